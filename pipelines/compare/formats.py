"""How the report and the verdicts write numbers: `–` for a missing value,
`mean ± sd` over seeds, steps to target with the seeds that reached it."""

from pipelines.compare.claims import mean_sd

MISSING = "–"


def ratio(numerator, denominator):
    """`numerator / denominator`, or None when either is missing (or the
    denominator is 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def fmt(value, digits=3):
    """`value` with `digits` decimals, or `–`."""
    if value is None:
        return MISSING
    return f"{value:.{digits}f}"


def fmt_mean_sd(values, digits=3):
    """`mean ± sd` of the non-None values (the mean alone for one value),
    or `–` for none."""
    mean, sd = mean_sd(values)
    if mean is None:
        return MISSING
    if len([v for v in values if v is not None]) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def fmt_steps(records):
    """Steps to target over the runs that reached it, and how many did:
    `"420 ± 30 (2/3)"`, `"never (0/3)"`, or `–` for no runs."""
    reached = [r["steps_to_target"] for r in records
               if r["steps_to_target"] is not None]
    if not records:
        return MISSING
    count = f"{len(reached)}/{len(records)}"
    if not reached:
        return f"never ({count})"
    return f"{fmt_mean_sd(reached, 0)} ({count})"
