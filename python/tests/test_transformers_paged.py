"""mha.transformers.PagedCache: generate() with a paged (and int8) cache that mha's attention reads
in place. Float32 pages give the dynamic cache's tokens (pages of 256 hold whole decode blocks, so
every step's attention is the same bits as on the contiguous cache); bfloat16 and int8 pages are
reported beside it (how many of the greedy tokens agree with float32's; random weights, so the
tokens themselves mean nothing). Memory follows the pages written; errors are named."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import mha  # noqa: E402
import mha.transformers  # noqa: E402

T = transformers
CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def llama(seed=0):
    torch.manual_seed(seed)
    model = T.LlamaForCausalLM(T.LlamaConfig(**CONFIG)).eval()
    model.set_attn_implementation("mha")
    return model


def prompts(seed=1):
    """Two left-padded prompts of 9 and 5 tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (2, 9), generator=gen)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    return ids, mask


def generate(model, ids, mask, tokens, cache=None):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                              pad_token_id=0, cache=cache)


def test_float32_pages_give_the_dynamic_caches_tokens():
    model = llama()
    ids, mask = prompts()
    dynamic = generate(model, ids, mask, 256)
    cache = mha.transformers.PagedCache(model.config, dtype="float32", page_size=256)
    paged = generate(model, ids, mask, 256, cache)
    assert torch.equal(paged, dynamic)
    assert cache.get_seq_length() == 9 + 255  # the last token is not fed back
    assert cache.pool.pages_in_use == 2 * 2  # two sequences of 264 tokens: 2 pages each
    # one prompt, no mask, pages smaller than a decode block: the same tokens (each step within
    # float rounding of the contiguous cache's)
    one = generate(model, ids[:1], None, 64)
    assert torch.equal(generate(model, ids[:1], None, 64, mha.transformers.PagedCache(model.config, dtype="float32",
                                                                                      page_size=16)), one)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_bfloat16_and_int8_pages_reported(dtype):
    model = llama()
    ids, mask = prompts()
    exact = generate(model, ids, mask, 64)
    got = generate(model, ids, mask, 64, mha.transformers.PagedCache(model.config, dtype=dtype))
    assert got.shape == exact.shape and torch.equal(got[:, :9], ids)
    agree = [int((got[r, 9:] != exact[r, 9:]).nonzero()[0]) if (got[r, 9:] != exact[r, 9:]).any() else 64
             for r in range(2)]
    print(f"{dtype} pages: greedy tokens equal to float32's for the first {agree} of 64")


def test_reset_releases_the_pages_and_errors_are_named():
    model = llama()
    ids, mask = prompts()
    cache = mha.transformers.PagedCache(model.config, dtype="int8", page_size=16)
    generate(model, ids, mask, 20, cache)
    assert cache.pool.pages_in_use == 2 * 2  # 28 tokens each: 2 pages of 16
    cache.reset()
    assert cache.pool.pages_in_use == 0 and cache.get_seq_length() == 0
    with pytest.raises(mha.ArgumentError, match="PagedCache: beam search is not supported"):
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, num_beams=2, pad_token_id=0,
                           cache=mha.transformers.PagedCache(model.config, dtype="float32"))
    small = mha.transformers.PagedCache(model.config, dtype="float32", page_size=4, pages=3)
    with pytest.raises(mha.ArgumentError, match=r"PagedKVCache::extend: expected at most 3 free pages to be needed \(0 of 3 in use\), got 6"):
        generate(model, ids, mask, 3, small)
    with pytest.raises(TypeError, match="dtype: expected float32, bfloat16, float16 or int8"):
        mha.transformers.PagedCache(model.config, dtype="float64")


