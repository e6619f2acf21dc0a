"""Triton implementation of the fused selective scan (Mamba's S6), forward and backward.

The math (docs/design/0023-fused-selective-scan.md, csrc/selective_params.h). For batch b,
channel d, state n and step t of the scan (position l = t, or L-1-t in reverse):

    dt[t]   = delta[l] + delta_bias[d], through softplus if delta_softplus
    a[t, n] = exp(dt[t] * A[d, n])                  x[t, n] = dt[t] * B[n, l] * u[l]
    h[t, n] = a[t, n] * h[t-1, n] + x[t, n]         h[-1] = initial (or 0)
    y[l]    = (sum_n C[n, l] * h[t, n] + D[d] * u[l]) * silu(z[l])

With cuts (packed sequences) a is 0 at each segment's first step in scan order: the state
restarts there, and no gradient flows through a or into the state before it. With a state a
segment (cu_seqlens), a segment's own initial state h0 enters at that step through x (x + a h0,
a then 0), each segment's last step in scan order stores its last state, and the backward adds
that segment's d_last_state into dh there and stores a dh (its d_initial) at the cut.

A chunk of CHUNK steps is one tl.associative_scan over the pairs (a, x): two steps compose as
(a1, x1) then (a2, x2) = (a1 * a2, a2 * x1 + x2), so the scanned x is h with the state entering
the chunk at zero and the scanned a is the product of the coefficients so far, which carries
that state in: h += cumprod(a) * state.

The backward, with g = d_y * silu(z) the gradient of the pre-gate output, runs the recurrence
against the scan:

    dh[t] = C[t] * g[t] + a[t+1] * dh[t+1]          dh[L-1] = C g + d_last_state

a reverse tl.associative_scan over the pairs (a[t+1], C[t] g[t]) (the coefficients shifted one
step, with tl.gather), the gradient entering from later chunks carried in like the state. Every
other gradient is a per-step product or a sum over n of dh against the forward's terms:
d_B = dh dt u, d_C = g h, d_u = D g + dt sum_n dh B, d(dt) = u sum_n dh B + sum_n dh a h[t-1] A,
d_A = sum_t dh a h[t-1] dt, d_initial = a[0] dh[0]. a h[t-1] is taken as h[t] - x[t], the scan's
own output, so no shifted copy of h is needed.

The memory plan. One program per (block of BLOCK_D channels, batch). The states of its channels
are a [BLOCK_D, N_PAD] tile (N masked up to a power of two) and a chunk's work a [BLOCK_D, N_PAD,
CHUNK] tile: u, delta, z, d_y come in as [BLOCK_D, CHUNK] tiles and per-step B, C as [1, N_PAD,
CHUNK] tiles, one group's rows shared by the block's channels (BLOCK_D divides the channels of a
group). No (batch, dim, N, L) tensor exists. The forward saves the state entering every span of
CHECKPOINT_STEPS steps (checkpoints, a contract shared with the CPU and CUDA kernels: each
backward reads the others' checkpoints). The backward takes the spans last to first: it rescans
a span from its checkpoint, saving the state entering each chunk in a small scratch buffer
(BLOCK_D * N_PAD values a chunk, one region per program), then takes the span's chunks last to
first, rescanning each from its saved state and scanning back through it. d_B and d_C per step
are summed over the block's channels and added into float accumulators with atomics; d_A, d_D,
d_delta_bias and per-channel d_B, d_C are summed in registers over the program's steps and added
once at its end.

Arithmetic is float64 for float64 u, float32 otherwise (A's dtype: the normalised A is float32
or float64 by the same rule).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._device import on_device_of

# The forward's checkpoint interval, shared with the CPU and CUDA kernels (kCheckpointSteps).
CHECKPOINT_STEPS = 128
# A program holds a [BLOCK_D, N_PAD, CHUNK] tile in registers, at least 8 steps of N_PAD states: the tile
# configs plan for no more states than this.
MAX_STATES = 256


@triton.jit
def _combine(a1, x1, a2, x2):
    return a1 * a2, a2 * x1 + x2


@triton.jit
def _softplus(x):
    # torch's softplus: x above 20, else log1p(exp(x)). log1p(w) is log(1 + w) * w / ((1 + w) - 1)
    # (exact to a few ulp; log(1 + w) alone loses w below float32's epsilon).
    w = tl.exp(tl.minimum(x, 20.0))
    s = 1.0 + w
    log1p_w = tl.where(s == 1.0, w, tl.log(s) * (w / (s - 1.0)))
    return tl.where(x > 20.0, x, log1p_w)


@triton.jit
def _column(v, cols, j):
    """Column j of a [BLOCK_D, N_PAD, CHUNK] tile, as [BLOCK_D, N_PAD]."""
    return tl.sum(tl.where(cols[None, None, :] == j, v, 0.0), axis=2)


@triton.jit
def _next_step(a, cols, CHUNK: tl.constexpr):
    """a one step later along the chunk (column j holds column j + 1), 1 in the last column."""
    later = tl.broadcast_to(tl.minimum(cols + 1, CHUNK - 1)[None, None, :], a.shape)
    return tl.where(cols[None, None, :] == CHUNK - 1, 1.0, tl.gather(a, later, axis=2))


@triton.jit
def _chunk_steps(chunk_start, L, CHUNK: tl.constexpr, REVERSE: tl.constexpr):
    """A chunk's columns, which of them are steps, and their positions l (int64)."""
    cols = tl.arange(0, CHUNK)
    t = chunk_start + cols
    steps_ok = t < L
    pos = (L - 1 - t) if REVERSE else t
    return cols, steps_ok, pos.to(tl.int64)


