#!/usr/bin/env bash
# On a GPU machine, in one call: install linrec (a carried wheel, or a build of this
# tree), then run the GPU checks. Writes logs and JSON under OUTDIR.
# Usage: bash scripts/gpu_check.sh [OUTDIR] [STEPS...]   (the device tool passes $OUT)
#   STEPS (default: tests attrs main sanitizer bench): any of
#     tests      the pytest suite (GPU tests included), or the files $TEST_FILES (paths from the
#                repository root), filtered by $TESTS (pytest -k), with $PYTEST_ARGS (e.g. -n 14);
#                TEST_SHARD=k/n runs the k-th of n shares of the test files (the whole suite takes
#                more than one 10-minute call on an H200 with 16 workers: 1/2 and 2/2 in two calls);
#                RESUME_JUNIT="a.xml b.xml" runs only the tests those JUnit files (runs cut off) do not list
#     attrs      python -m linrec.func_attrs (registers, spills)
#     main       python -m linrec (the main job)
#     sanitizer  compute-sanitizer memcheck + racecheck over python -m tools sanitize-cases $SANITIZE_ARGS
#     tune       python -m linrec.tune
#     table      python -m linrec.tune --table: a tuning table measured on this device (table.json)
#     sweep      python -m tools config-sweep $SWEEP_ARGS (kernel times of every compiled config;
#                several runs: SWEEP_ARGS="tile --lengths 10; pipe --lengths 11")
#     shapes     python -m tools shape-sweep $SHAPE_ARGS (the rule against torch.add between the
#                bench's cases; SHAPE_ARGS="--min-log 40" for its layouts alone)
#     bench      python -m linrec.bench (table, JSON, PNG)
#     before     python -m linrec.bench under $BEFORE_WHEEL, each of the ';'-separated $BEFORE_ARGS
#                (JSON before_N.json), then the wheel under test again: a same-run baseline
#     models     python -m tools models-bench (linrec.models against torch.nn.LSTM)
#     step       python -m linrec.bench --model (a gated linear RNN's training step against an
#                elementwise stand-in for the scan and the peers)
#     host       python -m linrec.bench --host (host time of one eager call, CPU and CUDA tensors)
#     complex    python -m tools complex-bench (complex64 recurrences beside float32 and torch.add)
#     grid       python -m tools throughput-grid (Martin & Cundy's training-throughput grid, JSON and PNG)
#     peer       start building mamba_ssm from the sdist $MAMBA_SDIST in the background (sm_90 only;
#                about 3 minutes with 16 jobs), for the selective step
#     weak-scaling  torchrun -m linrec.bench --distributed on 1, 2, 4 ... GPUs, as many as the machine has
#     peer-tests the tests that compare with mamba_ssm (tests/test_mamba.py -k mamba_ssm), after the build
#     selective  python -m linrec.bench --selective (after the peer build, where one was started)
#     selective-configs  python -m tools selective-configs (each compiled selective-scan config's time)
#     selective-ncu  Nsight Compute sections of the first selective_scan_fwd and _bwd kernels at
#                $NCU_SHAPE (default 8 3072 16 2048, bf16) and config $NCU_CONFIG (default 8 4)
# Env: LINREC_WHEEL (install this wheel with --no-deps instead of building), LINREC_TREE_PYTHON=1 (then
#      copy the tree's python/linrec over the installed package: a wheel built before a change to
#      Python files and tuning tables alone, whose compiled module is unchanged), PEER_WHEELS (wheels
#      of the bench's peers, installed with --no-deps: accelerated-scan, fla-core, ninja),
#      BEFORE_WHEEL, BEFORE_ARGS, MAMBA_SDIST, TORCH_CUDA_ARCH_LIST (default 9.0 when building),
#      TESTS, TEST_FILES, RESUME_JUNIT, PYTEST_ARGS, BENCH_ARGS, SANITIZE_ARGS, TUNE_ARGS, TABLE_ARGS, SWEEP_ARGS, SELECTIVE_ARGS,
#      WEAK_ARGS, TEST_TIMEOUT (seconds, default 900).
set -uo pipefail
out=${1:-${OUT:-results}}
shift || true
steps=${*:-tests attrs main sanitizer bench}
repo=$(pwd)
# Absolute wheel paths: the steps run from /tmp.
[ -n "${LINREC_WHEEL:-}" ] && LINREC_WHEEL=$(realpath "$LINREC_WHEEL")
[ -n "${BEFORE_WHEEL:-}" ] && BEFORE_WHEEL=$(realpath "$BEFORE_WHEEL")
[ -n "${RESUME_JUNIT:-}" ] && RESUME_JUNIT=$(realpath $RESUME_JUNIT | tr '\n' ' ')
mkdir -p "$out"
out=$(cd "$out" && pwd)  # the steps run from /tmp or the repository root
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
if p: print('SMs', p.multi_processor_count, 'L2', p.L2_cache_size, 'capability', p.major, p.minor,
            'memory clock kHz', getattr(p, 'memory_clock_rate', None), 'bus bits', getattr(p, 'memory_bus_width', None))" |
  tee -a "$out/gpu.txt"

