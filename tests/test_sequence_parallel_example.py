"""examples/sequence_parallel.py's training on 2 CPU processes (gloo): the loss over the ranks
follows the single-process run's, and it goes down."""

import importlib.util
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sequence_parallel.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("sequence_parallel", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gloo_threads():
    """The names of this process's gloo threads (Linux), or None where /proc is not there."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    names = []
    for task in tasks.iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return [name for name in names if "gloo" in name]


def _worker(rank, store_path, results):
    example = _load_example()
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        losses = example.train(example.parse_args(["--device", "cpu", "--steps", "21", "--length", "96",
                                                   "--dim", "8"]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Gloo's threads must be gone before the interpreter exits, or one can abort the exit: the
    # example imports what would otherwise keep the group alive.
    results.put((rank, losses, _gloo_threads()))


def test_sequence_parallel_example_matches_one_process(tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(str(tmp_path / "store"), results), nprocs=2, join=True, start_method="spawn")
    reports = dict((rank, (losses, threads)) for rank, losses, threads in (results.get(), results.get()))
    assert all(threads in (None, []) for _, threads in reports.values()), reports
    losses = reports[0][0]
    assert len(losses) == 21
    for _, sharded, whole in losses:
        assert abs(sharded - whole) <= 1e-4 * whole
    assert losses[-1][1] < 0.5 * losses[0][1]
