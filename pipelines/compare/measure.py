"""What a comparison measures of its runs for the claims (`collect`: the
records, the init-only probes, the heat maps) and how the claims read
those records (`sliced`, `init_values`, `run_values`, ...)."""

import io
import os

import numpy as np

from keras_attention.diagnostics import SUMMARY_KEYS
from keras_attention.viz import plot_attention
from pipelines.common import write_bytes_atomic
from pipelines.builders import build_probe_batch
from pipelines.builders import build_task
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import over_seeds
from pipelines.reports.probes import probe_at_init
from pipelines.reports.probes import probe_trained
from pipelines.run_dir import read_metrics

HEATMAP_DIR = "heatmaps"
# Longest side of a drawn map: a longer context (text at 256 or 512
# characters) is pooled to at most this many cells a side, since a 512x512
# map of one PNG panel shows no single cell anyway.
MAX_HEATMAP_POSITIONS = 128


def _summary(summary):
    """The `SUMMARY_KEYS` of a diagnostics summary as floats (or None)."""
    if not summary:
        return None
    return {key: None if summary.get(key) is None else float(summary[key])
            for key in SUMMARY_KEYS}


# ------------------------------------------------------------ heat maps
def pool_attention(weights, labels, max_positions=MAX_HEATMAP_POSITIONS):
    """`(weights, labels)` of `(heads, T, T)` maps pooled to at most
    `max_positions` cells a side: blocks of `ceil(T / max_positions)`
    positions, the mean over a block's queries and the sum over its keys
    (rows stay distributions), labels joined; shorter maps unchanged."""
    weights = np.asarray(weights)
    length = weights.shape[-1]
    if weights.shape[-2] != length or len(labels) != length:
        raise ValueError(
            "weights must be (heads, T, T) self-attention with T labels; "
            f"got {weights.shape}, {len(labels)} labels")
    block = -(-length // max_positions)
    if block == 1:
        return weights, list(labels)
    padded = -(-length // block) * block
    # Padding queries would dilute the last block's mean: average over the
    # real ones only; padding keys carry no weight.
    grid = np.zeros(weights.shape[:-2] + (padded, padded))
    grid[..., :length, :length] = weights
    heads, cells = weights.shape[0], padded // block
    sums = grid.reshape(heads, cells, block, cells, block).sum(axis=(2, 4))
    counts = np.minimum(block, length - block * np.arange(cells))
    pooled = sums / counts[None, :, None]
    joined = ["".join(labels[i:i + block]) for i in range(0, length, block)]
    return pooled, joined


# Per-layer statistics a depth comparison keeps (head means).
LAYER_KEYS = ("entropy_normalized", "max_weight", "score_std",
              "grad_norm_scores")


def layer_profile(diagnostics):
    """`[{key: mean over heads}]` per attention layer, bottom first, of a
    diagnostics record (None without layers)."""
    layers = (diagnostics or {}).get("layers")
    if not layers:
        return None
    # "attention_10" after "attention_9": by the layer's number.
    names = sorted(layers, key=lambda name: int(name.rsplit("_", 1)[-1])
                   if name.rsplit("_", 1)[-1].isdigit() else name)
    return [{key: float(np.mean(layers[name][key])) for key in LAYER_KEYS
             if layers[name].get(key) is not None} for name in names]


# ------------------------------------------------------------ collect
def _trained_record(spec, plan):
    """The record of a finished run."""
    metrics = read_metrics(spec.config.logdir)
    if metrics is None:
        raise RuntimeError(f"{spec.config.logdir} has no metrics.json")
    diagnostics = metrics.get("diagnostics") or {}
    init = diagnostics.get("init") or {}
    final = diagnostics.get("final") or {}
    record = {
        "arm": spec.arm,
        "key_dim": spec.values["key_dim"],
        "seed": spec.values["seed"],
        **{name: spec.values[name] for name in plan.slice()},
        "run": spec.name,
        "final_accuracy": metrics.get("heldout_accuracy"),
        "final_loss": metrics.get("heldout_loss"),
        # Text runs: held-out bits per character and the unigram baseline
        # beside it (None on the toy tasks).
        "final_bits": metrics.get("heldout_bits_per_character"),
        "unigram_bits": metrics.get("heldout_unigram_bits_per_character"),
        **{key: metrics.get(key) for key in (
            "steps", "steps_to_target", "target_accuracy",
            "diverged_at_step", "wall_time_s", "eval_history")},
        "init": _summary(init.get("summary")),
        "final": _summary(final.get("summary")),
    }
    if "num_layers" in plan.axes:
        record["layers"] = {"init": layer_profile(init),
                            "final": layer_profile(final)}
    return record


def _heatmaps(spec, init):
    """The spec's heat map entries at init (and trained, when it was)."""
    stages = [("init", init)]
    if spec.trained:
        stages.append(("final", probe_trained(spec.config)))
    task = build_task(spec.config)
    labels_at_full = task.token_labels(
        build_probe_batch(spec.config, task)[0][0])
    entries = []
    for stage, diagnostics in stages:
        filename = f"{spec.name}-{stage}.png"
        # The first probe example in the first attention layer.
        layers = diagnostics["layers"]
        weights, labels = pool_attention(
            np.asarray(layers[sorted(layers)[0]]["weights"])[0],
            labels_at_full)
        entries.append(
            {"arm": spec.arm, "key_dim": spec.values["key_dim"],
             "seed": spec.values["seed"], "stage": stage,
             "path": f"{HEATMAP_DIR}/{filename}", "title": f"{spec.name}, "
             f"{stage}", "labels": labels, "weights": weights.tolist()})
    return entries


def write_heatmaps(logdir, entries):
    """Draws each heat map entry of `collect` to its `path` under `logdir`
    and drops its `"title"` (comparison.json keeps the rest)."""
    os.makedirs(os.path.join(logdir, HEATMAP_DIR), exist_ok=True)
    for entry in entries:
        figure = plot_attention(np.asarray(entry["weights"]), entry["labels"],
                                vmax=1.0, title=entry.pop("title"))
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110)
        write_bytes_atomic(os.path.join(logdir, entry["path"]),
                           buffer.getvalue())


def collect(plan):
    """`{"runs", "init_only", "heatmaps"}`: the trained runs' records, the
    untrained key dims probed at init and the heat maps' probe attention
    (both in the grid's slice); writes nothing."""
    runs, init_only, heatmaps = [], [], []
    heatmap_key_dim = (plan.trained_axis("key_dim")
                       or plan.axis("key_dim"))[-1]
    heatmap_seed = plan.seeds[0]
    for spec in plan.runs():
        if spec.trained:
            runs.append(_trained_record(spec, plan))
        if not plan.in_slice(spec.values):
            continue
        wants_heatmap = (spec.values["key_dim"] == heatmap_key_dim
                         and spec.values["seed"] == heatmap_seed)
        init = (probe_at_init(spec.config)
                if wants_heatmap or not spec.trained else None)
        if not spec.trained:
            init_only.append({
                "arm": spec.arm, "key_dim": spec.values["key_dim"],
                "seed": spec.values["seed"],
                **{name: spec.values[name] for name in plan.slice()},
                "init": _summary(init["summary"])})
        if wants_heatmap:
            heatmaps += _heatmaps(spec, init)
    return {"runs": runs, "init_only": init_only, "heatmaps": heatmaps}


# ------------------------------------------------ reading the records
def sliced(plan, results):
    """`results` restricted to the grid's slice (`Grid.slice`), the runs
    the claims over d_k read (the heat maps are drawn in it only)."""
    if not plan.slice():
        return results
    return {key: ([record for record in records if plan.in_slice(record)]
                  if key in ("runs", "init_only") else records)
            for key, records in results.items()}


def has_pair(plan):
    """Whether the grid has both arms of the pair (`presets.PAIR`)."""
    return all(arm in plan.arms for arm in PAIR)


def init_stats(results, key):
    """`{(arm, key_dim): {"mean", "sd", "values"}}` of the init statistic
    `key` over the seeds of the trained and init-only runs."""
    return over_seeds([r for r in results["runs"] + results["init_only"]
                       if r["init"] is not None], ("arm", "key_dim"),
                      lambda r: r["init"][key])


def init_values(results, arm, key_dim, key):
    """The init statistic `key` of every seed of (arm, key_dim)."""
    return [record["init"][key]
            for record in results["runs"] + results["init_only"]
            if record["arm"] == arm and record["key_dim"] == key_dim
            and record["init"] is not None]


def run_values(results, arm, key_dim, getter=lambda record: record):
    """`getter(record)` of every trained run of (arm, key_dim) (default:
    the records)."""
    return [getter(record) for record in results["runs"]
            if record["arm"] == arm and record["key_dim"] == key_dim]


def init_points(results, keys):
    """`[(init/<key>/<arm>, mean over seeds, d_k)]` of the init statistics
    `keys`, for a claim's TensorBoard scalars over d_k."""
    stats = {key: init_stats(results, key) for key in keys}
    groups = list(stats[keys[0]])
    arms = list(dict.fromkeys(arm for arm, _ in groups))
    return [(f"init/{key}/{arm}", stats[key][arm, key_dim]["mean"], key_dim)
            for arm, key_dim in sorted(
                groups, key=lambda group: (arms.index(group[0]), group[1]))
            for key in keys]


def document_arms(document, by_arm):
    """The arms of `by_arm` in the comparison's order (comparison.json sorts
    its keys)."""
    return [arm for arm in document["arms"] if arm in by_arm]
