"""PF-PPO's drawing weights and draws (`rlflow.algos.pf_ppo`) against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.algos.pf_ppo import WEIGHT_FLOOR, pf_ppo_indices, pf_ppo_weights

SCORES = np.array([0.0, 1.0, -2.0, 1.0, 0.5])


@pytest.mark.parametrize(
    ("method", "weight_pow", "expected"),
    [
        ("pow", 2.0, [0.0, 1.0, 4.0, 1.0, 0.25]),
        ("pow", 1.0, [0.0, 1.0, 2.0, 1.0, 0.5]),
        ("pow", 0.0, [1.0, 1.0, 1.0, 1.0, 1.0]),  # numpy: 0 ** 0 = 1, every response alike
        ("max_min", 2.0, [0.0, 1.0, 1.0, 1.0, 0.0]),  # the two best (1.0) and the worst (-2.0)
        ("max_random", 2.0, [0.1, 0.4, 0.1, 0.4, 0.1]),
    ],
)
def test_weights_of_each_method(method, weight_pow, expected):
    got = pf_ppo_weights(SCORES, method, weight_pow)
    np.testing.assert_allclose(got, np.array(expected) + WEIGHT_FLOOR, rtol=0, atol=1e-15)


def test_equal_scores_are_drawn_uniformly():
    for method in ("max_min", "max_random", "pow"):
        w = pf_ppo_weights(np.zeros(4), method, 2.0)
        assert np.all(w == w[0]) and w[0] > 0


def test_draw_frequencies_follow_the_weights():
    # 4 x 5000 responses scored 0, 1, 2, 3; with pow 1 a draw lands on score k with probability k / 6.
    scores = np.repeat([0.0, 1.0, 2.0, 3.0], 5000)
    rows = pf_ppo_indices(scores, "pow", 1.0, seed=3, step=1)
    assert rows.shape == (20000,) and rows.dtype == np.int64
    drawn = scores[rows]
    assert np.count_nonzero(drawn == 0.0) == 0  # weight 1e-8 of 30000: ~1e-12 expected draws
    for k in (1.0, 2.0, 3.0):
        # binomial standard deviation at most 0.0036 for 20000 draws: 0.02 is over 5 of them
        assert abs(np.mean(drawn == k) - k / 6) < 0.02


def test_the_draw_is_keyed_by_seed_and_step():
    scores = np.linspace(-1.0, 1.0, 64)
    a = pf_ppo_indices(scores, "pow", 2.0, seed=1, step=5)
    np.testing.assert_array_equal(a, pf_ppo_indices(scores, "pow", 2.0, seed=1, step=5))
    assert not np.array_equal(a, pf_ppo_indices(scores, "pow", 2.0, seed=1, step=6))
    assert not np.array_equal(a, pf_ppo_indices(scores, "pow", 2.0, seed=2, step=5))


def test_max_min_draws_only_the_extremes():
    scores = np.array([0.2, 0.9, 0.1, 0.5, 0.9, 0.3])
    rows = pf_ppo_indices(scores, "max_min", 2.0, seed=0, step=1)
    assert set(rows.tolist()) <= {1, 2, 4}


@pytest.mark.parametrize(
    ("scores", "method", "weight_pow", "message"),
    [
        (SCORES, "top_k", 2.0, "unknown method 'top_k'"),
        (SCORES, "pow", -1.0, "weight_pow must be >= 0"),
        (np.array([0.0, np.nan]), "pow", 2.0, r"non-finite scores at rows \[1\]"),
        (np.zeros((2, 2)), "pow", 2.0, "non-empty"),
    ],
)
def test_bad_input_is_refused(scores, method, weight_pow, message):
    with pytest.raises(ValueError, match=message):
        pf_ppo_weights(scores, method, weight_pow)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.pf_ppo.reweight_method=top_k"],
            r"^algorithm\.pf_ppo\.reweight_method='top_k' is not one of",
        ),
        (["algorithm.pf_ppo.weight_pow=-1.0"], r"^algorithm\.pf_ppo\.weight_pow=-1\.0 must be >= 0"),
    ],
)
def test_pf_ppo_settings_are_checked_before_ray_starts(overrides, message):
    from rlflow.trainer.check_config import check_config

    check_config([*overrides, "algorithm.use_pf_ppo=false"], "demo")  # read only when PF-PPO is on
    with pytest.raises(ValueError, match=message):
        check_config([*overrides, "algorithm.use_pf_ppo=true"], "demo")
