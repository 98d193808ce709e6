#!/usr/bin/python3
"""Reference tensors for the fused attention ops (tests/check_attention.c):
PyTorch 1.13's explicit causal self-attention (minGPT / GPT-2's
CausalSelfAttention without the projections; 1.13 has no
F.scaled_dot_product_attention) and autograd for the gradients.

For each case (B, T, C, H, causal, scale), with seed 0 per case:
    qkv  = randn(B, T, 3C)            the input, q | k | v on the last dim
    dy   = randn(B, T, C)             the gradient flowing into y
    q, k, v = qkv.split(C, 2), each viewed [B, T, H, D] -> [B, H, T, D]
    att  = (q @ k^T) * scale, masked_fill(j > i, -inf) when causal
    lse  = logsumexp(att, -1)         [B, H, T]
    y    = (softmax(att) @ v).transpose(1, 2).reshape(B, T, C)
    dqkv = d(sum(y * dy)) / d qkv     [B, T, 3C]
Stored as "<case>/qkv", "/dy", "/y", "/lse", "/dqkv" (F32); the case list is
the "cases" metadata and each case's "<case>.shape" reads "B,T,C,H,causal,scale".
Every float32 result is checked against the same computation in float64
(within 1e-5 relative to the tensor's largest magnitude) before writing.

Run: /usr/bin/python3 tests/data/gen_attention_refs.py tests/data/attention_refs.safetensors
"""
import math
import sys

import numpy as np
import torch

from safetensors_io import read_safetensors, write_safetensors

# odd T, T past and not a multiple of any block size (the CPU's 32 rows),
# head size 8 and 64, batch 1 and 3, heads 1 and 4, causal and not
CASES = [
    ("b1_t7_h1_d8", 1, 7, 8, 1, 1, None),
    ("b3_t13_h4_d8", 3, 13, 32, 4, 1, None),
    ("b1_t45_h2_d64", 1, 45, 128, 2, 1, None),
    ("b1_t37_h1_d64_full", 1, 37, 64, 1, 0, None),
    ("b3_t7_h4_d64_scale", 3, 7, 256, 4, 1, 0.3),
    ("b1_t70_h4_d8", 1, 70, 32, 4, 1, None),
]


def attention(qkv, B, T, C, H, causal, scale):
    D = C // H
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, H, D).transpose(1, 2)
    k = k.view(B, T, H, D).transpose(1, 2)
    v = v.view(B, T, H, D).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * scale
    if causal:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(att, dim=-1)
    p = torch.softmax(att, dim=-1)
    y = (p @ v).transpose(1, 2).reshape(B, T, C)
    return y, lse


def run(qkv0, dy, B, T, C, H, causal, scale, dtype):
    qkv = qkv0.to(dtype).clone().requires_grad_(True)
    y, lse = attention(qkv, B, T, C, H, causal, scale)
    (y * dy.to(dtype)).sum().backward()
    return y.detach(), lse.detach(), qkv.grad


def close(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max()) <= 1e-5 * max(1.0, float(b.abs().max()))


def main(path):
    torch.set_num_threads(1)
    tensors, names = [], []
    meta = {}
    for name, B, T, C, H, causal, scale in CASES:
        torch.manual_seed(0)
        if scale is None:
            scale = 1.0 / math.sqrt(C // H)
        qkv = torch.randn(B, T, 3 * C)
        dy = torch.randn(B, T, C)
        y, lse, dqkv = run(qkv, dy, B, T, C, H, causal, scale, torch.float32)
        y64, lse64, dqkv64 = run(qkv, dy, B, T, C, H, causal, scale, torch.float64)
        for got, want, what in ((y, y64, "y"), (lse, lse64, "lse"), (dqkv, dqkv64, "dqkv")):
            assert close(got, want), "%s: float32 %s is off float64" % (name, what)
        for key, t in (("qkv", qkv), ("dy", dy), ("y", y), ("lse", lse), ("dqkv", dqkv)):
            tensors.append(("%s/%s" % (name, key), t.float().contiguous().numpy()))
        meta[name + ".shape"] = "%d,%d,%d,%d,%d,%r" % (B, T, C, H, causal, scale)
        names.append(name)
    meta["cases"] = ",".join(names)
    meta["generator"] = "tests/data/gen_attention_refs.py, torch %s" % torch.__version__
    write_safetensors(path, tensors, meta)
    back, _ = read_safetensors(path)
    for k, a in tensors:
        assert np.array_equal(back[k], a), k


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_refs.safetensors")
