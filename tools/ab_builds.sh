#!/usr/bin/env bash
# On a GPU machine: build this tree once per compile-time variant and time each
# with python -m tools kernel-times, in one call, so the variants share a device.
# Usage: bash tools/ab_builds.sh OUTDIR VARIANT...
#   VARIANT is NAME=FLAGS, FLAGS passed to nvcc (NVCC_APPEND_FLAGS), e.g. base= frontier=-DLINREC_X=1
# Env: TIMES_ARGS (kernel-times arguments, default --lengths 22 24 26), BENCH_ARGS (if set,
#      `python -m linrec.bench` with these arguments instead: whole calls replayed from a CUDA graph,
#      e.g. BENCH_ARGS="--impls linrec --only 2^2"; several runs separated by ';'),
#      SHAPE_ARGS (if set, python -m tools shape-sweep with these arguments instead, e.g.
#      SHAPE_ARGS="--min-log 40" for its layouts alone),
#      TESTS (pytest -k run after the last variant's timing, on that build).
set -uo pipefail
out=$1; shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for variant in "$@"; do
  name=${variant%%=*} flags=${variant#*=}
  start=$(date +%s)
  rm -rf "$repo/build"  # ninja does not see NVCC_APPEND_FLAGS change
  # Build logs are copied to the output folder only when the build fails, to keep the outputs few.
  log=/tmp/ab_install_$name.log
  (cd "$repo" && NVCC_APPEND_FLAGS="$flags" python3 -m pip install --no-build-isolation --no-deps . > "$log" 2>&1) ||
    { cp "$log" "$out/"; tail -30 "$log"; exit 1; }
  echo "== $name ($flags): built in $(( $(date +%s) - start )) s"
  if [ -n "${SHAPE_ARGS:-}" ]; then
    (cd "$repo" && python3 -m tools shape-sweep $SHAPE_ARGS) 2>&1 | tee "$out/times_$name.txt"
  elif [ -n "${BENCH_ARGS:-}" ]; then
    : > "$out/times_$name.txt"
    IFS=';' read -ra bench_runs <<< "$BENCH_ARGS"
    for args in "${bench_runs[@]}"; do
      (cd /tmp && eval "python3 -m linrec.bench $args") 2>&1 | tee -a "$out/times_$name.txt"
    done
  else
    (cd "$repo" && python3 -m tools kernel-times ${TIMES_ARGS:---lengths 22 24 26}) 2>&1 | tee "$out/times_$name.txt"
  fi
done
if [ -n "${TESTS:-}" ]; then
  (cd /tmp && python3 -m pytest -q -x -p no:cacheprovider "$repo/tests/test_gpu.py" -k "$TESTS") > "$out/tests.txt" 2>&1
  tail -5 "$out/tests.txt"
fi
