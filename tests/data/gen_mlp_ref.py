#!/usr/bin/python3
"""Generate tests/data/mlp_ref.safetensors: a PyTorch reference for kiln's MLP.

Model: 784 -> fc1(32) -> ReLU -> fc2(10), nn.CrossEntropyLoss (mean).
Three SGD steps (lr 0.1, momentum 0.9, weight_decay 1e-4, no Nesterov) on a
batch of 8 synthetic inputs.  Stores the initial weights, the inputs and
labels, the loss, the number of correct argmax predictions and every
parameter gradient for each step, and the final weights.

The safetensors file is written by hand (no safetensors package needed).
Deterministic: seed 0, one thread, no network, no dataset.

Usage: /usr/bin/python3 tests/data/gen_mlp_ref.py tests/data/mlp_ref.safetensors
"""
import sys

import numpy as np
import torch
import torch.nn as nn

from safetensors_io import read_safetensors, write_safetensors

LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4
BATCH = 8
STEPS = 3
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def as_array(t, dtype):
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(dtype))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: %s OUT.safetensors\n" % sys.argv[0])
        return 2
    out_path = sys.argv[1]

    torch.manual_seed(0)
    torch.set_num_threads(1)

    model = MLP()
    tensors = []
    for p in PARAMS:
        tensors.append(("init." + p, as_array(model.state_dict()[p], np.float32)))

    xs, ys = [], []
    for k in range(STEPS):
        xs.append(torch.randn(BATCH, 784, dtype=torch.float32))
        ys.append(torch.randint(0, 10, (BATCH,)))

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY, nesterov=False)
    loss_fn = nn.CrossEntropyLoss()
    named = dict(model.named_parameters())

    for k in range(STEPS):
        opt.zero_grad()
        logits = model(xs[k])
        loss = loss_fn(logits, ys[k])
        loss.backward()
        correct = (logits.argmax(dim=1) == ys[k]).sum().item()
        tensors.append(("x%d" % k, as_array(xs[k], np.float32)))
        tensors.append(("y%d" % k, as_array(ys[k], np.int32)))
        tensors.append(("loss%d" % k, np.array([loss.item()], dtype=np.float32)))
        tensors.append(("correct%d" % k, np.array([correct], dtype=np.float32)))
        for p in PARAMS:
            tensors.append(("grad%d.%s" % (k, p), as_array(named[p].grad, np.float32)))
        opt.step()

    for p in PARAMS:
        tensors.append(("final." + p, as_array(named[p], np.float32)))

    metadata = {
        "generator": "tests/data/gen_mlp_ref.py",
        "torch": torch.__version__,
        "lr": "0.1",
        "momentum": "0.9",
        "weight_decay": "0.0001",
    }
    write_safetensors(out_path, tensors, metadata)

    # Self-check: every tensor round-trips bit-exactly.
    back, meta = read_safetensors(out_path)
    assert meta == metadata, meta
    assert set(back) == {n for n, _ in tensors}
    for name, arr in tensors:
        got = back[name]
        assert got.shape == arr.shape and got.dtype.kind == arr.dtype.kind, name
        assert np.array_equal(got, arr), name
    return 0


if __name__ == "__main__":
    sys.exit(main())
