"""The numpy API (no torch): PyTorch's goldens, SDPA's shapes and broadcasting, dropout, thread
counts, zero-copy, and an error for every bad input."""
import os
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest
from conftest import SDPA_CASES, assert_close_f64, assert_flash_rule, load_case

import mha
from mha import _core, _fields, _layout, _mha


def run_golden(inputs, metadata, dtype):
    q, k, v, dout = (inputs[n].astype(dtype) for n in ("query", "key", "value", "grad_output"))
    mask = inputs.get("attn_mask")
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(dtype)
    scale = float(metadata["scale"]) if metadata["scale"] else None
    gqa = metadata["enable_gqa"] == "true"
    causal = metadata["causal"]
    # Every plain setting the metadata names, by mha's own list (a new one needs no edit here).
    variants = {name: type(default)(metadata[name]) for name, default in _fields.SETTINGS if name in metadata}
    if causal == "bottom_right":  # not in SDPA's signature: mha.torch reaches it through CausalBias
        out, lse, _ = _core.forward(q, k, v, mask, 0.0, causal, scale, gqa, None, 2, variants)
        grads = _core.backward(dout, q, k, v, out, lse, mask, 0.0, causal, scale, gqa, None, 2, variants)
    else:
        keywords = {"window_size": (variants.pop("window_left", -1), variants.pop("window_right", -1)), **variants}
        out, lse = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal == "top_left",
                                                    scale=scale, enable_gqa=gqa, return_logsumexp=True, **keywords)
        grads = mha.scaled_dot_product_attention_backward(dout, q, k, v, attn_mask=mask, is_causal=causal == "top_left",
                                                          scale=scale, enable_gqa=gqa, output=out, logsumexp=lse,
                                                          **keywords)
    return dict(zip(("output", "grad_query", "grad_key", "grad_value"), (out, *grads)))


@pytest.mark.parametrize("case", SDPA_CASES)
def test_golden(case):
    inputs, metadata, expected, torch_f32 = load_case(case)
    ours32 = run_golden(inputs, metadata, np.float32)
    ours64 = run_golden(inputs, metadata, np.float64)
    assert set(ours32) == set(expected)
    for name in expected:
        assert ours32[name].dtype == np.float32 and ours64[name].dtype == np.float64
        assert_flash_rule(ours32[name], expected[name], torch_f32[name], f"{case} {name} float32")
        assert_close_f64(ours64[name], expected[name], f"{case} {name} float64")


def randn(*shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed + len(shape) * 7 + sum(shape)).standard_normal(shape).astype(dtype)


def test_backward_recomputes_forward_when_not_given():
    q, k, v, dout = randn(2, 3, 4, 5), randn(2, 3, 6, 5, seed=1), randn(2, 3, 6, 5, seed=2), randn(2, 3, 4, 5, seed=3)
    out, lse = mha.scaled_dot_product_attention(q, k, v, is_causal=True, return_logsumexp=True)
    given = mha.scaled_dot_product_attention_backward(dout, q, k, v, is_causal=True, output=out, logsumexp=lse)
    recomputed = mha.scaled_dot_product_attention_backward(dout, q, k, v, is_causal=True)
    for a, b in zip(given, recomputed):
        np.testing.assert_array_equal(a, b)


