"""The comparison's documents: `comparison.md` (`render_report`) and
`comparison.json` (`build_comparison`)."""

from pipelines.common import markdown_table
from pipelines.common import to_jsonable
from pipelines.engine.presets import ARMS
from pipelines.compare.axes import slice_note
from pipelines.compare.axes import slice_values
from pipelines.compare.axes import sliced
from pipelines.compare.claims import init_values
from pipelines.compare.claims import run_values
from pipelines.compare.depth import depth_section
from pipelines.compare.depth import depth_verdict
from pipelines.reports.numbers import SD_NOTE
from pipelines.reports.numbers import fmt, fmt_mean_sd, fmt_steps, ratio
from pipelines.compare.length import length_section
from pipelines.compare.length import length_verdict
from pipelines.compare.verdicts import STATEMENTS
from pipelines.compare.verdicts import learning_verdict
from pipelines.compare.verdicts import saturation_verdict
from pipelines.compare.verdicts import status_word
from pipelines.compare.verdicts import variance_verdict
from pipelines.variance import variance_markdown

# Rows of the per-key_dim tables: (label, key, digits).
_TABLE_ROWS = (
    ("score std", "score_std", 3),
    ("entropy (nats)", "entropy", 3),
    ("entropy / log(keys)", "entropy_normalized", 3),
    ("max weight", "max_weight", 3),
    ("saturated rows (max ≥ 0.99)", "saturated_fraction", 3),
    ("\\|dL/dscores\\| (softmax input)", "grad_norm_scores", 5),
    ("\\|dL/dW_Q\\|", "grad_norm_query", 5),
    ("\\|dL/dW_K\\|", "grad_norm_key", 5),
)
_PAIR = ("scaled", "unscaled")


def _stage_values(results, arm, key_dim, stage, key):
    if stage == "init":
        return init_values(results, arm, key_dim, key)
    return run_values(results, arm, key_dim,
                      lambda r: (r["final"] or {}).get(key))


def _bits_rows(plan, results, key_dim):
    """Text runs: held-out bits per character per arm and the unigram
    baseline beside it (no rows on the toy tasks)."""
    rows = []
    for label, key in (("held-out bits per character", "final_bits"),
                       ("unigram baseline (bits per character)",
                        "unigram_bits")):
        values = [run_values(results, arm, key_dim, lambda r: r.get(key))
                  for arm in plan.arms]
        if any(v is not None for arm_values in values for v in arm_values):
            # The baseline is the held-out text's, the same for every run:
            # its mean alone.
            digits = [fmt_mean_sd(v, 3) if key == "final_bits"
                      else fmt_mean_sd(v[:1], 3) for v in values]
            rows.append([label, *digits])
    return rows


def key_dim_table(plan, results, key_dim):
    """The Markdown table of one key_dim: arms side by side (lines)."""
    trained = key_dim in plan.trained_axis("key_dim")
    rows = []
    if trained:
        rows.append(["final held-out accuracy", *(
            fmt_mean_sd(run_values(results, arm, key_dim,
                                   lambda r: r["final_accuracy"]))
            for arm in plan.arms
        )])
        rows += _bits_rows(plan, results, key_dim)
        rows.append([
            f"steps to {plan.base.target_accuracy:g} (seeds reaching)", *(
                fmt_steps(run_values(results, arm, key_dim, lambda r: r))
                for arm in plan.arms
            )])
    for stage in ("init", "final") if trained else ("init",):
        for label, key, digits in _TABLE_ROWS:
            rows.append([f"{stage}: {label}", *(
                fmt_mean_sd(_stage_values(results, arm, key_dim, stage, key),
                            digits)
                for arm in plan.arms
            )])
    return markdown_table(["", *plan.arms], rows, left_columns=1)


