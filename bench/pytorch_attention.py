#!/usr/bin/python3
"""Forward + backward time of causal self-attention in PyTorch (explicit ops,
as minGPT / GPT-2's CausalSelfAttention without the projections: PyTorch 1.13
has no F.scaled_dot_product_attention), the reference for bench/attention.

Usage: /usr/bin/python3 bench/pytorch_attention.py THREADS B T C H [REPEATS]
Prints the median of REPEATS (default 20) forward+backward pairs after two
warm-up pairs, and the forward alone.
"""
import math
import sys
import time

import torch


def main():
    threads, B, T, C, H = (int(a) for a in sys.argv[1:6])
    reps = int(sys.argv[6]) if len(sys.argv) > 6 else 20
    torch.set_num_threads(threads)
    D = C // H
    qkv = torch.randn(B, T, 3 * C, requires_grad=True)
    dy = torch.randn(B, T, C)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scale = 1.0 / math.sqrt(D)
    tf, tb = [], []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        t1 = time.perf_counter()
        qkv.grad = None
        y.backward(dy)
        tf.append(t1 - t0)
        tb.append(time.perf_counter() - t0)
    tf, tb = sorted(tf[2:]), sorted(tb[2:])
    print("pytorch %s attention B=%d T=%d C=%d H=%d threads=%d: fwd+bwd %.3f ms (fwd %.3f ms), median of %d; min %.3f ms (fwd %.3f ms)"
          % (torch.__version__, B, T, C, H, threads, tb[reps // 2] * 1e3, tf[reps // 2] * 1e3, reps,
             tb[0] * 1e3, tf[0] * 1e3))


if __name__ == "__main__":
    main()
