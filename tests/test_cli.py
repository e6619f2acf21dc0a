"""The command-line tools (python -m linrec, linrec.bench, linrec.tune, linrec.func_attrs) on the CPU:
--version, argument checking, the error without CUDA, and no file written unless asked. The GPU
work itself is replaced by stubs here; scripts/gpu_check.sh runs it for real."""

import json
import os
import subprocess
import sys

import pytest
import torch

import linrec
import linrec.__main__ as main_cli
from linrec import _cli, bench, func_attrs, tune

VERSION = f"linrec {linrec.__version__}"
GPU_TOOLS = {"linrec.bench": bench, "linrec.tune": tune, "linrec.func_attrs": func_attrs}
TOOLS = {"linrec": main_cli, **GPU_TOOLS}


def run_module(module, *args, cwd):
    """`python -m module args` in a fresh interpreter that imports this linrec, from cwd."""
    source_root = os.path.dirname(os.path.dirname(linrec.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU tools past their CUDA check, on a device named 'fake GPU'."""
    monkeypatch.setattr(_cli, "cuda_unavailable", lambda compiled_kernels: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")


@pytest.mark.parametrize("name", TOOLS)
def test_version(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        TOOLS[name].main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == VERSION + "\n"


@pytest.mark.parametrize("name", TOOLS)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        TOOLS[name].main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {name} ") and "--version" in out


@pytest.mark.parametrize("name", GPU_TOOLS)
def test_without_cuda_one_line_on_stderr(name, monkeypatch, in_tmp, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert GPU_TOOLS[name].main([]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"python -m {name}: error: needs a CUDA device, and torch sees none\n"
    assert os.listdir(in_tmp) == []


@pytest.mark.parametrize("name", ["linrec.tune", "linrec.func_attrs"])
def test_without_compiled_kernels(name, monkeypatch, capsys):
    """tune and func_attrs read the compiled kernels: a device alone is not enough (bench's
    linrec.linrec runs on Triton there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(linrec, "build_info", lambda: dict(cuda=False, cuda_unavailable="this build has no CUDA kernels"))
    assert GPU_TOOLS[name].main([]) == 1
    assert capsys.readouterr().err == (f"python -m {name}: error: needs linrec's compiled CUDA kernels: "
                                       "this build has no CUDA kernels\n")
    assert _cli.cuda_unavailable(compiled_kernels=False) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path, in a fresh interpreter")
@pytest.mark.parametrize("name", GPU_TOOLS)
def test_without_cuda_in_a_process(name, tmp_path):
    result = run_module(name, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []


def test_main_job_writes_nothing(tmp_path):
    result = run_module("linrec", "--seqs", "8", "--length", "33", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "relative error against the float64 reference" in result.stdout
    assert os.listdir(tmp_path) == []
    version = run_module("linrec", "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout == VERSION + "\n"


@pytest.mark.parametrize("name,args,message", [
    ("linrec", ["--seqs", "0"], "argument --seqs: 0 is not positive"),
    ("linrec", ["--length", "ten"], "argument --length: 'ten' is not an integer"),
    ("linrec.bench", ["--dtypes", "int8"], "argument --dtypes: invalid choice: 'int8' (choose from 'float32', "
                                           "'float64', 'float16', 'bfloat16', 'float16+float32', 'bfloat16+float32')"),
    ("linrec.bench", ["--dtypes", "float32+bfloat16"], "argument --dtypes: invalid choice: 'float32+bfloat16'"),
    ("linrec.bench", ["--dtypes", "complex64"], "argument --dtypes: invalid choice: 'complex64'"),
    ("linrec.bench", ["--impls", "cuda"], "argument --impls: invalid choice: 'cuda' (choose from 'linrec', "
                                          "'triton.pipe', 'linrec_hop', 'accelerated_scan.warp', "
                                          "'accelerated_scan.triton', 'fla.chunk_hgrn')"),
    ("linrec.bench", ["--reps", "-1"], "argument --reps: -1 is not positive"),
    ("linrec.tune", ["--dtype", "complex64"], "argument --dtype: invalid choice: 'complex64'"),
    ("linrec.tune", ["--kernels", "ref"], "argument --kernels: invalid choice: 'ref'"),
    ("linrec.tune", ["--lengths", "16", "0"], "argument --lengths: 0 is not positive"),
    ("linrec.func_attrs", ["--csv"], "unrecognized arguments: --csv"),
    # Files to write are checked before anything runs; no option is taken for a prefix.
    ("linrec.bench", ["--host", "--json", "/no/such/folder/b.json"], "argument --json: folder /no/such/folder does "
                                                                     "not exist"),
    ("linrec.bench", ["--png", "."], "argument --png: cannot write ."),
    ("linrec.tune", ["--table", "/no/such/folder/t.json"], "argument --table: folder /no/such/folder does not exist"),
    ("linrec.func_attrs", ["--json", "/no/such/folder/f.json"], "argument --json: folder /no/such/folder"),
    ("linrec.bench", ["--distrib"], "unrecognized arguments: --distrib"),
    # Options a mode has no use for are refused, not ignored.
    ("linrec.bench", ["--host", "--only", "4 x 16", "--dtypes", "float64"], "--host takes no --dtypes, --only"),
    ("linrec.bench", ["--selective", "--png", "s.png"], "--selective takes no --png"),
    ("linrec.bench", ["--host", "--model"], "--host, --model and --selective exclude each other"),
])
def test_bad_arguments(name, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        TOOLS[name].main(args)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and f"python -m {name}: error: {message}" in err


def test_bench_storage_names_match_the_registry():
    """Every real storage type of the registry, mixed ones as values+coeffs, parses to its dtypes."""
    pairs = {bench.parse_storage(name) for name in bench.DTYPES}
    assert pairs == {(getattr(torch, s.values), getattr(torch, s.coeffs)) for s in linrec._registry.STORAGES.values()
                     if not s.values.startswith("complex")}


def fake_bench_rows():
    rows = []
    for length in (16, 32):
        for impl, gbs in (("torch.add", 1000.0), ("linrec", 900.0)):
            rows.append(dict(case=f"grid L={length}", dtype="float32", backward=False, length=length, copy_gbs=2000.0,
                             impl=impl, ms=0.01, eager_ms=0.02, gbs=gbs, frac=gbs / 2000))
    return rows


@pytest.fixture
def fake_bench(monkeypatch, fake_gpu):
    """bench.run replaced: records its arguments, returns fake_bench_rows()."""
    calls = []

    def run(dtypes, reps, max_hop_elems, only, impls, options=False, after_case=None):
        calls.append(dict(dtypes=dtypes, impls=list(impls)))
        return 2000.0, fake_bench_rows()
    monkeypatch.setattr(bench, "run", run)
    monkeypatch.setattr(bench, "implementations", lambda names=None: {"linrec": linrec.linrec, "linrec_hop": linrec.linrec})
    return calls


def test_bench_writes_only_what_is_asked(fake_bench, in_tmp, capsys):
    assert bench.main(["--dtypes", "bfloat16+float32", "float64"]) == 0
    assert os.listdir(in_tmp) == []
    assert fake_bench[-1] == dict(dtypes=["bfloat16+float32", "float64"], impls=["linrec", "linrec_hop"])
    assert "grid L=16" in capsys.readouterr().out

    assert bench.main(["--impls", "linrec", "--json", "b.json"]) == 0
    assert os.listdir(in_tmp) == ["b.json"] and fake_bench[-1]["impls"] == ["linrec"]
    data = json.loads((in_tmp / "b.json").read_text())
    assert data["device"] == "fake GPU" and data["rows"] == fake_bench_rows()

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert bench.main(["--png", "b.png"]) == 0
        assert "matplotlib is not importable: no plot" in capsys.readouterr().err
    else:
        assert bench.main(["--png", "b.png"]) == 0
        assert (in_tmp / "b.png").stat().st_size > 0
    assert sorted(os.listdir(in_tmp)) in (["b.json"], ["b.json", "b.png"])


def test_bench_names_an_implementation_it_cannot_import(fake_bench, capsys):
    assert bench.main(["--impls", "linrec", "accelerated_scan.warp"]) == 1
    assert capsys.readouterr().err == "python -m linrec.bench: error: not importable here: accelerated_scan.warp\n"
    assert fake_bench == []


def fake_tune_rows(error):
    return [dict(kernel="tile", length=16, seqs=4, config=(4, 32, 1, 3), error=1e-7, fwd_ms=0.01, bwd_ms=0.02,
                 fwd_gbs=100.0, bwd_gbs=90.0),
            dict(kernel="tile", length=16, seqs=4, config=(8, 32, 1, 3), error=error, fwd_ms=0.01, bwd_ms=0.02,
                 fwd_gbs=120.0, bwd_gbs=80.0)]


@pytest.mark.parametrize("error", [2e-7, float("nan"), 1.0])
def test_tune_exit_status_and_files(error, monkeypatch, fake_gpu, in_tmp, capsys):
    """No file without --json; status 1 and the failing runs on stderr when a run misses its bound."""
    monkeypatch.setattr(tune, "tune", lambda *args: fake_tune_rows(error))
    ok = error < tune.MAX_ERROR["float32"]
    assert tune.main(["--kernels", "tile"]) == (0 if ok else 1)
    out, err = capsys.readouterr()
    assert os.listdir(in_tmp) == []
    assert f"2 runs, {0 if ok else 1} with error above 0.0001" in out
    if ok:
        assert err == ""
    else:
        assert err == (f"python -m linrec.tune: error: 1 of 2 runs with error above 0.0001 "
                       f"(tile L=16 (8, 32, 1, 3): {error:.1e})\n")
    assert tune.main(["--kernels", "tile", "--json", "t.json"]) == (0 if ok else 1)
    assert os.listdir(in_tmp) == ["t.json"]
    assert len(json.loads((in_tmp / "t.json").read_text())["rows"]) == 2


def test_func_attrs_writes_only_what_is_asked(monkeypatch, fake_gpu, in_tmp, capsys):
    rows = [dict(kernel="tile", storage="f32", backward=False, config=(4, 32, 1, 3), num_regs=40, local_bytes=0,
                 shared_bytes=128)]
    monkeypatch.setattr(func_attrs, "collect", lambda: rows)
    assert func_attrs.main([]) == 0
    assert os.listdir(in_tmp) == [] and "1 kernels, 0 with local memory" in capsys.readouterr().out
    assert func_attrs.main(["--json", "f.json"]) == 0
    assert json.loads((in_tmp / "f.json").read_text())[0]["num_regs"] == 40


def test_main_job_names_a_size_it_cannot_allocate(capsys):
    assert TOOLS["linrec"].main(["--seqs", "99999999999", "--length", "99999999"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m linrec: error: cannot allocate 99999999999 x 99999999 float32") and \
        err.count("\n") == 1
