"""Packed variable-length sequences (cu_seqlens) and log-space coefficients (log_coeffs),
against the float64 loop of tests/reference.py run segment by segment."""

import math
import random

import pytest
import torch

import linrec
from reference import reference, reference_with_grads, rel_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_cu_seqlens(length, segments, rng, device="cpu"):
    """segments - 1 random cuts of [0, length] (repeats give empty segments)."""
    cuts = sorted(rng.randint(0, length) for _ in range(segments - 1))
    return torch.tensor([0, *cuts, length], dtype=torch.int64, device=device)


def segments_reference(x, c, reverse, dim, initial, cu):
    """Each segment through the reference on its own, from its initial state."""
    bounds = cu.tolist()
    pieces = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        h = None if initial is None else initial.select(dim, k)
        pieces.append(reference(x.narrow(dim, a, b - a), c.narrow(dim, a, b - a), reverse, dim=dim, initial=h))
    return torch.cat(pieces, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_initial", [False, True])
def test_segments_match_the_loop(device, dim, reverse, with_initial):
    rng = random.Random(dim * 4 + reverse * 2 + with_initial)
    shape = [3, 5, 4]
    shape[dim] = 37
    x = torch.randn(shape, dtype=torch.float64, device=device)
    c = torch.rand(shape, dtype=torch.float64, device=device)
    cu = random_cu_seqlens(37, 7, rng, device)
    h_shape = list(shape)
    h_shape[dim] = 7
    h = torch.randn(h_shape, dtype=torch.float64, device=device) if with_initial else None
    y = linrec.linrec(x, c, reverse, dim=dim, initial=h, cu_seqlens=cu)
    assert rel_error(y, segments_reference(x, c, reverse, dim, h, cu)) < 1e-12


def test_segments_views_broadcast_and_empty_segments():
    """A transposed (non-contiguous) view, one coefficient a channel, a broadcast initial state,
    int32 boundaries with empty segments at the start, middle and end."""
    x = torch.randn(41, 6, dtype=torch.float64).t()  # (6, 41), strided
    c = torch.rand(6, 1, dtype=torch.float64)
    cu = torch.tensor([0, 0, 9, 9, 30, 41, 41], dtype=torch.int32)
    h = torch.randn(1, 6, dtype=torch.float64)
    y = linrec.linrec(x, c, initial=h, cu_seqlens=cu)
    assert rel_error(y, segments_reference(x, c.expand(6, 41), False, 1, h.expand(6, 6), cu)) < 1e-12


@pytest.mark.parametrize("reverse", [False, True])
def test_segments_gradients(reverse):
    """gradcheck of inputs, coeffs and the per-segment initial states, one segment empty."""
    x = torch.randn(2, 13, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(2, 13, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    h = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor([0, 4, 4, 9, 13])
    assert torch.autograd.gradcheck(lambda x, c, h: linrec.linrec(x, c, reverse, initial=h, cu_seqlens=cu),
                                    (x, c, h))


@pytest.mark.parametrize("device", DEVICES)
def test_segments_gradients_against_the_loop(device):
    x = torch.randn(4, 50, dtype=torch.float32, device=device, requires_grad=True)
    c = torch.rand(4, 50, dtype=torch.float32, device=device, requires_grad=True)
    h = torch.randn(4, 6, dtype=torch.float32, device=device, requires_grad=True)
    cu = random_cu_seqlens(50, 6, random.Random(3), device)
    g = torch.randn(4, 50, device=device)
    ours = torch.autograd.grad(linrec.linrec(x, c, initial=h, cu_seqlens=cu), (x, c, h), g)
    leaves = [t.detach().double().requires_grad_() for t in (x, c, h)]
    want = torch.autograd.grad(segments_reference(*leaves[:2], False, 1, leaves[2], cu), leaves, g.double())
    for a, b in zip(ours, want):
        assert rel_error(a, b) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_log_coeffs(device, reverse):
    """log_coeffs=True scans exp(coeffs): a full tensor, one a channel and a number; gradients
    for the log-coefficients against the loop's through exp."""
    x = torch.randn(3, 29, dtype=torch.float64, device=device)
    for log_c in (-torch.rand(3, 29, dtype=torch.float64, device=device),
                  -torch.rand(3, 1, dtype=torch.float64, device=device), -0.3):
        want = reference(x, torch.exp(torch.as_tensor(log_c, dtype=torch.float64, device=device)).expand(3, 29), reverse)
        assert rel_error(linrec.linrec(x, log_c, reverse, log_coeffs=True), want) < 1e-12
    log_c = -torch.rand(3, 1, dtype=torch.float64, device=device, requires_grad=True)
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, lc: linrec.linrec(x, lc, reverse, log_coeffs=True), (xg, log_c))


def test_log_coeffs_16bit_keeps_decays_near_one():
    """bfloat16 log gates near 0 (decays near 1, which bfloat16 rounds to 1) are exponentiated in
    float32: the scan keeps them; the gradient comes back in bfloat16."""
    x = torch.ones(2, 2000, dtype=torch.bfloat16)
    log_c = torch.full((2, 2000), -1e-3, dtype=torch.bfloat16, requires_grad=True)
    y = linrec.linrec(x, log_c, log_coeffs=True)
    want = reference(x.double(), torch.exp(log_c.detach().double()))
    rounded = reference(x.double(), torch.exp(log_c.detach().double()).to(torch.bfloat16).double())
    assert rel_error(y, want) < 1e-2 < rel_error(rounded, want) / 2
    y.sum().backward()
    assert log_c.grad.dtype == torch.bfloat16 and log_c.grad.shape == log_c.shape


def test_complex_log_coeffs_with_segments():
    """A complex log (log|c| + i angle) with packed segments and reverse."""
    x = torch.randn(2, 30, dtype=torch.complex128)
    c = torch.rand(2, 30, dtype=torch.float64) * torch.exp(1j * torch.rand(2, 30, dtype=torch.float64))
    cu = torch.tensor([0, 11, 30])
    y = linrec.linrec(x, torch.log(c), True, log_coeffs=True, cu_seqlens=cu)
    want = torch.empty_like(x)  # the complex loop, segment by segment, in reverse
    for a, b in ((0, 11), (11, 30)):
        state = torch.zeros(2, dtype=torch.complex128)
        for l in range(b - 1, a - 1, -1):
            state = c[:, l] * state + x[:, l]
            want[:, l] = state
    assert (y - want).abs().max() / want.abs().max() < 1e-12


BAD = [
    (dict(cu_seqlens=[0, 5, 10]), "cu_seqlens must be a 1-D integer tensor"),
    (dict(cu_seqlens=torch.tensor([[0, 10]])), "cu_seqlens must be a 1-D tensor"),
    (dict(cu_seqlens=torch.tensor([0.0, 10.0])), "cu_seqlens has dtype torch.float32"),
    (dict(cu_seqlens=torch.tensor([1, 10])), "cu_seqlens must start at 0 and end at"),
    (dict(cu_seqlens=torch.tensor([0, 9])), "cu_seqlens must start at 0 and end at"),
    (dict(cu_seqlens=torch.tensor([0, 6, 4, 10])), "cu_seqlens must be nondecreasing"),
    (dict(cu_seqlens=torch.tensor([0, 10], device="meta")), "cu_seqlens is on meta"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10]), initial=torch.zeros(2, 3)), "initial holds one state a segment"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10]), initial=1j), "initial must be a tensor or a real number"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10]), initial=10**400), r"initial \(int\) is too large for a float"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10]), initial=torch.zeros(2, 2, dtype=torch.complex64)), "initial is complex"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10]), initial=torch.zeros(2, 2, device="meta")), "initial is on meta"),
    (dict(log_coeffs=1.0), "log_coeffs must be a bool"),
]


