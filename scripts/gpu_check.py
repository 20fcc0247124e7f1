"""Training throughput and model FLOPs utilization of the trainer on one GPU.

Trains a larger configuration than the CPU defaults with the pipeline's
trainer (`pipelines.train.train`) under `mixed_bfloat16` and XLA
(`jit_compile="on"`) on the default strategy (one device), then prints:

* the device, TensorFlow version and the configuration trained;
* the first step's time (tracing and XLA compilation);
* steady steps/s and tokens/s (median of the trainer's logged windows after
  `--warmup` steps; evaluation, diagnostics and checkpoints excluded);
* model TFLOP/s (matmul FLOPs per token counted analytically, forward x 3)
  and model FLOPs utilization (MFU) against the GPU's dense bf16 peak
  (`--peak-tflops`, else a table of common GPUs), and against a bf16 matmul
  measured in the same run;
* the held-out accuracy of the run, as a sanity check that it trained.

Usage (usually through `scripts/gpu_check.sh`, which passes its flags on):

    python scripts/gpu_check.py                    # on a GPU machine
    python scripts/gpu_check.py --peak-tflops 989  # GPU missing from the table
    python scripts/gpu_check.py --smoke            # tiny dry run, CPU is fine

Bad arguments, or no GPU without `--smoke`, exit with status 2 and one line
on stderr.
"""

import sys
import time

import _bench  # first: backend, log level, sys.path
import _training
from _bench import add_flag
from _bench import tf

PROG = "gpu_check.py"

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendor's
# data sheets; the first name contained in the device name wins, so the
# more specific names come first.
BF16_PEAK_TFLOPS = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
)

# The larger configuration: reversal of 512-token sequences by an 8-layer,
# 16-head, 1024-wide model; about 0.65 GFLOP per token, 21 TFLOP per step.
FULL = dict(task="reverse", seq_len=512, vocab_size=16, d_model=1024,
            num_layers=8, num_heads=16, key_dim=64, batch_size=64,
            steps=300, warmup=50, matmul_size=8192)
# A dry run small enough for a CPU.
SMOKE = dict(task="reverse", seq_len=16, vocab_size=16, d_model=32,
             num_layers=1, num_heads=2, key_dim=16, batch_size=16,
             steps=40, warmup=10, matmul_size=256)


def _setting_key(flag):
    """The key of `FULL` / `SMOKE` that `--flag` sets."""
    key = flag.replace("-", "_")
    return {"layers": "num_layers", "heads": "num_heads"}.get(key, key)


def parse_args(argv=None):
    parser = _bench.parser(
        PROG,
        "Tokens/s and model FLOPs utilization of the trainer with "
        "mixed_bfloat16 and XLA on one GPU.",
    )
    parser.add_argument("--smoke", action="store_true",
                        help="tiny configuration; runs on a CPU")
    add_flag(parser, "--peak-tflops", None,
             "dense bf16 peak of the GPU in TFLOP/s (default: looked up from "
             "the device name)",
             lambda flag: _bench.positive(float, flag, "a positive number"))
    for flag, help_text in (
        ("steps", "optimizer steps"),
        ("warmup", "steps left out of the timing"),
        ("batch-size", "global batch"),
        ("seq-len", "sequence length"),
        ("d-model", "model width"),
        ("layers", "attention blocks"),
        ("heads", "attention heads"),
        ("key-dim", "per-head query/key size"),
    ):
        key = _setting_key(flag)
        add_flag(parser, f"--{flag}", None,
                 f"{help_text} (default {FULL[key]}, smoke {SMOKE[key]})")
    args = parser.parse_args(argv)
    settings = dict(SMOKE if args.smoke else FULL)
    for dest in ("steps", "warmup", "batch_size", "seq_len", "d_model",
                 "layers", "heads", "key_dim"):
        value = getattr(args, dest)
        if value is not None:
            settings[_setting_key(dest)] = value
    if settings["warmup"] >= settings["steps"]:
        parser.error(
            f"--warmup ({settings['warmup']}) must be smaller than --steps "
            f"({settings['steps']})"
        )
    return args, settings


