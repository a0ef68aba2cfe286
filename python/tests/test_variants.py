"""The score variants (soft-cap, sinks, ALiBi) and packed sequences through every Python door: the
numpy API, mha.torch's SDPA (autograd, gradcheck, torch.compile), FlashAttention-2's functions
(flash_attn_func, flash_attn_varlen_func) and merge_attention_states.

The expected values come from `reference` below: FlashAttention-2's attention_ref
(tests/test_flash_attn.py: scores scaled, soft-capped, masked by the window on the diagonal,
plus -slope * |i + d - j|) with gpt-oss's sinks (modeling_gpt_oss.eager_attention_forward: the
sink logit concatenated to each row, softmax, the sink's column dropped), in PyTorch float64 with
autograd; and the goldens of tests/goldens/variants, which the anchors' own code wrote."""
import inspect

import numpy as np
import pytest
torch = pytest.importorskip("torch")
from conftest import VARIANT_CASES, assert_close_f64, assert_flash_rule, load_case  # noqa: E402

import mha  # noqa: E402
import mha.torch  # noqa: E402
from mha import _core, _fields  # noqa: E402


def reference(q, k, v, causal="none", window=(-1, -1), softcap=0.0, sinks=None, slopes=None, scale=None):
    """q (B, Hq, L, D), k and v (B, Hkv, S, D); causal none, top_left or bottom_right."""
    B, Hq, L, D = q.shape
    S = k.shape[-2]
    k = k.repeat_interleave(Hq // k.shape[1], 1)
    v = v.repeat_interleave(Hq // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    d = 0 if causal == "top_left" else S - L  # query i's own key is i + d
    rights = [r for r in (window[1], 0 if causal != "none" else -1) if r >= 0]  # causality is a right side of 0
    see = torch.ones(L, S, dtype=torch.bool)
    if rights:
        see = see.tril(d + min(rights))
    if window[0] >= 0:
        see = see.triu(d - window[0])
    s = s.masked_fill(~see, float("-inf"))
    i = torch.arange(L).unsqueeze(-1) + d
    j = torch.arange(S)
    if slopes is not None:
        slopes = slopes if slopes.dim() == 2 else slopes.unsqueeze(0).expand(B, -1)
        s = s - slopes[:, :, None, None] * (i - j).abs().to(s.dtype)
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(B, -1, L, 1)], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees nothing gives 0
    lse = torch.logsumexp(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    return p @ v, lse


def inputs(B=2, Hq=4, Hkv=2, L=9, S=13, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, S, D, generator=g, dtype=dtype)
    sinks = torch.randn(Hq, generator=g, dtype=dtype) * 2
    slopes = torch.rand(B, Hq, generator=g, dtype=dtype)
    dout = torch.randn(B, Hq, L, D, generator=g, dtype=dtype)
    return q, k, v, sinks, slopes, dout


VARIANTS = {  # keyword arguments of both the reference and mha (the numpy API's causality is top-left)
    "softcap": dict(softcap=1.5),
    "sinks": dict(sinks=True),
    "alibi_heads": dict(slopes="heads"),
    "alibi_batch_heads": dict(slopes="batch_heads"),
    "all_causal_window": dict(causal="top_left", window=(3, 0), softcap=2.0, sinks=True, slopes="heads"),
}


def arguments(case, sinks, slopes):
    kw = dict(VARIANTS[case])
    kw["sinks"] = sinks if kw.get("sinks") else None
    kw["slopes"] = {None: None, "heads": slopes[0], "batch_heads": slopes}[kw.get("slopes")]
    return kw


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_numpy_api_against_the_reference(case):
    q, k, v, sinks, slopes, dout = inputs()
    kw = arguments(case, sinks.clone().requires_grad_(True), slopes)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    want, want_lse = reference(qr, kr, vr, **kw)
    want_grads = torch.autograd.grad(want, [qr, kr, vr] + ([kw["sinks"]] if kw["sinks"] is not None else []), dout)
    numpy_kw = dict(is_causal=kw.get("causal") == "top_left", window_size=kw.get("window", (-1, -1)),
                    softcap=kw.get("softcap", 0.0), enable_gqa=True,
                    sinks=None if kw["sinks"] is None else kw["sinks"].detach().numpy(),
                    alibi_slopes=None if kw["slopes"] is None else kw["slopes"].numpy())
    out, lse = mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), return_logsumexp=True, **numpy_kw)
    assert_close_f64(out, want.detach().numpy(), f"{case} output")
    assert_close_f64(lse, want_lse.detach().numpy(), f"{case} logsumexp")
    grads = mha.scaled_dot_product_attention_backward(dout.numpy(), q.numpy(), k.numpy(), v.numpy(), output=out,
                                                      logsumexp=lse, **numpy_kw)
    assert len(grads) == len(want_grads)  # grad_sinks comes fourth, with sinks
    for name, got, expected in zip(("query", "key", "value", "sinks"), grads, want_grads):
        assert_close_f64(got, expected.numpy(), f"{case} grad_{name}")
    # float32 under FlashAttention's rule against the same float64 values
    q32, k32, v32 = (t.float().numpy() for t in (q, k, v))
    kw32 = {n: (x.astype(np.float32) if isinstance(x, np.ndarray) else x) for n, x in numpy_kw.items()}
    ref32, _ = reference(*(t.float() for t in (q, k, v)), **{n: (x.detach().float() if isinstance(x, torch.Tensor)
                                                                  else x) for n, x in kw.items()})
    out32 = mha.scaled_dot_product_attention(q32, k32, v32, **kw32)
    assert_flash_rule(out32, want.detach().numpy(), ref32.numpy(), f"{case} float32 output")


