"""Adversarial inputs: the raw ops' own checks, layouts of any rank, 16-bit references, empty
inputs, clear errors, non-finite values, and a seeded random differential test of every CPU
implementation against the float64 loop."""

import random

import pytest
import torch

import linrec
from linrec._registry import FAMILIES
from conftest import CPU_IMPLS
from linrec.impl.python import linrec_hop, linrec_ref
from reference import reference, rel_error

fwd_op = torch.ops.linrec.linrec_fwd
bwd_op = torch.ops.linrec.linrec_bwd
AUTO = (0, 0, 0, 0, 3)  # kernel, elems_per_thread, threads_per_block, memcode, algocode


def fwd_args(x, c, h0, dim=-1, reverse=False, config=AUTO):
    return (x, c, h0, dim, reverse, *config)


# -- 1. a tensor on another device among the op's arguments


@pytest.mark.parametrize("meta", ["inputs", "coeffs", "initial"])
def test_fwd_op_rejects_a_meta_tensor_among_cpu_tensors(meta):
    """One meta tensor makes the dispatcher pick the ops' fake kernels, which must not return
    uninitialised CPU memory as the result."""
    args = dict(inputs=torch.ones(4, 8), coeffs=torch.full((4, 8), 0.5), initial=torch.zeros(4))
    args[meta] = args[meta].to("meta")
    with pytest.raises(RuntimeError, match="different device"):
        fwd_op(*fwd_args(*args.values()))


@pytest.mark.parametrize("meta", ["d_outputs", "coeffs", "outputs", "initial"])
def test_bwd_op_rejects_a_meta_tensor_among_cpu_tensors(meta):
    args = dict(d_outputs=torch.ones(4, 8), coeffs=torch.full((4, 8), 0.5), outputs=torch.ones(4, 8),
                initial=torch.zeros(4))
    args[meta] = args[meta].to("meta")
    with pytest.raises(RuntimeError, match="different device"):
        bwd_op(*args.values(), -1, False, *AUTO)


def test_ops_on_meta_tensors_still_trace():
    """All-meta arguments are shape propagation (torch.compile's fake tensors): no error."""
    x = torch.empty(4, 8, device="meta")
    assert fwd_op(*fwd_args(x, x, None)).shape == (4, 8)
    dx, dc, dh0 = bwd_op(x, x, x, x[:, 0], -1, False, *AUTO)
    assert dx.shape == dc.shape == (4, 8) and dh0.shape == (4,)


# -- 2. any rank, any layout


def permuted_layout(shape):
    """A tensor of `shape` whose memory order is reversed: no two of its dims merge."""
    return torch.randn(shape[::-1], dtype=torch.float64).permute(*range(len(shape) - 1, -1, -1))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [-1, 0, 3])
def test_any_rank_and_layout(dim, reverse):
    """8-d tensors whose batch dims merge into more than the kernels index: forward and all
    three gradients (the incoming gradient permuted) match the float64 reference."""
    shape = (2, 3, 2, 3, 2, 3, 2, 5)
    x = torch.randn(shape, dtype=torch.float64)
    c = (torch.rand(2, 1, 2, 1, 2, 1, 2, 5, dtype=torch.float64) * 0.6 + 0.4)
    h0 = permuted_layout(shape[:dim % 8] + shape[dim % 8 + 1:])
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y = linrec.linrec(leaves[0], leaves[1], reverse, dim=dim, initial=leaves[2])
    dy = permuted_layout(shape)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y_ref = reference(ref_leaves[0], ref_leaves[1], reverse, dim, ref_leaves[2])
    assert rel_error(y, y_ref) < 1e-12
    for g, r in zip(grads, torch.autograd.grad(y_ref, ref_leaves, dy)):
        assert g.shape == r.shape and rel_error(g, r) < 1e-12


