"""python -m linrec.bench: throughput of linrec and its peers next to torch.add and the copy bandwidth.

Cases (the project's performance floors, tools/check_floors.py): #SMs x 100 sequences of length 16 .. 65536; few long
sequences (1 x 2^24, 4 x 2^22); channel-last (8, 4096, 2048) scanned over dim=1;
float32 and bfloat16 (and on request mixed storage, e.g. `--dtypes bfloat16+float32`:
16-bit inputs with float32 coefficients). Forward counts 3 tensors of traffic (read
x, c; write y), forward+backward 8 (the fused backward reads dy, c, y and writes dx,
dc), each at its own dtype's size (mixed: the coefficient tensors c, c, dc at 4 bytes).
Baselines measured in the same run: torch.add on the same shape (forward) and an
elementwise product with autograd (forward+backward, the same 8-tensor class),
and the device's copy bandwidth. Each case times its baselines and
implementations twice, in the order baselines, implementations, implementations,
baselines, and every figure is the faster of its two runs (both in the
JSON; linrec_hop, a slow reference, runs once). A run is a median of device
time (the calls replayed from a CUDA graph: no Python or launch overhead); the
eager time per call, with the host running ahead, is reported beside it
(column `eager`). The calls cycle through copies of the inputs, enough that one
pass moves at least twice the L2 cache: every case, short ones too, runs from DRAM.
Prints a table; writes the rows as JSON with --json PATH, and plots the grid cases with
--png PATH (needs matplotlib). Needs a CUDA device.

`python -m linrec.bench --model` times one training step of a gated linear RNN instead
(linrec.bench_model).
`python -m linrec.bench --host` times the host's cost of one eager call on small tensors instead
(linrec.bench_host; no GPU needed).
`torchrun --nproc-per-node P -m linrec.bench --distributed` times sequence parallelism's weak
scaling instead (linrec.bench_distributed; its options: `--distributed --help`).
"""

from __future__ import annotations

import collections
import itertools
import math
import sys
import time
from typing import Sequence

import torch

import linrec
from linrec import _cli
from linrec._registry import STORAGES
from linrec._timing import copy_bandwidth_gbs, device_ms, eager_ms, write_rows

GRID_LENGTHS = [2**k for k in range(4, 17)]
# --dtypes: the real storage types, mixed ones as "values+coeffs".
DTYPES = [s.values if s.values == s.coeffs else f"{s.values}+{s.coeffs}" for s in STORAGES.values()
          if not s.values.startswith("complex") and not s.log_coeffs]
SLOW_REPS = 5
WAITS_FOR_DEVICE = {"linrec_hop"}  # reads a tensor's values on the host: no CUDA graph
PROG = "python -m linrec.bench"


def scanned_last(scan):
    """A (B, C, T) peer on linrec's layouts: the scanned dim moved last and made contiguous. The
    copy that needs (channel-last data) is counted as the peer's, as its callers pay it."""
    def call(x, c, reverse=False, dim=-1):
        xt, ct = x.movedim(dim, -1), c.movedim(dim, -1)
        rows = (1, -1, xt.shape[-1])
        return scan(ct.reshape(rows).contiguous(), xt.reshape(rows).contiguous()).reshape(xt.shape).movedim(-1, dim)
    return call


def scanned_middle(scan):
    """A (B, T, D) peer taking log-gates (FLA's HGRN) on linrec's layouts: the scanned dim moved to
    the middle, made contiguous, and the gates' log taken; that copy and pass count as the peer's."""
    def call(x, c, reverse=False, dim=-1):
        xt, ct = x.movedim(dim, 0), c.movedim(dim, 0)
        cols = (1, xt.shape[0], -1)
        y = scan(xt.reshape(cols).contiguous(), ct.reshape(cols).log().contiguous())
        return y.reshape(xt.shape).movedim(0, dim)
    return call


def fla_output(chunk_hgrn):
    """FLA's chunk_hgrn returns (output, final state): its output alone."""
    return lambda x, g: chunk_hgrn(x, g)[0]


# The peers implementations() imports where it can: --impls name -> (module, function, adapter).
PEERS = {"accelerated_scan.warp": ("accelerated_scan.warp", "scan", scanned_last),
         "accelerated_scan.triton": ("accelerated_scan.scalar", "scan", scanned_last),
         "fla.chunk_hgrn": ("fla.ops.hgrn", "chunk_hgrn", lambda f: scanned_middle(fla_output(f)))}
IMPLS = ["linrec", "triton.pipe", "linrec_hop", *PEERS]  # linrec's own, then the peers


