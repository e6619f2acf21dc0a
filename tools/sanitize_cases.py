"""A small set of kernel calls for compute-sanitizer (memcheck, racecheck).

Every kernel family (CUDA and Triton), both directions, partial tiles, misaligned views and aligned
rows; packed sequences on the tile, pipe and staged chained kernels; complex storage on the
strided, staged chained, tile, packed and ref kernels, fwd and bwd; the selective scan at every
compiled config, with partial warps, partial chunks, groups and per-channel B and C.

    compute-sanitizer --tool memcheck python -m tools sanitize-cases [--packed-only]
"""

import argparse

import torch

import linrec
from linrec._registry import FAMILIES
from linrec._segments import cut_flags
from linrec.impl import cuda, triton


def packed_sequences(x, c, reverse):
    """Packed sequences on every tile, pipe and staged chained config, which read the cuts packed
    into bits by a kernel of their own: lengths that are no multiple of 64 (a partial last word);
    the chained rows span several tiles."""
    long_x, long_c = (torch.cat([t] * 20, dim=-1) for t in (x, c))
    for kernel, configs in (("tile", linrec.compiled_configs()), ("pipe", linrec.compiled_configs()),
                            ("chained", [k for k in linrec.compiled_configs("chained") if k[2] == 3])):
        xs, cs = (long_x, long_c) if kernel == "chained" else (x, c)
        length = xs.shape[-1]
        cuts = cut_flags(torch.tensor([0, 5, 37, 500, length // 2, length], device="cuda"), length, reverse, "cuda")
        for e, t, m, a in configs:
            if kernel == "tile" and e * t < length:
                continue
            config = (FAMILIES[kernel].id, e, t, m, a)
            y = torch.ops.linrec.linrec_fwd(xs, cs, None, 1, reverse, *config, False, cuts)
            torch.ops.linrec.linrec_bwd(torch.randn_like(y), cs, y, None, 1, reverse, *config, False, cuts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools sanitize-cases", description=__doc__.splitlines()[0])
    parser.add_argument("--packed-only", action="store_true", help="only the packed sequences' cases")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.randn(3, 1031, device="cuda").to(dtype)
        x = base[:, 1:]  # misaligned start, odd length
        c = (torch.rand_like(base) * 0.5 + 0.5)[:, 1:]
        h0 = torch.randn(3, device="cuda").to(dtype)
        for reverse in (False, True):
            packed_sequences(x, c, reverse)
            if args.packed_only:
                continue
            for e, t, m, a in linrec.compiled_configs():
                kw = dict(elems_per_thread=e, threads_per_block=t, memcode=m, algocode=a)
                for fn in (cuda.linrec_tile, cuda.linrec_pipe, cuda.linrec_chained):
                    if fn is cuda.linrec_tile and e * t < x.shape[-1]:
                        continue
                    leaves = [v.clone().requires_grad_() for v in (x, c, h0)]
                    fn(*leaves[:2], reverse, initial=leaves[2], **kw).sum().backward()
            # The one-tile forward over aligned rows (vector configs, lengths a multiple of
            # elems_per_thread): a whole tile, and one whose last thread holds nothing.
            for e, t, m, a in linrec.compiled_configs():
                if m != 1:
                    continue
                for length in (e * t, e * t - e):
                    leaves = [torch.randn(3, length, device="cuda").to(dtype).requires_grad_() for _ in range(2)]
                    cuda.linrec_tile(*leaves, reverse, elems_per_thread=e, threads_per_block=t, memcode=m,
                                     algocode=a).sum().backward()
            # Strided: channel-last (T, D) over dim 0, 3 channels (one a lane) and, for 16-bit
            # storage, 66 (two a lane, a partial group); packed: sequences of 100 elements.
            xt, ct = x.t().contiguous(), c.t().contiguous()
            xw = torch.randn(1030, 66, device="cuda").to(dtype)
            cw = (torch.rand_like(xw) * 0.5 + 0.5).to(dtype)
            hw = torch.randn(66, device="cuda").to(dtype)
            for e, t, m, a in linrec.compiled_configs("strided"):
                for inputs in ((xt, ct, h0), (xw, cw, hw)):
                    leaves = [v.clone().requires_grad_() for v in inputs]
                    cuda.linrec_strided(*leaves[:2], reverse, dim=0, initial=leaves[2], elems_per_thread=e,
                                        threads_per_block=t, memcode=m, algocode=a).sum().backward()
            # Dense rows of at most 16 bytes (4 channels): the warp-range staging kernel, with a
            # full d_outputs so that the backward takes it too.
            xd = torch.randn(1032, 4, device="cuda").to(dtype)
            cd = (torch.rand_like(xd) * 0.5 + 0.5).to(dtype)
            for e, t, m, a in linrec.compiled_configs("strided"):
                leaves = [v.clone().requires_grad_() for v in (xd, cd, hw[:4])]
                y = cuda.linrec_strided(*leaves[:2], reverse, dim=0, initial=leaves[2], elems_per_thread=e,
                                        threads_per_block=t, memcode=m, algocode=a)
                y.backward(torch.randn_like(y))
            for e, t, m, a in linrec.compiled_configs("packed"):
                leaves = [v.clone().requires_grad_() for v in (x[:, :100], c[:, :100], h0)]
                cuda.linrec_packed(*leaves[:2], reverse, initial=leaves[2], elems_per_thread=e,
                                   threads_per_block=t, memcode=m, algocode=a).sum().backward()
            # Chained over 512 tiles of 256: look-back past its first window of 32 tiles.
            xl = torch.randn(2, 2**17 + 3, device="cuda").to(dtype)
            cl = (torch.rand_like(xl) * 0.5 + 0.5).to(dtype)
            leaves = [v.clone().requires_grad_() for v in (xl, cl)]
            cuda.linrec_chained(*leaves, reverse, elems_per_thread=4, threads_per_block=64, memcode=1,
                                algocode=3).sum().backward()
            # Chained tiles staged in shared memory (memcode 3): a misaligned start (copied
            # element by element), and an aligned one over 17-65 tiles (cp.async), each with a partial tile.
            for e, t, m, a in linrec.compiled_configs("chained"):
                if m != 3:
                    continue
                for inputs in ((x, c), (xl, cl)):
                    leaves = [v.clone().requires_grad_() for v in inputs]
                    cuda.linrec_chained(*leaves, reverse, elems_per_thread=e, threads_per_block=t, memcode=m,
                                        algocode=a).sum().backward()
            leaves = [v.clone().requires_grad_() for v in (x, c, h0)]
            cuda.linrec_ref(*leaves[:2], reverse, initial=leaves[2]).sum().backward()
            for fn in (triton.linrec_tile, triton.linrec_pipe):
                leaves = [v.clone().requires_grad_() for v in (x, c, h0)]
                fn(*leaves[:2], reverse, initial=leaves[2]).sum().backward()
    if args.packed_only:
        return 0
    # Complex storage: channel-last, 66 channels and 3; rows of several chained tiles, aligned and
    # misaligned; short rows on the tile and packed kernels.
    for reverse in (False, True):
        xr = torch.randn(3, 9001, device="cuda", dtype=torch.complex64)
        cr = torch.polar(torch.rand(3, 9001, device="cuda") * 0.5 + 0.5, torch.rand(3, 9001, device="cuda") * 6)
        hr = torch.randn(3, device="cuda", dtype=torch.complex64)
        for e, t, m, a in linrec.compiled_configs("chained"):
            for inputs in ((xr[:, :-1], cr[:, :-1], hr), (xr[:, 1:], cr[:, 1:], hr)):
                if m == 3:
                    leaves = [v.clone().requires_grad_() for v in inputs]
                    y = cuda.linrec_chained(*leaves[:2], reverse, initial=leaves[2], elems_per_thread=e,
                                            threads_per_block=t, memcode=m, algocode=a)
                    y.backward(torch.randn_like(y))
        xz = torch.randn(1030, 66, device="cuda", dtype=torch.complex64)
        cz = torch.polar(torch.rand(1030, 66, device="cuda") * 0.5 + 0.5, torch.rand(1030, 66, device="cuda") * 6)
        hz = torch.randn(66, device="cuda", dtype=torch.complex64)
        for inputs in ((xz, cz, hz), (xz[:, :3], cz[:, :3], hz[:3])):
            for e, t, m, a in linrec.compiled_configs("strided"):
                leaves = [v.clone().requires_grad_() for v in inputs]
                y = cuda.linrec_strided(*leaves[:2], reverse, dim=0, initial=leaves[2], elems_per_thread=e,
                                        threads_per_block=t, memcode=m, algocode=a)
                y.backward(torch.randn_like(y))
            leaves = [v.clone().requires_grad_() for v in inputs]
            y = cuda.linrec_ref(*leaves[:2], reverse, dim=0, initial=leaves[2])
            y.backward(torch.randn_like(y))
        # Tile and packed: rows at each config's capacity (the aligned-rows kernels) and a misaligned
        # view just short of it (the general kernels).
        for fn, kernel, capacity in ((cuda.linrec_tile, "tile", lambda e, t: e * t),
                                     (cuda.linrec_packed, "packed", lambda e, t: 32 * e)):
            for e, t, m, a in linrec.compiled_configs(kernel, torch.complex64):
                n = capacity(e, t)
                for inputs in ((xr[:, :n], cr[:, :n], hr), (xr[:, 1:n], cr[:, 1:n], hr)):
                    leaves = [v.clone().requires_grad_() for v in inputs]
                    y = fn(*leaves[:2], reverse, initial=leaves[2], elems_per_thread=e, threads_per_block=t,
                           memcode=m, algocode=a)
                    y.backward(torch.randn_like(y))
    selective_cases()
    torch.cuda.synchronize()
    print("sanitize cases done")
    return 0


def selective_cases():
    """The selective scan's ops at each compiled config, 300 steps (a partial chunk, three
    checkpoints), 17 states, 16-bit and float32: 37 channels (a partial last block) with
    per-step B in 37 groups (d_B added by each warp) beside per-channel C; 40 channels with
    per-channel B beside per-step C in one group (d_C added through the block's shared sums);
    40 channels with both per step in one group (B and C through the block's shared tiles)."""
    fwd, bwd = torch.ops.linrec.selective_scan_fwd, torch.ops.linrec.selective_scan_bwd
    batch, states, length = 2, 17, 300
    for dtype in (torch.float32, torch.bfloat16):
        for config in linrec._C_cuda.selective_configs():
            for dim, b_form, c_form in ((37, "groups", "channel"), (40, "channel", "one group"),
                                        (40, "one group", "one group")):
                def make(form):
                    if form == "channel":
                        return torch.randn(dim, states, device="cuda")
                    groups = dim if form == "groups" else 1
                    return torch.randn(batch, groups, states, length, device="cuda").to(dtype)
                u, delta, z, d_y = (torch.randn(batch, dim, length, device="cuda").to(dtype) for _ in range(4))
                A = -torch.rand(dim, states, device="cuda")
                D, bias = torch.randn(dim, device="cuda"), torch.randn(dim, device="cuda")
                h0 = torch.randn(batch, dim, states, device="cuda")
                for reverse in (0, 1):
                    args = (u, delta, A, make(b_form), make(c_form), D, z, bias, h0)
                    _, _, checkpoints = fwd(*args, True, reverse, *config)
                    bwd(d_y, h0, *args, checkpoints, True, reverse, *config)


if __name__ == "__main__":
    raise SystemExit(main())
