"""linrec: the diagonal linear recurrence y[l] = c[l] * y[l-1] + x[l] for PyTorch.

    import linrec
    y = linrec.linrec(x, c)                      # along the last dim
    y = linrec.linrec(x, c, reverse=True, dim=1, initial=h0)
"""

from __future__ import annotations

import warnings

import torch

from . import _C
from ._args import normalize
from ._ops import call_compiled
from ._version import __version__

__all__ = ["linrec", "build_info", "compiled_configs", "__version__"]


def build_info() -> dict:
    """What this installed build contains: version, CUDA version and archs, kernel configs."""
    info = dict(_C.build_info())
    info["version"] = __version__
    info["configs"] = compiled_configs()
    return info


def compiled_configs() -> list[tuple[int, int, int, int]]:
    """The compiled tile/pipe configs as (elems_per_thread, threads_per_block, memcode, algocode)."""
    return [tuple(c) for c in _C.compiled_configs()]


_HAS_CUDA_KERNELS = bool(_C.build_info()["cuda"])
_warned_fallback = False


def linrec(inputs, coeffs, reverse=False, *, dim=-1, initial=None):
    """The linear recurrence y[l] = coeffs[l] * y[l-1] + inputs[l] along `dim`.

    Args:
        inputs: floating tensor (float32, float64, float16 or bfloat16), any shape and strides.
        coeffs: tensor or number broadcastable to inputs (a scalar, one per channel, or full shape);
            cast to inputs' dtype. Its gradient is reduced to its own shape.
        reverse: run from the last element to the first.
        dim: the sequence dimension.
        initial: the state before the first step, shape of inputs without dim (or broadcastable
            to it); zeros when None.

    Returns:
        A tensor of inputs' shape and dtype. Differentiable in inputs, coeffs and initial.

    Raises:
        ValueError: a wrong dtype, device, shape or dim, naming the argument.
    """
    global _warned_fallback
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim)
    if inputs.device.type == "cpu" or (inputs.is_cuda and _HAS_CUDA_KERNELS):
        return call_compiled(inputs, coeffs, initial, dim, reverse)
    if not _warned_fallback:
        warnings.warn(f"linrec: no compiled kernels for {inputs.device}; using the associative_scan "
                      "reference, which is slow", stacklevel=2)
        _warned_fallback = True
    from .impl.python import linrec_hop

    return linrec_hop(inputs, coeffs, reverse, dim=dim, initial=initial)