def materialized(query, key, value, mask, gqa):
    """The same problem with every input broadcast and copied to the full (B..., H, n, d) shape
    and the key/value heads repeated (torch's repeat_interleave): what the layout must equal."""
    layout = _layout.Layout(query.shape, key.shape, value.shape, gqa)
    out = []
    for name, x in (("query", query), ("key", key), ("value", value)):
        s = layout.padded[name]
        x = np.broadcast_to(np.repeat(x.reshape(s), layout.heads // s[-3], axis=-3), layout.batch + (layout.heads,) + s[-2:])
        out.append(np.ascontiguousarray(x if layout.rank >= 3 else x.reshape(s[-2:])))
    if mask is not None:
        mask = np.ascontiguousarray(np.broadcast_to(mask, layout.mask_shape()))
    return (*out, mask)


def sum_to(grad, shape):
    """grad summed over what broadcasting and the head repeat added, back to `shape`."""
    lead = grad.shape[:-2]
    padded = (1,) * (len(lead) + 2 - len(shape)) + tuple(shape)
    h = padded[-3] if len(padded) >= 3 else 1
    if len(lead) and lead[-1] != h and h != 1:  # repeated heads: fold the repeats
        grad = grad.reshape(lead[:-1] + (h, lead[-1] // h) + grad.shape[-2:]).sum(axis=-3)
    axes = tuple(i for i, (a, b) in enumerate(zip(padded, grad.shape)) if a == 1 and b != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


BROADCAST_CASES = {
    # name: (query shape, key shape, value shape, mask shape or None, enable_gqa)
    "rank2": ((4, 5), (6, 5), (6, 3), None, False),
    "rank3": ((2, 4, 5), (2, 6, 5), (2, 6, 3), (2, 4, 6), False),
    "rank3_gqa": ((4, 3, 5), (2, 6, 5), (2, 6, 5), None, True),
    "query_without_batch": ((4, 3, 5), (2, 4, 6, 5), (2, 4, 6, 5), None, False),  # PyTorch's OpInfo sample
    "query_batch_1": ((1, 4, 3, 5), (2, 4, 6, 5), (2, 4, 6, 5), (3, 6), False),
    "one_kv_head_without_gqa": ((2, 4, 3, 5), (2, 1, 6, 5), (2, 1, 6, 5), (2, 1, 1, 6), False),
    "one_query_head": ((2, 1, 3, 5), (2, 4, 6, 5), (2, 4, 6, 5), None, False),
    "key_one_head_value_all": ((2, 4, 3, 5), (2, 1, 6, 5), (2, 4, 6, 5), None, False),
    "gqa_key_and_value_differ": ((2, 8, 3, 5), (2, 2, 6, 5), (2, 4, 6, 3), None, True),
    "rank5": ((2, 3, 4, 3, 5), (2, 3, 4, 6, 5), (2, 3, 4, 6, 5), (4, 3, 6), False),
    "rank5_broadcast": ((2, 1, 4, 3, 5), (1, 3, 4, 6, 5), (1, 3, 4, 6, 5), (3, 1, 3, 6), False),
    "scalar_mask": ((2, 4, 3, 5), (2, 4, 6, 5), (2, 4, 6, 5), (), False),
}


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("case", BROADCAST_CASES)
def test_broadcasting_equals_materialized_inputs(case, mask_kind):
    qs, ks, vs, ms, gqa = BROADCAST_CASES[case]
    q, k, v = randn(*qs), randn(*ks, seed=1), randn(*vs, seed=2)
    mask = None
    if ms is not None:
        mask = randn(*ms, seed=3) > -0.5 if mask_kind == "bool" else randn(*ms, seed=3)
    out = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    qf, kf, vf, mf = materialized(q, k, v, mask, gqa)
    expected = mha.scaled_dot_product_attention(qf, kf, vf, attn_mask=mf)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-14)
    dout = randn(*out.shape, seed=4)
    grads = mha.scaled_dot_product_attention_backward(dout, q, k, v, attn_mask=mask, enable_gqa=gqa)
    full = mha.scaled_dot_product_attention_backward(dout, qf, kf, vf, attn_mask=mf)
    for name, g, gf, x in zip(("query", "key", "value"), grads, full, (q, k, v)):
        assert g.shape == x.shape, name
        np.testing.assert_allclose(g, sum_to(gf, x.shape), rtol=0, atol=1e-13, err_msg=name)


def test_strided_inputs_give_the_contiguous_result():
    # (B, L, H, D) memory viewed as (B, H, L, D), a last dimension with a stride (copied), a
    # reversed one (negative strides: copied) and a misaligned buffer (copied).
    q, k, v = randn(2, 5, 3, 8, seed=1), randn(2, 7, 3, 8, seed=2), randn(2, 7, 3, 8, seed=3)
    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    expected = mha.scaled_dot_product_attention(*(np.ascontiguousarray(x) for x in (qt, kt, vt)))
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(qt, kt, vt), expected)
    wide = randn(2, 3, 7, 16, seed=4)
    every_other = wide[..., ::2]
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(qt, every_other, vt),
                                  mha.scaled_dot_product_attention(qt, every_other.copy(), vt))
    reversed_q = qt[:, :, ::-1]
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(reversed_q, kt, vt),
                                  mha.scaled_dot_product_attention(reversed_q.copy(), kt, vt))
    # A size-1 dimension reversed: numpy calls the array contiguous, with a negative stride.
    one_head = [np.ascontiguousarray(x[:, :1]) for x in (qt, kt, vt)]
    flipped = np.flip(one_head[0], axis=1)
    assert flipped.flags.c_contiguous and min(flipped.strides) < 0
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(flipped, *one_head[1:]),
                                  mha.scaled_dot_product_attention(*one_head))
    out = mha.scaled_dot_product_attention(*one_head)
    for got, want in zip(mha.scaled_dot_product_attention_backward(np.flip(out, axis=1), flipped, *one_head[1:]),
                         mha.scaled_dot_product_attention_backward(out, *one_head)):
        np.testing.assert_array_equal(got, want)
    raw = np.zeros(qt.size * 8 + 1, dtype=np.uint8)
    misaligned = raw[1:].view(np.float64).reshape(qt.shape)
    misaligned[...] = qt
    assert not misaligned.flags.aligned
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(misaligned, kt, vt), expected)


