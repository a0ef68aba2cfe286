"""mha inside Hugging Face transformers: attn_implementation="mha".

    import mha.transformers            # registers "mha" (mha.transformers.register() does it again)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="mha")
    model.set_attn_implementation("mha")   # or on a model already loaded

Importing this module registers two functions under the name "mha": `attention_forward` with
transformers' AttentionInterface and `attention_mask` with its AttentionMaskInterface. The mask
function hands the attention function the padding alone, as the 2-D (batch, keys) bool mask
transformers builds for FlashAttention (all True when nothing is padded), never a dense
(batch, 1, queries, keys) mask: causality, the sliding window, the soft-cap, the sinks and packed
sequences are the attention call's own settings, and mha skips the keys outside them (a window of
W keys costs O(L·W), not O(L²)). The mask's causality and window are read off the mask function
transformers composes and kept on the mask (an attribute, which torch.compile traces too); the
attention function takes them from there (the modules' own is_causal and sliding_window are wrong
in some models that only ran eager).

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
cannot turn into these settings (Gemma 3's bidirectional image blocks, Llama 4's chunks, a custom
mask function) is refused by the mask function with an error naming the model and the part, and
arguments mha has no setting for (a sparse indexer's `indices`, `block_indices`, per-token
`sinks`, a `position_bias` that needs a gradient) by the attention function; a 4-D mask the
caller built is applied as it is.
"""

import warnings

import torch
import transformers

from . import _core
from . import torch as _mha_torch

if int(transformers.__version__.split(".")[0]) < 5:  # the attention and mask interfaces' signatures
    raise ImportError(f"mha.transformers needs transformers >= 5 (pip install \"mha[transformers]\"), "
                      f"got transformers {transformers.__version__}")

__all__ = ["NAME", "register", "attention_forward", "attention_mask"]

NAME = "mha"

# The mask functions transformers composes that the attention call's settings express: causality
# (or none), the sliding windows, the padding (the 2-D mask) and packed sequences (position_ids).
_EXPRESSED = {
    "causal_mask_function",
    "bidirectional_mask_function",
    "sliding_window_overlay.<locals>.inner_mask",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
}
# The ones that combine others: every part must be expressed (an or_mask widens what a query
# sees, so it is never taken apart).
_AND = {"and_masks.<locals>.and_mask", "remap_positions_for_packed_sequence.<locals>.inner_mask",
        "add_offsets_to_mask_function.<locals>.inner_mask"}


def _parts(function):
    """The mask functions `function` is built from (the parts of its and_masks): (name, function)."""
    name = getattr(function, "__qualname__", type(function).__name__)
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
# (which torch.compile traces and guards like any other Python value): ((causal, window, packed),
# padded), the first None when no mask function was given. packed: "transformers" when transformers
# found packed sequences in the position ids (its packed_sequence_mask_function is a part), any
# batch; "flash" when no 2-D mask was given, where FlashAttention's integration finds them in a
# batch of one (with a cache too: DataCollatorWithFlattening's training); else None. The attention
# function takes the causality and the window from here rather than from the module and its
# arguments, which the eager path never reads and some models leave wrong: is_causal False on a
# decoder's self-attention (NLLB-MoE, PEGASUS-X, Moonshine, AIMv2's text tower) or unset
# (Splinter); sliding_window = W where the mask is |i − j| <= W (T5Gemma's encoder; ModernBERT
# passes W + 1, FlashAttention's convention).
_SETTINGS = "_mha_mask_settings"


def _window(parts):
    """(left, right) of the mask's sliding window, mha's convention, or None: a causal overlay of W
    keys (j > i − W) is (W − 1, W − 1), the causality bounding the right; a bidirectional one
    (|i − j| <= W) is (W, W)."""
    for name, function in parts.items():
        if name in ("sliding_window_overlay.<locals>.inner_mask",
                    "sliding_window_bidirectional_overlay.<locals>.inner_mask"):
            width = function.__closure__[function.__code__.co_freevars.index("sliding_window")].cell_contents
            side = int(width) - 1 if name.startswith("sliding_window_overlay") else int(width)
            return side, side
    return None


def _remember(mask, settings, padded):
    setattr(mask, _SETTINGS, (settings, padded))
    return mask


