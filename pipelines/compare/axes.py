"""The axes a comparison has beyond d_k and the seed, and the slice of the
grid that claims 1 to 3 read.

Claims 1 to 3 are about d_k: with another axis in the grid (`--num-layers
1,2,4`, `--num-pairs 16,64,256`, a learning rate), their tables, figures
and curves describe the runs at the first value of each such axis (the
shallowest stack, the shortest sequence), so that runs of different depths
are never pooled into one d_k. Claims 4 (depth) and 5 (length) read every
run. Without another axis the slice is the whole grid, and every record
and document is what it was before these axes existed.
"""

# The axes that claims 1 to 3 are measured over.
_OWN_AXES = ("key_dim", "seed")
# The length axis of each kind of task: the number of recall pairs, or
# the sequence length of the positional tasks.
LENGTH_AXES = ("num_pairs", "seq_len")


def extra_axes(plan):
    """The grid's axes besides d_k and the seed, in the grid's order."""
    return [name for name in plan.axes if name not in _OWN_AXES]


def slice_values(plan):
    """`{axis: its first value}` over the extra axes."""
    return {name: plan.axis(name)[0] for name in extra_axes(plan)}


def in_slice(plan, values, except_axis=None):
    """Whether a run's values (a dict, or a record) lie in the slice; the
    axis `except_axis` may take any value."""
    return all(values.get(name) == value
               for name, value in slice_values(plan).items()
               if name != except_axis)


def axis_values(plan, values):
    """The extra axes' values of a run, for its record."""
    return {name: values[name] for name in extra_axes(plan)}


def sliced(plan, results):
    """`results` (see `measure.collect`) restricted to the slice (the heat
    maps are drawn in it only)."""
    if not extra_axes(plan):
        return results
    return {key: ([record for record in records if in_slice(plan, record)]
                  if key in ("runs", "init_only") else records)
            for key, records in results.items()}


def length_axis(plan):
    """The grid's length axis (`num_pairs` or `seq_len`), or None."""
    return next((name for name in LENGTH_AXES if name in plan.axes), None)


def slice_note(plan):
    """One sentence saying which runs the d_k sections describe, or None
    without extra axes."""
    values = slice_values(plan)
    if not values:
        return None
    return ("Claims 1-3, their tables and figures and the per-d_k tables "
            "describe the runs at " + ", ".join(
                f"{name} {value}" for name, value in values.items())
            + " (the first value of each other axis); the depth and length "
            "sections read every run.")
