"""Where the training step of python -m linrec.bench --model spends its time, scan by scan.

At one size: the host time of one scan call at the step's shape beside torch.mul, by dtype
and layout; then for each scan of linrec.bench_model (linrec and the elementwise stand-in, or
--scans) the host's time to issue one step (the device drained before and after), the step's
eager time, the synchronizing calls torch reports (torch.cuda.set_sync_debug_mode), and the
torch profiler's ops by host time in the step. A step whose eager time exceeds its host
time by little is bound by the host; then the rows of the ops table that differ between the
scans are where the difference is.

    python -m tools step-profile [--size "small (32, 256, 256)"] [--scans linrec "elementwise stand-in"]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import linrec
from linrec import bench_host, bench_model


def host_ms(step, reps: int) -> float:
    """Median host time to issue one step, with the device idle before it and drained after."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def syncs(step) -> list[str]:
    """The synchronizing calls torch warns of in one step."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0] for w in caught]


def op_table(step, rows: int) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def scan_calls(shape, reps: int = 200, inner: int = 20) -> None:
    """Host time of one scan call at the step's shape, against torch.mul, by dtype and layout
    (the --host bench's timer: the two take turns sample by sample)."""
    print("host time of one call, µs (median): forward, forward+backward; the step's shape")
    for dtype in (torch.bfloat16, torch.float32):
        for dim, layout in ((1, "dim=1 (batch, time, width)"), (-1, "dim=-1 rows")):
            v = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            a = torch.rand(shape, device="cuda", dtype=dtype, requires_grad=True)
            grad = torch.ones(shape, device="cuda", dtype=dtype)
            calls = {"linrec": lambda: linrec.linrec(v, a, dim=dim), "mul": lambda: v * a}
            with torch.no_grad():
                fwd = bench_host.time_interleaved(calls, reps, inner)
            both = bench_host.time_interleaved(
                {name: (lambda fn=fn: torch.autograd.grad(fn(), (v, a), grad)) for name, fn in calls.items()},
                reps, inner)
            torch.cuda.synchronize()
            for name in calls:
                print(f"  {str(dtype):<15} {layout:<28} {name:<7} {fwd[name]:7.1f} {both[name]:7.1f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default=next(iter(bench_model.SIZES)), choices=list(bench_model.SIZES))
    parser.add_argument("--scans", nargs="+", default=["linrec", bench_model.STAND_IN])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step-profile: needs a CUDA GPU (the step's host time is measured against its device's)")
    batch, length, width = bench_model.SIZES[args.size]
    scans = {name: scan for name, scan in bench_model.scans().items() if name in args.scans}
    torch.manual_seed(0)
    model = bench_model.GatedLinearRNN(width).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, length, width, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}; {args.size}")
    scan_calls((batch, length, width))
    for name, scan in scans.items():
        step = bench_model.training_step(model, optimizer, x, scan, "cuda")
        for _ in range(3):
            step()
        eager = bench_model.eager_ms(step, reps=args.reps, inner=3, warmup=1)
        print(f"\n== {name}: host {host_ms(step, args.reps):.3f} ms a step, eager {eager:.3f} ms a step")
        found = syncs(step)
        print(f"synchronizing calls in one step: {len(found)}")
        for message in sorted(set(found)):
            print(f"  {found.count(message)} x {message}")
        print(op_table(step, args.rows))


if __name__ == "__main__":
    main()
