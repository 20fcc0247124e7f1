"""How the reports compute and write numbers over seeds: `mean_sd` (the
one sd convention, said once per report by `SD_NOTE`), `over_seeds`, and
`fmt`, `fmt_mean_sd`, `fmt_steps` (`MISSING` for a missing value)."""

import numpy as np

MISSING = "–"
SD_NOTE = "± is the sample standard deviation over seeds (n−1)."


def mean_sd(values):
    """`(mean, sd)` of the non-None values; sd is the sample standard
    deviation (0 for one value); `(None, None)` for none.

    NumPy, not `statistics.fmean`/`stdev`: on the default comparison those
    differ from NumPy in the last bits of 9 of 82 means and 15 sds, which
    would change comparison.json."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None, None
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.mean(values)), sd


def group_by(records, fields):
    """`{(record[f] for f in fields): [record, ...]}`, in order of first
    appearance."""
    grouped = {}
    for record in records:
        grouped.setdefault(tuple(record[f] for f in fields), []).append(record)
    return grouped


def over_seeds(records, fields, value):
    """`value(record)` over each group of `group_by(records, fields)` (its
    seeds): `{group: {"mean", "sd", "values"}}`, `values` the non-None ones
    in record order, `mean` and `sd` their `mean_sd`."""
    out = {}
    for group, members in group_by(records, fields).items():
        values = [v for v in map(value, members) if v is not None]
        mean, sd = mean_sd(values)
        out[group] = {"mean": mean, "sd": sd, "values": values}
    return out


def ratio(numerator, denominator):
    """`numerator / denominator`, or None when either is missing (or the
    denominator is 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def fmt(value, digits=3):
    """`value` with `digits` decimals (an integer as it is), or `MISSING`."""
    if value is None:
        return MISSING
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:.{digits}f}"


def fmt_mean_sd(values, digits=3):
    """`mean ± sd` of the non-None values (the mean alone for one value),
    or `MISSING` for none."""
    mean, sd = mean_sd(values)
    if mean is None:
        return MISSING
    if len([v for v in values if v is not None]) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def fmt_steps(records):
    """Steps to target over the runs that reached it, and how many did:
    `"420 ± 30 (2/3)"`, `"never (0/3)"`, or `MISSING` for no runs."""
    reached = [r["steps_to_target"] for r in records
               if r["steps_to_target"] is not None]
    if not records:
        return MISSING
    count = f"{len(reached)}/{len(records)}"
    if not reached:
        return f"never ({count})"
    return f"{fmt_mean_sd(reached, 0)} ({count})"
