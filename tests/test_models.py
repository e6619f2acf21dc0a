"""linrec.models against step-by-step float64 references written here, on the CPU (and on the
GPU where there is one): GILR and LS-LSTM, values and gradients (the selective scan:
test_selective_scan.py)."""

import pytest
import torch

from linrec.models import GILR, LSLSTM

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def gilr_loop(proj, x, h0=None):
    """One GILR layer (proj: its nn.Linear) one step at a time, in float64, on (length, batch,
    features) inputs."""
    U, V = proj.weight.double().chunk(2, 0)
    b_g, b_i = proj.bias.double().chunk(2, 0)
    h = h0.double() if h0 is not None else x.new_zeros(x.shape[1], U.shape[0], dtype=torch.float64)
    out = []
    for x_t in x.double():
        g = torch.sigmoid(x_t @ U.T + b_g)
        h = g * h + (1 - g) * torch.tanh(x_t @ V.T + b_i)
        out.append(h)
    return torch.stack(out)


def lslstm_loop(layer, x, c0=None, s0=None):
    """One LS-LSTM layer (layer: an LSLSTM's layers[k]) one step at a time, in float64, on (length,
    batch, features) inputs: h, c, surrogate."""
    n = layer.surrogate_proj.weight.shape[1]
    zeros = x.new_zeros(x.shape[1], n, dtype=torch.float64)
    surrogate = gilr_loop(layer.gilr, x, s0)
    Vx = layer.input_proj.weight.double()
    b = layer.input_proj.bias.double()
    Uh = layer.surrogate_proj.weight.double()
    c = c0.double() if c0 is not None else zeros
    prev = s0.double() if s0 is not None else zeros
    hs, cs = [], []
    for t, x_t in enumerate(x.double()):
        f, i, o, z = (x_t @ Vx.T + b + prev @ Uh.T).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(z)
        hs.append(torch.sigmoid(o) * c)
        cs.append(c)
        prev = surrogate[t]
    return torch.stack(hs), torch.stack(cs), surrogate


def stacked_gilr_loop(model, x, h0=None):
    """GILR's layers one after another: the top layer's states and h_n (num_layers, batch, hidden)."""
    finals = []
    for k, proj in enumerate(model.layers):
        x = gilr_loop(proj, x, None if h0 is None else h0[k])
        finals.append(x[-1])
    return x, torch.stack(finals)


def stacked_lslstm_loop(model, x, state=None):
    """LSLSTM's layers one after another: the top layer's h and (h_n, c_n, s_n)."""
    _, c0, s0 = state or (None, None, None)
    finals = ([], [], [])
    for k, layer in enumerate(model.layers):
        x, c, s = lslstm_loop(layer, x, None if c0 is None else c0[k], None if s0 is None else s0[k])
        for final, t in zip(finals, (x, c, s)):
            final.append(t[-1])
    return x, tuple(torch.stack(f) for f in finals)


def layer_cases(test):
    """Both layouts, one and three layers, with and without an entering state, on every device."""
    for name, values in (("device", DEVICES), ("batch_first", [False, True]), ("num_layers", [1, 3]),
                         ("with_state", [False, True])):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def as_layout(t, batch_first):
    """A (length, batch, ...) tensor in the layer's layout, or back."""
    return t.transpose(0, 1) if batch_first else t


def random_state(num_layers, batch, hidden, device, generator=None):
    return torch.randn(num_layers, batch, hidden, dtype=torch.float64, generator=generator).to(device)


@layer_cases
def test_gilr_matches_loop(device, batch_first, num_layers, with_state):
    torch.manual_seed(0)
    model = GILR(5, 7, batch_first=batch_first, num_layers=num_layers, device=device, dtype=torch.float64)
    x = torch.randn(41, 3, 5, dtype=torch.float64, device=device)  # (length, batch, features)
    h0 = random_state(num_layers, 3, 7, device) if with_state else None
    h, h_n = model(as_layout(x, batch_first), h0)
    h_ref, h_n_ref = stacked_gilr_loop(model, x, h0)
    torch.testing.assert_close(as_layout(h, batch_first), h_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_n, h_n_ref, rtol=1e-12, atol=1e-12)


