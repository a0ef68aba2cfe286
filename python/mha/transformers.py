"""mha inside Hugging Face transformers: attn_implementation="mha".

    import mha.transformers            # registers "mha" (mha.transformers.register() does it again)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="mha")
    model.set_attn_implementation("mha")   # or on a model already loaded

Importing this module registers two functions under the name "mha": `attention_forward` with
transformers' AttentionInterface and `attention_mask` with its AttentionMaskInterface. The mask
function returns the 2-D (batch, keys) bool padding mask transformers builds for FlashAttention
(all True when nothing is padded), never a dense (batch, 1, queries, keys) one: causality, the
sliding window, Llama 4's chunks, the soft-cap, the sinks and packed sequences are the attention
call's own settings, and mha skips the keys outside them (a window of W keys costs O(L·W), not
O(L²)). The padding itself goes to mha as lengths, not as a mask: each row's run of real tokens
is its sequence's `key_starts` (left padding, negative for a sliding-window cache that let the
first keys go, so that chunks count from where the sequence began) and `key_lengths` (right
padding, with `query_lengths` where the alignment of causality, a window or chunks needs it: a
padded query gives 0, as under FlashAttention). Only a row whose real tokens are not one run
(a padded prompt continued by generate()), or a mask whose values torch.compile cannot look at,
is also applied as a (batch, 1, 1, keys) mask. The mask's causality, window, chunk and lengths
are read off the mask function transformers composes and kept on the mask (an attribute, which
torch.compile traces too); the attention function takes them from there (the modules' own
is_causal and sliding_window are wrong in some models that only ran eager).

What the attention function takes, as transformers' models send it (docs/transformers.md):
`scaling`, `dropout` (the models pass 0 outside training), the mask's causality (else
`is_causal`, else the module's), the mask's window (else `sliding_window` in FlashAttention's
convention: a query sees W − 1 keys before it, both sides when not causal), `softcap` (Gemma 2),
`s_aux` (gpt-oss's sinks, with their gradient), grouped-query attention without repeating keys, a
KV cache (the queries are the last ones: bottom-right causality), `cu_seq_lens_q/k` and packed
`position_ids` (padding-free batches, DataCollatorWithFlattening; any batch where transformers'
mask packs), T5's `position_bias` (added as a float mask). It returns (B, L, H, Dv) as
transformers expects, and with `output_attentions=True` the attention weights (B, Hq, L, S) as
eager attention returns them (after dropout, without the sinks' column), computed by a second
pass that builds them (O(L·S) memory) and carries no gradient. A model whose mask has a part mha
cannot turn into these settings (Gemma 3's bidirectional image blocks, a custom mask function) is
refused by the mask function with an error naming the model and the part, and
arguments mha has no setting for (a sparse indexer's `indices`, `block_indices`, per-token
`sinks`, a `position_bias` that needs a gradient) by the attention function; a 4-D mask the
caller built is applied as it is.
"""

import inspect
import numbers
import sys
import warnings

import torch
import transformers
import transformers.cache_utils

from . import _core, _policy
from .torch._sdpa import _attention
from .torch._tensors import _autocast

if int(transformers.__version__.split(".")[0]) < 5:  # the attention and mask interfaces' signatures
    raise ImportError(f"mha.transformers needs transformers >= 5 (pip install \"mha[transformers]\"), "
                      f"got transformers {transformers.__version__}")

__all__ = ["NAME", "register", "attention_forward", "attention_mask", "PagedCache", "generate_batch"]

NAME = "mha"

# The mask functions transformers composes that the attention call's settings express: causality
# (or none), the sliding windows, Llama 4's chunks (their left padding is the 2-D mask's), the
# padding (the 2-D mask) and packed sequences (position_ids).
_EXPRESSED = {
    "causal_mask_function",
    "bidirectional_mask_function",
    "chunked_overlay.<locals>.inner_mask",
    "sliding_window_overlay.<locals>.inner_mask",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
}
# The ones that combine others: every part must be expressed (an or_mask widens what a query
# sees, so it is never taken apart).
_AND = {"and_masks.<locals>.and_mask", "remap_positions_for_packed_sequence.<locals>.inner_mask",
        "add_offsets_to_mask_function.<locals>.inner_mask"}


