"""mha.SentenceEncoder on the real all-MiniLM-L6-v2 (models/, `make model`): the committed
sentence-transformers goldens (float32 within twice sentence-transformers' float32 error on this
machine against float64, cosine >= 0.99999), sentence-transformers itself when it is installed, the same numbers as the
C++ encoder whatever the batch size, and errors for bad arguments and model directories."""
import pathlib
import shutil

import numpy as np
import pytest
from conftest import load_peer, load_safetensors

import mha

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "all-MiniLM-L6-v2"
GOLDEN = ROOT / "tests" / "goldens" / "sentence" / "minilm.safetensors"


@pytest.fixture(scope="module")
def encoder():
    assert (MODEL / "model.safetensors").exists(), f"{MODEL} is missing: run `make model`"
    return mha.SentenceEncoder(MODEL)


@pytest.fixture(scope="module")
def golden():
    tensors, _ = load_safetensors(GOLDEN)
    sentences = [s.decode("utf-8") for s in tensors["sentences"].tobytes().split(b"\0")[:-1]]
    return sentences, tensors


def test_matches_sentence_transformers_goldens(encoder, golden):
    sentences, t = golden
    ours = encoder.encode(sentences)
    assert ours.shape == (len(sentences), 384) and ours.dtype == np.float32
    f32, f64 = load_peer(GOLDEN)["embedding_f32"].astype(np.float64), t["embedding_f64"]
    ours_err = np.abs(ours - f64).max(axis=1)
    torch_err = np.abs(f32 - f64).max(axis=1)
    assert (ours_err <= 2 * torch_err + 1e-6).all(), (ours_err, torch_err)
    cosine = (ours * f64).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(f64, axis=1)
    assert cosine.min() >= 0.99999


def test_bfloat16_within_twice_sentence_transformers_bfloat16(golden):
    """Issue 26's bar: each embedding at most twice as far (Euclidean) from the float64 model's as
    sentence-transformers' own bfloat16 embedding (model.to(torch.bfloat16)); the thread count
    changes nothing."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    sentences, t = golden
    for dtype in ("bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        enc = mha.SentenceEncoder(MODEL, dtype=dtype)
        assert enc.dtype == "bfloat16"
    ours = enc.encode(sentences)
    assert ours.shape == (len(sentences), 384) and ours.dtype == np.float32
    f64 = t["embedding_f64"]
    ours_d = np.linalg.norm(ours - f64, axis=1)
    torch_d = np.linalg.norm(load_peer(GOLDEN)["embedding_bf16"].astype(np.float64) - f64, axis=1)
    assert (ours_d <= 2 * torch_d).all(), (ours_d / torch_d).max()
    saved = mha.get_num_threads()
    try:
        mha.set_num_threads(1)
        assert np.array_equal(enc.encode(sentences), ours)
    finally:
        mha.set_num_threads(saved)
    assert mha.SentenceEncoder(MODEL, dtype=np.float32).dtype == "float32"


def test_batch_size_and_threads_change_nothing(encoder, golden):
    sentences = golden[0][:12]
    base = encoder.encode(sentences)
    saved = mha.get_num_threads()
    try:
        for threads in (1, 2):
            mha.set_num_threads(threads)
            for batch in (1, 5):
                assert np.array_equal(encoder.encode(sentences, batch_size=batch), base)
    finally:
        mha.set_num_threads(saved)
    assert encoder.encode("A man is eating food.").shape == (384,)
    assert encoder.encode([]).shape == (0, 384)
    assert encoder.dimension == 384 and encoder.max_seq_length == 256


def test_against_sentence_transformers_directly(encoder):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(MODEL), device="cpu")
    sentences = ["The cat sits outside.", "A man is playing guitar.", "Ünïcödé and 東京 😀", ""]
    theirs = model.encode(sentences, convert_to_numpy=True)
    assert np.abs(encoder.encode(sentences) - theirs).max() < 1e-5


def test_bad_arguments(encoder, tmp_path):
    with pytest.raises(TypeError, match=r"sentences\[1\]: expected str, got int"):
        encoder.encode(["fine", 3])
    # A lone surrogate cannot be encoded as UTF-8: a ValueError naming the sentence, not the
    # binding's TypeError about its argument types.
    with pytest.raises(ValueError, match=r"sentences\[1\]: not valid UTF-8: a lone surrogate '\\ud800' at index 1"):
        encoder.encode(["fine", "a\ud800b"])
    with pytest.raises(mha.ArgumentError, match=r"sentences\[0\]"):
        encoder.encode("\udcff")
    for bad in (0, -1, 2.5, True, 2**63):
        with pytest.raises(mha.ArgumentError, match="batch_size"):
            encoder.encode(["x"], batch_size=bad)
    assert encoder.encode(["x"], batch_size=np.int64(4)).shape == (1, encoder.dimension)  # any integer type
    with pytest.raises(TypeError, match="sentences: expected a str or a list of str, got bytes"):
        encoder.encode(b"abc")
    with pytest.raises(TypeError, match="model_dir"):
        mha.SentenceEncoder(42)

    class BytesPath:  # an os.PathLike whose path is bytes
        def __fspath__(self):
            return b"/models"

    with pytest.raises(TypeError, match="model_dir: expected a str path, got bytes"):
        mha.SentenceEncoder(BytesPath())
    # A path or dtype holding a lone surrogate (os.fsdecode of a name that is not UTF-8): named.
    with pytest.raises(mha.ArgumentError, match=r"model_dir: not valid UTF-8: a lone surrogate '\\udce9'"):
        mha.SentenceEncoder(str(tmp_path) + "/caf\udce9")
    with pytest.raises(mha.ArgumentError, match=r"dtype: not valid UTF-8"):
        mha.SentenceEncoder(MODEL, dtype="bf\ud800")
    with pytest.raises(TypeError, match="dtype: expected .* got None"):
        mha.SentenceEncoder(MODEL, dtype=None)
    with pytest.raises(mha.ArgumentError, match=r'dtype: expected "float32" or "bfloat16", got "float16"'):
        mha.SentenceEncoder(MODEL, dtype=np.float16)
    with pytest.raises(TypeError, match="dtype: expected"):
        mha.SentenceEncoder(MODEL, dtype=object())
    with pytest.raises(mha.ArgumentError, match="vocab.txt: cannot open"):
        mha.SentenceEncoder(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(MODEL, broken, ignore=shutil.ignore_patterns("model.safetensors"))
    (broken / "model.safetensors").symlink_to(MODEL / "model.safetensors")
    (broken / "config.json").write_text((MODEL / "config.json").read_text().replace('"gelu"', '"gelu_new"'))
    with pytest.raises(mha.ArgumentError, match="config.json: field 'hidden_act'.*gelu_new"):
        mha.SentenceEncoder(broken)
    (broken / "config.json").write_text((MODEL / "config.json").read_text())
    (broken / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},'
                                         ' {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]')
    with pytest.raises(mha.ArgumentError, match=r"modules.json: module type \"sentence_transformers.models.Dense\" is not supported"):
        mha.SentenceEncoder(broken)
