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
         [--compile] [--precision fp32|bf16] [--init MODEL_BIN]
         [--tokens SHARD]
--init: the weights of an llm.c model file (bench/gpt_inputs.py's
model.bin, which kiln and llm.c start from), so all three train the same
model; without it PyTorch's own initialisation (its loss then differs).
--tokens: the batches from an llm.c token shard as kiln's tokens source
with shuffle = 0 cuts them (windows of T + 1 tokens starting every T, B
windows a step, in order), so the first step's loss is kiln's; without it
random tokens.
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

import numpy as np
import torch
import torch.nn as nn

from pytorch_gpt import GPT, lm_loss, windows


class GPTLoss(nn.Module):
    """bench/pytorch_gpt.py's GPT at this size, returning the mean cross-entropy
    (in f32 under bf16 autocast)."""

    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.gpt = GPT(vocab=V, ctx=T, c=C, layers=L, heads=H)

    def forward(self, idx, targets):
        return lm_loss(self.gpt(idx).float(), targets)


def load_llmc(gpt, path, L, C, V, T):
    """Copies llm.c's model file (header of 256 i32: magic 20240326, version 3,
    maxT, V, L, H, C, padded V; then f32 wte, wpe and each per-layer tensor
    for all L layers in turn, then ln_f) into bench/pytorch_gpt.py's GPT.
    nn.Linear's [out, in] is llm.c's layout, so nothing is transposed."""
    head = np.fromfile(path, dtype="<i4", count=256)
    if head[0] != 20240326 or head[1] != 3 or tuple(head[[2, 3, 4, 6, 7]]) != (T, V, L, C, V):
        raise SystemExit(f"{path}: not an f32 llm.c model of this shape (header {head[:8]})")
    w = np.fromfile(path, dtype="<f4", offset=256 * 4)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        t = torch.from_numpy(w[pos:pos + n].reshape(shape).copy())
        pos += n
        return t

    with torch.no_grad():
        gpt.wte.weight.copy_(take(V, C))
        gpt.wpe.weight.copy_(take(T, C))
        for name, shape in (("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
                            ("c_attn.weight", (3 * C, C)), ("c_attn.bias", (3 * C,)),
                            ("c_proj.weight", (C, C)), ("c_proj.bias", (C,)),
                            ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                            ("c_fc.weight", (4 * C, C)), ("c_fc.bias", (4 * C,)),
                            ("mlp_proj.weight", (C, 4 * C)), ("mlp_proj.bias", (C,))):
            for blk in gpt.h:
                blk.get_parameter(name).copy_(take(*shape))
        gpt.ln_f.weight.copy_(take(C))
        gpt.ln_f.bias.copy_(take(C))
    if pos != w.size:
        raise SystemExit(f"{path}: {w.size - pos} floats left over")


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "dim", "heads", "vocab", "context", "batch"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--init", help="llm.c model file to start from")
    ap.add_argument("--tokens", help="llm.c token shard to take the batches from")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPTLoss(a.layers, a.dim, a.heads, a.vocab, a.context)
    if a.init:
        load_llmc(model.gpt, a.init, a.layers, a.dim, a.vocab, a.context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    step_fn = torch.compile(model) if a.compile else model
    if a.tokens:
        win = windows(a.tokens, a.context)
        if win.shape[0] < a.batch * (a.warmup + a.steps):
            raise SystemExit(f"{a.tokens}: {win.shape[0]} windows, too few for the steps")
    else:
        win = torch.randint(0, a.vocab, (a.batch, a.context + 1))
    times = []
    t_start = time.perf_counter()
    warmup_s = 0.0
    for i in range(a.warmup + a.steps):
        b = win[i * a.batch:(i + 1) * a.batch] if a.tokens else win
        x, y = b[:, :-1], b[:, 1:]
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        if i == 0:
            first_loss = loss.item()
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        elif i == a.warmup - 1:
            warmup_s = time.perf_counter() - t_start
    med = statistics.median(times)
    print(json.dumps({"step_s": med, "tokens_per_s": a.batch * a.context / med,
                      "warmup_s": warmup_s, "loss": loss.item(), "first_loss": first_loss, "compile": a.compile, "precision": a.precision,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