def _name(function):
    """A mask function's qualified name (its code's: torch.compile does not trace the __qualname__ of
    a function closing over a tensor, chunked_overlay's)."""
    code = getattr(function, "__code__", None)
    if code is not None and sys.version_info >= (3, 11):
        return code.co_qualname
    return getattr(function, "__qualname__", type(function).__name__)


def _parts(function):
    """The mask functions `function` is built from (the parts of its and_masks): (name, function)."""
    name = _name(function)
    if name not in _AND:
        return [(name, function)]
    inner = []
    for cell in function.__closure__ or ():
        value = cell.cell_contents
        for part in value if isinstance(value, tuple) else (value,):
            if callable(part) and not isinstance(part, torch.Tensor):
                inner += _parts(part)
    return inner


# Models whose own code reads the mask the mask function returns as the dense (batch, 1, queries,
# keys) mask, found by running every transformers 5.24 model type built from its config.
_READ_DENSE = {
    "bigbird_pegasus": "its decoder adds the mask to its scores",
    "doge": "its dynamic mask is built from it",
}

# What the mask function knows about each mask it returns, kept on the mask as an attribute
# (which torch.compile traces and guards like any other Python value): ((causal, window, packed,
# chunk), lengths, dense, source), the first None when no mask function was given; lengths, the
# padding as mha's views (_lengths); dense, whether the mask is applied too; source, the 2-D mask
# it was cut from (None for none), for a model that hands the mask generate() built back to the
# mask function (Mistral's). packed: the offsets (cu_seqlens, the rows one after another) of the
# sequences transformers found packed in the position ids (its packed_sequence_mask_function is a
# part; any batch, and models that do not hand their attention the position ids: Llama 4's);
# "flash" when no 2-D mask was given, where FlashAttention's integration finds them in the position
# ids of a batch of one (with a cache too: DataCollatorWithFlattening's training); else None. The attention
# function takes the causality and the window from here rather than from the module and its
# arguments, which the eager path never reads and some models leave wrong: is_causal False on a
# decoder's self-attention (NLLB-MoE, PEGASUS-X, Moonshine, AIMv2's text tower) or unset
# (Splinter); sliding_window = W where the mask is |i − j| <= W (T5Gemma's encoder; ModernBERT
# passes W + 1, FlashAttention's convention).
_SETTINGS = "_mha_mask_settings"


def _closure(function, name):
    """The value `function` closes over under `name`."""
    return function.__closure__[function.__code__.co_freevars.index(name)].cell_contents


def _window(parts):
    """(left, right) of the mask's sliding window, mha's convention, or None: a causal overlay of W
    keys (j > i − W) is (W − 1, W − 1), the causality bounding the right; a bidirectional one
    (|i − j| <= W) is (W, W)."""
    for name, function in parts.items():
        if name in ("sliding_window_overlay.<locals>.inner_mask",
                    "sliding_window_bidirectional_overlay.<locals>.inner_mask"):
            width = _closure(function, "sliding_window")
            side = int(width) - 1 if name.startswith("sliding_window_overlay") else int(width)
            return side, side
    return None


def _chunk(parts):
    """chunk_size of the mask's chunked_overlay (Llama 4), or 0. Its left padding, the leading
    zeros of the 2-D mask, is where _lengths starts each sequence."""
    function = parts.get("chunked_overlay.<locals>.inner_mask")
    return int(_closure(function, "chunk_size")) if function is not None else 0


