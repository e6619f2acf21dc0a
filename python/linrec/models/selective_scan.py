"""Mamba's selective (S6) scan as linear recurrences over an expanded state.

For every batch b, channel d and state n, with dt = delta (+ delta_bias, softplus if asked):

    h[b, d, n, l] = exp(dt[b, d, l] * A[d, n]) * h[b, d, n, l-1] + dt[b, d, l] * B[b, n, l] * u[b, d, l]
    y[b, d, l]    = sum_n C[b, n, l] * h[b, d, n, l]  (+ D[d] * u[b, d, l]) (* silu(z[b, d, l]))

Memory plan. The expanded state has batch * channels * states * length elements, a few GB for
one Mamba layer at training sizes, and an unfused scan also builds its coefficients and inputs
at that size. So the states are taken a chunk at a time: a chunk of k states builds its
(batch, channels, k, length) coefficients and inputs, scans them with linrec.linrec (every
(b, d, n) one contiguous row, the per-sequence kernels) and contracts them with C at once, and
only the (batch, channels, length) sum is kept. With gradients, each chunk is checkpointed: the
backward rebuilds and rescans its chunk (one more forward's work) instead of keeping its
expanded tensors, so what the backward holds is the inputs and the (batch, channels, length)
step sizes. The expanded tensors are float32 for 16-bit and float32 inputs (float64 for float64):
exp(dt * A) lies close to 1, where bfloat16 cannot tell 0.999 from 1.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .. import linrec as _linrec

# Expanded elements a chunk (batch * channels * states * length) when state_chunk is not given:
# 512 MB a float32 tensor, a few of which live while a chunk is built. Smaller chunks cost time:
# each adds passes over (batch, channels, length) tensors (its sum into y), which at one state a
# chunk made Mamba-1.4b's width (8 x 3072 x 16 x 2048, bf16) 37% slower forward on an H100.
DEFAULT_CHUNK_ELEMENTS = 1 << 27


def _grouped(name, t, batch, channels, length):
    """B or C as a 5-D view that broadcasts against (batch, groups, channels / groups, states, length).

    (channels, states) -> (1, 1, channels, states, 1), one group; (batch, states, length) ->
    (batch, 1, 1, states, length); (batch, groups, states, length) -> (batch, groups, 1, states, length).
    """
    if t.dim() == 2:
        if t.shape[0] != channels:
            raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels={channels}, states)")
        return t.view(1, 1, channels, t.shape[1], 1)
    if t.dim() == 3:
        t = t.unsqueeze(1)
    if t.dim() != 4 or t.shape[0] != batch or t.shape[-1] != length:
        raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels, states), (batch={batch}, "
                         f"states, length={length}) or (batch, groups, states, length)")
    if channels % t.shape[1]:
        raise ValueError(f"linrec: {name} has {t.shape[1]} groups, which do not divide channels={channels}")
    return t.unsqueeze(2)


def _scan_chunk(dt, dtu, A, B, C):
    """One chunk of k states: the (batch, channels, length) sum of C * h over them, and h's last step."""
    batch, channels, length = dt.shape
    k = A.shape[1]
    coeffs = torch.exp(dt.unsqueeze(2) * A.unsqueeze(-1))  # (batch, channels, k, length)
    groups_b, groups_c = B.shape[1], C.shape[1]
    inputs = (dtu.view(batch, groups_b, channels // groups_b, 1, length) * B).view(batch, channels, k, length)
    states = _linrec(inputs, coeffs, dim=-1)
    y = (states.view(batch, groups_c, channels // groups_c, k, length) * C).sum(3).view(batch, channels, length)
    return y, states[..., -1].clone()  # a copy: a view would keep the chunk's states alive


def _state_chunk(state_chunk, batch, channels, states, length):
    """States a chunk: the caller's, or as many as fit DEFAULT_CHUNK_ELEMENTS, spread evenly."""
    if state_chunk is not None:
        try:
            k = operator.index(state_chunk)
        except TypeError:
            raise ValueError(f"linrec: state_chunk must be a positive integer, got {type(state_chunk).__name__}") from None
        if k < 1:
            raise ValueError(f"linrec: state_chunk must be a positive integer, got {k}")
        return max(1, min(k, states))
    if states == 0:
        return 1
    fit = max(1, DEFAULT_CHUNK_ELEMENTS // max(1, batch * channels * length))
    chunks = math.ceil(states / min(fit, states))
    return math.ceil(states / chunks)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, *, state_chunk: int | None = None,
                   recompute: bool = True) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The selective scan of Mamba (S6), with the arguments of mamba_ssm's selective_scan_fn.

    Args:
        u: (batch, channels, length) inputs.
        delta: (batch, channels, length) step sizes.
        A: (channels, states) real state matrix (diagonal per channel; negative for decay).
        B, C: (channels, states), or input-dependent (batch, states, length) or (batch, groups,
            states, length) with groups dividing channels.
        D: optional (channels,) skip connection.
        z: optional (batch, channels, length) gate: the output is multiplied by silu(z).
        delta_bias: optional (channels,) added to delta.
        delta_softplus: apply softplus to delta (after the bias).
        return_last_state: also return the state after the last step, (batch, channels, states).
        state_chunk: states expanded at a time (default: as many as keep a chunk's expanded
            tensors within DEFAULT_CHUNK_ELEMENTS elements). Fewer use less memory and launch
            more, smaller scans.
        recompute: with gradients, rebuild each chunk's expanded tensors in the backward rather
            than keep them: the backward holds O(batch * channels * length) instead of
            O(batch * channels * states * length), for about one more forward's time.

    Returns:
        (batch, channels, length) in u's dtype, and the last state (float32, or float64 for
        float64 u) if asked.
        Differentiable in every tensor argument.
    """
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError("linrec: u must be a (batch, channels, length) tensor")
    batch, channels, length = u.shape
    t: torch.Tensor | None
    for name, t in (("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"linrec: {name} must be a tensor, got {type(t).__name__}")
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("delta_bias", delta_bias)):
        # An integer u would be cast and scanned as if it were real; A is checked for complex below.
        if isinstance(t, torch.Tensor) and not (t.is_floating_point() or (t.is_complex() and name == "A")):
            raise ValueError(f"linrec: {name} has dtype {t.dtype}; expected a floating dtype")
    if not isinstance(delta, torch.Tensor) or delta.shape != u.shape:
        raise ValueError(f"linrec: delta must have u's shape {tuple(u.shape)}")
    if A.dim() != 2 or A.shape[0] != channels:
        raise ValueError(f"linrec: A of shape {tuple(A.shape)} must be (channels={channels}, states)")
    if A.is_complex():
        raise ValueError("linrec: A must be real (complex state matrices are not supported)")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None and t.shape != (channels,):
            raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels={channels},)")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"linrec: z must have u's shape {tuple(u.shape)}")
    states = A.shape[1]
    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    Bg = _grouped("B", B.to(acc), batch, channels, length)
    Cg = _grouped("C", C.to(acc), batch, channels, length)
    k = _state_chunk(state_chunk, batch, channels, states, length)

    dt = delta.to(acc)
    if delta_bias is not None:
        dt = dt + delta_bias.to(acc).unsqueeze(-1)
    if delta_softplus:
        dt = F.softplus(dt)
    dtu = dt * u.to(acc)
    A = A.to(acc)

    y, last = None, []
    if length:
        for s in range(0, states, k):
            chunk = (dt, dtu, A[:, s:s + k], Bg[:, :, :, s:s + k], Cg[:, :, :, s:s + k])
            if recompute and torch.is_grad_enabled():
                y_k, last_k = checkpoint(_scan_chunk, *chunk, use_reentrant=False)
            else:
                y_k, last_k = _scan_chunk(*chunk)
            y = y_k if y is None else y + y_k
            last.append(last_k)
    if y is None:  # no steps, or no states
        y = torch.zeros(batch, channels, length, dtype=acc, device=u.device)
    if D is not None:
        y = y + D.to(acc).unsqueeze(-1) * u.to(acc)
    if z is not None:
        y = y * F.silu(z.to(acc))
    y = y.to(u.dtype)
    if not return_last_state:
        return y
    return y, torch.cat(last, 2) if last else y.new_zeros(batch, channels, states, dtype=acc)
