"""mha.torch against PyTorch: forward and gradients against aten's math SDPA, gradcheck,
opcheck, torch.compile, PyTorch's own OpInfo samples, CausalBias, fallbacks, patch(), dropout
seeding, threads and zero-copy."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha.torch  # noqa: E402
from mha import _mha  # noqa: E402
from torch.nn.attention.bias import causal_lower_right, causal_upper_left  # noqa: E402

F = torch.nn.functional


def math_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's plain definition of SDPA (aten::_scaled_dot_product_attention_math). That op
    adds whatever mask it is given; F.scaled_dot_product_attention first turns a bool mask into
    0 / -inf, and so does this."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None,
                                                             scale=scale, enable_gqa=enable_gqa)[0]


def forward_and_grads(fn, inputs, grad_output, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves, **kw)
    grads = torch.autograd.grad(out, leaves, grad_output)
    return [out.detach(), *grads]


def make(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed + 31 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g, dtype=dtype)


def check_against_math(inputs, mask=None, **kw):
    """float64: mha within 1e-10 of aten's math SDPA; float32: within FlashAttention's rule
    (twice the math SDPA's own float32 error against float64, plus 1e-6 of the largest value)."""
    inputs64 = [x.double() for x in inputs]
    mask64 = mask.double() if mask is not None and mask.is_floating_point() else mask
    out_shape = math_sdpa(*inputs64, attn_mask=mask64, **kw).shape
    dout = make(*out_shape, seed=99)
    ref = forward_and_grads(math_sdpa, inputs64, dout, attn_mask=mask64, **kw)
    ours64 = forward_and_grads(mha.torch.scaled_dot_product_attention, inputs64, dout, attn_mask=mask64, **kw)
    names = ("output", "grad_query", "grad_key", "grad_value")
    for name, a, r in zip(names, ours64, ref):
        assert a.dtype == torch.float64 and a.shape == r.shape, name
        assert (a - r).abs().max() <= 1e-10 * max(1.0, r.abs().max()), f"{name} float64"
    inputs32 = [x.float() for x in inputs]
    mask32 = mask.float() if mask is not None and mask.is_floating_point() else mask
    torch32 = forward_and_grads(math_sdpa, inputs32, dout.float(), attn_mask=mask32, **kw)
    ours32 = forward_and_grads(mha.torch.scaled_dot_product_attention, inputs32, dout.float(), attn_mask=mask32, **kw)
    for name, a, t, r in zip(names, ours32, torch32, ref):
        assert a.dtype == torch.float32, name
        error, torch_error = (a.double() - r).abs().max(), (t.double() - r).abs().max()
        bound = 2 * torch_error + 1e-6 * r.abs().max()
        assert error <= bound, f"{name} float32: mha error {error} > {bound} (PyTorch float32 error {torch_error})"


CASES = {
    # name: (query, key, value shapes, mask (shape, "bool" | "float") or None, options)
    "plain": ((2, 3, 7, 16), (2, 3, 9, 16), (2, 3, 9, 16), None, {}),
    "causal_l_lt_s": ((2, 3, 5, 8), (2, 3, 9, 8), (2, 3, 9, 12), None, dict(is_causal=True)),
    "causal_l_gt_s": ((1, 2, 9, 8), (1, 2, 4, 8), (1, 2, 4, 8), None, dict(is_causal=True)),
    "bool_mask_padding": ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8), ((2, 1, 1, 7), "bool"), {}),
    "float_mask": ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8), ((4, 6, 7), "float"), dict(scale=0.7)),
    "gqa": ((2, 8, 5, 8), (2, 2, 6, 8), (2, 2, 6, 4), None, dict(enable_gqa=True, is_causal=True)),
    "rank3": ((3, 5, 8), (3, 6, 8), (3, 6, 8), ((5, 6), "bool"), {}),
    "broadcast_batch": ((4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8), None, {}),
    "negative_scale": ((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), None, dict(scale=-0.4)),
    # One query row per head against a long cache: the decode backend (chunks of 256 keys).
    "decode_one_row_gqa": ((1, 16, 1, 64), (1, 4, 1000, 64), (1, 4, 1000, 64), None, dict(enable_gqa=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_math_sdpa(case):
    qs, ks, vs, mask, kw = CASES[case]
    inputs = [make(*qs), make(*ks, seed=1), make(*vs, seed=2)]
    if mask is not None:
        shape, kind = mask
        mask = make(*shape, seed=3) > -0.7 if kind == "bool" else make(*shape, seed=3)
    check_against_math(inputs, mask, **kw)


def test_strided_inputs():
    # (B, L, H, D) tensors viewed as (B, H, L, D), and an expanded key: read in place.
    q, k, v = (make(2, 6, 3, 8, seed=i).transpose(1, 2) for i in range(3))
    check_against_math([q, k.expand(2, 3, 6, 8), v])


def test_fully_masked_rows_give_zero_and_finite_gradients():
    q, k, v = make(1, 2, 4, 8), make(1, 2, 5, 8, seed=1), make(1, 2, 5, 8, seed=2)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1] = False
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out = mha.torch.scaled_dot_product_attention(*leaves, attn_mask=mask)
    assert (out[:, :, 1] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_gradcheck():
    q, k, v = (make(1, 4, 3, 5, seed=0), make(1, 2, 4, 5, seed=1), make(1, 2, 4, 3, seed=2))
    mask = make(3, 4, seed=3)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda q, k, v: mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), leaves)
    assert torch.autograd.gradcheck(lambda q, k, v: mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                           enable_gqa=True), leaves)
    # With dropout, through the operator with a fixed seed: the backward drops the forward's entries.
    seed = torch.tensor(12345)
    assert torch.autograd.gradcheck(
        lambda q, k, v: torch.ops.mha.sdpa_forward(q, k, v, None, 0.3, "bottom_right", 0.8, True, seed)[0], leaves)