def test_a_float32_mask_with_float64_inputs_is_widened_exactly():
    # PyTorch's SDPA takes a float32 mask with any query dtype; widened to float64 it is exact.
    q, k, v, dout = randn(2, 3, 4, 5), randn(2, 3, 6, 5, seed=1), randn(2, 3, 6, 5, seed=2), randn(2, 3, 4, 5, seed=3)
    mask = randn(4, 6, dtype=np.float32, seed=4)
    mask[1, 2] = -np.inf
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                  mha.scaled_dot_product_attention(q, k, v, attn_mask=mask.astype(np.float64)))
    for got, want in zip(mha.scaled_dot_product_attention_backward(dout, q, k, v, attn_mask=mask),
                         mha.scaled_dot_product_attention_backward(dout, q, k, v, attn_mask=mask.astype(np.float64))):
        np.testing.assert_array_equal(got, want)


def test_a_float32_mask_is_widened_without_a_copy():
    # (a half call with a float32 mask runs as the float call: the L x S mask as it is, not copied)
    mask = np.zeros((64, 64), np.float32)
    assert _core._widened(mask) is mask


def _attention_in_child(queue, q, k, v):
    queue.put((mha.get_num_threads(), mha.scaled_dot_product_attention(q, k, v)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_runs_on_one_thread_and_does_not_hang():
    # libgomp's thread pool, made by the parent's parallel call, is not in a forked child (a
    # DataLoader worker): a parallel region there would wait for its threads forever. The child
    # runs on one thread instead, and gives the same result bit for bit.
    q, k, v = (randn(1, 4, 256, 64, dtype=np.float32, seed=s) for s in range(3))  # enough work for both threads
    saved = mha.get_num_threads()
    mha.set_num_threads(2)
    try:
        want = mha.scaled_dot_product_attention(q, k, v)  # (the pool exists from here on)
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_attention_in_child, args=(queue, q, k, v))
        child.start()
        try:
            threads, got = queue.get(timeout=120)  # (before join: the child exits once its result is read)
        except Exception:
            child.kill()
            pytest.fail("the forked child hung in its attention call")
        child.join()
    finally:
        mha.set_num_threads(saved)
    assert threads == 1 and mha.get_num_threads() == saved
    np.testing.assert_array_equal(got, want)


# numpy >= 2 gives every empty array strides of 0, and mha refuses a last dimension of stride 0
# even when there are no elements; the package re-strides such arrays.
def test_no_queries():
    q, k, v = randn(2, 3, 0, 4), randn(2, 3, 5, 4), randn(2, 3, 5, 6)
    assert mha.scaled_dot_product_attention(q, k, v).shape == (2, 3, 0, 6)
    dq, dk, dv = mha.scaled_dot_product_attention_backward(randn(2, 3, 0, 6), q, k, v)
    assert dq.shape == q.shape
    np.testing.assert_array_equal(dk, np.zeros_like(k))  # no query: no gradient
    np.testing.assert_array_equal(dv, np.zeros_like(v))


def test_no_heads():  # PyTorch returns empty results
    q, k, v = randn(2, 0, 4, 4), randn(2, 0, 5, 4), randn(2, 0, 5, 6)
    assert mha.scaled_dot_product_attention(q, k, v).shape == (2, 0, 4, 6)
    grads = mha.scaled_dot_product_attention_backward(randn(2, 0, 4, 6), q, k, v)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_no_keys():
    q, k, v = randn(2, 3, 4, 4), randn(2, 3, 0, 4), randn(2, 3, 0, 6)
    out = mha.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(out, np.zeros((2, 3, 4, 6)))  # every row fully masked


def test_no_keys_backward():
    q, k, v = randn(2, 3, 4, 4), randn(2, 3, 0, 4), randn(2, 3, 0, 6)
    dq, dk, dv = mha.scaled_dot_product_attention_backward(randn(2, 3, 4, 6), q, k, v)
    np.testing.assert_array_equal(dq, np.zeros_like(q))
    assert dk.shape == k.shape and dv.shape == v.shape


def test_dropout_is_a_function_of_the_seed():
    q, k, v = randn(2, 2, 6, 4), randn(2, 2, 6, 4, seed=1), randn(2, 2, 6, 4, seed=2)
    a = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_seed=7)
    np.testing.assert_array_equal(a, mha.scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_seed=7))
    assert not np.array_equal(a, mha.scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_seed=8))
    assert not np.array_equal(a, mha.scaled_dot_product_attention(q, k, v))
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(q, k, v, dropout_p=1.0, dropout_seed=7),
                                  np.zeros_like(a))