def _lengths(mask, q_length, kv_offset, written, aligned, chunked):
    """The padding of the 2-D `mask` (batch, columns from position 0, the call's keys being its
    columns [kv_offset, kv_offset + written)) as mha's views, and whether a row's real tokens are not
    one run (so that the mask must be applied too): key_starts, the first real token (transformers'
    left padding) from the call's first key, negative for a sequence begun before it (kept only where
    chunks count from there); key_lengths, past the last real one; query_lengths (`aligned`: the
    queries are the mask's last columns and causality, a window or chunks align them) the queries
    before it, those past it being padding. Views with nothing to say are left out (not under
    torch.compile, which cannot look at their values)."""
    mask = mask[:, :kv_offset + written]
    columns = mask.shape[1]
    first = (mask.cumsum(-1) == 0).sum(-1)  # the leading zeros (columns for a row of padding alone)
    end = torch.maximum(first, columns - (mask.flip(-1).cumsum(-1) == 0).sum(-1))
    holes = (mask.sum(-1) != end - first).any()
    key_lengths = (end - kv_offset).clamp(0, written)
    key_starts = torch.minimum(first - kv_offset if chunked else (first - kv_offset).clamp(min=0), key_lengths)
    views = {"key_starts": key_starts, "key_lengths": key_lengths}
    if aligned:
        views["query_lengths"] = (q_length - (written - key_lengths)).clamp(0, q_length)
    if torch.compiler.is_compiling():
        return views, True
    trivial = {"key_starts": 0, "key_lengths": written, "query_lengths": q_length}
    return {name: view for name, view in views.items() if not bool((view == trivial[name]).all())}, bool(holes)


def _remember(mask, settings, lengths, dense, source):
    setattr(mask, _SETTINGS, (settings, lengths, dense, source))
    return mask


def _known_mask(mask):
    """(settings, lengths, dense, source) of a mask the mask function returned, settings (causal,
    window, packed, chunk) or None; or None for any other mask."""
    return getattr(mask, _SETTINGS, None) if mask is not None else None


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, **kwargs):
    """transformers' AttentionMaskInterface function for "mha": the 2-D padding mask (batch, keys),
    bool, True for a real token, its columns [kv_offset, kv_offset + kv_length) (a sliding-window
    cache holds the last keys); all True when nothing is padded; shorter than kv_length when a
    causal layer's cache has slots past the last query (a static cache not yet full: the keys
    written, so that the attention call cuts the rest, its causality being aligned on the last key
    it is given). Each mask carries its causality, window and chunk for the attention function,
    and its padding as mha's lengths (_lengths), with whether it must be applied too (an
    attribute, traced by torch.compile too). Raises mha.ArgumentError for a mask with a part the
    attention call cannot express (the model and the part named)."""
    parts = dict(_parts(mask_function)) if mask_function is not None else {}
    unexpressed = [name for name in parts if name not in _EXPRESSED]
    model = getattr(kwargs.get("config"), "model_type", None) or "this model"
    if model in _READ_DENSE:
        raise _core.ArgumentError(
            f"attn_implementation=\"mha\": {model}'s layers read the dense attention mask themselves "
            f"({_READ_DENSE[model]}); use attn_implementation=\"eager\" for this model")
    if unexpressed:
        raise _core.ArgumentError(
            f"attn_implementation=\"mha\": {model}'s attention mask has a part mha does not express as settings "
            f"({', '.join(sorted(set(unexpressed)))}: e.g. bidirectional image blocks); use "
            f"attn_implementation=\"sdpa\" or \"eager\" for this model")
    own = _known_mask(attention_mask)
    if own is not None:  # a mask this function returned, handed back: built again from its source
        attention_mask = own[3]
    causal, window, chunk = "causal_mask_function" in parts, _window(parts), _chunk(parts)
    sequences = parts.get("packed_sequence_mask_function.<locals>.inner_mask")
    packed = (_offsets(_closure(sequences, "packed_sequence_mask").expand(batch_size, -1).diff(dim=-1) != 0)
              if sequences is not None else "flash" if attention_mask is None else None)
    settings = (causal, window, packed, chunk) if mask_function is not None else None
    kv_offset = int(kv_offset)
    if attention_mask is None:
        written = kv_length
        if causal and kv_length > q_length:
            written = min(kv_length, int(q_offset) + q_length - kv_offset)
        # Nothing padded: a chunked layer's sequences began kv_offset keys before the cache's first.
        lengths = {"key_starts": torch.full((batch_size,), -kv_offset)} if chunk and kv_offset else {}
        return _remember(torch.ones(batch_size, written, dtype=torch.bool), settings, lengths, False, None)
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.bool()
    mask = attention_mask[:, kv_offset:kv_offset + kv_length].contiguous()  # generate() makes it so, a copy else
    lengths, dense = _lengths(attention_mask, q_length, kv_offset, mask.shape[1],
                              aligned=causal or window is not None or chunk > 0, chunked=chunk > 0)
    return _remember(mask, settings, lengths, dense, attention_mask)


