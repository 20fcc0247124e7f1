"""`keras-attention compare --task text`: a tiny comparison on a file
written here, end to end (the text preset chosen, bits per character in the
report against the runs' own metrics.json, character labels on the heat
maps), claim 3 on text from hand-made records (the gap in bits per
character), and the pooling of long maps against numpy."""

import json
import re

import numpy as np
import pytest

from pipelines.cli import main
from pipelines.compare.claims.learning import BITS_GAP
from pipelines.compare.claims.learning import learning_claim
from pipelines.compare.claims.learning import learning_verdict
from pipelines.compare.measure import pool_attention
from test_claims import SEEDS
from test_claims import TARGET
from test_claims import _plan
from test_claims import _results

TEXT = "".join(["def f(a, b):\n    return (a + b)\n"] * 12
               + ["x = [1, 2]\n"])
TINY = ["compare", "--task", "text", "--key-dims", "4,8",
        "--train-key-dims", "8", "--seeds", "2", "--steps", "8",
        "--seq-len", "8", "--d-model", "16", "--num-heads", "1",
        "--batch-size", "4", "--heldout-size", "4", "--probe-size", "2",
        "--eval-every", "4", "--diagnostics-every", "4",
        "--checkpoint-every", "8", "--variance-samples", "0",
        "--backend", "tensorflow"]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare_text")
    path = root / "tiny.txt"
    path.write_text(TEXT, encoding="utf-8")
    logdir = root / "cmp"
    assert main([*TINY, "--text-file", str(path), "--layers", "1",
                 "--logdir", str(logdir)]) == 0
    document = json.loads((logdir / "comparison.json").read_text("utf-8"))
    return logdir, document


def _metrics(logdir, run):
    return json.loads((logdir / run / "metrics.json").read_text("utf-8"))


def test_text_comparison_reports_the_runs_bits_per_character(comparison):
    logdir, document = comparison
    assert document["preset"] == "text"
    runs = document["runs"]
    assert sorted((r["arm"], r["seed"]) for r in runs) == [
        ("scaled", 0), ("scaled", 1), ("unscaled", 0), ("unscaled", 1)]
    table = (logdir / "comparison.md").read_text("utf-8")
    for arm in ("scaled", "unscaled"):
        metrics = [_metrics(logdir, f"{arm}-dk8-seed{s}") for s in (0, 1)]
        bits = [m["heldout_bits_per_character"] for m in metrics]
        # The held-out loss is in nats: bits are that over ln 2.
        assert bits == pytest.approx(
            [m["heldout_loss"] / np.log(2) for m in metrics])
        recorded = [r["final_bits"] for r in runs if r["arm"] == arm]
        assert recorded == bits
        unigram = {m["heldout_unigram_bits_per_character"] for m in metrics}
        assert len(unigram) == 1
        mean, sd = np.mean(bits), np.std(bits, ddof=1)
        assert f"{mean:.3f} ± {sd:.3f}" in table
    row = re.search(r"\| held-out bits per character \|(.*)\|", table)
    assert row, "no bits-per-character row"
    assert re.search(r"\| unigram baseline \(bits per character\) \| "
                     rf"{unigram.pop():.3f} \| ", table)
    gap = document["claims"]["3"]["by_key_dim"][-1]
    expected = [
        _metrics(logdir, f"unscaled-dk8-seed{s}")["heldout_bits_per_character"]
        - _metrics(logdir, f"scaled-dk8-seed{s}")["heldout_bits_per_character"]
        for s in (0, 1)]
    assert gap["bits_difference"] == pytest.approx(expected)
    assert "Held-out bits per character, unscaled minus scaled" in table


def test_text_heat_maps_show_characters(comparison):
    logdir, document = comparison
    vocab = json.loads(
        (logdir / "scaled-dk8-seed0" / "vocab.json").read_text("utf-8"))
    entries = document["heatmaps"]
    assert {(e["arm"], e["stage"]) for e in entries} == {
        (arm, stage) for arm in ("scaled", "unscaled")
        for stage in ("init", "final")}
    shown = set("".join(TEXT)) - {" ", "\n"} | {"␣", "⏎"}
    for entry in entries:
        assert len(entry["labels"]) == 8
        assert set(entry["labels"]) <= shown, entry["labels"]
        assert (logdir / entry["path"]).stat().st_size > 0
    assert vocab  # the vocabulary the labels come from is saved with a run


def _text_results(scaled_bits, unscaled_bits):
    """Both arms at the same accuracy: only bits per character differ."""
    results = _results({"scaled": [0.5, 0.5], "unscaled": [0.5, 0.5]})
    for record in results["runs"]:
        bits = scaled_bits if record["arm"] == "scaled" else unscaled_bits
        record["final_bits"] = bits[record["seed"]]
        record["unigram_bits"] = 4.5
    return results


def test_claim_3_on_text_is_decided_by_bits_per_character():
    claim = learning_claim(_plan(), _text_results([2.0, 2.1], [2.5, 2.3]))
    (gap,) = claim["by_key_dim"]
    assert gap["accuracy_difference"] == [0.0, 0.0]
    assert gap["bits_difference"] == pytest.approx([0.5, 0.2])
    assert claim["holds"] is True
    lines, holds = learning_verdict(claim, TARGET)
    assert holds is True
    assert "per seed +0.500, +0.200" in lines[0]
    assert "A training gap on every seed." in lines[0]
    assert lines[-1].startswith("Claim 3 holds on text, as slower learning")
    # One seed under BITS_GAP: no gap on every seed, the claim fails.
    close = [2.1 + BITS_GAP / 2, 2.5]
    claim = learning_claim(_plan(), _text_results([2.1, 2.0], close))
    assert claim["by_key_dim"][0]["gap_every_seed"] is False
    assert claim["by_key_dim"][0]["gap_on_average"] is True
    assert claim["holds"] is False
    assert learning_verdict(claim, TARGET)[0][-1].startswith(
        "Claim 3 is NOT supported")
    assert SEEDS == [0, 1]


def test_long_maps_are_pooled_to_block_means_over_queries_and_sums_over_keys():
    rng = np.random.default_rng(0)
    weights = rng.random((2, 7, 7))
    weights /= weights.sum(-1, keepdims=True)
    labels = list("abcdefg")
    pooled, joined = pool_attention(weights, labels, max_positions=3)
    # Blocks of ceil(7 / 3) = 3: positions 0-2, 3-5, 6.
    blocks = [(0, 3), (3, 6), (6, 7)]
    expected = np.array([[[weights[h, q0:q1, k0:k1].sum(-1).mean()
                           for k0, k1 in blocks] for q0, q1 in blocks]
                         for h in range(2)])
    np.testing.assert_allclose(pooled, expected)
    np.testing.assert_allclose(pooled.sum(-1), 1.0)
    assert joined == ["abc", "def", "g"]
    same, same_labels = pool_attention(weights, labels, max_positions=7)
    np.testing.assert_array_equal(same, weights)
    assert same_labels == labels