def forward_samples():
    q, k, v = make(2, 4, 3, 8), make(2, 2, 5, 8, seed=1), make(2, 2, 5, 6, seed=2)
    seed = torch.tensor(-7)  # any int64: mha uses its 64 bits
    yield q, k, v, None, 0.0, "none", None, True, None
    yield q, k, v, make(3, 5, seed=3) > 0, 0.0, "none", 0.5, True, None
    yield q, k, v, make(2, 1, 3, 5, seed=4), 0.0, "none", None, True, None
    yield q, k, v, None, 0.25, "top_left", None, True, seed
    yield q.float(), k.float(), v.float(), None, 0.0, "bottom_right", None, True, None
    yield make(3, 5, 8), make(3, 4, 8), make(3, 4, 8), None, 0.0, "none", None, False, None


@pytest.mark.parametrize("args", list(forward_samples()), ids=lambda a: "")
def test_opcheck(args):
    grad_args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                      and i < 3 else a for i, a in enumerate(args))
    torch.library.opcheck(torch.ops.mha.sdpa_forward, grad_args)
    q, k, v, mask, p, causal, scale, gqa, seed = args
    out, lse = torch.ops.mha.sdpa_forward(*args)
    torch.library.opcheck(torch.ops.mha.sdpa_backward,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, mask, p,
                           causal, scale, gqa, seed))
    # The weights of the same call (the same dropout): output = weights · value, by definition.
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)  # it has no gradient
    torch.library.opcheck(torch.ops.mha.sdpa_weights, detached)
    weights = torch.ops.mha.sdpa_weights(*detached)
    values = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3) if gqa else v
    torch.testing.assert_close(out, weights @ values)


def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()

    def attention(q, k, v, mask):
        return mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.2, enable_gqa=True) * 2

    compiled = torch.compile(attention, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break fails
    inputs = [make(2, 4, 6, 8, seed=0), make(2, 2, 7, 8, seed=1), make(2, 2, 7, 8, seed=2)]
    mask = make(6, 7, seed=3) > -0.5
    results = []
    for fn in (compiled, attention):
        torch.manual_seed(5)  # the same dropout seed drawn in both
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = fn(*leaves, mask)
        out.backward(torch.ones_like(out))
        results.append([out, *(x.grad for x in leaves)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dropout_follows_torch_manual_seed():
    q, k, v = make(2, 2, 8, 4), make(2, 2, 8, 4, seed=1), make(2, 2, 8, 4, seed=2)
    torch.manual_seed(3)
    a = mha.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = mha.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    torch.testing.assert_close(mha.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.5), a, rtol=0, atol=0)
    assert not torch.equal(a, b)
    # Without dropout no random number is drawn: the stream is left as PyTorch leaves it.
    torch.manual_seed(3)
    mha.torch.scaled_dot_product_attention(q, k, v)
    after = torch.rand(())
    torch.manual_seed(3)
    assert torch.equal(torch.rand(()), after)


def sdpa_op_samples():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:  # PyTorch's test helpers import expecttest
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"torch.testing._internal needs {e.name}"))]
    return list(_samples(op_db))


