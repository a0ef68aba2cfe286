"""mha.torch.MultiheadAttention against torch.nn.MultiheadAttention with the same weights: output,
attention weights and the gradients of the inputs and every parameter (float64 and float32),
gradcheck, opcheck, torch.compile, PyTorch's own ModuleInfo samples, dropout seeding, fallbacks,
patch() routing, zero-copy parameters and errors."""
import warnings

import pytest

torch = pytest.importorskip("torch")
import mha.torch  # noqa: E402
from mha import _fields, _mha  # noqa: E402

nn = torch.nn


def make(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed + 31 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g, dtype=dtype)


def modules(ctor, dtype, seed=0):
    """(PyTorch's module, mha's) with the same weights; every parameter randomised (biases
    included, which PyTorch initialises to zero) so that no gradient term can hide."""
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(**ctor, dtype=dtype)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = mha.torch.MultiheadAttention(**ctor, dtype=dtype)
    ours.load_state_dict(reference.state_dict())
    return reference, ours


def run(module, inputs, grad_output, kwargs):
    """(output, attn_weights or None, {name: gradient}) of `module` on copies of the inputs."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, weights = module(*leaves, **kwargs)
    names = ["query", "key", "value"] + [n for n, _ in module.named_parameters()]
    params = [p for _, p in module.named_parameters()]
    grads = torch.autograd.grad(out, leaves + params, grad_output)
    return out.detach(), None if weights is None else weights.detach(), dict(zip(names, grads))


def reference_results(module, inputs, grad_output, kwargs):
    """PyTorch's results, where every query has a key to attend. A query whose keys are all
    masked gets NaN on PyTorch's need_weights=True path (pytorch/pytorch#41508) and zero attention
    in mha (docs/python.md): there the output and gradients come from PyTorch's
    need_weights=False path (SDPA, which also gives zero attention), and such weight rows must be
    0 in mha."""
    out, weights, grads = run(module, inputs, grad_output, kwargs)
    if torch.isnan(out).any():
        out, _, grads = run(module, inputs, grad_output, dict(kwargs, need_weights=False))
    return out, weights, grads


def max_error(a, reference):
    return (a.double() - reference.double()).abs().max().item() if a.numel() else 0.0


def check_weights(ours, expected):
    """Weights given exactly when PyTorch gives them, and 0 where PyTorch's are NaN."""
    assert (ours is None) == (expected is None), "attn_weights"
    if ours is not None:
        assert ours.shape == expected.shape, "attn_weights"
        assert (ours[torch.isnan(expected)] == 0).all(), "attn_weights: a fully masked query must have zero weights"


def with_dtype(kwargs, dtype):
    """The forward arguments with float masks in `dtype` (PyTorch adds them to its scores)."""
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}


def named_results(results):
    """[(name, tensor)] of run()'s results; attention weights of fully masked queries (NaN in
    PyTorch) as 0, after check_weights."""
    out, weights, grads = results
    named = [("output", out)]
    if weights is not None:
        named.append(("attn_weights", weights.masked_fill(torch.isnan(weights), 0)))
    return named + [(f"grad {n}", g) for n, g in grads.items()]


def assert_matches_float64(got, reference64):
    """mha within 1e-10·max(1, max|ref|) of PyTorch in float64 (the C++ goldens' bound)."""
    check_weights(got[1], reference64[1])
    for (name, a), (_, r) in zip(named_results(got), named_results(reference64), strict=True):
        assert a.dtype == torch.float64 and a.shape == r.shape, name
        scale = r.abs().max().item() if r.numel() else 0.0
        assert max_error(a, r) <= 1e-10 * max(1.0, scale), f"{name} float64: error {max_error(a, r)}"


def float32_errors(got, reference64, torch32):
    """[(name, mha's error, PyTorch's float32 error, max|ref|)], errors against the float64 reference."""
    check_weights(got[1], reference64[1])
    errors = []
    for (name, a), (_, r), (_, t) in zip(named_results(got), named_results(reference64), named_results(torch32),
                                         strict=True):
        assert a.dtype == torch.float32 and a.shape == r.shape, name
        errors.append((name, max_error(a, r), max_error(t, r), r.abs().max().item() if r.numel() else 0.0))
    return errors


