R=$(pwd)
python3 -m pip install --no-build-isolation --no-deps . > $OUT/install.log 2>&1 || { tail -30 $OUT/install.log; exit 1; }
cd /tmp
timeout 240 python3 -m pytest -q -x -p no:cacheprovider $R/tests/test_gpu.py -k "(test_every_staged_chained_config and (float32 or bfloat16)) or (long_sequences and not triton and not pipe) or chained_many or packed or lengths" 2>&1 | tail -3
for d in bfloat16 float32; do
python3 -m linrec.tune --kernels chained --lengths 16777216 --seqs 1 --dtype $d --reps 10 --all --json /tmp/t.json > $OUT/tune_chained_$d.txt 2>&1
grep -E "^chained" $OUT/tune_chained_$d.txt | sort -k5 -n | tail -8
done
python3 $R/scripts/kernel_times.py --reps 10 --lengths 24 26 2>&1 | grep linrec > $OUT/ktimes.txt; cut -c1-60 $OUT/ktimes.txt
