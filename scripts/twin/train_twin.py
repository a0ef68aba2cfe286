#!/usr/bin/env python3
"""The PyTorch twin of `mha train`: the same attention classifier, data, batches and optimizer.

    python3 scripts/twin/train_twin.py golden [--out FILE] [model flags]   # the committed loss golden
    python3 scripts/twin/train_twin.py train  [model and training flags]   # a whole run, in PyTorch
    python3 scripts/twin/train_twin.py bench  --steps N [flags]            # samples/s of N steps

The model is built from torch.nn layers with the parameter names mha uses
(input_projection.*, positions, blocks.<i>.norm.*, blocks.<i>.attention.* (nn.MultiheadAttention,
batch_first), norm.*, fc1.*, fc2.*). Images are read from the same IDX files (Debian's
dataset-fashion-mnist) and scaled the same way (uint8 / 255 in float32); each image is 28 tokens
of 28 pixels. Loss: F.cross_entropy; optimizer: torch.optim.AdamW(foreach=False) with the
learning rate set before every step from mha's warm-up + cosine formula (its agreement with
PyTorch's own schedulers is tests/goldens/training/schedule.safetensors).

golden: runs the mha binary (--mha, default build/tools/mha/mha) once to write its initial
weights (--save-initial) and batch order (--dump-batch-order), loads both, trains --steps steps
(default 50) with dropout off, and writes tests/goldens/training/twin_<name>.safetensors:
    model.<parameter>   the initial weights (F32)
    order               the training images of the first --steps batches, in order (I64)
    losses              PyTorch's loss of every step (F64; computed in float32)
    lr                  the learning rate of every step (F64)
    metadata            config (mha's TrainingConfig JSON), mha_flags, steps, regenerate, torch_version
tests/training/twin_golden_test.cpp trains mha from the same weights on the same batches and
requires every loss to agree within 1e-4 relative.

train / bench build the model from PyTorch's own initialisation (seeded by --seed) and shuffle
with torch.randperm; bench prints "twin: N samples in S s: R samples/s" for scripts/bench/bench_training.py.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = "/usr/share/datasets/fashion-mnist"


# ---- data ---------------------------------------------------------------------------------

def read_idx(path: str, magic: int) -> np.ndarray:
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    got = int.from_bytes(blob[:4], "big")
    if got != magic:
        raise SystemExit(f"{path}: expected IDX magic {magic:#010x}, got {got:#010x}")
    dims = [int.from_bytes(blob[4 + 4 * i: 8 + 4 * i], "big") for i in range(magic & 0xFF)]
    data = np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * len(dims))
    if data.size != int(np.prod(dims)):
        raise SystemExit(f"{path}: expected {int(np.prod(dims))} bytes of data, got {data.size}")
    return data.reshape(dims)


def load_split(data_dir: str, prefix: str):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 0x801)
    # As mha: uint8 -> float32, divided by 255 in float32.
    return torch.from_numpy(images.copy()).float() / 255.0, torch.from_numpy(labels.astype(np.int64))


# ---- model --------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width: int, heads: int, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(width) if pre_norm else None
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x):
        a = self.norm(x) if self.norm is not None else x
        return x + self.attention(a, a, a, need_weights=False)[0]


class AttentionClassifier(nn.Module):
    """Tutorial 002's classifier with mha's options (mha/models/attention_classifier.h)."""

    def __init__(self, c: dict):
        super().__init__()
        L, E = c["sequence_length"], c["embed_dim"]
        self.input_projection = nn.Linear(c["input_dim"], E) if c["input_projection"] else None
        self.positions = nn.Parameter(torch.randn(1, L, E) * 0.02) if c["learned_positions"] else None
        self.blocks = nn.ModuleList([Block(E, c["num_heads"], c["pre_norm"]) for _ in range(c["num_blocks"])])
        self.norm = nn.LayerNorm(E) if c["pre_norm"] else None
        self.fc1 = nn.Linear(E, c["hidden_dim"])
        self.dropout = nn.Dropout(c["dropout"])
        self.fc2 = nn.Linear(c["hidden_dim"], c["num_classes"])

    def forward(self, x):
        if self.input_projection is not None:
            x = self.input_projection(x)
        if self.positions is not None:
            x = x + self.positions
        for block in self.blocks:
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.fc2(self.dropout(F.relu(self.fc1(x.mean(dim=1)))))


def lr_at(step: int, base: float, floor: float, warmup: int, total: int) -> float:
    """mha::optim::WarmupCosineSchedule::lr_at."""
    if step < warmup:
        return base * (step + 1) / warmup
    decay = total - warmup
    progress = min(step - warmup, decay) / decay
    return floor + (base - floor) * (1.0 + math.cos(math.pi * progress)) / 2.0


# ---- flags shared with mha train ------------------------------------------------------------

def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=int, default=28)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--input-projection", action="store_true")
    p.add_argument("--positions", action="store_true")
    p.add_argument("--pre-norm", action="store_true")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: PyTorch's own choice)")


def model_config(a) -> dict:
    return {"sequence_length": 28, "input_dim": 28, "embed_dim": a.width, "num_heads": a.heads,
            "hidden_dim": a.hidden, "num_classes": 10, "num_blocks": a.blocks,
            "input_projection": a.input_projection, "learned_positions": a.positions, "pre_norm": a.pre_norm,
            "dropout": a.dropout}


def mha_flags(a) -> list:
    flags = ["--width", a.width, "--heads", a.heads, "--hidden", a.hidden, "--blocks", a.blocks,
             "--dropout", a.dropout, "--epochs", a.epochs, "--batch-size", a.batch_size, "--lr", a.lr,
             "--min-lr", a.min_lr, "--warmup-steps", a.warmup_steps, "--weight-decay", a.weight_decay,
             "--seed", a.seed, "--train-limit", a.train_limit, "--test-limit", a.test_limit]
    flags += ["--input-projection"] if a.input_projection else []
    flags += ["--positions"] if a.positions else []
    flags += ["--pre-norm"] if a.pre_norm else []
    return [str(f) for f in flags]


def make_optimizer(model, a):
    return torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay, foreach=False)


# ---- commands -----------------------------------------------------------------------------

def golden(a) -> None:
    from safetensors.torch import load_file
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts", "goldens"))
    from canonical_writer import save_canonical

    a.dropout = 0.0
    flags = mha_flags(a)
    with tempfile.TemporaryDirectory() as tmp:
        initial, order_file = os.path.join(tmp, "initial.safetensors"), os.path.join(tmp, "order.safetensors")
        cmd = [a.mha, "train", *flags, "--data-dir", a.data_dir, "--max-steps", "1",
               "--save-initial", initial, "--dump-batch-order", order_file]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        weights = load_file(initial)
        orders = load_file(order_file)
        with open(order_file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            config = json.loads(json.loads(f.read(n))["__metadata__"]["config"])

    train_x, train_y = load_split(a.data_dir, "train")
    if a.train_limit:
        train_x, train_y = train_x[:a.train_limit], train_y[:a.train_limit]
    model = AttentionClassifier(model_config(a))
    model.load_state_dict(weights, strict=True)
    opt = make_optimizer(model, a)
    steps_per_epoch = math.ceil(len(train_x) / a.batch_size)
    total = a.epochs * steps_per_epoch
    losses, lrs, used = [], [], []
    model.train()
    for step in range(a.steps):
        epoch, b = divmod(step, steps_per_epoch)
        idx = orders[f"epoch_{epoch}"][b * a.batch_size:(b + 1) * a.batch_size]
        used.append(idx)
        lr = lr_at(step, a.lr, a.min_lr, a.warmup_steps, total)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        lrs.append(lr)
    tensors = {f"model.{k}": v for k, v in weights.items()}
    tensors["order"] = torch.cat(used).to(torch.int64)
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["lr"] = torch.tensor(lrs, dtype=torch.float64)
    out = a.out or os.path.join(REPO_ROOT, "tests", "goldens", "training", f"twin_{a.name}.safetensors")
    # The command as the committed goldens record it: the script's earlier place (tests/goldens/README.md).
    regenerate = "python3 scripts/train_twin.py golden --name " + a.name + " " + " ".join(
        shlex.quote(f) for f in flags)
    save_canonical(tensors, out, {"config": json.dumps(config, sort_keys=True), "mha_flags": " ".join(flags),
                                  "steps": str(a.steps), "regenerate": regenerate,
                                  "torch_version": torch.__version__})
    print(f"{out}: {a.steps} losses, first {losses[0]:.6f}, last {losses[-1]:.6f}")


def train_or_bench(a, bench: bool) -> None:
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    train_x, train_y = load_split(a.data_dir, "train")
    test_x, test_y = load_split(a.data_dir, "t10k")
    if a.train_limit:
        train_x, train_y = train_x[:a.train_limit], train_y[:a.train_limit]
    if a.test_limit:
        test_x, test_y = test_x[:a.test_limit], test_y[:a.test_limit]
    model = AttentionClassifier(model_config(a))
    opt = make_optimizer(model, a)
    steps_per_epoch = math.ceil(len(train_x) / a.batch_size)
    total = a.epochs * steps_per_epoch
    step = 0
    start_all = time.perf_counter()
    print(f"twin: {sum(p.numel() for p in model.parameters())} parameters, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(len(train_x))
        seen, loss_sum, correct = 0, 0.0, 0
        start = time.perf_counter()
        for b in range(steps_per_epoch):
            if bench and step >= a.steps:
                break
            idx = order[b * a.batch_size:(b + 1) * a.batch_size]
            x, y = train_x[idx], train_y[idx]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, a.lr, a.min_lr, a.warmup_steps, total)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            seen += len(idx)
            loss_sum += loss.item() * len(idx)
            correct += int((logits.argmax(1) == y).sum())
        seconds = time.perf_counter() - start
        if bench:
            print(f"twin: {seen} samples in {seconds:.3f} s: {seen / seconds:.1f} samples/s")
            return
        model.eval()
        with torch.no_grad():
            test_logits = torch.cat([model(test_x[i:i + 1000]) for i in range(0, len(test_x), 1000)])
            test_loss = F.cross_entropy(test_logits, test_y).item()
            test_acc = (test_logits.argmax(1) == test_y).float().mean().item()
        print(f"epoch {epoch + 1}/{a.epochs}: train loss {loss_sum / seen:.4f} acc {100 * correct / seen:.2f}% | "
              f"test loss {test_loss:.4f} acc {100 * test_acc:.2f}% | {seconds:.1f} s, {seen / seconds:.0f} samples/s",
              flush=True)
    print(f"done in {time.perf_counter() - start_all:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("golden", help="write the loss golden for tests/training")
    add_config_flags(g)
    g.add_argument("--name", default="default", help="golden file: twin_<name>.safetensors")
    g.add_argument("--steps", type=int, default=50)
    g.add_argument("--out", default="")
    g.add_argument("--mha", default=os.path.join(REPO_ROOT, "build", "tools", "mha", "mha"))
    t = sub.add_parser("train", help="a whole run in PyTorch")
    add_config_flags(t)
    b = sub.add_parser("bench", help="time --steps training steps")
    add_config_flags(b)
    b.add_argument("--steps", type=int, default=200)
    a = parser.parse_args()
    if a.command == "golden":
        torch.set_num_threads(1)
        golden(a)
    else:
        train_or_bench(a, a.command == "bench")


if __name__ == "__main__":
    main()
