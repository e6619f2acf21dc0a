"""The affine map of a whole sequence in one read: (product of its coefficients, its last state
from zero), for sequence parallelism (linrec.distributed), where each rank needs only that
pair of its shard before its scan, not the shard's outputs.

The math. A step y <- c * y + x is the pair (c, x), and pairs compose as in impl/triton.py:
(c1, x1) then (c2, x2) = (c1 * c2, c2 * x1 + x2). The map of a sequence is the composition of
all its pairs, so a pass that reads x and c once and writes a pair per sequence gives it: 2
tensor passes where a scan from zero writes its outputs too (3), and takes a product after.

The memory plan. A program owns one block of BLOCK_I sequences that lie side by side in memory
(stride 1 between them: channel-last data) or one sequence (BLOCK_I = 1: rows), and a split of
SPLIT positions along the sequence. It walks its split in blocks of BLOCK_L positions, loads a
[BLOCK_L, BLOCK_I] tile of x and c, composes the tile's pairs along the sequence
(tl.associative_scan keeps their order; the last row is the tile's map) and folds that into its
running pair. It writes one pair a sequence and split; splits let few long sequences fill the
GPU. The pairs of a sequence's splits are themselves a sequence of steps (c = product, x =
state), so the same kernel over them, one split, gives the map. Arithmetic and the pairs are
float64 for float64 storage, float32 otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .triton import _combine, _seq_view, _widen

_TARGET_PROGRAMS = 1024  # enough programs to keep every multiprocessor's memory pipe full


@triton.jit
def _shard_map_kernel(x_ptr, c_ptr, out_ptr, L, n_inner, split,
                      sx0, sx1, sxl, sc0, sc1, scl, so_pair, so0, so1, so_split,
                      REVERSE: tl.constexpr, SCALE_BY_C: tl.constexpr,
                      BLOCK_L: tl.constexpr, BLOCK_I: tl.constexpr):
    outer = tl.program_id(0).to(tl.int64)
    inner = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    part = tl.program_id(2)
    inner_ok = inner < n_inner
    x_ptr += outer * sx0 + inner.to(tl.int64) * sx1
    c_ptr += outer * sc0 + inner.to(tl.int64) * sc1
    rows = tl.arange(0, BLOCK_L)
    state = _widen(tl.zeros([BLOCK_I], dtype=x_ptr.dtype.element_ty))
    product = state + 1.0
    start = part * split
    end = tl.minimum(L, start + split)
    for i0 in range(start, end, BLOCK_L):
        i = i0 + rows  # logical positions
        mask = (i < end)[:, None] & inner_ok[None, :]
        l = (L - 1 - i if REVERSE else i).to(tl.int64)[:, None]
        x = _widen(tl.load(x_ptr[None, :] + l * sxl, mask=mask, other=0.0))
        c = _widen(tl.load(c_ptr[None, :] + l * scl, mask=mask, other=1.0))
        if SCALE_BY_C:  # the gradient's map (linrec.distributed's backward): x is c * x
            x = x * c
        tile_c, tile_x = tl.associative_scan((c, x), axis=0, combine_fn=_combine)
        last = rows[:, None] == BLOCK_L - 1
        tile_c = tl.sum(tl.where(last, tile_c, 0.0), axis=0)
        tile_x = tl.sum(tl.where(last, tile_x, 0.0), axis=0)
        state = tile_c * state + tile_x
        product = product * tile_c
    out_ptr += outer * so0 + inner.to(tl.int64) * so1 + part.to(tl.int64) * so_split
    tl.store(out_ptr, product, mask=inner_ok)
    tl.store(out_ptr + so_pair, state, mask=inner_ok)


def _tile_shape(x: torch.Tensor, c: torch.Tensor) -> tuple[int, int, int]:
    """(BLOCK_L, BLOCK_I, num_warps): sequences side by side in memory share a tile, so that its
    loads are rows of neighbours; otherwise a tile is a run of one sequence."""
    if x.shape[1] > 1 and x.stride(1) == 1 and c.stride(1) in (0, 1):
        return 32, 64, 4
    block_l = min(2048, max(16, triton.next_power_of_2(x.shape[2])))
    return block_l, 1, max(1, min(8, block_l // 256))


def _launch(x, c, L, reverse, scale_by_c, pair_dtype):
    """Pairs (2, outer, inner, splits) of the (outer, inner, L) views x and c."""
    n_outer, n_inner = x.shape[0], x.shape[1]
    block_l, block_i, warps = _tile_shape(x, c)
    blocks = n_outer * triton.cdiv(n_inner, block_i)
    splits = max(1, min(triton.cdiv(L, block_l), triton.cdiv(_TARGET_PROGRAMS, blocks)))
    split = triton.cdiv(triton.cdiv(L, splits), block_l) * block_l
    splits = triton.cdiv(L, split)
    out = torch.empty((2, n_outer, n_inner, splits), dtype=pair_dtype, device=x.device)
    grid = (n_outer, triton.cdiv(n_inner, block_i), splits)
    wrap_triton(_shard_map_kernel)[grid](
        x, c, out, L, n_inner, split, *x.stride(), *c.stride(), *out.stride(),
        REVERSE=reverse, SCALE_BY_C=scale_by_c, BLOCK_L=block_l, BLOCK_I=block_i, num_warps=warps)
    return out


def triton_shard_map(inputs: torch.Tensor, coeffs: torch.Tensor, dim: int, reverse: bool,
                     scale_by_c: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(product of coeffs along dim, last state of the scan from zero) for real CUDA tensors of
    one shape, each of inputs' shape without dim, float32 (float64 for float64 storage). With
    scale_by_c the scan's inputs are coeffs * inputs."""
    pair_dtype = torch.promote_types(coeffs.dtype, torch.float32)
    dim %= inputs.dim()
    state_shape = inputs.shape[:dim] + inputs.shape[dim + 1:]
    L = inputs.shape[dim]
    (x, _), (c, _) = (_seq_view(t, dim) for t in (inputs, coeffs))
    pairs = _launch(x, c, L, reverse, scale_by_c, pair_dtype)
    if pairs.shape[-1] > 1:  # the splits' pairs, in scan order: a sequence of steps of its own
        pairs = _launch(pairs[1], pairs[0], pairs.shape[-1], False, False, pair_dtype)
    return pairs[0].reshape(state_shape), pairs[1].reshape(state_shape)
