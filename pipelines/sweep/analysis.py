"""What a sweep measured and means: one record per run, the curves over
the learning rate, the sensitivity, the best rates, the verdicts; plain
records in, plain data out."""

import math
import os

import numpy as np

from pipelines.engine.presets import PAIR
from pipelines.reports.numbers import group_by
from pipelines.reports.numbers import mean_sd
from pipelines.reports.numbers import over_seeds
from pipelines.run_dir import EVAL_LOGS
from pipelines.run_dir import read_metrics
from pipelines.tensorboard import read_event_scalars

# The final diagnostics each record keeps (`keras_attention.diagnostics`).
FINAL_DIAGNOSTICS = ("entropy_normalized", "saturated_fraction",
                     "max_abs_score", "score_std")
# The verdicts ask whether the learning rate rescues the pair's second arm
# and compare it with the first.
REFERENCE_ARM, QUESTION_ARM = PAIR


# ---------------------------------------------------------------- records
def run_record(run):
    """The record of one finished run of the grid, from its directory."""
    metrics = read_metrics(run.config.logdir)
    if metrics is None:
        raise RuntimeError(f"{run.config.logdir} has no metrics.json")
    eval_loss = read_event_scalars(
        os.path.join(run.config.logdir, EVAL_LOGS)).get("loss", {})
    diagnostics = metrics.get("diagnostics") or {}
    final = (diagnostics.get("final") or {}).get("summary") or {}
    diverged = metrics.get("diverged_at_step") is not None
    return {
        "run": run.name, "arm": run.arm,
        **{name: run.values[name] for name in ("optimizer", "learning_rate",
                                               "key_dim", "seed")},
        # A diverged run has no final loss: the last evaluation came before
        # the loss became non-finite.
        "final_loss": None if diverged else metrics.get("heldout_loss"),
        "final_accuracy": (None if diverged
                           else metrics.get("heldout_accuracy")),
        "init_loss": eval_loss.get(0),
        **{key: metrics.get(key) for key in (
            "steps", "steps_to_target", "target_accuracy",
            "diverged_at_step", "wall_time_s", "train_time_s",
            "first_step_time_s", "steps_per_s")},
        "final": {key: final.get(key) for key in FINAL_DIAGNOSTICS},
    }


def capped_loss(record):
    """`min(final loss, loss at init)`; a diverged run counts as its loss at
    init (Wortsman et al. 2023, section 3.1)."""
    init = record["init_loss"]
    final = record["final_loss"]
    if final is None or not math.isfinite(final):
        return init
    return final if init is None else min(final, init)


# ----------------------------------------------------------------- curves
def curves(records):
    """Per (optimizer, key_dim, arm): the learning rates and, per rate, the
    mean, sd, min and max over seeds of the capped final loss, the final
    accuracy (0 for a diverged run), the final max logit and entropy."""
    out = []
    for (optimizer, key_dim, arm), group in sorted(
            group_by(records, ("optimizer", "key_dim", "arm")).items()):
        rates = sorted(rate for (rate,) in group_by(group, ("learning_rate",)))
        curve = {"optimizer": optimizer, "key_dim": key_dim, "arm": arm,
                 "learning_rates": rates}
        for name, value in (
            ("loss", capped_loss),
            ("accuracy", lambda r: r["final_accuracy"] or 0.0),
            ("max_abs_score", lambda r: r["final"]["max_abs_score"]),
            ("entropy_normalized", lambda r: r["final"]["entropy_normalized"]),
        ):
            stats = over_seeds(group, ("learning_rate",), value)
            stats = [stats[(rate,)] for rate in rates]
            curve[name] = {
                "mean": [s["mean"] for s in stats],
                "sd": [s["sd"] for s in stats],
                "min": [min(s["values"], default=None) for s in stats],
                "max": [max(s["values"], default=None) for s in stats],
            }
        out.append(curve)
    return out


# ------------------------------------------------------------ sensitivity
def lr_sensitivity(losses, init_loss):
    """Wortsman et al. (2023)'s learning-rate sensitivity of one seed:
    `mean over rates of min(loss(rate), init_loss) - min over rates of
    min(loss(rate), init_loss)`. A non-finite or missing loss counts as
    `init_loss`.

    >>> lr_sensitivity([0.5, 0.1, float("nan")], init_loss=2.0)
    0.7666666666666667
    """
    capped = [init_loss if v is None or not math.isfinite(v)
              else min(v, init_loss) for v in losses]
    return float(np.mean(capped) - min(capped))


def sensitivities(records):
    """Per (optimizer, key_dim, arm): the sensitivity of each seed over the
    learning rates, and their mean and sd."""
    out = []
    for (optimizer, key_dim, arm), group in sorted(
            group_by(records, ("optimizer", "key_dim", "arm")).items()):
        per_seed = {}
        for (seed,), runs in sorted(group_by(group, ("seed",)).items()):
            init = [r["init_loss"] for r in runs if r["init_loss"] is not None]
            init_loss = float(np.mean(init)) if init else math.inf
            per_seed[seed] = lr_sensitivity(
                [r["final_loss"] for r in runs], init_loss)
        mean, sd = mean_sd(list(per_seed.values()))
        out.append({"optimizer": optimizer, "key_dim": key_dim, "arm": arm,
                    "per_seed": per_seed, "mean": mean, "sd": sd})
    return out