def test_torch_sdpa_gradcheck_with_every_variant():
    q, k, v, sinks, slopes, _ = inputs(B=1, Hq=2, Hkv=1, L=5, S=7, D=3)
    q, k, v, sinks = (t.requires_grad_(True) for t in (q, k, v, sinks))

    def f(q, k, v, sinks):
        return mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(2, 0),
                                                      softcap=1.2, sinks=sinks, alibi_slopes=slopes[0])
    assert torch.autograd.gradcheck(f, (q, k, v, sinks))
    want, _ = reference(q, k, v, causal="top_left", window=(2, 0), softcap=1.2, sinks=sinks, slopes=slopes[0])
    torch.testing.assert_close(f(q, k, v, sinks), want, rtol=0, atol=1e-13)


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v, sinks, slopes, dout = inputs()
    q, k, v, sinks = (t.float().requires_grad_(True) for t in (q, k, v, sinks))

    def f(q, k, v, sinks):
        return mha.torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=2.0, sinks=sinks,
                                                      alibi_slopes=slopes.float())
    compiled = torch.compile(f, fullgraph=True)
    eager_out = f(q, k, v, sinks)
    eager = torch.autograd.grad(eager_out, (q, k, v, sinks), dout.float())
    out = compiled(q, k, v, sinks)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout.float())
    torch.testing.assert_close(out, eager_out, rtol=0, atol=0)
    for a, b in zip(grads, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def flash_layout(t):
    return t.transpose(1, 2).contiguous()  # (B, H, N, D) -> FlashAttention's (B, N, H, D)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_against_the_reference(causal):
    q, k, v, sinks, slopes, dout = inputs(L=6, S=11)
    q, k, v, sinks = (t.requires_grad_(True) for t in (q, k, v, sinks))
    kw = dict(causal="bottom_right" if causal else "none", window=(4, 1), softcap=3.0, sinks=sinks, slopes=slopes)
    want, want_lse = reference(q, k, v, **kw)
    out, lse, probs = mha.torch.flash_attn_func(flash_layout(q), flash_layout(k), flash_layout(v), causal=causal,
                                                window_size=(4, 1), softcap=3.0, alibi_slopes=slopes, sinks=sinks,
                                                return_attn_probs=True)
    assert out.shape == (2, 6, 4, 8) and out.is_contiguous() and probs is None
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 6)  # FlashAttention's softmax_lse
    torch.testing.assert_close(out, flash_layout(want), rtol=0, atol=1e-13)
    torch.testing.assert_close(lse, want_lse.float(), rtol=1e-6, atol=1e-6)
    got = torch.autograd.grad(out, (q, k, v, sinks), flash_layout(dout))
    expected = torch.autograd.grad(want, (q, k, v, sinks), dout)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def packed(lengths_q, lengths_k, Hq=4, Hkv=2, D=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), Hq, D, generator=g, dtype=torch.float64)
    k = torch.randn(sum(lengths_k), Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(sum(lengths_k), Hkv, D, generator=g, dtype=torch.float64)
    cu = [torch.tensor([0] + np.cumsum(n).tolist(), dtype=torch.int32) for n in (lengths_q, lengths_k)]
    return q, k, v, cu[0], cu[1]


def test_flash_attn_varlen_func_equals_each_sequence_on_its_own():
    lengths_q, lengths_k = [5, 0, 9, 1, 40], [5, 3, 12, 4, 40]
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    slopes = torch.rand(5, 4, dtype=torch.float64)
    kw = dict(causal=True, window_size=(6, 0), softcap=2.5)
    out = mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, alibi_slopes=slopes, **kw)
    assert out.shape == q.shape
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for s in range(5):
        rq, rk = slice(int(cu_q[s]), int(cu_q[s + 1])), slice(int(cu_k[s]), int(cu_k[s + 1]))
        if rq.stop == rq.start:
            continue
        one = mha.torch.flash_attn_func(q[rq][None], k[rk][None], v[rk][None], alibi_slopes=slopes[s], **kw)[0]
        torch.testing.assert_close(out[rq], one, rtol=0, atol=1e-13)
        want = torch.autograd.grad(one, (q, k, v), dout[rq])
        torch.testing.assert_close(grads[0][rq], want[0][rq], rtol=0, atol=1e-12)
        torch.testing.assert_close(grads[1][rk], want[1][rk], rtol=0, atol=1e-12)
    # int64 offsets are the same call
    same = mha.torch.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k.long(), 40, 40, alibi_slopes=slopes, **kw)
    torch.testing.assert_close(same, out, rtol=0, atol=0)


