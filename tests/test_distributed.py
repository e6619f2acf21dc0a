"""linrec.distributed on CPU processes (gloo): each rank's shard of the outputs and its gradients
against the whole sequence in one process (linrec.linrec: the float64 loop; selective_scan:
linrec.selective_scan, itself checked against a float64 loop in test_selective_scan.py)."""

import datetime
import os
import re
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import linrec.distributed
from reference import reference, rel_error

# Shard lengths per world: uneven, with empty shards.
SHARDS = {2: [11, 6], 3: [5, 0, 12], 4: [7, 3, 0, 9]}


def _case(world, rank, layout, dtype, reverse, with_initial, seed, device="cpu"):
    """The whole problem (the same on every rank, from the seed) and this rank's slice of it."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(SHARDS[world])
    shape, dim = ((2, 3, total), 2) if layout == "rows" else ((2, total, 3), 1)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    c = torch.rand(shape, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    w = torch.randn(shape, generator=gen, dtype=torch.float64)
    state = tuple(s for d, s in enumerate(shape) if d != dim)
    h = torch.randn(state, generator=gen, dtype=torch.float64) if with_initial else None
    start = sum(SHARDS[world][:rank])
    x, c, w = x.to(device), c.to(device), w.to(device)
    return x, c, w, None if h is None else h.to(device), dim, start, SHARDS[world][rank]


def _check_rank(world, rank, device):
    for layout in ("rows", "channels"):
        # bfloat16 shards measured relative errors up to 4e-3 against the float64 loop on unrounded inputs
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            for reverse in (False, True):
                for with_initial in (False, True):
                    seed = zlib.crc32(repr((layout, dtype, reverse, with_initial)).encode())  # the same on every rank
                    x, c, w, h, dim, start, length = _case(world, rank, layout, dtype, reverse, with_initial, seed,
                                                           device)
                    leaves = [t.requires_grad_() for t in (x, c) + ((h,) if h is not None else ())]
                    want = reference(x, c, reverse, dim=dim, initial=h)
                    want_grads = torch.autograd.grad((want * w).sum(), leaves)
                    mine = [t.detach().narrow(dim, start, length).to(dtype).requires_grad_() for t in (x, c)]
                    h_mine = None if h is None else h.detach().to(dtype).requires_grad_()
                    y = linrec.distributed.linrec(mine[0], mine[1], reverse, dim=dim, initial=h_mine)
                    what = (world, rank, layout, dtype, reverse, with_initial)
                    assert rel_error(y, want.narrow(dim, start, length)) < tol or length == 0, what
                    grads = torch.autograd.grad((y * w.narrow(dim, start, length).to(dtype)).sum(),
                                                mine + ([h_mine] if h_mine is not None else []), allow_unused=True)
                    for got, full in zip(grads[:2], want_grads[:2]):
                        assert length == 0 or rel_error(got, full.narrow(dim, start, length)) < tol, what
                    if h is not None:  # the gradient of every rank's loss, on every rank
                        assert rel_error(grads[2], want_grads[2]) < tol, what
    # log-space coefficients, as linrec.linrec takes them
    x, c, _, h, dim, start, length = _case(world, rank, "rows", torch.float64, False, True, 7, device)
    y = linrec.distributed.linrec(x.narrow(dim, start, length), c.log().narrow(dim, start, length), dim=dim,
                                  initial=h, log_coeffs=True)
    assert length == 0 or rel_error(y, reference(x, c, dim=dim, initial=h).narrow(dim, start, length)) < 1e-10
    # Arguments that differ across ranks raise on every rank, and the group goes on working.
    channels = 4 if rank == 1 else 3
    others = ", ".join(f"rank {r}: {4 if r == 1 else 3}" for r in range(world))
    dtypes = ", ".join(f"rank {r}: torch.float{32 if r == 0 else 64}" for r in range(world))
    for bad, message in ((torch.randn(2, channels, 5, dtype=torch.float64, device=device),
                          f"differ in size of dim 1 (all but dim must match) ({others})"),
                         (torch.randn(2, 3, 5, dtype=torch.float32 if rank == 0 else torch.float64, device=device),
                          f"differ in inputs dtype ({dtypes})")):
        with pytest.raises(ValueError, match=re.escape(message)):
            linrec.distributed.linrec(bad, 0.5)
    dist.barrier()


def _check_selective_rank(world, rank, device):
    """Mamba's scan: y, the state leaving the shard, and every gradient. Gradients of what every
    rank holds whole (A, D, delta_bias) are a shard's share: their sum over the ranks counts."""
    batch, dim, states = 2, 3, 4
    total, start, length = sum(SHARDS[world]), sum(SHARDS[world][:rank]), SHARDS[world][rank]
    for reverse in (False, True):
        for with_initial in (False, True):
            gen = torch.Generator().manual_seed(zlib.crc32(repr(("selective", reverse, with_initial)).encode()))
            f64 = dict(generator=gen, dtype=torch.float64)
            whole = dict(u=torch.randn(batch, dim, total, **f64), delta=torch.randn(batch, dim, total, **f64),
                         A=-torch.rand(dim, states, **f64) - 0.2, B=torch.randn(batch, states, total, **f64),
                         C=torch.randn(batch, states, total, **f64), D=torch.randn(dim, **f64),
                         z=torch.randn(batch, dim, total, **f64), delta_bias=torch.randn(dim, **f64))
            whole = {k: v.to(device) for k, v in whole.items()}
            h0 = torch.randn(batch, dim, states, **f64).to(device) if with_initial else None
            w = torch.randn(batch, dim, total, **f64).to(device)
            names = list(whole)
            leaves = [whole[k].requires_grad_() for k in names] + ([h0.requires_grad_()] if with_initial else [])
            want, want_last = linrec.selective_scan(*(whole[k] for k in names[:7]), delta_bias=whole["delta_bias"],
                                                    delta_softplus=True, return_last_state=True, initial_state=h0,
                                                    reverse=reverse)
            want_grads = dict(zip(names + ["h0"], torch.autograd.grad((want * w).sum(), leaves)))
            # this rank's shard: positions [start, start + length) of the sequence as stored
            sharded = {"u", "delta", "B", "C", "z"}
            mine = {k: (v.detach().narrow(-1, start, length) if k in sharded else v.detach()).requires_grad_()
                    for k, v in whole.items()}
            h_mine = h0.detach().requires_grad_() if with_initial else None
            y, leaving = linrec.distributed.selective_scan(
                *(mine[k] for k in names[:7]), delta_bias=mine["delta_bias"], delta_softplus=True,
                return_last_state=True, initial_state=h_mine, reverse=reverse)
            what = (world, rank, reverse, with_initial)
            assert length == 0 or rel_error(y, want.narrow(-1, start, length)) < 1e-10, what
            if rank == (0 if reverse else world - 1):  # the rank that ends the sequence
                assert rel_error(leaving, want_last) < 1e-10, what
            inputs = [mine[k] for k in names] + ([h_mine] if with_initial else [])
            grads = dict(zip(names + ["h0"], torch.autograd.grad(
                (y * w.narrow(-1, start, length)).sum(), inputs, allow_unused=True)))
            for k, got in grads.items():
                if k in sharded:
                    assert length == 0 or rel_error(got, want_grads[k].narrow(-1, start, length)) < 1e-10, (k, what)
                elif k == "h0":  # the whole gradient on every rank
                    assert rel_error(got, want_grads[k]) < 1e-10, (k, what)
                else:
                    got = torch.zeros_like(whole[k]) if got is None else got.clone()
                    dist.all_reduce(got)
                    assert rel_error(got, want_grads[k]) < 1e-10, (k, what)
    with pytest.raises(ValueError, match=r"differ in states \(A's columns\) \(rank 0: 4, rank 1: 5"):  # N on rank 1
        n = 5 if rank == 1 else 4
        g = dict(device=device)
        linrec.distributed.selective_scan(torch.randn(1, 2, 3, **g), torch.randn(1, 2, 3, **g), -torch.rand(2, n, **g),
                                          torch.randn(1, n, 3, **g), torch.randn(1, n, 3, **g))
    dist.barrier()


