"""VLAs (SmolVLA, pi0, pi0.5) served offline through ARLI's serving path: random-init
checkpoints built from LeRobot's own classes on tiny local backbones and tokenizers
(tests/vla_builders.py), loaded by ``load_base_policy`` and by a real ``arli serve`` process,
answering two-camera + instruction requests. Nothing is downloaded.

pi0 / pi0.5 need huggingface's transformers fork for openpi, which is not on PyPI and
conflicts with SmolVLA's transformers; their tests run where it is installed and skip
otherwise, and without it a pi0 checkpoint is refused in one line that says what to install.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from arli.config import ServeConfig
from arli.errors import ConfigError, InputError
from arli.policies.lerobot_adapter import PI_TRANSFORMERS, LeRobotPolicyAdapter, pi_transformers_installed
from arli.policies.load import load_base_policy
from arli.types import ChunkRequest, Observation, PolicyRequest
from process_utils import ROOT, free_ports, running
from vla_builders import save_pi, save_smolvla

pytestmark = pytest.mark.timeout(300)

N, M = 9, 5  # the Franka driver's proprioception and its [dx, dy, dz, dyaw, grip] action
CAMERAS = {"front": (3, 32, 32), "wrist": (3, 24, 32)}  # name -> (3, h, w)
PICK, DRAWER = "pick up the red cube", "open the drawer"
STATE = np.linspace(-1, 1, N).astype(np.float32)
NO_FORK = ("LeRobot 0.4.4's pi0/pi0.5 need transformers 4.53.2 patched for openpi (huggingface's fork "
           "fix/lerobot_openpi or openpi's transformers_replace), which conflicts with SmolVLA's "
           "transformers>=4.57.1 (lerobot #2707): `make pi-env` makes that environment (.venv-pi), "
           "`make test-pi` runs these there")


def images(seed: int = 0) -> dict[str, np.ndarray]:
    """name -> (h, w, 3) uint8, one per camera of CAMERAS."""
    g = np.random.default_rng(seed)
    return {name: g.integers(0, 256, (h, w, 3), dtype=np.uint8) for name, (_, h, w) in CAMERAS.items()}


@pytest.fixture(scope="module")
def smolvla_dir(tmp_path_factory):
    return save_smolvla(tmp_path_factory.mktemp("smolvla"), N, M, CAMERAS, chunk_size=10, n_action_steps=6)


def _chunk(adapter, instruction: str, seed: int = 0, imgs: dict | None = None) -> np.ndarray:
    adapter.reset(seed)
    return adapter.infer(PolicyRequest.of(STATE, imgs or images(), instruction))


def _tokens(adapter: LeRobotPolicyAdapter, instruction: str) -> str:
    """The instruction as the model receives it: the processed batch's language tokens, decoded."""
    from lerobot.processor import TokenizerProcessorStep  # noqa: PLC0415

    batch = adapter._observations(Observation(STATE, 0, images=images()), instruction)
    tokens = batch["observation.language.tokens"][0][batch["observation.language.attention_mask"][0].bool()]
    step = next(s for s in adapter.pre.steps if isinstance(s, TokenizerProcessorStep))
    return step.input_tokenizer.decode(tokens)


def _check_vla(adapter: LeRobotPolicyAdapter, kind: str, H: int) -> None:
    """Two cameras by name, the instruction reaching the model, a finite (H, M) chunk."""
    assert adapter.cfg.type == kind
    assert sorted(adapter.cameras) == ["front", "wrist"] and adapter.state_dim == N
    chunk = _chunk(adapter, PICK)
    assert chunk.shape == (H, M) and chunk.dtype == np.float32 and np.all(np.isfinite(chunk))
    # same noise seed: the same request gives the same chunk; another instruction another one
    np.testing.assert_array_equal(chunk, _chunk(adapter, PICK))
    assert not np.allclose(chunk, _chunk(adapter, DRAWER), atol=1e-6)
    assert PICK in _tokens(adapter, PICK) and DRAWER in _tokens(adapter, DRAWER)
    # each camera reaches its own input
    flipped = {**images(), "wrist": 255 - images()["wrist"]}
    assert not np.allclose(chunk, _chunk(adapter, PICK, imgs=flipped), atol=1e-6)