# Arguments some models send that change which keys a query sees, or what joins its softmax, in a
# way mha has no setting for: refused rather than ignored.
_REFUSED = {
    "indices": "the keys each query attends to, chosen by a sparse indexer",
    "block_indices": "block-sparse attention",
    "sinks": "attention sinks per query token",
}

_warned = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"mha.transformers: {message} (this warning is shown once)", stacklevel=3)


def _offsets(steps):
    """cu_seqlens (N + 1,) of the sequences packed in (batch, length) rows, the rows taken one after
    another: a sequence begins each row and after each True of `steps` (batch, length − 1)."""
    batch, length = steps.shape[0], steps.shape[1] + 1
    offsets = torch.nonzero(torch.cat([steps.new_ones(batch, 1), steps], dim=-1).reshape(-1)).reshape(-1)
    return torch.cat([offsets, offsets.new_tensor([batch * length])]).to(torch.int64)


def _packed_offsets(position_ids, batch, length):
    """_offsets of the sequences packed in the (batch, length) rows where a row's position does not
    step by 1 (transformers' find_packed_sequence_indices; DataCollatorWithFlattening's positions
    restart at 0). None when each row is one sequence, or position_ids are not one per token."""
    if position_ids.shape[-1] != length or position_ids.numel() not in (length, batch * length):
        return None
    steps = position_ids.reshape(-1, length).expand(batch, length).diff(dim=-1) != 1
    if not torch.compiler.is_compiling() and not bool(steps.any()):
        return None
    return _offsets(steps)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                      position_ids=None, **kwargs):
    """transformers' AttentionInterface function for "mha": query (B, Hq, L, D), key and value
    (B, Hkv, S, D/Dv) as the models send them, attention_mask from `attention_mask` above (or a
    4-D mask the caller built) -> (output (B, L, Hq, Dv), weights (B, Hq, L, S) when
    output_attentions=True, else None). See the module's docstring."""
    if hasattr(key, _PAGED):  # a PagedCache's layer: its pages, read in place
        return _paged_attention(module, query, key, attention_mask, scaling, softcap, s_aux, **kwargs)
    _policy.refuse_inputs("query, key, value", _policy.unsupported(query, key, value, attention_mask),
                          'attn_implementation="mha": ')
    # Under torch.autocast, as "sdpa" gets them (rotary embeddings leave q and k in float32 beside a
    # bfloat16 v): every floating-point tensor but a float64 one in the autocast dtype.
    query, key, value = _autocast(query, key, value)
    for name, what in _REFUSED.items():
        if kwargs.get(name) is not None:
            model = getattr(getattr(module, "config", None), "model_type", None) or type(module).__name__
            raise _core.ArgumentError(f"attn_implementation=\"mha\": {model} passes `{name}` ({what}), which mha has no "
                                      f"setting for; use attn_implementation=\"sdpa\" or \"eager\" for this model")
    known = _known_mask(attention_mask)  # ((causal, window, packed, chunk) or None, lengths, dense, source)
    settings = known[0] if known is not None else None
    if settings is not None:
        # The mask's causality before is_causal, as eager and "sdpa" apply the mask (some modules
        # pass is_causal False beside a causal mask: Moonshine's decoder, AIMv2's text tower).
        causal, window, chunk = settings[0], settings[1] or (-1, -1), settings[3]
    else:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        # FlashAttention's convention, as transformers passes it
        window, chunk = (int(sliding_window) - 1,) * 2 if sliding_window is not None else (-1, -1), 0
    mask, lengths, cu_q, cu_k, full = None, {}, None, None, key.shape[2]
    if attention_mask is not None and attention_mask.dim() == 4:  # built by the caller: applied as given
        mask, causal, window = attention_mask, False, (-1, -1)
        if mask.dtype != torch.bool and mask.dtype != query.dtype:  # an additive mask, in the model's dtype
            mask = mask.to(query.dtype)
    elif attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != query.shape[0]:
            raise _core.ArgumentError(f"attention_mask: expected the (batch, keys) padding mask of mha's mask "
                                      f"function or a 4-D mask, got shape {tuple(attention_mask.shape)}")
        length = attention_mask.shape[1]
        if length < full:  # a static cache: the slots past the mask are not written yet
            key, value = key[:, :, :length], value[:, :, :length]
        if known is not None:  # the padding as lengths
            lengths = known[1]
        if known is None or known[2]:  # rows that are not one run of real tokens: the mask too
            mask = attention_mask[:, None, None, :]
            if mask.dtype != torch.bool:
                mask = mask.bool()
    # Packed sequences: the offsets given (FlashAttention's kwargs, a batch of one), those of
    # transformers' mask (any batch: its rows are then taken as one row), or those of the position
    # ids where FlashAttention's integration finds them (a batch of one, no 2-D mask given).
    batch, heads, length = query.shape[:3]
    packing = settings[2] if settings is not None else "flash"
    if mask is None and not lengths and cu_seq_lens_q is not None and cu_seq_lens_k is not None:
        cu_q, cu_k = cu_seq_lens_q.to(torch.int64), cu_seq_lens_k.to(torch.int64)
    elif isinstance(packing, torch.Tensor) and length == key.shape[2]:
        cu_q = cu_k = packing
    elif (mask is None and not lengths and position_ids is not None and length == key.shape[2]
          and packing == "flash" and batch == 1):
        cu_q = cu_k = _packed_offsets(position_ids, batch, length)
    bias = kwargs.get("position_bias")
    if bias is not None:  # T5's relative-position bias: added to the scores, as a float mask
        if torch.is_grad_enabled() and bias.requires_grad:
            raise _core.ArgumentError("position_bias: mha computes no gradient for an additive bias, and this one "
                                      "requires one (a learned relative-position bias in training); use "
                                      "attn_implementation=\"sdpa\" or \"eager\" to train, or run under torch.no_grad()")
        bias = bias[..., :key.shape[2]].to(query.dtype)
        if mask is None:
            mask = bias
        elif mask.dtype == torch.bool:
            mask = bias.masked_fill(~mask, float("-inf"))
        else:
            mask = bias + mask
    sinks = s_aux.to(query.dtype) if s_aux is not None else None
    need_weights = bool(kwargs.get("output_attentions", False))
    rows = batch > 1 and cu_q is not None  # packed rows of a batch, attended as one row
    if rows:
        query, key, value = (t.transpose(0, 1).reshape(1, t.shape[1], -1, t.shape[3]) for t in (query, key, value))
    variants = {"window_left": window[0], "window_right": window[1], "softcap": float(softcap or 0.0),
                "chunk_size": chunk, "sinks": sinks, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, **lengths}
    result = _attention(query, key, value, mask, float(dropout), "bottom_right" if causal else "none",
                                   scaling, True, variants, need_weights)
    output, weights = result[0], (result[2] if need_weights else None)
    if rows:  # back to (batch, heads, length, ...): each row's block of the one row
        output = output.reshape(heads, batch, length, -1).transpose(0, 1)
        if need_weights:
            weights = torch.stack([weights[0, :, r * length:(r + 1) * length, r * length:(r + 1) * length]
                                   for r in range(batch)])
    if need_weights:
        if torch.is_grad_enabled() and query.requires_grad and not torch.compiler.is_compiling():
            _warn_once("the attention weights output_attentions=True returns carry no gradient (the output does)")
        if weights.shape[-1] < full:  # a static cache's slots not written yet: weight 0
            weights = torch.nn.functional.pad(weights, (0, full - weights.shape[-1]))
    return output.transpose(1, 2).contiguous(), weights


