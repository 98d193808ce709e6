#!/bin/sh
# tests/rough_edges.sh - what a new user trips over on day one (issue 24),
# on the tiny model and data of tests/data/tr_cnn.ini:
#  1. idx `mean` with three values on 1-channel images names the count;
#  2. a layer's error carries its context once ("layer 'conv1' (conv): "),
#     not twice;
#  3. `section.key=` on the command line unsets a key (its default applies);
#  4. without evaluation the final JSON (stdout, metrics.jsonl) says null
#     for test_loss and test_acc; the final line's wall_s = setup_s + fit_s;
#  5. [data] limit is logged with the count it keeps (all, when it is past
#     the source's count), and [data.eval] does not inherit it: evaluation
#     takes the whole test set;
#  6. after a resume within an epoch, the epoch's train_loss averages the
#     whole epoch (the checkpoint's partial sums), as an uninterrupted run's,
#     bit for bit (metrics.jsonl's final line) where the checkpoint is
#     between two log points (its "interval" section: before session 39
#     the device's sums restarted at 0, the loss off in the last bits),
#     and the first train row after it is the uninterrupted run's (before,
#     it averaged step 3 alone);
#  7. KILN_LOG_LEVEL shows debug lines or hides info lines;
#  8. --resume with [train] epochs below the checkpoint's epoch evaluates
#     and reports the checkpoint, as max_steps below its step does; kiln
#     report shows a null final number as missing;
#  9. an empty config file, and the folder source without `channels`,
#     are errors pointing at the file and the [data] section.
# 10. a loss whose logits have another number of rows a sample than the
#     data has labels (token labels [B, T] against logits [B, V]) is a
#     config error naming the layer and both shapes (before session 28 it
#     trained on the first tokens as class labels, or read past them);
#     an embedding's vocab below the data's token ids (the evaluation's
#     too: session 33), and the loss's
#     `classes` below the labels', are config errors naming the key; a
#     model too big for the device names its size and largest tensor.
# 11. a log interval of which every step was skipped (non-finite gradients,
#     the loss finite) stops the run as diverged, exit 3, when the loss scale
#     cannot back off (fp16_static; before session 28 it ran on with its
#     parameters frozen, exit 0); fp16's dynamic scale from 2^40 backs off and
#     trains; [train] pct_start = 0 with onecycle and nesterov without
#     momentum are config errors naming the key.
# 12. an evaluation between two log points (eval_every off them) keeps the
#     training sums it reads off the device for the next log point: the
#     epoch's train loss and accuracy equal eval_every = 0's (before session
#     28 they were dropped while their samples still counted).
# 13. early stopping's state is in the checkpoint: a run stopped at step 4
#     and resumed stops early at step 6, as the uninterrupted run (before
#     session 28 the resumed run started its patience afresh: step 10).
# 14. the samples an epoch leaves out (whole optimizer steps: batch x
#     accumulate, the leftover micro-batches too) are logged at the start,
#     and a step larger than the set names the samples it needs.
# 15. on a terminal (script(1)'s pty) the progress bar is redrawn with
#     "\r\033[K", but with TERM=dumb it is a line per log point, no escape
#     (before session 36 a dumb terminal showed the escapes); a run of
#     lr = 0 that diverges is not told to lower lr.
name=rough
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"

need_source idx
d="data.path=$data"

# 1
kiln 2 train "$ini" "$d" "data.mean=0.1 0.2 0.3" run.out_dir=
stderr_has "[data] mean = '0.1 0.2 0.3' gives 3 values, but the idx source's images have 1 channel"
# a mean that is inf in f32 (every sample -inf, silently before session 40)
kiln 2 train "$ini" "$d" "data.mean=1e300" run.out_dir=
stderr_has "[data] mean = 1e+300, std = 1: (u8/255 - mean) / std is not finite in f32"
! grep -q "is not a number" "$err" || fail "the count is reported as 'is not a number'"

# 2
kiln 2 train "$ini" "$d" layer.conv1.groups=3 run.out_dir=
stderr_has "layer 'conv1' (conv): groups = 3"
[ "$(grep -o "layer 'conv1' (conv)" "$err" | wc -l)" -eq 1 ] || fail "the layer's context is repeated"