def test_dropout_backward_matches_finite_differences():
    # The backward drops exactly the forward's entries when given its seed: checked against
    # central differences of the forward itself, in float64, with a mask and GQA as well.
    q, k, v = randn(1, 2, 3, 4), randn(1, 1, 5, 4, seed=1), randn(1, 1, 5, 3, seed=2)
    mask = randn(3, 5, seed=3) > -0.8
    dout = randn(1, 2, 3, 3, seed=4)
    kw = dict(attn_mask=mask, dropout_p=0.3, enable_gqa=True, dropout_seed=2**64 - 5)

    def loss(q, k, v):
        return float((mha.scaled_dot_product_attention(q, k, v, **kw) * dout).sum())
    grads = mha.scaled_dot_product_attention_backward(dout, q, k, v, **kw)
    args = [q, k, v]
    for i, g in enumerate(grads):
        numeric = np.zeros_like(g)
        for idx in np.ndindex(g.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[i][idx] += 1e-6
            minus[i][idx] -= 1e-6
            numeric[idx] = (loss(*plus) - loss(*minus)) / 2e-6
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_are_bitwise_the_same_for_1_and_2_threads(dtype):
    q, k, v = randn(2, 4, 96, 32, dtype=dtype), randn(2, 2, 80, 32, dtype=dtype, seed=1), randn(2, 2, 80, 16, dtype=dtype, seed=2)
    mask = randn(96, 80, seed=3) > -1
    dout = randn(2, 4, 96, 16, dtype=dtype, seed=4)
    kw = dict(attn_mask=mask, enable_gqa=True, dropout_p=0.1, dropout_seed=3)
    results = []
    saved = mha.get_num_threads()
    try:
        for n in (1, 2):
            mha.set_num_threads(n)
            assert mha.get_num_threads() == n
            out = mha.scaled_dot_product_attention(q, k, v, **kw)
            results.append((out, *mha.scaled_dot_product_attention_backward(dout, q, k, v, **kw)))
    finally:
        mha.set_num_threads(saved)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("env, expected", [("3", 3), ("2,1", 2), ("", None), ("zero", None)])
def test_default_thread_count(env, expected):
    code = "import mha; print(mha.get_num_threads())"
    environ = dict(os.environ, OMP_NUM_THREADS=env)
    got = int(subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                             check=True).stdout)
    assert got == (expected if expected is not None else len(os.sched_getaffinity(0)))