def _samples(op_db):
    (op,) = [o for o in op_db if o.name == "nn.functional.scaled_dot_product_attention"]
    for dtype in (torch.float32, torch.float64):
        for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            yield pytest.param(sample, id=f"{str(dtype)[6:]}-{i}")


@pytest.mark.parametrize("sample", sdpa_op_samples())
def test_pytorch_opinfo_sample(sample):
    # Dropout samples run with dropout_p = 0: mha's dropout mask comes from its own seed and can
    # never equal the one PyTorch draws (its dropout is checked by gradcheck above instead).
    kwargs = dict(sample.kwargs, dropout_p=0.0)
    mask = kwargs.pop("attn_mask", None)
    check_against_math([sample.input, *sample.args], mask, **kwargs)


@pytest.mark.parametrize("bias, L, S", [(causal_upper_left, 4, 6), (causal_lower_right, 4, 6),
                                        (causal_lower_right, 5, 5)])
def test_causal_bias(bias, L, S):
    q, k, v = make(2, 3, L, 8), make(2, 3, S, 8, seed=1), make(2, 3, S, 8, seed=2)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias(L, S))
    got = mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=bias(L, S))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="CausalBias should not be used with causal=True"):
        mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=bias(L, S), is_causal=True)


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(mha._policy, "_warned", set())