# 3: the last override empties bias: conv decides (no bias before batchnorm)
kiln 0 train "$ini" "$d" layer.conv1.bias=1 layer.conv1.bias= train.max_steps=1 run.out_dir=
stderr_has "layer 'conv1': convolution followed by batchnorm gets no bias"
kiln 2 train "$ini" "$d" layer.conv1.bias=maybe run.out_dir=
stderr_has "'bias' = 'maybe' is not a boolean"

# 4
kiln 0 train "$ini" "$d" train.eval=0 "run.out_dir=$tmp/noeval"
stdout_has '"test_loss": null, "test_acc": null,'
grep -q '"event":"final".*"test_loss":null,"test_acc":null' "$tmp/noeval/metrics.jsonl" ||
	fail "metrics.jsonl's final line lacks null test metrics"
# ... and splits wall_s into setup_s + fit_s, both positive
sed -n 's/.*"event":"final".*"wall_s":\([0-9.e+-]*\),"setup_s":\([0-9.e+-]*\),"fit_s":\([0-9.e+-]*\)}$/\1 \2 \3/p' \
	"$tmp/noeval/metrics.jsonl" | awk '{ d = $1 - $2 - $3; if (NF == 3 && $2 > 0 && $3 > 0 && d < 1e-4 && d > -1e-4) ok = 1 }
		END { exit !ok }' || fail "metrics.jsonl's final line: wall_s is not setup_s + fit_s"

# 5
kiln 0 train "$ini" "$d" data.limit=16 train.max_steps=1 run.out_dir=
stderr_has "[data] limit = 16: the first 16 of the source's 48 samples"
stdout_has '"test_samples": 48,'
# ... and a limit past the source's count says that all are used
kiln 0 train "$ini" "$d" data.limit=100 train.max_steps=1 run.out_dir=
stderr_has "[data] limit = 100 is more than the source's 48 samples: all 48 are used"

