"""The independent reference: a sequential float64 loop written here, not in linrec.

Gradients come from torch autograd through this loop.
"""

import torch


def reference(inputs, coeffs, reverse=False, dim=-1, initial=None):
    """y[l] = c[l] * y[l-1] + x[l] along dim, in float64, with standard broadcasting of coeffs/initial."""
    x = inputs.double()
    c = torch.as_tensor(coeffs, dtype=torch.float64, device=x.device).expand(x.shape)
    dim = dim % x.dim()
    x, c = x.movedim(dim, -1), c.movedim(dim, -1)
    state = torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    if initial is not None:
        state = state + initial.double()
    outs = [None] * x.shape[-1]
    order = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    for l in order:
        state = c[..., l] * state + x[..., l]
        outs[l] = state
    if not outs:
        return torch.empty(inputs.shape, dtype=torch.float64, device=x.device)
    return torch.stack(outs, -1).movedim(-1, dim)


def rel_error(out, ref):
    """||out - ref|| / ||ref||, in float64; NaN anywhere fails any tolerance."""
    out, ref = out.double(), ref.double()
    if out.numel() == 0:
        return 0.0
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
