"""Shapes between the bench's cases: where does the shape rule fall behind torch.add?

The bench (python -m linrec.bench) times a fixed set of cases. This sweep times
linrec.linrec (the tuning table, python/linrec/tuning/) on a grid of (sequences, length)
shapes and a few layouts, beside torch.add (forward) and an elementwise product with
autograd (forward+backward) on the same shape, in one process, from CUDA graphs with
the inputs cycled past L2 (the bench's own timing). For unit-stride shapes of at least
two chained tiles a sequence it also times the chained kernel with the rule's chained
config (the same kernel where the rule picks it), so that a better threshold shows.
Prints a table (its /copy column counts three or eight full-size tensors, broadcast
coefficients too); --json writes it.

    python -m tools shape-sweep [--dtypes float32 bfloat16] [--seqs 1 8 ...] [--lengths 11 12 ...]
                                [--min-log 21] [--max-log 26] [--no-layouts]
"""

from __future__ import annotations

import argparse
import collections
import itertools

import torch

import linrec
from linrec._timing import copy_bandwidth_gbs, device_ms, write_rows
from linrec.impl.cuda import linrec_chained

SEQS = [1, 8, 32, 66, 132, 264, 528, 1056]
LOG_LENGTHS = [11, 12, 13, 14, 15, 16, 18, 20]
# (name, shape, dim, slicing of the last dim, coefficients' shape): channel-last data (the
# bench's case, fewer channels than a warp's lanes, heads), a strided view of every other
# element, and coefficients broadcast over time (one a sequence or channel, as time-invariant
# decays are) or a scalar.
LAYOUTS = [
    ("(8, 4096, 2048) dim=1", (8, 4096, 2048), 1, None, None),
    ("(1, 2^20, 16) dim=1", (1, 2**20, 16), 1, None, None),
    ("(1, 2^22, 4) dim=1", (1, 2**22, 4), 1, None, None),
    ("(1, 2^21, 8) dim=1", (1, 2**21, 8), 1, None, None),
    ("(2, 2^19, 16) dim=1", (2, 2**19, 16), 1, None, None),
    ("(4, 2^18, 64) dim=1", (4, 2**18, 64), 1, None, None),
    ("(32, 4096, 256) dim=1", (32, 4096, 256), 1, None, None),
    ("(4, 16, 4096, 64) dim=2", (4, 16, 4096, 64), 2, None, None),
    ("(13200, 2048)[:, ::2]", (13200, 2048), -1, 2, None),
    ("(13200, 1024) c (13200, 1)", (13200, 1024), -1, None, (13200, 1)),
    ("(1056, 2^15) c (1056, 1)", (1056, 2**15), -1, None, (1056, 1)),
    ("(1, 2^24) c scalar", (1, 2**24), -1, None, (1, 1)),
    ("(8, 4096, 2048) dim=1 c (2048,)", (8, 4096, 2048), 1, None, (2048,)),
]


def chained_config(dtype):
    """The rule's chained config: 64x128 staged for 16-bit storage, 32x128 staged otherwise."""
    return dict(elems_per_thread=64 if dtype in (torch.bfloat16, torch.float16) else 32, threads_per_block=128,
                memcode=3, algocode=3)


