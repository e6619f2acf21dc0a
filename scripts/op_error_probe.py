"""Does an error raised inside the compiled op reach Python as RuntimeError (not a crash)?"""
import sys

import torch

import linrec  # noqa: F401

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
x = torch.randn(2, 3, 5, device=device)
try:
    torch.ops.linrec.linrec_fwd(x, x[:, :2], None, -1, False, 0, 0, 0, 0, 3)
except RuntimeError as e:
    print(f"{device}: RuntimeError raised as expected: {str(e).splitlines()[0][:100]}")
