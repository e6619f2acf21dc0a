#!/usr/bin/env bash
# temporary: compute-sanitizer over scripts/sanitize_cases.py, then test_triton.py, on the final build
out=$1; repo=$(pwd)
bash scripts/gpu_check.sh $out sanitizer
cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE $repo/tests/test_triton.py > $out/tests_triton.txt 2>&1; echo "triton rc $?"; tail -3 $out/tests_triton.txt
