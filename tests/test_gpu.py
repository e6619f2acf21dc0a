"""The CUDA kernels against the float64 reference, on the GPU (skipped without one).

Outputs are allocated by the ops, so before each call the CUDA caching
allocator is filled with NaN blocks that the op's allocations then reuse: an
element the kernel fails to write shows up as NaN.
"""

import pytest
import torch

import linrec
from conftest import HAS_CUDA_KERNELS, gpu_impls
from reference import reference, reference_chunked, reference_with_grads, rel_error

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Mixed storage: (values, coefficients) dtypes, 16-bit inputs beside float32 coefficients.
MIXED = [(torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
STORAGES = DTYPES + MIXED
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 1e-2}
IMPLS = list(gpu_impls()) if HAS_CUDA_KERNELS else ["linrec"]
CONFIGS = linrec.compiled_configs()
STRIDED_CONFIGS = linrec.compiled_configs("strided")
PACKED_CONFIGS = linrec.compiled_configs("packed")
STAGED_CONFIGS = [c for c in linrec.compiled_configs("chained") if c[2] == 3]


def poison(nbytes: int) -> None:
    """Leave NaN-filled free blocks of about nbytes in the caching allocator. All bits set is a
    NaN in every dtype; a float32 NaN (0x7FC00000) reads as 0 and NaN in 16-bit halves."""
    blocks = [torch.full((max(nbytes, 1),), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(6)]
    del blocks


def values_dtype(storage):
    """The inputs' dtype of a storage: a dtype, or a MIXED pair."""
    return storage[0] if isinstance(storage, tuple) else storage


def storage_id(storage):
    """A test id: the dtype, or "mixed_bfloat16" for bfloat16 inputs with float32 coefficients."""
    return "mixed_" + str(storage[0]).removeprefix("torch.") if isinstance(storage, tuple) else str(storage)


def param_id(value):
    """A test id for a storage (storage_id) or anything else (str), such as a shape."""
    return storage_id(value) if isinstance(value, tuple) and isinstance(value[0], torch.dtype) else str(value)


def inputs(shape, dtype, device="cuda"):
    """Inputs and coefficients of a storage: one dtype, or a MIXED (values, coefficients) pair."""
    x_dtype, c_dtype = dtype if isinstance(dtype, tuple) else (dtype, dtype)
    x = torch.randn(shape, device=device).to(x_dtype)
    c = (torch.rand(shape, device=device) * 0.6 + 0.4).to(c_dtype)
    return x, c


def row_layout(num_seqs, length, layout, dtype, device="cuda"):
    """Inputs and coefficients of num_seqs sequences stored as rows: "contiguous",
    "padded" (rows 8 elements longer than the sequence: still aligned when the length
    is) or "shared_coeffs" (contiguous, one coefficient row expanded over all sequences)."""
    x, c = inputs((num_seqs, length + 8), dtype, device)
    if layout == "padded":
        x, c = x[:, :length], c[:, :length]
    else:
        x, c = x[:, :length].contiguous(), c[:, :length].contiguous()
    if layout == "shared_coeffs":
        c = c[:1].expand_as(x)
    return x, c


def check_fwd_bwd(fn, x, c, h0, reverse, dim=-1):
    """Forward and the gradients of fn (all three, or two where h0 is None) against autograd
    through the float64 reference."""
    tol = TOL[x.dtype]
    # detach() keeps each view's strides and offset; clone() would make a
    # strided or misaligned view contiguous before the op saw it.
    leaves = [t.detach().requires_grad_() for t in (x, c)]
    if h0 is not None:
        leaves.append(h0.detach().clone().requires_grad_())
    poison(3 * x.numel() * x.element_size())
    y = fn(leaves[0], leaves[1], reverse, dim=dim, initial=leaves[2] if h0 is not None else None)
    dy = torch.randn_like(y)
    poison(3 * x.numel() * x.element_size())
    grads = torch.autograd.grad(y, leaves, dy)
    assert y.dtype == x.dtype and grads[0].dtype == x.dtype and grads[1].dtype == c.dtype

    if x.shape[dim] == 0:  # nothing to scan: the initial state gets no gradient
        assert y.shape == x.shape and grads[0].shape == x.shape and grads[1].shape == x.shape
        assert h0 is None or torch.equal(grads[2], torch.zeros_like(h0))
        return
    if x.shape[dim] > 1024 and c.shape == x.shape:  # autograd through the loop takes seconds
        y_ref, *ref_grads = reference_with_grads(x, c, dy, reverse, dim, h0)
    else:
        ref_leaves = [t.detach().double().requires_grad_() for t in (x, c, h0) if t is not None]
        y_ref = reference(*ref_leaves[:2], reverse, dim, ref_leaves[2] if h0 is not None else None)
        ref_grads = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    assert rel_error(y, y_ref) < tol, "outputs"
    for name, g, r in zip(("inputs", "coeffs", "initial"), grads, ref_grads):
        assert rel_error(g, r) < tol, f"d_{name}"


def skip_if_too_long(impl, length):
    if impl == "cuda.linrec_packed" and length > 32 * 4:
        pytest.skip("the packed kernel holds at most 128 elements at its default config")


def config_kwargs(config):
    e, t, m, a = config
    return dict(elems_per_thread=e, threads_per_block=t, memcode=m, algocode=a)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("length", [0, 1, 2, 3, 17, 1000, 4096, 4097, 65537])
@pytest.mark.parametrize("reverse", [False, True])
def test_lengths(impl, length, reverse):
    fn = gpu_impls()[impl]
    max_tile = {"cuda.linrec_tile": 4096, "triton.linrec_tile": 16384, "cuda.linrec_packed": 128}.get(impl)
    if max_tile and length > max_tile:
        with pytest.raises(ValueError, match="kernel (scans|holds) at most"):
            fn(*inputs((2, length), torch.float32))
        return
    x, c = inputs((3, 5, length), torch.float32)
    h0 = torch.randn(3, 5, device="cuda")
    check_fwd_bwd(fn, x, c, h0, reverse)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("length", [1, 17, 128, 1000])
@pytest.mark.parametrize("reverse", [False, True])
def test_no_initial(impl, length, reverse):
    """Every kernel's forward and gradients with initial=None: no state to read, none to write."""
    skip_if_too_long(impl, length)
    x, c = inputs((3, 5, length), torch.float32)
    check_fwd_bwd(gpu_impls()[impl], x, c, None, reverse)


@pytest.mark.parametrize("kernel", ["tile", "pipe", "chained"])
@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_config(kernel, config, dtype, reverse):
    from linrec.impl import cuda

    tile_len = config[0] * config[1]
    length = tile_len - 3 if kernel == "tile" else 3 * tile_len + 5  # partial last tile
    fn = getattr(cuda, f"linrec_{kernel}")
    x, c = inputs((7, length), dtype)
    h0 = torch.randn(7, device="cuda").to(values_dtype(dtype))
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse)


@pytest.mark.parametrize("config", STAGED_CONFIGS, ids=[str(c) for c in STAGED_CONFIGS])
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "strided", "broadcast_coeffs"])
@pytest.mark.parametrize("reverse", [False, True])
def test_every_staged_chained_config(config, dtype, layout, reverse):
    """Chained tiles staged in shared memory: whole aligned tiles (copied
    asynchronously), a misaligned start and a strided view (copied element by
    element), and coefficients broadcast along the sequence (stride 0: one load a
    tile), each with a partial last tile."""
    from linrec.impl import cuda

    length = 2 * config[0] * config[1] + 8  # rows stay 16-byte aligned; the third tile is partial
    x, c = inputs((5, 2 * length + 8), dtype)
    if layout == "contiguous":
        x, c = x[:, :length].contiguous(), c[:, :length].contiguous()
    elif layout == "misaligned":
        x, c = x[:, 1 : length + 1], c[:, 1 : length + 1]
    elif layout == "broadcast_coeffs":
        x, c = x[:, :length].contiguous(), c[:, :1].expand(-1, length)
    else:
        x, c = x[:, ::2], c[:, 1::2]
    h0 = torch.randn(5, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_chained
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse)


