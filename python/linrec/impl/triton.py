"""Triton implementations: linrec_tile and linrec_pipe, registered as torch.library.triton_op.

The math. A step of the recurrence y <- c * y + x is the pair (c, x); two steps
compose as (c1, x1) then (c2, x2) = (c1 * c2, c2 * x1 + x2), which is
associative, so tl.associative_scan over the pairs of a block gives every
prefix: the scanned x is y (with the state entering the block at zero) and the
scanned c is the product of the coefficients so far. The state that did enter,
`carry`, then adds as y += cumprod(c) * carry.

The memory plan. One program per sequence. `tile` loads the whole sequence as
one block (at most MAX_TILE elements); `pipe` walks blocks of BLOCK elements in
scan order with the carry between them. Reverse scans visit memory from the end:
logical position i sits at l = L - 1 - i. Sequences are addressed through two
batch strides and one element stride per tensor, so views, broadcast (stride-0)
coefficients and any `dim` run without copies. The backward is one fused kernel
(reads d_outputs, coeffs, outputs; writes d_inputs, d_coeffs): the same scan
against the forward direction over d_outputs, with the coefficients one forward
step later, then d_coeffs = d_inputs * (outputs one forward step earlier).
Arithmetic is float64 for float64 storage, float32 otherwise. With LOG_COEFFS the
coefficient tensor holds log c: each load takes exp, and d_coeffs is that of log c,
c * d_coeffs (c loaded once more, at the step itself). With HAS_CUTS (packed sequences),
a flag a step: the coefficient of a flagged step is 0, and so is its gradient.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .._args import normalize
from .._autograd import backward_by_scans, refuse_torch_func
from .._dispatch import log_or_exp
from ._device import on_device_of

MAX_TILE = 16384


def _block_configs():
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config: the interpreter is slow
        return [triton.Config({"BLOCK": 64}, num_warps=4)]
    return [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (2048, 8), (4096, 8), (8192, 16))]


@triton.jit
def _combine(c1, x1, c2, x2):
    return c1 * c2, c2 * x1 + x2


@triton.jit
def _widen(x):
    # The arithmetic type by promotion: float64 stays float64, 16-bit and float32 become float32.
    return x + tl.zeros(x.shape, dtype=tl.float32)


@triton.jit
def _seq_base(pid, n_inner, s_outer, s_inner):
    return (pid // n_inner).to(tl.int64) * s_outer + (pid % n_inner).to(tl.int64) * s_inner


@triton.jit
def _fwd_kernel(x_ptr, c_ptr, y_ptr, h0_ptr, cuts_ptr, L, n_inner,
                sx0, sx1, sxl, sc0, sc1, scl, sy0, sy1, syl, sh0, sh1,
                HAS_INITIAL: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr,
                PIPE: tl.constexpr, LOG_COEFFS: tl.constexpr, HAS_CUTS: tl.constexpr):
    pid = tl.program_id(0)
    x_ptr += _seq_base(pid, n_inner, sx0, sx1)
    c_ptr += _seq_base(pid, n_inner, sc0, sc1)
    y_ptr += _seq_base(pid, n_inner, sy0, sy1)
    offs = tl.arange(0, BLOCK)
    carry = _widen(tl.zeros([1], dtype=x_ptr.dtype.element_ty))
    if HAS_INITIAL:
        carry += _widen(tl.load(h0_ptr + _seq_base(pid, n_inner, sh0, sh1) + tl.zeros([1], dtype=tl.int32)))
    num_blocks = tl.cdiv(L, BLOCK) if PIPE else 1
    for b in range(0, num_blocks):
        i = b * BLOCK + offs  # logical positions
        mask = i < L
        l = (L - 1 - i if REVERSE else i).to(tl.int64)
        x = _widen(tl.load(x_ptr + l * sxl, mask=mask, other=0.0))
        c = _widen(tl.load(c_ptr + l * scl, mask=mask, other=0.0 if LOG_COEFFS else 1.0))
        if LOG_COEFFS:  # coeffs holds log c (exp(0) = 1 past the end)
            c = tl.exp(c)
        if HAS_CUTS:  # a segment begins at l: the recurrence is cut there
            c = tl.where(tl.load(cuts_ptr + l, mask=mask, other=0) != 0, 0.0, c)
        cum_c, y = tl.associative_scan((c, x), axis=0, combine_fn=_combine)
        y = y + cum_c * carry
        tl.store(y_ptr + l * syl, y.to(y_ptr.dtype.element_ty), mask=mask)
        carry = tl.sum(tl.where(offs == BLOCK - 1, y, 0.0), axis=0, keep_dims=True)


@triton.jit
def _bwd_kernel(dy_ptr, c_ptr, y_ptr, h0_ptr, dx_ptr, dc_ptr, dh0_ptr, cuts_ptr, L, n_inner,
                sg0, sg1, sgl, sc0, sc1, scl, sy0, sy1, syl, sh0, sh1,
                sdx0, sdx1, sdxl, sdc0, sdc1, sdcl, sdh0, sdh1,
                HAS_INITIAL: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr,
                PIPE: tl.constexpr, LOG_COEFFS: tl.constexpr, HAS_CUTS: tl.constexpr):
    pid = tl.program_id(0)
    dy_ptr += _seq_base(pid, n_inner, sg0, sg1)
    c_ptr += _seq_base(pid, n_inner, sc0, sc1)
    y_ptr += _seq_base(pid, n_inner, sy0, sy1)
    dx_ptr += _seq_base(pid, n_inner, sdx0, sdx1)
    dc_ptr += _seq_base(pid, n_inner, sdc0, sdc1)
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros([1], dtype=tl.int32)
    initial = _widen(tl.zeros([1], dtype=dy_ptr.dtype.element_ty))
    if HAS_INITIAL:
        initial += _widen(tl.load(h0_ptr + _seq_base(pid, n_inner, sh0, sh1) + zero))
    step = -1 if REVERSE else 1  # one step later in the forward direction, in memory
    carry = _widen(tl.zeros([1], dtype=dy_ptr.dtype.element_ty))
    num_blocks = tl.cdiv(L, BLOCK) if PIPE else 1
    for b in range(0, num_blocks):
        i = b * BLOCK + offs  # logical positions of the backward scan
        mask = i < L
        l = (i if REVERSE else L - 1 - i).to(tl.int64)
        nxt = l + step
        nxt_ok = mask & (nxt >= 0) & (nxt < L)
        g = _widen(tl.load(dy_ptr + l * sgl, mask=mask, other=0.0))
        c_next = _widen(tl.load(c_ptr + nxt * scl, mask=nxt_ok, other=0.0))
        if LOG_COEFFS:
            c_next = tl.where(nxt_ok, tl.exp(c_next), 0.0)
        if HAS_CUTS:
            c_next = tl.where(tl.load(cuts_ptr + nxt, mask=nxt_ok, other=0) != 0, 0.0, c_next)
        c_next = tl.where(mask, c_next, 1.0)
        cum_c, dx = tl.associative_scan((c_next, g), axis=0, combine_fn=_combine)
        dx = dx + cum_c * carry
        prv = l - step
        prv_ok = mask & (prv >= 0) & (prv < L)
        y_prev = _widen(tl.load(y_ptr + prv * syl, mask=prv_ok, other=0.0))
        y_prev = tl.where(prv_ok, y_prev, initial)
        tl.store(dx_ptr + l * sdxl, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dc = dx * y_prev
        if LOG_COEFFS:  # the gradient of log c: times c
            dc = dc * tl.exp(_widen(tl.load(c_ptr + l * scl, mask=mask, other=0.0)))
        if HAS_CUTS:  # a cut coefficient is not used
            dc = tl.where(tl.load(cuts_ptr + l, mask=mask, other=0) != 0, 0.0, dc)
        tl.store(dc_ptr + l * sdcl, dc.to(dc_ptr.dtype.element_ty), mask=mask)
        carry = tl.sum(tl.where(offs == BLOCK - 1, dx, 0.0), axis=0, keep_dims=True)
    # After the last block the carry is d_inputs at the forward direction's first step.
    first = (L - 1 if REVERSE else 0) + zero
    c_first = _widen(tl.load(c_ptr + first.to(tl.int64) * scl, mask=first >= 0, other=0.0))
    if LOG_COEFFS:
        c_first = tl.where(first >= 0, tl.exp(c_first), 0.0)
    tl.store(dh0_ptr + _seq_base(pid, n_inner, sdh0, sdh1) + zero, (carry * c_first).to(dh0_ptr.dtype.element_ty))


_fwd_autotuned = triton.autotune(configs=_block_configs(), key=["L"])(_fwd_kernel)
_bwd_autotuned = triton.autotune(configs=_block_configs(), key=["L"])(_bwd_kernel)


def _seq_view(t: torch.Tensor, dim: int, state: bool = False):
    """t as (outer, inner, L), or (outer, inner) for a state tensor, and whether that is a view.

    Moving the scan dim last and merging the batch dims is a view for every layout whose
    batch dims merge into two; other layouts get a copy (see _write_back for outputs)."""
    if not state:
        t = t.movedim(dim, -1)
    batch = t.shape if state else t.shape[:-1]
    shape = (-1, batch[-1] if batch else 1, *(() if state else t.shape[-1:]))
    try:
        return t.view(shape), True
    except RuntimeError:
        return t.reshape(shape), False


def _strides(views, n_dims):
    return [s for v in views for s in v.stride()[:n_dims]]


def _launch(kernel_tile, kernel_pipe, n, L, pipe, args, flags):
    with on_device_of(args[0]):
        if pipe:
            wrap_triton(kernel_pipe)[(n,)](*args, **flags, PIPE=True)
        else:
            block = max(triton.next_power_of_2(L), 16)
            warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
            wrap_triton(kernel_tile)[(n,)](*args, **flags, BLOCK=block, PIPE=False, num_warps=warps)


def _write_back(outs):
    """Copy results computed in scratch copies (exotic output layouts) into the real outputs."""
    for real, view, is_view in outs:
        if not is_view:
            real.copy_(view.view(real.shape))


def _check_tile_length(L):
    if L > MAX_TILE:
        raise ValueError(f"linrec_tile (triton): the tile kernel scans at most {MAX_TILE} elements, but the "
                         f"sequence has {L}; use linrec_pipe")


@triton_op("linrec::triton_fwd", mutates_args={})
def triton_fwd(inputs: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None, dim: int,
               reverse: bool, pipe: bool, log_coeffs: bool = False,
               cuts: torch.Tensor | None = None) -> torch.Tensor:
    outputs = torch.empty_like(inputs)
    L = inputs.shape[dim]
    if inputs.numel() == 0:
        return outputs
    (x, _), (c, _), (y, y_is_view) = (_seq_view(t, dim) for t in (inputs, coeffs, outputs))
    h0 = _seq_view(initial, dim, state=True)[0] if initial is not None else x[:, :, 0]
    n = x.shape[0] * x.shape[1]
    flags_at = x if cuts is None else cuts.view(torch.uint8)  # any pointer when there are no cuts
    args = (x, c, y, h0, flags_at, L, x.shape[1], *_strides((x, c, y), 3), *_strides((h0,), 2))
    flags = dict(HAS_INITIAL=initial is not None, REVERSE=reverse, LOG_COEFFS=log_coeffs, HAS_CUTS=cuts is not None)
    _launch(_fwd_kernel, _fwd_autotuned, n, L, pipe, args, flags)
    _write_back([(outputs.movedim(dim, -1), y, y_is_view)])
    return outputs


def _bwd_outputs(d_outputs: torch.Tensor, dim: int, coeffs_dtype: torch.dtype):
    """The backward's (d_inputs, d_coeffs in coeffs_dtype, d_initial), and whether no kernel is
    needed: no elements, or no step (then the state passes through untouched: d_initial is zeroed)."""
    d_inputs = torch.empty_like(d_outputs)
    d_coeffs = torch.empty_like(d_outputs, dtype=coeffs_dtype)
    d_initial = d_outputs.new_empty(d_outputs.shape[:dim] + d_outputs.shape[dim + 1:])
    if d_outputs.shape[dim] == 0:
        d_initial.zero_()
    return d_inputs, d_coeffs, d_initial, d_outputs.numel() == 0


@triton_op("linrec::triton_bwd", mutates_args={})
def triton_bwd(d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, initial: torch.Tensor | None,
               dim: int, reverse: bool, pipe: bool, log_coeffs: bool = False, cuts: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_inputs, d_coeffs, d_initial, nothing_to_scan = _bwd_outputs(d_outputs, dim, coeffs.dtype)
    if nothing_to_scan:
        return d_inputs, d_coeffs, d_initial
    L = d_outputs.shape[dim]
    (g, _), (c, _), (y, _), (dx, dx_is_view), (dc, dc_is_view) = (
        _seq_view(t, dim) for t in (d_outputs, coeffs, outputs, d_inputs, d_coeffs))
    dh0, dh0_is_view = _seq_view(d_initial, dim, state=True)
    h0 = _seq_view(initial, dim, state=True)[0] if initial is not None else dh0
    n = g.shape[0] * g.shape[1]
    flags_at = g if cuts is None else cuts.view(torch.uint8)  # any pointer when there are no cuts
    args = (g, c, y, h0, dx, dc, dh0, flags_at, L, g.shape[1], *_strides((g, c, y), 3),
            *_strides((h0,), 2), *_strides((dx, dc), 3), *_strides((dh0,), 2))
    flags = dict(HAS_INITIAL=initial is not None, REVERSE=reverse, LOG_COEFFS=log_coeffs, HAS_CUTS=cuts is not None)
    _launch(_bwd_kernel, _bwd_autotuned, n, L, pipe, args, flags)
    _write_back([(d_inputs.movedim(dim, -1), dx, dx_is_view), (d_coeffs.movedim(dim, -1), dc, dc_is_view),
                 (d_initial, dh0, dh0_is_view)])
    return d_inputs, d_coeffs, d_initial


def _setup_context(ctx, inputs, output):
    _, coeffs, initial, dim, reverse, pipe, log_coeffs, cuts = inputs
    ctx.config = (dim, reverse, pipe, log_coeffs, cuts)
    ctx.has_initial = initial is not None
    ctx.save_for_backward(coeffs, output, initial)


def _backward(ctx, d_outputs):
    coeffs, outputs, initial = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate again
        dim, reverse, pipe, log_coeffs, cuts = ctx.config
        d_inputs, d_coeffs, d_initial = backward_by_scans(
            lambda x, c, d, r: triton_fwd(x, c, None, d, r, pipe), d_outputs, coeffs, outputs, initial,
            dim % outputs.dim(), reverse, log_coeffs, cuts)
    else:
        d_inputs, d_coeffs, d_initial = triton_bwd(d_outputs, coeffs, outputs, initial, *ctx.config)
    return d_inputs, d_coeffs, (d_initial if ctx.has_initial else None), None, None, None, None, None


triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def linrec_tile(inputs: torch.Tensor, coeffs: torch.Tensor | float, reverse: bool = False, *, dim: int = -1,
                initial: torch.Tensor | float | None = None, log_coeffs: bool = False) -> torch.Tensor:
    """linrec with one Triton program per sequence, the whole sequence in one block (<= MAX_TILE)."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse)
    _check_tile_length(inputs.shape[dim])
    refuse_torch_func("linrec.impl.triton")
    coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs is True)
    return triton_fwd(inputs, coeffs, initial, dim, bool(reverse), False, log_coeffs)


def linrec_pipe(inputs: torch.Tensor, coeffs: torch.Tensor | float, reverse: bool = False, *, dim: int = -1,
                initial: torch.Tensor | float | None = None, log_coeffs: bool = False) -> torch.Tensor:
    """linrec with one Triton program per sequence, walking it in blocks with a carry: any length."""
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse)
    refuse_torch_func("linrec.impl.triton")
    coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs is True)
    return triton_fwd(inputs, coeffs, initial, dim, bool(reverse), True, log_coeffs)
