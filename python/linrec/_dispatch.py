"""linrec on arguments already checked and brought into form by _args.normalize."""

from __future__ import annotations

import torch

from ._autograd import exp_of_log
from ._backend import scan_real
from ._complex import linrec_complex
from ._ops import LOG_STORAGES


def fused_log(inputs: torch.Tensor, coeffs: torch.Tensor) -> bool:
    """Whether log-coefficients of this storage go to the kernels, which take exp as they load
    them (csrc/registry.toml's log storages); others are exponentiated first."""
    return (str(inputs.dtype).removeprefix("torch."), str(coeffs.dtype).removeprefix("torch.")) in LOG_STORAGES


def log_or_exp(inputs: torch.Tensor, coeffs: torch.Tensor, log_coeffs: bool) -> tuple[torch.Tensor, bool]:
    """(coeffs, log_coeffs) as the kernels take them: log-coefficients of another storage
    exponentiated first."""
    if log_coeffs and not fused_log(inputs, coeffs):
        return exp_of_log(coeffs), False
    return coeffs, log_coeffs


def scan_normalized(inputs, coeffs, initial, dim: int, reverse: bool, log_coeffs: bool = False) -> torch.Tensor:
    """Complex or real, on the implementation _backend picks for the device."""
    coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs)
    if inputs.is_complex():
        return linrec_complex(inputs, coeffs, initial, dim, reverse)
    return scan_real(inputs, coeffs, initial, dim, reverse, log_coeffs)
