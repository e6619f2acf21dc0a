"""Martin & Cundy's training-throughput grid: linrec's LS-LSTM and GILR against torch.nn.LSTM.

The paper (Martin & Cundy 2018, Figure 1) times training of an LSTM-256-256 and an LS-LSTM-256-256
over minibatch sizes 1..256 and sequence lengths 256..65536 (powers of two), where a minibatch of
b sequences of length T is b * T events, and reports events a second. This repeats it on one GPU:

- a full training step (forward, a mean-square loss, backward, Adam) of 2-layer models of 256
  units on 256 inputs, float32 (torch.nn.LSTM through cuDNN; linrec's LSLSTM and GILR);
- the grid's cells with b * T <= 131072 events, the paper's (it ran out of memory beyond);
- torch.nn.LSTM at length 256 only: its cost is serial in the steps, so its events a second do
  not depend on the length (as the paper found; `--lstm-lengths` measures more).

Times are eager medians of CUDA-event samples (a training loop's host work included).

    python -m tools throughput-grid [--json FILE] [--png FILE] [--max-events N] [--lstm-lengths ...]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from linrec._timing import eager_ms
from linrec.models import GILR, LSLSTM

BATCHES = [2 ** i for i in range(9)]            # 1 .. 256
LENGTHS = [2 ** i for i in range(8, 17)]        # 256 .. 65536
HIDDEN = 256
# The paper's LS-LSTM-256-256 and LSTM-256-256 (thousands of events a second), its Figure 1,
# for the table beside ours: {length: {batch: value}}, and the LSTM's row by batch.
PAPER_LSLSTM = {
    256: [13.1, 28.1, 47.9, 66.7, 87.3, 101, 111, 116, 117], 512: [24.1, 48.3, 69.8, 82, 105, 114, 117, 118, 118],
    1024: [39, 65.3, 87.6, 100, 112, 115, 117, 116], 2048: [57, 90, 106, 117, 120, 121, 121],
    4096: [78.9, 107, 118, 123, 125, 123], 8192: [104, 120, 125, 126, 126], 16384: [119, 126, 129, 127],
    32768: [126, 129, 129], 65536: [129, 130],
}
PAPER_LSTM = [0.74, 1.41, 2.64, 5.6, 10.7, 21.5, 39.7, 69.1, 99.8]


def make_model(name: str) -> torch.nn.Module:
    if name == "torch.nn.LSTM":
        return torch.nn.LSTM(HIDDEN, HIDDEN, num_layers=2, device="cuda")
    layer = {"linrec LSLSTM": LSLSTM, "linrec GILR": GILR}[name]
    return layer(HIDDEN, HIDDEN, num_layers=2, device="cuda")


def step_ms(name: str, batch: int, length: int, reps: int) -> float:
    """Median time of one training step of model `name` on a (length, batch, HIDDEN) input."""
    model = make_model(name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(length, batch, HIDDEN, device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x)[0].square().mean().backward()
        optimizer.step()

    return eager_ms(step, reps=reps, inner=1, warmup=2)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = ["linrec LSLSTM", "linrec GILR"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5), constrained_layout=True)
    lstm = {r["batch"]: r["events_per_s"] for r in rows if r["model"] == "torch.nn.LSTM"}
    for ax, model in zip(axes, models):
        grid = torch.full((len(LENGTHS), len(BATCHES)), float("nan"))
        for r in rows:
            if r["model"] == model:
                grid[LENGTHS.index(r["length"]), BATCHES.index(r["batch"])] = r["events_per_s"] / lstm[r["batch"]]
        image = ax.imshow(grid.log10().numpy(), cmap="viridis", origin="lower", aspect="auto")
        for i in range(len(LENGTHS)):
            for j in range(len(BATCHES)):
                if not torch.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j].item():.3g}" if grid[i, j] < 1000 else f"{grid[i, j].item():.0f}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(BATCHES)), BATCHES)
        ax.set_yticks(range(len(LENGTHS)), LENGTHS)
        ax.set_xlabel("batch size")
        ax.set_ylabel("sequence length")
        ax.set_title(f"{model}, 2 x 256: training throughput / torch.nn.LSTM's")
        fig.colorbar(image, ax=ax, label="log10 of the ratio")
    fig.suptitle(f"{torch.cuda.get_device_name()}: a training step (forward, backward, Adam), float32")
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools throughput-grid", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--png", help="draw the ratio heatmaps to this file (needs matplotlib)")
    parser.add_argument("--max-events", type=int, default=131072, help="largest batch * length timed")
    parser.add_argument("--lstm-lengths", type=int, nargs="+", default=[256],
                        help="lengths at which torch.nn.LSTM is timed (its rate is the first one's)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m tools throughput-grid: needs a CUDA device", file=sys.stderr)
        return 1
    torch.backends.cudnn.benchmark = True
    rows = []

    def add(model, batch, length):
        ms = step_ms(model, batch, length, args.reps)
        rows.append(dict(model=model, batch=batch, length=length, step_ms=ms, events_per_s=batch * length / ms * 1e3))
        print(f"{model:<16} batch {batch:>3}  length {length:>5}  {ms:9.3f} ms  "
              f"{rows[-1]['events_per_s'] / 1e3:9.1f} k events/s", flush=True)

    for length in args.lstm_lengths:
        for batch in BATCHES:
            add("torch.nn.LSTM", batch, length)
    for model in ("linrec LSLSTM", "linrec GILR"):
        for length in LENGTHS:
            for batch in BATCHES:
                if batch * length <= args.max_events:
                    add(model, batch, length)
    # The LSTM's rate per batch: at the first length timed.
    first = args.lstm_lengths[0]
    rows = [r for r in rows if r["model"] != "torch.nn.LSTM" or r["length"] == first] + \
           [dict(r, model="torch.nn.LSTM (other length)") for r in rows
            if r["model"] == "torch.nn.LSTM" and r["length"] != first]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, hidden=HIDDEN, layers=2,
                  rows=rows, paper=dict(lslstm_k_events_per_s=PAPER_LSLSTM, lstm_k_events_per_s=PAPER_LSTM))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.png:
        plot(rows, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