def test_numpy_alibi_slopes_of_several_batch_dimensions():
    # (*batch, Hq): each batch element its own slopes, as the call on that element alone; slopes
    # of another batch shape (the same count of rows included) are refused, not misassigned.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 4, 5, 8)) for _ in range(3))
    slopes = rng.random((2, 3, 4))
    out = mha.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes)
    for b in np.ndindex(2, 3):
        np.testing.assert_array_equal(out[b], mha.scaled_dot_product_attention(q[b], k[b], v[b], alibi_slopes=slopes[b]))
    for shape in [(3, 2, 4), (6, 4), (1, 3, 4), (2, 3, 1, 4)]:
        with pytest.raises(mha.ArgumentError, match=rf"alibi_slopes: expected shape \(Hq,\) or \(\*batch, Hq\) = "
                                                    rf"\(2, 3, Hq\), got \({', '.join(map(str, shape))}\)"):
            mha.scaled_dot_product_attention(q, k, v, alibi_slopes=np.zeros(shape))


def test_numpy_packed_sequences():
    q, k, v, cu_q, cu_k = packed([3, 7], [4, 7])
    heads = lambda t: t.permute(1, 0, 2).numpy()  # (total, H, D) -> (H, total, D)
    out = mha.scaled_dot_product_attention(heads(q), heads(k), heads(v), enable_gqa=True, cu_seqlens_q=cu_q.numpy(),
                                           cu_seqlens_k=cu_k.numpy())
    for s in range(2):
        rq, rk = slice(int(cu_q[s]), int(cu_q[s + 1])), slice(int(cu_k[s]), int(cu_k[s + 1]))
        one = mha.scaled_dot_product_attention(heads(q[rq]), heads(k[rk]), heads(v[rk]), enable_gqa=True)
        np.testing.assert_array_equal(out[:, rq], one)


