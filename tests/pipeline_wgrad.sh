#!/bin/sh
# tests/pipeline_wgrad.sh - [pipeline] defer_wgrad (docs/pipeline.md,
# "Deferred weight gradients"; core/pipe_wgrad.c): stages on device
# instances of their own ([run] devices) split each backward, their linear
# layers' weight and bias gradients run on the stage's side stream while
# it waits for a peer and before the optimizer, in micro-batch order.  The
# parameters and the optimizer's state end byte for byte those of the
# backward unsplit: the tests' MLP in 2 stages (4 and 8 micro-batches,
# 1f1b and gpipe; with [train] accumulate 2) and 4 (a ReLU alone on a
# stage), a GPT in 4 stages (its
# residual stream a skip connection across each boundary, linear layers
# over [B, T, K], f32 and bf16 with x converted in the workspace).  A
# weight gradient run out of micro-batch order (micro-batch 0 writes, the
# later ones add) or dropped changes the bytes.  Where the pipeline cannot
# defer (stages on one device), 1 says why and runs unsplit.
name=pipeline_wgrad
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
tool="$top_builddir/tests/ckpt_tool"
need_source synthetic
need_source tokens

ini_pipeline_mlp 256 batch=32 > "$tmp/mlp.ini"
m="$tmp/mlp.ini"
two="run.devices=cpu:0, cpu:1"
four="run.devices=cpu:0,cpu:1,cpu:2,cpu:3"
for run in "m2f4 4 1f1b 2 layer.fc2.stage=1" "m2f8 8 1f1b 2 layer.fc2.stage=1" \
	"m2g4 4 gpipe 2 layer.fc2.stage=1" "m4f4 4 1f1b 4 model.stages=flat,r1|fc2|r2|fc3,loss" \
	"m4f8 8 1f1b 4 model.stages=flat,fc1|r1,fc2|r2|fc3,loss"; do
	set -- $run
	d=$two
	[ "$4" = 4 ] && d=$four
	kiln 0 train "$m" run.out_dir="$tmp/$1-0" pipeline.micro_batches=$2 pipeline.schedule=$3 \
		"$5" "$d" run.threads=$4 pipeline.defer_wgrad=0
	! grep -qF "deferred weight gradients" "$err" || fail "$1: defer_wgrad = 0 deferred"
	kiln 0 train "$m" run.out_dir="$tmp/$1-1" pipeline.micro_batches=$2 pipeline.schedule=$3 \
		"$5" "$d" run.threads=$4 pipeline.defer_wgrad=1
	stderr_has "deferred weight gradients: 3 linear layers' (each stage runs them while it waits for a peer, and before the optimizer)"
	"$tool" same "$(ck "$1-0" 6)" "$(ck "$1-1" 6)" params optim.momentum step ||
		fail "$1: the deferred weight gradients differ"
done
# defer_wgrad = 1 copies nothing: the 4 stages' plans keep what the
# deferred passes read, micro-batch j's until stage 0's backward of
# j + 3 (7 activation sets, 4 without)
stderr_has "from the plans' own buffers, no copies (7 activation sets"
# 1f1b with an early forward: one more set in flight (3), and one more for
# the deferred passes' lag (4)
kiln 0 train "$m" run.out_dir="$tmp/early-1" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	pipeline.early_forwards=1 pipeline.defer_wgrad=1
stderr_has "from the plans' own buffers, no copies (4 activation sets"
"$tool" same "$(ck m2f4-0 6)" "$(ck early-1 6)" params optim.momentum step ||
	fail "early_forwards 1: the deferred weight gradients differ"
# [train] accumulate on top: each pipeline step's first micro-batch of an
# optimizer step writes, the rest add
kiln 0 train "$m" run.out_dir="$tmp/acc-0" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	train.accumulate=2 pipeline.defer_wgrad=0
kiln 0 train "$m" run.out_dir="$tmp/acc-1" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	train.accumulate=2 pipeline.defer_wgrad=1
"$tool" same "$(ck acc-0 4)" "$(ck acc-1 4)" params optim.momentum step ||
	fail "accumulate 2: the deferred weight gradients differ"
echo "ok: the MLP's parameters are the same bytes with deferred weight gradients"

