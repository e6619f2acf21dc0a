"""Complex64 recurrences beside the float32 scan and torch.add on a GPU, fwd and fwd+bwd.

Time complex recurrences on a GPU: linrec.linrec on complex64 (whichever path linrec/_complex.py
takes), eager and under torch.compile, beside the compiled op's chained kernels on rows, the
fallback of two real scans, the float32 scan of the same shape and torch.add of complex64,
forward and forward+backward, timed as linrec.bench times its cases (CUDA-graph replays, inputs
cycled past L2).

    python -m tools complex-bench [--json FILE]

Fraction of copy bandwidth counts the bytes a fused kernel must move (3 tensors forward, 8
forward+backward, 8 bytes a complex64 element), so it reads as linrec.bench's figures.
"""

from __future__ import annotations

import argparse

import torch

import linrec
from linrec.impl import cuda
from linrec._timing import copy_bandwidth_gbs, write_rows
from linrec.bench import time_case

SHAPES = [((1056, 8192), -1), ((8, 4096, 1024), 1), ((4, 1 << 20), -1), ((13200, 64), -1), ((13200, 512), -1)]


def polar(x, c, dim):
    """The path linrec.linrec takes where neither the compiled kernels nor Triton run."""
    return linrec._complex._polar_scan(x, c, None, dim, False)


def chained(x, c, dim):
    """The staged chained kernel called directly (linrec.impl.cuda): linrec.linrec's own path for
    complex rows, timed without its Python layer."""
    return cuda.linrec_chained(x, c, dim=dim, elems_per_thread=16, threads_per_block=128, memcode=3)


def complex_case(shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", dtype=torch.complex64, generator=g)
    r = 0.5 + 0.5 * torch.rand(shape, device="cuda", generator=g)
    c = torch.polar(r, torch.rand(shape, device="cuda", generator=g) * 6.28)
    return x, c


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools complex-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    copy = copy_bandwidth_gbs()
    compiled = torch.compile(linrec.linrec, fullgraph=True)
    rows = []
    for shape, dim in SHAPES:
        x, c = complex_case(shape)
        xr, r_coeffs = x.real.contiguous(), c.abs().contiguous()
        impls = {
            "linrec complex64": (linrec.linrec, x, c),
            "linrec complex64, torch.compile": (compiled, x, c),
            "compiled op, chained 16x128": (chained, x, c),
            "two real scans (the fallback path)": (polar, x, c),
            "linrec float32 (same shape)": (linrec.linrec, xr, r_coeffs),
            "torch.add complex64": (lambda a, b, dim: a + b, x, c),
        }
        if dim != -1:  # channel-last: linrec.linrec's own path is the compiled op
            del impls["compiled op, chained 16x128"]
        for name, (fn, a, b) in impls.items():
            for backward in (False, True):
                try:
                    ms, _ = time_case(fn, a, b, dim, backward, args.reps, l2_bytes)
                except Exception as e:  # noqa: BLE001 (reported, not hidden: a row with the error)
                    rows.append(dict(impl=name, shape=shape, dim=dim, backward=backward, error=repr(e)[:200]))
                    continue
                nbytes = (8 if backward else 3) * x.numel() * a.element_size()
                rows.append(dict(impl=name, shape=shape, dim=dim, backward=backward, us=ms * 1e3,
                                 fraction_of_copy=nbytes / (ms * 1e-3) / 1e9 / copy))
    print(f"device: {torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
    for r in rows:
        what = "fwd+bwd" if r["backward"] else "fwd"
        result = (f"{r['us']:9.1f} us  {r['fraction_of_copy']:5.2f} of copy" if "us" in r else r["error"])
        print(f"{str(r['shape']):<18} dim={r['dim']:<3} {r['impl']:<34}{what:<8}{result}")
    if args.json:
        write_rows(args.json, copy, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
