"""Train a small linear RNN on the adding problem, with linrec.linrec as its recurrence.

The adding problem (Hochreiter & Schmidhuber, 1997): each sequence step holds a random value in
[0, 1) and a marker; exactly two steps are marked, one in each half of the sequence, and the
target is the sum of the two marked values. The answer is known, so the loss says how well the
model does: predicting the mean (1.0) gives a mean squared error of 1/6, solving the task gives 0.

Two recurrent layers to choose from (--model):

- lru: the Linear Recurrent Unit (Orvieto et al., 2023), a complex diagonal recurrence with
  time-invariant decays, h[t] = lambda * h[t-1] + gamma * (B x[t]), y[t] = Re(C h[t]) + D x[t];
- hawk: the real gated recurrence of Hawk (De et al., 2024, "RG-LRU"), with decays that depend
  on the input, h[t] = a[t] * h[t-1] + sqrt(1 - a[t]^2) * (i[t] * x[t]).

Each is one linrec.linrec call over the time dim of a (batch, time, channels) tensor.

    python examples/train_lru.py                        # 400 steps: 1.5-3.5 minutes on a 2-core CPU
    python examples/train_lru.py --steps 150 --size 16  # seconds
    python examples/train_lru.py --model hawk --png loss.png

Nothing is downloaded: the data is generated as it trains.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import linrec

MEAN_BASELINE = 1 / 6  # the loss of always predicting 1.0, the mean target: Var(a + b) = 2 / 12


def adding_problem(batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (batch, length, 2): values and markers; targets (batch,): the sum of the marked values."""
    values = torch.rand(batch, length, generator=generator)
    half = length // 2
    first = torch.randint(0, half, (batch,), generator=generator)
    second = torch.randint(half, length, (batch,), generator=generator)
    markers = torch.zeros(batch, length)
    rows = torch.arange(batch)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    return torch.stack([values, markers], dim=-1), (values * markers).sum(1)


class LRU(nn.Module):
    """Linear Recurrent Unit: complex diagonal decays lambda = exp(-exp(nu) + i exp(theta))."""

    def __init__(self, width: int, states: int, r_min: float = 0.9, r_max: float = 0.999, max_phase: float = math.pi / 10):
        super().__init__()
        u1, u2 = torch.rand(states), torch.rand(states)
        # |lambda| uniform on the ring r_min <= |lambda| <= r_max, phase uniform in [0, max_phase].
        self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2)))
        self.theta_log = nn.Parameter(torch.log(max_phase * u2))
        self.B = nn.Parameter(torch.randn(states, width, dtype=torch.complex64) / math.sqrt(2 * width))
        self.C = nn.Parameter(torch.randn(width, states, dtype=torch.complex64) / math.sqrt(states))
        self.D = nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, time, width)
        modulus = torch.exp(-torch.exp(self.nu_log))
        decay = torch.polar(modulus, torch.exp(self.theta_log))  # (states,): the same every step
        gamma = torch.sqrt(1 - modulus**2)  # keeps the state's scale independent of the decay
        impulse = gamma * (x.to(torch.complex64) @ self.B.T)  # (batch, time, states), complex
        h = linrec.linrec(impulse, decay, dim=1)  # h[t] = decay * h[t-1] + impulse[t]
        return (h @ self.C.T).real + self.D * x


class Hawk(nn.Module):
    """Hawk's real-gated linear recurrent unit: decays a[t] = sigmoid(Lambda)^(8 r[t]), r[t] from x[t]."""

    def __init__(self, width: int, states: int, c: float = 8.0):
        super().__init__()
        self.c = c
        self.gates = nn.Linear(width, 2 * states)  # recurrence gate r, input gate i
        self.inp = nn.Linear(width, states)
        self.out = nn.Linear(states, width)
        # sigmoid(Lambda)^c uniform in [0.9, 0.999], as in the paper.
        a = torch.empty(states).uniform_(0.9, 0.999) ** (1 / c)
        self.Lambda = nn.Parameter(torch.log(a / (1 - a)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r, i = torch.sigmoid(self.gates(x)).chunk(2, dim=-1)
        log_a = self.c * r * nn.functional.logsigmoid(self.Lambda)  # log a[t] < 0: a decay
        a = torch.exp(log_a)
        impulse = torch.sqrt(-torch.expm1(2 * log_a)) * (i * self.inp(x))  # sqrt(1 - a^2) * (i * x)
        h = linrec.linrec(impulse, a, dim=1)  # input-dependent decays, one per step and state
        return self.out(h)


class Block(nn.Module):
    """Pre-norm residual block: a gated MLP (per step), then the recurrence (across steps)."""

    def __init__(self, mixer: nn.Module, width: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mixer = mixer
        self.up = nn.Linear(width, 4 * width)  # gated MLP: a product of two projections
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(self.norm1(x)).chunk(2, dim=-1)
        x = x + self.down(nn.functional.gelu(gate) * value)
        return x + self.mixer(self.norm2(x))


class Model(nn.Module):
    def __init__(self, kind: str, width: int, layers: int):
        super().__init__()
        mixer = {"lru": LRU, "hawk": Hawk}[kind]
        self.embed = nn.Linear(2, width)
        self.blocks = nn.Sequential(*[Block(mixer(width, width), width) for _ in range(layers)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x))[:, -1]).squeeze(-1)  # read out the last step


def train(model_kind: str = "lru", steps: int = 400, size: int = 32, length: int = 64, batch: int = 64,
          layers: int = 2, lr: float = 1e-2, seed: int = 0, device: str = "cpu") -> list[float]:
    """Train on freshly generated batches; returns the loss of every step."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Model(model_kind, size, layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Warm up over the first 10% of the steps, then anneal (at least 20 steps long, so that
    # a run of a few steps still has a schedule).
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=max(steps, 20), pct_start=0.1)
    losses = []
    for _ in range(steps):
        x, target = adding_problem(batch, length, generator)
        loss = nn.functional.mse_loss(model(x.to(device)), target.to(device))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def smoothed(losses: list[float], window: int) -> float:
    window = max(1, min(window, len(losses)))
    return sum(losses[-window:]) / window


def plot(losses: list[float], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.8, label="training loss (MSE)")
    ax.axhline(MEAN_BASELINE, color="gray", ls="--", lw=1, label="predicting the mean")
    ax.set(yscale="log", xlabel="step", ylabel="mean squared error", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("lru", "hawk"), default="lru", help="complex LRU or real Hawk recurrence")
    parser.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    parser.add_argument("--size", type=int, default=32, help="model width and state size (default 32)")
    parser.add_argument("--length", type=int, default=64, help="sequence length (default 64)")
    parser.add_argument("--batch", type=int, default=64, help="sequences a step (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="residual blocks (default 2)")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (default 1e-2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--png", metavar="PATH", help="write the loss curve to PATH (needs matplotlib)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    losses = train(args.model, args.steps, args.size, args.length, args.batch, args.layers, args.lr, args.seed,
                   args.device)
    seconds = time.perf_counter() - start
    window = max(1, args.steps // 10)
    first, last = sum(losses[:window]) / window, smoothed(losses, window)
    print(f"{args.model}: {args.steps} steps, width {args.size}, length {args.length}, {seconds:.1f} s")
    print(f"loss: first {first:.4f} -> last {last:.4f} (mean of {window} steps each; "
          f"predicting the mean gives {MEAN_BASELINE:.4f})")
    if args.png:
        plot(losses, args.png, f"adding problem, length {args.length}: {args.model} on linrec.linrec")
        print(f"loss curve: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
