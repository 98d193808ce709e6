#!/usr/bin/python3
"""PyTorch side of the kiln vs PyTorch character GPT benchmark.

The model of examples/gpt_char.ini: GPT-2's architecture with 4 blocks, 4
heads, 128 channels, context 128, a byte vocabulary (256), the lm_head tied to
the token embedding; F.scaled_dot_product_attention (causal), GELU (tanh).
AdamW (lr 3e-3, betas 0.9/0.95 as kiln's defaults, weight decay 0.1 except
biases, layernorms and the embeddings), gradient clipping at norm 1.0, a
constant learning rate (the schedule costs nothing measurable).  Data: the
training shard of data/gpt_char (llm.c's format: 256 i32 header words, then
u16 tokens), cut into windows of context + 1 tokens as kiln's `tokens` source
does, shuffled with torch.randperm.  --warmup-steps untimed steps, then --steps
timed ones.  Prints one JSON line: train_samples_per_s (a sample is one
window of 128 tokens), train_tokens_per_s, and the --mode fields of
torch_modes.py.

  pytorch_gpt.py [--data data/gpt_char] [--batch 16] [--steps 100] [--threads 2]
                 [--mode eager|compile|compile-max|lightning]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_modes import add_mode_arg, compile_seconds, compiled, lightning_fit, mode_fields


def causal_attention(q, k, v):
    """F.scaled_dot_product_attention where it exists (2.x), else the explicit
    ops (PyTorch 1.13)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=256, ctx=128, c=128, layers=4, heads=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(ctx, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("pos", torch.arange(ctx), persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(self.pos[:idx.shape[1]])
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def windows(path, ctx):
    """The shard's tokens as windows [N, ctx + 1] (inputs and shifted targets)."""
    tok = np.fromfile(path, dtype=np.uint16, offset=256 * 4).astype(np.int64)
    n = (tok.shape[0] - 1) // ctx
    idx = np.arange(n)[:, None] * ctx + np.arange(ctx + 1)[None, :]
    return torch.from_numpy(tok[idx])


def make_opt(model, lr, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "wte" not in name and "wpe" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def lm_loss(logits, y):
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/gpt_char")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip-norm", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100, help="timed steps after the warm-up")
    ap.add_argument("--seed", type=int, default=1)
    add_mode_arg(ap)
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("--steps must be >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    w = windows(os.path.join(args.data, "train-000000.bin"), args.context)
    x_all, y_all = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    model = GPT(ctx=args.context)
    model.train()
    total = args.warmup_steps + args.steps
    extra = {}
    if args.mode == "lightning":
        samples, train_s, last_loss, ver = lightning_fit(
            model, lambda m: make_opt(m, args.lr, args.weight_decay), lm_loss, x_all, y_all,
            args.batch, total, "fp32", clip_norm=args.clip_norm, seed=args.seed)
        extra["lightning"] = ver
    else:
        run = compiled(model, args.mode)
        opt = make_opt(model, args.lr, args.weight_decay)
        perm = torch.randperm(x_all.shape[0])
        t_start = time.perf_counter()
        t0 = t_start
        for step in range(total):
            if step == args.warmup_steps:
                t0 = time.perf_counter()
            idx = perm[(step * args.batch) % (perm.shape[0] - args.batch):][:args.batch]
            xb, yb = x_all.index_select(0, idx), y_all.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = lm_loss(run(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
            opt.step()
        last_loss = loss.item()
        train_s = time.perf_counter() - t0
        samples = args.steps * args.batch
        extra["compile_s"] = compile_seconds(t0 - t_start, args.warmup_steps, train_s, args.steps)
    if not math.isfinite(last_loss):
        sys.exit("pytorch_gpt.py: the loss is not finite")
    out = {"impl": "pytorch", "model": "gpt_char", "train_samples_per_s": samples / train_s,
           "train_tokens_per_s": samples * args.context / train_s, "batch": args.batch,
           "context": args.context, "steps": args.steps, "warmup_steps": args.warmup_steps,
           "train_s": train_s, "final_loss": last_loss,
           "params": sum(p.numel() for p in model.parameters())}
    out.update(mode_fields(args.mode, extra=extra))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
