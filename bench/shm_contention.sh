#!/bin/sh
# bench/shm_contention.sh [ROUNDS] [LOAD...] - kiln bench comm's kiln-gloo
# (kiln's shared-memory allreduce) and kiln-gloo-noshm (Gloo over TCP) at
# 4 and 16 KiB, 2 ranks, this tree and MAIN (default /work/main, built)
# interleaved, ROUNDS (3) rounds, under each LOAD (default: quiet pin0
# spin2 pin0spin2): quiet = nothing added; pin0 = both ranks under
# `taskset -c 0`; spin2 = two `sh` busy loops (anywhere); pin0spin2 = the
# ranks and the two loops all on CPU 0 (docs/PERFORMANCE.md, "Session 15:
# kiln's shared-memory collectives on an oversubscribed CPU").  One line per
# run: load, tree, round, 4 KiB and 16 KiB latency (us) of each tool, the
# 1-minute load average.  WHAT=ddp: instead, a 2-rank DDP run of
# examples/fashion_mnist_mlp.ini (`kiln launch -n 2`, 1 epoch, data.limit
# LIMIT, default 20000; run directory under TMPDIR), its line rank 0's
# training samples/s.  Run from the top of a built tree.
N=${1:-3}
shift 2>/dev/null
LOADS=${*:-quiet pin0 spin2 pin0spin2}
MAIN=${MAIN:-/work/main}
T=${TMPDIR:-/tmp}
MAX=${MAX:-16384}
TOOLS=${TOOLS:-kiln-gloo,kiln-gloo-noshm}
WHAT=${WHAT:-comm}
LIMIT=${LIMIT:-20000}
TOP=$(pwd)
pids=
stop() { [ -n "$pids" ] && kill $pids 2>/dev/null; pids=; }
trap stop EXIT INT TERM
for l in $LOADS; do
	stop
	pin=
	case $l in
	pin0) pin="taskset -c 0" ;;
	spin2) for i in 1 2; do timeout 3600 sh -c 'while :; do :; done' & pids="$pids $!"; done ;;
	pin0spin2) pin="taskset -c 0"
		for i in 1 2; do taskset -c 0 timeout 3600 sh -c 'while :; do :; done' & pids="$pids $!"; done ;;
	esac
	sleep 1
	for r in $(seq "$N"); do
		for v in main branch; do
			if [ $v = main ]; then k=$MAIN/kiln; pp=$MAIN/plugins/.libs; else k=$TOP/kiln; pp=; fi
			if [ "$WHAT" = ddp ]; then
				mkdir -p "$T/sc_run" && (cd "$T/sc_run" &&
				KILN_PLUGIN_PATH=$pp $pin "$k" launch -n 2 -- "$k" train \
					"$TOP/examples/fashion_mnist_mlp.ini" train.epochs=1 train.overwrite=1 data.limit="$LIMIT" \
					> "$T/sc_$v$r.out" 2>&1)
				echo "$l $v $r samples/s=$(grep -o '"train_samples_per_s": [0-9.]*' "$T/sc_$v$r.out" | tail -1 | cut -d' ' -f2) load=$(cut -d' ' -f1 /proc/loadavg)"
				continue
			fi
			KILN_PLUGIN_PATH=$pp $pin "$k" bench comm --nproc 2 --max "$MAX" --runs 1 \
				--tools "$TOOLS" > "$T/sc_$v$r.out" 2>&1
			echo "$l $v $r $(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9.]+$/ { printf "%s:", $1; for (i = 2; i <= NF; i++) if ($i != "/") printf " %s", $i; printf " | " }' "$T/sc_$v$r.out") load=$(cut -d' ' -f1 /proc/loadavg)"
		done
	done
done
