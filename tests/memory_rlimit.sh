#!/bin/sh
# tests/memory_rlimit.sh - `[train] batch = auto` and batches set by hand
# under an address-space limit (ulimit -v, RLIMIT_AS).  Before session 40
# the search segfaulted in oneDNN (dnnl_primitive_create: its JIT code
# written through the NULL of a mapping the limit refused), or chose a
# batch that then failed to allocate: oneDNN's primitive cache kept every
# prediction's JIT code and the search counted resident memory, not
# address space (docs/memory.md, "Under ulimit -v").
#  1. The baseline, measured here, not assumed (the address space a process
#     starts with varies with the machine: OpenBLAS maps a buffer per CPU):
#     V0, the address space when the search starts (V0 = U - X, X the room
#     kiln logs under a generous limit U), and L64, the smallest limit (2
#     MiB steps) under which batch 64 trains; its need is L64 - V0.
#  2. batch = auto under V0 + 1.5 x that need exits 0, logs a multiple of 8
#     of at least 32 (half the batch that needs 2/3 of the room), and trains
#     at it: the run's config.ini says it, and the first step's accuracy is
#     a count of that many samples.
#  3. batch = auto, and batch 512 by hand, under V0 + 0, 4, 8, ... MiB up to
#     half that need: exit 0 or 1 with an error, never a signal (139:
#     SIGSEGV).
name=memory_rlimit
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

# tests/data/wide_conv.ini (tests/rlimit_lib.sh's): a convolution whose
# activations grow with the batch (0.46 MiB a sample), so that the batch,
# not the fixed cost, decides what fits; here on Fashion-MNIST
rl_data="data.source=idx data.path=$FM data.limit=8192 data.mean=0.286 data.std=0.353"
. "$(dirname "$0")/rlimit_lib.sh"

# 1. V0: under a limit U that leaves more than the search needs (doubled
# until the run trains), kiln logs the room the limit leaves it, X MiB
U=1048576
while ! train_under $U train.batch=auto; do
	[ $U -lt 33554432 ] || fail "batch = auto fails even under ulimit -v $U"
	U=$((U * 2))
done
X=$(sed -n 's/.*batch = auto: [0-9]*, predicted to need [0-9.]* MiB.* of the \([0-9.]*\) MiB.*/\1/p' "$err")
[ -n "$X" ] || fail "batch = auto under ulimit -v $U: no room logged"
# shellcheck disable=SC2086
"$kiln" memory "$cfg" $rl_data run.out_dir="$tmp/run" train.batch=auto >/dev/null 2>"$tmp/free.err" || { cat "$tmp/free.err"; fail "kiln memory"; }
free=$(sed -n 's/.* of the \([0-9.]*\) MiB.*/\1/p' "$tmp/free.err")
# the room must be the limit's, not less free memory's
awk -v x="$X" -v f="$free" 'BEGIN { exit !(x < f * 0.9) }' ||
	{ echo "SKIP: the machine has $free MiB free, not more than the $X MiB ulimit -v $U leaves"; exit 77; }
V0=$(awk -v u=$U -v x="$X" 'BEGIN { printf "%d", u - x * 1024 }')
# L64 (KiB): bisected between V0 (fails) and U (trains)
lo=$V0 hi=$U
while [ $((hi - lo)) -gt 2048 ]; do
	mid=$(((lo + hi) / 2))
	st=0
	train_under $mid train.batch=64 || st=$?
	[ $st -lt 124 ] || fail "batch 64 under ulimit -v $mid: exit $st (a signal or a hang)"
	if [ $st = 0 ]; then hi=$mid; else lo=$mid; fi
done
need=$((hi - V0))
echo "baseline: V0 $((V0 / 1024)) MiB when the search starts, batch 64 trains from ulimit -v $((hi / 1024)) MiB: needs $((need / 1024)) MiB"

# 2. batch = auto under 1.5 x that need trains at the batch it logs
lim=$((V0 + need * 3 / 2))
st=0
train_under $lim train.batch=auto || st=$?
[ $st = 0 ] || fail "batch = auto under ulimit -v $lim (V0 + 1.5 x the batch-64 need): exit $st"
b=$(auto_batch)
[ -n "$b" ] || fail "batch = auto under ulimit -v $lim: no choice logged"
[ $((b % 8)) = 0 ] && [ "$b" -ge 32 ] ||
	fail "batch = auto under ulimit -v $lim chose $b: not a multiple of 8 of at least 32"
cb=$(sed -n 's/^batch = //p' "$tmp/run/config.ini")
[ "$cb" = "$b" ] || fail "batch = auto logged $b, the run's config.ini says batch = $cb"
# the first step's accuracy: a count of correct samples over b
acc=$(sed -n '1s/.*"event":"train".*"acc":\([0-9.e-]*\).*/\1/p' "$tmp/run/metrics.jsonl")
[ -n "$acc" ] || fail "no first train row in $tmp/run/metrics.jsonl"
awk -v a="$acc" -v b="$b" 'BEGIN { n = a * b; d = n - int(n + 0.5); exit !(d < 1e-6 && d > -1e-6) }' ||
	fail "the first step's accuracy $acc is no count of $b samples"
echo "ok: batch = auto under ulimit -v $((lim / 1024)) MiB (room $(((lim - V0) / 1024)) MiB): $b, and trains at it"

# 3. tighter, from V0 up in 4 MiB steps to half the batch-64 need: a
# clean exit, never a signal (before session 40 these limits met SIGSEGV
# in oneDNN's JIT, and in the search's second close of a failed setup)
off=0
while [ $off -le $((need / 2)) ]; do
	lim=$((V0 + off))
	for bb in auto 512; do
		st=0
		train_under $lim train.batch=$bb || st=$?
		case $st in
		0) [ $bb != auto ] || [ "$(auto_batch)" = "$(sed -n 's/^batch = //p' "$tmp/run/config.ini")" ] ||
			   fail "batch = auto under ulimit -v $lim: the run's batch is not the one logged" ;;
		1) grep -q "error: " "$err" || fail "batch $bb under ulimit -v $lim: exit 1 without an error" ;;
		*) fail "batch $bb under ulimit -v $lim (V0 + $((off / 1024)) MiB): exit $st" ;;
		esac
		echo "ok: batch $bb under ulimit -v V0 + $((off / 1024)) MiB: exit $st $(grep -o 'error: .*' "$err" | cut -c1-100)"
	done
	off=$((off + 4096))
done
echo "PASS: $name"
