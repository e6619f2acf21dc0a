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


def reference_chunked(inputs, coeffs, reverse=False, initial=None, chunk=4096):
    """The float64 reference along the last dim for long sequences, in two levels:
    a sequential loop inside chunks (all chunks at once), then the carries passed
    from chunk to chunk sequentially, then each element corrected by
    (cumulative coefficient within its chunk) * (carry into its chunk).
    Checked against `reference` in test_cpu.py."""
    x = inputs.double()
    c = torch.as_tensor(coeffs, dtype=torch.float64, device=x.device).expand(x.shape)
    if reverse:
        x, c = x.flip(-1), c.flip(-1)
    *batch, length = x.shape
    pad = (-length) % chunk
    x = torch.nn.functional.pad(x, (0, pad))
    c = torch.nn.functional.pad(c, (0, pad), value=1.0)
    n = x.shape[-1] // chunk
    xc, cc = x.reshape(*batch, n, chunk), c.reshape(*batch, n, chunk)
    local = torch.empty_like(xc)
    cum = torch.empty_like(cc)
    state = torch.zeros(xc.shape[:-1], dtype=torch.float64, device=x.device)
    prod = torch.ones_like(state)
    for l in range(chunk):
        state = cc[..., l] * state + xc[..., l]
        prod = prod * cc[..., l]
        local[..., l], cum[..., l] = state, prod
    carry = torch.zeros(batch, dtype=torch.float64, device=x.device)
    if initial is not None:
        carry = carry + initial.double()
    carries = torch.empty(xc.shape[:-1], dtype=torch.float64, device=x.device)
    for k in range(n):
        carries[..., k] = carry
        carry = cum[..., k, -1] * carry + local[..., k, -1]
    y = (local + cum * carries.unsqueeze(-1)).reshape(*batch, n * chunk)[..., :length]
    return y.flip(-1) if reverse else y


def reference_with_grads(inputs, coeffs, d_outputs, reverse=False, dim=-1, initial=None, chunk=None):
    """Outputs and gradients (d_inputs, d_coeffs, d_initial) along dim, in float64, for long
    scans where autograd through `reference` takes seconds. The gradients come from the adjoint
    recurrence, not autograd: d_inputs is the recurrence of d_outputs run the other way with each
    coefficient one step later; d_coeffs = d_inputs * (the output one step earlier, the initial
    state before the first); d_initial = d_inputs * coeffs at the first step. Coefficients of the
    inputs' full shape. Checked against autograd through `reference` in test_cpu.py."""
    x = inputs.double().movedim(dim, -1)
    c = coeffs.double().movedim(dim, -1)
    g = d_outputs.double().movedim(dim, -1)
    h0 = torch.zeros(x.shape[:-1], dtype=torch.float64, device=x.device)
    if initial is not None:
        h0 = h0 + initial.double()
    if reverse:
        x, c, g = x.flip(-1), c.flip(-1), g.flip(-1)
    chunk = chunk or max(64, int(x.shape[-1] ** 0.5))
    y = reference_chunked(x, c, False, h0, chunk)
    c_next = torch.cat([c[..., 1:], torch.zeros_like(c[..., :1])], -1)
    dx = reference_chunked(g, c_next, True, None, chunk)
    dc = dx * torch.cat([h0.unsqueeze(-1), y[..., :-1]], -1)
    dh0 = dx[..., 0] * c[..., 0]
    if reverse:
        y, dx, dc = y.flip(-1), dx.flip(-1), dc.flip(-1)
    return y.movedim(-1, dim), dx.movedim(-1, dim), dc.movedim(-1, dim), dh0


def poison(device, nbytes):
    """On CUDA, leave NaN-filled free blocks of about nbytes in the caching allocator, so that an
    output element a kernel fails to write reads NaN, not an earlier test's right answer."""
    if str(device).startswith("cuda"):
        blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), device=device) for _ in range(6)]
        del blocks
