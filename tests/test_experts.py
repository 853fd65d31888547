import numpy as np
import pytest

from sim_envs import make_env
from arli.policies.expert import ExpertChunkPolicy
from sim_envs.experts import EXPERTS


@pytest.mark.parametrize("name", ["pick_cube", "peg_insert"])
def test_scripted_expert_success_rate(name):
    env, expert = make_env(name), EXPERTS[name]
    successes = 0
    for seed in range(50):
        obs, _ = env.reset(seed=1000 + seed)
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(expert(obs["state"]))
            done = term or trunc
        successes += info["is_success"]
    assert successes / 50 >= 0.95, f"{name}: {successes}/50"


@pytest.mark.xfail(strict=True, reason=(
    "known limit: the teleoperator-like pick expert ramps its speed from the measured hand speed, and "
    "robosuite's OSC hand lags the command so much that it crawls (0/3 in 100 steps); issue 11"))
def test_expert_on_robosuite_lift_through_the_adapter():
    env, expert = make_env("robosuite_lift"), EXPERTS["pick_cube"]
    wins = 0
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(expert(obs["state"]))
            done = term or trunc
        wins += info["is_success"]
    assert wins >= 2


def test_expert_chunk_keeps_committed_prefix():
    env = make_env("pick_cube")
    obs, _ = env.reset(seed=0)
    policy = ExpertChunkPolicy("pick_cube", chunk_size=8)
    prefix = np.tile(np.array([0.5, 0, 0, 0, -1], np.float32), (3, 1))
    chunk = policy.predict_actions(obs["state"], prefix)
    assert chunk.shape == (8, 5)
    np.testing.assert_array_equal(chunk[:3], prefix)
    free = policy.predict_actions(obs["state"])
    assert not np.allclose(free[3:], chunk[3:]), "planning must start after the prefix"
