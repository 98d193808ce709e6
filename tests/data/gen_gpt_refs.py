#!/usr/bin/python3
"""A 2-layer GPT-2's first AdamW steps in PyTorch, for tests/gpt_steps.sh.

The model is tests/data/gpt_tiny.ini: vocab V = 64, C = 32 channels, H = 4
heads, context T = 13, 2 blocks (ln_1, c_attn, causal attention, c_proj,
residual, ln_2, c_fc, tanh GELU, c_proj, residual), ln_f, lm_head tied to
transformer.wte (no bias); written out below as plain modules (PyTorch 1.13
has no F.scaled_dot_product_attention), with kiln's layer names.

Generate (the default) into tests/data:

  gpt_tokens.bin
        STEPS * B windows of T + 1 tokens (random ids < V) in llm.c's token
        shard format (256 int32 header: magic 20240520, version 1, count;
        then uint16 tokens): with [data] shuffle = 0, step k trains on windows
        k*B .. k*B + B - 1 (the windows start at multiples of T)
  gpt_init.safetensors
        the initial weights under kiln's names (lm_head.weight is the tied
        transformer.wte.weight, written once): GPT-2's N(0, 0.02) weights,
        random biases and layer-norm affines so that every term shows
  gpt_refs.safetensors
        loss.adamw    [STEPS]  the mean cross-entropy of each AdamW step
        grad.NAME     every parameter's gradient at step 1 (the tied weight's
                      is the sum of both uses')
        adamw.NAME    every parameter after STEPS steps of torch.optim.AdamW
                      (lr 0.01, betas (0.9, 0.999), eps 1e-4, weight_decay 0.1
                      except biases, layer norms and embeddings: the [train]
                      no_decay patterns of gpt_tiny.ini).  eps is 1e-4, not
                      the default 1e-8, because Adam's step lr g / (|g| + eps)
                      has the slope lr eps / (|g| + eps)^2 in g, up to lr / eps
                      where |g| ~ eps: a gradient element near eps whose f32
                      sum differs by 2e-9 between kiln and torch (1e-8 of the
                      largest gradient: rounding, not a bug) moves its weight
                      by 1.4e-5 with eps 1e-6 (more with 1e-8: the key bias
                      c_attn.bias[C:2C] has a gradient of exactly 0, both
                      sides hold rounding noise there), by < 1e-6 with 1e-4.
                      The gradients themselves are compared directly (grad.)

Check (--check KIND FILE [INIT LR]):
  --check adamw FILE            FILE (kiln's export after the 5 steps) holds
                                every adamw.NAME as NAME
  --check grad FILE INIT LR     FILE is kiln's export after one plain SGD step
                                (momentum 0, no decay) of rate LR from INIT:
                                (INIT - FILE) / LR is the gradient, compared
                                with grad.NAME.  With LR large (1e4) the
                                rounding of the step adds at most
                                eps * (|w| / LR + |g|) to it.
  --check loss METRICS [REL]    the train lines' losses of kiln's
                                metrics.jsonl against loss.adamw
Every tensor: max |kiln - torch| <= REL * max |torch| (REL 1e-4 unless
given: the bf16 check passes its documented tolerance).  Only the standard
library (the reader of gen_trained_refs.py): the test needs neither numpy
nor torch.  Exit 1 on a difference.

Deterministic: seed 0, one thread.  PyTorch 1.13 (Debian's python3-torch).

Usage: /usr/bin/python3 tests/data/gen_gpt_refs.py [tests/data]
       /usr/bin/python3 tests/data/gen_gpt_refs.py --check KIND ...
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_trained_refs import read  # noqa: E402  (standard library only)

V, C, H, T, B, LAYERS = 64, 32, 4, 13, 3, 2
STEPS = 5
LR, WD, BETAS, EPS = 0.01, 0.1, (0.9, 0.999), 1e-4
REL = 1e-4
MAGIC, VERSION = 20240520, 1


def no_decay(name):
    """gpt_tiny.ini's no_decay = *.bias, *ln_*, transformer.wte.*, transformer.wpe.*"""
    return (name.endswith(".bias") or "ln_" in name or name.startswith("transformer.wte.")
            or name.startswith("transformer.wpe."))


# ---- checking (standard library only) -----------------------------------------


def compare(label, got, ref, rel):
    """One line per tensor; True when max |got - ref| <= rel * max |ref|."""
    scale = max(abs(v) for v in ref)
    err = max(abs(x - y) for x, y in zip(got, ref))
    ok = len(got) == len(ref) and err <= rel * scale
    print("%s %-40s max |kiln - torch| = %.3g (max |torch| %.3g)"
          % ("ok" if ok else "MISMATCH", label, err, scale))
    return ok