@triton.jit
def _load_steps(rows, pos, s_step, tile_ok, acc_dtype):
    """A [BLOCK_D, CHUNK] tile of a (batch, dim, L) tensor from its channels' row starts [BLOCK_D, 1]."""
    return tl.load(rows + pos[None, :] * s_step, mask=tile_ok, other=0.0).to(acc_dtype)


@triton.jit
def _channel_rows(ptr, batch, channels, s_batch, s_channel):
    """Each block channel's row of a (batch, dim, L) tensor."""
    return ptr + batch * s_batch + channels[:, None] * s_channel


@triton.jit
def _bc_rows(ptr, batch, channels, states, first_channel, s_batch, s_group, s_state, channels_per_group,
             PER_STEP: tl.constexpr):
    """Where B's (or C's) rows for the program's channels start: per step, the rows of the block's
    group, [1, N_PAD, 1]; per channel, each channel's row, [BLOCK_D, N_PAD, 1]."""
    if PER_STEP:
        group = (first_channel // channels_per_group).to(tl.int64)
        rows = ptr + batch * s_batch + group * s_group + states[None, :, None] * s_state
    else:
        rows = ptr + channels[:, None, None] * s_group + states[None, :, None] * s_state
    return rows


@triton.jit
def _load_bc(rows, rows_ok, pos, s_step, steps_ok, acc_dtype, PER_STEP: tl.constexpr):
    """B (or C) for a chunk: [1, N_PAD, CHUNK] per step, [BLOCK_D, N_PAD, 1] per channel."""
    if PER_STEP:
        tile = tl.load(rows + pos[None, None, :] * s_step, mask=rows_ok & steps_ok[None, None, :], other=0.0)
    else:
        tile = tl.load(rows, mask=rows_ok, other=0.0)
    return tile.to(acc_dtype)


@triton.jit
def _step_sizes(delta, bias, steps_ok, SOFTPLUS: tl.constexpr):
    """dt for a [BLOCK_D, CHUNK] tile, 0 past the sequence's end (where a = 1 and x = 0: the state
    passes through and no gradient arises), and delta + bias (softplus's argument)."""
    raw = delta + bias[:, None]
    dt = _softplus(raw) if SOFTPLUS else raw
    return tl.where(steps_ok[None, :], dt, 0.0), raw


@triton.jit
def _load_cuts(cuts_ptr, pos, steps_ok, HAS_CUTS: tl.constexpr):
    """Which of a chunk's steps begin a segment of a packed sequence (none without cuts)."""
    cut = pos < 0
    if HAS_CUTS:
        cut = tl.load(cuts_ptr + pos, mask=steps_ok, other=0) != 0
    return cut


@triton.jit
def _scan_chunk(dt, dtu, A, B, state, cut, entering, HAS_CUTS: tl.constexpr, ENTERING: tl.constexpr):
    """The chunk's states h [BLOCK_D, N_PAD, CHUNK] from the state entering it, with a and x. At a
    cut a is 0: the state restarts there, and no gradient flows through a or past it; with
    ENTERING, from the segment's own initial state (`entering` at the cut's column), which comes
    in through the scanned x. x is returned without it: h - x is a h[t-1] at every step."""
    a = tl.exp(dt[:, None, :] * A[:, :, None])
    x = dtu[:, None, :] * B
    x_scanned = x
    if ENTERING:
        x_scanned = x + tl.where(cut[None, None, :], a * entering, 0.0)
    if HAS_CUTS:
        a = tl.where(cut[None, None, :], 0.0, a)
    cum_a, h = tl.associative_scan((a, x_scanned), axis=2, combine_fn=_combine)
    return a, x, h + cum_a * state[:, :, None]


@triton.jit
def _segment_steps(segments_ptr, cuts_ptr, chunk_start, pos, L, steps_ok, CHUNK: tl.constexpr,
                   REVERSE: tl.constexpr):
    """With a state a segment: each step's segment, and which steps are their segment's last in
    scan order (the next step cuts, or there is none)."""
    segment = tl.load(segments_ptr + pos, mask=steps_ok, other=0)
    next_ok = chunk_start + tl.arange(0, CHUNK) + 1 < L
    next_cuts = tl.load(cuts_ptr + (pos - 1 if REVERSE else pos + 1), mask=steps_ok & next_ok, other=0) != 0
    return segment, steps_ok & (next_cuts | ~next_ok)


@triton.jit
def _segment_tile(ptr, segment_base, segment, mask, N):
    """A [BLOCK_D, N_PAD, CHUNK] tile of a (batch, dim, segments, N) tensor: each step's segment's row."""
    return tl.load(ptr + segment_base[:, :, None] + segment[None, None, :] * N, mask=mask, other=0.0)


@triton.jit
def _program_channels(A_ptr, D_ptr, bias_ptr, dim, N, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_D: tl.constexpr, N_PAD: tl.constexpr):
    """A program's batch, channels and states (with their masks; cs: a (channel, state) offset
    in (dim, N) tensors), and its channels' A, D and delta_bias (zero where absent)."""
    acc = A_ptr.dtype.element_ty
    first_channel = tl.program_id(0) * BLOCK_D
    batch = tl.program_id(1).to(tl.int64)
    channels = (first_channel + tl.arange(0, BLOCK_D)).to(tl.int64)
    states = tl.arange(0, N_PAD)
    channels_ok, states_ok = channels < dim, states < N
    cs_ok = channels_ok[:, None] & states_ok[None, :]
    cs = channels[:, None] * N + states[None, :]
    A = tl.load(A_ptr + cs, mask=cs_ok, other=0.0)
    D = tl.load(D_ptr + channels, mask=channels_ok, other=0.0) if HAS_D else tl.zeros([BLOCK_D], acc)
    bias = tl.load(bias_ptr + channels, mask=channels_ok, other=0.0) if HAS_BIAS else tl.zeros([BLOCK_D], acc)
    return first_channel, batch, channels, states, channels_ok, states_ok, cs_ok, cs, A, D, bias


@triton.jit
def _selective_fwd_kernel(
        u_ptr, delta_ptr, z_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, initial_ptr, cuts_ptr, segments_ptr,
        y_ptr, last_ptr, checkpoints_ptr,
        dim, N, L, num_segments,
        s_u_b, s_u_d, s_u_l, s_dt_b, s_dt_d, s_dt_l, s_z_b, s_z_d, s_z_l,
        s_B_b, s_B_g, s_B_n, s_B_l, B_channels_per_group,
        s_C_b, s_C_g, s_C_n, s_C_l, C_channels_per_group,
        HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_INITIAL: tl.constexpr,
        HAS_CUTS: tl.constexpr, SEGMENTS: tl.constexpr, ENTERING: tl.constexpr,
        B_PER_STEP: tl.constexpr, C_PER_STEP: tl.constexpr, SOFTPLUS: tl.constexpr, REVERSE: tl.constexpr,
        BLOCK_D: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, CHECKPOINT: tl.constexpr):
    # HAS_INITIAL: a (batch, dim, N) initial state. SEGMENTS: a state a segment, (batch, dim,
    # segments, N) last states, and initial ones where ENTERING.
    acc = A_ptr.dtype.element_ty
    first_channel, batch, channels, states, channels_ok, states_ok, cs_ok, cs, A, D, bias = _program_channels(
        A_ptr, D_ptr, bias_ptr, dim, N, HAS_D, HAS_BIAS, BLOCK_D, N_PAD)
    states_at = (batch * dim) * N + cs  # (batch, channel, state) in (batch, dim, N) tensors
    segment_base = ((batch * dim + channels[:, None]) * num_segments) * N + states[None, :]
    state = tl.zeros([BLOCK_D, N_PAD], acc)
    if HAS_INITIAL:
        state += tl.load(initial_ptr + states_at, mask=cs_ok, other=0.0)

    u_rows = _channel_rows(u_ptr, batch, channels, s_u_b, s_u_d)
    delta_rows = _channel_rows(delta_ptr, batch, channels, s_dt_b, s_dt_d)
    z_rows = _channel_rows(z_ptr, batch, channels, s_z_b, s_z_d)
    y_rows = y_ptr + (batch * dim + channels[:, None]) * L
    B_rows = _bc_rows(B_ptr, batch, channels, states, first_channel, s_B_b, s_B_g, s_B_n, B_channels_per_group,
                      B_PER_STEP)
    C_rows = _bc_rows(C_ptr, batch, channels, states, first_channel, s_C_b, s_C_g, s_C_n, C_channels_per_group,
                      C_PER_STEP)
    B_rows_ok = states_ok[None, :, None] if B_PER_STEP else cs_ok[:, :, None]
    C_rows_ok = states_ok[None, :, None] if C_PER_STEP else cs_ok[:, :, None]
    num_spans = tl.cdiv(L, CHECKPOINT)
    checkpoint_at = ((batch * dim + channels[:, None]) * num_spans) * N + states[None, :]

    for chunk_start in range(0, L, CHUNK):
        if chunk_start % CHECKPOINT == 0:
            tl.store(checkpoints_ptr + checkpoint_at + (chunk_start // CHECKPOINT) * N, state, mask=cs_ok)
        cols, steps_ok, pos = _chunk_steps(chunk_start, L, CHUNK, REVERSE)
        tile_ok = channels_ok[:, None] & steps_ok[None, :]
        u = _load_steps(u_rows, pos, s_u_l, tile_ok, acc)
        dt, _ = _step_sizes(_load_steps(delta_rows, pos, s_dt_l, tile_ok, acc), bias, steps_ok, SOFTPLUS)
        B = _load_bc(B_rows, B_rows_ok, pos, s_B_l, steps_ok, acc, B_PER_STEP)
        C = _load_bc(C_rows, C_rows_ok, pos, s_C_l, steps_ok, acc, C_PER_STEP)
        cut = _load_cuts(cuts_ptr, pos, steps_ok, HAS_CUTS)
        segment, ends = pos, steps_ok
        entering = tl.zeros([BLOCK_D, N_PAD, CHUNK], acc)
        if SEGMENTS:
            segment, ends = _segment_steps(segments_ptr, cuts_ptr, chunk_start, pos, L, steps_ok, CHUNK, REVERSE)
            if ENTERING:
                entering = _segment_tile(initial_ptr, segment_base, segment, cs_ok[:, :, None] & cut[None, None, :], N)
        _, _, h = _scan_chunk(dt, dt * u, A, B, state, cut, entering, HAS_CUTS, ENTERING)
        if SEGMENTS:  # each segment's last step leaves its last state
            tl.store(last_ptr + segment_base[:, :, None] + segment[None, None, :] * N, h,
                     mask=cs_ok[:, :, None] & ends[None, None, :])
        y = tl.sum(C * h, axis=1) + D[:, None] * u
        if HAS_Z:
            z = _load_steps(z_rows, pos, s_z_l, tile_ok, acc)
            y = y * z * tl.sigmoid(z)
        tl.store(y_rows + pos[None, :], y.to(y_ptr.dtype.element_ty), mask=tile_ok)
        # Columns past the end pass the state through (a = 1, x = 0): the last column is h[L-1].
        state = _column(h, cols, CHUNK - 1)
    if not SEGMENTS:
        tl.store(last_ptr + states_at, state, mask=cs_ok)


@triton.jit
def _selective_bwd_kernel(
        d_y_ptr, u_ptr, delta_ptr, z_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr, d_last_ptr, checkpoints_ptr,
        cuts_ptr, initial_ptr, segments_ptr, scratch_ptr,
        d_u_ptr, d_delta_ptr, d_z_ptr, d_A_ptr, d_B_ptr, d_C_ptr, d_D_ptr, d_bias_ptr, d_initial_ptr,
        dim, N, L, num_segments,
        s_g_b, s_g_d, s_g_l, s_u_b, s_u_d, s_u_l, s_dt_b, s_dt_d, s_dt_l, s_z_b, s_z_d, s_z_l,
        s_B_b, s_B_g, s_B_n, s_B_l, B_channels_per_group, s_dB_b, s_dB_g, s_dB_n,
        s_C_b, s_C_g, s_C_n, s_C_l, C_channels_per_group, s_dC_b, s_dC_g, s_dC_n,
        HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_D_LAST: tl.constexpr,
        HAS_CUTS: tl.constexpr, SEGMENTS: tl.constexpr, ENTERING: tl.constexpr,
        B_PER_STEP: tl.constexpr, C_PER_STEP: tl.constexpr, SOFTPLUS: tl.constexpr, REVERSE: tl.constexpr,
        BLOCK_D: tl.constexpr, N_PAD: tl.constexpr, CHUNK: tl.constexpr, CHECKPOINT: tl.constexpr):
    # SEGMENTS, ENTERING as the forward's; d_last_state and d_initial then a state a segment.
    acc = A_ptr.dtype.element_ty
    first_channel, batch, channels, states, channels_ok, states_ok, cs_ok, cs, A, D, bias = _program_channels(
        A_ptr, D_ptr, bias_ptr, dim, N, HAS_D, HAS_BIAS, BLOCK_D, N_PAD)
    states_at = (batch * dim) * N + cs
    segment_base = ((batch * dim + channels[:, None]) * num_segments) * N + states[None, :]
    # The gradient with respect to the state entering the chunk last walked back through; at first,
    # with respect to h[L-1] (with a state a segment, d_last_state comes in at each segment's end).
    d_state = tl.zeros([BLOCK_D, N_PAD], acc)
    if HAS_D_LAST and not SEGMENTS:
        d_state += tl.load(d_last_ptr + states_at, mask=cs_ok, other=0.0)

    d_y_rows = _channel_rows(d_y_ptr, batch, channels, s_g_b, s_g_d)
    u_rows = _channel_rows(u_ptr, batch, channels, s_u_b, s_u_d)
    delta_rows = _channel_rows(delta_ptr, batch, channels, s_dt_b, s_dt_d)
    z_rows = _channel_rows(z_ptr, batch, channels, s_z_b, s_z_d)
    out_rows = (batch * dim + channels[:, None]) * L  # d_u, d_delta, d_z: contiguous
    B_rows = _bc_rows(B_ptr, batch, channels, states, first_channel, s_B_b, s_B_g, s_B_n, B_channels_per_group,
                      B_PER_STEP)
    C_rows = _bc_rows(C_ptr, batch, channels, states, first_channel, s_C_b, s_C_g, s_C_n, C_channels_per_group,
                      C_PER_STEP)
    d_B_rows = _bc_rows(d_B_ptr, batch, channels, states, first_channel, s_dB_b, s_dB_g, s_dB_n,
                        B_channels_per_group, B_PER_STEP)
    d_C_rows = _bc_rows(d_C_ptr, batch, channels, states, first_channel, s_dC_b, s_dC_g, s_dC_n,
                        C_channels_per_group, C_PER_STEP)
    B_rows_ok = states_ok[None, :, None] if B_PER_STEP else cs_ok[:, :, None]
    C_rows_ok = states_ok[None, :, None] if C_PER_STEP else cs_ok[:, :, None]

    # Sums over the program's steps, added into the shared accumulators at its end.
    d_A = tl.zeros([BLOCK_D, N_PAD], acc)
    d_D = tl.zeros([BLOCK_D], acc)
    d_bias = tl.zeros([BLOCK_D], acc)
    d_B_channel = tl.zeros([BLOCK_D, N_PAD, 1], acc)
    d_C_channel = tl.zeros([BLOCK_D, N_PAD, 1], acc)

    # This program's scratch: the state entering each chunk of the span in hand.
    program = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    scratch_rows = scratch_ptr + program.to(tl.int64) * (CHECKPOINT // CHUNK) * BLOCK_D * N_PAD \
        + tl.arange(0, BLOCK_D)[:, None] * N_PAD + states[None, :]
    num_spans = tl.cdiv(L, CHECKPOINT)
    checkpoint_at = ((batch * dim + channels[:, None]) * num_spans) * N + states[None, :]

    for spans_done in range(0, num_spans):
        span = num_spans - 1 - spans_done
        span_start = span * CHECKPOINT
        span_chunks = tl.cdiv(tl.minimum(L - span_start, CHECKPOINT), CHUNK)
        state = tl.load(checkpoints_ptr + checkpoint_at + span * N, mask=cs_ok, other=0.0)
        tl.debug_barrier()  # every thread has read the previous span's scratch before it is overwritten
        tl.store(scratch_rows, state)
        for chunk in range(0, span_chunks - 1):
            cols, steps_ok, pos = _chunk_steps(span_start + chunk * CHUNK, L, CHUNK, REVERSE)
            tile_ok = channels_ok[:, None] & steps_ok[None, :]
            u = _load_steps(u_rows, pos, s_u_l, tile_ok, acc)
            dt, _ = _step_sizes(_load_steps(delta_rows, pos, s_dt_l, tile_ok, acc), bias, steps_ok, SOFTPLUS)
            B = _load_bc(B_rows, B_rows_ok, pos, s_B_l, steps_ok, acc, B_PER_STEP)
            cut = _load_cuts(cuts_ptr, pos, steps_ok, HAS_CUTS)
            entering = tl.zeros([BLOCK_D, N_PAD, CHUNK], acc)
            if ENTERING:
                segment = tl.load(segments_ptr + pos, mask=steps_ok, other=0)
                entering = _segment_tile(initial_ptr, segment_base, segment, cs_ok[:, :, None] & cut[None, None, :], N)
            _, _, h = _scan_chunk(dt, dt * u, A, B, state, cut, entering, HAS_CUTS, ENTERING)
            state = _column(h, cols, CHUNK - 1)
            tl.store(scratch_rows + (chunk + 1) * BLOCK_D * N_PAD, state)
        tl.debug_barrier()  # the scratch is written before any thread reads it

        for chunks_done in range(0, span_chunks):
            chunk = span_chunks - 1 - chunks_done
            cols, steps_ok, pos = _chunk_steps(span_start + chunk * CHUNK, L, CHUNK, REVERSE)
            tile_ok = channels_ok[:, None] & steps_ok[None, :]
            state = tl.load(scratch_rows + chunk * BLOCK_D * N_PAD)
            u = _load_steps(u_rows, pos, s_u_l, tile_ok, acc)
            delta = _load_steps(delta_rows, pos, s_dt_l, tile_ok, acc)
            d_y = _load_steps(d_y_rows, pos, s_g_l, tile_ok, acc)
            dt, raw_dt = _step_sizes(delta, bias, steps_ok, SOFTPLUS)
            dtu = dt * u
            B = _load_bc(B_rows, B_rows_ok, pos, s_B_l, steps_ok, acc, B_PER_STEP)
            C = _load_bc(C_rows, C_rows_ok, pos, s_C_l, steps_ok, acc, C_PER_STEP)
            cut = _load_cuts(cuts_ptr, pos, steps_ok, HAS_CUTS)
            segment, ends = pos, steps_ok
            entering = tl.zeros([BLOCK_D, N_PAD, CHUNK], acc)
            if SEGMENTS:
                segment, ends = _segment_steps(segments_ptr, cuts_ptr, span_start + chunk * CHUNK, pos, L, steps_ok,
                                               CHUNK, REVERSE)
                if ENTERING:
                    entering = _segment_tile(initial_ptr, segment_base, segment,
                                             cs_ok[:, :, None] & cut[None, None, :], N)
            a, x, h = _scan_chunk(dt, dtu, A, B, state, cut, entering, HAS_CUTS, ENTERING)

            if HAS_Z:
                z = _load_steps(z_rows, pos, s_z_l, tile_ok, acc)
                gate = tl.sigmoid(z)
                y_pre = tl.sum(C * h, axis=1) + D[:, None] * u
                d_z = d_y * y_pre * gate * (1.0 + z * (1.0 - gate))
                tl.store(d_z_ptr + out_rows + pos[None, :], d_z.to(d_z_ptr.dtype.element_ty), mask=tile_ok)
                g = d_y * z * gate
            else:
                g = d_y

            g_states = C * g[:, None, :]
            if SEGMENTS and HAS_D_LAST:  # d_last_state enters at each segment's end
                g_states += _segment_tile(d_last_ptr, segment_base, segment, cs_ok[:, :, None] & ends[None, None, :], N)
            cum_a, dh = tl.associative_scan((_next_step(a, cols, CHUNK), g_states), axis=2, combine_fn=_combine,
                                            reverse=True)
            dh = dh + cum_a * d_state[:, :, None]
            d_state = _column(a * dh, cols, 0)
            if SEGMENTS:  # a segment's d_initial: a dh at its cut (0 where it starts from 0)
                d_entering = tl.zeros([BLOCK_D, N_PAD, CHUNK], acc)
                if ENTERING:
                    d_entering = tl.exp(dt[:, None, :] * A[:, :, None]) * dh
                tl.store(d_initial_ptr + segment_base[:, :, None] + segment[None, None, :] * N, d_entering,
                         mask=cs_ok[:, :, None] & cut[None, None, :])

            dh_B = tl.sum(dh * B, axis=1)
            dh_a_h_prev = dh * (h - x)  # dh[t] * a[t] * h[t-1]
            d_u = D[:, None] * g + dt * dh_B
            d_dt = u * dh_B + tl.sum(dh_a_h_prev * A[:, :, None], axis=1)
            d_A += tl.sum(dh_a_h_prev * dt[:, None, :], axis=2)
            d_D += tl.sum(g * u, axis=1)
            # softplus' derivative is sigmoid, and 1 above the threshold where softplus is x (as torch's).
            d_delta = d_dt * tl.where(raw_dt > 20.0, 1.0, tl.sigmoid(raw_dt)) if SOFTPLUS else d_dt
            d_delta = tl.where(tile_ok, d_delta, 0.0)  # past the end h - x is the carried state, not 0
            d_bias += tl.sum(d_delta, axis=1)
            tl.store(d_u_ptr + out_rows + pos[None, :], d_u.to(d_u_ptr.dtype.element_ty), mask=tile_ok)
            tl.store(d_delta_ptr + out_rows + pos[None, :], d_delta.to(d_delta_ptr.dtype.element_ty), mask=tile_ok)

            d_B_steps = dh * dtu[:, None, :]
            d_C_steps = g[:, None, :] * h
            if B_PER_STEP:  # the block's channels share the group's rows: their sum, added per step
                tl.atomic_add(d_B_rows + pos[None, None, :], tl.sum(d_B_steps, axis=0, keep_dims=True),
                              mask=B_rows_ok & steps_ok[None, None, :])
            else:
                d_B_channel += tl.sum(d_B_steps, axis=2, keep_dims=True)
            if C_PER_STEP:
                tl.atomic_add(d_C_rows + pos[None, None, :], tl.sum(d_C_steps, axis=0, keep_dims=True),
                              mask=C_rows_ok & steps_ok[None, None, :])
            else:
                d_C_channel += tl.sum(d_C_steps, axis=2, keep_dims=True)

    if not SEGMENTS:
        tl.store(d_initial_ptr + states_at, d_state, mask=cs_ok)
    tl.atomic_add(d_A_ptr + cs, d_A, mask=cs_ok)
    if HAS_D:
        tl.atomic_add(d_D_ptr + channels, d_D, mask=channels_ok)
    if HAS_BIAS:
        tl.atomic_add(d_bias_ptr + channels, d_bias, mask=channels_ok)
    if not B_PER_STEP:
        tl.atomic_add(d_B_rows, d_B_channel, mask=B_rows_ok)
    if not C_PER_STEP:
        tl.atomic_add(d_C_rows, d_C_channel, mask=C_rows_ok)


def _new_output(shape, dtype, device):
    """Storage for results the kernels write in full (tests fill it with NaN to catch gaps)."""
    return torch.empty(shape, dtype=dtype, device=device)


# Triton's interpreter runs a scan element by element: it gets small tiles, and several chunks a
# span so that its tests cross chunk edges.
SMALL_TILES = os.environ.get("TRITON_INTERPRET") == "1"


def _tile_config(n_pad: int, block_d_limit: int):
    """(BLOCK_D, CHUNK, num_warps): a [BLOCK_D, n_pad, CHUNK] tile of about 2048 values (16 a
    thread), CHUNK dividing CHECKPOINT_STEPS. A starting point, not yet tuned on a GPU."""
    if SMALL_TILES:
        return min(2, block_d_limit), 16, 1
    tile = 2048
    block_d = max(1, min(4, block_d_limit, tile // (32 * n_pad)))
    chunk = max(8, min(CHECKPOINT_STEPS, tile // (block_d * n_pad)))
    return block_d, chunk, 4


class _BCLayout(NamedTuple):
    """How the kernels address B or C: per step or per channel, the element strides over (batch,
    group, state, step), and the channels of a group."""
    per_step: bool
    strides: tuple[int, int, int, int]
    channels_per_group: int


def _bc_layout(t: torch.Tensor, dim: int) -> _BCLayout:
    if t.dim() == 2:  # per channel: a group is a channel, and no batch or step stride
        return _BCLayout(False, (0, t.stride(0), t.stride(1), 0), 1)
    return _BCLayout(True, tuple(t.stride()), dim // t.shape[1])


def _largest_power_of_two_dividing(n: int, limit: int) -> int:
    p = 1
    while p * 2 <= limit and n % (p * 2) == 0:
        p *= 2
    return p


class _Launch(NamedTuple):
    batch: int
    dim: int
    states: int
    length: int
    acc: torch.dtype  # the arithmetic and state dtype
    B: _BCLayout
    C: _BCLayout
    block_d: int
    n_pad: int
    chunk: int
    num_warps: int

    @staticmethod
    def of(u: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> "_Launch":
        batch, dim, length = u.shape
        states = A.shape[1]
        n_pad = max(1, triton.next_power_of_2(states))
        if n_pad > MAX_STATES:
            raise ValueError(f"selective scan (triton): at most {MAX_STATES} states, got {states}")
        B_layout, C_layout = _bc_layout(B, dim), _bc_layout(C, dim)
        # A block of channels lies in one group of every per-step B and C.
        per_group = [bc.channels_per_group for bc in (B_layout, C_layout) if bc.per_step]
        limit = _largest_power_of_two_dividing(math.gcd(*per_group), 64) if per_group else 64
        block_d, chunk, num_warps = _tile_config(n_pad, limit)
        acc = torch.float64 if u.dtype == torch.float64 else torch.float32
        return _Launch(batch, dim, states, length, acc, B_layout, C_layout, block_d, n_pad, chunk, num_warps)

    @property
    def grid(self):
        return (triton.cdiv(self.dim, self.block_d), self.batch)

    def meta(self, delta_softplus, reverse):
        """The compile-time arguments both kernels share."""
        return dict(B_PER_STEP=self.B.per_step, C_PER_STEP=self.C.per_step, SOFTPLUS=bool(delta_softplus),
                    REVERSE=bool(reverse), BLOCK_D=self.block_d, N_PAD=self.n_pad, CHUNK=self.chunk,
                    CHECKPOINT=CHECKPOINT_STEPS, num_warps=self.num_warps)


def _segment_of(cu_seqlens, length):
    """Each position's segment (int64, on cu_seqlens' device, with no host sync)."""
    positions = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)


def _states_from(state, shape, acc, device):
    """A copy of `state`, or zeros: where the kernels leave a state a segment unwritten (empty
    segments), it passes through."""
    return state.to(acc).clone() if state is not None else torch.zeros(shape, dtype=acc, device=device)


def selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus: bool, reverse: int,
                       cuts=None, cu_seqlens=None):
    """The fused selective scan's forward, on normalised arguments (docs/design/0023-fused-selective-scan.md);
    cuts: packed sequences, one flag a position, set where a segment begins in scan order (no
    initial_state); with cu_seqlens too (int64 [0, ..., L]), a state a segment: initial_state and
    last_state (batch, dim, segments, N).

    Returns y (batch, dim, L) in u's dtype, last_state (batch, dim, N) and checkpoints
    (batch, dim, ceil(L / 128), N): the state entering steps 0, 128, ... in scan order,
    float32 (float64 for float64 u)."""
    run = _Launch.of(u, A, B, C)
    batch, dim, N, L, acc, device = run.batch, run.dim, run.states, run.length, run.acc, u.device
    y = _new_output((batch, dim, L), u.dtype, device)
    segments = cu_seqlens is not None
    num_segments = cu_seqlens.shape[0] - 1 if segments else 0
    last_state = (_states_from(initial_state, (batch, dim, num_segments, N), acc, device) if segments
                  else _new_output((batch, dim, N), acc, device))
    checkpoints = _new_output((batch, dim, triton.cdiv(L, CHECKPOINT_STEPS), N), acc, device)
    if batch * dim == 0:
        return y, last_state, checkpoints
    A = A.contiguous()
    # Absent tensors pass a stand-in pointer that their HAS_ flag keeps the kernel from reading.
    with on_device_of(u):
        _selective_fwd_kernel[run.grid](
            u, delta, z if z is not None else u, A, B, C,
            D.contiguous() if D is not None else A,
            delta_bias.contiguous() if delta_bias is not None else A,
            initial_state.contiguous() if initial_state is not None else A,
            cuts.view(torch.uint8) if cuts is not None else u,
            _segment_of(cu_seqlens, L) if segments else u,
            y, last_state, checkpoints,
            dim, N, L, num_segments, *u.stride(), *delta.stride(), *(z if z is not None else u).stride(),
            *run.B.strides, run.B.channels_per_group, *run.C.strides, run.C.channels_per_group,
            HAS_Z=z is not None, HAS_D=D is not None, HAS_BIAS=delta_bias is not None,
            HAS_INITIAL=initial_state is not None and not segments, HAS_CUTS=cuts is not None, SEGMENTS=segments,
            ENTERING=segments and initial_state is not None, **run.meta(delta_softplus, reverse))
    return y, last_state, checkpoints


def selective_scan_bwd(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints,
                       delta_softplus: bool, reverse: int, cuts=None, cu_seqlens=None):
    """The fused selective scan's backward, from the forward's checkpoints (from any backend).

    Returns (d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial_state): d_u, d_delta,
    d_z in u's dtype; the rest float32 (float64 for float64 u), d_B and d_C in B's and C's
    normalised shapes; 0-element tensors for absent D, z, delta_bias. initial_state is read only
    with a state a segment (cu_seqlens): otherwise the checkpoints hold it."""
    run = _Launch.of(u, A, B, C)
    batch, dim, N, L, acc, device = run.batch, run.dim, run.states, run.length, run.acc, u.device
    d_u = _new_output((batch, dim, L), u.dtype, device)
    d_delta = _new_output((batch, dim, L), u.dtype, device)
    absent = torch.empty(0, dtype=u.dtype, device=device)
    d_z = _new_output((batch, dim, L), u.dtype, device) if z is not None else absent
    segments = cu_seqlens is not None
    num_segments = cu_seqlens.shape[0] - 1 if segments else 0
    d_initial = (_states_from(d_last_state, (batch, dim, num_segments, N), acc, device) if segments
                 else _new_output((batch, dim, N), acc, device))
    # Accumulators, added into by the programs.
    d_A = torch.zeros((dim, N), dtype=acc, device=device)
    d_B = torch.zeros(B.shape, dtype=acc, device=device)
    d_C = torch.zeros(C.shape, dtype=acc, device=device)
    d_D = torch.zeros((dim,) if D is not None else 0, dtype=acc, device=device)
    d_bias = torch.zeros((dim,) if delta_bias is not None else 0, dtype=acc, device=device)
    grads = (d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_bias, d_initial)
    if batch * dim == 0:
        return grads
    programs = run.grid[0] * run.grid[1]
    scratch = _new_output((programs * (CHECKPOINT_STEPS // run.chunk) * run.block_d * run.n_pad,), acc, device)
    A = A.contiguous()
    # d_B, d_C are addressed like B, C: over (batch, group, state) (per channel: (0, channel, state)),
    # a step stride of 1.
    d_B_strides = d_B.stride()[:3] if run.B.per_step else (0, *d_B.stride())
    d_C_strides = d_C.stride()[:3] if run.C.per_step else (0, *d_C.stride())
    with on_device_of(u):
        _selective_bwd_kernel[run.grid](
            d_y, u, delta, z if z is not None else u, A, B, C,
            D.contiguous() if D is not None else A,
            delta_bias.contiguous() if delta_bias is not None else A,
            d_last_state.contiguous() if d_last_state is not None else A,
            checkpoints.contiguous(), cuts.view(torch.uint8) if cuts is not None else u,
            initial_state.contiguous() if segments and initial_state is not None else A,
            _segment_of(cu_seqlens, L) if segments else u, scratch,
            d_u, d_delta, d_z if z is not None else d_u, d_A, d_B, d_C,
            d_D if D is not None else d_A, d_bias if delta_bias is not None else d_A, d_initial,
            dim, N, L, num_segments, *d_y.stride(), *u.stride(), *delta.stride(), *(z if z is not None else u).stride(),
            *run.B.strides, run.B.channels_per_group, *d_B_strides,
            *run.C.strides, run.C.channels_per_group, *d_C_strides,
            HAS_Z=z is not None, HAS_D=D is not None, HAS_BIAS=delta_bias is not None,
            HAS_D_LAST=d_last_state is not None, HAS_CUTS=cuts is not None, SEGMENTS=segments,
            ENTERING=segments and initial_state is not None, **run.meta(delta_softplus, reverse))
    return grads
