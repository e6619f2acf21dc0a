"""linrec.models.Mamba: outputs and gradients against a float64 reference written here, mamba_ssm's
state_dict layout and initialization, decoding one token at a time, 16-bit blocks, and (where
mamba_ssm and a GPU are there) the outputs of mamba_ssm's own block with the same weights."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

from linrec.bench_selective import import_from_mamba_ssm
from linrec.models import Mamba

HAS_GPU = torch.cuda.is_available()

# Small blocks covering mamba_ssm's options: biases on or off, another d_conv, expand and dt_rank.
CONFIGS = {
    "defaults": dict(d_model=8, d_state=4),
    "biases-d_conv3-expand1.5": dict(d_model=6, d_state=3, d_conv=3, expand=1.5, dt_rank=3, bias=True,
                                     conv_bias=False),
}


def randomized_block(config, dtype=torch.float64, device="cpu", seed=0):
    """A block whose every parameter is random: at mamba_ssm's initialization A_log is the same in
    every channel and D is ones, which would hide a mix-up of channels or states."""
    torch.manual_seed(seed)
    block = Mamba(**config, dtype=dtype, device=device)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name == "A_log":
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias") or name == "D":
                p.copy_(torch.randn_like(p))
            else:
                p.mul_(1 + 0.2 * torch.randn_like(p))
    return block


def reference_mamba(params, hidden, d_state, dt_rank, d_conv):
    """The Mamba block in float64 from the formulas: matrix products, the causal depthwise
    convolution as a sum over its taps, and the selective scan as a loop over steps and states.
    params maps mamba_ssm's parameter names to tensors (biases may be missing)."""
    params = {name: p.double() for name, p in params.items()}
    hidden = hidden.double()
    batch, length, _ = hidden.shape

    def linear(x, name):
        y = x @ params[f"{name}.weight"].T
        return y + params[f"{name}.bias"] if f"{name}.bias" in params else y

    x, z = linear(hidden, "in_proj").chunk(2, dim=-1)  # (batch, length, d_inner)
    taps = params["conv1d.weight"][:, 0, :]  # (d_inner, d_conv)
    # Output t reads inputs t - d_conv + 1 .. t; inputs before the sequence are zero.
    earlier = torch.cat([x.new_zeros(batch, d_conv - 1, x.shape[-1]), x], dim=1)
    conv = sum(earlier[:, k:k + length] * taps[:, k] for k in range(d_conv))
    if "conv1d.bias" in params:
        conv = conv + params["conv1d.bias"]
    x = conv * torch.sigmoid(conv)

    dt, B, C = linear(x, "x_proj").split([dt_rank, d_state, d_state], dim=-1)
    delta = torch.log1p(torch.exp(dt @ params["dt_proj.weight"].T + params["dt_proj.bias"]))  # softplus
    A = -torch.exp(params["A_log"])  # (d_inner, d_state)
    state = [x.new_zeros(batch, x.shape[-1]) for _ in range(d_state)]  # one (batch, d_inner) per state
    ys = []
    for t in range(length):
        y_t = params["D"] * x[:, t]
        for n in range(d_state):
            state[n] = torch.exp(delta[:, t] * A[:, n]) * state[n] + delta[:, t] * B[:, t, n, None] * x[:, t]
            y_t = y_t + C[:, t, n, None] * state[n]
        ys.append(y_t)
    y = torch.stack(ys, dim=1) * (z * torch.sigmoid(z))
    return linear(y, "out_proj")


def reference_of(block, hidden):
    return reference_mamba(dict(block.named_parameters()), hidden, block.d_state, block.dt_rank, block.d_conv)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("length", [1, 7, 33])
def test_forward_and_gradients_match_reference(config, length):
    block = randomized_block(config)
    hidden = torch.randn(2, length, block.d_model, dtype=torch.float64, requires_grad=True)
    out = block(hidden)
    expected = reference_of(block, hidden)
    assert out.shape == hidden.shape
    assert_matches_with_gradients(block, hidden, out, expected)


