"""The torch.library side: opcheck, torch.compile without graph breaks, error messages."""

import pytest
import torch

import linrec
from conftest import HAS_CUDA_KERNELS
from reference import reference, reference_with_grads, rel_error


def op_samples(device="cpu"):
    f64 = dict(dtype=torch.float64, device=device)
    x = torch.randn(3, 4, 11, **f64, requires_grad=True)
    c = (torch.rand(3, 4, 11, **f64) * 0.5 + 0.5).requires_grad_()
    h0 = torch.randn(3, 4, **f64, requires_grad=True)
    xt = torch.randn(5, 11, 3, **f64).transpose(1, 2).requires_grad_()  # scan over a strided dim
    ct = torch.rand(5, 11, 3, **f64).transpose(1, 2).requires_grad_()
    return [
        (x, c, h0, -1, False, 0, 0, 0, 0, 3),
        (x, c, None, 2, True, 0, 0, 0, 0, 3),
        (xt, ct, None, 1, False, 0, 0, 0, 0, 3),
    ]


@pytest.mark.parametrize("sample", range(3))
def test_opcheck_fwd(sample):
    torch.library.opcheck(torch.ops.linrec.linrec_fwd.default, op_samples()[sample])


@pytest.mark.parametrize("sample", range(3))
def test_opcheck_raw_fwd(sample):
    """_linrec_fwd, the forward without an autograd kernel that linrec.linrec differentiates
    itself: the same schema checks as linrec_fwd, on inputs that need no gradient, and outputs
    that match the float64 reference."""
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in op_samples()[sample]]
    torch.library.opcheck(torch.ops.linrec._linrec_fwd.default, args)
    x, c, h0, dim, reverse = args[:5]
    y = torch.ops.linrec._linrec_fwd(*args)
    assert rel_error(y, reference(x, c, reverse, dim, h0)) < 1e-10


def test_opcheck_bwd():
    x, c, h0, *config = op_samples()[0]
    y = torch.ops.linrec.linrec_fwd(x.detach(), c.detach(), h0.detach(), *config)
    dy = torch.randn_like(y)
    torch.library.opcheck(torch.ops.linrec.linrec_bwd.default, (dy, c.detach(), y, h0.detach(), *config))


@pytest.mark.parametrize("sample", range(3))
def test_function_and_op_autograd_agree(sample):
    """linrec.linrec differentiates through an autograd.Function (less host work a call); the
    op's own autograd registration (torch.ops.linrec.linrec_fwd called directly) must give the
    same gradients, and both must match the float64 reference."""
    x, c, h0, dim, reverse, *config = op_samples()[sample]
    leaves = [t for t in (x, c, h0) if t is not None]
    dy = torch.randn_like(x)
    y_fn = linrec.linrec(x, c, reverse, dim=dim, initial=h0)
    y_op = torch.ops.linrec.linrec_fwd(x, c, h0, dim, reverse, *config)
    assert torch.equal(y_fn, y_op)
    grads_fn = torch.autograd.grad(y_fn, leaves, dy)
    grads_op = torch.autograd.grad(y_op, leaves, dy)
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    y_ref = reference(ref_leaves[0], ref_leaves[1], reverse, dim, ref_leaves[2] if h0 is not None else None)
    grads_ref = torch.autograd.grad(y_ref, ref_leaves, dy)
    for g_fn, g_op, g_ref in zip(grads_fn, grads_op, grads_ref):
        assert torch.equal(g_fn, g_op)
        assert rel_error(g_fn, g_ref) < 1e-10


def test_constant_marker_matches_torch():
    """linrec marks its backend choice constant for torch.compile without importing Dynamo;
    the mark must be the one torch.compiler.assume_constant_result sets."""
    from linrec._backend import _assume_constant_result

    def ours():
        return 0

    def torchs():
        return 0

    _assume_constant_result(ours)
    torch.compiler.assume_constant_result(torchs)
    assert vars(ours) == vars(torchs) and vars(ours)


