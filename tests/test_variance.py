"""Tests of `keras-attention variance`: Var(q.k) against the lesson's theory."""

import json
import math

import numpy as np
import pytest

from pipelines import cli
from pipelines import variance


def _theoretical_sd_of_sample_variance(key_dim, samples):
    # q.k = sum of d independent x*y, x, y ~ N(0, 1): each term has variance
    # 1 and fourth moment E[x^4] E[y^4] = 9. The fourth central moment of
    # the sum is d * 9 + 3 d (d - 1); the sample variance of n draws has
    # variance (mu4 - sigma^4) / n.
    mu4 = 9 * key_dim + 3 * key_dim * (key_dim - 1)
    return math.sqrt((mu4 - key_dim**2) / samples)


@pytest.mark.parametrize("key_dim", [1, 16, 256])
def test_variance_matches_theory_within_sampling_error(key_dim):
    samples = 20000
    (row,) = variance.variance_table([key_dim], samples, seed=3)
    sd = _theoretical_sd_of_sample_variance(key_dim, samples)
    # 5 standard errors: a false failure has probability ~1e-6.
    assert abs(row["var_unscaled"] - key_dim) < 5 * sd
    assert abs(row["var_scaled"] - 1.0) < 5 * sd / key_dim
    assert row["theory_unscaled"] == key_dim
    assert row["theory_scaled"] == 1.0
    assert row["std_unscaled"] == pytest.approx(math.sqrt(row["var_unscaled"]))
    assert row["relative_standard_error"] == pytest.approx(sd / key_dim)


def test_scaled_scores_are_unscaled_over_sqrt_key_dim():
    unscaled, scaled = variance.sample_scores(64, 500, seed=1)
    np.testing.assert_allclose(scaled, unscaled / 8.0, rtol=1e-6, atol=1e-6)
    # Independent pairs: the mean of q.k is 0 up to sampling error.
    assert abs(np.mean(unscaled)) < 5 * 8.0 / math.sqrt(500)


def test_standard_error_predicts_the_spread_over_seeds():
    key_dim, samples = 16, 2000
    estimates = [
        variance.variance_table([key_dim], samples, seed=seed)[0][
            "var_unscaled"
        ]
        for seed in range(40)
    ]
    predicted = _theoretical_sd_of_sample_variance(key_dim, samples)
    # The sd of 40 draws is within a factor 1.5 of the truth with
    # overwhelming probability.
    assert predicted / 1.5 < np.std(estimates, ddof=1) < predicted * 1.5


def test_draws_are_reproducible_and_seeded():
    first = variance.variance_table([32], 1000, seed=5)
    again = variance.variance_table([32], 1000, seed=5)
    other = variance.variance_table([32], 1000, seed=6)
    assert first == again
    assert first[0]["var_unscaled"] != other[0]["var_unscaled"]


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="key_dims"):
        variance.variance_table([0], 100)
    with pytest.raises(ValueError, match="num_samples"):
        variance.variance_table([4], 1)


def test_variance_markdown_has_a_row_per_key_dim():
    rows = variance.variance_table([4, 9], 500, seed=0)
    lines = variance.variance_markdown(rows)
    assert len(lines) == 4
    cells = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert cells[0] == "9"
    assert float(cells[1]) == pytest.approx(rows[1]["var_unscaled"], abs=0.005)
    assert cells[2] == "9"
    assert float(cells[6]) == pytest.approx(3.0)


def test_command_prints_the_table_and_writes_json(tmp_path, capsys):
    output = tmp_path / "variance.json"
    status = cli.main(
        ["variance", "--key-dims", "4,64", "--samples", "4000",
         "--output", str(output)]
    )
    assert status == 0
    printed = capsys.readouterr().out
    rows = json.loads(output.read_text())["rows"]
    assert [row["key_dim"] for row in rows] == [4, 64]
    assert f"| 64 | {rows[1]['var_unscaled']:.2f} | 64 |" in printed


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--key-dims", "16,x"], "--key-dims"),
        (["--key-dims", "0"], "--key-dims"),
        (["--key-dims", "8,8"], "--key-dims"),
        (["--samples", "1"], "--samples"),
        (["--samples", "many"], "--samples"),
    ],
)
def test_bad_flags_exit_2_with_one_line(flags, message, capsys):
    assert cli.main(["variance", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error
    assert message in error
