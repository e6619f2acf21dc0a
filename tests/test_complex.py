"""Complex recurrences (linrec._complex) against a step-by-step complex128 loop written here, on
the CPU and, where there is one, the GPU: values, gradients (zero coefficients included), forward
tangents, layouts, long sequences and errors."""

import os

import pytest
import torch

import linrec
import linrec._complex
from linrec._registry import FAMILIES
from linrec.impl.python import linrec_hop
from reference import poison

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# The Triton kernels run in Triton's interpreter on CPU tensors without a GPU (conftest.py).
TRITON_DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def loop(x, c, reverse=False, dim=-1, initial=None):
    """y[l] = c[l] * y[l-1] + x[l] along dim, one step at a time in complex128 (differentiable)."""
    x = x.to(torch.complex128)
    c = torch.broadcast_to(torch.as_tensor(c, dtype=torch.complex128, device=x.device), x.shape)
    x, c = x.movedim(dim, -1), c.movedim(dim, -1)
    state = torch.zeros_like(x[..., 0]) if initial is None else initial.to(torch.complex128).expand(x.shape[:-1])
    out = [None] * x.shape[-1]
    for l in (range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])):
        state = c[..., l] * state + x[..., l]
        out[l] = state
    return torch.stack(out, -1).movedim(-1, dim)


def crandn(*shape, device="cpu", dtype=torch.complex128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.complex128).to(device=device, dtype=dtype)


def decays(*shape, device="cpu", dtype=torch.complex128, seed=1):
    """Coefficients r e^{i theta}, r in (0.5, 1), theta in (-pi, pi): stable, rotating."""
    g = torch.Generator().manual_seed(seed)
    r = 0.5 + 0.5 * torch.rand(*shape, generator=g, dtype=torch.float64)
    theta = (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * torch.pi
    return torch.polar(r, theta).to(device=device, dtype=dtype)


def rel_err(y, ref):
    return ((y.to(torch.complex128) - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.complex128, 1e-12), (torch.complex64, 2e-6)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [1, 37, 1000])
def test_complex_matches_loop(device, dtype, tol, reverse, length):
    x = crandn(3, 5, length, device=device, dtype=dtype)
    c = decays(3, 5, length, device=device, dtype=dtype)
    initial = crandn(3, 5, device=device, dtype=dtype, seed=2)
    poison(device, x.numel() * x.element_size())
    y = linrec.linrec(x, c, reverse, initial=initial)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, loop(x, c, reverse, initial=initial)) < tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["channel-last", "transposed view", "scalar coeff", "per-channel real coeffs",
                                  "zero coefficients"])
def test_complex_layouts_and_broadcasts(device, case):
    x = crandn(4, 300, 6, device=device)  # (batch, time, channels), scanned over time
    c = decays(4, 300, 6, device=device)
    dim, initial = 1, None
    if case == "transposed view":
        x, c, dim = x.transpose(1, 2), c.transpose(1, 2), 2  # strided along time
        initial = crandn(4, 6, device=device, seed=3)
    elif case == "scalar coeff":
        c = 0.9 * torch.exp(torch.tensor(0.3j)).item()  # a Python complex
    elif case == "per-channel real coeffs":
        c = torch.linspace(0.5, 0.99, 6, dtype=torch.float64, device=device)
    elif case == "zero coefficients":
        c = c.clone()
        c[:, ::7] = 0  # state resets
    y = linrec.linrec(x, c, dim=dim, initial=initial)
    assert rel_err(y, loop(x, c, dim=dim, initial=initial)) < 1e-12


