"""Tests of the comparison's pictures on the tiny comparison of
tests/conftest.py (`tiny_comparison`: two arms, two seeds, d_k 4 at init
only and 16 trained for 20 steps, held-out evaluation every 5 steps,
diagnostics every 10): the numbers in
comparison.json equal what the event files and the runs' records hold
(recomputed here with numpy), the figures draw exactly those numbers, the
custom-scalars layout is one TensorBoard accepts, and comparison.html is
self-contained and renders in Chromium with no network.
"""

import json
import math
import os
import re

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard import context as tb_context
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar import custom_scalars_plugin

from _pages import chromium
from pipelines.builders import build_probe_batch
from pipelines.builders import build_task
from pipelines.compare.claims import CLAIMS
from pipelines.compare.report import make_figures
from pipelines.compare.series import CURVE_METRICS
from pipelines.settings import TrainConfig
from pipelines.tensorboard import read_event_scalars

ARMS = ("scaled", "unscaled")
SEEDS = (0, 1)
KEY_DIMS = (4, 16)
TRAINED = 16

# With tests/test_compare.py, on the worker that builds the shared
# comparison once.
pytestmark = pytest.mark.xdist_group("compare")


def _run_dir(logdir, arm, seed):
    return os.path.join(logdir, f"{arm}-dk{TRAINED}-seed{seed}")


def _mean_sd(values):
    values = np.asarray(values, dtype=np.float64)
    return values.mean(), (values.std(ddof=1) if len(values) > 1 else 0.0)


def _init_values(document, arm, key_dim, key):
    return [r["init"][key] for r in document["runs"] + document["init_only"]
            if r["arm"] == arm and r["key_dim"] == key_dim]


def _labelled_lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_curves_are_the_seed_mean_and_sd_of_the_event_files(tiny_comparison):
    logdir, _, document, _ = tiny_comparison
    curves = {(c["key_dim"], c["arm"]): c for c in document["curves"]}
    assert set(curves) == {(TRAINED, arm) for arm in ARMS}
    for arm in ARMS:
        curve = curves[(TRAINED, arm)]
        assert curve["seeds"] == list(SEEDS)
        events = [read_event_scalars(os.path.join(_run_dir(logdir, arm, s),
                                                  "validation"))
                  for s in SEEDS]
        for name, tag, _ in CURVE_METRICS:
            series = curve["metrics"][name]
            steps = sorted(events[0][tag])
            assert series["steps"] == steps
            assert series["count"] == [len(SEEDS)] * len(steps)
            for step, mean, sd in zip(steps, series["mean"], series["sd"]):
                expected = _mean_sd([e[tag][step] for e in events])
                assert (mean, sd) == pytest.approx(expected, rel=1e-9,
                                                   abs=1e-12)
    accuracy = curves[(TRAINED, "scaled")]["metrics"]["accuracy"]
    assert accuracy["steps"] == [0, 5, 10, 15, 20]
    assert len(curves[(TRAINED, "scaled")]["metrics"]["loss"]["steps"]) == 5
    entropy = curves[(TRAINED, "scaled")]["metrics"]["entropy_normalized"]
    assert entropy["steps"] == [0, 10, 20]


def test_figure_data_are_the_records_statistics(tiny_comparison):
    document = tiny_comparison.document
    data = document["figures"]
    for figure, key in (("init_entropy", "entropy_normalized"),
                        ("score_std", "score_std")):
        for arm in ARMS:
            series = data[figure][arm]
            assert series["key_dims"] == list(KEY_DIMS)
            for k, mean, sd in zip(KEY_DIMS, series["mean"], series["sd"]):
                assert (mean, sd) == pytest.approx(
                    _mean_sd(_init_values(document, arm, k, key)))
    assert data["sqrt_key_dim"]["value"] == pytest.approx(
        [math.sqrt(k) for k in KEY_DIMS])
    for key in ("grad_norm_scores", "grad_norm_query"):
        ratios = data["gradient_ratios"][key]
        assert ratios["key_dims"] == list(KEY_DIMS)
        assert ratios["ratio"] == pytest.approx([
            np.mean(_init_values(document, "unscaled", k, key))
            / np.mean(_init_values(document, "scaled", k, key))
            for k in KEY_DIMS])


