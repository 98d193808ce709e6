#!/bin/sh
# Per-stage checkpoints ([dist] pipeline = P, issue 21, session 12): each
# rank's peak device bytes while a checkpoint is saved and while it is
# resumed, on 2 and 4 stages on as many ranks, this build (NEW) against
# another (MAIN: before session 12, /work/main), interleaved run by run.
#
# The model: tests/pipeline_dist.sh section 11's MLP (289,840 floats:
# stage 0 fc1's 2,080, the rest on stage 1; on 4 stages fc1 | fc2 | fc3 |
# fc4), SGD with momentum, batch 32 in 4 micro-batches, 1 thread a rank:
#   save:   kiln launch -n P -- kiln train INI train.max_steps=2
#           train.checkpoint_every=2 (the checkpoint after the last step)
#   resume: the same run directory, train.max_steps=4 train.resume=1
# A rank's peak is its log line "rank R (pipeline stage R): device memory
# live after the last step L bytes (peak B)" (both builds log it; it comes
# before the end of training's gather, so it is the step's, the
# checkpoint's and the start-up's); medians of RUNS runs (the figures are
# allocations: the runs agree).
#
# Usage: bench/pipe_ckpt_mem.sh [RUNS]   (default 3)
# Environment: NEW (default ./kiln), MAIN (default /work/main/kiln),
# MAIN_PLUGINS (default /work/main/plugins/.libs).  Run from the top of
# the source tree.
set -eu
RUNS=${1:-3}
NEW=${NEW:-./kiln}
MAIN=${MAIN:-/work/main/kiln}
MAIN_PLUGINS=${MAIN_PLUGINS:-/work/main/plugins/.libs}
. "$(dirname "$0")/common.sh"
case "$RUNS" in '' | *[!0-9]*) usage ;; esac
bench_tmpdir pipeckpt
ini="$(dirname "$0")/pipe_ckpt_wide.ini"

# one BUILD P PHASE RUN: a run; its ranks' peaks appended to $TMP/peaks
# as "BUILD P PHASE RANK BYTES"
one() {
	b=$1 P=$2 ph=$3 r=$4
	dir="$TMP/$b-$P-$r"
	if [ "$P" = 2 ]; then st="model.stages=flat,r1|fc2,loss"; else st="model.stages=flat,r1|fc2,r2|fc3,r3|fc4,loss"; fi
	if [ "$ph" = save ]; then more="train.max_steps=2 train.checkpoint_every=2"; else more="train.max_steps=4 train.resume=1"; fi
	if [ "$b" = main ]; then k=$MAIN; pp=$MAIN_PLUGINS; else k=$NEW; pp=${KILN_PLUGIN_PATH:-}; fi
	probe_cache "$k" # bench/common.sh: the probe cache of k's build
	log="$dir.$ph.log"
	# shellcheck disable=SC2086
	KILN_PLUGIN_PATH=$pp timeout 300 "$k" launch -n "$P" -- "$k" train "$ini" run.out_dir="$dir" \
		dist.pipeline="$P" "$st" $more > "$log" 2>&1 || { echo "$b P=$P $ph: exit $?" >&2; tail -5 "$log" >&2; exit 1; }
	sed -n "s/.*rank \([0-9]*\) (pipeline stage [0-9]*): device memory live after the last step [0-9]* bytes (peak \([0-9]*\)).*/$b $P $ph \1 \2/p" "$log" >> "$TMP/peaks"
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

: > "$TMP/peaks"
i=1
while [ "$i" -le "$RUNS" ]; do
	for P in 2 4; do
		for b in main new; do
			rm -rf "$TMP/$b-$P-$i"
			one "$b" "$P" save "$i"
			one "$b" "$P" resume "$i"
		done
	done
	i=$((i + 1))
done
echo "load average: $(cat /proc/loadavg)"
printf '%-3s %-7s %-5s %14s %14s %8s\n' P phase rank main_bytes new_bytes new/main
for P in 2 4; do
	for ph in save resume; do
		r=0
		while [ "$r" -lt "$P" ]; do
			m=$(awk -v P="$P" -v ph="$ph" -v r="$r" '$1 == "main" && $2 == P && $3 == ph && $4 == r { print $5 }' "$TMP/peaks" | median)
			n=$(awk -v P="$P" -v ph="$ph" -v r="$r" '$1 == "new" && $2 == P && $3 == ph && $4 == r { print $5 }' "$TMP/peaks" | median)
			printf '%-3s %-7s %-5s %14s %14s %8s\n' "$P" "$ph" "$r" "$m" "$n" \
				"$(awk -v a="$n" -v b="$m" 'BEGIN { if (b > 0) printf "%.3f", a / b }')"
			r=$((r + 1))
		done
	done
done
