#!/usr/bin/python3
"""PyTorch side of the kiln vs PyTorch MLP benchmark on Fashion-MNIST.

Model 784-512-ReLU-256-ReLU-10 (fc1, fc2, fc3), SGD with momentum, mean
cross-entropy. The whole dataset is preloaded as one float32 tensor (x/255),
with no DataLoader. Each epoch is shuffled with torch.randperm. The first
--warmup-steps steps are not timed. Prints a single JSON line on stdout.

Run with Debian's PyTorch: /usr/bin/python3 bench/pytorch_mlp.py [options];
with PyTorch 2.x also --mode compile, compile-max or lightning (torch_modes.py).
--flush-denormal: torch.set_flush_denormal(True) (x86 FTZ+DAZ on the threads
PyTorch computes on): the momentum of dead ReLU units decays into the f32
subnormal range after ~800 steps, where every operation takes a microcode
assist, so from the third epoch on PyTorch at its best sets it (kiln stores
optimizer state below FLT_MIN as zero, docs/training.md).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

from fmnist import DEFAULT_DATA, loaded_blas, read_split, train_loop
from torch_modes import add_mode_arg, compile_seconds, compiled, lightning_fit, mode_fields



def load_split(data_dir, prefix):
    x, y = read_split(data_dir, prefix)
    x = torch.from_numpy(x.reshape(x.shape[0], -1).astype(np.float32) / 255.0)
    y = torch.from_numpy(y.astype(np.int64))
    return x.contiguous(), y


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=0,
                    help="total training steps incl. warmup; 0 = --epochs full epochs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', bfloat16), "
                         "f32 master weights (PyTorch's CPU mixed precision)")
    ap.add_argument("--flush-denormal", action="store_true",
                    help="torch.set_flush_denormal(True): subnormals read and written as zero")
    ap.add_argument("--data", default=DEFAULT_DATA)
    add_mode_arg(ap)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # False where the CPU has no FTZ/DAZ (the run is then PyTorch's IEEE one)
    flush = torch.set_flush_denormal(True) if args.flush_denormal else False

    x_train, y_train = load_split(args.data, "train")
    x_test, y_test = load_split(args.data, "t10k")
    n = x_train.shape[0]
    steps_per_epoch = n // args.batch  # drop the last partial batch
    total_steps = args.steps if args.steps > 0 else steps_per_epoch * args.epochs
    if total_steps <= args.warmup_steps:
        sys.exit("need more steps (%d) than warmup steps (%d)"
                 % (total_steps, args.warmup_steps))

    model = MLP()
    def make_opt(m):
        return torch.optim.SGD(m.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    model.train()

    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    extra = {}
    if args.mode == "lightning":  # every step of the whole fit counts
        timed_samples, elapsed, last_loss, ver = lightning_fit(
            model, make_opt, loss_fn, x_train, y_train, args.batch, total_steps,
            args.precision, seed=args.seed)
        extra["lightning"] = ver
    else:
        stats = {}
        timed_samples, elapsed, last_loss = train_loop(
            compiled(model, args.mode), make_opt(model), loss_fn, x_train, y_train,
            args.batch, total_steps, args.warmup_steps, amp, stats=stats)
        extra["compile_s"] = compile_seconds(stats["warmup_s"], args.warmup_steps, elapsed,
                                             total_steps - args.warmup_steps)
        extra["epoch_samples_per_s"] = stats["epoch_samples_per_s"]

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x_test.shape[0], 1000):
            with amp():
                pred = model(x_test[i:i + 1000]).argmax(dim=1)
            correct += (pred == y_test[i:i + 1000]).sum().item()
    test_acc = correct / x_test.shape[0]

    out = {
        "impl": "pytorch",
        "precision": args.precision,
        "train_samples_per_s": timed_samples / elapsed,
        "threads": args.threads,
        "batch": args.batch,
        "steps": total_steps,
        "timed_steps": timed_samples // args.batch,
        "train_s": elapsed,
        "final_loss": last_loss,
        "flush_denormal": flush,
        "env": {k: os.environ.get(k) for k in
                ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE")},
        "blas": loaded_blas(),
        "test_acc": test_acc,
    }
    out.update(mode_fields(args.mode, extra=extra))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
