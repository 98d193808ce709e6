#!/bin/sh
# tests/affine.sh - thread-affine optimizer updates (session 50, issue 22):
# on a team of 2 the written weight gradient is kiln's own row split
# (plugins/cpu/gemm.c, gemm_blas_rows: each thread runs sgemm on its rows)
# and SGD and AdamW give each thread the rows it wrote (CPU_AFFINE_FOR,
# plugins/cpu/split.c).  Neither may move a bit: the benchmark's MLP
# (784-512-256-10) for 8 steps of 64 on random pixels, with
# $KILN_CPU_AFFINE=1 (on: it is off by default) and without (oneDNN's
# threaded sgemm whole and the update in halves of the flat buffer),
# gives the same loss and grad_norm every step and the same weights after (`kiln export`),
# for SGD with momentum and for AdamW, on 2 threads; and the split rows
# are those the one-thread run computes (run.threads = 1, whole sgemm).
name=affine
. "$(dirname "$0")/lib.sh"
need_source idx

# the ops: the written dW of check_device_gemm's shapes with the knob on
# (the fixture's team: 2 threads here, so the row split runs) has the
# matmul's bytes; a wrong row of the split fails it
KILN_CPU_AFFINE=1 CK_RUN_CASE=gemm_dw_write "$top_builddir/tests/check_device_gemm" \
	> "$tmp/dw.out" 2>&1 || { cat "$tmp/dw.out"; fail "check_device_gemm gemm_dw_write with KILN_CPU_AFFINE=1"; }
grep -q '100%: Checks: [1-9]' "$tmp/dw.out" || { cat "$tmp/dw.out"; fail "gemm_dw_write did not run"; }
echo "ok: the row-split dW has the matmul's bytes ($(grep -o 'Checks: [0-9]*' "$tmp/dw.out"))"

mlp_fixture 50 2
runs=0

# the train lines' step, loss and grad_norm
steps() { grep '"event": *"train"' "$1/metrics.jsonl" |
	sed 's/.*"step": *\([0-9]*\).*"loss": *\([^,]*\),.*"grad_norm": *\([^,}]*\).*/\1 \2 \3/'; }

# run DIR ENV OVERRIDES...: 8 steps into $tmp/DIR, its weights in $tmp/DIR.st
run() {
	d=$1 e=$2
	shift 2
	env KILN_CPU_AFFINE="$e" "$kiln" train "$ini" run.out_dir="$tmp/$d" \
		train.overwrite=1 "$@" > "$tmp/$d.out" 2>&1 || {
		rc=$?
		cat "$tmp/$d.out"
		fail "$d: kiln train: exit $rc"
	}
	runs=$((runs + 1))
	steps "$tmp/$d" > "$tmp/$d.steps"
	[ "$(wc -l < "$tmp/$d.steps")" -eq 8 ] || fail "$d: $(wc -l < "$tmp/$d.steps") train lines, expected 8"
	kiln 0 export "$ini" --checkpoint "$tmp/$d/checkpoints/ckpt-8.kiln" --safetensors "$tmp/$d.st" \
		run.out_dir="$tmp/none" "$@"
}

# same WHAT A B: runs A and B took the same steps to the same weights
same() {
	cmp -s "$tmp/$2.steps" "$tmp/$3.steps" ||
		{ diff "$tmp/$2.steps" "$tmp/$3.steps"; fail "$1: the steps' loss or grad_norm differ"; }
	cmp -s "$tmp/$2.st" "$tmp/$3.st" || fail "$1: the weights after 8 steps differ"
	echo "ok: $1: 8 steps, the same bits ($(sed -n '8p' "$tmp/$2.steps"))"
}

for opt in sgd adamw; do
	o="train.optimizer=$opt"
	[ "$opt" = adamw ] && o="$o train.lr=0.001"
	# shellcheck disable=SC2086 # the overrides' words
	run "$opt-off" "" $o
	# shellcheck disable=SC2086
	run "$opt-on" 1 $o
	# shellcheck disable=SC2086
	run "$opt-one" 1 $o run.threads=1
	same "$opt: thread-affine against the old split" "$opt-off" "$opt-on"
	same "$opt: thread-affine against one thread" "$opt-one" "$opt-on"
done
echo "PASS: $name ($runs kiln train runs, $checks kiln exports, check_device_gemm)"
