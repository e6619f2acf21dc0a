"""What torch.library knows of the fused selective scan's ops.

linrec::selective_scan_fwd / selective_scan_bwd are compiled (schemas in csrc/ops/ops.cpp, CPU
and CUDA kernels); linrec::_selective_scan_fwd_triton / _selective_scan_bwd_triton are the
Triton implementation (impl/triton_selective.py) as Python custom ops, imported only when a call
takes them. Both pairs take normalised arguments (linrec/_selective.py) and share the fake
kernels and the autograd Functions here (autograd_functions; `Route`: what selective_scan calls
for each): the forward keeps its inputs and checkpoints, the backward op gives every gradient at
once. Gradients are first order (the backward ops are not differentiable).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from . import _C  # noqa: F401  (loading it registers the ops)

CHECKPOINT_STEPS = 128  # csrc/selective_params.h: the forward saves the state every 128 steps

fwd_op = torch.ops.linrec.selective_scan_fwd
fwd_op_no_autograd = torch.ops.linrec._selective_scan_fwd  # for SelectiveScanFunction
bwd_op = torch.ops.linrec.selective_scan_bwd


def _check_fake_args(named_tensors, reverse, steps_per_thread, warps, cuts, cu_seqlens=None):
    """Checks of csrc/ops/selective_args.h that need no data, in the fake kernels: torch.compile
    traces these, and the dispatcher sends here any call with a meta tensor among its arguments,
    where a CPU tensor beside it must not come back as an uninitialised result."""
    (_, u), *others = named_tensors
    for name, t in others:
        if t is not None and t.device != u.device:
            raise RuntimeError(f"linrec: {name} is on a different device than u")
    if reverse not in (0, 1):
        raise RuntimeError(f"linrec: reverse must be a bool (or 0 / 1), got {reverse}")
    if steps_per_thread < 0 or warps < 0 or (steps_per_thread == 0) != (warps == 0):
        raise RuntimeError(f"linrec: steps_per_thread={steps_per_thread} and warps={warps} must both be 0 "
                           "(automatic) or both positive")
    if cuts is not None:
        if cuts.dtype not in (torch.bool, torch.uint8) or cuts.dim() != 1 or cuts.shape[0] != u.shape[2]:
            raise RuntimeError(f"linrec: cuts must be a 1-D bool or uint8 tensor, one element a step: {u.shape[2]} "
                               "(u.shape[dim])")
        if cuts.device != u.device:
            raise RuntimeError("linrec: cuts is on a different device than u")
        if dict(named_tensors).get("initial_state") is not None and cu_seqlens is None:
            raise RuntimeError("linrec: cuts and initial_state exclude each other unless cu_seqlens gives a state "
                               "a segment")
    if cu_seqlens is not None:
        if cuts is None or cu_seqlens.dtype != torch.int64 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            raise RuntimeError("linrec: cu_seqlens must be a 1-D int64 tensor of at least 2 elements, with cuts")
        if cu_seqlens.device != u.device:
            raise RuntimeError("linrec: cu_seqlens is on a different device than u")


def _state_shape(u, A, cu_seqlens):
    """last_state's (and initial_state's) shape: (batch, dim, N), or a state a segment."""
    batch, dim, _ = u.shape
    if cu_seqlens is None:
        return (batch, dim, A.shape[1])
    return (batch, dim, cu_seqlens.shape[0] - 1, A.shape[1])


def _acc_dtype(u):
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _named(names, tensors):
    return tuple(zip(names.split(), tensors))


def _fwd_fake(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse, steps_per_thread=0,
              warps=0, cuts=None, cu_seqlens=None):
    _check_fake_args(_named("u delta A B C D z delta_bias initial_state",
                            (u, delta, A, B, C, D, z, delta_bias, initial_state)), reverse, steps_per_thread, warps,
                     cuts, cu_seqlens)
    batch, dim, length = u.shape
    states = A.shape[1]
    acc = _acc_dtype(u)
    checkpoints = (length + CHECKPOINT_STEPS - 1) // CHECKPOINT_STEPS
    return (u.new_empty(batch, dim, length), u.new_empty(_state_shape(u, A, cu_seqlens), dtype=acc),
            u.new_empty(batch, dim, checkpoints, states, dtype=acc))


def _bwd_fake(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints, delta_softplus,
              reverse, steps_per_thread=0, warps=0, cuts=None, cu_seqlens=None):
    _check_fake_args(_named("u d_y d_last_state delta A B C D z delta_bias initial_state checkpoints",
                            (u, d_y, d_last_state, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints)),
                     reverse, steps_per_thread, warps, cuts, cu_seqlens)
    batch, dim, length = u.shape
    states = A.shape[1]
    acc = _acc_dtype(u)

    def bc_grad(t):  # per step (batch, groups, N, L) or per channel (dim, N), in the float type
        return u.new_empty(t.shape if t.dim() == 4 else (dim, states), dtype=acc)

    def optional_grad(t, shape, dtype):
        return u.new_empty(shape if t is not None else (0,), dtype=dtype)
    return (u.new_empty(u.shape), u.new_empty(u.shape), u.new_empty(dim, states, dtype=acc), bc_grad(B), bc_grad(C),
            optional_grad(D, (dim,), acc), optional_grad(z, u.shape, u.dtype),
            optional_grad(delta_bias, (dim,), acc), u.new_empty(_state_shape(u, A, cu_seqlens), dtype=acc))


torch.library.register_fake("linrec::selective_scan_fwd", _fwd_fake)
torch.library.register_fake("linrec::_selective_scan_fwd", _fwd_fake)
torch.library.register_fake("linrec::selective_scan_bwd", _bwd_fake)


# -- The Triton implementation as custom ops (its module is imported on the first call)


@torch.library.custom_op("linrec::_selective_scan_fwd_triton", mutates_args=())
def triton_fwd_op(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
                  initial_state: torch.Tensor | None, delta_softplus: bool, reverse: bool,
                  cuts: torch.Tensor | None = None,
                  cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .impl.triton_selective import selective_scan_fwd

    return selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse, cuts,
                              cu_seqlens)


@torch.library.custom_op("linrec::_selective_scan_bwd_triton", mutates_args=())
def triton_bwd_op(d_y: torch.Tensor, d_last_state: torch.Tensor | None, u: torch.Tensor, delta: torch.Tensor,
                  A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                  delta_bias: torch.Tensor | None, initial_state: torch.Tensor | None, checkpoints: torch.Tensor,
                  delta_softplus: bool, reverse: bool, cuts: torch.Tensor | None = None,
                  cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor, torch.Tensor]:
    from .impl.triton_selective import selective_scan_bwd

    return selective_scan_bwd(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints,
                              delta_softplus, reverse, cuts, cu_seqlens)


@triton_fwd_op.register_fake
def _triton_fwd_fake(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse, cuts=None,
                     cu_seqlens=None):
    return _fwd_fake(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse, 0, 0, cuts,
                     cu_seqlens)


@triton_bwd_op.register_fake
def _triton_bwd_fake(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints,
                     delta_softplus, reverse, cuts=None, cu_seqlens=None):
    return _bwd_fake(d_y, d_last_state, u, delta, A, B, C, D, z, delta_bias, initial_state, checkpoints,
                     delta_softplus, reverse, 0, 0, cuts, cu_seqlens)


# -- Autograd

_TENSOR_ARGS = 9  # u, delta, A, B, C, D, z, delta_bias, initial_state; then delta_softplus, reverse, ...


def _setup_context(ctx, inputs, output):
    _, _, checkpoints = output
    ctx.mark_non_differentiable(checkpoints)
    ctx.config = inputs[_TENSOR_ARGS:]
    ctx.save_for_backward(*inputs[:_TENSOR_ARGS], checkpoints)


def _grads(bwd, ctx, d_y, d_last_state):
    """The gradients of the nine tensor arguments, each in its argument's dtype (None for an absent one)."""
    *tensors, checkpoints = ctx.saved_tensors
    grads = bwd(d_y, d_last_state, *tensors, checkpoints, *ctx.config)
    # The ops give d_B and d_C in the float type; per-step B and C may be 16-bit.
    return tuple(None if t is None else g if g.dtype == t.dtype else g.to(t.dtype) for t, g in zip(tensors, grads))