def _known_mask(mask):
    """(settings, padded) of a mask the mask function returned, settings (causal, window, packed)
    or None; or None for any other mask."""
    return getattr(mask, _SETTINGS, None) if mask is not None else None


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, **kwargs):
    """transformers' AttentionMaskInterface function for "mha": the 2-D padding mask (batch, keys),
    bool, True for a real token, its last kv_length columns (a sliding-window cache holds the
    last keys); all True when nothing is padded; shorter than kv_length when a causal layer's
    cache has slots past the last query (a static cache not yet full: the keys written, so that
    the attention call cuts the rest, its causality being aligned on the last key it is given).
    Each mask carries its causality and window for the attention function (an attribute, traced
    by torch.compile too), and whether it pads anything (under torch.compile, which cannot look at
    its values, a given padding mask is taken as padding). Raises mha.ArgumentError for a mask
    with a part the attention call cannot express (the model and the part named)."""
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
            f"({', '.join(sorted(set(unexpressed)))}: e.g. bidirectional image blocks or chunked attention); use "
            f"attn_implementation=\"sdpa\" or \"eager\" for this model")
    causal = "causal_mask_function" in parts
    packed = ("transformers" if "packed_sequence_mask_function.<locals>.inner_mask" in parts
              else "flash" if attention_mask is None else None)
    settings = (causal, _window(parts), packed) if mask_function is not None else None
    if attention_mask is None:
        written = kv_length
        if causal and kv_length > q_length:
            written = min(kv_length, int(q_offset) + q_length - int(kv_offset))
        return _remember(torch.ones(batch_size, written, dtype=torch.bool), settings, padded=False)
    mask = attention_mask[:, -kv_length:]
    if mask.dtype != torch.bool:
        mask = mask.bool()
    return _remember(mask, settings, padded=torch.compiler.is_compiling() or not bool(mask.all()))


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


def _packed_offsets(position_ids, batch, length):
    """cu_seqlens (N + 1,) of the sequences packed in the (batch, length) rows, the rows taken one
    after another: a sequence begins each row and wherever a row's position does not step by 1
    (transformers' find_packed_sequence_indices; DataCollatorWithFlattening's positions restart at
    0). None when each row is one sequence, or position_ids are not one per token."""
    if position_ids.shape[-1] != length or position_ids.numel() not in (length, batch * length):
        return None
    positions = position_ids.reshape(-1, length).expand(batch, length)
    steps = positions.diff(dim=-1) != 1
    starts = torch.cat([steps.new_ones(batch, 1), steps], dim=-1).reshape(-1)
    if not torch.compiler.is_compiling() and int(starts.sum()) == batch:
        return None
    offsets = torch.nonzero(starts).reshape(-1)
    return torch.cat([offsets, offsets.new_tensor([batch * length])]).to(torch.int64)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                      position_ids=None, **kwargs):
    """transformers' AttentionInterface function for "mha": query (B, Hq, L, D), key and value
    (B, Hkv, S, D/Dv) as the models send them, attention_mask from `attention_mask` above (or a
    4-D mask the caller built) -> (output (B, L, Hq, Dv), weights (B, Hq, L, S) when
    output_attentions=True, else None). See the module's docstring."""
    reason = _mha_torch._unsupported(query, key, value, attention_mask)
    if reason is not None:
        raise _core.ArgumentError(f"attn_implementation=\"mha\": mha runs floating-point CPU tensors, got {reason}")
    # Under torch.autocast, as "sdpa" gets them (rotary embeddings leave q and k in float32 beside a
    # bfloat16 v): every floating-point tensor but a float64 one in the autocast dtype.
    query, key, value = _mha_torch._autocast(query, key, value)
    for name, what in _REFUSED.items():
        if kwargs.get(name) is not None:
            model = getattr(getattr(module, "config", None), "model_type", None) or type(module).__name__
            raise _core.ArgumentError(f"attn_implementation=\"mha\": {model} passes `{name}` ({what}), which mha has no "
                                      f"setting for; use attn_implementation=\"sdpa\" or \"eager\" for this model")
    known = _known_mask(attention_mask)  # ((causal, window, packed) or None, padded)
    settings = known[0] if known is not None else None
    if settings is not None:
        # The mask's causality before is_causal, as eager and "sdpa" apply the mask (some modules
        # pass is_causal False beside a causal mask: Moonshine's decoder, AIMv2's text tower).
        causal, window = settings[0], settings[1] or (-1, -1)
    else:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        # FlashAttention's convention, as transformers passes it
        window = (int(sliding_window) - 1,) * 2 if sliding_window is not None else (-1, -1)
    mask, cu_q, cu_k, full = None, None, None, key.shape[2]
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
        if known is None or known[1]:  # padding to apply (a mask of ones costs a pass for nothing)
            mask = attention_mask[:, None, None, :]
            if mask.dtype != torch.bool:
                mask = mask.bool()
    # Packed sequences: the offsets given (FlashAttention's kwargs, a batch of one), or those of the
    # position ids where transformers' mask packs them (any batch: its rows are then taken as one
    # row) or FlashAttention's integration would (a batch of one, no 2-D mask given).
    batch, heads, length = query.shape[:3]
    packing = settings[2] if settings is not None else "flash"
    if mask is None and cu_seq_lens_q is not None and cu_seq_lens_k is not None:
        cu_q, cu_k = cu_seq_lens_q.to(torch.int64), cu_seq_lens_k.to(torch.int64)
    elif (mask is None and position_ids is not None and length == key.shape[2]
          and (packing == "transformers" or (packing == "flash" and batch == 1))):
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
    variants = {"window_left": window[0], "window_right": window[1], "softcap": float(softcap or 0.0), "sinks": sinks,
                "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    result = _mha_torch._attention(query, key, value, mask, float(dropout), "bottom_right" if causal else "none",
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


def register():
    """Registers "mha" with transformers' AttentionInterface and AttentionMaskInterface (again:
    importing mha.transformers already did)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)


register()
