"""Which attention heads of a text run form which pattern, and when.

    keras-attention train --task text --logdir runs/text
    python scripts/text_heads.py --logdir runs/text

For every pattern of `keras_attention.tasks.text_patterns` (the previous
character, the start of the line, the matching bracket, the matching quote,
the character after an earlier occurrence of the last three identifier
characters), a head's score is the mean weight it puts on the pattern's
keys over the queries the pattern applies to; chance is the same mean for
uniform causal attention. The script prints, per pattern, the two best
heads of the trained model over `--examples` held-out windows, and when
each formed: the first diagnostics step at which its score on the run's
probe batch (logged by the trainer as `patterns/<pattern>/<layer>/head_<h>`)
reached `--min-score` and `--min-ratio` times chance.

Bad arguments exit with status 2 and one line on stderr.
"""

import json
import os
import sys

import _bench  # first: backend, log level, sys.path
from _bench import fail

import numpy as np

from keras_attention import record_attention
from keras_attention.tasks import text_patterns
from pipelines.builders import build_task
from pipelines.common import UsageError
from pipelines.settings import TrainConfig
from pipelines.run_dir import CONFIG_FILE
from pipelines.run_dir import EARLIER_EVAL_LOGS
from pipelines.run_dir import EVAL_LOGS
from pipelines.run_dir import restore_model
from pipelines.tensorboard import read_event_scalars

PROG = "text_heads.py"


def parse_args(argv):
    parser = _bench.parser(PROG, __doc__.split("\n\n")[0])
    parser.add_argument("--logdir", required=True, metavar="DIR",
                        help="a text run's directory")
    _bench.add_flag(parser, "--examples", 256,
                    "held-out windows the final model is scored on")
    _bench.add_flag(parser, "--batch", 32, "windows per forward pass")
    parser.add_argument("--min-score", type=float, default=0.2,
                        help="score a formed head reaches (default: 0.2)")
    parser.add_argument("--min-ratio", type=float, default=4.0,
                        help="times chance a formed head reaches "
                        "(default: 4)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the numbers to PATH")
    return parser.parse_args(argv)


def load_run(logdir):
    """The run's config and task (text only)."""
    path = os.path.join(logdir, CONFIG_FILE)
    try:
        with open(path) as handle:
            config = TrainConfig.from_dict(json.load(handle), source=path)
    except (OSError, ValueError) as error:
        fail(PROG, f"--logdir {logdir}: cannot read {CONFIG_FILE} ({error})",
             2)
    if config.task != "text":
        fail(PROG, f"--logdir {logdir} is a {config.task} run, not a text "
             "run", 2)
    return config, build_task(config)


def final_scores(model, task, examples, batch):
    """`{pattern: (scores (layers, heads), chance, queries, layer names)}`
    of the model over the first `examples` held-out windows."""
    tokens = task.heldout(examples)[0]
    sums, chance_sums, counts, names = {}, {}, {}, None
    for start in range(0, examples, batch):
        chunk = tokens[start:start + batch]
        with record_attention(model) as records:
            model(chunk, training=False)
        names = list(records)
        weights = [np.asarray(records[name]["weights"]) for name in names]
        for pattern, cells in task.attention_patterns(chunk).items():
            queries = int(cells[3][-1]) + 1 if len(cells[3]) else 0
            if not queries:
                continue
            layer_scores = []
            for layer_weights in weights:
                scores, chance = text_patterns.pattern_scores(
                    layer_weights, cells)
                layer_scores.append(scores * queries)
            sums[pattern] = sums.get(pattern, 0) + np.array(layer_scores)
            chance_sums[pattern] = chance_sums.get(pattern, 0) + (
                chance * queries)
            counts[pattern] = counts.get(pattern, 0) + queries
    return {pattern: (sums[pattern] / counts[pattern],
                      chance_sums[pattern] / counts[pattern],
                      counts[pattern], names)
            for pattern in sums}


def formed_at(history, chance, min_score, min_ratio):
    """The first step whose probe score is at least `min_score` and
    `min_ratio` times chance, or None."""
    for step in sorted(history):
        value = history[step]
        if value is not None and value >= min_score and (
                value >= min_ratio * chance.get(step, 0.0)):
            return step
    return None


def main(argv):
    args = parse_args(argv)
    config, task = load_run(args.logdir)
    try:
        model = restore_model(args.logdir)
    except UsageError as error:
        fail(PROG, str(error), 2)
    examples = min(args.examples, config.heldout_size)
    finals = final_scores(model, task, examples, min(args.batch, examples))
    # A run of an earlier version kept its held-out events in eval/.
    logged = (read_event_scalars(os.path.join(args.logdir, EVAL_LOGS))
              or read_event_scalars(os.path.join(args.logdir,
                                                 EARLIER_EVAL_LOGS)))
    rows, report = [], {}
    for pattern in text_patterns.PATTERNS:
        if pattern not in finals:
            continue
        scores, chance, queries, names = finals[pattern]
        probe_chance = logged.get(f"patterns/{pattern}/chance", {})
        best = np.argsort(scores, axis=None)[::-1][:2]
        report[pattern] = {"chance": chance, "queries": queries, "heads": []}
        for flat in best:
            layer, head = np.unravel_index(flat, scores.shape)
            name = f"{names[layer]}/head_{head}"
            history = logged.get(f"patterns/{pattern}/{name}", {})
            step = formed_at(history, probe_chance, args.min_score,
                             args.min_ratio)
            score = float(scores[layer, head])
            report[pattern]["heads"].append({
                "head": name, "score": score, "formed_at_step": step,
                "probe_history": {str(k): v for k, v in
                                  sorted(history.items())},
            })
            curve = ", ".join(f"{k}: {v:.2f}" for k, v in
                              sorted(history.items()))
            rows.append([pattern, name, f"{score:.3f}", f"{chance:.3f}",
                         f"{score / chance:.1f}", str(queries),
                         "-" if step is None else str(step), curve])
    print(f"# {args.logdir}: {examples} held-out windows of {task.seq_len} "
          f"characters; formed: probe score >= {args.min_score:g} and >= "
          f"{args.min_ratio:g} x chance")
    print(_bench.text_table(
        ["pattern", "head", "score", "chance", "x chance", "queries",
         "formed at", "probe score by step"], rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
