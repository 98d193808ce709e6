#!/bin/sh
# bench/int8.sh - INT8 inference (docs/inference.md) against fp32: the
# Fashion-MNIST CNN and ResNet examples trained for --epochs epochs (or the
# checkpoints in --dir from an earlier run), quantized (percentile ranges,
# 8 calibration batches of training data), then `kiln eval` on the 10000
# test images, fp32, fp32 folded and INT8, N runs interleaved; the medians
# of eval samples/s, the ratios, the test accuracies, the ISA oneDNN's int8
# convolution picked (ONEDNN_VERBOSE=1) and the load average before and
# after, as one table (a row per model and variant).
#
# Usage: sh bench/int8.sh [--short] [--runs N] [--threads T] [--epochs E] [--limit L]
#                         [--eval-limit E] [--dir D] [--models "cnn resnet"]
#   --limit L       train on the first L training images (default: all 60000)
#   --eval-limit E  evaluate on the first E test images (default: all 10000)
#   --short         --runs 3 --epochs 1 --limit 6000 --eval-limit 2000 (a few minutes)
# From the top of the build tree.  Environment: KILN (default ./kiln).
set -eu
RUNS=5 THREADS=2 EPOCHS=2 LIMIT=0 ELIMIT=0 DIR= MODELS="cnn resnet"
while [ $# -gt 0 ]; do
	case $1 in
	--short) RUNS=3 EPOCHS=1 LIMIT=6000 ELIMIT=2000; shift ;;
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
		# shellcheck disable=SC2086
		"$KILN" train "$(ex "$m")" $o train.epochs="$EPOCHS" data.limit="$LIMIT" train.eval=0 >/dev/null 2>"$DIR/$m.train.err"
	fi
	ck=$(ls "$DIR/$m"/checkpoints/ckpt-*.kiln | tail -1)
	# shellcheck disable=SC2086
	"$KILN" quantize "$(ex "$m")" $o --checkpoint "$ck" --calibrate 8 --out "$DIR/$m.int8" \
		data.eval.split=train >/dev/null 2>"$DIR/$m.quantize.err"
	# shellcheck disable=SC2086
	isa=$(ONEDNN_VERBOSE=1 "$KILN" eval "$(ex "$m")" $o --quantized "$DIR/$m.int8" 2>/dev/null |
		sed -n 's/.*exec,cpu,convolution,\([^,]*\),forward_inference,src_[us]8.*/\1/p' | sort -u | tr '\n' ' ')
	for r in $(seq "$RUNS"); do
		for v in fp32 fold int8; do
			case $v in
			fp32) a="--checkpoint $ck" ;;
			fold) a="--checkpoint $ck --fold" ;;
			int8) a="--quantized $DIR/$m.int8" ;;
			esac
			# shellcheck disable=SC2086
			"$KILN" eval "$(ex "$m")" $o $a 2>/dev/null >"$DIR/$m.$v.$r"
			field eval_samples_per_s <"$DIR/$m.$v.$r" >>"$DIR/$m.$v.sps"
		done
	done
	f=$(median <"$DIR/$m.fp32.sps")
	for v in fp32 fold int8; do
		r=$(median <"$DIR/$m.$v.sps")
		rows="$rows$(printf '| %s | %s | %s | %s | %s |' "$m" "$v" "$r" \
			"$(echo "$r $f" | awk '{ printf "%.2fx", $1 / $2 }')" "$(field test_acc <"$DIR/$m.$v.1")")
"
	done
	isas="$isas$m: ${isa:-?}; "
done
echo "eval samples/s, median of $RUNS interleaved runs, $THREADS threads"
echo "| model | variant | samples/s | vs fp32 unfolded | test acc |"
echo "|---|---|---:|---:|---|"
printf '%s' "$rows"
echo "oneDNN int8 convolution: $isas"
echo "load average after: $(cat /proc/loadavg)"
echo "checkpoints and quantized files in $DIR"