def test_smolvla_takes_two_cameras_and_the_instruction(smolvla_dir):
    """SmolVLA on a tiny local SmolVLM: the request's cameras go to their own
    ``observation.images.<name>`` inputs, its instruction is tokenized by the checkpoint's
    own processor (the decoded tokens hold it) and changes the chunk under the same noise;
    n_action_steps (6 of chunk_size 10) actions are served."""
    adapter = load_base_policy(str(smolvla_dir), task=DRAWER)
    _check_vla(adapter, "smolvla", 6)
    # no instruction in the request: the task given at load is the instruction
    np.testing.assert_array_equal(_chunk(adapter, ""), _chunk(adapter, DRAWER))
    with pytest.raises(ValueError, match=r"camera\(s\) \['wrist'\] missing: this policy needs \{'front': \(32, 32, 3\), 'wrist': \(24, 32, 3\)\}"):
        adapter.infer(PolicyRequest.of(STATE, {"front": images()["front"]}, PICK))
    with pytest.raises(ValueError, match=r"camera 'wrist' must be a \(24, 32, 3\) uint8 image"):
        adapter.infer(PolicyRequest.of(STATE, {**images(), "wrist": images()["front"]}, PICK))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_checkpoint_trained_on_a_gpu_runs_where_the_server_puts_it(smolvla_dir, tmp_path):
    """lerobot-train saves the pre-processor's device step as cuda: LeRobot's own loader then
    fails on a machine without one; the adapter moves the inputs to its own device instead.
    A cuda device where there is none is one line naming the field."""
    from lerobot.policies.factory import make_pre_post_processors  # noqa: PLC0415

    path = shutil.copytree(smolvla_dir, tmp_path / "trained_on_gpu")
    saved = json.loads((path / "policy_preprocessor.json").read_text())
    for step in saved["steps"]:
        if step["registry_name"] == "device_processor":
            step["config"]["device"] = "cuda"
    (path / "policy_preprocessor.json").write_text(json.dumps(saved))
    adapter = load_base_policy(str(path), device="cpu")
    with pytest.raises(ValueError, match="device_processor"):  # what serving it without the override did
        make_pre_post_processors(adapter.cfg, pretrained_path=str(path), preprocessor_overrides={
            "tokenizer_processor": {"tokenizer_name": str(path / "vlm")}})
    assert _chunk(adapter, PICK).shape == (6, M)
    with pytest.raises(InputError, match=r"device: expected a device torch can use here, got 'cuda'"):
        load_base_policy(str(path), device="cuda")
    with pytest.raises(ConfigError, match=r"device: expected auto, cpu, cuda or cuda:<index>, got 'gpu'"):
        ServeConfig(device="gpu").validate()


def test_a_checkpoint_with_its_backbone_and_tokenizer_beside_it_can_be_moved(smolvla_dir, tmp_path):
    """The local VLM backbone and tokenizer are named relative to the checkpoint; the adapter
    reads them from wherever the directory now is (a copy never points back at the original)."""
    from lerobot.processor import TokenizerProcessorStep  # noqa: PLC0415

    saved = (smolvla_dir / "config.json").read_text() + (smolvla_dir / "policy_preprocessor.json").read_text()
    assert str(smolvla_dir) not in saved and json.loads((smolvla_dir / "config.json").read_text())[
        "vlm_model_name"] == "vlm"
    moved = shutil.copytree(smolvla_dir, tmp_path / "moved")
    adapter = load_base_policy(str(moved), task=DRAWER)
    assert adapter.cfg.vlm_model_name == str(moved / "vlm")
    step = next(s for s in adapter.pre.steps if isinstance(s, TokenizerProcessorStep))
    assert step.tokenizer_name == str(moved / "vlm")
    np.testing.assert_array_equal(_chunk(adapter, PICK), _chunk(load_base_policy(str(smolvla_dir)), PICK))


def _ask(client, requests: dict[int, tuple[dict, str]], timeout_s: float = 60) -> dict:
    """request id -> (images, instruction), sent at once through the robot's client -> the
    replies that came within ``timeout_s``. A send refused while the connection is down is
    retried, as the runtime does."""
    deadline = time.perf_counter() + timeout_s
    for rid, (imgs, instruction) in requests.items():
        obs = Observation(STATE, 0, time.perf_counter(), imgs, instruction)
        while not client.submit(ChunkRequest(rid, 0, obs, 0, None), []) and time.perf_counter() < deadline:
            time.sleep(0.05)
    replies = {}
    while len(replies) < len(requests) and time.perf_counter() < deadline:
        client.drain(0.1)
        replies.update({r.request_id: r for r in client.poll(0)})
    return replies


