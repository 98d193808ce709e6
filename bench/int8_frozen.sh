#!/bin/sh
# bench/int8_frozen.sh - INT8 inference plans with frozen weights (ABI 2.15
# KILN_OPF_FROZEN on QCONV and QLINEAR, issue 23): `kiln predict --quantized
# --eval-set` of the Fashion-MNIST CNN (trained 1 epoch on 6000 images,
# quantized on 8 batches) over the 10000 test images in blocks of
# [run] infer_block rows, N rounds interleaved of
#   main:     a build before the change (--main DIR, its kiln and plugins),
#   frozen:   this build (QCONV/QLINEAR keep their quantized weights, no
#             compare of the f32 weights per run),
#   compared: this build with [plugin.cpu] keep_weights = 0 (the weights
#             compared every run, as before; the f32 conv1 also reorders
#             its weights every run).
# conv1 (f32) runs oneDNN's first implementation in all three
# ([plugin.cpu] conv_impl = first): timed choices, made per build's tune
# cache under load, can differ and change the logits' rounding.
# Prints each run's wall and user/sys seconds, then the medians, the load
# average before and after, and whether the three builds' logits are the
# same bytes.
# Usage: sh bench/int8_frozen.sh --main DIR [--runs N] [--block B] [--dir D]
# XDG_CACHE_HOME, unless set, is D/cache (kiln's IDX data and plugin probe).
# From the top of the build tree.
set -eu
RUNS=5 BLOCK=16 MAIN='' DIR=''
while [ $# -gt 0 ]; do
	case $1 in
	--main) MAIN=$2; shift 2 ;;
	--runs) RUNS=$2; shift 2 ;;
	--block) BLOCK=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[ -n "$MAIN" ] && [ -x "$MAIN/kiln" ] || { echo "bench/int8_frozen.sh: --main DIR: a built tree with ./kiln" >&2; exit 2; }
FM=${FM:-/usr/share/datasets/fashion-mnist}
cnn=examples/fashion_mnist_cnn.ini
DIR=${DIR:-$(mktemp -d)}
mkdir -p "$DIR"
# kiln's other caches (inflated IDX data, the plugin probe) in DIR too, not
# the user's ~/.cache (as bench/common.sh does), unless the caller set one
if [ -z "${XDG_CACHE_HOME:-}" ]; then
	XDG_CACHE_HOME=$DIR/cache
	export XDG_CACHE_HOME
fi
W=$(pwd)
if [ ! -f "$DIR/cnn.int8" ]; then
	./kiln train $cnn "run.out_dir=$DIR/cnn" "data.path=$FM" data.limit=6000 data.eval.limit=500 \
		train.epochs=1 >/dev/null 2>"$DIR/train.err"
	./kiln quantize $cnn "run.out_dir=$DIR/cnn" "data.path=$FM" --calibrate 8 --out "$DIR/cnn.int8" \
		data.eval.split=train >/dev/null 2>"$DIR/quantize.err"
fi
one() { # LABEL PLUGIN_DIR KILN [key=value ...]
	l=$1 pp=$2 k=$3
	shift 3
	KILN_PLUGIN_PATH=$pp /usr/bin/time -f "$l %e %U %S" "$k" predict $cnn --quantized "$DIR/cnn.int8" \
		--eval-set --logits "$DIR/$l.npy" "data.path=$FM" "run.out_dir=$DIR/cnn" \
		"plugin.cpu.tune_cache=$DIR/tune_$l.bin" plugin.cpu.conv_impl=first "run.infer_block=$BLOCK" "$@" \
		2>&1 >/dev/null | tail -1
}
echo "load average before: $(cat /proc/loadavg)"
for r in $(seq 0 "$RUNS"); do # round 0: the tune caches, not counted
	for v in main frozen compared; do
		case $v in
		main) o=$(one main "$MAIN/plugins/.libs" "$MAIN/kiln") ;;
		frozen) o=$(one frozen "$W/plugins/.libs" "$W/kiln") ;;
		compared) o=$(one compared "$W/plugins/.libs" "$W/kiln" plugin.cpu.keep_weights=0) ;;
		esac
		[ "$r" -gt 0 ] && echo "$o" >>"$DIR/runs" && echo "$o"
	done
done
echo "load average after: $(cat /proc/loadavg)"
med() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
for v in main frozen compared; do
	w=$(awk -v l=$v '$1 == l { print $2 }' "$DIR/runs" | med)
	c=$(awk -v l=$v '$1 == l { print $3 + $4 }' "$DIR/runs" | med)
	echo "$v: median wall $w s, user+sys $c s ($RUNS runs, blocks of $BLOCK)"
done
cmp -s "$DIR/main.npy" "$DIR/frozen.npy" && cmp -s "$DIR/main.npy" "$DIR/compared.npy" &&
	echo "logits: the same bytes in all three" || echo "logits: DIFFER"
rm -f "$DIR/runs"
