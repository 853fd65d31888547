"""LeRobot ACT and Diffusion policies, built with random weights, saved with LeRobot's own
save_pretrained (+ processors), loaded through the adapter. Nothing is downloaded."""

import numpy as np
import pytest
import torch

from arli.chunking import ChunkScheduler
from arli.latency import FixedLatency
from arli.policies.lerobot_adapter import LeRobotPolicyAdapter
from arli.policies.load import load_base_policy
from arli.chunking import gripper_hold
from arli.rollout import run_episode
from arli.types import Observation, PolicyRequest
from sim_envs import make_env
from lerobot_utils import save_lerobot_policy

N, M = 20, 5  # peg_insert state and action dims


def _save_lerobot_policy(kind: str, path, **kw) -> None:
    save_lerobot_policy(kind, path, N, M, **kw)


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("act")
    _save_lerobot_policy("act", path, chunk_size=10, n_action_steps=10, dim_model=64, n_heads=2,
                         dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    return path


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("diffusion")
    _save_lerobot_policy("diffusion", path, n_obs_steps=2, horizon=16, n_action_steps=8,
                         down_dims=(32, 64), num_inference_steps=3)
    return path


def test_cameras_are_matched_by_name_to_the_checkpoint_features(tmp_path):
    """ACT with two cameras: each request camera reaches its own ``observation.images.<name>``
    input through the saved processors; a missing or misshaped camera is named."""
    _save_lerobot_policy("act", tmp_path, cameras={"front": (3, 32, 32), "wrist": (3, 32, 32)}, chunk_size=6,
                         n_action_steps=6, dim_model=32, n_heads=2, dim_feedforward=32, n_encoder_layers=1,
                         n_decoder_layers=1, use_vae=False, pretrained_backbone_weights=None)
    adapter = load_base_policy(str(tmp_path))
    assert sorted(adapter.cameras) == ["front", "wrist"]
    g = np.random.default_rng(0)
    images = {n: g.integers(0, 255, (32, 32, 3), dtype=np.uint8) for n in ("front", "wrist")}
    state = np.linspace(-1, 1, N).astype(np.float32)
    chunk = adapter.infer(PolicyRequest.of(state, images, "insert the peg"))
    assert chunk.shape == (6, M) and np.all(np.isfinite(chunk))
    assert not np.allclose(chunk, adapter.infer(PolicyRequest.of(state, {**images, "wrist": 255 - images["wrist"]})))
    # LeRobot's own key spelling is accepted too
    np.testing.assert_array_equal(chunk, adapter.infer(PolicyRequest.of(
        state, {f"observation.images.{k}": v for k, v in images.items()})))
    with pytest.raises(ValueError, match=r"camera\(s\) \['wrist'\] missing: this policy needs \{'front': \(32, 32, 3\), 'wrist': \(32, 32, 3\)\}"):
        adapter.infer(PolicyRequest.of(state, {"front": images["front"]}))
    with pytest.raises(ValueError, match=r"unexpected camera\(s\) \['top'\]"):
        adapter.infer(PolicyRequest.of(state, {**images, "top": images["front"]}))
    with pytest.raises(ValueError, match=r"camera 'front' must be a \(32, 32, 3\) uint8 image"):
        adapter.infer(PolicyRequest.of(state, {**images, "front": images["front"][:16]}))


def test_a_batch_of_robots_gets_the_chunks_each_would_get_alone(tmp_path, diffusion_dir):
    """ACT with two cameras: several robots' requests collated into one pass through the
    checkpoint's processors and model give each robot the chunk it gets alone (ACT without
    its VAE is deterministic); a history-based Diffusion answers them one at a time."""
    _save_lerobot_policy("act", tmp_path, cameras={"front": (3, 32, 32), "wrist": (3, 32, 32)}, chunk_size=6,
                         n_action_steps=6, dim_model=32, n_heads=2, dim_feedforward=32, n_encoder_layers=1,
                         n_decoder_layers=1, use_vae=False, pretrained_backbone_weights=None)
    adapter = load_base_policy(str(tmp_path))
    assert adapter.batchable and not load_base_policy(str(diffusion_dir)).batchable
    g = np.random.default_rng(3)
    requests = [PolicyRequest.of(g.uniform(-1, 1, N).astype(np.float32),
                                 {n: g.integers(0, 255, (32, 32, 3), dtype=np.uint8) for n in ("front", "wrist")},
                                 committed_prefix=None if b == 0 else g.uniform(-1, 1, (b, M)).astype(np.float32))
                for b in range(3)]
    batch = adapter.infer_batch(requests)
    for b, r in enumerate(requests):
        np.testing.assert_allclose(batch[b], adapter.infer(r), atol=1e-5)
    assert not np.allclose(batch[0], batch[1])
    with pytest.raises(ValueError, match=r"request 2 of the batch: camera\(s\) \['wrist'\] missing"):
        adapter.infer_batch([*requests[:2], PolicyRequest.of(requests[2].state, {"front": requests[2].images["front"]})])


def test_act_round_trip_matches_lerobot_directly(act_dir):
    from lerobot.policies.act.modeling_act import ACTPolicy

    adapter = load_base_policy(str(act_dir))
    assert isinstance(adapter, LeRobotPolicyAdapter)
    assert (adapter.chunk_size, adapter.action_dim, adapter.n_obs_steps) == (10, M, 1)
    state = np.linspace(-1, 1, N).astype(np.float32)
    adapter.reset(0)
    chunk = adapter.infer(PolicyRequest.of(state))
    assert chunk.shape == (10, M) and chunk.dtype == np.float32
    # same weights used directly (identity normalisation): the adapter adds nothing but plumbing
    direct = ACTPolicy.from_pretrained(str(act_dir))
    direct.eval()
    x = torch.as_tensor(state)[None]
    with torch.no_grad():
        raw = direct.predict_action_chunk({"observation.state": x,
                                           "observation.environment_state": x})[0].numpy()
    np.testing.assert_allclose(chunk, np.clip(raw, -1, 1), atol=1e-5)
    assert not np.allclose(chunk, adapter.infer(PolicyRequest.of(-state)))  # depends on the observation


def test_diffusion_gets_its_observation_history_from_the_adapter(diffusion_dir):
    adapter = load_base_policy(str(diffusion_dir))
    assert (adapter.chunk_size, adapter.n_obs_steps) == (8, 2)
    adapter.reset(0)
    s0, s1 = np.zeros(N, np.float32), np.ones(N, np.float32)
    first = adapter.infer(PolicyRequest.of(s0))
    queue = adapter.policy._queues["observation.state"]
    assert len(queue) == 2 and all(torch.equal(q, queue[0]) for q in queue)  # padded with o_0
    adapter.infer(PolicyRequest.of(s1))
    queue = adapter.policy._queues["observation.state"]
    assert torch.equal(queue[0][0], torch.as_tensor(s0)) and torch.equal(queue[1][0], torch.as_tensor(s1))
    assert first.shape == (8, M)
    adapter.reset(3)
    a = adapter.infer(PolicyRequest.of(s0))
    adapter.reset(3)
    np.testing.assert_array_equal(a, adapter.infer(PolicyRequest.of(s0)))  # seeded sampling


def test_adapter_runs_in_the_scheduler_loop_with_committed_prefix(diffusion_dir):
    adapter = load_base_policy(str(diffusion_dir))
    prefix = np.full((3, M), 0.25, np.float32)
    chunk = adapter.infer(PolicyRequest(Observation(np.zeros(N, np.float32), step=7), prefix, 3))
    assert chunk.shape == (8, M)
    np.testing.assert_array_equal(chunk[:3], prefix)
    env = make_env("peg_insert", max_episode_steps=20)
    sched = ChunkScheduler(adapter.chunk_size, 4, M, "async", "rtc", 2, hold=gripper_hold())
    result = run_episode(env, adapter, sched, FixedLatency(0.1), np.random.default_rng(0), 0)
    assert result.steps == 20 and result.requests >= 4 and set(result.delays) == {2}


def test_bad_inputs_are_clear_errors(act_dir, tmp_path):
    adapter = load_base_policy(str(act_dir))
    with pytest.raises(ValueError, match=r"observation.state must have shape \(20,\)"):
        adapter.infer(PolicyRequest.of(np.zeros(7)))
    with pytest.raises(FileNotFoundError, match="missing config.json"):
        load_base_policy(str(tmp_path / "nothing"))


def test_diffusion_history_is_consecutive_control_steps_not_requests(diffusion_dir):
    """The runtime keeps the last n_obs_steps observations per control step: with a request
    every 4 steps, Diffusion sees (o_{t0-1}, o_t0), not (o_{t0-4}, o_t0)."""
    from arli.runtime.loop import StepController

    adapter = load_base_policy(str(diffusion_dir))
    seen: list[tuple[int, np.ndarray]] = []
    inner = adapter.policy.predict_action_chunk

    def spy(batch):
        seen.append(torch.stack(list(adapter.policy._queues["observation.state"]))[:, 0].numpy().copy())
        return inner(batch)

    adapter.policy.predict_action_chunk = spy

    class States(StepController):
        def __init__(self):
            self.states = []

        def act(self, t, obs, info):
            self.states.append(obs.state.copy())
            return info.base_action

    rec = States()
    env = make_env("peg_insert", max_episode_steps=14)
    sched = ChunkScheduler(adapter.chunk_size, 4, M, "async", "naive", 2, hold=gripper_hold())
    run_episode(env, adapter, sched, FixedLatency(0.1), np.random.default_rng(0), 0, rec)
    assert len(seen) >= 3
    # normalisation is the identity (stats mean 0, std 1): the queue holds the raw states
    np.testing.assert_allclose(seen[0], np.stack([rec.states[0], rec.states[0]]), atol=1e-6)  # o_0 padded
    for k, queue in enumerate(seen[1:], start=1):
        t0 = 4 * k
        np.testing.assert_allclose(queue, np.stack([rec.states[t0 - 1], rec.states[t0]]), atol=1e-6)


def test_actions_outside_the_action_space_are_reported_then_clipped(tmp_path, caplog):
    """A checkpoint whose post-processed actions leave [-1, 1] (robot units) is clipped to the
    runtime's action space, counted, and said so in a rate-limited warning; the committed
    prefix still fills the first slots."""
    from arli.policies.load import load_base_policy

    _save_lerobot_policy("act", tmp_path, cameras={}, chunk_size=4, n_action_steps=4, dim_model=32, n_heads=2,
                         dim_feedforward=32, n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1)
    adapter = load_base_policy(str(tmp_path))
    state = np.zeros(N, np.float32)
    inside = adapter.infer(PolicyRequest.of(state))
    assert adapter.clipped_chunks == 0 and np.abs(inside).max() <= 1
    post = adapter.post
    adapter.post = lambda chunk: post(chunk) * 0 + 3.0  # actions in robot units, far past 1
    prefix = np.full((1, M), -0.5, np.float32)
    with caplog.at_level("WARNING", logger="arli.policies"):
        out = [adapter.infer(PolicyRequest(Observation(state, 0), committed_prefix=prefix)) for _ in range(5)]
    assert adapter.clipped_chunks == 5
    assert all(np.all(o[1:] == 1.0) and np.all(o[0] == -0.5) for o in out)
    lines = [r.getMessage() for r in caplog.records if "outside the runtime's [-1, 1]" in r.getMessage()]
    assert len(lines) == 1 and "|a| = 3.000" in lines[0]  # once per minute, not once per chunk
