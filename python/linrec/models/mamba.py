"""A Mamba (Mamba-1) block whose parameters have mamba_ssm's names, shapes and initialization.

A mamba_ssm `Mamba` state_dict loads into `linrec.models.Mamba` as it is, and the block
computes what mamba_ssm's does, with linrec's selective scan in place of mamba_ssm's CUDA
kernels and causal-conv1d's: it runs on the CPU and on any GPU.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._segments import check_cu_seqlens
from .._selective import selective_scan


def _scan_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the state is computed in: float64 for float64 activations, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _segment_causal_conv(x: torch.Tensor, conv: nn.Conv1d, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """conv's causal depthwise convolution of x (batch, channels, length) with each segment of
    cu_seqlens on its own: a tap that reaches back past its segment's first step reads 0, as in
    a call on the segment alone. One shifted product a tap (d_conv of them), device-side only."""
    length, taps = x.shape[-1], conv.weight.shape[-1]
    position = torch.arange(length, device=x.device)
    # The segment holding each position: the first whose end lies past it (empty ones hold none).
    segment = torch.searchsorted(cu_seqlens[1:].long(), position, right=True)
    start = cu_seqlens[:-1].long()[segment.clamp_max(cu_seqlens.shape[0] - 2)]
    out = conv.bias[:, None].to(x.dtype) if conv.bias is not None else torch.zeros((), dtype=x.dtype, device=x.device)
    for back in range(taps):  # tap `back` steps back: x[t - back], weight column taps - 1 - back
        reaching = F.pad(x, (back, 0))[..., :length] * (position - back >= start)
        out = out + conv.weight[:, 0, taps - 1 - back, None].to(x.dtype) * reaching
    return out


def _is_positive_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _check_sizes(d_model, d_state, d_conv, expand, dt_rank, dt_min, dt_max) -> None:
    """Mamba's sizes, each named where it is wrong (torch's errors name none)."""
    for name, value in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv)):
        if not _is_positive_int(value):
            raise ValueError(f"linrec: Mamba's {name} must be a positive int, got {value!r}")
    if isinstance(expand, bool) or not isinstance(expand, numbers.Real) or not math.isfinite(expand) or \
            int(expand * d_model) < 1:
        raise ValueError(f"linrec: Mamba's expand must be a number with int(expand * d_model) >= 1, got {expand!r}")
    if dt_rank != "auto" and not _is_positive_int(dt_rank):
        raise ValueError(f"linrec: Mamba's dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
    if not (isinstance(dt_min, numbers.Real) and isinstance(dt_max, numbers.Real) and 0 < dt_min <= dt_max
            and math.isfinite(dt_max)):
        raise ValueError(f"linrec: Mamba's dt_min and dt_max must be numbers with 0 < dt_min <= dt_max, got "
                         f"{dt_min!r} and {dt_max!r}")


class Mamba(nn.Module):
    """The Mamba block of mamba_ssm (`mamba_ssm.modules.mamba_simple.Mamba`), in plain PyTorch.

    For an input h of (batch, length, d_model), at every step t:

        x_t, z_t        = split(in_proj(h_t))                              d_inner each
        x_t             = silu(sum_k conv1d.weight[:, 0, k] * x_{t-d_conv+1+k} + conv1d.bias)
                                                                  (causal, depthwise; x_{<0} = 0)
        dt_t, B_t, C_t  = split(x_proj(x_t))                               dt_rank, d_state, d_state
        delta_t         = softplus(dt_proj.weight @ dt_t + dt_proj.bias)   d_inner
        A               = -exp(A_log)                                      (d_inner, d_state)
        s_t[d, n]       = exp(delta_t[d] * A[d, n]) * s_{t-1}[d, n] + delta_t[d] * B_t[n] * x_t[d]
        y_t[d]          = (sum_n C_t[n] * s_t[d, n] + D[d] * x_t[d]) * silu(z_t[d])
        output_t        = out_proj(y_t)

    with s_{-1} = 0. delta's bias and softplus, s and y are one linrec.models.selective_scan
    call. s is computed in float32 for float32 and 16-bit blocks (float64 for float64), as in
    mamba_ssm.

    Args:
        d_model: features of the input and the output.
        d_state: states a channel (N in the paper).
        d_conv: width of the causal depthwise convolution.
        expand: d_inner = int(expand * d_model), the channels of the scan.
        dt_rank: rank of the step-size projection; "auto" is ceil(d_model / 16).
        dt_min, dt_max: the initial step sizes softplus(dt_proj.bias) are drawn log-uniformly
            from [dt_min, dt_max], and raised to dt_init_floor where lower.
        dt_init: "random" (dt_proj.weight uniform in +-dt_rank**-0.5 * dt_scale) or "constant"
            (every weight dt_rank**-0.5 * dt_scale).
        dt_scale, dt_init_floor: see dt_min and dt_init.
        conv_bias: whether conv1d has a bias.
        bias: whether in_proj and out_proj have biases.
        use_fast_path: accepted for mamba_ssm's signature and ignored: there is one path.
        layer_idx: the key of this block's states in inference_params (see forward).
        device, dtype: of the parameters; A_log and D are float32 whatever dtype, as in mamba_ssm.

    Parameters, as mamba_ssm's: in_proj (d_model -> 2 * d_inner, x rows then z rows), conv1d
    (d_inner, 1, d_conv), x_proj (d_inner -> dt_rank + 2 * d_state, no bias; dt, B, C rows),
    dt_proj (dt_rank -> d_inner), A_log (d_inner, d_state), D (d_inner,), out_proj
    (d_inner -> d_model). A_log and D carry `_no_weight_decay = True` and dt_proj.bias
    `_no_reinit = True`, the markers mamba_ssm's training code reads.

    Example:

        block = Mamba(d_model=256)
        block.load_state_dict(torch.load("mamba_layer.pt"))   # a mamba_ssm Mamba's state_dict
        x = torch.randn(2, 100, 256)
        y = block(x)                                          # (2, 100, 256)

        conv_state, ssm_state = block.allocate_inference_cache(batch_size=2, max_seqlen=100)
        for t in range(100):                                  # y[:, t:t + 1], one token at a time
            y_t, _, _ = block.step(x[:, t:t + 1], conv_state, ssm_state)
    """

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: float = 2,
                 dt_rank: int | str = "auto", dt_min: float = 0.001, dt_max: float = 0.1,
                 dt_init: str = "random", dt_scale: float = 1.0, dt_init_floor: float = 1e-4,
                 conv_bias: bool = True, bias: bool = False, use_fast_path: bool = True,
                 layer_idx: int | None = None, device: torch.device | str | int | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if dt_init not in ("random", "constant"):
            raise ValueError(f"linrec: dt_init must be 'random' or 'constant', got {dt_init!r}")
        _check_sizes(d_model, d_state, d_conv, expand, dt_rank, dt_min, dt_max)
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = int(expand * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.layer_idx = layer_idx

        # Created in mamba_ssm's order, so that one seed gives both blocks the same initial weights.
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias, **factory)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, padding=d_conv - 1, groups=self.d_inner,
                                bias=conv_bias, **factory)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, **factory)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **factory)

        # dt_proj's weight scaled by dt_rank ** -0.5, so that the spread of the initial step sizes
        # does not grow with dt_rank.
        weight_scale = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, weight_scale)
        else:
            nn.init.uniform_(self.dt_proj.weight, -weight_scale, weight_scale)
        log_dt = torch.rand(self.d_inner, **factory) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        initial_dt = torch.exp(log_dt).clamp(min=dt_init_floor)
        with torch.no_grad():
            # The inverse of softplus, log(exp(dt) - 1), written so that it does not overflow.
            self.dt_proj.bias.copy_(initial_dt + torch.log(-torch.expm1(-initial_dt)))
        self.dt_proj.bias._no_reinit = True  # type: ignore[attr-defined]

        # S4D-real initialization: A[d, n] = -(n + 1) for every channel, stored as log(-A).
        state_index = torch.arange(1, d_state + 1, dtype=torch.float32, device=device)
        self.A_log = nn.Parameter(torch.log(state_index).repeat(self.d_inner, 1))
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]
        self.D = nn.Parameter(torch.ones(self.d_inner, device=device))
        self.D._no_weight_decay = True  # type: ignore[attr-defined]

        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)

    def forward(self, hidden_states: torch.Tensor, inference_params: Any = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, length, d_model) -> (batch, length, d_model).

        inference_params, for generation as in mamba_ssm: an object with `key_value_memory_dict`
        (a dict) and `seqlen_offset` (an int), such as mamba_ssm's InferenceParams. This block's
        (conv_state, ssm_state) live in key_value_memory_dict[layer_idx], allocated on first use.
        With seqlen_offset 0 the call runs the whole prompt and leaves the states after its last
        token there; after that (seqlen_offset > 0) each call takes one token and runs `step`.

        cu_seqlens: packed sequences along the length, [0, e1, ..., length] (int32 / int64, on the
        input's device): each segment runs as if alone, its convolution and its scan starting
        from zero (linrec.selective_scan's cu_seqlens). Not with inference_params.
        """
        if not isinstance(hidden_states, torch.Tensor):
            raise ValueError(f"linrec: Mamba's input must be a tensor, got {type(hidden_states).__name__}")
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.d_model:
            raise ValueError(f"linrec: Mamba input of shape {tuple(hidden_states.shape)} must be "
                             f"(batch, length, d_model={self.d_model})")
        batch, length, _ = hidden_states.shape
        if cu_seqlens is not None:
            if inference_params is not None:
                raise ValueError("linrec: Mamba takes cu_seqlens or inference_params, not both")
            check_cu_seqlens(cu_seqlens, hidden_states, 1, "hidden_states")
        conv_state = ssm_state = None
        if inference_params is not None:
            conv_state, ssm_state = self._cached_states(inference_params, batch)
            if inference_params.seqlen_offset > 0:
                return self.step(hidden_states, conv_state, ssm_state)[0]

        # Channels first with the length contiguous, (batch, 2 * d_inner, length): the layout the
        # convolution and the scan read, made by the matrix product itself rather than a transpose.
        xz = torch.matmul(self.in_proj.weight, hidden_states.transpose(1, 2))
        if self.in_proj.bias is not None:
            xz = xz + self.in_proj.bias.unsqueeze(-1)
        x, z = xz.chunk(2, dim=1)
        if conv_state is not None:
            # The last d_conv inputs, zeros in front where the prompt is shorter.
            conv_state.copy_(F.pad(x, (self.d_conv - length, 0)))
        if cu_seqlens is not None:
            x = F.silu(_segment_causal_conv(x, self.conv1d, cu_seqlens))
        elif length == 0:  # nothing to convolve (torch's convolution refuses an empty length)
            x = F.silu(x)
        else:
            x = F.silu(self.conv1d(x)[..., :length])  # padded on both sides: the first `length` outputs are causal

        dt, B, C = self.x_proj(x.transpose(1, 2)).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = torch.matmul(self.dt_proj.weight, dt.transpose(1, 2))  # (batch, d_inner, length); bias in the scan
        scan_dtype = _scan_dtype(x)
        A = -torch.exp(self.A_log.to(scan_dtype))
        y = selective_scan(x, delta, A, B.transpose(1, 2), C.transpose(1, 2), self.D.to(scan_dtype), z=z,
                           delta_bias=self.dt_proj.bias.to(scan_dtype), delta_softplus=True,
                           return_last_state=ssm_state is not None, cu_seqlens=cu_seqlens)
        if ssm_state is not None:
            y, last_state = y
            ssm_state.copy_(last_state)
        return self.out_proj(y.transpose(1, 2))

    def step(self, hidden_states: torch.Tensor, conv_state: torch.Tensor,
             ssm_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token: hidden_states (batch, 1, d_model) -> (output (batch, 1, d_model), conv_state, ssm_state).

        conv_state (batch, d_inner, d_conv) holds the last d_conv inputs of the convolution and
        ssm_state (batch, d_inner, d_state) the scan's state, both as allocate_inference_cache
        makes them; both are updated in place (and returned, as mamba_ssm's step returns them).
        Stepping through a sequence from zero states gives forward's outputs over it.
        """
        if hidden_states.dim() != 3 or hidden_states.shape[1] != 1 or hidden_states.shape[2] != self.d_model:
            raise ValueError(f"linrec: Mamba.step takes one token, (batch, 1, d_model={self.d_model}); "
                             f"got {tuple(hidden_states.shape)}")
        dtype = hidden_states.dtype
        x, z = self.in_proj(hidden_states[:, 0]).chunk(2, dim=-1)  # (batch, d_inner) each

        conv_state.copy_(torch.cat([conv_state[..., 1:], x.unsqueeze(-1)], dim=-1))  # the oldest input leaves
        x = (conv_state * self.conv1d.weight[:, 0]).sum(-1)
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        x = F.silu(x).to(dtype)

        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        scan_dtype = _scan_dtype(x)
        delta = F.softplus(F.linear(dt, self.dt_proj.weight).to(scan_dtype) + self.dt_proj.bias.to(scan_dtype))
        A = -torch.exp(self.A_log.to(scan_dtype))
        x_scan = x.to(scan_dtype)
        state = (torch.exp(delta.unsqueeze(-1) * A) * ssm_state.to(scan_dtype)
                 + (delta * x_scan).unsqueeze(-1) * B.to(scan_dtype).unsqueeze(1))
        ssm_state.copy_(state)
        y = (state * C.to(scan_dtype).unsqueeze(1)).sum(-1) + self.D.to(scan_dtype) * x_scan
        y = y * F.silu(z.to(scan_dtype))
        return self.out_proj(y.to(dtype)).unsqueeze(1), conv_state, ssm_state

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype: torch.dtype | None = None,
                                 **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero states for `step`: conv_state (batch_size, d_inner, d_conv) and ssm_state
        (batch_size, d_inner, d_state), on the parameters' device.

        Their dtype is `dtype`, else conv1d's weight's (conv_state) and dt_proj's weight's
        (ssm_state), as in mamba_ssm. max_seqlen and kwargs are there for mamba_ssm's
        signature: the states do not grow with the sequence.
        """
        device = self.out_proj.weight.device
        conv_state = torch.zeros(batch_size, self.d_inner, self.d_conv, device=device,
                                 dtype=dtype or self.conv1d.weight.dtype)
        ssm_state = torch.zeros(batch_size, self.d_inner, self.d_state, device=device,
                                dtype=dtype or self.dt_proj.weight.dtype)
        return conv_state, ssm_state

    def _cached_states(self, inference_params: Any, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_idx is None:
            raise ValueError("linrec: Mamba needs a layer_idx to keep its states in inference_params")
        cache = inference_params.key_value_memory_dict
        if self.layer_idx not in cache:
            cache[self.layer_idx] = self.allocate_inference_cache(batch_size, max_seqlen=0)
        return cache[self.layer_idx]