def implementations(names=None):
    """The implementations importable here, by their --impls names; only those of `names` where
    given (importing accelerated_scan.warp compiles its kernel with nvcc)."""
    impls = {"linrec": linrec.linrec}
    try:
        from linrec.impl import triton as tr

        impls["triton.pipe"] = tr.linrec_pipe
    except ImportError:
        pass
    from linrec.impl.python import linrec_hop

    impls["linrec_hop"] = linrec_hop
    for name, (module, function, adapt) in PEERS.items():
        if names is not None and name not in names:
            continue
        try:  # a peer, when importable
            impls[name] = adapt(getattr(__import__(module, fromlist=[function]), function))
        except Exception as error:  # noqa: BLE001 - a peer that fails to import is left out, saying why
            if not isinstance(error, ImportError):
                print(f"{PROG}: {name} left out: {type(error).__name__}: {error}", file=sys.stderr)
    return impls


def cases(sms):
    for length in GRID_LENGTHS:
        yield dict(name=f"grid L={length}", shape=(sms * 100, length), dim=-1, length=length)
    yield dict(name="1 x 2^24", shape=(1, 2**24), dim=-1, length=2**24)
    yield dict(name="4 x 2^22", shape=(4, 2**22), dim=-1, length=2**22)
    yield dict(name="(8,4096,2048) dim=1", shape=(8, 4096, 2048), dim=1, length=4096)


def log_uniform_segments(total, low, high, seed=0):
    """Segment lengths drawn log-uniformly from [low, high], cut to sum to `total` (as cu_seqlens)."""
    gen = torch.Generator().manual_seed(seed)
    bounds = [0]
    while bounds[-1] < total:
        draw = math.exp(math.log(low) + (math.log(high) - math.log(low)) * torch.rand((), generator=gen).item())
        bounds.append(min(total, bounds[-1] + round(draw)))
    return torch.tensor(bounds, dtype=torch.int32)


