"""What a log of `AttentionMonitor` costs the training loop: what leaves the
device (on JAX counted with `jax.transfer_guard`, which refuses every
implicit transfer, and a count of the one explicit `jax.device_get`), the
steps it writes under `steps_per_execution`, and a write that fails on its
writer thread.

The fetched size is checked on every backend against the bound the design
allows: the maps of the `maps` examples asked for, the per-row entropies
for the histogram, and a few numbers per (example, head); never the whole
batch's scores, weights or gradients.
"""

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from _backends import BACKEND
from keras_attention import AttentionMonitor
from keras_attention import build_sequence_model
from keras_attention.dashboard import AttentionLogger
from keras_attention.diagnostics import diagnostics_probe
from keras_attention.events import SummaryWriter

SEQ_LEN, VOCAB, HEADS, LAYERS = 8, 10, 2, 2
EXAMPLES, MAPS = 32, 2


def _model():
    keras.utils.set_random_seed(3)
    model = build_sequence_model(
        vocab_size=VOCAB, seq_len=SEQ_LEN, num_classes=VOCAB, d_model=16,
        key_dim=8, num_heads=HEADS, num_layers=LAYERS)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    return model


def _examples(count=EXAMPLES):
    rng = np.random.default_rng(4)
    return (rng.integers(1, VOCAB, (count, SEQ_LEN)),
            rng.integers(0, VOCAB, (count, SEQ_LEN)))


def _nbytes(tree):
    return sum(np.asarray(leaf).nbytes for leaf in keras.tree.flatten(tree)
               if leaf is not None)


@pytest.mark.backends("jax", "torch")
def test_one_log_fetches_little_once_and_sends_nothing_back(monkeypatch):
    model = _model()
    x, y = _examples()
    probe = diagnostics_probe(model, maps=MAPS)
    logger = AttentionLogger(probe, x, y, dashboard_examples=MAPS)
    first = logger.probe()  # compiles; the examples go to the device
    fetched = []
    fetch = probe._fetch

    def counted(outputs):
        fetched.append(_nbytes(outputs))
        return fetch(outputs)

    monkeypatch.setattr(probe, "_fetch", counted)
    if BACKEND == "jax":
        import jax

        gets = []
        device_get = jax.device_get
        monkeypatch.setattr(
            jax, "device_get",
            lambda tree: gets.append(1) or device_get(tree))
        # Any implicit transfer, either way, raises.
        with jax.transfer_guard("disallow"):
            diagnostics = logger.collect(logger.dispatch())
        assert len(gets) == 1
    else:
        diagnostics = logger.collect(logger.dispatch())
    assert len(fetched) == 1
    # The design's bound: the maps asked for (weights, scores: float32;
    # the causal mask: bool) and per row one entropy and one flag; per
    # (example, head) 9 float32 sums; a few scalars.
    rows = EXAMPLES * HEADS * SEQ_LEN
    bound = LAYERS * (9 * MAPS * HEADS * SEQ_LEN * SEQ_LEN + rows * 5
                      + EXAMPLES * HEADS * 9 * 4 + 4 * 4) + 64
    whole_maps = LAYERS * 2 * EXAMPLES * HEADS * SEQ_LEN * SEQ_LEN * 4
    assert fetched[0] <= bound < whole_maps / 2
    # The same weights give the same diagnostics as the first, synchronous
    # probe.
    for name, stats in diagnostics["layers"].items():
        assert stats["weights"].shape == (MAPS, HEADS, SEQ_LEN, SEQ_LEN)
        np.testing.assert_array_equal(stats["weights"],
                                      first["layers"][name]["weights"])
        np.testing.assert_allclose(stats["entropy"],
                                   first["layers"][name]["entropy"])


def _steps(directory, tag):
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return sorted(event.step for event in accumulator.Tensors(tag))


def test_steps_are_batches_under_steps_per_execution(tmp_path):
    model = _model()
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True), steps_per_execution=4)
    x, y = _examples(64)
    # 64 examples in batches of 8, two epochs: 16 batches, in calls that
    # start at batches 0, 4, 8 and 12. Two monitors in one fit.
    expected = {
        8: [0, 8, 16],
        # A log at the first start at or after each multiple of 6, and at
        # the end.
        6: [0, 8, 12, 16],
    }
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
              callbacks=[AttentionMonitor(tmp_path / str(every), x[:2],
                                          update_freq=every)
                         for every in expected])
    for every, steps in expected.items():
        run = tmp_path / str(every) / "train"
        assert _steps(run, "attention/attention_0/entropy/head0") == steps
        assert _steps(run, "epoch_loss") == [0, 1]


def test_a_refused_write_is_raised_and_earlier_steps_stay(tmp_path,
                                                          monkeypatch):
    """A write that fails on the writer thread fails `fit` (at the next
    batch's hook or at its end) with the error; what was written stays."""
    model = _model()
    x, y = _examples(64)
    write = SummaryWriter.scalar

    def refused_after_step_0(self, tag, value, step, *args, **kwargs):
        if step > 0:
            raise OSError(28, "No space left on device")
        return write(self, tag, value, step, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "scalar", refused_after_step_0)
    with pytest.raises(OSError, match="No space left"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[AttentionMonitor(tmp_path, x[:2],
                                              update_freq=2)])
    assert _steps(tmp_path / "train",
                  "attention/attention_0/entropy/head0") == [0]
