#!/usr/bin/env bash
# The device tuning runs behind the tuning tables (python/linrec/tuning/): every compiled
# config of the kernels that serve each regime, float32 and bfloat16.
# Usage (on a GPU machine, linrec installed): bash tools/tune_sweep.sh OUTDIR [REGIMES...]
#   REGIMES (default: all): long (few long sequences), strided (channel-last), grid, short
set -uo pipefail
out=${1:-tune}
shift || true
regimes=${*:-long strided grid short}
mkdir -p "$out"
for dtype in float32 bfloat16; do
  for regime in $regimes; do
    case $regime in
      long) runs=("--kernels chained --lengths 16777216 --seqs 1" "--kernels chained --lengths 4194304 --seqs 4") ;;
      strided) runs=("--kernels strided --lengths 4096 --seqs 16384") ;;
      grid) runs=("--kernels tile pipe --lengths 1024 2048 4096 16384") ;;
      short) runs=("--kernels packed tile --lengths 16 32 64 128 256 512") ;;
      *) echo "unknown regime $regime"; continue ;;
    esac
    i=0
    for args in "${runs[@]}"; do
      i=$((i + 1))
      echo "== $regime $dtype: $args"
      python3 -m linrec.tune --dtype "$dtype" --reps 10 --all $args --json "$out/tune_${regime}${i}_${dtype}.json" 2>&1 |
        grep -v "^$" | grep -v "^best\|^  "
    done
  done
done
