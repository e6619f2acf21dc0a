"""Sequence layers and scans.

- selective_scan: Mamba's selective (S6) scan, with mamba_ssm's selective_scan_fn arguments: the
  fused op linrec.selective_scan, also here.
- Mamba: the Mamba (Mamba-1) block, with mamba_ssm's parameter names and shapes: a mamba_ssm
  Mamba's state_dict loads into it, on the CPU or any GPU.
- GILR, LSLSTM: the gated impulse linear recurrent layer and the linear surrogate LSTM of
  Martin & Cundy, "Parallelizing Linear Recurrent Neural Nets Over Sequence Length" (2018).
"""

from .._selective import selective_scan
from .mamba import Mamba
from .rnn import GILR, LSLSTM

__all__ = ["GILR", "LSLSTM", "Mamba", "selective_scan"]
