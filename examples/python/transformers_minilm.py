#!/usr/bin/env python3
"""all-MiniLM-L6-v2 through Hugging Face transformers with attn_implementation="mha", beside
transformers' own "sdpa" (a stop of `make demo`): the same model files, the same tokenizer, one
line changed. Prints the ranking of a few sentences against a query from both, how far their
embeddings are apart, and the time of each.

Checks itself (exit 1 on a mismatch): the float32 embeddings of the two agree to cosine 0.99999,
and the bfloat16 ones to cosine 0.999.
"""
import pathlib
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModel, AutoTokenizer

import mha.transformers  # noqa: F401  (registers attn_implementation="mha")

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "all-MiniLM-L6-v2"
QUERY = "How do I keep my laptop battery healthy?"
SENTENCES = [
    "Avoid leaving a lithium-ion battery at 100% charge for days on end.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Heat is the main enemy of a notebook's battery life.",
    "The museum opens at nine on weekdays.",
    "Calibrating the charge indicator once a month is no longer necessary.",
    "Our team won the match in the final minute.",
]


def embed(model, batch):
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state.float()
    weights = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1)


def main():
    if not (MODEL / "model.safetensors").exists():
        sys.exit(f"{MODEL} is missing: run `make model`")
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    batch = tokenizer([QUERY] + SENTENCES, padding=True, return_tensors="pt")
    print(f"{len(SENTENCES) + 1} sentences, padded to {batch['input_ids'].shape[1]} tokens, 2 threads")
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        for implementation in ("sdpa", "mha"):
            model = AutoModel.from_pretrained(MODEL, attn_implementation=implementation, dtype=dtype).eval()
            embeddings = embed(model, batch)
            times = []
            for _ in range(7):
                start = time.perf_counter()
                embed(model, batch)
                times.append(time.perf_counter() - start)
            results[dtype, implementation] = embeddings
            scores = embeddings[1:] @ embeddings[0]
            best = int(scores.argmax())
            print(f"  {str(dtype)[6:]:8} attn_implementation={implementation!r:7} {statistics.median(times) * 1e3:6.1f} ms"
                  f"   best match {scores[best]:.4f}: {SENTENCES[best]!r}")
    failed = False
    for dtype, bound in ((torch.float32, 0.99999), (torch.bfloat16, 0.999)):
        cosine = float((results[dtype, "mha"] * results[dtype, "sdpa"]).sum(1).min())
        ok = cosine >= bound
        failed |= not ok
        print(f"  {str(dtype)[6:]}: smallest cosine between mha's and sdpa's embeddings {cosine:.7f} "
              f"({'ok' if ok else 'MISMATCH'}, >= {bound})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
