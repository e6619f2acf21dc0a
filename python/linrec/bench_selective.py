"""The selective scan against mamba_ssm's fused kernel: `python -m linrec.bench --selective`.

Each case times linrec.selective_scan and, where it imports, mamba_ssm's selective_scan_fn on the
same inputs in the same run (Mamba's call: per-step B and C, D, z, delta_bias, softplus):
forward and forward+backward, from a CUDA graph (device time) and eagerly, and the peak memory
of one forward+backward above the inputs. Inputs rotate through enough copies to exceed L2.
One more case packs 32768 tokens into segments of log-uniform lengths in 64..8192 (cu_seqlens,
a state a segment), against the same tokens as one sequence. Two limits put the times in context:
- memory: the bytes a fused kernel must move (forward: u, delta, z, B, C read, y written;
  the backward reads those and d_y and writes their gradients) over the copy bandwidth;
- exp: batch * dim * N * L exponentials (twice that with the backward, which needs them
  again) at 16 a clock per SM, the SFU rate of sm_80 to sm_90.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import subprocess
import sys
import types

import torch

from ._timing import device_ms, eager_ms

# (batch, dim, N, L): Mamba-130m's width at 2 x 2048 tokens, Mamba-1.4b's at 8 x 2048, and one
# long sequence.
SHAPES = [(2, 1536, 16, 2048), (8, 3072, 16, 2048), (1, 2048, 16, 65536)]
PACKED_SHAPE = (1, 2048, 16, 32768)  # packed as linrec.bench's varlen cases
EXP_PER_CLOCK_PER_SM = 16


def import_from_mamba_ssm(module: str, name: str):
    """`name` from mamba_ssm's `module`, or None where it does not import. Imported without
    mamba_ssm/__init__.py, which pulls in its models (and transformers)."""
    spec = importlib.util.find_spec("mamba_ssm") if "mamba_ssm" not in sys.modules else None
    if spec is not None:
        package = types.ModuleType("mamba_ssm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = package
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def mamba_selective_scan():
    """mamba_ssm's selective_scan_fn, or None."""
    return import_from_mamba_ssm("mamba_ssm.ops.selective_scan_interface", "selective_scan_fn")


def sm_clock_ghz() -> float:
    """The SMs' maximum clock, from nvidia-smi (torch does not report it); 0 if unknown."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits",
                              f"--id={torch.cuda.current_device()}"], capture_output=True, text=True, timeout=30)
        return float(out.stdout.split()[0]) / 1e3
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0.0


def make_inputs(batch, dim, states, length, dtype):
    g = dict(device="cuda", dtype=dtype)
    return dict(
        u=torch.randn(batch, dim, length, **g),
        delta=torch.randn(batch, dim, length, **g) * 0.5 - 3,  # softplus(-3 +- 0.5): Mamba's dt range
        A=-torch.rand(dim, states, device="cuda").add(0.5) * torch.arange(1, states + 1, device="cuda"),
        B=torch.randn(batch, states, length, **g),
        C=torch.randn(batch, states, length, **g),
        D=torch.randn(dim, device="cuda"),
        z=torch.randn(batch, dim, length, **g),
        delta_bias=torch.rand(dim, device="cuda") - 4,
    )


def peak_mib(step) -> float:
    """Peak memory of one call of step() above what was allocated before it, MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def time_impl(scan, sets, reps):
    """(fwd device ms, fwd eager ms, fwd+bwd device ms, fwd+bwd eager ms, fwd+bwd peak MiB)."""
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    state = {"i": 0}

    def next_set():
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]

    def forward():
        s = next_set()
        return scan(*(s[k] for k in names[:7]), delta_bias=s["delta_bias"], delta_softplus=True)

    def forward_backward():
        s = next_set()
        args = [s[k].detach().requires_grad_() for k in names]
        y = scan(*args[:7], delta_bias=args[7], delta_softplus=True)
        return torch.autograd.grad(y, args, s["d_y"])

    with torch.no_grad():
        fwd = device_ms(forward, reps), eager_ms(forward, reps)
    both = device_ms(forward_backward, reps, inner=3), eager_ms(forward_backward, reps, inner=3)
    return (*fwd, *both, peak_mib(forward_backward))


