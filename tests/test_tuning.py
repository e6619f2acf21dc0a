"""The tuning tables' hardware model (which measured table a device without its own takes), the
table writer, and the shapes `python -m linrec.tune --table` probes each row with. No GPU needed:
devices are described by their properties."""

import json
from types import SimpleNamespace

import pytest

from linrec import tuning
from linrec.tune_table import probe_shapes


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
