"""Attention on bfloat16 and float16 through the Python doors: mha.torch's SDPA (autograd,
torch.compile, FlashAttention-2's functions, merge_attention_states), mha.torch.MultiheadAttention
(the module in that type: a training step's output and every gradient) and the numpy API
(np.float16 and ml_dtypes.bfloat16 arrays).

The accuracy bar is PyTorch's own: on the same bfloat16/float16 inputs, mha's error against the
float64 result is at most 2x that of PyTorch's result in that type, for the output and every
gradient. PyTorch's result is its SDPA where SDPA has the feature (masks, causality, GQA, a window
as a bool mask) and, for the variants SDPA lacks (soft-cap, sinks, ALiBi), the eager attention of
test_variants.reference run in the half type, as transformers' eager path runs those models. The
float64 result is the same computation on the half values widened. (The kernels' exactness, a half
call being the float call rounded once, is tests/attention/half_precision_test.cpp's.)"""
import warnings

import ml_dtypes
import numpy as np
import pytest
torch = pytest.importorskip("torch")
from test_variants import reference  # noqa: E402

import mha  # noqa: E402
import mha.torch  # noqa: E402

HALF = (torch.bfloat16, torch.float16)


def _inputs(dtype, B=2, Hq=8, Hkv=2, L=160, S=160, D=64, Dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    return [torch.randn(shape, generator=g).to(dtype) for shape in
            ((B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv), (B, Hq, L, Dv))]


def _error(x, ref):
    return (x.double() - ref).abs().max().item()


def _forward_backward(fn, q, k, v, dout):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    return [out] + list(torch.autograd.grad(out, leaves, dout))


def _expect_within_torch(ours, torch_half, exact, what):
    for name, a, b, c in zip(("output", "grad_query", "grad_key", "grad_value"), ours, torch_half, exact):
        assert a.dtype == b.dtype, f"{what} {name}: dtype {a.dtype}, PyTorch's {b.dtype}"
        mine, theirs = _error(a, c), _error(b, c)
        assert mine <= 2 * theirs, f"{what} {name}: mha's error {mine:.3g} > 2x PyTorch's {theirs:.3g}"


SDPA_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bool mask": dict(mask="bool"),
    "additive mask": dict(mask="additive"),
    # A float32 mask with half inputs, which PyTorch adds in float.
    "float32 additive mask": dict(mask="float32"),
    "window 48, causal": dict(window_size=(48, 0), is_causal=True),
    # PyTorch has no fused kernel for value heads of another size: it computes them in float32.
    "value heads of 40": dict(value_dim=40),
    # Nor for inputs broadcast over the batch or repeated over the heads (the gradients are sums
    # over the copies).
    "key and value broadcast over the batch": dict(take=lambda q, k, v: (q, k[:1], v[:1])),
    "query broadcast over the batch": dict(take=lambda q, k, v: (q[:1], k, v)),
    "query broadcast over the batch, bool mask": dict(take=lambda q, k, v: (q[:1], k, v), mask="bool"),
    "one key head, two value heads": dict(take=lambda q, k, v: (q, k[:, :1], v)),
    # Nor for a head dimension whose stride is not 1 (here a transposed copy's view), inputs of
    # five dimensions, or a mask of three (for inputs of four).
    "head dimension strided": dict(take=lambda q, k, v: tuple(x.mT.contiguous().mT for x in (q, k, v))),
    "inputs of five dimensions": dict(take=lambda q, k, v: (q[None], k[None], v[None])),
    "mask of three dimensions": dict(mask="three dimensions"),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_within_twice_pytorchs_error(dtype, case):
    L, S = 130, 200
    spec = SDPA_CASES[case]
    q, k, v, dout = _inputs(dtype, L=L, S=S, Dv=spec.get("value_dim"))
    q, k, v = spec.get("take", lambda *x: x)(q, k, v)
    dout = dout.expand(*q.shape[:-3], *dout.shape[-3:]) if q.dim() > 4 else dout
    g = torch.Generator().manual_seed(5)
    mask = {"bool": lambda: torch.rand(L, S, generator=g) > 0.3,
            "additive": lambda: (torch.randn(2, 1, L, S, generator=g) * 0.5).to(dtype),
            "float32": lambda: torch.randn(2, 1, L, S, generator=g) * 4,
            "three dimensions": lambda: torch.rand(8, L, S, generator=g) > 0.3}.get(spec.get("mask"), lambda: None)()
    causal, window = spec.get("is_causal", False), spec.get("window_size", (-1, -1))
    torch_mask, torch_causal = mask, causal
    if window != (-1, -1):  # PyTorch has no window: the keys it leaves (top-left causal) as a bool mask
        i, j = torch.arange(L).unsqueeze(-1), torch.arange(S)
        torch_mask, torch_causal = (j <= i) & (j >= i - window[0]), False

    def ours(q, k, v):
        return mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True,
                                                      window_size=window)

    def theirs(q, k, v):  # in q's dtype: the half type, or float64 on the same values
        m = torch_mask
        if m is not None and m.dtype != torch.bool and (m.dtype != torch.float32 or q.dtype == torch.float64):
            m = m.to(q.dtype)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=torch_causal,
                                                                enable_gqa=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to PyTorch
        mine = _forward_backward(ours, q, k, v, dout)
    _expect_within_torch(mine, _forward_backward(theirs, q, k, v, dout),
                         _forward_backward(theirs, *(x.double() for x in (q, k, v, dout))), f"{dtype} {case}")