# 6: steps 1..6 in one run, and 1..2 + a resume from step 2's checkpoint
#    (taken between two log points: log_every 3) for 3..6
one="train.max_steps=0 train.log_every=3"
kiln 0 train "$ini" "$d" $one "run.out_dir=$tmp/whole"
final_loss() { sed -n 's/.*"event":"final".*"train_loss":\([0-9.e+-]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }
whole=$(final_loss "$tmp/whole")
kiln 0 train "$ini" "$d" $one train.max_steps=4 train.checkpoint_every=2 train.keep_last=0 \
	"run.out_dir=$tmp/cut"
rm "$tmp/cut/checkpoints/ckpt-4.kiln"
kiln 0 train "$ini" "$d" $one train.checkpoint_every=2 train.keep_last=0 --resume \
	"run.out_dir=$tmp/cut"
stdout_has '"resumed_step": 2'
resumed=$(final_loss "$tmp/cut")
[ -n "$whole" ] && [ "$whole" = "$resumed" ] ||
	fail "train_loss after the resume is $resumed, the uninterrupted run's $whole"
# ... and the first train row after it (step 3, the later of the two the
# directory holds) averages steps 1..3, as the uninterrupted run's did
row3() { sed -n 's/.*"event":"train","epoch":1,"step":3,\("loss":[^,]*,"acc":[^,]*\),.*/\1/p' "$1/metrics.jsonl" | tail -1; }
[ -n "$(row3 "$tmp/whole")" ] && [ "$(row3 "$tmp/whole")" = "$(row3 "$tmp/cut")" ] ||
	fail "step 3's row after the resume: $(row3 "$tmp/cut"), the uninterrupted run's $(row3 "$tmp/whole")"
# 7: KILN_LOG_LEVEL sets what reaches stderr: debug lines only when asked,
#    info lines not at "error", another value refused
export KILN_LOG_LEVEL=debug
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
stderr_has "[train] debug: schedule"
export KILN_LOG_LEVEL=error
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
! grep -q "gets no bias" "$err" || fail "KILN_LOG_LEVEL=error still prints info lines"
export KILN_LOG_LEVEL=loud
kiln 2 --version
stderr_has "KILN_LOG_LEVEL = 'loud' is not one of error, warn, info, debug"
unset KILN_LOG_LEVEL
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
! grep -q "debug:" "$err" || fail "debug lines without KILN_LOG_LEVEL=debug"
stderr_has "gets no bias"
# 8: --resume with [train] epochs below the checkpoint's epoch (step 9,
#    epoch 2 of 6-step epochs, resumed with epochs = 1) does as max_steps
#    below its step does: no step, the checkpoint's epoch line and
#    evaluation, its numbers in the final JSON (the old code said epochs 0,
#    train_loss 0, test_loss null); kiln report shows the null test_loss of
#    a run without evaluation as missing, not 0
kiln 0 train "$ini" "$d" train.max_steps=0 train.epochs=4 train.eval=1 train.checkpoint_every=9 \
	train.keep_last=0 "run.out_dir=$tmp/ep"
rm "$tmp/ep/checkpoints/ckpt-18.kiln" "$tmp/ep/checkpoints/ckpt-24.kiln"
kiln 0 train "$ini" "$d" train.max_steps=4 train.epochs=4 train.eval=1 --resume "run.out_dir=$tmp/ep"
by_steps=$(sed 's/"train_samples_per_s".*//' "$out")
kiln 0 train "$ini" "$d" train.max_steps=0 train.epochs=1 train.eval=1 --resume "run.out_dir=$tmp/ep"
stdout_has '{"epochs": 2, "steps": 9, "train_loss": '
[ "$(sed 's/"train_samples_per_s".*//' "$out")" = "$by_steps" ] ||
	fail "epochs = 1 resumed: $(cat "$out"); max_steps = 4 resumed: $by_steps"
stdout_matches '"test_loss": [0-9.]+, "test_acc": [0-9.]+'
tail -1 "$tmp/ep/metrics.jsonl" | grep -q '"event":"final","epochs":2,"steps":9,"train_loss":[0-9.]*,"test_loss":[0-9.]' ||
	fail "metrics.jsonl's final line: $(tail -1 "$tmp/ep/metrics.jsonl")"
[ "$(ls "$tmp/ep/checkpoints" | tr '\n' ' ')" = "ckpt-9.kiln " ] ||
	fail "checkpoints after the resumes: $(ls "$tmp/ep/checkpoints" | tr '\n' ' ')"
kiln 0 report "$tmp/noeval"
grep -q '<td>test loss</td><td><span class="note">none (no evaluation)</span></td>' "$tmp/noeval/report.html" ||
	fail "kiln report: a null test_loss (no evaluation) is not shown as none: $(grep -o '<td>test loss</td><td>[^/]*' "$tmp/noeval/report.html")"
grep -q '<td>steps</td><td>5</td>' "$tmp/noeval/report.html" || fail "kiln report: steps is not 5"
# 9: where a config error points: an empty or comments-only config file
#    names the file (not "command line"); the folder source without
#    `channels` (its images' channels unknown before decoding) names the
#    [data] section's line and says why (not "default:", "images vary")
printf '; only comments\n# nothing\n' >"$tmp/comments.ini"
kiln 2 train "$tmp/comments.ini" "$d" data.images=tr_cnn_images.idx data.labels=tr_cnn_labels.idx \
	data.eval.images=tr_cnn_images.idx data.eval.labels=tr_cnn_labels.idx train.batch=8 run.out_dir=
stderr_has "kiln: error: $tmp/comments.ini: no [layer.NAME] sections: the model is empty"
python3 - "$tmp/fold" <<'EOF' || fail "python3 could not write the PNGs"
import os, struct, sys, zlib
def chunk(k, v):
    return struct.pack(">I", len(v)) + k + v + struct.pack(">I", zlib.crc32(k + v))
for c in ("a", "b"):
    os.makedirs(os.path.join(sys.argv[1], c))
    body = zlib.compress(b"".join(b"\0" + bytes(8) for _ in range(8)))
    open(os.path.join(sys.argv[1], c, "0.png"), "wb").write(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", body) + chunk(b"IEND", b""))
EOF
printf '[data]\nsource = folder\npath = %s\nsize = 8\n[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 2\n[layer.loss]\ntype = softmax_xent\n' \
	"$tmp/fold" >"$tmp/fold.ini"
kiln 2 train "$tmp/fold.ini" run.out_dir=
stderr_has "kiln: error: $tmp/fold.ini:1: [data] channels = 0 (as the source), but the source does not say how many its images have (it decodes each as it is, gray or colour): set channels = 1 or 3"
# 10: logits [B, V] against the token labels [B, T] of tests/data/gpt_tiny.ini
printf '[run]\nthreads = 1\n[data]\nsource = tokens\npath = %s\ncontext = 13\nvocab = 64\n[train]\nbatch = 3\nmax_steps = 1\neval = 0\n[layer.emb]\ntype = embedding\nvocab = 64\ndim = 8\n[layer.flat]\ntype = flatten\n[layer.head]\ntype = linear\nout = 64\n[layer.loss]\ntype = softmax_xent\n' \
	"$srcdir/tests/data/gpt_tokens.bin" >"$tmp/rows.ini"
kiln 2 train "$tmp/rows.ini" run.out_dir=
stderr_has "kiln: error: $tmp/rows.ini:22: the loss layer 'loss' reads logits [batch, 64], 1 row(s) of classes a sample, but the data [data] has 13 label(s) a sample (tokens)"
# 10b (session 29): an embedding whose vocab is below the data's token ids,
# and a loss whose `classes` is below the largest label, are config errors
# naming the key (before, the first failed in the forward naming a flat
# position in the batch, the second in the backward naming a row, exit 3)
grep -v '^\[layer.flat\]$\|^type = flatten$' "$tmp/rows.ini" >"$tmp/vocab.ini"
kiln 2 train "$tmp/vocab.ini" run.out_dir= layer.emb.vocab=40
# (the largest token's place with [data] vocab set too: since session 38)
stderr_has "command line 'layer.emb.vocab=40': layer 'emb' (embedding) has vocab = 40 but the data [data] has token ids up to 63 (a vocabulary of 64, the largest at $srcdir/tests/data/gpt_tokens.bin: token offset 53 (byte 1130)): set vocab = 64"
# ... and so are the evaluation's token ids, at startup (before session 33
# the run trained, then failed in the embedding's forward naming no file):
# a shard of 40 tokens, one of them 100
python3 - "$tmp/hi.bin" <<'EOF' || fail "python3 could not write the shard"
import struct, sys
toks = [i % 64 for i in range(40)]
toks[17] = 100
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) +
                              struct.pack("<%dH" % len(toks), *toks))
