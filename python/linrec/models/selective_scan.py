"""Mamba's selective (S6) scan as one linear recurrence over an expanded state.

For every batch b, channel d and state n, with dt = delta (+ delta_bias, softplus if asked):

    h[b, d, n, l] = exp(dt[b, d, l] * A[d, n]) * h[b, d, n, l-1] + dt[b, d, l] * B[b, n, l] * u[b, d, l]
    y[b, d, l]    = sum_n C[b, n, l] * h[b, d, n, l]  (+ D[d] * u[b, d, l]) (* silu(z[b, d, l]))

The state is laid out (batch, channels, states, length), so every (b, d, n) is one contiguous
row and linrec.linrec scans it with the per-sequence kernels. Unfused: the expanded inputs,
coefficients and states are materialized (batch * channels * states * length float32 elements
each), which costs memory that a fused kernel (mamba_ssm's) does not; gradients come from
linrec's fused backward and autograd through the surrounding element-wise ops. The expanded
tensors are float32 for 16-bit and float32 inputs (float64 for float64): exp(dt * A) lies close
to 1, where bfloat16 cannot tell 0.999 from 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import linrec as _linrec


def _expand_input_dependent(name, t, batch, channels, length):
    """B or C as (batch, channels, states, length), or (1, channels, states, 1) for (channels, states)."""
    if t.dim() == 2:
        if t.shape[0] != channels:
            raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels={channels}, states)")
        return t.unsqueeze(0).unsqueeze(-1)
    if t.dim() == 3:
        t = t.unsqueeze(1)  # (batch, 1 group, states, length)
    if t.dim() != 4 or t.shape[0] != batch or t.shape[-1] != length:
        raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels, states), (batch={batch}, "
                         f"states, length={length}) or (batch, groups, states, length)")
    groups = t.shape[1]
    if channels % groups:
        raise ValueError(f"linrec: {name} has {groups} groups, which do not divide channels={channels}")
    return t.repeat_interleave(channels // groups, dim=1)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False):
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

    Returns:
        (batch, channels, length) in u's dtype, and the last state (float32, or float64 for
        float64 u) if asked.
        Differentiable in every tensor argument.
    """
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError("linrec: u must be a (batch, channels, length) tensor")
    batch, channels, length = u.shape
    for name, t in (("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"linrec: {name} must be a tensor, got {type(t).__name__}")
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

    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    dt = delta.to(acc)
    if delta_bias is not None:
        dt = dt + delta_bias.to(acc).unsqueeze(-1)
    if delta_softplus:
        dt = F.softplus(dt)
    Bx = _expand_input_dependent("B", B.to(acc), batch, channels, length)
    Cx = _expand_input_dependent("C", C.to(acc), batch, channels, length)
    coeffs = torch.exp(dt.unsqueeze(2) * A.to(acc).unsqueeze(-1))  # (batch, channels, states, length)
    inputs = (dt * u.to(acc)).unsqueeze(2) * Bx
    states = _linrec(inputs, coeffs, dim=-1)
    y = (states * Cx).sum(2)
    if D is not None:
        y = y + D.to(acc).unsqueeze(-1) * u.to(acc)
    if z is not None:
        y = y * F.silu(z.to(acc))
    y = y.to(u.dtype)
    if not return_last_state:
        return y
    return y, states[..., -1] if length else states.new_zeros(batch, channels, A.shape[1])