@pytest.mark.parametrize("kwargs,message", BAD, ids=[m for _, m in BAD])
def test_bad_arguments_name_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        linrec.linrec(torch.randn(2, 10), 0.5, **kwargs)


def test_log_coeffs_overflow_names_coeffs():
    with pytest.raises(ValueError, match="coeffs"):
        linrec.linrec(torch.randn(2, 10), 1e6, log_coeffs=True)
    with pytest.raises(ValueError, match="coeffs has dtype torch.int64"):
        linrec.linrec(torch.randn(2, 10), torch.zeros(2, 10, dtype=torch.int64), log_coeffs=True)


def test_compile_traces_both_options_with_dynamic_segments():
    """torch.compile(fullgraph=True, dynamic=True) traces cu_seqlens and log_coeffs; a different
    number of segments reuses the graph's symbolic shapes."""
    fn = torch.compile(lambda x, lc, cu, h: linrec.linrec(x, lc, log_coeffs=True, cu_seqlens=cu, initial=h),
                       fullgraph=True, dynamic=True)
    for segments in (3, 5):
        x = torch.randn(2, 24, dtype=torch.float64)
        log_c = -torch.rand(2, 24, dtype=torch.float64)
        cu = random_cu_seqlens(24, segments, random.Random(segments))
        h = torch.randn(2, segments, dtype=torch.float64)
        want = segments_reference(x, log_c.exp(), False, 1, h, cu)
        assert rel_error(fn(x, log_c, cu, h), want) < 1e-12


