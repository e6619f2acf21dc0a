"""The sdist, which `pip install --no-binary linrec linrec` builds from, holds every source file."""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_files(prefix):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def test_sdist_holds_every_csrc_file(tmp_path):
    csrc = tracked_files("csrc")
    tree = tmp_path / "tree"
    for name in tracked_files("."):  # a copy of the checkout, so the build leaves no files in it
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    built = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=tree,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = sorted(n.split("/", 1)[1] for n in tar.getnames() if "/csrc/" in n and not tar.getmember(n).isdir())
    assert names == csrc


def test_public_api_is_typed():
    """py.typed ships beside the package, and the public API's annotations (strings, under
    `from __future__ import annotations`) resolve to what their modules import."""
    import typing

    import linrec
    from linrec.impl import cuda, python
    from linrec.models import GILR, LSLSTM, selective_scan

    assert (Path(linrec.__file__).parent / "py.typed").is_file()
    functions = [linrec.linrec, linrec.build_info, linrec.compiled_configs, python.linrec_ref, python.linrec_hop,
                 cuda.linrec_tile, cuda.linrec_ref, selective_scan, GILR.forward, LSLSTM.forward]
    for fn in functions + [GILR.__init__, LSLSTM.__init__]:
        hints = typing.get_type_hints(fn)
        assert "return" in hints or fn.__name__ == "__init__", fn.__qualname__
        assert set(hints) - {"return"} >= {name for name in fn.__code__.co_varnames[:fn.__code__.co_argcount]
                                           if name != "self"}, fn.__qualname__
