"""`keras_attention.diagnostics.length`: attention against the number of
keys at initialisation, against a numpy Monte Carlo written here and
hand-computed cases of the theory."""

import math

import numpy as np
import pytest

from keras_attention.diagnostics.length import STATISTICS
from keras_attention.diagnostics.length import iid_theory
from keras_attention.diagnostics.length import length_at_init

LENGTHS = (16, 128, 1024)


def _normalized(x):
    """Zero mean, unit variance over the last axis (a layer norm)."""
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6)


def numpy_monte_carlo(score_scale, key_dim, lengths, trials, seed,
                      qk_norm=False):
    """Means and standard errors of the five statistics, float64 numpy:
    `score_scale(n)` multiplies q·k; the relevant key is sqrt(d) q/|q|;
    with `qk_norm` q and every key are layer-normalized first."""
    rng = np.random.default_rng(seed)
    found = {name: [] for name in STATISTICS}
    for n in lengths:
        q = rng.standard_normal((trials, key_dim))
        random = rng.standard_normal((trials, n, key_dim))
        relevant = math.sqrt(key_dim) * q / np.linalg.norm(q, axis=1,
                                                           keepdims=True)
        if qk_norm:
            q, random, relevant = map(_normalized, (q, random, relevant))
        recall = np.concatenate([relevant[:, None], random[:, 1:]], axis=1)
        rows = []
        for keys in (recall, random):
            scores = score_scale(n) * np.einsum("td,tnd->tn", q, keys)
            p = np.exp(scores - scores.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            entropy = -np.sum(p * np.log(np.maximum(p, 1e-300)), 1) / np.log(n)
            rows.append((entropy, p[:, 0], p.max(1)))
        values = (*rows[0], rows[1][0], rows[1][2])
        for name, value in zip(STATISTICS, values):
            found[name].append((value.mean(), value.std() / math.sqrt(trials)))
    return {name: np.array(pairs) for name, pairs in found.items()}


@pytest.mark.parametrize("scale,score_scale", [
    ("sqrt", lambda n: 1 / 4.0),
    ("none", lambda n: 1.0),
    ("ssmax", lambda n: math.log(n) / (4.0 * math.log(64))),
], ids=["sqrt", "none", "ssmax"])
def test_measurement_matches_a_numpy_monte_carlo(scale, score_scale):
    found = length_at_init(scale, key_dim=16, lengths=LENGTHS,
                           num_trials=300, seed=1)
    expected = numpy_monte_carlo(score_scale, 16, LENGTHS, 600, seed=2)
    np.testing.assert_array_equal(found["num_keys"], LENGTHS)
    np.testing.assert_allclose(found["score_scale"],
                               [score_scale(n) for n in LENGTHS], rtol=1e-6)
    for name in STATISTICS:
        mean, sem = expected[name].T
        tolerance = 4 * np.hypot(sem, found[f"{name}_sem"]) + 2e-3
        assert np.all(np.abs(found[name] - mean) <= tolerance), (
            name, found[name], mean, tolerance)


def test_qk_norm_matches_a_numpy_monte_carlo_of_normalized_q_and_k():
    found = length_at_init("sqrt", key_dim=16, lengths=LENGTHS,
                           num_trials=300, seed=1, qk_norm=True)
    expected = numpy_monte_carlo(lambda n: 0.25, 16, LENGTHS, 600, seed=2,
                                 qk_norm=True)
    assert found["qk_norm"] is True
    for name in STATISTICS:
        mean, sem = expected[name].T
        tolerance = 4 * np.hypot(sem, found[f"{name}_sem"]) + 2e-3
        assert np.all(np.abs(found[name] - mean) <= tolerance), (
            name, found[name], mean, tolerance)


def test_learned_is_sqrt_and_ssmax_is_sqrt_at_its_reference_length():
    sqrt = length_at_init("sqrt", key_dim=8, lengths=(16, 64), num_trials=32)
    learned = length_at_init("learned", key_dim=8, lengths=(16, 64),
                             num_trials=32)
    ssmax = length_at_init("ssmax", key_dim=8, lengths=(16, 64),
                           num_trials=32, reference_length=64)
    assert ssmax["head_scale"] == pytest.approx(1 / math.log(64))
    for name in STATISTICS:
        np.testing.assert_allclose(learned[name], sqrt[name], rtol=1e-6)
        np.testing.assert_allclose(ssmax[name][1], sqrt[name][1], rtol=1e-5)
    # Below its reference length ssmax is flatter than sqrt.
    assert ssmax["iid_entropy_normalized"][0] > sqrt[
        "iid_entropy_normalized"][0]


def test_theory_against_hand_computed_cases():
    n = np.array([16.0, 4096.0])
    # Nearly equal scores: uniform rows; the relevant key's weight
    # e^{s*} / (e^{s*} + n - 1).
    flat = iid_theory(n, 1e-4, 2.0)
    np.testing.assert_allclose(flat["iid_entropy_normalized"], 1.0, atol=1e-6)
    np.testing.assert_allclose(flat["iid_max_weight"], 1 / n, rtol=1e-3)
    np.testing.assert_allclose(flat["relevant_weight"],
                               np.e**2 / (np.e**2 + n - 1), rtol=1e-4)
    # σ = 1: the simple form 1 - 1/(2 log n), which the computed theory
    # (the largest key apart) tops by 0.037 at n = 16.
    unit = iid_theory(n, 1.0, 8.0)
    assert np.all(unit["holds"])
    np.testing.assert_allclose(unit["iid_entropy_normalized"],
                               1 - 1 / (2 * np.log(n)), atol=0.05)
    np.testing.assert_allclose(unit["relevant_weight"][1], np.e**8 / (
        np.e**8 + 4095 * np.e**0.5), rtol=2e-3)
    large = iid_theory(n, 8.0, 64.0)
    assert not np.any(large["holds"])
    assert np.all(np.isfinite(large["iid_max_weight"]))
    np.testing.assert_allclose(large["relevant_weight"], 1.0)


def test_theory_follows_the_measurement_where_it_holds():
    found = length_at_init("sqrt", key_dim=64, lengths=(16, 256, 4096),
                           num_trials=128)
    theory = found["theory"]
    assert np.all(theory["holds"])
    np.testing.assert_allclose(theory["score_std"], 1.0)
    for name in ("relevant_weight", "iid_entropy_normalized",
                 "iid_max_weight"):
        np.testing.assert_allclose(found[name], theory[name], atol=0.04,
                                   err_msg=name)
    # The fading of the relevant key, measured: more keys, less weight.
    assert np.all(np.diff(found["relevant_weight"]) < 0)


@pytest.mark.parametrize("kwargs,argument", [
    ({"scale": "bogus"}, "`scale`"),
    ({"lengths": (16, 8)}, "`lengths`"),
    ({"lengths": (1, 8)}, "`lengths`"),
    ({"num_trials": 0}, "`num_trials`"),
    ({"scale": "sqrt", "reference_length": 64}, "`reference_length`"),
    ({"scale": "ssmax", "head_scale": -1.0}, "`head_scale`"),
])
def test_bad_arguments_are_named(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        length_at_init(**{"lengths": (16,), "num_trials": 2, **kwargs})