EOF
kiln 2 train "$tmp/vocab.ini" run.out_dir= train.eval=1 "data.eval.path=$tmp/hi.bin" data.eval.vocab=0 \
	layer.head.out=128
stderr_has "$tmp/vocab.ini:14: layer 'emb' (embedding) has vocab = 64 but the data [data.eval] has token ids up to 100 (a vocabulary of 101, the largest at $tmp/hi.bin: token offset 17 (byte 1058)): set vocab = 101"
# (the shard and the place of the largest id: before session 34 only the
# section was named, which over thousands of shards finds nothing) and the
# same for a last layer too small for them
kiln 2 train "$tmp/vocab.ini" run.out_dir= train.eval=1 "data.eval.path=$tmp/hi.bin" data.eval.vocab=0
stderr_has "the model has 64 outputs but the data [data.eval] has 101 classes (the largest label, 100, is at $tmp/hi.bin: token offset 17 (byte 1058)): set out = 101"
# 10c (session 38): a [data] vocab padded past the loss's classes (llm.c's
# 50304 for GPT-2's 50257) trains when every token is below classes
# (before, refused with the advice to count the padding as classes) ...
kiln 0 train "$tmp/vocab.ini" run.out_dir= data.vocab=72 layer.emb.vocab=72 layer.head.out=72 \
	layer.loss.classes=64
# ... and a token past classes is refused naming it and its place
kiln 2 train "$tmp/vocab.ini" run.out_dir= "data.path=$tmp/hi.bin" data.vocab=128 layer.emb.vocab=128 \
	layer.head.out=128 layer.loss.classes=64
