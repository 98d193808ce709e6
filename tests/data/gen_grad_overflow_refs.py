#!/usr/bin/python3
"""Generate tests/data/grad_overflow_refs.safetensors: PyTorch's step on
finite gradients whose squares overflow f32 (tests/grad_overflow.sh).

Model: 2 inputs -> fc1(2) -> fc2(3) (no activation), nn.CrossEntropyLoss
(mean), a batch of 2: inputs (1, 0) and (0, 1) (u8 255 and 0 / 255),
labels 1 and 2.  fc2.weight is of the order of 5e19, so every logit is
about 1e19, the softmax saturates, and fc1's gradients reach 4e19:
finite, but their squares (and the sum of squares) overflow f32, and
PyTorch's norm, taken in f32, is inf, while the true L2 norm (about
4.7e19) is far below FLT_MAX.  One SGD step (no momentum) three ways:

  plain:  lr 4e-21, the step on the raw gradients (no non-finite
          element: GradScaler's found_inf would be 0);
  norm:   lr 4e-21, clip_grad_norm_(max_norm = 1): the f32 norm is inf,
          the clip coefficient 1 / (inf + 1e-6) = 0, the gradients
          become 0 (torch 1.13 and 2.x alike) and the step is taken;
  value:  lr 0.1, clip_grad_value_(1): each gradient clamped to [-1, 1].

Stores init.<param> (the initial weights), images (u8 [2, 1, 2]),
labels (u8 [2]), <case>.<param> (the weights after the step), the loss,
the gradients (grad.<param>), PyTorch's norm (torch_norm: inf) and the
true norm in double (true_norm).

Usage: /usr/bin/python3 tests/data/gen_grad_overflow_refs.py tests/data/grad_overflow_refs.safetensors
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

from safetensors_io import read_safetensors, write_safetensors

PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
INIT = {
    "fc1.weight": [[0.5, -0.25], [0.75, 1.0]],
    "fc1.bias": [0.125, -0.5],
    "fc2.weight": [[6e19, -2e19], [-4e19, 5e19], [1e19, 3e19]],
    "fc2.bias": [0.0, 0.0, 0.0],
}
IMAGES = np.array([[[255, 0]], [[0, 255]]], np.uint8)
LABELS = np.array([1, 2], np.uint8)
CASES = (("plain", 4e-21, None), ("norm", 4e-21, "norm"), ("value", 0.1, "value"))


def grads(init):
    ps = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in init.items()}
    x = torch.tensor(IMAGES[:, 0].astype(np.float32) / 255)
    h = F.linear(x, ps["fc1.weight"], ps["fc1.bias"])
    loss = F.cross_entropy(F.linear(h, ps["fc2.weight"], ps["fc2.bias"]),
                           torch.tensor(LABELS.astype(np.int64)))
    loss.backward()
    return ps, loss


def step(init, lr, clip):
    ps, _ = grads(init)
    if clip == "norm":
        torch.nn.utils.clip_grad_norm_(list(ps.values()), 1.0)
    elif clip == "value":
        torch.nn.utils.clip_grad_value_(list(ps.values()), 1.0)
    opt = torch.optim.SGD([ps[k] for k in PARAMS], lr=lr)
    opt.step()
    return {k: ps[k].detach().numpy().astype(np.float32) for k in PARAMS}


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: %s OUT.safetensors\n" % sys.argv[0])
        return 2
    torch.set_num_threads(1)
    ps, loss = grads(INIT)
    g = {k: ps[k].grad.numpy().astype(np.float32) for k in PARAMS}
    flat = np.concatenate([g[k].ravel() for k in PARAMS])
    torch_norm = torch.nn.utils.clip_grad_norm_(list(ps.values()), 1e30).item()
    true_norm = float(np.sqrt(np.sum(flat.astype(np.float64) ** 2)))
    # what the test needs of these numbers: finite gradients whose
    # squares overflow f32, a finite loss, an inf f32 norm
    assert np.isfinite(flat).all() and np.isfinite(loss.item())
    assert np.abs(flat).max() ** 2 > np.finfo(np.float32).max
    assert torch_norm == float("inf") and true_norm < np.finfo(np.float32).max
    tensors = [("init." + k, np.array(INIT[k], np.float32)) for k in PARAMS]
    tensors += [("images", IMAGES), ("labels", LABELS)]
    tensors += [("grad." + k, g[k]) for k in PARAMS]
    for name, lr, clip in CASES:
        w = step(INIT, lr, clip)
        tensors += [("%s.%s" % (name, k), w[k]) for k in PARAMS]
    tensors += [("loss", np.array([loss.item()], np.float32)),
                ("torch_norm", np.array([torch_norm], np.float32)),
                ("true_norm", np.array([true_norm], np.float32))]
    meta = {"torch": torch.__version__, "lr": ",".join("%s=%r" % (n, lr) for n, lr, _ in CASES)}
    write_safetensors(sys.argv[1], tensors, meta)
    back, _ = read_safetensors(sys.argv[1])
    for name, a in tensors:
        assert np.array_equal(back[name], a, equal_nan=False) or not np.isfinite(a).all(), name
    print("wrote %s: loss %g, max |g| %g, torch norm %g, true norm %g"
          % (sys.argv[1], loss.item(), np.abs(flat).max(), torch_norm, true_norm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