def assert_flash_rule(errors):
    """FlashAttention's rule, as the SDPA tests and tests/goldens/README.md: mha's float32 error
    against PyTorch's float64 result at most twice PyTorch's own float32 error, plus 1e-6 of the
    largest value (for results PyTorch happens to get exactly)."""
    for name, error, torch_error, scale in errors:
        bound = 2 * torch_error + 1e-6 * scale
        assert error <= bound, f"{name} float32: mha error {error} > {bound} (PyTorch float32 error {torch_error})"


def check_against_torch(ctor, inputs, kwargs, seed=0, grad_output=None, dtypes=(torch.float64, torch.float32)):
    """mha against PyTorch in `dtypes`, modules from `ctor` with random weights: output, weights
    and every gradient. float64 is asserted here; float32's errors are returned (float32_errors)
    for assert_flash_rule."""
    reference64, ours64 = modules(ctor, torch.float64, seed)
    inputs64 = [x.double() for x in inputs]
    kwargs64, kwargs32 = with_dtype(kwargs, torch.float64), with_dtype(kwargs, torch.float32)
    if grad_output is None:
        out_shape = reference64(*inputs64, **dict(kwargs64, need_weights=False))[0].shape
        grad_output = make(*out_shape, seed=99)
    reference = reference_results(reference64, inputs64, grad_output, kwargs64)
    if torch.float64 in dtypes:
        assert_matches_float64(run(ours64, inputs64, grad_output, kwargs64), reference)
    if torch.float32 not in dtypes:
        return []

    reference32, ours32 = modules(ctor, torch.float32, seed)
    reference32.load_state_dict(reference64.state_dict())
    ours32.load_state_dict(reference64.state_dict())
    inputs32 = [x.float() for x in inputs]
    torch32 = reference_results(reference32, inputs32, grad_output.float(), kwargs32)
    return float32_errors(run(ours32, inputs32, grad_output.float(), kwargs32), reference, torch32)


def layout(ctor, batch, length, width):
    if batch == 0:
        return (length, width)
    return (batch, length, width) if ctor.get("batch_first") else (length, batch, width)


def case_inputs(ctor, batch=2, length=5, source=7):
    e = ctor["embed_dim"]
    return [make(*layout(ctor, batch, length, e)), make(*layout(ctor, batch, source, ctor.get("kdim") or e), seed=1),
            make(*layout(ctor, batch, source, ctor.get("vdim") or e), seed=2)]


def padding(batch, source, seed=3):
    mask = make(*((batch, source) if batch else (source,)), seed=seed) > 0.8
    mask[..., 0] = False  # every query keeps a key
    return mask


CASES = {
    # name: (constructor arguments, batch (0: unbatched), forward arguments made from (batch, L, S, H))
    "packed": (dict(embed_dim=16, num_heads=4), 2, lambda n, L, S, H: {}),
    "kdim_vdim": (dict(embed_dim=16, num_heads=2, kdim=6, vdim=10), 2, lambda n, L, S, H: {}),
    "no_bias_batch_first": (dict(embed_dim=12, num_heads=3, bias=False, batch_first=True), 3,
                            lambda n, L, S, H: dict(average_attn_weights=False)),
    "bias_kv_zero_attn_masks": (dict(embed_dim=8, num_heads=2, add_bias_kv=True, add_zero_attn=True), 2,
                                lambda n, L, S, H: dict(key_padding_mask=padding(n, S),
                                                        attn_mask=make(n * H, L, S, seed=4))),
    "separate_bias_kv_float_padding": (dict(embed_dim=8, num_heads=4, kdim=5, add_bias_kv=True, batch_first=True), 2,
                                       lambda n, L, S, H: dict(key_padding_mask=make(n, S, seed=5),
                                                               need_weights=False)),
    "unbatched_masks": (dict(embed_dim=8, num_heads=2), 0,
                        lambda n, L, S, H: dict(key_padding_mask=padding(0, S), attn_mask=make(H, L, S, seed=6) > 1)),
    "fully_masked_rows": (dict(embed_dim=8, num_heads=2), 2,
                          lambda n, L, S, H: dict(attn_mask=torch.arange(L)[:, None] < torch.zeros(S)[None, :] + 2,
                                                  average_attn_weights=False)),
    "is_causal_sdpa_path": (dict(embed_dim=8, num_heads=2, batch_first=True), 2,
                            lambda n, L, S, H: dict(attn_mask=torch.ones(L, S, dtype=torch.bool).triu(1),
                                                    is_causal=True, need_weights=False)),
    "is_causal_weights_path": (dict(embed_dim=8, num_heads=2), 2,
                               lambda n, L, S, H: dict(attn_mask=torch.ones(L, S, dtype=torch.bool).triu(1),
                                                       is_causal=True)),
}