def test_merge_attention_states_gives_the_whole_call():
    q, k, v, sinks, _, _ = inputs(L=5, S=20)
    fq, fk, fv = (flash_layout(t) for t in (q, k, v))
    whole = mha.torch.flash_attn_func(fq, fk, fv)
    # A shared prefix of 12 keys and the rest: each set's output and lse, then the merge.
    a, lse_a = mha.scaled_dot_product_attention(q.numpy(), k[:, :, :12].numpy(), v[:, :, :12].numpy(),
                                                enable_gqa=True, return_logsumexp=True)
    b, lse_b = mha.scaled_dot_product_attention(q.numpy(), k[:, :, 12:].numpy(), v[:, :, 12:].numpy(),
                                                enable_gqa=True, return_logsumexp=True)
    out, lse = mha.torch.merge_attention_states(torch.from_numpy(a), torch.from_numpy(lse_a), torch.from_numpy(b),
                                                torch.from_numpy(lse_b))
    torch.testing.assert_close(flash_layout(out), whole, rtol=0, atol=1e-14)
    _, whole_lse = mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), enable_gqa=True,
                                                    return_logsumexp=True)
    np.testing.assert_allclose(lse.numpy(), whole_lse, rtol=0, atol=1e-14)
    # a set a row does not see (lse -inf, output 0) leaves the other's row as it is
    empty = torch.full_like(torch.from_numpy(lse_b), float("-inf"))
    out, lse = mha.torch.merge_attention_states(torch.from_numpy(a), torch.from_numpy(lse_a),
                                                torch.zeros_like(torch.from_numpy(b)), empty)
    np.testing.assert_array_equal(out.numpy(), a)
    np.testing.assert_array_equal(lse.numpy(), lse_a)
    # Wrong dtypes are type errors (TypeError), wrong shapes value errors, each named.
    with pytest.raises(mha.ArgumentTypeError, match=r"output_b: expected .* dtype float64 \(from output_a\)"):
        mha.torch.merge_attention_states(*map(torch.from_numpy, (a, lse_a, b.astype(np.float32), lse_b)))
    with pytest.raises(mha.ArgumentTypeError, match="lse_b: expected a floating-point array"):
        mha.torch.merge_attention_states(*map(torch.from_numpy, (a, lse_a, b, lse_b.astype(np.int64))))
    with pytest.raises(mha.ArgumentError, match="lse_b: expected a floating-point array of shape"):
        mha.torch.merge_attention_states(*map(torch.from_numpy, (a, lse_a, b, np.ascontiguousarray(lse_b[..., :1]))))


@pytest.mark.parametrize("case", VARIANT_CASES)
def test_variant_goldens(case):
    """The goldens Gemma 2's, gpt-oss's and Bloom's code in transformers, FlashAttention's
    attention_ref and PyTorch's SDPA per packed sequence wrote, through the numpy API (float32
    under FlashAttention's rule, float64)."""
    inputs_, metadata, expected, torch_f32 = load_case(case, "variants")
    for dtype in (np.float32, np.float64):
        q, k, v, dout = (inputs_[n].astype(dtype) for n in ("query", "key", "value", "grad_output"))
        kw = dict(attn_mask=inputs_.get("attn_mask"), softcap=float(metadata.get("softcap", 0.0)),
                  window_size=(int(metadata.get("window_left", -1)), int(metadata.get("window_right", -1))),
                  sinks=inputs_.get("sinks"), alibi_slopes=inputs_.get("alibi_slopes"), enable_gqa=True)
        causal = metadata["causal"]
        if kw["attn_mask"] is not None and causal == "top_left":
            # SDPA's rule refuses a mask with is_causal: the causal mask joins the padding mask instead
            # (L = S here, so the window's diagonal is the same without causality).
            assert q.shape[-2] == k.shape[-2]
            kw["attn_mask"] = kw["attn_mask"] & np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
            causal = "none"
        packed = inputs_.get("cu_seqlens_q"), inputs_.get("cu_seqlens_k")
        variants = _fields.variants({n: kw[n] for n in ("window_size", "softcap", "sinks", "alibi_slopes")}, "test")
        variants["cu_seqlens_q"], variants["cu_seqlens_k"] = packed
        out, lse, _ = _core.forward(q, k, v, kw["attn_mask"], 0.0, causal, None, True, None, 2, variants)
        grads = _core.backward(dout, q, k, v, out, lse, kw["attn_mask"], 0.0, causal, None, True, None, 2, variants)
        ours = dict(zip(("output", "grad_query", "grad_key", "grad_value", "grad_sinks"), (out, *grads)))
        assert set(ours) == set(expected)
        for name in expected:
            if dtype == np.float32:
                assert_flash_rule(ours[name], expected[name], torch_f32[name], f"{case} {name} float32")
            else:
                assert_close_f64(ours[name], expected[name], f"{case} {name} float64")