# ---------------------------------------------------------------------------------------------
# A paged (and int8) KV cache for generate(): mha.PagedKVCache behind transformers' Cache.

# The attribute of the keys a PagedCache layer returns: (cache, layer, its sequences this forward,
# their cu_seqlens, whether the forward is a packed step).
_PAGED = "_mha_paged"


class _PagedLayer(transformers.cache_utils.CacheLayerMixin):
    """One layer of a PagedCache: its update writes the new keys and values into the pool's pages
    and returns stand-ins of their shape (no memory) that carry the cache, which attention_forward
    reads in place."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner, layer):
        super().__init__()
        self._owner, self._layer = owner, layer

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self._owner
        batch, heads, new, _ = key_states.shape
        seqs, cu = owner._grow(self._layer, batch, new)

        def packed(x):  # (B, H, T, D) -> (1, H, B·T, D) float32
            return x.detach().to(torch.float32).permute(1, 0, 2, 3).reshape(1, heads, batch * new, x.shape[-1]).numpy()

        owner.pool.write(self._layer, seqs, packed(key_states), packed(value_states), cu)
        step = owner._packed is not None
        if step and self._layer == len(owner.layers) - 1:
            owner._packed = None  # one forward's (its attention calls have the step on their keys)
        length = 0 if step else owner.pool.length(seqs[0])
        keys = torch.zeros((), dtype=key_states.dtype).expand(batch, heads, length, key_states.shape[-1])
        values = torch.zeros((), dtype=value_states.dtype).expand(batch, heads, length, value_states.shape[-1])
        setattr(keys, _PAGED, (owner, self._layer, seqs, cu, step))
        return keys, values

    def get_mask_sizes(self, query_length):
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self):
        owner = self._owner
        return owner.pool.length(owner.sequences[0]) if owner.sequences else 0

    def get_max_length(self):
        return -1

    def reset(self):
        self._owner.reset()

    def reorder_cache(self, beam_idx):
        raise _core.ArgumentError("PagedCache: beam search is not supported (it reorders the batch's caches); use "
                                  "greedy or sampled generation")


class PagedCache(transformers.Cache):
    """A KV cache for `model.generate(..., cache=PagedCache(model.config))` with
    attn_implementation="mha": every layer's keys and values in one mha.PagedKVCache (pages of
    `page_size` tokens through a block table; dtype "float32", "bfloat16", "float16" or "int8", a
    scale per token and kv head), read in place by mha's paged attention (each step one call over
    the batch's pages; no copy of the history). `pages` sizes the pool (the memory of a page is
    taken only when it is written); by default enough for `max_batch_size` sequences of the
    model's max_position_embeddings. One sequence per batch row; greedy and sampled generation
    (not beam search). docs/transformers.md."""

    def __init__(self, config, dtype="bfloat16", page_size=256, pages=None, max_batch_size=8):
        from ._paged import PagedKVCache
        text = config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        layers = text.num_hidden_layers
        if pages is None:
            longest = getattr(text, "max_position_embeddings", 4096) or 4096
            pages = max_batch_size * -(-int(longest) // page_size)
        self.pool = PagedKVCache(layers, pages, page_size, kv_heads, head_dim, dtype=dtype)
        self.sequences = []  # one per batch row (generate()); a packed step's are pack()'s
        self._packed = None
        super().__init__(layers=[_PagedLayer(self, i) for i in range(layers)])

    def pack(self, sequences, counts):
        """The next forward is one packed row (batch 1) holding counts[i] new tokens of pool sequence
        sequences[i] (ids from self.pool.add() or fork()), back to back, each sequence's queries
        its newest tokens: decode rows and prefill chunks of many sequences in one step (a serving
        engine's step; pass each token's position in its sequence as position_ids). Holds for one
        forward."""
        self._packed = ([int(s) for s in sequences], [int(c) for c in counts])

    def _grow(self, layer, batch, new):
        """Room for `new` tokens in each of the batch's sequences, once a step (at the first layer)."""
        if self._packed is not None:
            seqs, counts = self._packed
            if batch != 1 or new != sum(counts):
                self._packed = None
                raise _core.ArgumentError(f"PagedCache.pack: expected one row of {sum(counts)} tokens, got {batch} "
                                          f"of {new}")
            if layer == 0:
                self.pool.extend(seqs, counts)
            return seqs, [0] + torch.tensor(counts).cumsum(0).tolist()
        if not self.sequences:
            self.sequences = [self.pool.add() for _ in range(batch)]
        elif len(self.sequences) != batch:
            raise _core.ArgumentError(f"PagedCache: expected a batch of {len(self.sequences)} (its sequences), got "
                                      f"{batch}")
        if layer == 0:
            self.pool.extend(self.sequences, [new] * batch)
        return self.sequences, [t * new for t in range(batch + 1)]

    def reset(self):
        for s in self.sequences:
            self.pool.release(s)
        self.sequences = []