@pytest.mark.parametrize("device", DEVICES)
def test_complex64_long_sequence_keeps_its_phase(device):
    """|c| near 1 and a steady rotation: by the end the phase has turned some 3 x 10^4 radians.
    Summed in float64 and wrapped before it is rounded, complex64 stays within float32 rounding
    over the memory of 2000 steps (1e-5 here on the CPU, 3.4e-5 on an H200 at 40000 steps);
    rounded unwrapped, the phase alone is off by 2e-3 radians there (5e-4 at 40000 steps)."""
    length = 100000
    c = torch.full((2, length), 0.9995 * torch.exp(torch.tensor(0.31j)).item(), dtype=torch.complex64)
    x = crandn(2, length, dtype=torch.complex64)
    y = linrec.linrec(x.to(device), c.to(device)).cpu()
    assert rel_err(y, loop(x, c)) < 2e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_complex_gradients_match_loop(device, reverse):
    """Gradients of inputs, coeffs (zeros among them: the polar form has no derivative there) and
    initial against autograd through the loop, for a complex weighting of the outputs."""
    x = crandn(3, 40, device=device).requires_grad_()
    c = decays(3, 40, device=device)
    c[:, 5] = 0
    c[1, 17] = 0
    c = c.requires_grad_()
    initial = crandn(3, device=device, seed=4).requires_grad_()
    w = crandn(3, 40, device=device, seed=5)
    got = torch.autograd.grad((linrec.linrec(x, c, reverse, initial=initial) * w).real.sum(), (x, c, initial))
    want = torch.autograd.grad((loop(x, c, reverse, initial=initial) * w).real.sum(), (x, c, initial))
    for name, a, b in zip(("inputs", "coeffs", "initial"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"d_{name}: {m}")


@pytest.mark.parametrize("reverse", [False, True])
def test_complex_gradcheck_reverse_and_forward_mode(reverse):
    x = crandn(2, 7).requires_grad_()
    c = decays(2, 7)
    c[0, 2] = 0
    c = c.requires_grad_()
    initial = crandn(2, seed=6).requires_grad_()

    def f(a, b, d):
        return linrec.linrec(a, b, reverse, initial=d)
    assert torch.autograd.gradcheck(f, (x, c, initial))
    assert torch.autograd.gradcheck(f, (x, c, initial), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_grad=False)


def test_complex_coeff_gradient_reduced_to_its_shape():
    x = crandn(4, 25)
    c = decays(4, 1).requires_grad_()  # one coefficient a sequence
    (g,) = torch.autograd.grad(linrec.linrec(x, c).abs().sum(), c)
    (want,) = torch.autograd.grad(loop(x, c).abs().sum(), c)
    assert g.shape == (4, 1)
    torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-12)


def test_complex_empty_sequence():
    x = crandn(2, 0).requires_grad_()
    y = linrec.linrec(x, 0.5j)
    assert y.shape == (2, 0) and y.dtype == torch.complex128
    (g,) = torch.autograd.grad(y.abs().sum(), x, allow_unused=True)
    assert g is None or g.shape == (2, 0)


def test_complex_compile_fullgraph():
    x = crandn(3, 33).requires_grad_()
    c = decays(3, 33).requires_grad_()
    compiled = torch.compile(lambda a, b: linrec.linrec(a, b, dim=-1), fullgraph=True, backend="aot_eager")
    got = compiled(x, c)
    torch.testing.assert_close(got, loop(x, c), rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad(got.abs().sum(), (x, c))
    g_want = torch.autograd.grad(loop(x, c).abs().sum(), (x, c))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda: linrec.linrec(torch.randn(2, 5), torch.full((2, 5), 0.5j)),
     "coeffs is complex .* but inputs is real"),
    (lambda: linrec.linrec(torch.randn(2, 5), 0.5j), "coeffs must be a tensor or a real number, got complex"),
    (lambda: linrec.linrec(torch.randn(2, 5), 0.5, initial=torch.ones(2, dtype=torch.complex64)),
     "initial is complex"),
    (lambda: linrec.linrec(torch.ones(2, 5, dtype=torch.complex32), 0.5), "inputs has dtype torch.complex32"),
    (lambda: linrec_hop(crandn(2, 5), 0.5), "inputs has dtype torch.complex128; expected one of float32"),
])
def test_complex_errors_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("dtype,tol", [(torch.complex128, 1e-12), (torch.complex64, 2e-6)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", ["contiguous", "transposed", "channel-last", "channel-last, 40 channels",
                                  "broadcast coeffs", "no initial", "empty"])
