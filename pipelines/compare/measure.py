"""What a comparison measures of its runs, for every claim: one record per
trained run (`collect`), the init statistics of the key dims measured at
init only, the probe attention of the heat maps; and how the claims read
those records (`sliced`, `init_values`, `run_values`, ...).
"""

import io
import os

import numpy as np

from keras_attention.diagnostics import SUMMARY_KEYS
from keras_attention.viz import plot_attention
from pipelines.common import write_bytes_atomic
from pipelines.builders import build_probe_batch
from pipelines.builders import build_task
from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import mean_sd
from pipelines.reports.probes import probe_at_init
from pipelines.reports.probes import probe_trained
from pipelines.run_dir import read_metrics

HEATMAP_DIR = "heatmaps"
# Longest side of a drawn map: a longer context (text at 256 or 512
# characters) is pooled to at most this many cells a side, since a 512x512
# map of one PNG panel shows no single cell anyway.
MAX_HEATMAP_POSITIONS = 128


def _summary(diagnostics_summary):
    """The `SUMMARY_KEYS` of a diagnostics summary as floats (or None)."""
    if not diagnostics_summary:
        return None
    return {
        key: (
            float(diagnostics_summary[key])
            if diagnostics_summary.get(key) is not None
            else None
        )
        for key in SUMMARY_KEYS
    }


# ------------------------------------------------------------ heat maps
def probe_attention(diagnostics):
    """The first probe example's weights in the first attention layer,
    `(heads, T, S)`."""
    first_layer = sorted(diagnostics["layers"])[0]
    return np.asarray(diagnostics["layers"][first_layer]["weights"])[0]


def pool_attention(weights, labels, max_positions=MAX_HEATMAP_POSITIONS):
    """Pools `(heads, T, S)` maps of a long context to at most
    `max_positions` cells a side: blocks of `k = ceil(T / max_positions)`
    positions, the mean over a block's queries and the sum over a block's
    keys (so every row is still a distribution over the key blocks), each
    block labelled by its positions' labels joined. Shorter maps come back
    unchanged.

    Returns:
        `(weights, labels)`.
    """
    weights = np.asarray(weights)
    length = weights.shape[-1]
    if weights.shape[-2] != length or len(labels) != length:
        raise ValueError("weights must be (heads, T, T) self-attention with "
                         f"T labels; got {weights.shape}, {len(labels)} labels")
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


