"""Gradients: gradcheck in float64, and the analytic gradients against autograd through the reference."""

import pytest
import torch

from conftest import CPU_IMPLS
from reference import reference, rel_error

IMPLS = ["linrec", "python.linrec_hop"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeff_shape", [(3, 4, 9), (4, 1), ()], ids=str)
def test_gradcheck(impl, reverse, coeff_shape):
    fn = CPU_IMPLS[impl]
    x = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(coeff_shape, dtype=torch.float64) * 0.6 + 0.4).requires_grad_()
    h0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, c, h0: fn(x, c, reverse, initial=h0), (x, c, h0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("length", [1, 2, 17, 300])
def test_grads_match_reference(impl, reverse, dim, length):
    shape = [3, 5, 4]
    shape[dim] = length
    x = torch.randn(shape, dtype=torch.float64).transpose(0, 2).contiguous().transpose(0, 2)  # non-contiguous
    c = torch.rand(shape, dtype=torch.float64) * 0.6 + 0.4
    h0 = torch.randn(shape[:dim] + shape[dim + 1 :], dtype=torch.float64)
    dy = torch.randn(shape, dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, dy)

    got = grads(lambda x, c, h0: CPU_IMPLS[impl](x, c, reverse, dim=dim, initial=h0))
    want = grads(lambda x, c, h0: reference(x, c, reverse, dim, h0))
    for name, g, w in zip(("inputs", "coeffs", "initial"), got, want):
        assert rel_error(g, w) < 1e-12, name


def test_zero_length_grads():
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    c = torch.rand(3, 0, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = CPU_IMPLS["linrec"](x, c, initial=h0)
    assert out.shape == (3, 0)
    out.sum().backward()
    assert x.grad.shape == (3, 0) and torch.equal(h0.grad, torch.zeros(3, dtype=torch.float64))


def test_bf16_training_step():
    """A bf16 forward+backward stays close to the float64 reference."""
    x = torch.randn(4, 200).bfloat16().requires_grad_()
    c = (torch.rand(4, 200) * 0.5 + 0.5).bfloat16().requires_grad_()
    CPU_IMPLS["linrec"](x, c).float().pow(2).sum().backward()
    xr, cr = x.detach().double().requires_grad_(), c.detach().double().requires_grad_()
    reference(xr, cr).pow(2).sum().backward()
    assert rel_error(x.grad, xr.grad) < 2e-2
    assert rel_error(c.grad, cr.grad) < 2e-2
