#!/bin/sh
# bf16 training where oneDNN has no bf16 kernels (AVX2), A/B interleaved:
# A = the kiln at $A (another built tree, default ../integ), B = this tree,
# B0 = this tree with [plugin.cpu] keep_widened = 0 (every op widens its
# weights, as before session 16).  Each round runs every arm once on each
# case; medians over the rounds of train_samples_per_s (warm-up steps
# included) and of the set-up (the tuner times every bf16 op: tune_cache =
# none).  docs/PERFORMANCE.md, "Session 16: bf16 on AVX2 without widening
# every call".
#
# Usage: bench/bf16_widen.sh [ROUNDS]  (default 3), from the top of a built
# tree.  Cases: the CNN (bench/cnn_bench.ini) at batch 16 and 128, the MLP
# (bench/mlp_bench.ini) at batch 128.
set -eu
ROUNDS=${1:-3}
A=${A:-../integ}
FM=${FM:-/usr/share/datasets/fashion-mnist}
T=$(mktemp -d "${TMPDIR:-/tmp}/bf16w.XXXXXX")
trap 'rm -rf "$T"' EXIT
export XDG_CACHE_HOME="$T/cache"

# one LABEL KILN CASE EXTRA...: one run, "samples/s set-up_s" into $T/LABEL.CASE
one() {
	_l=$1 _k=$2 _c=$3
	shift 3
	case $_c in
	cnn16) _a="bench/cnn_bench.ini train.batch=16 data.limit=1280 train.max_steps=80" ;;
	cnn128) _a="bench/cnn_bench.ini train.batch=128 data.limit=3840 train.max_steps=30" ;;
	mlp128) _a="bench/mlp_bench.ini train.batch=128 data.limit=25600 train.max_steps=200" ;;
	esac
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug "$_k" train $_a data.path="$FM" train.eval=0 run.precision=bf16 \
		run.threads=2 plugin.cpu.tune_cache=none "$@" >"$T/out" 2>"$T/err"
	_s=$(sed -n 's/.*"train_samples_per_s": \([0-9.]*\).*/\1/p' "$T/out" | tail -1)
	_u=$(sed -n 's/.*set-up \([0-9.]*\) s:.*/\1/p' "$T/err" | tail -1)
	echo "$_s $_u" >>"$T/$_l.$_c"
}

med() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
	for c in cnn16 cnn128 mlp128; do
		one A "$A/kiln" $c
		one B ./kiln $c
		one B0 ./kiln $c plugin.cpu.keep_widened=0
	done
	echo "round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-4s %12s %10s   %s\n' case arm "samples/s" "set-up s" "runs (samples/s)"
for c in cnn16 cnn128 mlp128; do
	for l in A B B0; do
		printf '%-8s %-4s %12s %10s   %s\n' $c $l "$(cut -d' ' -f1 "$T/$l.$c" | med)" \
			"$(cut -d' ' -f2 "$T/$l.$c" | med)" "$(cut -d' ' -f1 "$T/$l.$c" | tr '\n' ' ')"
	done
done
