"""Weak scaling of sequence parallelism: `torchrun --nproc-per-node P -m linrec.bench --distributed`.

Every rank holds a shard of one long sequence of a fixed size (--elements, default 2^26), so
with P ranks the sequence is P times longer. Each case is timed forward and forward+backward
(through torch.autograd.grad), in one run:
- P ranks: linrec.distributed.linrec (selective_scan) over the group of all ranks;
- one shard: linrec.linrec (linrec.selective_scan) on this rank's shard alone, no exchange;
- local passes: the distributed call over a group of this rank alone, which runs the same
  passes with no peer to wait for;
- exchange: each all_gather the distributed call makes (its arguments' check, the (2, state)
  maps, in the backward the state's gradient), recorded from one call and timed alone.
The weak-scaling figure is P ranks / one shard (design record 0022's floor: at most 1.15).

Cases, per rank, scanned over the last dim: one sequence (1, E); channels-first rows
(8, 2048, E / 16384); Mamba's selective scan of (batch 1, dim 1536, N 16, length E / 2048).

Each figure is the median over --reps samples of --inner calls run eagerly between CUDA events
(the host clock on a CPU). The ranks meet at a barrier before every sample, and a sample counts
at its slowest rank's time. The calls are not replayed from a CUDA graph as in the other benches:
the distributed call's argument check waits on the host. At 2^26 float32 elements a tensor
is 256 MiB, so every call runs from DRAM.

From the exchange's times over 16 bytes and 16 MiB a rank, a ring all_gather model projects the
call's time to 8, 64 and 512 ranks (RingAllGather, project): a model, not a measurement.

NCCL with one GPU a process (LOCAL_RANK) where CUDA is available, else gloo on CPU processes (a
smoke test of the same code). Rank 0 prints the tables; --json PATH writes the rows with the
device's name, the world size and the backend.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

import linrec
import linrec.distributed
from linrec import _cli
from linrec.bench import DTYPES, parse_storage

PROG = "python -m linrec.bench --distributed"
LAUNCH = "torchrun --nproc-per-node P -m linrec.bench --distributed [--json PATH]"
FLOOR = 1.15  # the weak-scaling floor: a call on P ranks against one shard alone
PROJECTED_WORLDS = (8, 64, 512)
FIT_BYTES = (16, 16 * 2**20)  # all_gather sizes a rank that fix the model's latency and bandwidth
FOLD_PAIRS_TIMED = 64
WARMUP_CALLS = 3


@dataclass
class Case:
    """One shard's inputs and the calls timed on them.

    single(inputs), sharded(inputs, group): the output; `grads` names the inputs the
    forward+backward differentiates; fold_pairs(world, backward): how many (a, b) pairs the
    rank that folds the most applies in a call at that world size."""

    name: str
    shape: tuple
    inputs: dict
    grads: tuple
    single: Callable
    sharded: Callable
    state_shape: tuple
    exchange_dtype: torch.dtype
    fold_pairs: Callable[[int, bool], int]


def scan_case(shape, values, coeffs, device) -> Case:
    inputs = dict(x=torch.randn(shape, device=device).to(values),
                  c=(torch.rand(shape, device=device) * 0.5 + 0.5).to(coeffs))
    return Case(
        name=str(shape), shape=shape, inputs=inputs, grads=("x", "c"),
        single=lambda t: linrec.linrec(t["x"], t["c"]),
        sharded=lambda t, group: linrec.distributed.linrec(t["x"], t["c"], group=group),
        state_shape=shape[:-1], exchange_dtype=torch.promote_types(coeffs, torch.float32),
        # Forward: the last rank folds the P - 1 ranks before it. Backward: a rank folds the ranks
        # after it, so over both passes every rank folds P - 1.
        fold_pairs=lambda world, backward: world - 1)


def selective_case(batch, dim, states, length, values, device) -> Case:
    g = dict(device=device)
    inputs = dict(
        u=torch.randn(batch, dim, length, **g).to(values),
        delta=(torch.randn(batch, dim, length, **g) * 0.5 - 3).to(values),  # softplus(-3 +- 0.5): Mamba's dt
        A=-torch.rand(dim, states, **g).add(0.5) * torch.arange(1, states + 1, **g),
        B=torch.randn(batch, states, length, **g).to(values),
        C=torch.randn(batch, states, length, **g).to(values),
        D=torch.randn(dim, **g),
        z=torch.randn(batch, dim, length, **g).to(values),
        delta_bias=torch.rand(dim, **g) - 4)
    names = ("u", "delta", "A", "B", "C", "D", "z")

    def single(t):
        return linrec.selective_scan(*(t[k] for k in names), delta_bias=t["delta_bias"], delta_softplus=True)

    def sharded(t, group):
        return linrec.distributed.selective_scan(*(t[k] for k in names), delta_bias=t["delta_bias"],
                                                 delta_softplus=True, group=group)

    # The gradients of A, D and delta_bias are this shard's share; a training step sums them
    # over the ranks as any shared parameter's, which is not timed here.
    return Case(
        name=f"selective ({batch}, {dim}, {states}, {length})", shape=(batch, dim, length), inputs=inputs,
        grads=tuple(inputs), single=single, sharded=sharded, state_shape=(batch, dim, states),
        exchange_dtype=torch.promote_types(values, torch.float32),
        # Every rank computes the states entering all P shards, and its backward runs over all P.
        fold_pairs=lambda world, backward: 2 * world if backward else world)


def cases(elements, values, coeffs, device):
    yield scan_case((1, elements), values, coeffs, device)
    yield scan_case((8, 2048, elements // (8 * 2048)), values, coeffs, device)
    if values == coeffs:  # the selective scan takes one storage type
        yield selective_case(1, 1536, 16, elements // 2048, values, device)


def call(fn, case, backward):
    """A function that runs fn(inputs) once: forward, or forward+backward through autograd.grad
    (not .backward(): accumulating into .grad would add work)."""
    if not backward:
        return lambda: fn(case.inputs)
    leaves = {k: v.detach().requires_grad_() if k in case.grads else v for k, v in case.inputs.items()}
    d_out = torch.randn_like(case.inputs[case.grads[0]])  # the output is shaped and typed as x (u)

    def forward_backward():
        return torch.autograd.grad(fn(leaves), [leaves[k] for k in case.grads], d_out)
    return forward_backward


class Timer:
    """Median ms a call over the ranks (see the module docstring): fn() runs on every rank together."""

    def __init__(self, device, reps, inner):
        self.device, self.reps, self.inner = device, reps, inner

    def sample_ms(self, fn) -> float:
        if self.device.type != "cuda":
            start = time.perf_counter()
            for _ in range(self.inner):
                fn()
            return (time.perf_counter() - start) * 1e3 / self.inner
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / self.inner

    def __call__(self, fn) -> tuple[float, list[float]]:
        """(the median of the slowest rank's samples, each rank's median)."""
        for _ in range(WARMUP_CALLS):
            fn()
        samples = []
        for _ in range(self.reps):
            dist.barrier()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(self.sample_ms(fn))
        mine = torch.tensor(samples, dtype=torch.float64, device=self.device)
        everyone = torch.stack(linrec.distributed._gather(mine, None)).cpu()  # (world, reps)
        return median(everyone.max(0).values.tolist()), [median(rank.tolist()) for rank in everyone]


def median(values) -> float:
    return sorted(values)[len(values) // 2]


def all_gathers_of(fn) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of each tensor one run of fn() all_gathers through linrec.distributed, in
    order: the exchange timed alone is the library's as it is."""
    recorded = []
    gather = linrec.distributed._gather

    def recording(t, group):
        recorded.append((tuple(t.shape), t.dtype))
        return gather(t, group)

    linrec.distributed._gather = recording
    try:
        fn()
    finally:
        linrec.distributed._gather = gather
    return recorded


