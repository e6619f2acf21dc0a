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

as in the paper (no tanh on c_t).

Both follow torch.nn.GRU / torch.nn.LSTM: input (length, batch, input_size), or (batch, length,
input_size) with batch_first=True; num_layers stacked layers, each layer's outputs the next one's
inputs; forward returns (output, final state) with the states (num_layers, batch, hidden_size)
whatever batch_first, and takes that final state back as the state entering the next call, so
that two calls over the halves of a sequence give one call's outputs over the whole. LSLSTM's state
is (h, c, surrogate), not nn.LSTM's (h, c): the surrogate is what its gates read. The scans run
along the time dim in place (linrec's strided kernels on the GPU), with no transpose.

With float16 / bfloat16 activations (a 16-bit model, or autocast) the recurrences' gates g and f
are computed and scanned in float32 (linrec's mixed storage), the rest in the activations' dtype:
a gate near 1 is a long memory, which 16 bits round to an endless one (bfloat16 stores 0.999 as
1.0, and then 1 - g, the impulse's weight, is 0).
"""

from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch import nn

from .. import linrec as _linrec


def _time_dim(batch_first: bool) -> int:
    return 1 if batch_first else 0


def _gate(pre: torch.Tensor) -> torch.Tensor:
    """sigmoid(pre), in float32 for 16-bit pre-activations (see the module's docstring)."""
    return torch.sigmoid(pre.float() if pre.dtype in (torch.float16, torch.bfloat16) else pre)


def _check_input(x: torch.Tensor, input_size: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != input_size:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"linrec: input of shape {shape} must be 3-d with {input_size} features last")


def _check_state(name: str, t: torch.Tensor | None, num_layers: int, batch: int, size: int) -> None:
    if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (num_layers, batch, size)):
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"linrec: {name} of shape {shape} must be (num_layers={num_layers}, batch={batch}, {size})")


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"linrec: {name} must be a positive int, got {value!r}")


class _Stacked(nn.Module):
    """What GILR and LSLSTM share: their sizes, layout, activation, and num_layers layers, the
    first reading input_size features and the others hidden_size."""

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool,
                 activation: Callable[[torch.Tensor], torch.Tensor], num_layers: int,
                 make_layer: Callable[[int], nn.Module]):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            _check_positive_int(name, value)
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, batch_first
        self.num_layers, self.activation = num_layers, activation
        self.layers = nn.ModuleList(make_layer(input_size if k == 0 else hidden_size) for k in range(num_layers))


def _layer(state: torch.Tensor | None, k: int) -> torch.Tensor | None:
    return None if state is None else state[k]


def _final(states: torch.Tensor, time: int, entering: torch.Tensor | None) -> torch.Tensor:
    """The state after the last step of `states` (batch, hidden): the entering one (zeros when
    None) after no step."""
    if states.shape[time]:
        return states.select(time, -1)
    return entering if entering is not None else states.new_zeros(states.shape[1 - time], states.shape[-1])


def _gilr_states(proj: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 h0: torch.Tensor | None, time: int) -> torch.Tensor:
    """One GILR layer's states h at every step: proj holds [U; V] and [b_g; b_i]."""
    gate_pre, impulse_pre = proj(x).chunk(2, dim=-1)
    g = _gate(gate_pre)
    impulse = ((1 - g) * activation(impulse_pre)).to(impulse_pre.dtype)
    return _linrec(impulse, g, dim=time, initial=h0)