def assert_matches_with_gradients(block, hidden, out, expected, float32_tol=None):
    """out as expected, and the gradients of a weighted sum of each in the input and every
    parameter; float32_tol: the tolerances of float32 parameters' gradients, if not float64's."""
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(out)
    leaves = [hidden, *block.parameters()]
    names = ["input", *(name for name, _ in block.named_parameters())]
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    expected_grads = torch.autograd.grad((expected * weights).sum(), leaves)
    for name, got, want in zip(names, grads, expected_grads):
        tol = float32_tol if float32_tol and want.dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(got, want, **tol, msg=lambda m: f"d{name}: {m}")


# mamba_ssm's Mamba state_dict, key -> shape, for a few constructor arguments (from
# mamba_ssm/modules/mamba_simple.py, 2.3.2).
MAMBA_SSM_STATE_DICTS = [
    (dict(d_model=768), {  # Mamba-130m's blocks: d_inner 1536, dt_rank 48
        "A_log": (1536, 16), "D": (1536,),
        "in_proj.weight": (3072, 768),
        "conv1d.weight": (1536, 1, 4), "conv1d.bias": (1536,),
        "x_proj.weight": (80, 1536),
        "dt_proj.weight": (1536, 48), "dt_proj.bias": (1536,),
        "out_proj.weight": (768, 1536),
    }),
    (dict(d_model=24, d_state=8, d_conv=3, expand=1.5, bias=True, conv_bias=False), {  # d_inner 36, dt_rank 2
        "A_log": (36, 8), "D": (36,),
        "in_proj.weight": (72, 24), "in_proj.bias": (72,),
        "conv1d.weight": (36, 1, 3),
        "x_proj.weight": (18, 36),
        "dt_proj.weight": (36, 2), "dt_proj.bias": (36,),
        "out_proj.weight": (24, 36), "out_proj.bias": (24,),
    }),
    (dict(d_model=40, d_state=4, expand=3, dt_rank=5), {  # d_inner 120
        "A_log": (120, 4), "D": (120,),
        "in_proj.weight": (240, 40),
        "conv1d.weight": (120, 1, 4), "conv1d.bias": (120,),
        "x_proj.weight": (13, 120),
        "dt_proj.weight": (120, 5), "dt_proj.bias": (120,),
        "out_proj.weight": (40, 120),
    }),
]


@pytest.mark.parametrize("config,expected", MAMBA_SSM_STATE_DICTS, ids=["130m", "biases", "dt_rank5"])
def test_state_dict_matches_mamba_ssm(config, expected):
    state = Mamba(**config).state_dict()
    assert {name: tuple(t.shape) for name, t in state.items()} == expected
    Mamba(**config).load_state_dict({name: torch.zeros(shape) for name, shape in expected.items()})


def test_parameter_dtypes_and_markers():
    """A_log and D stay float32 in a 16-bit block, as mamba_ssm's; the optimizer markers are set."""
    block = Mamba(16, dtype=torch.bfloat16)
    for name, p in block.named_parameters():
        assert p.dtype == (torch.float32 if name in ("A_log", "D") else torch.bfloat16), name
    assert block.A_log._no_weight_decay and block.D._no_weight_decay
    assert block.dt_proj.bias._no_reinit


@pytest.mark.parametrize("dt_init", ["random", "constant"])
def test_initialization(dt_init):
    dt_min, dt_max, floor, scale = 0.01, 0.2, 0.02, 2.0
    block = Mamba(64, d_state=5, dt_min=dt_min, dt_max=dt_max, dt_init=dt_init, dt_scale=scale,
                  dt_init_floor=floor, dtype=torch.float64)
    d_inner, dt_rank = 128, 4
    assert (block.d_inner, block.dt_rank) == (d_inner, dt_rank)
    torch.testing.assert_close(block.A_log, torch.log(torch.arange(1.0, 6.0)).expand(d_inner, 5))
    torch.testing.assert_close(block.D, torch.ones(d_inner))
    bound = dt_rank ** -0.5 * scale
    weight = block.dt_proj.weight.detach()
    if dt_init == "constant":
        torch.testing.assert_close(weight, torch.full_like(weight, bound))
    else:
        assert weight.abs().max() <= bound and weight.std() > bound / 3  # uniform in +-bound
    initial_dt = F.softplus(block.dt_proj.bias.detach())
    assert initial_dt.min() >= floor * (1 - 1e-12) and initial_dt.max() <= dt_max * (1 + 1e-12)
    # Log-uniform in [0.01, 0.2]: about 23% of them fall below the floor and are raised to it.
    assert torch.isclose(initial_dt, torch.tensor(floor, dtype=torch.float64)).sum() > 0
    assert initial_dt.max() > math.exp((math.log(dt_min) + math.log(dt_max)) / 2)
    with pytest.raises(ValueError, match="dt_init"):
        Mamba(8, dt_init="normal")


