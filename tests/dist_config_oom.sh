#!/bin/sh
# tests/dist_config_oom.sh - rank 1 out of memory while it compares its
# config with rank 0's (core/dist_config.c rank_verdict) is "out of
# memory", exit 1, not a config error: before session 38 a failed
# kiln_strdup("") (its verdict "the same") set no message and the caller
# called it one, exit 2, "rank 1: comparing its config with rank 0's: ".
# tests/shim_fault.c on rank 1 alone fails its Nth allocation of 1 byte
# made from libkiln on its main thread (the verdict "the same" is one;
# the other threads' would make the order vary from run to run), for
# N = 1, 2, ...
# until one is not reached: no run may exit 2, and the verdict's must say
# "out of memory".
# Who is blamed (session 39; docs/distributed.md "Failures"), in every run
# of the sweep: rank 1's own allocation failed, so
#  - no rank blames rank 0 or its store: before, an answer of the store
#    that rank 1 had no memory for read as "connection lost (rank 0, which
#    hosts the store, may have died ...)", later requests as "the
#    connection failed earlier", the store's question as "the store on
#    rank 0 ... is gone"; and its connection broken, rank 1 could not tell
#    rank 0 it had failed (rank 0 called it lost);
#  - a run that fails exits 1 (rank 1's status), and kiln launch's last
#    line names rank 1 and quotes its out of memory ("; rank 1 said:
#    ...", cli/launch.h LAUNCH_FAILED_LINE), never rank 0, which may exit
#    first (before, 7 of 220 failed runs of a sweep over allocations of
#    any size named rank 0, the first reaped);
#  - rank 0's error is a stop (kiln launch stopped it) or names rank 1 as
#    failed (with its own error, or after the last collective) and quotes
#    its out of memory (kiln/failed_why);
# and at least 3 runs saw the store's answer fail and rank 0 quote rank 1.
name=dist-config-oom needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
shim_build || { bad "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"; exit 1; }
{
	ini run threads=1
	ini data source=synthetic image_size="1 1" classes=2 samples=64 workers=0
	ini_layers flat:flatten fc:linear:out=2 loss:softmax_xent
	ini train epochs=1 batch=4 max_steps=2
	ini dist timeout=20
} >"$tmp/s.ini"
n=1
said=0 store=0 quoted=0
while [ $n -le 200 ]; do
	rank1_oom $n 1 libkiln "$tmp/s.ini"
	rc=$?
	[ -e "$tmp/hit" ] || break
	[ $rc != 2 ] || { bad "allocation $n failing: exit 2 (a config error): $(grep 'error' "$tmp/l.log" | head -3)"; }
	grep -q "kiln: error: rank 1: comparing its config with rank 0's: out of memory" "$tmp/l.log" &&
		said=$((said + 1))
	e=$(grep "^kiln: error: " "$tmp/l.log")
	echo "$e" | grep -q "may have died\|the store on rank 0\|connection lost\|failed earlier\|rank 1 was lost" &&
		bad "allocation $n failing on rank 1: rank 0 or its store blamed: $(echo "$e" | cut -c1-300)"
	echo "$e" | grep -q "out of memory for its answer to" && store=$((store + 1))
	if [ $rc != 0 ]; then
		[ $rc = 1 ] || bad "allocation $n failing: kiln launch exited $rc, not rank 1's 1"
		grep "^kiln launch: error: " "$tmp/l.log" |
			grep -q "^kiln launch: error: rank 1 failed (exit status 1)\(; rank 0, which ended first, followed from it\)\?; rank 1 said: .*out of memory" ||
			bad "allocation $n failing: kiln launch does not name rank 1 and its out of memory: $(grep '^kiln launch: error' "$tmp/l.log")"
	fi
	echo "$e" | grep "^kiln: error: rank 0 of 2: " | grep -v ": a stop was requested (a signal) while " |
		grep -v "rank 1 \((host [^)]*) \)\?failed.*; rank 1 said: .*out of memory" |
		grep . && bad "allocation $n failing: rank 0 says neither a stop nor rank 1's out of memory (above)"
	echo "$e" | grep -q "^kiln: error: rank 0 of 2: .*; rank 1 said: .*out of memory" && quoted=$((quoted + 1))
	n=$((n + 1))
done
[ $n -gt 1 ] || bad "no 1-byte allocation of libkiln on rank 1: the sweep tested nothing"
[ $said -ge 1 ] || bad "no run said \"rank 1: comparing its config with rank 0's: out of memory\""
[ $store -ge 3 ] || bad "only $store runs had rank 1 out of memory for the store's answer (want 3 or more)"
[ $quoted -ge 3 ] || bad "only $quoted runs had rank 0 quote rank 1's out of memory (want 3 or more)"
[ $fail != 0 ] || echo "ok: rank 1 with each of $((n - 1)) allocations of 1 byte failing: none exit 2, $said the verdict's out of memory, $store the store's answer's, $quoted quoted by rank 0, none blaming rank 0"
exit $fail
