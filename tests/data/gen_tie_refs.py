#!/usr/bin/python3
"""Generate tests/data/tie_refs.safetensors: a PyTorch reference for kiln's
weight tying ([layer.X] tie = Y, core/tie.c).

Model: 12 -> a (Linear, 7) -> ReLU -> c (Linear, 12) -> ReLU
          -> b (Linear, 7, b.weight IS a.weight: one shared nn.Parameter)
          -> nn.CrossEntropyLoss (mean)
a.weight and b.weight are one tensor [7, 12]: its gradient is the sum of
both uses', the optimizer updates it once (model.parameters() yields it
once), and weight decay applies to it once.

Cases (metadata `cases`), each from the same initial weights on the same
4 batches of 8:
  sgd    torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
  adamw  torch.optim.AdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-8,
         weight_decay=0.1), the biases in a group with weight_decay=0
         (kiln's [train] no_decay = *.bias)

Tensors: init.<p> for p in a.weight, a.bias, c.weight, c.bias, b.bias (the
tied tensor is stored once, as a.weight); x{k} f32 [8, 12], y{k} i32 [8];
<case>.loss{k} f32 [1] (before step k's update); <case>.grad{k}.<p> (the
loss's gradient, the tied one summed over both uses); <case>.final.<p>
after the 4 steps.

Deterministic: seed 0, one thread, float32, no network, no dataset.

Usage: /usr/bin/python3 tests/data/gen_tie_refs.py tests/data/tie_refs.safetensors
"""
import sys

import numpy as np
import torch
import torch.nn as nn

from safetensors_io import read_safetensors, write_safetensors

K, N, BATCH, STEPS = 12, 7, 8, 4
PARAMS = ("a.weight", "a.bias", "c.weight", "c.bias", "b.bias")


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(K, N)
        self.c = nn.Linear(N, K)
        self.b = nn.Linear(K, N)
        self.b.weight = self.a.weight  # the tie: one nn.Parameter

    def forward(self, x):
        return self.b(torch.relu(self.c(torch.relu(self.a(x)))))


def as_array(t, dtype):
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(dtype))


def optimizer(case, model):
    if case == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    named = dict(model.named_parameters())  # the shared tensor once, as a.weight
    decay = [p for n, p in named.items() if not n.endswith(".bias")]
    no_decay = [p for n, p in named.items() if n.endswith(".bias")]
    return torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def main(out_path):
    torch.manual_seed(0)
    torch.set_num_threads(1)

    init = Tied()
    assert sorted(n for n, _ in init.named_parameters()) == sorted(PARAMS)
    tensors = [("init." + p, as_array(init.state_dict()[p], np.float32)) for p in PARAMS]
    xs = [torch.randn(BATCH, K) for _ in range(STEPS)]
    ys = [torch.randint(0, N, (BATCH,)) for _ in range(STEPS)]
    for k in range(STEPS):
        tensors.append(("x%d" % k, as_array(xs[k], np.float32)))
        tensors.append(("y%d" % k, as_array(ys[k], np.int32)))

    loss_fn = nn.CrossEntropyLoss()
    cases = ("sgd", "adamw")
    for case in cases:
        model = Tied()
        model.load_state_dict(init.state_dict())
        assert model.b.weight is model.a.weight
        named = dict(model.named_parameters())
        opt = optimizer(case, model)
        for k in range(STEPS):
            opt.zero_grad()
            loss = loss_fn(model(xs[k]), ys[k])
            loss.backward()
            tensors.append(("%s.loss%d" % (case, k), np.array([loss.item()], dtype=np.float32)))
            for p in PARAMS:
                tensors.append(("%s.grad%d.%s" % (case, k, p), as_array(named[p].grad, np.float32)))
            opt.step()
        for p in PARAMS:
            tensors.append(("%s.final.%s" % (case, p), as_array(named[p], np.float32)))

    metadata = {"generator": "tests/data/gen_tie_refs.py", "torch": torch.__version__,
                "cases": ",".join(cases), "steps": str(STEPS)}
    write_safetensors(out_path, tensors, metadata)

    back, meta = read_safetensors(out_path)
    assert meta == metadata, meta
    for name, arr in tensors:
        assert np.array_equal(back[name], arr), name
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: %s OUT.safetensors" % sys.argv[0])
    sys.exit(main(sys.argv[1]))
