"""Timing helpers shared by the main job, tune and bench: CUDA-event medians."""

from __future__ import annotations

import torch


def median_ms(fn, warmup=5, reps=30) -> float:
    """Median time of fn() in milliseconds, measured with CUDA events (or the host clock on CPU)."""
    if not torch.cuda.is_available():
        import time

        for _ in range(min(warmup, 2)):
            fn()
        times = []
        for _ in range(max(reps // 5, 3)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(nbytes=2**30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus written."""
    src = torch.empty(nbytes // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6