@dataclass
class InferenceParams:
    """The fields of mamba_ssm's InferenceParams that a Mamba block reads."""

    seqlen_offset: int = 0
    key_value_memory_dict: dict = field(default_factory=dict)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_step_by_step_equals_forward(config):
    """Decoding: one token at a time from zero states gives forward's outputs, and so does a
    prompt run through forward (filling the states) followed by steps."""
    block = randomized_block(config)
    batch, length = 2, 11
    hidden = torch.randn(batch, length, block.d_model, dtype=torch.float64)
    with torch.no_grad():
        expected = block(hidden)
        conv_state, ssm_state = block.allocate_inference_cache(batch, length)
        assert conv_state.shape == (batch, block.d_inner, block.d_conv)
        assert ssm_state.shape == (batch, block.d_inner, block.d_state)
        stepped = [block.step(hidden[:, t:t + 1], conv_state, ssm_state)[0] for t in range(length)]
        torch.testing.assert_close(torch.cat(stepped, dim=1), expected, rtol=1e-10, atol=1e-10)

        block.layer_idx = 3
        for prompt in (2, 6):  # shorter than d_conv (the conv_state is padded with zeros) and longer
            params = InferenceParams()
            outputs = [block(hidden[:, :prompt], params)]
            for t in range(prompt, length):
                params.seqlen_offset = t
                outputs.append(block(hidden[:, t:t + 1], params))
            torch.testing.assert_close(torch.cat(outputs, dim=1), expected, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(params.key_value_memory_dict[3], (conv_state, ssm_state),
                                       rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="one token"):
        block.step(hidden[:, :2], conv_state, ssm_state)


def test_inference_cache_dtype():
    block = Mamba(8, dtype=torch.bfloat16)
    assert all(s.dtype == torch.bfloat16 for s in block.allocate_inference_cache(1, 4))
    assert all(s.dtype == torch.float32 for s in block.allocate_inference_cache(1, 4, dtype=torch.float32))


def test_bfloat16_block_close_to_float32():
    """A bfloat16 block runs forward and backward, and lands near the float32 block with the same
    weights (bfloat16 keeps about 3 significant digits)."""
    reference = randomized_block(CONFIGS["defaults"], dtype=torch.float32)
    block = Mamba(**CONFIGS["defaults"], dtype=torch.bfloat16)  # A_log and D in float32, as mamba_ssm's
    block.load_state_dict(reference.state_dict())
    hidden = torch.randn(2, 33, 8)
    want = reference(hidden)
    got = block(hidden.bfloat16())
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() < 3e-2
    got.float().square().sum().backward()
    want.square().sum().backward()
    for (name, p), p_ref in zip(block.named_parameters(), reference.parameters()):
        assert torch.isfinite(p.grad).all(), name
        err = ((p.grad.float() - p_ref.grad).norm() / p_ref.grad.norm()).item()
        assert err < 5e-2, f"d{name}: relative error {err}"


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the block without a graph break; outputs and
    gradients as the eager block's."""
    block = randomized_block(CONFIGS["biases-d_conv3-expand1.5"])
    hidden = torch.randn(2, 9, block.d_model, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got, want = compiled(hidden), block(hidden)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    leaves = [hidden, *block.parameters()]
    for g_got, g_want in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(want.sum(), leaves)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_packed_segments_run_as_alone(config):
    """forward(cu_seqlens=...) on a packed batch: output and every gradient as the float64 reference
    run on each segment alone (an empty segment, one step, steps fewer than the convolution's
    taps, and longer ones)."""
    block = randomized_block(config)
    cu = [0, 0, 1, 3, 15, 40]
    hidden = torch.randn(2, cu[-1], block.d_model, dtype=torch.float64, requires_grad=True)
    out = block(hidden, cu_seqlens=torch.tensor(cu))
    expected = torch.cat([reference_of(block, hidden[:, a:b]) for a, b in zip(cu[:-1], cu[1:]) if b > a], dim=1)
    # A_log and D are float32 parameters (as mamba_ssm keeps them): the reference's gradient there
    # is a float32 sum of one rounded term a segment.
    assert_matches_with_gradients(block, hidden, out, expected, float32_tol=dict(rtol=1e-5, atol=1e-7))
    assert not torch.allclose(block(hidden), out)  # without cu_seqlens the segments would mix


def test_empty_sequences():
    """A length of 0: an empty output, and gradients that are zero (the parameters get no signal)."""
    block = randomized_block(next(iter(CONFIGS.values())))
    hidden = torch.randn(2, 0, block.d_model, dtype=torch.float64, requires_grad=True)
    for out in (block(hidden), block(hidden, cu_seqlens=torch.tensor([0, 0]))):
        assert out.shape == hidden.shape
        grads = torch.autograd.grad(out.sum(), list(block.parameters()), allow_unused=True)
        assert all(g is None or not g.any() for g in grads)


@pytest.mark.parametrize("kwargs,message", [
    (dict(d_model=0), "d_model must be a positive int, got 0"),
    (dict(d_model=4.5), "d_model must be a positive int, got 4.5"),
    (dict(d_model=8, d_state=-1), "d_state must be a positive int"),
    (dict(d_model=8, d_conv=0), "d_conv must be a positive int"),
    (dict(d_model=8, expand=0), "expand must be a number with int"),
    (dict(d_model=8, dt_rank=0), "dt_rank must be 'auto' or a positive int, got 0"),
    (dict(d_model=8, dt_rank="bad"), "dt_rank must be 'auto' or a positive int, got 'bad'"),
    (dict(d_model=8, dt_min=0), "dt_min and dt_max must be numbers with 0 < dt_min <= dt_max, got 0 and 0.1"),
    (dict(d_model=8, dt_min=0.5), "dt_min and dt_max must be numbers with 0 < dt_min <= dt_max, got 0.5 and 0.1"),
])
def test_constructor_errors_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(f"linrec: Mamba's {message}")):
        Mamba(**kwargs)


def test_errors():
    block = Mamba(8)
    with pytest.raises(ValueError, match="Mamba's input must be a tensor, got list"):
        block([[1.0] * 8])
    with pytest.raises(ValueError, match="cu_seqlens or inference_params"):
        block(torch.randn(1, 5, 8), InferenceParams(), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"end at hidden_states.shape\[1\] = 5"):
        block(torch.randn(1, 5, 8), cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="d_model=8"):
        block(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="layer_idx"):
        block(torch.randn(2, 5, 8), InferenceParams())


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("length", [1, 33, 300])
def test_gpu_matches_reference(length):
    block = randomized_block(CONFIGS["defaults"], dtype=torch.float32, device="cuda")
    hidden = torch.randn(2, length, block.d_model, device="cuda")
    with torch.no_grad():
        got = block(hidden)
        want = reference_of(block, hidden)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-4


def mamba_ssm_block_class():
    """mamba_ssm's Mamba, or None where it cannot be imported."""
    return import_from_mamba_ssm("mamba_ssm.modules.mamba_simple", "Mamba")


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("config", [dict(d_model=64), dict(d_model=48, d_state=8, d_conv=3, bias=True)],
                         ids=["defaults", "biases"])
def test_matches_mamba_ssm(config):
    """mamba_ssm's own block (its selective scan kernel, use_fast_path=False) and ours with its
    state_dict: the same outputs, float32."""
    mamba_ssm_class = mamba_ssm_block_class()
    if mamba_ssm_class is None:
        pytest.skip("mamba_ssm is not importable")
    torch.manual_seed(0)
    peer = mamba_ssm_class(**config, use_fast_path=False, device="cuda")
    with torch.no_grad():  # move every parameter off its initial value, as training would
        for p in peer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    block = Mamba(**config, device="cuda")
    block.load_state_dict(peer.state_dict())
    hidden = torch.randn(2, 257, config["d_model"], device="cuda")
    with torch.no_grad():
        want, got = peer(hidden), block(hidden)
    assert ((got - want).norm() / want.norm()).item() < 1e-4