# PyTorch's module (the reference) warns about a bool key_padding_mask beside a float attn_mask,
# which mha takes as it is.
@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask is deprecated")
@pytest.mark.parametrize("case", CASES)
def test_matches_torch_forward_and_every_gradient(case):
    ctor, batch, kwargs = CASES[case]
    length, source = 5, 7
    if "causal" in case:
        source = length
    inputs = case_inputs(ctor, batch, length, source)
    assert_flash_rule(check_against_torch(ctor, inputs, kwargs(batch or 1, length, source, ctor["num_heads"])))


def test_self_attention_with_one_tensor():
    ctor = dict(embed_dim=16, num_heads=4, batch_first=True)
    x = make(2, 6, 16)
    assert_flash_rule(check_against_torch(ctor, [x, x, x], {}))


def test_gradcheck():
    """float64 finite differences through the operator, for the inputs and every parameter,
    with masks, add_bias_kv, add_zero_attn and dropout (a fixed seed: backward drops what forward
    dropped)."""
    e, heads = 4, 2
    query, key, value = make(3, 2, e), make(4, 2, 3, seed=1), make(4, 2, 5, seed=2)
    params = [None, make(e, e, seed=3), make(e, 3, seed=4), make(e, 5, seed=5), make(3 * e, seed=6),
              make(1, 1, e, seed=7), make(1, 1, e, seed=8), make(e, e, seed=9), make(e, seed=10)]
    leaves = [x.requires_grad_() for x in (query, key, value, *[p for p in params if p is not None])]
    padding_mask = torch.tensor([[False, False, True, False], [False, True, False, False]])

    def forward(dropout_p, seed, need_weights):
        def f(q, k, v, *given):
            it = iter(given)
            ps = [None if p is None else next(it) for p in params]
            return torch.ops.mha.multihead_attention_forward(q, k, v, *ps, padding_mask, make(3, 4, seed=11), e, 3, 5,
                                                             heads, True, False, need_weights, True, False, dropout_p,
                                                             seed)[0]
        return f

    assert torch.autograd.gradcheck(forward(0.0, None, True), leaves)
    assert torch.autograd.gradcheck(forward(0.4, torch.tensor(2024), False), leaves)


def forward_op_samples():
    e = 4
    q, k, v = make(3, 2, e), make(5, 2, e, seed=1), make(5, 2, e, seed=2)
    packed = [make(3 * e, e, seed=3), None, None, None, make(3 * e, seed=4), None, None, make(e, e, seed=5),
              make(e, seed=6)]
    bias_kv = [make(1, 1, e, seed=7), make(1, 1, e, seed=8)]
    flags = dict(embed_dim=e, kdim=e, vdim=e, num_heads=2, add_zero_attn=False, batch_first=False, need_weights=True,
                 average_attn_weights=True, is_causal=False, dropout_p=0.0, dropout_seed=None)

    def sample(query, key, value, params, kpm=None, mask=None, **kw):
        return (query, key, value, *params, kpm, mask, *dict(flags, **kw).values())

    yield sample(q, k, v, packed)
    yield sample(q, k, v, packed[:5] + bias_kv + packed[7:], kpm=make(2, 5, seed=9) > 1, mask=make(3, 5, seed=10),
                 add_zero_attn=True, average_attn_weights=False)
    yield sample(q[:, 0], k[:, 0], v[:, 0], packed, need_weights=False, dropout_p=0.3, dropout_seed=torch.tensor(-3))
    yield sample(q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
                 [None if p is None else p.float() for p in packed], batch_first=True,
                 mask=torch.ones(3, 5, dtype=torch.bool).triu(1), is_causal=True, need_weights=False)
    # mha's variants after the module's own arguments (mha._fields.MODULE_NAMES): settings, views.
    variants = dict(window_left=2, window_right=1, softcap=0.7, chunk_size=3, scale=0.4, sinks=make(2, seed=12),
                    alibi_slopes=make(2, 2, seed=13).abs())
    yield sample(q, k, v, packed) + tuple(variants[name] for name in _fields.MODULE_NAMES)


