#!/bin/sh
# tests/dist_data.sh - bad training data under data-parallel training
# (`kiln launch -n 2`, Gloo on loopback; docs/data.md "Bad data"):
#  1. on_error = fail: the rank that reads a corrupt record fails naming
#     itself, as other data-parallel errors do ("rank R of 2: [data] sample
#     N: FILE: record N: CRC32C mismatch ..."; before session 29 the message
#     named no rank, and the other rank's "rank 0 is gone" was all that
#     said which one failed);
#  2. on_error = skip: rank 0 reports the bad samples of every rank, the
#     same count as one process over the same data, and rank 1 reports
#     none (before, each rank reported its own share); each rank's
#     per-sample warnings name it (before session 30 they did not).
# Fashion-MNIST's first 2048 training images packed as records, 3 of them
# corrupted (a payload byte flipped: a CRC32C mismatch); the MLP of
# tests/dist.sh, one epoch of 32 steps of a global batch of 64.
name=dist_data needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
{
	ini run seed=5 threads=1 comm=gloo out_dir=
	ini data source=records path="$tmp/rec"
	ini_layers flat:flatten fc1:linear:out=64 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=1 batch=32 lr=0.05 momentum=0.9 log_every=16 eval=0
	ini dist timeout=60
} > "$ini"
{
	ini_fmnist limit=2048 path=/usr/share/datasets/fashion-mnist
} > "$tmp/pack.ini"
"$kiln" pack "$tmp/pack.ini" --out "$tmp/rec" > "$tmp/pack.log" 2>&1 ||
	{ cat "$tmp/pack.log"; echo "FAIL: kiln pack"; exit 1; }
# records of 28x28 raw bytes: 24-byte header + 784 bytes, from offset 80 (after
# the 64-byte header and the 16-byte set block, docs/formats.md)
shard="$tmp/rec/train-00000.krec"
/usr/bin/python3 - "$shard" <<'EOF' || { echo "FAIL: corrupting the shard"; exit 1; }
import sys
with open(sys.argv[1], "r+b") as f:
    for i in (5, 100, 1000):
        at = 80 + i * 808 + 24 + 10
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
EOF

# ---- 1. on_error = fail: the failing rank names itself ----------------------
timeout 120 "$kiln" launch -n 2 -- "$kiln" train "$ini" > "$tmp/fail.log" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || bad "a corrupt record under 2 ranks: exit $rc"
line=$(grep "^kiln: error: rank [01] of 2: \[data\] sample [0-9]*: $shard: record [0-9]*: CRC32C mismatch" "$tmp/fail.log")
if [ -n "$line" ]; then
	echo "the failing rank: $line"
else
	bad "no data error naming its rank"
	grep "error" "$tmp/fail.log"
fi

# ---- 2. on_error = skip: rank 0 reports every rank's skips ------------------
run one 0 64 data.on_error=skip
run two 2 32 data.on_error=skip
n1=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced (on_error = skip)$/\1/p' "$tmp/one.log")
n2=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced over every rank (on_error = skip)$/\1/p' "$tmp/two.log")
lines=$(grep -c "bad sample(s) skipped and replaced" "$tmp/two.log")
echo "bad samples skipped: one process $n1, 2 ranks $n2 ($lines report line(s))"
[ -n "$n1" ] && [ "$n1" -ge 3 ] || bad "one process reported '$n1' skips, expected at least the 3 corrupt records"
[ "$n2" = "$n1" ] || bad "2 ranks reported '$n2' skips over every rank, one process $n1"
[ "$lines" = 1 ] || bad "2 ranks: $lines report lines, expected rank 0's alone"
# each per-sample warning names the rank that skipped it (before session 30
# none did); one process's name none
r0=$(grep -c "warning: rank 0: \[data\] sample [0-9]* skipped (" "$tmp/two.log")
r1=$(grep -c "warning: rank 1: \[data\] sample [0-9]* skipped (" "$tmp/two.log")
all=$(grep -c "\] sample [0-9]* skipped (" "$tmp/two.log")
echo "per-sample skip warnings under 2 ranks: rank 0 $r0, rank 1 $r1, of $all"
[ "$all" -ge 3 ] && [ "$((r0 + r1))" = "$all" ] || bad "2 ranks: $((r0 + r1)) of $all skip warnings name their rank"
grep -q "rank [0-9]*: \[data\] sample" "$tmp/one.log" && bad "one process's skip warnings name a rank"
[ $fail = 0 ] && echo "PASS"
exit $fail