def time_fn(fn, make_inputs, dim, backward, reps, l2_bytes):
    """Device ms a call of fn (forward, or forward+backward through autograd), on sets of inputs
    from make_inputs() (in the layout it makes) cycled so that a pass moves at least twice L2."""
    x, c = make_inputs()
    traffic = (8 if backward else 3) * x.numel() * x.element_size()
    sets = [(x, c)] + [make_inputs() for _ in range(max(1, -(-2 * l2_bytes // traffic)) - 1)]
    if backward:
        sets = [(a.detach().requires_grad_(), b.detach().requires_grad_(), torch.randn_like(a)) for a, b in sets]
    turn = itertools.cycle(sets)
    # Each call's results stay alive until the cycle returns to its inputs (as in the bench).
    held = collections.deque(maxlen=len(sets))

    def step():
        if backward:
            a, b, dy = next(turn)
            held.append(torch.autograd.grad(fn(a, b, dim=dim), (a, b), dy))
        else:
            a, b = next(turn)
            held.append(fn(a, b, dim=dim))

    inner = len(sets) * -(-10 // len(sets))
    ms = device_ms(step, reps=reps, inner=inner)
    held.clear()
    return ms


def shape_cases(seq_counts, log_lengths, min_log, max_log, layouts):
    for seqs in seq_counts:
        for log_len in log_lengths:
            n = seqs * 2**log_len
            if 2**min_log <= n <= 2**max_log:
                yield f"{seqs} x 2^{log_len}", (seqs, 2**log_len), -1, None, None
    if layouts:
        yield from LAYOUTS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools shape-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--min-log", type=int, default=21, help="smallest element count, log2")
    parser.add_argument("--max-log", type=int, default=26, help="largest element count, log2")
    parser.add_argument("--seqs", nargs="+", type=int, default=SEQS, help="sequence counts")
    parser.add_argument("--lengths", nargs="+", type=int, default=LOG_LENGTHS, help="log2 lengths")
    parser.add_argument("--no-layouts", action="store_true", help="only the (sequences, length) grid")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)

    props = torch.cuda.get_device_properties(0)
    l2_bytes = props.L2_cache_size
    copy = copy_bandwidth_gbs()
    print(f"device: {torch.cuda.get_device_name()}, copy {copy:.0f} GB/s")
    print(f"{'case':<32}{'dtype':<10}{'pass':<8}{'base µs':>9}{'rule µs':>9}{'rule/base':>10}{'/copy':>7}"
          f"{'chained µs':>11}")
    rows = []
    for dtype in (getattr(torch, d) for d in args.dtypes):
        cases = shape_cases(args.seqs, args.lengths, args.min_log, args.max_log, not args.no_layouts)
        for name, shape, dim, step, c_shape in cases:
            def make_inputs(shape=shape, step=step, c_shape=c_shape, dtype=dtype):
                x = torch.randn(shape, device="cuda").to(dtype)
                c = (torch.rand(c_shape or shape, device="cuda") * 0.5 + 0.5).to(dtype)
                return (x[..., ::step], c[..., ::step]) if step else (x, c)

            x, _ = make_inputs()
            seq_len = x.shape[dim]
            contiguous_seqs = x.stride(dim) == 1
            tile = chained_config(dtype)["elems_per_thread"] * 128
            for backward in (False, True):
                base_fn = (lambda a, b, dim: a * b) if backward else (lambda a, b, dim: torch.add(a, b))
                base = time_fn(base_fn, make_inputs, dim, backward, args.reps, l2_bytes)
                rule = time_fn(linrec.linrec, make_inputs, dim, backward, args.reps, l2_bytes)
                chained = None
                if contiguous_seqs and seq_len >= 2 * tile:
                    cfg = chained_config(dtype)
                    chained_fn = lambda a, b, dim: linrec_chained(a, b, dim=dim, **cfg)  # noqa: E731
                    chained = time_fn(chained_fn, make_inputs, dim, backward, args.reps, l2_bytes)
                nbytes = (8 if backward else 3) * x.numel() * x.element_size()
                row = dict(case=name, dtype=str(dtype).removeprefix("torch."), backward=backward,
                           base_us=base * 1e3, rule_us=rule * 1e3, frac=nbytes / rule / 1e6 / copy,
                           chained_us=None if chained is None else chained * 1e3)
                rows.append(row)
                ch = f"{row['chained_us']:>11.1f}" if chained is not None else f"{'':>11}"
                print(f"{name:<32}{row['dtype']:<10}{'fwd+bwd' if backward else 'fwd':<8}{row['base_us']:>9.1f}"
                      f"{row['rule_us']:>9.1f}{rule / base:>10.2f}{row['frac']:>7.2f}{ch}", flush=True)
            del x
    if args.json:
        write_rows(args.json, copy, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
