"""Gradients: gradcheck in float64, and the analytic gradients against autograd through the reference."""

import functools

import pytest
import torch

import linrec
from conftest import CPU_IMPLS
from reference import reference, rel_error

IMPLS = ["linrec", "python.linrec_hop"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeff_shape", [(3, 4, 9), (4, 1), ()], ids=str)
def test_gradcheck(impl, reverse, coeff_shape):
    fn = CPU_IMPLS[impl]
    x = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(coeff_shape, dtype=torch.float64) * 0.6 + 0.4).requires_grad_()
    h0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, c, h0: fn(x, c, reverse, initial=h0), (x, c, h0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("length", [1, 2, 17, 300])
def test_grads_match_reference(impl, reverse, dim, length):
    shape = [3, 5, 4]
    shape[dim] = length
    x = torch.randn(shape, dtype=torch.float64).transpose(0, 2).contiguous().transpose(0, 2)  # non-contiguous
    c = torch.rand(shape, dtype=torch.float64) * 0.6 + 0.4
    h0 = torch.randn(shape[:dim] + shape[dim + 1 :], dtype=torch.float64)
    dy = torch.randn(shape, dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, dy)

    got = grads(lambda x, c, h0: CPU_IMPLS[impl](x, c, reverse, dim=dim, initial=h0))
    want = grads(lambda x, c, h0: reference(x, c, reverse, dim, h0))
    for name, g, w in zip(("inputs", "coeffs", "initial"), got, want):
        assert rel_error(g, w) < 1e-12, name


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("channels", [1, 20, 600])
def test_channel_last_grads_match_reference(reverse, channels):
    """(B, T, D) scanned over T, every tensor contiguous: the CPU kernels walk neighbouring
    channels together, at most 512 at a time, and never across the end of a batch."""
    x = torch.randn(3, 33, channels, dtype=torch.float64)
    c = torch.rand(3, 33, channels, dtype=torch.float64) * 0.6 + 0.4
    h0 = torch.randn(3, channels, dtype=torch.float64)
    dy = torch.randn(3, 33, channels, dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, dy))

    got = grads(lambda x, c, h0: CPU_IMPLS["linrec"](x, c, reverse, dim=1, initial=h0))
    want = grads(lambda x, c, h0: reference(x, c, reverse, 1, h0))
    for name, g, w in zip(("outputs", "inputs", "coeffs", "initial"), got, want):
        assert rel_error(g, w) < 1e-12, name


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape", [(1, 37), (3, 37), (4, 37), (2, 9, 37), (2, 15, 4096)], ids=str)
@pytest.mark.parametrize("coeffs_layout", ["contiguous", "strided", "broadcast"])
def test_row_runs_grads_match_reference(reverse, shape, coeffs_layout):
    """Sequences stored as rows: the CPU kernels walk 4 of them at a time (cpu_kernels.cpp),
    each tensor with its own row stride (a strided coeffs view, or 0 where coeffs broadcast),
    and one at a time where fewer than 4 are left in a batch or in a thread's share
    ((2, 15, 4096) splits over threads)."""
    x = torch.randn(shape, dtype=torch.float64)
    dy = torch.randn(shape, dtype=torch.float64)
    # Leaves, and the views of them that the call takes: coeffs every other element of wider
    # rows, or one row for every sequence; initial not row-major.
    coeffs_leaf, coeffs_view = {
        "contiguous": (torch.rand(shape), lambda t: t),
        "strided": (torch.rand(*shape[:-1], 2 * shape[-1] + 3), lambda t: t[..., 1::2][..., : shape[-1]]),
        "broadcast": (torch.rand(shape[-1]), lambda t: t),
    }[coeffs_layout]
    coeffs_leaf = coeffs_leaf.double() * 0.6 + 0.4
    initial_leaf = torch.randn(shape[:-1][::-1], dtype=torch.float64)

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (x, coeffs_leaf, initial_leaf)]
        out = fn(leaves[0], coeffs_view(leaves[1]), leaves[2].permute(*reversed(range(leaves[2].dim()))))
        return (out, *torch.autograd.grad(out, leaves, dy))

    got = grads(lambda x, c, h0: CPU_IMPLS["linrec"](x, c, reverse, initial=h0))
    want = grads(lambda x, c, h0: reference(x, c, reverse, -1, h0))
    for name, g, w in zip(("outputs", "inputs", "coeffs", "initial"), got, want):
        assert rel_error(g, w) < 1e-12, name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeff_shape", [(3, 4, 9), (4, 1)], ids=str)