def check_tensors(path, refs, prefix, rel, derive=None):
    got, ref = read(path), read(refs)
    names = sorted(n[len(prefix):] for n in ref if n.startswith(prefix))
    ok = sorted(got) == names
    if not ok:
        print("MISMATCH names: kiln %s, torch %s" % (sorted(got), names))
    for name in names:
        if name in got:
            vals = got[name][2] if derive is None else derive(name, got[name][2])
            ok &= got[name][1] == ref[prefix + name][1]
            ok &= compare(prefix + name, vals, ref[prefix + name][2], rel)
    return ok


def check(argv, refs):
    kind = argv[0]
    if kind == "adamw":
        return check_tensors(argv[1], refs, "adamw.", REL)
    if kind == "grad":
        init, lr = read(argv[2]), float(argv[3])
        return check_tensors(argv[1], refs, "grad.", REL, lambda n, w1: [
            (w0 - w) / lr for w0, w in zip(init[n][2], w1)])
    if kind == "loss":
        rel = float(argv[2]) if len(argv) > 2 else REL
        with open(argv[1]) as f:
            lines = [json.loads(s) for s in f if s.strip()]
        got = [e["loss"] for e in lines if e.get("event", "train") == "train" and "loss" in e]
        ref = read(refs)["loss.adamw"][2]
        ok = len(got) == len(ref)
        if not ok:
            print("MISMATCH %d train losses in %s, %d steps" % (len(got), argv[1], len(ref)))
        for i, (a, b) in enumerate(zip(got, ref)):
            ok &= compare("loss of step %d (%.6f vs %.6f)" % (i + 1, a, b), [a], [b], rel)
        return ok
    raise SystemExit("gen_gpt_refs.py: unknown check %r" % kind)


# ---- generation (torch) --------------------------------------------------------


def gpt_model(linear):
    """The model of gpt_tiny.ini (V, C, H, T, LAYERS above) as PyTorch modules
    under kiln's (GPT-2's) names, explicit attention (PyTorch 1.13 has no
    F.scaled_dot_product_attention); linear(n_in, n_out) makes the blocks'
    projections: nn.Linear here, GPT-2's Conv1D in gen_gpt2_io_refs.py."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = linear(C, 3 * C)
            self.c_proj = linear(C, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = linear(C, 4 * C)
            self.c_proj = linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                h=nn.ModuleList([Block() for _ in range(LAYERS)]), ln_f=nn.LayerNorm(C)))
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.transformer.wte.weight

        def forward(self, idx):
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
            for block in tr.h:
                x = block(x)
            return self.lm_head(tr.ln_f(x))

    return GPT()


def generate(out_dir):
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from safetensors_io import write_safetensors

    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    net = gpt_model(nn.Linear)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.02 * torch.randn_like(p))
    params = dict(net.named_parameters())  # the tied tensor once, as transformer.wte.weight

    def weights(prefix=""):
        return [(prefix + n, p.detach().numpy().astype(np.float32).copy()) for n, p in params.items()]

    tokens = rng.integers(0, V, size=STEPS * B * T + 1).astype(np.uint16)
    header = np.zeros(256, dtype="<i4")
    header[:3] = (MAGIC, VERSION, len(tokens))
    with open(os.path.join(out_dir, "gpt_tokens.bin"), "wb") as f:
        f.write(header.tobytes() + tokens.astype("<u2").tobytes())
    write_safetensors(os.path.join(out_dir, "gpt_init.safetensors"), weights(),
                      {"generator": "tests/data/gen_gpt_refs.py"})

    windows = torch.from_numpy(tokens.astype(np.int64))
    opt = torch.optim.AdamW([
        {"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": WD},
        {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)
    losses, grads = [], None
    for step in range(STEPS):
        w = [windows[(step * B + i) * T:(step * B + i) * T + T + 1] for i in range(B)]
        x, y = torch.stack([z[:-1] for z in w]), torch.stack([z[1:] for z in w])
        opt.zero_grad()
        loss = F.cross_entropy(net(x).view(-1, V), y.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            grads = [("grad." + n, p.grad.numpy().astype(np.float32).copy()) for n, p in params.items()]
        opt.step()
    write_safetensors(os.path.join(out_dir, "gpt_refs.safetensors"),
                      [("loss.adamw", np.array(losses, dtype=np.float32))] + grads + weights("adamw."),
                      {"generator": "tests/data/gen_gpt_refs.py"})
    print("losses: " + " ".join("%.6f" % v for v in losses))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2:], os.path.join(here, "gpt_refs.safetensors")) else 1)
    generate(sys.argv[1] if len(sys.argv) > 1 else here)


if __name__ == "__main__":
    main()