_SINKS = 25 + _fields.MODULE_NAMES.index("sinks")  # its position among the operator's arguments


@pytest.mark.parametrize("args", list(forward_op_samples()), ids=lambda a: "")
def test_opcheck(args):
    grad_args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                      and (i < 12 or i == _SINKS) else a for i, a in enumerate(args))
    torch.library.opcheck(torch.ops.mha.multihead_attention_forward, grad_args)
    results = torch.ops.mha.multihead_attention_forward(*args)
    flags = list(args[14:25])
    del flags[7]  # average_attn_weights: the backward does not take it
    backward_args = (torch.randn_like(results[0]), *args[:14], *flags, *results[2:], *args[25:])
    torch.library.opcheck(torch.ops.mha.multihead_attention_backward, backward_args)


def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    _, module = modules(dict(embed_dim=16, num_heads=4, batch_first=True, dropout=0.2), torch.float64)
    module.train()
    x, mask = make(2, 6, 16), make(2, 6, seed=1) > 1

    def step(m, x):
        out, weights = m(x, x, x, key_padding_mask=mask)
        return out * 2, weights

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break fails
    results = []
    for fn in (compiled, step):
        torch.manual_seed(5)  # the same dropout seed drawn in both
        module.zero_grad()
        leaf = x.clone().requires_grad_()
        out, weights = fn(module, leaf)
        out.backward(torch.ones_like(out))
        results.append([out, weights, leaf.grad, *(p.grad for p in module.parameters())])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dropout_follows_torch_manual_seed_and_only_in_training():
    _, module = modules(dict(embed_dim=8, num_heads=2, dropout=0.5), torch.float64)
    x = make(6, 2, 8)
    module.train()
    torch.manual_seed(3)
    a, b = module(x, x, x)[0], module(x, x, x)[0]
    torch.manual_seed(3)
    torch.testing.assert_close(module(x, x, x)[0], a, rtol=0, atol=0)
    assert not torch.equal(a, b)
    module.eval()
    reference = nn.MultiheadAttention(8, 2, dropout=0.5, dtype=torch.float64).eval()
    reference.load_state_dict(module.state_dict())
    torch.testing.assert_close(module(x, x, x)[0], reference(x, x, x)[0], rtol=0, atol=1e-12)
    # Without dropout no random number is drawn: the stream is left as PyTorch leaves it.
    torch.manual_seed(3)
    module(x, x, x)
    after = torch.rand(())
    torch.manual_seed(3)
    assert torch.equal(torch.rand(()), after)


def module_samples(dtypes=(torch.float32, torch.float64)):
    """(sample, training) for each of PyTorch's ModuleInfo samples of nn.MultiheadAttention."""
    try:
        from torch.testing._internal.common_modules import module_db
    except ImportError as e:  # PyTorch's test helpers import expecttest
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"torch.testing._internal needs {e.name}"))]
    (info,) = [m for m in module_db if m.module_cls is nn.MultiheadAttention]
    params = []
    for dtype in dtypes:
        for training in (False, True):
            samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False, training=training)
            params += [pytest.param(s, training, id=f"{str(dtype)[6:]}-{'train' if training else 'eval'}-{i}")
                       for i, s in enumerate(samples)]
    return params


