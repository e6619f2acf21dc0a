"""The Triton kernels against the float64 reference. Without a GPU they run in
Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py) on small CPU tensors;
on a GPU the same tests run on CUDA tensors (and test_gpu.py runs the full suite),
with the caching allocator's free blocks poisoned before each call (an element a
kernel leaves unwritten shows up as NaN) and each implementation given inputs of
its own (so a freed result of the other one is never the right answer)."""

import os

import pytest
import torch

from reference import reference, rel_error

triton = pytest.importorskip("triton")
triton_impl = pytest.importorskip("linrec.impl.triton")
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
IMPLS = {"tile": triton_impl.linrec_tile, "pipe": triton_impl.linrec_pipe}
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def _seed_by_impl(request):
    params = getattr(request.node, "callspec", None)
    impl = params.params.get("impl") if params else None
    torch.manual_seed(list(IMPLS).index(impl) + 1 if impl else 0)


def poison(x):
    """On the GPU, free blocks of all-ones bits (NaN in every dtype) for the outputs of the next
    call on tensors like x."""
    if DEVICE == "cuda":
        blocks = [torch.full((6 * x.numel() * x.element_size(),), 0xFF, dtype=torch.uint8, device=DEVICE)
                  for _ in range(4)]
        del blocks


def check(fn, x, c, h0, reverse, dim=-1):
    # detach() keeps a view's strides; clone() would make a strided view contiguous.
    leaves = [t.detach().requires_grad_() for t in (x, c)] + [h0.detach().clone().requires_grad_()]
    poison(x)
    y = fn(leaves[0], leaves[1], reverse, dim=dim, initial=leaves[2])
    dy = torch.randn_like(y)
    poison(x)
    grads = torch.autograd.grad(y, leaves, dy, allow_unused=True)
    ref = [t.detach().double().requires_grad_() for t in (x, c, h0)]
    y_ref = reference(ref[0], ref[1], reverse, dim, ref[2])
    tol = TOL[x.dtype]
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel_error(y, y_ref) < tol
    if x.shape[dim] == 0:
        assert torch.equal(grads[2], torch.zeros_like(h0))
        return
    ref_grads = torch.autograd.grad(y_ref, ref, dy.double())
    for name, g, r in zip(("inputs", "coeffs", "initial"), grads, ref_grads):
        assert rel_error(g, r) < tol, name


def rand(shape, dtype=torch.float64):
    x = torch.randn(shape, device=DEVICE).to(dtype)
    c = (torch.rand(shape, device=DEVICE) * 0.6 + 0.4).to(dtype)
    return x, c


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("length", [0, 1, 2, 3, 17, 130])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_lengths(impl, length, reverse, dtype):
    x, c = rand((2, 3, length), dtype)
    check(IMPLS[impl], x, c, torch.randn(2, 3, device=DEVICE).to(dtype), reverse)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("view", ["strided", "transposed", "channel_last"])
def test_views_and_dims(impl, dim, view):
    bx, bc = rand((5, 6, 40))
    pick = {"strided": lambda t: t[..., ::2], "transposed": lambda t: t.transpose(0, 2),
            "channel_last": lambda t: t.permute(0, 2, 1)}[view]
    x, c = pick(bx), pick(bc)
    d = dim % 3
    h0 = torch.randn(x.shape[:d] + x.shape[d + 1:], dtype=torch.float64, device=DEVICE)
    check(IMPLS[impl], x, c, h0, True, dim)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("coeff_shape", [(), (6, 1), (1, 70)], ids=str)
def test_coeff_broadcast(impl, coeff_shape):
    x, _ = rand((4, 6, 70))
    c = torch.rand(coeff_shape, dtype=torch.float64, device=DEVICE) * 0.6 + 0.4
    h0 = torch.randn(6, dtype=torch.float64, device=DEVICE).expand(4, 6)
    check(IMPLS[impl], x, c, h0, False)


def test_bf16_storage():
    x, c = rand((3, 200), torch.bfloat16)
    check(IMPLS["pipe"], x, c, torch.randn(3, device=DEVICE).bfloat16(), False)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the interpreter's numpy, on inf * 0
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("reverse", [False, True])
def test_nonfinite_values(impl, reverse):
    """Non-finite exactly where the float64 loop is, finite values equal. The associative scan
    regroups c2 * (c1 * y + x) as c2 * c1 * y + c2 * x, so after an infinite coefficient it may
    give NaN where the loop gives +-inf (docs/usage.md, "Non-finite values")."""
    from test_hardening import nonfinite_case

    x, c = (t.to(DEVICE) for t in nonfinite_case(reverse))
    h0 = torch.randn(6, dtype=torch.float64, device=DEVICE)
    poison(x)
    y, want = IMPLS[impl](x, c, reverse, initial=h0), reference(x, c, reverse, initial=h0)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(y), finite)
    torch.testing.assert_close(y[finite], want[finite], rtol=1e-12, atol=1e-12)


def test_tile_too_long_error():
    with pytest.raises(ValueError, match="tile kernel scans at most"):
        IMPLS["tile"](*rand((1, triton_impl.MAX_TILE + 1)))


COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from linrec.impl import triton as impl
for kernel, pointers in (("_fwd_kernel", 5), ("_bwd_kernel", 8)):
    fn = getattr(impl, kernel)
    for dtype, options in (("fp32", False), ("fp32", True), ("fp64", False), ("bf16", True), ("fp16", True)):
        signature, constexprs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name == "cuts_ptr":
                signature[name] = "*u8"
            elif i < pointers:
                signature[name] = "*" + dtype
            elif name in ("HAS_INITIAL", "REVERSE", "PIPE", "BLOCK", "LOG_COEFFS", "HAS_CUTS"):
                signature[name] = "constexpr"
                constexprs[(i,)] = 256 if name == "BLOCK" else options if name in ("LOG_COEFFS", "HAS_CUTS") else True
            else:
                signature[name] = "i64"
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32))
        assert ".entry" in compiled.asm["ptx"], (kernel, dtype)
print("compiled")
"""


def test_kernels_compile_for_sm90():
    """The real Triton compiler (which the interpreter is not) accepts the kernels for every
    dtype, with and without log-coefficients and cuts; no GPU needed. Runs in a subprocess because the interpreter is chosen at import."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