start=$(date +%s)
if [ -n "${LINREC_WHEEL:-}" ]; then
  python3 -m pip install --no-deps --force-reinstall "$LINREC_WHEEL" > "$out/install.log" 2>&1 || { tail -50 "$out/install.log"; exit 1; }
  if [ "${LINREC_TREE_PYTHON:-0}" = 1 ]; then
    site=$(cd /tmp && python3 -c "import linrec, os; print(os.path.dirname(linrec.__file__))")
    (cd python/linrec && find . \( -name '*.py' -o -name '*.json' \) -exec cp --parents {} "$site" \;)
    echo "Python files and tables from the tree: $(cd python/linrec && find . \( -name '*.py' -o -name '*.json' \) | wc -l)"
  fi
else
  python3 -m pip install --no-build-isolation --no-deps -v . > "$out/install.log" 2>&1 || { tail -50 "$out/install.log"; exit 1; }
fi
if [ -n "${PEER_WHEELS:-}" ]; then
  python3 -m pip install --no-deps $PEER_WHEELS >> "$out/install.log" 2>&1 || echo "peer wheels: install failed"
fi
echo "install: $(( $(date +%s) - start )) s"
cd /tmp  # import the installed package, not the source tree
# The development tools (python -m tools) run from the repository root: its python/ (the source
# package) is not on sys.path there, so they too import the installed linrec.
run_tool() { (cd "$repo" && python3 -m tools "$@"); }
python3 -m linrec --info > "$out/info.json"; head -6 "$out/info.json"

wait_for_peer() {
  if [ -n "${peer_build:-}" ]; then
    wait "$peer_build"; echo "mamba_ssm build: exit $?"; tail -2 "$out/peer_build.log"; peer_build=
  fi
}

