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
#          collective a checkpoint gained), the median over the run.
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
case "$RUNS" in '' | *[!0-9]*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;; esac
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ddpfail.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
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

mpi=0
[ -f "$(dirname "$NEW")/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null && mpi=1

# train BUILD COMM DIR OVERRIDES...: plain DDP on 2 ranks of BUILD
train() {
	b=$1 c=$2 d=$3
	shift 3
	if [ "$b" = main ]; then k=$MAIN; pp=$MAIN_PLUGINS; else k=$NEW; pp=${KILN_PLUGIN_PATH:-}; fi
	if [ "$c" = gloo ]; then
		KILN_PLUGIN_PATH=$pp timeout 300 "$k" launch -n 2 --grace 60 -- "$k" train "$ini" \
			run.out_dir="$d" "$@"
	else
		port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
		timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_PLUGIN_PATH="$pp" \
			-x KILN_MASTER_PORT="$port" -x KILN_STORE_TOKEN -x OMP_NUM_THREADS=1 -x KILN_LOG_LEVEL="${KILN_LOG_LEVEL:-}" \
			"$k" train "$ini" run.out_dir="$d" plugin.mpi.thread_level=multiple "$@"
	fi
}

# fail BUILD COMM RUN: "fail BUILD COMM SECONDS NAMED" to $TMP/rows
fail() {
	d="$TMP/fail-$1-$2-$3"
	train "$1" "$2" "$d" train.max_steps=2 train.checkpoint_every=2 > "$d.a.log" 2>&1 ||
		{ echo "fail $1 $2: the first run: exit $?" >&2; tail -5 "$d.a.log" >&2; exit 1; }
	ln -s /dev/full "$d/checkpoints/ckpt-4.kiln.tmp"
	t0=$(date +%s.%N)
	if train "$1" "$2" "$d" train.max_steps=6 train.checkpoint_every=2 train.resume=1 > "$d.log" 2>&1; then
		echo "fail $1 $2: the run did not fail" >&2
		exit 1
	fi
	t1=$(date +%s.%N)
	n=0
	grep -q "rank 1: checkpoint $d/checkpoints/ckpt-4.kiln: rank 0 could not write it: .*No space left on device" "$d.log" && n=1
	echo "fail $1 $2 $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') $n" >> "$TMP/rows"
}

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
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

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
exit 0
