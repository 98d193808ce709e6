#!/usr/bin/env python3
"""The PyTorch side of tests/gpu/run.sh: the MLP of tests/gpu/mlp.ini
(784-512-256-10, ReLU, cross-entropy, SGD lr 0.01 momentum 0.9 weight decay
1e-4, batch 128) trained on one fixed batch resident on the GPU, as kiln's
`[data] resident = 1` does, so both sides time the training step alone.
fp32 throughout (TF32 off, as kiln's cuBLASLt GEMMs compute in full fp32).
Prints one JSON line: ms per step (CUDA events over the timed steps)."""
import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch


def load_images(path, n):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    # IDX: magic, count, rows, cols (big-endian u32), then u8 pixels
    return np.frombuffer(raw, dtype=np.uint8, offset=16)[: n * 784].reshape(n, 784)


def load_labels(path, n):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=8)[:n].astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="directory with t10k-*-idx*-ubyte.gz")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False"}))
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda")
    x = load_images(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"), a.batch)
    y = load_labels(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"), a.batch)
    x = ((torch.from_numpy(x.copy()).float() / 255.0 - 0.286) / 0.353).to(dev)
    y = torch.from_numpy(y.copy()).to(dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    # running sums on the device, as kiln keeps its metrics
    loss_sum = torch.zeros((), device=dev)
    correct = torch.zeros((), device=dev)

    def step():
        nonlocal loss_sum, correct
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        loss_sum += loss.detach()
        correct += (out.argmax(1) == y).sum()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(a.steps):
        step()
    t1.record()
    torch.cuda.synchronize()
    ms = t0.elapsed_time(t1) / a.steps
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                      "batch": a.batch, "steps": a.steps, "ms_per_step": round(ms, 4),
                      "samples_per_s": round(a.batch / ms * 1000.0, 1),
                      "final_loss": round(float(loss_sum) / (a.warmup + a.steps), 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
