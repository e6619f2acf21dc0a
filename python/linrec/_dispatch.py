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


def scan_normalized(inputs, coeffs, initial, dim: int, reverse: bool, log_coeffs: bool = False,
                    cuts: torch.Tensor | None = None) -> torch.Tensor:
    """Complex or real, on the implementation _backend picks for the device. cuts (packed
    sequences, from _segments; no initial with them): the coefficient is 0 where a step is cut."""
    coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs)
    if inputs.is_complex():
        if cuts is not None:  # the complex scans take no cuts: zero the coefficients there
            shape = [1] * inputs.dim()
            shape[dim] = inputs.shape[dim]
            coeffs = torch.where(cuts.view(shape), torch.zeros((), dtype=coeffs.dtype, device=coeffs.device), coeffs)
        return linrec_complex(inputs, coeffs, initial, dim, reverse)
    return scan_real(inputs, coeffs, initial, dim, reverse, log_coeffs, cuts)