@pytest.mark.gpu
def test_segments_across_tiles_and_thousands_of_segments():
    """Boundaries inside and across the kernels' tiles and blocks: long rows (chained kernels),
    channel-last data (strided kernels) and 3000 short segments, bfloat16 and float32."""
    rng = random.Random(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for shape, dim, segments in (((2, 70000), 1, 9), ((4, 9000, 33), 1, 40), ((3, 30000), 1, 3000)):
            x = torch.randn(shape, device="cuda").to(dtype)
            c = (torch.rand(shape, device="cuda") * 0.2 + 0.8).to(dtype)
            cu = random_cu_seqlens(shape[dim], segments, rng, "cuda")
            h_shape = list(shape)
            h_shape[dim] = segments
            h = torch.randn(h_shape, device="cuda").to(dtype)
            for reverse in (False, True):
                y = linrec.linrec(x, c, reverse, dim=dim, initial=h, cu_seqlens=cu)
                want = segments_reference(x.cpu().double(), c.cpu().double(), reverse, dim, h.cpu().double(),
                                          cu.cpu())
                assert rel_error(y.cpu(), want) < tol, (dtype, shape, reverse)


def test_no_segments_and_one_segment_agree():
    x, c = torch.randn(3, 17, dtype=torch.float64), torch.rand(3, 17, dtype=torch.float64)
    h = torch.randn(3, dtype=torch.float64)
    one = linrec.linrec(x, c, initial=h.unsqueeze(1), cu_seqlens=torch.tensor([0, 17]))
    assert rel_error(one, linrec.linrec(x, c, initial=h)) < 1e-14
    assert math.isclose(rel_error(one, reference(x, c, initial=h)), 0, abs_tol=1e-12)


def segments_reference_with_grads(x, c, dy, reverse, dim, cu):
    """Outputs and (d_inputs, d_coeffs) of independent segments from zero states, float64: the
    ops' contract for `cuts` (the coefficient at a segment's first step is not used: gradient 0)."""
    bounds = cu.tolist()
    outs = [[], [], []]
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        y, dx, dc, _ = reference_with_grads(*(t.narrow(dim, a, b - a) for t in (x, c, dy)), reverse, dim)
        for out, t in zip(outs, (y, dx, dc)):
            out.append(t)
    return [torch.cat(out, dim) for out in outs]


def cuts_of(cu, length, reverse, device):
    """The ops' cuts for cu_seqlens: a flag at each nonempty segment's first step in scan order."""
    cuts = torch.zeros(length, dtype=torch.bool, device=device)
    for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:]):
        if b > a:
            cuts[b - 1 if reverse else a] = True
    return cuts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_cut_flags_match_the_loop(device, reverse):
    """The flags the kernels get: one at each nonempty segment's first step in scan order, none
    for empty segments (at the start, the end, between), from int32 and int64 cu_seqlens."""
    from linrec._segments import cut_flags

    rng = random.Random(1)
    for cu in ([0, 0, 0, 5, 5, 9, 9], [0, 9], [0, 1, 2, 3, 9], [0, 0, 9, 9]) + tuple(
            random_cu_seqlens(50, 12, rng).tolist() for _ in range(20)):
        length = cu[-1]
        for dtype in (torch.int32, torch.int64):
            got = cut_flags(torch.tensor(cu, dtype=dtype, device=device), length, reverse, device)
            assert torch.equal(got.cpu(), cuts_of(torch.tensor(cu), length, reverse, "cpu")), (cu, dtype)


