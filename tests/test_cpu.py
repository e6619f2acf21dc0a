"""Every CPU implementation against the float64 sequential reference."""

import pytest
import torch

from conftest import CPU_IMPLS
from reference import reference, rel_error

LENGTHS = [0, 1, 2, 3, 17, 1000, 4097]
IMPLS = list(CPU_IMPLS)


def rand_coeffs(*shape, dtype=torch.float64):
    return torch.rand(shape, dtype=dtype) * 0.6 + 0.4  # in [0.4, 1): long memory, stable


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_initial", [False, True])
def test_lengths(impl, length, reverse, with_initial):
    if impl == "python.linrec_ref" and length > 1000:
        pytest.skip("the Python loop is the slow reference")
    x = torch.randn(3, 2, length, dtype=torch.float64)
    c = rand_coeffs(3, 2, length)
    h0 = torch.randn(3, 2, dtype=torch.float64) if with_initial else None
    out = CPU_IMPLS[impl](x, c, reverse, initial=h0)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert rel_error(out, reference(x, c, reverse, -1, h0)) < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "coeff_shape", [(), (1,), (4, 1), (5, 4, 1), (4, 37), (1, 37), (5, 1, 37)], ids=str
)
@pytest.mark.parametrize("reverse", [False, True])
def test_coeff_broadcast(impl, coeff_shape, reverse):
    x = torch.randn(5, 4, 37, dtype=torch.float64)
    c = rand_coeffs(*coeff_shape)
    out = CPU_IMPLS[impl](x, c, reverse)
    assert rel_error(out, reference(x, c, reverse)) < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_python_number_coeff_and_broadcast_initial(impl):
    x = torch.randn(5, 4, 37, dtype=torch.float64)
    h0 = torch.randn(4, dtype=torch.float64)  # broadcasts to (5, 4)
    out = CPU_IMPLS[impl](x, 0.9, initial=h0)
    assert rel_error(out, reference(x, 0.9, initial=h0.expand(5, 4))) < 1e-12


VIEWS = {
    "strided_last": lambda t: t[..., ::2],
    "transposed": lambda t: t.transpose(0, 2),
    "permuted": lambda t: t.permute(2, 0, 1),
    "sliced_batch": lambda t: t[1:, ::3],
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_views_and_dims(impl, view, dim, reverse):
    base_x = torch.randn(6, 7, 40, dtype=torch.float64)
    base_c = rand_coeffs(6, 7, 40)
    x, c = VIEWS[view](base_x), VIEWS[view](base_c)
    h0_shape = x.shape[: dim % 3] + x.shape[dim % 3 + 1 :]
    h0 = torch.randn(h0_shape, dtype=torch.float64).transpose(0, 1).contiguous().transpose(0, 1)
    out = CPU_IMPLS[impl](x, c, reverse, dim=dim, initial=h0)
    assert rel_error(out, reference(x, c, reverse, dim, h0)) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_dtypes(dtype):
    x = torch.randn(4, 300).to(dtype)
    c = rand_coeffs(4, 300).to(dtype)
    out = CPU_IMPLS["linrec"](x, c)
    assert out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_error(out, reference(x, c)) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reverse", [False, True])
def test_low_precision_channel_last(dtype, reverse):
    """(B, T, D) scanned over T: the kernel walks neighbouring channels together (cpu_kernels.cpp)."""
    x = torch.randn(3, 300, 40).to(dtype)
    c = rand_coeffs(3, 300, 40).to(dtype)
    h0 = torch.randn(3, 40).to(dtype)
    out = CPU_IMPLS["linrec"](x, c, reverse, dim=1, initial=h0)
    assert out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_error(out, reference(x, c, reverse, 1, h0)) < tol


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dim", [-1, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_mixed_storage(impl, dtype, dim, reverse):
    """16-bit inputs with float32 coefficients of decays that 16 bits round to 1 (mixed storage):
    outputs in the inputs' dtype and gradients (d_coeffs in float32) match the float64 reference,
    where the coefficients rounded to 16 bits miss the outputs by more than twice the tolerance."""
    decay = 1 - 1.9e-3 if dtype == torch.bfloat16 else 1 - 2.3e-4
    x = (torch.rand(3, 700, 5) + 0.5).to(dtype).movedim(1, dim)
    c = (decay + (1 - decay) * 0.1 * torch.rand(3, 700, 5)).movedim(1, dim).requires_grad_()
    assert torch.all(c.to(dtype) == 1)
    h0 = torch.randn(3, 5).to(dtype).requires_grad_()
    xg = x.detach().requires_grad_()
    y = CPU_IMPLS[impl](xg, c, reverse, dim=dim, initial=h0)
    assert y.dtype == dtype
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (xg, c, h0), dy)
    assert [g.dtype for g in grads] == [dtype, torch.float32, dtype]
    leaves = [t.detach().double().requires_grad_() for t in (x, c, h0)]
    y_ref = reference(*leaves[:2], reverse, dim, leaves[2])
    ref_grads = torch.autograd.grad(y_ref, leaves, dy.double())
    assert rel_error(y, y_ref) < 1e-2
    for g, r in zip(grads, ref_grads):
        assert rel_error(g, r) < 1e-2
    assert rel_error(reference(x, c.detach().to(dtype), reverse, dim, h0.detach()), y_ref) > 2e-2


def test_nan_and_inf_propagate():
    x = torch.randn(2, 8, dtype=torch.float64)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    out = CPU_IMPLS["linrec"](x, torch.full((2, 8), 0.5, dtype=torch.float64))
    assert torch.isfinite(out[0, :3]).all() and torch.isnan(out[0, 3:]).all()
    assert torch.isfinite(out[1, :5]).all() and torch.isinf(out[1, 5:]).all()


@pytest.mark.parametrize("reverse", [False, True])
def test_chunked_reference_matches_sequential(reverse):
    """The two-level reference used for long GPU sequences agrees with the plain loop."""
    from reference import reference_chunked

    x = torch.randn(3, 1001, dtype=torch.float64)
    c = rand_coeffs(3, 1001)
    h0 = torch.randn(3, dtype=torch.float64)
    want = reference(x, c, reverse, initial=h0)
    assert rel_error(reference_chunked(x, c, reverse, h0, chunk=64), want) < 1e-13


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,dim", [((3, 1001), -1), ((2, 301, 5), 1), ((4, 2, 77), 0)], ids=str)
@pytest.mark.parametrize("chunk", [None, 16])
def test_reference_with_grads_matches_autograd(shape, dim, reverse, chunk):
    """The adjoint-recurrence gradients used for long GPU scans agree with autograd through
    the plain loop."""
    from reference import reference_with_grads

    x = torch.randn(shape, dtype=torch.float64)
    c = torch.rand(shape, dtype=torch.float64) * 0.6 + 0.4
    h0 = torch.randn(x.movedim(dim, -1).shape[:-1], dtype=torch.float64)
    dy = torch.randn(shape, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y = reference(*leaves[:2], reverse, dim, leaves[2])
    want = (y, *torch.autograd.grad(y, leaves, dy))
    got = reference_with_grads(x, c, dy, reverse, dim, h0, chunk=chunk)
    for name, g, w in zip(("outputs", "d_inputs", "d_coeffs", "d_initial"), got, want):
        assert g.shape == w.shape and rel_error(g, w) < 1e-12, name
