"""mha inside Hugging Face transformers (mha.transformers, issue 27): attn_implementation="mha"
for each family, built from a small config with random weights, against the same model in
float64.

The bar is transformers' own: on a padded batch, mha's largest error over the real tokens'
logits (or hidden states) against float64 is at most twice that of transformers' own path in the
same dtype ("sdpa" where the family has it, else "eager"). The float64 reference and
transformers' own path run each sequence alone, unpadded: with left padding transformers' own
float paths put NaN in the padded rows, which the next layer's values carry into every row, so
the padded batch has no finite reference there (mha gives a padded query that sees no key 0).
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import mha  # noqa: E402
import mha.transformers  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

T = transformers
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
LAYERS = dict(SMALL, num_key_value_heads=2)
TWO_KINDS = ["sliding_attention", "full_attention"]

# family: (model class, config, transformers' own path). Windows of 5 keys, so that 12 tokens
# reach past them; Gemma 2's soft-cap at 0.5, so that it bends these small random scores.
DECODERS = {
    "llama": (T.LlamaForCausalLM, lambda: T.LlamaConfig(**LAYERS), "sdpa"),
    "mistral": (T.MistralForCausalLM, lambda: T.MistralConfig(**LAYERS, sliding_window=5), "sdpa"),
    "qwen2": (T.Qwen2ForCausalLM, lambda: T.Qwen2Config(**LAYERS, use_sliding_window=True, sliding_window=5,
                                                         max_window_layers=1), "sdpa"),
    "qwen3": (T.Qwen3ForCausalLM, lambda: T.Qwen3Config(**LAYERS, head_dim=16), "sdpa"),
    "gemma2": (T.Gemma2ForCausalLM, lambda: T.Gemma2Config(**LAYERS, head_dim=16, query_pre_attn_scalar=24,
                                                           attn_logit_softcapping=0.5, sliding_window=5), "eager"),
    "gemma3": (T.Gemma3ForCausalLM, lambda: T.Gemma3TextConfig(**LAYERS, head_dim=16, query_pre_attn_scalar=24,
                                                               sliding_window=5, layer_types=TWO_KINDS), "sdpa"),
    "gpt_oss": (T.GptOssForCausalLM, lambda: T.GptOssConfig(**LAYERS, head_dim=16, sliding_window=5,
                                                            num_local_experts=4, num_experts_per_tok=2,
                                                            layer_types=TWO_KINDS), "eager"),
    # Llama 4's chunked attention: chunks of 4 in its first layer (the second, without rotary
    # embeddings, attends to every key), left padding aligning them as transformers does.
    "llama4": (T.Llama4ForCausalLM, lambda: T.Llama4TextConfig(
        **LAYERS, head_dim=16, attention_chunk_size=4, intermediate_size_mlp=128, num_local_experts=4,
        num_experts_per_tok=1, no_rope_layers=[1, 0]), "sdpa"),
    # Multi-head latent attention: query and key heads of 24 (16 + 8 rotary), value heads of 12.
    "deepseek_v3": (T.DeepseekV3ForCausalLM, lambda: T.DeepseekV3Config(
        **SMALL, num_key_value_heads=4, moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12), "sdpa"),
}
ENCODERS = {
    "bert": (T.BertModel, lambda: T.BertConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4), "sdpa"),
    "modernbert": (T.ModernBertModel, lambda: T.ModernBertConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                                                 num_hidden_layers=3, num_attention_heads=4,
                                                                 local_attention=6, global_attn_every_n_layers=3,
                                                                 pad_token_id=0), "sdpa"),
}
FAMILIES = {**DECODERS, **ENCODERS}


@pytest.fixture(autouse=True)
def float64_softmax(monkeypatch):
    """The float64 references in float64 throughout: transformers' eager attention asks softmax
    for float32 (`softmax(scores, dtype=torch.float32).to(query.dtype)`, Llama, Mistral, Qwen 3,
    Gemma 2/3, ModernBERT, ...), which in a float64 model would round every weight to float32 —
    an error of the same size as the float32 paths' own, shared with eager float32. A float64
    input keeps float64 here; every other call is PyTorch's as it is."""
    softmax = torch.nn.functional.softmax

    def exact(input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype == torch.float64 and dtype == torch.float32:
            dtype = torch.float64
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)
    monkeypatch.setattr(torch.nn.functional, "softmax", exact)


def build(family, attn_implementation, dtype):
    cls, config, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(config()).eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # the grouped product takes no float64
    if family == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()  # sinks that weigh in the softmax
    model = model.to(dtype)
    model.set_attn_implementation(attn_implementation)
    return model


def output_of(family, model, ids, mask=None, position_ids=None):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids)
    return (out.logits if family in DECODERS else out.last_hidden_state).double()


