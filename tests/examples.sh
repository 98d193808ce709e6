#!/bin/sh
# tests/examples.sh - the data examples end to end on a slice of
# Fashion-MNIST: pack the idx files into records shards and into an image
# folder with `kiln pack` (the commands in the examples' headers), train
# examples/fashion_mnist_records.ini and examples/fashion_mnist_folder.ini
# for two short epochs, and check that
#   - records give exactly the run the idx example gives (same pixels, same
#     order: identical final loss and accuracy),
#   - the folder run learns (accuracy well above chance),
#   - `kiln bench data` reports a rate for the folder,
#   - examples/fashion_mnist_cnn.ini with run.precision=bf16 (bf16 compute)
#     learns and ends within 3 points of the same run in fp32,
#   - examples/gpt_char.ini trains a few steps on the fortunes, and
#     examples/gpt2_small.ini has GPT-2 124M's parameter count (summary, memory).
# Run by `make check` (tests/local.mk exports top_builddir, abs_top_srcdir).
name=examples
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

short="data.limit=6000 data.eval.limit=1000 train.epochs=2 run.out_dir="
for sec in data data.eval; do
	"$kiln" pack "$srcdir/examples/fashion_mnist_mlp.ini" --out "$tmp/records" --section $sec \
		data.limit=6000 data.eval.limit=1000 >/dev/null 2>"$tmp/err" ||
		{ cat "$tmp/err"; fail "pack records ($sec)"; }
	"$kiln" pack "$srcdir/examples/fashion_mnist_mlp.ini" --out "$tmp/folder" --section $sec \
		--format folder --store png data.limit=6000 data.eval.limit=1000 >/dev/null 2>"$tmp/err" ||
		{ cat "$tmp/err"; fail "pack folder ($sec)"; }
done
echo "ok: packed 6000 + 1000 samples as records and as a PNG folder"

# shellcheck disable=SC2086
"$kiln" train "$srcdir/examples/fashion_mnist_mlp.ini" $short >"$tmp/idx.out" 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "train idx"; }
# shellcheck disable=SC2086
"$kiln" train "$srcdir/examples/fashion_mnist_records.ini" $short "data.path=$tmp/records" \
	>"$tmp/rec.out" 2>"$tmp/err" || { cat "$tmp/err"; fail "train records"; }
same_metrics idx "$tmp/idx.out" records "$tmp/rec.out"
echo "ok: records train exactly as idx (test_acc $(field test_acc "$tmp/rec.out"))"

# shellcheck disable=SC2086
"$kiln" train "$srcdir/examples/fashion_mnist_folder.ini" $short "data.path=$tmp/folder" \
	>"$tmp/fold.out" 2>"$tmp/err" || { cat "$tmp/err"; fail "train folder"; }
acc=$(field test_acc "$tmp/fold.out")
awk -v a="$acc" 'BEGIN { exit !(a > 0.65) }' || fail "folder test_acc $acc <= 0.65"
echo "ok: folder trains (test_acc $acc)"

"$kiln" bench data "$srcdir/examples/fashion_mnist_folder.ini" "data.path=$tmp/folder" \
	data.limit=3000 --batches 5 >"$tmp/bench.out" 2>"$tmp/err" || { cat "$tmp/err"; fail "bench data"; }
rate=$(field samples_per_s "$tmp/bench.out")
awk -v r="$rate" 'BEGIN { exit !(r > 0) }' || fail "bench data: samples_per_s '$rate'"
grep -q "read+decode" "$tmp/err" || fail "bench data: no breakdown on stderr"
echo "ok: kiln bench data: $rate samples/s"

# bf16 compute on the CNN example: a slice, against the same slice in fp32
# tune_cache = none: the timing below must happen even when an earlier test
# left the choices in the suite's cache (tests/cpu_tune_cache.sh tests it)
cnn="data.limit=4000 data.eval.limit=1000 train.epochs=2 run.out_dir= plugin.cpu.tune_cache=none"
for p in fp32 bf16; do
	# shellcheck disable=SC2086
	"$kiln" train "$srcdir/examples/fashion_mnist_cnn.ini" $cnn run.precision=$p \
		>"$tmp/cnn-$p.out" 2>"$tmp/cnn-$p.err" || { cat "$tmp/cnn-$p.err"; fail "train cnn $p"; }
done
grep -q "precision = bf16: bf16 compute" "$tmp/cnn-bf16.err" || fail "cnn bf16: no precision line in the log"
# [plugin.cpu] bf16_conv = bf16_gemm = auto: one timed choice per GEMM (fc1's
# and fc2's three) and per convolution oneDNN runs (on AVX-512 none: conv1
# is kiln's first-layer kernel since session 24, conv2 the FFT since 23)
n=$(grep -c '^\[cpu\] bf16 \(CONV\|CONV_BWD_DATA\|CONV_BWD_WEIGHTS\|GEMM\) .*: the \(bf16\|f32\|second bf16\) kernel$' "$tmp/cnn-bf16.err" || true)
[ "$n" -ge 6 ] || fail "cnn bf16: $n kernel choices logged, want one per bf16 convolution and GEMM"
a32=$(field test_acc "$tmp/cnn-fp32.out")
a16=$(field test_acc "$tmp/cnn-bf16.out")
awk -v a="$a16" -v b="$a32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.65 && d <= 0.03) }' ||
	fail "cnn bf16 test_acc $a16 vs fp32 $a32 (want > 0.65 and within 0.03)"
echo "ok: cnn bf16 test_acc $a16, fp32 $a32"

# the GPT examples: examples/gpt_char.ini on Debian's fortunes for a few
# steps (scripts/make-gpt-char-data packs them), and GPT-2 small's shape
# (examples/gpt2_small.ini) through kiln summary and kiln memory on a tiny
# shard of byte tokens
[ -d /usr/share/games/fortunes ] || fail "/usr/share/games/fortunes missing: run scripts/install-deps"
KILN="$kiln" "$srcdir/scripts/make-gpt-char-data" "$tmp/gpt_char" >/dev/null 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "make-gpt-char-data"; }
"$kiln" train "$srcdir/examples/gpt_char.ini" "data.path=$tmp/gpt_char" train.max_steps=3 train.batch=4 \
	train.eval_every=3 data.eval.limit=8 "run.out_dir=$tmp/gpt_run" >"$tmp/gpt.out" 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "train gpt_char"; }
loss=$(field test_loss "$tmp/gpt.out")
awk -v l="$loss" 'BEGIN { exit !(l > 2 && l < 6) }' || fail "gpt_char: test_loss '$loss' after 3 steps"
echo "ok: gpt_char trains 3 steps (test_loss $loss)"
small="data.path=$tmp/gpt_char data.shards=train-*.bin data.eval.shards=val-*.bin run.device=cpu"
# shellcheck disable=SC2086
"$kiln" summary "$srcdir/examples/gpt2_small.ini" $small >"$tmp/g2.out" 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "summary gpt2_small"; }
grep -q '"params": 124475904,' "$tmp/g2.out" || fail "gpt2_small: not GPT-2 124M's 124,475,904 parameters (vocab 50304, tied)"
# shellcheck disable=SC2086
"$kiln" memory "$srcdir/examples/gpt2_small.ini" $small >"$tmp/g2m.out" 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "memory gpt2_small"; }
grep -q '"recompute_segments": [1-9]' "$tmp/g2m.out" || fail "gpt2_small: kiln memory shows no recompute = auto segments"
echo "ok: gpt2_small: 124,475,904 parameters; kiln memory $(field total "$tmp/g2m.out") bytes"