# --------------------------------------------------------- best and target
def best_rates(records):
    """Per (optimizer, key_dim, arm): the rate of lowest mean capped loss,
    its loss and accuracy, how many seeds reached the target there, and
    every rate at which all / some seeds reached it."""
    out = []
    for (optimizer, key_dim, arm), group in sorted(
            group_by(records, ("optimizer", "key_dim", "arm")).items()):
        by_rate = group_by(group, ("learning_rate",))
        rates = sorted(rate for (rate,) in by_rate)

        def reached(rate):
            return sum(r["steps_to_target"] is not None
                       and r["diverged_at_step"] is None
                       for r in by_rate[(rate,)])

        loss = {rate: stats["mean"] for (rate,), stats in over_seeds(
            group, ("learning_rate",), capped_loss).items()}
        best = min(rates, key=lambda rate: (loss[rate] is None, loss[rate]))
        accuracy = mean_sd([r["final_accuracy"] or 0.0
                             for r in by_rate[(best,)]])
        seeds = len(by_rate[(best,)])
        out.append({
            "optimizer": optimizer, "key_dim": key_dim, "arm": arm,
            "best_learning_rate": best, "best_loss": loss[best],
            "best_accuracy": accuracy[0], "best_accuracy_sd": accuracy[1],
            "seeds": seeds, "seeds_reaching_target_at_best": reached(best),
            "at_grid_edge": len(rates) > 1 and best in (rates[0], rates[-1]),
            "rates_all_seeds_reach": [r for r in rates
                                      if reached(r) == len(by_rate[(r,)])],
            "rates_some_seeds_reach": [r for r in rates
                                       if 0 < reached(r) < len(by_rate[(r,)])],
            "learning_rates": rates,
        })
    return out


def _rates_text(rates):
    return ", ".join(f"{rate:g}" for rate in rates)


def arm_verdict(best, steps, target):
    """One sentence on one arm from its `best_rates` entry."""
    arm, rates = best["arm"], best["learning_rates"]
    if best["rates_all_seeds_reach"] or best["rates_some_seeds_reach"]:
        parts = []
        if best["rates_all_seeds_reach"]:
            parts.append("every seed reaches the target at learning rate(s) "
                         + _rates_text(best["rates_all_seeds_reach"]))
        if best["rates_some_seeds_reach"]:
            parts.append("only some seeds do at "
                         + _rates_text(best["rates_some_seeds_reach"]))
        text = f"{arm}: " + "; ".join(parts)
    else:
        text = (f"{arm} attention fails at every learning rate tried "
                f"({_rates_text(rates)}): no seed reaches held-out accuracy "
                f"{target:g} within {steps} steps")
    text += (f". Best: learning rate {best['best_learning_rate']:g}, final "
             f"loss {best['best_loss']:.3f}, accuracy "
             f"{best['best_accuracy']:.3f} ± {best['best_accuracy_sd']:.3f} "
             f"({best['seeds_reaching_target_at_best']}/{best['seeds']} seeds "
             "at the target)")
    if best["at_grid_edge"]:
        side = ("smallest" if best["best_learning_rate"] == rates[0]
                else "largest")
        text += (f"; that is the {side} rate tried, so a rate beyond the "
                 "grid might do better")
    return text + "."


def verdicts(bests, steps, target):
    """Per (optimizer, key_dim): the verdict lines, the unscaled arm's
    first, and a headline: does the rate rescue unscaled attention (every
    seed, some, none), and did the scaled arm do better at all."""
    out = []
    for (optimizer, key_dim), group in sorted(
            group_by(bests, ("optimizer", "key_dim")).items()):
        arms = {best["arm"]: best for best in group}
        order = [QUESTION_ARM, REFERENCE_ARM] + sorted(
            set(arms) - {QUESTION_ARM, REFERENCE_ARM})
        lines = [arm_verdict(arms[a], steps, target) for a in order
                 if a in arms]
        headline = None
        if QUESTION_ARM in arms:
            question = arms[QUESTION_ARM]
            rescued = question["rates_all_seeds_reach"]
            partly = question["rates_some_seeds_reach"]
            if rescued:
                headline = ("the learning rate rescues unscaled attention: "
                            "every seed reaches the target at "
                            + _rates_text(rescued))
            elif partly:
                headline = ("unscaled attention is rescued only partly: some "
                            "seeds reach the target at " + _rates_text(partly))
            else:
                headline = ("unscaled attention fails at every learning rate "
                            "tried")
            if REFERENCE_ARM in arms:
                reference = arms[REFERENCE_ARM]
                if not (reference["rates_all_seeds_reach"]
                        or reference["rates_some_seeds_reach"]):
                    headline += ("; but scaled attention does not reach the "
                                 "target either, so this grid does not "
                                 "separate them")
                elif question["best_loss"] is not None and (
                        reference["best_loss"] is not None):
                    headline += (
                        f" (best final loss {question['best_loss']:.3f} "
                        f"against {reference['best_loss']:.3f} scaled)")
        out.append({"optimizer": optimizer, "key_dim": key_dim,
                    "headline": headline, "lines": lines})
    return out
