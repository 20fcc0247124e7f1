"""The lesson's claims, one module each, decided in the order a preset's
`options["claims"]` names them (all five by default). A claim module has:

    NUMBER, STATEMENT   its key in comparison.json's `"claims"`, its line
    applies(plan)       whether the grid can measure it
    measure(plan, results, log)
                        its evidence from `measure.collect` (with
                        `"variance"`): a dict whose `"holds"` is None when
                        the grid lacks what it needs
    headline(plan, claim)
                        the deciding number in a few words, or None
    verdict(plan, claim, results)
                        `(lines, holds)` under "## Verdicts"
    section(plan, claim, results)
                        its lines of comparison.md
    FIGURES             `(name, caption, draw(document))`; the captions'
                        letters order every claim's figures
    SCALAR_RUNS, scalars(plan, claim, results)
                        its TensorBoard runs, `{run: [(tag, value, step)]}`
"""

from pipelines.compare.claims import depth
from pipelines.compare.claims import learning
from pipelines.compare.claims import length
from pipelines.compare.claims import saturation
from pipelines.compare.claims import variance

CLAIMS = {module.__name__.rsplit(".", 1)[-1]: module
          for module in (variance, saturation, learning, depth, length)}
