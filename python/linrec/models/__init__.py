"""Sequence layers and scans.

- selective_scan: Mamba's selective (S6) scan, with mamba_ssm's selective_scan_fn arguments: the
  fused op linrec.selective_scan, also here.
- GILR, LSLSTM: the gated impulse linear recurrent layer and the linear surrogate LSTM of
  Martin & Cundy, "Parallelizing Linear Recurrent Neural Nets Over Sequence Length" (2018).
"""

from .._selective import selective_scan
from .rnn import GILR, LSLSTM

__all__ = ["GILR", "LSLSTM", "selective_scan"]
