"""Reference implementations in plain PyTorch.

linrec_ref walks the sequence in a Python loop: obviously correct, slow.
linrec_hop computes the same with torch's associative_scan higher-order op over
pairs (c, y) combined as (c1, y1) . (c2, y2) = (c1 * c2, c2 * y1 + y2). Its
backward is written out (an autograd.Function), because autograd through the
HOP costs O(L^2).
"""

from __future__ import annotations

import torch

from .._args import normalize


def linrec_ref(inputs, coeffs, reverse=False, *, dim=-1, initial=None):
    """y[l] = coeffs[l] * y[l-1] + inputs[l] along dim, one step at a time (complex too). The state
    takes the wider of the two dtypes (float32 beside 16-bit inputs in mixed storage) and the
    outputs are in inputs' dtype."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True)
    x = inputs.movedim(dim, -1)
    c = coeffs.movedim(dim, -1)
    if x.shape[-1] == 0:
        return torch.empty_like(inputs)
    state = torch.zeros_like(x[..., 0]) if initial is None else initial
    steps = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    outputs = [None] * x.shape[-1]
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
        from .._ops import backward_by_scans

        c, y, initial = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate again
            scan = lambda x, cs, d, r: _HopScan.apply(x, cs, None, d, r)  # noqa: E731
        else:
            scan = lambda x, cs, d, r: _scan(x.contiguous(), cs, d, r)  # noqa: E731
        return *backward_by_scans(scan, dy, c, y, initial, ctx.dim, ctx.reverse), None, None


def linrec_hop(inputs, coeffs, reverse=False, *, dim=-1, initial=None):
    """linrec with torch._higher_order_ops.associative_scan for the forward and backward scans."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse)
    if inputs.shape[dim] == 0:  # associative_scan rejects empty scans
        return (inputs * coeffs).to(inputs.dtype)
    if coeffs.dtype != inputs.dtype:  # mixed storage: one dtype through the scan, float32
        initial = None if initial is None else initial.to(coeffs.dtype)
        return _HopScan.apply(inputs.to(coeffs.dtype), coeffs, initial, dim, reverse).to(inputs.dtype)
    return _HopScan.apply(inputs, coeffs, initial, dim, reverse)
