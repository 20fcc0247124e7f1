"""The sweep's report: `sweep.json` (the document), `sweep.md` and a
self-contained `sweep.html` (figures inline as data-URI PNGs, nothing
fetched), built from the same document."""

import base64
import html

from pipelines.common import markdown_table
from pipelines.sweep.analysis import best_rates
from pipelines.sweep.analysis import curves
from pipelines.sweep.analysis import sensitivities
from pipelines.sweep.analysis import verdicts
from pipelines.sweep.init_picture import growth_exponents

FIGURES = {
    "lr": ("lr_loss_accuracy.png", "Final loss and accuracy against the "
           "learning rate (the Wortsman figure)"),
    "sensitivity": ("lr_sensitivity.png", "Learning-rate sensitivity per arm"),
    "diagnostics": ("lr_max_logit_entropy.png", "Final max attention logit "
                    "and entropy against the learning rate"),
    "init": ("init_by_key_dim.png", "Score std and entropy at init against "
             "d_k per scale mode"),
}


def overhead(records):
    """Per-run overhead: a run's wall time minus its steady training time
    (`(steps - 1) / steps_per_s`), i.e. building, compiling, the first
    step, evaluations, diagnostics, checkpoints and saving; as seconds and
    as a fraction of the training time."""
    rows = [r for r in records if r.get("wall_time_s") and r.get("steps_per_s")]
    if not rows:
        return None
    steady = [max(r["steps"] - 1, 0) / r["steps_per_s"] for r in rows]
    extra = [r["wall_time_s"] - s for r, s in zip(rows, steady)]
    return {"runs": len(rows), "overhead_s_mean": sum(extra) / len(rows),
            "overhead_s_max": max(extra), "train_s_total": sum(steady),
            "overhead_s_total": sum(extra),
            "overhead_fraction": sum(extra) / max(sum(steady), 1e-9)}


def build_document(plan, records, init_rows, timing):
    """The `sweep.json` document."""
    bests = best_rates(records)
    return {
        "preset": plan.preset,
        "grid": {"arms": plan.arms, "optimizers": plan.optimizers,
                 "learning_rates": plan.learning_rates,
                 "key_dims": plan.key_dims, "seeds": plan.seeds,
                 "steps": plan.base.steps,
                 "target_accuracy": plan.base.target_accuracy},
        "runs": records,
        "curves": curves(records),
        "sensitivity": sensitivities(records),
        "best": bests,
        "verdicts": verdicts(bests, plan.base.steps,
                             plan.base.target_accuracy),
        "init_by_key_dim": init_rows,
        "init_growth_exponents": growth_exponents(init_rows),
        "overhead": overhead(records),
        "timing": timing,
        "figures": {key: f"figures/{name}" for key, (name, _) in FIGURES.items()},
    }


def _tables(document):
    best = markdown_table(
        ["optimizer", "d_k", "arm", "best lr", "final loss", "accuracy",
         "seeds at target (best lr)", "lrs: all seeds reach",
         "lrs: some seeds reach", "LR sensitivity"],
        [[b["optimizer"], str(b["key_dim"]), b["arm"],
          f"{b['best_learning_rate']:g}" + (" (edge)" if b["at_grid_edge"] else ""),
          f"{b['best_loss']:.3f}",
          f"{b['best_accuracy']:.3f} ± {b['best_accuracy_sd']:.3f}",
          f"{b['seeds_reaching_target_at_best']}/{b['seeds']}",
          ", ".join(f"{r:g}" for r in b["rates_all_seeds_reach"]) or "none",
          ", ".join(f"{r:g}" for r in b["rates_some_seeds_reach"]) or "none",
          next(f"{s['mean']:.3f} ± {s['sd']:.3f}" for s in document["sensitivity"]
               if (s["optimizer"], s["key_dim"], s["arm"])
               == (b["optimizer"], b["key_dim"], b["arm"]))]
         for b in document["best"]], left_columns=3)
    init = markdown_table(
        ["scale mode", "d_k", "score std", "entropy / log(keys)",
         "max |q·k·scale|"],
        [[row["mode"], str(row["key_dim"]),
          f"{row['score_std']['mean']:.3f} ± {row['score_std']['sd']:.3f}",
          f"{row['entropy_normalized']['mean']:.3f} ± "
          f"{row['entropy_normalized']['sd']:.3f}",
          f"{row['max_abs_score']['mean']:.2f} ± "
          f"{row['max_abs_score']['sd']:.2f}"]
         for row in document["init_by_key_dim"]], left_columns=1)
    runs = markdown_table(
        ["run", "final loss", "accuracy", "steps to target", "diverged at",
         "max |q·k·scale|", "entropy / log(keys)", "saturated"],
        [[r["run"], _num(r["final_loss"]), _num(r["final_accuracy"]),
          _num(r["steps_to_target"]), _num(r["diverged_at_step"]),
          _num(r["final"]["max_abs_score"], 2),
          _num(r["final"]["entropy_normalized"]),
          _num(r["final"]["saturated_fraction"])]
         for r in document["runs"]], left_columns=1)
    return best, init, runs


