"""linrec.selective_scan, the fused selective scan (Mamba's S6), and its ops
linrec::selective_scan_fwd / selective_scan_bwd: values, last states and every gradient against a
float64 loop written here, on the CPU kernel; the CUDA kernels at each compiled config and the
Triton implementation against the CPU kernel where there is a GPU."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

import linrec
from linrec._backend import C_CUDA
from linrec._segments import cut_flags
from reference import poison

fwd_op = torch.ops.linrec.selective_scan_fwd
bwd_op = torch.ops.linrec.selective_scan_bwd
ARG_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")


def reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None,
              reverse=False):
    """The scan one step at a time in float64, each step over (batch, channels, states) at once;
    differentiable by autograd. Returns y and the last state."""
    u, delta, A = u.double(), delta.double(), A.double()
    batch, channels, length = u.shape
    dt = delta + (delta_bias.double()[:, None] if delta_bias is not None else 0)
    if delta_softplus:
        dt = F.softplus(dt)

    def at_step(t, l):  # B or C at position l, as (batch or 1, channels, states)
        t = t.double()
        if t.dim() == 2:
            return t[None]
        if t.dim() == 3:
            t = t[:, None]
        # channel d reads group d // (channels / groups)
        return t[..., l].repeat_interleave(channels // t.shape[1], dim=1)

    h = (initial_state.double() if initial_state is not None
         else torch.zeros(batch, channels, A.shape[1], dtype=torch.float64, device=u.device))
    ys = [None] * length
    for l in (reversed(range(length)) if reverse else range(length)):
        h = torch.exp(dt[..., l, None] * A) * h + (dt[..., l] * u[..., l])[..., None] * at_step(B, l)
        ys[l] = (h * at_step(C, l)).sum(-1)
    y = torch.stack(ys, -1) if length else u.new_zeros(batch, channels, 0)
    if D is not None:
        y = y + D.double()[:, None] * u
    if z is not None:
        y = y * F.silu(z.double())
    return y, h


def make_args(batch=2, channels=4, states=3, length=9, b_form="step", c_form="step", groups=1, extras=True,
              dtype=torch.float64, device="cpu", seed=0):
    """Arguments as a trained model has them: positive step sizes, negative A (decays in (0, 1]).
    B and C forms: "channel" (channels, states), "step" (batch, states, length), "group"
    (batch, groups, states, length)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device=device, dtype=dtype)

    def bc(form):
        return {"channel": lambda: rand(channels, states), "step": lambda: rand(batch, states, length),
                "group": lambda: rand(batch, groups, states, length)}[form]()

    args = dict(u=rand(batch, channels, length), delta=rand(batch, channels, length).abs() * 0.5,
                A=(-torch.rand(channels, states, generator=g, dtype=torch.float64) * 2).to(device=device, dtype=dtype),
                B=bc(b_form), C=bc(c_form))
    if extras:
        args.update(D=rand(channels), z=rand(batch, channels, length), delta_bias=rand(channels, scale=0.3),
                    initial_state=rand(batch, channels, states))
    return args


def grads_of(fn, args, weights):
    """The outputs of fn(**args) (y, last_state) and the gradients of sum(w * out) in every tensor argument."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items()}
    outs = fn(**leaves)
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    return outs, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def scan(**args):
    return linrec.selective_scan(**args, return_last_state=True)


def check_against_reference(args, rtol=1e-9, atol=1e-10, **options):
    (y, last), grads = grads_of(lambda **a: scan(**a, **options), args, weights_for(args))
    (y_ref, last_ref), grads_ref = grads_of(lambda **a: reference(**a, **options), args, weights_for(args))
    torch.testing.assert_close(y, y_ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(last, last_ref, rtol=rtol, atol=atol)
    for name in args:
        assert grads[name].dtype == args[name].dtype and grads[name].shape == args[name].shape, name
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"d{name}: {m}")


def weights_for(args):
    g = torch.Generator().manual_seed(1)
    batch, channels, length = args["u"].shape
    states = args["A"].shape[1]
    return (torch.randn(batch, channels, length, generator=g, dtype=torch.float64).to(args["u"].device),
            torch.randn(batch, channels, states, generator=g, dtype=torch.float64).to(args["u"].device))


FORMS = [("channel", "channel", 1), ("step", "step", 1), ("group", "group", 2), ("channel", "group", 4),
         ("group", "channel", 2), ("step", "channel", 1)]


@pytest.mark.parametrize("b_form,c_form,groups", FORMS, ids=lambda v: str(v))
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "D-z-bias-initial"])
@pytest.mark.parametrize("softplus", [False, True], ids=["", "softplus"])
@pytest.mark.parametrize("reverse", [False, True], ids=["", "reverse"])
def test_forms_match_reference(b_form, c_form, groups, extras, softplus, reverse):
    """Every form of B and C, with and without D, z, delta_bias and initial_state: y, the last
    state and the gradients of all of them, across a checkpoint (129 steps)."""
    args = make_args(2, 4, 3, 129, b_form, c_form, groups, extras, seed=groups)
    check_against_reference(args, delta_softplus=softplus, reverse=reverse)


@pytest.mark.parametrize("length", [1, 7, 128, 129, 300])
@pytest.mark.parametrize("states", [1, 5, 16])
def test_lengths_and_states(length, states):
    """Lengths around the 128-step checkpoints, one to several spans, and N from 1 up."""
    args = make_args(1, 3, states, length, "group", "step", 1, seed=length)
    check_against_reference(args, delta_softplus=True, reverse=length % 2 == 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_streaming_equals_one_call(reverse):
    """Two calls, the second entering with the first's last state, give one call's outputs and
    gradients (the first call in the scan's order takes the sequence's first part)."""
    args = make_args(2, 4, 3, 300, "group", "group", 2, seed=3)
    split = 170

    def part(t, first):
        if t is None or t.dim() < 3 or t.shape[-1] != 300:
            return t
        lo, hi = (300 - split, 300) if reverse else (0, split)
        if not first:
            lo, hi = (0, 300 - split) if reverse else (split, 300)
        return t[..., lo:hi]

    def two_calls(**a):
        first = {k: part(v, True) for k, v in a.items()}
        y1, mid = scan(**first, delta_softplus=True, reverse=reverse)
        second = {k: part(v, False) for k, v in a.items()}
        y2, last = scan(**{**second, "initial_state": mid}, delta_softplus=True, reverse=reverse)
        return (torch.cat([y2, y1] if reverse else [y1, y2], -1), last)

    (y, last), grads = grads_of(two_calls, args, weights_for(args))
    (y_one, last_one), grads_one = grads_of(lambda **a: scan(**a, delta_softplus=True, reverse=reverse), args,
                                            weights_for(args))
    torch.testing.assert_close(y, y_one, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, last_one, rtol=1e-12, atol=1e-12)
    for name in args:
        torch.testing.assert_close(grads[name], grads_one[name], rtol=1e-10, atol=1e-11)


def test_strided_views():
    """u, delta, z as views of channel-last tensors, per-step B and C with a step stride of the
    states, a stride-0 d_y: read through their strides, as contiguous copies would give."""
    args = make_args(2, 5, 4, 131, "step", "group", 1, seed=5)
    views = {k: (v.transpose(1, 2).contiguous().transpose(1, 2) if k in ("u", "delta", "z")
                 else v.transpose(-1, -2).contiguous().transpose(-1, -2) if k in ("B", "C") else v)
             for k, v in args.items()}
    assert not views["u"].is_contiguous() and not views["B"].is_contiguous()
    check_against_reference(views, delta_softplus=True)
    back = bwd_args(args)
    d_y = torch.randn(5, 131, dtype=torch.float64).expand(2, 5, 131)
    for got, want in zip(bwd_op(d_y, *back[1:]), bwd_op(d_y.contiguous(), *back[1:])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def rel_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype,bc_dtype,tol", [(torch.float32, None, 1e-5), (torch.bfloat16, None, 2e-2),
                                                (torch.float16, None, 4e-3), (torch.bfloat16, torch.float32, 2e-2),
                                                (torch.float16, torch.float32, 4e-3)], ids=str)
def test_low_precision_storage(dtype, bc_dtype, tol):
    """16-bit and float32 storage computes in float32: against the float64 loop of the rounded
    inputs, within the output's rounding (and 16-bit d_u, d_delta, d_z)."""
    args = make_args(2, 4, 6, 200, "group", "channel", 2, dtype=dtype, seed=7)
    args = {k: v.float() if k in ("A", "D", "delta_bias", "initial_state") or (k == "C") else v
            for k, v in args.items()}
    if bc_dtype is not None:
        args["B"] = args["B"].to(bc_dtype)
    (y, last), grads = grads_of(lambda **a: scan(**a, delta_softplus=True), args, weights_for(args))
    rounded = {k: v.double() for k, v in args.items()}
    (y_ref, last_ref), grads_ref = grads_of(lambda **a: reference(**a, delta_softplus=True), rounded,
                                            weights_for(args))
    assert y.dtype == dtype and last.dtype == torch.float32
    assert rel_error(y, y_ref) < tol and rel_error(last, last_ref) < 1e-5
    for name in args:
        assert grads[name].dtype == args[name].dtype, name
        assert rel_error(grads[name], grads_ref[name]) < 4 * tol, name


