"""linrec: the diagonal linear recurrence y[l] = c[l] * y[l-1] + x[l] for PyTorch.

    import linrec
    y = linrec.linrec(x, c)                      # along the last dim
    y = linrec.linrec(x, c, reverse=True, dim=1, initial=h0)
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

try:
    from . import _C
except ImportError as _error:
    # linrec._C needs only torch's CPU libraries of the stable ABI (torch >= 2.10).
    raise ImportError(
        f"linrec: its compiled extension does not load with this torch ({torch.__version__}): {_error}. "
        "linrec's binary wheels need torch >= 2.10; or build linrec against this torch: "
        "pip install --no-build-isolation --no-binary linrec linrec"
    ) from _error
from . import tuning
from ._args import normalize
from ._complex import linrec_complex
from ._registry import FAMILIES
from ._ops import call_compiled, refuse_torch_func
from ._version import __version__


def _load_cuda_kernels():
    """linrec._C_cuda, the CUDA kernels, and None; or None and why they are not loaded.

    That module links the CUDA runtime of the CUDA version it was built with and torch's
    CUDA library, so it is loaded only next to a torch of the same CUDA major version. With
    any other torch, CUDA tensors go to the Triton implementation (warning once a device)."""
    built = _C.build_info()["cuda_version"]
    if not built:
        return None, "this build has no CUDA kernels"
    if torch.version.cuda is None:
        return None, f"the CUDA kernels were built for CUDA {built}, and this torch ({torch.__version__}) has no CUDA"
    if torch.version.cuda.split(".")[0] != built.split(".")[0]:
        return None, (f"the CUDA kernels were built for CUDA {built}, and this torch ({torch.__version__}) has "
                      f"CUDA {torch.version.cuda}; install the wheel for it (README, 'Install a binary wheel')")
    try:
        from . import _C_cuda
    except ImportError as error:
        return None, f"the CUDA kernels (CUDA {built}) do not load: {error}"
    return _C_cuda, None


_C_cuda, _NO_CUDA_KERNELS = _load_cuda_kernels()
_HAS_CUDA_KERNELS = _C_cuda is not None
if _HAS_CUDA_KERNELS:
    tuning.install(_C_cuda)  # the default table; a device's own comes with its first call (_resolve_backend)
else:
    from ._ops import register_missing_cuda_kernels

    register_missing_cuda_kernels(_NO_CUDA_KERNELS)

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

_BACKENDS = ("auto", "cuda", "triton")


def _archs_cover(capability: tuple[int, int], archs: str) -> bool:
    """Whether a TORCH_CUDA_ARCH_LIST-style `archs` runs on a device of this compute capability:
    SASS for X.Y runs on X.Z with Z >= Y (X.Ya only on X.Y), PTX on anything at least as new."""
    for arch in filter(None, archs.replace(" ", ";").split(";")):
        ptx = arch.endswith("+PTX")
        name = arch.removesuffix("+PTX")
        specific = name.endswith("a")
        major, minor = (int(v) for v in name.rstrip("a").split("."))
        if ptx and (major, minor) <= capability:
            return True
        if major == capability[0] and (minor == capability[1] if specific else minor <= capability[1]):
            return True
    return False


def _assume_constant_result(fn):
    """torch.compiler.assume_constant_result, without its import of torch._dynamo, which doubles
    the time of `import linrec` (2-core CPU: 1.1 s of 2.4). The decorator only marks the function
    with this attribute, which Dynamo reads when it traces a call (torch 2.10-2.14);
    tests/test_ops.py checks that the two still agree."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _cuda_backend(device_index: int) -> str:
    return _resolve_backend(device_index)


@functools.cache
def _resolve_backend(device_index: int) -> str:
    """'cuda' or 'triton' for this device: LINREC_BACKEND forces one, auto prefers compiled kernels."""
    choice = os.environ.get("LINREC_BACKEND", "auto")
    if choice not in _BACKENDS:
        raise ValueError(f"linrec: LINREC_BACKEND={choice!r}; expected one of {', '.join(_BACKENDS)}")
    capability = torch.cuda.get_device_capability(device_index)
    archs = _C.build_info()["cuda_archs"]
    name = torch.cuda.get_device_name(device_index)
    if not _HAS_CUDA_KERNELS:
        why = _NO_CUDA_KERNELS
    elif not _archs_cover(capability, archs):
        why = f"this build has no kernels for {name} (archs: {archs!r})"
    else:
        why = None
    if choice == "cuda" and why:
        raise RuntimeError(f"linrec: LINREC_BACKEND=cuda, but {why}")
    if choice == "triton" or why:
        if choice == "auto":
            warnings.warn(f"linrec: no compiled kernels for {name}: {why}; using the Triton implementation",
                          stacklevel=3)
        return "triton"
    tuning.install(_C_cuda, device_index, name)
    return "cuda"


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
    if inputs.is_cuda and _cuda_backend(inputs.device.index or 0) == "triton":
        from .impl.triton import triton_fwd

        refuse_torch_func("the Triton kernels (no compiled kernels for this GPU, or LINREC_BACKEND=triton)")
        return triton_fwd(inputs, coeffs, initial, dim, bool(reverse), True)
    return call_compiled(inputs, coeffs, initial, dim, reverse)
