"""How linrec differentiates a scan: autograd for the compiled op, and the torch.func guards.

The fused backward op computes d_inputs, d_coeffs and d_initial in one pass; with
create_graph=True the backward is one more scan and element-wise products
(backward_by_scans), which autograd differentiates again, for every implementation;
forward-mode AD is one more forward. linrec.linrec's calls take the cheapest Function
that serves the call (_autograd_function); the op's own registration serves direct
callers of torch.ops.linrec.linrec_fwd.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from ._ops import bwd_op, fwd_op, fwd_op_no_autograd
from ._registry import KERNEL_AUTO


def _setup_context(ctx, inputs, output):
    _, coeffs, initial, *config = inputs
    # dim, reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode[, log_coeffs[, cuts]]
    ctx.config = config
    ctx.has_initial = initial is not None
    ctx.save_for_backward(coeffs, output, initial)


def _previous_states(outputs, initial, dim, reverse):
    """The state before each step: outputs shifted one step along the scan, initial (or 0) first."""
    length = outputs.shape[dim]
    first = (initial if initial is not None else outputs.new_zeros(())).expand(
        outputs.shape[:dim] + outputs.shape[dim + 1:]).unsqueeze(dim)
    if length == 0:
        return outputs
    if reverse:
        return torch.cat([outputs.narrow(dim, 1, length - 1), first], dim)
    return torch.cat([first, outputs.narrow(dim, 0, length - 1)], dim)


def exp_of_log(log_coeffs: torch.Tensor) -> torch.Tensor:
    """The coefficients of log-coefficients: exp, computed in float32 at least (a 16-bit log gate
    near 0 is a decay near 1, which 16 bits would round)."""
    if log_coeffs.dtype in (torch.float16, torch.bfloat16):
        log_coeffs = log_coeffs.float()
    return log_coeffs.exp()


def _cut_along(cuts, like, dim):
    """cuts (one flag a step) as a bool tensor broadcasting along `dim` of `like`."""
    shape = [1] * like.dim()
    shape[dim] = like.shape[dim]
    return cuts.bool().view(shape)


def backward_by_scans(scan, d_outputs, coeffs, outputs, initial, dim, reverse, log_coeffs=False, cuts=None):
    """The backward of y[l] = c[l] * y[l-1] + x[l] as one more scan and element-wise products,
    for a backward that must itself be differentiable (create_graph=True: double backward,
    Hessian-vector products). With "next" one step later in the scan's direction:

        d_inputs[l] = conj(c[next(l)]) * d_inputs[next(l)] + d_outputs[l]   (the scan against it)
        d_coeffs[l] = d_inputs[l] * conj(y[l-1])                            (y[-1] = initial, or 0)
        d_initial   = d_inputs[first] * conj(c[first])

    `scan(inputs, coeffs, dim, reverse)` is a differentiable linrec (the implementation's own), so
    every order of derivative follows. The fused backward kernels compute the same in one pass;
    conj is the identity on real tensors. With log_coeffs, `coeffs` holds log c and d_coeffs is
    the gradient of log c, c * d_coeffs. With cuts (packed sequences: the op's argument), the
    coefficients at cut steps are 0 and so are their gradients. Returns (d_inputs, d_coeffs,
    d_initial or None)."""
    length = outputs.shape[dim]
    if length == 0:
        d_initial = None if initial is None else torch.zeros_like(initial)
        return torch.zeros_like(d_outputs), torch.zeros_like(coeffs), d_initial
    if log_coeffs:
        linear = exp_of_log(coeffs)
        d_inputs, d_linear, d_initial = backward_by_scans(scan, d_outputs, linear, outputs, initial, dim, reverse,
                                                          cuts=cuts)
        return d_inputs, (d_linear * linear).to(coeffs.dtype), d_initial
    if cuts is not None:
        kept = ~_cut_along(cuts, coeffs, dim)
        d_inputs, d_kept, d_initial = backward_by_scans(scan, d_outputs, coeffs * kept, outputs, initial, dim,
                                                        reverse)
        return d_inputs, d_kept * kept, d_initial
    next_coeffs = _previous_states(coeffs, None, dim, not reverse).conj()  # c one step later, 0 past the end
    d_inputs = scan(d_outputs, next_coeffs, dim, not reverse)
    # In the coefficients' dtype: float32 in mixed storage, where d_inputs and outputs are 16-bit.
    d_coeffs = d_inputs.to(coeffs.dtype) * _previous_states(outputs, initial, dim, reverse).to(coeffs.dtype).conj()
    d_initial = None
    if initial is not None:
        first = length - 1 if reverse else 0
        d_initial = (d_inputs.select(dim, first) * coeffs.select(dim, first).conj()).to(initial.dtype)
    return d_inputs, d_coeffs, d_initial


def _grads(ctx, d_outputs):
    """(d_inputs, d_coeffs, d_initial or None) of a call whose context _setup_context filled."""
    coeffs, outputs, initial = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate again
        dim, reverse, *kernel = ctx.config[:7]
        d_inputs, d_coeffs, d_initial = backward_by_scans(
            lambda x, c, d, r: call_compiled(x, c, None, d, r, *kernel), d_outputs, coeffs, outputs, initial,
            dim % outputs.dim(), reverse, log_coeffs=_log_coeffs(ctx.config), cuts=_cuts(ctx.config))
    else:
        d_inputs, d_coeffs, d_initial = bwd_op(d_outputs, coeffs, outputs, initial, *ctx.config)
    return d_inputs, d_coeffs, (d_initial if ctx.has_initial else None)


def _backward(ctx, d_outputs):
    """The backward of the op's own arguments: no gradient for each config argument."""
    return *_grads(ctx, d_outputs), *([None] * len(ctx.config))


def _log_coeffs(config) -> bool:
    """Whether a call's config (the op's arguments after initial) has log-coefficients."""
    return len(config) > 7 and bool(config[7])


def _cuts(config):
    """A call's cuts (packed sequences), or None."""
    return config[8] if len(config) > 8 else None


torch.library.register_autograd("linrec::linrec_fwd", _backward, setup_context=_setup_context)


class _LinrecFunction(torch.autograd.Function):
    """The registration above as an autograd.Function, for linrec.linrec's calls: the same
    forward, context and fused backward with less host work a call than the op's own autograd
    wrapper (2-core CPU, 4 x 16 float32, forward with grad 39 -> 13 µs). The one-method form
    (context in forward) is the cheap one: with a separate setup_context it cost 32 µs (and
    torch.func transforms, which need that form, fail on the op's wrapper too). The op's
    arguments after initial come as one tuple, `config`: an argument of apply costs host time
    in the forward and in the backward, which returns a gradient (None) for each."""

    @staticmethod
    def forward(ctx, inputs, coeffs, initial, config):
        outputs = fwd_op_no_autograd(inputs, coeffs, initial, *config)
        ctx.config = config
        ctx.has_initial = initial is not None
        ctx.save_for_backward(coeffs, outputs, initial)
        return outputs

    @staticmethod
    def backward(ctx, d_outputs):
        return *_grads(ctx, d_outputs), None


class _LinrecDualFunction(_LinrecFunction):
    """_LinrecFunction plus forward-mode AD, for calls with dual tensors. The tangent of
    y[l] = c[l] * y[l-1] + x[l] is the same recurrence, t[l] = c[l] * t[l-1] + (dx[l] +
    dc[l] * y[l-1]), entered with d_initial: one more forward. A class of its own because
    torch.compile does not trace a Function that defines jvp."""

    @staticmethod
    def forward(ctx, inputs, coeffs, initial, config):
        outputs = _LinrecFunction.forward(ctx, inputs, coeffs, initial, config)
        ctx.save_for_forward(coeffs, outputs, initial)
        return outputs

    @staticmethod
    def jvp(ctx, d_inputs, d_coeffs, d_initial, *_):  # *_: the config's tangents (None)
        coeffs, outputs, initial = ctx.saved_tensors
        dim, reverse = ctx.config[0] % outputs.dim(), ctx.config[1]
        steps = d_inputs if d_inputs is not None else torch.zeros_like(outputs)
        if d_coeffs is not None:
            if _log_coeffs(ctx.config):  # the tangent of c = exp(log c)
                d_coeffs = d_coeffs * exp_of_log(coeffs)
            if _cuts(ctx.config) is not None:  # a cut coefficient is not used
                d_coeffs = d_coeffs * ~_cut_along(_cuts(ctx.config), d_coeffs, dim)
            steps = steps + d_coeffs * _previous_states(outputs, initial, dim, reverse)
        # The tangent is in the outputs' dtype (16-bit in mixed storage, where d_coeffs * y is float32).
        return fwd_op(steps.to(outputs.dtype), coeffs, d_initial, *ctx.config)  # differentiable again


class _LinrecTransformable(torch.autograd.Function):
    """The same Function for calls under torch.func transforms (grad, vmap, jacrev, jacfwd,
    hessian, functional_call's gradients), which take an autograd.Function only in its
    setup_context form and with a vmap rule. That form costs host time on every call (see
    _LinrecFunction), so linrec.linrec takes it only while a transform is active. Its vmap rule
    is generated: the forward, backward and jvp run under vmap, where the ops' own vmap rules
    (below) scan the batch as more sequences."""

    generate_vmap_rule = True

    @staticmethod
    def forward(inputs, coeffs, initial, *config):
        return fwd_op_no_autograd(inputs, coeffs, initial, *config)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[1], output, inputs[2])

    backward = staticmethod(_backward)
    jvp = staticmethod(_LinrecDualFunction.jvp)


_EAGER_IN_TORCH_FUNC = (
    "linrec runs eagerly under torch.func transforms inside torch.compile: Dynamo traces the transform "
    "itself and does not see linrec's autograd there (grad, jacrev, jacfwd and hessian came back zero)")


class TracedInTorchFunc(NotImplementedError):
    """Raised while torch.compile traces a linrec call inside a torch.func transform, to leave the call
    out of the graph.

    Dynamo traces grad, vmap, jacrev, ... by running them over its own tensors, on which
    requires_grad reads False, and it does not take a setup_context Function there: traced, a
    linrec call came out without autograd, and torch.compile(torch.func.grad(f)) returned zero
    gradients (torch 2.11-2.14; a Function whose forward calls the op traced no better). Raised
    while tracing, this error makes Dynamo run the call eagerly (a graph break), where linrec's
    setup_context Function and vmap rules handle the transform; with fullgraph=True it reaches the
    caller. (torch 2.11 gets a compiled jacrev wrong across any graph break, this one included.)"""


def refuse_torch_func(path: str) -> None:
    """Raise a clear error under torch.func transforms on a path that does not support them (the
    Triton fallbacks, whose autograd is not in the form the transforms take). While torch.compile
    traces, TracedInTorchFunc: the eager call then raises this error."""
    if torch._C._are_functorch_transforms_active():
        if torch.compiler.is_compiling():
            raise TracedInTorchFunc(_EAGER_IN_TORCH_FUNC)
        raise NotImplementedError(
            f"linrec: torch.func transforms (vmap, grad, jacrev, ...) run on the compiled kernels only, "
            f"and this call takes {path}; they work on CPU tensors and on CUDA devices the build has "
            "kernels for (linrec.build_info())")


def _autograd_function(inputs, coeffs, initial):
    """The Function that differentiates this call, or None when neither mode of AD needs one."""
    # Dual tensors carry tangents whatever the grad mode; with no dual level open (forward_ad's
    # own test in unpack_dual) none does. Compiled code takes the reverse-mode Function only.
    # Written out, not as loops over the tensors: this runs on every call (host time, 0015).
    if not torch.compiler.is_compiling():
        if torch._C._are_functorch_transforms_active():
            return _LinrecTransformable
        if getattr(fwAD, "_current_level", 0) >= 0 and any(
                fwAD.unpack_dual(t).tangent is not None for t in (inputs, coeffs, initial) if t is not None):
            return _LinrecDualFunction
    elif torch._C._are_functorch_transforms_active():
        raise TracedInTorchFunc(_EAGER_IN_TORCH_FUNC)
    if torch.is_grad_enabled() and (inputs.requires_grad or coeffs.requires_grad or
                                    (initial is not None and initial.requires_grad)):
        return _LinrecFunction
    return None


MAX_CUDA_SEQS = 2**31 - 1  # a launch's grid: at most 2^31-1 blocks (csrc/kernels/*.cuh)


def call_compiled(inputs, coeffs, initial, dim, reverse, kernel=KERNEL_AUTO, elems_per_thread=0,
                  threads_per_block=0, memcode=0, algocode=3, log_coeffs=False, cuts=None):
    """Run the compiled op on arguments already checked by _args.normalize (log_coeffs: on a
    storage the registry has log kernels for, _dispatch.fused_log; cuts: from _segments, with
    no initial)."""
    if inputs.is_cuda and inputs.shape[dim] and inputs.numel() // inputs.shape[dim] > MAX_CUDA_SEQS:
        raise ValueError(f"linrec: inputs holds {inputs.numel() // inputs.shape[dim]} sequences; the CUDA "
                         f"kernels take at most {MAX_CUDA_SEQS} in one call (split the batch)")
    config = (dim, bool(reverse), kernel, elems_per_thread, threads_per_block, memcode, algocode)
    if log_coeffs or cuts is not None:  # left out otherwise: the op's defaults, fewer arguments to box
        config += (bool(log_coeffs),) if cuts is None else (bool(log_coeffs), cuts)
    function = _autograd_function(inputs, coeffs, initial)
    if function is None:
        return fwd_op_no_autograd(inputs, coeffs, initial, *config)
    # The transforms' Function takes the config one argument at a time: its generated vmap rule
    # gives each argument its own gradient. It never runs compiled (is_compiling first: Dynamo
    # does not trace `is` between Function classes).
    if not torch.compiler.is_compiling() and function is _LinrecTransformable:
        return function.apply(inputs, coeffs, initial, *config)
    return function.apply(inputs, coeffs, initial, config)