def test_per_step_bc_dtypes_are_normalised():
    """Per-step B and C not in u's dtype: float32 beside 16-bit u, u's dtype beside float32 u;
    per-channel B and C and A in the float type. Gradients come back in each input's dtype."""
    args = make_args(1, 2, 3, 5, "step", "channel", dtype=torch.float32, seed=2)
    args["B"] = args["B"].to(torch.bfloat16)
    args["C"] = args["C"].double()
    args["A"] = args["A"].half()
    _, grads = grads_of(scan, args, weights_for(args))
    assert grads["B"].dtype == torch.bfloat16 and grads["C"].dtype == torch.float64
    assert grads["A"].dtype == torch.float16


def test_empty_sequence_passes_the_state():
    """No steps: y is empty, the last state is the initial one, and its gradient passes through."""
    args = make_args(2, 3, 4, 0, "step", "channel", seed=4)
    (y, last), grads = grads_of(scan, args, weights_for(args))
    assert y.shape == (2, 3, 0)
    torch.testing.assert_close(last, args["initial_state"])
    torch.testing.assert_close(grads["initial_state"], weights_for(args)[1])
    assert all(grads[k].abs().sum() == 0 for k in args if k != "initial_state")
    y, last = scan(**{k: v for k, v in args.items() if k != "initial_state"})
    assert torch.equal(last, torch.zeros(2, 3, 4, dtype=torch.float64))


def test_no_states():
    """With no states, y is D * u gated by silu(z), and so are the gradients."""
    check_against_reference(make_args(2, 3, 0, 9, "step", "channel", seed=6), delta_softplus=True)


def test_no_channels_or_batch():
    for batch, channels in ((0, 3), (2, 0)):
        args = make_args(batch, channels, 4, 9, "step", "channel", groups=1, seed=8)
        (y, last), grads = grads_of(scan, args, weights_for(args))
        assert y.shape == (batch, channels, 9) and last.shape == (batch, channels, 4)
        assert all(grads[k].shape == args[k].shape and not grads[k].abs().sum() for k in args)


def test_models_selective_scan_is_the_fused_op():
    from linrec.models import selective_scan

    assert selective_scan is linrec.selective_scan


def test_gradcheck():
    args = make_args(2, 4, 3, 6, "group", "channel", 2, seed=9)
    names = list(args)
    assert torch.autograd.gradcheck(
        lambda *t: scan(**dict(zip(names, t)), delta_softplus=True, reverse=True),
        tuple(v.requires_grad_() for v in args.values()))


def op_args(args, softplus=True, reverse=0, config=(0, 0)):
    """The forward op's arguments from make_args' (3-D B and C as 4-D)."""
    a = {k: (v.unsqueeze(1) if k in ("B", "C") and v.dim() == 3 else v) for k, v in args.items()}
    return tuple(a.get(k) for k in ARG_NAMES) + (softplus, reverse, *config)


def bwd_args(args, **options):
    fwd = op_args(args, **options)
    y, last, checkpoints = fwd_op(*fwd)
    g = torch.Generator().manual_seed(3)
    d_y = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    d_last = torch.randn(last.shape, generator=g, dtype=torch.float64).to(last.dtype)
    return (d_y, d_last) + fwd[:9] + (checkpoints,) + fwd[9:]


@pytest.mark.parametrize("extras", [False, True])
def test_opcheck(extras):
    args = make_args(2, 4, 3, 130, "group", "channel", 2, extras, seed=10)
    torch.library.opcheck(fwd_op, op_args(args))
    torch.library.opcheck(bwd_op, bwd_args(args))