def run(reps: int = 20, dtypes=(torch.bfloat16, torch.float32)) -> list[dict]:
    from . import selective_scan
    from ._timing import copy_bandwidth_gbs
    from .bench import log_uniform_segments

    props = torch.cuda.get_device_properties(0)
    copy = copy_bandwidth_gbs()
    clock = sm_clock_ghz()
    exp_per_ms = props.multi_processor_count * EXP_PER_CLOCK_PER_SM * clock * 1e6
    impls = {"linrec": selective_scan}
    peer = mamba_selective_scan()
    if peer is not None:
        impls["mamba_ssm"] = peer
    cu = log_uniform_segments(PACKED_SHAPE[3], 64, 8192).cuda()
    packed_impls = {"linrec": selective_scan,
                    "linrec cu_seqlens": functools.partial(selective_scan, cu_seqlens=cu)}
    rows = []
    for dtype in dtypes:
        for shape in SHAPES + [PACKED_SHAPE]:
            batch, dim, states, length = shape
            first = make_inputs(batch, dim, states, length, dtype)
            first["d_y"] = torch.randn_like(first["u"])
            set_bytes = sum(t.numel() * t.element_size() for t in first.values())
            sets = [first] + [{k: v.clone() for k, v in first.items()}
                              for _ in range(math.ceil(2 * props.L2_cache_size / set_bytes) - 1)]
            size = dtype.itemsize
            bdl, bnl = batch * dim * length, batch * states * length
            fwd_bytes = (4 * bdl + 2 * bnl) * size
            both_bytes = fwd_bytes + (7 * bdl + 4 * bnl) * size
            exps = batch * dim * states * length
            for name, scan in (packed_impls if shape == PACKED_SHAPE else impls).items():
                fwd, fwd_eager, both, both_eager, peak = time_impl(scan, sets, reps)
                rows.append(dict(impl=name, dtype=str(dtype).removeprefix("torch."), batch=batch, dim=dim,
                                 states=states, length=length, segments=len(cu) - 1 if "cu_seqlens" in name else 1,
                                 fwd_ms=fwd, fwd_eager_ms=fwd_eager,
                                 fwd_bwd_ms=both, fwd_bwd_eager_ms=both_eager, fwd_bwd_peak_mib=peak,
                                 memory_limit_fwd_ms=fwd_bytes / copy / 1e6,
                                 memory_limit_fwd_bwd_ms=both_bytes / copy / 1e6,
                                 exp_limit_fwd_ms=exps / exp_per_ms if clock else None,
                                 exp_limit_fwd_bwd_ms=2 * exps / exp_per_ms if clock else None))
            del sets, first
    for row in rows:  # each implementation against mamba_ssm's figure of the same case
        peer_row = next((r for r in rows if r["impl"] == "mamba_ssm" and all(
            r[k] == row[k] for k in ("dtype", "batch", "dim", "states", "length"))), None)
        if peer_row is not None:
            for key in ("fwd_ms", "fwd_bwd_ms", "fwd_bwd_peak_mib"):
                row[f"{key}_vs_mamba_ssm"] = row[key] / peer_row[key]
        one_sequence = next((r for r in rows if r["impl"] == "linrec" and r["segments"] == 1 and all(
            r[k] == row[k] for k in ("dtype", "batch", "dim", "states", "length"))), None)
        if row["segments"] > 1 and one_sequence is not None:  # packed against the same tokens unpacked
            for key in ("fwd_ms", "fwd_bwd_ms"):
                row[f"{key}_vs_one_sequence"] = row[key] / one_sequence[key]
    return rows


def print_table(rows) -> None:
    # The /peer columns: against mamba_ssm, and for a packed row against the same tokens unpacked.
    print(f"{'impl':<19}{'dtype':<10}{'(batch, dim, N, L)':<24}{'fwd ms':>8}{'eager':>8}{'f+b ms':>8}{'eager':>8}"
          f"{'MiB':>7}{'fwd/peer':>9}{'f+b/peer':>9}{'MiB/peer':>9}{'mem lim':>9}{'exp lim':>9}")
    for r in rows:
        shape = f"({r['batch']}, {r['dim']}, {r['states']}, {r['length']})"
        ratios = "".join(f"{r.get(k + '_vs_mamba_ssm', r.get(k + '_vs_one_sequence', float('nan'))):>9.2f}"
                         for k in ("fwd_ms", "fwd_bwd_ms", "fwd_bwd_peak_mib"))
        exp_limit = r["exp_limit_fwd_ms"] or float("nan")
        print(f"{r['impl']:<19}{r['dtype']:<10}{shape:<24}{r['fwd_ms']:>8.3f}{r['fwd_eager_ms']:>8.3f}"
              f"{r['fwd_bwd_ms']:>8.3f}{r['fwd_bwd_eager_ms']:>8.3f}{r['fwd_bwd_peak_mib']:>7.0f}{ratios}"
              f"{r['memory_limit_fwd_ms']:>9.3f}{exp_limit:>9.3f}")
