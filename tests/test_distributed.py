"""linrec.distributed.linrec on CPU processes (gloo): each rank's shard of the outputs and its
gradients against the float64 loop over the whole sequence, in one process each world."""

import os
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import linrec.distributed
from reference import reference, rel_error

# Shard lengths per world: uneven, with empty shards.
SHARDS = {2: [11, 6], 3: [5, 0, 12], 4: [7, 3, 0, 9]}


def _case(world, rank, layout, dtype, reverse, with_initial, seed):
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
    return x, c, w, h, dim, start, SHARDS[world][rank]


def _check_rank(world, rank):
    for layout in ("rows", "channels"):
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
            for reverse in (False, True):
                for with_initial in (False, True):
                    seed = zlib.crc32(repr((layout, dtype, reverse, with_initial)).encode())  # the same on every rank
                    x, c, w, h, dim, start, length = _case(world, rank, layout, dtype, reverse, with_initial, seed)
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
    x, c, _, h, dim, start, length = _case(world, rank, "rows", torch.float64, False, True, 7)
    y = linrec.distributed.linrec(x.narrow(dim, start, length), c.log().narrow(dim, start, length), dim=dim,
                                  initial=h, log_coeffs=True)
    assert length == 0 or rel_error(y, reference(x, c, dim=dim, initial=h).narrow(dim, start, length)) < 1e-10
    # Arguments that differ across ranks raise on every rank, and the group goes on working.
    channels = 4 if rank == 1 else 3
    for bad in (torch.randn(2, channels, 5, dtype=torch.float64),
                torch.randn(2, 3, 5, dtype=torch.float32 if rank == 0 else torch.float64)):
        with pytest.raises(ValueError, match="differ"):
            linrec.distributed.linrec(bad, 0.5)
    dist.barrier()


def _worker(rank, world, store_path, failures):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        _check_rank(world, rank)
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


def test_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    with pytest.raises(RuntimeError, match="not initialized"):
        linrec.distributed.linrec(torch.randn(2, 5), 0.5)