@pytest.mark.parametrize("config", [(4, 64, 1, 3), (16, 256, 1, 3), *STAGED_CONFIGS[:2]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, MIXED[0]], ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_chained_many_tiles(config, dtype, reverse):
    """More tiles than fit on the GPU at once, of many sequences, each with a partial
    last tile, through a strided (non-contiguous) view."""
    from linrec.impl import cuda

    length = config[0] * config[1] + 7  # two tiles, the second partial
    seqs = 3_000_000 // length  # more tiles than fit on an H100 at once
    x, c = inputs((seqs, 2 * length), dtype)
    x, c = x[:, ::2], c[:, 1::2]
    h0 = torch.randn(seqs, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_chained
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse)


@pytest.mark.parametrize("config", STRIDED_CONFIGS, ids=[str(c) for c in STRIDED_CONFIGS])
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_strided_config(config, dtype, reverse):
    """Channel-last (B, T, D) over T: a partial last chunk and a partial group of 32 channels."""
    from linrec.impl import cuda

    chunk = config[0] * config[1] // 32
    x, c = inputs((3, 3 * chunk + 5, 45), dtype)
    h0 = torch.randn(3, 45, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_strided
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse, dim=1)


STRIDED_16BIT_LAYOUTS = {
    # two channels a lane: even, unit-stride, aligned channels (a partial group of 64)
    "pairs": lambda x: x,
    # one channel a lane: odd channel count, odd base offset, channel stride 2
    "odd_channels": lambda x: x[..., :45],
    "misaligned": lambda x: x[..., 1:47],
    "channel_stride_2": lambda x: x[..., ::2],
}


@pytest.mark.parametrize("config", STRIDED_CONFIGS, ids=[str(c) for c in STRIDED_CONFIGS])
@pytest.mark.parametrize("layout", list(STRIDED_16BIT_LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, *MIXED], ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_16bit_layouts(config, layout, dtype, reverse):
    """Channel-last 16-bit data, with and without the two-channels-a-lane path (in mixed
    storage a lane's two float32 coefficients are one 8-byte word)."""
    from linrec.impl import cuda

    chunk = config[0] * config[1] // 32
    view = STRIDED_16BIT_LAYOUTS[layout]
    x, c = (view(t) for t in inputs((3, 2 * chunk + 7, 92), dtype))
    h0 = torch.randn(x.shape[0], x.shape[2], device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_strided
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse, dim=1)


@pytest.mark.parametrize("reverse", [False, True])
def test_strided_16bit_broadcast_coeffs(reverse):
    """Coefficients shared by all channels (stride 0 across them): one channel a lane."""
    from linrec.impl import cuda

    x, _ = inputs((2, 301, 64), torch.bfloat16)
    c = (torch.rand(2, 301, 1, device="cuda") * 0.6 + 0.4).to(torch.bfloat16)
    h0 = torch.randn(2, 64, device="cuda").to(torch.bfloat16)
    check_fwd_bwd(cuda.linrec_strided, x, c, h0, reverse, dim=1)


# (batch, channels): one channel (32 lane groups of one lane), an odd count (16-bit data one
# channel a lane), 16-bit channel pairs (6 and 16 channels), and two batches in one group.
FEW_CHANNEL_SHAPES = [(1, 1), (1, 3), (1, 6), (1, 16), (2, 4)]


def strided_chunk_len(config, num_seqs, channel_pairs):
    """Time steps a strided block scans: lanes on as few channels as cover the sequences (a
    power of two), the warp's other lanes on further slices of time."""
    per_lane = 2 if channel_pairs else 1
    lanes = 32
    while lanes > 1 and lanes // 2 * per_lane >= num_seqs:
        lanes //= 2
    return config[0] * config[1] // lanes


@pytest.mark.parametrize("config", STRIDED_CONFIGS, ids=[str(c) for c in STRIDED_CONFIGS])
@pytest.mark.parametrize("batch,channels", FEW_CHANNEL_SHAPES, ids=[f"{b}x{d}" for b, d in FEW_CHANNEL_SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, MIXED[0]], ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_few_channels(config, batch, channels, dtype, reverse):
    """Channel-last (B, T, D) over T with fewer sequences than a warp's lanes take: the lanes
    split into groups over consecutive slices of time. Three chunks, the last partial."""
    from linrec.impl import cuda

    pairs = values_dtype(dtype) == torch.bfloat16 and channels % 2 == 0
    length = 2 * strided_chunk_len(config, batch * channels, pairs) + 5
    x, c = inputs((batch, length, channels), dtype)
    h0 = torch.randn(batch, channels, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_strided
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse, dim=1)


STAGED_STRIDED_CONFIGS = [c for c in STRIDED_CONFIGS if c[2] == 3]
# Rows of 2-16 bytes take the dense-rows kernel; 6 and 8 fp32 channels (24 and 32 bytes) the
# lane-group kernel.
DENSE_ROW_CHANNELS = [1, 3, 4, 6, 8]


@pytest.mark.parametrize("config", STAGED_STRIDED_CONFIGS, ids=[str(c) for c in STAGED_STRIDED_CONFIGS])
@pytest.mark.parametrize("channels", DENSE_ROW_CHANNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, MIXED[0]], ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_dense_rows(config, channels, dtype, reverse):
    """One batch of few channels, rows of at most 16 bytes, T * D * size a multiple of 16:
    each warp stages its whole range of rows (the dense-rows kernel; mixed storage, whose
    tensors' rows differ in bytes, takes the lane-group kernel). Three chunks, the last
    partial, so the reverse scan's ranges start before row 0."""
    from linrec.impl import cuda

    pairs = values_dtype(dtype) == torch.bfloat16 and channels % 2 == 0
    length = 2 * strided_chunk_len(config, channels, pairs) + 8
    x, c = inputs((1, length, channels), dtype)
    h0 = torch.randn(1, channels, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_strided
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse, dim=1)


VECTOR_CONFIGS = [c for c in CONFIGS if c[2] == 1]


@pytest.mark.parametrize("config", VECTOR_CONFIGS, ids=[str(c) for c in VECTOR_CONFIGS])
@pytest.mark.parametrize("case", ["whole_contiguous", "last_thread_empty_padded", "3e_shared_coeffs"])
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_tile_rows_config(config, case, dtype, reverse):
    """The one-tile forward over aligned rows (lengths a multiple of elems_per_thread, at
    most a tile): a whole tile, a tile whose last thread holds nothing (rows padded 8
    elements), and three threads' worth with one coefficient row shared by all sequences.
    test_every_config covers the general tile kernel (length not a multiple)."""
    from linrec.impl import cuda

    e, t = config[0], config[1]
    length, layout = {"whole": (e * t, "contiguous"), "last": (e * t - e, "padded"),
                      "3e": (3 * e, "shared_coeffs")}[case.split("_")[0]]
    x, c = row_layout(67, length, layout, dtype)
    h0 = torch.randn(67, device="cuda").to(values_dtype(dtype))
    check_fwd_bwd(lambda *a, **k: cuda.linrec_tile(*a, **k, **config_kwargs(config)), x, c, h0, reverse)


@pytest.mark.parametrize("config", PACKED_CONFIGS, ids=[str(c) for c in PACKED_CONFIGS])
@pytest.mark.parametrize("length", [1, 5, 16, 33, "3e", "max"])
@pytest.mark.parametrize("layout", ["contiguous", "padded", "shared_coeffs"])
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_packed_config(config, length, layout, dtype, reverse):
    """Many short sequences, several per warp, the last block partly filled. Lengths that
    are a multiple of elems_per_thread take the aligned-rows kernels (with padded rows, and
    one coefficient row shared by all sequences, too; "3e" leaves a lane of each segment
    empty); the other lengths take the general kernels."""
    from linrec.impl import cuda

    e = config[0]
    length = {"max": 32 * e, "3e": 3 * e}.get(length, length)
    if layout != "contiguous" and length % e:
        pytest.skip("the general kernels are tested contiguous")
    x, c = row_layout(385, length, layout, dtype)
    h0 = torch.randn(385, device="cuda").to(values_dtype(dtype))
    fn = cuda.linrec_packed
    check_fwd_bwd(lambda *a, **k: fn(*a, **k, **config_kwargs(config)), x, c, h0, reverse)


@pytest.mark.parametrize("length", [16, 64, 100, 128])
@pytest.mark.parametrize("reverse", [False, True])
def test_short_sequences_auto(length, reverse):
    """linrec.linrec on a grid of short rows (the packed kernel), misaligned rows included."""
    x, c = inputs((3000, length + 1), torch.bfloat16)
    x, c = x[:, 1:], c[:, 1:]
    h0 = torch.randn(3000, device="cuda").to(torch.bfloat16)
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, MIXED[0]], ids=storage_id)
def test_channel_last_auto(dtype, reverse):
    """linrec.linrec on contiguous (B, T, D) over dim=1 (the strided kernel), many chunks."""
    x, c = inputs((2, 5003, 300), dtype)
    h0 = torch.randn(2, 300, device="cuda").to(values_dtype(dtype))
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse, dim=1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", ["dense", "padded"])
@pytest.mark.parametrize("channels", [4, 16])
def test_channel_last_few_channels_auto(dtype, reverse, rows, channels):
    """linrec.linrec on one batch of few channels over a long T (lanes split over slices of
    time), a hundred chunks or more: dense rows (4 channels take the dense-rows kernel), and
    rows two elements wider than the channels scanned (lanes staging their own channels)."""
    width = channels if rows == "dense" else channels + 2
    x, c = (t[..., :channels] for t in inputs((1, 70004, width), dtype))
    h0 = torch.randn(1, channels, device="cuda").to(dtype)
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse, dim=1)