def moduleinfo_float32_errors(sample, training):
    """Runs one sample through both modules (built from its constructor arguments, mha's with
    PyTorch's weights) and compares as above: float64 asserted, float32 errors returned."""
    ctor, inputs = sample.constructor_input, sample.forward_input
    if training and ctor.kwargs.get("dropout", 0.0) > 0:
        pytest.skip("dropout in training: mha's dropped entries come from its own counter-based generator")
    assert not ctor.args, "the samples pass constructor arguments by name"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback to PyTorch
        return check_against_torch(dict(ctor.kwargs), [x.double() for x in inputs.args], inputs.kwargs,
                                   grad_output=torch.ones_like(inputs.args[0], dtype=torch.float64),
                                   dtypes=(inputs.args[0].dtype,))


@pytest.mark.parametrize("sample, training", module_samples())
def test_pytorch_moduleinfo_sample(sample, training):
    """Every sample PyTorch tests nn.MultiheadAttention with, in both modes: float64 output,
    weights and every gradient; float32 output and weights by FlashAttention's rule. (float32
    gradients: the next test.)"""
    assert_flash_rule([e for e in moduleinfo_float32_errors(sample, training) if not e[0].startswith("grad")])


def test_pytorch_moduleinfo_float32_gradients_as_one_batch():
    """The float32 gradients of all the samples, held to FlashAttention's rule as one tensor per
    gradient (the largest error over the samples against PyTorch's largest). The samples are
    3x3 with head_dim 1: a gradient of 3 to 9 values whose maximum error is one or two roundings,
    where "twice PyTorch's error" is a coin toss per sample (mha's summed error over them is
    below PyTorch's), and the rule is meant for tensors of many values."""
    params = module_samples((torch.float32,))
    for param in params:
        for mark in param.marks:
            pytest.skip(mark.kwargs["reason"])
    worst = {}
    for param in params:
        for name, error, torch_error, scale in moduleinfo_float32_errors(*param.values):
            if name.startswith("grad"):
                e, t, s = worst.get(name, (0.0, 0.0, 0.0))
                worst[name] = (max(e, error), max(t, torch_error), max(s, scale))
    assert worst, "no float32 sample ran"
    assert_flash_rule([(name, *values) for name, values in worst.items()])


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(mha._policy, "_warned", set())


@pytest.mark.parametrize("kind", ["meta", "float_mask_requires_grad"])
def test_falls_back_to_pytorch_with_one_warning(kind, fresh_warnings):
    dtype = torch.float64
    device = "meta" if kind == "meta" else "cpu"
    reference, ours = modules(dict(embed_dim=8, num_heads=2), dtype)
    reference, ours = reference.to(device), ours.to(device)
    x = make(4, 2, 8).to(device=device, dtype=dtype)
    mask = make(4, 4, seed=3).requires_grad_() if kind == "float_mask_requires_grad" else None
    with pytest.warns(UserWarning, match="using PyTorch's MultiheadAttention instead") as record:
        out, _ = ours(x, x, x, attn_mask=mask)
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        ours(x, x, x, attn_mask=mask)
    assert out.dtype == dtype and out.device.type == device
    if device == "cpu":
        torch.testing.assert_close(out, reference(x, x, x, attn_mask=mask)[0], rtol=0, atol=0)
    if mask is not None:
        out.sum().backward()
        assert mask.grad is not None


def test_forward_ad_and_vmap_go_to_pytorchs_forward(fresh_warnings):
    # The module's operator reads memory and has no jvp: a dual input's tangent, or a vmap's
    # wrapped tensors, go to PyTorch's forward (the tangent PyTorch's gives, not dropped).
    reference, ours = modules(dict(embed_dim=8, num_heads=2), torch.float64)
    x, t = make(4, 2, 8), make(4, 2, 8, seed=1)
    def tangent(module):
        with torch.autograd.forward_ad.dual_level():
            dual = torch.autograd.forward_ad.make_dual(x, t)
            # (need_weights=True: PyTorch's math path, which has forward AD; its fused SDPA has none)
            return torch.autograd.forward_ad.unpack_dual(module(dual, dual, dual)[0]).tangent
    with pytest.warns(UserWarning, match="a torch.func transform or forward-mode AD"):
        got = tangent(ours)
    assert got is not None
    torch.testing.assert_close(got, tangent(reference), rtol=0, atol=0)
    batched = lambda module: torch.func.vmap(lambda y: module(y, y, y, need_weights=False)[0], in_dims=1)(x)
    torch.testing.assert_close(batched(ours), batched(reference), rtol=0, atol=0)