def _header(plan, results, wall_time_s, trained_now):
    base = plan.base
    layers = (", ".join(map(str, plan.axis("num_layers")))
              if "num_layers" in plan.axes else base.num_layers)
    lines = [
        f"# Scaled vs unscaled attention on `{base.task}`",
        "",
        f"Arms: {', '.join(plan.arms)}. Key dims measured at init: "
        f"{', '.join(map(str, plan.axis('key_dim')))}; trained: "
        f"{', '.join(map(str, plan.trained_axis('key_dim'))) or 'none'}. Seeds: "
        f"{', '.join(map(str, plan.seeds))}.",
        "",
        f"Model: d_model {base.d_model}, {layers} {base.norm}-LN "
        f"layer(s), {base.num_heads} head(s), W_Q, W_K init "
        f"{base.qk_init_std}. Optimizer: {base.optimizer}, learning rate "
        f"{base.learning_rate:g}"
        + (f", momentum {base.momentum:g}" if base.optimizer == "sgd" else "")
        + f", batch {base.batch_size}, {base.steps} steps, fresh samples "
        "every step. Runs of the same key_dim and seed share data and initial"
        " weights.",
        "",
        SD_NOTE,
        "",
    ]
    if slice_note(plan):
        lines += [slice_note(plan), ""]
    if wall_time_s is not None:
        run_times = [r["wall_time_s"] for r in results["runs"]
                     if r.get("wall_time_s") is not None]
        text = f"Wall time of this invocation: {wall_time_s:.0f} s"
        if trained_now is not None:
            text += f" ({len(trained_now)} runs trained now)"
        if run_times:
            text += (f"; the training runs' own wall times sum to "
                     f"{sum(run_times):.0f} s")
        lines += [text + ".", ""]
    lines += [f"TensorBoard: `tensorboard --logdir {plan.logdir}`", "",
              "## Arms", ""]
    lines += [f"- `{arm}`: {ARMS[arm].description}" for arm in plan.arms]
    return lines


def _verdict_section(plan, claims, variance_rows):
    lines = ["## Verdicts", ""]
    verdicts = [
        ("1", variance_verdict(claims["1"], variance_rows)),
        ("2", saturation_verdict(claims["2"])),
        ("3", learning_verdict(claims["3"], plan.base.target_accuracy)),
    ]
    if "4" in claims:
        verdicts.append(
            ("4", depth_verdict(claims["4"], plan.base.target_accuracy)))
    if "5" in claims:
        verdicts.append(("5", length_verdict(claims["5"])))
    for number, (texts, holds) in verdicts:
        lines += [f"**Claim {number}. {STATEMENTS[number]}: "
                  f"{status_word(holds)}.**", ""]
        lines += [f"- {text}" for text in texts]
        lines.append("")
    return lines


def _section(title, table, preface=()):
    """A `## title` section around a table (lines), or none without rows."""
    if len(table) <= 2:
        return []
    return [f"## {title}", "", *preface, *table, ""]


def _ratio_table(ratios):
    return markdown_table(
        ["d_k", "scaled", "unscaled", "ratio", "√d_k", "ratio/√d_k − 1"],
        [[str(r["key_dim"]), f"{r['scaled_score_std']:.3f}",
          f"{r['unscaled_score_std']:.3f}", f"{r['ratio']:.3f}",
          f"{r['sqrt_key_dim']:.3f}", f"{r['relative_error']:+.2%}"]
         for r in ratios],
    )


def _entropy_table(entropy):
    return markdown_table(
        ["d_k", "entropy/log(keys) scaled", "unscaled", "unscaled/scaled",
         "max weight scaled", "unscaled", "saturated rows scaled",
         "unscaled"],
        [[str(r["key_dim"]), fmt(r["scaled_entropy_normalized"]),
          fmt(r["unscaled_entropy_normalized"]),
          fmt(ratio(r["unscaled_entropy_normalized"],
                    r["scaled_entropy_normalized"])),
          fmt(r["scaled_max_weight"]), fmt(r["unscaled_max_weight"]),
          fmt(r["scaled_saturated_fraction"]),
          fmt(r["unscaled_saturated_fraction"])]
         for r in entropy],
    )


def _training_table(results, gaps):
    rows = []
    for g in gaps:
        records = {arm: run_values(results, arm, g["key_dim"], lambda r: r)
                   for arm in _PAIR}
        rows.append(
            [str(g["key_dim"])]
            + [fmt_mean_sd([r["final_accuracy"] for r in records[arm]])
               for arm in _PAIR]
            + [fmt_steps(records[arm]) for arm in _PAIR]
            + [fmt(g["grad_scores_ratio"]), fmt(g["grad_query_ratio"]),
               fmt(g["grad_key_ratio"])]
        )
    return markdown_table(
        ["d_k", "final accuracy scaled", "unscaled",
         "steps to target scaled", "unscaled", "\\|dL/dscores\\| ratio",
         "\\|dL/dW_Q\\| ratio", "\\|dL/dW_K\\| ratio"],
        rows,
    )


def _heatmap_lines(heatmaps):
    if not heatmaps:
        return []
    return [
        "## Probe attention (first example; queries down, keys across)",
        "",
        *(f"- {item['arm']}, d_k {item['key_dim']}, seed {item['seed']}, "
          f"{item['stage']}: ![{item['arm']} {item['stage']}]({item['path']})"
          for item in heatmaps),
        "",
    ]


