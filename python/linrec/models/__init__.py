"""Sequence layers built on linrec.linrec.

- selective_scan: Mamba's selective (S6) scan, with mamba_ssm's selective_scan_fn arguments.
- GILR, LSLSTM: the gated impulse linear recurrent layer and the linear surrogate LSTM of
  Martin & Cundy, "Parallelizing Linear Recurrent Neural Nets Over Sequence Length" (2018).
"""

from .rnn import GILR, LSLSTM
from .selective_scan import selective_scan

__all__ = ["GILR", "LSLSTM", "selective_scan"]
