"""An attention call's variants, from mha's own two lists: the plain settings of
mha::attention::Scoring (Scoring::visit_fields) and the typed views of Options (Options::visit_views),
both exported by the binding, and a module call's views (MultiheadAttentionArgs::visit_views).
Every Python door is built from here: the keywords of the numpy functions, of mha.torch's
functions, of FlashAttention-2's and of mha.torch.MultiheadAttention, and the torch operators'
schemas, fakes and autograd (mha.transformers still names the variants it sends). A new Scoring field or view reaches them all with no edit
in the Python package (docs/architecture.md, "Adding an attention variant").

Inside the package a call's variants are one dict keyed by the C++ names (window_left,
window_right, softcap, chunk_size, query_lengths, ..., sinks, alibi_slopes); the public keywords
are the same names, but for the window, which FlashAttention's form window_size = (left, right)
stands for.
"""
from __future__ import annotations

import inspect
import math
import numbers

from . import _mha

# Scoring fields that SDPA's own arguments set (is_causal, scale, dropout_p and the seed), and
# whole_call, context parallelism's, which Python does not set.
_SDPA_FIELDS = ("causal", "scale", "dropout_p", "dropout_seed", "whole_call")
# Options' masks: SDPA's attn_mask, bool (attend_mask) or added (additive_mask).
MASKS = ("attend_mask", "additive_mask")

_DEFAULTS = _mha.Scoring()
# The plain settings beside SDPA's: (name, default).
SETTINGS = tuple((name, getattr(_DEFAULTS, name)) for name in _mha.scoring_fields() if name not in _SDPA_FIELDS)
SETTING_NAMES = frozenset(name for name, _ in SETTINGS)
# Every typed view, masks included, in the binding's order: (name, kind), kind "bool", "value"
# (the query's dtype) or "index" (int32/int64 lengths and offsets, taken as int64).
ALL_VIEWS = tuple(_mha.views())
VIEWS = tuple((name, kind) for name, kind in ALL_VIEWS if name not in MASKS)
# The variants in order: what the torch operators take after SDPA's nine arguments.
NAMES = tuple(name for name, _ in SETTINGS) + tuple(name for name, _ in VIEWS)
DEFAULTS = {**dict(SETTINGS), **{name: None for name, _ in VIEWS}}
# The views with a gradient of their own (the backward's fourth result).
DIFFERENTIABLE = ("sinks",)

# The public keywords: window_size for (window_left, window_right), then the rest by their names.
_WINDOW = ("window_left", "window_right")
KEYWORDS = {"window_size": (-1, -1), **{n: d for n, d in DEFAULTS.items() if n not in _WINDOW}}

# A module's variants (mha.torch.MultiheadAttention): its settings, held from construction
# (MultiheadAttentionOptions::scoring: the plain settings, and the scale, which a module has no other
# argument for), and a call's views (MultiheadAttentionArgs::visit_views), in order: what its
# operators take after their own arguments.
MODULE_SETTINGS = SETTINGS + (("scale", None),)
MODULE_VIEWS = tuple(_mha.module_views())
MODULE_NAMES = tuple(name for name, _ in MODULE_SETTINGS) + MODULE_VIEWS
MODULE_DEFAULTS = {**dict(MODULE_SETTINGS), **{name: None for name in MODULE_VIEWS}}
# The constructor's keywords (window_size for the window, as the functions').
MODULE_KEYWORDS = {"window_size": (-1, -1), **{n: d for n, d in MODULE_SETTINGS if n not in _WINDOW}}


