#!/bin/sh
# bench/int8.sh - INT8 inference (docs/inference.md) against fp32: the
# Fashion-MNIST CNN and ResNet examples trained for --epochs epochs (or the
# checkpoints in --dir from an earlier run), quantized (minmax ranges, the default,
# 8 calibration batches of training data), then `kiln eval` on the 10000
# test images: fp32, fp32 folded, INT8 with f32 between the INT8 layers
# (int8-f32, every chained layer's int8_out_scale=0) and INT8 as `kiln eval
# --quantized` runs it (int8: u8 between the INT8 layers on the CPU), N runs
# interleaved.  The medians of eval samples/s and of the process's user+sys
# CPU seconds, the ratios to fp32 and to the folded fp32, the test
# accuracies and INT8 - fp32 in points, the ISA oneDNN's int8 convolution
# picked (ONEDNN_VERBOSE=1) and the load average before and after, as one
# table (a row per model and variant).
#
# Usage: sh bench/int8.sh [--short | --full] [--runs N] [--threads T] [--epochs E]
#                         [--limit L] [--eval-limit E] [--dir D] [--models "cnn resnet"]
#   --limit L       train on the first L training images (default: all 60000)
#   --eval-limit E  evaluate on the first E test images (default: all 10000)
#   --epochs E      train E epochs (default 2); 0: the examples' own [train] epochs
#   --short         --runs 3 --epochs 1 --limit 6000 --eval-limit 2000 (a few minutes)
#   --full          fully trained models: --epochs 0 (the examples' 15 epochs on all
#                   60000 images), --eval-limit 0, --runs 3 (hours on 2 loaded cores)
# From the top of the build tree.  Environment: KILN (default ./kiln).
set -eu
RUNS=5 THREADS=2 EPOCHS=2 LIMIT=0 ELIMIT=0 DIR= MODELS="cnn resnet"
while [ $# -gt 0 ]; do
	case $1 in
	--short) RUNS=3 EPOCHS=1 LIMIT=6000 ELIMIT=2000; shift ;;
	--full) RUNS=3 EPOCHS=0 LIMIT=0 ELIMIT=0; shift ;;
	--eval-limit) ELIMIT=$2; shift 2 ;;
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--epochs) EPOCHS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--limit) LIMIT=$2; shift 2 ;;
	--models) MODELS=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
HERE=$(dirname "$0")
DIR=${DIR:-$(mktemp -d)}
mkdir -p "$DIR"
ex() { echo "$HERE/../examples/fashion_mnist_$1.ini"; }
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | tail -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load average before: $(cat /proc/loadavg)"
rows= isas=
for m in $MODELS; do
	o="run.out_dir=$DIR/$m run.threads=$THREADS data.eval.limit=$ELIMIT"
	if ! ls "$DIR/$m"/checkpoints/ckpt-*.kiln >/dev/null 2>&1; then
		ep=
		[ "$EPOCHS" = 0 ] || ep="train.epochs=$EPOCHS"
		# shellcheck disable=SC2086
		"$KILN" train "$(ex "$m")" $o $ep data.limit="$LIMIT" train.eval=0 >/dev/null 2>"$DIR/$m.train.err"
	fi
	ck=$(ls "$DIR/$m"/checkpoints/ckpt-*.kiln | sort -V | tail -1) # the newest step
	# shellcheck disable=SC2086
	"$KILN" quantize "$(ex "$m")" $o --checkpoint "$ck" --calibrate 8 --out "$DIR/$m.int8" \
		data.eval.split=train >/dev/null 2>"$DIR/$m.quantize.err"
	# the ISA, and the layers that write u8 (core/quantize.c logs them)
	# shellcheck disable=SC2086
	isa=$(ONEDNN_VERBOSE=1 KILN_LOG_LEVEL=info "$KILN" eval "$(ex "$m")" $o --quantized "$DIR/$m.int8" \
		2>"$DIR/$m.int8.log" | sed -n 's/.*exec,cpu,convolution,\([^,]*\),forward_inference,src_[us]8.*/\1/p' |
		sort -u | tr '\n' ' ')
	nochain=$(sed -n "s/.*layer '\([^']*\)' writes u8.*/layer.\1.int8_out_scale=0/p" "$DIR/$m.int8.log" | tr '\n' ' ')
	# this run's figures only: a --dir reused from an earlier run keeps its
	# checkpoints, not its per-run rates
	for v in fp32 fold int8-f32 int8; do
		rm -f "$DIR/$m.$v.sps" "$DIR/$m.$v.cpu"
	done
	for r in $(seq "$RUNS"); do
		for v in fp32 fold int8-f32 int8; do
			case $v in
			fp32) a="--checkpoint $ck" ;;
			fold) a="--checkpoint $ck --fold" ;;
			int8-f32) a="--quantized $DIR/$m.int8 $nochain" ;;
			int8) a="--quantized $DIR/$m.int8" ;;
			esac
			# shellcheck disable=SC2086
			/usr/bin/time -f '%U %S' -o "$DIR/$m.$v.$r.time" \
				"$KILN" eval "$(ex "$m")" $o $a 2>/dev/null >"$DIR/$m.$v.$r"
			field eval_samples_per_s <"$DIR/$m.$v.$r" >>"$DIR/$m.$v.sps"
			awk '{ print $1 + $2 }' "$DIR/$m.$v.$r.time" >>"$DIR/$m.$v.cpu"
		done
	done
	f=$(median <"$DIR/$m.fp32.sps") fo=$(median <"$DIR/$m.fold.sps")
	acc=$(field test_acc <"$DIR/$m.fp32.1")
	for v in fp32 fold int8-f32 int8; do
		r=$(median <"$DIR/$m.$v.sps") a=$(field test_acc <"$DIR/$m.$v.1")
		rows="$rows$(printf '| %s | %s | %s | %s | %s | %s | %s | %s |' "$m" "$v" "$r" \
			"$(echo "$r $f" | awk '{ printf "%.2fx", $1 / $2 }')" \
			"$(echo "$r $fo" | awk '{ printf "%.2fx", $1 / $2 }')" \
			"$(median <"$DIR/$m.$v.cpu")" "$a" \
			"$(echo "$a $acc" | awk '{ printf "%+.2f", 100 * ($1 - $2) }')")
"
	done
	isas="$isas$m: ${isa:-?}; "
done
echo "eval samples/s and process CPU s (user+sys, start-up included), medians of $RUNS interleaved runs, $THREADS threads"
echo "| model | variant | samples/s | vs fp32 | vs fp32 folded | CPU s | test acc | vs fp32 (points) |"
echo "|---|---|---:|---:|---:|---:|---|---:|"
printf '%s' "$rows"
echo "oneDNN int8 convolution: $isas"
echo "load average after: $(cat /proc/loadavg)"
echo "checkpoints and quantized files in $DIR"
