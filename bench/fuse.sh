#!/bin/sh
# bench/fuse.sh - what [run] fuse buys: kiln's training samples/s with the
# activation fusion off and on, for the MLP (bench/mlp_bench.ini, one epoch)
# and the CNN (bench/cnn_bench.ini, --steps steps, both layouts; and the same
# CNN with a batchnorm before each ReLU), run N times interleaved (off, on,
# off, on, ...); medians, the ratio, the whole-step GFLOP/s (training FLOPs
# taken as 3 x the forward's from `kiln summary`: an upper bound, the first
# layer's input gradient is not computed) against bench/gemm_peak, and the
# load average before and after.
#
# Usage: sh bench/fuse.sh [--runs N] [--threads T] [--steps S] [--models "mlp cnn cnn_nhwc cnn_bn"]
#   --steps S  CNN training steps (default 220, as bench/cnn.sh's kiln runs)
# From the top of the build tree.  Environment: KILN (default ./kiln).
set -eu
RUNS=5 THREADS=2 STEPS=220 MODELS="mlp cnn cnn_nhwc cnn_bn"
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--models) MODELS=$2; shift 2 ;;
	*) echo "usage: $0 [--runs N] [--threads T] [--models LIST]" >&2; exit 2 ;;
	esac
done
KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
HERE=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; bench_cache_rm' EXIT
# the CNN with a batchnorm before each ReLU (conv -> bn -> relu fuses to
# conv, bn+relu)
sed -e 's/^\[layer.relu1\]/[layer.bn1]\ntype = batchnorm\n[layer.relu1]/' \
	-e 's/^\[layer.relu2\]/[layer.bn2]\ntype = batchnorm\n[layer.relu2]/' \
	"$HERE/cnn_bench.ini" >"$tmp/cnn_bn.ini"

args() { # MODEL: config and overrides
	case $1 in
	mlp) echo "$HERE/mlp_bench.ini train.epochs=1" ;;
	cnn) echo "$HERE/cnn_bench.ini model.layout=nchw data.limit=$((STEPS * 128)) train.max_steps=$STEPS train.eval=0" ;;
	cnn_nhwc) echo "$HERE/cnn_bench.ini model.layout=nhwc data.limit=$((STEPS * 128)) train.max_steps=$STEPS train.eval=0" ;;
	cnn_bn) echo "$tmp/cnn_bn.ini model.layout=nhwc data.limit=$((STEPS * 128)) train.max_steps=$STEPS train.eval=0" ;;
	esac
}
# train_flops MODEL: FLOPs of one training sample
train_flops() {
	# shellcheck disable=SC2046
	"$KILN" summary $(args "$1") 2>/dev/null | awk '
		/^Forward FLOPs/ { gsub(/,/, "", $0); match($0, /: [0-9]+/); print substr($0, RSTART + 2, RLENGTH - 2) }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load average before: $(cat /proc/loadavg)"
peak=$("$HERE/gemm_peak" --threads "$THREADS" 2>/dev/null | sed -n 's/.*"gflops": \([0-9.]*\).*/\1/p')
echo "GEMM peak (bench/gemm_peak --threads $THREADS): ${peak:-?} GFLOP/s"
for m in $MODELS; do
	for r in $(seq "$RUNS"); do
		for f in 0 1; do
			# shellcheck disable=SC2046
			"$KILN" train $(args "$m") run.threads="$THREADS" run.fuse=$f run.out_dir= \
				2>/dev/null | sed -n 's/.*"train_samples_per_s": \([0-9.e+]*\).*/\1/p' |
				tail -1 >>"$tmp/$m.$f"
		done
	done
done
echo "load average after:  $(cat /proc/loadavg)"
printf '%-10s %14s %14s %7s %16s %16s\n' model "fuse=0 smp/s" "fuse=1 smp/s" ratio "GFLOP/s (0 / 1)" "% of peak (0/1)"
for m in $MODELS; do
	a=$(median <"$tmp/$m.0") b=$(median <"$tmp/$m.1")
	fw=$(train_flops "$m")
	awk -v m="$m" -v a="$a" -v b="$b" -v fw="$fw" -v pk="${peak:-0}" 'BEGIN {
		t = 3 * fw; ga = a * t / 1e9; gb = b * t / 1e9
		printf "%-10s %14.0f %14.0f %6.3fx %7.2f / %6.2f %7.1f / %6.1f\n", m, a, b, b / a, ga, gb,
			(pk > 0 ? 100 * ga / pk : 0), (pk > 0 ? 100 * gb / pk : 0) }'
done
echo "runs: $RUNS each, interleaved; medians. Training FLOPs per sample: 3 x the forward's (kiln summary)."