@pytest.mark.gpu
def test_packed_call_captured_in_a_cuda_graph():
    """A packed call adds no host sync or host-to-device copy: it replays from a CUDA graph."""
    x = torch.randn(4, 3000, device="cuda")
    c = torch.rand(4, 3000, device="cuda") * 0.5 + 0.5
    cu = torch.tensor([0, 7, 7, 1500, 2999, 3000], device="cuda")
    want = linrec.linrec(x, c, reverse=True, cu_seqlens=cu)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = linrec.linrec(x, c, reverse=True, cu_seqlens=cu)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)


def check_ops_with_cuts(fwd, bwd, shape, dim, values, coeffs, reverse, segments, tol, device, seed=0):
    """fwd(x, c, cuts) and bwd(dy, c, y, cuts) against the segments' float64 loops; outputs poisoned."""
    rng = random.Random(seed)
    x = torch.randn(shape).to(device=device, dtype=values)
    c = (torch.rand(shape) * 0.3 + 0.7).to(device=device, dtype=coeffs)
    dy = torch.randn(shape).to(device=device, dtype=values)
    cu = random_cu_seqlens(shape[dim], segments, rng)
    cuts = cuts_of(cu, shape[dim], reverse, device)
    if device == "cuda":
        blocks = [torch.full((4 * x.numel(),), float("nan"), device=device) for _ in range(6)]
        del blocks
    y = fwd(x, c, cuts)
    d_inputs, d_coeffs = bwd(dy, c, y, cuts)[:2]
    want = segments_reference_with_grads(*(t.cpu().double() for t in (x, c, dy)), reverse, dim, cu)
    for got, ref in zip((y, d_inputs, d_coeffs), want):
        assert rel_error(got.cpu(), ref) < tol


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_cpu_op_takes_cuts(reverse, dim):
    """The CPU kernel's cuts, rows and channel-last, float32 and bfloat16 beside float32."""
    for values, coeffs, tol in ((torch.float32, torch.float32, 1e-5), (torch.bfloat16, torch.float32, 2e-2)):
        check_ops_with_cuts(
            lambda x, c, cuts: torch.ops.linrec.linrec_fwd(x, c, None, dim, reverse, 0, 0, 0, 0, 3, cuts=cuts),
            lambda g, c, y, cuts: torch.ops.linrec.linrec_bwd(g, c, y, None, dim, reverse, 0, 0, 0, 0, 3, cuts=cuts),
            (61, 7) if dim == 0 else (7, 61), dim, values, coeffs, reverse, 9, tol, "cpu")