@pytest.mark.slow
def test_arli_serve_answers_smolvla_requests_over_zeromq(smolvla_dir, tmp_path):
    """A real ``arli serve checkpoint=<smolvla dir>`` process, asked through the robot's own
    client (RemoteInference): the handshake reports the policy's chunk; two-camera requests,
    with an instruction or with the client's default one, get finite (6, M) chunks; one
    missing a camera gets an error reply naming it, and the server keeps serving."""
    from arli.transport.inference_client import RemoteInference  # noqa: PLC0415

    (port,) = free_ports(1)
    address = f"tcp://127.0.0.1:{port}"
    with running(["serve", f"checkpoint={smolvla_dir}", f"transport.server={address}"], tmp_path / "serve.log"):
        client = RemoteInference(address, dt=0.05, instruction=DRAWER)
        try:
            meta = client.connect(timeout_s=120)
            assert (meta["policy"], meta["chunk_size"], meta["action_dim"]) == ("LeRobotPolicyAdapter", 6, M)
            replies = _ask(client, {1: (images(), PICK), 2: (images(1), "")})
            replies.update(_ask(client, {3: ({"front": images()["front"]}, PICK)}))
            replies.update(_ask(client, {4: (images(2), PICK)}))
        finally:
            client.close()
    assert sorted(replies) == [1, 2, 3, 4], (tmp_path / "serve.log").read_text()[-3000:]
    for rid in (1, 2, 4):
        assert replies[rid].actions.shape == (6, M) and np.all(np.isfinite(replies[rid].actions))
        assert replies[rid].meta["compute_s"] > 0
    assert replies[3].actions is None
    assert "camera(s) ['wrist'] missing" in replies[3].meta["error"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not pi_transformers_installed(), reason=NO_FORK)
@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_pi_policies_take_two_cameras_and_the_instruction(kind, tmp_path):
    """pi0 / pi0.5 at the smallest size LeRobot runs (gemma_2b backbone, gemma_300m expert,
    ~3.3 B parameters at random init; float32, since CPUs without bf16 units run bfloat16
    several times slower), with a local tokenizer in place of PaliGemma's: the same checks as
    SmolVLA's through ``load_base_policy``, then served by a real ``arli serve`` process that
    answers a two-camera + instruction request from the robot's client and names a missing
    camera. Minutes and ~14 GB of memory on a CPU."""
    from arli.transport.inference_client import RemoteInference  # noqa: PLC0415

    path = save_pi(kind, tmp_path / kind, N, M, CAMERAS, chunk_size=5, dtype="float32")
    adapter = load_base_policy(str(path))
    _check_vla(adapter, kind, 5)
    del adapter  # the server loads its own copy: two would not fit beside each other on 24 GB
    gc.collect()
    address = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    with running(["serve", f"checkpoint={path}", f"transport.server={address}"], tmp_path / "serve.log"):
        client = RemoteInference(address, dt=0.05)
        try:
            meta = client.connect(timeout_s=600)
            replies = _ask(client, {1: (images(), PICK)}, timeout_s=600)
            replies.update(_ask(client, {2: ({"wrist": images()["wrist"]}, PICK)}, timeout_s=600))
        finally:
            client.close()
    assert (meta["policy"], meta["chunk_size"], meta["action_dim"]) == ("LeRobotPolicyAdapter", 5, M)
    assert sorted(replies) == [1, 2], (tmp_path / "serve.log").read_text()[-3000:]
    assert replies[1].actions.shape == (5, M) and np.all(np.isfinite(replies[1].actions))
    assert "camera(s) ['front'] missing" in replies[2].meta["error"]


def _pi_config_only(kind: str, path) -> None:
    """A pi0 / pi0.5 checkpoint's config.json alone: enough to be refused before any weights."""
    from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: PLC0415
    from lerobot.policies.factory import make_policy_config  # noqa: PLC0415

    make_policy_config(kind, input_features={"observation.state": PolicyFeature(FeatureType.STATE, (N,))},
                       output_features={"action": PolicyFeature(FeatureType.ACTION, (M,))}).save_pretrained(path)


@pytest.mark.skipif(pi_transformers_installed(), reason="the transformers fork for openpi is installed")
@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_a_pi_checkpoint_without_the_fork_is_refused_in_one_line(kind, tmp_path):
    """On stock transformers LeRobot builds the whole pi0 and then raises "An incorrect
    transformer version is used"; the loader refuses first, naming what to install."""
    _pi_config_only(kind, tmp_path)
    start = time.perf_counter()
    with pytest.raises(InputError) as info:
        load_base_policy(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and f"is a LeRobot {kind} policy" in message
    assert message.endswith(f"pip install '{PI_TRANSFORMERS}'")
    assert time.perf_counter() - start < 10  # no model was allocated


@pytest.mark.slow
@pytest.mark.skipif(pi_transformers_installed(), reason="the transformers fork for openpi is installed")
def test_arli_serve_refuses_a_pi05_checkpoint_without_the_fork_in_one_line(tmp_path):
    _pi_config_only("pi05", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "arli.cli", "serve", f"checkpoint={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "incorrect transformer version" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("arli serve: error: checkpoint: ") and PI_TRANSFORMERS in last
