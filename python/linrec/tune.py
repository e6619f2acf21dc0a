"""python -m linrec.tune: time every compiled config of a kernel over sequence lengths.

For each kernel (tile, pipe, chained, strided, packed), config and length it checks the
error against the float64 CPU kernel on a few sequences, then times (device
time) forward and fused backward with #SMs * 100 sequences (fewer if that would
not fit --max-elems; --seqs sets it). The strided kernel runs on the transposed,
channel-last layout. It prints the best config per length, and with --json PATH
writes all rows as JSON.
It exits with status 1 when a run's error is above its dtype's bound. Needs a CUDA device and
linrec's compiled CUDA kernels.

`python -m linrec.tune --table PATH` instead measures a tuning table for this device: every row
of the template table (--template, default the H100's) with its config measured here
(linrec.tune_table). Copy the file into linrec/tuning/ to ship it; linrec then uses it on every
device whose name contains one of its "match" strings.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

import torch

import linrec
from linrec import _cli, tune_table, tuning
from linrec._registry import FAMILIES
from linrec._timing import device_ms
from linrec.impl import cuda

DEFAULT_LENGTHS = [16, 64, 256, 1024, 4096, 16384, 65536]
KERNELS = {name: family.id for name, family in FAMILIES.items() if family.has_configs}


# Largest relative error against the float64 reference that counts as correct:
# 16-bit storage rounds every output (bf16 keeps 8 bits of mantissa).
MAX_ERROR = {"float32": 1e-4, "float64": 1e-10, "float16": 1e-2, "bfloat16": 1e-2}
PROG = "python -m linrec.tune"


def rel_error(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def tune(kernels, lengths, dtype, max_elems, reps, seqs=None):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for length in lengths:
        num_seqs = seqs or max(1, min(sms * 100, max_elems // length))
        x = torch.randn(num_seqs, length, device="cuda").to(dtype)
        c = (torch.rand(num_seqs, length, device="cuda") * 0.5 + 0.5).to(dtype)
        dy = torch.randn_like(x)
        check = slice(0, 4)
        y_ref = linrec.linrec(x[check].double().cpu(), c[check].double().cpu())
        for kernel in kernels:
            fn = getattr(cuda, f"linrec_{kernel}")
            # The strided kernel is timed on the channel-last layout it is for: (length, seqs) over dim 0.
            strided = kernel == "strided"
            dim = 0 if strided else -1
            xk, ck, dyk = (t.t().contiguous() if strided else t for t in (x, c, dy))
            for config in linrec.compiled_configs(kernel, dtype):
                e, t, m, a = config
                if not tune_table.fits(kernel, length, config):
                    continue
                kw = dict(dim=dim, elems_per_thread=e, threads_per_block=t, memcode=m, algocode=a)
                y = fn(xk, ck, **kw)
                err = rel_error((y.t() if strided else y)[check], y_ref)
                args = (dyk, ck, y, None, dim, False, KERNELS[kernel], e, t, m, a)
                fwd_ms = device_ms(lambda: fn(xk, ck, **kw), reps=reps)
                bwd_ms = device_ms(lambda: torch.ops.linrec.linrec_bwd(*args), reps=reps)
                size = x.numel() * x.element_size()
                rows.append(dict(kernel=kernel, length=length, seqs=num_seqs, config=config, error=err,
                                 fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_gbs=3 * size / fwd_ms / 1e6,
                                 bwd_gbs=5 * size / bwd_ms / 1e6))
    return rows


def best_table(rows, kernel, key, max_error):
    """(length, GB/s, config) of the fastest correct run of `kernel` per length, by `key` (fwd or bwd)."""
    out = []
    for length in sorted({r["length"] for r in rows if r["kernel"] == kernel}):
        cands = [r for r in rows if r["kernel"] == kernel and r["length"] == length and r["error"] < max_error]
        if cands:
            best = max(cands, key=lambda r: r[f"{key}_gbs"])
            out.append((length, best[f"{key}_gbs"], best["config"]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = _cli.parser(PROG, __doc__)
    parser.add_argument("--kernels", nargs="+", default=["tile", "pipe"], choices=list(KERNELS), metavar="KERNEL",
                        help=f"kernel families to time: {', '.join(KERNELS)} (default: tile pipe)")
    parser.add_argument("--lengths", nargs="+", type=_cli.positive_int, default=DEFAULT_LENGTHS, metavar="LENGTH",
                        help=f"sequence lengths (default: {' '.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--dtype", default="float32", choices=list(MAX_ERROR), help="storage (default: float32)")
    parser.add_argument("--max-elems", type=_cli.positive_int, default=2**27,
                        help="elements per length at most (default: 2^27)")
    parser.add_argument("--seqs", type=_cli.positive_int, default=None,
                        help="sequences per length (default: fill --max-elems)")
    parser.add_argument("--reps", type=_cli.positive_int, default=20, help="samples per figure (default: 20)")
    parser.add_argument("--json", metavar="PATH", type=_cli.output_path,
                        help="write every run to this JSON file")
    parser.add_argument("--all", action="store_true", help="also print every run, not only the best per length")
    parser.add_argument("--table", metavar="PATH", type=_cli.output_path,
                        help="instead, measure a tuning table for this device into PATH")
    parser.add_argument("--template", default=tuning.DEFAULT_TABLE, choices=tuning.tables(),
                        help=f"--table: the table whose rows are measured (default: {tuning.DEFAULT_TABLE})")
    parser.add_argument("--move-bounds", action="store_true",
                        help="--table: also move each row's end down where the next row is faster here "
                             "(times each row's first storage class alone)")
    args = parser.parse_args(argv)
    reason = _cli.cuda_unavailable(compiled_kernels=True)
    if reason:
        return _cli.fail(PROG, reason)
    if args.table:
        table = tune_table.write(args.template, args.table, args.reps, args.max_elems, list(argv or sys.argv[1:]),
                                 bounds=args.move_bounds)
        print(f"{args.table}: {len(table['rows'])} rows for {table['device']}")
        return 0
    rows = tune(args.kernels, args.lengths, getattr(torch, args.dtype), args.max_elems, args.reps, args.seqs)
    print(f"device: {torch.cuda.get_device_name()}, dtype {args.dtype}")
    if args.all:
        print("kernel    length    seqs  fwd GB/s  bwd GB/s  config (E, T, memcode, algocode)")
        for r in rows:
            print(f"{r['kernel']:<8} {r['length']:>8} {r['seqs']:>6} {r['fwd_gbs']:>9.0f} {r['bwd_gbs']:>9.0f}  {r['config']}")
    max_error = MAX_ERROR[args.dtype]
    for kernel in args.kernels:
        for key in ("fwd", "bwd"):
            print(f"\nbest linrec_{kernel} {key}: length, GB/s, config (E, T, memcode, algocode)")
            for length, gbs, config in best_table(rows, kernel, key, max_error):
                print(f"  {length:>8} {gbs:>8.0f}  {config}")
    bad = [r for r in rows if not r["error"] < max_error]
    print(f"\n{len(rows)} runs, {len(bad)} with error above {max_error:g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), dtype=args.dtype, rows=rows), f, indent=1)
    if bad:
        worst = ", ".join(f"{r['kernel']} L={r['length']} {r['config']}: {r['error']:.1e}" for r in bad[:5])
        return _cli.fail(PROG, f"{len(bad)} of {len(rows)} runs with error above {max_error:g} "
                               f"({worst}{', ...' if len(bad) > 5 else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli.run(main))
