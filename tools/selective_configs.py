"""GPU time of each compiled selective-scan config, forward and backward, at the benchmark's shapes.

The selective scan's ops take the config as (steps_per_thread, warps); (0, 0) is the automatic
choice, the first compiled config (csrc/dispatch.h's SELECTIVE_CONFIG_LIST). This times every
config, each op alone from a CUDA graph (the median of --reps samples), so that the list's
order can follow measurements.

Usage: python -m tools selective-configs [--dtypes bfloat16 float32] [--reps 10] [--json PATH]
       [--shape BATCH DIM N L] [--config STEPS WARPS]   (one shape, one config: e.g. under ncu)
"""

from __future__ import annotations

import argparse
import json

import torch

from linrec import _C_cuda
from linrec._timing import device_ms
from linrec.bench_selective import SHAPES, make_inputs


def op_args(inputs):
    """The ops' normalised arguments (per-step B and C as (batch, 1, N, L)), as linrec.selective_scan passes them."""
    return (inputs["u"], inputs["delta"], inputs["A"], inputs["B"].unsqueeze(1), inputs["C"].unsqueeze(1),
            inputs["D"], inputs["z"], inputs["delta_bias"], None, True, 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools selective-configs", description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--shape", nargs=4, type=int, metavar=("BATCH", "DIM", "N", "L"))
    parser.add_argument("--config", nargs=2, type=int, metavar=("STEPS", "WARPS"))
    args = parser.parse_args(argv)
    shapes = [tuple(args.shape)] if args.shape else SHAPES
    configs = [tuple(args.config)] if args.config else _C_cuda.selective_configs()
    fwd, bwd = torch.ops.linrec.selective_scan_fwd, torch.ops.linrec.selective_scan_bwd
    rows = []
    print(torch.cuda.get_device_name())
    for dtype_name in args.dtypes:
        for batch, dim, states, length in shapes:
            inputs = make_inputs(batch, dim, states, length, getattr(torch, dtype_name))
            a = op_args(inputs)
            d_y = torch.randn_like(inputs["u"])
            for steps, warps in configs:
                _, _, checkpoints = fwd(*a, steps, warps)
                fwd_ms = device_ms(lambda: fwd(*a, steps, warps), args.reps, inner=3)
                bwd_ms = device_ms(lambda: bwd(d_y, None, *a[:9], checkpoints, *a[9:], steps, warps), args.reps,
                                   inner=3)
                row = dict(dtype=dtype_name, batch=batch, dim=dim, states=states, length=length,
                           steps_per_thread=steps, warps=warps, fwd_ms=fwd_ms, bwd_ms=bwd_ms)
                rows.append(row)
                print(f"{dtype_name:9s} ({batch}, {dim}, {states}, {length}) ({steps:2d}, {warps:2d})  "
                      f"fwd {fwd_ms:8.3f} ms  bwd {bwd_ms:8.3f} ms")
            del inputs, a, d_y
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
