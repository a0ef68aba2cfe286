#!/usr/bin/env python3
"""`make bench`, sentence embeddings: mha's SentenceEncoder (the encoder `mha embed` runs, through
the Python binding) beside sentence-transformers (PyTorch) and ONNX Runtime, on the same
sentences, the same model (all-MiniLM-L6-v2 from models/), the same thread count, in one run.

Each contender turns a list of str into normalised embeddings, tokenizing included:
  mha       mha.SentenceEncoder(dir).encode(sentences, batch_size)
  mha_bf16  mha.SentenceEncoder(dir, dtype="bfloat16"): the layers in bfloat16 (issue 26)
  torch     sentence_transformers.SentenceTransformer(dir).encode(sentences, batch_size)
  torch_bf16  the same model .to(torch.bfloat16) (PyTorch's bfloat16 CPU kernels, oneDNN's)
  onnxrt    the same model exported by torch.onnx.export (BertModel + mean pooling + L2
            normalisation in the graph), run by onnxruntime's CPU provider with its default
            graph optimisations; tokenized by the model's Hugging Face fast tokenizer with
            sentence-transformers' batching (longest first, padded to the batch's longest)
All three sort by length before batching, so the padding waste is the same. Rounds interleave the
contenders, with a pause of 0.5 s before each (ONNX Runtime's and OpenMP's idle threads spin for a
while after a call, and would otherwise take a core from the next contender); the median over rounds is reported, with ratios mha / peer from the same rounds, and
every peer's embeddings are checked against mha's (cosine), so all do the same work.
Then `mha embed` file to file (process start, model load, tokenizing, encoding, writing).

The sentences are generated (seeded): English-like words, 4–60 words each, so the token counts
vary as in real text. Threads: 2 unless --threads. Writes <build>/bench/embed.json.

    python3 scripts/bench/bench_embed.py [build dir] [--threads N] [--rounds R] [--quick]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "more can out up into do any your what some its time only could new them man about other may "
    "then these first also after like our over such our well made years even must through back "
    "where much before right because just people between long both state world under while house "
    "government business system program question during without number however company group "
    "problem information development national university community research important children "
    "attention transformer embedding sentence similarity language model search query document "
    "retrieval vector semantic meaning computer network training weights inference library speed"
).split()


def make_sentences(count, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = max(4, min(60, int(rng.lognormvariate(2.6, 0.6))))
        words = [rng.choice(WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", "?", "!", "."]))
    return out


def timed(run):
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def cosine_min(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


def onnx_contender(threads, tmpdir):
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModel.from_pretrained(MODEL).eval()

    class Pooled(torch.nn.Module):  # sentence-transformers' Transformer -> Pooling(mean) -> Normalize
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    path = os.path.join(tmpdir, "minilm.onnx")
    ids = torch.ones(2, 16, dtype=torch.long)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 8:] = 0
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", min=2, max=512)}
    torch.onnx.export(Pooled(model).eval(), (ids, mask), path, input_names=["input_ids", "attention_mask"],
                      output_names=["embeddings"], dynamic_shapes=(dims, dims), dynamo=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    max_length = 256  # sentence_bert_config.json's max_seq_length, as sentence-transformers uses

    def encode(sentences, batch_size):
        order = np.argsort([-len(s) for s in sentences], kind="stable")  # sentence-transformers' order
        out = np.empty((len(sentences), 384), dtype=np.float32)
        for start in range(0, len(sentences), batch_size):
            chosen = order[start:start + batch_size]
            batch = tokenizer([sentences[i] for i in chosen], padding=True, truncation=True,
                              max_length=max_length, return_tensors="np")
            out[chosen] = session.run(None, {"input_ids": batch["input_ids"].astype(np.int64),
                                             "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
        return out

    return encode


def main():
    def at_least_1(text):
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
        return int(text)
    parser = argparse.ArgumentParser()
    parser.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    parser.add_argument("--threads", type=at_least_1, default=2)
    parser.add_argument("--rounds", type=at_least_1, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer sentences, and 2 rounds whatever --rounds says")
    args = parser.parse_args()
    if not os.path.isdir(MODEL):
        sys.exit(f"bench_embed: {MODEL} is missing: run `make model`")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import mha
    mha.set_num_threads(args.threads)
    encoder = mha.SentenceEncoder(MODEL)
    contenders = {"mha": encoder.encode, "mha_bf16": mha.SentenceEncoder(MODEL, dtype="bfloat16").encode}
    skipped = {}
    try:
        import torch
        torch.set_num_threads(args.threads)
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(MODEL, device="cpu")
        contenders["torch"] = lambda s, b: st.encode(s, batch_size=b, convert_to_numpy=True)
        st16 = SentenceTransformer(MODEL, device="cpu").to(torch.bfloat16)
        contenders["torch_bf16"] = lambda s, b: st16.encode(s, batch_size=b, convert_to_tensor=True).float().numpy()
    except ImportError as e:
        skipped["torch"] = f"not installed ({e.name}): pip install torch sentence-transformers"
    tmpdir = tempfile.mkdtemp(prefix="mha_bench_embed_")  # the ONNX model (88 MB) and the CLI's files
    try:
        run_cases(args, encoder, contenders, skipped, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def run_cases(args, encoder, contenders, skipped, tmpdir):
    try:
        contenders["onnxrt"] = onnx_contender(args.threads, tmpdir)
    except ImportError as e:
        skipped["onnxrt"] = f"not installed ({e.name}): pip install onnxruntime onnxscript transformers torch"

    rounds = 2 if args.quick else args.rounds
    cases = [(32, 128 if args.quick else 512), (1, 32 if args.quick else 128)]  # (batch size, sentences)
    report = {"threads": args.threads, "rounds": rounds, "skipped": skipped, "cases": {}}
    print(f"sentence embeddings, all-MiniLM-L6-v2, {args.threads} threads, median of {rounds} rounds "
          f"(sentences/s; ratio = mha / peer, same rounds)")
    for batch_size, count in cases:
        sentences = make_sentences(count, seed=batch_size)
        reference = encoder.encode(sentences, batch_size)
        times = {name: [] for name in contenders}
        agreement = {}
        for name, encode in contenders.items():  # warm-up, and the check that all do the same work
            agreement[name] = cosine_min(np.asarray(encode(sentences, batch_size)), reference)
        for _ in range(rounds):
            for name, encode in contenders.items():
                time.sleep(0.5)  # the previous contender's idle threads (ORT's, OpenMP's) stop spinning
                times[name].append(timed(lambda: encode(sentences, batch_size))[0])
        rate = {name: count / statistics.median(t) for name, t in times.items()}
        case = {"sentences": count, "sentences_per_s": rate, "min_cosine_vs_mha": agreement}
        # (mha, peer): float32 against the float32 peers, bfloat16 against all (issue 26's bars:
        # at least 1.7× torch float32 and 1.3× torch bfloat16).
        for ours, peer in (("mha", "torch"), ("mha", "onnxrt"), ("mha_bf16", "torch"), ("mha_bf16", "torch_bf16"),
                           ("mha_bf16", "onnxrt")):
            if peer in times:
                ratios = [b / a for a, b in zip(times[ours], times[peer])]
                case[f"ratio_{ours}_vs_{peer}"] = statistics.median(ratios)
        report["cases"][f"batch{batch_size}"] = case
        line = "  ".join(f"{n} {r:7.1f}" for n, r in rate.items())
        ratio = "  ".join(f"{k[6:].replace('_vs_', ' / ')} ×{case[k]:.2f}" for k in case if k.startswith("ratio_"))
        print(f"  batch {batch_size:2d} ({count} sentences): {line}")
        print(f"           {ratio}")
        print(f"           min cosine vs mha: " + "  ".join(f"{n} {c:.7f}" for n, c in agreement.items()))
    for name, why in skipped.items():
        print(f"  {name}: skipped, {why}")

    cli = os.path.join(args.build, "tools", "mha", "mha")
    if os.path.exists(cli):
        sentences = make_sentences(512, seed=32)
        src = os.path.join(tmpdir, "sentences.txt")
        with open(src, "w") as f:
            f.write("\n".join(sentences) + "\n")
        run = lambda: subprocess.run([cli, "embed", "--model", MODEL, "--input", src, "--output",
                                      os.path.join(tmpdir, "out.safetensors"), "--batch-size", "32"], check=True)
        run()
        seconds = statistics.median(timed(run)[0] for _ in range(rounds))
        report["cli_file_to_file"] = {"sentences": 512, "seconds": seconds, "sentences_per_s": 512 / seconds}
        print(f"  mha embed file to file (512 sentences, batch 32, process start and model load included): "
              f"{seconds * 1e3:.0f} ms, {512 / seconds:.1f} sentences/s")

    out_dir = os.path.join(args.build, "bench")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "embed.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out_dir, "embed.json.tmp"), os.path.join(out_dir, "embed.json"))


if __name__ == "__main__":
    main()
