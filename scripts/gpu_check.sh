#!/usr/bin/env bash
# scripts/gpu_check.py on a machine that has JAX (with CUDA) but neither
# Keras nor a package index: Keras travels as wheels in .whl/ (ignored by
# git), built here first.
#
#   scripts/gpu_check.sh wheels          # here: fill .whl/ (needs pip + index)
#   scripts/gpu_check.sh run [FLAGS]     # there: install .whl/, run the check
#   scripts/gpu_check.sh smoke [FLAGS]   # here: the check's CPU smoke mode
#   scripts/gpu_check.sh collect DIR     # here: DIR's results into
#                                        # scripts/results/<date>-h200/
#
# The GPU call (one command, about 8 minutes), from the checkout that the
# device call sends (its tracked files, about 1.3 MB, travel; .whl/ only
# when carried):
#   1. here:  scripts/gpu_check.sh wheels
#   2. run:   command   = bash scripts/gpu_check.sh run --out "$OUT"
#             carry     = [".whl"]
#             timeout_s = 500
#      The stages end by --budget-s (default 450 s, so the command ends
#      near 7.5 minutes); what ran is in $OUT even if the call is stopped.
#      A rerun of the later stages on the still-warm machine, say:
#      bash scripts/gpu_check.sh run --out "$OUT" --stages compare,sweep \
#          --budget-s 200
#   3. here:  scripts/gpu_check.sh collect <files_at of the reply>
# $OUT gets gpu_check.json, gpu_check.txt (the tables), gpu_check.log,
# comparison-default.md, comparison-full.md and sweep.md: six files.
#
# What .whl/ holds: the Keras of this checkout's environment and what it
# needs that the GPU machine lacks (its image has absl-py, h5py, ml-dtypes,
# numpy, packaging, rich and typing-extensions): namex and optree, built
# for CPython 3.12 on x86-64 Linux. Measured: keras 3.15.1, namex 0.1.0,
# optree 0.20.0; 2,897,577 bytes (2.8 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
# Keras's own requirements that the GPU machine's image does not have.
MISSING=(namex optree)

version_of() {
    python3 -c "import importlib.metadata as m; print(m.version('$1'))"
}

case "${1:-}" in
wheels)
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    specs=("keras==$(version_of keras)")
    for name in "${MISSING[@]}"; do
        specs+=("$name==$(version_of "$name")")
    done
    python3 -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$WHEELS" "${specs[@]}"
    ls -l "$WHEELS"
    du -sh "$WHEELS"
    ;;
run)
    shift
    [ -n "$(ls "$WHEELS"/*.whl 2>/dev/null)" ] || {
        echo "gpu_check.sh: error: no wheels in $WHEELS; run" \
            "'scripts/gpu_check.sh wheels' where pip can reach an index" >&2
        exit 2
    }
    site="${GPU_CHECK_SITE:-/tmp/site}"
    python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    out=
    for ((i = 1; i <= $#; i++)); do
        if [ "${!i}" = --out ]; then j=$((i + 1)); out="${!j}"; fi
    done
    if [ -z "$out" ]; then
        out="scripts/results/$(date +%F)-h200"
        set -- --out "$out" "$@"
    fi
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
        --format=csv,noheader 2>&1 | tee "$out/gpu_check.log" || true
    python3 scripts/gpu_check.py "$@" 2>&1 | tee -a "$out/gpu_check.log"
    exit "${PIPESTATUS[0]}"
    ;;
smoke)
    shift
    exec python3 scripts/gpu_check.py --smoke "$@"
    ;;
collect)
    from="${2:?gpu_check.sh collect DIR: the directory of the files of the GPU run}"
    date=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["run"]["date"])' "$from/gpu_check.json")
    to="scripts/results/$date-h200"
    mkdir -p "$to"
    for name in gpu_check.json gpu_check.txt gpu_check.log \
        comparison-default.md comparison-full.md sweep.md; do
        if [ -f "$from/$name" ]; then cp "$from/$name" "$to/"; fi
    done
    ls -l "$to"
    ;;
*)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
