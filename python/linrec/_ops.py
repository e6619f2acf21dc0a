"""What torch.library knows of the compiled ops linrec::linrec_fwd and linrec::linrec_bwd.

The schemas live in C++ (csrc/ops/ops.cpp). Here: the op handles, fake kernels (so
torch.compile traces the ops with no graph break, and meta tensors get checked), vmap
rules (torch.func), and the CUDA kernels' stand-ins where linrec._C_cuda is not loaded.
How linrec differentiates the ops is _autograd.py.
"""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loading it registers the ops)
from ._registry import FAMILIES, KERNEL_AUTO, STORAGES

_FAMILIES_BY_ID = {f.id: f for f in FAMILIES.values()}
LOG_STORAGES = frozenset((s.values, s.coeffs) for s in STORAGES.values() if s.log_coeffs)
_KERNEL_IDS = ", ".join(["0 auto"] + [f"{f.id} {name}" for name, f in FAMILIES.items()])  # as csrc/registry.h

fwd_op = torch.ops.linrec.linrec_fwd
bwd_op = torch.ops.linrec.linrec_bwd
# linrec_fwd with no autograd kernel: what linrec.linrec calls, differentiating it with the
# Functions of _autograd.py. The registered autograd of linrec_fwd is torch.library's Python wrapper,
# which every call pays for, with grad or without (csrc/ops/ops.cpp).
fwd_op_no_autograd = torch.ops.linrec._linrec_fwd


def _check_fake_args(named_tensors, kernel_args):
    """The checks of csrc/ops/op_args.h that need no data, in the fake kernels: torch.compile traces
    these, and the dispatcher sends here any call with a meta tensor among its arguments, where
    a CPU tensor beside it must not come back as an uninitialised result. `named_tensors`: the
    (name, tensor or None) pairs, first the one the others follow; None is allowed for initial."""
    (ref_name, ref), *others = named_tensors
    for name, t in named_tensors:
        if t is None and name != "initial":
            raise RuntimeError(f"linrec: {name} must be a tensor, got None")
    for name, t in others:
        if t is not None and t.device != ref.device:
            raise RuntimeError(f"linrec: {name} is on a different device than {ref_name}")
    reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode = kernel_args
    if reverse not in (0, 1):  # True and False are 1 and 0
        raise RuntimeError(f"linrec: reverse must be a bool (or 0 / 1), got {reverse}")
    family = _FAMILIES_BY_ID.get(kernel)
    if family is None and kernel != KERNEL_AUTO:
        raise RuntimeError(f"linrec: kernel={kernel} is not a kernel id ({_KERNEL_IDS})")
    least = 1 if family is not None and family.has_configs else 0  # the others ignore the config: 0 there
    if elems_per_thread < least or threads_per_block < least:
        raise RuntimeError(f"linrec: elems_per_thread={elems_per_thread} and threads_per_block={threads_per_block} "
                           f"must be {'positive' if least else 'non-negative'} for kernel={kernel}")
    if not 0 <= memcode <= 3:
        raise RuntimeError(f"linrec: memcode={memcode} must be in 0..3")
    if not 0 <= algocode <= 3:
        raise RuntimeError(f"linrec: algocode={algocode} must be in 0..3")


def _check_log_storage(values, coeffs, log_coeffs, values_name):
    """log_coeffs only on a storage the registry has log kernels for (csrc/ops/op_args.h, storage_of)."""
    if log_coeffs and (str(values.dtype).removeprefix("torch."), str(coeffs.dtype).removeprefix("torch.")) \
            not in LOG_STORAGES:
        raise RuntimeError(f"linrec: log_coeffs=True takes float32, float16 and bfloat16 {values_name} (coeffs of "
                           f"the same dtype, or float32), not {values.dtype} and {coeffs.dtype}: pass exp(coeffs) "
                           "with log_coeffs=False")


def _check_cuts(cuts, like, dim, initial, like_name):
    """The checks of csrc/ops/op_args.h's cuts_of."""
    if cuts is None:
        return
    if cuts.dtype not in (torch.bool, torch.uint8):
        raise RuntimeError(f"linrec: cuts must be a bool or uint8 tensor, got {cuts.dtype}")
    if cuts.dim() != 1 or cuts.shape[0] != like.shape[dim]:
        raise RuntimeError(f"linrec: cuts must be 1-D, one element a step: {like.shape[dim]} ({like_name}.shape[dim])")
    if cuts.device != like.device:
        raise RuntimeError(f"linrec: cuts is on a different device than {like_name}")
    if initial is not None:
        raise RuntimeError("linrec: cuts and initial exclude each other (the state entering a segment comes in "
                           "through the inputs)")