def address(a):
    return a.__array_interface__["data"][0]


def test_inputs_that_mha_can_view_are_not_copied(binding_spy):
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 8, seed=1), randn(2, 3, 6, 8, seed=2)
    strided_q = randn(2, 4, 3, 8, seed=3).transpose(0, 2, 1, 3)  # (B, L, H, D) memory
    mask = randn(4, 6, seed=4) > 0
    out, lse = mha.scaled_dot_product_attention(strided_q, k, v, attn_mask=mask, return_logsumexp=True)
    name, arguments = binding_spy[-1]
    assert name == "sdpa_forward"
    for mine, passed in ((strided_q, "query"), (k, "key"), (v, "value"), (mask, "attend_mask")):
        assert address(arguments[passed]) == address(mine), passed
        assert np.shares_memory(arguments[passed], mine)
    assert arguments["query"].strides == strided_q.strides
    # The results are the buffers mha wrote into.
    assert address(arguments["output"]) == address(out) and address(arguments["logsumexp"]) == address(lse)
    dout = randn(*out.shape, seed=5)
    grads = mha.scaled_dot_product_attention_backward(dout, q, k, v, output=out, logsumexp=lse)
    name, arguments = binding_spy[-1]
    assert name == "sdpa_backward"
    for mine, passed in ((q, "query"), (k, "key"), (v, "value"), (out, "output"), (lse, "logsumexp"),
                         (dout, "grad_output")):
        assert address(arguments[passed]) == address(mine), passed
    for g, passed in zip(grads, ("grad_query", "grad_key", "grad_value")):
        assert address(arguments[passed]) == address(g), passed
    # Rank 3 and a broadcast batch are views too.
    q3 = randn(3, 4, 8)
    mha.scaled_dot_product_attention(q3, randn(2, 3, 6, 8), randn(2, 3, 6, 8))
    arguments = binding_spy[-1][1]
    assert address(arguments["query"]) == address(q3) and arguments["query"].strides[0] == 0


def test_the_binding_never_converts():
    # A float64 query among float32 arrays matches neither overload: refused, not converted.
    q, k, v = (np.zeros((1, 1, 2, 4), dtype=np.float32) for _ in range(3))
    out, lse = np.empty((1, 1, 2, 4), dtype=np.float32), np.empty((1, 1, 2))
    with pytest.raises(TypeError):
        _mha.sdpa_forward(query=q.astype(np.float64), key=k, value=v, output=out, logsumexp=lse,
                          scoring=_mha.Scoring(), views=(None,) * len(_mha.views()), num_threads=1)
    # mha's own checks come back as ValueError: an output that overlaps an input.
    with pytest.raises(ValueError, match="overlaps an input"):
        _mha.sdpa_forward(query=q, key=k, value=v, output=q, logsumexp=lse, scoring=_mha.Scoring(),
                          views=(None,) * len(_mha.views()), num_threads=1)
    with pytest.raises(ValueError, match="num_threads"):
        _mha.sdpa_forward(query=q, key=k, value=v, output=out, logsumexp=lse, scoring=_mha.Scoring(),
                          views=(None,) * len(_mha.views()), num_threads=0)
    # A view of the wrong dtype is refused by its name, not converted.
    views = [None] * len(_mha.views())
    views[[n for n, _ in _mha.views()].index("key_lengths")] = np.zeros(1, dtype=np.int32)
    with pytest.raises(TypeError, match="key_lengths: expected a CPU array"):
        _mha.sdpa_forward(q, k, v, out, lse, _mha.Scoring(), tuple(views), 1)


