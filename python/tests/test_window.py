"""window_size (a sliding window, FlashAttention-2's) through the numpy API and mha.torch, against
PyTorch's SDPA given the same window as a dense bool mask built here from its definition:
query i sees key j when i + d - left <= j <= i + d + right (-1 = unbounded), d = 0 with is_causal
(and then j <= i) and S - L without."""
import warnings

import numpy as np
import pytest
torch = pytest.importorskip("torch")

import mha  # noqa: E402
import mha.torch  # noqa: E402


def window_mask(L, S, is_causal, left, right):
    d = 0 if is_causal else S - L
    mask = np.zeros((L, S), dtype=bool)
    for i in range(L):
        for j in range(S):
            see = (left < 0 or j >= i + d - left) and (right < 0 or j <= i + d + right)
            mask[i, j] = see and (not is_causal or j <= i)
    return torch.from_numpy(mask)


CASES = {  # (B, Hq, Hkv, L, S, D), is_causal, (left, right)
    "left_causal": ((2, 4, 2, 37, 37, 8), True, (5, 0)),
    "left_causal_l_lt_s": ((1, 2, 2, 9, 40, 8), True, (3, -1)),
    "two_sided": ((2, 2, 1, 30, 45, 16), False, (4, 7)),
    "right_only": ((1, 2, 2, 20, 20, 8), False, (-1, 2)),
    "one_key": ((1, 1, 1, 17, 17, 4), False, (0, 0)),
    "wider_than_the_sequence": ((1, 2, 2, 12, 12, 8), True, (100, 100)),
    "past_a_tile": ((1, 2, 2, 300, 300, 8), True, (70, 0)),
}


def tensors(B, Hq, Hkv, L, S, D, dtype=torch.float64):
    g = torch.Generator().manual_seed(L * 131 + S)
    return [torch.randn(shape, generator=g, dtype=dtype) for shape in ((B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D))]


@pytest.mark.parametrize("name", CASES)
def test_numpy_forward_and_backward_equal_pytorchs_with_the_dense_mask(name):
    (B, Hq, Hkv, L, S, D), is_causal, window = CASES[name]
    q, k, v = tensors(B, Hq, Hkv, L, S, D)
    mask = window_mask(L, S, is_causal, *window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=Hq != Hkv)
    dout = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want.backward(dout)
    got = mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), is_causal=is_causal,
                                           enable_gqa=Hq != Hkv, window_size=window)
    # A row no key is left for: PyTorch's SDPA gives NaN there, mha 0 (README: on purpose).
    rows = mask.any(-1)
    np.testing.assert_allclose(got[..., rows, :], want.detach().numpy()[..., rows, :], rtol=0, atol=1e-12)
    assert np.all(got[..., ~rows, :] == 0)
    grads = mha.scaled_dot_product_attention_backward(dout.numpy(), q.numpy(), k.numpy(), v.numpy(),
                                                      is_causal=is_causal, enable_gqa=Hq != Hkv, window_size=window)
    if rows.all():
        for g, leaf in zip(grads, leaves):
            np.testing.assert_allclose(g, leaf.grad.numpy(), rtol=0, atol=1e-11)


def test_torch_autograd_and_compile_take_the_window():
    (B, Hq, Hkv, L, S, D), is_causal, window = CASES["two_sided"]
    q, k, v = tensors(B, Hq, Hkv, L, S, D, torch.float32)
    mask = window_mask(L, S, is_causal, *window)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = mha.torch.scaled_dot_product_attention(*ours, enable_gqa=True, window_size=window)
    want = torch.nn.functional.scaled_dot_product_attention(*theirs, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    out.sum().backward()
    want.sum().backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5)
    compiled = torch.compile(lambda q, k, v: mha.torch.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                                                     window_size=window),
                             fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), out.detach(), rtol=0, atol=0)


def test_pytorchs_fallback_gets_the_window_as_a_mask():
    # A float mask that requires grad goes to PyTorch's SDPA (mha computes no mask gradient): the
    # window joins it as -inf where it hides a key.
    (B, Hq, Hkv, L, S, D), is_causal, window = CASES["two_sided"]
    q, k, v = tensors(B, Hq, Hkv, L, S, D)
    mask = torch.randn(L, S, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "using PyTorch's scaled_dot_product_attention", once per process
        got = mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, window_size=window)
    hidden = ~window_mask(L, S, is_causal, *window)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.masked_fill(hidden, float("-inf")),
                                                            enable_gqa=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1,), (1, 2, 3), ("a", 0), (True, 0), 3, (1.5, 0)])
def test_a_bad_window_is_refused(window):
    q = np.zeros((1, 1, 2, 4), dtype=np.float32)
    with pytest.raises(mha.ArgumentError, match="window_size: expected \\(left, right\\), each -1"):
        mha.scaled_dot_product_attention(q, q, q, window_size=window)
    with pytest.raises(mha.ArgumentError, match="window_size"):
        mha.torch.scaled_dot_product_attention(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4),
                                               torch.zeros(1, 1, 2, 4), window_size=window)
