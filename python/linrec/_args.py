"""Argument checking and broadcasting shared by every implementation.

Each implementation receives (inputs, coeffs, initial, dim) in the same
normalised form: coeffs and initial expanded (views, no copies) to the shapes
they must have, dim non-negative. Errors name the argument at fault.
"""

from __future__ import annotations

import numbers
import operator
import struct

import torch

from ._registry import STORAGES

_STORAGE_DTYPES = tuple(dict.fromkeys(getattr(torch, s.values) for s in STORAGES.values()))
SUPPORTED_DTYPES = tuple(d for d in _STORAGE_DTYPES if not d.is_complex)
COMPLEX_DTYPES = tuple(d for d in _STORAGE_DTYPES if d.is_complex)  # linrec.linrec and linrec_ref only


def _check_dtype(name: str, t: torch.Tensor, complex_ok: bool = False) -> None:
    """A supported dtype, in a dense (strided) tensor: sparse and nested tensors raise here, not in
    the dispatcher."""
    if t.is_nested or t.layout != torch.strided:  # a nested tensor may report the strided layout
        kind = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise ValueError(f"linrec: {name} must be a dense tensor, got {kind}")
    if t.dtype in SUPPORTED_DTYPES or (complex_ok and t.dtype in COMPLEX_DTYPES):
        return
    expected = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES + (COMPLEX_DTYPES if complex_ok else ()))
    raise ValueError(f"linrec: {name} has dtype {t.dtype}; expected one of {expected}")


# Mixed storage: (values, coeffs) dtype pairs that differ, float32 coefficients beside 16-bit values.
MIXED_PAIRS = frozenset((getattr(torch, s.values), getattr(torch, s.coeffs)) for s in STORAGES.values()
                        if s.values != s.coeffs)
MIXED_VALUE_DTYPES = tuple(dict.fromkeys(values for values, _ in MIXED_PAIRS))


def is_mixed(inputs_dtype: torch.dtype, coeffs_dtype: torch.dtype) -> bool:
    """Whether (inputs, coeffs) of these dtypes are mixed storage: float32 coefficients beside 16-bit
    inputs, which every implementation scans without rounding the coefficients to 16 bits."""
    return (inputs_dtype, coeffs_dtype) in MIXED_PAIRS


def _exact_in(value: float, dtype: torch.dtype) -> bool:
    """Whether a real number survives rounding to float16 or bfloat16 unchanged (pure Python: no
    tensor, so no device sync and nothing for a tracer to see)."""
    try:
        if dtype == torch.float16:
            return struct.unpack("<e", struct.pack("<e", value))[0] == value
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except (OverflowError, struct.error):
        return False
    return struct.unpack("<f", struct.pack("<I", bits))[0] == value and bits & 0xFFFF == 0