def test_opcheck_raw_fwd():
    """_selective_scan_fwd, the forward without an autograd kernel that linrec.selective_scan
    differentiates itself: the schema checks on inputs that need no gradient, and the same
    outputs as selective_scan_fwd."""
    args = op_args(make_args(2, 4, 3, 130, "group", "channel", 2, seed=10))
    raw = torch.ops.linrec._selective_scan_fwd
    torch.library.opcheck(raw.default, args)
    for got, want in zip(raw(*args), fwd_op(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("grad_needed", ["none", "u", "all"])
def test_autograd_paths_match_reference(grad_needed):
    """linrec.selective_scan takes its own autograd.Function when a gradient is needed, the raw op
    otherwise, and the registered autograd under torch.func: each against the float64 loop."""
    args = make_args(2, 4, 3, 21, "step", "channel", seed=13)
    wanted = {"none": (), "u": ("u",), "all": tuple(args)}[grad_needed]
    leaves = {k: v.detach().clone().requires_grad_(k in wanted) for k, v in args.items()}
    y, last = scan(**leaves, delta_softplus=True)
    y_ref, last_ref = reference(**args, delta_softplus=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(last, last_ref, rtol=1e-9, atol=1e-10)
    assert y.requires_grad == bool(wanted)
    if wanted:
        (y_w, last_w) = weights_for(args)
        loss = (y * y_w).sum() + (last * last_w).sum()
        grads = torch.autograd.grad(loss, [leaves[k] for k in wanted])
        _, grads_ref = grads_of(lambda **a: reference(**a, delta_softplus=True), args, weights_for(args))
        for name, g in zip(wanted, grads):
            torch.testing.assert_close(g, grads_ref[name], rtol=1e-9, atol=1e-10, msg=lambda m, n=name: f"d{n}: {m}")


def test_torch_func_grad_and_vjp():
    """torch.func.grad and torch.func.vjp of linrec.selective_scan in u and A, as the float64 loop's gradients."""
    args = make_args(2, 4, 3, 21, "group", "channel", 2, seed=14)
    y_w, last_w = weights_for(args)

    def loss(u, A):
        y, last = scan(**{**args, "u": u, "A": A}, delta_softplus=True)
        return (y * y_w).sum() + (last * last_w).sum()

    d_u, d_A = torch.func.grad(loss, argnums=(0, 1))(args["u"], args["A"])
    _, grads_ref = grads_of(lambda **a: reference(**a, delta_softplus=True), args, weights_for(args))
    torch.testing.assert_close(d_u, grads_ref["u"], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(d_A, grads_ref["A"], rtol=1e-9, atol=1e-10)
    _, vjp = torch.func.vjp(lambda u, A: loss(u, A), args["u"], args["A"])
    for got, name in zip(vjp(torch.ones((), dtype=torch.float64)), ("u", "A")):
        torch.testing.assert_close(got, grads_ref[name], rtol=1e-9, atol=1e-10)


def test_higher_order_and_forward_mode_raise():
    """The scan differentiates to first order in reverse mode. A double backward and forward-mode AD
    raise (they returned zeros and no tangent), while the first-order gradients stay available."""
    args = {k: v.detach().clone().requires_grad_() for k, v in make_args(1, 2, 3, 7, seed=4).items()}
    y = linrec.selective_scan(**args)
    d_u, = torch.autograd.grad(y.square().sum(), args["u"], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        d_u.sum().backward()
    with pytest.raises(RuntimeError, match="not have been used in the graph"):  # the backward leads nowhere
        torch.autograd.grad(d_u.sum(), args["u"])
    plain = {k: v.detach() for k, v in args.items()}
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(plain["u"], torch.ones_like(plain["u"]))
        with pytest.raises(NotImplementedError, match="selective_scan has no forward-mode AD"):
            linrec.selective_scan(**{**plain, "u": dual})
        linrec.selective_scan(**plain)  # no tangent anywhere: runs
    with pytest.raises(NotImplementedError, match="selective_scan has no forward-mode AD"):
        torch.func.jvp(lambda u: linrec.selective_scan(**{**plain, "u": u}), (plain["u"],), (plain["u"],))

    def loss(u):
        return linrec.selective_scan(**{**plain, "u": u}).square().sum()

    torch.func.grad(loss)(plain["u"])  # first order: runs
    with pytest.raises(NotImplementedError, match="nested torch.func transforms"):  # they came back zero
        torch.func.grad(lambda u: torch.func.grad(loss)(u).sum())(plain["u"])


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces linrec.selective_scan and its backward with no graph
    break; values and gradients as the eager call's."""
    args = make_args(2, 4, 3, 20, "group", "channel", 2, seed=11)
    compiled = torch.compile(lambda **a: scan(**a, delta_softplus=True), fullgraph=True, backend="aot_eager")
    (y, last), grads = grads_of(compiled, args, weights_for(args))
    (y_e, last_e), grads_e = grads_of(lambda **a: scan(**a, delta_softplus=True), args, weights_for(args))
    torch.testing.assert_close(y, y_e, rtol=0, atol=0)
    torch.testing.assert_close(last, last_e, rtol=0, atol=0)
    for name in args:
        torch.testing.assert_close(grads[name], grads_e[name], rtol=1e-14, atol=1e-14)


def bad(**change):
    return {**make_args(2, 4, 3, 7, "step", "channel", seed=12), **change}


BAD_ARGS = [
    ("u", dict(u=[1.0]), "u must be a tensor, got list"),
    ("u", dict(u=torch.zeros(2, 4, 7, dtype=torch.int64)), "u has dtype torch.int64"),
    ("u", dict(u=torch.zeros(2, 4, 7, dtype=torch.complex64)), "u has dtype torch.complex64"),
    ("u", dict(u=torch.zeros(8, 7, dtype=torch.float64)), r"u of shape \(8, 7\) must be \(batch, channels, length\)"),
    ("delta", dict(delta=None), "delta must be a tensor, got NoneType"),
    ("delta", dict(delta=torch.zeros(2, 4, 5, dtype=torch.float64)), r"delta of shape \(2, 4, 5\)"),
    ("delta", dict(delta=torch.zeros(2, 4, 7, dtype=torch.int32)), "delta has dtype torch.int32"),
    ("A", dict(A=None), "A must be a tensor, got NoneType"),
    ("A", dict(A=torch.zeros(5, 3)), r"A of shape \(5, 3\) must be \(channels=4, states\)"),
    ("A", dict(A=torch.zeros(4, 3, dtype=torch.complex64)), "A has dtype torch.complex64"),
    ("A", dict(A=torch.zeros(4, 257), B=torch.zeros(4, 257), C=torch.zeros(4, 257)), "A has 257 states"),
    ("B", dict(B=None), "B must be a tensor, got NoneType"),
    ("B", dict(B=torch.zeros(2, 3, 3, 9)), r"B of shape \(2, 3, 3, 9\)"),
    ("B", dict(B=torch.zeros(4, 5)), r"B of shape \(4, 5\) must be \(channels=4, states=3\)"),
    ("B", dict(B=torch.zeros(2, 3, 7, dtype=torch.int64)), "B has dtype torch.int64"),
    ("C", dict(C=torch.zeros(2, 3, 3, 7)), "C has 3 groups, which do not divide channels=4"),
    ("C", dict(B=torch.zeros(2, 2, 3, 7), C=torch.zeros(2, 4, 3, 7)), "C has 4 groups but B has 2"),
    ("D", dict(D=torch.zeros(3)), r"D of shape \(3,\) must be \(channels=4,\)"),
    ("z", dict(z=torch.zeros(2, 4)), r"z of shape \(2, 4\)"),
    ("delta_bias", dict(delta_bias=torch.zeros(4, 1)), r"delta_bias of shape \(4, 1\)"),
    ("delta_bias", dict(delta_bias=torch.zeros(4, dtype=torch.bool)), "delta_bias has dtype torch.bool"),
    ("initial_state", dict(initial_state=torch.zeros(2, 4)), r"initial_state of shape \(2, 4\)"),
    ("initial_state", dict(initial_state=torch.zeros(2, 4, 3, device="meta")),
     "initial_state is on meta but u is on cpu"),
    ("delta_softplus", dict(delta_softplus="yes"), "delta_softplus must be a bool, got 'yes'"),
    ("return_last_state", dict(return_last_state=None), "return_last_state must be a bool, got None"),
    ("reverse", dict(reverse=2), "reverse must be a bool, got 2"),
]


@pytest.mark.parametrize("name,change,message", BAD_ARGS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_ARGS)])
def test_bad_arguments_name_the_argument(name, change, message):
    with pytest.raises(ValueError, match=message):
        linrec.selective_scan(**bad(**change))


def test_op_checks_its_arguments():
    """The ops are public: they check again, with RuntimeErrors naming the argument."""
    args = make_args(2, 4, 3, 7, "group", "group", 2, seed=13)
    fwd = list(op_args(args))
    cases = [
        ({10: 2}, "reverse must be a bool \\(or 0 / 1\\), got 2"),
        ({11: -1, 12: -1}, "steps_per_thread=-1 and warps=-1 must both be 0"),
        ({11: 8, 12: 0}, "steps_per_thread=8 and warps=0 must both be 0"),
        ({0: args["u"][0]}, "u has shape \\(4, 7\\); expected \\(batch, dim, L\\)"),
        ({0: args["u"].long()}, "u has dtype Long"),
        ({1: args["delta"].float()}, "delta has dtype Float; expected Double"),
        ({1: args["delta"][..., :5]}, "delta has shape \\(2, 4, 5\\)"),
        ({2: args["A"].float()}, "A has dtype Float; expected Double"),
        ({2: torch.zeros(4, 300, dtype=torch.float64)}, "A has N=300 states"),
        ({3: args["B"][:, :, :2]}, "B has shape \\(2, 2, 2, 7\\)"),
        ({3: torch.zeros(2, 3, 3, 7, dtype=torch.float64)}, "B has 3 groups, which do not divide dim=4"),
        ({3: args["B"][:, :1]}, "C has 2 groups but B has 1"),
        ({4: args["C"].float()}, "C has dtype Float but B has Double"),
        ({3: args["B"].float(), 4: args["C"].float()}, "B has dtype Float but u has Double"),
        ({3: torch.zeros(4, 3)}, "B has dtype Float; expected Double"),
        ({5: torch.zeros(3, dtype=torch.float64)}, "D has shape \\(3,\\); expected \\(dim,\\)"),
        ({6: args["z"].float()}, "z has dtype Float"),
        ({7: torch.zeros(4, 1, dtype=torch.float64)}, "delta_bias has shape \\(4, 1\\)"),
        ({8: args["initial_state"][:1]}, "initial_state has shape \\(1, 4, 3\\)"),
        ({8: args["initial_state"].to("meta")}, "initial_state is on a different device than u"),
    ]
    for change, message in cases:
        call = list(fwd)
        for i, v in change.items():
            call[i] = v
        with pytest.raises(RuntimeError, match=message):
            fwd_op(*call)
    back = list(bwd_args(args))
    for change, message in [({0: back[0].float()}, "d_y has dtype Float"),
                            ({1: back[1][:, :2]}, "d_last_state has shape \\(2, 2, 3\\)"),
                            ({11: back[11][:, :, :0]}, "checkpoints has shape \\(2, 4, 0, 3\\)"),
                            ({13: 3}, "reverse must be a bool")]:
        call = list(back)
        for i, v in change.items():
            call[i] = v
        with pytest.raises(RuntimeError, match=message):
            bwd_op(*call)


def test_absent_gradients_have_no_elements():
    args = make_args(2, 4, 3, 7, "step", "channel", extras=False, seed=14)
    grads = bwd_op(*bwd_args(args))
    assert [tuple(g.shape) for g in grads] == [(2, 4, 7), (2, 4, 7), (4, 3), (2, 1, 3, 7), (4, 3), (0,), (0,), (0,),
                                               (2, 4, 3)]


# -- GPU: the CUDA kernels at each compiled config, and the Triton implementation, against the CPU kernel

needs_cuda_kernels = pytest.mark.skipif(not (torch.cuda.is_available() and C_CUDA is not None),
                                        reason="needs a GPU and the compiled CUDA kernels")


def to_device(args, device, dtype=None):
    """args on `device`; values (u, delta, z, per-step B and C) in `dtype`, the rest float32 or float64."""
    acc = torch.float64 if dtype in (None, torch.float64) else torch.float32
    out = {}
    for k, v in args.items():
        if v is None:
            continue
        per_step = k in ("u", "delta", "z") or (k in ("B", "C") and v.dim() >= 3)
        out[k] = v.to(device=device, dtype=(dtype or v.dtype) if per_step else acc)
    return out


def cpu_op_results(args, options):
    """The CPU kernel's forward and backward in float64 on the arguments as given (rounded)."""
    cpu = {k: v.detach().cpu().double() for k, v in args.items()}
    fwd = op_args(cpu, **options)
    y, last, ckpt = fwd_op(*fwd)
    d_y, d_last = gpu_grad_seeds(args)
    grads = bwd_op(d_y.cpu().double(), d_last.cpu().double(), *fwd[:9], ckpt, *fwd[9:])
    return (y, last, ckpt), grads


def gpu_grad_seeds(args):
    g = torch.Generator().manual_seed(21)
    u, A = args["u"], args["A"]
    d_y = torch.randn(u.shape, generator=g).to(device=u.device, dtype=u.dtype)
    d_last = torch.randn(*u.shape[:2], A.shape[1], generator=g).to(device=u.device, dtype=A.dtype)
    return d_y, d_last


def compare(name, got, want, tol):
    assert torch.isfinite(got).all(), f"{name}: not finite"
    assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.numel():
        err = rel_error(got.cpu(), want)
        assert err < tol, f"{name}: relative error {err}"


def check_gpu_call(fwd, bwd, args, options, tol, config=None, expected=None):
    """fwd / bwd (the ops with a config, or the Triton functions) on the GPU against the CPU op
    (`expected`: its results, if already at hand)."""
    (y_ref, last_ref, ckpt_ref), grads_ref = expected or cpu_op_results(args, options)
    a = op_args(args, **options, **({"config": config} if config else {}))
    if config is None:  # the Triton functions: no config, reverse a bool
        a = a[:10] + (bool(a[10]),)
    y, last, ckpt = fwd(*a)
    for name, got, want in (("y", y, y_ref), ("last_state", last, last_ref), ("checkpoints", ckpt, ckpt_ref)):
        compare(name, got, want, tol)
    d_y, d_last = gpu_grad_seeds(args)
    grads = bwd(d_y, d_last, *a[:9], ckpt, *a[9:])
    for name, got, want in zip(["d_" + n for n in ARG_NAMES], grads, grads_ref):
        # Wider for the gradients summed over batch and steps (float32 adds in any order, with
        # cancellation) than for the per-element ones; float64 keeps them tight either way.
        compare(name, got, want, 20 * tol if name in ("d_A", "d_delta_bias", "d_D") else 4 * tol)


GPU_CASES = [  # batch, channels, states, length, B form, C form, groups
    (1, 1, 1, 1, "step", "step", 1),
    (2, 3, 5, 7, "group", "channel", 1),
    (2, 16, 16, 129, "group", "group", 4),
    (3, 40, 16, 300, "channel", "step", 1),
    (1, 64, 64, 1000, "group", "group", 2),
    (2, 8, 16, 2 ** 17, "step", "step", 1),
    (100, 1000, 5, 3, "group", "channel", 10),
    (2, 24, 40, 520, "group", "group", 3),
    (3, 12, 7, 2049, "step", "group", 1),
    (1, 8, 256, 300, "channel", "group", 1),
    # Mamba's form (per-step B and C, N <= 16) with whole blocks of a group's channels, so that
    # the blocks share B and C through shared tiles: long and short rows, one and two groups.
    (2, 128, 16, 1000, "step", "step", 1),
    (1, 256, 5, 3001, "group", "group", 2),
    (1, 128, 16, 20000, "step", "group", 1),
    (3, 256, 12, 129, "group", "step", 1),
]


def selective_configs():
    return [tuple(c) for c in C_CUDA.selective_configs()] if C_CUDA is not None else []


@needs_cuda_kernels
@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_cuda_kernels_match_cpu(case, dtype):
    batch, channels, states, length, b_form, c_form, groups = case
    configs = selective_configs()
    if dtype == torch.float64:  # the automatic choice only (float64 on the GPU is for checking)
        configs = configs[:1]
    tol = {torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float64: 1e-10}[dtype]
    for reverse in (0, 1):
        args = to_device(make_args(batch, channels, states, length, b_form, c_form, groups, seed=length + reverse),
                         "cuda", dtype)
        options = dict(softplus=True, reverse=reverse)
        expected = cpu_op_results(args, options)
        for config in configs:
            check_gpu_call(fwd_op, bwd_op, args, options, tol, config, expected)


@needs_cuda_kernels
@pytest.mark.gpu
def test_cuda_empty_and_stateless_calls():
    for shape in ((2, 3, 0, 9), (2, 3, 4, 0), (0, 3, 4, 9), (2, 0, 4, 9)):
        batch, channels, states, length = shape
        args = to_device(make_args(batch, channels, states, length, "group", "step", 1, seed=2), "cuda",
                         torch.float32)
        check_gpu_call(fwd_op, bwd_op, args, dict(softplus=True), 1e-5, (0, 0))


@needs_cuda_kernels
@pytest.mark.gpu
def test_cuda_config_errors():
    args = to_device(make_args(1, 2, 20, 5, "step", "channel", seed=3), "cuda", torch.float32)
    with pytest.raises(RuntimeError, match=r"steps_per_thread=3, warps=3 is not a compiled selective-scan config; "
                                           r"the compiled \(steps_per_thread, warps\) are \(8, 4\)"):
        fwd_op(*op_args(args, config=(3, 3)))


@needs_cuda_kernels
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_scan_on_cuda_matches_reference(dtype):
    """The public function on CUDA tensors: values and gradients against the float64 loop."""
    args = make_args(2, 8, 16, 300, "group", "channel", 2, seed=4)
    device_args = to_device(args, "cuda", dtype)
    (y, last), grads = grads_of(lambda **a: scan(**a, delta_softplus=True), device_args, weights_for(device_args))
    rounded = {k: v.cpu().double() for k, v in device_args.items()}
    (y_ref, last_ref), grads_ref = grads_of(lambda **a: reference(**a, delta_softplus=True), rounded,
                                            weights_for(rounded))
    tol = 2e-4 if dtype == torch.float32 else 2e-2
    assert rel_error(y.cpu(), y_ref) < tol and rel_error(last.cpu(), last_ref) < 2e-4
    for name in args:
        assert rel_error(grads[name].cpu(), grads_ref[name]) < 4 * tol, name


@needs_cuda_kernels
@pytest.mark.gpu
def test_compiled_by_inductor_on_cuda():
    args = to_device(make_args(2, 8, 6, 300, "group", "channel", 2, seed=5), "cuda", torch.bfloat16)
    compiled = torch.compile(lambda **a: scan(**a, delta_softplus=True), fullgraph=True)
    (y, last), grads = grads_of(compiled, args, weights_for(args))
    (y_e, last_e), grads_e = grads_of(lambda **a: scan(**a, delta_softplus=True), args, weights_for(args))
    torch.testing.assert_close(y, y_e)
    torch.testing.assert_close(last, last_e)
    for name in args:
        torch.testing.assert_close(grads[name], grads_e[name])


@needs_cuda_kernels
@pytest.mark.gpu
def test_no_expanded_state_on_cuda():
    """A forward and backward peaks far below one (batch, channels, states, length) float32
    tensor: what it holds is the inputs, their gradients and the checkpoints."""
    batch, channels, states, length = 2, 64, 64, 2048
    args = to_device(make_args(batch, channels, states, length, "step", "step", seed=6), "cuda", torch.float32)
    args = {k: v.requires_grad_() for k, v in args.items()}
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    args.pop("initial_state")
    linrec.selective_scan(**args, delta_softplus=True).sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < batch * channels * states * length * 4 / 8


def triton_selective():
    if not torch.cuda.is_available():
        return None
    try:
        from linrec.impl import triton_selective
    except ImportError:
        return None
    return triton_selective


@pytest.mark.skipif(triton_selective() is None, reason="needs a GPU and linrec.impl.triton_selective")
@pytest.mark.parametrize("case", GPU_CASES[:5], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_matches_cpu(case, dtype):
    module = triton_selective()
    batch, channels, states, length, b_form, c_form, groups = case
    tol = 2e-4 if dtype == torch.float32 else 2e-2
    for reverse in (0, 1):
        args = to_device(make_args(batch, channels, states, length, b_form, c_form, groups, seed=length), "cuda",
                         dtype)
        check_gpu_call(module.selective_scan_fwd, module.selective_scan_bwd, args,
                       dict(softplus=True, reverse=reverse), tol)


def test_checkpoint_count():
    args = make_args(1, 2, 3, 300, "step", "channel", seed=15)
    _, _, checkpoints = fwd_op(*op_args(args))
    assert checkpoints.shape == (1, 2, math.ceil(300 / 128), 3)
    torch.testing.assert_close(checkpoints[:, :, 0], args["initial_state"])


# -- Packed sequences (cu_seqlens): each segment scanned on its own, against the float64 loop a segment

SEGMENTS = [0, 0, 1, 131, 150]  # an empty segment, one step, one across the 128-step checkpoint, the rest


def segment_slices(args, cu):
    """args cut to each segment along the length (per-channel B, C and the per-channel tensors
    whole), initial_state to the segment's own."""
    for k, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        yield {name: (v[..., start:end] if name in ("u", "delta", "z") or (name in ("B", "C") and v.dim() >= 3)
                      else v[:, :, k] if name == "initial_state" else v)
               for name, v in args.items()}


def packed_reference(args, cu, reverse, **options):
    """(y, last_state) of a packed call from the loop over each segment alone: y concatenated, the
    last states stacked as (batch, channels, segments, states) (an empty segment's is its initial
    state, or zeros)."""
    outs = [reference(**a, reverse=reverse, **options) for a in segment_slices(args, cu)]
    return torch.cat([y for y, _ in outs], -1), torch.stack([last for _, last in outs], 2)


def per_segment_states(args, segments, seed):
    g = torch.Generator().manual_seed(seed)
    batch, channels, _ = args["u"].shape
    return torch.randn(batch, channels, segments, args["A"].shape[1], generator=g, dtype=torch.float64)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("initial", [False, True], ids=["zero", "initial"])
@pytest.mark.parametrize("b_form,c_form,groups", [("step", "channel", 1), ("group", "group", 2),
                                                   ("channel", "step", 1)])
def test_cu_seqlens_scans_each_segment(b_form, c_form, groups, initial, reverse):
    """selective_scan(cu_seqlens=...) on the CPU kernel: y, each segment's last state and every
    gradient (a state a segment's too) as the float64 loop over each segment alone (empty and
    one-step segments, one across a checkpoint), from zero or from each segment's initial state."""
    args = make_args(2, 4, 3, SEGMENTS[-1], b_form, c_form, groups, seed=21)
    del args["initial_state"]
    if initial:
        args["initial_state"] = per_segment_states(args, len(SEGMENTS) - 1, seed=27)
    cu = torch.tensor(SEGMENTS)
    options = dict(delta_softplus=True)
    weights = packed_weights(args, len(SEGMENTS) - 1)
    (y, last), grads = grads_of(lambda **a: scan(**a, cu_seqlens=cu, reverse=reverse, **options), args, weights)
    (y_ref, last_ref), grads_ref = grads_of(lambda **a: packed_reference(a, SEGMENTS, reverse, **options), args,
                                            weights)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(last, last_ref, rtol=1e-9, atol=1e-10)
    for name in args:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-9, atol=1e-10,
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("reverse", [False, True])
def test_cu_seqlens_gradcheck(reverse):
    """torch.autograd.gradcheck of a packed call with a state a segment (an empty segment among them),
    in every tensor argument, against finite differences."""
    args = make_args(1, 2, 2, 9, "step", "channel", seed=30)
    args["initial_state"] = per_segment_states(args, 4, seed=31)
    cu = torch.tensor([0, 4, 4, 5, 9])
    names = list(args)

    def call(*tensors):
        return scan(**dict(zip(names, tensors)), cu_seqlens=cu, reverse=reverse, delta_softplus=True)

    assert torch.autograd.gradcheck(call, tuple(v.detach().requires_grad_() for v in args.values()))


def packed_weights(args, segments):
    """weights_for's, with one (batch, channels, states) weight a segment for the last states."""
    w_y, _ = weights_for(args)
    return w_y, per_segment_states(args, segments, seed=2).to(args["u"].device)


def test_cu_seqlens_compile_fullgraph():
    """torch.compile(fullgraph=True) traces a packed call and its backward: values and gradients as eager."""
    args = make_args(2, 4, 3, 20, "step", "channel", seed=26)
    args["initial_state"] = per_segment_states(args, 2, seed=28)
    cu = torch.tensor([0, 6, 20])
    call = lambda **a: scan(**a, cu_seqlens=cu, delta_softplus=True)  # noqa: E731
    weights = packed_weights(args, 2)
    (y, last), grads = grads_of(torch.compile(call, fullgraph=True, backend="aot_eager"), args, weights)
    (y_e, last_e), grads_e = grads_of(call, args, weights)
    torch.testing.assert_close(y, y_e, rtol=0, atol=0)
    torch.testing.assert_close(last, last_e, rtol=0, atol=0)
    for name in args:
        torch.testing.assert_close(grads[name], grads_e[name], rtol=1e-14, atol=1e-14)


def test_cu_seqlens_compile_dynamic_segments():
    """torch.compile(fullgraph=True, dynamic=True): a different number of segments (and states a
    segment) reuses the graph's symbolic shapes; values as the float64 loop over each segment."""
    from torch._dynamo.testing import CompileCounterWithBackend

    backend = CompileCounterWithBackend("aot_eager")
    call = torch.compile(lambda cu, **a: scan(**a, cu_seqlens=cu, delta_softplus=True), fullgraph=True,
                         dynamic=True, backend=backend)
    # Segment counts unlike every other size here (torch.compile's duck sizing would tie them).
    for bounds in ([0, 2, 6, 9, 14, 20], [0, 3, 3, 5, 11, 13, 17, 20]):
        args = make_args(2, 4, 3, 20, "step", "channel", seed=len(bounds))
        args["initial_state"] = per_segment_states(args, len(bounds) - 1, seed=33)
        y, last = call(torch.tensor(bounds), **args)
        y_ref, last_ref = packed_reference(args, bounds, False, delta_softplus=True)
        torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(last, last_ref, rtol=1e-9, atol=1e-10)
    assert backend.frame_count == 1


def test_cu_seqlens_without_segments():
    """cu_seqlens = [0] packs no sequence into a length of 0: empty outputs, states a segment (none)."""
    args = make_args(2, 4, 3, 0, "step", "channel", seed=3)
    args["initial_state"] = torch.zeros(2, 4, 0, 3, dtype=torch.float64)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items()}
    y, last = scan(**leaves, cu_seqlens=torch.tensor([0]))
    assert y.shape == (2, 4, 0) and last.shape == (2, 4, 0, 3)
    grads = torch.autograd.grad(y.sum() + last.sum(), list(leaves.values()), allow_unused=True)
    assert all(g is None or not g.any() for g in grads)
    y, last = scan(**{**args, "initial_state": None}, cu_seqlens=torch.tensor([0]))
    assert y.shape == (2, 4, 0) and last.shape == (2, 4, 0, 3) and last.dtype == torch.float64


@pytest.mark.parametrize("reverse", [False, True])
def test_cu_seqlens_one_segment_is_the_plain_scan(reverse):
    """One segment, from its initial state: the plain scan's values, last state and gradients."""
    args = make_args(2, 4, 3, 40, "step", "step", seed=22)
    plain = dict(args)
    args["initial_state"] = args["initial_state"][:, :, None]
    w_y, w_last = weights_for(args)
    (y, last), grads = grads_of(lambda **a: scan(**a, cu_seqlens=torch.tensor([0, 40]), reverse=reverse), args,
                                (w_y, w_last[:, :, None]))
    (y_plain, last_plain), grads_plain = grads_of(lambda **a: scan(**a, reverse=reverse), plain, (w_y, w_last))
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)
    torch.testing.assert_close(last[:, :, 0], last_plain, rtol=0, atol=0)
    for name in args:
        want = grads_plain[name][:, :, None] if name == "initial_state" else grads_plain[name]
        torch.testing.assert_close(grads[name], want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("change,message", [
    (dict(initial_state=torch.zeros(2, 4, 3, dtype=torch.float64)),
     r"initial_state of shape \(2, 4, 3\) must be \(batch=2, channels=4, segments=2, states=3\)"),
    (dict(cu_seqlens=torch.tensor([0, 5, 9])), r"cu_seqlens must start at 0 and end at u.shape\[2\] = 10"),
    (dict(cu_seqlens=torch.tensor([0, 6, 5, 10])), "cu_seqlens must be nondecreasing"),
    (dict(cu_seqlens=torch.tensor([0.0, 10.0])), "cu_seqlens has dtype torch.float32"),
])
def test_cu_seqlens_refusals_name_the_argument(change, message):
    args = make_args(2, 4, 3, 10, "step", "step", extras=False, seed=23)
    with pytest.raises(ValueError, match=message):
        linrec.selective_scan(**{**args, "cu_seqlens": torch.tensor([0, 4, 10]), **change})


def test_opcheck_with_cuts():
    """The ops with cuts: schema, fake kernels and autograd registration (opcheck), on the CPU kernel."""
    args = make_args(2, 4, 3, 150, "group", "channel", 2, extras=False, seed=24)
    cuts = torch.zeros(150, dtype=torch.bool)
    cuts[[0, 7, 130]] = True
    fwd = op_args(args) + (cuts,)
    torch.library.opcheck(fwd_op, fwd)
    torch.library.opcheck(torch.ops.linrec._selective_scan_fwd.default, fwd)
    y, last, checkpoints = fwd_op(*fwd)
    d_y, d_last = torch.randn_like(y), torch.randn_like(last)
    torch.library.opcheck(bwd_op, (d_y, d_last) + fwd[:9] + (checkpoints,) + fwd[9:])
    with pytest.raises(RuntimeError, match="cuts and initial_state exclude each other"):
        fwd_op(*fwd[:8], torch.zeros(2, 4, 3, dtype=torch.float64), *fwd[9:])
    # A state a segment: cu_seqlens beside the cuts, initial and last states (batch, dim, segments, N).
    cu = torch.tensor([0, 7, 7, 130, 150])
    segmented = fwd[:8] + (per_segment_states(args, 4, seed=29),) + fwd[9:] + (cu,)
    torch.library.opcheck(fwd_op, segmented)
    y, last, checkpoints = fwd_op(*segmented)
    assert last.shape == (2, 4, 4, 3)
    torch.testing.assert_close(last[:, :, 1], segmented[8][:, :, 1], rtol=0, atol=0)  # the empty segment's
    d_last = torch.randn_like(last)
    torch.library.opcheck(bwd_op, (torch.randn_like(y), d_last) + segmented[:9] + (checkpoints,) + segmented[9:])
    with pytest.raises(RuntimeError, match=r"initial_state has shape \(2, 4, 3\); expected \(batch, dim, segments"):
        fwd_op(*fwd[:8], torch.zeros(2, 4, 3, dtype=torch.float64), *fwd[9:], cu)
    with pytest.raises(RuntimeError, match="cu_seqlens must run from 0 to 150"):
        fwd_op(*segmented[:-1], torch.tensor([0, 7, 149]))
    # A bound past the length (or below 0) in the middle: refused before any position's segment is written.
    for bounds in ([0, 10**8, 130, 140, 150], [0, 7, 300, 7, 150], [0, -5, 7, 130, 150]):
        with pytest.raises(RuntimeError, match="cu_seqlens must not decrease"):
            fwd_op(*segmented[:-1], torch.tensor(bounds))
        with pytest.raises(RuntimeError, match="cu_seqlens must not decrease"):
            bwd_op(torch.randn_like(y), d_last, *segmented[:9], checkpoints, *segmented[9:-1], torch.tensor(bounds))


def packed_cpu_results(args, cu, reverse, d_y, d_last):
    """The CPU kernel's packed forward and backward in float64 on the arguments as given (rounded)."""
    cpu = {k: v.detach().cpu().double() for k, v in args.items()}
    cuts = cut_flags(cu, cpu["u"].shape[2], bool(reverse), "cpu")
    fwd = op_args(cpu, reverse=reverse) + (cuts, cu)
    y, last, ckpt = fwd_op(*fwd)
    return (y, last, ckpt), bwd_op(d_y.cpu().double(), d_last.cpu().double(), *fwd[:9], ckpt, *fwd[9:])


PACKED_GPU_CASES = [  # batch, channels, states, length, B form, C form, groups, segments
    # Boundaries inside a lane's steps, across lanes, chunks (128 or 256 steps) and checkpoints.
    (2, 8, 4, 700, "group", "channel", 2, 9),
    # Mamba's form with whole blocks of a group (shared tiles), thousands of segments, empty ones.
    (1, 128, 16, 9000, "step", "step", 1, 3000),
    (2, 64, 5, 1500, "channel", "group", 1, 40),
]


@needs_cuda_kernels
@pytest.mark.gpu
@pytest.mark.parametrize("case", PACKED_GPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_kernels_take_cu_seqlens(case, dtype):
    """The CUDA kernels at each compiled config with cu_seqlens (a state a segment, random
    boundaries, empty segments among them), outputs poisoned, against the CPU kernel in float64
    on the same rounded arguments: y, checkpoints, each segment's last state and every gradient."""
    batch, channels, states, length, b_form, c_form, groups, segments = case
    rng = random.Random(length)
    bounds = sorted(rng.randint(0, length) for _ in range(segments - 1))
    cu = torch.tensor([0, *bounds, length])
    tol = {torch.float32: 2e-4, torch.bfloat16: 2e-2}[dtype]
    for reverse in (0, 1):
        args = make_args(batch, channels, states, length, b_form, c_form, groups, seed=length + reverse)
        args["initial_state"] = per_segment_states(args, segments, seed=reverse)
        args = to_device(args, "cuda", dtype)
        g = torch.Generator().manual_seed(22)
        d_y = torch.randn(args["u"].shape, generator=g).to("cuda", dtype)
        d_last = torch.randn(batch, channels, segments, states, generator=g).cuda()
        expected = packed_cpu_results(args, cu, reverse, d_y, d_last)
        cuts = cut_flags(cu.cuda(), length, bool(reverse), "cuda")
        for config in selective_configs():
            fwd = op_args(args, reverse=reverse, config=config) + (cuts, cu.cuda())
            poison("cuda", 4 * args["u"].numel() * states)
            outputs = fwd_op(*fwd)
            for name, got, want in zip(("y", "last_state", "checkpoints"), outputs, expected[0]):
                compare(f"{name} at {config}", got, want, tol)
            poison("cuda", 4 * args["u"].numel() * states)
            grads = bwd_op(d_y, d_last, *fwd[:9], outputs[2], *fwd[9:])
            for name, got, want in zip(ARG_NAMES, grads, expected[1]):
                compare(f"d_{name} at {config}", got, want, 20 * tol if name in ("A", "D", "delta_bias") else 4 * tol)


@needs_cuda_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_cu_seqlens_on_cuda(dtype, reverse, backend, monkeypatch):
    """selective_scan(cu_seqlens=...) on CUDA tensors, on the compiled kernels and in Triton,
    against the float64 loop over each segment alone, on the same rounded arguments: y, each
    segment's last state and every gradient, from each segment's initial state."""
    if backend == "triton" and triton_selective() is None:
        pytest.skip("needs Triton")
    monkeypatch.setattr(linrec._selective, "cuda_backend", lambda index: backend)  # as LINREC_BACKEND does
    args = make_args(2, 8, 4, 300, "group", "channel", 2, seed=25)
    cu = torch.tensor([0, 3, 3, 140, 260, 300])
    args["initial_state"] = per_segment_states(args, len(cu) - 1, seed=32)
    gpu = {k: v.detach().requires_grad_() for k, v in to_device(args, "cuda", dtype).items()}
    y, last = scan(**gpu, cu_seqlens=cu.cuda(), reverse=reverse, delta_softplus=True)
    leaves = {k: v.detach().cpu().double().requires_grad_() for k, v in gpu.items()}
    y_ref, last_ref = packed_reference(leaves, cu.tolist(), reverse, delta_softplus=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    compare("y", y, y_ref, tol)
    compare("last_state", last, last_ref, tol)
    w_y, w_last = packed_weights(leaves, len(cu) - 1)
    grads = torch.autograd.grad((y.double() * w_y.cuda()).sum() + (last.double() * w_last.cuda()).sum(),
                                list(gpu.values()))
    grads_ref = torch.autograd.grad((y_ref * w_y).sum() + (last_ref * w_last).sum(), list(leaves.values()))
    for name, got, want in zip(gpu, grads, grads_ref):
        compare(f"d{name}", got.double(), want, tol)


@needs_cuda_kernels
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_tensors_on_another_gpu(backend, monkeypatch):
    """Tensors on cuda:1 while cuda:0 is current, packed segments: both backends run on the
    tensors' device (Triton launches on the current device unless told), and y, the last states
    and every gradient match the float64 loop over each segment."""
    if backend == "triton" and triton_selective() is None:
        pytest.skip("needs Triton")
    monkeypatch.setattr(linrec._selective, "cuda_backend", lambda index: backend)
    args = make_args(2, 8, 4, 300, "group", "channel", 2, seed=26)
    cu = torch.tensor([0, 5, 150, 150, 300])
    args["initial_state"] = per_segment_states(args, len(cu) - 1, seed=33)
    with torch.cuda.device(0):
        gpu = {k: v.detach().requires_grad_() for k, v in to_device(args, "cuda:1", torch.float32).items()}
        y, last = scan(**gpu, cu_seqlens=cu.to("cuda:1"), delta_softplus=True)
        leaves = {k: v.detach().cpu().double().requires_grad_() for k, v in gpu.items()}
        w_y, w_last = packed_weights(leaves, len(cu) - 1)
        grads = torch.autograd.grad((y.double() * w_y.to("cuda:1")).sum() + (last.double() * w_last.to("cuda:1")).sum(),
                                    list(gpu.values()))
        assert torch.cuda.current_device() == 0
    assert {t.device for t in (y, last, *grads)} == {torch.device("cuda:1")}
    y_ref, last_ref = packed_reference(leaves, cu.tolist(), False, delta_softplus=True)
    compare("y", y, y_ref, 1e-5)
    compare("last_state", last, last_ref, 1e-5)
    grads_ref = torch.autograd.grad((y_ref * w_y).sum() + (last_ref * w_last).sum(), list(leaves.values()))
    for name, got, want in zip(gpu, grads, grads_ref):
        compare(f"d{name}", got.double(), want, 1e-5)
