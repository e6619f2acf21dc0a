"""A tuning table for this device, measured: `python -m linrec.tune --table PATH`.

A table's rows split the calls into regimes (storage class, layout, direction, lengths, sequences
per SM, tiles a sequence) and give each regime a kernel and its config. The regimes and the kernel
of each row are the project's design and stay those of a template table (the default one); what
differs between devices is which config keeps enough bytes in flight for the device's bandwidth,
and where one row's lengths end and the next row's begin. So each row is probed: a few shapes
inside the row's regime (probe_shapes), each timed with every config of the row's kernel that is
compiled for all of the row's storage classes and fits the row's lengths. The config with the
least time summed over the shapes (each relative to its fastest) wins, unless the template's is
within TIE of it (noise must not churn a table). With --move-bounds, each row's longest length
is then moved down while the next row is faster there (move_boundaries). It times a row's first
storage class alone and moves the row's end for all of them, so it is off by default: the H200
table took its float32 moves by hand, leaving float64 where it was.

Inputs cycle past L2, as in the bench, so short sequences are read from DRAM. Timing is device
time (a CUDA graph), one kernel at a time: forward, fused backward, or both for a row of either
direction.
"""

from __future__ import annotations

import datetime
import itertools
import math
import time

import torch

from . import compiled_configs, tuning
from ._ops import bwd_op, fwd_op_no_autograd as fwd_op
from ._registry import FAMILIES
from ._timing import copy_bandwidth_gbs, device_ms
from .bench import copies_past_l2

TIE = 0.02  # the template's config stays when it is within 2% of the fastest
# The dtype each storage class is probed with.
STORAGE_DTYPES = {"32bit": torch.float32, "16bit": torch.bfloat16, "64bit": torch.float64,
                  "complex64": torch.complex64, "complex128": torch.complex128}
PROBE_ORDER = ["32bit", "16bit", "complex64", "64bit", "complex128"]
MEMCODE_NAMES = {v: k for k, v in tuning.MEMCODES.items()}
ALGOCODE_NAMES = {v: k for k, v in tuning.ALGOCODES.items()}


def serves(rows, index, storage, layout, direction, length, seqs, sms):
    """Whether rows[index] is the first row matching a call (the rule of csrc/tuning/kernel_choice_cuda.cpp)."""
    for i, row in enumerate(rows):
        if storage not in row["storage"] or row["layout"] != layout:
            continue
        if row.get("direction", "any") not in ("any", direction):
            continue
        if length < row.get("min_len", 0) or 0 <= row.get("max_len", -1) < length:
            continue
        if row.get("max_seqs_per_sm", 0) and seqs >= row["max_seqs_per_sm"] * sms:
            continue
        if row.get("min_tiles", 0) and length < row["min_tiles"] * row["config"][0] * row["config"][1]:
            continue
        return i == index
    return False


def probe_storage(row):
    return next(s for s in PROBE_ORDER if s in row["storage"])