stderr_has "kiln: error: command line 'layer.loss.classes=64': the loss layer 'loss' counts 64 classes but the data [data] has a label 100 (the largest, at $tmp/hi.bin: token offset 17 (byte 1058)): a label must be below classes; check the data, or set classes = 101 if it is a class"
kiln 2 train "$ini" "$d" run.out_dir= layer.loss.classes=3
stderr_has "command line 'layer.loss.classes=3': the loss layer 'loss' counts 3 classes but the data [data] has 5: set classes = 5 (or 0: every logit a class)"
# ... but a largest label that is the ignore_index is no class: accepted
# (review of session 29: the new check refused it)
kiln 0 train "$ini" "$d" run.out_dir= layer.loss.classes=4 layer.loss.ignore_index=4 train.max_steps=2
# a shape typed wrong: the parameters' allocation fails in the model's
# terms, naming the largest tensor (before: "cpu: alloc of N bytes failed")
kiln 1 train "$ini" "$d" run.out_dir= layer.conv1.out=1000000000
stderr_has "kiln: error: the model's parameters and their gradients (678.00 GiB, 91000000016 floats; the largest tensor 'fc1.weight' f32[5, 16000000000]): cpu: alloc of"
# 11: skipped intervals, and two schedule/optimizer keys
kiln 3 train "$ini" data.path="$data" run.out_dir= run.precision=fp16_static plugin.amp.loss_scale=1e30 train.max_steps=4 train.log_every=2
stderr_has "steps 1..2 (epoch 1): every step had non-finite gradients and was skipped, the loss finite"
kiln 0 train "$ini" data.path="$data" run.out_dir= run.precision=fp16 plugin.amp.init_scale=1099511627776 train.max_steps=40 train.log_every=10
grep -qE 'step [0-9]+: ([0-9]+) step\(s\) of the last \1 skipped' "$err" ||
	fail "fp16 from 2^40: no interval skipped whole while the scale backed off (the case is not exercised)"
kiln 2 train "$ini" data.path="$data" run.out_dir= train.schedule=onecycle train.pct_start=0 train.max_steps=2
stderr_has "command line 'train.pct_start=0': [train] pct_start = 0 with schedule = onecycle"
kiln 2 train "$ini" data.path="$data" run.out_dir= train.optimizer=sgd train.momentum=0 train.nesterov=1 train.max_steps=2
stderr_has "command line 'train.nesterov=1': [train] nesterov = 1 needs momentum > 0"
# 12: eval_every off the log points
ep_line() { grep -o 'epoch 2/2: train loss [0-9.]* acc [0-9.]*' "$err"; }
kiln 0 train "$ini" data.path="$data" run.out_dir= train.epochs=2 train.max_steps=12 train.log_every=4 train.eval_every=0
e0=$(ep_line)
kiln 0 train "$ini" data.path="$data" run.out_dir= train.epochs=2 train.max_steps=12 train.log_every=4 train.eval_every=3
e3=$(ep_line)
[ -n "$e0" ] && [ "$e0" = "$e3" ] || fail "eval_every = 3 between log points: '$e3', eval_every = 0: '$e0'"
# 13: early stopping across a resume
es="data.path=$data train.epochs=5 train.max_steps=0 train.eval_every=2 train.early_stop_patience=2 train.early_stop_min_delta=100"
kiln 0 train "$ini" $es run.out_dir="$tmp/es_u"
stderr_has "early stop at step 6: test accuracy did not improve"
# with [data.val] it watches val's evaluation, and says so (it said "test"
# before session 32)
kiln 0 train "$ini" $es run.out_dir= data.val.images=tr_cnn_images.idx data.val.labels=tr_cnn_labels.idx
stderr_has "early stop at step 6: val accuracy did not improve"
# the JSON line says so (docs/training.md; session 29: it did not)
stdout_matches '"early_stopped": true'
kiln 0 train "$ini" $es run.out_dir="$tmp/es_r" train.max_steps=4
kiln 0 train "$ini" $es run.out_dir="$tmp/es_r" --resume
stderr_has "early stop at step 6:"
# eval = 0 beside keep_best and early stopping: said, not silently ignored
kiln 0 train "$ini" data.path="$data" run.out_dir="$tmp/eval0" train.eval=0 train.keep_best=2 train.early_stop_patience=1 train.max_steps=1
stderr_has "[train] eval = 0 runs no evaluation, which keep_best and early_stop_patience need: ignored"
# a schedule's keys under another schedule, eval_every with eval = 0: said
# (before session 34 ignored without a word)
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.milestones=3,6 \
	train.gamma=0.5 train.pct_start=0.4 train.eval=0 train.eval_every=1
