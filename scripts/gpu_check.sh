#!/usr/bin/env bash
# One call on a GPU machine: build, GPU tests, sanitizer, kernel attributes, a short benchmark.
# Usage: bash scripts/gpu_check.sh [OUTDIR]   (the device tool passes $OUT)
# Env: TESTS (pytest -k filter), SKIP_SANITIZER=1, SKIP_TUNE=1, TORCH_CUDA_ARCH_LIST (default 9.0).
set -uo pipefail
out=${1:-${OUT:-results}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"

start=$(date +%s)
if [ -n "${LINREC_WHEEL:-}" ]; then
  python3 -m pip install --no-deps --force-reinstall "$LINREC_WHEEL" > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
else
  python3 -m pip install --no-build-isolation --no-deps -v . > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
fi
echo "install: $(( $(date +%s) - start )) s"
cd /tmp  # import the installed package, not the source tree
python3 -m linrec --info | head -5

python3 -m pytest -q -rfE -p no:cacheprovider "$OLDPWD/tests" ${TESTS:+-k "$TESTS"} --junitxml="$out/junit.xml" > "$out/tests.txt" 2>&1; tail -25 "$out/tests.txt"
python3 -m linrec.func_attrs --json "$out/func_attrs.json" | tail -3
python3 -m linrec
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 "$OLDPWD/scripts/sanitize_cases.py" > "$out/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -c ERROR "$out/sanitizer_$tool.txt") errors)"; tail -2 "$out/sanitizer_$tool.txt"
  done
fi
if [ "${SKIP_TUNE:-0}" != 1 ]; then
  python3 -m linrec.tune --json "$out/tune.json" --lengths 64 256 1024 4096 16384 65536 --reps 10 2>&1 | tail -40
fi
