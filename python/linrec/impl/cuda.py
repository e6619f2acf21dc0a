"""The compiled CUDA kernels, one function per kernel family of csrc/registry.toml.

Each `linrec_<family>` has the signature of linrec.linrec (without cu_seqlens); the families that take a
compiled TileConfig also take it as keyword arguments (elems_per_thread,
threads_per_block, memcode, algocode; see linrec.compiled_configs(family, dtype)). The
config reaches the op as plain ints, so torch.compile traces these calls like any other.
Complex storage runs on the families compiled for it, at the configs listed for it.

Families:
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from .. import compiled_configs
from .._args import normalize
from .._autograd import call_compiled
from .._dispatch import log_or_exp
from .._registry import FAMILIES, STORAGES

_COMPLEX_FAMILIES = frozenset(name for name, f in FAMILIES.items()
                              if any(STORAGES[s].values.startswith("complex") for s in f.storages))


def _check_cuda(inputs):
    if not inputs.is_cuda:
        raise ValueError(f"linrec.impl.cuda: inputs must be a CUDA tensor, got one on {inputs.device}")


@functools.cache
def _compiled(kernel, dtype):
    return frozenset(compiled_configs(kernel, dtype))


def _check_config(kernel, inputs, dim, config):
    """The checks the op makes, in Python: under torch 2.11 an error raised inside the op ends the process."""
    elems_per_thread, threads_per_block = config[:2]
    if config not in _compiled(kernel, inputs.dtype):
        raise ValueError(
            f"linrec_{kernel}: config (elems_per_thread, threads_per_block, memcode, algocode) = {config} "
            f"is not compiled for {inputs.dtype}; see linrec.compiled_configs({kernel!r}, {inputs.dtype}), "
            "or build with LINREC_CONFIGS=full"
        )
    if kernel == "packed" and inputs.shape[dim] > 32 * elems_per_thread:
        raise ValueError(
            f"linrec_packed: the packed kernel holds at most 32 * elems_per_thread = {32 * elems_per_thread} "
            f"elements, but the sequence has {inputs.shape[dim]}; use linrec_tile or linrec_pipe"
        )
    if kernel == "tile" and inputs.shape[dim] > elems_per_thread * threads_per_block:
        raise ValueError(
            f"linrec_tile: the tile kernel scans at most elems_per_thread * threads_per_block = "
            f"{elems_per_thread * threads_per_block} elements, but the sequence has {inputs.shape[dim]}; "
            "use linrec_pipe or a larger config"
        )


def _family_function(kernel: str, family) -> Callable[..., torch.Tensor]:
    """linrec_<kernel>: checks its arguments and its config, then runs the family's compiled kernel."""
    complex_ok = kernel in _COMPLEX_FAMILIES

    def run(inputs: torch.Tensor, coeffs: torch.Tensor | float | complex, reverse: bool = False, *, dim: int = -1,
            initial: torch.Tensor | float | complex | None = None, log_coeffs: bool = False,
            **config: int) -> torch.Tensor:
        inputs, coeffs, initial, dim = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=complex_ok)
        _check_cuda(inputs)
        coeffs, log_coeffs = log_or_exp(inputs, coeffs, log_coeffs is True)
        if not family.has_configs:
            if config:
                raise TypeError(f"linrec_{kernel} takes no config, got {', '.join(config)}")
            return call_compiled(inputs, coeffs, initial, dim, reverse, family.id, log_coeffs=log_coeffs)
        defaults = dict(zip(_CONFIG_ARGS, family.default_config))
        unknown = set(config) - set(defaults)
        if unknown:
            raise TypeError(f"linrec_{kernel} got unexpected arguments {', '.join(sorted(unknown))}")
        values = tuple({**defaults, **config}[name] for name in _CONFIG_ARGS)
        _check_config(kernel, inputs, dim, values)
        return call_compiled(inputs, coeffs, initial, dim, reverse, family.id, *values, log_coeffs=log_coeffs)

    run.__name__ = run.__qualname__ = f"linrec_{kernel}"
    takes = (f" Config keywords and defaults: {dict(zip(_CONFIG_ARGS, family.default_config))}."
             if family.has_configs else "")
    run.__doc__ = f"The {kernel} kernels: {family.doc}.{takes}"
    return run


_CONFIG_ARGS = ("elems_per_thread", "threads_per_block", "memcode", "algocode")

__all__ = []
for _name, _family in FAMILIES.items():
    globals()[f"linrec_{_name}"] = _family_function(_name, _family)
    __all__.append(f"linrec_{_name}")
    __doc__ += f"- linrec_{_name}: {_family.doc}.\n"
