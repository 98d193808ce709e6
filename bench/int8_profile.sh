#!/bin/sh
# bench/int8_profile.sh - where INT8 evaluation spends its time, on one
# thread, for the checkpoints and quantized files bench/int8.sh left in
# --dir: for each model and variant (fp32 folded, INT8 with f32 between
# the INT8 layers, INT8 chained: u8 between them, docs/inference.md)
#  1. oneDNN's own time per primitive (ONEDNN_VERBOSE=2 exec lines of one
#     `kiln eval` of --limit test images, summed by kind, implementation,
#     data types and shape), and its total;
#  2. the CPU seconds of the evaluation alone: user+sys of `kiln eval` of
#     --limit + 500 images minus that of 500 images (start-up, reading,
#     folding and planning cancel), --rounds rounds interleaved.
# Usage: sh bench/int8_profile.sh --dir D [--models "cnn resnet"] [--limit N] [--rounds R]
# From the top of the build tree, after `sh bench/int8.sh --dir D`.
# Environment: KILN (default ./kiln).
set -eu
DIR= MODELS="cnn resnet" LIMIT=2000 ROUNDS=3
while [ $# -gt 0 ]; do
	case $1 in
	--dir) DIR=$2; shift 2 ;;
	--models) MODELS=$2; shift 2 ;;
	--limit) LIMIT=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[ -n "$DIR" ] || { echo "bench/int8_profile.sh: --dir D (bench/int8.sh's) is required" >&2; exit 2; }
KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
HERE=$(dirname "$0")
ex() { echo "$HERE/../examples/fashion_mnist_$1.ini"; }
export OMP_NUM_THREADS=1

# variant arguments of model $1 and variant $2
args() {
	ck=$(ls "$DIR/$1"/checkpoints/ckpt-*.kiln | sort -V | tail -1) # the newest step
	nochain=$(KILN_LOG_LEVEL=info "$KILN" eval "$(ex "$1")" run.out_dir="$DIR/$1" data.eval.limit=1 \
		--quantized "$DIR/$1.int8" 2>&1 >/dev/null |
		sed -n "s/.*layer '\([^']*\)' writes u8.*/layer.\1.int8_out_scale=0/p" | tr '\n' ' ')
	case $2 in
	fold) echo "--checkpoint $ck --fold" ;;
	int8-f32) echo "--quantized $DIR/$1.int8 $nochain" ;;
	int8) echo "--quantized $DIR/$1.int8" ;;
	esac
}

# user+sys CPU seconds of one evaluation of $3 images
cpu() {
	# shellcheck disable=SC2086
	/usr/bin/time -f '%U %S' -o "$DIR/prof.time" "$KILN" eval "$(ex "$1")" run.out_dir="$DIR/$1" \
		run.threads=1 data.eval.limit="$3" $2 >/dev/null 2>&1
	awk '{ print $1 + $2 }' "$DIR/prof.time"
}

echo "load average before: $(cat /proc/loadavg)"
for m in $MODELS; do
	for v in fold int8-f32 int8; do
		a=$(args "$m" "$v")
		echo "### $m $v: oneDNN ms per primitive, $LIMIT images, 1 thread"
		# shellcheck disable=SC2086
		ONEDNN_VERBOSE=2 "$KILN" eval "$(ex "$m")" run.out_dir="$DIR/$m" run.threads=1 \
			data.eval.limit="$LIMIT" $a 2>/dev/null |
			awk -F, '$1 == "onednn_verbose" && $2 == "exec" {
				k = $4 " " $5 " " $7 " " $(NF - 1); t[k] += $NF; s += $NF }
				END { for (k in t) printf "%10.1f  %s\n", t[k], k; printf "%10.1f  TOTAL\n", s }' |
			sort -rn | head -25
	done
done
echo "### CPU s of the evaluation alone (limit $((LIMIT + 500)) minus 500), 1 thread, $ROUNDS rounds"
echo "| model | variant | CPU s per round | mean |"
echo "|---|---|---|---:|"
for m in $MODELS; do
	for v in fp32 fold int8-f32 int8; do
		if [ "$v" = fp32 ]; then
			a="--checkpoint $(ls "$DIR/$m"/checkpoints/ckpt-*.kiln | sort -V | tail -1)"
		else
			a=$(args "$m" "$v")
		fi
		echo "$a" >"$DIR/prof.$m.$v.args"
	done
done
for r in $(seq "$ROUNDS"); do
	for m in $MODELS; do
		for v in fp32 fold int8-f32 int8; do
			a=$(cat "$DIR/prof.$m.$v.args")
			big=$(cpu "$m" "$a" $((LIMIT + 500))) small=$(cpu "$m" "$a" 500)
			echo "$big $small" | awk '{ printf "%.3f\n", $1 - $2 }' >>"$DIR/prof.$m.$v.cpu.$$"
		done
	done
done
for m in $MODELS; do
	for v in fp32 fold int8-f32 int8; do
		f="$DIR/prof.$m.$v.cpu.$$"
		echo "| $m | $v | $(tr '\n' ' ' <"$f") | $(awk '{ s += $1 } END { printf "%.3f", s / NR }' "$f") |"
	done
done
echo "load average after: $(cat /proc/loadavg)"
