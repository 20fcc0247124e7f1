"""`AttentionLogger`: the one way a model's attention is probed on fixed
examples and written for TensorBoard, whoever drives the steps.

Floor 2: builds on `keras_attention.diagnostics` (the probe and its
scalars, histograms and heat maps) and `keras_attention.viz` (the Attention
dashboard's summary). `keras_attention.callbacks.AttentionMonitor` drives it
from `model.fit`; the training pipeline drives it from its own callback
beside `fit`. Both write the same tags:

* `attention/<layer>/maps`, the Attention dashboard's summary of the first
  `dashboard_examples` examples (weights, scores, mask, labels, per example
  and head statistics);
* the scalars, histograms and optional heat-map images of
  `keras_attention.diagnostics.write_diagnostics` (entropy, max weight,
  saturated fraction, score std per layer and head; the gradient norms
  where the examples have targets).
"""

import numpy as np

from keras_attention.diagnostics import write_diagnostics
from keras_attention.validation import check_int
from keras_attention.viz import attention_summary
from keras_attention.viz import write_attention_summary

# Examples shown by the Attention dashboard (each costs
# heads * T * S * 2 bytes a step in the event file).
DASHBOARD_EXAMPLES = 4
_RECORD_KEYS = ("weights", "scores", "mask")
_GRADIENT_KEYS = ("grad_norm_query", "grad_norm_key", "grad_norm_value",
                  "grad_norm_scores")


class AttentionLogger:
    """Probes a model on fixed examples and writes what TensorBoard shows.

    Args:
        probe: a `keras_attention.diagnostics.diagnostics_probe(model)`;
            it reads the model's current weights at every call. Its `maps`
            should cover `max(dashboard_examples, max_images)` examples.
        inputs: the examples, as the model takes them.
        targets: their targets, or `None`: no loss, and no gradient
            statistics in what `probe` returns or what is written.
        sample_weight: optional weights of the targets.
        labels: token labels, one list per example (`(B, T)` nested
            sequences of strings; at least one per dashboard example), or
            `None` for positions `0..T-1`. An axis of a map whose length is
            not the labels' gets positions.
        target_cells: optional `(row, column)` cells per dashboard example
            that its targets read from (`task.target_cells`).
        dashboard: write the Attention dashboard's summary.
        dashboard_examples: how many examples the dashboard shows.
        max_images: examples drawn per head in the Images tab's labelled
            heat maps when a step asks for images (0: none; drawing
            dominates the cost of a step).

    Raises:
        ValueError: if `dashboard_examples` is not a positive integer or
            `max_images` not a non-negative one.

    Example:

    ```python
    logger = AttentionLogger(diagnostics_probe(model), tokens, targets)
    with SummaryWriter("runs/a/train") as writer:
        logger.write(logger.probe(), step=0, writer=writer)
    ```
    """

    def __init__(self, probe, inputs, targets=None, sample_weight=None,
                 labels=None, target_cells=None, dashboard=True,
                 dashboard_examples=DASHBOARD_EXAMPLES, max_images=0):
        self._probe = probe
        self.inputs, self.targets = inputs, targets
        self.sample_weight = sample_weight
        self.labels = labels
        self.target_cells = target_cells
        self.dashboard = bool(dashboard)
        self.dashboard_examples = check_int(dashboard_examples,
                                            "dashboard_examples")
        self.max_images = check_int(max_images, "max_images", minimum=0,
                                    expected="a non-negative integer")
        self._prepared = None

    def probe(self):
        """The diagnostics of the model's current weights on the examples
        (without the gradient norms when there are no targets)."""
        return self.collect(self.dispatch())

    def dispatch(self):
        """Starts a probe of the model's current weights: the compiled call
        on the examples, which stay on the device from the first call on;
        returns its outputs where they are, for `collect`."""
        if self._prepared is None:
            self._prepared = self._probe.prepare(
                self.inputs, self.targets, self.sample_weight)
        return self._probe.dispatch(self._prepared)

    def collect(self, pending):
        """The diagnostics of `dispatch`'s outputs: one transfer to the
        host and arithmetic on a few numbers (another thread may run it).
        """
        diagnostics = self._probe.collect(pending)
        if self.targets is None:
            for stats in diagnostics["layers"].values():
                for key in _GRADIENT_KEYS:
                    stats.pop(key, None)
            for key in _GRADIENT_KEYS:
                diagnostics["summary"].pop(key, None)
        return diagnostics

    def check(self, diagnostics):
        """Raises `ValueError` where `write` would refuse `diagnostics` (the
        labels or cells against the maps), before anything is written."""
        if self.dashboard:
            for name, record, statistics in self._dashboard_records(
                    diagnostics):
                attention_summary(record, *self._labels_of(record),
                                  target_cells=self.target_cells,
                                  statistics=statistics)

    def write(self, diagnostics, step, writer, images=True):
        """Writes `diagnostics` (from `probe`) at `step` to `writer`, a
        `keras_attention.events.SummaryWriter`: the dashboard's summary,
        then `write_diagnostics`' summaries (with the heat maps when
        `images`)."""
        if self.dashboard:
            for name, record, statistics in self._dashboard_records(
                    diagnostics):
                write_attention_summary(name, record, step,
                                        *self._labels_of(record),
                                        target_cells=self.target_cells,
                                        writer=writer, statistics=statistics)
        write_diagnostics(diagnostics, step, writer,
                          max_images=self.max_images if images else 0,
                          query_labels=self.labels)

    def _dashboard_records(self, diagnostics):
        """`(name, record, statistics)` of each layer's shown examples; the
        statistics reduced by the probe, or `None` (computed from the
        record) where it gave none."""
        examples = self.dashboard_examples
        for name, stats in diagnostics["layers"].items():
            record = {key: stats[key][:examples] for key in _RECORD_KEYS
                      if stats.get(key) is not None}
            per_example = stats.get("per_example")
            yield name, record, None if per_example is None else {
                key: values[:examples]
                for key, values in per_example.items()}

    def _labels_of(self, record):
        """`(query_labels, key_labels)` of a dashboard record."""
        examples, _, queries, keys = np.shape(record["weights"])
        labels = self.labels

        def axis(length):
            if labels is None:
                return [[str(position) for position in range(length)]
                        ] * examples
            if len(labels) < examples:
                raise ValueError(
                    f"`labels` must hold the labels of each of the "
                    f"{examples} examples shown; received {len(labels)}.")
            rows = [list(row) for row in labels[:examples]]
            if any(len(row) != length for row in rows):
                # Another axis's labels (cross-attention): positions.
                return [[str(position) for position in range(length)]
                        ] * examples
            return rows

        return axis(queries), axis(keys)


def is_finite(diagnostics):
    """Whether the weights the probe read (`"weights_finite"`), every
    statistic and every map of `diagnostics` are finite (a diverged
    model's are not). A few numbers and the shown maps: cheap on the
    host."""
    if not diagnostics.get("weights_finite", True):
        return False
    values = [diagnostics["loss"], *diagnostics["summary"].values()]
    for stats in diagnostics["layers"].values():
        for key, value in stats.items():
            if key == "per_example":
                values.extend(value.values())
            elif key != "mask" and value is not None:
                values.append(value)
    return all(np.all(np.isfinite(np.asarray(value, np.float64)))
               for value in values)
