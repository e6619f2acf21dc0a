"""The benchmark's input cycling (python -m linrec.bench): a pass over the copies moves at least twice L2."""

import pytest
import torch

from linrec.bench import input_sets


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("length", [16, 300])
def test_input_sets_exceed_l2(backward, length):
    l2_bytes = 1 << 20
    x = torch.randn(40, length)
    c = torch.rand(40, length)
    sets = input_sets(x, c, backward, l2_bytes)
    traffic = (8 if backward else 3) * x.numel() * x.element_size()
    assert len(sets) * traffic >= 2 * l2_bytes
    assert (len(sets) - 1) * traffic < 2 * l2_bytes  # no more copies than that
    pointers = {s[0].data_ptr() for s in sets} | {s[1].data_ptr() for s in sets}
    assert len(pointers) == 2 * len(sets)  # every copy its own memory
    for s in sets:
        assert torch.equal(s[0], x) and torch.equal(s[1], c)
        if backward:
            assert s[0].requires_grad and s[1].requires_grad and s[2].shape == x.shape


def test_input_sets_large_case_is_not_copied():
    x, c = torch.randn(8, 1 << 16), torch.rand(8, 1 << 16)
    (only,) = input_sets(x, c, False, l2_bytes=1 << 20)
    assert only[0] is x and only[1] is c
