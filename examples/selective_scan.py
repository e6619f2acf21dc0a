"""Mamba's selective (S6) scan with linrec.selective_scan, checked against a plain loop.

selective_scan takes the arguments of mamba_ssm's selective_scan_fn and computes, for every
batch b, channel d and state n (dt = softplus(delta + delta_bias)):

    h[b, d, n, t] = exp(dt[b, d, t] * A[d, n]) * h[b, d, n, t-1] + dt[b, d, t] * B[b, n, t] * u[b, d, t]
    y[b, d, t]    = sum_n C[b, n, t] * h[b, d, n, t] + D[d] * u[b, d, t],  times silu(z[b, d, t])

in one fused op, with no (batch, channels, states, length) tensor. This script builds
inputs of a small Mamba layer's shapes, runs the scan forward and backward, and compares values
and gradients with a step-by-step float64 loop.

    python examples/selective_scan.py                 # CPU, a second or two
    python examples/selective_scan.py --device cuda --length 2048

The Mamba block around the scan, which loads mamba_ssm's state_dicts, is linrec.models.Mamba
(examples/mamba_from_state_dict.py).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from linrec import selective_scan


def loop_reference(u, delta, A, B, C, D, z, delta_bias):
    """The same scan, one step at a time in float64: slow and obviously right."""
    u, delta, A, B, C, D, z, delta_bias = (t.double() for t in (u, delta, A, B, C, D, z, delta_bias))
    dt = F.softplus(delta + delta_bias[:, None])
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=torch.float64, device=u.device)
    ys = []
    for t in range(u.shape[-1]):
        decay = torch.exp(dt[:, :, t, None] * A)  # (batch, channels, states)
        h = decay * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1) + D[:, None] * u
    return y * F.silu(z)


def make_inputs(batch, channels, states, length, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device, dtype).requires_grad_()

    u, delta, z = randn(batch, channels, length), randn(batch, channels, length, scale=0.5), randn(batch, channels, length)
    # Mamba's initialization: A[d, n] = -(n + 1), stored as its log; step sizes around 0.001-0.1.
    A = -torch.arange(1, states + 1, dtype=torch.float32).repeat(channels, 1)
    A = A.to(device).requires_grad_()
    B, C = randn(batch, states, length), randn(batch, states, length)  # input-dependent, as in Mamba
    D = randn(channels)
    delta_bias = torch.log(torch.expm1(torch.empty(channels).uniform_(1e-3, 1e-1, generator=g)))
    delta_bias = delta_bias.to(device).requires_grad_()
    return u, delta, A, B, C, D, z, delta_bias


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--channels", type=int, default=64, help="inner width, d_inner (default 64)")
    parser.add_argument("--states", type=int, default=16, help="d_state (default 16)")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    inputs = make_inputs(args.batch, args.channels, args.states, args.length, args.device, torch.float32)
    u, delta, A, B, C, D, z, delta_bias = inputs

    start = time.perf_counter()
    y, last_state = selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=True,
                                   return_last_state=True)
    y.square().sum().backward()
    seconds = time.perf_counter() - start
    grads = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None

    expected = loop_reference(*inputs)
    expected.square().sum().backward()
    value_error = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    grad_errors = {name: ((g.double() - t.grad.double()).abs().max() / t.grad.abs().max()).item()
                   for name, g, t in zip("u delta A B C D z delta_bias".split(), grads, inputs)}

    print(f"selective_scan: u {tuple(u.shape)}, {args.states} states, last state {tuple(last_state.shape)}, "
          f"forward+backward {seconds * 1e3:.1f} ms on {args.device}")
    print(f"largest error relative to the float64 loop: outputs {value_error:.1e}, gradients "
          + ", ".join(f"{name} {err:.1e}" for name, err in grad_errors.items()))
    worst = max(value_error, *grad_errors.values())
    if worst > 1e-3:
        print("mismatch against the loop")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