class GILR(_Stacked):
    """Gated impulse linear recurrent layers, stacked as torch.nn.GRU's.

    Args:
        input_size: features of the input x_t.
        hidden_size: features of the state h_t.
        batch_first: input and output (batch, length, features) instead of (length, batch, features).
        activation: tau, the impulse's non-linearity (tanh by default).
        num_layers: layers stacked, each reading the states of the one below.

    forward(x, h0=None) -> (output, h_n): output holds the top layer's states h at every step
    (x's layout, hidden_size features); h_n the states after the last step, (num_layers, batch,
    hidden_size). h0 enters the sequence, of h_n's shape (zeros when None): pass h_n to continue.

    layers[k] is layer k's nn.Linear of [U; V] and [b_g; b_i] (gate rows first).
    """

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = False,
                 activation: Callable[[torch.Tensor], torch.Tensor] = torch.tanh,
                 device: torch.device | str | int | None = None, dtype: torch.dtype | None = None, *,
                 num_layers: int = 1):
        super().__init__(input_size, hidden_size, batch_first, activation, num_layers,
                         lambda size: nn.Linear(size, 2 * hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(x, self.input_size)
        time = _time_dim(self.batch_first)
        _check_state("h0", h0, self.num_layers, x.shape[1 - time], self.hidden_size)
        finals = []
        for k, proj in enumerate(self.layers):
            x = _gilr_states(proj, self.activation, x, _layer(h0, k), time)
            finals.append(_final(x, time, _layer(h0, k)))
        return x, torch.stack(finals)


class _LSLSTMLayer(nn.Module):
    """One LS-LSTM layer's parameters: its surrogate GILR's and its cell's."""

    def __init__(self, input_size: int, hidden_size: int, **kw):
        super().__init__()
        self.gilr = nn.Linear(input_size, 2 * hidden_size, **kw)  # the surrogate's [U; V], [b_g; b_i]
        self.input_proj = nn.Linear(input_size, 4 * hidden_size, **kw)  # V_{f,i,o,z}, b_{f,i,o,z}
        self.surrogate_proj = nn.Linear(hidden_size, 4 * hidden_size, bias=False, **kw)  # U_{f,i,o,z}

    def forward(self, x: torch.Tensor, c0: torch.Tensor | None, s0: torch.Tensor | None, time: int,
                activation: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h, c and the surrogate at every step."""
        length, batch = x.shape[time], x.shape[1 - time]
        surrogate = _gilr_states(self.gilr, activation, x, s0, time)
        # h~_{t-1}: the surrogate one step back, its entering state (or 0) first.
        first = (s0 if s0 is not None else surrogate.new_zeros(batch, surrogate.shape[-1])).unsqueeze(time)
        previous = torch.cat([first, surrogate.narrow(time, 0, length - 1)], dim=time) if length else surrogate
        pre = self.input_proj(x) + self.surrogate_proj(previous)
        f, i, o, z = pre.chunk(4, dim=-1)
        f, i, o = _gate(f), torch.sigmoid(i), torch.sigmoid(o)
        c = _linrec(i * activation(z), f, dim=time, initial=c0)
        return o * c, c, surrogate


class LSLSTM(_Stacked):
    """Linear surrogate LSTM layers, stacked as torch.nn.LSTM's.

    Args:
        input_size: features of the input x_t.
        hidden_size: features of h_t, c_t and the surrogate h~_t.
        batch_first: input and output (batch, length, features) instead of (length, batch, features).
        activation: tau (tanh by default).
        num_layers: layers stacked, each reading the outputs h of the one below.

    forward(x, state=None) -> (output, (h_n, c_n, s_n)): output holds the top layer's o_t * c_t at
    every step (x's layout, hidden_size features); h_n, c_n and s_n the outputs, cells and
    surrogates after the last step, each (num_layers, batch, hidden_size). `state` enters the
    sequence in the same form, (h_0, c_0, s_0), any of them None for zeros: pass the returned
    state to continue. h_0 is checked but not read (the gates read the surrogate, not h).

    layers[k] holds layer k's parameters: gilr (the surrogate GILR's nn.Linear), input_proj
    (V_{f,i,o,z} and the biases) and surrogate_proj (U_{f,i,o,z}), gate rows in that order.
    """

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = False,
                 activation: Callable[[torch.Tensor], torch.Tensor] = torch.tanh,
                 device: torch.device | str | int | None = None, dtype: torch.dtype | None = None, *,
                 num_layers: int = 1):
        super().__init__(input_size, hidden_size, batch_first, activation, num_layers,
                         lambda size: _LSLSTMLayer(size, hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor | None, torch.Tensor | None,
                                                    torch.Tensor | None] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        _check_input(x, self.input_size)
        time = _time_dim(self.batch_first)
        if state is None:
            state = (None, None, None)
        if not isinstance(state, (tuple, list)) or len(state) != 3:
            got = type(state).__name__ + (f" of {len(state)}" if isinstance(state, (tuple, list)) else "")
            raise ValueError(f"linrec: state must be (h, c, surrogate), as LSLSTM returns it; got {got}")
        for name, t in zip(("h0", "c0", "surrogate0"), state):
            _check_state(name, t, self.num_layers, x.shape[1 - time], self.hidden_size)
        h0, c0, s0 = state
        finals: tuple[list[torch.Tensor], ...] = ([], [], [])
        for k, layer in enumerate(self.layers):
            x, c, surrogate = layer(x, _layer(c0, k), _layer(s0, k), time, self.activation)
            for final, states, entering in zip(finals, (x, c, surrogate), (h0, c0, s0)):
                final.append(_final(states, time, _layer(entering, k)))
        h_n, c_n, s_n = (torch.stack(f) for f in finals)
        return x, (h_n, c_n, s_n)
