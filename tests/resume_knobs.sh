#!/bin/sh
# tests/resume_knobs.sh - the speed switches that are safe keys on resume
# (core/resume.c safe_keys; docs/checkpoints.md): [plugin.cpu] async,
# [plugin.cpu] graph, [data] transform_on and [data.eval] transform_on.
# For each, a run of tests/data/tr_cnn.ini (2 epochs of 6 steps, shuffled,
# evaluated) cut at step 3 and resumed with the switch changed ends with
# a checkpoint whose every section but the config is byte for byte the
# uninterrupted run's, and the same test loss; the log shows the switch
# took effect (async streams, a captured step, samples normalised on the
# device).  Likewise [pipeline] early_forwards, zero_copy, sendrecv and defer_wgrad on
# 2 stages (defer_wgrad 0 -> 1 also on [run] devices, where it splits).  [plugin.cuda] graph stays refused: no GPU checked it.  Before session 30 each resume was refused (exit 2: "[plugin.cpu]
# async is absent in the checkpoint but '1' here").
name=resume_knobs
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
need_source idx

run="data.path=$data train.max_steps=0 train.epochs=2 data.shuffle=1 train.checkpoint_every=3 train.keep_last=0"
kiln 0 train "$ini" $run "run.out_dir=$tmp/whole"
whole_loss=$(field test_loss "$out")
kiln 0 train "$ini" $run train.max_steps=3 "run.out_dir=$tmp/cut"
[ -f "$(ck cut 3)" ] || fail "the cut run wrote no ckpt-3.kiln"
tags=$("$top_builddir/tests/ckpt_tool" sections "$(ck whole 12)" | awk '$1 != "config" { print $1 }')
[ -n "$tags" ] || fail "no sections in $(ck whole 12)"

# resumed "KEY=VALUE..." LOGGED: the resume from step 3 with the switches
# changed equals the uninterrupted run, and its log (debug) has LOGGED
resumed() {
	rm -rf "$tmp/r"
	mkdir -p "$tmp/r/checkpoints"
	cp "$(ck cut 3)" "$tmp/r/checkpoints/"
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug kiln 0 train "$ini" $run "run.out_dir=$tmp/r" --resume $1
	stdout_has '"resumed_step": 3'
	stderr_has "$2"
	# shellcheck disable=SC2086
	"$top_builddir/tests/ckpt_tool" same "$(ck whole 12)" "$(ck r 12)" $tags ||
		fail "$1: the resumed run's ckpt-12.kiln differs from the uninterrupted run's"
	[ "$(field test_loss "$out")" = "$whole_loss" ] ||
		fail "$1: test_loss $(field test_loss "$out"), the uninterrupted run's $whole_loss"
	echo "ok: resumed with $1: the same bytes ($(echo $tags | wc -w) sections), test_loss $whole_loss"
}
resumed plugin.cpu.async=1 "1 threads, async streams"
resumed plugin.cpu.graph=1 "captured (input slot"
resumed data.transform_on=device "[data] 64-byte u8 samples copied, normalised on the device"
# profiling and the inference API's blocking change no number (refused
# before session 33: "[run] profile is '0' in the checkpoint but '1' here")
resumed "run.profile=1 run.profile_steps=2 run.infer_block=0" \
	"profiling: every device op of a step is synchronised and timed"
# ([data.eval]'s alone may not differ from [data]'s, u8 against f32
# samples: both; the log line is [data]'s)
resumed "data.transform_on=device data.eval.transform_on=device" \
	"[data] 64-byte u8 samples copied, normalised on the device"
