#!/usr/bin/python3
"""GPT-2 training steps in PyTorch on the CPU, the reference for bench/gpt.sh.

The model is the one bench/gpt.sh gives kiln (examples/gpt2_small.ini's
blocks at any size; bench/pytorch_gpt.py's GPT module): token and learned position embeddings, L pre-norm
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
compilation), tokens_per_s = B * T / that median, warmup_s = the wall time
of the W untimed steps (with --compile: the compilation, reported apart and
never in step_s), and the versions.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

from pytorch_gpt import GPT, lm_loss


class GPTLoss(nn.Module):
    """bench/pytorch_gpt.py's GPT at this size, returning the mean cross-entropy
    (in f32 under bf16 autocast)."""

    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.gpt = GPT(vocab=V, ctx=T, c=C, layers=L, heads=H)

    def forward(self, idx, targets):
        return lm_loss(self.gpt(idx).float(), targets)


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
    model = GPTLoss(a.layers, a.dim, a.heads, a.vocab, a.context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    step_fn = torch.compile(model) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.context))
    y = torch.randint(0, a.vocab, (a.batch, a.context))
    times = []
    t_start = time.perf_counter()
    warmup_s = 0.0
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        elif i == a.warmup - 1:
            warmup_s = time.perf_counter() - t_start
    med = statistics.median(times)
    print(json.dumps({"step_s": med, "tokens_per_s": a.batch * a.context / med,
                      "warmup_s": warmup_s, "loss": loss.item(), "compile": a.compile, "precision": a.precision,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
