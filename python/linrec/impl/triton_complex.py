"""Triton kernels for complex recurrences (complex64 / complex128), forward and fused backward.

The math is triton.py's with complex arithmetic: a step is the pair (c, x), two steps compose as
(c1, x1) then (c2, x2) = (c1 c2, c2 x1 + x2), and tl.associative_scan runs over the four real
planes (Re c, Im c, Re x, Im x). The backward (PyTorch's conjugate convention) scans the
d_outputs against the forward direction with the conjugated coefficients one forward step later,
then d_coeffs = d_inputs * conj(outputs one forward step earlier) and d_initial = conj(c[first]) *
d_inputs[first].

The memory plan is triton.py's pipe: a program walks its sequence in blocks of BLOCK elements
with the carry between them, sequences addressed by two batch strides and an element stride.
Where neighbouring sequences lie next to each other (channel-last data), a program takes CH of
them as the columns of [BLOCK, CH] blocks scanned along axis 0, so that each row is one read.
Complex tensors reach the kernels as their float views (torch.view_as_real): real parts at even
offsets, imaginary parts one element after, strides doubled; the ops take and return those views
(complex_fwd and complex_bwd wrap them for complex tensors). linrec/_complex.py decides when these
kernels run; the ops carry no autograd of their own.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ._device import on_device_of
from .triton import _block_configs, _bwd_outputs, _strides, _write_back


@triton.jit
def _cmul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


@triton.jit
def _combine(cr1, ci1, xr1, xi1, cr2, ci2, xr2, xi2):
    cr, ci = _cmul(cr1, ci1, cr2, ci2)
    tr, ti = _cmul(cr2, ci2, xr1, xi1)
    return cr, ci, tr + xr2, ti + xi2


@triton.jit
def _last(v, offs, BLOCK: tl.constexpr):
    """The block's last row, [1, CH]."""
    return tl.sum(tl.where((offs == BLOCK - 1)[:, None], v, 0.0), axis=0, keep_dims=True)


