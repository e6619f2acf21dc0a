"""One bench case, run a few times, for a profiler (ncu) to read its kernels.

Usage: python -m tools profile-case DTYPE NUM_SEQS SEQ_LEN [--dim-last|--channel-last] [--backward]
e.g.   ncu --clock-control none --launch-skip 2 --launch-count 1 python -m tools profile-case bfloat16 13200 4096
"""

import argparse

import torch

import linrec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools profile-case", description=__doc__.splitlines()[0])
    parser.add_argument("dtype")
    parser.add_argument("num_seqs", type=int)
    parser.add_argument("seq_len", type=int)
    parser.add_argument("--channel-last", action="store_true", help="(seq_len, num_seqs) scanned over dim 0")
    parser.add_argument("--backward", action="store_true")
    args = parser.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    shape = (args.seq_len, args.num_seqs) if args.channel_last else (args.num_seqs, args.seq_len)
    dim = 0 if args.channel_last else -1
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=args.backward)
    c = (torch.rand(shape, device="cuda") * 0.5 + 0.5).to(dtype)
    for _ in range(4):
        y = linrec.linrec(x, c, dim=dim)
        if args.backward:
            y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