# defer_wgrad = auto (the default): off while the process's threads wait
# for a CPU under 0.25 s a second, read every 4 steps, 2 readings in a row
# turning it on or off.  The signal driven by the CPU device's hook
# (KILN_CPU_RUNWAIT, the async watch's): quiet stays off; busy turns on
# at step 9 (readings at steps 5 and 9) and defers steps 9..12 of the
# same bytes
s12="train.epochs=2 train.max_steps=12 train.checkpoint_every=12"
kiln 0 train "$m" run.out_dir="$tmp/a12-0" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	$s12 pipeline.defer_wgrad=0
KILN_CPU_RUNWAIT=0 kiln 0 train "$m" run.out_dir="$tmp/quiet" pipeline.micro_batches=4 layer.fc2.stage=1 \
	"$two" run.threads=2 $s12
stderr_has "[pipeline] defer_wgrad = auto: off while this process's threads wait for a CPU under 0.25 s a second"
! grep -qF "deferred weight gradients:" "$err" || fail "defer_wgrad = auto, quiet: deferred"
! grep -qF "defer_wgrad = auto: on" "$err" || fail "defer_wgrad = auto, quiet: turned on"
KILN_CPU_RUNWAIT=0.9 kiln 0 train "$m" run.out_dir="$tmp/busy" pipeline.micro_batches=4 layer.fc2.stage=1 \
	"$two" run.threads=2 $s12
stderr_has "[pipeline] defer_wgrad = auto: on from pipeline step 9 ("
# the figure from two clocks read apart: a range, not its digits
rate=$(sed -n 's/.*defer_wgrad = auto: on from pipeline step 9 (the process.s threads waited \([0-9.]*\) s a second.*/\1/p' "$err")
awk -v r="$rate" 'BEGIN { exit !(r != "" && r >= 0.5 && r <= 1.5) }' ||
	fail "defer_wgrad = auto, busy: waited '$rate' s a second, not 0.5..1.5 (the hook's 0.9)"
stderr_has "deferred weight gradients: 3 linear layers'"
cp "$err" "$tmp/busy.err"
# 4 steps of 4 micro-batches deferred: 16 groups on each stage, 32 in all
groups=$(sed -n 's/.*side stream work (deferred, threads 1): \([0-9]*\) groups run while waiting for another event ([0-9.]* ms), \([0-9]*\) at a wait.*/\1 \2/p' "$err" |
	awk '{ n += $1 + $2 } END { print n + 0 }')
[ "$groups" = 32 ] || fail "defer_wgrad = auto, busy: $groups deferred groups, not 32 (steps 9..12)"
"$tool" same "$(ck a12-0 12)" "$(ck quiet 12)" params optim.momentum step || fail "defer_wgrad = auto, quiet: the bytes differ"
"$tool" same "$(ck a12-0 12)" "$(ck busy 12)" params optim.momentum step || fail "defer_wgrad = auto, busy: the bytes differ"
echo "ok: defer_wgrad = auto: off at the hook's 0, on at its 0.9 from step 9, the same bytes"

data="$srcdir/tests/data"
grep -v '^tie = ' "$data/gpt_tiny.ini" | sed 's/^no_decay = .*/no_decay = *.bias/' > "$tmp/gpt.ini"
g="$tmp/gpt.ini"
set -- "data.path=$data/gpt_tokens.bin" train.max_steps=3 train.optimizer=sgd train.momentum=0.9 train.lr=0.05 \
	train.batch=4 pipeline.micro_batches=2 layer.transformer.h.0.ln_2.stage=1 \
	layer.transformer.h.1.ln_1.stage=2 layer.transformer.h.1.mlp.c_fc.stage=3 "$four" run.threads=4
for pr in fp32 bf16; do
	kiln 0 train "$g" "$@" run.out_dir="$tmp/g-$pr-0" run.precision=$pr pipeline.defer_wgrad=0
	kiln 0 train "$g" "$@" run.out_dir="$tmp/g-$pr-1" run.precision=$pr pipeline.defer_wgrad=1
	stderr_has "deferred weight gradients:"
	"$tool" same "$(ck "g-$pr-0" 3)" "$(ck "g-$pr-1" 3)" params optim.momentum step ||
		fail "GPT ($pr): the deferred weight gradients differ"
done
echo "ok: the GPT's parameters are the same bytes with deferred weight gradients"

# stages on one device: said, and unsplit
kiln 0 train "$m" run.out_dir="$tmp/one" pipeline.micro_batches=4 layer.fc2.stage=1 pipeline.defer_wgrad=1
stderr_has "[pipeline] defer_wgrad = 1: not with stages on one device (no [run] devices)"
"$tool" same "$(ck m2f4-0 6)" "$(ck one 6)" params optim.momentum step ||
	fail "stages on one device with defer_wgrad = 1 differ"