stderr_has "command line 'train.milestones=3,6': [train] milestones is read by schedule = multistep, not by schedule = constant: ignored"
stderr_has "command line 'train.gamma=0.5': [train] gamma is read by schedule = step, multistep or exponential, not by schedule = constant: ignored"
stderr_has "command line 'train.pct_start=0.4': [train] pct_start is read by schedule = onecycle, not by schedule = constant: ignored"
stderr_has "command line 'train.eval_every=1': [train] eval_every needs eval = 1 ([train] eval = 0 runs no evaluation): ignored"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.schedule=multistep \
	train.milestones=3,6 train.gamma=0.5 train.eval_every=1
! grep -q "is read by schedule\|eval_every needs" "$err" || fail "a warning for keys the run reads: $(cat "$err")"
# what makes a schedule other than it reads: base_batch without lr_scale,
# warmup with onecycle, a warm-up as long as the run, a cosine whose
# (scaled) lr is below lr_min (session 40: an explorer; silent before)
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=2 train.base_batch=64 \
	train.warmup=5 train.schedule=cosine train.lr_min=0.5
stderr_has "command line 'train.base_batch=64': [train] base_batch is read by lr_scale = linear or sqrt, not by lr_scale = none: lr = 0.1 is used as written"
stderr_has "command line 'train.warmup=5': [train] warmup = 5 is at least the run's 2 step(s): the rate rises to lr x 2 / 5 = 0.04 at the last step, never to lr = 0.1, and the schedule (cosine) never starts"
stderr_has "command line 'train.lr_min=0.5': schedule = cosine anneals upward, from lr = 0.1 to lr_min = 0.5 (lr_min is the final rate): lower lr_min"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=2 train.schedule=onecycle train.warmup=1
stderr_has "command line 'train.warmup=1': [train] warmup = 1 with schedule = onecycle: the warm-up to lr runs first"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=2 train.base_batch=8 train.lr_scale=linear \
	train.warmup=1 train.schedule=cosine train.lr_min=0.01
! grep -q "base_batch is read\|warmup = \|anneals upward" "$err" || fail "a schedule warning for a schedule as meant: $(cat "$err")"
# another built-in optimizer's keys: said, not silently ignored (session
# 40: sgd took eps and beta1 without a word); the optimizer's own not
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.eps=0 train.beta1=0.5
stderr_has "command line 'train.eps=0': [train] eps is read by optimizer = adam or adamw or lamb, not by optimizer = sgd: ignored"
stderr_has "command line 'train.beta1=0.5': [train] beta1 is read by optimizer = adam or adamw or lamb, not by optimizer = sgd: ignored"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.optimizer=adamw train.eps=1e-6 train.momentum=0.5
stderr_has "command line 'train.momentum=0.5': [train] momentum is read by optimizer = sgd, not by optimizer = adamw: ignored"
! grep -q "eps is read by" "$err" || fail "adamw's own eps warned of: $(grep 'eps is read' "$err")"
# a loss layer's key in [train]: the layer type named
kiln 2 train "$ini" data.path="$data" run.out_dir= train.label_smoothing=0.1
stderr_has "command line 'train.label_smoothing=0.1': unknown key 'label_smoothing' in [train]; 'label_smoothing' is a key of a [layer.NAME] of type softmax_xent"

