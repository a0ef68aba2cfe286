#!/usr/bin/env python3
"""PyTorch goldens for the training pieces: cross-entropy, AdamW and the learning-rate schedule.

    python3 scripts/goldens/make_training_goldens.py             # writes tests/goldens/training/*.safetensors
    python3 scripts/goldens/make_training_goldens.py --out DIR

cross_entropy.safetensors  cases "<case>.<tensor>": logits (F64, drawn in float32), targets (I64),
                           loss (F64, shape []), grad_logits (F64) from
                           F.cross_entropy(logits, targets) in float64; torch_f32.loss and
                           torch_f32.grad_logits the same in float32 (F32).
adamw.safetensors          torch.optim.AdamW(foreach=False) on two float32 parameters "a" (5, 3)
                           and "b" (4) for `steps` steps with the learning rate changed before
                           every step: initial.<p>, lr (F64, one per step), grad.<k>.<p>,
                           after.<k>.<p> (parameters after step k), final exp_avg.<p>,
                           exp_avg_sq.<p>. Metadata: weight_decay, betas, eps, steps.
schedule.safetensors       "<case>.lr" (F64): the rate of every update from PyTorch's schedulers
                           SequentialLR([LinearLR(1/W, 1, W-1), CosineAnnealingLR(T-W, min)],
                           [W]) (or CosineAnnealingLR alone when W = 0), as the lr in the optimizer
                           when each step is taken. Metadata "<case>.{base_lr,min_lr,warmup,total}".

Deterministic (fixed seeds, single thread, sorted metadata): a re-run gives identical files.
"""
from __future__ import annotations

import argparse
import os
import warnings

import torch
import torch.nn.functional as F
from canonical_writer import save_canonical

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "goldens", "training")
# The command the committed files record (the script's earlier place; tests/goldens/README.md).
REGENERATE = "python3 scripts/make_training_goldens.py"


def cross_entropy(out: str) -> None:
    g = torch.Generator().manual_seed(11)
    cases = {
        "small": (torch.randn(7, 10, generator=g), torch.randint(0, 10, (7,), generator=g)),
        "batch1": (torch.randn(1, 3, generator=g), torch.tensor([2])),
        # Logits in the thousands: exp overflows unless the maximum is subtracted first.
        "large": (torch.randn(5, 10, generator=g) * 1000.0, torch.randint(0, 10, (5,), generator=g)),
        "peaked": (torch.randn(6, 4, generator=g) * 40.0, torch.randint(0, 4, (6,), generator=g)),
    }
    tensors, names = {}, []
    for name, (logits32, targets) in cases.items():
        logits32 = logits32.to(torch.float32)
        names.append(name)
        for dtype, prefix in ((torch.float64, ""), (torch.float32, "torch_f32.")):
            x = logits32.to(dtype).clone().requires_grad_(True)
            loss = F.cross_entropy(x, targets)
            loss.backward()
            tensors[f"{name}.{prefix}loss"] = loss.detach().reshape(())
            tensors[f"{name}.{prefix}grad_logits"] = x.grad.detach()
        tensors[f"{name}.logits"] = logits32.to(torch.float64)
        tensors[f"{name}.targets"] = targets.to(torch.int64)
    save_canonical(tensors, os.path.join(out, "cross_entropy.safetensors"),
                   {"cases": ",".join(names), "regenerate": REGENERATE, "torch_version": torch.__version__})


def adamw(out: str) -> None:
    g = torch.Generator().manual_seed(12)
    params = {"a": torch.randn(5, 3, generator=g), "b": torch.randn(4, generator=g)}
    tensors = {f"initial.{k}": v.clone() for k, v in params.items()}
    leaves = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    weight_decay, betas, eps, steps = 0.05, (0.9, 0.999), 1e-8, 6
    opt = torch.optim.AdamW(list(leaves.values()), lr=1e-3, betas=betas, eps=eps, weight_decay=weight_decay,
                            foreach=False)
    lrs = [1e-3, 3e-3, 1e-2, 5e-3, 0.0, 2e-3]
    for k in range(steps):
        for name, p in leaves.items():
            grad = torch.randn(p.shape, generator=g) * (0.1 if k % 2 else 3.0)
            if name == "a":
                grad[0, 0] = 0.0  # a parameter whose gradient is exactly zero: eps sets the step
            p.grad = grad
            tensors[f"grad.{k}.{name}"] = grad.clone()
        for group in opt.param_groups:
            group["lr"] = lrs[k]
        opt.step()
        for name, p in leaves.items():
            tensors[f"after.{k}.{name}"] = p.detach().clone()
    for name, p in leaves.items():
        state = opt.state[p]
        tensors[f"exp_avg.{name}"] = state["exp_avg"].clone()
        tensors[f"exp_avg_sq.{name}"] = state["exp_avg_sq"].clone()
    tensors["lr"] = torch.tensor(lrs, dtype=torch.float64)
    save_canonical(tensors, os.path.join(out, "adamw.safetensors"),
                   {"weight_decay": repr(weight_decay), "beta1": repr(betas[0]), "beta2": repr(betas[1]),
                    "eps": repr(eps), "steps": str(steps), "regenerate": REGENERATE,
                    "torch_version": torch.__version__})


def schedule(out: str) -> None:
    cases = {"warmup": (1e-3, 1e-5, 5, 30), "no_warmup": (2e-3, 0.0, 0, 20), "one_warmup": (1e-3, 1e-4, 1, 12)}
    tensors, meta = {}, {"cases": ",".join(cases), "regenerate": REGENERATE, "torch_version": torch.__version__}
    for name, (base, floor, warmup, total) in cases.items():
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=floor)
        if warmup > 1:
            linear = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0,
                                                       total_iters=warmup - 1)
            sched = torch.optim.lr_scheduler.SequentialLR(opt, [linear, cosine], milestones=[warmup])
        elif warmup == 1:
            linear = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
            sched = torch.optim.lr_scheduler.SequentialLR(opt, [linear, cosine], milestones=[1])
        else:
            sched = cosine
        lrs = []
        for _ in range(total):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SequentialLR's deprecation chatter
                sched.step()
        tensors[f"{name}.lr"] = torch.tensor(lrs, dtype=torch.float64)
        meta.update({f"{name}.base_lr": repr(base), f"{name}.min_lr": repr(floor), f"{name}.warmup": str(warmup),
                     f"{name}.total": str(total)})
    save_canonical(tensors, os.path.join(out, "schedule.safetensors"), meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    cross_entropy(args.out)
    adamw(args.out)
    schedule(args.out)
    print(f"wrote cross_entropy, adamw and schedule goldens to {args.out}")


if __name__ == "__main__":
    main()