def test_figures_draw_the_values_of_comparison_json(tiny_comparison):
    logdir, _, document, _ = tiny_comparison
    figures = {name: figure for name, _, figure in make_figures(document, CLAIMS.values())}
    assert set(figures) == {"accuracy", "init_entropy", "score_std",
                            "gradient_ratio", "attention_init",
                            "attention_final"}
    # (a): each arm's mean line, and its band from mean - sd to mean + sd.
    (ax,) = figures["accuracy"].axes
    lines = _labelled_lines(ax)
    for curve in document["curves"]:
        series = curve["metrics"]["accuracy"]
        line = lines[f"{curve['arm']} ({len(SEEDS)} seeds)"]
        np.testing.assert_allclose(line.get_xydata(),
                                   np.column_stack([series["steps"],
                                                    series["mean"]]))
        band = [c for c in ax.collections
                if np.allclose(c.get_facecolor()[0][:3],
                               to_rgb(line.get_color()))]
        vertices = band[0].get_paths()[0].vertices
        for step, mean, sd in zip(series["steps"], series["mean"],
                                  series["sd"]):
            for edge in (mean - sd, mean + sd):
                assert np.any(np.all(np.isclose(vertices, [step, edge]),
                                     axis=1))
    # (b), (c): one line per arm through (d_k, mean), and the √d_k line.
    for name, figure_key in (("init_entropy", "init_entropy"),
                             ("score_std", "score_std")):
        (ax,) = figures[name].axes
        bars = {c.get_label(): c for c in ax.containers}
        for arm in ARMS:
            series = document["figures"][figure_key][arm]
            line, _, (segments,) = bars[arm].lines
            np.testing.assert_allclose(
                line.get_xydata(),
                np.column_stack([series["key_dims"], series["mean"]]))
            np.testing.assert_allclose(
                [segment[:, 1] for segment in segments.get_segments()],
                [[m - sd, m + sd] for m, sd in zip(series["mean"],
                                                   series["sd"])])
        assert ax.get_xscale() == "log"
    lines = _labelled_lines(figures["score_std"].axes[0])
    np.testing.assert_allclose(lines["√d_k"].get_ydata(),
                               document["figures"]["sqrt_key_dim"]["value"])
    # (d): the two ratios.
    lines = _labelled_lines(figures["gradient_ratio"].axes[0])
    for key, label in (("grad_norm_scores", "|dL/dscores| unscaled/scaled"),
                       ("grad_norm_query", "|dL/dW_Q| unscaled/scaled")):
        np.testing.assert_allclose(
            lines[label].get_ydata(),
            document["figures"]["gradient_ratios"][key]["ratio"])
    # (e): the heat-map entries' weights, their difference, the labels.
    config = TrainConfig.from_dict(
        json.load(open(os.path.join(_run_dir(logdir, "scaled", 0),
                                    "config.json"))))
    task = build_task(config)
    labels = task.token_labels(build_probe_batch(config, task)[0][0])
    for stage in ("init", "final"):
        entries = {e["arm"]: e for e in document["heatmaps"]
                   if e["stage"] == stage}
        panels = [ax for ax in figures[f"attention_{stage}"].axes
                  if ax.images]
        scaled = np.asarray(entries["scaled"]["weights"])[0]
        unscaled = np.asarray(entries["unscaled"]["weights"])[0]
        np.testing.assert_array_equal(panels[0].images[0].get_array(), scaled)
        np.testing.assert_array_equal(panels[1].images[0].get_array(),
                                      unscaled)
        np.testing.assert_allclose(panels[2].images[0].get_array(),
                                   unscaled - scaled)
        assert entries["scaled"]["labels"] == labels
        assert [t.get_text() for t in panels[0].get_yticklabels()] == labels


