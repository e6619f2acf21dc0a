"""Which compiled kernel a call takes: tuning tables, one per device, as data.

Each ``*.json`` file here is one device's table, with its provenance (device, date,
commands) and, in every row, the measurement it came from. A row's conditions
(storage class, layout, direction, length range, sequences per SM, tiles a sequence)
pick a kernel family and its config; the first matching row wins. The C++ op reads
the table at call time (``csrc/tuning/``); this module hands the tables over: the
default one at import, and a device's own the first time linrec runs on it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .._registry import FAMILIES

_HERE = Path(__file__).parent
DEFAULT_TABLE = "h100"  # measured tables exist for these devices only; others take the H100's

STORAGE_CLASSES = {"16bit": 0, "32bit": 1, "64bit": 2, "complex64": 3, "complex128": 4}
DIRECTIONS = {"any": 0, "fwd": 1, "bwd": 2}
LAYOUTS = {"rows": False, "channels": True}
MEMCODES = {"direct": 0, "vector": 1, "coalesced": 2, "staged": 3}
ALGOCODES = {"loadstore": 0, "thread": 1, "warp": 2, "block": 3}


@functools.cache
def load(name: str) -> dict:
    """The table ``name`` (a file stem here), as its JSON."""
    return json.loads((_HERE / f"{name}.json").read_text())


def tables() -> list[str]:
    return sorted(p.stem for p in _HERE.glob("*.json"))


def table_for(device_name: str) -> str:
    """The table whose ``match`` strings occur in the device's name, else the default."""
    for name in tables():
        if any(m in device_name for m in load(name)["match"]):
            return name
    return DEFAULT_TABLE


def encode(table: dict) -> list[tuple]:
    """A table's rows as the tuples linrec._C_cuda.set_tuning_table takes."""
    rows = []
    for r in table["rows"]:
        e, t, m, a = r["config"]
        rows.append((
            sum(1 << STORAGE_CLASSES[s] for s in r["storage"]), DIRECTIONS[r.get("direction", "any")],
            LAYOUTS[r["layout"]], r.get("min_len", 0), r.get("max_len", -1), r.get("max_seqs_per_sm", 0),
            r.get("min_tiles", 0), FAMILIES[r["kernel"]].id, e, t, MEMCODES[m], ALGOCODES[a]))
    return rows


def install(cuda_module, device: int = -1, device_name: str | None = None) -> str:
    """Hand a table to the compiled kernels: the default (device -1), or the one for a device."""
    name = DEFAULT_TABLE if device_name is None else table_for(device_name)
    cuda_module.set_tuning_table(device, encode(load(name)))
    return name