def probe_shapes(rows, index, sms, max_elems):
    """The calls rows[index] is probed with, as (sequences, length, directions): shapes inside its
    regime, each with the directions the row serves there (an earlier row may take the forward).
    Few long sequences: one, as long as max_elems allows; a few sequences per SM (chained over
    several tiles): 8 per SM; a bounded row: the largest power of two it takes; an
    unbounded one: from just above the earlier rows' lengths to 16384. Many sequences: the
    bench's grid (#SMs x 100)."""
    row = rows[index]
    lower = shortest_length(rows, index)
    if row.get("max_seqs_per_sm", 0) and row["max_seqs_per_sm"] <= 2:
        shapes = [(1, max(row.get("min_len", 0), max_elems // 4))]
    elif row.get("max_seqs_per_sm", 0):
        shapes = [(8 * sms, 2 ** int(math.log2(max_elems // (8 * sms))))]
    elif row.get("max_len") is not None:  # a power of two where one is in range: odd lengths are misaligned
        power = 2 ** int(math.log2(row["max_len"]))
        shapes = [(sms * 100, power if power >= lower else row["max_len"])]
    else:
        lengths = sorted({2 ** math.ceil(math.log2(max(lower, 16))), 4096, 16384})
        shapes = [(sms * 100, n) for n in lengths if n >= lower]
    storage = probe_storage(row)
    directions = ["fwd", "bwd"] if row.get("direction", "any") == "any" else [row["direction"]]
    served = []
    for seqs, length in shapes:
        dirs = [d for d in directions if serves(rows, index, storage, row["layout"], d, length, seqs, sms)]
        if dirs:
            served.append((seqs, length, dirs))
    return served


def shortest_length(rows, index, storage=None):
    """The shortest length no earlier row takes from rows[index] (for every sequence count): of
    the calls of `storage`, or of any storage class the rows share."""
    row = rows[index]
    lower = row.get("min_len", 0)
    classes = set(row["storage"]) if storage is None else {storage}
    for earlier in rows[:index]:
        covers = earlier.get("direction", "any") in ("any", row.get("direction", "any"))  # all its directions
        same_calls = earlier["layout"] == row["layout"] and set(earlier["storage"]) & classes
        if same_calls and covers and not earlier.get("max_seqs_per_sm"):
            lower = max(lower, earlier.get("max_len", -1) + 1)
    return lower


def fits(kernel, length, config):
    """Whether a config (elems_per_thread, threads_per_block, ...) can run a sequence of this length:
    a packed kernel's sequence fits one warp's elements, a tile kernel's one block's (the others
    throw)."""
    e, t = config[:2]
    if kernel == "packed":
        return length <= 32 * e
    if kernel == "tile":
        return length <= e * t
    return True


def candidates(row):
    """The configs compiled for every storage class of the row, as (e, t, memname, algoname)."""
    sets = []
    for storage in row["storage"]:
        compiled = compiled_configs(row["kernel"], STORAGE_DTYPES[storage])
        sets.append({(e, t, MEMCODE_NAMES[m], ALGOCODE_NAMES[a]) for e, t, m, a in compiled})
    return sorted(set.intersection(*sets))


def time_config(kernel, config, sets, dim, directions, reps):
    """Device ms of the forward, the fused backward, or their sum, at `config`."""
    e, t, m, a = config
    kid = FAMILIES[kernel].id
    args = (kid, e, t, tuning.MEMCODES[m], tuning.ALGOCODES[a])
    turn = itertools.cycle(sets)
    total = 0.0
    if "fwd" in directions:
        def forward():
            x, c, _, _ = next(turn)
            fwd_op(x, c, None, dim, 0, *args)
        total += device_ms(forward, reps=reps, inner=len(sets) * -(-10 // len(sets)))
    if "bwd" in directions:
        def backward():
            _, c, y, dy = next(turn)
            bwd_op(dy, c, y, None, dim, 0, *args)
        total += device_ms(backward, reps=reps, inner=len(sets) * -(-10 // len(sets)))
    return total


def probe_sets(row, seqs, length, l2_bytes):
    """Input sets (x, c, y, dy) of the row's probe, copied past L2; channel-last rows as (length, seqs)
    scanned over dim 0."""
    dtype = STORAGE_DTYPES[probe_storage(row)]
    shape = (length, seqs) if row["layout"] == "channels" else (seqs, length)
    x = torch.randn(shape, device="cuda").to(dtype)
    c = (torch.rand(shape, device="cuda") * 0.5 + 0.5).to(dtype)
    y, dy = torch.randn_like(x), torch.randn_like(x)
    return copies_past_l2((x, c, y, dy), 8 * x.numel() * x.element_size(), l2_bytes)


DIRECTIONS = {"any": ["fwd", "bwd"], "fwd": ["fwd"], "bwd": ["bwd"]}
MAX_OCTAVES = 2  # how far move_boundaries moves a row's end in one run: to a quarter of its largest power of two


def taker(rows, storage, layout, direction, length, seqs, sms):
    """The index of the row that serves a call, or None."""
    return next((i for i in range(len(rows)) if serves(rows, i, storage, layout, direction, length, seqs, sms)), None)


def move_boundaries(rows, sms, time_pair, log=print):
    """The rows, each row with a longest length ending where the row after it becomes faster;
    a list beside `rows`, None for a row dropped.

    The template's boundaries between rows (a tile kernel up to 4096, the pipe past it) were
    measured on one device, and another device's bandwidth can move them. For each row with a
    max_len, at the largest power of two it takes, P, and #SMs x 100 sequences: the row's kernel
    and config, and those of the row that takes P once this row stops below it, are timed on the
    same inputs (time_pair(row, other, seqs, P, directions) -> (ms, ms)). While the other is
    faster by more than TIE, the row ends at P // 2 and P // 2 is tried, down to P / 2^MAX_OCTAVES
    at most (short probes time launches more than bandwidth). A row left with no
    length is dropped. Ends only move down: a row's configs were chosen for its lengths, and a
    tile kernel's may not fit longer ones. A row that ends sooner hands lengths to the rows after
    it, which can change what an earlier row is compared with, so the passes repeat until none
    moves (each pair timed once)."""
    rows = [dict(r) for r in rows]
    # The shortest length each row is tried at: MAX_OCTAVES - 1 halvings below its longest power of two.
    shortest_tries = [(2 ** int(math.log2(r["max_len"])) >> (MAX_OCTAVES - 1)) if r.get("max_len") else 0
                      for r in rows]
    timed = {}
    while any([_move_one(rows, i, shortest_tries[i], sms, time_pair, timed, log) for i in range(len(rows))]):
        pass
    return rows


def _move_one(rows, i, shortest_try, sms, time_pair, timed, log):
    """move_boundaries for rows[i], in place, trying lengths down to shortest_try; whether it moved."""
    row = rows[i]
    if row is None or row.get("max_len") is None or row.get("max_seqs_per_sm") or row.get("min_tiles"):
        return False
    before = [r for r in rows[:i] if r is not None]

    def table(candidate):
        return before + [candidate] + [r for r in rows[i + 1:] if r is not None]

    k, storage, layout, seqs = len(before), probe_storage(row), row["layout"], 100 * sms
    lower = max(shortest_length(table(row), k, storage), 1)
    length, moved = 2 ** int(math.log2(row["max_len"])), False
    while length >= max(lower, shortest_try):
        dirs = [d for d in DIRECTIONS[row.get("direction", "any")]
                if serves(table(row), k, storage, layout, d, length, seqs, sms)]
        trial = table(dict(row, max_len=length - 1))
        takers = {taker(trial, storage, layout, d, length, seqs, sms) for d in dirs}
        if not dirs or len(takers) != 1 or None in takers:  # no single row to hand the length to
            break
        other = trial[takers.pop()]
        # The other row takes every length from here to the row's end: its config must fit them.
        if (other["kernel"], other["config"]) == (row["kernel"], row["config"]) or \
                not fits(other["kernel"], row["max_len"], other["config"]):
            break
        key = (row["kernel"], tuple(row["config"]), other["kernel"], tuple(other["config"]), length, tuple(dirs))
        if key not in timed:
            timed[key] = time_pair(row, other, seqs, length, dirs)
        mine, theirs = timed[key]
        verdict = (f"at {length} {'+'.join(dirs)}: {row['kernel']} {_name(row['config'])} {1e3 * mine:.1f} us, "
                   f"{other['kernel']} {_name(other['config'])} {1e3 * theirs:.1f}")
        if theirs >= (1 - TIE) * mine:
            log(f"row {i:>2} {row['kernel']:<8} keeps {length}: {verdict}")
            break
        record = "; ".join(filter(None, [row.get("measured"), f"ends at {length // 2}, {verdict}"]))
        row = rows[i] = dict(row, max_len=length // 2, measured=record)
        log(f"row {i:>2} {row['kernel']:<8} ends at {length // 2}: {verdict}")
        moved, length = True, length // 2
    # Dropped once no call of any of its storage classes reaches it (rows before it may cover some).
    if all(row["max_len"] < max(shortest_length(table(row), k, s), 1) for s in row["storage"]):
        log(f"row {i:>2} {row['kernel']:<8} dropped: the rows around it took all its lengths")
        rows[i] = None
    return moved


def measure(template, reps=10, max_elems=2**26, log=print, bounds=False):
    """The rows of `template` (a table's JSON) with each config measured on this device, and
    with `bounds`, each row's longest length (move_boundaries): a list beside the template's
    rows, None for a row dropped."""
    props = torch.cuda.get_device_properties(0)
    rows = []
    sms = props.multi_processor_count
    start = time.perf_counter()
    for i, row in enumerate(template["rows"]):
        dim = 0 if row["layout"] == "channels" else -1
        shapes = probe_shapes(template["rows"], i, sms, max_elems)
        if not shapes:  # no call reaches the row: it stays as it is
            rows.append(row)
            log(f"row {i:>2} {row['kernel']:<8} reached by no probe; kept")
            continue
        longest = max([n for _, n, _ in shapes] + [row.get("max_len", 0)])
        configs = [tuple(c) for c in candidates(row) if fits(row["kernel"], longest, c)]
        score = dict.fromkeys(configs, 0.0)  # summed over the shapes, each relative to its fastest config
        plain = {}
        for seqs, length, dirs in shapes:
            sets = probe_sets(row, seqs, length, props.L2_cache_size)
            times = {}
            for cfg in configs:
                try:
                    times[cfg] = time_config(row["kernel"], cfg, sets, dim, dirs, reps)
                except RuntimeError as error:  # a config this device cannot launch (shared memory)
                    log(f"row {i:>2} {_name(cfg)}: left out: {str(error).splitlines()[0][:160]}")
            configs = [cfg for cfg in configs if cfg in times]
            score = {cfg: score[cfg] for cfg in configs}
            del sets
            for cfg, ms in times.items():
                score[cfg] += ms / min(times.values())
                plain[cfg] = 1e3 * ms  # the last shape's time, for the record
        old = tuple(row["config"])
        best = min(score, key=score.get)
        chosen = old if old in score and score[old] <= (1 + TIE) * score[best] else best
        others = ", ".join(f"{_name(k)} {plain[k]:.1f}"
                           for _, k in sorted((v, k) for k, v in score.items() if k != chosen)[:2])
        where = ", ".join(f"{s} x {n} {'+'.join(d)}" for s, n, d in shapes) + (" over dim 0" if dim == 0 else "")
        record = f"{probe_storage(row)} {where}; us at the last: {_name(chosen)} {plain[chosen]:.1f}; {others}"
        if old != chosen and old in plain:
            record += f"; the template's {_name(old)} {plain[old]:.1f}"
        rows.append(dict(row, config=list(chosen), measured=record))
        log(f"row {i:>2} {row['kernel']:<8} {record} ({time.perf_counter() - start:.0f} s)")
    if not bounds:
        return rows

    def time_pair(row, other, seqs, length, dirs):
        sets = probe_sets(row, seqs, length, props.L2_cache_size)
        dim = 0 if row["layout"] == "channels" else -1
        return tuple(time_config(r["kernel"], tuple(r["config"]), sets, dim, dirs, reps) for r in (row, other))

    return move_boundaries(rows, sms, time_pair, log)


def differences(rows, template_rows):
    """What measured rows (beside the template's, None where dropped) changed, in words."""
    pairs = [(new, old) for new, old in zip(rows, template_rows) if new is not None]
    configs = sum(new["config"] != old["config"] for new, old in pairs)
    bounds = sum(new.get("max_len") != old.get("max_len") for new, old in pairs)
    return (f"{configs} configs unlike the template's, {bounds} rows ending sooner, "
            f"{len(template_rows) - len(pairs)} rows dropped")


def _name(config):
    e, t, m, a = config
    return f"{e}x{t} {m}"


def write(template_name, path, reps, max_elems, argv, bounds=False, log=print):
    """Measure every row of the template table and write a table for this device to `path`."""
    template = tuning.load(template_name)
    props = torch.cuda.get_device_properties(0)
    rows = measure(template, reps, max_elems, log, bounds)
    log(differences(rows, template["rows"]))
    table = dict(
        device=props.name,
        match=[props.name],
        hardware=tuning.hardware_facts(props, copy_gbs=round(copy_bandwidth_gbs())),
        date=datetime.date.today().isoformat(),
        commands=[f"python -m linrec.tune {' '.join(argv)}"],
        template=template_name,
        rule=template["rule"],
        rows=[row for row in rows if row is not None],
    )
    tuning.write(table, path)
    return table
