"""The tuning tables' hardware model (which measured table a device without its own takes), the
table writer, and the shapes `python -m linrec.tune --table` probes each row with. No GPU needed:
devices are described by their properties."""

import json
from types import SimpleNamespace

import pytest

from linrec import tuning
from linrec.tune_table import differences, fits, move_boundaries, probe_shapes, taker


def props(sms, major, minor, clock_khz, bus_bits, name="GPU"):
    return SimpleNamespace(name=name, multi_processor_count=sms, major=major, minor=minor, L2_cache_size=50 * 2**20,
                           memory_clock_rate=clock_khz, memory_bus_width=bus_bits)


H100 = props(132, 9, 0, 2619000, 5120, "NVIDIA H100 80GB HBM3")  # as torch 2.11 reported them on an H100


def test_peak_bandwidth_from_memory_clock_and_bus():
    """Double data rate over the bus: 2 x 2.619 GHz x 5120 bits / 8 = 3352 GB/s (the H100 SXM's 3.35 TB/s)."""
    assert tuning.peak_gbs(H100) == pytest.approx(3352.3, abs=0.1)
    assert tuning.peak_gbs(SimpleNamespace()) is None  # an older torch: no memory clock
    facts = tuning.hardware_facts(H100, copy_gbs=3000)
    assert facts == dict(sms=132, capability="9.0", l2_mb=50, peak_gbs=3352, copy_gbs=3000)


@pytest.fixture
def two_tables(tmp_path, monkeypatch):
    """The shipped H100 table beside a made-up one of 1.47x its bandwidth per SM and compute capability 10.0."""
    h100 = tuning.load("h100")
    wide = dict(h100, device="made-up", match=["Wide"], hardware=dict(h100["hardware"], peak_gbs=4915,
                                                                       capability="10.0"))
    for name, table in (("h100", h100), ("wide", wide)):
        (tmp_path / f"{name}.json").write_text(json.dumps(table))
    monkeypatch.setattr(tuning, "_HERE", tmp_path)
    tuning.load.cache_clear()
    yield
    tuning.load.cache_clear()


@pytest.mark.parametrize("device,expected", [
    (props(132, 9, 0, 2619000, 5120), "h100"),   # the H100's own figures
    (props(132, 9, 0, 3201000, 6144), "h100"),   # an H200's bandwidth, nearer wide's: capability 9.0 first
    (props(148, 10, 0, 2619000, 5120), "wide"),  # an H100's bandwidth at capability 10.0: wide
    (props(108, 8, 0, 1593000, 5120), "h100"),   # an A100, neither capability: 2039 GB/s / 108 SMs is nearer
    (props(100, 8, 0, 4000000, 8192), "wide"),   # capability 8.0, 8192 GB/s / 100 SMs: nearer wide
    (props(60, 8, 0, 1953125, 8192), "wide"),    # 4000 GB/s, nearer the H100's in total, over 60 SMs: per SM wide's
    (props(132, 9, 0, 0, 0), "h100"),            # bandwidth unknown: the default
])
def test_a_device_without_a_table_takes_the_nearest_by_bandwidth_per_sm(two_tables, device, expected):
    assert tuning.table_for("Some GPU", tuning.hardware_facts(device)) == expected


def test_a_device_named_in_a_table_takes_it(two_tables):
    slow = tuning.hardware_facts(props(132, 9, 0, 1000000, 5120))
    assert tuning.table_for("NVIDIA Wide 141GB", slow) == "wide"  # its name wins over the model
    assert tuning.table_for("NVIDIA H100 80GB HBM3") == "h100"
    assert tuning.table_for("Some GPU") == tuning.DEFAULT_TABLE  # no facts: the default