def test_op_refuses_bad_cuts():
    x, c = torch.randn(3, 10), torch.rand(3, 10)
    args = (None, -1, 0, 0, 0, 0, 0, 3)
    with pytest.raises(RuntimeError, match="cuts must be 1-D, one element a step: 10"):
        torch.ops.linrec.linrec_fwd(x, c, *args, cuts=torch.zeros(9, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="cuts must be a bool or uint8 tensor"):
        torch.ops.linrec.linrec_fwd(x, c, *args, cuts=torch.zeros(10))
    with pytest.raises(RuntimeError, match="cuts and initial exclude each other"):
        torch.ops.linrec.linrec_fwd(x, c, torch.zeros(3), *args[1:], cuts=torch.zeros(10, dtype=torch.bool))


def test_opcheck_with_cuts():
    x, c = torch.randn(2, 3, 19), torch.rand(2, 3, 19)
    cuts = cuts_of(torch.tensor([0, 5, 5, 19]), 19, True, "cpu")
    torch.library.opcheck(torch.ops.linrec.linrec_fwd, (x, c, None, -1, 1, 0, 0, 0, 0, 3), {"cuts": cuts})
    y = torch.ops.linrec.linrec_fwd(x, c, None, -1, 1, 0, 0, 0, 0, 3, cuts=cuts)
    torch.library.opcheck(torch.ops.linrec.linrec_bwd, (torch.randn_like(x), c, y, None, -1, 1, 0, 0, 0, 0, 3),
                          {"cuts": cuts})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test below runs Triton on CUDA tensors")
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_cuts_interpreted(reverse):
    """Triton's kernels with HAS_CUTS, in Triton's interpreter on CPU tensors (conftest.py)."""
    pytest.importorskip("linrec.impl.triton")
    check_ops_with_cuts(lambda x, c, cuts: torch.ops.linrec.triton_fwd(x, c, None, 1, reverse, True, False, cuts),
                        lambda g, c, y, cuts: torch.ops.linrec.triton_bwd(g, c, y, None, 1, reverse, True, False, cuts),
                        (3, 45), 1, torch.float32, torch.float32, reverse, 6, 1e-5, "cpu")


# Each CUDA family with cuts: (family, config or None for its default, shape, dim, segments); the
# chained and strided kernels in registers and staged, their tiles and chunks cut inside and across.
# The tile, pipe and staged chained kernels read the cuts as bits, a thread's flags from one
# word: configs of 4 to 64 steps a thread (a 64-bit word at 64), each memory strategy, odd lengths.
CUT_CASES = [("ref", None, (5, 300), 1, 7), ("tile", None, (5, 2000), 1, 30), ("pipe", None, (3, 9001), 1, 40),
             ("tile", (4, 256, 0, 3), (5, 1001), 1, 20), ("pipe", (4, 64, 0, 3), (3, 9001), 1, 40),
             ("pipe", (8, 64, 2, 3), (3, 5003), 1, 60), ("pipe", (16, 256, 1, 3), (2, 20001), 1, 40),
             ("chained", None, (1, 70001), 1, 50), ("chained", (16, 128, 3, 3), (1, 70001), 1, 50),
             ("chained", (64, 128, 3, 3), (1, 70001), 1, 50), ("chained", (32, 256, 3, 3), (2, 40001), 1, 30),
             ("strided", None, (3001, 40), 0, 60), ("strided", None, (3001, 64), 0, 60),
             ("strided", (8, 128, 0, 3), (3001, 64), 0, 60), ("packed", None, (100, 77), 1, 9)]


@pytest.mark.gpu
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("storage", ["float32", "bfloat16", "bfloat16+float32", "log float32", "log bfloat16"])
def test_gpu_families_take_cuts(reverse, storage):
    from linrec._registry import FAMILIES

    log = storage.startswith("log ")
    values, _, coeffs = storage.removeprefix("log ").partition("+")
    values, coeffs = getattr(torch, values), getattr(torch, coeffs or values)
    tol = 1e-5 if values == torch.float32 else 2e-2
    for family, config, shape, dim, segments in CUT_CASES:
        f = FAMILIES[family]
        kernel = (f.id, *(config or f.default_config or (0, 0, 0, 3)))
        take = (lambda c: c.log()) if log else (lambda c: c)

        def fwd(x, c, cuts):
            return torch.ops.linrec.linrec_fwd(x, take(c), None, dim, reverse, *kernel, log, cuts)

        def bwd(g, c, y, cuts):
            dx, dc, _ = torch.ops.linrec.linrec_bwd(g, take(c), y, None, dim, reverse, *kernel, log, cuts)
            return dx, dc / c if log else dc  # the gradient of log c is c times that of c

        check_ops_with_cuts(fwd, bwd, shape, dim, values, coeffs, reverse, segments, tol, "cuda")
    pytest.importorskip("linrec.impl.triton")  # registers the Triton ops
    check_ops_with_cuts(lambda x, c, cuts: torch.ops.linrec.triton_fwd(x, c, None, 1, reverse, True, False, cuts),
                        lambda g, c, y, cuts: torch.ops.linrec.triton_bwd(g, c, y, None, 1, reverse, True, False, cuts),
                        (3, 9001), 1, values, coeffs, reverse, 40, tol, "cuda")
