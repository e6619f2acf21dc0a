"""python -m linrec.func_attrs: registers, spills and shared memory of every compiled kernel.

Read through cudaFuncGetAttributes. `local` is the per-thread local memory:
anything above zero means the kernel spills registers. Prints a table; --json PATH also writes
the rows. Needs a CUDA device and linrec's compiled CUDA kernels.
"""

from __future__ import annotations

import json
from typing import Sequence

import linrec

from . import _cli
from ._registry import FAMILIES, STORAGES

PROG = "python -m linrec.func_attrs"

# The aligned-rows kernels (csrc/kernels/primitives/rows.cuh), launched instead of the general
# kernel when every tensor's rows are unit-stride and aligned: reported as "<family>_rows"
# (scanning forward) and "<family>_rows_rev" (in reverse), where a family has them.
VARIANTS = {"": 0, "_rows": 1, "_rows_rev": 2}


def collect():
    """One row per compiled kernel: every family, storage, direction, config and variant."""
    rows = []
    for kind, family in FAMILIES.items():
        for storage_name in family.storages:
            storage = STORAGES[storage_name]
            configs = ([None] if not family.has_configs else
                       [tuple(c) for c in linrec._C_cuda.compiled_configs(family.id, storage.values, storage.coeffs,
                                                                           storage.log_coeffs)])
            for backward in (False, True):
                for config in configs:
                    for suffix, variant in VARIANTS.items():
                        attrs = linrec._C_cuda.func_attrs(family.id, storage.values, storage.coeffs, backward,
                                                          variant, *(config or (0, 0, 0, 0)), storage.log_coeffs)
                        if attrs is not None:
                            rows.append(dict(kernel=kind + suffix, storage=storage_name, backward=backward,
                                             config=config, **attrs))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = _cli.parser(PROG, __doc__)
    parser.add_argument("--json", metavar="PATH", type=_cli.output_path,
                        help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    reason = _cli.cuda_unavailable(compiled_kernels=True)
    if reason:
        return _cli.fail(PROG, reason)
    rows = collect()
    print(f"{'kernel':<17}{'dir':<5}{'storage':<10}{'config (E, T, mem, algo)':<26}{'regs':>6}{'local':>7}{'shared':>8}")
    for r in rows:
        print(f"{r['kernel']:<17}{'bwd' if r['backward'] else 'fwd':<5}{r['storage']:<10}{str(r['config']):<26}"
              f"{r['num_regs']:>6}{r['local_bytes']:>7}{r['shared_bytes']:>8}")
    spills = [r for r in rows if r["local_bytes"] > 0]
    print(f"{len(rows)} kernels, {len(spills)} with local memory (spills)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli.run(main))
