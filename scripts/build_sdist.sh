#!/usr/bin/env bash
# Build the sdist and check that it holds what a source build needs.
#   bash scripts/build_sdist.sh      writes .whl/sdist/linrec-VERSION.tar.gz
# setup.py imports torch, so the build runs without isolation next to a torch of any CUDA
# (TORCH_INDEX: the only index torch comes from, e.g. https://download.pytorch.org/whl/cpu;
# empty: pip's own configuration). PYTHON: the interpreter for the virtualenv (default python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${LINREC_WORK:-.whl}/sdist
venv=${LINREC_WORK:-.whl}/venv-sdist
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -c "import torch" 2> /dev/null ||
  "$venv/bin/pip" install -q "torch==2.14.*" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} || exit 1
"$venv/bin/pip" install -q "setuptools>=77" wheel ninja build || exit 1
rm -rf "$out"
LINREC_LOCAL_VERSION='' LINREC_CPU_ONLY=1 "$venv/bin/python" -m build --sdist --no-isolation --outdir "$out" . \
  > "$out.log" 2>&1 || { tail -30 "$out.log"; echo "sdist: build failed"; exit 1; }
sdist=$(ls "$out"/linrec-*.tar.gz)
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python/linrec/_version.py)
missing=$("$venv/bin/python" - "$sdist" "$version" <<'PY'
import subprocess, sys, tarfile
sdist, version = sys.argv[1:]
names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
need = ["pyproject.toml", "setup.py", "LICENSE", "python/linrec/_version.py", "python/linrec/py.typed"]
need += subprocess.run(["git", "ls-files", "csrc", "python/linrec/tuning"], capture_output=True, text=True).stdout.split()
print(" ".join(n for n in need if n not in names)
      + ("" if sdist.endswith(f"linrec-{version}.tar.gz") else f" (named {sdist}, expected linrec-{version})"))
PY
)
if [ -n "$missing" ]; then echo "sdist: FAILED, missing: $missing"; exit 1; fi
echo "sdist: OK, $sdist ($(du -h "$sdist" | cut -f1)), every file under csrc/ included"