def _as_float(name: str, value) -> float:
    """A real number as a float, or a ValueError naming the argument (an int beyond float's range)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"linrec: {name} ({type(value).__name__}) is too large for a float (it overflows "
                         "float64)") from None


def _coeffs_dtype(value, like: torch.Tensor) -> torch.dtype:
    """The dtype coefficients are stored in beside `like` (the inputs): the inputs' own, except
    beside 16-bit real inputs, where coefficients of another dtype, and numbers that 16 bits
    would round, stay float32 (mixed storage). Rounded to bfloat16, 0.999 becomes 1.0: a decay
    over ~1000 steps would turn into an endless memory."""
    if like.dtype not in MIXED_VALUE_DTYPES:
        return like.dtype
    if isinstance(value, torch.Tensor):
        return like.dtype if value.dtype == like.dtype else torch.float32
    if torch.compiler.is_compiling():  # a constant to Dynamo: no check to trace, float32 is always exact
        return torch.float32
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return like.dtype  # not a coefficient: _as_tensor raises
    return like.dtype if _exact_in(_as_float("coeffs", value), like.dtype) else torch.float32


def _as_tensor(name: str, value, like: torch.Tensor) -> torch.Tensor:
    """coeffs or initial as a tensor on inputs' device, of inputs' dtype (coeffs: _coeffs_dtype's).
    With complex inputs a real value becomes complex; with real inputs a complex one raises
    (casting would drop its imaginary part)."""
    dtype = _coeffs_dtype(value, like) if name == "coeffs" else like.dtype
    if isinstance(value, torch.Tensor):
        _check_dtype(name, value, complex_ok=True)
        if value.is_complex() and not like.is_complex():
            raise ValueError(f"linrec: {name} is complex ({value.dtype}) but inputs is real ({like.dtype}); "
                             f"pass complex inputs for a complex recurrence")
        if value.device != like.device:
            if value.dim() == 0 and value.device.type == "cpu":
                return value.to(device=like.device, dtype=dtype)
            raise ValueError(f"linrec: {name} is on {value.device} but inputs is on {like.device}")
        return value.to(dtype)
    number = numbers.Number if like.is_complex() else numbers.Real
    if isinstance(value, number) and not isinstance(value, bool):
        scalar = complex(_as_float(name, value.real), _as_float(name, value.imag)) if like.is_complex() else \
            _as_float(name, value)
        return torch.tensor(scalar, dtype=dtype, device=like.device)
    kind = "a number" if like.is_complex() else "a real number"
    raise ValueError(f"linrec: {name} must be a tensor or {kind}, got {type(value).__name__}")


def _as_dim(dim) -> int:
    """An integer dim of another type (numpy.int64, an integer torch scalar) as an int, through
    __index__; a bool, float or anything else raises."""
    if not isinstance(dim, bool):
        try:
            return operator.index(dim)
        except TypeError:
            pass
    raise ValueError(f"linrec: dim must be an int, got {type(dim).__name__}")


def state_shape(shape: torch.Size, dim: int) -> torch.Size:
    """The shape of the recurrent state: `shape` without `dim`."""
    return shape[:dim] + shape[dim + 1 :]


def normalize(inputs, coeffs, initial, dim: int, reverse=False,
              complex_ok=False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """Check the arguments of linrec and bring them into the form every implementation takes.

    Returns (inputs, coeffs, initial, dim) with coeffs expanded to inputs.shape, initial
    expanded to inputs.shape without dim (or None) and dim in [0, inputs.dim()). `reverse` is
    only checked: a bool (or 0 / 1), so that a string or None is not taken for its truth value.
    complex_ok admits complex64 / complex128 inputs (coeffs and initial then cast to them).
    """
    if reverse is not True and reverse is not False and not (isinstance(reverse, numbers.Integral) and
                                                             reverse in (0, 1)):
        raise ValueError(f"linrec: reverse must be a bool, got {reverse!r}")
    if not isinstance(inputs, torch.Tensor):
        raise ValueError(f"linrec: inputs must be a tensor, got {type(inputs).__name__}")
    _check_dtype("inputs", inputs, complex_ok)
    if inputs.dim() == 0:
        raise ValueError("linrec: inputs must have at least one dimension (the sequence)")
    if not isinstance(dim, int) or isinstance(dim, bool):
        dim = _as_dim(dim)
    if not -inputs.dim() <= dim < inputs.dim():
        raise ValueError(f"linrec: dim={dim} is out of range for inputs with {inputs.dim()} dimensions")
    dim = dim % inputs.dim()

    if (initial is None and isinstance(coeffs, torch.Tensor) and coeffs.layout == torch.strided
            and not coeffs.is_nested and coeffs.shape == inputs.shape
            and (coeffs.dtype == inputs.dtype or is_mixed(inputs.dtype, coeffs.dtype))
            and coeffs.device == inputs.device):
        return inputs, coeffs, None, dim  # the common case, checked in a few microseconds

    coeffs = _as_tensor("coeffs", coeffs, inputs)
    try:
        shape = torch.broadcast_shapes(coeffs.shape, inputs.shape)
    except RuntimeError:
        shape = None
    if shape != inputs.shape:
        raise ValueError(
            f"linrec: coeffs of shape {tuple(coeffs.shape)} does not broadcast to inputs of shape "
            f"{tuple(inputs.shape)}"
        )
    coeffs = coeffs.expand(inputs.shape)

    if initial is not None:
        initial = _as_tensor("initial", initial, inputs)
        want = state_shape(inputs.shape, dim)
        try:
            ok = torch.broadcast_shapes(initial.shape, want) == want
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"linrec: initial of shape {tuple(initial.shape)} does not broadcast to {tuple(want)}, "
                f"the shape of inputs {tuple(inputs.shape)} without dim={dim}"
            )
        initial = initial.expand(want)
    return inputs, coeffs, initial, dim
