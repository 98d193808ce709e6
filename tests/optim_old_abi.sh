#!/bin/sh
# tests/optim_old_abi.sh - a device plugin built before ABI 2.29 / 2.30 is
# never asked for what those ABIs added to the optimizer and schedule ops
# (core/device.c; docs/plugins.md "ABI 2.29", "ABI 2.30"): SGD's dampening
# (KILN_OP_SGD's f[3]), amsgrad (ADAMW's i[1], for adam and adamw), the
# schedules exponential, linear and polynomial and onecycle's three_phase
# and anneal_strategy (LR_SCHEDULE's i[0] 5..7, i[5], i[6]).  Such a
# device would ignore them (or read the step count as SGD's multiplier):
# the run is refused before its first step, exit 2 (a config error, as
# kiln's exit codes say: exit 1 before session 45), the message naming
# the device, its ABI, the key and the ABI that has it.  Every config that
# needs none of them trains on it, the same losses as on the CPU device;
# a model trained with them evaluates on it (`kiln eval` steps no
# optimizer), the same loss.
# The device: tprefill28 (tests/plugins/tnodecode.c), the CPU device of
# this build under abi_minor 28; the model: tests/data/tr_cnn.ini (a conv,
# batchnorm, max pooling and a linear layer on 48 8x8 images), 6 steps.
name=optim_old_abi
. "$(dirname "$0")/lib.sh"
need_source idx
plugdir="$abs_top_builddir/tests/plugins/nodecode/.libs"
[ -f "$plugdir/kiln-tnodecode.so" ] || fail "no $plugdir/kiln-tnodecode.so (make check builds it)"
kiln="$abs_top_builddir/kiln"
cd "$srcdir" || fail "cannot enter $srcdir"
cnn="tests/data/tr_cnn.ini data.path=tests/data train.max_steps=6 train.epochs=1 train.log_every=1"
old="tprefill28: built for ABI 2.28, before"

# on_old ARGS...: kiln ARGS with the test plugins' directory searched
on_old() {
	KILN_PLUGIN_PATH=$plugdir
	export KILN_PLUGIN_PATH
	kiln "$@"
	unset KILN_PLUGIN_PATH
}

# losses NAME: "STEP LOSS" a line, from $tmp/NAME/metrics.jsonl
losses() {
	sed -n 's/.*"event":"train".*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/p' \
		"$tmp/$1/metrics.jsonl" 2>/dev/null
}

# refused WHAT OVERRIDES...: on tprefill28, exit 2 before the first step,
# the message "tprefill28: built for ABI 2.28, before WHAT: rebuild ..."
refused() {
	_what=$1
	shift
	rm -rf "$tmp/refused"
	# shellcheck disable=SC2086
	on_old 2 train $cnn run.out_dir="$tmp/refused" run.device=tprefill28 "$@"
	stderr_has "$old $_what: rebuild it against this kiln's headers"
	[ -z "$(losses refused)" ] || fail "$*: refused after training began: $(losses refused)"
}

# accepted OVERRIDES...: trains on tprefill28, each of the 6 steps' losses
# that of the CPU device
accepted() {
	rm -rf "$tmp/cpu" "$tmp/old"
	# shellcheck disable=SC2086
	kiln 0 train $cnn run.out_dir="$tmp/cpu" run.device=cpu "$@"
	# shellcheck disable=SC2086
	on_old 0 train $cnn run.out_dir="$tmp/old" run.device=tprefill28 "$@"
	! grep -qF "$old" "$err" || fail "$*: $(grep -F "$old" "$err")"
	losses cpu >"$tmp/cpu.losses"
	losses old >"$tmp/old.losses"
	[ "$(wc -l <"$tmp/cpu.losses")" = 6 ] || fail "$*: not 6 steps logged: $(cat "$tmp/cpu.losses")"
	cmp -s "$tmp/cpu.losses" "$tmp/old.losses" ||
		fail "$*: tprefill28's losses differ from the CPU device's: $(paste "$tmp/cpu.losses" "$tmp/old.losses")"
	echo "ok: $*: trained on tprefill28, the CPU device's losses"
}

# ---- 2.29: SGD's dampening, amsgrad ------------------------------------------
refused "SGD's dampening (\`dampening\` with momentum, 2.29)" \
	train.optimizer=sgd train.momentum=0.9 train.dampening=0.5
refused "ADAMW's amsgrad (\`amsgrad = 1\`, 2.29)" train.optimizer=adam train.amsgrad=1
refused "ADAMW's amsgrad (\`amsgrad = 1\`, 2.29)" train.optimizer=adamw train.amsgrad=1
accepted train.optimizer=sgd train.momentum=0.9 train.dampening=0
# without momentum the dampening changes nothing (as in PyTorch): not asked
accepted train.optimizer=sgd train.momentum=0 train.dampening=0.5
accepted train.optimizer=adamw train.amsgrad=0
# 2.28's L2 weight decay
accepted train.optimizer=adam train.weight_decay=0.01
# lamb has no amsgrad: the key is ignored (a warning)
accepted train.optimizer=lamb train.amsgrad=1

# ---- 2.30: the schedules ------------------------------------------------------
refused "\`schedule = exponential\` (2.30)" train.schedule=exponential train.gamma=0.9
refused "\`schedule = linear\` (2.30)" train.schedule=linear
refused "\`schedule = polynomial\` (2.30)" train.schedule=polynomial train.total_iters=4
refused "onecycle's \`three_phase = 1\` (2.30)" train.schedule=onecycle train.three_phase=1
refused "onecycle's \`anneal_strategy = linear\` (2.30)" train.schedule=onecycle \
	train.anneal_strategy=linear
accepted train.schedule=constant train.warmup=2
accepted train.schedule=cosine
accepted train.schedule=step train.step_size=2 train.gamma=0.5
accepted train.schedule=multistep train.milestones=2,4 train.gamma=0.5
accepted train.schedule=onecycle train.pct_start=0.5
accepted train.schedule=plateau train.eval_every=2

# ---- evaluating a model trained with them asks for neither -------------------
kiln 0 train $cnn run.out_dir="$tmp/ams" run.device=cpu train.checkpoint_every=6 train.optimizer=adamw \
	train.amsgrad=1 train.schedule=polynomial train.total_iters=4
kiln 0 eval $cnn run.out_dir="$tmp/ams" run.device=cpu train.optimizer=adamw train.amsgrad=1 \
	train.schedule=polynomial train.total_iters=4
cp "$out" "$tmp/ams.eval"
on_old 0 eval $cnn run.out_dir="$tmp/ams" run.device=tprefill28 train.optimizer=adamw \
	train.amsgrad=1 train.schedule=polynomial train.total_iters=4
[ "$(field test_loss "$out")" = "$(field test_loss "$tmp/ams.eval")" ] && [ -n "$(field test_loss "$out")" ] ||
	fail "evaluated on tprefill28: $(cat "$out"), on the CPU device: $(cat "$tmp/ams.eval")"
echo "ok: an amsgrad, polynomial-schedule model evaluated on tprefill28 as on the CPU device"
echo "PASS: $checks runs"
