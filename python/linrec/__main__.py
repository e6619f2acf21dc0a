"""python -m linrec: run a default problem, check it against the reference, time it.

On a GPU it times the fastest available implementation next to torch.add and
the device's copy bandwidth; without one it uses the CPU kernel.
`python -m linrec --info` prints what this build contains.
"""

from __future__ import annotations

import json
from typing import Sequence

import torch

import linrec
from linrec import _cli
from linrec._timing import copy_bandwidth_gbs, device_ms
from linrec.impl.python import linrec_hop


def progress(iterable, desc):
    try:
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, leave=False)
    except ImportError:
        return iterable


def rel_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


PROG = "python -m linrec"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _cli.parser(PROG, __doc__)
    parser.add_argument("--info", action="store_true", help="print the build's contents (JSON) and exit")
    parser.add_argument("--seqs", type=_cli.positive_int, default=None,
                        help="number of sequences (default: #SMs x 100 on a GPU, 256 on the CPU)")
    parser.add_argument("--length", type=_cli.positive_int, default=None,
                        help="sequence length (default: 4096 on a GPU, 2048 on the CPU)")
    args = parser.parse_args(argv)
    if args.info:
        print(json.dumps(linrec.build_info(), indent=2))
        return 0

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    seqs = args.seqs or (torch.cuda.get_device_properties(0).multi_processor_count * 100 if gpu else 256)
    length = args.length or (4096 if gpu else 2048)
    name = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"linrec {linrec.__version__} on {name}: {seqs} sequences x {length}, float32")

    try:
        x = torch.randn(seqs, length, device=device)
        c = torch.rand(seqs, length, device=device) * 0.5 + 0.5
        h0 = torch.randn(seqs, device=device)
    except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
        return _cli.fail(PROG, f"cannot allocate {seqs} x {length} float32 on {name}: {str(error).splitlines()[0]}")
    check = slice(0, min(seqs, 64))
    ref = linrec_hop(x[check].double(), c[check].double(), initial=h0[check].double())
    y = linrec.linrec(x, c, initial=h0)
    err = rel_error(y[check], ref)
    print(f"relative error against the float64 reference: {err:.2e}")
    if not err < 1e-5:
        return _cli.fail(PROG, f"relative error {err:.2e} is above 1e-5")

    rows = []
    nbytes_fwd = 3 * x.numel() * x.element_size()
    cases = [("linrec.linrec forward", lambda: linrec.linrec(x, c, initial=h0)), ("torch.add", lambda: x + c)]
    if not gpu:
        cases.append(("linrec_hop forward", lambda: linrec_hop(x, c, initial=h0)))
    for label, fn in progress(cases, "timing"):
        ms = device_ms(fn)
        rows.append((label, ms, nbytes_fwd / ms / 1e6))
    copy = copy_bandwidth_gbs() if gpu else None
    print(f"{'implementation':<24}{'ms':>10}{'GB/s':>10}" + (f"{'/copy':>8}" if copy else ""))
    for label, ms, gbs in rows:
        print(f"{label:<24}{ms:>10.3f}{gbs:>10.1f}" + (f"{gbs / copy:>8.2f}" if copy else ""))
    if copy:
        print(f"device copy bandwidth: {copy:.0f} GB/s (read + write)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli.run(main))
