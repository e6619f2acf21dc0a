"""Argument checking and broadcasting shared by every implementation.

Each implementation receives (inputs, coeffs, initial, dim) in the same
normalised form: coeffs and initial expanded (views, no copies) to the shapes
they must have, dim non-negative. Errors name the argument at fault.
"""

from __future__ import annotations

import numbers
import operator
import warnings

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
COMPLEX_DTYPES = (torch.complex64, torch.complex128)  # linrec.linrec and linrec_ref only


def _check_dtype(name: str, t: torch.Tensor, complex_ok: bool = False) -> None:
    """A supported dtype, in a dense (strided) tensor: sparse and nested tensors raise here, not in
    the dispatcher."""
    if t.layout != torch.strided:
        raise ValueError(f"linrec: {name} must be a dense tensor, got layout {t.layout}")
    if t.dtype in SUPPORTED_DTYPES or (complex_ok and t.dtype in COMPLEX_DTYPES):
        return
    expected = "float32, float64, float16, bfloat16" + (", complex64, complex128" if complex_ok else "")
    raise ValueError(f"linrec: {name} has dtype {t.dtype}; expected one of {expected}")


_warned_16bit_coeffs = False


def _warn_16bit_coeffs(source: str, dtype: torch.dtype) -> None:
    """Once a process: coeffs of a wider dtype are cast to 16-bit inputs' dtype, which rounds
    decays near 1 (bfloat16: 0.999 -> 1.0, a memory of ~1000 steps made endless)."""
    global _warned_16bit_coeffs
    if not _warned_16bit_coeffs:
        _warned_16bit_coeffs = True
        warnings.warn(
            f"linrec: coeffs ({source}) are cast to the inputs' dtype {dtype}, which rounds decays near 1 "
            "(bfloat16 stores 0.999 as 1.0, float16 stores 0.9999 as 1.0). Where decays near 1 matter, pass "
            "float32 inputs (linrec scans 16-bit storage in float32 anyway). Warned once.", stacklevel=5)


def _as_tensor(name: str, value, like: torch.Tensor) -> torch.Tensor:
    """coeffs or initial as a tensor of inputs' dtype and device. With complex inputs a real value
    becomes complex; with real inputs a complex one raises (casting would drop its imaginary part).
    Coefficients narrowed to 16-bit inputs warn once (_warn_16bit_coeffs): every coefficient tensor
    of a wider dtype, and a number whose rounding turns a decay (|c| < 1) into |c| >= 1."""
    narrowing = (name == "coeffs" and like.element_size() == 2 and not like.is_complex()
                 and not torch.compiler.is_compiling())  # a warning or .item() would break the graph
    if isinstance(value, torch.Tensor):
        _check_dtype(name, value, complex_ok=True)
        if value.is_complex() and not like.is_complex():
            raise ValueError(f"linrec: {name} is complex ({value.dtype}) but inputs is real ({like.dtype}); "
                             f"pass complex inputs for a complex recurrence")
        if narrowing and value.element_size() > 2:
            _warn_16bit_coeffs(f"{value.dtype}", like.dtype)
        if value.device != like.device:
            if value.dim() == 0 and value.device.type == "cpu":
                return value.to(device=like.device, dtype=like.dtype)
            raise ValueError(f"linrec: {name} is on {value.device} but inputs is on {like.device}")
        return value.to(like.dtype)
    number = numbers.Number if like.is_complex() else numbers.Real
    if isinstance(value, number) and not isinstance(value, bool):
        if narrowing and abs(float(value)) < 1 <= abs(torch.tensor(float(value), dtype=like.dtype).item()):
            _warn_16bit_coeffs(f"the number {value}", like.dtype)
        return torch.tensor(complex(value) if like.is_complex() else float(value), dtype=like.dtype,
                            device=like.device)
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


def normalize(inputs, coeffs, initial, dim: int, reverse=False, complex_ok=False):
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

    if (initial is None and isinstance(coeffs, torch.Tensor) and coeffs.shape == inputs.shape
            and coeffs.dtype == inputs.dtype and coeffs.device == inputs.device and coeffs.layout == torch.strided):
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