def nbytes(shape, dtype) -> int:
    return torch.Size(shape).numel() * dtype.itemsize


@dataclass
class RingAllGather:
    """A ring all_gather's time: P - 1 steps, each sending every rank's `nbytes` one hop,
    (P - 1) * (alpha + nbytes / beta).

    Assumes: alpha (a step's latency) and beta (one hop's bandwidth) do not depend on P, as
    measured here among the run's ranks, and the host's work on P separate receive tensors (what
    linrec.distributed gathers into) grows no faster than the steps. The fit puts the call's
    fixed cost into alpha, so the model charges it on every step: pessimistic, the more so for a
    fit from 2 ranks (one step). So is the ring: NCCL's algorithms for small messages at scale
    need fewer than P - 1 steps. Ranks on other hosts have a larger alpha and a smaller beta than
    ranks on one host's NVLink: there a fit from one host is optimistic.
    """

    alpha_ms: float
    beta_bytes_per_ms: float

    @classmethod
    def fit(cls, world, small, large):
        """The model through two measured (bytes a rank, ms) points at `world` ranks."""
        steps = world - 1
        beta = (large[0] - small[0]) / ((large[1] - small[1]) / steps)
        return cls(alpha_ms=small[1] / steps - small[0] / beta, beta_bytes_per_ms=beta)

    def ms(self, world, nbytes) -> float:
        return (world - 1) * (self.alpha_ms + nbytes / self.beta_bytes_per_ms)