# a finished run extended with another batch: its last epoch (48 samples
# in steps of 8) is complete in steps of 10 too, and epoch 3 takes 4
# steps (refused before session 31: "sample 48 ... keep the global batch
# a divisor of the offset", exit 3)
rm -rf "$tmp/ext"
cp -a "$tmp/whole" "$tmp/ext"
kiln 0 train "$ini" $run train.epochs=3 train.batch=10 "run.out_dir=$tmp/ext" --resume
stdout_has '"resumed_step": 12'
stderr_has "the checkpoint's epoch 2 was complete (48 samples in steps of 8); it stays complete in steps of 10"
[ "$(field steps "$out")" = 16 ] || fail "the extended run ended at step $(field steps "$out"), want 16"
[ -f "$(ck ext 16)" ] || fail "no ckpt-16.kiln after the extension"
# stages on two devices of one process, resumed on one device: the
# checkpoint holds the same state (refused before session 31: "[run]
# devices is 'cpu:0, cpu:1' in the checkpoint but '' here"); the
# parameters equal the uninterrupted run's to float rounding (one
# micro-batch: batchnorm's statistics over the whole batch, as one device)
rm -rf "$tmp/dev"
kiln 0 train "$ini" $run train.max_steps=3 "run.out_dir=$tmp/dev" "run.devices=cpu:0, cpu:1" \
	model.stages=auto pipeline.micro_batches=1
kiln 0 train "$ini" $run "run.out_dir=$tmp/dev" --resume
stdout_has '"resumed_step": 3'
"$top_builddir/tests/ckpt_tool" close "$(ck whole 12)" "$(ck dev 12)" 1e-5 params ||
	fail "stages on devices resumed on one: the parameters differ from the uninterrupted run's"
# micro_batches changed on resume (a safe key: the state's layout is the
# same) changes what batchnorm's statistics and the loss's mean are over:
# said, once (before session 32 nothing was said, and the run went on
# another path); unchanged, nothing is said
rm -rf "$tmp/mb"
kiln 0 train "$ini" $run train.max_steps=2 "run.out_dir=$tmp/mb" pipeline.micro_batches=4
kiln 0 train "$ini" $run train.max_steps=4 "run.out_dir=$tmp/mb" pipeline.micro_batches=1 --resume
stderr_has "resume: a micro-batch changes from 2 rows (batch 8 / micro_batches 4 on each of 1 rank(s)) to 8 (8 / 1 on 1): batchnorm's batch statistics and the loss's mean over the targets it counts are per micro-batch, so the run will not continue as it would have"
kiln 0 train "$ini" $run train.max_steps=6 "run.out_dir=$tmp/mb" pipeline.micro_batches=1 --resume
grep -q "micro-batch changes" "$err" && fail "an unchanged micro-batch was said to change"
# the pipeline's early forwards and hand-offs change no number
# (docs/pipeline.md): a run in 2 stages of 2 micro-batches cut at step 3
# resumes with each changed and ends with the uninterrupted run's bytes
# (refused before session 38, exit 2: "[pipeline] early_forwards is '0'
# in the checkpoint but '1' here")
pl="model.stages=conv1,flat|fc1,loss pipeline.micro_batches=2"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pl "run.out_dir=$tmp/plw"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pl train.max_steps=3 "run.out_dir=$tmp/pl"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pl "run.out_dir=$tmp/pl" --resume \
	pipeline.early_forwards=1 pipeline.zero_copy=0 pipeline.sendrecv=0 pipeline.defer_wgrad=0
stdout_has '"resumed_step": 3'
# shellcheck disable=SC2086
"$top_builddir/tests/ckpt_tool" same "$(ck plw 12)" "$(ck pl 12)" $tags ||
	fail "2 stages resumed with early_forwards, zero_copy, sendrecv and defer_wgrad changed: ckpt-12.kiln differs from the uninterrupted run's"
echo "ok: 2 stages resumed with early_forwards=1 zero_copy=0 sendrecv=0 defer_wgrad=0: the same bytes"
# the same 2 stages on devices of their own ([run] devices), where
# defer_wgrad = 1 splits each backward: cut with it 0, resumed with it 1,
# the uninterrupted run's bytes
pd="$pl run.devices=cpu:0,cpu:1 run.threads=2"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pd "run.out_dir=$tmp/pdw" pipeline.defer_wgrad=0
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pd train.max_steps=3 "run.out_dir=$tmp/pd" pipeline.defer_wgrad=0
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $pd "run.out_dir=$tmp/pd" --resume pipeline.defer_wgrad=1
stdout_has '"resumed_step": 3'
stderr_has "[pipeline] deferred weight gradients: 1 linear layers'"
# shellcheck disable=SC2086
"$top_builddir/tests/ckpt_tool" same "$(ck pdw 12)" "$(ck pd 12)" $tags ||
	fail "2 stages on [run] devices resumed with defer_wgrad 0 -> 1: ckpt-12.kiln differs from the uninterrupted run's"
