"""linrec.selective_scan: Mamba's selective (S6) scan, fused, with mamba_ssm's selective_scan_fn arguments.

Here the arguments are checked (ValueError naming the argument) and brought into the form the
ops take (docs/design/0023-fused-selective-scan.md): u, delta and z in one dtype; A, D,
delta_bias, initial_state and per-channel B and C in the float type (float32, float64 for
float64 u); per-step B and C as (batch, groups, N, L). Then the compiled op runs (CPU, and CUDA
devices the build has kernels for), or the Triton implementation on other CUDA devices.
"""

from __future__ import annotations

import numbers

import torch
import torch.autograd.forward_ad as fwAD
from torch._C._functorch import TransformType, get_interpreter_stack

from ._backend import cuda_backend
from ._segments import check_cu_seqlens, cut_flags
from ._selective_ops import COMPILED, TRITON

MAX_STATES = 256
VALUE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_flag(name, value):
    if value is not True and value is not False and not (isinstance(value, numbers.Integral) and value in (0, 1)):
        raise ValueError(f"linrec: {name} must be a bool, got {value!r}")
    return bool(value)


def _check_tensor(name, t, device, required=True):
    """t is a real floating tensor on u's device, `device` (None allowed unless required)."""
    if t is None and not required:
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"linrec: {name} must be a tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"linrec: {name} has dtype {t.dtype}; expected a real floating dtype")
    if t.device != device:
        raise ValueError(f"linrec: {name} is on {t.device} but u is on {device}")


