"""Where a call runs, decided in one place.

- The compiled op (linrec._C on the CPU; linrec._C_cuda on CUDA devices the build has kernels
  for, next to a torch of its CUDA major version).
- Otherwise, on CUDA tensors: the Triton implementation (impl/triton.py, impl/triton_complex.py).
- Complex tensors with neither: two real scans (_complex.py), also for fewer sequences than
  the device has SMs, where the one-program-a-sequence Triton kernels would idle.
LINREC_BACKEND=cuda|triton forces a backend for CUDA tensors.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

from . import _C, tuning
from ._autograd import call_compiled, refuse_torch_func
from ._ops import register_missing_cuda_kernels


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


C_CUDA, NO_CUDA_KERNELS = _load_cuda_kernels()
HAS_CUDA_KERNELS = C_CUDA is not None
if HAS_CUDA_KERNELS:
    tuning.install(C_CUDA)  # the default table; a device's own comes with its first call (_resolve_backend)
else:
    register_missing_cuda_kernels(NO_CUDA_KERNELS)

_BACKENDS = ("auto", "cuda", "triton")


def archs_cover(capability: tuple[int, int], archs: str) -> bool:
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
def cuda_backend(device_index: int) -> str:
    return _resolve_backend(device_index)


@_assume_constant_result
def forced_backend() -> str:
    """LINREC_BACKEND as set ('auto' when it is not): whether the caller forced a backend."""
    return os.environ.get("LINREC_BACKEND", "auto")


@functools.cache
def _resolve_backend(device_index: int) -> str:
    """'cuda' or 'triton' for this device: LINREC_BACKEND forces one, auto prefers compiled kernels."""
    choice = os.environ.get("LINREC_BACKEND", "auto")
    if choice not in _BACKENDS:
        raise ValueError(f"linrec: LINREC_BACKEND={choice!r}; expected one of {', '.join(_BACKENDS)}")
    capability = torch.cuda.get_device_capability(device_index)
    archs = _C.build_info()["cuda_archs"]
    name = torch.cuda.get_device_name(device_index)
    if not HAS_CUDA_KERNELS:
        why = NO_CUDA_KERNELS
    elif not archs_cover(capability, archs):
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
    tuning.install(C_CUDA, device_index, name, tuning.hardware_facts(torch.cuda.get_device_properties(device_index)))
    return "cuda"



_sm_counts: dict[int, int] = {}


def complex_path(x: torch.Tensor, dim: int) -> str:
    """'compiled', 'triton' or 'polar' for a complex call (the module docstring says why)."""
    if not x.is_cuda:
        return "compiled"
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if cuda_backend(index) == "cuda":
        return "compiled"
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    try:
        import triton  # noqa: F401

        many_seqs = x.numel() >= _sm_counts[index] * max(1, x.shape[dim])
    except ImportError:
        many_seqs = False
    return "triton" if many_seqs else "polar"


def scan_real(inputs, coeffs, initial, dim: int, reverse: bool, log_coeffs: bool = False,
              cuts: torch.Tensor | None = None) -> torch.Tensor:
    """The recurrence on real arguments already checked by _args.normalize, where they run."""
    if inputs.is_cuda and cuda_backend(inputs.device.index or 0) == "triton":
        from .impl.triton import triton_fwd

        refuse_torch_func("the Triton kernels (no compiled kernels for this GPU, or LINREC_BACKEND=triton)")
        return triton_fwd(inputs, coeffs, initial, dim, bool(reverse), True, log_coeffs, cuts)
    return call_compiled(inputs, coeffs, initial, dim, reverse, log_coeffs=log_coeffs, cuts=cuts)
