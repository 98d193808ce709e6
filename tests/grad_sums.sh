#!/bin/sh
# tests/grad_sums.sh - the gradients' non-finite check taken where the
# backward makes them (session 44, core/train_gradsums.c): the benchmark's
# MLP (784-512-256-10, bench/mlp_bench.ini) with skip_nonfinite = 1 (the
# default), one process, fp32, on random pixels:
#  1. `kiln train` sums each layer's gradient blocks right after its
#     backward (the profile lists GRAD_SUMSQ under fc1, fc2 and fc3's
#     backward) and the check before the optimizer reads no gradient
#     again: the first step that does says so once (debug level); on a
#     device built before ABI 2.32 (never asked) and one of ABI 2.32
#     without has_op whose prepare answers KILN_EINVAL for GRAD_SUMSQ
#     (tnosums, tests/plugins/tnodecode.c: before session 44's review
#     `kiln train` stopped at setup) the one pass gives the same steps;
#     so does a 2.31 device with has_op (tknown31), which is asked about
#     no op after 2.31's (before session 45: about GRAD_SUMSQ, 53);
#  2. the same run through tests/train_nan with a step it never reaches
#     (its gradient hook installed, which writes nothing, keeps the one
#     GRAD_CLIP pass of before): every step's loss and grad_norm in
#     metrics.jsonl and the weights after the run (`kiln export`) are the
#     same bits, also with clip_norm (a quarter of the first norm, every
#     step scaled) and with clip_value and two threads; the hook run says
#     at setup that it keeps the one pass and never takes the sums (before
#     the review it summed them in every backward too, unused).
#  3. `kiln memory` counts the sums' 4 ceil(535,818 / 1024) = 2096 bytes
#     ("other") where the run takes them, and not under fp16's loss
#     scaling or accumulate = 2, where nothing is allocated (before the
#     session 44 review it counted them wherever the check ran).
# The skips themselves through this path: tests/grad_overflow.sh (inf and
# NaN gradients at step 1, finite ones whose squares overflow),
# tests/nonfinite_logs.sh; the op against GRAD_CLIP's one pass, NaN and
# inf at each layer's first and last element:
# tests/check_device_optim (test_grad_sumsq).
name=grad_sums
. "$(dirname "$0")/lib.sh"
need_source idx

mlp_fixture 44 1
nan="$abs_top_builddir/tests/train_nan"

# the train lines' step, loss, skipped, clipped and grad_norm
steps() { grep '"event": *"train"' "$1/metrics.jsonl" |
	sed 's/.*"step": *\([0-9]*\).*"loss": *\([^,]*\),.*"skipped": *\([0-9]*\).*"clipped": *\([0-9]*\).*"grad_norm": *\([^,}]*\).*/\1 \2 \3 \4 \5/'; }

# same WHAT OVERRIDES...: kiln train and train_nan (the one pass) agree
same() {
	what=$1
	shift
	kiln 0 train "$ini" run.out_dir="$tmp/a" train.overwrite=1 "$@"
	KILN_LOG_LEVEL=debug KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" "$nan" 1000000 "$ini" \
		run.out_dir="$tmp/b" train.overwrite=1 "$@" > "$tmp/nan.out" 2>&1 ||
		{ cat "$tmp/nan.out"; fail "$what: train_nan: exit $?"; }
	grep -q "one pass before the optimizer: a gradient hook" "$tmp/nan.out" ||
		{ grep -i "gradients' check" "$tmp/nan.out"; fail "$what: train_nan: its hook did not keep the one pass at setup"; }
	! grep -q "per-layer sums" "$tmp/nan.out" || fail "$what: train_nan: a step took the sums under a gradient hook"
	steps "$tmp/a" > "$tmp/a.steps"
	steps "$tmp/b" > "$tmp/b.steps"
	[ "$(wc -l < "$tmp/a.steps")" -eq 8 ] || fail "$what: $(wc -l < "$tmp/a.steps") train lines, expected 8"
	cmp -s "$tmp/a.steps" "$tmp/b.steps" ||
		{ diff "$tmp/a.steps" "$tmp/b.steps"; fail "$what: the steps' loss, skips, clips or grad_norm differ from the one pass's"; }
	for r in a b; do
		kiln 0 export "$ini" --checkpoint "$tmp/$r/checkpoints/ckpt-8.kiln" \
			--safetensors "$tmp/$r.st" run.out_dir="$tmp/none"
	done
	cmp -s "$tmp/a.st" "$tmp/b.st" || fail "$what: the weights after 8 steps differ from the one pass's"
	echo "ok: $what: 8 steps, the same bits ($(sed -n '8p' "$tmp/a.steps"))"
}

