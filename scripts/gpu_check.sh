#!/usr/bin/env bash
# The project on one GPU on Keras's JAX backend, each stage under `timeout`
# with a limit from the H200's measured times (2026-12-04): the layer's
# correctness (gpu_check.py layer, its matmul precision recorded), "auto"
# against the fused path with and without a causal mask (bench_layer.py),
# the README's main job (`compare`, on JAX), AttentionMonitor's cost
# (bench_callback.py), the torch backend's training, and two
# `--deterministic` runs against one without (gpu_check.py deterministic).
# `bench_train`, `compare-full` and `sweep` run when named in --stages. A
# grid cut by its limit reports its finished runs; every stage's output is
# in its log. Keras travels as wheels (`gpu_check.sh wheels` fills .whl/).
#   bash scripts/gpu_check.sh [--out DIR] [--logdir DIR] [--smoke]
#        [--stages layer,bench_layer,main-job,...]
# At most 6 minutes on a GPU (the limits' sum, 345 s), so a rerun fits a
# 15-minute lease. DIR gets gpu_check.json, .txt (the tables), .log and
# comparison-main-job.md.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = wheels ]; then  # and what Keras needs that JAX's image lacks
    rm -rf .whl && python3 -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp -d .whl \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        $(python3 -c 'import importlib.metadata as m
print(*(f"{n}=={m.version(n)}" for n in ("keras", "namex", "optree")))')
    exec du -sh .whl
fi
smoke= out=scripts/results/$(date +%F)-gpu-check runs=
stages=layer,bench_layer,main-job,callback,torch-train,deterministic
while [ $# -gt 0 ]; do
    case "$1" in
    --smoke) smoke=1 ;;
    --out | --logdir | --stages) declare "${1#--}=$2"; shift ;;
    *) echo "gpu_check.sh: error: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
# Before the wheels are installed: a refusal installs nothing (JAX is the
# machine's own).
if [ -z "$smoke" ] && [ "$(python3 -c 'import jax
print(jax.default_backend())' 2>/dev/null)" != gpu ]; then
    echo "gpu_check.sh: error: JAX sees no GPU; --smoke runs on a CPU" >&2
    exit 2
fi
if [ -z "$smoke" ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=jax \
    PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
runs=${logdir:-$(mktemp -d -t gpu-check-XXXX)}
mkdir -p "$out" "$runs" && rm -f "$runs/stages.tsv" || exit 2
if [ -n "$smoke" ]; then  # every stage's code path, at tiny sizes
    declare -A limit=([layer]=300 [bench_layer]=300 [main-job]=300
                      [callback]=300 [torch-train]=300 [deterministic]=300
                      [bench_train]=300 [compare-full]=300 [sweep]=300)
    layer=(--smoke)
    bench=(--seq-lens 32 --heads 2 --batch 1 --width 16 --key-dim 8
           --repeats 1 --warmup 1
           --implementations auto,explicit,fused,memory_efficient)
    # One 10-step window past the warm-up: the trainer logs every 10.
    train=(--steps 20 --warmup 5 --d-model 16 --key-dim 8
           --batch-size 8 --matmul-size 64 --diagnostics-every 20)
    tiny=(--key-dims 8 --seeds 1 --steps 8 --d-model 16 --batch-size 8
          --heldout-size 32 --probe-size 4 --num-pairs 4 --num-keys 8
          --num-values 4 --jobs 1)
    compare=("${tiny[@]}" --train-key-dims all --variance-samples 100)
    full=("${compare[@]}") sweep=("${tiny[@]}" --optimizers sgd
                                  --learning-rates 0.1 --init-key-dims none)
    callback=(--steps 20 --rounds 1 --update-freq 10)
    torch=(--steps 8 --d-model 16 --key-dim 8 --batch-size 8
           --heldout-size 32 --probe-size 4 --num-pairs 4 --num-keys 8
           --num-values 4)
else
    # Measured on the H200 (2026-12-04): layer 57 s, the bench_layer stage
    # of three paths 52 s, the main job 120 s before the factored scores
    # (its runs' training was 4 s each; start-up and compiling the rest),
    # a 300-step torch run 15 s; the deterministic stage is three such
    # runs on JAX. Their sum, 345 s, is the check's most.
    declare -A limit=([layer]=60 [bench_layer]=45 [main-job]=100
                      [callback]=40 [torch-train]=40 [deterministic]=60
                      [bench_train]=60 [compare-full]=60 [sweep]=60)
    layer=() train=(--steps 200 --warmup 50)
    # Long sequences in bf16, where the fused path meets cuDNN ("dpa").
    bench=(--precision mixed_bfloat16 --seq-lens 4096,16384 --heads 16
           --key-dim 64 --width 1024 --batch 2 --warmup 2 --repeats 3
           --implementations auto,fused)
    compare=() full=(--train-key-dims 1024 --seeds 1 --jobs 4)
    sweep=(--jobs 4) callback=(--steps 500 --rounds 2) torch=(--steps 300)
fi

stage() {  # stage NAME LIMIT_S COMMAND...: its output in $runs/NAME.log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    case ,$stages, in *",${name%-report},"*) ;; *) return 0 ;; esac
    echo "== $name (limit $limit s): $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$runs/$name.log"
    set -- "${PIPESTATUS[0]}"
    printf '%s\t%s\t%s\t%s\n' "$name" "$1" $((SECONDS - start)) "$limit" \
        >>"$runs/stages.tsv"
    return "$1"
}
grid() {  # grid NAME LIMIT_S COMMAND PRESET FLAGS...
    local name=$1 limit=$2
    set -- python3 -m pipelines "$3" --backend jax --preset "$4" \
        --logdir "$runs/$name" "${@:5}"
    stage "$name" "$limit" "$@"
    case $? in  # cut by its limit: the report of the runs that finished
    124 | 137) stage "$name-report" 20 "$@" --report-only ;;
    esac
}
{
    stage layer "${limit[layer]}" python3 scripts/gpu_check.py layer \
        "$runs/layer.json" "${layer[@]}"
    stage bench_layer "${limit[bench_layer]}" python3 scripts/bench_layer.py \
        --backend jax --masks none,causal "${bench[@]}"
    stage bench_train "${limit[bench_train]}" python3 scripts/bench_train.py \
        --backend jax --rounds 1 "${train[@]}"
    # The README's main job as written, on JAX (no TensorFlow here).
    grid main-job "${limit[main-job]}" compare default "${compare[@]}"
    stage callback "${limit[callback]}" python3 scripts/bench_callback.py \
        --backend jax "${callback[@]}"
    stage torch-train "${limit[torch-train]}" python3 -m pipelines train \
        --backend torch --logdir "$runs/torch-train" "${torch[@]}"
    stage deterministic "${limit[deterministic]}" python3 \
        scripts/gpu_check.py deterministic "$runs/deterministic" \
        ${smoke:+--smoke}
    grid compare-full "${limit[compare-full]}" compare full "${full[@]}"
    grid sweep "${limit[sweep]}" sweep quick "${sweep[@]}"
    python3 scripts/gpu_check.py summary "$runs" "$out" ${smoke:+--smoke}
} 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
