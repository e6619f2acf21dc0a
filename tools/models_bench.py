"""linrec.models against torch.nn.LSTM (cuDNN), on a GPU.

Time linrec.models on a GPU: the layers of Martin & Cundy against torch.nn.LSTM (cuDNN) of the
same hidden size, forward and forward+backward (eager, median of CUDA-event timings: the layers'
host work is part of what a training step pays). The selective scan has its own benchmark
against mamba_ssm: python -m linrec.bench --selective.

    python -m tools models-bench [--json FILE] [--profile BATCHxLENGTH]

--profile instead splits one forward+backward of LSLSTM and torch.nn.LSTM at that shape (hidden
256, float32) by GPU kernel (torch.profiler): matrix products, linrec's scans, the rest.

The layers run float32 twice: with TF32 matrix products off for both (torch's default for
matmuls) and on for both (cuDNN's default for its RNNs): torch.nn.LSTM under torch's defaults
takes TF32 where nn.Linear does not.

LSTM throughput in the paper's sense: sequence elements (batch * length) a second.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json

import torch

from linrec._timing import eager_ms
from linrec.models import GILR, LSLSTM


def fwd_bwd(run):
    def step():
        out = run()
        out.float().square().mean().backward()
    return step


@contextlib.contextmanager
def matmul_precision(tf32):
    """Both torch's matrix products and cuDNN (whose RNNs take TF32 by default while torch's
    float32 matmuls do not) at one precision, so that the layers are compared like for like."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def time_layers(rows, hidden, shapes, dtype, tf32):
    with matmul_precision(tf32):
        for batch, length in shapes:
            x = torch.randn(length, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
            lslstm = LSLSTM(hidden, hidden, device="cuda", dtype=dtype)
            layers = {
                "torch.nn.LSTM": torch.nn.LSTM(hidden, hidden, device="cuda", dtype=dtype),
                "linrec GILR": GILR(hidden, hidden, device="cuda", dtype=dtype),
                "linrec LSLSTM": lslstm,
                "linrec LSLSTM, torch.compile": torch.compile(lslstm),
            }
            for name, layer in layers.items():
                def run(layer=layer):
                    return layer(x)[0]
                with torch.no_grad():
                    fwd = eager_ms(run)
                both = eager_ms(fwd_bwd(run), reps=10, inner=3)
                rows.append(dict(model=name, dtype=str(dtype).removeprefix("torch."), tf32=tf32, hidden=hidden,
                                 batch=batch, length=length, fwd_ms=fwd, fwd_bwd_ms=both,
                                 fwd_bwd_elements_per_s=batch * length / (both * 1e-3)))


def kernel_class(name):
    """Which part of a layer a GPU kernel belongs to, from its name."""
    lowered = name.lower()
    if "linrec" in lowered:
        return "linrec scans"
    if any(k in lowered for k in ("gemm", "xmma", "cutlass", "sgemm", "cublas", "lstm", "rnn")):
        return "matrix products and cuDNN's LSTM"
    return "element-wise and other"


def profile_layers(batch, length, hidden=256):
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(length, batch, hidden, device="cuda", requires_grad=True)
    for (name, layer), tf32 in itertools.product(
            (("torch.nn.LSTM", torch.nn.LSTM(hidden, hidden, device="cuda")),
             ("linrec LSLSTM", LSLSTM(hidden, hidden, device="cuda"))), (False, True)):
        step = fwd_bwd(lambda layer=layer: layer(x)[0])
        with matmul_precision(tf32):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kernels)
        by_class = {}
        for e in kernels:
            by_class[kernel_class(e.key)] = by_class.get(kernel_class(e.key), 0) + e.self_device_time_total
        print(f"{name}, {batch} x {length}, hidden {hidden}, {'tf32' if tf32 else 'float32'} matmuls, fwd+bwd: "
              f"{total / 1e3:.3f} ms of GPU kernels")
        for cls, us in sorted(by_class.items(), key=lambda kv: -kv[1]):
            print(f"  {cls:<36}{us / 1e3:8.3f} ms  {us / total:6.1%}")
        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:8]:
            print(f"    {e.self_device_time_total / 1e3:8.3f} ms  x{e.count:<4} {e.key[:90]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools models-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--profile", metavar="BATCHxLENGTH", help="split LSLSTM and torch.nn.LSTM by kernel")
    args = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    if args.profile:
        profile_layers(*(int(n) for n in args.profile.split("x")))
        return 0
    rows = []
    for tf32 in (False, True):
        time_layers(rows, 256, [(1, 8192), (16, 1024), (256, 256)], torch.float32, tf32)
    print(f"device: {torch.cuda.get_device_name()}")
    for r in rows:
        shape = {k: r[k] for k in ("hidden", "batch", "length")}
        rate = f"  {r['fwd_bwd_elements_per_s'] / 1e6:8.2f} M elements/s"
        dtype = r["dtype"] + (", tf32" if r.get("tf32") else "")
        print(f"{r['model']:<32}{dtype:<16}{str(shape):<48} fwd {r['fwd_ms']:8.3f} ms  "
              f"fwd+bwd {r['fwd_bwd_ms']:8.3f} ms{rate}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