def test_patch_routes_construction_and_restores_even_on_an_exception():
    original = nn.MultiheadAttention
    before = nn.MultiheadAttention(8, 2)
    with pytest.raises(KeyError):
        with mha.torch.patch():
            assert nn.MultiheadAttention is mha.torch.MultiheadAttention
            inside = nn.MultiheadAttention(8, 2, batch_first=True)
            raise KeyError("inside the block")
    assert type(inside) is mha.torch.MultiheadAttention and isinstance(inside, original)
    assert type(before) is original
    assert nn.MultiheadAttention is original
    assert torch.nn.modules.activation.MultiheadAttention is original
    x = make(2, 3, 8, dtype=torch.float32)
    reference = original(8, 2, batch_first=True)
    reference.load_state_dict(inside.state_dict())
    torch.testing.assert_close(inside(x, x, x)[0], reference(x, x, x)[0])


def test_parameters_and_batch_first_inputs_are_read_in_place(monkeypatch):
    calls = []
    real = _mha.multihead_attention_forward
    monkeypatch.setattr(_mha, "multihead_attention_forward", lambda *a: calls.append(a) or real(*a))
    _, module = modules(dict(embed_dim=8, num_heads=2, batch_first=True), torch.float32)
    x = make(2, 3, 8, dtype=torch.float32)
    module(x, x, x)
    (args,) = calls
    pointer = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    assert pointer(args[0]) == x.data_ptr()
    assert pointer(args[3]) == module.in_proj_weight.data_ptr()
    assert pointer(args[10]) == module.out_proj.weight.data_ptr()


def test_results_do_not_depend_on_the_thread_count():
    _, module = modules(dict(embed_dim=32, num_heads=4, batch_first=True), torch.float32)
    x = make(2, 64, 32, dtype=torch.float32)
    saved = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(run(module, [x, x, x], torch.ones(2, 64, 32), {}))
    finally:
        torch.set_num_threads(saved)
    (out1, w1, g1), (out2, w2, g2) = results
    assert torch.equal(out1, out2) and torch.equal(w1, w2)
    assert all(torch.equal(g1[n], g2[n]) for n in g1)


def test_bad_inputs_raise_python_exceptions():
    _, module = modules(dict(embed_dim=8, num_heads=2, kdim=6), torch.float64)
    q, k = make(3, 2, 8), make(4, 2, 6, seed=1)
    for bad, error, message in (
            (dict(query=make(3, 8, 2, 1)), RuntimeError, "query: expected a 3-D tensor (L, N, E)"),
            (dict(key=make(4, 2, 8)), RuntimeError, "key: expected last dimension kdim = 6"),
            (dict(value=make(5, 2, 8)), RuntimeError, "value: expected the same sequence length as key (4)"),
            (dict(attn_mask=torch.ones(3, 3, dtype=torch.bool)), RuntimeError, "attn_mask (2-D): expected shape [3, 4]"),
            (dict(key_padding_mask=torch.ones(4, 2, dtype=torch.bool)), RuntimeError,
             "key_padding_mask (N, S): expected shape [2, 4], got [4, 2]"),
            (dict(attn_mask=torch.ones(3, 4, dtype=torch.int32)), TypeError, "attn_mask: expected dtype bool"),
            (dict(is_causal=True), RuntimeError, "is_causal: PyTorch requires attn_mask"),
            (dict(key=k.float()), TypeError, "key, value: expected the dtype of query (torch.float64)"),
            (dict(query=q.float(), key=k.float(), value=make(4, 2, 8, seed=2).float()), TypeError,
             "query: expected the dtype of the module's parameters (torch.float64), got torch.float32")):
        arguments = dict(dict(query=q, key=k, value=make(4, 2, 8, seed=2)), **bad)
        with pytest.raises(error) as info:
            module(**arguments)
        assert message in str(info.value)


