"""log_coeffs=True inside the kernels: the storages with log kernels (float32, float16, bfloat16,
and float32 log-coefficients beside 16-bit values) on the CPU kernel, every CUDA family and
Triton, forward and fused backward against the float64 loop of tests/reference.py through exp.
(tests/test_segments.py covers log_coeffs through linrec.linrec with every option.)"""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import linrec
from reference import poison, reference_with_grads, rel_error

# (inputs dtype, log-coefficients dtype, relative tolerance)
LOG_STORAGES = [
    (torch.float32, torch.float32, 1e-5),
    (torch.float16, torch.float16, 1e-2),
    (torch.bfloat16, torch.bfloat16, 2e-2),
    (torch.float16, torch.float32, 1e-2),
    (torch.bfloat16, torch.float32, 2e-2),
]
STORAGE_IDS = [f"{str(v)[6:]}+{str(c)[6:]}" for v, c, _ in LOG_STORAGES]
HAS_CUDA_KERNELS = torch.cuda.is_available() and linrec.build_info()["cuda"]


def make_case(shape, dim, values, coeffs, device, seed=0):
    """Random inputs, log-coefficients in (-0.7, 0) with a few cuts (log 0 = -inf), an initial
    state and output gradients; non-contiguous views of larger tensors."""
    g = torch.Generator().manual_seed(seed)
    wide = list(shape)
    wide[-1] *= 2
    x = torch.randn(wide, generator=g)[..., ::2].to(device=device, dtype=values)
    log_c = -0.7 * torch.rand(wide, generator=g)
    log_c.view(-1)[:: 97] = float("-inf")
    log_c = log_c[..., 1::2].to(device=device, dtype=coeffs)
    state = list(shape)
    del state[dim]
    h = torch.randn(state, generator=g).to(device=device, dtype=values)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=values)
    return x, log_c, h, dy


def check_against_loop(fn, shape, dim, reverse, values, coeffs, tol, device):
    """fn(x, log_c, reverse, dim=, initial=, log_coeffs=True) and its gradients against the float64 loop."""
    x, log_c, h, dy = make_case(shape, dim, values, coeffs, device)
    xs, lcs, hs = (t.detach().requires_grad_() for t in (x, log_c, h))
    y = fn(xs, lcs, reverse, dim=dim, initial=hs, log_coeffs=True)
    dx, d_log_c, dh = torch.autograd.grad(y, (xs, lcs, hs), dy)
    c64 = log_c.cpu().double().exp()
    want_y, want_dx, want_dc, want_dh = reference_with_grads(
        x.cpu().double(), c64, dy.cpu().double(), reverse, dim, h.cpu().double())
    assert y.dtype == values and d_log_c.dtype == coeffs and d_log_c.shape == log_c.shape
    assert rel_error(y.cpu(), want_y) < tol
    assert rel_error(dx.cpu(), want_dx) < tol
    assert rel_error(d_log_c.cpu(), want_dc * c64) < tol  # d/d(log c) = c * d/dc
    assert rel_error(dh.cpu(), want_dh) < tol


@pytest.mark.parametrize("values,coeffs,tol", LOG_STORAGES, ids=STORAGE_IDS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [1, 2])
def test_cpu_kernel(values, coeffs, tol, reverse, dim):
    """The CPU kernel, rows (dim 2) and channel-last runs (dim 1), odd lengths."""
    check_against_loop(linrec.linrec, (3, 37, 5) if dim == 1 else (3, 5, 37), dim, reverse, values, coeffs, tol,
                       "cpu")


def test_op_takes_log_coeffs_and_refuses_other_storage():
    """The op itself: log_coeffs=True is exp inside; float64 has no log kernels and says so."""
    x, log_c = torch.randn(4, 33), -torch.rand(4, 33)
    y = torch.ops.linrec.linrec_fwd(x, log_c, None, -1, 0, 0, 0, 0, 0, 3, log_coeffs=True)
    assert rel_error(y, torch.ops.linrec.linrec_fwd(x, log_c.exp(), None, -1, 0, 0, 0, 0, 0, 3)) < 1e-6
    with pytest.raises(RuntimeError, match="log_coeffs=True takes float32, float16 and bfloat16"):
        torch.ops.linrec.linrec_fwd(x.double(), log_c.double(), None, -1, 0, 0, 0, 0, 0, 3, log_coeffs=True)


def test_opcheck_with_log_coeffs():
    x, log_c, h, dy = make_case((2, 3, 19), 2, torch.float32, torch.float32, "cpu")
    fwd_args = (x, log_c.clamp_min(-5), h, -1, 1, 0, 0, 0, 0, 3)
    torch.library.opcheck(torch.ops.linrec.linrec_fwd, fwd_args, {"log_coeffs": True})
    y = torch.ops.linrec.linrec_fwd(*fwd_args, log_coeffs=True)
    bwd_args = (dy, log_c.clamp_min(-5), y, h, -1, 1, 0, 0, 0, 0, 3)
    torch.library.opcheck(torch.ops.linrec.linrec_bwd, bwd_args, {"log_coeffs": True})


