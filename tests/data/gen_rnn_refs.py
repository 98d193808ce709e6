#!/usr/bin/python3
"""Reference tensors for kiln's recurrent layers (tests/check_rnn.c):
PyTorch 1.13's nn.LSTM / nn.GRU (batch_first) and autograd.

Each case is a model, written as kiln INI text (metadata "<case>.ini"):

    unmasked:  x [B, T, I]                     -> rnn stack -> flatten -> fc -> loss
    masked:    ids [B, T] -> embedding "emb" -> rnn stack -> flatten -> fc -> loss

The rnn stack is nn.LSTM/nn.GRU(I, H, num_layers = L, bidirectional = D == 2,
batch_first = True).  In kiln, layer k of direction d is the layer "r<k>"
(forward) or "r<k>r" (reverse, `reverse = 1`), both with `index = k`, and a
bidirectional layer's two outputs are joined by the concat "c<k>" (dim = -1).
Masked cases pad each row after its length with the pad id 0 and give the
ids as the rnn layers' second input (`pad_id = 0`); PyTorch runs them
through pack_padded_sequence / pad_packed_sequence(total_length = T).
fc is linear(5), loss softmax_xent (mean over the batch).

A "last" case ends the stack in its final hidden state instead: the top
layer's kiln layers have `last = 1` ([B, H] each, joined by the concat on
the last dimension when bidirectional) and feed fc directly; PyTorch's
model takes h_n of the top layer, torch.cat([h_n[-2], h_n[-1]], 1) when
bidirectional (h_n[-1] when not), into fc = Linear(H * D, K).

The shape [B, T, I] is the metadata "shape", or "<case>.shape" for a case
of its own batch and length (one row of one step).

Stored per case: "<case>/x" (f32, or "<case>/ids" i32), "/labels" (i32),
"/loss" (f32[1]), "/dx" (unmasked), "/param/<kiln name>" and
"/grad/<kiln name>" for every parameter.  Each case is also run in float64
from the same float32 start; the script fails if float32 differs from it by
more than 1e-5 of the tensor's largest magnitude (floor 0.1).

Deterministic: each case seeds torch with crc32(case name), one thread.

Run: /usr/bin/python3 tests/data/gen_rnn_refs.py tests/data/rnn_refs.safetensors
"""
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from safetensors_io import read_safetensors, write_safetensors

B, T, I, H, K, V = 3, 5, 4, 6, 5, 7
LENGTHS = [5, 3, 1]

# name, cell, layers, directions, masked (, options: "bt" (batch, time):
# B, T unless given, masked cases take B, T and LENGTHS; "last": the top
# layer's final hidden state into fc)
CASES = [
    ("lstm_l1", "lstm", 1, 1, 0),
    ("gru_l1", "gru", 1, 1, 0),
    ("lstm_l2_bi", "lstm", 2, 2, 0),
    ("gru_l2_bi", "gru", 2, 2, 0),
    ("lstm_l1_mask", "lstm", 1, 1, 1),
    ("gru_l1_mask", "gru", 1, 1, 1),
    ("lstm_l2_bi_mask", "lstm", 2, 2, 1),
    ("gru_l2_bi_mask", "gru", 2, 2, 1),
    # one row of one step: weight_hh's gradient is 0 (h0 = 0); oneDNN 2.6
    # multiplied the gates' gradient by h1 there (plugins/cpu/rnn.c)
    ("lstm_l1_b1t1", "lstm", 1, 1, 0, {"bt": (1, 1)}),
    ("lstm_l2_bi_b1t1", "lstm", 2, 2, 0, {"bt": (1, 1)}),
    ("gru_l1_b1t1", "gru", 1, 1, 0, {"bt": (1, 1)}),
    ("lstm_l1_b1t2", "lstm", 1, 1, 0, {"bt": (1, 2)}),
    # h_n: the forward direction's at each row's length - 1 (not T - 1
    # when the row is padded), the reverse direction's at t = 0
    ("lstm_l1_last", "lstm", 1, 1, 0, {"last": 1}),
    ("gru_l1_last", "gru", 1, 1, 0, {"last": 1}),
    ("lstm_l2_bi_last", "lstm", 2, 2, 0, {"last": 1}),
    ("gru_l2_bi_last", "gru", 2, 2, 0, {"last": 1}),
    ("lstm_l1_last_mask", "lstm", 1, 1, 1, {"last": 1}),
    ("gru_l1_last_mask", "gru", 1, 1, 1, {"last": 1}),
    ("lstm_l2_bi_last_mask", "lstm", 2, 2, 1, {"last": 1}),
    ("gru_l2_bi_last_mask", "gru", 2, 2, 1, {"last": 1}),
]