def test_parameters_of_mixed_dtypes_are_each_named_with_their_own():
    # One submodule converted: the message used to call every parameter float32, the dtype of
    # the first one that differs from the query's.
    _, module = modules(dict(embed_dim=8, num_heads=2), torch.float64)
    module.out_proj.float()
    q = make(3, 2, 8)
    with pytest.raises(TypeError) as info:
        module(q, q, q)
    assert str(info.value) == (
        "the module's parameters: expected one dtype, that of query (torch.float64), got in_proj_weight "
        "torch.float64, in_proj_bias torch.float64, out_proj.weight torch.float32, out_proj.bias torch.float32 "
        "(convert the module with .to(dtype))")
    assert isinstance(info.value, RuntimeError)  # as PyTorch's own error for it


@pytest.mark.parametrize("query_shape, key_shape", [((2, 0, 8), (2, 3, 8)), ((2, 3, 8), (2, 0, 8)),
                                                    ((0, 3, 8), (0, 4, 8))])
def test_empty_sequences_and_batches(query_shape, key_shape):
    # numpy >= 2 strides empty arrays 0; mha reads no memory there and takes them.
    reference, ours = modules(dict(embed_dim=8, num_heads=2, batch_first=True), torch.float64)
    q, k = make(*query_shape), make(*key_shape, seed=1)
    expected = run(reference, [q, k, k], torch.ones(query_shape, dtype=torch.float64), {})
    got = run(ours, [q, k, k], torch.ones(query_shape, dtype=torch.float64), {})
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
    for name in expected[2]:
        torch.testing.assert_close(got[2][name], expected[2][name], rtol=0, atol=1e-12, msg=name)