@layer_cases
def test_lslstm_matches_loop(device, batch_first, num_layers, with_state):
    torch.manual_seed(1)
    model = LSLSTM(4, 6, batch_first=batch_first, num_layers=num_layers, device=device, dtype=torch.float64)
    x = torch.randn(33, 2, 4, dtype=torch.float64, device=device)
    state = tuple(random_state(num_layers, 2, 6, device) for _ in range(3)) if with_state else None
    h, final = model(as_layout(x, batch_first), state)
    h_ref, final_ref = stacked_lslstm_loop(model, x, state)
    torch.testing.assert_close(as_layout(h, batch_first), h_ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(final, final_ref):
        assert got.shape == (num_layers, 2, 6)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model_class", [GILR, LSLSTM])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("length,split", [(23, 10), (17, 1), (9, 8), (15, 0), (15, 15)])
def test_state_round_trips(model_class, batch_first, num_layers, length, split):
    """The final state a call returns enters the next call: two calls over the parts of a sequence
    (odd lengths, a part of one step or none) give one call's outputs and final state over the
    whole, and both the float64 loop's."""
    g = torch.Generator().manual_seed(length * 10 + split)
    torch.manual_seed(length)
    model = model_class(3, 5, batch_first=batch_first, num_layers=num_layers, dtype=torch.float64)
    x = torch.randn(length, 4, 3, dtype=torch.float64, generator=g)  # (length, batch, features)
    entering = random_state(num_layers, 4, 5, "cpu", g)
    state = entering if model_class is GILR else (None, entering, -entering)  # h0 is not read
    whole, final = model(as_layout(x, batch_first), state)
    first, mid = model(as_layout(x[:split], batch_first), state)
    second, end = model(as_layout(x[split:], batch_first), mid)
    torch.testing.assert_close(torch.cat([first, second], 1 if batch_first else 0), whole, rtol=1e-12, atol=1e-12)
    loop = stacked_gilr_loop if model_class is GILR else stacked_lslstm_loop
    whole_ref, final_ref = loop(model, x, state)
    torch.testing.assert_close(as_layout(whole, batch_first), whole_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(end, final, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model_class", [GILR, LSLSTM])
def test_empty_sequence_returns_the_entering_state(model_class):
    model = model_class(3, 5, num_layers=2, dtype=torch.float64)
    x = torch.zeros(0, 4, 3, dtype=torch.float64)
    out, final = model(x)
    zeros = torch.zeros(2, 4, 5, dtype=torch.float64)
    assert out.shape == (0, 4, 5)
    torch.testing.assert_close(final, zeros if model_class is GILR else (zeros,) * 3, rtol=0, atol=0)
    state = torch.randn(2, 4, 5, dtype=torch.float64)
    state = state if model_class is GILR else (state, state + 1, state + 2)
    torch.testing.assert_close(model(x, state)[1], state, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layers_keep_16bit_gates_near_one(device, dtype):
    """16-bit layers whose recurrence gates sit near 1 (memories of ~1000 steps) match the float64
    loop: the gates are scanned in float32. Rounded to 16 bits they would be 1 (checked), which
    would leave the GILR state at its entering value and the cell with an endless memory."""
    torch.manual_seed(3)
    # sigmoid(7.6) = 0.9995 is 1.0 in bfloat16, sigmoid(9) = 0.99988 in float16. Near 8, bfloat16
    # holds a pre-activation to 1/32: (1 - g) moves by up to 3% before any scan, hence the tolerance.
    length, bias = 1500, 7.6 if dtype == torch.bfloat16 else 9.0
    gilr = GILR(4, 6, device=device, dtype=dtype)
    lstm = LSLSTM(4, 6, device=device, dtype=dtype)
    with torch.no_grad():
        for proj, gates in ((gilr.layers[0], 6), (lstm.layers[0].gilr, 6), (lstm.layers[0].input_proj, 6)):
            proj.weight.mul_(0.05)
            proj.bias[:gates] = bias  # GILR: g's bias; LS-LSTM: f's bias (the first chunk of four)
    x = torch.randn(length, 2, 4, device=device).to(dtype)
    assert torch.all(torch.sigmoid(torch.tensor(bias)).to(dtype) == 1)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    h, _ = gilr(x)
    assert h.dtype == dtype and rel(h, gilr_loop(gilr.layers[0], x)) < 5e-2
    h, (_, c_n, _) = lstm(x)
    h_ref, c_ref, _ = lslstm_loop(lstm.layers[0], x)
    assert h.dtype == dtype and rel(h, h_ref) < 5e-2 and rel(c_n[0], c_ref[-1]) < 5e-2


def flat(result):
    out, final = result
    return out, *final


def test_gilr_and_lslstm_gradients():
    """Through two layers, into the entering states and the parameters."""
    torch.manual_seed(2)
    x = torch.randn(2, 11, 3, dtype=torch.float64, requires_grad=True)
    gilr = GILR(3, 4, batch_first=True, num_layers=2, dtype=torch.float64)
    h0 = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h0, *p: gilr(x, h0), (x, h0, *gilr.parameters()))
    lstm = LSLSTM(3, 4, batch_first=True, num_layers=2, dtype=torch.float64)
    state = tuple(torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda x, c0, s0, *p: flat(lstm(x, (None, c0, s0))), (x, *state, *lstm.parameters()))


def test_layer_errors_name_the_argument():
    with pytest.raises(ValueError, match="input of shape \\(2, 5\\) must be 3-d with 3 features"):
        GILR(3, 4)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="h0 of shape \\(2, 4\\) must be \\(num_layers=1, batch=2, 4\\)"):
        GILR(3, 4)(torch.zeros(7, 2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="c0 of shape \\(1, 3, 4\\) must be \\(num_layers=2, batch=2, 4\\)"):
        LSLSTM(3, 4, batch_first=True, num_layers=2)(torch.zeros(2, 7, 3), (None, torch.zeros(1, 3, 4), None))
    with pytest.raises(ValueError, match="state must be \\(h, c, surrogate\\), as LSLSTM returns it; got tuple of 2"):
        LSLSTM(3, 4)(torch.zeros(7, 2, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    for bad in (0, 1.0, True):
        with pytest.raises(ValueError, match=f"num_layers must be a positive int, got {bad!r}"):
            LSLSTM(3, 4, num_layers=bad)
    for layer in (GILR, LSLSTM):
        for bad in (0, -2, 4.5, "4"):
            with pytest.raises(ValueError, match=f"hidden_size must be a positive int, got {bad!r}"):
                layer(3, bad)
            with pytest.raises(ValueError, match=f"input_size must be a positive int, got {bad!r}"):
                layer(bad, 3)


def test_models_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the layers without a graph break; values and
    gradients match the eager calls."""
    x = torch.randn(7, 3, 5, dtype=torch.float64, requires_grad=True)
    layer = LSLSTM(5, 4, num_layers=2, dtype=torch.float64)

    def lslstm(x):
        return layer(x)[0]
    compiled = torch.compile(lslstm, fullgraph=True, backend="aot_eager")
    leaves = [x, *layer.parameters()]
    want = lslstm(x)
    got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(want)
    for g_got, g_want in zip(torch.autograd.grad((got * w).sum(), leaves),
                             torch.autograd.grad((want * w).sum(), leaves)):
        torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)