def batch(padding, lengths=(12, 7, 9), seed=1):
    """Three sequences of `lengths` tokens (at most 12), padded on the right or the left: ids,
    mask, the position ids each sequence has alone, and each sequence's tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (3, 12), generator=gen)
    mask = torch.zeros(3, 12, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    if padding == "left":
        mask = mask.flip(1)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    alone = [ids[row][mask[row].bool()].unsqueeze(0) for row in range(3)]
    return ids, mask, position_ids, alone


def error_alone(family, model, alone, reference):
    return max((output_of(family, model, x)[0] - r[0]).abs().max().item() for x, r in zip(alone, reference))


def test_an_older_transformers_is_refused_at_import(monkeypatch):
    # transformers 4's mask interface takes other arguments: a clear ImportError, not a TypeError
    # from inside a model's forward.
    import importlib
    monkeypatch.setattr("transformers.__version__", "4.57.6")  # (the module as imported now: lazy, it replaced itself)
    with pytest.raises(ImportError, match="mha.transformers needs transformers >= 5 .* got transformers 4.57.6"):
        importlib.reload(mha.transformers)
    monkeypatch.undo()
    importlib.reload(mha.transformers)


def test_registered_under_the_name_mha():
    assert ALL_ATTENTION_FUNCTIONS["mha"] is mha.transformers.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["mha"] is mha.transformers.attention_mask
    mha.transformers.register()  # again: the same functions
    assert ALL_ATTENTION_FUNCTIONS["mha"] is mha.transformers.attention_forward


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_within_twice_transformers_own_error(family, dtype):
    own_path = FAMILIES[family][2]
    reference_model = build(family, "eager", torch.float64)
    own, ours = build(family, own_path, dtype), build(family, "mha", dtype)
    for padding in ("right", "left"):
        ids, mask, position_ids, alone = batch(padding)
        reference = [output_of(family, reference_model, x) for x in alone]
        own_error = error_alone(family, own, alone, reference)
        got = output_of(family, ours, ids, mask, position_ids)
        real = mask.bool()
        our_error = max((got[row][real[row]] - reference[row][0]).abs().max().item() for row in range(3))
        print(f"{family} {dtype} {padding}: mha {our_error:.3g}, transformers {own_path} {own_error:.3g}")
        assert our_error <= 2 * own_error, f"{family} {dtype} {padding}-padded"


# More families, float32 only, on a right-padded batch, against float64 eager (the same rule): the
# attention of a GPT-2, a GPT-NeoX, Phi, Mixtral (window), Starcoder2 (window), OPT, Gemma, Cohere
# and Qwen2-MoE decoder; RoBERTa, DistilBERT, ELECTRA and Splinter encoders; BART, T5 (its
# relative-position bias), NLLB-MoE, PEGASUS-X and Whisper encoder-decoders (cross-attention with
# the encoder's padding), T5Gemma (soft-cap, and bidirectional windows in the encoder); ViT and
# CLIP's text tower. Splinter, NLLB-MoE and PEGASUS-X run only eager in transformers, and their
# modules' is_causal is unset or wrong (False on the decoder's self-attention); T5Gemma's encoder
# passes sliding_window = W for the mask |i − j| <= W: the causality and the window come from the
# mask function. Windows of 8 keys: with 5 padding tokens a padded query still sees a real key (else
# eager's float32 batch has NaN). Each is built from a small config with random weights.
SEQ2SEQ = dict(vocab_size=97, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
MORE = {
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**SMALL)),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**SMALL)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0)),
    "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                                            sliding_window=8)),
    "starcoder2": lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(**SMALL, num_key_value_heads=2, sliding_window=8)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=97, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                num_attention_heads=4, word_embed_proj_dim=64)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**SMALL, head_dim=16, num_key_value_heads=1)),
    "cohere": lambda: T.CohereForCausalLM(T.CohereConfig(**SMALL)),
    "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**SMALL, num_key_value_heads=2, num_experts=4,
                                                                moe_intermediate_size=32,
                                                                shared_expert_intermediate_size=32)),
    "nllb_moe": lambda: T.NllbMoeForConditionalGeneration(T.NllbMoeConfig(**SEQ2SEQ, num_experts=4)),
    "pegasus_x": lambda: T.PegasusXForConditionalGeneration(T.PegasusXConfig(**SEQ2SEQ, block_size=4,
                                                                             num_global_tokens=2)),
    "roberta": lambda: T.RobertaModel(T.RobertaConfig(**SMALL)),
    "splinter": lambda: T.SplinterModel(T.SplinterConfig(**SMALL)),
    "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=97, dim=64, hidden_dim=128, n_layers=2,
                                                                n_heads=4)),
    "electra": lambda: T.ElectraModel(T.ElectraConfig(**SMALL)),
    "bart": lambda: T.BartForConditionalGeneration(T.BartConfig(**SEQ2SEQ)),
    "t5gemma": lambda: T.T5GemmaForConditionalGeneration(T.T5GemmaConfig(
        encoder=T.T5GemmaModuleConfig(**LAYERS, head_dim=16, sliding_window=8, attn_logit_softcapping=0.5),
        decoder=T.T5GemmaModuleConfig(**LAYERS, head_dim=16, sliding_window=8, attn_logit_softcapping=0.5),
        vocab_size=97, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(vocab_size=97, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                          num_heads=4)),
    "whisper": lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
        **SEQ2SEQ, num_mel_bins=8, max_source_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1)),
    "vit": lambda: T.ViTModel(T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=128, image_size=32, patch_size=8)),
    "clip_text": lambda: T.CLIPTextModel(T.CLIPTextConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                                          num_hidden_layers=2, num_attention_heads=4)),
}


SEQ2SEQ_FAMILIES = ("bart", "nllb_moe", "pegasus_x", "t5", "t5gemma")


def run_more(family, implementation, dtype, compiled=False):
    """(output over the real positions) of a MORE family's model in `dtype` under `implementation`
    (compiled with torch.compile's eager backend when asked)."""
    torch.manual_seed(0)
    model = MORE[family]().eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # the grouped product takes no float64
    model = model.to(dtype)
    model.set_attn_implementation(implementation)
    if compiled:
        model = torch.compile(model, backend="eager")
    ids, mask, _, _ = batch("right")
    gen = torch.Generator().manual_seed(2)
    decoder = dict(decoder_input_ids=ids[:, :6], decoder_attention_mask=mask[:, :6].flip(0))  # padded differently
    with torch.no_grad():
        if family == "vit":
            out = model(pixel_values=torch.randn(3, 3, 32, 32, generator=gen).to(dtype))
            return out.last_hidden_state.double().flatten(0, 1)
        if family == "whisper":
            out = model(input_features=torch.randn(3, 8, 32, generator=gen).to(dtype), **decoder)
        elif family in SEQ2SEQ_FAMILIES:
            out = model(input_ids=ids, attention_mask=mask, **decoder)
        else:
            out = model(input_ids=ids, attention_mask=mask)
    result = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    real = (decoder["decoder_attention_mask"] if family in SEQ2SEQ_FAMILIES + ("whisper",) else mask).bool()
    return result.double()[real]


@pytest.mark.parametrize("family", sorted(MORE))
def test_more_families_within_twice_eager_error(family):
    reference = run_more(family, "eager", torch.float64)
    own_error = (run_more(family, "eager", torch.float32) - reference).abs().max().item()
    our_error = (run_more(family, "mha", torch.float32) - reference).abs().max().item()
    assert our_error <= 2 * own_error, f"{family}: mha {our_error:.3g}, eager {own_error:.3g}"


@pytest.mark.parametrize("family", ("nllb_moe", "pegasus_x", "splinter", "t5gemma"))
def test_compiled_models_whose_modules_misstate_their_masks(family):
    """Under torch.compile too the causality and the window come from the mask function (carried
    on the mask), not from the modules these models leave wrong: the uncompiled output bit for bit
    (before, the compiled ones lost their causality or a key of their window: errors of 2e-2 to
    1e-1)."""
    torch.testing.assert_close(run_more(family, "mha", torch.float32, compiled=True),
                               run_more(family, "mha", torch.float32), rtol=0, atol=0)


def test_what_mha_cannot_honour_is_refused():
    """T5's learned relative-position bias needs a gradient in training, which mha does not
    compute; a sparse indexer's key choice (DeepSeek V3.2), block-sparse indices and per-token
    sinks have no mha setting; BigBird-Pegasus and Doge read the dense mask in their own layers:
    each an error naming it, never ignored."""
    torch.manual_seed(0)
    t5 = MORE["t5"]().train()
    t5.set_attn_implementation("mha")
    ids, mask, _, _ = batch("right")
    with pytest.raises(mha.ArgumentError, match="position_bias: mha computes no gradient for an additive bias"):
        t5(input_ids=ids, attention_mask=mask, labels=ids)
    # Models whose own layers read the dense mask (found by running every model type of
    # transformers 5.24): refused by the mask function, naming the model.
    for model_type in ("bigbird_pegasus", "doge"):
        config = T.PretrainedConfig()
        config.model_type = model_type
        with pytest.raises(mha.ArgumentError, match=f"{model_type}'s layers read the dense attention mask"):
            mha.transformers.attention_mask(1, 4, 4, config=config)
    module = torch.nn.Module()
    q = torch.randn(1, 2, 4, 8)
    for name in ("indices", "block_indices", "sinks"):
        with pytest.raises(mha.ArgumentError, match=f"Module passes `{name}`"):
            mha.transformers.attention_forward(module, q, q, q, None, **{name: torch.zeros(1)})


def attentions_of(model, ids, mask=None, position_ids=None):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, output_attentions=True)
    return [a.double() for a in out.attentions]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_output_attentions_gives_the_eager_weights(family, dtype):
    """output_attentions=True: each layer's (B, Hq, L, S) weights as eager attention returns them
    (soft-capped, windowed, the sinks' share left out), on right- and left-padded batches: exactly
    0 on the padded keys, and over the real queries and keys within twice the error of eager
    attention in the same dtype on the same batch, against float64 (each sequence alone). Measured
    (largest over the batch, per layer, mha / eager): float32 0.35-1.07, bfloat16 0.64-1.01."""
    reference_model, own, ours = (build(family, "eager", torch.float64), build(family, "eager", dtype),
                                  build(family, "mha", dtype))
    for padding in ("right", "left"):
        ids, mask, position_ids, alone = batch(padding)
        got, eager = attentions_of(ours, ids, mask, position_ids), attentions_of(own, ids, mask, position_ids)
        reference = [attentions_of(reference_model, x) for x in alone]
        real = mask.bool()
        assert len(got) == len(eager) == reference_model.config.num_hidden_layers
        for layer, (g, e) in enumerate(zip(got, eager)):
            assert g.shape == e.shape == (3, e.shape[1], 12, 12)
            our_error = own_error = 0.0
            for row in range(3):
                r = reference[row][layer][0]
                ours_row, eager_row = g[row][:, real[row]], e[row][:, real[row]]
                assert torch.all(ours_row[:, :, ~real[row]] == 0), f"{family} {padding} row {row}: padded keys"
                our_error = max(our_error, (ours_row[:, :, real[row]] - r).abs().max().item())
                own_error = max(own_error, (eager_row[:, :, real[row]] - r).abs().max().item())
            assert our_error <= 2 * own_error, \
                f"{family} {dtype} {padding} layer {layer}: {our_error:.3g} vs eager {own_error:.3g}"