def lookup_peak(device_name):
    """The table's dense bf16 peak (TFLOP/s) for `device_name`, or None."""
    for name, peak in BF16_PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return peak
    return None


def main(argv=None):
    args, settings = parse_args(argv)
    _bench.setup_tensorflow(PROG)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        device_name = details.get("device_name", "GPU")
    elif args.smoke:
        device_name = "CPU (smoke run)"
    else:
        _bench.fail(PROG, "no GPU visible to TensorFlow; run with --smoke for "
                    "a CPU dry run", status=2)

    model_settings = ("task", "seq_len", "vocab_size", "d_model", "num_layers",
                      "num_heads", "key_dim", "batch_size", "steps")
    config, task = _training.resolved_config(PROG, dict(
        {name: settings[name] for name in model_settings},
        precision="mixed_bfloat16", jit_compile="on", strategy="default",
        **_training.quiet_run_settings(settings["steps"]),
    ))
    tokens_per_step = config.batch_size * task.seq_len
    flops_per_token = _bench.model_flops_per_token(config, task)

    used = f"{len(gpus)} GPU(s) visible, 1 used" if gpus else "no GPU"
    print(f"device: {device_name} ({used}); TensorFlow {tf.__version__}")
    print(f"config: task {config.task}, seq_len {task.seq_len}, batch "
          f"{config.batch_size} ({tokens_per_step} tokens/step), d_model "
          f"{config.d_model}, layers {config.num_layers}, heads "
          f"{config.num_heads}, key_dim {config.key_dim}, optimizer "
          f"{config.optimizer}, mixed_bfloat16, XLA on; {config.steps} "
          f"steps, first {settings['warmup']} untimed")
    print(f"model FLOPs per token (fwd+bwd matmuls): {flops_per_token:.3e}",
          flush=True)

    matmul = _bench.measure_matmul_flops(settings["matmul_size"],
                                         dtype="bfloat16")
    size = settings["matmul_size"]
    print(f"measured {size}x{size} bf16 matmul: {matmul / 1e12:.4g} TFLOP/s",
          flush=True)
    peak_tflops = args.peak_tflops or lookup_peak(device_name)
    peak_source = "--peak-tflops" if args.peak_tflops else "table"
    if peak_tflops is None:
        peak_tflops = matmul / 1e12
        peak_source = ("measured bf16 matmul: device not in the table, pass "
                       "--peak-tflops")

    start = time.perf_counter()
    steps_per_second, metrics = _training.train_and_time(
        config, settings["warmup"], "gpu-check-"
    )
    run_seconds = time.perf_counter() - start
    if metrics.get("diverged_at_step") is not None:
        print(f"warning: the loss became non-finite at step "
              f"{metrics['diverged_at_step']}; the throughput below still "
              "holds")

    tokens_per_second = steps_per_second * tokens_per_step
    model_flops = tokens_per_second * flops_per_token
    print(f"first step (trace + XLA compile): "
          f"{metrics['first_step_time_s']:.1f} s; whole run "
          f"{run_seconds:.0f} s")
    print(f"steady: {1e3 / steps_per_second:.1f} ms/step, "
          f"{steps_per_second:.2f} steps/s, {tokens_per_second:,.0f} tokens/s")
    print(f"model: {model_flops / 1e12:.4g} TFLOP/s")
    print(f"MFU vs bf16 peak {peak_tflops:.4g} TFLOP/s ({peak_source}): "
          f"{100 * model_flops / (peak_tflops * 1e12):.1f}%")
    print(f"MFU vs measured bf16 matmul {matmul / 1e12:.4g} TFLOP/s: "
          f"{100 * model_flops / matmul:.1f}%")
    print(f"held-out accuracy after {metrics['steps']} steps: "
          f"{metrics['heldout_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