# 1: the sums run in the backward
KILN_LOG_LEVEL=debug kiln 0 train "$ini" run.out_dir="$tmp/p" run.profile=1 train.max_steps=3
[ "$(grep -c "non-finite check from per-layer sums (step 1)" "$err")" -eq 1 ] &&
	[ "$(grep -c "per-layer sums" "$err")" -eq 1 ] ||
	{ grep "gradients' check\|per-layer" "$err"; fail "not said once that step 1's check took the per-layer sums"; }
prof="$tmp/p/profile.txt"
[ -f "$prof" ] || fail "no profile at $prof"
for l in fc1 fc2 fc3; do
	grep -qE "(^|[[:space:]])$l[[:space:]]+grad_sumsq[[:space:]]+backward[[:space:]]+2[[:space:]]" "$prof" ||
		{ cat "$prof"; fail "the profile has no grad_sumsq in $l's backward (one a step)"; }
done
# ... and the clip reads the sums alone: its op still one a step
grep -qE "(^|[[:space:]])clip[[:space:]]+grad_clip[[:space:]]+optimizer[[:space:]]+2[[:space:]]" "$prof" ||
	{ cat "$prof"; fail "the profile has no clip op a step"; }

# 1b: a device built before ABI 2.32 is never asked (tprefill28: the CPU
# device as it is but for its abi_minor, 28; tests/plugins/tnodecode.c):
# its one pass gives the same steps, and its profile has no grad_sumsq
plugdir="$abs_top_builddir/tests/plugins/nodecode/.libs"
[ -f "$plugdir/kiln-tnodecode.so" ] || fail "no $plugdir/kiln-tnodecode.so (make check builds it)"
KILN_PLUGIN_PATH=$plugdir
export KILN_PLUGIN_PATH
steps "$tmp/p" > "$tmp/p.steps"
for d in tprefill28 tknown31 tnosums; do
	KILN_LOG_LEVEL=debug kiln 0 train "$ini" run.device=$d run.out_dir="$tmp/q" train.overwrite=1 \
		run.profile=1 train.max_steps=3
	! grep -q "which ABI 2.31 does not have" "$err" || fail "$d: $(grep "does not have" "$err" | head -1)"
	! grep -q grad_sumsq "$tmp/q/profile.txt" || { cat "$tmp/q/profile.txt"; fail "$d: grad_sumsq"; }
	! grep -q "per-layer sums" "$err" || fail "$d: a step took the per-layer sums"
	steps "$tmp/q" > "$tmp/q.steps"
	[ "$(wc -l < "$tmp/p.steps")" -eq 3 ] && cmp -s "$tmp/p.steps" "$tmp/q.steps" ||
		{ diff "$tmp/p.steps" "$tmp/q.steps"; fail "$d's one pass: other steps"; }
done
grep -q "one pass before the optimizer: tnosums: GRAD_SUMSQ: bad op" "$err" ||
	{ grep "gradients' check" "$err"; fail "tnosums: its refusal not said at debug level"; }
unset KILN_PLUGIN_PATH

# 2: the same bits as the one pass
same "skip_nonfinite"
first=$(sed -n '1s/.* //p' "$tmp/a.steps")
same "clip_norm $first / 4" train.clip_norm="$(awk -v n="$first" 'BEGIN { print n / 4 }')"
grep -q ' 0 8 ' "$tmp/a.steps" || fail "clip_norm: not every step clipped: $(tail -1 "$tmp/a.steps")"
same "clip_value 0.001, 2 threads" train.clip_value=0.001 run.threads=2
# 3: kiln memory's "other" with the check on, less with it off
other() {
	kiln 0 memory "$ini" "$@"
	got=$(field other "$out")
}
for o in "" run.precision=fp16 train.accumulate=2; do
	exp=0
	[ -z "$o" ] && exp=2096
	other $o
	on=$got
	other $o train.skip_nonfinite=0
	d=$((on - got))
	[ "$d" -eq "$exp" ] || fail "kiln memory ${o:-fp32}: the check adds $d bytes, want $exp (the sums where taken)"
	echo "ok: kiln memory ${o:-fp32}: the check's sums $d bytes"
done
echo "PASS: $name ($checks kiln runs)"