echo "ok: 2 stages on [run] devices resumed with defer_wgrad=1: the same bytes"
# [data.val] inherits [data]'s loader keys: with the section present, a
# resume with data.workers or data.prefetch changed continues (refused
# before session 33, exit 2: "[data.val] workers is '0' in the checkpoint
# but '2' here"), and ends where the uninterrupted run ends
val="data.val.images=tr_cnn_images.idx data.val.labels=tr_cnn_labels.idx"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $val "run.out_dir=$tmp/vwhole"
vloss=$(field val_loss "$out")
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $val train.max_steps=3 "run.out_dir=$tmp/val"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run $val "run.out_dir=$tmp/val" data.workers=2 data.prefetch=3 --resume
stdout_has '"resumed_step": 3'
[ "$(field val_loss "$out")" = "$vloss" ] ||
	fail "[data.val] resumed with data.workers=2: val_loss $(field val_loss "$out"), the uninterrupted run's $vloss"
"$top_builddir/tests/ckpt_tool" same "$(ck vwhole 12)" "$(ck val 12)" $tags ||
	fail "[data.val] resumed with data.workers=2: ckpt-12.kiln differs from the uninterrupted run's"
echo "ok: [data.val] resumed with data.workers=2 data.prefetch=3: val_loss $vloss, the same bytes"
# where stages' threads run changes no number: [run] bind_stages (its
# default went auto -> none) and [plugin.cpu] stage_spin_us (refused
# before session 35: "[run] bind_stages is 'none' in the checkpoint but
# 'auto' here")
resumed "run.bind_stages=auto plugin.cpu.stage_spin_us=0" "1 threads"
# [run] fuse, whose default went 0 -> auto (on for the CPU) in session 8:
# this CNN's fused ReLU (after batchnorm) computes the unfused bits, so a
# checkpoint of an unfused run resumes fused with a warning and ends as
# the uninterrupted (fused) run (refused before session 35, exit 2:
# "[run] fuse is '0' in the checkpoint but 'auto' here")
rm -rf "$tmp/fz"
kiln 0 train "$ini" $run train.max_steps=3 "run.out_dir=$tmp/fz" run.fuse=0
kiln 0 train "$ini" $run "run.out_dir=$tmp/fz" --resume
stdout_has '"resumed_step": 3'
stderr_has "resume: [run] fuse is '0' in the checkpoint but 'auto' here (the default, \`auto\` (on for the CPU) since session 8; 0 before): on the CPU this run's fused ReLUs compute the unfused bits, its evaluations fuse no GELU, no conv of one input channel runs NHWC and [train] batch is not \`auto\` (docs/config.md, fuse), so the run continues as it would have"
# shellcheck disable=SC2086
"$top_builddir/tests/ckpt_tool" same "$(ck whole 12)" "$(ck fz 12)" $tags ||
	fail "resumed fused from an unfused checkpoint: ckpt-12.kiln differs from the uninterrupted run's"