def _notes(base):
    lines = [
        "## Notes",
        "",
        "- The effect depends on the task. Associative recall needs the "
        "query to find its key by content, which is what q·k measures. On "
        "reversal, whose attention is purely positional, earlier "
        "measurements showed no gap even at d_k 1024.",
        "- The optimizer is SGD with momentum on purpose: Adam rescales each "
        "parameter's update and so partly undoes the gradient scale the "
        "claims are about; with d_model 64 and d_k 1024 it also destabilised "
        "the scaled runs, a confound.",
    ]
    if base.task == "recall":
        lines.append(
            f"- Chance level on this recall task is 1/{base.num_values} = "
            f"{1 / base.num_values:.3f}; a run that stalls stays near it."
        )
    return lines + [""]


def _figure_lines(figures, page):
    """The figures section: one image per figure (its caption as the alt
    text) and the self-contained page's name."""
    if not figures:
        return []
    lines = ["## Figures", "",
             f"The same report with the figures inline, for a browser and "
             f"offline: [{page}]({page}). The numbers behind each figure are "
             "in comparison.json (`curves`, `figures`, `heatmaps`).", ""]
    for item in figures:
        lines += [f"![{item['caption']}]({item['path']})", ""]
    return lines


def render_report(plan, results, variance_rows, claims, wall_time_s=None,
                  trained_now=None, figures=(), page="comparison.html",
                  missing=()):
    """The comparison report as Markdown text.

    `figures` are the entries of `pipelines.plotting.write_figures` (name,
    caption, path), linked in a section after the verdicts; `page` names
    the HTML version; `missing` names the runs not finished yet (a report
    over the finished ones). `results` holds every run; the d_k sections
    read their slice (`axes.sliced`)."""
    lines = _header(plan, results, wall_time_s, trained_now) + [""]
    every_run, results = results, sliced(plan, results)
    if missing:
        lines += [f"**Not finished yet: measured at init only, left out of "
                  f"every training number "
                  f"({len(missing)} runs):** {', '.join(missing)}.", ""]
    lines += _verdict_section(plan, claims, variance_rows)
    lines += _figure_lines(figures, page)
    if variance_rows:
        lines += _section("Claim 1: Var(q·k) for random unit-variance q, k",
                          variance_markdown(variance_rows))
    lines += _section(
        "Score std at init in the model, unscaled / scaled vs √d_k",
        _ratio_table(claims["1"]["score_std_ratios"]))
    lines += _section("Softmax at init, scaled vs unscaled",
                      _entropy_table(claims["2"]["entropy"]))
    lines += _section(
        "Training and gradients, unscaled vs scaled",
        _training_table(results, claims["3"]["by_key_dim"]),
        preface=("Gradient ratios are unscaled / scaled at init (probe "
                 "batch).", ""),
    )
    if "4" in claims:
        lines += depth_section(plan, claims["4"], every_run)
    if "5" in claims:
        lines += length_section(plan, claims["5"])
    lines += ["## Results per key_dim (mean ± sd over seeds)", ""]
    for key_dim in reversed(plan.axis("key_dim")):
        trained = key_dim in plan.trained_axis("key_dim")
        lines += [
            f"### d_k = {key_dim}" + ("" if trained else " (init only)"),
            "",
            *key_dim_table(plan, results, key_dim),
            "",
        ]
    lines += _heatmap_lines(results["heatmaps"])
    lines += _notes(plan.base)
    return "\n".join(lines)


def build_comparison(plan, results, variance_rows, claims, wall_time_s):
    """The `comparison.json` document (every run's record; with other axes
    than d_k, `"slice"` names the runs claims 1-3 read)."""
    document = {
        "task": plan.base.task,
        "preset": plan.preset,
        "arms": list(plan.arms),
        "key_dims": list(plan.axis("key_dim")),
        "train_key_dims": list(plan.trained_axis("key_dim")),
        "seeds": list(plan.seeds),
        "steps": plan.base.steps,
        "target_accuracy": plan.base.target_accuracy,
        "config": plan.base.to_dict(),
        "runs": results["runs"],
        "init_only": results["init_only"],
        "heatmaps": results["heatmaps"],
        "variance": variance_rows,
        "claims": to_jsonable(claims),
        "wall_time_s": wall_time_s,
    }
    if slice_note(plan):
        document["slice"] = slice_values(plan)
    return document