class ArgumentError(ValueError, RuntimeError):
    """A bad argument value or shape. Also a RuntimeError, which is what PyTorch raises for the
    same mistakes, so code written against torch's SDPA catches it."""


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype (a TypeError, and a RuntimeError as in PyTorch)."""


def check_window(window_size):
    """(left, right) as two ints, each -1 (unbounded) or in [0, 2**63)."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) or not -1 <= w < 2**63
                   for w in window_size)):
        raise ArgumentError(f"window_size: expected (left, right), each -1 (unbounded) or a number of keys in "
                            f"[0, 2**63), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _setting(name, value):
    """A plain setting's value as the operators and the binding take it (int or float, as its
    default); the wrong type is an ArgumentTypeError naming it (mha checks the value)."""
    integral = isinstance(MODULE_DEFAULTS[name], int)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integral else numbers.Real):
        raise ArgumentTypeError(f"{name}: expected {'an integer' if integral else 'a number'}, got {value!r}")
    if integral and not -2**63 <= value < 2**63:
        raise ArgumentError(f"{name}: expected a 64-bit integer, got {value!r}")
    if integral:
        return int(value)
    try:
        return float(value)
    except OverflowError:  # an int past double's range: as infinite, which mha's own check names
        return math.inf if value > 0 else -math.inf


def variants(keywords, where):
    """A door's variant keywords (KEYWORDS, any subset) as the package's dict of C++ names, the
    settings' types checked; an unknown keyword is a TypeError naming it, as Python's own."""
    out = {}
    for name, value in keywords.items():
        if name == "window_size":
            out["window_left"], out["window_right"] = check_window(value)
        elif name in SETTING_NAMES and name not in _WINDOW:
            out[name] = _setting(name, value)
        elif name in DEFAULTS and name not in _WINDOW:
            out[name] = value
        else:
            raise ArgumentTypeError(f"{where}() got an unexpected keyword argument {name!r} (mha's variants: "
                                    f"{', '.join(KEYWORDS)})")
    return out


def module_settings(keywords, where):
    """A module's setting keywords (MODULE_KEYWORDS, any subset) as the package's dict of C++ names,
    the types checked (a scale of None is the default 1/sqrt(head_dim)); an unknown keyword is a
    TypeError naming it."""
    out = {}
    for name, value in keywords.items():
        if name == "window_size":
            out["window_left"], out["window_right"] = check_window(value)
        elif name in MODULE_KEYWORDS:
            out[name] = None if value is None and name == "scale" else _setting(name, value)
        else:
            raise ArgumentTypeError(f"{where}() got an unexpected keyword argument {name!r} (mha's settings: "
                                    f"{', '.join(MODULE_KEYWORDS)})")
    return out


def arguments(given):
    """Every variant in order (NAMES), the defaults where `given` has none: an operator's arguments
    after SDPA's."""
    return tuple(given.get(name, DEFAULTS[name]) for name in NAMES)


def scoring(causal, scale, dropout_p, dropout_seed, given):
    """The call's settings as the binding takes them: one _mha.Scoring, SDPA's four and every
    setting in `given` (a variants dict; its views are skipped)."""
    s = _mha.Scoring()
    s.causal = getattr(_mha.Causal, causal)
    s.scale = scale
    s.dropout_p = float(dropout_p)
    s.dropout_seed = int(dropout_seed or 0)
    for name, default in SETTINGS:  # (the defaults are Scoring's own already)
        value = given.get(name, default)
        if value != default:
            setattr(s, name, _setting(name, value))
    return s


def signature(function):
    """`function` with its **variants shown as the keyword-only KEYWORDS it takes (help(), inspect)."""
    params = [p for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD]
    have = {p.name for p in params}
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
               for n, d in KEYWORDS.items() if n not in have]
    function.__signature__ = inspect.Signature(params)
    return function


def schema(leading, returns, settings=SETTINGS, views=tuple(name for name, _ in VIEWS)):
    """A torch operator's schema: `leading` (its own arguments, schema text) then every variant,
    settings as int/float with their defaults (float? for the scale) and views as optional tensors."""
    def setting(name, default):
        kind = "float?" if default is None else "int" if isinstance(default, int) else "float"
        return f"{kind} {name}={default!r}"
    parts = [leading] + [setting(n, d) for n, d in settings] + [f"Tensor? {n}=None" for n in views]
    return f"({', '.join(parts)}) -> {returns}"
