#!/usr/bin/python3
"""PyTorch side of the kiln vs PyTorch LSTM benchmark (bench/lstm.sh).

Two models, each the PyTorch form of a kiln INI that bench/lstm.sh writes:

  seq2seq  examples/seq2seq.ini's shape: nn.Embedding(11, 32), a
           bidirectional nn.LSTM(32, 64) encoder, an nn.LSTM(128, 128)
           decoder over its sequence, nn.Linear(128, 11), T 8
  lm       nn.Embedding(V, E), nn.LSTM(E, H, num_layers = 2), nn.Linear(H, V)
           at every position (a language model), V = E = 256, H 256, T 64

all batch_first, fp32, cross-entropy at every position (mean; ignore_index 0,
as the example's), AdamW (lr 1e-3, betas 0.9 / 0.999, eps 1e-8, no weight
decay), gradients clipped at norm 1.0.  Every step trains the same batch:
the first --batch windows of the token shard (kiln's `tokens` source with
shuffle = 0 and resident = 1 trains on the same ones), so the losses of the
two can be compared step by step.  The tokens are 1 .. V-1 (no pad id 0):
every row of the seq2seq shape has length T, and nn.LSTM needs no packing.

  pytorch_lstm.py --model M --shard FILE [--batch 64] [--steps 20]
                  [--warmup-steps 5] [--threads 1] [--init OUT.safetensors]
  pytorch_lstm.py --model M --write-shard FILE --tokens N --seed S

--init writes the initial parameters (seeded by --seed) under kiln's names
(tests/data/safetensors_io.py), for kiln's [model] init_from; --write-shard
writes N random tokens of the model's vocabulary in llm.c's shard format.
Prints one JSON line: train_samples_per_s over the steps after the warm-up,
cpu_ms_per_step (the process's CPU time, every thread, over those steps: on
a shared machine the figure that load changes least), the losses of the
first and last step, the threads and PyTorch's version.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
from safetensors_io import write_safetensors  # noqa: E402

# vocabulary, embedding, context of each model (the INIs of bench/lstm.sh)
SHAPES = {"seq2seq": {"V": 11, "E": 32, "T": 8},
          "lm": {"V": 256, "E": 256, "T": 64, "H": 256}}


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 32)
        self.enc = nn.LSTM(32, 64, batch_first=True, bidirectional=True)
        self.dec = nn.LSTM(128, 128, batch_first=True)
        self.head = nn.Linear(128, 11)

    def forward(self, ids):
        y, _ = self.enc(self.embed(ids))
        y, _ = self.dec(y)
        return self.head(y)

    def kiln_names(self):
        """(kiln name, tensor) of every parameter: the layer names of
        examples/seq2seq.ini (enc.fwd, enc.bwd with reverse = 1, dec.lstm)."""
        out = [("enc.embed.weight", self.embed.weight)]
        for n, p in self.enc.named_parameters():
            out.append(("enc.%s.%s" % ("bwd" if n.endswith("_reverse") else "fwd", n), p))
        out += [("dec.lstm." + n, p) for n, p in self.dec.named_parameters()]
        out += [("dec.head.weight", self.head.weight), ("dec.head.bias", self.head.bias)]
        return out


class LM(nn.Module):
    def __init__(self, v, e, h):
        super().__init__()
        self.embed = nn.Embedding(v, e)
        self.rnn = nn.LSTM(e, h, num_layers=2, batch_first=True)
        self.head = nn.Linear(h, v)

    def forward(self, ids):
        y, _ = self.rnn(self.embed(ids))
        return self.head(y)

    def kiln_names(self):
        """layer k of the stack is kiln's layer "r<k>" (index = k)."""
        out = [("embed.weight", self.embed.weight)]
        out += [("r%s.%s" % (n[-1], n), p) for n, p in self.rnn.named_parameters()]
        out += [("head.weight", self.head.weight), ("head.bias", self.head.bias)]
        return out


def make_model(name, hidden):
    if name == "seq2seq":
        return Seq2Seq()
    s = SHAPES["lm"]
    return LM(s["V"], s["E"], hidden or s["H"])


def write_shard(path, model, ntok, seed):
    """llm.c's token shard: i32 header[256] (magic 20240520, version 1, N),
    then u16 tokens, uniform over 1 .. V-1 (no pad id 0)."""
    s = SHAPES[model]
    rng = np.random.default_rng(seed)
    tok = rng.integers(1, s["V"], size=ntok, dtype=np.int64).astype("<u2")
    head = np.zeros(256, dtype="<i4")
    head[:3] = (20240520, 1, ntok)
    with open(path, "wb") as f:
        f.write(head.tobytes())
        f.write(tok.tobytes())


def first_batch(path, batch, ctx):
    """The first `batch` non-overlapping windows of ctx + 1 tokens (kiln's
    tokens source: inputs tokens[w, w+T), targets tokens[w+1, w+T+1))."""
    tok = np.fromfile(path, dtype="<u2", offset=256 * 4).astype(np.int64)
    idx = np.arange(batch)[:, None] * ctx + np.arange(ctx + 1)[None, :]
    w = torch.from_numpy(tok[idx])
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), required=True)
    ap.add_argument("--hidden", type=int, default=0, help="lm: H (default 256)")
    ap.add_argument("--shard")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", help="write the initial parameters (kiln names) here and exit")
    ap.add_argument("--write-shard", help="write a random token shard here and exit")
    ap.add_argument("--tokens", type=int, default=0)
    args = ap.parse_args()

    if args.write_shard:
        write_shard(args.write_shard, args.model, args.tokens, args.seed)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = make_model(args.model, args.hidden)
    if args.init:
        write_safetensors(args.init, [(n, p.detach().numpy().astype(np.float32))
                                      for n, p in model.kiln_names()], {})
        return
    if args.steps < 1 or not args.shard:
        sys.exit("pytorch_lstm.py: need --shard and --steps >= 1")
    x, y = first_batch(args.shard, args.batch, SHAPES[args.model]["T"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    model.train()
    losses = []
    t0 = c0 = None
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - t0
    cpu_s = time.process_time() - c0
    if not all(math.isfinite(v) for v in losses):
        sys.exit("pytorch_lstm.py: the loss is not finite")
    print(json.dumps({
        "impl": "pytorch", "torch": torch.__version__, "model": args.model,
        "train_samples_per_s": args.steps * args.batch / train_s, "batch": args.batch,
        "threads": args.threads, "steps": args.warmup_steps + args.steps,
        "timed_steps": args.steps, "train_s": train_s,
        "cpu_ms_per_step": 1000 * cpu_s / args.steps, "loss_first": losses[0],
        "loss_last": losses[-1], "mkldnn": torch.backends.mkldnn.is_available(),
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}}),
        flush=True)


if __name__ == "__main__":
    main()
