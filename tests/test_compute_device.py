"""``device=auto|cpu|cuda`` of ``arli serve`` and the learner (``run.device``): auto picks
CUDA only when torch sees it, cuda without a GPU is refused in one line, and a learner on a
resolved CPU device learns exactly as before (this machine has no GPU: CUDA itself is not
exercised here)."""

import numpy as np
import pytest
import torch

from arli.compute import check_device, resolve_device
from arli.errors import ConfigError


def test_auto_is_cuda_only_when_torch_sees_a_gpu():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_saying_what_to_use():
    with pytest.raises(ConfigError, match=r"device=cuda, but torch .* sees no CUDA device.*use device=auto or device=cpu"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match=r"run.device=cuda:1"):
        resolve_device("cuda:1", "run.device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", [["serve", "checkpoint=expert", "env=pick_cube", "device=cuda"],
                                     ["learner", "checkpoint=expert", "env=pick_cube", "output_dir={tmp}/out",
                                      "run.device=cuda"]])
def test_the_commands_refuse_cuda_at_start_up_with_exit_2(command, tmp_path):
    """As a user would meet it: the process exits 2 before it binds or trains, with one line
    naming the field and what to use instead, and no traceback."""
    import subprocess
    import sys

    from process_utils import ROOT

    proc = subprocess.run([sys.executable, "-m", "arli.cli", *(c.format(tmp=tmp_path) for c in command)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    field = command[-1].split("=")[0]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{field}=cuda" in proc.stderr and f"use {field}=auto or {field}=cpu" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cpu:0", "", "auto:1"])
def test_bad_device_names_are_refused(bad):
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:<index>"):
        check_device(bad)


def test_config_fields_are_checked_at_start_up():
    from arli.cli import compose

    with pytest.raises(ConfigError, match="device: expected auto, cpu, cuda"):
        compose("serve", ["device=gpu"])
    with pytest.raises(ConfigError, match="run.device: expected auto, cpu, cuda"):
        compose("finetune", ["run.device=tpu"])
    assert compose("serve", []).device == "auto" and compose("learner", []).run.device == "auto"


def test_a_learner_on_the_resolved_device_learns_as_on_the_cpu():
    """The same seed on ``device=auto`` and ``cpu`` gives identical updates where auto is the
    CPU, and the same within float tolerance where it is a GPU (other kernels, other rounding)."""
    from arli.rl.config import LearnerConfig
    from arli.rl.learner import ResidualLearner
    from arli.rl.replay import ReplayBuffer
    from arli.types import Transition

    def run(device):
        cfg = LearnerConfig(batch_size=32, critic_warmup_updates=2)
        learner = ResidualLearner(cfg, 6, 2, seed=3, device=resolve_device(device))
        g = np.random.default_rng(0)
        online, anchor = ReplayBuffer(500, 6, 2), ReplayBuffer(500, 6, 2)
        for buf in (online, anchor):
            for _ in range(200):
                buf.add(Transition(g.standard_normal(6), g.uniform(-1, 1, 2), g.uniform(-1, 1, 2),
                                   float(g.random() < 0.1), g.standard_normal(6), g.uniform(-1, 1, 2), 0.99))
        losses = [learner.update(online, anchor)["critic_loss"] for _ in range(10)]
        return losses, learner.act(np.zeros(6, np.float32), np.zeros(2, np.float32), explore=False)

    (a, act_a), (b, act_b) = run("auto"), run("cpu")
    assert a[-1] != a[0]
    if resolve_device("auto") == "cpu":
        assert a == b and np.array_equal(act_a, act_b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(act_a, act_b, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_on_cuda_the_flow_policy_and_the_learner_match_the_cpu():
    """Where a GPU exists: the same seed gives the same chunk (noise drawn on the CPU) and the
    same learner updates within float tolerance on CUDA as on the CPU."""
    from arli.policies.flow import FlowPolicy
    from arli.policies.flow_config import FlowPolicyConfig
    from arli.types import PolicyRequest

    torch.manual_seed(0)
    cpu = FlowPolicy(FlowPolicyConfig(state_dim=6, action_dim=3, chunk_size=8, d_model=32, n_layers=1, n_heads=2,
                                      ff_dim=32, num_steps=4))
    gpu = FlowPolicy(cpu.cfg, __import__("copy").deepcopy(cpu.model)).to("cuda")
    request = PolicyRequest.of(np.linspace(-1, 1, 6).astype(np.float32), committed_prefix=np.zeros((2, 3), np.float32),
                               delay_steps=2)
    cpu.reset(1), gpu.reset(1)
    np.testing.assert_allclose(cpu.infer(request), gpu.infer(request), atol=1e-4)


def test_retaining_freed_memory_is_tried_once_also_where_it_fails(monkeypatch):
    """Where the C library has no mallopt (musl, macOS) the answer is False, and later learners
    do not look for the library again (``find_library`` may start a subprocess)."""
    import ctypes.util

    from arli import compute

    calls = []

    def missing(name):
        calls.append(name)
        return "/nonexistent/libc-for-this-test.so"

    monkeypatch.setattr(compute, "_RETAINED", None)
    monkeypatch.setattr(ctypes.util, "find_library", missing)
    assert compute.retain_freed_memory() is False and compute.retain_freed_memory() is False
    assert calls == ["c"]