def greedy(model, ids, mask, tokens=32):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                          output_scores=True, return_dict_in_generate=True, pad_token_id=0)


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_greedy_generation_gives_the_eager_tokens(family):
    """32 greedy tokens after left-padded prompts of 7 and 9 tokens, transformers' dynamic cache
    (the sliding-window layers' past the window of 5): the eager float32 tokens. A step whose two
    best eager logits are closer than twice transformers' own float32 error on the prompt may
    pick the other; from there the continuations differ, so the comparison stops (and counts)."""
    ids, mask, position_ids, alone = batch("left")
    ids, mask, alone = ids[1:], mask[1:], alone[1:]
    reference = build(family, "eager", torch.float64)
    own = build(family, FAMILIES[family][2], torch.float32)
    bound = 2 * error_alone(family, own, alone, [output_of(family, reference, x) for x in alone])
    eager, ours = greedy(build(family, "eager", torch.float32), ids, mask), greedy(build(family, "mha", torch.float32), ids, mask)
    prompt = ids.shape[1]
    near_ties = 0
    for row in range(ids.shape[0]):
        for step, scores in enumerate(eager.scores):
            if ours.sequences[row, prompt + step] == eager.sequences[row, prompt + step]:
                continue
            top2 = scores[row].double().topk(2).values
            assert top2[0] - top2[1] < bound, f"{family}: row {row} differs at step {step}, not a near tie"
            near_ties += 1
            break
    print(f"{family}: {near_ties} near-tie steps")


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "llama4"])
def test_a_static_cache_gives_the_eager_tokens(family):
    """transformers' static cache holds slots not written yet past the last query: the keys are
    cut there, at the padding mask's length or, without a mask, at the keys written so far (the
    mask function counts them from the cache's offsets). 8 greedy tokens after left-padded
    prompts and after one prompt without a mask, the sliding-window layers' static caches past
    their window: the eager float32 tokens."""
    ids, mask, _, _ = batch("left")
    for inputs in (dict(input_ids=ids[1:], attention_mask=mask[1:]), dict(input_ids=ids[:1])):
        run = lambda implementation: build(family, implementation, torch.float32).generate(
            **inputs, max_new_tokens=8, do_sample=False, pad_token_id=0, cache_implementation="static")
        assert torch.equal(run("mha"), run("eager")), "with a mask" if "attention_mask" in inputs else "no mask"
    if family != "llama":
        return
    # With output_attentions, each step's weights span the whole cache as eager's do (0 on the
    # slots not written yet), within the rule of test_output_attentions_gives_the_eager_weights
    # (one unpadded prompt: float64 eager on a left-padded batch is NaN from its second layer on).
    steps = lambda implementation, dtype=torch.float32: build("llama", implementation, dtype).generate(
        input_ids=ids[:1], max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static",
        output_attentions=True, return_dict_in_generate=True).attentions
    for step, (ours, eager, exact) in enumerate(zip(steps("mha"), steps("eager"), steps("eager", torch.float64))):
        for a, b, r in zip(ours, eager, exact):
            assert a.shape == b.shape == r.shape and torch.all(a[..., ids.shape[1] + step:] == 0)
            assert (a.double() - r).abs().max() <= 2 * (b.double() - r).abs().max(), step


