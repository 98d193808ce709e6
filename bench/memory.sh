#!/bin/sh
# Memory benchmark: gradient checkpointing's cost, and `kiln memory`'s
# predictions against what the operating system measured.
#
# 1. Recompute.  The deep ResNet example (examples/fashion_mnist_resnet_deep.ini,
#    33 convolutions) with [train] recompute = none and = auto: the activation
#    arena from `kiln memory`, and training samples/s from
#      $KILN train CONFIG train.recompute=R train.max_steps=S train.epochs=1
#          train.eval=0 data.limit=S*128 run.out_dir=
#    run N times each, interleaved (none, auto, none, auto, ...) so the
#    machine's noise falls on both; medians.  Step-time cost = the ratio of
#    the medians minus 1.
# 2. Accounting.  For the CNN, ResNet and deep ResNet examples at batches 128
#    and 512: the prediction (`kiln memory`: device total + host staging +
#    device library) against the run's resident peak growth (kiln train's
#    rss_growth_bytes: VmHWM minus the resident size before the model was
#    built) and the device counter (device_peak_bytes), from
#      $KILN train CONFIG train.batch=B train.max_steps=3 train.epochs=1
#          data.eval.limit=1000 run.out_dir=
#
# Usage: bench/memory.sh [--runs N] [--steps S] [--no-accounting] [--no-recompute]
# Environment: KILN (default ./kiln).  Run from the top of the source tree.
set -eu

RUNS=5
STEPS=30
DO_ACC=1
DO_REC=1
KILN=${KILN:-./kiln}
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--no-accounting) DO_ACC=0; shift ;;
	--no-recompute) DO_REC=0; shift ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done

. "$(dirname "$0")/common.sh"
real_kiln # time the binary itself, not libtool's wrapper
calc() { awk "BEGIN { print $1 }"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-mem.XXXXXX")
trap 'rm -rf "$tmp"; bench_cache_rm' EXIT

if [ $DO_REC = 1 ]; then
	deep=examples/fashion_mnist_resnet_deep.ini
	echo "== recompute: $deep, batch 128, $STEPS steps, $RUNS runs each, interleaved"
	for r in none auto; do
		"$KILN" memory "$deep" "train.recompute=$r" 2>/dev/null | tail -1 >"$tmp/mem.$r"
	done
	i=0
	while [ $i -lt "$RUNS" ]; do
		for r in none auto; do
			"$KILN" train "$deep" "train.recompute=$r" "train.max_steps=$STEPS" train.epochs=1 \
				train.eval=0 "data.limit=$((STEPS * 128))" run.out_dir= 2>/dev/null |
				tail -1 | field train_samples_per_s >>"$tmp/sps.$r"
		done
		i=$((i + 1))
	done
	an=$(field activations <"$tmp/mem.none")
	aa=$(field activations <"$tmp/mem.auto")
	sn=$(median <"$tmp/sps.none")
	sa=$(median <"$tmp/sps.auto")
	printf "%-10s %14s %12s   %s\n" recompute "activations" "samples/s" "runs"
	printf "%-10s %10.2f MiB %12.1f   %s\n" none "$(calc "$an / 1048576")" "$sn" "$(tr '\n' ' ' <"$tmp/sps.none")"
	printf "%-10s %10.2f MiB %12.1f   %s\n" auto "$(calc "$aa / 1048576")" "$sa" "$(tr '\n' ' ' <"$tmp/sps.auto")"
	printf "activation memory cut %.2fx; step time +%.1f%% (ratio of medians)\n" \
		"$(calc "$an / $aa")" "$(calc "($sn / $sa - 1) * 100")"
fi

if [ $DO_ACC = 1 ]; then
	echo "== kiln memory vs the operating system (resident peak growth) and the device counter"
	printf "%-36s %6s %14s %14s %8s %14s\n" config batch predicted "resident peak" diff "device counter"
	for c in cnn resnet resnet_deep; do
		for b in 128 512; do
			cfg=examples/fashion_mnist_$c.ini
			"$KILN" memory "$cfg" "train.batch=$b" data.eval.limit=1000 2>/dev/null | tail -1 >"$tmp/m"
			"$KILN" train "$cfg" "train.batch=$b" train.max_steps=3 train.epochs=1 data.eval.limit=1000 \
				run.out_dir= 2>/dev/null | tail -1 >"$tmp/t"
			p=$(($(field total <"$tmp/m") + $(field host <"$tmp/m") + $(field library <"$tmp/m")))
			r=$(field rss_growth_bytes <"$tmp/t")
			d=$(field device_peak_bytes <"$tmp/t")
			printf "%-36s %6d %14d %14d %+7.2f%% %14d\n" "$cfg" "$b" "$p" "$r" \
				"$(calc "($r - $p) * 100 / $p")" "$d"
		done
	done
fi