# Inside patch(), F.scaled_dot_product_attention is mha's, and CausalBias's __torch_function__,
# which recognises PyTorch's by identity, no longer applies: mha honours the bias itself. Forward
# and gradients against PyTorch's unpatched SDPA with the same bias (float32: within rounding;
# float16, bfloat16: against the float64 result, at most 2x the error of PyTorch's own in that
# type); L > S only upper-left (lower-right rows then see no key: NaN in PyTorch, zero in mha).
@pytest.mark.parametrize("bias, L, S", [(causal_upper_left, 3, 7), (causal_upper_left, 7, 3),
                                        (causal_lower_right, 3, 7), (causal_lower_right, 5, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_causal_bias_inside_patch(bias, L, S, dtype, fresh_warnings):
    q, k, v = (make(2, 3, n, 8, seed=i).to(dtype) for i, n in enumerate((L, S, S)))
    dout = make(2, 3, L, 8, seed=9).to(dtype)
    expected = forward_and_grads(F.scaled_dot_product_attention, (q, k, v), dout, attn_mask=bias(L, S))
    exact = forward_and_grads(F.scaled_dot_product_attention, (q.double(), k.double(), v.double()), dout.double(),
                              attn_mask=bias(L, S))
    with warnings.catch_warnings(), mha.torch.patch():
        warnings.simplefilter("error")  # mha's path, no fallback
        got = forward_and_grads(F.scaled_dot_product_attention, (q, k, v), dout, attn_mask=bias(L, S))
    for name, a, e, x in zip(("output", "grad_query", "grad_key", "grad_value"), got, expected, exact):
        assert a.dtype == dtype and a.shape == e.shape, name
        if dtype == torch.float32:  # within rounding of PyTorch's
            torch.testing.assert_close(a, e, rtol=0, atol=1e-5 * max(1.0, e.abs().max().item()), msg=name)
        else:
            mine, theirs = (a.double() - x).abs().max().item(), (e.double() - x).abs().max().item()
            assert mine <= 2 * theirs, f"{name}: mha's error {mine:.3g} > 2x PyTorch's {theirs:.3g}"


@pytest.mark.parametrize("kind", ["meta", "float_mask_requires_grad"])
def test_falls_back_to_pytorch_with_one_warning(kind, fresh_warnings):
    dtype = torch.float64
    device = "meta" if kind == "meta" else "cpu"
    q, k, v = (make(1, 2, 4, 8, seed=i).to(device=device, dtype=dtype) for i in range(3))
    mask = make(4, 4, seed=3).requires_grad_() if kind == "float_mask_requires_grad" else None
    with pytest.warns(UserWarning, match="using PyTorch's scaled_dot_product_attention instead") as record:
        out = mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.dtype == dtype and out.device.type == device
    if device == "cpu":
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    if mask is not None:
        out.sum().backward()
        assert mask.grad is not None


def test_nested_tensors_fall_back(fresh_warnings):
    q = torch.nested.nested_tensor([make(2, 3, 8), make(2, 5, 8, seed=1)], layout=torch.jagged)
    with pytest.warns(UserWarning, match="nested tensors"):
        try:
            mha.torch.scaled_dot_product_attention(q, q, q)
        except RuntimeError:
            pass  # whatever PyTorch's own SDPA says about these inputs on the CPU


def test_patch_routes_and_restores_even_on_an_exception(monkeypatch):
    original = F.scaled_dot_product_attention
    calls = []
    real = torch.ops.mha.sdpa_forward
    monkeypatch.setattr(torch.ops.mha, "sdpa_forward", lambda *a: calls.append(1) or real(*a))
    # Training mode (dropout 0) keeps the module off its fused inference fast path, so its
    # need_weights=False path calls F's SDPA: mha's inside the block.
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True, dtype=torch.float64).train()
    x = make(2, 5, 16)
    expected = m(x, x, x, need_weights=False)[0]
    with pytest.raises(KeyError):
        with mha.torch.patch():
            assert F.scaled_dot_product_attention is mha.torch.scaled_dot_product_attention
            got = m(x, x, x, need_weights=False)[0]
            raise KeyError("inside the block")
    assert calls, "nn.MultiheadAttention did not reach mha"
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert F.scaled_dot_product_attention is original
    with mha.torch.patch():
        with mha.torch.patch():
            pass
        assert F.scaled_dot_product_attention is mha.torch.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is original


def test_tensors_are_read_and_written_in_place(binding_spy):
    q = make(2, 5, 3, 8).transpose(1, 2).requires_grad_()  # (B, L, H, D) memory
    k, v = make(2, 3, 6, 8, seed=1).requires_grad_(), make(2, 3, 6, 8, seed=2).requires_grad_()
    out = mha.torch.scaled_dot_product_attention(q, k, v)
    passed = binding_spy[-1][1]
    for name, t in (("query", q), ("key", k), ("value", v)):
        assert passed[name].__array_interface__["data"][0] == t.data_ptr(), name
    assert passed["output"].__array_interface__["data"][0] == out.data_ptr()
    out.backward(torch.ones_like(out))
    passed = binding_spy[-1][1]
    assert passed["output"].__array_interface__["data"][0] == out.data_ptr()
    assert passed["grad_key"].__array_interface__["data"][0] == k.grad.data_ptr()


def test_threads_follow_torch_and_results_do_not_depend_on_them(binding_spy):
    q, k, v = (make(2, 4, 64, 32, dtype=torch.float32, seed=i).requires_grad_() for i in range(3))
    saved = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = mha.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert binding_spy[-1][1]["num_threads"] == n
            results.append([out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))])
    finally:
        torch.set_num_threads(saved)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_errors_are_runtime_errors_like_pytorch():
    q, k, v = make(2, 4, 3, 8), make(2, 4, 5, 8, seed=1), make(2, 4, 5, 8, seed=2)
    for bad, message in ((dict(key=k.float()), "key, value: expected the dtype of query"),
                         (dict(key=k[:, :2], value=v[:, :2]), "heads (dimension -3"),
                         (dict(query=q[0, 0, 0]), "query: expected at least 2 dimensions"),
                         (dict(attn_mask=torch.ones(4, 5, dtype=torch.bool)), "attn_mask: expected a shape"),
                         (dict(attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True), "attn_mask: expected None"),
                         (dict(dropout_p=1.5), "dropout_p: expected a probability in [0, 1]")):
        arguments = dict(dict(query=q, key=k, value=v), **bad)
        with pytest.raises(RuntimeError) as info:
            mha.torch.scaled_dot_product_attention(**arguments)
        assert message in str(info.value)
        with pytest.raises(RuntimeError):  # PyTorch refuses the same inputs
            F.scaled_dot_product_attention(**arguments)


@pytest.mark.parametrize("query_shape, key_shape", [((2, 3, 0, 4), (2, 3, 5, 4)), ((2, 3, 4, 4), (2, 3, 0, 4)),
                                                    ((0, 3, 4, 4), (0, 3, 5, 4))])