def generate_batch(model, inputs, max_new_tokens=20, *, dtype="bfloat16", page_size=256, max_batch_tokens=512,
                   pages=None, eos_token_id=None, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                   generator=None):
    """Generation for many prompts by continuous batching on mha's paged attention: every
    step is one forward of one packed row (PagedCache.pack) holding a token of each decoding
    request, then prompt chunks of the waiting ones in arrival order, up to `max_batch_tokens`
    tokens (transformers' FIFO scheduler's order); a request whose prompt ends in a step yields
    its first token there, a finished one gives its pages back at once. A request is admitted when
    the pool has pages for its prompt and `max_new_tokens` (`pages`: by default every request's,
    taken only where written). `model`: a causal LM with attn_implementation="mha". `inputs`: the
    prompts as lists of token ids. Greedy, or with `do_sample` drawn from the softmax of the logits
    after transformers' temperature, top-k and top-p warpers (`generator`: a torch.Generator for
    repeatable draws). Returns each prompt's generated tokens (a list of lists of int), ending at
    `max_new_tokens` or after an `eos_token_id` (an int or a list). docs/transformers.md."""
    if getattr(model.config, "_attn_implementation", None) != NAME:
        raise _core.ArgumentError(f"generate_batch: expected a model with attn_implementation=\"mha\", got "
                                  f"{getattr(model.config, '_attn_implementation', None)!r}")
    vocab = model.config.get_text_config(decoder=True).vocab_size
    prompts = []
    for i, prompt in enumerate(inputs):
        try:
            prompt = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise _core.ArgumentError(f"inputs[{i}]: expected a list of token ids, got a {type(prompt).__name__} "
                                      f"that is not one") from None
        if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
            raise _core.ArgumentError(f"inputs[{i}]: expected a non-empty list of token ids 0 to {vocab - 1}, got "
                                      f"{len(prompt)} ids" + (f" from {min(prompt)} to {max(prompt)}" if prompt else ""))
        prompts.append(prompt)
    for name, value in (("max_new_tokens", max_new_tokens), ("max_batch_tokens", max_batch_tokens),
                        ("page_size", page_size), ("pages", 1 if pages is None else pages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _core.ArgumentError(f"generate_batch: {name}: expected a positive int, got {value!r}")
    warpers = []
    if do_sample:
        from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                             TopPLogitsWarper)
        for name, value, kind in (("temperature", temperature, numbers.Real), ("top_k", top_k, numbers.Integral),
                                  ("top_p", top_p, numbers.Real)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                what = "an integer" if kind is numbers.Integral else "a number"
                raise _core.ArgumentError(f"generate_batch: {name}: expected {what}, got {value!r}")
        try:  # the warpers check their settings ("`temperature` (=0) has to be a strictly positive float, ...")
            if temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(temperature))
            if top_k is not None:
                warpers.append(TopKLogitsWarper(top_k))
            if top_p is not None:
                warpers.append(TopPLogitsWarper(top_p))
        except ValueError as e:
            raise _core.ArgumentError(f"generate_batch: {e}") from None
    stops = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stops):
        raise _core.ArgumentError(f"generate_batch: eos_token_id: expected a token id or a list of them, got "
                                  f"{eos_token_id!r}")
    stops = set(stops)
    need = [-(-(len(p) + max_new_tokens) // page_size) for p in prompts]  # pages each request may fill
    pages = sum(need) or 1 if pages is None else pages
    if need and max(need) > pages:
        raise _core.ArgumentError(f"generate_batch: pages: expected at least {max(need)} (the longest prompt and "
                                  f"max_new_tokens in pages of {page_size}), got {pages}")
    cache = PagedCache(model.config, dtype=dtype, page_size=page_size, pages=pages) if prompts else None
    # transformers 5.24 renamed the forward's past_key_values to cache
    cache_name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    out = [[] for _ in prompts]
    waiting, running, free = list(range(len(prompts))), [], pages  # running: [request, sequence, done]
    with torch.no_grad():
        while waiting or running:
            while waiting and need[waiting[0]] <= free:  # admit in arrival order
                free -= need[waiting[0]]
                running.append([waiting.pop(0), cache.pool.add(), 0])
            budget, step = max_batch_tokens, []  # (entry, tokens this step)
            for entry in sorted(running, key=lambda e: e[2] < len(prompts[e[0]])):  # decodes, then prompts
                if budget == 0:
                    break
                r, _, done = entry
                todo = prompts[r][done:] if done < len(prompts[r]) else out[r][-1:]
                step.append((entry, todo[:budget]))
                budget -= len(step[-1][1])
            ids = torch.tensor([t for _, tokens in step for t in tokens])[None]
            positions = torch.cat([torch.arange(e[2], e[2] + len(t)) for e, t in step])[None]
            ends = torch.tensor([len(t) for _, t in step]).cumsum(0) - 1
            cache.pack([e[1] for e, _ in step], [len(t) for _, t in step])
            logits = model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=ends,
                           **{cache_name: cache}).logits[0]
            if do_sample:
                for warp in warpers:  # (they read no input ids)
                    logits = warp(None, logits)
                chosen = torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=generator)[:, 0]
            else:
                chosen = logits.argmax(dim=-1)
            for (entry, tokens), token in zip(step, chosen.tolist()):
                r = entry[0]
                entry[2] += len(tokens)
                if entry[2] < len(prompts[r]):  # a prompt's chunk short of its end: no token yet
                    continue
                out[r].append(token)
                if len(out[r]) == max_new_tokens or out[r][-1] in stops:
                    cache.pool.release(entry[1])
                    running.remove(entry)
                    free += need[r]
    return out


