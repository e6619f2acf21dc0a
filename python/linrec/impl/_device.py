"""The device a Triton kernel launches on.

Triton launches on the current CUDA device and its current stream, not on its arguments'
device. Called with tensors on cuda:1 while cuda:0 is current, a kernel would run on cuda:0
against another GPU's memory. The compiled kernels take a device guard in C++; the Triton
launches take this one.
"""

from __future__ import annotations

import contextlib

import torch


def on_device_of(t: torch.Tensor):
    """A context in which t's CUDA device is current (nothing to do when it already is, and under
    torch.compile, whose generated code sets the device itself)."""
    if not t.is_cuda or torch.compiler.is_compiling() or t.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)
