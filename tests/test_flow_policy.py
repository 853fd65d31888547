import numpy as np
import pytest
import torch

from arli.policies.flow import FlowChunkModel, FlowPolicy, FlowPolicyConfig
from arli.policies.flow_math import rtc_guidance_weight, rtc_soft_mask, training_inputs
from arli.types import PolicyRequest

H, M, N = 8, 3, 4


def _synthetic(n=512, seed=0, sign=None):
    """Bimodal chunks: ramps up or down (random sign, as two equally good demonstrators),
    scaled by the state. RTC guidance has to pick the mode the committed prefix is in."""
    g = np.random.default_rng(seed)
    state = g.normal(size=(n, N)).astype(np.float32)
    ramp = np.linspace(0.2, 1, H, dtype=np.float32)[None, :, None]
    signs = g.choice([-1.0, 1.0], size=(n, 1, 1)) if sign is None else np.full((n, 1, 1), sign)
    chunks = signs * ramp * (1.0 + 0.3 * np.tanh(state[:, None, :M]))
    return torch.as_tensor(state), torch.as_tensor(chunks.astype(np.float32))


def _model(mode="guidance", **kw):
    torch.manual_seed(0)
    cfg = FlowPolicyConfig(state_dim=N, action_dim=M, chunk_size=H, d_model=64, n_layers=2,
                           n_heads=4, ff_dim=128, num_steps=8, rtc_mode=mode, execute_horizon=4,
                           instruction="test task", **kw)
    return FlowChunkModel(cfg)


