"""python -m linrec.func_attrs: registers, spills and shared memory of every compiled kernel.

Read through cudaFuncGetAttributes. `local` is the per-thread local memory:
anything above zero means the kernel spills registers.
"""

from __future__ import annotations

import argparse
import json

import torch

import linrec

# DType in csrc/params.h; complex storage has its own config lists (linrec.compiled_configs).
DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "complex64": 4, "complex128": 5}
KINDS = {"ref": 1, "tile": 2, "pipe": 3, "chained": 4, "strided": 5, "packed": 6}
VECTOR = 1  # MemCode::kVector
# The aligned-rows kernels (csrc/kernels/rows.cuh), launched instead of the general
# kernel when every tensor's rows are unit-stride and aligned: reported as
# "<kind>_rows" (scanning forward) and "<kind>_rows_rev" (in reverse).
ROWS_VARIANTS = {"_rows": 1, "_rows_rev": 2}


def has_rows_kernel(kind, backward, config):
    return kind == "packed" or (kind == "tile" and not backward and config[2] == VECTOR)


def collect():
    rows = []
    for dtype, d in DTYPES.items():
        for backward in (False, True):
            rows.append(dict(kernel="ref", dtype=dtype, backward=backward, config=None,
                             **linrec._C_cuda.func_attrs(d, KINDS["ref"], backward, 0, 0, 0, 0, 0)))
            for kind in ("tile", "pipe", "chained", "strided", "packed"):
                for config in linrec.compiled_configs(kind, getattr(torch, dtype)):
                    variants = {"": 0}
                    if has_rows_kernel(kind, backward, config):
                        variants.update(ROWS_VARIANTS)
                    for suffix, variant in variants.items():
                        rows.append(dict(kernel=kind + suffix, dtype=dtype, backward=backward, config=config,
                                         **linrec._C_cuda.func_attrs(d, KINDS[kind], backward, variant, *config)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m linrec.func_attrs", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not linrec.build_info()["cuda"]:
        print("this build has no CUDA kernels")
        return 1
    rows = collect()
    print(f"{'kernel':<17}{'dir':<5}{'dtype':<10}{'config (E, T, mem, algo)':<26}{'regs':>6}{'local':>7}{'shared':>8}")
    for r in rows:
        print(f"{r['kernel']:<17}{'bwd' if r['backward'] else 'fwd':<5}{r['dtype']:<10}{str(r['config']):<26}"
              f"{r['num_regs']:>6}{r['local_bytes']:>7}{r['shared_bytes']:>8}")
    spills = [r for r in rows if r["local_bytes"] > 0]
    print(f"{len(rows)} kernels, {len(spills)} with local memory (spills)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
