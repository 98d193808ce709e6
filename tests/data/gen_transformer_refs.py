#!/usr/bin/python3
"""Generate tests/data/transformer_refs.safetensors: PyTorch references for
kiln's transformer layers and ops (read by tests/check_device_transformer.c).

Op cases (each name a prefix "CASE/"):
  ln_*      nn.LayerNorm over the last dim of x [B, T, C]: x, weight, bias,
            dy -> y, saved (mean, rstd per row), dx, dweight, dbias
  gelu_*    nn.GELU(approximate = none | tanh): x, dy -> y, dx
  emb_*     nn.Embedding: idx i32 [B, T] (repeated ids), weight [V, C], dy ->
            y, dweight
  xent_*    nn.CrossEntropyLoss(ignore_index = -100) over logits [B, T, V]
            and i32 targets [B, T] with some -100: loss, dlogits (of the mean)
Model cases ("gpt_*"): a one-block transformer written as kiln INI text
(metadata "CASE/ini"): embedding -> pos_embedding -> layernorm -> linear
(3-d) -> gelu -> dropout (p = 0) -> linear -> add (residual) -> layernorm ->
linear (no bias) -> softmax_xent (ignore_index -100); stored: x (token ids),
labels (targets with -100), param/NAME (kiln names), loss (the mean over the
rows not ignored), grad/NAME.

Shapes: odd T (7, 13: no multiple of any block size), C 8 and 64, batch 1
and 3.  Deterministic: each case seeds torch with crc32(case name), one
thread, float32.

Usage: /usr/bin/python3 tests/data/gen_transformer_refs.py tests/data/transformer_refs.safetensors
"""
import sys
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_io import read_safetensors, write_safetensors

IGNORE = -100


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def f32(t):
    return t.detach().numpy().astype(np.float32)


def i32(t):
    return t.detach().numpy().astype(np.int32)


def ln_case(out, name, B, T, C):
    seed(name)
    x = (torch.randn(B, T, C) * 2 + 0.5).requires_grad_()
    m = nn.LayerNorm(C, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(torch.randn(C) * 0.5 + 1)
        m.bias.copy_(torch.randn(C) * 0.5)
    dy = torch.randn(B, T, C)
    y = m(x)
    y.backward(dy)
    xd = x.detach().double()
    mean = xd.mean(-1)
    rstd = 1 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5)
    saved = torch.stack([mean, rstd], -1).float()
    out += [(name + "/x", f32(x)), (name + "/weight", f32(m.weight)),
            (name + "/bias", f32(m.bias)), (name + "/dy", f32(dy)), (name + "/y", f32(y)),
            (name + "/saved", f32(saved)), (name + "/dx", f32(x.grad)),
            (name + "/dweight", f32(m.weight.grad)), (name + "/dbias", f32(m.bias.grad))]


def gelu_case(out, name, n, approximate):
    seed(name)
    x = (torch.randn(n) * 3).requires_grad_()
    dy = torch.randn(n)
    y = F.gelu(x, approximate=approximate)
    y.backward(dy)
    out += [(name + "/x", f32(x)), (name + "/dy", f32(dy)), (name + "/y", f32(y)),
            (name + "/dx", f32(x.grad))]


def emb_case(out, name, B, T, V, C):
    seed(name)
    idx = torch.randint(0, V, (B, T))
    idx[0, 0] = idx[0, -1]  # a repeated id, whatever the draw
    m = nn.Embedding(V, C)
    dy = torch.randn(B, T, C)
    y = m(idx)
    y.backward(dy)
    out += [(name + "/idx", i32(idx)), (name + "/weight", f32(m.weight)),
            (name + "/dy", f32(dy)), (name + "/y", f32(y)),
            (name + "/dweight", f32(m.weight.grad))]


