"""The GILR layer and the LS-LSTM of Martin & Cundy (2018), evaluated over the whole sequence.

GILR (gated impulse linear recurrent layer), inputs x_t of `input_size`, states of `hidden_size`:

    g_t = sigmoid(U x_t + b_g),   i_t = tau(V x_t + b_i),   h_t = g_t * h_{t-1} + (1 - g_t) * i_t

Both affine maps are one (batch * length, input) x (input, 2 * hidden) matrix product for the
whole sequence, and h is one linrec.linrec call: h_t = c_t * h_{t-1} + x_t with c = g and
x = (1 - g) * i. Nothing runs step by step.

LS-LSTM (linear surrogate LSTM): an LSTM whose gates read a GILR state h~ (the surrogate)
instead of its own output, so both of its recurrences are linear:

    h~_t           = GILR(x)_t
    f_t, i_t, o_t  = sigmoid(U_{f,i,o} h~_{t-1} + V_{f,i,o} x_t + b_{f,i,o})
    z_t            = tau(U_z h~_{t-1} + V_z x_t + b_z)
    c_t            = f_t * c_{t-1} + i_t * z_t          (a second linrec.linrec call)
    h_t            = o_t * c_t

as in the paper (no tanh on c_t). Tensors are (length, batch, features), or (batch, length,
features) with batch_first=True, as in torch.nn.LSTM; the scans run along the time dim in place
(linrec's strided kernels on the GPU), with no transpose.

With float16 / bfloat16 activations (a 16-bit model, or autocast) the recurrences' gates g and f
are computed and scanned in float32 (linrec's mixed storage), the rest in the activations' dtype:
a gate near 1 is a long memory, which 16 bits round to an endless one (bfloat16 stores 0.999 as
1.0, and then 1 - g, the impulse's weight, is 0).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import linrec as _linrec


def _time_dim(batch_first: bool) -> int:
    return 1 if batch_first else 0


def _gate(pre: torch.Tensor) -> torch.Tensor:
    """sigmoid(pre), in float32 for 16-bit pre-activations (see the module's docstring)."""
    return torch.sigmoid(pre.float() if pre.dtype in (torch.float16, torch.bfloat16) else pre)


def _check_input(x, input_size):
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != input_size:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"linrec: input of shape {shape} must be 3-d with {input_size} features last")


def _check_state(name, t, batch, size):
    if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (batch, size)):
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"linrec: {name} of shape {shape} must be (batch={batch}, {size})")


class GILR(nn.Module):
    """Gated impulse linear recurrent layer: input (length, batch, input_size), or (batch, length,
    input_size) with batch_first=True; returns the states h of hidden_size for every step.

    forward(x, h0=None) -> h; h0: (batch, hidden_size), zeros when None.
    activation is tau, the impulse's non-linearity (tanh by default)."""

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = False, activation=torch.tanh,
                 device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, batch_first
        self.activation = activation
        self.proj = nn.Linear(input_size, 2 * hidden_size, device=device, dtype=dtype)  # [U; V], [b_g; b_i]

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
        _check_input(x, self.input_size)
        _check_state("h0", h0, x.shape[1 - _time_dim(self.batch_first)], self.hidden_size)
        gate_pre, impulse_pre = self.proj(x).chunk(2, dim=-1)
        g = _gate(gate_pre)
        impulse = ((1 - g) * self.activation(impulse_pre)).to(impulse_pre.dtype)
        return _linrec(impulse, g, dim=_time_dim(self.batch_first), initial=h0)


class LSLSTM(nn.Module):
    """Linear surrogate LSTM: input (length, batch, input_size), or (batch, length, input_size)
    with batch_first=True.

    forward(x, state=None) -> (h, (h_last, c_last, surrogate_last)): h holds the outputs
    o_t * c_t of every step, hidden_size each. `state` enters the sequence: the state a previous
    call returned, (h, c, surrogate), to continue it (h is checked but not read: the gates read
    the surrogate), or (c, surrogate); each (batch, hidden_size), zeros when None. activation is
    tau (tanh by default)."""

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = False, activation=torch.tanh,
                 device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, batch_first
        self.activation = activation
        kw = dict(device=device, dtype=dtype)
        self.surrogate = GILR(input_size, hidden_size, batch_first, activation, **kw)
        self.input_proj = nn.Linear(input_size, 4 * hidden_size, **kw)  # V_{f,i,o,z}, b_{f,i,o,z}
        self.surrogate_proj = nn.Linear(hidden_size, 4 * hidden_size, bias=False, **kw)  # U_{f,i,o,z}

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        _check_input(x, self.input_size)
        time = _time_dim(self.batch_first)
        if x.shape[time] == 0:
            raise ValueError("linrec: LSLSTM needs at least one step (its outputs end with the last one)")
        batch = x.shape[1 - time]
        if state is None:
            state = (None, None)
        if not isinstance(state, (tuple, list)) or len(state) not in (2, 3):
            raise ValueError(f"linrec: state must be (h, c, surrogate), as LSLSTM returns it, or (c, surrogate); "
                             f"got {type(state).__name__}" + (f" of {len(state)}" if isinstance(state, (tuple, list))
                                                              else ""))
        if len(state) == 3:
            _check_state("h0", state[0], batch, self.hidden_size)
        c0, s0 = state[-2:]
        _check_state("c0", c0, batch, self.hidden_size)
        _check_state("surrogate0", s0, batch, self.hidden_size)
        surrogate = self.surrogate(x, s0)
        # h~_{t-1}: the surrogate one step back, its entering state (or 0) first.
        first = (s0 if s0 is not None else surrogate.new_zeros(batch, self.hidden_size)).unsqueeze(time)
        previous = torch.cat([first, surrogate.narrow(time, 0, x.shape[time] - 1)], dim=time)
        pre = self.input_proj(x) + self.surrogate_proj(previous)
        f, i, o, z = pre.chunk(4, dim=-1)
        f, i, o = _gate(f), torch.sigmoid(i), torch.sigmoid(o)
        c = _linrec(i * self.activation(z), f, dim=time, initial=c0)
        h = o * c
        return h, (h.select(time, -1), c.select(time, -1), surrogate.select(time, -1))
