#!/usr/bin/python3
"""A 2-layer GPT-2 in the GPT-2 release's layouts, for tests/gpt2_io.sh.

The model is tests/data/gpt_tiny.ini's (vocab V = 64, C = 32, H = 4 heads,
context T = 13, 2 blocks, tanh GELU, lm_head tied to transformer.wte),
written here as Hugging Face's GPT2LMHeadModel holds it: the blocks'
projections c_attn, attn.c_proj, c_fc and mlp.c_proj are GPT-2's Conv1D,
y = x @ W + b with W [in, out] (nn.Linear's transposed), and state_dict()
names them transformer.h.N.attn.c_attn.weight, ...  No transformers package:
the modules are written out below (PyTorch 1.13, Debian's python3-torch).

Generate (the default) into tests/data:

  gpt2_hf.safetensors
        the weights as GPT2LMHeadModel.save_pretrained writes them: every
        parameter under its state_dict name, Conv1D weights [in, out], the
        tied lm_head.weight left out (it is transformer.wte.weight)
  gpt2_hf_bare.safetensors
        the same weights as the GPT-2 release's model.safetensors names
        them (GPT2Model: no "transformer." prefix) with its causal-mask
        buffers h.N.attn.bias [1, 1, T, T] and h.N.attn.masked_bias []
  gpt2_llmc.bin
        the same weights in llm.c's model file (train_gpt2.py's
        write_model: 256 int32 header, magic 20240326, version 3, then every
        tensor f32 in llm.c's order, weights [out, in])
  gpt2_io_refs.safetensors
        loss     [1]        the mean cross-entropy of the first batch of
                            tests/data/gpt_tokens.bin (3 windows of T + 1
                            tokens at offsets 0, T, 2T, as gpt_steps.sh's
                            [data] shuffle = 0 reads them)
        greedy   [T] i32    the prompt PROMPT then T - len(PROMPT) tokens,
                            each the argmax of the last position's logits
                            (greedy decoding) with the vocabulary padded to
                            GEN_V = 256 by zero rows of wte (the byte-level
                            tokenizer of `kiln generate` needs 256 ids): the
                            padded tokens' logits are 0

Check (--check KIND ...), standard library only:
  --check gpt2 FILE    FILE (kiln export --format gpt2) holds exactly the
                       tensors of gpt2_hf.safetensors: names, shapes and
                       every value bit for bit
  --check kiln FILE    FILE (kiln export, PyTorch's layouts) holds them with
                       the Conv1D weights transposed to [out, in]
  --check padded FILE N  as kiln, FILE's transformer.wte.weight having N
                       more rows, all 0 (a padded vocabulary)
  --check loss METRICS the first train line's loss of kiln's metrics.jsonl
                       against loss (relative 1e-5)
  --check greedy FILE  FILE (kiln generate's stdout, bytes, and the newline
                       that ends it) is greedy's tokens as bytes
Exit 1 on a difference.

Deterministic: seed 1, one thread.

Usage: /usr/bin/python3 tests/data/gen_gpt2_io_refs.py [tests/data]
       /usr/bin/python3 tests/data/gen_gpt2_io_refs.py --check KIND FILE
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_trained_refs import read  # noqa: E402  (standard library only)
from gen_gpt_refs import gpt_model  # noqa: E402  (imports torch when called)

V, C, H, T, B, LAYERS = 64, 32, 4, 13, 3, 2
GEN_V = 256
PROMPT = [48, 49, 50, 51]  # "0123"
REL = 1e-5
LLMC_MAGIC, LLMC_VERSION = 20240326, 3
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# ---- checking (standard library only) -----------------------------------------


def transpose(shape, vals):
    """[rows, cols] row-major values as [cols, rows]."""
    rows, cols = shape
    return [vals[r * cols + c] for c in range(cols) for r in range(rows)]


def check_tensors(path, conv1d_transposed, pad_rows=0):
    here = os.path.dirname(os.path.abspath(__file__))
    got, ref = read(path), read(os.path.join(here, "gpt2_hf.safetensors"))
    ok = sorted(got) == sorted(ref)
    if not ok:
        print("MISMATCH names: kiln %s, reference %s" % (sorted(got), sorted(ref)))
    for name in sorted(set(got) & set(ref)):
        dtype, shape, vals = ref[name]
        if conv1d_transposed and name.endswith(CONV1D):
            shape, vals = [shape[1], shape[0]], transpose(shape, vals)
        if pad_rows and name == "transformer.wte.weight":
            shape, vals = [shape[0] + pad_rows, shape[1]], list(vals) + [0.0] * (pad_rows * shape[1])
        same = got[name][0] == dtype and got[name][1] == shape and \
            struct.pack("<%df" % len(vals), *vals) == struct.pack("<%df" % len(got[name][2]), *got[name][2])
        print("%s %-40s %s %s" % ("ok" if same else "MISMATCH", name, got[name][1], shape))
        ok &= same
    return ok


def check(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    refs = read(os.path.join(here, "gpt2_io_refs.safetensors"))
    kind = argv[0]
    if kind in ("gpt2", "kiln"):
        return check_tensors(argv[1], kind == "kiln")
    if kind == "padded":
        return check_tensors(argv[1], True, int(argv[2]))
    if kind == "loss":
        with open(argv[1]) as f:
            lines = [json.loads(s) for s in f if s.strip()]
        got = [e["loss"] for e in lines if e.get("event", "train") == "train" and "loss" in e][0]
        ref = refs["loss"][2][0]
        ok = abs(got - ref) <= REL * abs(ref)
        print("%s loss of the first batch: kiln %.7f, torch %.7f" % ("ok" if ok else "MISMATCH", got, ref))
        return ok
    if kind == "greedy":
        with open(argv[1], "rb") as f:
            got = list(f.read())
        if len(got) == T + 1 and got[-1] == 10:  # the newline that ends the output
            got = got[:-1]
        ref = list(refs["greedy"][2])
        ok = got == ref
        print("%s greedy tokens: kiln %s, torch %s" % ("ok" if ok else "MISMATCH", got, ref))
        return ok
    raise SystemExit("gen_gpt2_io_refs.py: unknown check %r" % kind)


# ---- generation (torch) --------------------------------------------------------


def generate(out_dir):
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from safetensors_io import write_safetensors

    torch.manual_seed(1)
    torch.set_num_threads(1)

    class Conv1D(nn.Module):
        """GPT-2's Conv1D (transformers.pytorch_utils.Conv1D): weight [nx, nf]."""

        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
                *x.shape[:-1], self.weight.shape[1])

    # GPT2LMHeadModel's modules, Conv1D(nf = out, nx = in) for the projections
    net = gpt_model(lambda n_in, n_out: Conv1D(n_out, n_in))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:  # larger than GPT-2's 0.02, so the logits are far from uniform
                p.copy_(0.3 * torch.randn_like(p))
    # state_dict order, the tied tensor once (save_pretrained drops lm_head.weight)
    params = [(n, p.detach().numpy().astype(np.float32).copy()) for n, p in net.named_parameters()]
    meta = {"format": "pt", "generator": "tests/data/gen_gpt2_io_refs.py"}
    write_safetensors(os.path.join(out_dir, "gpt2_hf.safetensors"), params, meta)

    bare = []
    for n, a in params:
        bare.append((n[len("transformer."):], a))
        if n.endswith("attn.c_proj.bias"):  # after each block's attention, as GPT2Model lists them
            block = n[len("transformer."):-len(".c_proj.bias")]
            bare.append((block + ".bias", np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)))
            bare.append((block + ".masked_bias", np.array(-1e4, dtype=np.float32)))
    write_safetensors(os.path.join(out_dir, "gpt2_hf_bare.safetensors"), bare, meta)

    # llm.c: every kind for all layers, then the next; weights [out, in]
    sd = dict(params)
    kinds = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
             "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
             "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    header = np.zeros(256, dtype="<i4")
    header[:8] = (LLMC_MAGIC, LLMC_VERSION, T, V, LAYERS, H, C, V)
    with open(os.path.join(out_dir, "gpt2_llmc.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(sd["transformer.wte.weight"].astype("<f4").tobytes())
        f.write(sd["transformer.wpe.weight"].astype("<f4").tobytes())
        for k in kinds:
            for layer in range(LAYERS):
                a = sd["transformer.h.%d.%s" % (layer, k)]
                f.write((a.T if k in CONV1D else a).astype("<f4").tobytes())
        f.write(sd["transformer.ln_f.weight"].astype("<f4").tobytes())
        f.write(sd["transformer.ln_f.bias"].astype("<f4").tobytes())

    with open(os.path.join(out_dir, "gpt_tokens.bin"), "rb") as f:
        tokens = np.frombuffer(f.read()[1024:], dtype="<u2").astype(np.int64)
    w = [torch.from_numpy(tokens[i * T:i * T + T + 1]) for i in range(B)]
    x, y = torch.stack([z[:-1] for z in w]), torch.stack([z[1:] for z in w])
    with torch.no_grad():
        loss = F.cross_entropy(net(x).view(-1, V), y.reshape(-1))
        seq = list(PROMPT)
        while len(seq) < T:
            last = net(torch.tensor([seq]))[0, -1]
            seq.append(int(torch.cat([last, torch.zeros(GEN_V - V)]).argmax()))
    write_safetensors(os.path.join(out_dir, "gpt2_io_refs.safetensors"), [
        ("loss", np.array([loss.item()], dtype=np.float32)),
        ("greedy", np.array(seq, dtype=np.int32))], {"generator": "tests/data/gen_gpt2_io_refs.py"})
    print("loss %.6f, greedy %s" % (loss.item(), seq))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2:]) else 1)
    generate(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    main()
