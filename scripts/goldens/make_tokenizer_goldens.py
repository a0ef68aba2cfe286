#!/usr/bin/env python3
"""Goldens for mha's WordPiece tokenizer: a hard corpus and the ids Hugging Face's tokenizer gives.

Writes
  tests/goldens/tokenizer/corpus.txt       the corpus, one line per '\\n' (no line ends in '\\r')
  tests/goldens/tokenizer/ids.safetensors  per corpus line, the ids of
      AutoTokenizer(models/all-MiniLM-L6-v2)(line, truncation=True, max_length=256)
      (its fast tokenizer: the `tokenizers` library), flattened: `ids` (I32) and `offsets` (I64,
      line i is ids[offsets[i]:offsets[i+1]]); and for the first VARIANT_LINES lines the same with
      the normalizer's options changed (`ids_<variant>`, `offsets_<variant>`), see VARIANTS.

The corpus is generated (seeded) to be hard: accents in NFC and NFD, CJK, kana, hangul, emoji
(ZWJ sequences, flags, skin tones), zero-width and control characters, soft hyphens, Unicode
spaces and line separators, punctuation of every kind, words of 99..150 characters, numbers,
URLs, many scripts, Turkish i, ß, ligatures, fullwidth forms, stacked combining marks, the
special tokens written out, characters assigned after Unicode 8.0, lines past 256 tokens, empty
and whitespace-only lines, and plain English.

    python3 scripts/goldens/make_tokenizer_goldens.py   (needs transformers, tokenizers, torch)
"""
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical_writer import save_canonical  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
OUT = os.path.join(ROOT, "tests", "goldens", "tokenizer")
MAX_LENGTH = 256
VARIANT_LINES = 400
# name -> BertNormalizer options (clean_text, handle_chinese_chars, strip_accents, lowercase)
VARIANTS = {
    "cased": dict(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=False),
    "lower_keep_accents": dict(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
    "cased_strip_accents": dict(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=False),
    "no_chinese_split": dict(clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=True),
}

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.", "A man is eating food.", "It's a beautiful day, isn't it?",
    "Transformers use self-attention to relate tokens.", "She said: \"I'll be there at 5 p.m.\"",
    "Dr. Smith's co-author (née Jones) won the 2019 award.", "e-mail me at john.doe@example.com!",
    "Visit https://huggingface.co/docs?q=tokenizers&lang=en#wordpiece for details.",
    "The U.S.A. and the U.K. signed the treaty in 1945.", "Prices rose 3.5% to $1,234.56 (approx.).",
    "unbelievably, antidisestablishmentarianism is a word", "I can't won't shouldn't've",
]
WORDS = ("attention tokenization unaffable running jumped playing internationalization hyperparameter "
         "preprocessing microservices electroencephalography photosynthesis cat dog the a of and").split()
ACCENTED = ["café", "naïve", "résumé", "jalapeño", "Ångström", "façade", "coöperate", "São Paulo", "Zürich",
            "Dvořák", "Łódź", "Ærøskøbing", "Ελληνικά", "crème brûlée", "piñata", "ﬁancé", "Øresund"]
SCRIPTS = ["Привет, как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีครับ",
           "გამარჯობა", "Բարեւ", "ሰላም", "ᚠᛇᚻ", "ꦲꦏ꧀ꦱꦫ", "ᏣᎳᎩ", "ᠮᠣᠩᠭᠣᠯ", "ཀཁག", "ខ្មែរ", "ລາວ", "မြန်မာ"]
