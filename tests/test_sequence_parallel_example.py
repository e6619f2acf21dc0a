"""examples/sequence_parallel.py's training on 2 CPU processes (gloo): the loss over the ranks
follows the single-process run's, and it goes down."""

import importlib.util
import os
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sequence_parallel.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("sequence_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker(rank, store_path, results, finished):
    example = _load_example()
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        losses = example.train(example.parse_args(["--device", "cpu", "--steps", "21", "--length", "96",
                                                   "--dim", "8"]))
        if rank == 0:
            results.put(losses)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Both ranks are done and their results are in. A spawned process's interpreter shutdown
    # with gloo's threads still around has aborted a rank (SIGABRT, "terminate called without an
    # active exception") about once in three full-suite runs; skipping it keeps the test about
    # the example's numbers.
    finished.wait()
    os._exit(0)


def test_sequence_parallel_example_matches_one_process(tmp_path):
    ctx = mp.get_context("spawn")
    results, finished = ctx.SimpleQueue(), ctx.Barrier(2)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_worker, args=(str(tmp_path / "store"), results, finished), nprocs=2, join=True,
                       start_method="spawn")
    losses = results.get()
    assert len(losses) == 21
    for _, sharded, whole in losses:
        assert abs(sharded - whole) <= 1e-4 * whole
    assert losses[-1][1] < 0.5 * losses[0][1]
