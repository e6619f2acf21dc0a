"""Each of linrec's figures in a `python -m linrec.bench --json` file against its floor,
with the margin, so a run's verdicts need no arithmetic by hand.

The floors, as fractions of the run's copy bandwidth or ratios to the same run's baselines:
  grid L >= 4096           fwd >= 0.95 of copy, fwd+bwd >= 0.92
  grid L = 1024, 2048      fwd >= 0.97 x torch.add's fraction, fwd+bwd >= 0.97 x the elementwise fwd+bwd's
  grid 16 <= L <= 512      fwd time <= 1.1 x torch.add's, fwd+bwd time <= 1.2 x the elementwise fwd+bwd's
  any other case           fwd >= 0.85 of copy, fwd+bwd >= 0.80 (few long sequences, channel-last)
  every case with a peer   at least the best peer's GB/s in the same run (accelerated-scan, FLA, the
                           Triton pipe: every implementation that is not linrec's own)
  eager, >= 2^23 elements  fwd eager time <= 1.1 x torch.add's, fwd+bwd <= 1.15 x the elementwise fwd+bwd's
  --options cases          packed sequences ("varlen ..."): linrec with cu_seqlens, fwd >= 0.90 of copy,
                           fwd+bwd >= 0.85; log-coefficients ("log ..."): linrec with log_coeffs=True
                           takes at most 1.03 x the time of linrec on the same values as coefficients
The same floors hold for every dtype, but for the 16-bit forward of few long sequences: 0.78
(lowered 2026-11-27 after about 30 measured designs, docs/design/0006-chained-fixed-cost-bf16-forward.md).
A `python -m linrec.bench --host --json` file has one floor: on CPU tensors, fwd+bwd host time
<= 1.2 x torch.cumsum(x * c)'s, at every shape. A `--model --json` file has one too: linrec's
training step <= 1.02 x the step with an elementwise stand-in for the scan, at every size.

Usage: python -m tools check-floors benchmarks/bench_h100.json [--impl linrec]
Exits 1 if any floor is missed.
"""

import argparse
import json
import sys

BASELINES = {False: "torch.add", True: "torch.mul fwd+bwd"}
# The --options cases: by the case's name, the implementation their floors are for (the plain
# linrec rows there are references: the same values without the option).
OPTION_IMPLS = {"varlen ": "linrec cu_seqlens", "log ": "linrec log_coeffs"}
NOT_PEERS = {"linrec", "linrec_hop", "torch.add", "torch.mul fwd+bwd", "torch.exp + linrec", *OPTION_IMPLS.values()}
EAGER_FLOORS = {False: 1.1, True: 1.15}
EAGER_MIN_ELEMS = 2**23


FEW_LONG_CASES = ("1 x 2^24", "4 x 2^22")
SIXTEEN_BIT = ("bfloat16", "float16")


def floor_of(case, dtype, backward, ours, base, copy_gbs, plain=None):
    """(figure, floor, higher_is_better, what) for one linrec row and its same-run baseline
    (and, in a --options case, the plain linrec row on the same values)."""
    if case.startswith("varlen "):
        return ours["gbs"] / copy_gbs, 0.85 if backward else 0.90, True, "of copy"
    if case.startswith("log "):
        return ours["ms"] / plain["ms"], 1.03, False, "x linrec's time on plain coefficients"
    if case.startswith("grid L="):
        length = int(case.split("=")[1])
        if length >= 4096:
            return ours["gbs"] / copy_gbs, 0.92 if backward else 0.95, True, "of copy"
        if length in (1024, 2048):
            return ours["gbs"] / copy_gbs, 0.97 * base["gbs"] / copy_gbs, True, "of copy (0.97 x baseline)"
        return ours["ms"] / base["ms"], 1.2 if backward else 1.1, False, "x baseline time"
    if case in FEW_LONG_CASES and dtype in SIXTEEN_BIT and not backward:
        return ours["gbs"] / copy_gbs, 0.78, True, "of copy"
    return ours["gbs"] / copy_gbs, 0.80 if backward else 0.85, True, "of copy"


def under_test(case, impl):
    """The implementation a case's floors are for: impl, or in a --options case of linrec its option's."""
    for prefix, option_impl in OPTION_IMPLS.items():
        if case.startswith(prefix) and impl == "linrec":
            return option_impl
    return impl


