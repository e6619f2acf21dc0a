"""Time linrec.models on a GPU: the layers of Martin & Cundy against torch.nn.LSTM (cuDNN) of the
same hidden size, and Mamba's selective scan (time, and the peak memory of a forward+backward),
forward and forward+backward (eager, median of CUDA-event timings: the layers' host work is part
of what a training step pays).

    python scripts/models_bench.py [--json FILE]

LSTM throughput in the paper's sense: sequence elements (batch * length) a second.
"""

from __future__ import annotations

import argparse
import json

import torch

from linrec._timing import eager_ms
from linrec.models import GILR, LSLSTM, selective_scan


def fwd_bwd(run):
    def step():
        out = run()
        out.float().square().mean().backward()
    return step


def time_layers(rows, hidden, shapes, dtype):
    for batch, length in shapes:
        x = torch.randn(length, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
        layers = {
            "torch.nn.LSTM": torch.nn.LSTM(hidden, hidden, device="cuda", dtype=dtype),
            "linrec GILR": GILR(hidden, hidden, device="cuda", dtype=dtype),
            "linrec LSLSTM": LSLSTM(hidden, hidden, device="cuda", dtype=dtype),
        }
        for name, layer in layers.items():
            run = (lambda layer=layer: layer(x)[0]) if name != "linrec GILR" else (lambda layer=layer: layer(x))
            with torch.no_grad():
                fwd = eager_ms(run)
            both = eager_ms(fwd_bwd(run), reps=10, inner=3)
            rows.append(dict(model=name, dtype=str(dtype).removeprefix("torch."), hidden=hidden, batch=batch,
                             length=length, fwd_ms=fwd, fwd_bwd_ms=both,
                             fwd_bwd_elements_per_s=batch * length / (both * 1e-3)))


def peak_mib(step):
    """Peak GPU memory of one step above what was allocated before it, MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def time_selective_scan(rows, batch, channels, states, length, dtype):
    g = dict(device="cuda", dtype=dtype)
    u, z = torch.randn(batch, channels, length, **g), torch.randn(batch, channels, length, **g)
    delta = torch.rand(batch, channels, length, **g) * 0.1
    A = -torch.rand(channels, states, device="cuda") * 4
    B, C = torch.randn(batch, states, length, **g), torch.randn(batch, states, length, **g)
    D = torch.randn(channels, device="cuda")
    tensors = [u, delta, A, B, C, D, z]
    # The default (chunks of states within DEFAULT_CHUNK_ELEMENTS, rebuilt in the backward) and
    # the whole expanded state in one chunk, kept for the backward.
    variants = {"default": {}, "one chunk, kept": dict(state_chunk=states, recompute=False)}
    for variant, kwargs in variants.items():
        def run(kwargs=kwargs):
            return selective_scan(*tensors, delta_softplus=True, **kwargs)
        for t in tensors:
            t.requires_grad_(False)
        with torch.no_grad():
            fwd = eager_ms(run)
        for t in tensors:
            t.requires_grad_()
        both = eager_ms(fwd_bwd(run), reps=10, inner=3)
        peak = peak_mib(fwd_bwd(run))
        for t in tensors:
            t.grad = None
        rows.append(dict(model=f"selective_scan ({variant})", dtype=str(dtype).removeprefix("torch."), batch=batch,
                         channels=channels, states=states, length=length, fwd_ms=fwd, fwd_bwd_ms=both,
                         fwd_bwd_peak_mib=peak))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    rows = []
    time_layers(rows, 256, [(1, 8192), (16, 1024), (256, 256)], torch.float32)
    time_selective_scan(rows, 2, 1536, 16, 2048, torch.bfloat16)
    time_selective_scan(rows, 8, 3072, 16, 2048, torch.bfloat16)  # Mamba-1.4b's inner width, batch 8
    print(f"device: {torch.cuda.get_device_name()}")
    for r in rows:
        shape = {k: r[k] for k in ("hidden", "batch", "length", "channels", "states") if k in r}
        rate = f"  {r['fwd_bwd_elements_per_s'] / 1e6:8.2f} M elements/s" if "fwd_bwd_elements_per_s" in r else ""
        rate += f"  peak {r['fwd_bwd_peak_mib']:8.1f} MiB" if "fwd_bwd_peak_mib" in r else ""
        print(f"{r['model']:<32}{r['dtype']:<10}{str(shape):<48} fwd {r['fwd_ms']:8.3f} ms  "
              f"fwd+bwd {r['fwd_bwd_ms']:8.3f} ms{rate}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