def _check_refusals(world, rank, device):
    """Arguments that one rank's own checks refuse: that rank raises its error and every other rank
    one naming it, at once (the others used to wait in the exchange until the group's timeout)."""
    g = dict(device=device)
    bad = rank == world - 1
    with pytest.raises(ValueError, match="does not broadcast" if bad else f"rank {world - 1} refused its arguments"):
        linrec.distributed.linrec(torch.randn(4, 8, **g), torch.rand(4, 5 if bad else 8, **g))
    with pytest.raises(ValueError, match="must be a bool" if bad else f"rank {world - 1} refused"):
        linrec.distributed.linrec(torch.randn(4, 8, **g), torch.rand(4, 8, **g), log_coeffs=1 if bad else False)
    with pytest.raises(ValueError, match="delta of shape" if bad else f"rank {world - 1} refused"):
        linrec.distributed.selective_scan(torch.randn(1, 2, 3, **g), torch.rand(1, 2, 4 if bad else 3, **g),
                                          -torch.rand(2, 4, **g), torch.randn(2, 4, **g), torch.randn(2, 4, **g))
    with pytest.raises(ValueError, match="z of shape" if bad else f"rank {world - 1} refused"):
        linrec.distributed.selective_scan(torch.randn(1, 2, 3, **g), torch.rand(1, 2, 3, **g), -torch.rand(2, 4, **g),
                                          torch.randn(2, 4, **g), torch.randn(2, 4, **g),
                                          z=torch.randn(1, 2, 4 if bad else 3, **g))
    dist.barrier()


def _worker(rank, world, store_path, failures, backend="gloo"):
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    # A minute, not the default half hour: a rank left waiting for another fails the test soon.
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        _check_rank(world, rank, device)
        _check_selective_rank(world, rank, device)
        _check_refusals(world, rank, device)
    except BaseException as error:  # reported to the test, which fails with it
        failures.put(f"rank {rank}: {type(error).__name__}: {error}")
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", sorted(SHARDS))
def test_sharded_scan_matches_the_whole_sequence(world, tmp_path):
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), failures), nprocs=world, join=True,
                       start_method="spawn")
    assert failures.empty()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_scans_on_gpus_with_nccl(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), failures, "nccl"), nprocs=world, join=True,
                       start_method="spawn")
    assert failures.empty()


def test_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    with pytest.raises(RuntimeError, match="not initialized"):
        linrec.distributed.linrec(torch.randn(2, 5), 0.5)