def test_gradgradcheck(impl, reverse, coeff_shape):
    """Second derivatives (create_graph=True: gradient penalties, Hessian-vector products) against
    finite differences of the first, zero coefficients included."""
    fn = CPU_IMPLS[impl]
    x = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    c = torch.rand(coeff_shape, dtype=torch.float64) * 0.6 + 0.4
    c.view(-1)[1] = 0
    c.requires_grad_()
    h0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, c, h0: fn(x, c, reverse, initial=h0), (x, c, h0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 2])
@pytest.mark.parametrize("length", [0, 1, 40])
def test_double_backward_matches_reference(impl, reverse, dim, length):
    """A Hessian-vector product (the gradient of <grad, v>) against autograd through the reference
    loop; the first-order gradients taken with create_graph=True equal those taken without."""
    shape = [3, 4, 5]
    shape[dim] = length
    g = torch.Generator().manual_seed(length + dim)
    x, w = (torch.randn(shape, dtype=torch.float64, generator=g) for _ in range(2))
    c = torch.rand(shape, dtype=torch.float64, generator=g) * 0.6 + 0.4
    h0 = torch.randn(shape[:dim] + shape[dim + 1:], dtype=torch.float64, generator=g)
    v = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in (x, c, h0)]

    def hvp(fn):
        leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
        y = fn(leaves[0], leaves[1], leaves[2])
        grads = torch.autograd.grad((y * w).sum(), leaves, create_graph=True, allow_unused=True,
                                    materialize_grads=True)  # linrec_hop of an empty scan skips initial
        dot = sum((a * b).sum() for a, b in zip(grads, v))
        if not dot.requires_grad:  # an empty scan: gradients that depend on nothing
            return grads, [torch.zeros_like(t) for t in leaves]
        return grads, torch.autograd.grad(dot, leaves, allow_unused=True, materialize_grads=True)

    grads, got = hvp(lambda x, c, h0: CPU_IMPLS[impl](x, c, reverse, dim=dim, initial=h0))
    # The reference of an empty scan has no graph; its Hessian is zero.
    want = hvp(lambda x, c, h0: reference(x, c, reverse, dim, h0))[1] if length else [torch.zeros_like(t) for t in v]
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    plain = torch.autograd.grad((CPU_IMPLS[impl](*leaves[:2], reverse, dim=dim, initial=leaves[2]) * w).sum(), leaves,
                                allow_unused=True, materialize_grads=True)
    for name, a, b in zip(("inputs", "coeffs", "initial"), got, want):
        assert rel_error(a, b) < 1e-12, name
    for a, p in zip(grads, plain):
        assert rel_error(a.detach(), p) < 1e-15


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeff_shape", [(3, 4, 9), (4, 1), ()], ids=str)
def test_forward_ad_gradcheck(reverse, coeff_shape):
    """Forward-mode AD (the tangent is one more recurrence) against finite differences."""
    x = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(coeff_shape, dtype=torch.float64) * 0.6 + 0.4).requires_grad_()
    h0 = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    fn = CPU_IMPLS["linrec"]
    assert torch.autograd.gradcheck(lambda x, c, h0: fn(x, c, reverse, initial=h0), (x, c, h0),
                                    check_forward_ad=True, check_backward_ad=False, check_batched_grad=False)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("length", [0, 1, 17])
@pytest.mark.parametrize("tangents", ["all", "inputs", "coeffs", "initial", "none_initial"])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_forward_ad_matches_reference(reverse, dim, length, tangents, grad_mode):
    """Dual tensors that do not require grad (and under no_grad, which forward AD ignores):
    the tangent must not be dropped, whichever inputs carry one."""
    import torch.autograd.forward_ad as fwAD

    shape = [3, 5, 4]
    shape[dim] = length
    x = torch.randn(shape, dtype=torch.float64)
    c = torch.rand(shape, dtype=torch.float64) * 0.6 + 0.4
    h0 = None if tangents == "none_initial" else torch.randn(shape[:dim] + shape[dim + 1 :], dtype=torch.float64)
    carries = {"x": tangents in ("all", "inputs", "none_initial"), "c": tangents in ("all", "coeffs"),
               "h0": tangents in ("all", "initial")}

    def tangent_of(fn):
        with fwAD.dual_level(), torch.set_grad_enabled(grad_mode):
            args = [fwAD.make_dual(t, torch.randn_like(t, generator=torch.Generator().manual_seed(i)))
                    if t is not None and carries[k] else t for i, (k, t) in enumerate(zip("x c h0".split(), (x, c, h0)))]
            return fwAD.unpack_dual(fn(*args)).tangent

    got = tangent_of(lambda x, c, h0: CPU_IMPLS["linrec"](x, c, reverse, dim=dim, initial=h0))
    want = tangent_of(lambda x, c, h0: reference(x, c, reverse, dim, h0))
    assert got is not None and got.shape == x.shape
    assert rel_error(got, want) < 1e-12 if length else got.numel() == 0