kiln 0 train "$m" run.out_dir="$tmp/sync" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	plugin.cpu.async=0 pipeline.defer_wgrad=1
stderr_has "[pipeline] defer_wgrad = 1: not with a stage's device without stream threads ([plugin.cpu] async = 0)"
"$tool" same "$(ck m2f4-0 6)" "$(ck sync 6)" params optim.momentum step ||
	fail "sync streams with defer_wgrad = 1 differ"
# no layer to defer (every linear layer frozen): said, unsplit
kiln 0 train "$m" run.out_dir="$tmp/none" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2 \
	layer.fc1.trainable=0 layer.fc2.trainable=0 layer.fc3.trainable=0 pipeline.defer_wgrad=1
stderr_has "[pipeline] defer_wgrad = 1: no layer to defer"
echo "ok: defer_wgrad = 1 where the pipeline cannot defer: said, unsplit"

# kiln memory.  defer_wgrad = 1: no copies, the plans keep what the
# deferred passes read and one more activation set per stage of lag (2
# stages, 1f1b, M = 8: 3 instead of 2), as the run makes them
kiln 0 memory "$m" pipeline.micro_batches=8 layer.fc2.stage=1 "$two" run.threads=2 pipeline.defer_wgrad=1
stdout_has "deferred weight gradients ([pipeline] defer_wgrad = 1, stages on [run] devices): no copies, the plans keep each deferred linear layer's input and output gradient (and output, with a fused ReLU) to the schedule's end: 3 activation sets instead of 2"
kiln 0 train "$m" run.out_dir="$tmp/mem" pipeline.micro_batches=8 layer.fc2.stage=1 "$two" run.threads=2 \
	pipeline.defer_wgrad=1
stderr_has "2 stages, 8 micro-batches of 4, schedule 1f1b: 3 activation sets"
stderr_has "from the plans' own buffers, no copies (3 activation sets"
! grep -qF "MiB of their inputs" "$err" || fail "defer_wgrad = 1: copies made"
# defer_wgrad = auto: the records the run copies into once it turns on,
# min(M, P - s) of them on stage s (the busy run above, M = 4 of 8 rows)
kiln 0 memory "$m" pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2
mem=$(sed -n 's/.*deferred weight gradients (\[pipeline\] defer_wgrad = auto, once the CPUs. contention turns it on.* stage 0 \([0-9.]*\) MiB, stage 1 \([0-9.]*\) MiB$/\1 \2/p' "$out")
[ -n "$mem" ] || fail "kiln memory: no line for defer_wgrad = auto's records"
ran=$(sed -n 's/.*deferred weight gradients: .*; \([0-9.]*\) MiB of their inputs, min(M, P - s) = 2..1 .*/\1/p' "$tmp/busy.err")
awk -v m="$mem" -v r="$ran" 'BEGIN { split(m, a, " "); d = a[1] + a[2] - r; exit !(r > 0 && d < 0.002 && d > -0.002) }' ||
	fail "kiln memory's records ($mem MiB) are not the run's ($ran MiB)"
# M = 4 of the same micro-batches (batch 16) as M = 8 (batch 32): the
# same records (2 on stage 0, 1 on stage 1)
kiln 0 memory "$m" train.batch=16 pipeline.micro_batches=4 layer.fc2.stage=1 "$two" run.threads=2
mem4=$(sed -n 's/.*deferred weight gradients (\[pipeline\] defer_wgrad.* stage 0 \([0-9.]*\) MiB, stage 1 \([0-9.]*\) MiB$/\1 \2/p' "$out")
kiln 0 memory "$m" pipeline.micro_batches=8 layer.fc2.stage=1 "$two" run.threads=2
mem8=$(sed -n 's/.*deferred weight gradients (\[pipeline\] defer_wgrad.* stage 0 \([0-9.]*\) MiB, stage 1 \([0-9.]*\) MiB$/\1 \2/p' "$out")
[ -n "$mem4" ] && [ "$mem4" = "$mem8" ] || fail "kiln memory: M = 4's records ($mem4 MiB) are not M = 8's ($mem8 MiB)"
kiln 0 memory "$m" pipeline.micro_batches=8 layer.fc2.stage=1 "$two" run.threads=2 pipeline.defer_wgrad=1 \
	plugin.cpu.async=0
! grep -qF "deferred weight gradients" "$out" || fail "kiln memory: records where the run falls back (async = 0)"
kiln 0 memory "$m" pipeline.micro_batches=8 model.stages="flat,r1|fc2|r2|fc3,loss" "$four" run.threads=4 \
	pipeline.defer_wgrad=1
grep -qF "on each of the 3 stages with one" "$out" ||
	fail "kiln memory: a workspace counted for the stage without a linear layer"
echo "ok: kiln memory reports the activation sets and records the run makes"