def _train(model, steps=400):
    state, chunks = _synthetic()
    opt = torch.optim.Adam(model.parameters(), 2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(state), (128,), generator=g)
        loss = model.loss(state[idx], chunks[idx], generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


@pytest.fixture(scope="module")
def trained():
    return _train(_model())


def test_flow_matching_loss_decreases_on_a_fixed_batch():
    model = _model()
    state, chunks = _synthetic(64)
    opt = torch.optim.Adam(model.parameters(), 1e-3)

    def fixed_loss():
        return model.loss(state, chunks, generator=torch.Generator().manual_seed(1))

    before = fixed_loss().item()
    for _ in range(60):
        loss = fixed_loss()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert fixed_loss().item() < 0.5 * before


def test_sampling_is_deterministic_under_a_seed(trained):
    s = _synthetic(2)[0]
    a = trained.sample(s, generator=torch.Generator().manual_seed(3))
    b = trained.sample(s, generator=torch.Generator().manual_seed(3))
    c = trained.sample(s, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


def test_trained_policy_fits_the_data(trained):
    state, _ = _synthetic(64, seed=5)
    pred = trained.sample(state, generator=torch.Generator().manual_seed(0))
    _, up = _synthetic(64, seed=5, sign=1.0)
    err = torch.minimum((pred - up).abs().mean((1, 2)), (pred + up).abs().mean((1, 2)))
    assert err.mean() < 0.15  # every sample lies on one of the two modes
    frac_up = (pred[:, -1, 0] > 0).float().mean()
    assert 0.15 < frac_up < 0.85  # and both modes are used


def test_rtc_guidance_keeps_the_committed_prefix_and_smooths_the_switch(trained):
    state, prev = _synthetic(64, seed=7, sign=1.0)  # the previous chunk ramps up
    d = 3
    free = trained.sample(state, generator=torch.Generator().manual_seed(1))
    guided = trained.sample(state, prefix=prev[:, : H - 4], delay=d,
                            generator=torch.Generator().manual_seed(1))
    err_free = (free[:, :d] - prev[:, :d]).abs().mean()
    err_guided = (guided[:, :d] - prev[:, :d]).abs().mean()
    assert err_guided < 0.1, err_guided
    assert err_guided < 0.3 * err_free
    assert (guided[:, -1, 0] > 0).float().mean() > 0.9  # continues in the prefix's mode
    # discontinuity at the switch: the first new action vs the last committed one
    jump_free = (free[:, d] - prev[:, d - 1]).abs().mean()
    jump_guided = (guided[:, d] - prev[:, d - 1]).abs().mean()
    assert jump_guided < jump_free


def test_training_time_prefix_conditioning_keeps_prefix_and_masks_its_loss():
    model = _train(_model("prefix", rtc_max_prefix=4), steps=200)
    state = _synthetic(8, seed=3)[0]
    prefix = torch.full((8, 2, M), 0.3)
    out = model.sample(state, prefix=prefix, delay=2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out[:, :2], prefix)
    # the training inputs: prefix slots clean at time 0, excluded from the loss
    _, actions = _synthetic(4)
    noise = torch.randn(actions.shape)
    x, t_tok, target, weight = training_inputs(actions, noise, torch.full((4,), 0.7),
                                               torch.tensor([0, 1, 3, H]))
    for row, d in enumerate([0, 1, 3, H]):
        torch.testing.assert_close(x[row, :d], actions[row, :d])
        assert torch.all(t_tok[row, :d] == 0) and torch.all(t_tok[row, d:] == 0.7)
        assert torch.all(weight[row, :d] == 0) and torch.all(weight[row, d:] == 1)
        torch.testing.assert_close(x[row, d:], 0.7 * noise[row, d:] + 0.3 * actions[row, d:])
    torch.testing.assert_close(target, noise - actions)


def test_soft_mask_and_weight_schedule():
    w = rtc_soft_mask(16, 4, 8)
    assert torch.all(w[:4] == 1) and torch.all(w[8:] == 0)
    assert torch.all(w[4:8][1:] <= w[4:8][:-1]) and 0 < w[4] < 1
    assert rtc_guidance_weight(0.0, 5.0) == 5.0 and rtc_guidance_weight(1.0, 5.0) == 5.0
    assert rtc_guidance_weight(0.5, 5.0) == pytest.approx(2.0)  # (0.5/0.5) * 0.5 / 0.25
    assert rtc_guidance_weight(0.5, 1.5) == 1.5  # clipped at beta


def test_save_load_gives_identical_chunks(trained, tmp_path):
    policy = FlowPolicy(trained.cfg, trained)
    policy.save(str(tmp_path / "ckpt"))
    loaded = FlowPolicy.load(str(tmp_path / "ckpt"))
    s = np.ones(N, np.float32)
    policy.reset(11)
    loaded.reset(11)
    np.testing.assert_array_equal(policy.infer(PolicyRequest.of(s)), loaded.infer(PolicyRequest.of(s)))
    assert (tmp_path / "ckpt" / "model.safetensors").exists()


def test_wrong_shape_observation_is_a_clear_error(trained):
    policy = FlowPolicy(trained.cfg, trained)
    with pytest.raises(ValueError, match=r"observation.state must have shape \(4,\)"):
        policy.infer(PolicyRequest.of(np.zeros(7)))
    with pytest.raises(FileNotFoundError, match="arli pretrain"):
        FlowPolicy.load("/nonexistent/ckpt")


@pytest.mark.parametrize("mode", ["guidance", "prefix"])
def test_a_batch_of_robots_gets_the_chunks_each_would_get_alone(mode):
    """Rows of one batch differ in state, instruction, prefix length, delay and horizon; from
    the same starting noise each row is the chunk its request gets alone (the server batches
    robots into one forward pass and must not mix them)."""
    model = _model(mode, rtc_max_prefix=4) if mode == "prefix" else _model(mode)
    model.eval()
    g = np.random.default_rng(1)
    states = torch.as_tensor(g.normal(size=(4, N)).astype(np.float32))
    prefixes = [None, g.uniform(-1, 1, (2, M)), g.uniform(-1, 1, (5, M)), g.uniform(-1, 1, (3, M))]
    delays, horizons = [0, 1, 3, 2], [None, 4, 2, 5]
    lang = torch.stack([model.lang_tokens, model.lang_tokens,
                        torch.as_tensor([5, 9, 0] + [0] * 13), model.lang_tokens])
    noise = torch.randn((4, H, M), generator=torch.Generator().manual_seed(0))
    p = torch.zeros(4, 5, M)
    for b, pre in enumerate(prefixes):
        if pre is not None:
            p[b, :len(pre)] = torch.as_tensor(pre, dtype=torch.float32)
    lengths = [0 if pre is None else len(pre) for pre in prefixes]
    batch = model.sample(states, None, p, delays, None, horizons, lang, lengths, noise=noise)
    for b in range(4):
        alone = model.sample(states[b:b + 1], None, None if prefixes[b] is None else p[b:b + 1, :lengths[b]],
                             delays[b], None, horizons[b], lang[b:b + 1], noise=noise[b:b + 1])
        assert torch.allclose(batch[b], alone[0], atol=1e-5), (mode, b)
    # and the rows really differ in what conditions them: the committed slots are each row's own
    if mode == "prefix":
        for b in (1, 2, 3):
            assert torch.allclose(batch[b, :delays[b]], p[b, :delays[b]])


def test_infer_batch_names_the_request_that_does_not_fit(trained):
    policy = FlowPolicy(trained.cfg, trained)
    ok = PolicyRequest.of(np.zeros(N))
    out = policy.infer_batch([ok, PolicyRequest.of(np.ones(N), instruction="other words")])
    assert len(out) == 2 and all(a.shape == (H, M) for a in out) and not np.allclose(out[0], out[1])
    with pytest.raises(ValueError, match=r"request 1 of the batch: observation.state must have shape \(4,\)"):
        policy.infer_batch([ok, PolicyRequest.of(np.zeros(7))])
