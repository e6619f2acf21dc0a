"""Per-kernel GPU durations of linrec and torch.add calls, from the torch profiler.

Shows what a call's time is made of (the chained kernels' workspace fill, the
scan kernel itself) and how a kernel's time grows with the length: fitting
t = a * n + b over lengths separates the steady rate from a fixed cost.

With --segments, also a forward+backward through autograd of the same rows packed into segments of
64..8192 steps (cu_seqlens) beside the plain one: every kernel a packed call adds.

Usage: python -m tools kernel-times [--dtypes float32 bfloat16] [--lengths 22 23 24 25 26] [--seqs 1] [--segments]
"""

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import linrec
from linrec.bench import log_uniform_segments


def kernel_medians(fn, reps):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            # The chained kernels let the next call's kernels launch during their drain (chained.cuh):
            # back to back, a kernel's span would include its wait for the one before it.
            torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(e.name, []).append(e.device_time)
    return {name: (statistics.median(ts), len(ts) // reps) for name, ts in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools kernel-times", description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[22, 23, 24, 25, 26], help="log2 lengths")
    parser.add_argument("--seqs", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--segments", action="store_true",
                        help="also forward+backward, plain and packed (cu_seqlens, segments of 64..8192 steps)")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name())
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for log_len in args.lengths:
            shape = (args.seqs, 2**log_len)
            x = torch.randn(shape, device="cuda").to(dtype)
            c = (torch.rand(shape, device="cuda") * 0.5 + 0.5).to(dtype)
            y = linrec.linrec(x, c)
            dy = torch.randn_like(y)
            cases = {
                "add": lambda: torch.add(x, c),
                "fwd": lambda: linrec.linrec(x, c),
                "bwd": lambda: torch.ops.linrec.linrec_bwd(dy, c, y, None, -1, False, 0, 0, 0, 0, 0),
            }
            if args.segments:
                cu = log_uniform_segments(2**log_len, 64, 8192).cuda()
                xg, cg = x.detach().requires_grad_(), c.detach().requires_grad_()
                cases["fwd+bwd"] = lambda: torch.autograd.grad(linrec.linrec(xg, cg), (xg, cg), dy)
                cases["packed fwd+bwd"] = lambda: torch.autograd.grad(linrec.linrec(xg, cg, cu_seqlens=cu), (xg, cg), dy)
            for case, fn in cases.items():
                for name, (us, per_call) in kernel_medians(fn, args.reps).items():
                    print(f"{dtype_name:9s} {args.seqs} x 2^{log_len} {case:14s} {us:9.1f} us  x{per_call}  {name[:90]}")
            del x, c, y, dy
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