# without batchnorm, in an NCHW model, the conv of one channel fuses its
# ReLU, read by the maxpool: it then runs NHWC, whose weight gradient sums
# in another order (the parameters differ from the unfused run's).
# Refused, naming the override that resumes the run as it was
sed '/^\[layer.bn1\]/,/^$/d' "$ini" >"$tmp/stem.ini"
rm -rf "$tmp/st"
kiln 0 train "$tmp/stem.ini" $run train.max_steps=3 "run.out_dir=$tmp/st" run.fuse=0 model.layout=nchw
kiln 2 train "$tmp/stem.ini" $run "run.out_dir=$tmp/st" model.layout=nchw --resume
stderr_has "[run] fuse is '0' in the checkpoint but 'auto' here (the default, \`auto\` (on for the CPU) since session 8; 0 before), and in this model a conv of one input channel whose ReLU a maxpool reads runs NHWC when fused"
stderr_has "Resume with run.fuse=0 (what the checkpoint's run did)"
kiln 0 train "$tmp/stem.ini" $run "run.out_dir=$tmp/st" model.layout=nchw --resume run.fuse=0
stdout_has '"resumed_step": 3'
# an evaluation fuses a conv's (or linear's) GELU: oneDNN's epilogue rounds
# otherwise than the GELU op after the conv, in bf16 (the test loss moves
# in the 4th digit) and in f32 (other logits' bytes), and keep_best, early
# stopping and the logs read the evaluations: refused, naming the layer
# and the override (before f35u the resume went on, said to continue "as
# it would have").  Without evaluations no GELU is fused: resumed.
sed -e '/^\[layer.bn1\]/,/^$/d' -e 's/^type = relu$/type = gelu/' "$ini" >"$tmp/gelu.ini"
for p in bf16 fp32; do
	rm -rf "$tmp/g$p"
	kiln 0 train "$tmp/gelu.ini" $run train.max_steps=3 "run.out_dir=$tmp/g$p" run.fuse=0 run.precision=$p
	kiln 2 train "$tmp/gelu.ini" $run "run.out_dir=$tmp/g$p" run.precision=$p --resume
	stderr_has "[run] fuse is '0' in the checkpoint but 'auto' here (the default, \`auto\` (on for the CPU) since session 8; 0 before), and layer 'conv1' (conv) fuses its GELU in the evaluations, which then round otherwise than unfused (keep_best, early stopping and the logged losses read them). Resume with run.fuse=0 (what the checkpoint's run did)"
	kiln 0 train "$tmp/gelu.ini" $run "run.out_dir=$tmp/g$p" run.precision=$p --resume run.fuse=0
	stdout_has '"resumed_step": 3'
done
kiln 0 eval "$tmp/gelu.ini" $run --checkpoint "$(ck gbf16 3)" run.precision=bf16 run.fuse=0
l0=$(field test_loss "$out")
kiln 0 eval "$tmp/gelu.ini" $run --checkpoint "$(ck gbf16 3)" run.precision=bf16 run.fuse=1
l1=$(field test_loss "$out")
[ "$l0" != "$l1" ] || fail "bf16: the fused GELU's evaluation equals the unfused one's ($l0): the refusal has no cause"
for f in 0 1; do
	kiln 0 predict "$tmp/gelu.ini" $run --checkpoint "$(ck gfp32 3)" --eval-set --no-fold \
		--logits "$tmp/logits$f.npy" run.fuse=$f
done
cmp -s "$tmp/logits0.npy" "$tmp/logits1.npy" && fail "f32: the fused GELU's logits are the unfused ones' bytes"
echo "ok: [run] fuse with a GELU an evaluation fuses: refused (bf16 test_loss $l0 unfused, $l1 fused; f32 logits differ)"
rm -rf "$tmp/gn"
kiln 0 train "$tmp/gelu.ini" $run train.max_steps=3 "run.out_dir=$tmp/gn" run.fuse=0 train.eval=0
kiln 0 train "$tmp/gelu.ini" $run "run.out_dir=$tmp/gn" train.eval=0 --resume
stderr_has "on the CPU this run's fused ReLUs compute the unfused bits, it evaluates nothing (where a GELU would be fused), no conv"
# [train] batch = auto plans its batch by memory, which a fused activation
# (a view) changes: 32 unfused, 40 fused here, so the resume would go on
# with another batch (before f35u: "continues as it would have")
mem="train.batch=auto run.memory_limit=3M layer.conv1.out=64 model.layout=nhwc"
rm -rf "$tmp/ba"
kiln 0 train "$tmp/stem.ini" $run $mem train.max_steps=1 "run.out_dir=$tmp/ba" run.fuse=0
stderr_has "[train] batch = auto: 32,"
kiln 0 memory "$tmp/stem.ini" $run $mem
stderr_has "[train] batch = auto: 40,"
kiln 2 train "$tmp/stem.ini" $run $mem "run.out_dir=$tmp/ba" --resume
stderr_has "and [train] batch = auto chooses the batch by the plans' memory, which fusing changes. Resume with run.fuse=0"
echo "ok: [run] fuse: resumed fused where the bits are the same, refused where not"
echo "PASS: resume_knobs"