def train_step(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out.loss.double(), {name: p.grad.double().clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gpt_oss", "llama4"])
def test_training_step_and_a_packed_batch(family):
    """A training step's loss and every parameter's gradient, on a right-padded batch and on the
    same three sequences packed in one row by DataCollatorWithFlattening (padding-free: position_ids
    restart at each sequence): within twice the error of transformers' own float32 path on the
    padded batch, parameter by parameter, against float64 on it. (2 and 3 padding tokens, fewer
    than the window's 5 keys: a padded query whose window holds only padding would put NaN in
    transformers' own padded batch, and the next layer's values would carry it into every row.)

    A gradient's largest error over a tensor of 64 elements (the norms' weights) is noisy: the
    worst parameter's ratio (mha / transformers) over six batches ran 1.27-2.14 for Gemma 2 and
    1.23-1.47 for Llama, a different parameter each time, while the median over the parameters
    stayed 0.89-1.19. So each parameter's error, both paths', is the largest over four batches.
    Two rules get a floor, with the evidence: the loss is one scalar that either float32 path
    hits to the last bit or misses by one unit by chance (transformers 0, mha 4.8e-7, one unit in
    the last place of 4.6), so its bound adds that unit; and gpt-oss's four sink gradients per
    layer are each a sum over every row of −exp(sink − lse)·(dO·O) whose terms cancel, which mha
    adds in double from its float32 O and dO (attention.cpp, sink_gradients): what is left is
    their rounding, luck of the cancellation (measured, layer 1, |g| ≤ 5.1e-4, in units in the
    last place of the largest: mha 21 packed and 8.7 padded, transformers 9.2), so a tensor of at
    most 16 elements may also be within 32 such units."""
    from transformers import DataCollatorWithFlattening
    reference, own_model, ours_model = (build(family, "eager", torch.float64),
                                        build(family, FAMILIES[family][2], torch.float32),
                                        build(family, "mha", torch.float32))
    eps = torch.finfo(torch.float32).eps
    worst = {}  # (inputs, parameter) -> [mha's largest error, transformers' largest error, largest |gradient|]
    for seed in range(1, 5):
        ids, mask, _, alone = batch("right", lengths=(12, 10, 9), seed=seed)
        padded = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        features = [{"input_ids": x[0].tolist()} for x in alone]
        packed = dict(DataCollatorWithFlattening()(features))  # the sequences from position_ids
        if family == "llama4":  # its layers do not hand position_ids to attention: transformers' mask packs them,
            packed["use_cache"] = False  # which it does without a cache
        with_offsets = dict(DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features))  # cu_seq_lens_q/k
        ref_loss, ref = train_step(reference, **padded)
        own_loss, own = train_step(own_model, **padded)
        for name, inputs in (("padded", padded), ("packed", packed), ("packed with offsets", with_offsets)):
            loss, grads = train_step(ours_model, **inputs)
            assert abs(loss - ref_loss) <= 2 * abs(own_loss - ref_loss) + eps * abs(ref_loss), \
                f"{family} {name} batch {seed}: loss"
            for p in ref:
                w = worst.setdefault((name, p), [0.0, 0.0, 0.0])
                w[0] = max(w[0], (grads[p] - ref[p]).abs().max().item())
                w[1] = max(w[1], (own[p] - ref[p]).abs().max().item())
                w[2] = max(w[2], ref[p].abs().max().item())
    for (name, p), (ours_error, own_error, largest) in worst.items():
        floor = 32 * eps * largest if reference.get_parameter(p).numel() <= 16 else 0.0
        assert ours_error <= max(2 * own_error, floor), \
            f"{family} {name}: gradient of {p}: {ours_error:.3g} vs {own_error:.3g}"


@pytest.mark.parametrize("family, padding", [("mistral", "right"), ("llama4", "left")])
def test_torch_compile_has_no_graph_break(family, padding):
    """The whole model compiles into one graph (the mask function's settings and lengths ride on
    the mask as an attribute, which torch.compile traces; the attention is mha's operator), and
    gives the uncompiled logits (where the padding, whose values the compiled mask function cannot
    look at, is applied as a mask as well as lengths)."""
    ids, mask, _, _ = batch(padding)
    model = build(family, "mha", torch.float32)
    explanation = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    assert explanation.graph_break_count == 0, [r.reason for r in explanation.break_reasons]
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)
    if family != "mistral":
        return
    # With output_attentions transformers' own output capture breaks the graph once, under eager
    # attention as well; the weights' operator adds no break and gives the uncompiled weights.
    weights = lambda m: m(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    breaks = [torch._dynamo.explain(weights)(m).graph_break_count for m in (model, build("mistral", "eager", torch.float32))]
    assert breaks[0] == breaks[1], breaks
    with torch.no_grad():
        for a, b in zip(torch.compile(weights, backend="eager")(model), weights(model)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_mask_mha_cannot_express_is_refused():
    """Gemma 3's bidirectional image blocks (an or_mask of a blockwise overlay) and a mask function
    of one's own: an error naming the model and the part, before any attention runs. Causality,
    windows, chunks, padding and packing pass, the padding as lengths."""
    from transformers import masking_utils as M
    config = T.Gemma3TextConfig(**LAYERS)
    blocks = M.or_masks(M.causal_mask_function, M.blockwise_overlay(torch.zeros(1, 4, dtype=torch.long)))
    for function, part in ((blocks, "or_masks"), (lambda b, h, q, kv: kv <= q, "<lambda>")):
        with pytest.raises(mha.ArgumentError, match=f"gemma3_text's attention mask .*{part}"):
            mha.transformers.attention_mask(1, 4, 4, mask_function=function, config=config)
    padding = torch.tensor([[1, 1, 0, 0]])

    def lengths(mask):
        return {name: view.tolist() for name, view in mha.transformers._known_mask(mask)[1].items()}

    # Each mask is remembered with its causality, window (j > i − 3: 2 keys before the query's
    # own; |i − j| <= 2: 2 keys on each side) and chunk, and its padding as lengths: the right
    # padding [1, 1, 0, 0] is 2 keys, and 2 queries where causality or a window aligns them.
    for function, causal, window, chunk in (
            (M.causal_mask_function, True, None, 0), (M.sliding_window_causal_mask_function(3), True, (2, 2), 0),
            (M.sliding_window_bidirectional_mask_function(2), False, (2, 2), 0),
            (M.bidirectional_mask_function, False, None, 0),
            (M.chunked_causal_mask_function(3, torch.zeros(1)), True, None, 3),
            (M.and_masks(M.causal_mask_function, M.padding_mask_function(padding.bool())), True, None, 0)):
        ones = mha.transformers.attention_mask(1, 4, 4, mask_function=function)
        assert torch.equal(ones, torch.ones(1, 4, dtype=torch.bool))
        assert mha.transformers._known_mask(ones) == ((causal, window, "flash", chunk), {}, False, None)
        given = mha.transformers.attention_mask(1, 4, 4, mask_function=function, attention_mask=padding)
        assert torch.equal(given, padding.bool()) and mha.transformers._known_mask(given)[0] == (causal, window, None,
                                                                                                chunk)
        aligned = {"query_lengths": [2]} if causal or window else {}
        assert lengths(given) == {"key_lengths": [2], **aligned} and not mha.transformers._known_mask(given)[2]
        # Handed back to the mask function (as Mistral's model does with the mask generate() built):
        # the same mask, built again from its source.
        again = mha.transformers.attention_mask(1, 4, 4, mask_function=function, attention_mask=given)
        assert torch.equal(again, given) and lengths(again) == lengths(given)
    # A sliding-window cache's keys are the columns [kv_offset, kv_offset + kv_length) of the mask.
    assert torch.equal(mha.transformers.attention_mask(1, 1, 2, kv_offset=2, attention_mask=torch.tensor([[0, 1, 1, 0]])),
                       torch.tensor([[True, False]]))
    last = mha.transformers.attention_mask(1, 1, 2, kv_offset=2, attention_mask=torch.tensor([[0, 1, 1, 1]]))
    assert torch.equal(last, torch.ones(1, 2, dtype=torch.bool)) and mha.transformers._known_mask(last)[:3] == (None, {},
                                                                                                               False)
    # Left padding is where a sequence starts, counted from the cache's first key (and only for
    # chunks, whose origin it is, before it: a sequence that began 2 keys before the cache's);
    # real tokens that are not one run are applied as a mask too.
    chunked = M.chunked_causal_mask_function(3, torch.zeros(2))
    left = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert lengths(mha.transformers.attention_mask(2, 1, 4, kv_offset=2, attention_mask=left)) == {"key_starts": [1, 0]}
    assert lengths(mha.transformers.attention_mask(2, 1, 4, kv_offset=2, mask_function=chunked, attention_mask=left)) == {
        "key_starts": [1, -2]}
    holes = mha.transformers.attention_mask(1, 1, 4, attention_mask=torch.tensor([[1, 0, 1, 1]]))
    assert mha.transformers._known_mask(holes)[2] and lengths(holes) == {}
    assert lengths(mha.transformers.attention_mask(1, 4, 4, attention_mask=torch.tensor([[0, 0, 0, 0]]))) == {
        "key_starts": [4]}  # padding alone: no key
    # A mask the mask function did not make is not known (a copy, or one whose memory was reused).
    assert mha.transformers._known_mask(last.clone()) is None
    # Made without a mask function, the causality and the window are the module's and the
    # arguments' (here causal, and FlashAttention's sliding_window = 2: the key before and its own).
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = (torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    ones = mha.transformers.attention_mask(1, 4, 4, attention_mask=torch.ones(1, 4, dtype=torch.long))
    out, _ = mha.transformers.attention_forward(module, q, k, v, ones, sliding_window=2)
    i, j = torch.arange(4)[:, None], torch.arange(4)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j >= i - 1))
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_a_4d_mask_is_applied_as_given_and_bad_inputs_are_refused():
    module = torch.nn.Module()
    module.is_causal = True
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=gen) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6, generator=gen) > 0.3
    mask[..., 0] = True
    out, weights = mha.transformers.attention_forward(module, q, k, v, mask, scaling=0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5)
    torch.testing.assert_close(out, expected.transpose(1, 2))
    assert weights is None and out.is_contiguous()
    additive = torch.zeros(2, 1, 6, 6, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min)
    out, _ = mha.transformers.attention_forward(module, q, k, v, additive, scaling=0.5)  # taken in q's dtype
    torch.testing.assert_close(out, expected.transpose(1, 2))
    out, weights = mha.transformers.attention_forward(module, q, k, v, mask, scaling=0.5, output_attentions=True)
    scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1))
    torch.testing.assert_close(out, expected.transpose(1, 2))
    with pytest.warns(UserWarning, match="carry no gradient"):
        mha.transformers.attention_forward(module, q.requires_grad_(), k, v, None, output_attentions=True)
    with pytest.raises(mha.ArgumentError, match=r"attention_mask: expected the \(batch, keys\) padding mask .* got "
                                                r"shape \(2, 6, 6\)"):
        mha.transformers.attention_forward(module, q, k, v, torch.ones(2, 6, 6, dtype=torch.bool))
    with pytest.raises(mha.ArgumentError, match="query, key, value: expected floating-point CPU tensors mha can read, got tensors on meta"):
        mha.transformers.attention_forward(module, q.to("meta"), k.to("meta"), v.to("meta"), None)


