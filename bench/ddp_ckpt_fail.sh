#!/bin/sh
# DDP checkpoint write failures, session 13 (docs/checkpoints.md "A failed
# write"): this build (NEW) against another (MAIN, /work/main), interleaved
# run by run, on tests/ddp_ckpt_fail.sh's MLP (2,608 floats), plain DDP on
# 2 ranks (rank 0 writes the gathered state):
#   fail:  from a checkpoint at step 2 to step 6, the write of ckpt-4.kiln
#          failing on rank 0 (its temporary file a link to /dev/full: a
#          full disk), [dist] timeout and heartbeat 60: the seconds until
#          the job has ended (`kiln launch --grace 60`; under mpirun with
#          [plugin.mpi] thread_level = multiple where kiln-mpi and mpirun
#          exist) and whether rank 1's error names rank 0's cause;
#   agree: NEW only: 20 steps, a checkpoint after each, KILN_LOG_LEVEL =
#          debug: the microseconds each rank spends agreeing on a written
#          checkpoint's outcome (the log's "outcome agreed in X us": the
#          collective a checkpoint gained in session 13; and, session 14,
#          "preparation agreed in X us", the one before the gather), the
#          median over the run.
# Medians of RUNS runs.
#
# Usage: bench/ddp_ckpt_fail.sh [RUNS]   (default 3)
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
bench_tmpdir ddpfail
: "${KILN_STORE_TOKEN:=kiln-bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"
export KILN_STORE_TOKEN
ini="$TMP/mlp.ini"
cat > "$ini" <<'INI'
[run]
seed = 5
threads = 1
[data]
source = synthetic
samples = 1024
image_size = 8
classes = 16
workers = 0
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 32
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 16
[layer.loss]
type = softmax_xent
[train]
epochs = 1
optimizer = sgd
momentum = 0.9
lr = 0.05
batch = 16
log_every = 2
eval = 0
checkpoint_last = 0
[dist]
timeout = 60
heartbeat = 60
INI

TRAIN_ARGS="" WHO1="rank 1"
. "$(dirname "$0")/ckpt_fail_lib.sh"

# agree COMM RUN: "agree COMM US" to $TMP/rows (the median of the run's
# checkpoints, both ranks)
agree() {
	d="$TMP/agree-$1-$2"
	KILN_LOG_LEVEL=debug train new "$1" "$d" train.max_steps=20 train.checkpoint_every=1 \
		train.keep_last=2 > "$d.log" 2>&1 ||
		{ echo "agree $1: exit $?" >&2; tail -5 "$d.log" >&2; exit 1; }
	us=$(sed -n 's/.*outcome agreed in \([0-9.]*\) us (0 rank(s) failed).*/\1/p' "$d.log" | median)
	[ -n "$us" ] || { echo "agree $1: no 'outcome agreed' line" >&2; exit 1; }
	echo "agree $1 $us" >> "$TMP/rows"
	# (session 14: the preparation's agreement before the gather)
	us=$(sed -n 's/.*checkpoint: preparation agreed in \([0-9.]*\) us (0 rank(s) failed).*/\1/p' "$d.log" | median)
	[ -z "$us" ] || echo "ready $1 $us" >> "$TMP/rows"
}

: > "$TMP/rows"
echo "load average before: $(cat /proc/loadavg)"
i=1
while [ "$i" -le "$RUNS" ]; do
	for b in main new; do
		fail "$b" gloo "$i"
		[ "$mpi" = 0 ] || fail "$b" mpi "$i"
	done
	agree gloo "$i"
	[ "$mpi" = 0 ] || agree mpi "$i"
	i=$((i + 1))
done
echo "load average after: $(cat /proc/loadavg)"
for b in main new; do
	for c in gloo mpi; do
		s=$(awk -v b="$b" -v c="$c" '$1 == "fail" && $2 == b && $3 == c { print $4 }' "$TMP/rows" | median)
		[ -n "$s" ] || continue
		echo "$b: rank 0's write failing ($c): the job ended after $s s (median), rank 1 named the cause in $(awk -v b="$b" -v c="$c" '$1 == "fail" && $2 == b && $3 == c { n += $5 } END { print n + 0 }' "$TMP/rows") of $RUNS runs"
	done
done
for c in gloo mpi; do
	s=$(awk -v c="$c" '$1 == "agree" && $2 == c { print $3 }' "$TMP/rows" | median)
	[ -n "$s" ] && echo "new ($c): a written checkpoint's outcome agreed in $s us (median of the runs' medians)"
done
for c in gloo mpi; do
	s=$(awk -v c="$c" '$1 == "ready" && $2 == c { print $3 }' "$TMP/rows" | median)
	[ -n "$s" ] && echo "new ($c): its preparation agreed in $s us (median of the runs' medians; session 14)"
done
exit 0