def _math_cases():
    """(name, query, key, value, attn_mask, enable_gqa) in bfloat16, of layouts PyTorch's CPU SDPA
    takes to its flash kernel or to its math backend."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(shape, generator=g).to(torch.bfloat16) for shape in ((2, 4, 21, 64), (2, 4, 34, 64),
                                                                                 (2, 4, 34, 64)))
    strided = lambda x: x.mT.contiguous().mT  # noqa: E731
    bool_mask = lambda *shape: torch.rand(shape, generator=g) > 0.3  # noqa: E731
    return [
        ("plain", q, k, v, None, False),
        ("query strided", strided(q), k, v, None, False),
        ("key strided", q, strided(k), v, None, False),
        ("value strided", q, k, strided(v), None, False),
        ("size-1 head dimension strided", strided(q[..., :1]), k[..., :1], v[..., :1], None, False),
        ("every other dimension", q[..., ::2], k[..., ::2], v[..., ::2], None, False),
        ("head dimension sliced", q[..., :32], k[..., :32], v[..., :32], None, False),
        ("sequence dimension transposed", q.transpose(1, 2).contiguous().transpose(1, 2), k, v, None, False),
        ("three dimensions", q[0], k[0], v[0], None, False),
        ("two dimensions", q[0, 0], k[0, 0], v[0, 0], None, False),
        ("five dimensions", q[None], k[None], v[None], None, False),
        ("value heads of 40", q, k, v[..., :40], None, False),
        ("mask (L, S)", q, k, v, bool_mask(21, 34), False),
        ("mask (B, 1, 1, S)", q, k, v, bool_mask(2, 1, 1, 34), False),
        ("mask (H, L, S)", q, k, v, bool_mask(4, 21, 34), False),
        ("mask (1, L, S)", q, k, v, bool_mask(1, 21, 34), False),
        ("three dimensions, mask (H, L, S)", q[0], k[0], v[0], bool_mask(4, 21, 34), False),
        ("GQA", q, k[:, :2], v[:, :2], None, True),
        ("one query row", q[:, :, :1], k, v, None, False),
        ("query broadcast over the batch", q[:1].expand(2, -1, -1, -1), k, v, None, False),
    ]


@pytest.mark.skipif(not hasattr(torch, "_fused_sdp_choice"), reason="PyTorch without torch._fused_sdp_choice")
def test_the_float_call_where_pytorch_computes_in_float():
    """mha's rule for where PyTorch's CPU SDPA computes a half call in float32 (its math backend;
    mha's backward then runs the float call, each gradient rounded once) is the backend PyTorch
    chooses, on layouts of either kind."""
    from torch.nn.attention import SDPBackend
    from mha import _policy
    for name, q, k, v, mask, gqa in _math_cases():
        math = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=gqa) == SDPBackend.MATH.value
        arrays = (mha.torch._tensors._numpy(x) for x in (q, k, v, mask))
        assert _policy.pytorch_computes_in_float(*arrays) == math, f"{name}: PyTorch's math backend {math}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_strided_head_dimension_within_twice_pytorchs_error(dtype):
    """A head dimension whose stride is not 1 (a transposed copy's view) takes PyTorch's SDPA to
    its math backend, which computes in float32: mha's backward runs the float call there, each
    gradient rounded once, and keeps within 2x PyTorch's error on the shapes where the half call's
    gradients went past it (up to 2.3x at seeds 0, 2 and 4 here)."""
    for seed in range(5):
        q, k, v, dout = _inputs(dtype, B=2, Hq=3, Hkv=3, L=21, S=34, D=64, seed=seed)
        q, k, v = (x.mT.contiguous().mT for x in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        _expect_within_torch(_forward_backward(mha.torch.scaled_dot_product_attention, q, k, v, dout),
                             _forward_backward(sdpa, q, k, v, dout),
                             _forward_backward(sdpa, *(x.double() for x in (q, k, v, dout))), f"seed {seed}")


VARIANTS = {
    "soft-cap 20": dict(softcap=20.0),
    "sinks, causal": dict(sinks=True, causal="top_left"),
    "ALiBi, causal, window 40": dict(slopes=True, causal="bottom_right", window=(40, 0)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", VARIANTS)
def test_variants_within_twice_eager_error(dtype, case):
    q, k, v, dout = _inputs(dtype, L=96, S=128)
    g = torch.Generator().manual_seed(6)
    spec = dict(VARIANTS[case])
    sinks = (torch.randn(8, generator=g) * 2).to(dtype) if spec.pop("sinks", False) else None
    slopes = torch.rand(8, generator=g).to(dtype) if spec.pop("slopes", False) else None
    causal, window, softcap = spec.get("causal", "none"), spec.get("window", (-1, -1)), spec.get("softcap", 0.0)

    def eager(q, k, v, s=sinks, a=slopes):
        cast = (lambda t: None if t is None else t.to(q.dtype))
        return reference(q, k, v, causal, window, softcap, cast(s), cast(a))[0]

    def ours(q, k, v):
        if causal == "bottom_right":
            return mha.torch.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                             window_size=window, softcap=softcap,
                                             alibi_slopes=slopes).transpose(1, 2)
        return mha.torch.scaled_dot_product_attention(q, k, v, is_causal=causal == "top_left", enable_gqa=True,
                                                      window_size=window, softcap=softcap, sinks=sinks,
                                                      alibi_slopes=slopes)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine = _forward_backward(ours, q, k, v, dout)
    _expect_within_torch(mine, _forward_backward(eager, q, k, v, dout),
                         _forward_backward(eager, *(x.double() for x in (q, k, v, dout))), f"{dtype} {case}")


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sink_gradient_in_the_half_type(dtype):
    # The sink's gradient sums −P_sink·D over rows whose terms can cancel. With D = dO·O from the
    # output rounded to the half type it was 12 bfloat16 ulps off on seed 1 (eager autograd: under
    # 1); with cpu_flash's own D (Σ P·dP from float P and dP) it is the exact gradient rounded
    # once: within one ulp of it (derived: D's float error is ~1e-6 of the row's terms), and so
    # within twice eager's error, on every seed.
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]  # significand bits: ulp(x) = 2^(e − bits + 1)
    for seed in range(20):
        q, k, v, dout = _inputs(dtype, L=40, S=40, seed=seed)
        sinks = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + seed))
        s = sinks.to(dtype).requires_grad_()
        out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, sinks=s)
        (grad,) = torch.autograd.grad(out, (s,), dout)
        s64 = sinks.to(dtype).double().requires_grad_()
        out64 = reference(q.double(), k.double(), v.double(), "top_left", sinks=s64)[0]
        (grad64,) = torch.autograd.grad(out64, (s64,), dout.double())
        s_eager = sinks.to(dtype).requires_grad_()
        (grad_eager,) = torch.autograd.grad(reference(q, k, v, "top_left", sinks=s_eager)[0], (s_eager,), dout)
        assert grad.dtype == dtype
        ulp = torch.exp2(torch.floor(torch.log2(grad64.abs())) - (bits - 1))
        assert ((grad.double() - grad64).abs() <= ulp).all(), f"seed {seed}: {grad} against {grad64}"
        assert _error(grad, grad64) <= 2 * _error(grad_eager, grad64), f"seed {seed}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_torch_compile_fullgraph(dtype):
    q, k, v, dout = _inputs(dtype, L=64, S=64)

    def f(q, k, v):
        return mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    eager = _forward_backward(f, q, k, v, dout)
    compiled = _forward_backward(torch.compile(f, fullgraph=True, backend="eager"), q, k, v, dout)
    for a, b in zip(eager, compiled):
        assert a.dtype == dtype and torch.equal(a, b)


def test_flash_attn_varlen_and_merge_in_bfloat16():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(50, 4, 32, generator=g).bfloat16()
    k = torch.randn(50, 2, 32, generator=g).bfloat16()
    v = torch.randn(50, 2, 32, generator=g).bfloat16()
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    out = mha.torch.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == (50, 4, 32)
    for s0, s1 in ((0, 20), (20, 50)):  # each sequence alone
        alone = mha.torch.flash_attn_func(q[None, s0:s1], k[None, s0:s1], v[None, s0:s1], causal=True)[0]
        assert torch.equal(out[s0:s1], alone)
    # Two halves of the keys merged give the whole call, within the half type's rounding of each part.
    qb, kb, vb = q[None], k[None], v[None]  # (1, 50, H, D)
    whole = mha.torch.flash_attn_func(qb, kb, vb)
    parts = [mha.torch.flash_attn_func(qb, kb[:, keys], vb[:, keys], return_attn_probs=True)
             for keys in (slice(0, 25), slice(25, 50))]
    (a, lse_a, _), (b, lse_b, _) = parts
    merged, _ = mha.torch.merge_attention_states(a.transpose(1, 2), lse_a, b.transpose(1, 2), lse_b)
    assert merged.dtype == torch.bfloat16
    # A log-sum-exp in bfloat16 (or float16) is taken as its values.
    for dtype in (torch.bfloat16, torch.float16):
        rounded = [x.to(dtype) for x in (lse_a, lse_b)]
        half_lse, _ = mha.torch.merge_attention_states(a.transpose(1, 2), rounded[0], b.transpose(1, 2), rounded[1])
        float_lse, _ = mha.torch.merge_attention_states(a.transpose(1, 2), rounded[0].float(), b.transpose(1, 2),
                                                        rounded[1].float())
        assert torch.equal(half_lse, float_lse), dtype
    assert _error(merged.transpose(1, 2), whole.double()) <= 2 ** -7 * whole.double().abs().max().item()


@pytest.mark.parametrize("dtype", (np.float16, ml_dtypes.bfloat16), ids=("float16", "bfloat16"))
def test_numpy_half_arrays(dtype):
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal(s).astype(dtype) for s in ((2, 4, 30, 16), (2, 4, 40, 16), (2, 4, 40, 16),
                                                                     (2, 4, 30, 16)))
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads = mha.scaled_dot_product_attention_backward(dout, q, k, v, is_causal=True)
    assert out.dtype == np.dtype(dtype) and all(g.dtype == np.dtype(dtype) for g in grads)
    # The torch door gives the same bits (one implementation).
    t = [torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16 if dtype is ml_dtypes.bfloat16 else torch.float16)
         for x in (q, k, v)]
    same = mha.torch.scaled_dot_product_attention(*t, is_causal=True)
    assert np.array_equal(out.astype(np.float32), same.float().numpy())
    # The mask's dtype is bool, the query's, or float32 (PyTorch's rule: added in float; the call is
    # then the float call on the widened values, rounded once).
    mask = rng.standard_normal((30, 40)).astype(np.float32)
    out = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    widened = mha.scaled_dot_product_attention(*(x.astype(np.float32) for x in (q, k, v)), attn_mask=mask)
    assert out.dtype == np.dtype(dtype) and np.array_equal(out, widened.astype(dtype))
    with pytest.raises(mha.ArgumentTypeError, match=r"attn_mask: expected dtype bool .* or (float16|bfloat16) or "
                                                    r"float32 \(added to the scores\), got float64"):
        mha.scaled_dot_product_attention(q, k, v, attn_mask=np.zeros((30, 40), np.float64))
    with pytest.raises(mha.ArgumentTypeError, match="key, value: expected the dtype of query"):
        mha.scaled_dot_product_attention(q, k.astype(np.float32), v)


MODULE_CASES = {
    "self, batch first": dict(batch_first=True),
    "cross, sequence first, padding": dict(cross=True, padding=True),
    "additive attn_mask, no bias": dict(batch_first=True, mask=True, bias=False),
    "kdim, vdim, bias_kv, zero_attn": dict(cross=True, kdim=24, vdim=40, add_bias_kv=True, add_zero_attn=True),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", MODULE_CASES)
def test_multihead_attention_module_within_twice_pytorchs_error(dtype, case):
    """mha.torch.MultiheadAttention in bfloat16/float16 runs mha's module in that type (no
    fallback): the output and the gradients of the inputs and of every parameter (a training
    step's) within 2x the error of PyTorch's module in that type, against the float64 module on
    the same rounded weights and inputs."""
    o = MODULE_CASES[case]
    torch.manual_seed(1)
    kwargs = dict(batch_first=o.get("batch_first", False), bias=o.get("bias", True), kdim=o.get("kdim"),
                  vdim=o.get("vdim"), add_bias_kv=o.get("add_bias_kv", False), add_zero_attn=o.get("add_zero_attn", False))
    ours = mha.torch.MultiheadAttention(64, 4, **kwargs).to(dtype)
    theirs = torch.nn.MultiheadAttention(64, 4, **kwargs).to(dtype)
    exact = torch.nn.MultiheadAttention(64, 4, **kwargs).double()
    theirs.load_state_dict(ours.state_dict())
    exact.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    N, L, S = 3, 40, 56 if o.get("cross") else 40
    shape = (lambda n, l, e: (n, l, e)) if kwargs["batch_first"] else (lambda n, l, e: (l, n, e))
    g = torch.Generator().manual_seed(2)
    q = torch.randn(shape(N, L, 64), generator=g).to(dtype)
    k = torch.randn(shape(N, S, o.get("kdim") or 64), generator=g).to(dtype) if o.get("cross") else q
    v = torch.randn(shape(N, S, o.get("vdim") or 64), generator=g).to(dtype) if o.get("cross") else q
    dout = torch.randn(shape(N, L, 64), generator=g).to(dtype)
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[1, -9:] = True
    extra = {}
    if o.get("padding"):
        extra["key_padding_mask"] = padding
    if o.get("mask"):
        extra["attn_mask"] = torch.randn(L, S, generator=g).to(dtype)

    def step(module, cast):
        leaves = [x.detach().to(cast).requires_grad_() for x in ((q,) if q is k else (q, k, v))]
        args = leaves * 3 if len(leaves) == 1 else leaves
        kw = {name: (m.to(cast) if m.is_floating_point() else m) for name, m in extra.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback warning: mha runs the half module
            out, _ = module(*args, **kw)
        module.zero_grad()
        grads = torch.autograd.grad(out, leaves + [p for p in module.parameters()], dout.to(cast))
        return [out] + list(grads)

    mine, torch_half, truth = step(ours, dtype), step(theirs, dtype), step(exact, torch.float64)
    names = ["output"] + [f"grad {i}" for i in range(len(mine) - 1 - len(list(ours.parameters())))] + \
        [f"grad {n}" for n, _ in ours.named_parameters()]
    for name, a, b, c in zip(names, mine, torch_half, truth):
        assert a.dtype == dtype, f"{name}: dtype {a.dtype}"
        e_mine, e_torch = _error(a, c), _error(b, c)
        assert e_mine <= 2 * e_torch, f"{case} {name}: mha's error {e_mine:.3g} > 2x PyTorch's {e_torch:.3g}"



def test_bf16_path_names_what_the_products_run_on():
    from mha import _mha
    path = _mha.bf16_path()
    assert path in ("AMX tiles (TDPBF16PS)", "AVX512_BF16 (VDPBF16PS, libxsmm)", "float32 (operands widened)"), path
    assert _mha.bf16_native() == (path != "float32 (operands widened)")