def ini_text(cell, L, D, masked, last):
    out = []
    prev = "data"
    if masked:
        out.append("[layer.emb]\ntype = embedding\nvocab = %d\ndim = %d\n" % (V, I))
        prev = "emb"
    for k in range(L):
        names = ["r%d" % k] + (["r%dr" % k] if D == 2 else [])
        for d, n in enumerate(names):
            inputs = "%s, data" % prev if masked else prev
            out.append("[layer.%s]\ntype = %s\nhidden = %d\nindex = %d\nreverse = %d\n"
                       "inputs = %s\n%s%s" % (n, cell, H, k, d, inputs,
                                              "pad_id = 0\n" if masked else "",
                                              "last = 1\n" if last and k == L - 1 else ""))
        if D == 2:
            out.append("[layer.c%d]\ntype = concat\ninputs = %s\ndim = -1\n" % (k, ", ".join(names)))
            prev = "c%d" % k
        else:
            prev = names[0]
    if not last:
        out.append("[layer.flat]\ntype = flatten\ninput = %s\n" % prev)
    out.append("[layer.fc]\ntype = linear\nout = %d\ninput = %s\n" % (K, "flat" if not last else prev))
    out.append("[layer.loss]\ntype = softmax_xent\n")
    return "".join(out)


def kiln_name(torch_name):
    """rnn.weight_ih_l1_reverse -> r1r.weight_ih_l1_reverse"""
    base = torch_name.split(".", 1)[1]
    k = base.split("_l")[1].split("_")[0]
    return "r%s%s.%s" % (k, "r" if base.endswith("_reverse") else "", base)


def build(cell, L, D, T, last):
    mod = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    m = torch.nn.Module()
    m.rnn = mod(I, H, num_layers=L, bidirectional=D == 2, batch_first=True)
    m.fc = torch.nn.Linear((1 if last else T) * H * D, K)
    return m


def final_hidden(h, D):
    """The top layer's h_n [B, H * D] of nn.LSTM's (h_n, c_n) or nn.GRU's h_n."""
    hn = h[0] if isinstance(h, tuple) else h
    return torch.cat([hn[-2], hn[-1]], 1) if D == 2 else hn[-1]


def run(m, masked, inp, labels, dtype, emb, B, T, last, D):
    m = m.to(dtype)
    for p in m.parameters():
        p.grad = None
    if masked:
        e = emb.to(dtype).clone().requires_grad_(True)
        x = F.embedding(inp, e)
        packed = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=True,
                                      enforce_sorted=False)
        y, h = m.rnn(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    else:
        e = None
        x = inp.to(dtype).clone().requires_grad_(True)
        y, h = m.rnn(x)
    logits = m.fc(final_hidden(h, D) if last else y.reshape(B, -1))
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {"emb.weight": e.grad} if masked else {"dx": x.grad}
    for n, p in m.named_parameters():
        grads[n] = p.grad
    return loss.detach(), grads


def close(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max()) <= 1e-5 * max(0.1, float(b.abs().max()))


def main(path):
    torch.set_num_threads(1)
    tensors, names, meta = [], [], {}
    for name, cell, L, D, masked, *opts in CASES:
        opts = opts[0] if opts else {}
        bt, last = opts.get("bt"), opts.get("last", 0)
        b_, t_ = bt if bt else (B, T)
        torch.manual_seed(zlib.crc32(name.encode()))
        m = build(cell, L, D, t_, last)
        emb = torch.randn(V, I)
        if masked:
            inp = torch.randint(1, V, (B, T), dtype=torch.int32)
            for b, n in enumerate(LENGTHS):
                inp[b, n:] = 0
            inp_t = inp.long()
        else:
            inp = inp_t = torch.randn(b_, t_, I)
        labels = torch.randint(0, K, (b_,), dtype=torch.int32)
        start = {n: p.detach().clone() for n, p in m.named_parameters()}
        loss, grads = run(m, masked, inp_t, labels.long(), torch.float32, emb, b_, t_, last, D)
        m64 = build(cell, L, D, t_, last)
        with torch.no_grad():
            for n, p in m64.named_parameters():
                p.copy_(start[n])
        loss64, grads64 = run(m64, masked, inp_t, labels.long(), torch.float64, emb, b_, t_,
                              last, D)
        assert close(loss, loss64), name + ": loss"
        for k in grads:
            assert close(grads[k], grads64[k]), "%s: %s float32 is off float64" % (name, k)
        key = lambda n: kiln_name(n) if n.startswith("rnn.") else n
        tensors.append(("%s/%s" % (name, "ids" if masked else "x"), inp.numpy()))
        tensors.append(("%s/labels" % name, labels.numpy()))
        tensors.append(("%s/loss" % name, loss.reshape(1).float().numpy()))
        if masked:
            tensors.append(("%s/param/emb.weight" % name, emb.float().numpy()))
        for n, p in start.items():
            tensors.append(("%s/param/%s" % (name, key(n)), p.float().contiguous().numpy()))
        for n, g in grads.items():
            where = "dx" if n == "dx" else "grad/" + key(n)
            tensors.append(("%s/%s" % (name, where), g.float().contiguous().numpy()))
        meta[name + ".ini"] = ini_text(cell, L, D, masked, last)
        meta[name + ".masked"] = str(masked)
        if bt:
            meta[name + ".shape"] = "%d,%d,%d" % (b_, t_, I)
        names.append(name)
    meta["cases"] = ",".join(names)
    meta["shape"] = "%d,%d,%d" % (B, T, I)
    meta["generator"] = "tests/data/gen_rnn_refs.py, torch %s" % torch.__version__
    write_safetensors(path, tensors, meta)
    back, _ = read_safetensors(path)
    for k, a in tensors:
        assert np.array_equal(back[k], a), k


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "rnn_refs.safetensors")