def test_the_masks_causality_wins_over_the_modules_is_causal():
    """Moonshine's decoder passes is_causal = self.is_causal and attention_mask is None (False
    beside its causal mask) and AIMv2's text tower is_causal=False beside create_causal_mask's mask:
    eager applies the mask, so mha takes the mask's causality (before: 0.3-0.4 and 2.8 off, a
    later token moving an earlier one's logits)."""
    gen = torch.Generator().manual_seed(0)
    ids, mask, _, _ = batch("right")
    moonshine = T.MoonshineConfig(vocab_size=97, hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2,
                                  decoder_num_hidden_layers=2, encoder_num_attention_heads=4,
                                  decoder_num_attention_heads=4, encoder_num_key_value_heads=4,
                                  decoder_num_key_value_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  decoder_start_token_id=1)
    audio = torch.randn(3, 4000, generator=gen, dtype=torch.float64)
    cases = {
        "moonshine": (lambda: T.MoonshineForConditionalGeneration(moonshine),
                      dict(input_values=audio, decoder_input_ids=ids, decoder_attention_mask=mask)),
        "aimv2_text": (lambda: T.Aimv2TextModel(T.Aimv2TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                                                   num_hidden_layers=2, num_attention_heads=4,
                                                                   eos_token_id=2)),
                       dict(input_ids=ids, attention_mask=mask)),
    }
    for name, (make, inputs) in cases.items():
        outputs = {}
        for implementation in ("eager", "mha"):
            torch.manual_seed(0)
            model = make().double().eval()
            model.set_attn_implementation(implementation)
            with torch.no_grad():
                out = model(**inputs)
            outputs[implementation] = (out.logits if hasattr(out, "logits") else out.last_hidden_state)[mask.bool()]
        torch.testing.assert_close(outputs["mha"], outputs["eager"], rtol=0, atol=1e-12, msg=name)