def test_import_does_not_load_dynamo():
    """`import linrec` stays light: torch._dynamo is loaded only by whoever compiles."""
    import subprocess
    import sys

    code = "import sys, linrec; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_compile_fullgraph_forward_backward():
    def model(x, w, h0):
        c = torch.sigmoid(w)
        y = linrec.linrec(x * 2.0, c, dim=1, initial=h0)
        return (y.tanh() ** 2).mean()

    x = torch.randn(4, 33, 8, dtype=torch.float64)
    w = torch.randn(8, dtype=torch.float64)
    h0 = torch.randn(4, 8, dtype=torch.float64)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(model)(x, w, h0)
    assert explain.graph_break_count == 0, explain.break_reasons

    compiled = torch.compile(model, fullgraph=True)
    args_c = [t.clone().requires_grad_() for t in (x, w, h0)]
    args_e = [t.clone().requires_grad_() for t in (x, w, h0)]
    loss_c, loss_e = compiled(*args_c), model(*args_e)
    loss_c.backward()
    loss_e.backward()
    assert torch.allclose(loss_c, loss_e)
    for a, b in zip(args_c, args_e):
        assert torch.allclose(a.grad, b.grad)

    # and both against the float64 reference
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    loss_r = (reference(xr * 2.0, torch.sigmoid(wr), dim=1, initial=h0).tanh() ** 2).mean()
    loss_r.backward()
    assert rel_error(args_c[0].grad, xr.grad) < 1e-10
    assert rel_error(args_c[1].grad, wr.grad) < 1e-10


X = torch.randn(2, 3, 5)

BAD_INPUTS = [
    ("coeffs", dict(inputs=X, coeffs=torch.rand(4, 5)), "coeffs of shape"),
    ("coeffs bigger than inputs", dict(inputs=X, coeffs=torch.rand(7, 2, 3, 5)), "does not broadcast"),
    ("int inputs", dict(inputs=torch.ones(2, 5, dtype=torch.int64), coeffs=0.5), "inputs has dtype"),
    ("bool coeffs", dict(inputs=X, coeffs=torch.ones(5, dtype=torch.bool)), "coeffs has dtype"),
    ("int initial", dict(inputs=X, coeffs=0.5, initial=torch.ones(2, 3, dtype=torch.int32)), "initial has dtype"),
    ("dim", dict(inputs=X, coeffs=0.5, dim=3), "dim=3 is out of range"),
    ("negative dim", dict(inputs=X, coeffs=0.5, dim=-4), "dim=-4 is out of range"),
    ("float dim", dict(inputs=X, coeffs=0.5, dim=1.0), "dim must be an int, got float"),
    ("bool dim", dict(inputs=X, coeffs=0.5, dim=True), "dim must be an int, got bool"),
    ("index dim out of range", dict(inputs=X, coeffs=0.5, dim=torch.tensor(3)), "dim=3 is out of range"),
    ("initial shape", dict(inputs=X, coeffs=0.5, initial=torch.randn(2, 5)), "initial of shape"),
    ("0-d inputs", dict(inputs=torch.tensor(1.0), coeffs=0.5), "at least one dimension"),
    ("not a tensor", dict(inputs=[1.0, 2.0], coeffs=0.5), "inputs must be a tensor"),
    ("coeffs type", dict(inputs=X, coeffs="0.5"), "coeffs must be a tensor or a real number"),
    ("reverse string", dict(inputs=X, coeffs=0.5, reverse="yes"), "reverse must be a bool"),
    ("reverse None", dict(inputs=X, coeffs=0.5, reverse=None), "reverse must be a bool"),
    ("reverse 2", dict(inputs=X, coeffs=0.5, reverse=2), "reverse must be a bool"),
    ("sparse inputs", dict(inputs=X.to_sparse(), coeffs=0.5), "inputs must be a dense tensor"),
    ("sparse coeffs", dict(inputs=X, coeffs=torch.rand(2, 3, 5).to_sparse()), "coeffs must be a dense tensor"),
    ("sparse initial", dict(inputs=X, coeffs=0.5, initial=torch.rand(2, 3).to_sparse()),
     "initial must be a dense tensor"),
]


