"""Sequence parallelism: one long sequence sharded along its length over the ranks of a group.

Each rank holds one contiguous shard of the sequence along `dim`, in rank order (the scan
runs from the last rank's end with reverse=True); shards may differ in length, and a shard
may be empty. A shard maps the state entering it to the state leaving it affinely:

    leaving = A * entering + B,   A = prod(c over the shard),   B = the shard's scan from 0

so the exchange is one all_gather of (A, B), two tensors of the state's shape a rank. Each
rank folds the pairs of the ranks before it (from `initial`) into its entering state and
scans its shard from there with the local kernels. The backward is the same recurrence run
the other way: the gradient entering a shard from its end is folded from the later ranks'
(conj(A), B') pairs, where B' is the shard's outgoing gradient with none entering, and a
second local pass scans from it.

Cost a call, each rank, in tensor passes (a local scan forward is 3, its fused backward 5):
forward a scan from zero for B and the product for A (4), then the scan from the entering
state (3); backward the gradient leaving the shard (conj(c) * d_outputs and a scan of it, 6),
the incoming gradient added at the shard's end (a copy of d_outputs, 2) and the fused
backward (5). The exchanges move O(world * state) elements. A pass that gives (A, B) in one
read of inputs and coeffs would move 2 instead of 4; in Triton it measured slower than the
scan it replaces (docs/design/0022-sequence-parallel-scan.md).

selective_scan is the same for Mamba's scan, whose state is (batch, dim, N): a shard's map
has A = exp(A_d,n * sum of its dt) and B = its last state from zero. The exchange is an
autograd function of (A, B) of every rank, so the gradients of a later rank's entering state
reach the earlier ranks' shards through their own local scans.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._args import normalize
from ._autograd import exp_of_log
from ._dispatch import scan_normalized

_DTYPE_CODES = {dtype: code for code, dtype in enumerate(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128))}
_MAX_DIMS = 8  # the shape check's fixed width


def linrec(inputs, coeffs, reverse=False, *, dim=-1, initial=None, log_coeffs=False, group=None):
    """linrec.linrec over a sequence sharded along `dim` across the ranks of `group`.

    Args:
        inputs, coeffs, reverse, dim, log_coeffs: as linrec.linrec, for this rank's shard; every
            rank passes tensors of the same dtype and the same shape but for `dim`.
        initial: the state before the sequence's first step (rank 0's first; the last rank's
            last with reverse), passed on every rank. Its gradient is the gradient of the sum of
            all ranks' losses, the same on every rank (as DistributedDataParallel expects of a
            replicated tensor).
        group: a torch.distributed process group (None: the default group), or a one-dimensional
            DeviceMesh.

    Returns:
        This rank's shard of the outputs, differentiable in inputs, coeffs and initial (first
        order). NCCL needs CUDA tensors; gloo takes CPU tensors.

    Raises:
        ValueError, on every rank: shapes or dtypes that differ across ranks, or the arguments
        linrec.linrec refuses.
    """
    group = _process_group(group)

    def check():
        if log_coeffs is not True and log_coeffs is not False:
            raise ValueError(f"linrec: log_coeffs must be a bool, got {log_coeffs!r}")
        args = normalize(inputs, coeffs, initial, dim, reverse, complex_ok=True)
        return args, _shape_meta(*args, bool(reverse), group)

    inputs, coeffs, initial, dim = _checked_on_every_rank(check, inputs, group, _LINREC_FIELDS)
    if log_coeffs:
        coeffs = exp_of_log(coeffs)
    return _ShardedScan.apply(inputs, coeffs, initial, dim, bool(reverse), group)


def _process_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("linrec.distributed: torch.distributed is not initialized (init_process_group)")
    if group is not None and hasattr(group, "get_group"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError("linrec.distributed: group must be a one-dimensional DeviceMesh (take a mesh "
                             "dimension: mesh['seq'])")
        return group.get_group()
    return group


def _meta_device(group, like) -> torch.device:
    """Where the argument checks' all_gather runs: for NCCL, `like`'s GPU where it is a CUDA tensor
    (as the exchange that follows), else the current one; the CPU for other backends."""
    if dist.get_backend(group) != "nccl":
        return torch.device("cpu")
    return like.device if isinstance(like, torch.Tensor) and like.is_cuda else \
        torch.device("cuda", torch.cuda.current_device())


def _gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


_REFUSED = -7  # a rank's row of the argument check when its own checks raised (real rows hold >= -2)
# What each integer of the argument checks' rows is, in order.
_LINREC_FIELDS = ("dimensions", "dim", "inputs dtype", "coeffs dtype", "initial given", "reverse",
                  *(f"size of dim {d} (all but dim must match)" for d in range(_MAX_DIMS)))
_SELECTIVE_FIELDS = ("batch", "channels", "u dtype", "A's channels", "states (A's columns)", "B per step",
                     "C per step", "initial_state given", "reverse", "delta_softplus", "delta_bias given")
_DTYPE_NAMES = {code: str(dtype) for dtype, code in _DTYPE_CODES.items()}
_SIZE_WORDS = {-1: "the sharded dim", -2: "none"}


def _describe(field: str, value: int) -> str:
    if field.endswith("dtype"):
        return _DTYPE_NAMES[value]
    if field.startswith("size of dim"):
        return _SIZE_WORDS.get(value, str(value))
    return str(value)


def _checked_on_every_rank(check, like, group, fields: tuple[str, ...]):
    """check() -> (result, meta): this rank's own checks of its arguments, and one integer a field
    of `fields` that every rank must agree on. One all_gather of each rank's meta (on `like`'s
    device, see _meta_device): a rank whose checks raised sends a refusal and raises its own
    error, and every other rank raises one naming it, so that no rank waits in a later collective
    for a rank that gave up; ranks whose meta differ raise the same error, naming the first field
    that differs. Returns the result."""
    device = _meta_device(group, like)
    try:
        result, meta = check()
    except Exception:  # whatever stops this rank must reach the others
        _gather(torch.full((len(fields),), _REFUSED, dtype=torch.int64, device=device), group)
        raise
    mine = torch.tensor(meta, dtype=torch.int64, device=device)
    everyone = torch.stack(_gather(mine, group))
    if bool(everyone.eq(mine).all()):  # one wait on the device, not one a rank
        return result
    refused = [rank for rank, row in enumerate(everyone.tolist()) if row[0] == _REFUSED]
    if refused:
        who = f"rank {refused[0]} refused its" if len(refused) == 1 else \
            f"ranks {', '.join(map(str, refused))} refused their"
        raise ValueError(f"linrec.distributed: {who} arguments (see the error there)")
    rows = everyone.tolist()
    field = next(i for i in range(len(fields)) if len({row[i] for row in rows}) > 1)
    values = ", ".join(f"rank {rank}: {_describe(fields[field], row[field])}" for rank, row in enumerate(rows))
    raise ValueError(f"linrec.distributed: the ranks' arguments differ in {fields[field]} ({values})")


def _shape_meta(inputs, coeffs, initial, dim, reverse, group) -> list[int]:
    """What every rank must agree on: dimensions, dim, dtypes, initial, reverse and the shape but
    for dim (fixed width)."""
    if dist.get_backend(group) == "nccl" and not inputs.is_cuda:
        raise ValueError("linrec.distributed: a NCCL group takes CUDA tensors; use gloo for CPU tensors")
    if inputs.dim() > _MAX_DIMS:
        raise ValueError(f"linrec.distributed: inputs has {inputs.dim()} dimensions; at most {_MAX_DIMS}")
    shape = [s if d != dim else -1 for d, s in enumerate(inputs.shape)] + [-2] * (_MAX_DIMS - inputs.dim())
    return [inputs.dim(), dim, _DTYPE_CODES[inputs.dtype], _DTYPE_CODES[coeffs.dtype], int(initial is not None),
            int(reverse), *shape]


def _leaving(inputs, coeffs, dim, reverse, exchange):
    """The state leaving this shard with none entering: its scan from zero at its last step."""
    last = 0 if reverse else inputs.shape[dim] - 1
    return scan_normalized(inputs, coeffs, None, dim, reverse).select(dim, last).to(exchange)


def _fold(pairs, start):
    """start through the affine maps state -> a * state + b of `pairs`, in order."""
    state = start
    for a, b in pairs:
        state = a * state + b
    return state


def _ranks_in_scan_order(group, reverse):
    ranks = list(range(dist.get_world_size(group)))
    return ranks[::-1] if reverse else ranks


class _ShardedScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, coeffs, initial, dim, reverse, group):
        state_shape = inputs.shape[:dim] + inputs.shape[dim + 1:]
        exchange = torch.promote_types(coeffs.dtype, torch.float32)  # 16-bit states travel in float32
        length = inputs.shape[dim]
        if length:
            leaving = _leaving(inputs, coeffs, dim, reverse, exchange)
            product = coeffs.prod(dim, dtype=exchange)  # accumulated in the exchange dtype, no widened copy
        else:
            leaving = torch.zeros(state_shape, dtype=exchange, device=inputs.device)
            product = torch.ones(state_shape, dtype=exchange, device=inputs.device)
        pairs = _gather(torch.stack([product, leaving]), group)
        order = _ranks_in_scan_order(group, reverse)
        me = order.index(dist.get_rank(group))
        start = initial.to(exchange) if initial is not None else torch.zeros_like(leaving)
        entering = _fold([(p[0], p[1]) for p in (pairs[r] for r in order[:me])], start)
        # The local scan keeps its own graph: its backward is linrec's fused one, on any backend.
        with torch.enable_grad():
            local_inputs, local_coeffs, local_entering = (
                t.detach().requires_grad_() for t in (inputs, coeffs, entering.to(inputs.dtype)))
            outputs = scan_normalized(local_inputs, local_coeffs, local_entering, dim, reverse)
        ctx.local = (local_inputs, local_coeffs, outputs)
        ctx.products = [pairs[r][0] for r in order]  # in scan order
        ctx.order, ctx.me, ctx.dim, ctx.reverse, ctx.group = order, me, dim, reverse, group
        ctx.has_initial, ctx.exchange, ctx.state = initial is not None, exchange, (state_shape, inputs.dtype)
        return outputs.detach()

    @staticmethod
    def backward(ctx, d_outputs):
        local_inputs, local_coeffs, outputs = ctx.local
        dim, reverse, group, me = ctx.dim, ctx.reverse, ctx.group, ctx.me
        length = outputs.shape[dim]
        state_shape, initial_dtype = ctx.state
        if length:
            # The backward scan run the other way, over conj(c) * d_outputs: the gradient leaving the
            # shard at its start, sum of d_outputs[l] * conj(c[first..l]).
            conj_coeffs = local_coeffs.detach().conj()
            outgoing = _leaving(conj_coeffs * d_outputs, conj_coeffs, dim, not reverse, ctx.exchange)
        else:
            outgoing = torch.zeros(state_shape, dtype=ctx.exchange, device=outputs.device)
        gathered = _gather(outgoing, group)
        later = [(a.conj(), gathered[r]) for a, r in zip(ctx.products, ctx.order)]  # in scan order
        # The gradient entering this shard from its end: the later ranks' maps, from the sequence's end.
        incoming = _fold(reversed(later[me + 1:]), torch.zeros_like(outgoing))
        d_initial = _fold(reversed(later), torch.zeros_like(outgoing)).to(initial_dtype) if ctx.has_initial else None
        if not length:
            return torch.zeros_like(local_inputs), torch.zeros_like(local_coeffs), d_initial, None, None, None
        # The incoming gradient adds to the last step's (in scan order): the recurrence is linear in it.
        last = 0 if reverse else length - 1
        grad = d_outputs.clone()
        grad.select(dim, last).add_(incoming.to(grad.dtype))
        d_inputs, d_coeffs = torch.autograd.grad(outputs, (local_inputs, local_coeffs), grad)
        return d_inputs, d_coeffs, d_initial, None, None, None


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, *, initial_state=None, reverse=False, group=None):
    """linrec.selective_scan over a sequence sharded along its length (the last dim) across the
    ranks of `group`, in rank order (from the last rank's end with reverse).

    Args:
        u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse: as linrec.selective_scan, for
            this rank's shard (per-step B and C and z sharded like u); every rank passes the same
            dtypes and shapes but for the length, which may differ, or be 0.
        initial_state: the state before the sequence's first step, passed on every rank; its
            gradient is that of all ranks' losses, the same on every rank.
        return_last_state: also return the state leaving this rank's shard (on the rank that
            ends the sequence, its last state).
        group: a torch.distributed process group (None: the default group), or a one-dimensional
            DeviceMesh.

    Returns:
        This rank's shard of y (and the state leaving it), differentiable in every tensor argument.
        The gradients of the tensors every rank holds whole (A, D, delta_bias, per-channel B and C)
        are this shard's share: sum them over the group, as for any parameter the shards share.

    Raises:
        ValueError, on every rank: shapes, dtypes or options that differ across ranks, or the
        arguments linrec.selective_scan refuses.
    """
    from ._selective import _check_shape, _check_tensor, selective_scan as local_scan

    group = _process_group(group)

    def check():
        """This shard's own checks, and the scan from zero: its map of the entering state is
        leaving = decay * entering + from_zero."""
        if not isinstance(u, torch.Tensor) or u.dim() != 3:
            raise ValueError("linrec.distributed: u must be a (batch, dim, length) tensor")
        if dist.get_backend(group) == "nccl" and not u.is_cuda:
            raise ValueError("linrec.distributed: a NCCL group takes CUDA tensors; use gloo for CPU tensors")
        # What only the later, local scan reads, checked now: a rank that raised there would leave
        # the others waiting in the backward's exchange.
        _check_tensor("A", A, u.device)
        batch, channels, states = *u.shape[:2], A.shape[-1]
        for name, t, shape in (("D", D, (channels,)), ("z", z, u.shape),
                               ("initial_state", initial_state, (batch, channels, states))):
            _check_tensor(name, t, u.device, required=False)
            _check_shape(name, t, shape, "{0}")
        _, last = local_scan(u, delta, A, B, C, None, None, delta_bias, delta_softplus, True, reverse=reverse)
        per_step = [int(t.dim() > 2) for t in (B, C)]
        return last, [*u.shape[:2], _DTYPE_CODES[u.dtype], *A.shape, *per_step, int(initial_state is not None),
                      int(bool(reverse)), int(bool(delta_softplus)), int(delta_bias is not None)]

    from_zero = _checked_on_every_rank(check, u, group, _SELECTIVE_FIELDS)
    dt = delta.to(from_zero.dtype)
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype).unsqueeze(-1)
    if delta_softplus:
        dt = torch.nn.functional.softplus(dt)
    decay = torch.exp(A.to(dt.dtype) * dt.sum(-1, keepdim=True))
    start = torch.zeros_like(from_zero) if initial_state is None else initial_state.to(from_zero.dtype)
    entering = _ExchangeStates.apply(decay, from_zero, start, bool(reverse), group)
    return local_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                      initial_state=entering, reverse=reverse)


class _ExchangeStates(torch.autograd.Function):
    """The state entering this rank's shard, from every rank's (decay, from_zero) map and the
    sequence's start. Backward: with g_k the gradient of rank k's entering state s_k (in scan
    order), the total gradient of s_k is G_k = g_k + decay_k * G_(k+1); a rank's from_zero gets
    G of the state after it, its decay that times its own entering state, and the start G_0."""

    @staticmethod
    def forward(ctx, decay, from_zero, start, reverse, group):
        maps = _gather(torch.stack([decay, from_zero]), group)
        order = _ranks_in_scan_order(group, reverse)
        states = [start]  # states[k]: entering the k-th shard in scan order
        for rank in order:
            states.append(maps[rank][0] * states[-1] + maps[rank][1])
        me = order.index(dist.get_rank(group))
        ctx.decays = [maps[rank][0] for rank in order]
        ctx.entering, ctx.me, ctx.order, ctx.group = states[me], me, order, group
        return states[me].clone()

    @staticmethod
    def backward(ctx, grad):
        gathered = _gather(grad, ctx.group)
        total = torch.zeros_like(grad)  # G of the state after the last shard: nothing reads it
        after_me = None
        for k in reversed(range(len(ctx.order))):
            if k == ctx.me:
                after_me = total
            total = gathered[ctx.order[k]] + ctx.decays[k] * total
        return after_me * ctx.entering, after_me, total, None, None


__all__ = ["linrec", "selective_scan"]