CJK = ["我喜欢自然语言处理", "東京は日本の首都です", "ひらがなとカタカナ", "한국어 문장입니다", "中文，標點。符號！",
       "𠀀𠀁𪜀𫝀", "豈更車", "漢字かな混じり文", "ｶﾀｶﾅ", "〆〇〡"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🫠", "🥰", "🏳️‍🌈", "👩🏿‍💻", "1️⃣", "©", "™", "🀄", "☃"]
SPECIAL_CHARS = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "\u2060", "\u061c", "\u180e", "\u2066", "\u202e",
                 "\u0000", "\u0001", "\u0007", "\u001b", "\u007f", "\u0085", "\u009f", "\t", "\u000b", "\u000c",
                 "\r", "\u00a0", "\u2002", "\u3000", "\u2028", "\u2029", "\u1680", "\u202f", "\ufffd", "\ue000",
                 "\U000f0000", "\u0378", "\U0001bca0", "\U000e0001", "\u034f", "\ufe0f"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["¡", "¿", "«", "»", "“", "”", "‘", "’", "—", "–", "…", "·",
                                                      "¶", "§", "†", "‡", "•", "‰", "′", "″", "‹", "›", "¢", "£",
                                                      "¥", "€", "±", "×", "÷", "、", "。", "「", "」", "《", "》",
                                                      "⹂", "⹅", "⹝", "𞥞", "¦", "¬", "°", "µ", "^"]
LATER_UNICODE = ["\u08e2", "\U000110cd", "\U00013430", "\U00013439", "\u0890", "\u2e4f", "\U0001e94a", "\u0d00",
                 "\U00010d24", "\u0eba", "\ua8ff", "\U0001f97a", "\U0001fae0", "\u1ab0", "\u1cf8"]
# Characters whose general category changed after Unicode 8.0, and CJK Extension E's first 256
# code points (U+2B820–U+2B91F, outside tokenizers' range for it) with its first one after them.
CATEGORY_CHANGED = ["\u1734", "\u1885", "\u1886", "\ua9bd", "\U000111c9", "\u166d", "\U0002b820", "\U0002b8ff",
                    "\U0002b91f", "\U0002b920"]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0323", "\u035c", "\u0489", "\u20dd", "\u0903", "\u0bcd"]
TURKISH = ["İstanbul", "ıi İI", "DİYARBAKIR", "ǅemal ǈjubav ǋ", "ΣΑΣ ΟΔΟΣ", "Straße STRASSE ß ẞ", "ﬀ ﬃ ﬄ ﬅ",
           "ＡＢＣ　ｘｙｚ１２３！", "Ⅻ ⅻ ① ⑽ ㊙", "ǰ ΐ ﬆ", "K Å Ω"]
SPECIAL_TOKENS = ["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", "[mask]", "[CLS][SEP]", "x[MASK]y", "[[MASK]]",
                  "[ CLS ]", "[Mask]"]


def long_word(rng, n):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


def make_corpus(count=2400, seed=15):
    rng = random.Random(seed)
    lines = ["", " ", "\t", "   \t  ", "\u3000", "\u00a0\u00a0", "\u200b", "\u0000", "\ufeff"]
    lines += ENGLISH + ACCENTED + SCRIPTS + CJK + EMOJI + TURKISH + SPECIAL_TOKENS
    lines += [long_word(rng, n) for n in (99, 100, 101, 150, 300)]
    lines += ["un" + "believ" * 20 + "able", "x" * 100 + " " + "y" * 101, "é" * 100, "é" * 101, "e\u0301" * 60]
    lines += ["word " * 300, "a, " * 200, "我" * 400, " ".join(str(i) for i in range(400))]
    lines += ["a" + c + "b" for c in SPECIAL_CHARS + LATER_UNICODE + PUNCT + CATEGORY_CHANGED]
    lines += ["x" + "".join(rng.sample(COMBINING, 4)) + "y" for _ in range(20)]
    pools = [ENGLISH, WORDS, ACCENTED, SCRIPTS, CJK, EMOJI, SPECIAL_CHARS, PUNCT, LATER_UNICODE, TURKISH,
             SPECIAL_TOKENS, COMBINING]
    while len(lines) < count:
        parts = []
        for _ in range(rng.randint(1, 16)):
            pool = rng.choice(pools)
            piece = rng.choice(pool)
            if pool is ACCENTED and rng.random() < 0.5:
                import unicodedata
                piece = unicodedata.normalize("NFD", piece)
            if rng.random() < 0.1:
                piece = piece.upper()
            if rng.random() < 0.05:
                piece = long_word(rng, rng.randint(90, 110))
            parts.append(piece)
        sep = rng.choice([" ", " ", " ", "", "\t", "\u00a0", "  "])
        line = sep.join(parts)
        if rng.random() < 0.03:
            line = (line + " ") * rng.randint(8, 20)
        lines.append(line)
    # One line per '\n': no '\n' inside a line, and no line ending in '\r' (read as a Windows line end).
    lines = [l.replace("\n", " ") for l in lines]
    return [l + "." if l.endswith("\r") else l for l in lines]


def flatten(rows):
    ids = [i for row in rows for i in row]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    return torch.tensor(ids, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int64)


def main():
    from tokenizers import normalizers
    from transformers import AutoTokenizer
    import tokenizers
    import transformers

    corpus = make_corpus()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(corpus) + "\n")
    tok = AutoTokenizer.from_pretrained(MODEL)
    tensors = {}
    rows = [tok(line, truncation=True, max_length=MAX_LENGTH)["input_ids"] for line in corpus]
    tensors["ids"], tensors["offsets"] = flatten(rows)
    for name, options in VARIANTS.items():
        variant = AutoTokenizer.from_pretrained(MODEL)
        variant.backend_tokenizer.normalizer = normalizers.BertNormalizer(**options)
        rows_v = [variant(line, truncation=True, max_length=MAX_LENGTH)["input_ids"] for line in corpus[:VARIANT_LINES]]
        tensors[f"ids_{name}"], tensors[f"offsets_{name}"] = flatten(rows_v)
    save_canonical(tensors, os.path.join(OUT, "ids.safetensors"), {
        "regenerate": "python3 scripts/goldens/make_tokenizer_goldens.py",
        "tokenizer": f"AutoTokenizer(all-MiniLM-L6-v2), truncation=True, max_length={MAX_LENGTH}",
        "versions": f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
        "variants": ", ".join(f"{k}: {v}" for k, v in VARIANTS.items()).replace("None", "null"),
    })
    print(f"wrote {len(corpus)} lines, {int(tensors['ids'].numel())} ids; longest line "
          f"{max(len(r) for r in rows)} ids")


if __name__ == "__main__":
    main()