@pytest.mark.parametrize("name,kwargs,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
@pytest.mark.parametrize("impl", ["linrec", "python.linrec_ref", "python.linrec_hop"])
def test_bad_input_errors(name, kwargs, message, impl):
    from conftest import CPU_IMPLS

    with pytest.raises(ValueError, match=message):
        CPU_IMPLS[impl](**kwargs)


@pytest.mark.parametrize("impl", ["triton.linrec_tile", "triton.linrec_pipe", "cuda.linrec_ref", "cuda.linrec_tile",
                                  "cuda.linrec_chained"])
def test_reverse_checked_by_every_wrapper(impl):
    """The Triton and CUDA wrappers check reverse first, as linrec.linrec does (no GPU needed:
    the check comes before the device check)."""
    import importlib

    module, name = impl.split(".")
    fn = getattr(importlib.import_module(f"linrec.impl.{module}"), name)
    with pytest.raises(ValueError, match="reverse must be a bool, got 'yes'"):
        fn(X, torch.rand_like(X), "yes")


class IndexLike:
    """An integer type of another library (numpy.int64 and the like): an int through __index__."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


@pytest.mark.parametrize("impl", ["linrec", "python.linrec_ref", "python.linrec_hop"])
@pytest.mark.parametrize("dim", [IndexLike(1), IndexLike(-2), torch.tensor(1)], ids=["index", "negative", "tensor"])
def test_integer_dim_of_another_type(impl, dim):
    from conftest import CPU_IMPLS

    x, c = torch.randn(3, 7, 2, dtype=torch.float64), torch.rand(3, 7, 2, dtype=torch.float64)
    torch.testing.assert_close(CPU_IMPLS[impl](x, c, dim=dim), reference(x, c, dim=1), rtol=1e-12, atol=1e-12)


def test_device_mismatch_error():
    meta_c = torch.rand(2, 3, 5, device="meta")
    with pytest.raises(ValueError, match="coeffs is on meta but inputs is on cpu"):
        linrec.linrec(X, meta_c)
    with pytest.raises(ValueError, match="initial is on meta"):
        linrec.linrec(X, 0.5, initial=torch.zeros(2, 3, device="meta"))


TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.skipif(TORCH_VERSION < (2, 14), reason="torch < 2.14 crashes on an exception thrown inside a "
                    "stable-ABI kernel (seen on 2.11); linrec's Python layer checks arguments before the op")
def test_op_level_checks():
    """The C++ op checks its own arguments too, for callers that skip the Python layer."""
    c = torch.rand(2, 3, 5)
    with pytest.raises(RuntimeError, match="coeffs must have the shape of inputs"):
        torch.ops.linrec.linrec_fwd(X, c[:, :2], None, -1, False, 0, 0, 0, 0, 3)
    with pytest.raises(RuntimeError, match="coeffs has dtype"):
        torch.ops.linrec.linrec_fwd(X, c.double(), None, -1, False, 0, 0, 0, 0, 3)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.linrec.linrec_fwd(X, c, None, 5, False, 0, 0, 0, 0, 3)


@pytest.mark.parametrize("capability,archs,covered", [
    ((9, 0), "8.0;9.0", True),
    ((8, 9), "8.0;8.6", True),      # sm_86 SASS runs on sm_89
    ((8, 9), "9.0", False),
    ((9, 0), "9.0a", True),
    ((10, 0), "9.0a;8.0", False),   # arch-specific SASS only on its own arch
    ((12, 0), "9.0;10.0+PTX", True),  # PTX of an older arch
    ((7, 5), "8.0+PTX", False),
    ((9, 0), "", False),
])
def test_arch_coverage(capability, archs, covered):
    assert linrec._backend.archs_cover(capability, archs) == covered


def test_build_info():
    info = linrec.build_info()
    assert info["version"] == linrec.__version__
    assert isinstance(info["cuda"], bool)
    assert "cpu" in info["backends"] and ("cuda" in info["backends"]) == info["cuda"]
    if info["cuda"]:
        assert set(info["configs"]) == {"tile", "strided", "packed"}
        assert all(cs and all(len(c) == 4 for c in cs) for cs in info["configs"].values())


def test_compiled_configs_names_the_kernel():
    with pytest.raises(ValueError, match="kernel='scan'"):
        linrec.compiled_configs("scan")


def test_tune_best_table_uses_the_dtype_tolerance():
    """linrec.tune keeps the fastest run under the error bound it is given (16-bit runs err ~1e-3)."""
    from linrec.tune import MAX_ERROR, best_table

    rows = [
        dict(kernel="strided", length=64, config=(8, 128, 0, 3), error=2e-3, fwd_gbs=900.0),
        dict(kernel="strided", length=64, config=(8, 256, 0, 3), error=1.6e-3, fwd_gbs=1300.0),
        dict(kernel="strided", length=64, config=(16, 128, 0, 3), error=float("nan"), fwd_gbs=5000.0),
    ]
    assert best_table(rows, "strided", "fwd", MAX_ERROR["bfloat16"]) == [(64, 1300.0, (8, 256, 0, 3))]
    assert best_table(rows, "strided", "fwd", MAX_ERROR["float32"]) == []


def test_cli_output_into_a_closed_pipe():
    """`python -m linrec --info | head -4` exits 0 without a traceback when head
    closes the pipe first (PYTHONUNBUFFERED makes print write before the pipe
    closes, so with a pipe it is a race; here the read end is closed before the
    process starts, so every write fails)."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "linrec", "--info"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write_end)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


def run_python(code, extra_env=None):
    """Runs `code` in a fresh interpreter (a first `import linrec` there) and returns its stdout."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **(extra_env or {})}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


# Makes the dynamic loader's failure on `module` happen in a subprocess: an import hook.
FAIL_MODULE = """
import importlib.abc, sys
class FailExtension(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise ImportError("libtorch_cuda.so: cannot open shared object file: No such file or directory")
sys.meta_path.insert(0, FailExtension())
"""

needs_cuda_part = pytest.mark.skipif(not linrec._C.build_info()["cuda_version"], reason="a build without CUDA kernels")


def test_extension_load_failure_names_the_cause():
    """linrec._C (ops and CPU kernel) links only torch's CPU libraries; where even it cannot load
    (a torch older than the stable ABI), the ImportError says which torch this is and what to do."""
    out = run_python(FAIL_MODULE.format(module="linrec._C") + """
import torch
try:
    import linrec
except ImportError as e:
    print(e)
    print("cause:", type(e.__cause__).__name__)
""")
    assert "its compiled extension does not load with this torch (" + torch.__version__ in out
    assert "libtorch_cuda.so: cannot open shared object file" in out
    assert "--no-binary linrec" in out and "cause: ImportError" in out


CPU_CALL_AND_INFO = """
import json, torch, linrec
from linrec.impl.python import linrec_hop
x, c = torch.randn(3, 50, dtype=torch.float64), torch.rand(3, 50, dtype=torch.float64)
assert torch.allclose(linrec.linrec(x, c), linrec_hop(x, c))
info = linrec.build_info()
print(json.dumps({k: info.get(k) for k in ("cuda", "cuda_unavailable", "backends")}))
print(json.dumps(linrec.compiled_configs("chained")))
"""


@needs_cuda_part
def test_cuda_kernels_that_cannot_load_leave_the_cpu_kernel():
    """A binary wheel's CUDA part (linrec._C_cuda) links the CUDA runtime and torch's CUDA library
    of its CUDA version. Where they are missing, `import linrec` still works: the CPU kernel runs,
    build_info says why the CUDA kernels are not there, and there are no compiled configs."""
    import json

    lines = run_python(FAIL_MODULE.format(module="linrec._C_cuda") + CPU_CALL_AND_INFO).splitlines()
    info, configs = json.loads(lines[-2]), json.loads(lines[-1])
    assert info["cuda"] is False and "cuda" not in info["backends"] and configs == []
    assert "do not load: libtorch_cuda.so: cannot open shared object file" in info["cuda_unavailable"]


@needs_cuda_part
@pytest.mark.parametrize("torch_cuda", [None, "99.1"])
def test_cuda_kernels_not_loaded_next_to_another_cuda(torch_cuda):
    """Next to a CPU-only torch, or one of another CUDA major version, linrec._C_cuda is not even
    loaded (two CUDA runtimes in one process); build_info names both versions."""
    import json

    patch = f"import torch; torch.version.cuda = {torch_cuda!r}\n"
    lines = run_python(patch + CPU_CALL_AND_INFO).splitlines()
    info = json.loads(lines[-2])
    built = linrec._C.build_info()["cuda_version"]
    assert info["cuda"] is False and json.loads(lines[-1]) == []
    assert f"built for CUDA {built}" in info["cuda_unavailable"]
    assert ("has CUDA 99.1" if torch_cuda else "has no CUDA") in info["cuda_unavailable"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_storage_coeffs_dtype(dtype):
    """Beside 16-bit inputs, coefficients stay float32 wherever 16 bits would round them (mixed
    storage; bfloat16 stores 0.999 as 1.0): tensors of any other dtype, and numbers 16 bits do
    not hold exactly. Coefficients in the inputs' dtype, and exact numbers, keep it. Under
    torch.compile a number is float32 (nothing to check at trace time)."""
    from linrec._args import normalize

    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    x = torch.randn(2, 8).to(dtype)
    cases = [(torch.full((2, 8), 0.5, dtype=dtype), dtype), (0.5, dtype), (0.999, torch.float32),
             (torch.full((2, 8), 0.5), torch.float32), (torch.full((2, 8), 0.5, dtype=torch.float64), torch.float32),
             (torch.full((2, 8), 0.5, dtype=other), torch.float32), (1e6, torch.float32)]
    for coeffs, want in cases:
        assert normalize(x, coeffs, None, -1)[1].dtype == want, coeffs
    assert normalize(x.float(), 0.999, None, -1)[1].dtype == torch.float32
    assert normalize(x.double(), torch.full((2, 8), 0.5), None, -1)[1].dtype == torch.float64
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: linrec.linrec(a, 0.5), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), linrec.linrec(x, 0.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_storage_op(dtype):
    """The ops take float32 coefficients beside 16-bit inputs: opcheck (schema, fake kernels,
    autograd registration), outputs in the inputs' dtype and d_coeffs in float32, laid out as
    d_outputs; any other pair of dtypes raises, naming both."""
    x = torch.randn(3, 11, 4).to(dtype).transpose(1, 2)
    c = (torch.rand(3, 11, 4) * 0.5 + 0.5).transpose(1, 2)
    h0 = torch.randn(3, 4).to(dtype)
    config = (-1, False, 0, 0, 0, 0, 3)
    torch.library.opcheck(torch.ops.linrec.linrec_fwd.default, (x, c, h0, *config))
    y = torch.ops.linrec.linrec_fwd(x, c, h0, *config)
    assert y.dtype == dtype
    dy = torch.randn_like(y)
    torch.library.opcheck(torch.ops.linrec.linrec_bwd.default, (dy, c, y, h0, *config))
    dx, dc, dh0 = torch.ops.linrec.linrec_bwd(dy, c, y, h0, *config)
    assert (dx.dtype, dc.dtype, dh0.dtype) == (dtype, torch.float32, dtype)
    assert dc.stride() == dy.stride()
    for bad_c in (c.double(), c.to(dtype).float().to(torch.float16 if dtype == torch.bfloat16 else torch.bfloat16)):
        with pytest.raises(RuntimeError, match="coeffs has dtype .* float32 beside float16 or bfloat16"):
            torch.ops.linrec.linrec_fwd(x, bad_c, h0, *config)
    with pytest.raises(RuntimeError, match="coeffs has dtype"):
        torch.ops.linrec.linrec_fwd(x.float(), c.to(dtype), None, *config)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixed_storage_higher_order_and_forward_ad(dtype):
    """Mixed storage through the differentiable backward (create_graph: a Hessian-vector product)
    and forward-mode AD, against the same derivatives of the float64 reference; each derivative
    in its argument's dtype. The decays round to 1 in 16 bits, and every derivative computed from
    the rounded coefficients misses the reference by more than twice the tolerance (checked), so
    a path that rounds them fails."""
    import torch.autograd.forward_ad as fwAD

    decay = 1 - 1.9e-3 if dtype == torch.bfloat16 else 1 - 2.3e-4
    shape = (3, 700)
    x = (torch.rand(shape) + 0.5).to(dtype)
    c = decay + (1 - decay) * 0.1 * torch.rand(shape)
    assert torch.all(c.to(dtype) == 1)
    h0 = torch.randn(3).to(dtype)
    # Scaled so that second derivatives and tangents (sums over ~700 * 700 terms) stay within float16.
    dy, v = (torch.rand(shape) + 0.5).to(dtype), torch.randn(shape) * 1e-3
    tx, tc = (torch.rand(shape) + 0.5).to(dtype), torch.rand(shape) * 1e-3

    def hvp(fn, x, c, h0, dy):
        leaves = [t.detach().requires_grad_() for t in (x, c, h0)]
        g = torch.autograd.grad(fn(leaves[0], leaves[1], initial=leaves[2]), leaves, dy, create_graph=True)
        return g, torch.autograd.grad((g[1] * v.to(g[1].dtype)).sum(), leaves[:2])

    def jvp(fn, x, c, h0):
        with fwAD.dual_level():
            y = fn(fwAD.make_dual(x, tx.to(x.dtype)), fwAD.make_dual(c, tc.to(c.dtype)), initial=h0)
            return fwAD.unpack_dual(y).tangent

    g, hv = hvp(linrec.linrec, x, c, h0, dy)
    g_ref, hv_ref = hvp(reference, x.double(), c.double(), h0.double(), dy.double())
    g_rounded, hv_rounded = hvp(reference, x.double(), c.to(dtype).double(), h0.double(), dy.double())
    assert [t.dtype for t in g] == [dtype, torch.float32, dtype] and [t.dtype for t in hv] == [dtype, torch.float32]
    # 16-bit rounding: within the 16-bit tolerance.
    for ours, ref, rounded in zip(g + hv, g_ref + hv_ref, g_rounded + hv_rounded):
        assert rel_error(ours, ref) < 1e-2
        assert rel_error(rounded, ref) > 2e-2
    tangent = jvp(linrec.linrec, x, c, h0)
    tangent_ref = jvp(reference, x.double(), c.double(), h0.double())
    assert tangent.dtype == dtype
    assert rel_error(tangent, tangent_ref) < 1e-2
    assert rel_error(jvp(reference, x.double(), c.to(dtype).double(), h0.double()), tangent_ref) > 2e-2


def _randn(*shape, device):
    return torch.randn(*shape, device=device)


# Tensors in the layouts the ops' outputs follow, scanned over dim 1: row-major, permuted, with a
# dim of size 1 at an odd stride, with gaps, broadcast, channels-last 4-D with gaps, without
# elements, and dense in more dims than merge.
LAYOUTS = {
    "row-major": lambda d: _randn(3, 7, 5, device=d),
    "permuted": lambda d: _randn(5, 3, 7, device=d).permute(1, 2, 0),
    "size-1 dim": lambda d: _randn(21, device=d).as_strided((3, 7, 1), (7, 1, 100)),
    "gaps": lambda d: _randn(3, 14, 5, device=d)[:, ::2],
    "broadcast": lambda d: _randn(1, 7, 5, device=d).expand(3, 7, 5),
    "channels-last gaps": lambda d: _randn(2, 3, 7, 10, device=d).to(memory_format=torch.channels_last)[..., ::2],
    "empty": lambda d: _randn(0, 7, 5, device=d).transpose(0, 1),
    # Dense, but no two neighbouring dims merge: more sequence dims than the kernels index
    # (kMaxSeqDims), so the op scans row-major copies and copies its outputs back.
    "8-D reversed": lambda d: _randn(2, 3, 2, 3, 2, 3, 2, 5, device=d).permute(7, 6, 5, 4, 3, 2, 1, 0),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA_KERNELS, reason="needs a GPU and linrec's CUDA kernels"))])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_outputs_laid_out_as_empty_like(layout, device):
    """The ops allocate their outputs as torch.empty_like would (and their fake kernels do), for
    every layout, on each device: traced graphs rely on the fake kernels' strides."""
    x = LAYOUTS[layout](device)
    c = torch.rand_like(x)
    config = (1, False, 0, 0, 0, 0, 3)
    torch.library.opcheck(torch.ops.linrec.linrec_fwd.default, (x, c, None, *config),
                          test_utils=("test_schema", "test_faketensor"))
    y = torch.ops.linrec.linrec_fwd(x, c, None, *config)
    assert y.stride() == torch.empty_like(x).stride()
    d_y = torch.randn_like(x)
    dx, dc, dh = torch.ops.linrec.linrec_bwd(d_y, c, y, None, *config)
    assert dx.stride() == dc.stride() == torch.empty_like(x).stride()
    assert dh.is_contiguous() and dh.shape == x.shape[:1] + x.shape[2:]
    if x.numel() == 0:
        return
    # The values too, against the float64 loop: a copy into the wrong layout would scramble them.
    y_ref, dx_ref, dc_ref, _ = reference_with_grads(x.cpu(), c.cpu(), d_y.cpu(), dim=1)
    for name, got, want in (("y", y, y_ref), ("d_inputs", dx, dx_ref), ("d_coeffs", dc, dc_ref)):
        assert rel_error(got.cpu(), want) < 1e-5, name
