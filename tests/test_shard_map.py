"""The Triton pass that gives a shard's affine map (linrec.distributed's exchange) against a
float64 loop written here. Without a GPU the kernel runs in Triton's interpreter
(TRITON_INTERPRET=1, set in conftest.py) on small CPU tensors; the cases cross the kernel's
tiles and, with the split count forced down, its splits."""

import os

import pytest
import torch

from reference import rel_error

pytest.importorskip("triton")
shard_map = pytest.importorskip("linrec.impl.triton_shard_map")
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-5}


def reference_map(inputs, coeffs, dim, reverse, scale_by_c):
    """(product of coeffs, last state from zero) along dim, a float64 loop over the steps."""
    x, c = (t.double().movedim(dim, -1) for t in torch.broadcast_tensors(inputs, coeffs))
    if scale_by_c:
        x = c * x
    product, state = torch.ones(x.shape[:-1], dtype=torch.float64), torch.zeros(x.shape[:-1], dtype=torch.float64)
    steps = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    for l in steps:
        state = c[..., l] * state + x[..., l]
        product = product * c[..., l]
    return product, state


def random_case(shape, dim, dtype, coeffs_dtype=None, channel_last=False, broadcast_coeffs=False):
    """inputs and coeffs of `shape` (coefficients in (0.5, 1): products stay representable)."""
    gen = torch.Generator().manual_seed(sum(shape) + dim)
    inputs = torch.randn(shape, generator=gen, dtype=torch.float64)
    coeffs = 0.5 + 0.5 * torch.rand(shape, generator=gen, dtype=torch.float64)
    if channel_last:  # the scan dim outer in memory, its neighbours side by side
        inputs = inputs.movedim(dim, 0).contiguous().movedim(0, dim)
    if broadcast_coeffs:
        index = [slice(None)] * len(shape)
        index[0] = slice(0, 1)
        coeffs = coeffs[tuple(index)].expand(shape)
    return (inputs.to(dtype).to(DEVICE), coeffs.to(coeffs_dtype or dtype).to(DEVICE))


CASES = {
    "row-odd": dict(shape=(3, 1001), dim=-1),
    "one-long-row": dict(shape=(1, 5000), dim=-1),
    "channel-last": dict(shape=(2, 77, 70), dim=1, channel_last=True),
    "dim0": dict(shape=(131, 5), dim=0),
    "broadcast-coeffs": dict(shape=(3, 300), dim=-1, broadcast_coeffs=True),
    "strided-rows": dict(shape=(4, 6, 40), dim=1),
}


@pytest.mark.parametrize("scale_by_c", [False, True], ids=["map", "gradient-map"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_shard_map_matches_loop(case, reverse, scale_by_c, monkeypatch):
    monkeypatch.setattr(shard_map, "_TARGET_PROGRAMS", 64)  # splits even on the interpreter's small shapes
    kwargs = dict(CASES[case])
    shape, dim = kwargs.pop("shape"), kwargs.pop("dim")
    inputs, coeffs = random_case(shape, dim, torch.float32, **kwargs)
    product, state = shard_map.triton_shard_map(inputs, coeffs, dim, reverse, scale_by_c)
    want_product, want_state = reference_map(inputs.cpu(), coeffs.cpu(), dim, reverse, scale_by_c)
    assert product.dtype == state.dtype == torch.float32
    assert product.shape == state.shape == want_state.shape
    assert rel_error(product.cpu(), want_product) < TOL[torch.float32]
    assert rel_error(state.cpu(), want_state) < TOL[torch.float32]


@pytest.mark.parametrize("dtype,coeffs_dtype", [(torch.float64, None), (torch.bfloat16, None),
                                                (torch.bfloat16, torch.float32)],
                         ids=["float64", "bfloat16", "bfloat16-float32"])
def test_shard_map_storage(dtype, coeffs_dtype):
    inputs, coeffs = random_case((2, 700), -1, dtype, coeffs_dtype)
    product, state = shard_map.triton_shard_map(inputs, coeffs, -1, False)
    want = torch.promote_types(coeffs.dtype, torch.float32)
    assert product.dtype == state.dtype == want
    want_product, want_state = reference_map(inputs.cpu(), coeffs.cpu(), -1, False, False)
    assert rel_error(product.cpu(), want_product) < TOL[want]
    assert rel_error(state.cpu(), want_state) < TOL[want]