def _paged_attention(module, query, key, attention_mask, scaling, softcap, s_aux, **kwargs):
    """attention_forward for keys a PagedCache layer returned: the batch's rows as sequences of its
    pool, each row's queries its newest tokens, left padding (the 2-D mask's) as key_starts; or a
    packed step's sequences (PagedCache.pack), bottom-right causal each."""
    owner, layer, seqs, cu, step = getattr(key, _PAGED)
    if kwargs.get("output_attentions"):
        raise _core.ArgumentError("PagedCache: output_attentions=True is not supported (a paged call builds no weights)")
    known = _known_mask(attention_mask)
    if attention_mask is not None and known is None:
        raise _core.ArgumentError("PagedCache: expected the mask of mha's mask function (attn_implementation=\"mha\"), "
                                  "got a mask built elsewhere")
    settings, lengths = (known[0], known[1]) if known is not None else (None, {})
    if known is not None and known[2]:
        raise _core.ArgumentError("PagedCache: a row whose real tokens are not one run (padding inside a sequence) is "
                                  "not supported")
    causal, window, chunk = (settings[0], settings[1] or (-1, -1), settings[3]) if settings else (True, (-1, -1), 0)
    batch, heads, length, dim = query.shape
    variants = {"window_left": window[0], "window_right": window[1], "softcap": float(softcap or 0.0),
                "chunk_size": chunk}
    if s_aux is not None:
        variants["sinks"] = s_aux.detach().to(torch.float32).numpy()
    starts = None if step else lengths.get("key_starts")  # (a packed step's sequences are pack()'s, unpadded)
    q = query.detach().to(torch.float32).transpose(0, 1).reshape(1, heads, batch * length, dim).numpy()
    out, _ = owner.pool.attend(layer, seqs, q, cu, scale=scaling, causal=causal if not step else True,
                               key_starts=None if starts is None else starts.numpy(), **variants)
    out = torch.from_numpy(out).reshape(heads, batch, length, -1).to(query.dtype)
    return out.permute(1, 2, 0, 3).contiguous(), None


def register():
    """Registers "mha" with transformers' AttentionInterface and AttentionMaskInterface (again:
    importing mha.transformers already did)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)


register()