@pytest.mark.parametrize("call, message", [
    (lambda a: mha.scaled_dot_product_attention(*a, softcap=-1.0), "softcap: expected 0 (none) or a finite cap > 0"),
    (lambda a: mha.scaled_dot_product_attention(*a, softcap=float("nan")), "softcap: expected 0 (none)"),
    (lambda a: mha.scaled_dot_product_attention(*a, sinks=np.zeros(3)), "sinks: expected shape (Hq) = [4]"),
    (lambda a: mha.scaled_dot_product_attention(*a, sinks=np.array([0, np.nan, 0, 0])), "sinks: expected finite"),
    (lambda a: mha.scaled_dot_product_attention(*a, alibi_slopes=np.zeros((3, 4))), "alibi_slopes: expected shape"),
    (lambda a: mha.scaled_dot_product_attention(*a, alibi_slopes=np.zeros(4, dtype=np.int64)),
     "alibi_slopes: expected a floating-point array"),
    (lambda a: mha.scaled_dot_product_attention(*a, cu_seqlens_q=np.array([0, 9]), cu_seqlens_k=np.array([0.0, 9.0])),
     "cu_seqlens_k: expected int32 or int64 values"),
])
def test_numpy_bad_values(call, message):
    q, k, v, *_ = inputs(B=2, Hq=4, Hkv=4)
    with pytest.raises((mha.ArgumentError, mha.ArgumentTypeError), match=None) as e:
        call((q.numpy(), k.numpy(), v.numpy()))
    assert message in str(e.value)


def test_flash_functions_bad_values():
    q, k, v, cu_q, cu_k = packed([3, 7], [4, 7])
    with pytest.raises(mha.ArgumentError, match="max_seqlen_q: expected at least the longest sequence's 7, got 5"):
        mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 7)
    # With a block_table, k and v are paged caches (test_paged.py): unpaged ones are named.
    with pytest.raises(mha.ArgumentError, match=r"k: expected a paged cache \(num_blocks, page_block_size"):
        mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(mha.ArgumentError, match="cu_seqlens_q: expected non-decreasing offsets"):
        mha.torch.flash_attn_varlen_func(q, k, v, torch.tensor([0, 7, 3, 10], dtype=torch.int32),
                                         torch.tensor([0, 4, 4, 11], dtype=torch.int32), 7, 7)
    with pytest.raises(mha.ArgumentTypeError, match="cu_seqlens_k: expected a 1-D int32 or int64 tensor"):
        mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k.float(), 7, 7)
    with pytest.raises(mha.ArgumentError, match="q, k, v: expected floating-point CPU tensors mha can read, got "
                                                "tensors on meta"):
        mha.torch.flash_attn_func(q[None].to("meta"), k[None].to("meta"), v[None].to("meta"))
    # flash-attn's ranks: (batch, seqlen, nheads, headdim) and (total, nheads, headdim)
    with pytest.raises(mha.ArgumentError, match=r"q: expected 4 dimensions \(batch, seqlen, nheads, headdim\), got "
                                                r"shape \(10, 4, 8\)"):
        mha.torch.flash_attn_func(q, k, v)
    with pytest.raises(mha.ArgumentError, match=r"k: expected 3 dimensions \(total, nheads, headdim\), got shape "
                                                r"\(1, 11, 2, 8\)"):
        mha.torch.flash_attn_varlen_func(q, k[None], v, cu_q, cu_k, 7, 7)
    # max_seqlen: anything that stands for an int, as flash-attn takes it
    want = mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7)
    for length in (np.int64(7), torch.tensor(7)):
        torch.testing.assert_close(mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, length, length), want,
                                   rtol=0, atol=0)
    with pytest.raises(mha.ArgumentTypeError, match="max_seqlen_k: expected an integer, got float"):
        mha.torch.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7.0)
    # Decreasing offsets are named as such, not as a max_seqlen too small.
    with pytest.raises(mha.ArgumentError, match="cu_seqlens_q: expected non-decreasing offsets"):
        mha.torch.flash_attn_varlen_func(q, k, v, torch.tensor([0, -1, 10], dtype=torch.int32), cu_k, 7, 7)
    # Outside mha's inputs, PyTorch's SDPA has no soft-cap, sinks or ALiBi: refused, not dropped.
    b = torch.randn(1, 2, 4, 8, device="meta")
    with pytest.raises(mha.ArgumentError, match="softcap, sinks: mha runs these only on inputs it can read"):
        mha.torch.scaled_dot_product_attention(b, b, b, softcap=2.0, sinks=torch.zeros(2))