def test_empty_sequences_and_batches(query_shape, key_shape):
    q, k, v = (make(*s, seed=i).requires_grad_() for i, s in enumerate((query_shape, key_shape, key_shape)))
    out = mha.torch.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))  # no key: zeros, as PyTorch
    out.sum().backward()
    assert q.grad.shape == q.shape and (k.grad == 0).all() and (v.grad == 0).all()


def _outcome(fn):
    """fn()'s value, or the type of what it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (PyTorch's own outcome, whatever it is)
        return type(e)


@pytest.mark.parametrize("transform", ["vmap", "grad", "jacrev", "jvp", "forward_ad"])
def test_torch_func_transforms_and_forward_ad_go_to_pytorch(transform, fresh_warnings):
    # mha's operators read memory and have no jvp: under torch.func (wrapped tensors) or with a
    # dual tensor the call is PyTorch's own SDPA, whatever PyTorch does with it (a tangent never
    # dropped silently); torch.compile traces the transforms itself.
    q, k, v, t = (make(3, 2, 4, 8, seed=i) for i in range(4))
    loss = lambda sdpa: lambda x: sdpa(x, k, v, is_causal=True).sum()
    def run(sdpa):
        if transform == "vmap":
            return torch.func.vmap(lambda x: sdpa(x, k[0], v[0]))(q)
        if transform == "grad":
            return torch.func.grad(loss(sdpa))(q)
        if transform == "jacrev":
            return torch.func.jacrev(lambda x: sdpa(x, k, v))(q)
        if transform == "jvp":
            return torch.func.jvp(loss(sdpa), (q,), (t,))[1]
        with torch.autograd.forward_ad.dual_level():
            out = sdpa(torch.autograd.forward_ad.make_dual(q, t), k, v)
            return torch.autograd.forward_ad.unpack_dual(out).tangent
    want = _outcome(lambda: run(F.scaled_dot_product_attention))
    with pytest.warns(UserWarning, match="a torch.func transform or forward-mode AD"):
        got = _outcome(lambda: run(mha.torch.scaled_dot_product_attention))
    if isinstance(want, type):
        assert got is want
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(mha.ArgumentError, match="q, k, v: expected floating-point CPU tensors mha can read, got a "
                                                "torch.func transform or forward-mode AD"):
        run(lambda *qkv, **kw: mha.torch.flash_attn_func(*(t if t.dim() == 4 else t.unsqueeze(0) for t in qkv)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_in_its_dtype_as_pytorchs_sdpa_does(dtype):
    # torch.autocast("cpu") gives PyTorch's SDPA its floating tensors (float64 aside) in the
    # autocast dtype, a float32 query against a bfloat16 key included; mha's the same.
    q = make(1, 2, 4, 8, dtype=torch.float32, seed=1).requires_grad_()
    k, v = make(1, 2, 6, 8, dtype=dtype, seed=2), make(1, 2, 6, 8, dtype=torch.float32, seed=3)
    mask = make(4, 6, dtype=torch.float32, seed=4)
    with torch.autocast("cpu", dtype=dtype):
        assert F.scaled_dot_product_attention(q, k, v, attn_mask=mask).dtype == dtype
        out = mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        wide = make(1, 2, 4, 8, seed=5)
        assert mha.torch.scaled_dot_product_attention(wide, wide, wide).dtype == torch.float64
    assert out.dtype == dtype
    q16 = q.detach().to(dtype).requires_grad_()
    want = mha.torch.scaled_dot_product_attention(q16, k, v.to(dtype), attn_mask=mask.to(dtype))
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    out.float().sum().backward()
    want.float().sum().backward()
    assert q.grad.dtype == torch.float32
    torch.testing.assert_close(q.grad, q16.grad.float(), rtol=0, atol=0)


def test_the_python_bench_calls_what_the_binding_takes(monkeypatch):
    # `make bench`'s bench_python.py times the binding's own call beside the package's: on a tiny
    # shape, every figure it reports is there (it had kept the binding's old arguments).
    import os
    import sys
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench"))
    import bench_python
    sys.modules.pop("bench_python", None)
    figures = bench_python.bench_shape(1, 2, 16, 8, 1)
    for name in ("mha_forward_ms", "torch_forward_ms", "numpy_forward_ms", "binding_forward_ms"):
        assert figures[name] > 0, name
