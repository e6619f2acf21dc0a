"""Reference implementations in plain PyTorch.

linrec_ref walks the sequence in a Python loop: obviously correct, slow.
linrec_hop computes the same with torch's associative_scan higher-order op over
pairs (c, y) combined as (c1, y1) . (c2, y2) = (c1 * c2, c2 * y1 + y2). Its
backward is written out (an autograd.Function), because autograd through the
HOP costs O(L^2).

Both compute 16-bit storage in float32, as the kernels do: a bfloat16 state
stops growing once a step adds less than half its last bit (ones decayed by
0.99609375 stalled at 128, not 250.9).
"""

from __future__ import annotations

import torch

from .._args import MIXED_VALUE_DTYPES, normalize


def _in_arithmetic_dtype(inputs, coeffs, initial):
    """inputs, coeffs and initial in the dtype the recurrence is computed in: float32 for 16-bit
    storage (mixed or not), the inputs' own otherwise. Casts are differentiable."""
    dtype = torch.float32 if inputs.dtype in MIXED_VALUE_DTYPES else inputs.dtype
    return inputs.to(dtype), coeffs.to(dtype), None if initial is None else initial.to(dtype)


def _empty_result(inputs, coeffs):
    """The result of a scan with no element, connected to autograd like a scan's."""
    return (inputs * coeffs).to(inputs.dtype)


def linrec_ref(inputs: torch.Tensor, coeffs: torch.Tensor | float | complex, reverse: bool = False, *, dim: int = -1,
               initial: torch.Tensor | float | complex | None = None) -> torch.Tensor:
    """y[l] = coeffs[l] * y[l-1] + inputs[l] along dim, one step at a time (complex too), in
    float32 for 16-bit storage; the outputs are in inputs' dtype. Non-finite values propagate as
    IEEE arithmetic does in this loop."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True)
    if inputs.numel() == 0:
        return _empty_result(inputs, coeffs)
    x, c, initial = _in_arithmetic_dtype(inputs, coeffs, initial)
    x, c = x.movedim(dim, -1), c.movedim(dim, -1)
    state = torch.zeros_like(x[..., 0]) if initial is None else initial
    steps = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    outputs: list = [None] * x.shape[-1]
    for l in steps:
        state = c[..., l] * state + x[..., l]
        outputs[l] = state
    return torch.stack(outputs, dim=-1).movedim(-1, dim).to(inputs.dtype)


def _combine(left, right):
    c1, y1 = left
    c2, y2 = right
    return c1 * c2, c2 * y1 + y2


def _scan(x, c, dim, reverse):
    from torch._higher_order_ops.associative_scan import associative_scan

    _, y = associative_scan(_combine, (c, x), dim, reverse=reverse, combine_mode="generic")
    return y


def _fold_initial(x, c, initial, dim, reverse):
    """Fold the initial state into the first step: x[first] + c[first] * initial."""
    n = x.shape[dim]
    if initial is None or n == 0:
        return x
    head = x.narrow(dim, n - 1 if reverse else 0, 1) + c.narrow(dim, n - 1 if reverse else 0, 1) * initial.unsqueeze(dim)
    if reverse:
        return torch.cat([x.narrow(dim, 0, n - 1), head], dim)
    return torch.cat([head, x.narrow(dim, 1, n - 1)], dim)


class _HopScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, c, initial, dim, reverse):
        y = _scan(_fold_initial(x, c, initial, dim, reverse), c, dim, reverse)
        ctx.save_for_backward(c, y, initial)
        ctx.dim, ctx.reverse = dim, reverse
        return y

    @staticmethod
    def backward(ctx, dy):
        from .._autograd import backward_by_scans

        c, y, initial = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate again
            scan = lambda x, cs, d, r: _HopScan.apply(x, cs, None, d, r)  # noqa: E731
        else:
            scan = lambda x, cs, d, r: _scan(x.contiguous(), cs, d, r)  # noqa: E731
        return *backward_by_scans(scan, dy, c, y, initial, ctx.dim, ctx.reverse), None, None


def linrec_hop(inputs: torch.Tensor, coeffs: torch.Tensor | float, reverse: bool = False, *, dim: int = -1,
               initial: torch.Tensor | float | None = None) -> torch.Tensor:
    """linrec with torch._higher_order_ops.associative_scan for the forward and backward scans.

    With an infinite coefficient it runs linrec_ref's loop instead: the scan regroups
    c2 * (c1 * y + x1) as c2 * c1 * y + c2 * x1, which gives inf - inf = NaN where the loop's
    IEEE arithmetic gives +-inf (the behaviour every implementation documents)."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse)
    if inputs.numel() == 0:  # associative_scan rejects empty scans and empty batches
        return _empty_result(inputs, coeffs)
    if torch.isinf(coeffs).any():
        return linrec_ref(inputs, coeffs, reverse, dim=dim, initial=initial)
    x, c, initial = _in_arithmetic_dtype(inputs, coeffs, initial)
    return _HopScan.apply(x, c, initial, dim, reverse).to(inputs.dtype)
