#!/bin/sh
# tests/checkpoint_once.sh - the weights file a command names (--checkpoint
# F of kiln export, eval, eval --fold, predict and quantize; --quantized Q
# of eval and predict) is opened once: its kind (a kiln checkpoint or a
# weights file) told from its first bytes and its weights read through
# that one descriptor.  Before session 39 F was opened two or three times
# (the checkpoint magic, then the checkpoint or weights reader, then again
# to fold), so a file replaced between the opens was told apart as one
# file and read as another: a safetensors F replaced by a kiln checkpoint
# loaded that checkpoint's weights unverified (its config never checked),
# and a checkpoint was verified whole twice.
#
# tests/shim_fault.c logs the open()s of the path (SHIM_OPEN_PREFIX, in
# SHIM_OPEN_LOG) and at the second renames SHIM_OPEN_WITH over it (other
# weights of the same model): the command's output must be the untouched
# file's, byte for byte, after one open.
name=checkpoint_once
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
c="data.path=$data data.eval.path=$data run.out_dir=$tmp/none"

shim_build || fail "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"

# the weights: PyTorch's trained tensors (safetensors) and a checkpoint of
# 5 steps from its initial ones; two INT8 models, one of each
kiln 0 train "$ini" "data.path=$data" "model.init_from=$data/tr_cnn_init.safetensors" \
	"run.out_dir=$tmp/run"
st="$data/tr_cnn_trained.safetensors"
ck="$tmp/run/checkpoints/ckpt-5.kiln"
[ -f "$ck" ] || fail "no checkpoint"
kiln 0 quantize "$ini" $c --checkpoint "$st" --calibrate 1 --out "$tmp/q_st" data.eval.split=train
kiln 0 quantize "$ini" $c --checkpoint "$ck" --calibrate 1 --out "$tmp/q_ck" data.eval.split=train

# each command: LABEL OUTPUT ARGS (@F@: the file named; OUTPUT: the file
# compared, "stdout" for standard output; the command: LABEL to its '-')
cat >"$tmp/cases" <<EOF
export $tmp/got --checkpoint @F@ --safetensors $tmp/got
eval stdout --checkpoint @F@
eval-fold stdout --checkpoint @F@ --fold
predict stdout --checkpoint @F@ --eval-set
predict-no-fold stdout --checkpoint @F@ --eval-set --no-fold
quantize $tmp/got --checkpoint @F@ --calibrate 1 --out $tmp/got data.eval.split=train
EOF
cat >"$tmp/qcases" <<EOF
eval-quantized stdout --quantized @F@
predict-quantized stdout --quantized @F@ --eval-set
EOF
# run FILE WITH LABEL OUTPUT ARGS...: the command with F = $tmp/F, a copy
# of FILE made anew; WITH: the file renamed over it at its second open
# ("-": the shim only counts); the output kept in $tmp/LABEL.WITH (eval's
# throughput dropped), the opens counted in $tmp/opens
run() {
	file=$1 with=$2 label=$3 output=$4
	shift 4
	cp "$file" "$tmp/F"
	[ "$with" = - ] || cp "$with" "$tmp/with"
	rm -f "$tmp/opens" "$tmp/got"
	set -- $(echo "$*" | sed "s|@F@|$tmp/F|")
	last="$label $ini $c $* (F renamed over at its second open: $with)"
	LD_PRELOAD="$shim" SHIM_OPEN_PREFIX="$tmp/F" SHIM_OPEN_AT=2 SHIM_OPEN_DO=swap \
		SHIM_OPEN_WITH="$tmp/with" SHIM_OPEN_LOG="$tmp/opens" \
		"$kiln" "${label%%-*}" "$ini" $c "$@" </dev/null >"$out" 2>"$err"
	rc=$?
	checks=$((checks + 1))
	[ $rc -eq 0 ] || fail "exit $rc"
	if [ "$output" = stdout ]; then
		sed 's/, "eval_samples_per_s": [^}]*//' "$out" >"$tmp/$label.$(basename "$with")"
	else
		cp "$output" "$tmp/$label.$(basename "$with")"
	fi
	[ "$(cat "$tmp/opens")" = "$tmp/F" ] ||
		fail "$label: F opened $(wc -l <"$tmp/opens") times"
}
# check FILE OTHER <CASES: each case with FILE, untouched and with OTHER
# renamed over it at a second open: the same output, one open (and OTHER's
# own output another, so that reading it would show)
check() {
	while read -r label output args; do
		run "$2" - "$label" "$output" $args
		mv "$tmp/$label.-" "$tmp/$label.other"
		run "$1" - "$label" "$output" $args
		! cmp -s "$tmp/$label.-" "$tmp/$label.other" ||
			fail "$label: $(basename "$1") and $(basename "$2") give the same output"
		run "$1" "$2" "$label" "$output" $args
		cmp -s "$tmp/$label.-" "$tmp/$label.$(basename "$2")" ||
			fail "$label: $(basename "$2") renamed over $(basename "$1") changed the output"
		echo "ok: $label of $(basename "$1"): opened once, the output of the file opened"
	done
}
check "$st" "$ck" <"$tmp/cases"
check "$ck" "$st" <"$tmp/cases"
check "$tmp/q_st" "$tmp/q_ck" <"$tmp/qcases"
echo "PASS: $checks checks"
