"""Which compiled kernel a call takes: tuning tables, one per device, as data.

Each ``*.json`` file here is one device's table, with its provenance (device, date,
commands) and, in every row, the measurement it came from. A row's conditions
(storage class, layout, direction, length range, sequences per SM, tiles a sequence)
pick a kernel family and its config; the first matching row wins. The C++ op reads
the table at call time (``csrc/tuning/``); this module hands the tables over: the
default one at import, and a device's own the first time linrec runs on it.

A device with no table of its own (none whose ``match`` strings occur in its name) takes
the measured table of the device most like it by a model of the hardware: Little's law
says an SM must keep bandwidth-per-SM x latency bytes in flight to draw its share of the
bandwidth, and the config is what sets bytes in flight. With DRAM latency about the same
across these GPUs, the nearest table by peak bandwidth per SM (on a log scale; same
compute capability first, whose register and shared-memory budgets the configs were
measured under) is the one whose configs keep about the right bytes in flight.
`python -m linrec.tune --table PATH` measures a table for a new device.
"""

from __future__ import annotations

import functools
import json
import math
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


def peak_gbs(props) -> float | None:
    """A device's peak DRAM bandwidth in GB/s (double data rate over its bus), from torch's
    device properties; None where they lack the memory clock or bus width."""
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def hardware_facts(props, copy_gbs: float | None = None) -> dict:
    """What a table records of its device, and what the model compares: SM count, compute
    capability, L2, peak bandwidth and (measured, when given) copy bandwidth."""
    facts = dict(sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                 l2_mb=round(props.L2_cache_size / 2**20), peak_gbs=round(peak_gbs(props) or 0) or None)
    if copy_gbs is not None:
        facts["copy_gbs"] = copy_gbs
    return facts


def nearest_table(facts: dict) -> str:
    """The measured table for a device with no table of its own (the module docstring's model):
    same compute capability first, then the nearest peak bandwidth per SM on a log scale. The
    default table when the device's bandwidth is unknown."""
    if not facts.get("peak_gbs"):
        return DEFAULT_TABLE

    def distance(name):
        hw = load(name)["hardware"]
        other_arch = hw["capability"] != facts["capability"]
        return other_arch, abs(math.log(facts["peak_gbs"] / facts["sms"] / (hw["peak_gbs"] / hw["sms"])))

    return min(tables(), key=distance)


def table_for(device_name: str, facts: dict | None = None) -> str:
    """The table whose ``match`` strings occur in the device's name; else, given the device's
    hardware_facts, the nearest by the model; else the default."""
    for name in tables():
        if any(m in device_name for m in load(name)["match"]):
            return name
    return nearest_table(facts) if facts else DEFAULT_TABLE


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


def install(cuda_module, device: int = -1, device_name: str | None = None, facts: dict | None = None) -> str:
    """Hand a table to the compiled kernels: the default (device -1), or the one for a device."""
    name = DEFAULT_TABLE if device_name is None else table_for(device_name, facts)
    cuda_module.set_tuning_table(device, encode(load(name)))
    return name


def write(table: dict, path) -> None:
    """A table as JSON, one row a line (as the shipped tables are laid out)."""
    head = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in table.items() if k != "rows"]
    rows = ",\n".join("    " + json.dumps(r) for r in table["rows"])
    lines = "\n".join(["{", *head, '  "rows": [', rows, "  ]", "}"]) + "\n"
    Path(path).write_text(lines)
