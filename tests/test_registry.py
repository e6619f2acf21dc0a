"""The kernel registry and the tuning tables derived from it.

csrc/registry.toml lists the kernel families and storage types; `python -m tools generate`
writes everything derived from it, and these tests fail when that is stale, when the Python
view disagrees with the compiled one, or when a tuning row names a config the build lacks.
"""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import linrec
from linrec import tuning
from linrec._registry import FAMILIES, STORAGES

ROOT = Path(__file__).resolve().parent.parent
needs_cuda_module = pytest.mark.skipif(not linrec.build_info()["cuda"], reason="this build has no CUDA kernels")


def test_generated_files_are_current():
    result = subprocess.run([sys.executable, "-m", "tools", "generate", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_registry_ids_are_the_ops_kernel_ids():
    ids = [f.id for f in FAMILIES.values()]
    assert sorted(ids) == list(range(1, len(ids) + 1))
    from linrec.impl import cuda

    assert {f"linrec_{name}" for name in FAMILIES} <= set(dir(cuda))


@needs_cuda_module
@pytest.mark.parametrize("kernel", [name for name, f in FAMILIES.items() if f.has_configs])
def test_compiled_configs_follow_the_registry(kernel):
    family = FAMILIES[kernel]
    for name, storage in STORAGES.items():
        configs = linrec.compiled_configs(kernel, getattr(torch, storage.values))
        compiled_here = any(STORAGES[s].values == storage.values for s in family.storages)
        assert bool(configs) == compiled_here, (kernel, name)
    assert family.default_config in linrec.compiled_configs(kernel)


@pytest.mark.parametrize("table", tuning.tables())
def test_tuning_rows_name_compiled_configs(table):
    """Each row of a shipped table names a family compiled for its storage classes at its config,
    and cites its measurement."""
    data = tuning.load(table)
    assert {"device", "date", "commands", "rows"} <= set(data)
    dtypes = {"16bit": torch.bfloat16, "32bit": torch.float32, "64bit": torch.float64,
              "complex64": torch.complex64, "complex128": torch.complex128}
    for row in data["rows"]:
        assert row["measured"]
        assert row["kernel"] in FAMILIES
        config = tuple(tuning.encode({"rows": [row]})[0][-4:])
        if linrec.build_info()["cuda"]:
            for storage in row["storage"]:
                assert config in linrec.compiled_configs(row["kernel"], dtypes[storage]), (row, storage)


def _rule_before_tables(seq_len, num_seqs, interleaved, backward, dtype, sms):
    """The shape rule as C++ code held it before it became the H100 table (an independent
    transcription: the table must choose the same kernel for every shape), and the one row
    measured since: short channel-last sequences take the strided 16x128 staged config, faster
    than 8x128 direct on an H100 and an H200 (python -m linrec.tune --table, 2026-11-28)."""
    vec, staged = 1, 3
    short_channel_last = ("strided", 16, 128, staged)
    if dtype.is_complex:
        c128 = dtype == torch.complex128
        if interleaved:
            return short_channel_last if seq_len < 256 else ("strided", 16, 128 if c128 else 256, staged)
        if seq_len <= 128:
            return ("packed", 4, 128, vec)
        if seq_len <= 256:
            return ("tile", 4, 64, vec)
        if seq_len <= 512:
            return ("tile", 4, 256, vec) if c128 else ("tile", 8, 64, vec)
        if seq_len <= 1024:
            return ("tile", 4, 256, vec)
        if seq_len < 2048 and not c128:
            return ("tile", 8, 256, vec)
        return ("chained", 16, 128, staged)
    elem_bytes = dtype.itemsize
    b16 = elem_bytes == 2
    if interleaved:
        return short_channel_last if seq_len < 256 else ("strided", 16, 256, staged)
    chained = ("chained", 64 if b16 else 32, 128, staged)
    tile_len = chained[1] * chained[2]
    if num_seqs < 2 * sms and seq_len >= 16384:
        return chained
    if elem_bytes <= 4 and num_seqs < 64 * sms and seq_len >= (4 if b16 else 2) * tile_len:
        return chained
    if b16:
        if not backward and 32 < seq_len < 128:
            return ("packed", 16, 128, vec)
        if seq_len < 128:
            return ("packed", 8, 256, vec)
        if seq_len <= 512:
            return ("packed", 16, 128, vec)
        if backward:
            return ("pipe", 8 if seq_len <= 2048 else 16, 64, vec)
        if seq_len <= 1024:
            return ("tile", 16, 64, vec)
        return ("pipe", 16, 256, vec) if seq_len > 8192 else ("pipe", 16, 64, vec)
    if seq_len <= 128:
        return ("packed", 4, 256, vec)
    if seq_len <= 256:
        return ("packed", 8, 128, vec)
    if not backward:
        if seq_len <= 512:
            return ("tile", 8, 64, vec)
        return ("tile", 4, 256, vec) if seq_len <= 1024 else ("pipe", 4, 256, vec)
    if seq_len <= 1024:
        return ("tile", 16, 64, vec)
    if seq_len <= 2048:
        return ("tile", 8, 256, vec)
    if seq_len <= 4096:
        return ("tile", 16, 256, vec)
    return ("pipe", 16, 64, vec)


@needs_cuda_module
def test_h100_table_is_the_rule_it_replaced():
    linrec.tuning.install(linrec._C_cuda)
    names = {f.id: name for name, f in FAMILIES.items()}
    dtypes = [(torch.float32, "float32"), (torch.float64, "float64"), (torch.float16, "float16"),
              (torch.bfloat16, "bfloat16"), (torch.bfloat16, "float32"), (torch.float16, "float32"),
              (torch.complex64, "complex64"), (torch.complex128, "complex128")]
    lengths = sorted({n + d for n in [2**k for k in range(0, 27)] + [33, 127, 255, 2047, 8193] for d in (-1, 0, 1)}
                     - {0})
    for (dtype, coeffs), seq_len, num_seqs, interleaved, backward in itertools.product(
            dtypes, lengths, [1, 4, 263, 264, 8447, 8448, 13200], [False, True], [False, True]):
        kind, e, t, m, _ = linrec._C_cuda.kernel_choice(str(dtype).removeprefix("torch."), coeffs, seq_len, num_seqs,
                                                        interleaved, backward, -1, 132)
        assert (names[kind], e, t, m) == _rule_before_tables(seq_len, num_seqs, interleaved, backward, dtype, 132), \
            (dtype, coeffs, seq_len, num_seqs, interleaved, backward)
