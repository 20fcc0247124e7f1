"""TensorBoard scalars of claims 4 and 5, whose "step" axis is the depth or
the length (as the run `claims` plots over d_k), one TensorBoard run each,
a tag per arm (or scaling mode) ending in `/<arm>`:

    depth/         step = layers: final/accuracy,
                   final/steps_to_target (seeds that reached it),
                   init/entropy_normalized (mean over layers),
                   init/entropy_normalized_{first,last} and
                   init/grad_scores_first_over_last
    length_init/   step = n keys: init/<statistic> and theory/<statistic>
                   (entropy_normalized, relevant_weight, max_weight), per
                   mode
    length/        step = the trained length: final/accuracy
    length_eval/   step = evaluated pairs: accuracy, relevant_weight

Each is rewritten from scratch; none is written without its claim.
"""

import os

import numpy as np

from pipelines.compare.length import INIT_STATISTICS
from pipelines.tensorboard import write_points

DIRECTORIES = ("depth", "length_init", "length", "length_eval")


def _depth_points(row, arm):
    values = row["arms"][arm]
    reached = [s for s in values["steps_to_target"] if s is not None]
    entropy = (values["entropy_init"] or {}).get("mean") or [None]
    depth = row["num_layers"]
    return [
        ("final/accuracy", values["accuracy_mean"], depth),
        ("final/steps_to_target",
         float(np.mean(reached)) if reached else None, depth),
        ("init/entropy_normalized",
         float(np.mean(entropy)) if entropy[0] is not None else None, depth),
        ("init/entropy_normalized_first", entropy[0], depth),
        ("init/entropy_normalized_last", entropy[-1], depth),
        ("init/grad_scores_first_over_last",
         values["gradient"]["first_over_last"], depth),
    ]


def write_beyond_scalars(logdir, claims):
    """Writes the scalars of claims 4 and 5 present in `claims`."""
    points = {}
    depth = claims.get("4")
    if depth:
        for arm in (depth["by_depth"][0]["arms"] if depth["by_depth"]
                    else ()):
            points.setdefault("depth", []).extend(
                (f"{tag}/{arm}", value, step)
                for row in depth["by_depth"]
                for tag, value, step in _depth_points(row, arm))
    length = claims.get("5")
    if length:
        for mode, curve in length["init"]["curves"]["modes"].items():
            points.setdefault("length_init", []).extend(
                (f"{kind}/{name}/{mode}", values[i], n)
                for name in INIT_STATISTICS
                for kind, values in (("init", curve[name]),
                                     ("theory", curve["theory"][name]))
                for i, n in enumerate(curve["num_keys"]))
        trained = length["trained"]
        for row in trained["rows"]:
            for arm, values in row["arms"].items():
                points.setdefault("length", []).append(
                    (f"final/accuracy/{arm}", values["mean"],
                     row[trained["axis"]]))
        for row in length["extrapolation"]["rows"]:
            for arm, values in row["arms"].items():
                points.setdefault("length_eval", []).extend([
                    (f"accuracy/{arm}", values["accuracy_mean"],
                     row["eval_pairs"]),
                    (f"relevant_weight/{arm}",
                     values["relevant_weight_mean"], row["eval_pairs"])])
    for name in DIRECTORIES:
        write_points(os.path.join(logdir, name), points.get(name, []))
