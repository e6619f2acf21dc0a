"""python -m linrec.bench --model: a gated linear RNN's training step with linrec, a stand-in and each peer.

What users feel is the step, not the kernel. The model is a stack of residual blocks

    a = sigmoid(gate(x)),  v = (1 - a) * value(x),  h[t] = a[t] * h[t-1] + v[t],  x = x + out(h)

over (batch, time, width) tensors, trained with AdamW under bfloat16 autocast (the parameters and
the optimizer in float32). Only the scan changes between the rows:

  linrec                linrec.linrec(v, a, dim=1)
  elementwise stand-in  v * a: no recurrence, the same shapes and autograd graph size; a model
                        cannot train faster with any scan (floor: linrec's step <= 1.02x its)
  accelerated_scan      accelerated-scan's warp scan (where importable), which takes (batch,
                        width, time): the transposes it needs are part of its step
  fla chunk_hgrn        flash-linear-attention's HGRN scan (where importable), on log-gates

A step is zero_grad, forward, a mean-square loss, backward and the optimizer's step, timed
eagerly (CUDA events around `inner` steps, the host running ahead as in a training loop; the
host clock on a machine without a GPU). Each figure is the median of `reps` samples, and the
scans take turns sample by sample. Writes the rows as JSON with --json PATH.
"""

from __future__ import annotations

import json

import torch
from torch import nn

import linrec
from linrec._timing import eager_ms

LAYERS = 4
# (batch, time, width): a host-bound small model, the shape measured when the floor was set,
# and a long-sequence one.
SIZES = {"small (32, 256, 256)": (32, 256, 256), "medium (8, 2048, 1024)": (8, 2048, 1024),
         "long (2, 16384, 1024)": (2, 16384, 1024)}
FLOOR = 1.02  # linrec's step time over the elementwise stand-in's
STAND_IN = "elementwise stand-in"


class GatedBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.gate = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x, scan):
        a = torch.sigmoid(self.gate(x))
        return x + self.out(scan((1 - a) * self.value(x), a))


class GatedLinearRNN(nn.Module):
    def __init__(self, width: int, layers: int = LAYERS):
        super().__init__()
        self.blocks = nn.ModuleList(GatedBlock(width) for _ in range(layers))

    def forward(self, x, scan):
        for block in self.blocks:
            x = block(x, scan)
        return x


def scans() -> dict:
    """{name: scan(values, gates) over dim 1 of (batch, time, width)}: linrec, the stand-in and
    the peers importable here."""
    found = {"linrec": lambda v, a: linrec.linrec(v, a, dim=1), STAND_IN: lambda v, a: v * a}
    try:
        from accelerated_scan.warp import scan as warp_scan

        def accelerated(v, a):
            return warp_scan(a.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()).transpose(1, 2)

        found["accelerated_scan"] = accelerated
    except ImportError:
        pass
    try:
        from fla.ops.hgrn import chunk_hgrn

        found["fla chunk_hgrn"] = lambda v, a: chunk_hgrn(v, a.float().log().to(v.dtype))[0]
    except ImportError:
        pass
    return found


def training_step(model, optimizer, x, scan, autocast_device):
    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(autocast_device, dtype=torch.bfloat16):
            loss = model(x, scan).float().square().mean()
        loss.backward()
        optimizer.step()
    return step


def run(reps: int = 20, inner: int = 3, sizes: dict | None = None, device: str | None = None,
        names: list[str] | None = None) -> list[dict]:
    """The rows: one a (size, scan), with its median step time in ms."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    found = scans()
    found = {k: v for k, v in found.items() if names is None or k in names}
    rows = []
    for size, (batch, time, width) in (sizes or SIZES).items():
        torch.manual_seed(0)
        model = GatedLinearRNN(width).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(batch, time, width, device=device)
        steps = {name: training_step(model, optimizer, x, scan, device) for name, scan in found.items()}
        samples = {name: [] for name in steps}
        for step in steps.values():  # warm-up: autotuning, allocator, the optimizer's state
            for _ in range(2):
                step()
        for _ in range(reps):
            for name, step in steps.items():
                samples[name].append(eager_ms(step, reps=1, inner=inner, warmup=0))
        for name, s in samples.items():
            rows.append(dict(size=size, batch=batch, time=time, width=width, layers=LAYERS, scan=name,
                             ms=sorted(s)[len(s) // 2]))
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"one training step ({LAYERS} gated blocks, bfloat16 autocast, AdamW), ms (median); "
          f"ratio: the step over the {STAND_IN}'s")
    stand_in = {r["size"]: r["ms"] for r in rows if r["scan"] == STAND_IN}
    for r in rows:
        ratio = f"{r['ms'] / stand_in[r['size']]:6.3f}" if r["size"] in stand_in else "     -"
        print(f"{r['size']:<24} {r['scan']:<22} {r['ms']:9.3f} {ratio}")


def write_json(path: str, rows: list[dict], reps: int) -> None:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    with open(path, "w") as f:
        json.dump(dict(kind="model", device=gpu or "cpu", torch=torch.__version__, linrec=linrec.__version__,
                       reps=reps, floor=FLOOR, reference=STAND_IN, rows=rows), f, indent=1)
