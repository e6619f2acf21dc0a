"""The compiled CUDA kernels, one function per kernel family.

Each has the signature of linrec.linrec plus keyword config arguments that pick
one compiled TileConfig (see linrec.compiled_configs(kernel)). The config reaches the
op as plain ints, so torch.compile traces these calls like any other.

- linrec_ref: one thread per sequence, walking it step by step.
- linrec_tile: one thread block scans a whole sequence held in registers
  (at most elems_per_thread * threads_per_block elements).
- linrec_pipe: the tile scan over consecutive tiles with a carry: any length.
- linrec_chained: one block per tile, each finding its entering state by
  decoupled look-back: any length, for few long sequences.
- linrec_strided: lanes across sequences, time in chunks chained by look-back:
  for sequences strided along their length (channel-last data), any length.
- linrec_packed: several short sequences to a warp, each held whole by a
  segment of lanes (at most 32 * elems_per_thread elements).

Every family but linrec_pipe also takes complex64 / complex128, at the configs
linrec.compiled_configs(kernel, dtype) lists for them (tile: the vector configs,
memcode 1; chained: the staged ones, memcode 3).
"""

from __future__ import annotations

import functools

import torch

from .. import compiled_configs
from .._args import normalize
from .._ops import KERNEL_CHAINED, KERNEL_PACKED, KERNEL_PIPE, KERNEL_REF, KERNEL_STRIDED, KERNEL_TILE, call_compiled


def _check_cuda(inputs):
    if not inputs.is_cuda:
        raise ValueError(f"linrec.impl.cuda: inputs must be a CUDA tensor, got one on {inputs.device}")


@functools.cache
def _compiled(kernel, complex_storage):
    return frozenset(compiled_configs(kernel, torch.complex64 if complex_storage else None))


def _check_config(kernel, inputs, dim, elems_per_thread, threads_per_block, memcode, algocode):
    config = (elems_per_thread, threads_per_block, memcode, algocode)
    if config not in _compiled(kernel, inputs.is_complex()):
        if inputs.is_complex() and config in _compiled(kernel, False):
            raise ValueError(
                f"linrec_{kernel}: config {config} is not compiled for {inputs.dtype}; see "
                f"linrec.compiled_configs({kernel!r}, {inputs.dtype})"
            )
        raise ValueError(
            f"linrec_{kernel}: config (elems_per_thread, threads_per_block, memcode, algocode) = {config} "
            f"is not compiled; see linrec.compiled_configs({kernel!r}), or build with LINREC_CONFIGS=full"
        )
    if kernel == "packed" and inputs.shape[dim] > 32 * elems_per_thread:
        raise ValueError(
            f"linrec_packed: the packed kernel holds at most 32 * elems_per_thread = {32 * elems_per_thread} "
            f"elements, but the sequence has {inputs.shape[dim]}; use linrec_tile or linrec_pipe"
        )
    if kernel == "tile" and inputs.shape[dim] > elems_per_thread * threads_per_block:
        raise ValueError(
            f"linrec_tile: the tile kernel scans at most elems_per_thread * threads_per_block = "
            f"{elems_per_thread * threads_per_block} elements, but the sequence has {inputs.shape[dim]}; "
            "use linrec_pipe or a larger config"
        )


def _run_config(kernel, kernel_id, inputs, coeffs, reverse, dim, initial, config):
    """Check the arguments and the config, then run one compiled kernel with it."""
    complex_ok = kernel != "pipe"  # which configs are compiled for complex storage: _check_config
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=complex_ok)
    _check_cuda(inputs)
    _check_config(kernel, inputs, dim, *config)
    return call_compiled(inputs, coeffs, initial, dim, reverse, kernel_id, *config)


def linrec_ref(inputs, coeffs, reverse=False, *, dim=-1, initial=None):
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True)
    _check_cuda(inputs)
    return call_compiled(inputs, coeffs, initial, dim, reverse, KERNEL_REF)


def linrec_tile(inputs, coeffs, reverse=False, *, dim=-1, initial=None, elems_per_thread=16,
                threads_per_block=256, memcode=1, algocode=3):
    return _run_config("tile", KERNEL_TILE, inputs, coeffs, reverse, dim, initial,
                       (elems_per_thread, threads_per_block, memcode, algocode))


def linrec_pipe(inputs, coeffs, reverse=False, *, dim=-1, initial=None, elems_per_thread=8,
                threads_per_block=256, memcode=1, algocode=3):
    return _run_config("pipe", KERNEL_PIPE, inputs, coeffs, reverse, dim, initial,
                       (elems_per_thread, threads_per_block, memcode, algocode))


def linrec_chained(inputs, coeffs, reverse=False, *, dim=-1, initial=None, elems_per_thread=8,
                   threads_per_block=64, memcode=1, algocode=3):
    """One block per tile; the scan always runs in full (algocode is ignored beyond the config lookup)."""
    return _run_config("chained", KERNEL_CHAINED, inputs, coeffs, reverse, dim, initial,
                       (elems_per_thread, threads_per_block, memcode, algocode))


def linrec_strided(inputs, coeffs, reverse=False, *, dim=-1, initial=None, elems_per_thread=16,
                   threads_per_block=256, memcode=3, algocode=3):
    """Lanes across 32 sequences (64 for 16-bit channel pairs), elems_per_thread steps per thread,
    threads_per_block / 32 warps splitting a chunk of time, each thread's steps in registers
    (memcode 0) or staged in shared memory (memcode 3); see linrec.compiled_configs("strided")."""
    return _run_config("strided", KERNEL_STRIDED, inputs, coeffs, reverse, dim, initial,
                       (elems_per_thread, threads_per_block, memcode, algocode))


def linrec_packed(inputs, coeffs, reverse=False, *, dim=-1, initial=None, elems_per_thread=4,
                  threads_per_block=256, memcode=1, algocode=3):
    """Sequences of at most 32 * elems_per_thread elements, several to a warp; see
    linrec.compiled_configs("packed")."""
    return _run_config("packed", KERNEL_PACKED, inputs, coeffs, reverse, dim, initial,
                       (elems_per_thread, threads_per_block, memcode, algocode))
