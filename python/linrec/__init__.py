"""linrec: the diagonal linear recurrence y[l] = c[l] * y[l-1] + x[l] for PyTorch.

    import linrec
    y = linrec.linrec(x, c)                      # along the last dim
    y = linrec.linrec(x, c, reverse=True, dim=1, initial=h0)
    y = linrec.selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True)  # Mamba's S6
"""

from __future__ import annotations

from typing import Any

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
from ._dispatch import log_or_exp, scan_normalized
from ._registry import FAMILIES
from ._segments import check_cu_seqlens, check_log_number, scan_segments, segment_initial
from ._selective import selective_scan
from ._version import __version__


__all__ = ["linrec", "selective_scan", "build_info", "compiled_configs", "__version__"]


def build_info() -> dict[str, Any]:
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

def linrec(inputs: torch.Tensor, coeffs: torch.Tensor | float | complex, reverse: bool = False, *, dim: int = -1,
           initial: torch.Tensor | float | complex | None = None, log_coeffs: bool = False,
           cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
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
            to it); zeros when None. With cu_seqlens, one state a segment: inputs' shape with
            dim of size len(cu_seqlens) - 1 (or broadcastable to it).
        log_coeffs: coeffs holds log(c) (logsigmoid gates, -softplus(.) * r, a complex log): the
            scan takes exp(coeffs), computed in float32 at least; the gradient is for the
            log-coefficients, in their shape and dtype. For float32, float16 and bfloat16 the
            kernels take exp as they load each coefficient (no extra pass, no extra tensor);
            float64 and complex log-coefficients are exponentiated first.
        cu_seqlens: packed sequences of different lengths along dim: a 1-D int32 / int64 tensor
            [0, e1, ..., inputs.shape[dim]] on inputs' device; segment k is steps
            cu_seqlens[k] .. cu_seqlens[k+1]-1, scanned on its own (in reverse too), from
            initial[k]. Empty segments are allowed. Its values are checked on CPU tensors
            outside torch.compile only: checking needs them on the host (on CUDA, a wait for
            the device; under torch.compile, while tracing), so a wrong cu_seqlens on CUDA
            gives wrong results, not an error. A segment is cut by a zero coefficient at its
            first step, so an inf or NaN state turns the next segments' outputs and gradients
            NaN (0 * inf); finite values never cross a cut.

    Returns:
        A tensor of inputs' shape and dtype. Differentiable in inputs, coeffs and initial, in
        reverse mode and in forward mode (torch.autograd.forward_ad).

    Raises:
        ValueError: a wrong dtype, device, shape or dim, naming the argument.

    On CUDA tensors the compiled kernels run when the build has them for the device,
    the Triton implementation otherwise; LINREC_BACKEND=cuda|triton forces one.
    """
    if log_coeffs is not True and log_coeffs is not False:
        raise ValueError(f"linrec: log_coeffs must be a bool, got {log_coeffs!r}")
    if log_coeffs:
        check_log_number(coeffs)
    if cu_seqlens is not None:
        inputs, coeffs, _, dim = normalize(inputs, coeffs, None, dim, reverse, complex_ok=True)
        check_cu_seqlens(cu_seqlens, inputs, dim)
        initial = segment_initial(initial, inputs, dim, cu_seqlens.shape[0] - 1)
        coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs)
        return scan_segments(scan_normalized, inputs, coeffs, initial, dim, bool(reverse), cu_seqlens, log_coeffs)
    return scan_normalized(*normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True), reverse, log_coeffs)