Q, K, V = randn(2, 4, 3, 8), randn(2, 4, 5, 8, seed=1), randn(2, 4, 5, 8, seed=2)

FORWARD_ERRORS = {
    # name: (arguments, exception, part of the message)
    "rank_1": (dict(query=Q[0, 0, 0], key=K[0, 0, 0], value=V[0, 0, 0]), mha.ArgumentError, "query: expected at least 2"),
    "integer_dtype": (dict(query=Q.astype(np.int64), key=K.astype(np.int64), value=V.astype(np.int64)),
                      mha.ArgumentTypeError, "query: expected dtype float32, float64, float16 or bfloat16 "
                      "(ml_dtypes.bfloat16), got int64"),
    "mixed_dtypes": (dict(key=K.astype(np.float32)), mha.ArgumentTypeError, "key, value: expected the dtype of query"),
    "not_an_array": (dict(query=object()), mha.ArgumentTypeError, "query: expected dtype"),
    "head_size": (dict(key=K[..., :6]), mha.ArgumentError, "key: expected head size 8"),
    "sequence_length": (dict(value=V[:, :, :4]), mha.ArgumentError, "value: expected sequence length 5"),
    "heads": (dict(key=K[:, :2], value=V[:, :2]), mha.ArgumentError, "heads (dimension -3"),
    "gqa_heads": (dict(query=randn(2, 4, 3, 8), key=K[:, :3], value=V[:, :3], enable_gqa=True),
                  mha.ArgumentError, "enable_gqa: the numbers of key and value heads must divide"),
    "batch": (dict(key=randn(3, 4, 5, 8), value=randn(3, 4, 5, 8)), mha.ArgumentError, "batch dimensions"),
    "mask_shape": (dict(attn_mask=np.ones((3, 4), dtype=bool)), mha.ArgumentError,
                   "attn_mask: expected a shape broadcastable to (..., L, S) = (2, 4, 3, 5), got (3, 4)"),
    "mask_rank": (dict(attn_mask=np.ones((1, 1, 1, 3, 5), dtype=bool)), mha.ArgumentError, "attn_mask: expected"),
    "mask_integer": (dict(attn_mask=np.ones((3, 5), dtype=np.int32)), mha.ArgumentTypeError,
                     "attn_mask: expected dtype bool (True = may attend) or float64"),
    "mask_other_float": (dict(attn_mask=np.ones((3, 5), dtype=np.float16)), mha.ArgumentTypeError,
                         "attn_mask: expected dtype bool (True = may attend) or float64 or float32 (added to the "
                         "scores), got float16"),
    "mask_and_causal": (dict(attn_mask=np.ones((3, 5), dtype=bool), is_causal=True), mha.ArgumentError,
                        "attn_mask: expected None when is_causal=True"),
    "causal_not_bool": (dict(is_causal="yes"), mha.ArgumentTypeError, "is_causal: expected a bool"),
    "dropout_negative": (dict(dropout_p=-0.1, dropout_seed=1), mha.ArgumentError, "dropout_p: expected a probability"),
    "dropout_above_1": (dict(dropout_p=1.5, dropout_seed=1), mha.ArgumentError, "got 1.5"),
    "dropout_nan": (dict(dropout_p=float("nan"), dropout_seed=1), mha.ArgumentError, "dropout_p"),
    "dropout_text": (dict(dropout_p="0.1"), mha.ArgumentError, "dropout_p"),
    "dropout_without_seed": (dict(dropout_p=0.1), mha.ArgumentError, "dropout_seed: expected an integer seed"),
    "seed_negative": (dict(dropout_p=0.1, dropout_seed=-1), mha.ArgumentError, "dropout_seed: expected an integer in"),
    "seed_too_large": (dict(dropout_p=0.1, dropout_seed=2**64), mha.ArgumentError, "dropout_seed"),
    "seed_float": (dict(dropout_p=0.1, dropout_seed=1.0), mha.ArgumentError, "dropout_seed"),
    "scale_nan": (dict(scale=float("nan")), mha.ArgumentError, "scale: expected None"),
    "scale_inf": (dict(scale=float("inf")), mha.ArgumentError, "scale"),
    "scale_text": (dict(scale="1"), mha.ArgumentError, "scale"),
    "scale_past_doubles": (dict(scale=10**400), mha.ArgumentError, "scale: expected None"),
    "softcap_past_doubles": (dict(softcap=10**400), mha.ArgumentError, "softcap: expected 0 (none) or a finite cap"),
    "window_past_int64": (dict(window_size=(2**63, 0)), mha.ArgumentError, "window_size: expected (left, right)"),
    "window_right_past_int64": (dict(window_size=(0, 2**64)), mha.ArgumentError, "in [0, 2**63), got (0, "),
    "head_size_0_default_scale": (dict(query=Q[..., :0], key=K[..., :0]), mha.ArgumentError,
                                  "head size must be > 0 for the default scale"),  # mha's own check
}


