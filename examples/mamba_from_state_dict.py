"""A Mamba block loaded from a state_dict in mamba_ssm's layout, run over a sequence and decoded.

linrec.models.Mamba has the parameter names and shapes of mamba_ssm's Mamba block, so a
mamba_ssm state_dict (from torch.save(mamba_block.state_dict(), path)) loads into it as it is.
mamba_ssm is not needed here: this script saves a state_dict of that layout from a Mamba of
its own, loads it into a second block, runs that over a sequence, then decodes the same
sequence one token at a time with step and checks that the outputs agree.

    python examples/mamba_from_state_dict.py            # CPU, about a second
    python examples/mamba_from_state_dict.py --device cuda --d-model 768 --length 2048
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from linrec.models import Mamba


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    source = Mamba(args.d_model, device=args.device)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mamba_layer.pt"
        torch.save(source.state_dict(), path)  # the file a mamba_ssm Mamba's state_dict would be
        block = Mamba(args.d_model, device=args.device)
        block.load_state_dict(torch.load(path, map_location=args.device))
    print("parameters:", ", ".join(f"{name} {tuple(t.shape)}" for name, t in block.state_dict().items()))
    loaded = all(torch.equal(block.state_dict()[name], t) for name, t in source.state_dict().items())

    x = torch.randn(2, args.length, args.d_model, device=args.device)
    with torch.no_grad():
        y = block(x)
        conv_state, ssm_state = block.allocate_inference_cache(batch_size=2, max_seqlen=args.length)
        steps = [block.step(x[:, t:t + 1], conv_state, ssm_state)[0] for t in range(args.length)]
        decoded_error = ((torch.cat(steps, dim=1) - y).abs().max() / y.abs().max()).item()
    print(f"output {tuple(y.shape)}; decoded one token at a time against the whole sequence: "
          f"largest difference {decoded_error:.1e} (relative to the largest output)")
    if not loaded or decoded_error > 1e-4:
        print("mismatch: " + ("the loaded parameters differ" if not loaded else "decoding differs"))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