def test_zero_length_grads():
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    c = torch.rand(3, 0, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = CPU_IMPLS["linrec"](x, c, initial=h0)
    assert out.shape == (3, 0)
    out.sum().backward()
    assert x.grad.shape == (3, 0) and torch.equal(h0.grad, torch.zeros(3, dtype=torch.float64))


def test_bf16_training_step():
    """A bf16 forward+backward stays close to the float64 reference."""
    x = torch.randn(4, 200).bfloat16().requires_grad_()
    c = (torch.rand(4, 200) * 0.5 + 0.5).bfloat16().requires_grad_()
    CPU_IMPLS["linrec"](x, c).float().pow(2).sum().backward()
    xr, cr = x.detach().double().requires_grad_(), c.detach().double().requires_grad_()
    reference(xr, cr).pow(2).sum().backward()
    assert rel_error(x.grad, xr.grad) < 2e-2
    assert rel_error(c.grad, cr.grad) < 2e-2


TRANSFORM_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and linrec.build_info()["cuda"] else [])


TRANSFORMS = ["vmap", "vmap_in_dims", "grad", "jacrev", "jacfwd", "jvp", "hessian", "per_sample_grad"]


def torch_func_case(device, transform, fn):
    """(ours, theirs, inputs): the torch.func `transform` of `fn` (linrec.linrec's signature) and
    of the reference loop, as functions of the float64 tensors `inputs` (x, c, h)."""
    func = torch.func
    g = torch.Generator().manual_seed(7)
    inputs = (torch.randn(4, 3, 20, dtype=torch.float64, generator=g).to(device),
              (torch.rand(4, 3, 20, dtype=torch.float64, generator=g) * 0.5 + 0.5).to(device),
              torch.randn(4, 3, dtype=torch.float64, generator=g).to(device))
    cases = {
        "vmap": lambda f, x, c, h: func.vmap(f)(x, c, h),
        "vmap_in_dims": lambda f, x, c, h: func.vmap(lambda a, b, s: f(a, b, s, dim=0, reverse=True),
                                                     in_dims=(2, None, None))(x, c[..., 0], h[0]),
        "grad": lambda f, x, c, h: func.grad(lambda a, b, s: f(a, b, s).pow(2).sum(), argnums=(0, 1, 2))(x, c, h),
        "jacrev": lambda f, x, c, h: func.jacrev(lambda b: f(x[0, 0], b, h[0, 0]))(c[0, 0]),
        "jacfwd": lambda f, x, c, h: func.jacfwd(lambda s: f(x[0], c[0], s))(h[0]),
        "jvp": lambda f, x, c, h: func.jvp(lambda a, b: f(a, b, h), (x, c), (c, x))[1],
        "hessian": lambda f, x, c, h: func.hessian(lambda b: f(x[0, 0], b, h[0, 0]).pow(3).sum())(c[0, 0]),
        "per_sample_grad": lambda f, x, c, h: func.vmap(
            func.grad(lambda a, b: f(a, b, None).pow(2).sum(), argnums=1))(x, c),
    }

    def ours(a, b, s, dim=-1, reverse=False):
        return fn(a, b, reverse, dim=dim, initial=s)

    def theirs(a, b, s, dim=-1, reverse=False):
        return reference(a, b, reverse, dim, s)

    case = cases[transform]
    return (lambda *xs: case(ours, *xs)), (lambda *xs: case(theirs, *xs)), inputs


def assert_same_results(got, want, tol):
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert rel_error(a, b) < tol


@pytest.mark.parametrize("device", TRANSFORM_DEVICES)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_torch_func_transforms(device, transform):
    """linrec.linrec under torch.func transforms against the same transform of the reference
    loop: vmap (batched, and over a dim that is not the first, with unbatched coeffs), grad,
    jacrev, jacfwd, jvp, hessian and vmap(grad) per-sample gradients."""
    ours, theirs, inputs = torch_func_case(device, transform, linrec.linrec)
    assert_same_results(ours(*inputs), theirs(*inputs), 1e-12)


# torch 2.11 (not 2.13 or 2.14): torch.compile(torch.func.jacrev(f)) returns zeros whenever f breaks
# the graph, as linrec's call does there; a torch.compiler.disable'd `a * b` shows the same.
JACREV_GRAPH_BREAK_BUG = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13)


def xfail_jacrev_on_old_torch(request, transform):
    if transform == "jacrev" and JACREV_GRAPH_BREAK_BUG:
        request.applymarker(pytest.mark.xfail(reason="torch < 2.13: compiled jacrev across a graph break"))