def test_double_backward_and_forward_mode():
    """create_graph=True and forward-mode AD with log-coefficients (float32 kernels), against
    the same through torch.exp."""
    x = torch.randn(2, 23, requires_grad=True)
    log_c = (-torch.rand(2, 23)).requires_grad_()

    def first_and_second(y):
        gx, gc = torch.autograd.grad(y.square().sum(), (x, log_c), create_graph=True)
        return gc, torch.autograd.grad(gc.sum() + gx.sum(), log_c)[0]

    gc, second = first_and_second(linrec.linrec(x, log_c, log_coeffs=True))
    want_gc, want_second = first_and_second(linrec.linrec(x, log_c.exp()))
    assert rel_error(gc, want_gc) < 1e-5 and rel_error(second, want_second) < 1e-4

    tangent = torch.randn(2, 23)
    with fwAD.dual_level():
        jvp = fwAD.unpack_dual(linrec.linrec(x.detach(), fwAD.make_dual(log_c.detach(), tangent),
                                             log_coeffs=True)).tangent
        want = fwAD.unpack_dual(linrec.linrec(x.detach(), fwAD.make_dual(log_c.detach(), tangent).exp())).tangent
    assert rel_error(jvp, want) < 1e-5


def test_compile_traces_log_coeffs():
    fn = torch.compile(lambda x, lc: linrec.linrec(x, lc, True, log_coeffs=True), fullgraph=True)
    x, log_c, _, _ = make_case((3, 41), 1, torch.float32, torch.float32, "cpu")
    assert rel_error(fn(x, log_c), linrec.linrec(x, log_c.exp(), True)) < 1e-6


def gpu_families():
    if not HAS_CUDA_KERNELS:
        return []
    from linrec.impl import cuda, triton

    return [("ref", cuda.linrec_ref, (2, 3, 300), 2), ("tile", cuda.linrec_tile, (2, 3, 1000), 2),
            ("pipe", cuda.linrec_pipe, (2, 3, 9001), 2), ("chained", cuda.linrec_chained, (1, 2, 70001), 2),
            ("strided", cuda.linrec_strided, (2, 3001, 40), 1), ("strided-pairs", cuda.linrec_strided, (2, 3001, 64), 1),
            ("packed", cuda.linrec_packed, (50, 3, 77), 2), ("triton", triton.linrec_pipe, (2, 3, 5001), 2),
            ("auto", linrec.linrec, (3, 2049, 8), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("values,coeffs,tol", LOG_STORAGES, ids=STORAGE_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_families(values, coeffs, tol, reverse):
    """Every CUDA family at its default config, and Triton, outputs poisoned with NaN."""
    for name, fn, shape, dim in gpu_families():
        blocks = [torch.full((2 * 3 * 70001,), float("nan"), device="cuda") for _ in range(6)]
        del blocks
        check_against_loop(fn, shape, dim, reverse, values, coeffs, tol, "cuda")


def check_long_memory(fn, shape, dim, values, coeffs, tol, device):
    """Decays near 1 (log c in (-1e-3, 0)), so that each output sums thousands of steps: the
    error of each exp the kernels take compounds along the product, and must stay within the
    storage's tolerance (the CPU kernel's float32 error here: about 1e-6)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(values)
    log_c = (-1e-3 * torch.rand(shape, generator=g)).to(coeffs)
    poison(device, 4 * x.numel())
    y = fn(x.to(device), log_c.to(device), False, dim=dim, log_coeffs=True)
    want = reference_with_grads(x.double(), log_c.double().exp(), torch.zeros(shape, dtype=torch.float64), False,
                                dim)[0]
    assert rel_error(y.cpu(), want) < tol


@pytest.mark.parametrize("values,coeffs,tol", LOG_STORAGES, ids=STORAGE_IDS)
def test_cpu_long_memory(values, coeffs, tol):
    check_long_memory(linrec.linrec, (1, 2, 70001), 2, values, coeffs, tol, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("values,coeffs,tol", LOG_STORAGES, ids=STORAGE_IDS)
def test_gpu_long_memory(values, coeffs, tol):
    """check_long_memory for every CUDA family but packed (its sequences are short), and Triton."""
    for name, fn, shape, dim in gpu_families():
        if name != "packed":
            check_long_memory(fn, shape, dim, values, coeffs, tol, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("memcode", [0, 1, 2, 3])
def test_gpu_chained_memcodes(memcode):
    """The chained kernels' memory strategies (the staged one reads the coefficients again for
    the gradient of log c) at a compiled config of each."""
    from linrec.impl import cuda

    configs = [c for c in linrec.compiled_configs("chained", torch.bfloat16) if c[2] == memcode]
    if not configs:
        pytest.skip(f"no chained config with memcode {memcode} compiled")
    e, t, m, a = configs[0]
    fn = lambda *args, **kw: cuda.linrec_chained(*args, **kw, elems_per_thread=e, threads_per_block=t,  # noqa: E731
                                                 memcode=m, algocode=a)
    for reverse in (False, True):
        check_against_loop(fn, (1, 1, 50001), 2, reverse, torch.bfloat16, torch.float32, 2e-2, "cuda")


@pytest.mark.skipif(HAS_CUDA_KERNELS, reason="the GPU test above runs Triton on CUDA tensors")
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_interpreted(reverse):
    """Triton's kernels with LOG_COEFFS, in Triton's interpreter on CPU tensors (conftest.py)."""
    triton = pytest.importorskip("linrec.impl.triton")
    for fn in (triton.linrec_tile, triton.linrec_pipe):
        check_against_loop(fn, (2, 3, 45), 2, reverse, torch.float32, torch.float32, 1e-5, "cpu")
