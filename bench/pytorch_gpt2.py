#!/usr/bin/python3
"""GPT-2 training steps in PyTorch on the CPU, the reference for bench/gpt.sh.

The model is the one bench/gpt.sh gives kiln (examples/gpt2_small.ini's
blocks at any size): token and learned position embeddings, L pre-norm
blocks (layer norm, causal self-attention with H heads, layer norm, MLP
4C with tanh GELU, residuals), a final layer norm, lm_head tied to the
token embedding, mean cross-entropy; torch.optim.AdamW (lr 1e-4, as llm.c's
CPU trainer).  Attention is F.scaled_dot_product_attention(is_causal=True)
where PyTorch has it (2.x), else the explicit ops (1.13).

Usage: python bench/pytorch_gpt2.py --layers L --dim C --heads H --vocab V
         --context T --batch B [--steps N] [--warmup W] [--threads N]
         [--compile] [--precision fp32|bf16]
Prints one JSON line: the median step time of N timed steps after W
untimed ones (--compile: torch.compile(model); the warm-up includes the
compilation), tokens_per_s = B * T / that median, and the versions.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.C, self.H = C, H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attention(self, x):
        b, t, C = x.shape
        q, k, v = (z.view(b, t, self.H, C // self.H).transpose(1, 2)
                   for z in self.c_attn(x).split(C, dim=2))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(b, t, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "dim", "heads", "vocab", "context", "batch"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT(a.layers, a.dim, a.heads, a.vocab, a.context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    step_fn = torch.compile(model) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.context))
    y = torch.randint(0, a.vocab, (a.batch, a.context))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"step_s": med, "tokens_per_s": a.batch * a.context / med,
                      "loss": loss.item(), "compile": a.compile, "precision": a.precision,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