def project(row, fold_pairs, model: RingAllGather, world) -> dict:
    """The call's time at `world` ranks, modelled: its local passes (measured on a one-rank group),
    each of its all_gathers by `model`, and `fold_pairs` (a, b) pairs folded at the cost a pair
    measured here. Left out: the wait for a slower rank, and the host's work on the P gathered
    tensors beyond the fold."""
    exchange = sum(model.ms(world, g["bytes"]) for g in row["all_gathers"])
    fold = fold_pairs * row["fold_pair_ms"]
    projected = row["local_ms"] + exchange + fold
    return dict(case=row["case"], dtype=row["dtype"], backward=row["backward"], world_size=world,
                projected_ms=projected, exchange_ms=exchange, fold_ms=fold, vs_single=projected / row["single_ms"])


def time_case(case, dtype_name, backward, timer, own_group, model) -> tuple[dict, list[dict]]:
    """The case's row, and its projections where `model` (the all_gather's, None with one rank) is given."""
    world = dist.get_world_size()
    single = call(case.single, case, backward)
    sharded = call(lambda t: case.sharded(t, None), case, backward)
    local = call(lambda t: case.sharded(t, own_group), case, backward)
    # One shard and P ranks in the order A B B A, each figure the faster of its two: neither side
    # always runs first.
    runs = {"single": [], "sharded": []}
    for name in ("single", "sharded", "sharded", "single"):
        runs[name].append(timer(single if name == "single" else sharded))
    (single_ms, single_ranks), (sharded_ms, sharded_ranks) = (min(runs[k]) for k in ("single", "sharded"))
    local_ms = timer(local)[0]
    gathers = []
    for shape, dtype in all_gathers_of(sharded):
        buffer = torch.zeros(shape, dtype=dtype, device=timer.device)
        gathers.append(dict(shape=list(shape), dtype=str(dtype).removeprefix("torch."), bytes=nbytes(shape, dtype),
                            ms=timer(lambda: linrec.distributed._gather(buffer, None))[0]))
    pairs = [(torch.rand(case.state_shape, dtype=case.exchange_dtype, device=timer.device),) * 2
             for _ in range(FOLD_PAIRS_TIMED)]
    start = torch.zeros(case.state_shape, dtype=case.exchange_dtype, device=timer.device)
    fold_pair_ms = timer(lambda: linrec.distributed._fold(pairs, start))[0] / FOLD_PAIRS_TIMED
    exchange_ms = sum(g["ms"] for g in gathers)
    row = dict(case=case.name, shape=list(case.shape), dtype=dtype_name, backward=backward, world_size=world,
               single_ms=single_ms, distributed_ms=sharded_ms, ratio=sharded_ms / single_ms,
               floor_met=sharded_ms / single_ms <= FLOOR, local_ms=local_ms, exchange_ms=exchange_ms,
               exchange_share=exchange_ms / sharded_ms, all_gathers=gathers, fold_pair_ms=fold_pair_ms,
               single_ms_ranks=single_ranks, distributed_ms_ranks=sharded_ranks)
    projection = [project(row, case.fold_pairs(w, backward), model, w) for w in PROJECTED_WORLDS] if model else []
    return row, projection


