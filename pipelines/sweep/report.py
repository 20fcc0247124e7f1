"""The sweep's `sweep.json` document and `sweep.md`, built from it."""

from pipelines.common import markdown_table
from pipelines.reports.numbers import SD_NOTE
from pipelines.reports.numbers import fmt
from pipelines.sweep.analysis import best_rates
from pipelines.sweep.analysis import curves
from pipelines.sweep.analysis import sensitivities
from pipelines.sweep.analysis import verdicts
from pipelines.sweep.init_picture import growth_exponents


def overhead(records):
    """Per-run overhead: wall time minus steady training time
    (`(steps - 1) / steps_per_s`), in seconds and as a fraction of it."""
    rows = [r for r in records
            if r.get("wall_time_s") and r.get("steps_per_s")]
    if not rows:
        return None
    steady = [max(r["steps"] - 1, 0) / r["steps_per_s"] for r in rows]
    extra = [r["wall_time_s"] - s for r, s in zip(rows, steady)]
    return {"runs": len(rows), "overhead_s_mean": sum(extra) / len(rows),
            "overhead_s_max": max(extra), "train_s_total": sum(steady),
            "overhead_s_total": sum(extra),
            "overhead_fraction": sum(extra) / max(sum(steady), 1e-9)}


def build_document(plan, records, init_rows, timing, missing=()):
    """The `sweep.json` document (`missing`: the runs not finished yet,
    left out of it)."""
    bests = best_rates(records)
    return {
        "preset": plan.preset,
        "missing": list(missing),
        "grid": {"arms": plan.arms, "optimizers": plan.axis("optimizer"),
                 "learning_rates": plan.axis("learning_rate"),
                 "key_dims": plan.axis("key_dim"), "seeds": plan.seeds,
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
    }


def _pm(stat, digits=3):
    return f"{stat['mean']:.{digits}f} ± {stat['sd']:.{digits}f}"


def _tables(document):
    best = markdown_table(
        ["optimizer", "d_k", "arm", "best lr", "final loss", "accuracy",
         "seeds at target (best lr)", "lrs: all seeds reach",
         "lrs: some seeds reach", "LR sensitivity"],
        [[b["optimizer"], str(b["key_dim"]), b["arm"],
          f"{b['best_learning_rate']:g}"
          + (" (edge)" if b["at_grid_edge"] else ""),
          f"{b['best_loss']:.3f}",
          f"{b['best_accuracy']:.3f} ± {b['best_accuracy_sd']:.3f}",
          f"{b['seeds_reaching_target_at_best']}/{b['seeds']}",
          ", ".join(f"{r:g}" for r in b["rates_all_seeds_reach"]) or "none",
          ", ".join(f"{r:g}" for r in b["rates_some_seeds_reach"]) or "none",
          next(_pm(s) for s in document["sensitivity"]
               if (s["optimizer"], s["key_dim"], s["arm"])
               == (b["optimizer"], b["key_dim"], b["arm"]))]
         for b in document["best"]], left_columns=3)
    init = markdown_table(
        ["scale mode", "d_k", "score std", "entropy / log(keys)",
         "max |q·k·scale|"],
        [[row["mode"], str(row["key_dim"]), _pm(row["score_std"]),
          _pm(row["entropy_normalized"]), _pm(row["max_abs_score"], 2)]
         for row in document["init_by_key_dim"]], left_columns=1)
    runs = markdown_table(
        ["run", "final loss", "accuracy", "steps to target", "diverged at",
         "max |q·k·scale|", "entropy / log(keys)", "saturated"],
        [[r["run"], fmt(r["final_loss"]), fmt(r["final_accuracy"]),
          fmt(r["steps_to_target"]), fmt(r["diverged_at_step"]),
          fmt(r["final"]["max_abs_score"], 2),
          fmt(r["final"]["entropy_normalized"]),
          fmt(r["final"]["saturated_fraction"])]
         for r in document["runs"]], left_columns=1)
    return best, init, runs


def _summary_lines(document):
    grid, timing = document["grid"], document["timing"]
    cost = document["overhead"]
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
    lines.append(SD_NOTE)
    exponents = document["init_growth_exponents"]
    if exponents:
        lines.append("Growth of the init score std with d_k (slope of log std "
                     "against log d_k; predicted sqrt 0, none 0.5, inverse "
                     "-0.5): " + ", ".join(
                         f"{mode} {slope:+.2f}"
                         for mode, slope in exponents.items()))
    return lines


def render_markdown(document, figures=()):
    """`sweep.md`; `figures`: the entries of `write_figures`."""
    best, init, runs = _tables(document)
    lines = ["# Learning-rate sweep: does the scale matter once the rate is "
             "tuned?", "", *_summary_lines(document), ""]
    if document["missing"]:
        lines += [f"**Not finished yet, left out of every number below "
                  f"({len(document['missing'])} runs):** "
                  f"{', '.join(document['missing'])}.", ""]
    lines += ["## Verdicts", ""]
    for verdict in document["verdicts"]:
        headline = verdict["headline"] or "no unscaled arm in the grid"
        lines.append(f"**{verdict['optimizer']}, d_k {verdict['key_dim']}**: "
                     f"{headline}.")
        lines += [f"- {line}" for line in verdict["lines"]] + [""]
    lines += ["## Best learning rate per arm", "", *best, "",
              "Final loss is min(final held-out loss, loss at init), a "
              "diverged run counting as its loss at init; the LR "
              "sensitivity is the mean of that over the learning rates minus "
              "its minimum (Wortsman et al. 2023), mean ± sd over seeds. "
              "Read it beside the best loss: an arm that learns at no rate "
              "has every loss near its loss at init, hence a low "
              "sensitivity.", ""]
    for item in figures:
        lines += [f"![{item['caption']}]({item['path']})", ""]
    lines += ["## At initialisation, per scale mode", "", *init, "",
              "## Every run", "", *runs, ""]
    return "\n".join(lines)
