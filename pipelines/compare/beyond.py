"""Claims 4 and 5, beyond one layer and one length: when a comparison
measures them, and what it measures for them.

Claim 4 (depth) is measured when the grid has a `num_layers` axis. Claim 5
(length) is measured when it has a length axis (`num_pairs`, `seq_len`) or
`length_multiples` (train at one length, evaluate at multiples of it);
then its init curves are measured too (a few seconds). Neither is measured
otherwise, so a comparison over d_k alone writes what it always wrote.
"""

from pipelines.builders import build_task
from pipelines.compare.axes import in_slice
from pipelines.compare.axes import length_axis
from pipelines.compare.depth import depth_claim
from pipelines.compare.extrapolate import extrapolation
from pipelines.compare.length import init_curves
from pipelines.compare.length import length_claim


def measures_length(plan):
    """Whether the comparison measures claim 5."""
    return bool(length_axis(plan) or plan.options.get("length_multiples"))


def _shortest(plan, axis):
    """The config of the shortest trained length, the other axes at their
    slice."""
    config = plan.base
    if axis:
        config = config.replace(**{axis: plan.trained_axis(axis)[0]})
    return config


def evaluated_runs(plan):
    """`[(run, multiples)]`: the recall runs measured at lengths, at the
    largest trained d_k with the other axes at their slice: those at the
    shortest trained length at `length_multiples`, the others at their own
    length (1x, for the query's weight on its pair)."""
    if plan.base.task != "recall":
        return []
    axis = length_axis(plan)
    key_dim = plan.trained_axis("key_dim")[-1]
    multiples = list(plan.options.get("length_multiples") or ())
    chosen = []
    for run in plan.trained_runs():
        if run.key_dim != key_dim or not in_slice(plan, run.values,
                                                  except_axis=axis):
            continue
        shortest = axis is None or run.values[axis] == plan.trained_axis(
            axis)[0]
        if shortest and multiples:
            chosen.append((run, multiples))
        elif axis is not None:
            chosen.append((run, [1]))
    return chosen


def measure_beyond(plan, results, log=print):
    """`{"4": claim, "5": claim}`, each only when the grid measures it."""
    claims = {}
    if "num_layers" in plan.axes:
        claims["4"] = depth_claim(plan, results)
    if measures_length(plan):
        axis = length_axis(plan)
        key_dims = plan.trained_axis("key_dim") or plan.axis("key_dim")
        # ssmax starts at 1/log of the keys of the shortest trained length.
        reference = build_task(_shortest(plan, axis)).seq_len
        curves = init_curves(key_dims[-1], reference)
        log(f"length: init curves at d_k {key_dims[-1]} for "
            f"{', '.join(curves['modes'])}")
        records = extrapolation(plan, evaluated_runs(plan), log)
        claims["5"] = length_claim(plan, results, curves, records, axis)
    return claims