def fit_all_gather(timer) -> dict:
    """Each FIT_BYTES size's all_gather time at the run's world size, and the model through them."""
    points = []
    for size in FIT_BYTES:
        buffer = torch.zeros(size // 4, dtype=torch.float32, device=timer.device)
        points.append((size, timer(lambda: linrec.distributed._gather(buffer, None))[0]))
    world = dist.get_world_size()
    model = RingAllGather.fit(world, *points) if world > 1 else None
    return dict(points=[dict(bytes=b, ms=ms) for b, ms in points], model=model)


def run(elements, dtypes, reps, inner, only, device) -> dict:
    timer = Timer(device, reps, inner)
    own_group, _ = dist.new_subgroups(group_size=1)  # every rank alone: the call's local passes
    fit = fit_all_gather(timer)
    model = fit["model"]
    rows, projection = [], []
    for dtype_name in dtypes:
        values, coeffs = parse_storage(dtype_name)
        for case in cases(elements, values, coeffs, device):
            if only and only not in case.name:
                continue
            for backward in (False, True):
                row, projected = time_case(case, dtype_name, backward, timer, own_group, model)
                rows.append(row)
                projection += projected
    return dict(rows=rows, all_gather=dict(
        points=fit["points"], model="ring: (P - 1) * (alpha + bytes / beta)",
        alpha_ms=model.alpha_ms if model else None,
        beta_gbs=model.beta_bytes_per_ms / 1e6 if model else None), projection=projection)


def print_tables(result, device_name, world, backend, elements):
    ranks = f"{world} rank{'s' if world > 1 else ''}"
    print(f"device: {device_name}, {ranks} ({backend}), {elements} elements a rank")
    print(f"{'case':<34}{'dtype':<18}{'pass':<8}{'shard ms':>10}{ranks + ' ms':>13}{'ratio':>7}{'floor':>7}"
          f"{'local ms':>10}{'exchange ms':>13}{'share':>7}")
    for r in result["rows"]:
        print(f"{r['case']:<34}{r['dtype']:<18}{'fwd+bwd' if r['backward'] else 'fwd':<8}{r['single_ms']:>10.3f}"
              f"{r['distributed_ms']:>13.3f}{r['ratio']:>7.2f}{'met' if r['floor_met'] else 'missed':>7}"
              f"{r['local_ms']:>10.3f}{r['exchange_ms']:>13.4f}{r['exchange_share']:>7.1%}")
    print(f"shard: linrec on one rank's shard alone; ratio: {ranks} / shard (floor {FLOOR}); local: the "
          "distributed call on a one-rank group; exchange: its all_gathers, each timed alone; share: exchange / "
          f"{ranks}")
    gather = result["all_gather"]
    points = ", ".join(f"{p['bytes']} B a rank {p['ms']:.4f} ms" for p in gather["points"])
    print(f"all_gather over {ranks}: {points}")
    if not result["projection"]:
        print("projection: needs at least 2 ranks, to time the all_gather between them")
        return
    print(f"ring model (P - 1) * (alpha + bytes / beta): alpha {gather['alpha_ms'] * 1e3:.2f} us, "
          f"beta {gather['beta_gbs']:.2f} GB/s")
    print(f"projection from {ranks} (a model, not a measurement): a call at P ranks / one shard alone")
    print(f"{'case':<34}{'dtype':<18}{'pass':<8}" + "".join(f"{f'P={w}':>10}" for w in PROJECTED_WORLDS))
    by_row = {}
    for p in result["projection"]:
        by_row.setdefault((p["case"], p["dtype"], p["backward"]), []).append(p["vs_single"])
    for (case, dtype, backward), ratios in by_row.items():
        print(f"{case:<34}{dtype:<18}{'fwd+bwd' if backward else 'fwd':<8}" + "".join(f"{v:>10.2f}" for v in ratios))


def elements_per_rank(text: str) -> int:
    """An argparse type: enough elements for the (8, 2048, L) case's rows."""
    value = _cli.positive_int(text)
    if value < 8 * 2048:
        raise argparse.ArgumentTypeError(f"{value} is below 16384, the (8, 2048, L) case's rows")
    return value


def init_process_group() -> torch.device:
    """The default group of torchrun's ranks: NCCL on the GPU LOCAL_RANK names, else gloo on the CPU."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {local_rank}, but torch sees {torch.cuda.device_count()} GPUs")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _cli.parser(PROG, __doc__)
    parser.add_argument("--elements", type=elements_per_rank, default=2**26,
                        help="elements a rank's shard holds (default: 2^26; at least 16384)")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=DTYPES, metavar="DTYPE",
                        help=f"storage types, mixed ones as values+coeffs: {', '.join(DTYPES)} (default: float32)")
    parser.add_argument("--reps", type=_cli.positive_int, default=30, help="samples per figure (default: 30)")
    parser.add_argument("--inner", type=_cli.positive_int, default=10, help="calls per sample (default: 10)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--json", metavar="PATH", type=_cli.output_path,
                        help="rank 0 writes the rows to this JSON file")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return _cli.fail(PROG, f"runs one process a GPU under torchrun: {LAUNCH}")
    names = {case.name for dtype in args.dtypes for case in cases(args.elements, *parse_storage(dtype), "meta")}
    if args.only and not any(args.only in name for name in names):  # said before the ranks meet
        return _cli.fail(PROG, f"no case name contains {args.only!r} (--only; the cases: {', '.join(sorted(names))})")
    try:
        device = init_process_group()
    except ValueError as error:
        return _cli.fail(PROG, str(error))
    try:
        result = run(args.elements, args.dtypes, args.reps, args.inner, args.only, device)
        if dist.get_rank() == 0:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
            world, backend = dist.get_world_size(), dist.get_backend()
            print_tables(result, name, world, backend, args.elements)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(device=name, world_size=world, backend=backend, elements=args.elements,
                                   reps=args.reps, inner=args.inner, floor=FLOOR, **result), f, indent=1)
        dist.barrier()  # no rank closes its connections while rank 0 still writes
    finally:
        dist.destroy_process_group()
    return 0
