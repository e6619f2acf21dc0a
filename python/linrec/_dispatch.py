"""linrec on arguments already checked and brought into form by _args.normalize."""

from __future__ import annotations

import torch

from ._backend import scan_real
from ._complex import linrec_complex


def scan_normalized(inputs, coeffs, initial, dim: int, reverse: bool) -> torch.Tensor:
    """Complex or real, on the implementation _backend picks for the device."""
    if inputs.is_complex():
        return linrec_complex(inputs, coeffs, initial, dim, reverse)
    return scan_real(inputs, coeffs, initial, dim, reverse)
