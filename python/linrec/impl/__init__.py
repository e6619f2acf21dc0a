"""Implementations of the linear recurrence, to call directly (references and single backends).

Each takes linrec.linrec's arguments but cu_seqlens; linrec.impl.python takes no log_coeffs.

- linrec.impl.python: the references, linrec_ref (the sequential loop, complex too) and
  linrec_hop (torch's associative_scan, real dtypes).
- linrec.impl.cuda: the compiled CUDA kernels, one function per family (ref, tile, pipe,
  chained, strided, packed), all but ref with a config as keyword arguments; CUDA tensors only.
- linrec.impl.triton: the Triton kernels (tile, pipe), real dtypes only.

The CPU kernel has no function here: linrec.linrec runs it on CPU tensors.
"""