@pytest.mark.parametrize("case", FORWARD_ERRORS)
def test_forward_errors(case):
    arguments, exception, message = FORWARD_ERRORS[case]
    arguments = dict(dict(query=Q, key=K, value=V), **arguments)
    with pytest.raises(exception) as info:
        mha.scaled_dot_product_attention(**arguments)
    assert message in str(info.value)
    assert isinstance(info.value, RuntimeError)  # what PyTorch raises, for drop-in code


OUT, LSE = mha.scaled_dot_product_attention(Q, K, V, return_logsumexp=True)

BACKWARD_ERRORS = {  # a wrong dtype is a type error (a TypeError), as in the forward
    "grad_output_shape": (dict(grad_output=OUT[:, :, :2]), mha.ArgumentError,
                          "grad_output: expected shape (2, 4, 3, 8) and dtype float64"),
    "grad_output_dtype": (dict(grad_output=OUT.astype(np.float32)), mha.ArgumentTypeError,
                          "got shape (2, 4, 3, 8) and dtype float32"),
    "output_without_logsumexp": (dict(logsumexp=None), mha.ArgumentError, "output, logsumexp: expected both"),
    "logsumexp_dtype": (dict(logsumexp=LSE.astype(np.float32)), mha.ArgumentTypeError,
                        "logsumexp: expected shape (2, 4, 3) and dtype float64"),
    "output_shape": (dict(output=OUT[0]), mha.ArgumentError, "output: expected shape"),
    "dropout_without_seed": (dict(dropout_p=0.5), mha.ArgumentError, "dropout_seed"),
}


@pytest.mark.parametrize("case", BACKWARD_ERRORS)
def test_backward_errors(case):
    changes, exception, message = BACKWARD_ERRORS[case]
    arguments = dict(dict(grad_output=OUT, query=Q, key=K, value=V, output=OUT, logsumexp=LSE), **changes)
    with pytest.raises(exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        mha.scaled_dot_product_attention_backward(**arguments)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_set_num_threads_errors(n):
    with pytest.raises(mha.ArgumentError, match="set_num_threads: expected an integer >= 1"):
        mha.set_num_threads(n)


def test_the_settings_are_one_class_with_every_field_of_mhas_scoring():
    # _mha.Scoring's attributes are bound from mha::attention::Scoring::visit_fields, with its defaults.
    s = _mha.Scoring()
    assert (s.causal, s.scale, s.dropout_p, s.dropout_seed) == (_mha.Causal.none, None, 0.0, 0)
    w = s.whole_call
    assert (w.query_offset, w.key_offset, w.head_offset, w.query_len, w.key_len, w.heads) == (0, 0, 0, 0, 0, 0)
    s.causal, s.scale, s.dropout_p, s.dropout_seed = _mha.Causal.bottom_right, 0.5, 0.25, 2**64 - 1
    assert (s.causal, s.scale, s.dropout_p, s.dropout_seed) == (_mha.Causal.bottom_right, 0.5, 0.25, 2**64 - 1)