def heatmap_png(weights, labels, title):
    """PNG bytes of one example's labelled attention maps (all heads; queries
    down, keys across; one colour scale, [0, 1])."""
    figure = plot_attention(weights, labels, vmax=1.0, title=title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


# Per-layer statistics a depth comparison keeps (head means).
LAYER_KEYS = ("entropy_normalized", "max_weight", "score_std",
              "grad_norm_scores")


def layer_profile(diagnostics):
    """`[{key: value}]` over the attention layers, bottom first, of a
    diagnostics record's `"layers"` (each value the mean over heads); None
    without one."""
    layers = (diagnostics or {}).get("layers")
    if not layers:
        return None
    # "attention_10" after "attention_9": by the layer's number.
    names = sorted(layers, key=lambda name: int(name.rsplit("_", 1)[-1])
                   if name.rsplit("_", 1)[-1].isdigit() else name)
    return [{key: float(np.mean(layers[name][key])) for key in LAYER_KEYS
             if layers[name].get(key) is not None} for name in names]


# ------------------------------------------------------------ collect
def _run_record(spec, metrics, plan):
    diagnostics = metrics.get("diagnostics") or {}
    init = diagnostics.get("init") or {}
    final = diagnostics.get("final") or {}
    record = {
        "arm": spec.arm,
        "key_dim": spec.values["key_dim"],
        "seed": spec.values["seed"],
        **_slice_values(plan, spec.values),
        "run": spec.name,
        "final_accuracy": metrics.get("heldout_accuracy"),
        "final_loss": metrics.get("heldout_loss"),
        # Text runs: held-out bits per character and the unigram baseline
        # beside it (None on the toy tasks).
        "final_bits": metrics.get("heldout_bits_per_character"),
        "unigram_bits": metrics.get("heldout_unigram_bits_per_character"),
        "steps": metrics.get("steps"),
        "steps_to_target": metrics.get("steps_to_target"),
        "target_accuracy": metrics.get("target_accuracy"),
        "diverged_at_step": metrics.get("diverged_at_step"),
        "wall_time_s": metrics.get("wall_time_s"),
        "eval_history": metrics.get("eval_history"),
        "init": _summary(init.get("summary")),
        "final": _summary(final.get("summary")),
    }
    if "num_layers" in plan.axes:
        record["layers"] = {"init": layer_profile(init),
                            "final": layer_profile(final)}
    return record


def _slice_values(plan, values):
    """A run's values of the axes besides d_k and the seed, for its
    record."""
    return {name: values[name] for name in plan.slice()}


def _trained_record(spec, plan):
    """The record of a finished run."""
    metrics = read_metrics(spec.config.logdir)
    if metrics is None:
        raise RuntimeError(f"{spec.config.logdir} has no metrics.json")
    return _run_record(spec, metrics, plan)


def _heatmaps(spec, init):
    """The spec's heat map entries at init (and trained, when it was), for
    the report and comparison.json: the weights drawn and the probe
    example's token labels."""
    stages = [("init", init)]
    if spec.trained:
        stages.append(("final", probe_trained(spec.config)))
    task = build_task(spec.config)
    labels_at_full = task.token_labels(
        build_probe_batch(spec.config, task)[0][0])
    entries = []
    for stage, diagnostics in stages:
        filename = f"{spec.name}-{stage}.png"
        weights, labels = pool_attention(probe_attention(diagnostics),
                                         labels_at_full)
        entries.append(
            {"arm": spec.arm, "key_dim": spec.values["key_dim"],
             "seed": spec.values["seed"], "stage": stage,
             "path": f"{HEATMAP_DIR}/{filename}", "title": f"{spec.name}, "
             f"{stage}", "labels": labels, "weights": weights.tolist()}
        )
    return entries


def write_heatmaps(logdir, entries):
    """Draws each heat map entry of `collect` to its `path` under `logdir`
    and drops its `"title"` (comparison.json keeps the rest)."""
    os.makedirs(os.path.join(logdir, HEATMAP_DIR), exist_ok=True)
    for entry in entries:
        write_bytes_atomic(
            os.path.join(logdir, entry["path"]),
            heatmap_png(np.asarray(entry["weights"]), entry["labels"],
                        entry.pop("title")))


def collect(plan, log=print):
    """Reads the trained runs, measures the untrained key dims at init and
    the probe attention of the heat maps (both in the grid's slice
    only); writes nothing (`write_heatmaps` draws them).

    Returns:
        A dict `{"runs": [...], "init_only": [...], "heatmaps": [...]}`.
    """
    runs, init_only, heatmaps = [], [], []
    heatmap_key_dim = (
        plan.trained_axis("key_dim")[-1] if plan.trained_axis("key_dim") else plan.axis("key_dim")[-1]
    )
    heatmap_seed = plan.seeds[0]
    for spec in plan.runs():
        if spec.trained:
            runs.append(_trained_record(spec, plan))
        if not plan.in_slice(spec.values):
            continue
        wants_heatmap = (spec.values["key_dim"] == heatmap_key_dim
                         and spec.values["seed"] == heatmap_seed)
        init = None
        if wants_heatmap or not spec.trained:
            init = probe_at_init(spec.config)
        if not spec.trained:
            init_only.append(
                {
                    "arm": spec.arm,
                    "key_dim": spec.values["key_dim"],
                    "seed": spec.values["seed"],
                    **_slice_values(plan, spec.values),
                    "init": _summary(init["summary"]),
                }
            )
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


def group_init(results):
    """`{arm: {key_dim: [init summary, ...]}}` over trained and init-only
    runs."""
    grouped = {}
    for record in results["runs"] + results["init_only"]:
        if record["init"] is not None:
            grouped.setdefault(record["arm"], {}).setdefault(
                record["key_dim"], []).append(record["init"])
    return grouped


def init_values(results, arm, key_dim, key):
    """The init statistic `key` of every seed of (arm, key_dim)."""
    return [record["init"][key]
            for record in results["runs"] + results["init_only"]
            if record["arm"] == arm and record["key_dim"] == key_dim
            and record["init"] is not None]


def run_values(results, arm, key_dim, getter):
    """`getter(record)` of every trained run of (arm, key_dim)."""
    return [getter(record) for record in results["runs"]
            if record["arm"] == arm and record["key_dim"] == key_dim]


def init_points(results, keys):
    """`[(init/<key>/<arm>, mean over seeds, d_k)]` of the init statistics
    `keys`, for a claim's TensorBoard scalars over d_k."""
    return [(f"init/{key}/{arm}", mean_sd([s[key] for s in summaries])[0],
             key_dim)
            for arm, by_key_dim in group_init(results).items()
            for key_dim, summaries in sorted(by_key_dim.items())
            for key in keys]


def document_arms(document, by_arm):
    """The arms of `by_arm` in the comparison's order (comparison.json
    keeps its keys sorted)."""
    return [arm for arm in document["arms"] if arm in by_arm]
