"""Timing functions shared by `python -m linrec`, tune and bench.

Two clocks, both medians over `reps` samples of `inner` back-to-back calls:

- device_ms: the calls are captured once in a CUDA graph and the graph is
  replayed between CUDA events. This is the GPU's time for the work alone,
  without Python and launch overheads; bandwidth figures use it.
- eager_ms: the calls run eagerly between CUDA events with no synchronisation
  inside a sample, so the host runs ahead as in a training loop. Where the
  kernels are shorter than the host's per-call cost, this is the host's time.

On a machine without a GPU both fall back to the host clock.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def _host_ms(fn, reps) -> float:
    fn()
    times = []
    for _ in range(max(reps // 5, 3)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _median_of_samples(run_sample, reps, inner) -> float:
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_sample()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return sorted(times)[len(times) // 2]


def eager_ms(fn, reps=20, inner=10, warmup=3) -> float:
    """Median time per call of fn() in ms, run eagerly (see the module docstring)."""
    if not torch.cuda.is_available():
        return _host_ms(fn, reps)
    for _ in range(warmup):
        fn()

    def sample():
        for _ in range(inner):
            fn()

    return _median_of_samples(sample, reps, inner)


def device_ms(fn, reps=20, inner=10, warmup=3) -> float:
    """Median GPU time per call of fn() in ms, replayed from a CUDA graph (see the module docstring).

    Warm-up (autotuning, lazy initialisation) runs on a side stream before capture, as
    torch.cuda.graph requires. Functions that cannot be captured are timed eagerly.
    """
    if not torch.cuda.is_available():
        return _host_ms(fn, reps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
    except RuntimeError as error:
        torch.cuda.synchronize()
        print(f"linrec: timed eagerly, the CUDA graph capture failed: {error}", file=sys.stderr)
        return eager_ms(fn, reps, inner, warmup=0)
    graph.replay()
    ms = _median_of_samples(graph.replay, reps, inner)
    del graph
    return ms


def copy_bandwidth_gbs(nbytes=2**30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus written.

    Timed eagerly: captured in a CUDA graph, the copy becomes a memcpy node that
    the copy engines run (about 20% slower on an H100 than the copy kernel that
    runs eagerly). At 1 GiB per call the host's overhead is negligible.
    """
    src = torch.empty(nbytes // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = eager_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def write_rows(path: str, copy_gbs: float, rows: list) -> None:
    """A benchmark's rows as JSON, with the device and its copy bandwidth of the same run."""
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, rows=rows), f, indent=1)