def long_and_short_segments(total, long, short):
    """`long` segments of a quarter of `total` each, and `short` ones sharing the rest."""
    quarter = total // 4
    lengths = [quarter] * long + [(total - long * quarter) // short] * short
    lengths[-1] += total - sum(lengths)
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def option_cases(sms):
    """log_coeffs and cu_seqlens cases (--options), each with its own implementations: fn(x, c, dim)
    where c holds the log-coefficients for the log case. 32768 tokens of 4096 channels, as in
    LLM training, packed FLA's way (1, T, D) over dim 1 and as rows (D, T)."""
    # "linrec": the same values taken as plain coefficients, the time log_coeffs must match.
    yield dict(name="log 13200 x 4096", shape=(sms * 100, 4096), dim=-1, length=4096, log=True, impls={
        "linrec log_coeffs": lambda a, b, dim: linrec.linrec(a, b, dim=dim, log_coeffs=True),
        "linrec": lambda a, b, dim: linrec.linrec(a, b, dim=dim),
        "torch.exp + linrec": lambda a, b, dim: linrec.linrec(a, b.exp(), dim=dim)})
    packings = {"log-uniform 64..8192": log_uniform_segments(32768, 64, 8192),
                "3 long + 2000 short": long_and_short_segments(32768, 3, 2000)}
    for label, cu in packings.items():
        for shape, dim in (((1, 32768, 4096), 1), ((4096, 32768), -1)):
            def packed(a, b, dim, cu=cu.cuda()):
                return linrec.linrec(a, b, dim=dim, cu_seqlens=cu)
            layout = "(1,32768,4096) dim=1" if dim == 1 else "(4096,32768)"
            yield dict(name=f"varlen {label} {layout}", shape=shape, dim=dim, length=32768,
                       impls={"linrec cu_seqlens": packed, "linrec": lambda a, b, dim: linrec.linrec(a, b, dim=dim)})


def copies_past_l2(tensors, traffic, l2_bytes):
    """`tensors` and enough clones of them that one pass over all, moving `traffic` bytes
    a set, moves at least twice the L2 cache (just `tensors` when one set already does)."""
    count = max(1, -(-2 * l2_bytes // traffic))
    return [tuple(tensors)] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def input_sets(x, c, backward, l2_bytes):
    """Copies of (x, c) (and a dy) enough that one pass over them moves at least twice the L2 cache.

    Replayed on one set of inputs, a case whose tensors fit in L2 (the short grid
    lengths: 1-40 MB) is read from L2 rather than DRAM, and its fraction of the copy
    bandwidth can pass 1. Cycling the calls through these copies keeps every case's
    inputs and outputs larger than L2, as the figures assume.
    """
    traffic = (8 if backward else 3) * x.numel() * x.element_size()
    sets = copies_past_l2((x, c), traffic, l2_bytes)
    if not backward:
        return sets
    return [(a.detach().requires_grad_(), b.detach().requires_grad_(), torch.randn_like(a)) for a, b in sets]


def time_case(fn, x, c, dim, backward, reps, l2_bytes, capturable=True, slow_ms=None):
    """(device ms, eager ms) of fn forward, or forward+backward through autograd, on inputs cycled past L2.
    A function that waits for the device (not `capturable` in a CUDA graph) is timed eagerly in
    both columns: a failed capture leaves torch's CUDA generator unusable (torch 2.11). One whose
    first call takes longer than `slow_ms` (a peer far off the pace) gets SLOW_REPS samples of
    one call each: its figure is still a median, and the bench's time goes to the close races."""
    sets = input_sets(x, c, backward, l2_bytes)
    turn = itertools.cycle(sets)
    # Each call's results stay alive until the cycle comes back to its inputs, so the calls of
    # one cycle write distinct outputs too (freed at once, they would reuse one L2-resident buffer).
    held = collections.deque(maxlen=len(sets))
    if not backward:
        def step():
            a, b = next(turn)
            held.append(fn(a, b, dim=dim))
    else:
        def step():  # autograd.grad, not .backward(): accumulating into .grad would add traffic
            a, b, dy = next(turn)
            held.append(torch.autograd.grad(fn(a, b, dim=dim), (a, b), dy))

    inner = len(sets) * -(-10 // len(sets))  # whole cycles, at least 10 calls a sample
    if slow_ms is not None:
        step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if (time.perf_counter() - start) * 1e3 > slow_ms:
            reps, inner = SLOW_REPS, 1
    eager = eager_ms(step, reps=reps, inner=inner)
    times = (device_ms(step, reps=reps, inner=inner) if capturable else eager), eager
    held.clear()
    return times


def parse_storage(name: str):
    """(values dtype, coefficients dtype) of a --dtypes entry: "bfloat16", or "bfloat16+float32"."""
    values, _, coeffs = name.partition("+")
    return getattr(torch, values), getattr(torch, coeffs or values)


def run(dtypes, reps, max_hop_elems, only, impls, options=False, after_case=None):
    """(copy bandwidth, rows): every case of `dtypes` whose name contains one of `only` (every
    case if it is empty), for `impls` (name -> function; a case may name its own) and the
    baselines; with `options` the log_coeffs and cu_seqlens cases too. after_case(copy, rows),
    where given, sees the rows so far after each case (a run cut short keeps its figures)."""
    props = torch.cuda.get_device_properties(0)
    sms, l2_bytes = props.multi_processor_count, props.L2_cache_size
    copy = copy_bandwidth_gbs()
    # The first figure a process times is an outlier: on the H100 the first torch.add of 13200 x 16
    # fp32 took 2.35-2.49 µs a call in six processes, every later one 2.70-2.81 (linrec timed
    # first in a later case: no outlier). One figure, discarded, before the first case.
    warm = torch.randn(sms * 100, 16, device="cuda")
    time_case(lambda a, b, dim: torch.add(a, b), warm, warm, -1, False, reps, l2_bytes)
    rows = []
    for dtype_name in dtypes:
        values, coeffs = parse_storage(dtype_name)
        for case in itertools.chain(cases(sms), option_cases(sms) if options else ()):
            if only and not any(text in case["name"] for text in only):
                continue
            case_impls = case.get("impls", impls)
            x = torch.randn(case["shape"], device="cuda").to(values)
            c = (torch.rand(case["shape"], device="cuda") * 0.5 + 0.5).to(coeffs)
            if case.get("log"):
                c = c.log()
            vb, cb = x.element_size(), c.element_size()
            # Mixed storage: the add writes the inputs' dtype (8 bytes an element, as linrec's
            # forward); the product's fwd+bwd moves more than linrec's (float32 out and d_out).
            baseline_fns = {
                False: lambda a, b, dim: torch.add(a, b, out=torch.empty_like(a)),
                True: lambda a, b, dim: a * b,
            }
            # Two rounds, and the faster run of each figure counts. On the H100 single runs
            # swung: the first add of 1 x 2^24, right after the largest case, took 80 µs
            # in every full run against 69 µs timed again; linrec's 13200 x 64 fp32 forward
            # took 5.1 µs in one full run and 2.9 in others (causes not found). The second round
            # runs the implementations first, so that no side always has the first slot.
            first, again, runs, unsupported = {}, {}, {}, set()

            def time_implementations(rnd):
                for backward in (False, True):
                    for name, fn in case_impls.items():
                        if name == "linrec_hop" and (x.numel() > max_hop_elems or rnd is again):
                            continue
                        if (backward, name) in unsupported:
                            continue
                        try:
                            # Off the pace: 20x the baseline's first-round time (or more).
                            slow = 20 * first[backward][0] if name != "linrec" and backward in first else None
                            runs.setdefault((backward, name), []).append(time_case(
                                fn, x, c, case["dim"], backward, reps, l2_bytes, name not in WAITS_FOR_DEVICE, slow))
                        except (RuntimeError, AssertionError, ValueError) as error:
                            if name in PEERS:  # a peer's limits (lengths, sizes): no figure for this case
                                unsupported.add((backward, name))
                                runs.pop((backward, name), None)
                                print(f"{PROG}: {name} skips {case['name']} {dtype_name}: "
                                      f"{type(error).__name__}: {str(error)[:120]}", file=sys.stderr)
                            else:
                                raise

            for rnd in (first, again):
                if rnd is again:
                    time_implementations(rnd)
                rnd.update({bwd: time_case(fn, x, c, case["dim"], bwd, reps, l2_bytes)
                            for bwd, fn in baseline_fns.items()})
                if rnd is first:
                    time_implementations(rnd)
            timed = [(bwd, name, min(r, key=lambda t: t[0]), r) for (bwd, name), r in runs.items()]
            for backward in (False, True):
                nbytes = x.numel() * (5 * vb + 3 * cb if backward else 2 * vb + cb)
                base = dict(case=case["name"], dtype=dtype_name, backward=backward,
                            length=case["length"], elems=x.numel(), copy_gbs=copy)
                label = "torch.mul fwd+bwd" if backward else "torch.add"
                base_ms, eager = min(first[backward], again[backward], key=lambda t: t[0])  # (device, eager)
                rows.append(dict(base, impl=label, ms=base_ms, eager_ms=eager, gbs=nbytes / base_ms / 1e6,
                                 frac=nbytes / base_ms / 1e6 / copy,
                                 ms_runs=[first[backward][0], again[backward][0]]))
                for bwd, name, (ms, eager), name_runs in timed:
                    if bwd != backward:
                        continue
                    gbs = nbytes / ms / 1e6
                    rows.append(dict(base, impl=name, ms=ms, eager_ms=eager, gbs=gbs, frac=gbs / copy,
                                     vs_baseline=base_ms / ms, ms_runs=[t[0] for t in name_runs]))
            del x, c  # the caching allocator keeps the memory for the next case
            if after_case:
                after_case(copy, rows)
    return copy, rows


def print_table(rows):
    print(f"{'case':<22}{'dtype':<9}{'pass':<8}{'impl':<20}{'ms':>9}{'GB/s':>8}{'/copy':>7}{'/base':>7}"
          f"{'eager ms':>10}")
    for r in rows:
        vs = f"{r['vs_baseline']:>7.2f}" if "vs_baseline" in r else f"{'':>7}"
        print(f"{r['case']:<22}{r['dtype']:<9}{'fwd+bwd' if r['backward'] else 'fwd':<8}{r['impl']:<20}"
              f"{r['ms']:>9.3f}{r['gbs']:>8.0f}{r['frac']:>7.2f}{vs}{r['eager_ms']:>10.3f}")


def plot(rows, copy, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROG}: warning: matplotlib is not importable: no plot", file=sys.stderr)
        return
    grid = [r for r in rows if r["case"].startswith("grid")]
    panels = sorted({(r["dtype"], r["backward"]) for r in grid})
    if not panels:
        print(f"{PROG}: warning: no grid cases ran: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (dtype, backward) in zip(axes[0], panels):
        for impl in sorted({r["impl"] for r in grid}):
            pts = sorted((r["length"], r["gbs"]) for r in grid
                         if r["impl"] == impl and r["dtype"] == dtype and r["backward"] == backward)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.axhline(copy, color="k", linestyle="--", label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (#SMs x 100 sequences)")
        ax.set_ylabel("effective GB/s")
        ax.set_title(f"{dtype} {'forward+backward' if backward else 'forward'}")
        ax.legend(fontsize=8)
    fig.suptitle(torch.cuda.get_device_name())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


# The options each of the other modes has no use for: given with one, they are refused, not ignored.
MODE_IGNORES = {"host": ("dtypes", "only", "impls", "options", "png", "max_hop_elems"),
                "model": ("dtypes", "impls", "options", "png", "max_hop_elems"),
                "selective": ("dtypes", "only", "impls", "options", "png", "max_hop_elems")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--distributed" in argv:  # its own options, and CPU processes (gloo) too
        from . import bench_distributed

        return bench_distributed.main([a for a in argv if a != "--distributed"])
    parser = _cli.parser(PROG, __doc__)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES, metavar="DTYPE",
                        help=f"storage types, mixed ones as values+coeffs: {', '.join(DTYPES)} "
                             "(default: float32 bfloat16)")
    parser.add_argument("--reps", type=_cli.positive_int, default=None,
                        help="samples per figure (default: 20; with --host 200)")
    parser.add_argument("--max-hop-elems", type=_cli.positive_int, default=2**24,
                        help="skip linrec_hop above this size (default: 2^24)")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help="run the cases whose name contains one of these")
    parser.add_argument("--impls", nargs="+", default=None, choices=IMPLS, metavar="IMPL",
                        help=f"time only these of {', '.join(IMPLS)} (default: those importable; "
                             "the torch baselines always run)")
    parser.add_argument("--options", action="store_true",
                        help="also the log_coeffs and cu_seqlens (packed sequences) cases")
    parser.add_argument("--selective", action="store_true",
                        help="instead, the selective scan against mamba_ssm's selective_scan_fn (where it imports)")
    parser.add_argument("--host", action="store_true",
                        help="instead, the host time of one eager call on small tensors, against native op "
                             "chains (linrec.bench_host; on the CPU, and on CUDA where a GPU is present)")
    parser.add_argument("--model", action="store_true",
                        help="instead, one training step of a gated linear RNN at three sizes, with linrec, an "
                             "elementwise stand-in for the scan and each peer (linrec.bench_model)")
    parser.add_argument("--distributed", action="store_true",
                        help="instead, the weak scaling of linrec.distributed, under torchrun "
                             "(its options: --distributed --help)")
    parser.add_argument("--json", metavar="PATH", type=_cli.output_path,
                        help="write the rows to this JSON file")
    parser.add_argument("--png", metavar="PATH", type=_cli.output_path,
                        help="plot the grid cases into this PNG file (needs matplotlib)")
    args = parser.parse_args(argv)
    modes = [mode for mode in MODE_IGNORES if getattr(args, mode)]
    if len(modes) > 1:
        parser.error("--host, --model and --selective exclude each other")
    ignored = [f"--{name.replace('_', '-')}" for mode in modes for name in MODE_IGNORES[mode]
               if getattr(args, name) != parser.get_default(name)]
    if ignored:
        parser.error(f"--{modes[0]} takes no {', '.join(ignored)}")
    if args.host:  # no GPU needed
        from . import bench_host

        reps = args.reps or 200
        rows = bench_host.run(reps)
        gpu = f"; GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
        print(f"CPU: {bench_host.cpu_name()}{gpu}")
        bench_host.print_table(rows)
        if args.json:
            bench_host.write_json(args.json, rows, reps, bench_host.INNER)
        return 0
    args.reps = args.reps or 20
    reason = _cli.cuda_unavailable(compiled_kernels=False)
    if reason:
        return _cli.fail(PROG, reason)
    if args.model:
        from . import bench_model

        sizes = {k: v for k, v in bench_model.SIZES.items() if not args.only or any(t in k for t in args.only)}
        rows = bench_model.run(args.reps, sizes=sizes)
        print(f"device: {torch.cuda.get_device_name()}")
        bench_model.print_table(rows)
        if args.json:
            bench_model.write_json(args.json, rows, args.reps)
        return 0
    if args.selective:
        from . import bench_selective
        from ._timing import copy_bandwidth_gbs

        rows = bench_selective.run(args.reps)
        print(f"device: {torch.cuda.get_device_name()}")
        bench_selective.print_table(rows)
        if args.json:
            write_rows(args.json, copy_bandwidth_gbs(), rows)
        return 0
    found = implementations(args.impls)
    missing = [name for name in args.impls or () if name not in found]
    if missing:
        return _cli.fail(PROG, f"not importable here: {', '.join(missing)}")
    impls = {k: v for k, v in found.items() if not args.impls or k in args.impls}
    save = (lambda copy, rows: write_rows(args.json, copy, rows)) if args.json else None
    copy, rows = run(args.dtypes, args.reps, args.max_hop_elems, args.only, impls, args.options, save)
    print(f"device: {torch.cuda.get_device_name()}, copy bandwidth {copy:.0f} GB/s (read + write)")
    print_table(rows)
    if args.json:
        write_rows(args.json, copy, rows)
    if args.png:
        plot(rows, copy, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli.run(main))
