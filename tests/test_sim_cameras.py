"""Sim cameras: a fixed front camera and a wrist camera on the Franka hand, rendered at a
chosen size only when asked for, selected by ``env.cameras`` / ``env.image_size``."""

from __future__ import annotations

import numpy as np
import pytest

from sim_envs import make_env

MOVE = np.array([0.0, 0.8, -0.5, 0.0, 0.0])  # +y (to the image's right in the front view) and down


def _hand_frame(env) -> tuple[np.ndarray, np.ndarray]:
    body = env.unwrapped.model.body("right_gripper").id
    data = env.unwrapped.data
    return data.xpos[body].copy(), data.xmat[body].reshape(3, 3).copy()


def test_the_wrist_camera_moves_with_the_hand_and_the_front_one_stays():
    env = make_env("peg_insert", image_size=32, cameras=["front", "wrist"])
    u = env.unwrapped
    wrist, front = u.model.camera("wrist").id, u.model.camera("front").id
    obs, _ = env.reset(seed=0)
    assert set(obs["images"]) == {"front", "wrist"}
    assert all(img.shape == (32, 32, 3) and img.dtype == np.uint8 for img in obs["images"].values())
    before = {k: v.astype(int) for k, v in obs["images"].items()}
    cam0, front0, site0 = u.data.cam_xpos[wrist].copy(), u.data.cam_xpos[front].copy(), u.ctrl.ee_pos()
    pos0, rot0 = _hand_frame(env)
    for _ in range(15):
        obs, *_ = env.step(MOVE)
    after = {k: v.astype(int) for k, v in obs["images"].items()}
    cam1, site1 = u.data.cam_xpos[wrist].copy(), u.ctrl.ee_pos()
    pos1, rot1 = _hand_frame(env)

    assert np.linalg.norm(site1 - site0) > 0.15  # the hand really moved
    # the wrist camera is rigidly mounted on the hand: same pose in the hand's frame, and it
    # travelled with the hand; the front camera did not move
    np.testing.assert_allclose(rot1.T @ (cam1 - pos1), rot0.T @ (cam0 - pos0), atol=1e-6)
    assert np.linalg.norm((cam1 - cam0) - (site1 - site0)) < 0.005
    np.testing.assert_array_equal(u.data.cam_xpos[front], front0)
    # what each camera sees: the wrist view changes everywhere, the front view's left quarter
    # (table and fixture on the far side, away from the arm) stays exactly the same
    assert np.abs(after["wrist"] - before["wrist"]).mean() > 10
    np.testing.assert_array_equal(after["front"][:, :8], before["front"][:, :8])
    assert np.abs(after["front"] - before["front"]).mean() > 5  # the arm moved in the front view
    assert np.abs(before["front"] - before["wrist"]).mean() > 30  # two views, not one image twice


def test_nothing_is_rendered_unless_cameras_are_asked_for():
    env = make_env("pick_cube")
    obs, _ = env.reset(seed=0)
    env.step(MOVE)
    assert set(obs) == {"state"} and "images" not in env.observation_space.spaces
    assert env.unwrapped.render_s == 0.0
    only = make_env("pick_cube", image_size=32, cameras=["wrist"])
    obs, _ = only.reset(seed=0)
    assert set(obs["images"]) == {"wrist"} and only.unwrapped.render_s > 0
    assert only.observation_space["images"]["wrist"].shape == (32, 32, 3)


def test_cameras_are_chosen_by_config_and_bad_names_are_refused():
    from arli.cli import compose  # noqa: PLC0415
    from arli.config import ConfigError  # noqa: PLC0415

    cfg = compose("collect_demos", ["env=pick_cube", "env.image_size=64", "env.cameras=[front,wrist]"])
    assert cfg.env.render_kwargs() == {"image_size": 64, "cameras": ["front", "wrist"]}
    assert compose("collect_demos", ["env=pick_cube"]).env.render_kwargs() == {}  # state only by default
    with pytest.raises(ConfigError, match=r"env.cameras: expected distinct names from \['front', 'wrist'\]"):
        compose("collect_demos", ["env.image_size=64", "env.cameras=[front,top]"])
    with pytest.raises(ConfigError, match="env.cameras: expected at least one camera when env.image_size > 0"):
        compose("collect_demos", ["env.image_size=64", "env.cameras=[]"])
    with pytest.raises(ValueError, match="cameras must be distinct names from"):
        make_env("pick_cube", image_size=32, cameras=["front", "front"])
