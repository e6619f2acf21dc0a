"""python -m linrec.bench --distributed (linrec.bench_distributed): a run on 2 CPU processes under
torchrun (gloo), its table and JSON; the ring all_gather model; without torchrun, one line on
stderr and exit status 1."""

import json
import os
import subprocess
import sys

import pytest

import linrec
from linrec import bench
from linrec.bench_distributed import PROG, PROJECTED_WORLDS, RingAllGather

SOURCE_ROOT = os.path.dirname(os.path.dirname(linrec.__file__))
ELEMENTS = 32768  # per rank: (1, 32768), (8, 2048, 2), selective (1, 1536, 16, 16)


def environment(**extra):
    """This interpreter's environment, importing this linrec, without torchrun's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def bench_on_two_cpu_processes(tmp_path, *args):
    """torchrun of `python -m linrec.bench --distributed ARGS` on 2 CPU processes (gloo), in tmp_path."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "linrec.bench", "--distributed", "--elements", str(ELEMENTS), "--inner", "1", *args]
    return subprocess.run(command, cwd=tmp_path, env=environment(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=300)  # a hang, not a slow start under load


def test_two_cpu_processes_write_the_rows(tmp_path):
    result = bench_on_two_cpu_processes(tmp_path, "--reps", "3", "--json", "weak.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("device: CPU, 2 ranks (gloo)") == 1  # rank 0 alone prints
    assert "projection from 2 ranks (a model, not a measurement)" in result.stdout
    assert os.listdir(tmp_path) == ["weak.json"]

    data = json.loads((tmp_path / "weak.json").read_text())
    assert (data["device"], data["world_size"], data["backend"], data["elements"]) == ("CPU", 2, "gloo", ELEMENTS)
    cases = ["(1, 32768)", "(8, 2048, 2)", "selective (1, 1536, 16, 16)"]
    assert [(r["case"], r["backward"]) for r in data["rows"]] == [(c, b) for c in cases for b in (False, True)]
    for row in data["rows"]:
        for key in ("single_ms", "distributed_ms", "local_ms", "exchange_ms", "fold_pair_ms"):
            assert 0 < row[key] < 1e4, (key, row)
        assert row["ratio"] == pytest.approx(row["distributed_ms"] / row["single_ms"])
        assert row["floor_met"] == (row["ratio"] <= data["floor"])
        assert row["exchange_ms"] == pytest.approx(sum(g["ms"] for g in row["all_gathers"]))
        assert len(row["single_ms_ranks"]) == len(row["distributed_ms_ranks"]) == 2
        # The argument check, the (2, state) maps, and in the backward the state's gradient.
        state = [1] if row["case"] == cases[0] else [8, 2048] if row["case"] == cases[1] else [1, 1536, 16]
        shapes = [(g["shape"], g["dtype"]) for g in row["all_gathers"]]
        assert shapes[0][1] == "int64"
        assert shapes[1:] == [([2, *state], "float32")] + ([(state, "float32")] if row["backward"] else [])
    fit = data["all_gather"]
    assert [p["bytes"] for p in fit["points"]] == [16, 16 * 2**20] and fit["beta_gbs"] > 0
    assert [(p["case"], p["backward"], p["world_size"]) for p in data["projection"]] == [
        (r["case"], r["backward"], w) for r in data["rows"] for w in PROJECTED_WORLDS]
    for p in data["projection"]:
        assert p["projected_ms"] > 0 and p["vs_single"] > 0


def test_no_case_matching_only_is_an_error(tmp_path):
    result = bench_on_two_cpu_processes(tmp_path, "--reps", "2", "--only", "no such case")
    assert result.returncode != 0
    assert "python -m linrec.bench --distributed: error: no case name contains 'no such case' (--only; the " \
        "cases: (1, 32768), (8, 2048, 2), selective (1, 1536, 16, 16))" in result.stderr
    assert "device: CPU" not in result.stdout


def test_ring_model_through_its_two_points():
    model = RingAllGather(alpha_ms=0.01, beta_bytes_per_ms=1e8)
    fitted = RingAllGather.fit(4, (16, model.ms(4, 16)), (2**24, model.ms(4, 2**24)))
    assert fitted.alpha_ms == pytest.approx(0.01) and fitted.beta_bytes_per_ms == pytest.approx(1e8)
    assert model.ms(1, 2**20) == 0 and model.ms(512, 0) == pytest.approx(511 * 0.01)


def test_without_torchrun_one_line_on_stderr(tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert bench.main(["--distributed", "--elements", "16384"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (f"{PROG}: error: runs one process a GPU under torchrun: "
                                 "torchrun --nproc-per-node P -m linrec.bench --distributed [--json PATH]\n")

    result = subprocess.run([sys.executable, "-m", "linrec.bench", "--distributed"], cwd=tmp_path,
                            env=environment(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == "" and result.stderr == err
    assert os.listdir(tmp_path) == []


def test_elements_below_the_rows_case(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--distributed", "--elements", "100"])
    assert exit_info.value.code == 2
    assert "argument --elements: 100 is below 16384, the (8, 2048, L) case's rows" in capsys.readouterr().err