@pytest.mark.parametrize("device", TRANSFORM_DEVICES)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_torch_func_inside_compile(request, device, transform):
    """torch.compile around a torch.func transform of linrec.linrec: the same results as the
    reference's transform. (Traced by Dynamo, the calls had no autograd, and grad, jacrev,
    jacfwd and hessian returned zeros; linrec now breaks the graph there and the transform runs
    eagerly.)"""
    xfail_jacrev_on_old_torch(request, transform)
    torch._dynamo.reset()
    ours, theirs, inputs = torch_func_case(device, transform, linrec.linrec)
    assert_same_results(torch.compile(ours, backend="aot_eager")(*inputs), theirs(*inputs), 1e-12)


@pytest.mark.parametrize("device", TRANSFORM_DEVICES)
@pytest.mark.parametrize("transform", ["grad", "jacrev", "per_sample_grad"])
@pytest.mark.parametrize("with_initial", [False, True])
def test_compiled_torch_func_transform(request, device, transform, with_initial):
    """torch.compile of a transformed function itself, torch.compile(torch.func.grad(f)): the
    form in which Dynamo's trace returned zero gradients."""
    xfail_jacrev_on_old_torch(request, transform)
    _, _, (x, c, h) = torch_func_case(device, "grad", linrec.linrec)
    func = torch.func
    argnums = (0, 1, 2) if with_initial else (0, 1)
    transforms = {
        "grad": lambda f: func.grad(lambda a, b, s: f(a, b, False, -1, s).pow(2).sum(), argnums=argnums),
        "jacrev": lambda f: func.jacrev(lambda a, b, s: f(a, b, False, -1, s), argnums=argnums),
        "per_sample_grad": lambda f: func.vmap(func.grad(lambda a, b, s: f(a, b, True, -1, s).pow(2).sum(),
                                                         argnums=argnums), in_dims=(0, 0, 0 if with_initial else None)),
    }
    rows = (x[0], c[0], h[0]) if transform == "jacrev" else (x, c, h)
    if not with_initial:
        rows = (*rows[:2], None)
    ours = transforms[transform](lambda a, b, r, d, s: linrec.linrec(a, b, r, dim=d, initial=s))
    got = torch.compile(ours, backend="aot_eager")(*rows)
    assert_same_results(got, transforms[transform](reference)(*rows), 1e-12)


@pytest.mark.skipif("cuda" not in TRANSFORM_DEVICES, reason="needs a GPU and the compiled CUDA kernels")
@pytest.mark.parametrize("kernel", ["linrec_tile", "linrec_pipe", "linrec_chained", "linrec_packed"])
def test_compiled_torch_func_on_kernel_functions(kernel):
    """The per-kernel functions of linrec.impl.cuda under torch.compile(torch.func.grad(...))."""
    import linrec.impl.cuda

    fn = getattr(linrec.impl.cuda, kernel)
    config = dict(zip(("elems_per_thread", "threads_per_block", "memcode", "algocode"),
                      linrec.compiled_configs(kernel.removeprefix("linrec_"))[0]))
    _, _, (x, c, h) = torch_func_case("cuda", "grad", linrec.linrec)
    loss = lambda f: lambda a, b, s: f(a, b, True, dim=-1, initial=s).pow(2).sum()  # noqa: E731
    got = torch.compile(torch.func.grad(loss(functools.partial(fn, **config)), argnums=(0, 1, 2)),
                        backend="aot_eager")(x, c, h)
    want = torch.func.grad(loss(lambda a, b, r, dim, initial: reference(a, b, r, dim, initial)),
                           argnums=(0, 1, 2))(x, c, h)
    assert_same_results(got, want, 1e-12)


def test_torch_func_inside_compile_fullgraph_raises():
    """With fullgraph=True that graph break is Dynamo's error, and it names linrec's reason."""
    torch._dynamo.reset()
    ours, _, inputs = torch_func_case("cpu", "grad", linrec.linrec)
    with pytest.raises(Exception, match="linrec runs eagerly under torch.func transforms inside torch.compile"):
        torch.compile(ours, backend="aot_eager", fullgraph=True)(*inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_torch_func_on_triton_raises(monkeypatch):
    """The Triton fallback does not support torch.func: a NotImplementedError naming it."""
    monkeypatch.setattr(linrec._backend, "cuda_backend", lambda index: "triton")
    x = torch.randn(4, 20, dtype=torch.float64, device="cuda")
    c = torch.rand(4, 20, dtype=torch.float64, device="cuda")
    with pytest.raises(NotImplementedError, match="this call takes the Triton kernels"):
        torch.func.grad(lambda b: linrec.linrec(x, b).sum())(c)
    from linrec.impl.triton import linrec_pipe

    with pytest.raises(NotImplementedError, match="this call takes linrec.impl.triton"):
        torch.func.grad(lambda b: linrec_pipe(x, b).sum())(c)
