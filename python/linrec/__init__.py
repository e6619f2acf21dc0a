"""linrec: the diagonal linear recurrence y[l] = c[l] * y[l-1] + x[l] for PyTorch.

    import linrec
    y = linrec.linrec(x, c)                      # along the last dim
    y = linrec.linrec(x, c, reverse=True, dim=1, initial=h0)
"""

from __future__ import annotations

import torch

try:
    from . import _C
except ImportError as _error:
    # linrec._C needs only torch's CPU libraries of the stable ABI (torch >= 2.10), and building it
    # needs torch >= 2.14 headers: a build against an older installed torch cannot work.
    try:
        _old_torch = torch.torch_version.TorchVersion(torch.__version__) < (2, 10)
    except Exception:  # an unparsable version: give both remedies
        _old_torch = False
    _remedy = (
        'linrec needs torch >= 2.10: pip install "torch>=2.10"' if _old_torch else
        "reinstall a binary wheel for your torch's CUDA version (README, 'Install a binary wheel'), "
        "or build from source with build isolation, which compiles against torch >= 2.14 headers in "
        "a separate environment and leaves your torch as it is: pip install --no-binary linrec linrec"
    )
    raise ImportError(
        f"linrec: its compiled extension does not load with this torch ({torch.__version__}): {_error}. {_remedy}"
    ) from _error
from ._args import normalize
from ._backend import C_CUDA as _C_cuda
from ._backend import HAS_CUDA_KERNELS as _HAS_CUDA_KERNELS
from ._backend import NO_CUDA_KERNELS as _NO_CUDA_KERNELS
from ._backend import scan_real
from ._complex import linrec_complex
from ._registry import FAMILIES
from ._version import __version__


__all__ = ["linrec", "build_info", "compiled_configs", "__version__"]


def build_info() -> dict:
    """What this installed build contains: version, backends, CUDA version and archs, kernel configs."""
    info = {"version": __version__, "cuda": _HAS_CUDA_KERNELS, **_C.build_info()}
    if not _HAS_CUDA_KERNELS:
        info["cuda_unavailable"] = _NO_CUDA_KERNELS
    backends = ["cpu"] + (["cuda"] if info["cuda"] else [])
    try:
        import triton  # noqa: F401

        backends.append("triton")
    except ImportError:
        pass
    info["backends"] = backends
    info["configs"] = {kernel: compiled_configs(kernel) for kernel in ("tile", "strided", "packed")}
    return info


_CONFIG_KERNELS = tuple(name for name, family in FAMILIES.items() if family.has_configs)


def compiled_configs(kernel: str = "tile", dtype: torch.dtype | None = None) -> list[tuple[int, int, int, int]]:
    """The compiled configs of a CUDA kernel family as (elems_per_thread, threads_per_block, memcode, algocode).

    `kernel` is one of the families of csrc/registry.toml that take a config (tile, pipe,
    chained, strided, packed); `dtype` the storage (float32 when None). Complex storage has
    its own lists (the tile kernel's vector configs, the chained kernel's staged ones, and no
    pipe configs); mixed storage (16-bit inputs, float32 coefficients) shares its 16-bit
    dtype's. Empty where the CUDA kernels are not loaded (build_info()["cuda_unavailable"]
    says why) or the family is not compiled for `dtype`.
    """
    if kernel not in _CONFIG_KERNELS:
        raise ValueError(f"linrec: kernel={kernel!r}; expected one of {', '.join(_CONFIG_KERNELS)}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ValueError(f"linrec: dtype must be a torch.dtype or None, got {dtype!r}")
    if not _HAS_CUDA_KERNELS:
        return []
    name = str(dtype or torch.float32).removeprefix("torch.")
    try:
        return [tuple(c) for c in _C_cuda.compiled_configs(FAMILIES[kernel].id, name, name)]
    except ValueError:
        return []  # a dtype no storage type uses

def linrec(inputs, coeffs, reverse=False, *, dim=-1, initial=None):
    """The linear recurrence y[l] = coeffs[l] * y[l-1] + inputs[l] along `dim`.

    Args:
        inputs: floating tensor (float32, float64, float16 or bfloat16), any shape and strides;
            or complex64 / complex128 (the compiled kernels in complex arithmetic; see
            linrec._complex).
        coeffs: tensor or number broadcastable to inputs (a scalar, one per channel, or full shape);
            cast to inputs' dtype (complex coeffs need complex inputs), except beside float16 /
            bfloat16 inputs, where coefficients of another dtype, and numbers 16 bits would round,
            stay float32 (mixed storage: bfloat16 would store 0.999 as 1.0). Its gradient is
            reduced to its own shape, in its own dtype.
        reverse: run from the last element to the first.
        dim: the sequence dimension.
        initial: the state before the first step, shape of inputs without dim (or broadcastable
            to it); zeros when None.

    Returns:
        A tensor of inputs' shape and dtype. Differentiable in inputs, coeffs and initial, in
        reverse mode and in forward mode (torch.autograd.forward_ad).

    Raises:
        ValueError: a wrong dtype, device, shape or dim, naming the argument.

    On CUDA tensors the compiled kernels run when the build has them for the device,
    the Triton implementation otherwise; LINREC_BACKEND=cuda|triton forces one.
    """
    inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True)
    if inputs.is_complex():
        return linrec_complex(inputs, coeffs, initial, dim, reverse)
    return scan_real(inputs, coeffs, initial, dim, reverse)
