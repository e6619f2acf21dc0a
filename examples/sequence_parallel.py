"""Train a small gated linear RNN with its sequence split across processes.

    torchrun --nproc-per-node 2 examples/sequence_parallel.py                 # 2 GPUs, NCCL
    torchrun --nproc-per-node 2 examples/sequence_parallel.py --device cpu    # 2 CPU processes, gloo

Every rank holds one contiguous piece of each sequence (its time steps), the parameters are
replicated, and `linrec.distributed.linrec` carries the recurrence's state across the pieces.
After each backward the parameter gradients are summed over the ranks, as the loss is the sum
of the ranks' losses. Rank 0 also trains the same model on the whole sequences in one process
and prints both losses: they agree to rounding.
"""

import argparse
import copy

import torch
import torch.distributed as dist
# torch.optim's first optimizer imports torch.distributed._shard, which then holds on to the
# process groups that exist (torch 2.14): destroy_process_group leaves gloo's threads running into
# the interpreter's exit, where one can abort it ("terminate called without an active exception").
# Imported here, before any group exists, it holds none.
try:
    import torch.distributed._shard  # noqa: F401
except ImportError:  # a torch without it
    pass

import linrec
import linrec.distributed


class GatedLinearRNN(torch.nn.Module):
    """h[t] = a[t] * h[t-1] + (1 - a[t]) * v[t], a = sigmoid(gate(x)), over dim 1 of (B, T, D)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gate = torch.nn.Linear(dim, dim)
        self.value = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x, scan):
        log_a = torch.nn.functional.logsigmoid(self.gate(x))
        values = (1 - log_a.exp()) * self.value(x)
        return self.out(scan(values, log_a, dim=1, log_coeffs=True))


def teacher_data(steps, batch, length, dim, seed=0):
    """Inputs and targets from a fixed random leaky average, which the model can learn exactly."""
    gen = torch.Generator().manual_seed(seed)
    decay = torch.rand(dim, generator=gen) * 0.2 + 0.75
    for _ in range(steps):
        x = torch.randn(batch, length, dim, generator=gen)
        yield x, linrec.linrec((1 - decay) * x, decay.expand_as(x), dim=1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024, help="time steps a sequence, all ranks together")
    parser.add_argument("--dim", type=int, default=32)
    return parser.parse_args(argv)


def train(args):
    """Train on an initialized process group; rank 0 returns (step, loss over the ranks, loss in one process)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, rank % torch.cuda.device_count()) if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    bounds = [args.length * r // world for r in range(world + 1)]  # this rank's time steps

    torch.manual_seed(0)
    model = GatedLinearRNN(args.dim).to(device)
    whole = copy.deepcopy(model) if rank == 0 else None  # the single-process run, for comparison
    optim = torch.optim.Adam(model.parameters(), lr=3e-2)
    whole_optim = torch.optim.Adam(whole.parameters(), lr=3e-2) if whole is not None else None
    losses = []
    for step, (x, target) in enumerate(teacher_data(args.steps, args.batch, args.length, args.dim)):
        x, target = x.to(device), target.to(device)
        piece = slice(bounds[rank], bounds[rank + 1])
        y = model(x[:, piece], linrec.distributed.linrec)
        loss = ((y - target[:, piece]) ** 2).sum() / target.numel()  # this rank's share of the mean
        optim.zero_grad()
        loss.backward()
        for p in model.parameters():  # the loss is the sum of the ranks' losses
            dist.all_reduce(p.grad)
        optim.step()
        dist.all_reduce(loss := loss.detach())
        if whole is not None:
            whole_loss = ((whole(x, linrec.linrec) - target) ** 2).mean()
            whole_optim.zero_grad()
            whole_loss.backward()
            whole_optim.step()
            losses.append((step, loss.item(), whole_loss.item()))
    return losses


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    for step, sharded, whole in train(args):
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss over {dist.get_world_size()} ranks {sharded:.6f}  in one process {whole:.6f}",
                  flush=True)
    dist.barrier()  # no rank closes its connections while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