def test_pngs_report_links_and_summary(tiny_comparison):
    logdir, stdout, document, _ = tiny_comparison
    report = open(os.path.join(logdir, "comparison.md")).read()
    for name in ("accuracy", "init_entropy", "score_std", "gradient_ratio",
                 "attention_init", "attention_final"):
        path = f"figures/{name}.png"
        with open(os.path.join(logdir, path), "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
        assert f"]({path})" in report
    # The tables stay.
    assert "### d_k = 16" in report and "| final held-out accuracy |" in report
    assert "comparison.html" in stdout.strip().splitlines()[-2]


def test_custom_scalars_layout_and_bands(tiny_comparison):
    logdir, _, document, _ = tiny_comparison
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    plugin = custom_scalars_plugin.CustomScalarsPlugin(
        base_plugin.TBContext(logdir=logdir, multiplexer=multiplexer,
                              data_provider=provider))
    layout = json.loads(plugin.layout_impl(tb_context.RequestContext(), ""))
    categories = {c["title"]: c for c in layout["category"]}
    # The curves' margin charts, and the claims' charts over d_k.
    assert set(categories) == {"arms: mean ± sd over seeds",
                               "claims: each arm over d_k"}
    category = categories["arms: mean ± sd over seeds"]
    charts = {c["title"]: c["margin"]["series"] for c in category["chart"]}
    assert list(charts) == [title for _, _, title in CURVE_METRICS]
    curve_names = [f"{c['arm']}-dk{TRAINED}" for c in document["curves"]]
    for (name, _, title) in CURVE_METRICS:
        assert charts[title] == [{"value": f"{name}/{curve}/mean",
                                  "lower": f"{name}/{curve}/lower",
                                  "upper": f"{name}/{curve}/upper"}
                                 for curve in curve_names]
    tags = read_event_scalars(os.path.join(logdir, "curves"))
    for curve in document["curves"]:
        for metric, series in curve["metrics"].items():
            name = f"{metric}/{curve['arm']}-dk{TRAINED}"
            for step, mean, sd in zip(series["steps"], series["mean"],
                                      series["sd"]):
                assert tags[f"{name}/mean"][step] == pytest.approx(mean,
                                                                   rel=1e-6)
                assert tags[f"{name}/lower"][step] == pytest.approx(
                    mean - sd, rel=1e-6, abs=1e-7)
                assert tags[f"{name}/upper"][step] == pytest.approx(
                    mean + sd, rel=1e-6, abs=1e-7)
    # The claims' scalars over d_k (step = d_k): numpy's means over seeds
    # of comparison.json's records.
    claims = read_event_scalars(os.path.join(logdir, "claims"))
    records = document["runs"] + document["init_only"]
    for arm in document["arms"]:
        final = [r["final_accuracy"] for r in document["runs"]
                 if r["arm"] == arm]
        assert claims[f"final/accuracy/{arm}"] == {
            TRAINED: pytest.approx(np.mean(final), rel=1e-6)}
        for key in ("score_std", "entropy_normalized", "saturated_fraction",
                    "grad_norm_scores"):
            assert claims[f"init/{key}/{arm}"] == {
                key_dim: pytest.approx(np.mean(
                    [r["init"][key] for r in records
                     if r["arm"] == arm and r["key_dim"] == key_dim]),
                    rel=1e-6, abs=1e-9)
                for key_dim in document["key_dims"]}


def test_comparison_html_is_offline_and_renders(tiny_comparison, tmp_path):
    logdir = tiny_comparison.logdir
    path = os.path.join(logdir, "comparison.html")
    page = open(path, encoding="utf-8").read()
    assert not re.search(r"https?://", page, re.IGNORECASE)
    assert not re.search(r"""src\s*=\s*["'](?!data:)""", page)
    assert page.count("<svg") == 6
    with chromium(1200, 1600) as driver:
        driver.get("file://" + path)
        figures = driver.execute_script(
            "return Array.from(document.querySelectorAll('figure svg'))"
            ".map(s => [s.closest('figure').id, s.getBBox().width,"
            " s.textContent.includes('training step') ||"
            " s.textContent.includes('d_k')])")
        assert [f[0] for f in figures] == [
            "figure-accuracy", "figure-init_entropy", "figure-score_std",
            "figure-gradient_ratio", "figure-attention_init",
            "figure-attention_final"]
        assert all(width > 100 for _, width, _ in figures)
        assert all(has_text for _, _, has_text in figures[:4])
        images = driver.execute_script(
            "return Array.from(document.images).map(i => i.naturalWidth)")
        assert len(images) == 4 and all(width > 0 for width in images)
        tables = driver.find_elements("css selector", "table")
        assert len(tables) >= 3
        driver.save_screenshot(str(tmp_path / "comparison.png"))