def test_a_packed_step_of_a_prefill_and_decode_rows():
    # PagedCache.pack: a serving engine's step, one packed row holding a 20-token prompt and a 7-token
    # prompt, then a decode row of each and a third sequence's 30-token prompt, in one forward each;
    # every token's logits against the same model run on each sequence alone in float64 (eager), the
    # bar twice the error of that run in float32 (transformers' dynamic cache, mha's attention).
    model = llama()
    reference = llama()
    reference.set_attn_implementation("eager")
    reference = reference.double()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 97, (n,), generator=gen) for n in (20, 7, 30)]
    nexts = [torch.randint(1, 97, (1,), generator=gen) for _ in range(2)]
    cache = mha.transformers.PagedCache(model.config, dtype="float32", page_size=16)
    a, b, c = (cache.pool.add() for _ in range(3))

    def step(seqs, parts, starts):
        ids = torch.cat(parts)[None]
        positions = torch.cat([torch.arange(s, s + len(p)) for s, p in zip(starts, parts)])[None]
        cache.pack(seqs, [len(p) for p in parts])
        with torch.no_grad():
            return model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True).logits[0]

    first = step([a, b], prompts[:2], [0, 0])
    second = step([a, b, c], [nexts[0], nexts[1], prompts[2]], [20, 7, 0])
    assert [cache.pool.length(s) for s in (a, b, c)] == [21, 8, 30]
    got = {0: torch.cat([first[:20], second[:1]]), 1: torch.cat([first[20:], second[1:2]]), 2: second[2:]}
    whole = [torch.cat([prompts[0], nexts[0]]), torch.cat([prompts[1], nexts[1]]), prompts[2]]
    for s, tokens in enumerate(whole):
        with torch.no_grad():
            exact = reference(input_ids=tokens[None]).logits[0]
            own = model(input_ids=tokens[None]).logits[0].double()
        bound = 2 * (own - exact).abs().max() + 1e-6
        assert (got[s].double() - exact).abs().max() <= bound, f"sequence {s}"
    with pytest.raises(mha.ArgumentError, match="PagedCache.pack: expected one row of 3 tokens, got 1 of 2"):
        cache.pack([a], [3])
        with torch.no_grad():
            model(input_ids=nexts[0].repeat(2)[None], past_key_values=cache, use_cache=True)


def five_prompts():
    """Prompts of 5, 23, 1, 40 and 9 tokens."""
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(1, 97, (n,), generator=gen).tolist() for n in (5, 23, 1, 40, 9)]


