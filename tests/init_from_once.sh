#!/bin/sh
# tests/init_from_once.sh - [model] init_from is opened once: its kind
# (kiln checkpoint, llm.c's model file, safetensors) is told from its first
# bytes and its tensors read through that one descriptor.  Before session
# 38 it was opened up to three times (the checkpoint magic, llm.c's magic,
# then the reader), so a file removed between the opens was "cannot open:
# No such file or directory", exit 1, not the documented "[model]
# init_from: PATH: no such file", exit 2 (README.md, "Exit codes"), and a
# file replaced between them was read as the other one.
#
# tests/shim_fault.c logs the open()s of the path (SHIM_OPEN_PREFIX, in
# SHIM_OPEN_LOG, a line each) and, at the SHIM_OPEN_AT'th, first removes
# that file (SHIM_OPEN_DO=rm) or renames SHIM_OPEN_WITH over it
# (SHIM_OPEN_DO=swap).  `kiln export` with no checkpoint in out_dir exports the
# weights init_from gives: removed at the first open: exit 2, no such
# file; removed or replaced with a text file at a second open (there is
# none now): the export of the untouched file, byte for byte, one open.
name=init_from_once
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"

shim_build || fail "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"

common="data.path=$data run.out_dir=$tmp/empty"
# a checkpoint to start from too: 5 steps of tests/data/tr_cnn.ini
kiln 0 train "$data/tr_cnn.ini" "data.path=$data" \
	"model.init_from=$data/tr_cnn_init.safetensors" "run.out_dir=$tmp/run"
[ -f "$tmp/run/checkpoints/ckpt-5.kiln" ] || fail "no checkpoint"
echo "not a weights file" >"$tmp/text"

# shim WANT AT DO FILE: kiln export with [model] init_from = $tmp/init
# (a copy of FILE, made anew), the shim doing DO at its AT'th open; the
# opens counted in $tmp/opens
shim() {
	cp "$4" "$tmp/init"
	cp "$tmp/text" "$tmp/with"
	rm -f "$tmp/opens" "$tmp/got.safetensors"
	last="export $common model.init_from=$tmp/init --safetensors $tmp/got.safetensors (at open $2 of init_from: $3)"
	LD_PRELOAD="$shim" SHIM_OPEN_PREFIX="$tmp/init" SHIM_OPEN_AT=$2 SHIM_OPEN_DO=$3 \
		SHIM_OPEN_WITH="$tmp/with" SHIM_OPEN_LOG="$tmp/opens" \
		"$kiln" export "$data/tr_cnn.ini" $common "model.init_from=$tmp/init" \
		--safetensors "$tmp/got.safetensors" >"$out" 2>"$err"
	rc=$?
	[ $rc -eq "$1" ] || fail "exit $rc, expected $1"
}
for kind in safetensors checkpoint; do
	if [ $kind = safetensors ]; then f="$data/tr_cnn_init.safetensors"; else f="$tmp/run/checkpoints/ckpt-5.kiln"; fi
	kiln 0 export "$data/tr_cnn.ini" $common "model.init_from=$f" --safetensors "$tmp/want.safetensors"
	shim 2 1 rm "$f"
	stderr_has "[model] init_from: $tmp/init: no such file"
	echo "ok: $kind init_from removed as it is opened: exit 2, no such file"
	for do in rm swap; do
		shim 0 2 $do "$f"
		[ "$(cat "$tmp/opens")" = "$tmp/init" ] || fail "init_from opened $(wc -l <"$tmp/opens") times"
		cmp -s "$tmp/got.safetensors" "$tmp/want.safetensors" ||
			fail "the export differs from the untouched file's"
		echo "ok: $kind init_from opened once: $do after it changes nothing"
	done
done
echo "PASS"
