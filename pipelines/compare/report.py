"""The comparison's `comparison.md` (`render_report`, its verdicts and
sections the claims' own), `comparison.json` (`build_comparison`) and
figures (`make_figures`)."""

from pipelines.common import markdown_table
from pipelines.common import to_jsonable
from pipelines.compare.measure import init_values
from pipelines.compare.measure import run_values
from pipelines.compare.measure import sliced
from pipelines.engine.presets import ARMS
from pipelines.reports.numbers import SD_NOTE
from pipelines.reports.numbers import fmt_mean_sd
from pipelines.reports.numbers import fmt_steps
from pipelines.reports.plotting import draw_figures

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


def key_dim_table(plan, results, key_dim):
    """The Markdown table of one key_dim: arms side by side (lines)."""
    trained = key_dim in plan.trained_axis("key_dim")
    runs = {arm: run_values(results, arm, key_dim) for arm in plan.arms}

    def row(label, cell):
        return [label, *map(cell, plan.arms)]

    def values(arm, key):
        return [r.get(key) for r in runs[arm]]

    rows = []
    if trained:
        rows.append(row("final held-out accuracy", lambda arm: fmt_mean_sd(
            values(arm, "final_accuracy"))))
        # Text runs: bits per character per arm, and the unigram baseline,
        # the held-out text's, the same for every run: its mean alone.
        for label, key, first in (
                ("held-out bits per character", "final_bits", None),
                ("unigram baseline (bits per character)", "unigram_bits", 1)):
            if any(v is not None
                   for arm in plan.arms for v in values(arm, key)):
                rows.append(row(label, lambda arm: fmt_mean_sd(
                    values(arm, key)[:first], 3)))
        rows.append(row(f"steps to {plan.base.target_accuracy:g} (seeds "
                        "reaching)", lambda arm: fmt_steps(runs[arm])))
    for stage in ("init", "final") if trained else ("init",):
        for label, key, digits in _TABLE_ROWS:
            rows.append(row(f"{stage}: {label}", lambda arm: fmt_mean_sd(
                init_values(results, arm, key_dim, key) if stage == "init"
                else [(r["final"] or {}).get(key) for r in runs[arm]],
                digits)))
    return markdown_table(["", *plan.arms], rows, left_columns=1)


def key_dim_tables(plan, results, markdown=False):
    """The table of every d_k, the largest first, under its title (a
    Markdown heading when `markdown`)."""
    lines = []
    for key_dim in reversed(plan.axis("key_dim")):
        trained = key_dim in plan.trained_axis("key_dim")
        title = f"d_k = {key_dim}" + ("" if trained else " (init only)")
        lines += ([f"### {title}", ""] if markdown else [title])
        lines += [*key_dim_table(plan, results, key_dim), ""]
    return lines


def _header(plan, results, wall_time_s, trained_now):
    base = plan.base
    layers = (", ".join(map(str, plan.axis("num_layers")))
              if "num_layers" in plan.axes else base.num_layers)
    lines = [
        f"# Scaled vs unscaled attention on `{base.task}`",
        "",
        f"Arms: {', '.join(plan.arms)}. Key dims measured at init: "
        f"{', '.join(map(str, plan.axis('key_dim')))}; trained: "
        f"{', '.join(map(str, plan.trained_axis('key_dim'))) or 'none'}. "
        f"Seeds: {', '.join(map(str, plan.seeds))}.",
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
    if plan.slice():
        lines += [_slice_note(plan), ""]
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


def _slice_note(plan):
    """One sentence saying which runs the d_k sections describe."""
    return ("Claims 1-3, their tables and figures and the per-d_k tables "
            "describe the runs at " + ", ".join(
                f"{name} {value}" for name, value in plan.slice().items())
            + " (the first value of each other axis); the depth and length "
            "sections read every run.")


def status_word(holds):
    """`holds`, `not supported` or `not measured`."""
    return {True: "holds", False: "not supported", None: "not measured"}[holds]


def verdict_line(plan, claim, evidence):
    """`Claim N (statement): holds — the deciding figure`, which only a
    measured claim has."""
    holds = evidence.get("holds")
    line = f"Claim {claim.NUMBER} ({claim.STATEMENT}): {status_word(holds)}"
    figure = None if holds is None else claim.headline(plan, evidence)
    return line if figure is None else f"{line}: {figure}"


def _verdict_section(plan, claims, measured, results):
    lines = ["## Verdicts", ""]
    for claim in claims:
        if claim.NUMBER not in measured:
            continue
        texts, holds = claim.verdict(plan, measured[claim.NUMBER], results)
        lines += [f"**Claim {claim.NUMBER}. {claim.STATEMENT}: "
                  f"{status_word(holds)}.**", ""]
        lines += [f"- {text}" for text in texts]
        lines.append("")
    return lines


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
    """The figures section: an image per figure and the page's name."""
    if not figures:
        return []
    lines = ["## Figures", "",
             f"The same report with the figures inline, for a browser and "
             f"offline: [{page}]({page}). The numbers behind each figure are "
             "in comparison.json (`curves`, `figures`, `heatmaps`).", ""]
    for item in figures:
        lines += [f"![{item['caption']}]({item['path']})", ""]
    return lines


def render_report(plan, results, claims, measured, wall_time_s=None,
                  trained_now=None, figures=(), page="comparison.html",
                  missing=()):
    """The comparison report as Markdown text.

    `measured`: the `claims`' evidence by number; `figures`: the entries of
    `write_figures`; `page`: the HTML version's name; `missing`: the runs
    not finished yet. The d_k tables read the slice of `results`."""
    lines = _header(plan, results, wall_time_s, trained_now) + [""]
    every_run, results = results, sliced(plan, results)
    if missing:
        lines += [f"**Not finished yet: measured at init only, left out of "
                  f"every training number "
                  f"({len(missing)} runs):** {', '.join(missing)}.", ""]
    lines += _verdict_section(plan, claims, measured, every_run)
    lines += _figure_lines(figures, page)
    for claim in claims:
        if claim.NUMBER in measured:
            lines += claim.section(plan, measured[claim.NUMBER], every_run)
    lines += ["## Results per key_dim (mean ± sd over seeds)", "",
              *key_dim_tables(plan, results, markdown=True)]
    lines += _heatmap_lines(results["heatmaps"])
    lines += _notes(plan.base)
    return "\n".join(lines)


def build_comparison(plan, results, measured, wall_time_s):
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
        **{key: results[key]
           for key in ("runs", "init_only", "heatmaps", "variance")},
        "claims": to_jsonable(measured),
        "wall_time_s": wall_time_s,
    }
    if plan.slice():
        document["slice"] = plan.slice()
    return document


def make_figures(document, claims):
    """`[(name, caption, Figure)]` of the claims' figures with data, in the
    order of their captions' letters."""
    table = sorted((entry for claim in claims for entry in claim.FIGURES),
                   key=lambda entry: entry[1][:3])
    return draw_figures(table, document)
