"""Complex diagonal recurrences (S4, S5, LRU): complex64 and complex128.

Three ways (_backend.complex_path picks one a call):

- the compiled op (linrec::linrec_fwd / linrec_bwd, complex arithmetic in C++ and CUDA, with
  linrec.linrec's autograd as for real tensors): on the CPU, and on CUDA wherever the compiled
  kernels are loaded (the complex rows of linrec/tuning/h100.json: the strided kernels for
  channel-last data; for rows the packed, tile, then staged chained kernels as they grow);
- without them, Triton kernels that scan the complex pairs, one program a sequence
  (impl/triton_complex.py), for at least as many CUDA sequences as the device has SMs;
- two real scans where neither runs (fewer sequences, or no Triton), as follows.

Write the coefficients in polar form, c[l] = r[l] e^{i theta[l]}, and let Phi[l] be the phase
accumulated in scan order, Phi[l] = theta[l] + Phi[l-1] (Phi[-1] = 0). With y[l] = e^{i Phi[l]} z[l]:

    z[l] = r[l] * z[l-1] + e^{-i Phi[l]} x[l],    z[-1] = initial

a recurrence with real coefficients. So the real and imaginary parts of z are two real scans with
the same coefficients r, which linrec.linrec runs as one call on a (2, ...) stack. The rotation
never grows or shrinks anything (|e^{i Phi}| = 1). Phi is summed in float64 and reduced modulo
2 pi before it is rounded to the working precision, so a rotation far along a long sequence is as
exact as one near its start.

The backward is the same kind of recurrence (with PyTorch's conjugate convention):

    d_x[l] = conj(c[l+1]) * d_x[l+1] + g[l]          (run against the scan; c past the end := 0)
    d_c[l] = d_x[l] * conj(y[l-1]),   d_initial = conj(c[first]) * d_x[first]

computed by the fused Triton kernel, or here by the same polar scan rather than by autograd
through the polar form, whose derivative at c = 0 (a state reset) would be lost: |c| and angle(c)
have none there. The forward tangent is one more forward: dy[l] = c[l] dy[l-1] + (dc[l] y[l-1] +
dx[l]).

Cost of the polar scan: its real scans move twice the elements of a float scan of the same
shape, and the polar form, the rotations and the stacks add some twenty element-wise passes.
"""

from __future__ import annotations

import math

import torch
import torch.autograd.forward_ad as fwAD

from ._args import normalize
from ._autograd import _previous_states, backward_by_scans, call_compiled, refuse_torch_func
from ._backend import complex_path, scan_real


def _polar_scan(x, c, initial, dim: int, reverse: bool) -> torch.Tensor:
    """y[l] = c[l] * y[l-1] + x[l] for complex x, c (and initial), by two real scans (see above)."""
    real = x.real.dtype
    phase = torch.angle(c).to(torch.float64)
    phase = phase.flip(dim).cumsum(dim).flip(dim) if reverse else phase.cumsum(dim)
    phase = phase.remainder(2 * math.pi).to(real)
    cos, sin = phase.cos(), phase.sin()
    xr, xi = x.real, x.imag
    rotated = torch.stack([xr * cos + xi * sin, xi * cos - xr * sin])  # e^{-i Phi} x
    state = None if initial is None else torch.stack([initial.real, initial.imag])
    zr, zi = scan_real(*normalize(rotated, c.abs(), state, dim + 1, reverse), reverse).unbind(0)
    return torch.complex(zr * cos - zi * sin, zr * sin + zi * cos)  # e^{i Phi} z


def _scan(x, c, initial, dim: int, reverse: bool) -> torch.Tensor:
    if complex_path(x, dim) == "triton":
        from .impl.triton_complex import complex_fwd

        return complex_fwd(x, c, initial, dim, reverse)
    return _polar_scan(x, c, initial, dim, reverse)


class _ComplexLinrec(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, coeffs, initial, dim, reverse):
        outputs = _scan(inputs, coeffs, initial, dim, reverse)
        ctx.dim, ctx.reverse, ctx.has_initial = dim, reverse, initial is not None
        ctx.save_for_backward(coeffs, initial, outputs)
        return outputs

    @staticmethod
    def backward(ctx, grad):
        coeffs, initial, outputs = ctx.saved_tensors
        dim, reverse = ctx.dim, ctx.reverse
        if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate again
            scan = lambda x, c, d, r: _ComplexLinrec.apply(x, c, None, d, r)  # noqa: E731
        elif outputs.shape[dim] and complex_path(outputs, dim) == "triton":  # the fused backward kernel
            from .impl.triton_complex import complex_bwd

            d_inputs, d_coeffs, d_initial = complex_bwd(grad, coeffs, outputs, initial, dim, reverse)
            return d_inputs, d_coeffs, (d_initial if ctx.has_initial else None), None, None
        else:
            scan = lambda x, c, d, r: _polar_scan(x, c, None, d, r)  # noqa: E731
        d_inputs, d_coeffs, d_initial = backward_by_scans(scan, grad, coeffs, outputs, initial, dim, reverse)
        return d_inputs, d_coeffs, (d_initial if ctx.has_initial else None), None, None


class _ComplexLinrecDual(_ComplexLinrec):
    """_ComplexLinrec plus forward-mode AD, for calls with dual tensors (torch.compile does not
    trace a Function that defines jvp, so it is a class of its own, as in _autograd.py)."""

    @staticmethod
    def forward(ctx, inputs, coeffs, initial, dim, reverse):
        outputs = _ComplexLinrec.forward(ctx, inputs, coeffs, initial, dim, reverse)
        ctx.save_for_forward(coeffs, initial, outputs)
        return outputs

    @staticmethod
    def jvp(ctx, d_inputs, d_coeffs, d_initial, *_):
        coeffs, initial, outputs = ctx.saved_tensors
        dim, reverse = ctx.dim, ctx.reverse
        steps = d_inputs if d_inputs is not None else torch.zeros_like(outputs)
        if d_coeffs is not None:
            steps = steps + d_coeffs * _previous_states(outputs, initial, dim, reverse)
        return _scan(steps, coeffs, d_initial, dim, reverse)


def linrec_complex(inputs, coeffs, initial, dim: int, reverse: bool) -> torch.Tensor:
    """The recurrence for complex64 / complex128 arguments, normalized as by _args.normalize."""
    path = complex_path(inputs, dim)
    if path == "compiled":
        return call_compiled(inputs, coeffs, initial, dim, reverse)
    refuse_torch_func("the Triton complex kernels" if path == "triton" else "two real scans (no compiled kernels)")
    tensors = (inputs, coeffs) if initial is None else (inputs, coeffs, initial)
    dual = not torch.compiler.is_compiling() and any(fwAD.unpack_dual(t).tangent is not None for t in tensors)
    return (_ComplexLinrecDual if dual else _ComplexLinrec).apply(inputs, coeffs, initial, dim, bool(reverse))
