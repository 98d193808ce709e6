#!/bin/sh
# tests/dist_config.sh - every rank runs rank 0's config (core/dist_config.c):
# a key that differs on one rank fails every rank at once, with exit 2 and
# the same message naming the rank, the key and both values, long before
# [dist] timeout (the broken behaviour: a collective only some ranks start,
# hanging until the timeout, or ranks that train different things without
# a word); keys that may differ between ranks (docs/distributed.md) do not
# stop the run, nor a plugin section one rank writes out at its defaults,
# nor a value one rank writes otherwise (0.05 and 5e-2).
name=dist-config needs=gloo
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/mlp.ini"
mlp_ini "$ini" 1 60
common=

# launched NAME N RANK ARGS: `kiln launch -n N` of the MLP (with $common
# on every rank's command line), rank RANK's with ARGS added; status in
# $rc, time in $ms
launched() {
	_n=$1 _np=$2 _r=$3 _a=$4
	_t0=$(date +%s%N)
	timeout 120 "$kiln" launch -n "$_np" -- sh -c \
		"if [ \"\$KILN_RANK\" = $_r ]; then x='$_a'; else x=; fi; exec \"$kiln\" train \"$ini\" run.out_dir=\"$tmp/$_n.\$KILN_RANK\" train.max_steps=4 $common \$x" \
		> "$tmp/$_n.log" 2>&1
	rc=$?
	ms=$(( ($(date +%s%N) - _t0) / 1000000 ))
	echo "$_n: exit $rc in $ms ms"
}

# differs NAME N RANK ARGS PATTERN: every rank exits 2 with the message
differs() {
	launched "$1" "$2" "$3" "$4"
	[ "$rc" = 2 ] || bad "$1: exit $rc, not 2 (a config error)"
	# dist.timeout is 60 s: a hang would take that long
	[ "$ms" -lt 30000 ] || bad "$1: took $ms ms (a hang until the timeout?)"
	_k=$(grep -c "rank $3's config differs from rank 0's: $5" "$tmp/$1.log")
	[ "$_k" -ge "$2" ] || { bad "$1: $_k of $2 ranks name rank $3 and the key"; tail -5 "$tmp/$1.log"; }
}

differs lr 2 1 "train.lr=0.02" "\[train\] lr is '0.05' on rank 0 but '0.02' on rank 1"
differs width 2 1 "layer.fc1.out=32" "\[layer.fc1\] out is '64' on rank 0 but '32' on rank 1"
# rank 2 of 3: ranks 0 and 1 name it too
differs seed3 3 2 "run.seed=7" "\[run\] seed is '1' on rank 0 but '7' on rank 2"
# a plugin section only one rank has, not at its default
differs shm 2 1 "plugin.gloo.shm=0" "\[plugin.gloo\] shm is '1' (not set: the default) on rank 0 but '0' on rank 1"
# the pipeline's shared buffers: a collective only some ranks would open
common="dist.pipeline=2 pipeline.micro_batches=2 layer.fc2.stage=1"
differs zc 2 1 "pipeline.zero_copy=0" "\[pipeline\] zero_copy is '1' on rank 0 but '0' on rank 1"
common=

# the same config but for keys that may differ between ranks: trains
launched local 2 1 "run.threads=2 data.workers=2 dist.timeout=90 plugin.cpu.async=0 plugin.gloo.busy_poll=1"
[ "$rc" = 0 ] || { bad "local: exit $rc"; tail -5 "$tmp/local.log"; }
# a plugin section written out at its defaults on one rank alone
launched dflt 2 0 "plugin.gloo.shm=1 plugin.gloo.hierarchical=1"
[ "$rc" = 0 ] || { bad "dflt: exit $rc"; tail -5 "$tmp/dflt.log"; }
# the same values written otherwise on one rank: compared by meaning
# (core/config_same.c: numbers as numbers, booleans by truth), one config
# (before session 36 the bytes: "[data] shuffle is '1' on rank 0 but
# 'true' on rank 1", exit 2)
launched fmt 2 1 "train.lr=5e-2 train.momentum=0.90 layer.fc1.out=064 data.shuffle=true"
[ "$rc" = 0 ] || { bad "fmt: exit $rc"; tail -5 "$tmp/fmt.log"; }
for n in local dflt fmt; do
	grep -q 'step 4/' "$tmp/$n.log" && [ -f "$tmp/$n.0/checkpoints/ckpt-4.kiln" ] ||
		bad "$n: no step 4 or no ckpt-4.kiln"
done
exit $fail