def test_packed_rows_of_a_batch_and_positions_that_jump():
    """transformers packs whenever position ids do not step by 1 (no mask, no cache), in every row
    of a batch, restarting at 0 or not: each sequence then equals itself alone, under mha as under
    eager (before, mha packed only a batch of one restarting at 0, and leaked across the rest:
    0.4-0.5 off). An all-ones mask makes it one sequence per row, as eager has it, and so does a
    cache in a batch of two (FlashAttention's rule packs a batch of one without a mask, cache or
    not: the training test below)."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 97, (2, 12), generator=gen)
    cases = [  # (position_ids, each row's sequences)
        (torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]]),
         [[(0, 7), (7, 12)], [(0, 4), (4, 12)]]),
        (torch.tensor([[0, 1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]),
         [[(0, 7), (7, 12)], [(0, 12)]]),
    ]
    for family in ("llama", "mistral"):
        reference, ours = build(family, "eager", torch.float64), build(family, "mha", torch.float64)
        for position_ids, sequences in cases:
            with torch.no_grad():
                alone = torch.stack([torch.cat([reference(input_ids=ids[r:r + 1, a:b],
                                                          position_ids=position_ids[r:r + 1, a:b]).logits[0]
                                                for a, b in sequences[r]]) for r in range(2)])
                for model in (reference, ours):
                    got = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
                    torch.testing.assert_close(got, alone, rtol=0, atol=1e-12, msg=family)
                # the weights of the packed rows, as eager's (each row's sequences apart)
                weights = [model(input_ids=ids, position_ids=position_ids, use_cache=False,
                                 output_attentions=True).attentions for model in (reference, ours)]
                for a, b in zip(*weights):
                    torch.testing.assert_close(b, a, rtol=0, atol=1e-12, msg=family)
                for kw in (dict(attention_mask=torch.ones_like(ids), use_cache=False), dict(use_cache=True)):
                    torch.testing.assert_close(ours(input_ids=ids, position_ids=position_ids, **kw).logits,
                                               reference(input_ids=ids, position_ids=position_ids, **kw).logits,
                                               rtol=0, atol=1e-12, msg=f"{family} {list(kw)}")


def test_a_4d_mask_on_a_sliding_window_model_is_applied_as_given():
    """A 4-D mask the caller built is the whole mask under eager and "sdpa": no sliding window is
    added to it (before, mha added the module's window: 0.3 off on Mistral)."""
    ids, _, _, _ = batch("right", lengths=(12, 12, 12))
    i, j = torch.arange(12)[:, None], torch.arange(12)
    prefix = ((j <= i) | (j < 6))[None, None].expand(3, 1, 12, 12)  # a prefix-LM mask, wider than the window
    additive = torch.zeros(prefix.shape, dtype=torch.float64).masked_fill(~prefix, torch.finfo(torch.float64).min)
    with torch.no_grad():
        want = build("mistral", "eager", torch.float64)(input_ids=ids, attention_mask=additive).logits
        for mask in (prefix, additive):
            got = build("mistral", "mha", torch.float64)(input_ids=ids, attention_mask=mask).logits
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", ("llama", "gemma2", "gpt_oss"))
def test_autocast_within_twice_transformers_own_error(family):
    """Under torch.autocast("cpu", bfloat16) the rotary embeddings leave q and k in float32 beside a
    bfloat16 v; "sdpa" gets all three in bfloat16 from autocast, and so does mha (before: a dtype
    error). Logits within twice transformers' own autocast error against float64; a training
    step's backward runs and gives the float32 parameters float32 gradients."""
    ids, mask, _, _ = batch("right")
    with torch.no_grad():
        reference = output_of(family, build(family, "eager", torch.float64), ids, mask)
    errors = {}
    for implementation in (FAMILIES[family][2], "mha"):
        model = build(family, implementation, torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            errors[implementation] = (output_of(family, model, ids, mask) - reference)[mask.bool()].abs().max().item()
            if implementation == "mha":
                model.train()
                loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        if implementation == "mha":
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.requires_grad]
            assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert errors["mha"] <= 2 * errors[FAMILIES[family][2]], errors


def test_all_minilm_through_automodel_matches_sentence_transformers():
    """The real all-MiniLM-L6-v2 (models/, `make model`) through AutoModel with
    attn_implementation="mha", mean-pooled and normalised as sentence-transformers does, on the 50
    golden sentences as one batch padded to 256 tokens: each embedding within twice
    sentence-transformers' float32 error against float64 (the committed goldens,
    tests/goldens/sentence, with sentence-transformers run on this machine: load_peer), and in
    bfloat16 within twice its bfloat16 distance from float64."""
    import pathlib

    import numpy as np
    from conftest import load_peer, load_safetensors
    root = pathlib.Path(__file__).resolve().parents[2]
    model_dir = root / "models" / "all-MiniLM-L6-v2"
    assert (model_dir / "model.safetensors").exists(), f"{model_dir} is missing: run `make model`"
    path = root / "tests" / "goldens" / "sentence" / "minilm.safetensors"
    golden, _ = load_safetensors(path)
    peers = load_peer(path)
    ids = torch.from_numpy(golden["input_ids"])
    mask = torch.from_numpy(golden["attention_mask"])
    f64 = golden["embedding_f64"]
    for dtype, peer in ((torch.float32, peers["embedding_f32"]), (torch.bfloat16, peers["embedding_bf16"])):
        model = T.AutoModel.from_pretrained(model_dir, attn_implementation="mha", dtype=dtype).eval()
        assert model.config._attn_implementation == "mha"
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.double()
        weights = mask.unsqueeze(-1).double()
        mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        ours = torch.nn.functional.normalize(mean, dim=1).numpy()
        ours_distance = np.linalg.norm(ours - f64, axis=1)
        peer_distance = np.linalg.norm(peer.astype(np.float64) - f64, axis=1)
        worst = float(np.max(ours_distance / peer_distance))
        print(f"all-MiniLM-L6-v2 {dtype}: largest distance / sentence-transformers' {worst:.2f}")
        assert (ours_distance <= 2 * peer_distance).all(), (dtype, worst)
