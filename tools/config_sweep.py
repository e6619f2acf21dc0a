"""Kernel times of every compiled config of one kernel family, by shape, from the torch profiler.

The data behind the packed, tile, pipe and chained picks of the tuning table (python/linrec/tuning/):
each cell is the median kernel duration of the forward / the fused backward at an explicit
config, called through torch.ops.linrec.linrec_fwd / linrec_bwd (no workspace fill or other
kernel counted).

Usage: python -m tools config-sweep packed  [--seqs 13200] [--lengths 4 5 6 7 8 9]
       python -m tools config-sweep tile    [--seqs 13200] [--lengths 9 10 11 12]  (and pipe, strided)
       python -m tools config-sweep chained [--shapes 1x22 1x24 4x22 1x26] [--registers]
--channels lays each shape out channel-last, (length, sequences) scanned over dim 0 (the strided
family's layout); --segments cuts every sequence into packed segments of lengths drawn
log-uniformly from 64 to 8192 (the bench's varlen packing), timed with the ops' cuts. --log
passes the coefficients as log c (log_coeffs=True).
--dtypes takes complex64 / complex128 too (the configs compiled for complex storage; rows of
zero imaginary part, which time as any other).
"""

import argparse
import itertools

import torch

import linrec
from linrec._registry import FAMILIES
from linrec._segments import cut_flags
from linrec.bench import copies_past_l2, log_uniform_segments
from linrec.tune_table import fits
from linrec.tuning import MEMCODES
from tools.kernel_times import kernel_medians

KERNEL_IDS = {name: family.id for name, family in FAMILIES.items() if family.has_configs}
# What the kernels' names contain (pipe is the tile template with another schedule).
KERNEL_NAMES = {"tile": "tile", "pipe": "tile", "chained": "chained", "strided": "strided", "packed": "packed"}
STAGED = MEMCODES["staged"]
MEMCODE_NAMES = {code: name for name, code in MEMCODES.items()}


def configs(kernel, dtype, registers=False):
    """The configs compiled for `dtype` to time: for chained the staged ones, unless `registers`."""
    cfgs = linrec.compiled_configs(kernel, dtype)
    return [c for c in cfgs if c[2] == STAGED] if kernel == "chained" and not registers else cfgs


def cycled(tensors, cold):
    """A function returning the next copy of `tensors` each call; with `cold`, enough copies that
    one pass over them moves twice the L2 cache, so the kernels read DRAM as in the bench."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    sets = itertools.cycle(copies_past_l2(tensors, nbytes, l2_bytes) if cold else [tuple(tensors)])
    return lambda: next(sets)


def kernel_us(fn, reps, kernel):
    times = [us for name, (us, _) in kernel_medians(fn, reps).items() if kernel in name]
    return times[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools config-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=sorted(KERNEL_IDS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--seqs", type=int, default=13200, help="packed, tile, pipe, strided: sequences")
    parser.add_argument("--lengths", nargs="+", type=int, default=[4, 5, 6, 7, 8, 9],
                        help="packed, tile, pipe, strided: log2 lengths")
    parser.add_argument("--shapes", nargs="+", default=["1x22", "1x24", "4x22", "1x26"],
                        help="chained: SEQSxLOG2LEN")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--cold", action="store_true", help="cycle the inputs past L2 (as the bench does)")
    parser.add_argument("--registers", action="store_true", help="chained: the register-tile configs too")
    parser.add_argument("--channels", action="store_true", help="(length, sequences) over dim 0")
    parser.add_argument("--segments", action="store_true", help="packed segments of 64..8192 steps")
    parser.add_argument("--log", action="store_true", help="coefficients as log c (log_coeffs=True)")
    args = parser.parse_args(argv)
    kid = KERNEL_IDS[args.kernel]
    if args.kernel != "chained":
        shapes = [(args.seqs, 2**lg) for lg in args.lengths]
    else:
        shapes = [(int(s.split("x")[0]), 2 ** int(s.split("x")[1])) for s in args.shapes]
    print(torch.cuda.get_device_name(), "kernel us fwd / bwd")
    for dtype in (getattr(torch, d) for d in args.dtypes):
        for seqs, length in shapes:
            shape, dim = ((length, seqs), 0) if args.channels else ((seqs, length), -1)
            x = torch.randn(shape, device="cuda").to(dtype)
            c = torch.rand(shape, device="cuda") * 0.5 + 0.5
            c = (c.log() if args.log else c).to(dtype)
            cuts = (cut_flags(log_uniform_segments(length, 64, 8192).cuda(), length, False, "cuda")
                    if args.segments else None)
            y = torch.ops.linrec.linrec_fwd(x, c, None, dim, False, 0, 0, 0, 0, 0, args.log, cuts)
            dy = torch.randn_like(y)
            fwd_args, bwd_args = cycled([x, c], args.cold), cycled([dy, c, y], args.cold)
            add = kernel_us(lambda: torch.add(*fwd_args()), args.reps, "")
            row = [f"{str(dtype)[6:]:8s}{' log' if args.log else ''} {' x '.join(map(str, shape))} dim {dim}  "
                   f"add {add:6.1f}"]
            for e, t, m, a in configs(args.kernel, dtype, args.registers):
                if not fits(args.kernel, length, (e, t)):
                    continue
                name = f"{e}x{t} {MEMCODE_NAMES[m]}"
                try:
                    fwd = kernel_us(lambda: torch.ops.linrec.linrec_fwd(*fwd_args(), None, dim, False, kid, e, t, m, a,
                                                                        args.log, cuts),
                                    args.reps, KERNEL_NAMES[args.kernel])
                    bwd = kernel_us(lambda: torch.ops.linrec.linrec_bwd(*bwd_args(), None, dim, False, kid, e, t, m, a,
                                                                        args.log, cuts),
                                    args.reps, KERNEL_NAMES[args.kernel])
                except RuntimeError as err:  # a staged config whose block does not fit: named, not timed
                    row.append(f"{name} ({str(err)[:40]})")
                    continue
                row.append(f"{name} {fwd:6.1f} / {bwd:6.1f}")
            print(" | ".join(row), flush=True)
            del x, c, y, dy, fwd_args, bwd_args
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
