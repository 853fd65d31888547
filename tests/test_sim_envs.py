import gymnasium as gym
import mujoco
import numpy as np
import pytest

import sim_envs
from sim_envs import make_env
from sim_envs.base import PROPRIO_DIM


def _rollout(env, seed, actions):
    obs, _ = env.reset(seed=seed)
    states = [obs["state"]]
    for a in actions:
        obs, *_ = env.step(a)
        states.append(obs["state"])
    return np.stack(states)


@pytest.mark.parametrize("name", ["pick_cube", "peg_insert"])
def test_seeded_determinism(name):
    actions = np.random.default_rng(1).uniform(-1, 1, (30, 5))
    a = _rollout(make_env(name), 7, actions)
    b = _rollout(make_env(name), 7, actions)
    c = _rollout(make_env(name), 8, actions)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[0], c[0]), "different seeds must randomise the initial state"


@pytest.mark.parametrize("gym_id", ["ARLI/PickCube-v0", "ARLI/PegInsert-v0"])
def test_gym_ids_and_spaces(gym_id):
    env = gym.make(gym_id)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["state"].shape[0] == PROPRIO_DIM + len(env.unwrapped.task_state_names)
    assert env.action_space.shape == (5,)
    assert info["is_success"] is False


def test_wrong_env_id_names_valid_choices():
    with pytest.raises(ValueError, match="valid: .*peg_insert.*pick_cube"):
        make_env("pick_cub")


@pytest.mark.parametrize("bad", [np.zeros(4), np.zeros((1, 5)), [0, 0, np.nan, 0, 0], [np.inf, 0, 0, 0, 0]])
def test_bad_actions_are_rejected_not_clipped(bad):
    env = make_env("pick_cube")
    env.reset(seed=0)
    before = env.data.qpos.copy()
    with pytest.raises(ValueError):
        env.step(bad)
    np.testing.assert_array_equal(env.data.qpos, before)  # nothing executed


def test_out_of_range_action_is_clipped_to_the_same_motion():
    a, b = make_env("pick_cube"), make_env("pick_cube")
    sa = _rollout(a, 3, [np.array([5.0, 0, 0, 0, -1])] * 5)
    sb = _rollout(b, 3, [np.array([1.0, 0, 0, 0, -1])] * 5)
    np.testing.assert_allclose(sa, sb)


def test_bad_dt_is_rejected():
    with pytest.raises(ValueError, match="multiple of the physics step"):
        make_env("pick_cube", dt=0.0123)


def test_cartesian_control_tracks_commands():
    env = make_env("pick_cube")
    obs, _ = env.reset(seed=0)
    z0 = obs["state"][2]
    for _ in range(10):
        obs, *_ = env.step([0, 0, 1, 0, -1])
    assert obs["state"][2] - z0 > 0.1  # 10 steps x 2 cm commanded, most of it tracked
    x0 = obs["state"][0]
    for _ in range(5):
        obs, *_ = env.step([-1, 0, 0, 0, -1])
    assert x0 - obs["state"][0] > 0.06


def test_grasp_is_by_contact_and_friction():
    env = make_env("pick_cube")
    m = env.model
    assert m.neq == 0, "no weld/connect constraints may attach objects"
    assert m.nmocap == 0
    from sim_envs.experts import pick_cube_expert

    obs, _ = env.reset(seed=2)
    for _ in range(100):
        obs, _, term, trunc, info = env.step(pick_cube_expert(obs["state"]))
        if term or trunc:
            break
    assert info["is_success"]
    cube = m.geom("cube_geom").id
    pads = {m.geom("finger1_pad_collision").id, m.geom("finger2_pad_collision").id}
    touching = {int(c.geom1) for c in env.data.contact[: env.data.ncon] if c.geom2 == cube} | \
               {int(c.geom2) for c in env.data.contact[: env.data.ncon] if c.geom1 == cube}
    assert pads <= touching, "the lifted cube must be held by both finger pads"


def test_images_are_rendered_when_requested():
    env = make_env("pick_cube", image_size=32)
    obs, _ = env.reset(seed=0)
    img = obs["images"]["front"]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    assert img.std() > 5  # a real scene, not a blank buffer


def test_peg_insert_success_requires_the_hole():
    env = make_env("peg_insert")
    env.reset(seed=0)
    assert not env.unwrapped._is_success()
    q = env.data.qpos
    adr = env.model.joint("peg_free").qposadr[0]
    hole = env.unwrapped.hole_pos()
    q[adr:adr + 3] = (hole[0], hole[1], 0.041)  # peg resting inside the hole
    mujoco.mj_forward(env.model, env.data)
    assert env.unwrapped._is_success()
    q[adr:adr + 3] = (hole[0] + 0.03, hole[1], 0.041)  # same height, beside the hole
    mujoco.mj_forward(env.model, env.data)
    assert not env.unwrapped._is_success()


@pytest.mark.parametrize("field", ["qvel", "qpos"])
@pytest.mark.parametrize("at_step", [0, 3])
def test_an_unstable_simulation_ends_the_episode_unsuccessful_not_silently_reset(field, at_step):
    """MuJoCo resets mjData on a NaN/inf/huge state and carries on (objects back at their
    default poses); the env ends that episode there, truncated and unsuccessful, and counts
    it, on the first control step or a later one, and again after an earlier reset (MuJoCo's
    own warning counters are not monotonic across its resets)."""
    env = make_env("peg_insert")
    zero = np.zeros(5, np.float32)
    for episode in range(2):  # the second unstable episode is detected as the first was
        env.reset(seed=episode)
        for _ in range(at_step):
            assert not env.step(zero)[4]["sim_unstable"]
        getattr(env.unwrapped.data, field)[:] = np.nan if field == "qpos" else 1e200
        _, reward, terminated, truncated, info = env.step(zero)
        assert info["sim_unstable"] and truncated and not terminated and reward == 0.0 and not info["is_success"]
        assert env.unwrapped.unstable_episodes == episode + 1
    env.reset(seed=5)  # a fresh episode steps normally again
    assert not any(env.step(zero)[4]["sim_unstable"] for _ in range(5))
