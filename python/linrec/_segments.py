"""Packed variable-length sequences (`cu_seqlens`) and log-space coefficients (`log_coeffs`).

Segment k of the packed dim is steps cu_seqlens[k] .. cu_seqlens[k+1]-1, an independent
recurrence entered from initial[k] (zeros without initial). At each segment's first step in
scan order (its last with reverse) the recurrence is cut by a zero coefficient there, and the
state entering the segment comes in through the inputs:

    y[first] = c[first] * initial[k] + x[first]

The kernels take the cuts as one flag a step along dim (the op's `cuts`): the coefficient there
reads as 0, in the forward and the fused backward, and its gradient is 0. The entering
states add into the inputs at the segments' first steps only (index_add), so without
`initial` the inputs go to the kernels as they are. Autograd gives the gradients of inputs,
coeffs and initial (per segment) through that addition. The boundaries are found with
device-side tensor ops only: no host sync on CUDA.
"""

from __future__ import annotations

import cmath
import math
import numbers

import torch

from ._args import _as_tensor
from ._autograd import exp_of_log

SEGMENT_INDEX_DTYPES = (torch.int32, torch.int64)


def check_log_number(coeffs) -> None:
    """A log-coefficient given as a number must have a finite exp (a tensor is not checked: that
    would read it, and wait for the device on CUDA)."""
    if isinstance(coeffs, numbers.Number) and not isinstance(coeffs, bool):
        try:
            cmath.exp(coeffs) if isinstance(coeffs, complex) else math.exp(coeffs)
        except OverflowError:
            raise ValueError(f"linrec: coeffs={coeffs!r} with log_coeffs=True overflows exp") from None


def check_cu_seqlens(cu_seqlens, inputs: torch.Tensor, dim: int, name: str = "inputs") -> None:
    """A 1-D int32 / int64 tensor on inputs' device, [0, e1, ..., inputs.shape[dim]], nondecreasing;
    `name` is inputs' in the errors. The values are checked on CPU tensors only: on CUDA that would
    wait for the device."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"linrec: cu_seqlens must be a 1-D integer tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"linrec: cu_seqlens must be a 1-D tensor of at least one element, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in SEGMENT_INDEX_DTYPES:
        raise ValueError(f"linrec: cu_seqlens has dtype {cu_seqlens.dtype}; expected torch.int32 or torch.int64")
    if cu_seqlens.device != inputs.device:
        raise ValueError(f"linrec: cu_seqlens is on {cu_seqlens.device} but {name} is on {inputs.device}")
    if cu_seqlens.device.type != "cpu" or torch.compiler.is_compiling():
        return
    length = inputs.shape[dim]
    if cu_seqlens[0].item() != 0 or cu_seqlens[-1].item() != length:
        raise ValueError(f"linrec: cu_seqlens must start at 0 and end at {name}.shape[{dim}] = {length}, got "
                         f"{cu_seqlens[0].item()} .. {cu_seqlens[-1].item()}")
    if cu_seqlens.numel() > 1 and bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError("linrec: cu_seqlens must be nondecreasing")


def segment_initial(initial, inputs: torch.Tensor, dim: int, num_segments: int):
    """initial as one state a segment: inputs' shape with `dim` of size num_segments (broadcast)."""
    if initial is None:
        return None
    shape = list(inputs.shape)
    shape[dim] = num_segments
    initial = _as_tensor("initial", initial, inputs)
    try:
        if torch.broadcast_shapes(initial.shape, shape) == torch.Size(shape):
            return initial.expand(shape)
    except RuntimeError:
        pass
    raise ValueError(f"linrec: with cu_seqlens, initial holds one state a segment: shape {tuple(shape)} "
                     f"({num_segments} segments along dim {dim}) or broadcastable to it, got {tuple(initial.shape)}")


def cut_flags(cu_seqlens, length: int, reverse: bool, device) -> torch.Tensor:
    """The kernels' flags, one a step, set at each segment's first step in scan order: its start,
    or with reverse its last step. Two to five small kernels on CUDA (0.9-1.5 µs each on an H200,
    python -m tools kernel-times --segments)."""
    # An empty segment's flag lands on the next segment's first step (or, with reverse, the last
    # step of the one before), which is set anyway, or on a scratch slot past the end: its start
    # is `length` when no step follows it; with reverse, step -1 (taken modulo length + 1) when
    # none precedes it. index_fill_ takes int64 indices and the value as a kernel argument (an
    # index assignment copies it to the device from pageable memory: no CUDA graph captures that).
    bounds = cu_seqlens.long()
    slots = torch.zeros(length + 1, dtype=torch.bool, device=device)
    slots.index_fill_(0, (bounds[1:] + length).remainder_(length + 1) if reverse else bounds[:-1], True)
    return slots[:length]  # the same start as the tensor: the kernels read the flags 16 bytes at a time


def segment_firsts(cu_seqlens, length: int, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, nonempty): each segment's first step in scan order (`length` for an empty segment),
    and which segments have steps."""
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    nonempty = ends > starts
    return torch.where(nonempty, ends - 1 if reverse else starts, length), nonempty


def scan_segments(scan, inputs, coeffs, initial, dim: int, reverse: bool, cu_seqlens, log_coeffs=False):
    """`scan(inputs, coeffs, initial, dim, reverse, log_coeffs, cuts)` over each segment of
    cu_seqlens (see above). inputs and coeffs come as _args.normalize gives them; initial from
    segment_initial."""
    length = inputs.shape[dim]
    if length == 0:
        return scan(inputs, coeffs, None, dim, reverse, log_coeffs, None)
    cuts = cut_flags(cu_seqlens, length, reverse, inputs.device)
    if initial is not None:
        first, nonempty = segment_firsts(cu_seqlens, length, reverse)
        # y[first] = c[first] * initial[k] + x[first]; an empty segment adds 0 (at any step).
        at = first.clamp_max(length - 1)
        shape = [1] * inputs.dim()
        shape[dim] = at.shape[0]
        entering_coeffs = coeffs.index_select(dim, at)
        if log_coeffs:
            entering_coeffs = exp_of_log(entering_coeffs)
        entering = entering_coeffs * initial * nonempty.view(shape)
        inputs = inputs.index_add(dim, at, entering.to(inputs.dtype))
    return scan(inputs, coeffs, None, dim, reverse, log_coeffs, cuts)

