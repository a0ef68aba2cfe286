"""mha.SentenceEncoder: sentence embeddings from a sentence-transformers model directory."""
from __future__ import annotations

import numbers
import os

import numpy as np

from . import _core, _mha, _threads
from ._core import ArgumentError


def _check_utf8(name, text):
    """A str can hold a lone surrogate ("\\ud800", e.g. from a surrogateescape decode) that UTF-8
    cannot encode; the binding would refuse it with a TypeError that names nothing."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentError(f"{name}: not valid UTF-8: a lone surrogate {text[e.start]!r} at index {e.start}") from None


class SentenceEncoder:
    """A BERT-family sentence encoder loaded from a sentence-transformers (or plain Hugging Face)
    model directory, computing what sentence_transformers.SentenceTransformer(directory).encode
    computes, in C++ (mha::models::SentenceEncoder, the encoder `mha embed` runs).

        enc = mha.SentenceEncoder("models/all-MiniLM-L6-v2")
        e = enc.encode(["A man is eating food.", "Someone eats."])   # (2, 384) float32
        similarity = e @ e.T                                        # normalised: cosines

    dtype "bfloat16" (or np.dtype / ml_dtypes.bfloat16) runs the encoder's layers in bfloat16:
    weights rounded to bfloat16, products on the CPU's bf16 instructions where it has them (float
    products of the same values elsewhere); the embeddings are float32 either way.

    Loading errors (missing files, unsupported configurations, wrong shapes) raise ArgumentError
    (a ValueError) naming the file and the field or tensor.
    """

    def __init__(self, model_dir, dtype="float32"):
        if not isinstance(model_dir, (str, os.PathLike)):
            raise TypeError(f"model_dir: expected a path (str or os.PathLike), got {type(model_dir).__name__}")
        model_dir = os.fspath(model_dir)
        if not isinstance(model_dir, str):
            raise TypeError(f"model_dir: expected a str path, got {type(model_dir).__name__}")
        if not isinstance(dtype, str):
            try:
                name = np.dtype(dtype).name if dtype is not None else None  # (np.dtype(None) is float64)
            except TypeError:
                name = None
            if name is None:
                raise TypeError("dtype: expected \"float32\" or \"bfloat16\" (a str or a numpy dtype), got "
                                f"{dtype!r}")
            dtype = name
        for name, text in (("model_dir", model_dir), ("dtype", dtype)):  # (os.fsdecode gives surrogates)
            _check_utf8(name, text)
        try:
            self._encoder = _mha.SentenceEncoder(model_dir, dtype)
        except ValueError as e:
            raise ArgumentError(str(e)) from None

    @property
    def dtype(self):
        """The type the layers compute in: "float32" or "bfloat16"."""
        return self._encoder.dtype

    @property
    def dimension(self):
        """The size of each embedding (the model's hidden size)."""
        return self._encoder.dimension

    @property
    def max_seq_length(self):
        """Tokens per sentence after truncation, [CLS] and [SEP] included."""
        return self._encoder.max_seq_length

    def encode(self, sentences, batch_size=32):
        """Embeddings (len(sentences), dimension), float32, of a list of str (a single str gives
        shape (dimension,)). batch_size sentences are encoded together (sorted by length, as
        sentence-transformers does); the result does not depend on it. The GIL is released.
        A sentence with a lone surrogate (not valid UTF-8) raises ArgumentError naming its index."""
        if isinstance(sentences, (bytes, bytearray)):
            raise TypeError(f"sentences: expected a str or a list of str, got {type(sentences).__name__}")
        single = isinstance(sentences, str)
        items = [sentences] if single else list(sentences)
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise TypeError(f"sentences[{i}]: expected str, got {type(s).__name__}")
            _check_utf8(f"sentences[{i}]", s)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or not 1 <= batch_size < 2**63:
            raise ArgumentError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        batch_size = int(batch_size)
        try:
            out = self._encoder.encode(items, batch_size, _threads.get_num_threads())
        except ValueError as e:
            raise ArgumentError(str(e)) from None
        out = np.asarray(out)
        return out[0] if single else out
