#!/bin/sh
# tests/memory_limit_rlimit.sh - `[train] batch = auto` with a
# `[run] memory_limit` larger than the address space `ulimit -v` leaves, on
# the CPU (whose memory is the host's): the smaller of the two bounds the
# choice, and a warning says so.
#
# Before session 41 a memory_limit turned the address-space budget off
# (core/memory.c auto_room_read: only without one): under ulimit -v 800000
# a memory_limit of 2G chose batch 4560 for this model (2047.6 MiB
# predicted), whose 1.97 GiB of activations then failed to allocate
# (exit 1); without the memory_limit the same limit chose 760, which
# trains.
#  1. V, the address space when the search starts: the room the warning
#     gives under ulimit -v 2 GiB with memory_limit = 4G, from 2 GiB.
#  2. Under V + 300 MiB, memory_limit = 2G: the warning names both sizes;
#     the choice is the one without a memory_limit, logged against the
#     address space, and the run trains at it (its config.ini says so).
#  3. memory_limit = 64M, the smaller: no warning, the choice is logged
#     against it.
name=memory_limit_rlimit
. "$(dirname "$0")/lib.sh"

# tests/data/wide_conv.ini (tests/rlimit_lib.sh's), on synthetic samples
rl_data="data.source=synthetic data.samples=8192 data.image_size=28x28 data.image_channels=1 data.classes=10"
. "$(dirname "$0")/rlimit_lib.sh"
# the room the warning gives in $err (MiB, one decimal)
warned_room() { sed -n 's/.*is more than the \([0-9.]*\) MiB of address space RLIMIT_AS.*/\1/p' "$err" | head -1; }

# 1. V
st=0
train_under 2097152 train.batch=auto run.memory_limit=4G || st=$?
[ $st = 0 ] || fail "exit $st"
r=$(warned_room)
[ -n "$r" ] || fail "memory_limit = 4G under ulimit -v 2 GiB: no warning giving the room"
V=$(awk -v r="$r" 'BEGIN { printf "%d", 2048 - r }')
echo "the search starts at about $V MiB of address space"

# 2. a memory_limit of 2G under V + 300 MiB
lim=$(((V + 300) * 1024))
st=0
train_under $lim train.batch=auto || st=$?
[ $st = 0 ] || fail "no memory_limit: exit $st"
b0=$(auto_batch)
st=0
train_under $lim train.batch=auto run.memory_limit=2G || st=$?
[ $st = 0 ] || fail "memory_limit = 2G under ulimit -v $lim: exit $st (before session 41: the batch of 2G, whose allocation failed)"
r=$(warned_room)
[ -n "$r" ] || fail "memory_limit = 2G under ulimit -v $lim: no warning"
stderr_has "[run] memory_limit = 2G (2048.0 MiB) is more than the $r MiB of address space RLIMIT_AS (ulimit -v) leaves: [train] batch = auto fits the smaller"
awk -v r="$r" 'BEGIN { exit !(r > 290 && r < 310) }' || fail "the room said, $r MiB, is not about the 300 MiB the limit leaves"
b=$(auto_batch)
[ -n "$b" ] && [ "$b" = "$b0" ] || fail "memory_limit = 2G chose '$b', without it the same limit chose $b0"
stderr_has "batch = auto: $b, predicted to need"
grep -q "batch = auto: $b, predicted to need .* MiB of address space RLIMIT_AS (ulimit -v) leaves" "$err" ||
	fail "the choice is not logged against the address space"
[ "$(sed -n 's/^batch = //p' "$tmp/run/config.ini")" = "$b" ] || fail "the run's config.ini does not say batch = $b"
echo "ok: under ulimit -v $((lim / 1024)) MiB, memory_limit = 2G: batch $b (as without it), trained"

# 3. the smaller memory_limit
st=0
train_under $lim train.batch=auto run.memory_limit=64M || st=$?
[ $st = 0 ] || fail "memory_limit = 64M: exit $st"
! grep -q "is more than the" "$err" || fail "memory_limit = 64M: warned, though it is the smaller"
grep -q "batch = auto: [0-9]*, predicted to need [0-9.]* MiB of the 64.0 MiB \[run\] memory_limit" "$err" ||
	fail "memory_limit = 64M: the choice is not logged against it"
echo "ok: memory_limit = 64M: batch $(auto_batch) of the memory_limit"
echo "PASS: $name"