def reference_tokens(model, prompt, tokens):
    """Greedy tokens of generate() on transformers' dynamic cache (mha's attention), and the smallest
    gap between the two best logits over its steps."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    gap = min(float(s[0].double().topk(2).values.diff().abs()) for s in out.scores)
    return out.sequences[0, len(prompt):].tolist(), gap


@pytest.mark.parametrize("budget,page_size,pages", [(512, 256, None), (7, 16, None), (3, 4, None), (64, 16, 4)])
def test_generate_batch_gives_each_prompts_own_tokens(budget, page_size, pages):
    # Continuous batching on float32 pages: five prompts (1 to 40 tokens) run as packed steps of at
    # most `budget` tokens (7 and 3 cut every prompt into chunks that share steps with other
    # requests' decodes; pages of 4 cross a page every few tokens; 4 pages of 16 admit one request
    # at a time) give each prompt's greedy tokens of generate() alone. The smallest gap between
    # two best logits of the reference is asserted first, so that the tokens are decided far
    # from float32's rounding (about 1e-6 here).
    model = llama()
    prompts = five_prompts()
    expected = [reference_tokens(model, p, 12) for p in prompts]
    assert min(gap for _, gap in expected) > 1e-4
    got = mha.transformers.generate_batch(model, prompts, 12, dtype="float32", page_size=page_size,
                                          max_batch_tokens=budget, pages=pages)
    assert got == [tokens for tokens, _ in expected]


def test_generate_batch_stops_at_eos_and_reports_low_precision_pages():
    model = llama()
    prompts = five_prompts()
    full = mha.transformers.generate_batch(model, prompts, 12, dtype="float32")
    eos = full[0][3]
    stopped = mha.transformers.generate_batch(model, prompts, 12, dtype="float32", eos_token_id=[eos, 96])
    for tokens, whole in zip(stopped, full):  # each up to and with its first eos, or all 12
        ends = [i for i, t in enumerate(whole) if t in (eos, 96)]
        assert tokens == whole[:ends[0] + 1 if ends else 12]
    assert len(stopped[0]) < 12
    for dtype in ("bfloat16", "int8"):
        got = mha.transformers.generate_batch(model, prompts, 12, dtype=dtype, page_size=16, max_batch_tokens=9)
        assert [len(t) for t in got] == [12] * 5
        print(f"{dtype} pages: tokens equal to float32's before the first difference:",
              [next((i for i, (a, b) in enumerate(zip(g, f)) if a != b), 12) for g, f in zip(got, full)])


def test_generate_batch_errors_are_named():
    model = llama()
    run = mha.transformers.generate_batch
    assert run(model, [], 3) == []
    with pytest.raises(mha.ArgumentError, match=r"inputs\[1\]: expected a non-empty list of token ids 0 to 96, "
                                                r"got 0 ids"):
        run(model, [[1, 2], []], 3)
    with pytest.raises(mha.ArgumentError, match=r"inputs\[0\]: expected .* 0 to 96, got 2 ids from 1 to 97"):
        run(model, [[1, 97]], 3)
    with pytest.raises(mha.ArgumentError, match=r"inputs\[0\]: expected a list of token ids, got a str that is not one"):
        run(model, ["a b"], 3)
    with pytest.raises(mha.ArgumentError, match=r"eos_token_id: expected a token id or a list of them, got \['x'\]"):
        run(model, [[1]], 3, eos_token_id=["x"])
    with pytest.raises(mha.ArgumentError, match="pages: expected a positive int, got 0"):
        run(model, [[1]], 3, pages=0)
    with pytest.raises(TypeError, match="dtype: expected float32, bfloat16, float16 or int8"):
        run(model, [[1]], 3, dtype="float64")
    with pytest.raises(mha.ArgumentError, match="max_new_tokens: expected a positive int, got 0"):
        run(model, [[1]], 0)
    with pytest.raises(mha.ArgumentError, match="max_batch_tokens: expected a positive int, got 2.5"):
        run(model, [[1]], 3, max_batch_tokens=2.5)
    with pytest.raises(mha.ArgumentError, match=r"pages: expected at least 2 \(the longest prompt and max_new_tokens "
                                                r"in pages of 16\), got 1"):
        run(model, [[1] * 20], 3, page_size=16, pages=1)
    model.set_attn_implementation("sdpa")
    with pytest.raises(mha.ArgumentError, match="expected a model with attn_implementation=\"mha\", got 'sdpa'"):
        run(model, [[1]], 3)


def test_generate_batch_samples_from_the_warped_softmax():
    # do_sample: the first token of a prompt drawn 4000 times (one request each, continuous
    # batching's steps of 512 tokens) against the softmax of generate()'s own first logits after
    # temperature 0.7 and top-k 5 (PyTorch's softmax over transformers' warped scores): every
    # frequency within 4.5 standard deviations of its probability, tokens outside the top 5 never
    # drawn. The output layer is scaled by 20 (random weights give logits within 0.15 of each
    # other, where any temperature looks uniform), so that the top 5 span about 3. A seeded
    # generator repeats the draws; top_k 1 is greedy.
    model = llama()
    with torch.no_grad():
        model.lm_head.weight *= 20
    prompt = [3, 14, 15, 92, 65]
    with torch.no_grad():
        first = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=1, do_sample=False, pad_token_id=0,
                               output_logits=True, return_dict_in_generate=True).logits[0][0].double()
    top = first.topk(5)
    probability = torch.zeros(97, dtype=torch.float64)
    probability[top.indices] = torch.softmax(top.values / 0.7, dim=0)
    draws = 4000
    got = mha.transformers.generate_batch(model, [prompt] * draws, 1, dtype="float32", do_sample=True,
                                          temperature=0.7, top_k=5, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(torch.tensor([t[0] for t in got]), minlength=97).double()
    assert counts[probability == 0].sum() == 0
    sigma = (draws * probability * (1 - probability)).sqrt()
    assert ((counts - draws * probability).abs() <= 4.5 * sigma + 1e-9).all(), (counts[top.indices], draws * probability[top.indices])
    again = [mha.transformers.generate_batch(model, [prompt, [7, 8]], 6, dtype="float32", do_sample=True, top_p=0.9,
                                             generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert again[0] == again[1]
    assert mha.transformers.generate_batch(model, [prompt], 6, dtype="float32", do_sample=True, top_k=1) == \
        mha.transformers.generate_batch(model, [prompt], 6, dtype="float32")
    with pytest.raises(mha.ArgumentError, match=r"temperature` \(=0.0\) has to be a strictly positive float"):
        mha.transformers.generate_batch(model, [prompt], 2, do_sample=True, temperature=0.0)
    with pytest.raises(mha.ArgumentError, match="top_k: expected an integer, got 'x'"):
        mha.transformers.generate_batch(model, [prompt], 2, do_sample=True, top_k="x")