def test_written_table_reads_back(tmp_path):
    table = tuning.load("h100")
    tuning.write(table, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == table
    lines = (tmp_path / "t.json").read_text().splitlines()
    assert len(lines) == len(table["rows"]) + len(table) + 3  # a line a field and a row, the brackets


def test_probe_shapes_stay_inside_each_rows_calls():
    """Worked by hand: a forward-only row for 33..127, a row of either direction up to 127 (so the
    backward at any length and the forward up to 32), and an unbounded row above both."""
    rows = [
        {"storage": ["16bit"], "layout": "rows", "direction": "fwd", "min_len": 33, "max_len": 127,
         "kernel": "packed", "config": [16, 128, "vector", "block"]},
        {"storage": ["16bit"], "layout": "rows", "max_len": 127,
         "kernel": "packed", "config": [8, 256, "vector", "block"]},
        {"storage": ["16bit"], "layout": "rows", "kernel": "pipe", "config": [16, 64, "vector", "block"]},
        {"storage": ["16bit"], "layout": "rows", "min_len": 16384, "max_seqs_per_sm": 2,
         "kernel": "chained", "config": [64, 128, "staged", "block"]},
    ]
    sms = 132
    assert probe_shapes(rows, 0, sms, 2**26) == [(13200, 64, ["fwd"])]
    assert probe_shapes(rows, 1, sms, 2**26) == [(13200, 64, ["bwd"])]  # the forward at 64 is row 0's
    assert probe_shapes(rows, 2, sms, 2**26) == [(13200, n, ["fwd", "bwd"]) for n in (128, 4096, 16384)]
    # Behind row 2, which takes every length: no call reaches it, so it is not probed.
    assert probe_shapes(rows, 3, sms, 2**26) == []
    assert probe_shapes(rows[:2] + rows[3:], 2, sms, 2**26) == [(1, 2**24, ["fwd", "bwd"])]


def test_every_row_of_the_shipped_tables_is_probed():
    """Each row of each shipped table is reached by a probe (a row no call reaches would be dead data)."""
    for name in tuning.tables():
        rows = tuning.load(name)["rows"]
        for i, row in enumerate(rows):
            sms = tuning.load(name)["hardware"]["sms"]
            assert probe_shapes(rows, i, sms, 2**27), (name, i, row)


TILE_THEN_PIPE = [  # the backward of float32 rows: two tile configs up to 1024 and 4096, the pipe past them
    {"storage": ["32bit"], "layout": "rows", "direction": "bwd", "max_len": 1024, "kernel": "tile",
     "config": [16, 64, "vector", "block"]},
    {"storage": ["32bit"], "layout": "rows", "direction": "bwd", "max_len": 4096, "kernel": "tile",
     "config": [16, 256, "vector", "block"]},
    {"storage": ["32bit"], "layout": "rows", "direction": "bwd", "kernel": "pipe",
     "config": [8, 64, "vector", "block"]},
]


def pipe_faster_from(shortest):
    """A time_pair under which the pipe takes 0.9 of a tile kernel's time at lengths >= `shortest` and
    1.1 below, and the wider tile config 1.1 of the narrower's; with the calls it was asked for."""
    calls = []

    def time_pair(row, other, seqs, length, dirs):
        calls.append((row["config"][:2], other["kernel"], other["config"][:2], length, tuple(dirs)))
        return 1.0, 0.9 if other["kernel"] == "pipe" and length >= shortest else 1.1

    return time_pair, calls


def test_a_row_ends_where_the_next_rows_kernel_becomes_faster():
    time_pair, calls = pipe_faster_from(4096)
    rows = move_boundaries(TILE_THEN_PIPE, 132, time_pair, log=lambda _: None)
    assert [r and r.get("max_len") for r in rows] == [1024, 2048, None]
    assert rows[1]["measured"] == "ends at 2048, at 4096 bwd: tile 16x256 vector 1000.0 us, pipe 8x64 vector 900.0"
    assert rows[0] == TILE_THEN_PIPE[0] and rows[2] == TILE_THEN_PIPE[2]
    # Each pair at each length timed once, on #SMs x 100 sequences of the backward.
    assert sorted(calls) == sorted([([16, 64], "tile", [16, 256], 1024, ("bwd",)),
                                    ([16, 256], "pipe", [8, 64], 4096, ("bwd",)),
                                    ([16, 256], "pipe", [8, 64], 2048, ("bwd",))])
    assert differences(rows, TILE_THEN_PIPE) == "0 configs unlike the template's, 1 rows ending sooner, 0 rows dropped"


def test_a_row_that_loses_all_its_lengths_is_dropped_and_the_row_before_meets_the_next():
    """Once the 16x256 row is gone, the 16x64 row's longest length goes to the pipe, which is compared
    there in turn (a second pass)."""
    time_pair, calls = pipe_faster_from(512)
    rows = move_boundaries(TILE_THEN_PIPE, 132, time_pair, log=lambda _: None)
    assert [r and r.get("max_len") for r in rows] == [256, None, None]
    assert rows[1] is None and rows[2] == TILE_THEN_PIPE[2]
    assert ([16, 64], "pipe", [8, 64], 1024, ("bwd",)) in calls
    assert differences(rows, TILE_THEN_PIPE) == "0 configs unlike the template's, 1 rows ending sooner, 1 rows dropped"


def test_no_row_moves_where_its_own_kernel_is_faster():
    time_pair, _ = pipe_faster_from(2**30)
    assert move_boundaries(TILE_THEN_PIPE, 132, time_pair, log=lambda _: None) == TILE_THEN_PIPE


LENGTHS = [1, 2, 3, 17, 33, 64, 100, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 2047,
           2048, 2049, 4095, 4096, 4097, 8193, 16384, 2**20, 2**24]


@pytest.mark.parametrize("name", tuning.tables())
@pytest.mark.parametrize("other_faster", [True, False])
def test_moved_shipped_tables_still_serve_every_call(name, other_faster):
    """Whatever the timings, a table whose boundaries moved serves every call the template served,
    each row keeps its regime but for max_len, which only goes down; only bounded rows are timed,
    on the grid's shape, against another kernel or config that fits the length."""
    table = tuning.load(name)
    sms, template = table["hardware"]["sms"], table["rows"]
    asked = []

    def time_pair(row, other, seqs, length, dirs):
        assert row.get("max_len") is not None and seqs == 100 * sms and length <= row["max_len"]
        assert (other["kernel"], other["config"]) != (row["kernel"], row["config"])
        asked.append(length)
        return (1.0, 0.5) if other_faster else (0.5, 1.0)

    rows = move_boundaries(template, sms, time_pair, log=lambda _: None)
    assert asked
    if not other_faster:
        assert rows == template
    for new, old in zip(rows, template):
        if new is not None:
            assert {k: v for k, v in new.items() if k not in ("max_len", "measured")} == \
                {k: v for k, v in old.items() if k not in ("max_len", "measured")}
            assert new.get("max_len", 2**62) <= old.get("max_len", 2**62)
    kept = [r for r in rows if r is not None]
    for storage in {s for r in template for s in r["storage"]}:
        for layout in ("rows", "channels"):
            for direction in ("fwd", "bwd"):
                for length in LENGTHS:
                    for seqs in (1, 2 * sms, 100 * sms):
                        if taker(template, storage, layout, direction, length, seqs, sms) is not None:
                            row = kept[taker(kept, storage, layout, direction, length, seqs, sms)]
                            assert fits(row["kernel"], length, row["config"]), (storage, direction, length, row)


def test_measure_times_configs_then_moves_ends(monkeypatch):
    """measure's whole path with the device left out: each row's configs timed on its probes, then
    its end moved, both through time_config (here a made-up cost: the pipe 0.9x a tile kernel's
    time from 4096 on, and the config first in the row's candidates 1% faster)."""
    from linrec import tune_table
    monkeypatch.setattr(tune_table.torch.cuda, "get_device_properties",
                        lambda _: SimpleNamespace(multi_processor_count=132, L2_cache_size=50 * 2**20))
    monkeypatch.setattr(tune_table, "candidates", lambda row: [tuple(row["config"]), (4, 64, "vector", "block")])
    monkeypatch.setattr(tune_table, "probe_sets", lambda row, seqs, length, l2: [(seqs, length)])
    timed = []

    def time_config(kernel, config, sets, dim, directions, reps):
        (seqs, length), = sets
        timed.append((kernel, config[:2], length, tuple(directions)))
        cost = seqs * length * (0.9 if kernel == "pipe" and length >= 4096 else 1.0) * 1e-9
        return cost * (1.0 if config[:2] == (4, 64) else 0.99)

    monkeypatch.setattr(tune_table, "time_config", time_config)
    rows = tune_table.measure({"rows": TILE_THEN_PIPE}, reps=1, log=lambda _: None, bounds=True)
    assert [r["config"] for r in rows] == [r["config"] for r in TILE_THEN_PIPE]
    assert [r.get("max_len") for r in rows] == [1024, 2048, None]
    assert ("tile", (16, 256), 4096, ("bwd",)) in timed and ("pipe", (8, 64), 4096, ("bwd",)) in timed
    # Without --move-bounds (the default), the ends stay the template's.
    assert tune_table.measure({"rows": TILE_THEN_PIPE}, reps=1, log=lambda _: None)[1]["max_len"] == 4096


def test_a_row_shared_by_storage_classes_stays_while_one_still_reaches_it():
    """complex128 up to 512 is the first row's; complex64 from 1 and complex128 above 512 the
    second's. The second loses its longest lengths to the chained row down to 256: complex128
    calls no longer reach it, complex64 ones up to 256 still do, so it stays. The first row, now
    next to the chained row at 512, loses 512 to it as well."""
    rows = [
        {"storage": ["complex128"], "layout": "rows", "max_len": 512, "kernel": "tile",
         "config": [4, 256, "vector", "block"]},
        {"storage": ["complex64", "complex128"], "layout": "rows", "max_len": 1024, "kernel": "tile",
         "config": [4, 256, "vector", "block"]},
        {"storage": ["complex64", "complex128"], "layout": "rows", "kernel": "chained",
         "config": [16, 128, "staged", "block"]},
    ]
    moved = move_boundaries(rows, 132, lambda row, other, *_: (1.0, 0.5 if other["kernel"] == "chained" else 2.0),
                            log=lambda _: None)
    assert [r and r.get("max_len") for r in moved] == [256, 256, None]
    assert taker(moved, "complex64", "rows", "fwd", 200, 13200, 132) == 1
    assert taker(moved, "complex64", "rows", "fwd", 300, 13200, 132) == 2
