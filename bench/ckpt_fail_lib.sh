# bench/ckpt_fail_lib.sh - what bench/ddp_ckpt_fail.sh and
# bench/pipe_ckpt_fail.sh share; sourced (not run) after setting NEW,
# MAIN, MAIN_PLUGINS, TMP, ini (the config) and
#   TRAIN_ARGS  the overrides of every run (stages on ranks: dist.pipeline=2
#               and the stages; empty for plain DDP)
#   WHO1        rank 1's name in its messages ("rank 1", "rank 1 (pipeline
#               stage 1)")
# It gives
#   train BUILD COMM DIR OVERRIDES...   2 ranks of BUILD (main, new) under
#                                       COMM (gloo: `kiln launch --grace 60`;
#                                       mpi: mpirun, thread_level multiple)
#   fail BUILD COMM RUN                 from a checkpoint at step 2 to step 6,
#                                       the write of ckpt-4.kiln failing on
#                                       rank 0 (its temporary file a link to
#                                       /dev/full): "fail BUILD COMM SECONDS
#                                       NAMED" to $TMP/rows, NAMED 1 when rank
#                                       1's error names rank 0's cause
#   median                              the median of stdin's numbers
#   mpi                                 1 where kiln-mpi and mpirun exist
mpi=0
[ -f "$(dirname "$NEW")/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null && mpi=1

train() {
	b=$1 c=$2 d=$3
	shift 3
	if [ "$b" = main ]; then k=$MAIN; pp=$MAIN_PLUGINS; else k=$NEW; pp=${KILN_PLUGIN_PATH:-}; fi
	probe_cache "$k" # bench/common.sh: the probe cache of k's build
	if [ "$c" = gloo ]; then
		# shellcheck disable=SC2086 # TRAIN_ARGS: words
		KILN_PLUGIN_PATH=$pp timeout 300 "$k" launch -n 2 --grace 60 -- "$k" train "$ini" \
			run.out_dir="$d" $TRAIN_ARGS "$@"
	else
		port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
		# shellcheck disable=SC2086
		timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_PLUGIN_PATH="$pp" \
			-x KILN_MASTER_PORT="$port" -x KILN_STORE_TOKEN -x OMP_NUM_THREADS=1 -x KILN_LOG_LEVEL="${KILN_LOG_LEVEL:-}" \
			"$k" train "$ini" run.out_dir="$d" $TRAIN_ARGS plugin.mpi.thread_level=multiple "$@"
	fi
}

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
	grep -q "$WHO1: checkpoint $d/checkpoints/ckpt-4.kiln: rank 0 could not write it: .*No space left on device" "$d.log" && n=1
	echo "fail $1 $2 $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') $n" >> "$TMP/rows"
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
