"""The performance tables of docs/performance.md, from a `python -m linrec.bench --json` file.

Usage: python -m tools readme-tables benchmarks/bench_h100.json
"""

import argparse
import json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools readme-tables", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a python -m linrec.bench --json file")
    bench = json.load(open(parser.parse_args(argv).path))
    rows = bench["rows"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        def get(case, impl, backward):
            for r in rows:
                if (r["case"], r["dtype"], r["impl"], r["backward"]) == (case, dtype, impl, backward):
                    return r
            return None

        print(f"\n{dtype}: fraction of copy bandwidth, fwd / fwd+bwd; last column: linrec time over the "
              "elementwise baseline's (fwd / fwd+bwd)\n")
        print("| case | torch.add / torch.mul fwd+bwd | linrec (CUDA) | Triton pipe | linrec time / baseline time |")
        print("|---|---|---|---|---|")
        for case in cases:
            base = [get(case, "torch.add", False), get(case, "torch.mul fwd+bwd", True)]
            ours = [get(case, "linrec", False), get(case, "linrec", True)]
            triton = [get(case, "triton.pipe", False), get(case, "triton.pipe", True)]
            if None in base or None in ours:
                continue
            frac = lambda pair: " / ".join("-" if r is None else f"{r['frac']:.2f}" for r in pair)
            ratio = " / ".join(f"{o['ms'] / b['ms']:.2f}" for o, b in zip(ours, base))
            print(f"| {case} | {frac(base)} | {frac(ours)} | {frac(triton)} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