def _backward(bwd, ctx, d_y, d_last_state, _):
    return *_grads(bwd, ctx, d_y, d_last_state), *([None] * len(ctx.config))


# The compiled forward op as users may call it; linrec.selective_scan takes the Functions below, and
# the Triton ops only through them (a registered autograd would run inside their forward, where
# torch.func's transforms refuse it).
torch.library.register_autograd("linrec::selective_scan_fwd", lambda ctx, *g: _backward(bwd_op, ctx, *g),
                                setup_context=_setup_context)


class Route(NamedTuple):
    """How linrec.selective_scan calls one implementation: its forward op without autograd, and
    the two autograd.Functions over it and its backward op (see autograd_functions)."""
    fwd: object
    function: type
    transformable: type


def autograd_functions(fwd, bwd) -> tuple[type, type]:
    """The autograd.Functions over a forward op (without autograd registration) and its backward,
    for linrec.selective_scan's calls. A registered autograd (as above) wraps the op in torch.library's
    own autograd function, which cost every call host time (python -m linrec.bench --host, 2-core
    CPU, (1, 4, 8) float32, N = 2: a forward with grad 87-92 -> 30-31 µs, forward and backward
    224-356 -> 137-171; docs/design/0024-host-time-against-native-chains.md). The op's arguments
    after the tensors come as one tuple, `config`. The first Function is the cheap one-method form
    (context in forward); torch.func's grad transforms (grad, vjp) need the second, with a separate
    setup_context, taken only while a transform is active. The ops have no vmap rule, so vmap and
    the transforms built on it (jacrev, hessian) raise."""

    class SelectiveScanFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, u, delta, A, B, C, D, z, delta_bias, initial_state, config):
            tensors = (u, delta, A, B, C, D, z, delta_bias, initial_state)
            y, last_state, checkpoints = fwd(*tensors, *config)
            ctx.mark_non_differentiable(checkpoints)
            ctx.config = config
            ctx.save_for_backward(*tensors, checkpoints)
            return y, last_state, checkpoints

        @staticmethod
        @once_differentiable  # the backward ops have no derivative: a double backward raises, not zeros
        def backward(ctx, d_y, d_last_state, _):
            return *_grads(bwd, ctx, d_y, d_last_state), None

    class SelectiveScanTransformable(torch.autograd.Function):
        @staticmethod
        def forward(u, delta, A, B, C, D, z, delta_bias, initial_state, config):
            return fwd(u, delta, A, B, C, D, z, delta_bias, initial_state, *config)

        @staticmethod
        def setup_context(ctx, inputs, output):
            *tensors, config = inputs
            ctx.mark_non_differentiable(output[2])
            ctx.config = config
            ctx.save_for_backward(*tensors, output[2])

        backward = staticmethod(SelectiveScanFunction.backward)

    return SelectiveScanFunction, SelectiveScanTransformable


class _NoTransforms:
    """Under torch.func's transforms the Triton ops cannot run: a Python custom op has an autograd
    kernel of its own (an autograd.Function without setup_context), which the transforms refuse,
    and a Triton launch cannot read the transforms' wrapped tensors. This says so by name."""

    @staticmethod
    def apply(*args):
        raise RuntimeError("linrec: torch.func transforms (grad, vjp) of selective_scan run on the compiled kernels "
                           "(CPU, and CUDA devices the build has kernels for), not in Triton (other GPUs, and "
                           "packed sequences on CUDA)")


# The compiled ops' config: (delta_softplus, reverse, steps_per_thread, warps[, cuts, cu_seqlens]);
# Triton's: (delta_softplus, reverse, cuts, cu_seqlens).
COMPILED = Route(fwd_op_no_autograd, *autograd_functions(fwd_op_no_autograd, bwd_op))
TRITON = Route(triton_fwd_op, autograd_functions(triton_fwd_op, triton_bwd_op)[0], _NoTransforms)