def _fwd_fake(inputs, coeffs, initial, dim, reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode,
              log_coeffs=False, cuts=None):
    _check_fake_args((("inputs", inputs), ("coeffs", coeffs), ("initial", initial)),
                     (reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode))
    _check_log_storage(inputs, coeffs, log_coeffs, "inputs")
    _check_cuts(cuts, inputs, dim, initial, "inputs")
    return torch.empty_like(inputs)


torch.library.register_fake("linrec::linrec_fwd", _fwd_fake)
torch.library.register_fake("linrec::_linrec_fwd", _fwd_fake)


@torch.library.register_fake("linrec::linrec_bwd")
def _bwd_fake(d_outputs, coeffs, outputs, initial, dim, reverse, kernel, elems_per_thread, threads_per_block, memcode,
              algocode, log_coeffs=False, cuts=None):
    _check_fake_args((("d_outputs", d_outputs), ("coeffs", coeffs), ("outputs", outputs), ("initial", initial)),
                     (reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode))
    _check_log_storage(d_outputs, coeffs, log_coeffs, "d_outputs")
    _check_cuts(cuts, d_outputs, dim, initial, "d_outputs")
    dim = dim % d_outputs.dim()
    state = d_outputs.shape[:dim] + d_outputs.shape[dim + 1:]
    return (torch.empty_like(d_outputs), torch.empty_like(d_outputs, dtype=coeffs.dtype),
            d_outputs.new_empty(state))


def _batch_first(t, in_dim, batch):
    """t with vmap's batch dim first; one without a batch dim is expanded to it (no copy)."""
    if t is None:
        return None
    return t.movedim(in_dim, 0) if in_dim is not None else t.expand(batch, *t.shape)


def _fwd_vmap(op):
    """The vmap rule of a forward op: the batch becomes one more sequence dim, in front."""
    def rule(info, in_dims, inputs, coeffs, initial, dim, reverse, *kernel):
        per_sample_dims = inputs.dim() - (in_dims[0] is not None)
        x, c, h = (_batch_first(t, d, info.batch_size) for t, d in zip((inputs, coeffs, initial), in_dims))
        return op(x, c, h, dim % per_sample_dims + 1, reverse, *kernel), 0
    return rule


def _bwd_vmap(info, in_dims, d_outputs, coeffs, outputs, initial, dim, reverse, *kernel):
    per_sample_dims = d_outputs.dim() - (in_dims[0] is not None)
    g, c, y, h = (_batch_first(t, d, info.batch_size) for t, d in zip((d_outputs, coeffs, outputs, initial), in_dims))
    return bwd_op(g, c, y, h, dim % per_sample_dims + 1, reverse, *kernel), (0, 0, 0)


torch.library.register_vmap("linrec::linrec_fwd", _fwd_vmap(fwd_op))
torch.library.register_vmap("linrec::_linrec_fwd", _fwd_vmap(fwd_op_no_autograd))
torch.library.register_vmap("linrec::linrec_bwd", _bwd_vmap)


_missing_cuda_kernels = None  # the torch.library.Library holding the registrations below, kept alive


def register_missing_cuda_kernels(reason: str) -> None:
    """Where linrec._C_cuda is not loaded (linrec/_backend.py), the ops' CUDA kernels raise a
    RuntimeError naming `reason`, not the dispatcher's 'could not run ... with arguments from the
    CUDA backend'. linrec.linrec and linrec.selective_scan send CUDA tensors to Triton then; these
    reach direct op calls."""
    global _missing_cuda_kernels

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"linrec: the compiled CUDA kernels are not loaded: {reason}. linrec.linrec and "
                           "linrec.selective_scan run the Triton implementation on CUDA tensors instead")

    _missing_cuda_kernels = torch.library.Library("linrec", "IMPL")
    for name in ("linrec_fwd", "_linrec_fwd", "linrec_bwd", "selective_scan_fwd", "_selective_scan_fwd",
                 "selective_scan_bwd"):
        _missing_cuda_kernels.impl(name, unavailable, "CUDA")