def test_autocast_runs_the_module_in_its_dtype_as_pytorchs_does():
    # PyTorch's nn.MultiheadAttention under torch.autocast("cpu") computes in the autocast dtype
    # (its linear layers and attention take the cast weights and inputs); mha's runs its bfloat16
    # module on the same cast values, and the float32 parameters get float32 gradients.
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    torch_module = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    module = mha.torch.MultiheadAttention(16, 2, batch_first=True)
    module.load_state_dict(torch_module.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_weights = torch_module(x, x, x)
        out, weights = module(x, x, x)
    assert (out.dtype, weights.dtype) == (want.dtype, want_weights.dtype) == (torch.bfloat16, torch.bfloat16)
    cast = mha.torch.MultiheadAttention(16, 2, batch_first=True).to(torch.bfloat16)
    cast.load_state_dict(torch_module.state_dict())
    torch.testing.assert_close(out, cast(x.bfloat16(), x.bfloat16(), x.bfloat16())[0], rtol=0, atol=0)
    out.float().sum().backward()
    assert module.in_proj_weight.grad.dtype == torch.float32
    assert module.in_proj_weight.grad.abs().sum() > 0


def test_the_modules_variants_against_their_definition():
    """The module's settings (a window, a soft-cap, chunks and a scale, held from construction) and
    a call's views (sinks and ALiBi slopes), forward and backward (the inputs, every parameter, the
    sinks) in float64, against the module written out here with torch's operations from the
    definitions (docs/variants.md: the soft-cap before ALiBi's −slope·|i + S − L − j|; query i sees
    key j when i + d − 3 <= j <= i + d + 1 and ⌊j / 4⌋ = ⌊(i + d) / 4⌋, d = S − L; each head's sink
    logit joins every row's softmax): within 1e-12."""
    E, H, N, L, S = 8, 2, 2, 7, 11
    torch.manual_seed(5)
    module = mha.torch.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64, window_size=(3, 1),
                                          softcap=0.8, chunk_size=4, scale=0.3)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    assert "window_left=3, window_right=1, softcap=0.8, chunk_size=4, scale=0.3" in repr(module)
    query, kv, grad = make(N, L, E, seed=1), make(N, S, E, seed=2), make(N, L, E, seed=3)
    sinks, slopes = make(H, seed=4), make(N, H, seed=5).abs()

    def definition(q, kv, sinks, *parameters):
        w, b, out_w, out_b = parameters
        heads = [(x @ w[n * E:(n + 1) * E].T + b[n * E:(n + 1) * E]).view(N, -1, H, E // H).transpose(1, 2)
                 for n, x in enumerate((q, kv, kv))]
        scores = 0.8 * torch.tanh(0.3 * heads[0] @ heads[1].transpose(-1, -2) / 0.8)
        i, j = torch.arange(L)[:, None] + S - L, torch.arange(S)
        scores = scores - slopes[:, :, None, None] * (i - j).abs()
        scores = scores.masked_fill(~((j >= i - 3) & (j <= i + 1) & (j // 4 == i // 4)), float("-inf"))
        logits = torch.cat([scores, sinks[None, :, None, None].expand(N, H, L, 1)], dim=-1)
        p = torch.softmax(logits, dim=-1)[..., :S]
        return (p @ heads[2]).transpose(1, 2).reshape(N, L, E) @ out_w.T + out_b, p.mean(1)

    parameters = [module.in_proj_weight, module.in_proj_bias, module.out_proj.weight, module.out_proj.bias]
    leaves = [x.clone().requires_grad_() for x in (query, kv, sinks)]
    out, weights = module(leaves[0], leaves[1], leaves[1], sinks=leaves[2], alibi_slopes=slopes)
    ours = torch.autograd.grad(out, leaves + parameters, grad)
    refs = [x.clone().requires_grad_() for x in (query, kv, sinks, *parameters)]
    want, want_weights = definition(*refs)
    theirs = torch.autograd.grad(want, refs, grad)
    assert max_error(out, want) <= 1e-12 and max_error(weights, want_weights) <= 1e-12
    for name, a, b in zip(["query", "key and value", "sinks", "in_proj_weight", "in_proj_bias", "out_proj.weight",
                           "out_proj.bias"], ours, theirs):
        assert max_error(a, b) <= 1e-12, name
    # The defaults are torch's module, bit for bit.
    plain = mha.torch.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    plain.load_state_dict(module.state_dict())
    reference = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    reference.load_state_dict(module.state_dict())
    assert max_error(plain(query, kv, kv)[0], reference(query, kv, kv)[0]) <= 1e-12


def test_the_modules_variants_are_checked():
    with pytest.raises(mha.ArgumentError, match=r"MultiheadAttention: scoring.chunk_size: expected 0 \(no chunks\) or "
                                                r"a number of keys > 0, got -2"):
        mha.torch.MultiheadAttention(8, 2, chunk_size=-2)
    with pytest.raises(mha.ArgumentError, match=r"MultiheadAttention: scoring.softcap"):
        mha.torch.MultiheadAttention(8, 2, softcap=float("nan"))
    with pytest.raises(mha.ArgumentError, match=r"window_size: expected \(left, right\)"):
        mha.torch.MultiheadAttention(8, 2, window_size=3)
    with pytest.raises(mha.ArgumentTypeError, match="chunk_size: expected an integer, got 2.5"):
        mha.torch.MultiheadAttention(8, 2, chunk_size=2.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sinks'"):
        mha.torch.MultiheadAttention(8, 2, sinks=torch.zeros(2))  # a call's, not the module's
    module = mha.torch.MultiheadAttention(8, 2, batch_first=True, chunk_size=2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(mha.ArgumentTypeError, match="unexpected keyword argument 'softcap'"):
        module(x, x, x, softcap=1.0)
    with pytest.raises(mha.ArgumentTypeError, match="sinks: expected a floating-point tensor, got dtype torch.int64"):
        module(x, x, x, sinks=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(mha.ArgumentError, match=r"sinks: expected shape \(Hq\) = \[2\]"):
        module(x, x, x, sinks=torch.zeros(3))
    # Inputs PyTorch's module takes instead (a float mask that requires grad) cannot carry mha's variants.
    with pytest.raises(mha.ArgumentError, match="chunk_size, sinks: mha runs these only on inputs it can read"):
        module(x, x, x, attn_mask=torch.zeros(3, 3, requires_grad=True), sinks=torch.zeros(2))
