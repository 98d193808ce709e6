#!/bin/sh
# tests/trained_no_data.sh - with a checkpoint that records its sample
# shape (section `sample`), `kiln eval`, `kiln export`, `kiln predict` and
# `kiln generate` do not open the training set ([data]): they run, and
# give the same output, with it moved away after training, and an
# LD_PRELOAD shim sees none of its files opened while it is there.
# Before session 38 each opened (and listed) the whole training set only
# to warn of a [data] sample shape that differed from the checkpoint's:
# a folder of 100k images or a large records file for one prediction.
# ([data.eval], which eval and predict --eval-set read, is elsewhere.)
name=trained_no_data
. "$(dirname "$0")/lib.sh"
need_source idx
need_source tokens
data="$srcdir/tests/data"

# tests/shim_fault.c: each open() of a path under SHIM_OPEN_PREFIX is a
# line of SHIM_OPEN_LOG
shim_build || fail "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"

# the CNN: [data] in $tmp/tr, [data.eval] in $tmp/ev; an image to predict
mkdir "$tmp/tr" "$tmp/ev"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/tr/"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/ev/"
ini="$data/tr_cnn.ini"
c="data.path=$tmp/tr data.eval.path=$tmp/ev run.out_dir=$tmp/run"
kiln 0 train "$ini" $c "model.init_from=$data/tr_cnn_init.safetensors"
kiln 0 pack "$ini" $c --format folder --store png --out "$tmp/png" --section data.eval
png=$(find "$tmp/png" -name '*.png' | sort | head -1)
[ -n "$png" ] || fail "kiln pack wrote no PNG"
# the GPT: bytes of a small text, [data] in $tmp/tok
i=0
while [ $i -lt 50 ]; do
	echo "the quick brown fox $i"
	i=$((i + 1))
done >"$tmp/corpus.txt"
kiln 0 pack --format tokens "$tmp/corpus.txt" --out "$tmp/tr/tok" --val-fraction 0.1
printf '[run]\nseed = 1\nthreads = 1\n[data]\nsource = tokens\ncontext = 16\nvocab = 256\n' >"$tmp/gpt.ini"
printf '[train]\nbatch = 4\nmax_steps = 3\neval = 0\n' >>"$tmp/gpt.ini"
printf '[layer.wte]\ntype = embedding\nvocab = 256\ndim = 8\n' >>"$tmp/gpt.ini"
printf '[layer.wpe]\ntype = pos_embedding\nmax_len = 16\n[layer.ln_f]\ntype = layernorm\n' >>"$tmp/gpt.ini"
printf '[layer.lm_head]\ntype = linear\nout = 256\nbias = 0\ntie = wte\n' >>"$tmp/gpt.ini"
printf '[layer.loss]\ntype = softmax_xent\n' >>"$tmp/gpt.ini"
g="data.path=$tmp/tr/tok run.out_dir=$tmp/grun"
kiln 0 train "$tmp/gpt.ini" $g

# each command: LABEL OUTPUT CONFIG OVERRIDES ARGS (OUTPUT: the file whose
# bytes are compared, "stdout" for standard output)
cases() {
	echo "eval stdout $ini $c"
	echo "export $tmp/w.safetensors $ini $c --safetensors $tmp/w.safetensors"
	echo "predict-eval-set stdout $ini $c --eval-set"
	echo "predict-logits $tmp/l.npy $ini $c --eval-set --logits $tmp/l.npy"
	echo "predict-png stdout $ini $c $png"
	echo "generate stdout $tmp/gpt.ini $g --prompt the --tokens 5 --seed 3"
}
# run WHEN LABEL OUTPUT CMD ARGS...: the command (the shim on when WHEN is
# "with"), its output kept in $tmp/WHEN.LABEL (eval: its test_loss)
run() {
	when=$1 label=$2 file=$3
	shift 3
	[ "$file" = stdout ] || rm -f "$file"
	rm -f "$tmp/opens"
	if [ "$when" = with ]; then
		LD_PRELOAD="$shim" SHIM_OPEN_PREFIX="$tmp/tr/" SHIM_OPEN_LOG="$tmp/opens" "$kiln" "$@" >"$out" 2>"$err"
	else
		"$kiln" "$@" >"$out" 2>"$err"
	fi
	rc=$?
	last="$* ($when the training set)"
	[ $rc -eq 0 ] || fail "exit $rc"
	if [ "$file" = stdout ]; then
		cp "$out" "$tmp/$when.$label"
	else
		cp "$file" "$tmp/$when.$label"
	fi
	[ "$label" = eval ] && field test_loss "$out" >"$tmp/$when.$label"
	[ -s "$tmp/$when.$label" ] || fail "no output"
}
cases | while read -r label file cfg rest; do
	cmd=${label%%-*}
	# shellcheck disable=SC2086 # (the overrides and arguments, split)
	run with "$label" "$file" $cmd "$cfg" $rest
	[ ! -s "$tmp/opens" ] || fail "$label opened the training set: $(sort -u "$tmp/opens" | tr '\n' ' ')"
	echo "ok: $label: no file of [data] opened"
done || exit 1
mv "$tmp/tr" "$tmp/tr.away"
cases | while read -r label file cfg rest; do
	cmd=${label%%-*}
	# shellcheck disable=SC2086
	run without "$label" "$file" $cmd "$cfg" $rest
	cmp -s "$tmp/with.$label" "$tmp/without.$label" ||
		fail "$label: the output differs without the training set"
	echo "ok: $label with the training set moved away: exit 0, the same output"
done || exit 1

# a folder training set ([data] source = folder): predict names the classes
# by its class folders, listed as it starts (not its images); moved away,
# the indices with a warning (before session 38: "cannot list the
# directory", exit 1).  The packed folders are named by index: the same lines.
kiln 0 pack "$ini" "data.path=$data" --format folder --store png --out "$tmp/f" --section data
kiln 0 pack "$ini" "data.path=$data" --format folder --store png --out "$tmp/fe" --section data.eval
sed -e '/^images\|^labels/d' -e 's/^source = idx/source = folder/' "$ini" >"$tmp/f.ini"
f="data.path=$tmp/f data.size=8 data.channels=1 data.eval.path=$tmp/fe run.out_dir=$tmp/frun"
kiln 0 train "$tmp/f.ini" $f
kiln 0 predict "$tmp/f.ini" $f "$png"
stdout_has '"class": "4"'
cp "$out" "$tmp/f.with"
mv "$tmp/f" "$tmp/f.away"
kiln 0 predict "$tmp/f.ini" $f "$png"
stderr_has "[predict] warning: $tmp/f: no such directory ([data] path): the training split's class names are not known; the classes are their indices"
cmp -s "$out" "$tmp/f.with" || fail "predict's output differs without the folder training set"
echo "ok: a folder training set moved away: predict prints the indices for its classes"
echo "PASS"
