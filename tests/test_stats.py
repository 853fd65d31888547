"""The intervals every reported comparison carries: coverage, pairing, verdicts."""

import numpy as np
import pytest

from arli.stats import gain_ci, success_ci, verdict


def test_the_success_interval_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(60):
        outcomes = rng.random((3, 200)) < 0.6
        lo, hi = success_ci(outcomes, samples=500, seed=k)
        hits += lo <= 0.6 <= hi
    assert 52 <= hits <= 60  # 95% nominal: 57 expected, a few either way
    assert success_ci(np.ones((3, 50))) == (1.0, 1.0)


def test_a_paired_gain_is_resolved_where_unpaired_rates_overlap():
    rng = np.random.default_rng(1)
    before = (rng.random((3, 200)) < 0.5).astype(float)
    after = before.copy()
    fixed = np.flatnonzero(before[0] == 0)[:20]  # the same 20 episodes fixed on every seed
    after[:, fixed] = 1.0
    lo, hi = gain_ci(after, before)
    assert 0 < lo <= 0.1 <= hi < 0.2 and verdict((lo, hi)) == "above"
    a, b = success_ci(after), success_ci(before)
    assert a[0] < b[1]  # the two rates' own intervals overlap: only pairing resolves the gain
    assert gain_ci(before, before) == (0.0, 0.0) and verdict((0.0, 0.0)) == "unresolved"


def test_a_seed_free_baseline_is_paired_with_every_training_seed():
    base = np.array([1, 0, 1, 0] * 25, float)
    runs = np.stack([base, base, np.ones(100)])
    lo, hi = gain_ci(runs, base)
    assert 0 <= lo <= hi <= 0.5 and hi > 0
    with pytest.raises(ValueError, match="same"):
        gain_ci(np.ones((3, 10)), np.ones((2, 10)))
    assert verdict((-0.2, -0.01)) == "below" and verdict((-0.1, 0.1)) == "unresolved"
