#!/bin/sh
# bench/comm_load.sh [ROUNDS] - kiln bench comm's kiln-gloo-noshm beside 6
# `yes > /dev/null` at nice 0 (the full test suite's load on 2 cores), this
# tree and MAIN (default /work/main, built) interleaved, ROUNDS (3) rounds:
# one line per run with its exit status, seconds, rows measured (2 when it
# worked), the load and the Gloo error when it failed (docs/PERFORMANCE.md,
# "Session 14: kiln bench comm's kiln-gloo-noshm under load").  Scratch
# under TMPDIR.  Run from the top of a built tree.
N=${1:-3}
MAIN=${MAIN:-/work/main}
T=${TMPDIR:-/tmp}
pids=
for i in 1 2 3 4 5 6; do
	timeout 3600 yes > /dev/null &
	pids="$pids $!"
done
trap 'kill $pids 2>/dev/null' EXIT INT TERM
sleep 1
for r in $(seq "$N"); do
	for v in main branch; do
		if [ $v = main ]; then k=$MAIN/kiln; pp=$MAIN/plugins/.libs; else k=./kiln; pp=; fi
		s=$(date +%s.%N)
		KILN_PLUGIN_PATH=$pp "$k" bench comm --nproc 2 --max 16384 --runs 1 --tools kiln-gloo-noshm \
			> "$T/cl_$v$r.out" 2> "$T/cl_$v$r.err"
		rc=$?
		echo "$v round $r rc=$rc t=$(echo "$(date +%s.%N) - $s" | bc | cut -c1-5) rows=$(awk '$1 == 4096 || $1 == 16384' "$T/cl_$v$r.out" | wc -l) load=$(cut -d' ' -f1 /proc/loadavg) $(grep -o 'Read timeout\|Connection closed by peer' "$T/cl_$v$r.err" | head -1)"
	done
done
