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
