"""The d_k picture per scale mode: score std and normalized entropy at init
against d_k in the sweep's model, over seeds.

With unit-variance q and k components, q·k has std √d_k: 1/√d_k keeps the
scores' std near 1, no scale lets it grow like √d_k, 1/d_k (μP) shrinks it
like 1/√d_k (the softmax tends to uniform); qk_norm keeps 1/√d_k.
"""

from operator import itemgetter

import numpy as np

from pipelines.engine.presets import ARMS
from pipelines.engine.presets import MODE_ARMS
from pipelines.reports.numbers import over_seeds
from pipelines.reports.probes import probe_at_init

# Scale mode -> the arm that has it, for the modes of the picture.
MODES = {mode: MODE_ARMS[mode] for mode in ("sqrt", "none", "inverse",
                                            "qk_norm")}
STATISTICS = ("score_std", "entropy_normalized", "max_abs_score")


def measure_init(base, key_dims, seeds, log=print):
    """Rows `{mode, arm, key_dim, <statistic>: {mean, sd, values}}` for
    every scale mode and d_k, over `seeds`."""
    rows = []
    for mode, arm in MODES.items():
        measured = []
        for key_dim in key_dims:
            for seed in seeds:
                config = base.replace(
                    key_dim=key_dim, seed=seed,
                    **ARMS[arm].overrides(key_dim, base.qk_init_gain))
                summary = probe_at_init(config)["summary"]
                measured.append({"key_dim": key_dim, **{
                    name: float(summary[name]) for name in STATISTICS}})
        stats = {name: over_seeds(measured, ("key_dim",), itemgetter(name))
                 for name in STATISTICS}
        rows += [{"mode": mode, "arm": arm, "key_dim": key_dim, **{
            name: stats[name][(key_dim,)] for name in STATISTICS}}
            for key_dim in key_dims]
        log(f"init picture: {mode} measured at d_k "
            f"{', '.join(map(str, key_dims))}")
    return rows


def growth_exponents(rows):
    """Per mode: the slope of log(score std) against log(d_k), the measured
    counterpart of the predicted 0 (sqrt, qk_norm), 1/2 (none) and -1/2
    (inverse)."""
    out = {}
    for mode in MODES:
        points = [(row["key_dim"], row["score_std"]["mean"])
                  for row in rows if row["mode"] == mode
                  and row["score_std"]["mean"] > 0]
        if len(points) >= 2:
            x = np.log([point[0] for point in points])
            y = np.log([point[1] for point in points])
            out[mode] = float(np.polyfit(x, y, 1)[0])
    return out
