"""The examples in examples/ run on the CPU at tiny sizes, and do what they say."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only add overhead on a busy machine
    yield
    torch.set_num_threads(threads)


def test_train_lru_cli_loss_goes_down(tmp_path, capsys, one_thread):
    """The complex LRU, through the command line (in this process: no second torch import): the loss
    falls well below its start and below the loss of predicting the mean (the model has learned
    which values to add), and the PNG is written."""
    args = ["--model", "lru", "--steps", "200", "--size", "16", "--length", "32"]
    png = tmp_path / "loss.png"
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert load("train_lru").main([*args, *(["--png", str(png)] if has_matplotlib else [])]) == 0
    out = capsys.readouterr().out
    first, last, baseline = map(float, re.search(r"first ([\d.]+) -> last ([\d.]+).*gives ([\d.]+)", out).groups())
    assert last < 0.25 * first, out
    assert last < 0.5 * baseline, out
    if has_matplotlib:
        assert png.read_bytes().startswith(b"\x89PNG")


def test_train_hawk_loss_goes_down(one_thread):
    """The real, input-gated Hawk recurrence, called in-process."""
    train_lru = load("train_lru")
    losses = train_lru.train("hawk", steps=150, size=16, length=32)
    first, last = sum(losses[:15]) / 15, sum(losses[-15:]) / 15
    assert last < 0.25 * first, (first, last)
    assert last < 0.5 * train_lru.MEAN_BASELINE, (first, last)


def test_adding_problem_targets():
    train_lru = load("train_lru")
    x, target = train_lru.adding_problem(8, 10, torch.Generator().manual_seed(0))
    assert x.shape == (8, 10, 2) and target.shape == (8,)
    assert torch.equal(x[..., 1].sum(1), torch.full((8,), 2.0))  # two markers a sequence
    assert torch.allclose((x[..., 0] * x[..., 1]).sum(1), target)


def test_selective_scan_example_matches_loop(capsys, one_thread):
    """Values and gradients of linrec.models.selective_scan against the example's float64 loop."""
    assert load("selective_scan").main(["--channels", "8", "--states", "4", "--length", "24"]) == 0
    assert "largest error" in capsys.readouterr().out


def test_mamba_example_loads_and_decodes(capsys, one_thread):
    """The Mamba block loads a state_dict of mamba_ssm's layout, and decoding it one token at a
    time gives its outputs over the whole sequence."""
    assert load("mamba_from_state_dict").main(["--d-model", "16", "--length", "9"]) == 0
    out = capsys.readouterr().out
    assert "A_log (32, 16)" in out and "dt_proj.bias (32,)" in out, out
