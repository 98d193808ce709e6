"""tests/tok_pads.py - the padded token set the token-mean tests share
(tests/eval_token_mean.sh, tests/loss_plugin_abi.sh, tests/nonfinite_logs.sh),
with Python's standard library only:

    python3 tests/tok_pads.py DIR WINDOWS SEED [LOSS [EVAL]]

writes in DIR
  tok.bin        a token shard (docs/formats.md, token shards) of WINDOWS
                 windows of 8 tokens of a vocabulary of 11, each window's
                 share of pads (token 0) drawn from 0, 10%, 50% and 90%,
                 then one token more (the last window's last target), all
                 drawn from random.Random(SEED);
  w.safetensors  emb.weight [11, 11] f32 (tests/st.py), uniform in [-3, 3]
                 from the same generator after the tokens: row x is the
                 logits after token x;
  pad.bin        81 pads: 10 windows whose every target is ignored;
  LOSS.ini       the model: an embedding of 11 x 11 (the weights' rows are
                 the logits) under layer type LOSS (default softmax_xent,
                 which gets ignore_index = 0; a loss plugin's rule is its
                 own), trained on tok.bin unshuffled, evaluated on EVAL
                 (tok.bin or pad.bin; default tok.bin), 1 thread, workers
                 0, no out_dir: a test adds its own keys on the command
                 line (run.out_dir=, model.init_from=, train.*);
and prints the reference over tok.bin's windows, in double: "LOSS ACC N",
the mean over the N targets that are not pads of logsumexp(W[x]) - W[x][y]
(x a token, y the next), and the share of them whose row's first arg max
is y.  The same arguments write the same bytes.
"""
import math
import os
import random
import struct
import sys

import st

V, T, MAGIC = 11, 8, 20240520


def shard(path, toks):
    """A token shard of u16 ids: the 1 KiB header (magic, version 1, count)."""
    hdr = [MAGIC, 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))


def main(argv):
    if len(argv) < 4 or len(argv) > 6:
        sys.exit("usage: tok_pads.py DIR WINDOWS SEED [LOSS [EVAL]]")
    d, n, seed = argv[1], int(argv[2]), int(argv[3])
    loss_type = argv[4] if len(argv) > 4 else "softmax_xent"
    ev = argv[5] if len(argv) > 5 else "tok.bin"
    os.makedirs(d, exist_ok=True)
    rng = random.Random(seed)
    toks = []
    for _ in range(n):
        p = rng.choice([0.0, 0.1, 0.5, 0.9])
        toks += [0 if rng.random() < p else rng.randrange(1, V) for _ in range(T)]
    toks.append(rng.randrange(1, V))
    shard(os.path.join(d, "tok.bin"), toks)
    shard(os.path.join(d, "pad.bin"), [0] * 81)
    # f32 weights: the values kiln reads
    W = list(struct.unpack("<%df" % (V * V), struct.pack("<%df" % (V * V),
                           *[rng.uniform(-3, 3) for _ in range(V * V)])))
    st.write(os.path.join(d, "w.safetensors"), {"emb.weight": ([V, V], W)})
    with open(os.path.join(d, loss_type + ".ini"), "w") as f:
        f.write("[run]\nthreads = 1\nout_dir =\n"
                "[data]\nsource = tokens\npath = %s\ncontext = %d\nvocab = %d\nshuffle = 0\n"
                "workers = 0\n[data.eval]\npath = %s\n"
                "[layer.emb]\ntype = embedding\nvocab = %d\ndim = %d\n"
                "[layer.loss]\ntype = %s\n%s"
                % (os.path.join(d, "tok.bin"), T, V, os.path.join(d, ev), V, V, loss_type,
                   "ignore_index = 0\n" if loss_type == "softmax_xent" else ""))
    loss = 0.0
    count = right = 0
    for i in range(n * T):
        x, y = toks[i], toks[i + 1]
        if y == 0:
            continue
        row = W[x * V:(x + 1) * V]
        m = max(row)
        loss += m + math.log(sum(math.exp(v - m) for v in row)) - row[y]
        right += row.index(m) == y
        count += 1
    print("%.9f %.9f %d" % (loss / count, right / count, count))


if __name__ == "__main__":
    main(sys.argv)
