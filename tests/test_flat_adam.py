"""Flat parameter buffers and FlatAdam: the same arithmetic as torch.optim.Adam, gradients
accumulated into the shared buffer, and learner checkpoints that resume exactly."""

import pytest
import torch
from torch import nn

from arli.bench.learner import filled_buffers
from arli.rl.config import LearnerConfig
from arli.rl.flat_adam import FlatAdam, FlatParameters
from arli.rl.learner import ResidualLearner


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("foreach", [True, False])
def test_flat_adam_matches_torch_adam_bit_for_bit(foreach):
    ours, ref = _net(0), _net(0)
    flat = FlatParameters(ours)
    opt, ref_opt = FlatAdam(flat, lr=3e-3), torch.optim.Adam(ref.parameters(), lr=3e-3, foreach=foreach)
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):
        x, y = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)
        for net, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    # the parameters really are views of the buffer the optimiser moved
    assert ours[0].weight.data_ptr() == flat.data.data_ptr()
    assert not torch.equal(flat.data, torch.cat([p.reshape(-1) for p in _net(0).parameters()]))


def test_gradients_accumulate_into_the_flat_buffer_and_zero_clears_them():
    net = _net(0)
    flat = FlatParameters(net)
    net(torch.ones(2, 6)).sum().backward()
    expected = torch.cat([p.grad.reshape(-1).clone() for p in net.parameters()])
    assert torch.equal(flat.grad, expected) and flat.grad.abs().sum() > 0
    net(torch.ones(2, 6)).sum().backward()  # a second backward adds, as autograd does
    torch.testing.assert_close(flat.grad, 2 * expected)
    flat.zero_grad()
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in net.parameters())


def test_learner_checkpoint_resumes_to_identical_updates():
    cfg = LearnerConfig(critic_hidden=16, hidden=16, batch_size=32, critic_warmup_updates=0)
    online, anchor = filled_buffers(12, 3, 128, 0)
    a = ResidualLearner(cfg, 12, 3, seed=0)
    for _ in range(6):
        a.update(online, anchor)
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.state_dict().items()}
    b = ResidualLearner(cfg, 12, 3, seed=5)
    b.load_state_dict(state)
    for _ in range(4):
        a.update(online, anchor)
        b.update(online, anchor)
    for x, y in ((a.actor_flat, b.actor_flat), (a.critic_flat, b.critic_flat),
                 (a.critic_target_flat, b.critic_target_flat)):
        assert torch.equal(x.data, y.data)
    with pytest.raises(ValueError, match="FlatAdam"):
        b.critic_opt.load_state_dict({"state": {}, "param_groups": []})