@pytest.mark.parametrize("shape", [(4, 3001, 1024), (1, 1_700_000, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_channel_last_many_waves(shape, dtype, reverse):
    """linrec.linrec over dim=1 with more strided blocks than an H100 holds at once, so blocks
    numbered by their index look back across waves: many channel groups of a few chunks, and
    one group of few dense channels over hundreds of chunks."""
    x, c = inputs(shape, dtype)
    h0 = torch.randn(shape[0], shape[2], device="cuda").to(dtype)
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse, dim=1)


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (300, 8197)), (torch.bfloat16, (70, 32771)),
                                         (MIXED[0], (70, 32771))], ids=param_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_many_sequences_of_few_tiles_auto(dtype, shape, reverse):
    """linrec.linrec on hundreds of sequences of a few chained tiles each (the rule's chained
    kernel below 64 sequences a multiprocessor), the last tile of each partial."""
    x, c = inputs(shape, dtype)
    h0 = torch.randn(shape[0], device="cuda").to(values_dtype(dtype))
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse)


@pytest.mark.parametrize("shape", [(300, 100), (100, 700), (40, 3000), (2, 40000)],
                         ids=["packed", "tile", "pipe", "chained"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_other_element_auto(shape, dtype, reverse):
    """linrec.linrec on views of every other element (x[:, ::2]), against the float64
    reference: shapes for each per-sequence kernel the rule now picks for such views (the
    ids name fp32's picks), each reading with stride 2."""
    x, c = inputs((shape[0], 2 * shape[1]), dtype)
    x, c = x[:, ::2], c[:, 1::2]
    h0 = torch.randn(shape[0], device="cuda").to(dtype)
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", STORAGES, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_dtypes(impl, dtype, reverse):
    skip_if_too_long(impl, 777)
    x, c = inputs((4, 3, 777), dtype)
    h0 = torch.randn(4, 3, device="cuda").to(values_dtype(dtype))
    check_fwd_bwd(gpu_impls()[impl], x, c, h0, reverse)


# Shapes that take each kernel family through linrec.linrec (dispatch.h's rule for 16-bit values),
# and the dim scanned.
MIXED_AUTO_SHAPES = {"packed": ((3000, 512), -1), "tile": ((300, 1000), -1), "pipe": ((100, 5000), -1),
                     "chained": ((2, 200_003), -1), "strided": ((2, 3001, 300), 1),
                     "strided_few_channels": ((1, 40_000, 6), 1)}


@pytest.mark.parametrize("case", list(MIXED_AUTO_SHAPES))
@pytest.mark.parametrize("values", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_mixed_storage_keeps_decays_near_one(case, values, reverse):
    """16-bit inputs with float32 coefficients of decays that 16 bits round to 1 (from 0.9981 in
    bfloat16, 0.99977 in float16), through every kernel family: outputs and gradients match the
    float64 reference to 16-bit rounding, where the same coefficients rounded to 16 bits miss the
    outputs by more than twice the tolerance (checked here, so the test can fail)."""
    shape, dim = MIXED_AUTO_SHAPES[case]
    decay = 1 - 1.9e-3 if values == torch.bfloat16 else 1 - 2.3e-4
    x = (torch.rand(shape, device="cuda") + 0.5).to(values)
    c = decay + (1 - decay) * 0.1 * torch.rand(shape, device="cuda")  # float32, all round to 1
    assert torch.all(c.to(values) == 1)
    h0 = torch.randn(shape[0] if dim == -1 else (shape[0], shape[2]), device="cuda").to(values)
    check_fwd_bwd(linrec.linrec, x, c, h0, reverse, dim=dim)
    ref = reference_chunked if dim == -1 and shape[-1] > 4096 else reference
    if dim == -1:
        y_ref, y_rounded = (ref(x, coeffs, reverse, initial=h0) for coeffs in (c, c.to(values)))
    else:
        y_ref, y_rounded = (reference(x, coeffs, reverse, dim, h0) for coeffs in (c, c.to(values)))
    assert rel_error(y_rounded, y_ref) > 2 * TOL[values]


VIEWS = {
    "strided_last": lambda t: t[..., ::2],
    "transposed": lambda t: t.transpose(0, 2),
    "channel_last": lambda t: t.permute(0, 2, 1),
    "misaligned": lambda t: t[..., 1:],
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_views_and_dims(impl, view, dim, reverse):
    bx, bc = inputs((6, 9, 301), torch.float32)
    x, c = VIEWS[view](bx), VIEWS[view](bc)
    d = dim % 3
    skip_if_too_long(impl, x.shape[d])
    h0 = torch.randn(x.shape[:d] + x.shape[d + 1 :], device="cuda")
    check_fwd_bwd(gpu_impls()[impl], x, c, h0, reverse, dim)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("coeff_shape", [(), (9, 1), (1, 101), (6, 1, 1)], ids=str)
def test_coeff_broadcast(impl, coeff_shape):
    x, _ = inputs((6, 9, 101), torch.float32)
    c = torch.rand(coeff_shape, device="cuda") * 0.6 + 0.4
    h0 = torch.randn(9, device="cuda")  # broadcast over the batch
    check_fwd_bwd(gpu_impls()[impl], x, c, h0.expand(6, 9), False)


def check_long(fn, x, c, h0, reverse, tol):
    """Forward and gradients of one long scan (along the last dim) against the chunked float64
    reference and its adjoint recurrence."""
    poison(3 * x.numel() * x.element_size())
    y = fn(x, c, reverse, initial=h0)
    dy = torch.randn_like(y)
    y_ref, *ref_grads = reference_with_grads(x, c, dy, reverse, -1, h0)
    assert rel_error(y, y_ref) < tol, "outputs"
    leaves = [t.clone().requires_grad_() for t in (x, c, h0)]
    y = fn(*leaves[:2], reverse, initial=leaves[2])
    poison(3 * x.numel() * x.element_size())
    grads = torch.autograd.grad(y, leaves, dy)
    for name, g, r in zip(("inputs", "coeffs", "initial"), grads, ref_grads):
        assert rel_error(g, r) < tol, f"d_{name}"


@pytest.mark.parametrize("impl", ["linrec", "cuda.linrec_pipe", "cuda.linrec_chained", "triton.linrec_pipe"])
@pytest.mark.parametrize("shape", [(1, 2**24), (4, 2**22 + 7)], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_long_sequences(impl, shape, reverse):
    x, c = inputs(shape, torch.float32)
    c = c * 0.0 + (1.0 - torch.rand(shape, device="cuda") * 1e-3)  # long memory
    h0 = torch.randn(shape[0], device="cuda")
    check_long(gpu_impls()[impl], x, c, h0, reverse, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_long_sequences_16bit(dtype, reverse):
    """The rule's 16-bit chained tiles, more than one wave of them, against the float64
    reference of the rounded inputs; coefficients 1 or 1 - 2^-8 carry a state for
    thousands of steps, across tiles."""
    shape = (2, 2**22 + 7)
    x = torch.randn(shape, device="cuda").to(dtype)
    c = torch.where(torch.rand(shape, device="cuda") < 0.9, 1.0, 1.0 - 2**-8).to(dtype)
    h0 = torch.randn(shape[0], device="cuda").to(dtype)
    check_long(linrec.linrec, x, c, h0, reverse, TOL[dtype])


@pytest.mark.parametrize("num_seqs", [16, 17], ids=["interleaved", "sequence_by_sequence"])
@pytest.mark.parametrize("reverse", [False, True])
def test_chained_backward_tile_orders(num_seqs, reverse):
    """The chained backward numbers the tiles of up to 16 sequences across the sequences, and
    of more sequence by sequence (kMaxInterleavedSeqsBwd in chained.cuh): both orders, over
    several waves of tiles, each sequence's last tile partial, with long memory so that a
    state entering the wrong tile shows. (The forward interleaves up to 4 sequences:
    test_long_sequences and test_long_sequences_16bit.)"""
    shape = (num_seqs, 2**20 + 5)
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    c = torch.where(torch.rand(shape, device="cuda") < 0.9, 1.0, 1.0 - 2**-8).to(torch.bfloat16)
    h0 = torch.randn(num_seqs, device="cuda").to(torch.bfloat16)
    check_long(gpu_impls()["cuda.linrec_chained"], x, c, h0, reverse, TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_sum_backward_chained(dtype, reverse):
    """y.sum() hands the backward d_outputs of stride 0 (one value broadcast), which the
    chained kernel stages with one load a tile; one coefficient a sequence (stride 0 too)."""
    x = torch.randn(2, 40003, device="cuda").to(dtype)
    c = (torch.rand(2, 1, device="cuda") * 0.5 + 0.5).to(dtype)
    leaves = [x.clone().requires_grad_(), c.clone().requires_grad_()]
    y = linrec.linrec(*leaves, reverse)
    poison(6 * x.numel() * x.element_size())
    dx, dc = torch.autograd.grad(y.sum(), leaves)
    c_full = c.expand_as(x)
    assert rel_error(y, reference_chunked(x, c_full, reverse)) < TOL[dtype]
    # d_inputs: the reverse recurrence of ones with the coefficients one step later.
    zero = torch.zeros_like(x[:, :1])
    c_next = torch.cat([zero, c_full[:, :-1]], 1) if reverse else torch.cat([c_full[:, 1:], zero], 1)
    dx_ref = reference_chunked(torch.ones_like(x), c_next, not reverse)
    assert rel_error(dx, dx_ref) < TOL[dtype]
    y_prev = torch.cat([y[:, 1:], zero], 1) if reverse else torch.cat([zero, y[:, :-1]], 1)
    assert rel_error(dc, (dx_ref * y_prev.double()).sum(1, keepdim=True)) < TOL[dtype]


def test_more_than_2_31_elements():
    """64-bit offsets: a bf16 tensor of 2^31 + 2^16 elements, checked on its last sequences."""
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    rows, length = 2**15 + 1, 2**16
    coeff = 0.9921875  # exact in bfloat16, so the reference sees the coefficient the kernel sees
    x = torch.randn(rows, length, device="cuda", dtype=torch.bfloat16)
    y = linrec.linrec(x, coeff)
    assert y.numel() > 2**31
    tail = slice(rows - 3, rows)
    assert rel_error(y[tail], reference_chunked(x[tail], coeff)) < 1e-2
    assert rel_error(y[:2], reference_chunked(x[:2], coeff)) < 1e-2
    del y
    x.requires_grad_()
    linrec.linrec(x, coeff, reverse=True).backward(torch.ones_like(x))
    assert rel_error(x.grad[tail], reference_chunked(torch.ones_like(x[tail]), coeff, reverse=False)) < 1e-2


def test_uncompiled_config_error():
    from linrec.impl import cuda

    with pytest.raises(ValueError, match="is not compiled"):
        cuda.linrec_pipe(*inputs((2, 100), torch.float32), elems_per_thread=3)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
def test_gradgradcheck_gpu(impl, reverse):
    """Second derivatives (create_graph=True) of every GPU implementation in float64, rows of 9
    steps (strided: channel-last, over dim 0), a zero coefficient included."""
    fn = gpu_impls()[impl] if HAS_CUDA_KERNELS else linrec.linrec
    dim = 0 if impl == "cuda.linrec_strided" else -1
    x, c = inputs((9, 12), torch.float64) if dim == 0 else inputs((3, 4, 9), torch.float64)
    c.view(-1)[1] = 0
    h0 = torch.randn(x.shape[1:] if dim == 0 else x.shape[:-1], dtype=torch.float64, device="cuda")
    leaves = [t.requires_grad_() for t in (x, c, h0)]
    assert torch.autograd.gradgradcheck(lambda x, c, h0: fn(x, c, reverse, dim=dim, initial=h0), leaves)


def test_func_attrs_cover_every_kernel():
    from linrec import _C_cuda
    from linrec._registry import FAMILIES
    from linrec.func_attrs import collect

    rows = collect()
    names = {r["kernel"] for r in rows}
    assert {"tile_rows", "tile_rows_rev", "packed_rows", "packed_rows_rev"} <= names
    assert all(r["num_regs"] > 0 for r in rows)
    # Three rows a packed config: the general kernel and the aligned-rows kernel in each direction.
    packed = [r for r in rows if r["kernel"].startswith("packed") and r["storage"] == "f32" and not r["backward"]]
    assert len(packed) == 3 * len(PACKED_CONFIGS)
    # Every family and storage of the registry, mixed storage included.
    assert {(r["kernel"].split("_")[0], r["storage"]) for r in rows} == {
        (name, s) for name, family in FAMILIES.items() for s in family.storages}
    assert all(r["config"][2] == 1 for r in rows if r["kernel"] == "tile" and r["storage"] == "c64")
    chained = FAMILIES["chained"].id
    assert _C_cuda.func_attrs(chained, "float32", "float32", False, 1, *STAGED_CONFIGS[0]) is None  # no rows variant
    with pytest.raises(ValueError, match="variant"):
        _C_cuda.func_attrs(FAMILIES["packed"].id, "float32", "float32", False, 3, *PACKED_CONFIGS[0])
    with pytest.raises(ValueError, match="dtype name"):
        _C_cuda.func_attrs(chained, "int32", "float32", False, 0, *STAGED_CONFIGS[0])


def test_cuda_kernels_not_loaded_fall_back_to_triton():
    """Next to a torch of another CUDA major version the compiled CUDA kernels are not loaded:
    linrec.linrec warns, naming why, and runs Triton (checked against the reference), and a direct
    call of the op raises a RuntimeError naming why (not the dispatcher's missing-kernel error)."""
    import subprocess
    import sys

    code = """
import warnings, torch
torch.version.cuda = "99.1"
import linrec
x, c = torch.randn(4, 3000, device="cuda", dtype=torch.float64), torch.rand(4, 3000, device="cuda", dtype=torch.float64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = linrec.linrec(x, c)
print("warned:", [str(w.message) for w in caught])
from linrec.impl.python import linrec_hop
print("error:", ((y - linrec_hop(x, c)).norm() / linrec_hop(x, c).norm()).item())
try:
    torch.ops.linrec.linrec_fwd(x, c, None, -1, False, 0, 0, 0, 0, 0)
except RuntimeError as e:
    print("raised:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "has CUDA 99.1; install the wheel" in out.split("warned:")[1].splitlines()[0]
    assert "using the Triton implementation" in out
    assert float(out.split("error:")[1].split()[0]) < 1e-12
    assert "raised: linrec: the compiled CUDA kernels are not loaded: the CUDA kernels were built for CUDA" in out


DEPENDENT_CASES = {  # the kernel linrec.linrec picks: shape, dim
    "packed": ((20000, 64), -1),
    "tile": ((300, 3000), -1),
    "chained": ((1, 2**21 + 3), -1),
    "strided": ((2, 3001, 256), 1),
}


@pytest.mark.parametrize("case", list(DEPENDENT_CASES))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_back_to_back_dependent_calls(case, graph):
    """A chain of calls, each reading the output of the one before, some straight behind
    a linrec kernel, some behind a torch kernel. On sm_90+ every linrec kernel is a
    programmatic dependent launch that may start before its predecessor ends: each must
    wait for it before its first access. Also replayed from a CUDA graph."""
    shape, dim = DEPENDENT_CASES[case]
    x, c = inputs(shape, torch.float32)
    c = c * 0.5  # bounded values along the chain

    def chain(y):
        outs = []
        for k in range(6):
            y = linrec.linrec(y if k % 2 else y * 0.9, c, dim=dim)
            outs.append(y)
        return outs

    poison(4 * x.numel() * x.element_size())
    if graph:
        chain(x)  # warm-up outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = chain(x)
        g.replay()
        g.replay()
    else:
        outs = chain(x)
    expected = x.double()
    for k, y in enumerate(outs):
        step_in = expected if k % 2 else expected * 0.9
        expected = reference_chunked(step_in, c) if case == "chained" else reference(step_in, c, dim=dim)
        assert rel_error(y, expected) < 1e-5, f"call {k}"


@pytest.mark.parametrize("case", ["chained", "strided"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_workspace_new_inputs(case, graph):
    """One call made again and again with new inputs: eagerly (the allocator hands each call
    the workspace memory of the call before) or as replays of one captured call (the same
    workspace every time). Each call must read the statuses the call before it left at the
    same addresses as not ready: with the same inputs a stale status would even hold the
    right value. Coefficients near 1 carry every state across all tiles."""
    shape, dim = DEPENDENT_CASES[case]
    x = torch.randn(shape, device="cuda")
    c = 1.0 - torch.rand(shape, device="cuda") * 1e-3
    y = linrec.linrec(x, c, dim=dim)
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = linrec.linrec(x, c, dim=dim)
    for k in range(3):
        x.copy_(torch.randn_like(x))
        if graph:
            g.replay()
        else:
            y = linrec.linrec(x, c, dim=dim)
        expected = reference_chunked(x, c) if case == "chained" else reference(x, c, dim=dim)
        assert rel_error(y, expected) < 1e-5, f"call {k}"


def test_current_stream_is_used():
    x, c = inputs((64, 5000), torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # x and c are written on the default stream
    with torch.cuda.stream(s):
        y = linrec.linrec(x, c)
    s.synchronize()
    assert rel_error(y, reference(x, c)) < 1e-5


@pytest.mark.parametrize("impl", ["linrec", "triton.linrec_pipe", "triton.linrec_tile"])
def test_compile_fullgraph_gpu(impl):
    fn = gpu_impls()[impl]

    def model(x, w):
        return fn(x.relu(), torch.sigmoid(w), dim=1).square().mean()

    x = torch.randn(4, 1000, 64, device="cuda")
    w = torch.randn(64, device="cuda", requires_grad=True)
    torch._dynamo.reset()
    loss = torch.compile(model, fullgraph=True)(x, w)
    loss.backward()
    w2 = w.detach().double().requires_grad_()
    reference(x.relu(), torch.sigmoid(w2), dim=1).square().mean().backward()
    assert rel_error(w.grad, w2.grad) < 1e-5


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [64, 5000], ids=["packed", "tile"])
def test_forward_ad_gpu(reverse, length):
    """Forward-mode AD through the CUDA kernels (the tangent is one more forward) against the
    float64 reference's tangent."""
    import torch.autograd.forward_ad as fwAD

    x, c = inputs((3, 7, length), torch.float32)
    h0 = torch.randn(3, 7, device="cuda")
    tangents = [torch.randn_like(t) for t in (x, c, h0)]
    with fwAD.dual_level():
        y = linrec.linrec(*(fwAD.make_dual(t, d) for t, d in zip((x, c), tangents[:2])), reverse,
                          initial=fwAD.make_dual(h0, tangents[2]))
        got = fwAD.unpack_dual(y).tangent
        ref = reference(*(fwAD.make_dual(t.double(), d.double()) for t, d in zip((x, c), tangents[:2])), reverse,
                        -1, fwAD.make_dual(h0.double(), tangents[2].double()))
        want = fwAD.unpack_dual(ref).tangent
    assert got is not None and rel_error(got, want) < TOL[torch.float32]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float16] + MIXED, ids=storage_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_16bit_forward_ad_and_create_graph(impl, storage, reverse):
    """16-bit inputs (16-bit or float32 coefficients) through forward-mode AD and the
    differentiable backward (create_graph: a Hessian-vector product) of every GPU implementation,
    against the float64 reference. Mixed storage takes decays that 16 bits round to 1, where the
    rounded coefficients miss by more than twice the tolerance (checked). The Triton kernels have
    no forward-mode AD; they take the create_graph part."""
    import torch.autograd.forward_ad as fwAD

    values, mixed = values_dtype(storage), isinstance(storage, tuple)
    shape = (3, 5, 700 if mixed else 100)
    skip_if_too_long(impl, shape[-1])
    x = (torch.rand(shape, device="cuda") + 0.5).to(values)
    if mixed:
        decay = 1 - 1.9e-3 if values == torch.bfloat16 else 1 - 2.3e-4
        c = decay + (1 - decay) * 0.1 * torch.rand(shape, device="cuda")
        assert torch.all(c.to(values) == 1)
    else:
        c = (torch.rand(shape, device="cuda") * 0.6 + 0.4).to(values)
    fn = gpu_impls()[impl]
    h0 = torch.randn(shape[:-1], device="cuda").to(values)
    dy, v = (torch.rand(shape, device="cuda") + 0.5).to(values), torch.randn(shape, device="cuda")
    # Small coefficient tangents: the tangent sums tc * y over the sequence, and float16 holds at most 65504.
    tx, tc = (torch.rand(shape, device="cuda") + 0.5).to(values), torch.rand(shape, device="cuda") / 64

    def hvp(fn, c):
        leaves = [t.detach().requires_grad_() for t in (x, c, h0)]
        if fn is reference:
            leaves = [t.double() for t in leaves]
        poison(6 * x.numel() * 4)
        g = torch.autograd.grad(fn(leaves[0], leaves[1], reverse, initial=leaves[2]), leaves, dy.to(leaves[0].dtype),
                                create_graph=True)
        return g + torch.autograd.grad((g[1] * v.to(g[1].dtype)).sum(), leaves[:2])

    def jvp(fn, c):
        cast = (lambda t: t.double()) if fn is reference else (lambda t: t)
        with fwAD.dual_level():
            poison(3 * x.numel() * 4)
            y = fn(fwAD.make_dual(cast(x), cast(tx.to(x.dtype))), fwAD.make_dual(cast(c), cast(tc.to(c.dtype))),
                   reverse, initial=cast(h0))
            return fwAD.unpack_dual(y).tangent

    # The reference's derivatives (a Python loop, seconds each), once per case: the autouse seed
    # gives every implementation the same inputs, and the poison keeps one call's results from
    # standing in for another's.
    key = (storage_id(storage), reverse)
    if key not in _REFERENCE_DERIVATIVES:
        _REFERENCE_DERIVATIVES[key] = (hvp(reference, c), jvp(reference, c),
                                       mixed and (hvp(reference, c.to(values)), jvp(reference, c.to(values))))
    (ref, ref_tangent), rounded = _REFERENCE_DERIVATIVES[key][:2], _REFERENCE_DERIVATIVES[key][2]
    tol = TOL[values]
    if mixed:  # the rounded coefficients are off by more than twice the tolerance: the test can fail
        assert all(rel_error(off, want) > 2 * tol for off, want in zip(rounded[0] + (rounded[1],), ref + (ref_tangent,)))
    for ours, want in zip(hvp(fn, c), ref):
        assert rel_error(ours, want) < tol
    if not impl.startswith("triton."):
        tangent = jvp(fn, c)
        assert tangent.dtype == values and rel_error(tangent, ref_tangent) < tol


_REFERENCE_DERIVATIVES = {}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reverse", [False, True])
def test_nonfinite_values(impl, reverse):
    """NaN and inf through every GPU implementation, against the float64 loop: non-finite exactly
    where the loop is, finite values equal. The sequential kernel (cuda.linrec_ref) matches the
    loop exactly, as the CPU kernel does; the parallel scans may give NaN where the loop gives
    +-inf after an infinite coefficient (docs/usage.md, "Non-finite values")."""
    from test_hardening import nonfinite_case

    x, c = (t.cuda() for t in nonfinite_case(reverse))
    h0 = torch.randn(6, dtype=torch.float64, device="cuda")
    poison(3 * x.numel() * x.element_size())
    y, want = gpu_impls()[impl](x, c, reverse, initial=h0), reference(x, c, reverse, initial=h0)
    assert torch.equal(torch.isfinite(y), torch.isfinite(want))
    torch.testing.assert_close(y[torch.isfinite(want)], want[torch.isfinite(want)], rtol=1e-12, atol=1e-12)
    if impl == "cuda.linrec_ref":
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("case,impl", [(case, "linrec") for case in ("packed", "tile", "chained", "chained_bf16", "strided")]
                         + [("tile", "triton.linrec_tile"), ("strided", "triton.linrec_pipe"),
                            ("chained_bf16", "triton.linrec_pipe")])
def test_tensors_on_another_gpu(case, impl):
    """Tensors on cuda:1 while cuda:0 is current: every kernel family, and the Triton kernels
    (which launch on the current device unless told), run on the tensors' device and stream,
    and forward and gradients match the float64 reference (outputs poisoned)."""
    shape, dim, dtype = {
        "packed": ((300, 100), -1, torch.float32),
        "tile": ((16, 3000), -1, torch.float32),
        "chained": ((2, 1 << 18), -1, torch.float32),
        "chained_bf16": ((2, 1 << 18), -1, torch.bfloat16),
        "strided": ((3000, 256), 0, torch.float32),
    }[case]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).to(dtype)
    c = (torch.rand(shape, generator=g) * 0.6 + 0.4).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    with torch.cuda.device(0):
        xs, cs = (t.to("cuda:1").requires_grad_() for t in (x, c))
        poison_1 = [torch.full((x.numel() * 4,), float("nan"), device="cuda:1") for _ in range(4)]
        del poison_1
        y = gpu_impls()[impl](xs, cs, dim=dim)
        dx, dc = torch.autograd.grad(y, (xs, cs), dy.to("cuda:1"))
        assert y.device == dx.device == dc.device == torch.device("cuda:1")
        assert torch.cuda.current_device() == 0
    xr, cr = (t.double().requires_grad_() for t in (x, c))
    yr = reference(xr, cr, dim=dim)
    dxr, dcr = torch.autograd.grad(yr, (xr, cr), dy.double())
    for got, want in ((y, yr), (dx, dxr), (dc, dcr)):
        assert rel_error(got.cpu(), want) < TOL[dtype]
