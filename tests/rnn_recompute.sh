#!/bin/sh
# tests/rnn_recompute.sh - `[layer.X] recompute = 1` (docs/memory.md,
# "Gradient checkpointing") on the recurrent layers of a seq2seq model, and
# where the key can free nothing:
#  1. on the encoder's two LSTMs of examples/seq2seq.ini, which feed a
#     concat (whose backward reads no input, so no backward reads their
#     outputs): `kiln memory` marks both recomputed and predicts less than
#     the plan without (before session 41 the key was silently a no-op
#     there: nothing recomputed, the same 12,380,928 bytes, their 2.75 MiB
#     of saved state each kept from the forward to the backward);
#  2. the same on a small seq2seq model trained 4 AdamW steps ends with the
#     parameters and both moments of the run without, bit for bit;
#  3. a layer that keeps nothing and whose output no backward reads (a
#     linear layer feeding a concat), a loss layer and a flatten of the
#     data (a view) with the key: one warning each, naming the line and
#     why, said once in a run with evaluations (before: nothing);
#  4. a batchnorm feeding a separate relu with the key (the rule is not the
#     recurrent layers'): replayed, the same bytes as without.
name=rnn_recompute
. "$(dirname "$0")/lib.sh"
tool="$abs_top_builddir/tests/ckpt_tool"
json_field() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$out"; }

# ---- 1. kiln memory of examples/seq2seq.ini -----------------------------------
kiln 0 memory "$srcdir/examples/seq2seq.ini"
base=$(json_field activations)
kiln 0 memory "$srcdir/examples/seq2seq.ini" layer.enc.fwd.recompute=1 layer.enc.bwd.recompute=1
rec=$(json_field activations)
[ "$(json_field recomputed)" = 2 ] || fail "the encoder's LSTMs are not recomputed: $(grep recomputed "$out")"
stdout_matches '^  enc\.fwd +lstm +[0-9.]+ +2\.751 +[0-9.]+  recomputed$'
stdout_matches '^  enc\.bwd +lstm +[0-9.]+ +2\.751 +[0-9.]+  recomputed$'
[ -n "$base" ] && [ -n "$rec" ] && [ "$rec" -lt $((base - 4 * 1048576)) ] ||
	fail "recomputing the encoder's LSTMs does not free their saved state: activations $rec bytes, $base without"
grep -q "recomputes nothing" "$err" && fail "the encoder's LSTMs said to recompute nothing"

# ---- 2. training: the same bytes ---------------------------------------------
cat >"$tmp/s2s.ini" <<EOF2
[run]
threads = 1
seed = 1
[data]
source = seq2seq
samples = 256
length = 6
min_length = 3
task = reverse
[train]
optimizer = adamw
lr = 0.01
batch = 16
max_steps = 4
eval = 0
[layer.enc.embed]
type = embedding
vocab = 11
dim = 8
[layer.enc.fwd]
type = lstm
hidden = 12
inputs = enc.embed, data
pad_id = 0
[layer.enc.bwd]
type = gru
hidden = 12
reverse = 1
inputs = enc.embed, data
pad_id = 0
[layer.enc.out]
type = concat
inputs = enc.fwd, enc.bwd
dim = -1
[layer.dec]
type = lstm
hidden = 16
inputs = enc.out, data
pad_id = 0
[layer.head]
type = linear
out = 11
[layer.loss]
type = softmax_xent
ignore_index = 0
EOF2
kiln 0 train "$tmp/s2s.ini" "run.out_dir=$tmp/plain"
kiln 0 train "$tmp/s2s.ini" "run.out_dir=$tmp/rec" layer.enc.fwd.recompute=1 layer.enc.bwd.recompute=1
stderr_has "[core] recompute: 0 segments, 2 layers' outputs recomputed in the backward"
"$tool" same "$(ck plain 4)" "$(ck rec 4)" params optim.exp_avg optim.exp_avg_sq ||
	fail "recomputing the encoder's LSTM and GRU changes the training"

# ---- 3. where the key frees nothing: said -------------------------------------
cat >"$tmp/w.ini" <<EOF2
[run]
threads = 1
[data]
source = synthetic
samples = 64
image_size = 4
classes = 5
[data.eval]
samples = 16
[train]
batch = 16
max_steps = 2
eval_every = 1
[layer.flat]
type = flatten
recompute = 1
[layer.fc1]
type = linear
out = 8
recompute = 1
[layer.cat]
type = concat
inputs = fc1, flat
[layer.head]
type = linear
out = 5
[layer.loss]
type = softmax_xent
recompute = 1
EOF2
kiln 0 train "$tmp/w.ini" run.out_dir=
stderr_has "[core] warning: $tmp/w.ini:16: [layer.flat] recompute = 1 recomputes nothing: its output is a view of the data input, which is kept"
stderr_has "[core] warning: $tmp/w.ini:20: [layer.fc1] recompute = 1 recomputes nothing: no backward reads its output and its forward keeps nothing for its backward, so the output is freed after its last forward reader already"
stderr_has "[core] warning: $tmp/w.ini:29: [layer.loss] recompute = 1 recomputes nothing: a loss layer stores no output"
[ "$(grep -c "recomputes nothing" "$err")" = 3 ] ||
	fail "the warnings are not said once each: $(grep -c "recomputes nothing" "$err") lines"

# ---- 4. not only recurrent layers: a batchnorm feeding a separate relu -------
# (its output no backward reads, its forward keeps its statistics): replayed
# before its backward, the training the same bytes as without the key
cat >"$tmp/bn.ini" <<EOF2
[run]
threads = 1
seed = 1
[data]
source = synthetic
samples = 64
image_size = 6
classes = 5
[train]
optimizer = adamw
lr = 0.01
batch = 16
max_steps = 3
eval = 0
[layer.conv]
type = conv
out = 4
kernel = 3
[layer.bn]
type = batchnorm
[layer.act]
type = relu
[layer.flat]
type = flatten
[layer.head]
type = linear
out = 5
[layer.loss]
type = softmax_xent
EOF2
kiln 0 train "$tmp/bn.ini" "run.out_dir=$tmp/bnplain"
kiln 0 train "$tmp/bn.ini" "run.out_dir=$tmp/bnrec" layer.bn.recompute=1
grep -q "recomputes nothing" "$err" && fail "the batchnorm said to recompute nothing"
stderr_has "[core] recompute: 0 segments, 1 layers' outputs recomputed in the backward"
"$tool" same "$(ck bnplain 3)" "$(ck bnrec 3)" params optim.exp_avg optim.exp_avg_sq ||
	fail "recomputing the batchnorm changes the training"
echo "PASS: $checks checks"
