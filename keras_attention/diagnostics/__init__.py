"""Attention diagnostics for TensorBoard, computed on a fixed probe batch.

Floor 2 (beside models, tasks and export): imports the layer floor
(`keras_attention.recording`) and the core (`ops`, `validation`, `events`:
the summaries are written to its `SummaryWriter`), never the pipelines.
Inside the package, `statistics` (numpy statistics and `SUMMARY_KEYS`) and
`heatmaps` (colour map, heat-map tiles) import only
the core; `drawing` (labelled maps drawn with matplotlib, their argument
checks; `keras_attention.viz` builds on it) uses `heatmaps`' colour map;
`probe` builds on `statistics` and on one private `_gradients_<backend>`
module per Keras backend (its backward pass), `summaries` on `drawing`;
`length` (attention against the number of keys at initialisation, beside
the i.i.d. theory) imports only the core.

The training pipeline probes every few hundred steps, outside the training
step, with the compiled `diagnostics_probe` (`probe_diagnostics` is the
eager, one-off form of the same computation), and hands the result to
`write_diagnostics`. One forward and backward pass on the probe batch gives,
for every attention layer (`ScaledDotProductAttention`, or Keras's
`MultiHeadAttention`, `GroupQueryAttention`, `Attention`, `AdditiveAttention`:
see `keras_attention.recording.attention_layers`):

* how peaked the attention is: per-head mean softmax entropy (raw and
  normalised by the log of the number of attendable keys), mean maximum
  weight and the fraction of saturated rows;
* how spread the pre-softmax scores are (`score_std`), which is what the
  `1/sqrt(d_k)` scale controls, and the largest of them (`max_abs_score`,
  the attention-logit growth tracked in training-stability studies);
* how much gradient reaches the projections (where the layer has them)
  and the scores (vanishing gradients through a saturated softmax show up
  here first);
* the weights themselves, drawn as labelled heat maps (token labels on
  both axes, a colour bar).

The numeric helpers take and return numpy arrays so they can be used on any
recorded attention, not only inside the probe.
"""

from keras_attention.diagnostics.heatmaps import COLORMAP
from keras_attention.diagnostics.heatmaps import attention_heatmaps
from keras_attention.diagnostics.heatmaps import colorize
from keras_attention.diagnostics.length import iid_theory
from keras_attention.diagnostics.length import length_at_init
from keras_attention.diagnostics.probe import default_loss
from keras_attention.diagnostics.probe import diagnostics_probe
from keras_attention.diagnostics.probe import probe_diagnostics
from keras_attention.diagnostics.statistics import SATURATION_THRESHOLD
from keras_attention.diagnostics.statistics import SUMMARY_KEYS
from keras_attention.diagnostics.statistics import SUMMARY_MAX_KEYS
from keras_attention.diagnostics.statistics import layer_statistics
from keras_attention.diagnostics.statistics import max_abs_score
from keras_attention.diagnostics.statistics import max_weight
from keras_attention.diagnostics.statistics import saturated_fraction
from keras_attention.diagnostics.statistics import score_std
from keras_attention.diagnostics.summaries import MAX_HEATMAP_SIDE
from keras_attention.diagnostics.summaries import write_diagnostics
# The event writer's PNG encoder, as the Images tab's heat maps use it.
from keras_attention.events import encode_png

__all__ = [
    "COLORMAP",
    "MAX_HEATMAP_SIDE",
    "SATURATION_THRESHOLD",
    "SUMMARY_KEYS",
    "SUMMARY_MAX_KEYS",
    "attention_heatmaps",
    "colorize",
    "default_loss",
    "diagnostics_probe",
    "encode_png",
    "iid_theory",
    "layer_statistics",
    "length_at_init",
    "max_abs_score",
    "max_weight",
    "probe_diagnostics",
    "saturated_fraction",
    "score_std",
    "write_diagnostics",
]