def targets(B, T, V):
    t = torch.randint(0, V, (B, T))
    t[:, -1] = IGNORE  # the last position of every sample, and one more
    t[0, T // 2] = IGNORE
    return t


def xent_case(out, name, B, T, V):
    seed(name)
    logits = (torch.randn(B, T, V) * 2).requires_grad_()
    t = targets(B, T, V)
    loss = nn.CrossEntropyLoss(ignore_index=IGNORE)(logits.view(-1, V), t.view(-1))
    loss.backward()
    out += [(name + "/logits", f32(logits)), (name + "/labels", i32(t)),
            (name + "/loss", np.array([loss.item()], np.float32)),
            (name + "/dlogits", f32(logits.grad))]


GPT_INI = """# a one-block transformer (tests/data/gen_transformer_refs.py)
[layer.wte]
type = embedding
vocab = {V}
dim = {C}

[layer.wpe]
type = pos_embedding
max_len = 16

[layer.ln1]
type = layernorm

[layer.fc]
type = linear
out = {H}

[layer.act]
type = gelu
approximate = {approx}

[layer.drop]
type = dropout
p = 0

[layer.proj]
type = linear
out = {C}

[layer.res]
type = add
inputs = wpe, proj

[layer.lnf]
type = layernorm
eps = 1e-5

[layer.head]
type = linear
out = {V}
bias = 0

[layer.loss]
type = softmax_xent
ignore_index = -100
"""


class Block(nn.Module):
    def __init__(self, V, C, H, approx):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(16, C)
        self.ln1 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, H)
        self.proj = nn.Linear(H, C)
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.approx = approx

    def forward(self, idx):
        T = idx.shape[1]
        h = self.wte(idx) + self.wpe.weight[:T]
        r = h + self.proj(F.gelu(self.fc(self.ln1(h)), approximate=self.approx))
        return self.head(self.lnf(r))


def gpt_case(out, meta, name, B, T, C, V, approx):
    seed(name)
    H = 2 * C
    m = Block(V, C, H, approx)
    with torch.no_grad():  # affine norms away from ones/zeros, to test them
        for ln in (m.ln1, m.lnf):
            ln.weight.add_(torch.randn(C) * 0.3)
            ln.bias.add_(torch.randn(C) * 0.3)
    x = torch.randint(0, V, (B, T))
    t = targets(B, T, V)
    logits = m(x)
    loss = nn.CrossEntropyLoss(ignore_index=IGNORE)(logits.view(-1, V), t.view(-1))
    loss.backward()
    meta[name + "/ini"] = GPT_INI.format(V=V, C=C, H=H, approx=approx)
    out += [(name + "/x", i32(x)), (name + "/labels", i32(t)),
            (name + "/loss", np.array([loss.item()], np.float32))]
    for pn, p in m.named_parameters():
        out += [(name + "/param/" + pn, f32(p)), (name + "/grad/" + pn, f32(p.grad))]


def main():
    torch.set_num_threads(1)
    out, meta = [], {}
    for B, T, C in ((1, 7, 8), (3, 13, 64), (3, 7, 8)):
        ln_case(out, "ln_b%d_t%d_c%d" % (B, T, C), B, T, C)
    gelu_case(out, "gelu_none", 3 * 13 * 8 + 5, "none")
    gelu_case(out, "gelu_tanh", 3 * 13 * 8 + 5, "tanh")
    emb_case(out, "emb_b1_t7_c8", 1, 7, 5, 8)
    emb_case(out, "emb_b3_t13_c64", 3, 13, 11, 64)
    xent_case(out, "xent_b3_t7", 3, 7, 11)
    xent_case(out, "xent_b1_t13", 1, 13, 5)
    gpt_case(out, meta, "gpt_b1_t7_c8", 1, 7, 8, 5, "tanh")
    gpt_case(out, meta, "gpt_b3_t13_c64", 3, 13, 64, 11, "tanh")
    gpt_case(out, meta, "gpt_b3_t7_c8_exact", 3, 7, 8, 11, "none")
    meta["cases"] = "ln_b1_t7_c8 ln_b3_t13_c64 ln_b3_t7_c8 emb_b1_t7_c8 emb_b3_t13_c64 " \
        "xent_b3_t7 xent_b1_t13 gpt_b1_t7_c8 gpt_b3_t13_c64 gpt_b3_t7_c8_exact"
    write_safetensors(sys.argv[1], out, meta)
    back, _ = read_safetensors(sys.argv[1])
    assert len(back) == len(out)


if __name__ == "__main__":
    main()
