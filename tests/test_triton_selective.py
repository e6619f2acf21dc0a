"""The Triton fused selective scan against a float64 reference loop written here. Without a GPU
the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py) on small CPU
tensors, which runs a scan element by element: the cases are few and small, and chosen to cross
the kernels' chunk edges and the 128-step checkpoint spans. Every result the functions allocate
uninitialised comes filled with NaN, so an element a kernel leaves unwritten fails the check."""

import math
import os
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from reference import rel_error

triton = pytest.importorskip("triton")
selective = pytest.importorskip("linrec.impl.triton_selective")
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2}
CHECKPOINT_STEPS = 128
GRAD_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")


@pytest.fixture(autouse=True)
def _nan_outputs(monkeypatch):
    monkeypatch.setattr(selective, "_new_output",
                        lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype, device=device))


def reference(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, reverse, cuts=None):
    """y, the last state and the states entering steps 0, 128, ... in scan order: a float64 loop
    over the steps, differentiable by autograd (initial_state is a tensor, zeros for none). cuts:
    positions where the decay is 0 (packed sequences: a segment begins there in scan order)."""
    batch, dim, L = u.shape
    N = A.shape[1]
    dt = delta + (delta_bias[:, None] if delta_bias is not None else 0.0)
    if delta_softplus:
        dt = F.softplus(dt)

    def per_channel_step(M):  # (batch, dim, N, L)
        if M.dim() == 2:
            return M[None, :, :, None].expand(batch, dim, N, L)
        return M.repeat_interleave(dim // M.shape[1], dim=1)

    B_steps, C_steps = per_channel_step(B), per_channel_step(C)
    state, entering, ys = initial_state, [], [None] * L
    for t in range(L):
        l = L - 1 - t if reverse else t
        entering.append(state)
        decay = torch.zeros_like(A) if cuts is not None and l in cuts else torch.exp(dt[:, :, l, None] * A)
        state = decay * state + (dt[:, :, l] * u[:, :, l])[..., None] * B_steps[..., l]
        ys[l] = (C_steps[..., l] * state).sum(-1)
    y = torch.stack(ys, -1) if L else torch.zeros_like(u)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    checkpoints = (torch.stack(entering[::CHECKPOINT_STEPS], 2) if L
                   else initial_state.new_zeros(batch, dim, 0, N))
    return y, state, checkpoints


@dataclass
class Case:
    batch: int = 2
    dim: int = 3
    states: int = 5
    length: int = 130
    reverse: bool = False
    dtype: torch.dtype = torch.float64
    B: str | int = 1        # "channel": (dim, N); an int: per step, that many groups
    C: str | int = 1
    bc_float32: bool = False  # per-step B in float32 beside 16-bit u
    z: bool = True
    D: bool = True
    delta_bias: bool = True
    softplus: bool = True
    initial_state: bool = True
    d_last_state: bool = True
    views: bool = False     # u, delta, z, d_y, B, C as non-contiguous views
    cuts: tuple = ()        # packed sequences: the positions where the decay is 0 (no initial state)


def make_inputs(case: Case):
    """The arguments of selective_scan_fwd, in the case's storage, and d_y, d_last_state."""
    batch, dim, N, L, dtype = case.batch, case.dim, case.states, case.length, case.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def values(scale=1.0, shift=0.0):
        if case.views:  # (batch, L, dim) transposed, and every other step of twice as many
            return (torch.randn(batch, 2 * L, dim, device=DEVICE) * scale + shift).to(dtype).transpose(1, 2)[..., ::2]
        return (torch.randn(batch, dim, L, device=DEVICE) * scale + shift).to(dtype)

    def bc(kind, storage):
        if kind == "channel":
            return torch.randn(dim, N, device=DEVICE).to(acc)
        if case.views:
            return torch.randn(batch, L, kind, N, device=DEVICE).to(storage).permute(0, 2, 3, 1)
        return torch.randn(batch, kind, N, L, device=DEVICE).to(storage)

    u = values()
    # Step sizes around 0.3 to 1 (softplus), or positive without softplus: the states stay bounded.
    delta = values(0.5, -0.5) if case.softplus else (torch.rand(batch, dim, L, device=DEVICE) * 0.9 + 0.1).to(dtype)
    A = -(torch.rand(dim, N, device=DEVICE) * 2 + 0.1).to(acc)
    B = bc(case.B, acc if case.bc_float32 else dtype)
    C = bc(case.C, dtype)
    D = torch.randn(dim, device=DEVICE).to(acc) if case.D else None
    z = values() if case.z else None
    delta_bias = (torch.randn(dim, device=DEVICE) * 0.2).to(acc) if case.delta_bias else None
    initial_state = torch.randn(batch, dim, N, device=DEVICE).to(acc) if case.initial_state else None
    d_y = values()
    d_last_state = torch.randn(batch, dim, N, device=DEVICE).to(acc) if case.d_last_state else None
    return (u, delta, A, B, C, D, z, delta_bias, initial_state), d_y, d_last_state


def check(case: Case, checkpoints_from_reference: bool = False):
    args, d_y, d_last_state = make_inputs(case)
    u, delta, A, B, C, D, z, delta_bias, initial_state = args
    batch, dim, N, L = case.batch, case.dim, case.states, case.length
    acc = torch.float64 if case.dtype == torch.float64 else torch.float32
    tol = TOL[case.dtype]

    cuts = None
    if case.cuts:
        cuts = torch.zeros(L, dtype=torch.bool, device=DEVICE)
        cuts[list(case.cuts)] = True
    y, last_state, checkpoints = selective.selective_scan_fwd(*args, case.softplus, int(case.reverse), cuts)

    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in args]
    if leaves[8] is None:  # the gradient of the state entering the scan is returned all the same
        leaves[8] = torch.zeros(batch, dim, N, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y_ref, last_ref, checkpoints_ref = reference(*leaves, case.softplus, case.reverse, set(case.cuts) or None)

    assert y.shape == (batch, dim, L) and y.dtype == case.dtype and y.is_contiguous()
    assert last_state.shape == (batch, dim, N) and last_state.dtype == acc
    assert checkpoints.shape == (batch, dim, math.ceil(L / CHECKPOINT_STEPS), N) and checkpoints.dtype == acc
    assert rel_error(y, y_ref) < tol, "y"
    assert rel_error(last_state, last_ref) < tol, "last_state"
    assert rel_error(checkpoints, checkpoints_ref) < tol, "checkpoints"

    if checkpoints_from_reference:  # the checkpoint contract: a backward works from any forward's
        checkpoints = checkpoints_ref.detach().to(acc)
    grads = selective.selective_scan_bwd(d_y, d_last_state, *args, checkpoints, case.softplus, int(case.reverse),
                                         cuts)

    outputs, d_outputs = [y_ref], [d_y.double()]
    if d_last_state is not None:
        outputs.append(last_ref)
        d_outputs.append(d_last_state.double())
    outputs, d_outputs = zip(*[(o, d) for o, d in zip(outputs, d_outputs) if o.requires_grad])
    wanted = [t for t in leaves if t is not None]
    ref_grads = iter(torch.autograd.grad(outputs, wanted, d_outputs, allow_unused=True))
    assert len(grads) == len(GRAD_NAMES)
    for name, arg, leaf, grad in zip(GRAD_NAMES, args, leaves, grads):
        if leaf is None:  # absent D, z or delta_bias
            assert grad.numel() == 0, name
            continue
        ref = next(ref_grads)
        if ref is None:  # L = 0: nothing reached this input
            ref = torch.zeros_like(leaf)
        if name in ("u", "delta", "z"):
            assert grad.dtype == case.dtype and grad.is_contiguous(), name
        else:
            assert grad.dtype == acc and grad.is_contiguous(), name
        assert grad.shape == (arg.shape if arg is not None else (batch, dim, N)), name
        assert rel_error(grad, ref) < tol, name


CASES = {
    "L1-grouped-B": Case(dim=4, length=1, B=2, C="channel"),
    "L7-plain-reverse": Case(states=1, length=7, reverse=True, B="channel", C="channel", z=False, D=False,
                             delta_bias=False, softplus=False, initial_state=False, d_last_state=False),
    "L130-N16-reverse-views": Case(batch=1, dim=4, states=16, reverse=True, B=2, C=1, views=True),
    "L300-views": Case(length=300, D=False, initial_state=False, views=True),
    "L300-N1-reverse": Case(states=1, length=300, reverse=True, C="channel", z=False, delta_bias=False,
                            softplus=False, d_last_state=False),
    "L0": Case(length=0, B=1, C="channel"),
    "float32": Case(dtype=torch.float32, reverse=True, B="channel"),
    "bfloat16": Case(dim=4, dtype=torch.bfloat16, reverse=True, B=2, bc_float32=True, C=1),
    # Cuts at the first step, next to each other, at chunk edges and across the checkpoint.
    "L150-cuts": Case(dim=4, length=150, B=2, C="channel", initial_state=False, cuts=(0, 1, 2, 15, 16, 127, 128, 140)),
    "L150-cuts-reverse": Case(dim=4, length=150, reverse=True, B=1, C=2, initial_state=False,
                              cuts=(0, 3, 16, 128, 149)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    check(CASES[name])


# -- A state a segment (cu_seqlens): each segment from its own initial state, its own last state

def segment_reference(leaves, bounds, softplus, reverse):
    """y and the last states (batch, dim, segments, N) from the reference loop over each segment
    alone, from initial[:, :, k]."""
    u, delta, A, B, C, D, z, delta_bias, initial = leaves
    ys, lasts = [], []
    for k, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        def steps(t):
            return t if t is None or t.dim() == 2 else t[..., start:end]
        y, last, _ = reference(steps(u), steps(delta), A, steps(B), steps(C), D, steps(z), delta_bias,
                               initial[:, :, k], softplus, reverse)
        ys.append(y)
        lasts.append(last)
    return torch.cat(ys, -1), torch.stack(lasts, 2)


SEGMENT_CASES = {
    # Empty and one-step segments, ends at the 16-step chunk edges and across the checkpoint span.
    "L150": (Case(dim=4, length=150, B=2, C="channel"), (0, 0, 1, 16, 17, 127, 129, 129, 150)),
    "L150-reverse-no-initial": (Case(dim=4, length=150, reverse=True, B=1, C=2, initial_state=False),
                                (0, 3, 16, 33, 128, 150)),
    "L40-no-d-last": (Case(batch=1, dim=2, states=3, length=40, reverse=True, d_last_state=False), (0, 20, 40)),
}


@pytest.mark.parametrize("name", list(SEGMENT_CASES))
def test_segments_match_reference(name):
    """selective_scan_fwd / _bwd with cu_seqlens, against the reference loop over each segment alone:
    y, the last states and every gradient, a segment's initial state's included."""
    case, bounds = SEGMENT_CASES[name]
    args, d_y, _ = make_inputs(case)
    u, delta, A, B, C, D, z, delta_bias, _ = args
    batch, dim, N, L, segments = case.batch, case.dim, case.states, case.length, len(bounds) - 1
    acc = torch.float64 if case.dtype == torch.float64 else torch.float32
    initial = torch.randn(batch, dim, segments, N, device=DEVICE).to(acc) if case.initial_state else None
    d_last = torch.randn(batch, dim, segments, N, device=DEVICE).to(acc) if case.d_last_state else None
    args = (*args[:8], initial)
    cu = torch.tensor(bounds, device=DEVICE)
    from linrec._segments import cut_flags
    cuts = cut_flags(cu, L, case.reverse, DEVICE)
    y, last, checkpoints = selective.selective_scan_fwd(*args, case.softplus, int(case.reverse), cuts, cu)
    grads = selective.selective_scan_bwd(d_y, d_last, *args, checkpoints, case.softplus, int(case.reverse), cuts, cu)

    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in args]
    if leaves[8] is None:
        leaves[8] = torch.zeros(batch, dim, segments, N, dtype=torch.float64, device=DEVICE)
    y_ref, last_ref = segment_reference(leaves, bounds, case.softplus, case.reverse)
    assert last.shape == (batch, dim, segments, N)
    assert rel_error(y, y_ref) < TOL[case.dtype], "y"
    assert rel_error(last, last_ref) < TOL[case.dtype], "last_state"
    loss = (y_ref * d_y.double()).sum() + ((last_ref * d_last.double()).sum() if d_last is not None else 0)
    wanted = [(name, leaf, grad) for name, leaf, grad in zip(GRAD_NAMES, leaves, grads) if leaf is not None
              and leaf.requires_grad]
    refs = torch.autograd.grad(loss, [leaf for _, leaf, _ in wanted])
    for (name, _, grad), ref in zip(wanted, refs):
        assert rel_error(grad, ref) < TOL[case.dtype], name


def test_selective_scans_route_to_triton():
    """What linrec.selective_scan calls on CUDA tensors that take Triton (_selective_ops.TRITON): its
    autograd.Function's output and gradients against the reference loop; under torch.func.grad, an
    error that says the transforms need the compiled kernels."""
    from linrec._selective_ops import TRITON

    args, d_y, d_last = make_inputs(Case(batch=1, dim=2, states=3, length=40, B=1, C="channel"))
    config = (True, 0, None, None)  # delta_softplus, reverse, cuts, cu_seqlens
    leaves = [t.detach().requires_grad_() if t is not None else None for t in args]
    y, last, _ = TRITON.function.apply(*leaves, config)
    grads = torch.autograd.grad((y * d_y).sum() + (last * d_last).sum(), [t for t in leaves if t is not None])
    ref_leaves = [t.detach().double().requires_grad_() if t is not None else None for t in args]
    y_ref, last_ref, _ = reference(*ref_leaves, True, False)
    ref_grads = torch.autograd.grad((y_ref * d_y.double()).sum() + (last_ref * d_last.double()).sum(),
                                    [t for t in ref_leaves if t is not None])
    assert rel_error(y, y_ref) < TOL[torch.float64] and rel_error(last, last_ref) < TOL[torch.float64]
    for name, grad, ref in zip([n for n, t in zip(GRAD_NAMES, args) if t is not None], grads, ref_grads):
        assert rel_error(grad, ref) < TOL[torch.float64], name

    def loss_of_u(u):
        y, last, _ = TRITON.transformable.apply(u, *args[1:], config)
        return (y * d_y).sum() + (last * d_last).sum()

    with pytest.raises(RuntimeError, match="torch.func transforms .* run on the compiled kernels"):
        torch.func.grad(loss_of_u)(args[0])


def test_backward_from_reference_checkpoints():
    check(Case(batch=1, dim=2, states=2, length=300, reverse=True), checkpoints_from_reference=True)


def test_gpu_tile_shapes(monkeypatch):
    """The tiles the kernels get on a GPU (here [4, 4, 128]: one chunk a checkpoint span, no
    rescan), which the interpreter's small tiles leave untested."""
    monkeypatch.setattr(selective, "SMALL_TILES", False)
    assert selective._tile_config(4, 4)[:2] == (4, 128)
    check(Case(batch=1, dim=4, states=3, length=130, reverse=True, B=1, C=1))


COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from linrec.impl import triton_selective as impl
VALUE_POINTERS = {"u_ptr", "delta_ptr", "z_ptr", "y_ptr", "d_y_ptr", "d_u_ptr", "d_delta_ptr", "d_z_ptr"}
FLAGS = {"HAS_Z", "HAS_D", "HAS_BIAS", "HAS_INITIAL", "HAS_D_LAST", "HAS_CUTS", "SEGMENTS", "ENTERING",
         "B_PER_STEP", "C_PER_STEP", "SOFTPLUS", "REVERSE"}
SIZES = {"BLOCK_D": 4, "N_PAD": 16, "CHUNK": 32, "CHECKPOINT": impl.CHECKPOINT_STEPS}
for kernel in ("_selective_fwd_kernel", "_selective_bwd_kernel"):
    fn = getattr(impl, kernel)
    # float32 with every flag on (per-step B and C, every optional tensor), bfloat16 with every flag off.
    for dtype, flags in (("fp32", True), ("bf16", False)):
        signature, constexprs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name == "cuts_ptr":
                signature[name] = "*u8"
            elif name == "segments_ptr":
                signature[name] = "*i64"
            elif name.endswith("_ptr"):
                signature[name] = "*" + (dtype if name in VALUE_POINTERS else "fp32")
            elif name in FLAGS or name in SIZES:
                signature[name] = "constexpr"
                constexprs[(i,)] = SIZES.get(name, flags)
            else:
                signature[name] = "i64" if name.startswith("s_") else "i32"
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32))
        assert ".entry" in compiled.asm["ptx"], (kernel, dtype)
print("compiled")
"""


def test_kernels_compile_for_sm90():
    """The real Triton compiler (which the interpreter is not) accepts both kernels; no GPU needed.
    Runs in a subprocess because the interpreter is chosen at import."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
