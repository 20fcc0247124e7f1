"""The lesson's claims, one module each, with one interface.

A comparison decides the claims its preset names (`options["claims"]`, all
five by default), in this order; a claim is one module of this package that
has

    NUMBER, STATEMENT       its key in comparison.json's `"claims"` and its
                            one-line statement
    applies(plan)           whether the grid can measure it
    measure(plan, results, log)
                            its evidence from the collected runs
                            (`measure.collect`, with `"variance"`): a dict
                            with `"holds"` (True, False, or None when the
                            grid lacks what it needs)
    headline(plan, claim)   the number that decides it once measured
                            (`"holds"` not None), in a few words, or None
    verdict(plan, claim, results)
                            `(lines, holds)` under "## Verdicts"
    section(plan, claim, results)
                            its section of comparison.md (lines)
    FIGURES                 `(name, caption, draw(document))`, drawn from
                            comparison.json; the captions' letters order
                            every claim's figures in one list
    SCALAR_RUNS, scalars(plan, claim, results)
                            its TensorBoard runs, rewritten on each report,
                            and `{run: [(tag, value, step)]}`

so a new claim is one new module, named here.
"""

from pipelines.compare.claims import depth
from pipelines.compare.claims import learning
from pipelines.compare.claims import length
from pipelines.compare.claims import saturation
from pipelines.compare.claims import variance

CLAIMS = {module.__name__.rsplit(".", 1)[-1]: module
          for module in (variance, saturation, learning, depth, length)}


def named(names):
    """The claim modules of `names` (a preset's `claims`), in order.

    Raises:
        KeyError: for a name that is no claim.
    """
    return [CLAIMS[name] for name in names]