# a key that writes into out_dir without one: refused as checkpoint_every
# is (before session 34 keep_best, tensorboard and csv wrote nothing, silently)
kiln 2 train "$ini" data.path="$data" run.out_dir= train.keep_best=2
stderr_has "command line 'train.keep_best=2': [train] keep_best needs [run] out_dir (the best checkpoints go to out_dir/checkpoints/best)"
kiln 2 train "$ini" data.path="$data" run.out_dir= log.tensorboard=1
stderr_has "command line 'log.tensorboard=1': [log] tensorboard needs [run] out_dir (its event files go to out_dir)"
kiln 2 train "$ini" data.path="$data" run.out_dir= log.csv=1
stderr_has "command line 'log.csv=1': [log] csv needs [run] out_dir (train.csv and eval.csv go to out_dir)"
# an empty out_dir (`run.out_dir=$UNSET`) keeps nothing: said at the start,
# naming where it was set (before session 50 a run trained and kept no
# weights without a word); not when checkpoint_last = 0 says so already
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1
stderr_has "[train] warning: command line 'run.out_dir=': [run] out_dir is empty: nothing is written (no metrics.jsonl, no checkpoint): the trained weights end with the process"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.checkpoint_last=0
! grep -q "out_dir is empty" "$err" || fail "checkpoint_last = 0 and out_dir empty: warned: $(grep "out_dir is empty" "$err")"
# epochs = 0 (a typo) runs no step: said, naming where it was set (before
# session 50 a JSON line of nulls, no word why)
kiln 0 train "$ini" data.path="$data" run.out_dir= train.epochs=0
stderr_has "[train] warning: command line 'train.epochs=0': [train] epochs = 0: no step is run: nothing is trained or evaluated, and no checkpoint written"
grep -q '"steps": 0,' "$out" || fail "epochs = 0: $(tail -1 "$out")"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.epochs=1 train.max_steps=1
! grep -q "epochs = 0" "$err" || fail "epochs = 1 warned of epochs = 0"
# 14: 48 samples, steps of 5 x 2: 4 steps, 8 samples left out each epoch
kiln 0 train "$ini" data.path="$data" run.out_dir= train.batch=5 train.accumulate=2 train.max_steps=1
stderr_has "an epoch is 4 step(s) of 10 samples (batch 5 x accumulate 2 x 1 rank(s)): 8 of the 48 training samples are left out of each epoch (drop_last)"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1
! grep -q "left out of each epoch" "$err" || fail "batch 8 leaves nothing out of 48, yet a line says so"
kiln 2 train "$ini" data.path="$data" run.out_dir= train.accumulate=7
stderr_has "command line 'train.accumulate=7': [train] batch 8 x accumulate 7 x 1 rank(s) needs 56 training samples a step, more than the 48 there are"
# 15: the progress bar on a terminal, and on a dumb one
if script -qec true /dev/null >/dev/null 2>&1; then
	for term in xterm dumb; do
		TERM=$term script -qec "'$kiln' train '$ini' '$d' run.out_dir= train.max_steps=5 train.log_every=1" \
			/dev/null >"$tmp/tty.$term" 2>&1 </dev/null || fail "TERM=$term: the run under script(1) failed"
	done
	grep -q "$(printf '\033')\[K" "$tmp/tty.xterm" || fail "TERM=xterm: no progress bar redrawn on the terminal"
	! grep -q "$(printf '\033')" "$tmp/tty.dumb" || fail "TERM=dumb: an escape sequence on the dumb terminal"
	grep -q "^epoch 1 step 5/6 loss" "$tmp/tty.dumb" || fail "TERM=dumb: no line per log point"
	echo "ok: the progress bar is redrawn on a terminal, not on TERM=dumb"
else
	echo "skip: no script(1) for a terminal"
fi
# 15: lr = 0 and a loss that is not finite (the training inputs 1e38, as
# tests/nonfinite_weights.sh's evaluation): no "lower [train] lr"
kiln 3 train "$ini" "$d" run.out_dir= train.lr=0 data.std=1e-12 data.mean=-1e26 train.max_steps=2 train.log_every=1
stderr_has "[train] lr is 0, so the step size is not the cause: look at the data, its normalisation ([data] mean, std) and the initial weights"
! grep -q "lower \[train\] lr" "$err" || fail "lr = 0: told to lower lr"
echo "PASS: $checks kiln runs (train_loss $whole whole, $resumed resumed)"