for step in $steps; do
  echo "== $step"
  case $step in
    tests)
      files=${TEST_FILES:-$(cd "$repo" && ls tests/test_*.py)}
      if [ -n "${TEST_SHARD:-}" ]; then  # every n-th file from the k-th, in name order
        k=${TEST_SHARD%/*} n=${TEST_SHARD#*/}
        files=$(printf '%s\n' $files | awk -v k="$k" -v n="$n" '(NR - k) % n == 0')
      fi
      paths=(); for f in $files; do paths+=("$repo/$f"); done
      if [ -n "${RESUME_JUNIT:-}" ]; then  # only the tests that earlier runs' JUnit XML files lack
        python3 -m pytest --collect-only -q -p no:cacheprovider "${paths[@]}" ${TESTS:+-k "$TESTS"} 2>/dev/null |
          (cd "$repo" && python3 -m tools tests-not-run $RESUME_JUNIT) > "$out/not_run.txt"
        echo "tests not in $RESUME_JUNIT: $(wc -l < "$out/not_run.txt")"
        mapfile -t paths < <(sed "s#^#$repo/#" "$out/not_run.txt")
        [ ${#paths[@]} -gt 0 ] || continue
      fi
      # A time limit, so that a hung kernel leaves the later steps their time; as an interrupt,
      # so that pytest still reports the failures so far and writes its XML.
      timeout -s INT -k 60 "${TEST_TIMEOUT:-900}" python3 -m pytest -q -rfE -p no:cacheprovider "${paths[@]}" ${TESTS:+-k "$TESTS"} ${PYTEST_ARGS:-} \
        --durations=15 --junitxml="$out/junit.xml" > "$out/tests.txt" 2>&1
      tail -15 "$out/tests.txt" ;;
    attrs) python3 -m linrec.func_attrs --json "$out/func_attrs.json" | tail -1 ;;
    main) python3 -m linrec ;;
    sanitizer)
      for tool in memcheck racecheck; do
        (cd "$repo" && compute-sanitizer --tool $tool --error-exitcode 9 python3 -m tools sanitize-cases ${SANITIZE_ARGS:-}) \
          > "$out/sanitizer_$tool.txt" 2>&1
        echo "compute-sanitizer $tool: exit $?"; tail -1 "$out/sanitizer_$tool.txt"
      done ;;
    tune) python3 -m linrec.tune --json "$out/tune.json" --reps 10 ${TUNE_ARGS:-} 2>&1 | tail -40 ;;
    table) python3 -m linrec.tune --table "$out/table.json" --reps 10 ${TABLE_ARGS:-} 2>&1 | tee "$out/table.txt" ;;
    sweep)
      IFS=';' read -ra sweeps <<< "${SWEEP_ARGS:-tile}"
      for args in "${sweeps[@]}"; do
        run_tool config-sweep $args 2>&1 | tee -a "$out/sweep.txt"
      done ;;
    shapes) run_tool shape-sweep ${SHAPE_ARGS:-} --json "$out/shapes.json" 2>&1 | tee "$out/shapes.txt" ;;
    bench)  # eval: BENCH_ARGS may quote an argument, e.g. --only ' x 2^2'
      eval "python3 -m linrec.bench --json \"\$out/bench.json\" --png \"\$out/bench.png\" ${BENCH_ARGS:-}" 2>&1 |
        tee "$out/bench.txt" | tail -150 ;;
    before)
      python3 -m pip install --no-deps --force-reinstall "$BEFORE_WHEEL" > "$out/install_before.log" 2>&1 &&
        n=0 && IFS=';' read -ra runs <<< "${BEFORE_ARGS:-}" &&
        for args in "${runs[@]}"; do
          n=$((n + 1))
          eval "python3 -m linrec.bench --json \"\$out/before_$n.json\" $args" 2>&1 | tee -a "$out/before.txt" | tail -40
        done
      if [ -n "${LINREC_WHEEL:-}" ]; then
        python3 -m pip install --no-deps --force-reinstall "$LINREC_WHEEL" >> "$out/install_before.log" 2>&1
      else
        python3 -m pip install --no-build-isolation --no-deps "$repo" >> "$out/install_before.log" 2>&1
      fi
      echo "before: done, the wheel under test reinstalled (exit $?)" ;;
    models) run_tool models-bench --json "$out/models.json" 2>&1 | tee "$out/models.txt" ;;
    step) python3 -m linrec.bench --model --json "$out/step.json" 2>&1 | tee "$out/step.txt" ;;
    host) python3 -m linrec.bench --host --json "$out/host.json" 2>&1 | tee "$out/host.txt" ;;
    complex) run_tool complex-bench --json "$out/complex.json" 2>&1 | tee "$out/complex.txt" ;;
    grid) run_tool throughput-grid --json "$out/grid.json" --png "$out/grid.png" 2>&1 | tee "$out/grid.txt" | tail -5 ;;
    peer)
      peer_dir=$(mktemp -d) && tar xzf "$repo/$MAMBA_SDIST" -C "$peer_dir"
      peer_src=$(ls -d "$peer_dir"/mamba_ssm-*)
      # sm_90 only: its setup.py otherwise compiles every architecture it knows.
      sed -i 's/^\( *\)# HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI/\1cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]\n&/' \
        "$peer_src/setup.py"
      (cd "$peer_src" && CUDA_HOME=/usr/local/cuda MAMBA_FORCE_BUILD=TRUE \
        python3 -m pip install --no-build-isolation --no-deps . > "$out/peer_build.log" 2>&1) &
      peer_build=$! ;;
    selective-ncu)
      for kernel in selective_fwd selective_bwd; do
        (cd "$repo" && ncu --clock-control none -k "regex:$kernel" --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
          --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section InstructionStats python3 -m tools selective-configs --dtypes bfloat16 --reps 1 \
          --shape ${NCU_SHAPE:-8 3072 16 2048} --config ${NCU_CONFIG:-8 4}) > "$out/ncu_$kernel.txt" 2>&1
        echo "ncu $kernel: exit $?"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|L1/TEX Hit" "$out/ncu_$kernel.txt" | head -30
      done ;;
    selective-configs) run_tool selective-configs --json "$out/selective_configs.json" 2>&1 | tee "$out/selective_configs.txt" ;;
    weak-scaling)
      gpus=$(nvidia-smi --list-gpus | wc -l)
      for p in 1 2 4 8; do
        [ "$p" -le "$gpus" ] || break
        python3 -m torch.distributed.run --standalone --nproc-per-node "$p" -m linrec.bench --distributed \
          --json "$out/weak_$p.json" ${WEAK_ARGS:-} 2>&1 | tee "$out/weak_$p.txt" | tail -20
      done ;;
    peer-tests)
      wait_for_peer
      python3 -m pytest -q -rfE -p no:cacheprovider "$repo/tests/test_mamba.py" -k mamba_ssm 2>&1 | tail -5 ;;
    selective)
      wait_for_peer
      python3 -m linrec.bench --selective --json "$out/selective.json" ${SELECTIVE_ARGS:-} 2>&1 |
        tee "$out/selective.txt" | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
