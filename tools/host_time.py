"""Host time of eager linrec calls, and of the CUDA queries a launch may make.

The bench's `eager` column is GPU time with the host running ahead; when it is
far above the graph-replay figure, the host is the bottleneck. This script
times the host side alone: samples of `inner` calls back to back on the host
clock (the GPU queue is drained between samples, so that it never fills), and
single cudaDeviceGetAttribute queries through the CUDA runtime that torch loads.

    python -m tools host-time [--reps 50]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import time

import torch

import linrec

# cudaDeviceAttr values (driver_types.h).
ATTRS = {"MultiProcessorCount": 16, "MemoryClockRate": 36, "GlobalMemoryBusWidth": 37}
SHAPES = {"1 x 2^24": (1, 2**24), "4 x 2^22": (4, 2**22), "13200 x 1024": (13200, 1024), "13200 x 16": (13200, 16)}


def median_us(fn, reps: int, inner: int = 1) -> float:
    """Median host µs a call over `reps` samples of `inner` calls."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) * 1e6 / inner)
    return sorted(times)[len(times) // 2]


def cudart():
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    candidates = glob.glob(os.path.join(lib_dir, "libcudart.so*")) + glob.glob(
        os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib", "libcudart.so*"))
    return ctypes.CDLL(candidates[0] if candidates else "libcudart.so")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools host-time", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    print(torch.cuda.get_device_name(0))
    reps = args.reps
    try:
        rt, value = cudart(), ctypes.c_int()
        for name, attr in ATTRS.items():
            us = median_us(lambda: rt.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0), reps)
            print(f"cudaDeviceGetAttribute({name}): {us:9.1f} us (value {value.value})")
    except OSError as err:
        print(f"no CUDA runtime to call through ctypes: {err}")
    x = torch.randn(13200, 16, device="cuda")
    c = torch.rand_like(x)
    op_args = (x, c, None, -1, False, 0, 0, 0, 0, 3)
    for label, fn in (("torch.empty_like", lambda: torch.empty_like(x)), ("torch.add", lambda: torch.add(x, c)),
                      ("linrec_fwd (autograd registered)", lambda: torch.ops.linrec.linrec_fwd(*op_args)),
                      ("_linrec_fwd (no autograd)", lambda: torch.ops.linrec._linrec_fwd(*op_args)),
                      ("linrec.linrec", lambda: linrec.linrec(x, c))):
        print(f"{label:>34} 13200 x 16: {median_us(fn, reps, inner=10):8.1f} us (host)")
    for dtype in (torch.float32, torch.bfloat16):
        for label, (seqs, length) in SHAPES.items():
            x = torch.randn(seqs, length, device="cuda", dtype=dtype)
            c = torch.rand_like(x)
            fwd = median_us(lambda: linrec.linrec(x, c), reps, inner=10)
            xg, cg = x.clone().requires_grad_(), c.clone().requires_grad_()
            dy = torch.randn_like(x)
            both = median_us(lambda: linrec.linrec(xg, cg).backward(dy), reps, inner=10)
            print(f"{label:>14} {str(dtype):>15}: forward {fwd:8.1f} us, forward+backward {both:8.1f} us (host)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