def test_lengths_starts_and_chunks_reach_the_doors_from_mhas_lists():
    """query_lengths, key_lengths, key_starts and chunk_size reach the numpy door, mha.torch and
    FlashAttention's function with no code of their own in the package (mha._fields builds the
    keywords from the binding's lists), and equal PyTorch's SDPA given the dense mask of their
    definition (docs/variants.md): sequence b's keys are [start, end) (a negative start: the
    sequence began before the call's first key), its positions its own, query i's own key
    i + S_b - L, and with chunks it sees only that key's chunk of C positions."""
    assert {"chunk_size", "query_lengths", "key_lengths", "key_starts"} <= set(_fields.KEYWORDS)
    assert "chunk_size" in inspect.signature(mha.scaled_dot_product_attention).parameters
    B, H, L, S, D, C = 3, 2, 6, 11, 8, 4
    generator = torch.Generator().manual_seed(3)  # its own: the global stream stays as other tests leave it
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, generator=generator) for n in (L, S, S))
    starts, ends = torch.tensor([0, 2, -5]), torch.tensor([11, 9, 11])  # the third began 5 keys before the call

    def dense(causal):
        mask = torch.zeros(B, 1, L, S, dtype=torch.bool)
        for b in range(B):
            own = int(ends[b] - starts[b])
            for i in range(L):
                diagonal = i + own - L
                for j in range(max(int(starts[b]), 0), int(ends[b])):
                    jo = j - int(starts[b])
                    mask[b, 0, i, j] = jo // C == diagonal // C and (not causal or jo <= diagonal)
        return mask

    for causal in (False, True):
        mask = dense(causal)
        seen = mask.any(-1, keepdim=True)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).where(seen, 0)
        keywords = dict(chunk_size=C, key_starts=starts, key_lengths=ends)
        got = mha.torch.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                                        **keywords).transpose(1, 2)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        if not causal:  # numpy's door and mha.torch's: without causality the diagonal is S_b - L too
            got = mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                   **{n: x.numpy() if torch.is_tensor(x) else x
                                                      for n, x in keywords.items()})
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
            got = mha.torch.scaled_dot_product_attention(q, k, v, **keywords)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(mha.ArgumentError, match="chunk_size: expected 0 \\(no chunks\\) or a number of keys > 0"):
        mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), chunk_size=-2)
    with pytest.raises(mha.ArgumentTypeError, match="chunk_size: expected an integer"):
        mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), chunk_size=2.5)
    # A half call PyTorch computes in float (a float32 mask) checks the views as the half call does.
    half = (x.numpy().astype(_core.BFLOAT16) for x in (q, k, v))
    with pytest.raises(mha.ArgumentTypeError, match="sinks: expected a floating-point array, got dtype int64"):
        mha.scaled_dot_product_attention(*half, attn_mask=np.zeros((L, S), np.float32), sinks=np.zeros(H, np.int64))
    # Inputs mha cannot run go to PyTorch's SDPA, which has none of these: refused by their names
    # (the lengths an array, whose truth is not a bool).
    with pytest.raises(mha.ArgumentError, match="chunk_size, key_lengths: mha runs these only on inputs it can read"):
        mha.torch.scaled_dot_product_attention(*(x.to(torch.int32) for x in (q, k, v)), chunk_size=C,
                                               key_lengths=ends.numpy())
    with pytest.raises(mha.ArgumentTypeError, match="unexpected keyword argument 'chunk'"):
        mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), chunk=2)