def _refuse_sparse_and_nested(**tensors):
    """A ValueError naming the first sparse or nested tensor among `tensors`, if any. Called only
    once a call has failed: checking each argument up front cost every call host time."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and (t.is_nested or t.layout != torch.strided):
            raise ValueError(f"linrec: {name} must be a dense tensor, got "
                             f"{'a nested tensor' if t.is_nested else f'layout {t.layout}'}")


def _differentiating_transforms() -> int:
    """How many torch.func transforms that differentiate (grad, vjp, jvp) are active."""
    stack = get_interpreter_stack() or ()
    return sum(level.key() in (TransformType.Grad, TransformType.Jvp) for level in stack)


def _check_shape(name, t, shape, expected):
    """t (unless None) has `shape`; `expected` names it in the error, a format string of the shape as
    {0}, formatted only on failure (formatting on every call cost host time)."""
    if t is not None and t.shape != shape:
        raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be {expected.format(tuple(shape))}")


def _cast(t, dtype):
    """t in dtype; None stays None. A tensor already in it is passed on, not through .to(): the
    call costs microseconds of host time even then, and eager calls feel it."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _bc_form(name, t, batch, channels, states, length):
    """B or C as the ops take it: (channels, states), or per step (batch, groups, states, length)."""
    if t.dim() == 2:
        _check_shape(name, t, (channels, states), "(channels={0[0]}, states={0[1]})")
        return t
    if t.dim() == 3:
        t = t.unsqueeze(1)
    if t.dim() != 4 or t.shape[0] != batch or t.shape[2] != states or t.shape[3] != length:
        raise ValueError(f"linrec: {name} of shape {tuple(t.shape)} must be (channels={channels}, states={states}), "
                         f"(batch={batch}, states, length={length}) or (batch, groups, states, length)")
    if t.shape[1] == 0 or channels % t.shape[1]:
        raise ValueError(f"linrec: {name} has {t.shape[1]} groups, which do not divide channels={channels}")
    return t


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, *, initial_state: torch.Tensor | None = None,
                   reverse: bool = False,
                   cu_seqlens: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The selective scan of Mamba (S6), fused, with the arguments of mamba_ssm's selective_scan_fn.

    For batch b, channel d, state n and step l, with dt = delta (+ delta_bias, through softplus
    if delta_softplus):

        h[b, d, n, l] = exp(dt[b, d, l] * A[d, n]) * h[b, d, n, l-1] + dt[b, d, l] * B[b, n, l] * u[b, d, l]
        y[b, d, l]    = (sum_n C[b, n, l] * h[b, d, n, l] + D[d] * u[b, d, l]) * silu(z[b, d, l])

    No (batch, channels, states, length) tensor is made: one kernel walks the sequence with
    the states in registers, and the backward rescans from a state saved every 128 steps.

    Args:
        u: (batch, channels, length) inputs, float32, float64, float16 or bfloat16.
        delta: (batch, channels, length) step sizes (cast to u's dtype).
        A: (channels, states) real state matrix (diagonal per channel; negative for decay), at
            most 256 states.
        B, C: (channels, states), or input-dependent (batch, states, length) or (batch, groups,
            states, length) with groups dividing channels (B and C alike where both are). Per
            step, they stay in u's dtype where they have it, and are otherwise cast to float32
            beside 16-bit u, to u's dtype beside float32 and float64 u.
        D: optional (channels,) skip connection.
        z: optional (batch, channels, length) gate: the output is multiplied by silu(z).
        delta_bias: optional (channels,) added to delta.
        delta_softplus: apply softplus to delta (after the bias).
        return_last_state: also return the state after the last step (with cu_seqlens, each
            segment's).
        initial_state: optional (batch, channels, states) state before the first step (zeros
            when None): with the last state, a long sequence runs as consecutive calls. With
            cu_seqlens, (batch, channels, segments, states): each segment's own.
        reverse: scan from the last step to the first.
        cu_seqlens: packed sequences of different lengths along the length dim: a 1-D int32 /
            int64 tensor [0, e1, ..., length] on u's device; segment k is steps cu_seqlens[k] ..
            cu_seqlens[k+1]-1, scanned on its own (in reverse too) from initial_state[:, :, k]
            (or zero), and its last state is the one its last step in scan order leaves (an empty
            segment's is its initial state). Its values are checked on CPU tensors outside
            torch.compile only: checking needs them on the host (on CUDA, a wait for the
            device; under torch.compile, while tracing), so a wrong cu_seqlens on CUDA gives
            wrong results, not an error.

    Returns:
        y, (batch, channels, length) in u's dtype; with return_last_state, (y, last_state),
        last_state (batch, channels, states), or (batch, channels, segments, states) with
        cu_seqlens, in float32 (float64 for float64 u). The scan computes in that float type
        too. Differentiable (first order) in every tensor argument, initial_state included;
        gradients come in each argument's dtype and shape. On the compiled kernels (CPU and
        CUDA) also under torch.func.grad and torch.func.vjp. A second derivative (a backward
        with create_graph=True, nested torch.func transforms) raises, as does forward-mode AD.

    Raises:
        ValueError: a wrong type, dtype, device or shape, naming the argument.
        NotImplementedError: dual tensors (forward-mode AD, torch.func.jvp), nested torch.func
            transforms.

    On CUDA tensors the compiled kernels run when the build has them for the device, the
    Triton implementation otherwise (LINREC_BACKEND=cuda|triton forces one).
    """
    try:
        return _selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                               initial_state, reverse, cu_seqlens)
    except Exception:
        _refuse_sparse_and_nested(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                                  initial_state=initial_state)
        raise


def _selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state, reverse,
                    cu_seqlens):
    """linrec.selective_scan, for dense tensors."""
    delta_softplus = _check_flag("delta_softplus", delta_softplus)
    return_last_state = _check_flag("return_last_state", return_last_state)
    reverse = _check_flag("reverse", reverse)
    if not isinstance(u, torch.Tensor):
        raise ValueError(f"linrec: u must be a tensor, got {type(u).__name__}")
    if u.dtype not in VALUE_DTYPES:
        raise ValueError(f"linrec: u has dtype {u.dtype}; expected float32, float64, float16 or bfloat16")
    if u.dim() != 3:
        raise ValueError(f"linrec: u of shape {tuple(u.shape)} must be (batch, channels, length)")
    u_device = u.device
    for name, t, required in (("delta", delta, True), ("A", A, True), ("B", B, True), ("C", C, True),
                              ("D", D, False), ("z", z, False), ("delta_bias", delta_bias, False),
                              ("initial_state", initial_state, False)):
        _check_tensor(name, t, u_device, required)
    batch, channels, length = u.shape
    _check_shape("delta", delta, u.shape, "u's shape {0}")
    _check_shape("z", z, u.shape, "u's shape {0}")
    if A.dim() != 2 or A.shape[0] != channels:
        raise ValueError(f"linrec: A of shape {tuple(A.shape)} must be (channels={channels}, states)")
    states = A.shape[1]
    if states > MAX_STATES:
        raise ValueError(f"linrec: A has {states} states; the selective scan takes at most {MAX_STATES}")
    _check_shape("D", D, (channels,), "(channels={0[0]},)")
    _check_shape("delta_bias", delta_bias, (channels,), "(channels={0[0]},)")
    if cu_seqlens is None:
        _check_shape("initial_state", initial_state, (batch, channels, states),
                     "(batch={0[0]}, channels={0[1]}, states={0[2]})")
    B = _bc_form("B", B, batch, channels, states, length)
    C = _bc_form("C", C, batch, channels, states, length)
    per_step = [t for t in (B, C) if t.dim() == 4]
    if len(per_step) == 2 and B.shape[1] != C.shape[1]:
        raise ValueError(f"linrec: C has {C.shape[1]} groups but B has {B.shape[1]}; per-step B and C share their "
                         "groups")

    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    if all(t.dtype == u.dtype for t in per_step):
        bc_dtype = u.dtype
    else:
        bc_dtype = torch.float32 if u.dtype in (torch.float16, torch.bfloat16) else u.dtype
    # One call each, not loops over the tensors: this runs on every call (host time).
    B, C = _cast(B, bc_dtype if B.dim() == 4 else acc), _cast(C, bc_dtype if C.dim() == 4 else acc)
    delta, z = _cast(delta, u.dtype), _cast(z, u.dtype)
    A, D, delta_bias, initial_state = _cast(A, acc), _cast(D, acc), _cast(delta_bias, acc), _cast(initial_state, acc)

    cuts = None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, u, 2, "u")
        segments = cu_seqlens.shape[0] - 1
        _check_shape("initial_state", initial_state, (batch, channels, segments, states),
                     "(batch={0[0]}, channels={0[1]}, segments={0[2]}, states={0[3]}): a state a segment of "
                     "cu_seqlens")
        if segments == 0:  # no segment, so no step: nothing to scan
            if length:
                raise ValueError(f"linrec: cu_seqlens holds no segment but u has {length} steps")
            y = u * 0
            last_state = initial_state.clone() if initial_state is not None else u.new_zeros(
                (batch, channels, 0, states), dtype=acc)
            return (y, last_state) if return_last_state else y
        cuts = cut_flags(cu_seqlens, length, reverse, u_device)
        cu_seqlens = _cast(cu_seqlens, torch.int64)

    tensors = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    # Dual tensors (forward-mode AD) carry tangents whatever the grad mode; none exist outside a dual level.
    if getattr(fwAD, "_current_level", 0) >= 0 and not torch.compiler.is_compiling() and any(
            t is not None and fwAD.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError("linrec: selective_scan has no forward-mode AD (dual tensors, torch.func.jvp); "
                                  "it differentiates in reverse mode, to first order")
    index = u_device.index if u_device.index is not None else (torch.cuda.current_device() if u.is_cuda else 0)
    if u.is_cuda and cuda_backend(index) == "triton":
        route, config = TRITON, (delta_softplus, reverse, cuts, cu_seqlens)
    else:
        route, config = COMPILED, (delta_softplus, reverse, 0, 0)  # steps_per_thread, warps: the automatic config
        if cuts is not None:
            config += (cuts, cu_seqlens)
    if torch._C._are_functorch_transforms_active():
        if _differentiating_transforms() > 1:  # the backward ops have no derivative: it would come back zero
            raise NotImplementedError("linrec: selective_scan differentiates to first order; nested torch.func "
                                      "transforms (grad of grad, jvp of grad) need its second derivative")
        y, last_state, _ = route.transformable.apply(*tensors, config)
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        y, last_state, _ = route.function.apply(*tensors, config)
    else:
        y, last_state, _ = route.fwd(*tensors, *config)
    return (y, last_state) if return_last_state else y
