#!/bin/sh
# bench/pipeline_wgrad.sh - [pipeline] defer_wgrad's settings against each
# other (docs/pipeline.md, "Deferred weight gradients"; docs/PERFORMANCE.md,
# session 50), interleaved: bench/pipeline.sh's mirror model (2 stages on
# cpu:0, cpu:1 of 1 thread each, 1f1b, batch 256), for M = 4, 8, 16 each
# round runs every setting once, their order rotated by round, with
# bench/c2c_latency --rounds 1 before and after each run.  The settings:
#   zero   defer_wgrad = 0            one   defer_wgrad = 1 (no copies)
#   auto   defer_wgrad = auto         base  $A with defer_wgrad = 1 (a build
#                                           before: session 49's copies)
# --busy: one `sh` busy loop beside the runs (the competitor, one CPU's
# worth; started under timeout and killed on exit).  Prints one line a run
# (cond round M setting samples/s bubble c2c_before c2c_after load1
# auto_on: 1 where auto turned on), then per M and setting the median of
# samples/s (and against zero) and of the bubble, over all runs and over
# the runs whose probes both read under C2C_FAST_NS (bench/common.sh).
# The bubble column counts the deferred passes as idle (docs/pipeline.md):
# with the split compare samples/s.  auto reads every 4 steps and turns on
# after 2 readings: use --steps well above 9.
#
# Usage: [A=/path/to/old/kiln] [KILN=./kiln] sh bench/pipeline_wgrad.sh
#            [--rounds N] [--steps S] [--busy] [--settings "zero one auto"]
# Run from the top of the build tree (bench/c2c_latency built).
set -eu
ROUNDS=5 STEPS=32 COND=quiet SETS=
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) ROUNDS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--busy) COND=busy; shift ;;
	--settings) SETS=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
[ -n "$SETS" ] || SETS="zero one auto${A:+ base}"
. "$(dirname "$0")/common.sh"
KILN=${KILN:-./kiln}
new=$(run_words "$KILN")
base=${A:+$(run_words "$A")}
tmp=$(mktemp -d)
SPIN=
cleanup() { [ -z "$SPIN" ] || kill "$SPIN" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
. "$(dirname "$0")/../tests/config_lib.sh"
{
	ini run seed=1 threads=1 out_dir="$tmp/run"
	ini_synthetic 8192 4 16 image_channels=1 workers=1
	ini_layers flat:flatten in:linear:out=1024 r0:relu b1:linear:out=1024 r1:relu \
		b2:linear:out=1024 r2:relu b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu \
		head:linear:out=16 loss:softmax_xent
	ini train epochs=1 max_steps="$STEPS" batch=256 lr=0.01 log_every=1000 eval=0 \
		checkpoint_last=0 overwrite=1
} > "$tmp/p.ini"
if [ "$COND" = busy ]; then
	timeout 7200 sh -c 'while :; do :; done' &
	SPIN=$!
	sleep 0.3
fi
echo "load average: $(cat /proc/loadavg); $COND; $ROUNDS round(s) of $STEPS steps"
: > "$tmp/runs"
for r in $(seq "$ROUNDS"); do
	for M in 4 8 16; do
		# shellcheck disable=SC2086 # SETS: words
		set -- $SETS
		k=$(((r - 1) % $#))
		while [ "$k" -gt 0 ]; do a=$1; shift; set -- "$@" "$a"; k=$((k - 1)); done
		for c in "$@"; do
			case $c in
			zero) bin=$new; arg=pipeline.defer_wgrad=0 ;;
			one) bin=$new; arg=pipeline.defer_wgrad=1 ;;
			auto) bin=$new; arg=pipeline.defer_wgrad=auto ;;
			base) bin=${base:?base needs A}; arg=pipeline.defer_wgrad=1 ;;
			*) echo "pipeline_wgrad.sh: setting $c: zero, one, auto or base" >&2; exit 2 ;;
			esac
			place_fresh
			place_before
			# shellcheck disable=SC2086 # bin: words (run_words)
			$bin train "$tmp/p.ini" pipeline.micro_batches="$M" "model.stages=flat,r2|b3,loss" \
				"run.devices=cpu:0, cpu:1" run.threads=2 "$arg" > "$tmp/o" 2> "$tmp/e" ||
				{ tail -3 "$tmp/e" >&2; exit 1; }
			place_after
			sps=$(sed -n 's/.*"train_samples_per_s": *\([0-9.]*\).*/\1/p' "$tmp/o" | tail -1)
			bub=$(sed -n 's/.*; bubble \([0-9.-]*\) (schedule \([0-9.]*\);.*/\1/p' "$tmp/e" | tail -1)
			on=$(grep -c "defer_wgrad = auto: on" "$tmp/e" || true)
			echo "$COND $r $M $c $sps $bub $C2C_BEFORE $C2C_AFTER $(cut -d' ' -f1 /proc/loadavg) $on" |
				tee -a "$tmp/runs"
		done
	done
done
awk -v sets="$SETS" -v fast="$C2C_FAST_NS" '
function med(v, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j] < v[j - 1]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
	return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
{ k = $3 " " $4; n[k]++; s[k, n[k]] = $5; b[k, n[k]] = $6; on[k] += $10
  if ($7 + 0 < fast && $8 + 0 < fast && $7 ~ /^[0-9]/ && $8 ~ /^[0-9]/) { nf[k]++; sf[k, nf[k]] = $5 } }
END {
	ns = split(sets, C, " ")
	printf "%4s %-5s %4s %8s %7s %7s %5s %8s %7s %4s\n", "M", "set", "runs", "sps", "vs_zero", "bubble", "fast", "sps_f", "vs_z_f", "on"
	for (m = 4; m <= 16; m *= 2) for (c = 1; c <= ns; c++) {
		k = m " " C[c]
		if (!n[k]) continue
		delete v; for (i = 1; i <= n[k]; i++) v[i] = s[k, i]; ms = med(v, n[k])
		delete v; for (i = 1; i <= n[k]; i++) v[i] = b[k, i]; mb = med(v, n[k])
		delete v; for (i = 1; i <= nf[k]; i++) v[i] = sf[k, i]; mf = nf[k] ? med(v, nf[k]) : 0
		if (C[c] == "zero") { z = ms; zf = mf }
		printf "%4d %-5s %4d %8.0f %+6.1f%% %7.3f %5d %8s %7s %4d\n", m, C[c], n[k], ms, z ? 100 * (ms / z - 1) : 0, mb,
			nf[k] + 0, nf[k] ? sprintf("%.0f", mf) : "-", nf[k] && zf ? sprintf("%+.1f%%", 100 * (mf / zf - 1)) : "-", on[k] }
}' "$tmp/runs"
echo "load average: $(cat /proc/loadavg)"