@triton.jit
def _sequences(pid, n_inner, CH: tl.constexpr):
    """This program's outer index and its CH inner sequences (and which of them exist)."""
    n_chunks = tl.cdiv(n_inner, CH)
    inner = (pid % n_chunks) * CH + tl.arange(0, CH)
    return (pid // n_chunks).to(tl.int64), inner.to(tl.int64), inner < n_inner


@triton.jit
def _initial_state(h0_ptr, outer, inner, sh0, sh1, seq_ok, HAS_INITIAL: tl.constexpr, CH: tl.constexpr):
    """The state entering the program's sequences as (real, imaginary) rows [1, CH]; 0 without one."""
    state_r = tl.zeros([1, CH], dtype=h0_ptr.dtype.element_ty)
    state_i = tl.zeros([1, CH], dtype=h0_ptr.dtype.element_ty)
    if HAS_INITIAL:
        h0 = h0_ptr + outer * sh0 + inner * sh1
        state_r += tl.load(h0, mask=seq_ok, other=0.0)[None, :]
        state_i += tl.load(h0 + 1, mask=seq_ok, other=0.0)[None, :]
    return state_r, state_i


@triton.jit
def _cfwd_kernel(x_ptr, c_ptr, y_ptr, h0_ptr, L, n_inner,
                 sx0, sx1, sxl, sc0, sc1, scl, sy0, sy1, syl, sh0, sh1,
                 HAS_INITIAL: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr, CH: tl.constexpr):
    outer, inner, seq_ok = _sequences(tl.program_id(0), n_inner, CH)
    x_seq = x_ptr + outer * sx0 + inner * sx1  # [CH] sequence starts
    c_seq = c_ptr + outer * sc0 + inner * sc1
    y_seq = y_ptr + outer * sy0 + inner * sy1
    offs = tl.arange(0, BLOCK)
    carry_r, carry_i = _initial_state(h0_ptr, outer, inner, sh0, sh1, seq_ok, HAS_INITIAL, CH)
    for b in range(0, tl.cdiv(L, BLOCK)):
        i = b * BLOCK + offs  # logical positions
        mask = (i < L)[:, None] & seq_ok[None, :]
        l = (L - 1 - i if REVERSE else i).to(tl.int64)[:, None]
        xr = tl.load(x_seq[None, :] + l * sxl, mask=mask, other=0.0)
        xi = tl.load(x_seq[None, :] + l * sxl + 1, mask=mask, other=0.0)
        cr = tl.load(c_seq[None, :] + l * scl, mask=mask, other=1.0)
        ci = tl.load(c_seq[None, :] + l * scl + 1, mask=mask, other=0.0)
        pr, pi, yr, yi = tl.associative_scan((cr, ci, xr, xi), axis=0, combine_fn=_combine)
        er, ei = _cmul(pr, pi, carry_r, carry_i)  # the state entering the block, carried through
        yr += er
        yi += ei
        tl.store(y_seq[None, :] + l * syl, yr, mask=mask)
        tl.store(y_seq[None, :] + l * syl + 1, yi, mask=mask)
        carry_r = _last(yr, offs, BLOCK)
        carry_i = _last(yi, offs, BLOCK)


@triton.jit
def _cbwd_kernel(dy_ptr, c_ptr, y_ptr, h0_ptr, dx_ptr, dc_ptr, dh0_ptr, L, n_inner,
                 sg0, sg1, sgl, sc0, sc1, scl, sy0, sy1, syl, sh0, sh1,
                 sdx0, sdx1, sdxl, sdc0, sdc1, sdcl, sdh0, sdh1,
                 HAS_INITIAL: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr, CH: tl.constexpr):
    outer, inner, seq_ok = _sequences(tl.program_id(0), n_inner, CH)
    g_seq = (dy_ptr + outer * sg0 + inner * sg1)[None, :]
    c_seq = (c_ptr + outer * sc0 + inner * sc1)[None, :]
    y_seq = (y_ptr + outer * sy0 + inner * sy1)[None, :]
    dx_seq = (dx_ptr + outer * sdx0 + inner * sdx1)[None, :]
    dc_seq = (dc_ptr + outer * sdc0 + inner * sdc1)[None, :]
    offs = tl.arange(0, BLOCK)
    init_r, init_i = _initial_state(h0_ptr, outer, inner, sh0, sh1, seq_ok, HAS_INITIAL, CH)
    step = -1 if REVERSE else 1  # one step later in the forward direction, in memory
    carry_r = tl.zeros([1, CH], dtype=dy_ptr.dtype.element_ty)
    carry_i = tl.zeros([1, CH], dtype=dy_ptr.dtype.element_ty)
    for b in range(0, tl.cdiv(L, BLOCK)):
        i = b * BLOCK + offs  # logical positions of the backward scan
        in_block = (i < L)[:, None]
        mask = in_block & seq_ok[None, :]
        l = (i if REVERSE else L - 1 - i).to(tl.int64)[:, None]
        gr = tl.load(g_seq + l * sgl, mask=mask, other=0.0)
        gi = tl.load(g_seq + l * sgl + 1, mask=mask, other=0.0)
        nxt = l + step
        nxt_ok = mask & (nxt >= 0) & (nxt < L)
        # conj(c) one forward step later: 0 past the sequence's end, 1 (the identity) past the block's
        cnr = tl.where(in_block, tl.load(c_seq + nxt * scl, mask=nxt_ok, other=0.0), 1.0)
        cni = -tl.load(c_seq + nxt * scl + 1, mask=nxt_ok, other=0.0)
        pr, pi, dxr, dxi = tl.associative_scan((cnr, cni, gr, gi), axis=0, combine_fn=_combine)
        er, ei = _cmul(pr, pi, carry_r, carry_i)
        dxr += er
        dxi += ei
        prv = l - step
        prv_ok = mask & (prv >= 0) & (prv < L)
        ypr = tl.where(prv_ok, tl.load(y_seq + prv * syl, mask=prv_ok, other=0.0), init_r)
        ypi = tl.where(prv_ok, tl.load(y_seq + prv * syl + 1, mask=prv_ok, other=0.0), init_i)
        tl.store(dx_seq + l * sdxl, dxr, mask=mask)
        tl.store(dx_seq + l * sdxl + 1, dxi, mask=mask)
        tl.store(dc_seq + l * sdcl, dxr * ypr + dxi * ypi, mask=mask)  # d_inputs * conj(y_prev)
        tl.store(dc_seq + l * sdcl + 1, dxi * ypr - dxr * ypi, mask=mask)
        carry_r = _last(dxr, offs, BLOCK)
        carry_i = _last(dxi, offs, BLOCK)
    # After the last block the carry is d_inputs at the forward direction's first step.
    c_first = c_ptr + outer * sc0 + inner * sc1
    if REVERSE:
        c_first += (L - 1).to(tl.int64) * scl
    cfr = tl.load(c_first, mask=seq_ok, other=0.0)[None, :]
    cfi = tl.load(c_first + 1, mask=seq_ok, other=0.0)[None, :]
    dh0 = (dh0_ptr + outer * sdh0 + inner * sdh1)[None, :]
    tl.store(dh0, carry_r * cfr + carry_i * cfi, mask=seq_ok[None, :])  # carry * conj(c[first])
    tl.store(dh0 + 1, carry_i * cfr - carry_r * cfi, mask=seq_ok[None, :])


def _channel_configs():
    """Blocks of time steps for CH neighbouring sequences a program (channel-last data)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"BLOCK": 16}, num_warps=4)]
    return [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 4), (64, 4), (128, 8), (256, 8))]


# Sequences stored as rows take one a program (CH = 1) and long blocks; sequences whose
# neighbours lie next to each other in memory (channel-last) take up to CHANNELS a program, so
# that a block's row of them is one contiguous read, and fewer where that would leave fewer than
# PROGRAMS_PER_SM programs an SM (each program walks its sequences' whole length).
CHANNELS = 32
PROGRAMS_PER_SM = 4
_cfwd_rows = triton.autotune(configs=_block_configs(), key=["L"])(_cfwd_kernel)
_cbwd_rows = triton.autotune(configs=_block_configs(), key=["L"])(_cbwd_kernel)
_cfwd_channels = triton.autotune(configs=_channel_configs(), key=["L", "CH"])(_cfwd_kernel)
_cbwd_channels = triton.autotune(configs=_channel_configs(), key=["L", "CH"])(_cbwd_kernel)


def _launch(rows_kernel, channels_kernel, seqs, args, flags):
    """seqs: an (outer, inner, L, 2) float view; channel-last when neighbouring inner sequences
    are one complex element apart and the steps are not."""
    outer, inner = seqs.shape[0], seqs.shape[1]
    if seqs.stride(1) == 2 and seqs.stride(2) != 2 and inner > 1:
        ch = min(CHANNELS, triton.next_power_of_2(inner))
        if seqs.is_cuda:
            sms = torch.cuda.get_device_properties(seqs.device).multi_processor_count
            while ch > 2 and outer * triton.cdiv(inner, ch) < PROGRAMS_PER_SM * sms:
                ch //= 2
        with on_device_of(seqs):
            wrap_triton(channels_kernel)[(outer * triton.cdiv(inner, ch),)](*args, **flags, CH=ch)
    else:
        with on_device_of(seqs):
            wrap_triton(rows_kernel)[(outer * inner,)](*args, **flags, CH=1)


def _planes(t: torch.Tensor, dim: int, state: bool = False):
    """A complex tensor's float view (..., 2) as (outer, inner[, L], 2), and whether that is a view
    (a copy otherwise, see triton.py's _write_back)."""
    if not state:
        t = t.movedim(dim, -2)
    batch = t.shape[:-1] if state else t.shape[:-2]
    shape = (-1, batch[-1] if batch else 1, *(() if state else t.shape[-2:-1]), 2)
    try:
        return t.view(shape), True
    except RuntimeError:
        return t.reshape(shape), False


# The ops take and return the float views of complex tensors (torch.view_as_real, a trailing dim
# of 2), with `dim` counted among the complex dims: inductor does not lower complex tensors.


@triton_op("linrec::triton_complex_fwd", mutates_args={})
def triton_complex_fwd(inputs: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None, dim: int,
                       reverse: bool) -> torch.Tensor:
    outputs = torch.empty_like(inputs)
    L = inputs.shape[dim]
    if inputs.numel() == 0:
        return outputs
    (x, _), (c, _), (y, y_is_view) = (_planes(t, dim) for t in (inputs, coeffs, outputs))
    h0 = _planes(initial, dim, state=True)[0] if initial is not None else x[:, :, 0]
    args = (x, c, y, h0, L, x.shape[1], *_strides((x, c, y), 3), *_strides((h0,), 2))
    _launch(_cfwd_rows, _cfwd_channels, x, args, dict(HAS_INITIAL=initial is not None, REVERSE=reverse))
    _write_back([(outputs.movedim(dim, -2), y, y_is_view)])
    return outputs


@triton_op("linrec::triton_complex_bwd", mutates_args={})
def triton_complex_bwd(d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor,
                       initial: torch.Tensor | None, dim: int,
                       reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_inputs, d_coeffs, d_initial, nothing_to_scan = _bwd_outputs(d_outputs, dim, coeffs.dtype)
    if nothing_to_scan:
        return d_inputs, d_coeffs, d_initial
    L = d_outputs.shape[dim]
    (g, _), (c, _), (y, _), (dx, dx_is_view), (dc, dc_is_view) = (
        _planes(t, dim) for t in (d_outputs, coeffs, outputs, d_inputs, d_coeffs))
    dh0, dh0_is_view = _planes(d_initial, dim, state=True)
    h0 = _planes(initial, dim, state=True)[0] if initial is not None else dh0
    args = (g, c, y, h0, dx, dc, dh0, L, g.shape[1], *_strides((g, c, y), 3), *_strides((h0,), 2),
            *_strides((dx, dc), 3), *_strides((dh0,), 2))
    _launch(_cbwd_rows, _cbwd_channels, g, args, dict(HAS_INITIAL=initial is not None, REVERSE=reverse))
    _write_back([(d_inputs.movedim(dim, -2), dx, dx_is_view), (d_coeffs.movedim(dim, -2), dc, dc_is_view),
                 (d_initial, dh0, dh0_is_view)])
    return d_inputs, d_coeffs, d_initial


def _real(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.view_as_real(t.resolve_conj())


def complex_fwd(inputs: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None, dim: int,
                reverse: bool) -> torch.Tensor:
    """triton_complex_fwd on complex tensors."""
    return torch.view_as_complex(triton_complex_fwd(_real(inputs), _real(coeffs), _real(initial), dim, reverse))


def complex_bwd(d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, initial: torch.Tensor | None,
                dim: int, reverse: bool) -> tuple[torch.Tensor, ...]:
    """triton_complex_bwd on complex tensors: (d_inputs, d_coeffs, d_initial)."""
    grads = triton_complex_bwd(_real(d_outputs), _real(coeffs), _real(outputs), _real(initial), dim, reverse)
    return tuple(torch.view_as_complex(g) for g in grads)
