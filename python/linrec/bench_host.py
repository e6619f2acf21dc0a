"""python -m linrec.bench --host: the host time of one eager call, what a small or host-bound model pays on every scan.

On small tensors a call's time is the host's: Python, the dispatcher, the autograd graph and
the allocations, not the kernel. This bench times linrec.linrec beside native op chains of the
same autograd shape, on the host clock:

  forward           the call without grad
  forward (grad)    the call on inputs that require grad (the autograd graph is built)
  forward+backward  the call and torch.autograd.grad of the inputs and coefficients

  linrec.linrec          the scan
  torch.cumsum(x * c)    two native ops with native autograd (a scan of c = 1 after a product):
                         the floor's reference, fwd+bwd on CPU tensors <= 1.2x its time
  torch.mul              one elementwise op (the forward: torch.add)

and linrec.selective_scan at a tiny Mamba layer's shape, alone (the same three passes).

Each figure is the median of `reps` samples of `inner` calls, in µs a call, with Python's
garbage collector off while a sample runs (as timeit does). The implementations take turns
sample by sample, so that a drift of the machine reaches all of them alike. CUDA tensors (where
a GPU is present) are synchronised before each sample, so that the queue never fills and the
host's time is what is measured. Writes the rows as JSON with --json PATH.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import time

import torch

import linrec

SHAPES = {"4 x 16": (4, 16), "64 x 256": (64, 256)}
# The selective scan of a tiny Mamba layer: (batch, channels, length, states), with D and z.
SELECTIVE = {"selective (1, 4, 8), N=2": (1, 4, 8, 2)}
FLOOR = 1.2  # fwd+bwd on CPU tensors, as a ratio to torch.cumsum(x * c)'s time
REFERENCE = "torch.cumsum(x * c)"
INNER = 20  # calls a sample


def _calls(x, c, dy):
    """{pass: {implementation: function of no argument}} for inputs x, c (leaves that require
    grad) and the gradient dy."""
    xn, cn = x.detach(), c.detach()

    def both(scan):
        return lambda: torch.autograd.grad(scan(x, c), (x, c), dy)

    scans = {"linrec.linrec": lambda a, b: linrec.linrec(a, b),
             REFERENCE: lambda a, b: torch.cumsum(a * b, -1),
             "torch.mul": torch.mul}
    forward = {"linrec.linrec": lambda: linrec.linrec(xn, cn), REFERENCE: lambda: torch.cumsum(xn * cn, -1),
               "torch.add": lambda: torch.add(xn, cn)}
    return {"forward": forward,
            "forward (grad)": {name: (lambda s=s: s(x, c)) for name, s in scans.items()},
            "forward+backward": {name: both(s) for name, s in scans.items()}}


def _selective_calls(shape, device, gen):
    """{pass: {"linrec.selective_scan": function}} for a selective scan of `shape`, as _calls."""
    batch, channels, length, states = shape

    def rand(*size):
        return torch.randn(size, generator=gen).to(device)

    tensors = (rand(batch, channels, length), rand(batch, channels, length), -rand(channels, states).abs(),
               rand(batch, states, length), rand(batch, states, length), rand(channels), rand(batch, channels, length))
    tensors = tuple(t.requires_grad_() for t in tensors)
    plain = tuple(t.detach() for t in tensors)
    dy = torch.randn((batch, channels, length), generator=gen).to(device)

    def scan(ts):
        return linrec.selective_scan(*ts[:5], D=ts[5], z=ts[6], delta_softplus=True)

    name = "linrec.selective_scan"
    return {"forward": {name: lambda: scan(plain)}, "forward (grad)": {name: lambda: scan(tensors)},
            "forward+backward": {name: lambda: torch.autograd.grad(scan(tensors), tensors, dy)}}


def _sample_us(fn, inner, sync) -> float:
    sync()
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) * 1e6 / inner
    finally:
        if enabled:
            gc.enable()


def time_interleaved(fns: dict, reps: int, inner: int, sync=lambda: None) -> dict:
    """{name: median µs a call} of the functions in `fns`, taking turns sample by sample."""
    for fn in fns.values():  # warm-up: first-call work (allocator, autograd engine threads)
        for _ in range(inner):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(_sample_us(fn, inner, sync))
    return {name: sorted(s)[len(s) // 2] for name, s in samples.items()}


def run(reps: int = 200, inner: int = INNER, devices=None) -> list[dict]:
    """The rows: one a (device, shape, pass, implementation), with its µs a call."""
    if devices is None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        for case, shape in SHAPES.items():
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(shape, generator=gen).to(device).requires_grad_()
            c = torch.rand(shape, generator=gen).to(device).requires_grad_()
            dy = torch.randn(shape, generator=gen).to(device)
            for pass_, fns in _calls(x, c, dy).items():
                for impl, us in time_interleaved(fns, reps, inner, sync).items():
                    rows.append(dict(device=device, case=case, dtype="float32", pass_=pass_, impl=impl, us=us))
        for case, shape in SELECTIVE.items():
            for pass_, fns in _selective_calls(shape, device, torch.Generator().manual_seed(0)).items():
                for impl, us in time_interleaved(fns, reps, inner, sync).items():
                    rows.append(dict(device=device, case=case, dtype="float32", pass_=pass_, impl=impl, us=us))
    return rows


def print_table(rows: list[dict]) -> None:
    by_key = {(r["device"], r["case"], r["pass_"], r["impl"]): r["us"] for r in rows}
    print(f"host time of one eager call, µs (median), float32; last column: linrec.linrec / {REFERENCE}")
    print(f"{'device':<6} {'shape':<9} {'pass':<17} {'linrec':>8} {'cumsum(x*c)':>12} {'add / mul':>10} {'ratio':>6}")
    for device, case, pass_ in dict.fromkeys((r["device"], r["case"], r["pass_"]) for r in rows if r["case"] in SHAPES):
        ours, ref = by_key[(device, case, pass_, "linrec.linrec")], by_key[(device, case, pass_, REFERENCE)]
        simple = by_key.get((device, case, pass_, "torch.add"), by_key.get((device, case, pass_, "torch.mul")))
        print(f"{device:<6} {case:<9} {pass_:<17} {ours:8.1f} {ref:12.1f} {simple:10.1f} {ours / ref:6.2f}")
    for r in rows:
        if r["case"] in SELECTIVE:
            print(f"{r['device']:<6} {r['case']:<25} {r['pass_']:<17} {r['impl']} {r['us']:8.1f}")


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows, with the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def write_json(path: str, rows: list[dict], reps: int, inner: int) -> None:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    with open(path, "w") as f:
        json.dump(dict(kind="host", cpu=cpu_name(), gpu=gpu,
                       torch=torch.__version__, linrec=linrec.__version__, threads=torch.get_num_threads(),
                       reps=reps, inner=inner, floor=FLOOR, reference=REFERENCE, rows=rows), f, indent=1)