def test_triton_complex_kernels(dtype, tol, reverse, case):
    """The Triton forward and fused backward kernels called directly (several blocks a sequence:
    the interpreter's blocks hold 64 steps, 16 in channel-last programs), against the loop and
    autograd through it. Channel-last data takes programs of up to 32 neighbouring sequences (40:
    a full one and a partial one)."""
    pytest.importorskip("triton")
    from linrec.impl.triton_complex import complex_bwd as triton_complex_bwd
    from linrec.impl.triton_complex import complex_fwd as triton_complex_fwd
    if TRITON_DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    length = 0 if case == "empty" else 150
    x = crandn(2, 3, length, device=TRITON_DEVICE, dtype=dtype)
    c = decays(2, 3, length, device=TRITON_DEVICE, dtype=dtype)
    initial = None if case == "no initial" else crandn(2, 3, device=TRITON_DEVICE, dtype=dtype, seed=3)
    dim = 2
    if case == "transposed":
        x, c, dim = x.transpose(1, 2), c.transpose(1, 2), 1
        initial = initial.contiguous()
    elif case.startswith("channel-last"):
        channels, length = (40, 37) if "40" in case else (3, length)  # the interpreter is slow
        x = crandn(2, length, channels, device=TRITON_DEVICE, dtype=dtype)
        c = decays(2, length, channels, device=TRITON_DEVICE, dtype=dtype)
        initial, dim = crandn(2, channels, device=TRITON_DEVICE, dtype=dtype, seed=3), 1
    elif case == "broadcast coeffs":
        c = c[:1, :, :1].expand(x.shape)  # one coefficient a channel, stride 0 along the scan
    poison(TRITON_DEVICE, x.numel() * x.element_size())
    y = triton_complex_fwd(x, c, initial, dim, reverse)
    if length == 0:
        assert y.shape == x.shape
        d_initial = triton_complex_bwd(torch.zeros_like(x), c, y, initial, dim, reverse)[2]
        assert torch.equal(d_initial, torch.zeros_like(d_initial))
        return
    leaves = [t.detach().to(torch.complex128).requires_grad_() for t in (x, c)]
    h = None if initial is None else initial.detach().to(torch.complex128).requires_grad_()
    y_ref = loop(leaves[0], leaves[1], reverse, dim, h)
    assert rel_err(y, y_ref) < tol
    g = crandn(*x.shape, device=TRITON_DEVICE, dtype=dtype, seed=9)
    poison(TRITON_DEVICE, x.numel() * x.element_size())
    got = triton_complex_bwd(g, c, y, initial, dim, reverse)
    want = torch.autograd.grad(y_ref, leaves + ([h] if h is not None else []), g.to(torch.complex128))
    for name, a, b in zip(("inputs", "coeffs", "initial"), got, want):
        assert rel_err(a, b) < tol, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("path", ["compiled", "triton", "polar"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_complex_paths_gpu(monkeypatch, path, reverse, device):
    """Every GPU path of linrec.linrec on complex64, forced, through autograd: values and
    gradients against the loop. cuda:1 runs while cuda:0 is current: each path launches on the
    tensors' device."""
    if path == "compiled" and linrec._backend.cuda_backend(0) != "cuda":
        pytest.skip("the compiled CUDA kernels are not loaded")
    if device == "cuda:1" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    monkeypatch.setattr(linrec._complex, "complex_path", lambda x, dim: path)
    current = torch.cuda.current_device() if device == "cuda" else 0
    with torch.cuda.device(current):
        x = crandn(6, 2000, 4, device=device, dtype=torch.complex64).requires_grad_()
        c = decays(6, 2000, 4, device=device, dtype=torch.complex64)
        c[:, 100] = 0
        c = c.requires_grad_()
        initial = crandn(6, 4, device=device, dtype=torch.complex64, seed=3).requires_grad_()
        poison(device, x.numel() * x.element_size())
        y = linrec.linrec(x, c, reverse, dim=1, initial=initial)
        g = crandn(6, 2000, 4, dtype=torch.complex64, seed=8).to(device)
        poison(device, 2 * x.numel() * x.element_size())
        got = torch.autograd.grad(y, (x, c, initial), g)
    assert {t.device for t in (y, *got)} == {x.device}
    leaves = [t.detach().cpu().to(torch.complex128).requires_grad_() for t in (x, c, initial)]
    y_ref = loop(leaves[0], leaves[1], reverse, 1, leaves[2])
    assert rel_err(y.cpu(), y_ref) < 5e-6
    want = torch.autograd.grad(y_ref, leaves, g.cpu().to(torch.complex128))
    for name, a, b in zip(("inputs", "coeffs", "initial"), got, want):
        assert rel_err(a.cpu(), b) < 5e-6, name


@pytest.mark.parametrize("device,path", [("cpu", "compiled"), ("cpu", "polar")] + (
    [("cuda", "compiled"), ("cuda", "triton"), ("cuda", "polar")] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("reverse", [False, True])
def test_complex_gradgradcheck(monkeypatch, device, path, reverse):
    """Second derivatives on every path (create_graph=True), a zero coefficient included."""
    if path == "compiled" and device == "cuda" and linrec._backend.cuda_backend(0) != "cuda":
        pytest.skip("the compiled CUDA kernels are not loaded")
    monkeypatch.setattr(linrec._complex, "complex_path", lambda x, dim: path)
    x = crandn(2, 7, device=device).requires_grad_()
    c = decays(2, 7, device=device)
    c[0, 2] = 0
    c.requires_grad_()
    initial = crandn(2, device=device, seed=6).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda a, b, d: linrec.linrec(a, b, reverse, initial=d), (x, c, initial))


@pytest.mark.parametrize("device", DEVICES)
def test_complex_torch_func(device):
    """torch.func on the compiled op's complex path: vmap, and grad of a real loss in coeffs."""
    if device == "cuda" and linrec._backend.cuda_backend(0) != "cuda":
        pytest.skip("the compiled CUDA kernels are not loaded")
    x, c = crandn(4, 3, 20, device=device), decays(4, 3, 20, device=device)
    assert rel_err(torch.func.vmap(linrec.linrec)(x, c), loop(x, c)) < 1e-12
    got = torch.func.grad(lambda b: linrec.linrec(x, b).abs().pow(2).sum())(c)
    want = torch.func.grad(lambda b: loop(x, b).abs().pow(2).sum())(c)
    assert rel_err(got, want) < 1e-12
    torch._dynamo.reset()  # and inside torch.compile, where the transform runs eagerly
    compiled = torch.compile(torch.func.grad(lambda a, b: linrec.linrec(a, b).abs().pow(2).sum(), argnums=1),
                             backend="aot_eager")
    assert rel_err(compiled(x, c), want) < 1e-12


@pytest.mark.parametrize("path", ["polar", "triton"])
def test_complex_torch_func_fallbacks_raise(monkeypatch, path):
    """The fallback paths do not support torch.func: a NotImplementedError naming the path."""
    monkeypatch.setattr(linrec._complex, "complex_path", lambda x, dim: path)
    device = TRITON_DEVICE if path == "triton" else "cpu"
    x, c = crandn(4, 3, 20, device=device), decays(4, 3, 20, device=device)
    with pytest.raises(NotImplementedError, match="torch.func transforms .* run on the compiled kernels only"):
        torch.func.grad(lambda b: linrec.linrec(x, b).abs().pow(2).sum())(c)
    assert rel_err(linrec.linrec(x, c), loop(x, c)) < 1e-12  # outside a transform the path runs


def test_complex_rule(monkeypatch):
    """The compiled op wherever it is loaded (the CPU; CUDA with the compiled kernels); without
    them, Triton for at least as many CUDA sequences as SMs and two real scans for fewer."""
    path = linrec._backend.complex_path
    assert path(torch.empty(4, 64, dtype=torch.complex64), 1) == "compiled"
    if not torch.cuda.is_available():
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, few_rows = (torch.empty(n, 64, device="cuda", dtype=torch.complex64) for n in (sms, sms - 1))
    channel_last = torch.empty(2, 64, 8, device="cuda", dtype=torch.complex64)
    if linrec._backend.cuda_backend(0) == "cuda":
        assert path(rows, 1) == path(few_rows, 1) == path(channel_last, 1) == "compiled"
    monkeypatch.setattr(linrec._backend, "cuda_backend", lambda index: "triton")
    assert path(rows, 1) == "triton"
    assert path(few_rows, 1) == path(channel_last, 1) == "polar"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dim", [-1, 1])
def test_complex_inductor_gpu(dim):
    """torch.compile (inductor, fullgraph) of complex64 scans, rows and channel-last, on the
    compiled op where it is loaded: values and gradients as the eager call's."""
    x = crandn(8, 300, 200, device="cuda", dtype=torch.complex64).requires_grad_()
    c = decays(8, 300, 200, device="cuda", dtype=torch.complex64).requires_grad_()
    compiled = torch.compile(lambda a, b: linrec.linrec(a, b, dim=dim), fullgraph=True)
    got, want = compiled(x, c), linrec.linrec(x, c, dim=dim)
    assert rel_err(got, want.detach().to(torch.complex128)) < 1e-6
    w = crandn(8, 300, 200, device="cuda", dtype=torch.complex64, seed=7)
    for a, b in zip(torch.autograd.grad((got * w).real.sum(), (x, c)), torch.autograd.grad((want * w).real.sum(), (x, c))):
        assert rel_err(a, b.to(torch.complex128)) < 1e-6


# The compiled op's complex kernels called directly: the CPU kernel, and on CUDA the ref kernel
# and every config of every family compiled for complex storage (tile, chained, strided, packed).
def _op_kernels():
    kernels = [("cpu", (0, 0, 0, 0, 3))]
    if torch.cuda.is_available() and linrec._backend.cuda_backend(0) == "cuda":
        kernels += [("cuda", (FAMILIES["ref"].id, 0, 0, 0, 3))]
        for name in ("tile", "chained", "strided", "packed"):
            kernels += [("cuda", (FAMILIES[name].id, *cfg)) for cfg in linrec.compiled_configs(name, torch.complex64)]
    return kernels


def _op_shape(layout, kernel):
    """(shape, dim) of a layout. The tile (2) and packed (6) kernels hold a sequence whole, so
    theirs run at their capacity: a length just short of it (the general kernel: a ragged last
    vector), or all of it in rows (whole aligned vectors: the aligned-rows kernels)."""
    kind, e, t = kernel[:3]
    tile, packed = FAMILIES["tile"].id, FAMILIES["packed"].id
    if kind not in (tile, packed):
        return {"channel_last": ((3, 1100, 40), 1), "rows": ((5, 777), 1), "long_rows": ((2, 9000), 1),
                "few_channels": ((1, 2300, 3), 1)}[layout]
    cap = e * t if kind == tile else 32 * e
    return {"channel_last": ((3, cap - 1, 40), 1), "rows": ((5, cap - 3), 1), "long_rows": ((6, cap), 1),
            "few_channels": ((1, cap - 5, 3), 1)}[layout]


def _staged_fits(kernel, dtype, backward):
    """Whether a staged config's block fits the GPU's shared memory. Strided: slices of 2 tensors
    (3 backward) of E x NT elements, beside 2 x 32 x 32 accumulators; chained: 2 tiles of NT rows
    of E elements and 16 bytes of padding, beside a few KB. complex128's largest staged configs do
    not fit (the launch then raises, naming the bytes)."""
    kind, e, t, memcode, _ = kernel
    chained = FAMILIES["chained"].id
    if kind not in (chained, FAMILIES["strided"].id) or memcode != 3:
        return True
    item = torch.empty((), dtype=dtype).element_size()
    limit = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", 227 * 1024)
    if kind == chained:
        return 2 * t * (e * item + 16) + 4096 <= limit
    return ((3 if backward else 2) * e * t + 2 * 32 * 32) * item <= limit


@pytest.mark.parametrize("device,kernel", _op_kernels(), ids=lambda v: str(v))
@pytest.mark.parametrize("dtype,tol", [(torch.complex64, 5e-6), (torch.complex128, 1e-12)])
@pytest.mark.parametrize("layout", ["channel_last", "rows", "long_rows", "few_channels"])
@pytest.mark.parametrize("reverse", [False, True])
def test_complex_op_kernels(device, kernel, dtype, tol, layout, reverse):
    """linrec_fwd / linrec_bwd on complex storage against the complex128 loop, outputs poisoned:
    channel-last (B, T, D) over T long enough for several chunks of time, rows, rows of several
    chained tiles (of whole vectors, for tile and packed), and 3 channels (lane groups); with an
    initial state and a zero coefficient (a reset)."""
    from linrec._autograd import call_compiled

    if not _staged_fits(kernel, dtype, backward=False):
        x = crandn(3, 1100, 40, device=device, dtype=dtype)
        with pytest.raises(RuntimeError, match="bytes of shared memory"):
            call_compiled(x, x, None, 1, reverse, *kernel)
        # The refusal leaves no CUDA error behind for the next launch to report as its own.
        assert torch.isfinite(call_compiled(x, 0.5 * x, None, 1, reverse).abs()).all()
        return
    shape, dim = _op_shape(layout, kernel)
    x = crandn(*shape, device=device, dtype=dtype).requires_grad_()
    c = decays(*shape, device=device, dtype=dtype)
    c.select(dim, 50).zero_()
    c.requires_grad_()
    initial = crandn(*(n for k, n in enumerate(shape) if k != dim), device=device, dtype=dtype, seed=5)
    initial.requires_grad_()
    poison(device, 3 * x.numel() * x.element_size())
    y = call_compiled(x, c, initial, dim, reverse, *kernel)
    leaves = [t.detach().cpu().to(torch.complex128).requires_grad_() for t in (x, c, initial)]
    y_ref = loop(leaves[0], leaves[1], reverse, dim, leaves[2])
    assert y.dtype == dtype and rel_err(y.cpu(), y_ref) < tol
    g = crandn(*shape, dtype=dtype, seed=9).to(device)
    poison(device, 3 * x.numel() * x.element_size())
    if not _staged_fits(kernel, dtype, backward=True):
        with pytest.raises(RuntimeError, match="bytes of shared memory"):
            torch.autograd.grad(y, (x, c, initial), g)
        return
    got = torch.autograd.grad(y, (x, c, initial), g)
    want = torch.autograd.grad(y_ref, leaves, g.cpu().to(torch.complex128))
    for name, a, b in zip(("d_inputs", "d_coeffs", "d_initial"), got, want):
        assert rel_err(a.cpu(), b) < tol, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype,tol", [(torch.complex64, 5e-6), (torch.complex128, 1e-12)])
@pytest.mark.parametrize("length", [16, 128, 129, 256, 257, 1024, 1025, 2048, 2049])
@pytest.mark.parametrize("layout", ["rows", "view", "row coeffs"])
def test_complex_rows_auto(dtype, tol, length, layout):
    """linrec.linrec on complex rows either side of each length where the rule changes kernels
    (packed, tile, chained), contiguous (the aligned-rows kernels where the length allows), as a
    view with a ragged start, and with one coefficient a row (stride 0 along it): values and
    gradients against the complex128 loop, outputs poisoned."""
    n = 300
    x = crandn(n, length + 1, device="cuda", dtype=dtype)
    c = decays(n, length + 1, device="cuda", dtype=dtype)
    x, c = (x[:, 1:], c[:, 1:]) if layout == "view" else (x[:, :-1].contiguous(), c[:, :-1].contiguous())
    if layout == "row coeffs":
        # |c| <= 0.99: a row's one coefficient near 1 would carry float32 rounding over its whole
        # length. d_coeffs is then a sum over the row, in the storage dtype: 10x the tolerance
        # (H100, complex64, 2049 steps, before the 0.99: d_coeffs 5.2e-6, outputs up to 1.2e-5).
        c = 0.99 * c[:, :1].contiguous()
        tol *= 10
    initial = crandn(n, device="cuda", dtype=dtype, seed=3)
    leaves = [t.detach().requires_grad_() for t in (x, c, initial)]
    for reverse in (False, True):
        poison("cuda", 3 * x.numel() * x.element_size())
        y = linrec.linrec(*leaves[:2], reverse, initial=leaves[2])
        ref_leaves = [t.detach().cpu().to(torch.complex128).requires_grad_() for t in leaves]
        y_ref = loop(ref_leaves[0], ref_leaves[1], reverse, initial=ref_leaves[2])
        assert rel_err(y.detach().cpu(), y_ref) < tol
        g = crandn(n, length, dtype=dtype, seed=9)
        poison("cuda", 3 * x.numel() * x.element_size())
        got = torch.autograd.grad(y, leaves, g.cuda())
        want = torch.autograd.grad(y_ref, ref_leaves, g.to(torch.complex128))
        for name, a, b in zip(("d_inputs", "d_coeffs", "d_initial"), got, want):
            assert rel_err(a.cpu(), b) < tol, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_complex_op_other_kernels_raise():
    """The pipe kernel, and configs not compiled for complex storage, are refused by name."""
    if linrec._backend.cuda_backend(0) != "cuda":
        pytest.skip("the compiled CUDA kernels are not loaded")
    from linrec._autograd import call_compiled

    x = crandn(4, 64, device="cuda", dtype=torch.complex64)
    ids = {name: family.id for name, family in FAMILIES.items()}
    with pytest.raises(RuntimeError, match="the pipe kernels are not compiled for these dtypes"):
        call_compiled(x, x, None, 1, False, ids["pipe"], 8, 64, 1, 3)
    with pytest.raises(RuntimeError, match="the chained kernels are not compiled for TileConfig"):  # in registers
        call_compiled(x, x, None, 1, False, ids["chained"], 8, 64, 1, 3)
    with pytest.raises(RuntimeError, match="the tile kernels are not compiled for TileConfig"):  # direct loads
        call_compiled(x, x, None, 1, False, ids["tile"], 8, 64, 0, 3)
    assert linrec.compiled_configs("pipe", torch.complex64) == []
    assert all(cfg[2] == 1 for cfg in linrec.compiled_configs("tile", torch.complex128))
    from linrec.impl import cuda

    for call in (lambda: cuda.linrec_chained(x, x, elems_per_thread=8, threads_per_block=64, memcode=1),
                 lambda: cuda.linrec_tile(x, x, elems_per_thread=8, threads_per_block=64, memcode=0),
                 lambda: cuda.linrec_pipe(x, x)):
        with pytest.raises(ValueError, match="complex64"):  # linrec.impl.cuda names the dtype
            call()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [1, 2])
def test_complex_opcheck(device, dim):
    """The ops' schema, fake kernels and autograd registration on complex storage
    (torch.library.opcheck), channel-last (dim 1) and rows (dim 2)."""
    x = crandn(3, 40, 4, device=device).requires_grad_()
    c = decays(3, 40, 4, device=device).requires_grad_()
    h0 = crandn(*(n for k, n in enumerate(x.shape) if k != dim), device=device, seed=2).requires_grad_()
    config = (dim, False, 0, 0, 0, 0, 3)
    torch.library.opcheck(torch.ops.linrec.linrec_fwd.default, (x, c, h0, *config))
    y = torch.ops.linrec.linrec_fwd(x.detach(), c.detach(), h0.detach(), *config)
    torch.library.opcheck(torch.ops.linrec.linrec_bwd.default, (torch.randn_like(y), c.detach(), y, h0.detach(), *config))