def test_raw_ops_take_any_layout():
    shape = (3, 2, 3, 2, 3, 2, 3, 7)
    x, c, dy = permuted_layout(shape), permuted_layout(shape).sigmoid(), torch.randn(shape, dtype=torch.float64)
    y = fwd_op(*fwd_args(x, c, None, 2, True))
    assert rel_error(y, reference(x, c, True, 2)) < 1e-12
    dx, dc, _ = bwd_op(dy, c, y, None, 2, True, *AUTO)
    leaves = [t.clone().requires_grad_() for t in (x, c)]
    want = torch.autograd.grad(reference(*leaves, True, 2), leaves, dy)
    assert rel_error(dx, want[0]) < 1e-12 and rel_error(dc, want[1]) < 1e-12


# -- 3. the Python references accumulate 16-bit storage in float32


@pytest.mark.parametrize("impl", ["python.linrec_ref", "python.linrec_hop"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_references_accumulate_16bit_in_float32(impl, dtype):
    """Ones decayed by 0.99609375 (exact 250.89; bfloat16 arithmetic gave 128), and random sequences:
    within 16-bit rounding of the float64 loop, as the kernels are."""
    x = torch.ones(1, 1000, dtype=dtype)
    c = torch.full_like(x, 0.99609375)
    want = reference(x, c)
    assert rel_error(CPU_IMPLS[impl](x, c), want) < 1e-2
    x = torch.randn(3, 501).to(dtype)
    c = (1 - torch.rand(3, 501) * 0.01).to(dtype)  # long memory: each 16-bit step loses a little
    y = CPU_IMPLS[impl](x, c)
    assert y.dtype == dtype and rel_error(y, reference(x, c)) < 1e-2


# -- 4. empty inputs


@pytest.mark.parametrize("impl", list(CPU_IMPLS))
@pytest.mark.parametrize("shape,dim", [((0, 5), -1), ((3, 0), -1), ((0, 4, 3), 1), ((2, 0, 3), 1)], ids=str)
def test_empty_inputs(impl, shape, dim):
    """No sequence or no step: an empty result of inputs' shape that autograd differentiates."""
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    c = torch.rand(shape, dtype=torch.float64, requires_grad=True)
    y = CPU_IMPLS[impl](x, c, dim=dim)
    assert y.shape == x.shape and y.requires_grad
    dx, dc = torch.autograd.grad(y, (x, c), torch.ones_like(y))
    assert dx.shape == dc.shape == x.shape
    assert CPU_IMPLS[impl](x, 0.5, dim=dim).requires_grad


# -- 5. the raw ops check their own arguments

BAD_KERNEL_ARGS = [
    ("reverse", dict(reverse=2), "reverse must be"),
    ("kernel", dict(kernel=99), "kernel=99"),
    ("negative kernel", dict(kernel=-1), "kernel=-1"),
    ("elems_per_thread", dict(kernel=2, elems_per_thread=-1), "elems_per_thread=-1"),
    ("threads_per_block", dict(kernel=3, threads_per_block=-5), "threads_per_block=-5"),
    ("zero config", dict(kernel=4, elems_per_thread=0, threads_per_block=0), "elems_per_thread=0"),
    ("memcode", dict(memcode=9), "memcode=9"),
    ("algocode", dict(algocode=-3), "algocode=-3"),
]


def kernel_args(reverse=False, kernel=0, elems_per_thread=0, threads_per_block=0, memcode=0, algocode=3):
    return reverse, kernel, elems_per_thread, threads_per_block, memcode, algocode


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name,bad,message", BAD_KERNEL_ARGS, ids=[b[0] for b in BAD_KERNEL_ARGS])
def test_raw_ops_check_kernel_arguments(name, bad, message, device):
    """On CPU tensors (the kernel) and on meta tensors (the fake kernels torch.compile traces)."""
    x = torch.ones(4, 8, device=device)
    args = kernel_args(**bad)
    with pytest.raises(RuntimeError, match=message):
        fwd_op(x, x, None, -1, *args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.linrec._linrec_fwd(x, x, None, -1, *args)
    with pytest.raises(RuntimeError, match=message):
        bwd_op(x, x, x, None, -1, *args)


def test_raw_ops_take_every_valid_kernel_argument():
    """Every kernel id with a config of its own, and auto / ref with the zeros linrec passes."""
    x, c = torch.randn(3, 9, dtype=torch.float64), torch.rand(3, 9, dtype=torch.float64)
    want = reference(x, c, True)
    for family in (None, *FAMILIES.values()):
        kernel = 0 if family is None else family.id
        config = (kernel, 8, 256, 3, 0) if family is not None and family.has_configs else (kernel, 0, 0, 0, 3)
        assert rel_error(fwd_op(*fwd_args(x, c, None, -1, True, config)), want) < 1e-12
    assert rel_error(fwd_op(*fwd_args(x, c, None, -1, 1)), want) < 1e-12  # an int 0 / 1 is a bool


# -- 6. errors that name the argument

BAD_CALLS = [
    ("huge coeffs", lambda x: linrec.linrec(x, 10**400), ValueError, "coeffs"),
    ("huge coeffs, 16-bit inputs", lambda x: linrec.linrec(x.bfloat16(), 10**400), ValueError, "coeffs"),
    ("huge initial", lambda x: linrec.linrec(x, 0.5, initial=10**400), ValueError, "initial"),
    ("nested inputs", lambda x: linrec.linrec(torch.nested.nested_tensor([x[0], x[1, :3]]), 0.5), ValueError,
     "inputs must be a dense tensor"),
    ("nested coeffs", lambda x: linrec.linrec(x, torch.nested.nested_tensor([x[0], x[1]])), ValueError,
     "coeffs must be a dense tensor"),
    ("op int64 inputs", lambda x: fwd_op(*fwd_args(x.long(), x.long(), None)), RuntimeError,
     "inputs has dtype Long"),
    ("op int64 d_outputs", lambda x: bwd_op(x.long(), x.long(), x.long(), None, -1, False, *AUTO), RuntimeError,
     "d_outputs has dtype Long"),
    ("op coeffs None", lambda x: fwd_op(*fwd_args(x, None, None)), RuntimeError, "coeffs must be a tensor"),
    ("op inputs None", lambda x: fwd_op(*fwd_args(None, x, None)), RuntimeError, "inputs must be a tensor"),
    ("op outputs None", lambda x: bwd_op(x, x, None, None, -1, False, *AUTO), RuntimeError,
     "outputs must be a tensor"),
]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("name,call,error,message", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_errors_name_the_argument(name, call, error, message):
    with pytest.raises(error, match=message) as info:
        call(torch.rand(2, 5))
    assert "frame #" not in str(info.value)  # no C++ stack trace


def test_lslstm_state_round_trips():
    """The state LSLSTM returns is the state it takes: two halves of a sequence, the second
    entering with the first's state, give the outputs of the whole."""
    from linrec.models import LSLSTM

    model = LSLSTM(5, 7, batch_first=True).double()
    x = torch.randn(3, 21, 5, dtype=torch.float64)
    whole, state = model(x)
    first, mid_state = model(x[:, :10])
    second, end_state = model(x[:, 10:], mid_state)
    assert rel_error(torch.cat([first, second], 1), whole) < 1e-12
    for got, want in zip(end_state, state):
        assert rel_error(got, want) < 1e-12


@pytest.mark.parametrize("arg", ["u", "delta", "A", "B", "C", "D", "z", "delta_bias"])
def test_selective_scan_rejects_integer_tensors(arg):
    from linrec.models import selective_scan

    batch, channels, states, length = 2, 3, 4, 6
    args = dict(u=torch.randn(batch, channels, length), delta=torch.rand(batch, channels, length),
                A=-torch.rand(channels, states), B=torch.randn(channels, states), C=torch.randn(channels, states),
                D=torch.randn(channels), z=torch.randn(batch, channels, length), delta_bias=torch.randn(channels))
    args[arg] = args[arg].round().long()
    with pytest.raises(ValueError, match=f"{arg} has dtype torch.int64"):
        selective_scan(**args)


@pytest.mark.parametrize("arg", ["u", "A", "B", "D"])
@pytest.mark.parametrize("kind", ["sparse", "nested"])
def test_selective_scan_rejects_sparse_and_nested_tensors(arg, kind):
    from linrec.models import selective_scan

    args = dict(u=torch.randn(2, 3, 6), delta=torch.rand(2, 3, 6), A=-torch.rand(3, 4), B=torch.randn(3, 4),
                C=torch.randn(3, 4), D=torch.randn(3))
    if kind == "sparse":
        args[arg], message = args[arg].to_sparse(), "layout torch.sparse_coo"
    else:
        args[arg], message = torch.nested.nested_tensor(list(args[arg])), "a nested tensor"
    with pytest.raises(ValueError, match=f"{arg} must be a dense tensor, got {message}"):
        selective_scan(**args)


# -- non-finite values: the sequential loop's IEEE arithmetic


def nonfinite_case(reverse):
    """Sequences through an infinite coefficient (+inf and -inf, after states of either sign),
    a zero after one (0 * inf: NaN), an infinite input, a NaN input and a NaN coefficient."""
    x = torch.randn(6, 23, dtype=torch.float64)
    c = torch.rand(6, 23, dtype=torch.float64) * 1.2 - 0.6
    at = lambda l: 22 - l if reverse else l  # noqa: E731  (position l in scan order)
    c[0, at(7)], c[1, at(7)], c[2, at(3)] = float("inf"), -float("inf"), float("inf")
    c[2, at(11)] = 0.0
    x[3, at(5)], x[4, at(9)], c[5, at(13)] = float("inf"), float("nan"), float("nan")
    return x, c


@pytest.mark.parametrize("impl", list(CPU_IMPLS))
@pytest.mark.parametrize("reverse", [False, True])
def test_nonfinite_values_follow_the_sequential_loop(impl, reverse):
    """inf where the float64 loop gives inf, with its sign, and NaN where it gives NaN."""
    x, c = nonfinite_case(reverse)
    h0 = torch.randn(6, dtype=torch.float64)
    y, want = CPU_IMPLS[impl](x, c, reverse, initial=h0), reference(x, c, reverse, initial=h0)
    assert torch.isinf(want).any() and torch.isnan(want).any()
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12, equal_nan=True)


# -- a seeded random differential test against the float64 loop

STORAGES = [(torch.float64, torch.float64), (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
            (torch.float16, torch.float16), (torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}


def random_view(rng, t):
    """t itself, or the same values in a non-contiguous layout: permuted memory, or a view with a
    step or an offset into a bigger tensor."""
    kind = rng.choice(["contiguous", "permuted", "strided", "offset"])
    if kind == "permuted" and t.dim() > 1:
        order = list(range(t.dim()))
        rng.shuffle(order)
        return t.permute(*order).contiguous().permute(*[order.index(k) for k in range(t.dim())])
    if kind in ("strided", "offset") and t.dim() > 0:
        k = rng.randrange(t.dim())
        step = 2 if kind == "strided" else 1
        big = torch.zeros(t.shape[:k] + (t.shape[k] * step + 1,) + t.shape[k + 1:], dtype=t.dtype)
        view = big.narrow(k, 1, t.shape[k] * step)[(slice(None),) * k + (slice(None, None, step),)]
        view.copy_(t)
        return view
    return t


def random_broadcast_shape(rng, shape):
    """A shape that broadcasts to `shape`: some dims 1, some leading dims dropped."""
    out = [1 if rng.random() < 0.4 else n for n in shape]
    return tuple(out[rng.randrange(len(out) + 1):]) if rng.random() < 0.3 else tuple(out)


def fuzz_case(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ndim = rng.choice([1, 1, 2, 2, 3, 3, 4, 5, 8])
    shape = tuple(rng.choice([1, 2, 3, 5]) for _ in range(ndim))
    dim = rng.randrange(-ndim, ndim)
    shape = shape[:dim % ndim] + (rng.choice([0, 1, 2, 7, 16, 33, 65]),) + shape[dim % ndim + 1:]
    values, coeff_dtype = rng.choice(STORAGES)
    x = random_view(rng, torch.randn(shape, generator=gen, dtype=torch.float64).to(values))
    coeff_kind = rng.choice(["full", "broadcast", "number"])
    if coeff_kind == "number":
        c = rng.choice([0.5, 0.9990234375, -0.75, rng.uniform(-1, 1)])
    else:
        c_shape = shape if coeff_kind == "full" else random_broadcast_shape(rng, shape)
        c = torch.rand(c_shape, generator=gen, dtype=torch.float64) * 1.8 - 0.9
        c = random_view(rng, c.to(coeff_dtype))
    state = shape[:dim % ndim] + shape[dim % ndim + 1:]
    h0 = None
    if rng.random() < 0.5:
        h0 = random_view(rng, torch.randn(random_broadcast_shape(rng, state), generator=gen,
                                          dtype=torch.float64).to(values))
    return x, c, h0, dim, rng.random() < 0.5


@pytest.mark.parametrize("impl", list(CPU_IMPLS))
def test_random_differential(impl):
    """Random ranks (up to 8), shapes (empty and odd lengths), dims, layouts (permuted, strided,
    offset views), broadcasts, numbers, initial states and storages: outputs and gradients of
    every CPU implementation against autograd through the float64 loop on the same values."""
    cases = {"linrec": 300, "python.linrec_ref": 100, "python.linrec_hop": 40}[impl]
    for seed in range(cases):
        x, c, h0, dim, reverse = fuzz_case(seed)
        tensors = [t for t in (x, c, h0) if isinstance(t, torch.Tensor)]
        leaves = [t.detach().requires_grad_() for t in tensors]
        as_leaf = dict(zip(map(id, tensors), leaves))
        args = [as_leaf.get(id(t), t) for t in (x, c, h0)]
        y = CPU_IMPLS[impl](args[0], args[1], reverse, dim=dim, initial=args[2])
        assert y.shape == x.shape and y.dtype == x.dtype, seed
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
        grads = torch.autograd.grad(y, leaves, dy, allow_unused=True)
        # The reference takes each tensor expanded to the shape it acts at, so that a reduced
        # gradient can be measured against the sum of the magnitudes it adds up (16-bit terms
        # that cancel are exact only to that scale).
        d = dim % x.dim()
        full_shapes = {id(x): x.shape, id(c): x.shape, id(h0): x.shape[:d] + x.shape[d + 1:]}
        full = [t.detach().double().expand(full_shapes[id(t)]).requires_grad_() for t in tensors]
        as_ref = dict(zip(map(id, tensors), full))
        ref_args = [as_ref.get(id(t), t) for t in (x, c, h0)]
        y_ref = reference(ref_args[0], ref_args[1], reverse, dim, ref_args[2])
        ref_grads = [torch.zeros_like(t) for t in full]  # no element: nothing depends on the tensors
        if y_ref.requires_grad:
            ref_grads = torch.autograd.grad(y_ref, full, dy.double(), materialize_grads=True)
        tol = TOL[x.dtype]
        assert rel_error(y, y_ref) < tol, seed
        for g, r, t in zip(grads, ref_grads, tensors):
            g = torch.zeros_like(t) if g is None else g
            assert g.shape == t.shape and g.dtype == t.dtype, seed
            scale = r.abs().sum_to_size(t.shape).norm().clamp_min(1e-30)
            assert ((g.double() - r.sum_to_size(t.shape)).norm() / scale).item() < tol, seed