def check(bench, impl="linrec"):
    """One verdict a (case, dtype, pass) that has both impl and its baseline: a list of
    dicts with case, dtype, backward, figure, floor, what and ok."""
    rows = {(r["case"], r["dtype"], r["backward"], r["impl"]): r for r in bench["rows"]}
    verdicts = []
    for (case, dtype, backward, name), ours in rows.items():
        base = rows.get((case, dtype, backward, BASELINES[backward]))
        plain = rows.get((case, dtype, backward, impl))
        if name != under_test(case, impl) or base is None or (case.startswith("log ") and plain is None):
            continue
        # A file merged from runs keeps each row's own copy bandwidth.
        figure, floor, higher, what = floor_of(case, dtype, backward, ours, base, ours.get("copy_gbs", bench["copy_gbs"]),
                                               plain)
        ok = figure >= floor if higher else figure <= floor
        verdicts.append(dict(case=case, dtype=dtype, backward=backward, figure=figure, floor=floor, what=what, ok=ok))
        peers = [r for (c, d, b, n), r in rows.items() if (c, d, b) == (case, dtype, backward) and n not in NOT_PEERS]
        if peers:
            best = max(peers, key=lambda r: r["gbs"])
            figure = ours["gbs"] / best["gbs"]
            verdicts.append(dict(case=case, dtype=dtype, backward=backward, figure=figure, floor=1.0,
                                 what=f"x {best['impl']}'s GB/s", ok=figure >= 1.0))
        if ours.get("elems", 0) >= EAGER_MIN_ELEMS and "eager_ms" in ours:
            figure = ours["eager_ms"] / base["eager_ms"]
            verdicts.append(dict(case=case, dtype=dtype, backward=backward, figure=figure, floor=EAGER_FLOORS[backward],
                                 what="x baseline eager time", ok=figure <= EAGER_FLOORS[backward]))
    return verdicts


def check_host(bench, impl="linrec.linrec"):
    """The host bench's verdicts: CPU fwd+bwd time against the reference chain's, a shape each."""
    rows = {(r["device"], r["case"], r["pass_"], r["impl"]): r["us"] for r in bench["rows"]}
    verdicts = []
    for (device, case, pass_, name), us in rows.items():
        if name != impl or device != "cpu" or pass_ != "forward+backward":
            continue
        figure = us / rows[(device, case, pass_, bench["reference"])]
        verdicts.append(dict(case=f"host, CPU {case}", dtype="float32", backward=True, figure=figure,
                             floor=bench["floor"], what=f"x {bench['reference']}'s time", ok=figure <= bench["floor"]))
    return verdicts


def check_model(bench):
    """The training-step bench's verdicts: linrec's step time against the stand-in's, a size each."""
    steps = {(r["size"], r["scan"]): r["ms"] for r in bench["rows"]}
    verdicts = []
    for (size, scan), ms in steps.items():
        if scan != "linrec" or (size, bench["reference"]) not in steps:
            continue
        figure = ms / steps[(size, bench["reference"])]
        verdicts.append(dict(case=f"step, {size}", dtype="bfloat16", backward=True, figure=figure,
                             floor=bench["floor"], what=f"x the {bench['reference']}'s step",
                             ok=figure <= bench["floor"]))
    return verdicts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools check-floors", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--impl", default="linrec")
    args = parser.parse_args(argv)
    bench = json.load(open(args.path))
    if not isinstance(bench, dict) or not ("kind" in bench or "rows" in bench and "copy_gbs" in bench):
        parser.error(f"{args.path} is not a file of python -m linrec.bench --json (plain, --host or --model)")
    if bench.get("kind") == "model":
        verdicts = check_model(bench)
        print(f"{bench['device']}, torch {bench['torch']}: linrec's training step against the floor")
    elif bench.get("kind") == "host":
        verdicts = check_host(bench)
        print(f"{bench['cpu']}, torch {bench['torch']}: linrec.linrec's host time against the floor")
    else:
        verdicts = check(bench, args.impl)
        print(f"{bench.get('device', '?')}, copy {bench['copy_gbs']:.0f} GB/s: {args.impl} against the floors")
    for v in verdicts:
        mark = "ok  " if v["ok"] else "MISS"
        pass_ = "fwd+bwd" if v["backward"] else "fwd"
        print(f"{mark} {v['case']:<22} {v['dtype']:<9} {pass_:<8} {v['figure']:.3f} vs {v['floor']:.3f} {v['what']}")
    missed = [v for v in verdicts if not v["ok"]]
    print(f"{len(verdicts) - len(missed)} of {len(verdicts)} floors met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
