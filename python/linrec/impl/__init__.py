"""Implementations of the linear recurrence, all with the signature of linrec.linrec.

- linrec.impl.python: the sequential loop and torch's associative_scan (references).
- linrec.impl.cuda: the compiled kernels (ref, tile, pipe) and the CPU kernel.
"""
