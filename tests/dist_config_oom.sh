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
# "out of memory".  (Other failures in the sweep end the run in other
# words; those are not checked here.)
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
said=0
while [ $n -le 200 ]; do
	rm -rf "$tmp/hit" "$tmp/r.0" "$tmp/r.1"
	KILN_MASTER_PORT=$(free_port $n) timeout 120 "$kiln" launch -n 2 -- sh -c \
		"if [ \"\$KILN_RANK\" = 1 ]; then export LD_PRELOAD=\"$shim\" SHIM_ALLOC_NTH=$n SHIM_ALLOC_BYTES=1 SHIM_ALLOC_FROM=libkiln SHIM_ALLOC_MAIN=1 SHIM_ALLOC_HIT=\"$tmp/hit\"; fi; exec \"$kiln\" train \"$tmp/s.ini\" run.out_dir=\"$tmp/r.\$KILN_RANK\"" \
		>"$tmp/l.log" 2>&1
	rc=$?
	[ -e "$tmp/hit" ] || break
	[ $rc != 2 ] || { bad "allocation $n failing: exit 2 (a config error): $(grep 'error' "$tmp/l.log" | head -3)"; }
	grep -q "kiln: error: rank 1: comparing its config with rank 0's: out of memory" "$tmp/l.log" &&
		said=$((said + 1))
	n=$((n + 1))
done
[ $n -gt 1 ] || bad "no 1-byte allocation of libkiln on rank 1: the sweep tested nothing"
[ $said -ge 1 ] || bad "no run said \"rank 1: comparing its config with rank 0's: out of memory\""
[ $fail != 0 ] || echo "ok: rank 1 with each of $((n - 1)) allocations of 1 byte failing: none exit 2, $said the verdict's out of memory"
exit $fail
