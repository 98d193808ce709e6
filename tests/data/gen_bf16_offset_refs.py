#!/usr/bin/python3
"""bf16 against PyTorch's CPU autocast on rows with a large common offset,
for tests/bf16_offset.sh.

The model is tests/data/bf16_offset.ini: a token embedding h (V = 32
ids, C = 16 channels) whose rows are OFFSET + 0.1 x randn, one residual
block r = fc(ln1(h)) + h + fc(ln1(h)) (fc a linear C -> C; its output
added twice, so the sum meets a bf16 input as its second and third term),
a layer norm ln2, a linear head to the V classes, cross-entropy on the
next token (context T = 8, batch B = 4).  Under torch.autocast('cpu',
dtype=torch.bfloat16) the embedding's rows, the residual sum and the
layer norms stay f32 and only the linear layers' products run in bf16
(their inputs rounded to bf16, their outputs bf16); the relative L2 error
of the embedding's gradient against the f32 model's stays near bf16's
rounding whatever the offset.  Rounding the rows
themselves to bf16 (kiln before session 40) loses their spread at a large
offset (bf16's step at 50 is 0.25, the spread 0.1) and the error grows
with it (690% at 50).

Generate (the default) into tests/data:

  bf16_offset_tokens.bin
        B windows of T + 1 random ids < V in llm.c's token shard format
        (256 int32 header: magic 20240520, version 1, count; uint16 ids)
  bf16_offset_init_OFFSET.safetensors  (OFFSET 0 and 50)
        the initial weights under kiln's names: emb.weight OFFSET + 0.1 x
        randn, ln1.weight and ln2.weight 1 + 0.1 x randn, the biases, the
        fc and head weights 0.1 x randn (the same draws for both offsets)
  bf16_offset_refs.safetensors
        fp32.OFFSET      emb.weight's gradient, the f32 model
        autocast.OFFSET  emb.weight's gradient under CPU autocast bf16

Check (--check OFFSET FILE LR FACTOR [REL]): FILE is kiln's export after
one plain SGD step (momentum 0, no decay) of rate LR from
bf16_offset_init_OFFSET.safetensors; (init - FILE) / LR is kiln's gradient
of emb.weight.  Passes when its relative L2 error against fp32.OFFSET is at
most FACTOR x autocast.OFFSET's error, and, with REL given, when that error
is at most REL as well (the f32 run: REL 1e-4).  Only the standard library
(gen_trained_refs.py's reader): the test needs neither numpy nor torch.

Deterministic: seed 0, one thread.  PyTorch 1.13 (Debian's python3-torch).

Usage: /usr/bin/python3 tests/data/gen_bf16_offset_refs.py [tests/data]
       /usr/bin/python3 tests/data/gen_bf16_offset_refs.py --check ...
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_trained_refs import read  # noqa: E402  (standard library only)

V, C, T, B = 32, 16, 8, 4
OFFSETS = (0, 50)
MAGIC, VERSION = 20240520, 1


def rel_l2(got, ref):
    num = math.sqrt(sum((a - b) ** 2 for a, b in zip(got, ref)))
    return num / math.sqrt(sum(b * b for b in ref))


def check(argv, here):
    offset, path, lr, factor = argv[0], argv[1], float(argv[2]), float(argv[3])
    rel = float(argv[4]) if len(argv) > 4 else None
    init = read(os.path.join(here, "bf16_offset_init_%s.safetensors" % offset))
    refs = read(os.path.join(here, "bf16_offset_refs.safetensors"))
    got = read(path)["emb.weight"][2]
    grad = [(w0 - w1) / lr for w0, w1 in zip(init["emb.weight"][2], got)]
    ref, ac = refs["fp32." + offset][2], refs["autocast." + offset][2]
    err, err_ac = rel_l2(grad, ref), rel_l2(ac, ref)
    ok = len(grad) == len(ref) and err <= factor * err_ac and (rel is None or err <= rel)
    print("%s offset %s: emb.weight's gradient, relative L2 error against f32: kiln %.4g, "
          "autocast %.4g (bound %g x autocast%s)"
          % ("ok" if ok else "MISMATCH", offset, err, err_ac, factor,
             "" if rel is None else ", and %g" % rel))
    return ok


def generate(out_dir):
    import numpy as np
    import torch
    import torch.nn.functional as F

    from safetensors_io import write_safetensors

    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, size=B * T + 1).astype(np.uint16)
    header = np.zeros(256, dtype="<i4")
    header[:3] = (MAGIC, VERSION, len(tokens))
    with open(os.path.join(out_dir, "bf16_offset_tokens.bin"), "wb") as f:
        f.write(header.tobytes() + tokens.astype("<u2").tobytes())
    ids = torch.from_numpy(tokens.astype(np.int64))
    x = torch.stack([ids[i * T:i * T + T] for i in range(B)])
    y = torch.stack([ids[i * T + 1:i * T + T + 1] for i in range(B)])

    spread = 0.1 * torch.randn(V, C)
    rest = [("ln1.weight", 1 + 0.1 * torch.randn(C)), ("ln1.bias", 0.1 * torch.randn(C)),
            ("fc.weight", 0.1 * torch.randn(C, C)), ("fc.bias", 0.1 * torch.randn(C)),
            ("ln2.weight", 1 + 0.1 * torch.randn(C)), ("ln2.bias", 0.1 * torch.randn(C)),
            ("head.weight", 0.1 * torch.randn(V, C)), ("head.bias", 0.1 * torch.randn(V))]
    refs = []
    for offset in OFFSETS:
        init = [("emb.weight", offset + spread)] + rest
        write_safetensors(os.path.join(out_dir, "bf16_offset_init_%d.safetensors" % offset),
                          [(n, t.numpy().astype(np.float32).copy()) for n, t in init],
                          {"generator": "tests/data/gen_bf16_offset_refs.py"})
        for kind in ("fp32", "autocast"):
            p = [t.clone().requires_grad_(True) for _, t in init]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "autocast"):
                h = F.embedding(x, p[0])
                f = F.linear(F.layer_norm(h, (C,), p[1], p[2], 1e-5), p[3], p[4])
                r = f + h + f
                logits = F.linear(F.layer_norm(r, (C,), p[5], p[6], 1e-5), p[7], p[8])
                loss = F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))
            loss.backward()
            refs.append(("%s.%d" % (kind, offset), p[0].grad.numpy().astype(np.float32).copy()))
    write_safetensors(os.path.join(out_dir, "bf16_offset_refs.safetensors"), refs,
                      {"generator": "tests/data/gen_bf16_offset_refs.py",
                       "torch": torch.__version__})
    g = dict(refs)
    for offset in OFFSETS:
        ref = g["fp32.%d" % offset].ravel().tolist()
        print("offset %d: autocast's relative L2 error %.4g" % (
            offset, rel_l2(g["autocast.%d" % offset].ravel().tolist(), ref)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2:], here) else 1)
    generate(sys.argv[1] if len(sys.argv) > 1 else here)


if __name__ == "__main__":
    main()
