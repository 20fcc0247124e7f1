"""`XLA_FLAGS` values for the tests and the processes they start (imports
nothing heavy: tests/conftest.py uses it before Keras is imported)."""


def xla_flags(current, *flags, keep=False):
    """`current` (an `XLA_FLAGS` value, or None) with each of `flags`
    (`--name=value`): in place of a flag of the same name already there,
    or, with `keep`, left out where there is one (a value the user set
    stays)."""
    def name(flag):
        return flag.split("=")[0]

    kept = (current or "").split()
    if keep:
        present = {name(flag) for flag in kept}
        return " ".join(kept + [f for f in flags if name(f) not in present])
    replaced = {name(flag) for flag in flags}
    return " ".join([flag for flag in kept if name(flag) not in replaced]
                    + list(flags))