def _num(value, digits=3):
    if value is None:
        return "—"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _summary_lines(document):
    grid, timing, cost = document["grid"], document["timing"], document["overhead"]
    lines = [
        f"Grid: arms {', '.join(grid['arms'])}; optimizers "
        f"{', '.join(grid['optimizers'])}; learning rates "
        f"{', '.join(f'{r:g}' for r in grid['learning_rates'])}; d_k "
        f"{', '.join(map(str, grid['key_dims']))}; seeds "
        f"{', '.join(map(str, grid['seeds']))}; {grid['steps']} steps each "
        f"({len(document['runs'])} runs; target accuracy "
        f"{grid['target_accuracy']:g}).",
        f"Wall time {timing['wall_time_s']:.0f} s, CPU time "
        f"{timing['cpu_time_s']:.0f} s ({timing['trained_now']} runs trained "
        f"now by {timing['workers']} worker(s), {timing['builds']} of them "
        f"built their compiled step; {timing['skipped']} skipped as "
        "complete).",
    ]
    if cost:
        lines.append(
            f"Per-run overhead (wall time minus steady training time: build, "
            f"compile, first step, evaluations, diagnostics, checkpoints, "
            f"saving): {cost['overhead_s_mean']:.2f} s on average, "
            f"{cost['overhead_fraction']:.1%} of the training time.")
    exponents = document["init_growth_exponents"]
    if exponents:
        lines.append("Growth of the init score std with d_k (slope of log std "
                     "against log d_k; predicted sqrt 0, none 0.5, inverse "
                     "-0.5): " + ", ".join(
                         f"{mode} {slope:+.2f}" for mode, slope in exponents.items()))
    return lines


def render_markdown(document):
    """`sweep.md`."""
    best, init, runs = _tables(document)
    lines = ["# Learning-rate sweep: does the scale matter once the rate is "
             "tuned?", "", *_summary_lines(document), "", "## Verdicts", ""]
    for verdict in document["verdicts"]:
        lines.append(f"**{verdict['optimizer']}, d_k {verdict['key_dim']}**: "
                     f"{verdict['headline'] or 'no unscaled arm in the grid'}.")
        lines += [f"- {line}" for line in verdict["lines"]] + [""]
    lines += ["## Best learning rate per arm", "", *best, "",
              "Final loss is min(final held-out loss, loss at init), a "
              "diverged run counting as its loss at init; the LR "
              "sensitivity is the mean of that over the learning rates minus "
              "its minimum (Wortsman et al. 2023), mean ± sd over seeds. "
              "Read it beside the best loss: an arm that learns at no rate "
              "has every loss near its loss at init, hence a low "
              "sensitivity.", ""]
    for key, (name, caption) in FIGURES.items():
        lines += [f"![{caption}](figures/{name})", ""]
    lines += ["## At initialisation, per scale mode", "", *init, "",
              "## Every run", "", *runs, ""]
    return "\n".join(lines)


def render_html(document, pngs):
    """`sweep.html`: the report with the figures as data-URI PNGs."""
    best, init, _ = _tables(document)

    def table(lines):
        rows = [line.strip("|").split("|") for line in lines]
        head = "".join(f"<th>{html.escape(c.strip())}</th>" for c in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row)
            + "</tr>" for row in rows[2:])
        return f"<table><tr>{head}</tr>{body}</table>"

    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>Learning-rate sweep</title><style>body{font-family:sans-"
             "serif;max-width:1200px;margin:auto}table{border-collapse:"
             "collapse}td,th{border:1px solid #ccc;padding:2px 6px}</style>",
             "</head><body><h1>Learning-rate sweep</h1>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in _summary_lines(document)]
    parts.append("<h2>Verdicts</h2>")
    for verdict in document["verdicts"]:
        parts.append(f"<p><b>{html.escape(verdict['optimizer'])}, d_k "
                     f"{verdict['key_dim']}</b>: "
                     f"{html.escape(verdict['headline'] or 'no unscaled arm')}.</p><ul>"
                     + "".join(f"<li>{html.escape(line)}</li>"
                               for line in verdict["lines"]) + "</ul>")
    parts += ["<h2>Best learning rate per arm</h2>", table(best)]
    for key, (_, caption) in FIGURES.items():
        if key in pngs:
            data = base64.b64encode(pngs[key]).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(caption)}' "
                         f"src='data:image/png;base64,{data}'><figcaption>"
                         f"{html.escape(caption)}</figcaption></figure>")
    parts += ["<h2>At initialisation, per scale mode</h2>", table(init),
              "</body></html>"]
    return "\n".join(parts)
