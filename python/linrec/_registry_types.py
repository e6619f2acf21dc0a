"""The record types of linrec._registry (which tools/generate.py writes from csrc/registry.toml)."""

from __future__ import annotations

from typing import NamedTuple


class Family(NamedTuple):
    """A compiled kernel family."""

    id: int  # the ops' `kernel` argument
    storages: tuple  # names in STORAGES
    default_config: tuple | None  # (elems_per_thread, threads_per_block, memcode, algocode); None: takes none
    workspace: bool
    doc: str

    @property
    def has_configs(self) -> bool:
        return self.default_config is not None


class Storage(NamedTuple):
    """A storage type: the dtypes of the scanned tensors and of the coefficients, and whether
    the coefficients hold log c (the kernels take exp as they load them)."""

    values: str  # torch dtype name
    coeffs: str  # torch dtype name
    log_coeffs: bool = False
