#!/bin/sh
# tests/data_skip_count.sh - the count of bad samples a run reports with
# [data] on_error = skip ("N bad sample(s) skipped and replaced"; docs/data.md
# "Bad data") is the samples its batches replaced:
#  1. with workers = auto, the same count as workers = 2: the probe's trial
#     batches' replacements are not added (before session 36 they were, and
#     they used up the 10 logged warnings);
#  2. a run cut at step 5 and resumed reports the uninterrupted run's count:
#     the checkpoint holds the count so far (its "data_skipped" section; before
#     session 36 the resumed run counted the skips after the resume alone).
# Fashion-MNIST's first 512 training images packed as records, 24 of them
# corrupted (a payload byte flipped: a CRC32C mismatch); an MLP, one epoch of
# 16 steps of 32.
name=data_skip_count
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
need_source records
need_fashion_mnist
cat > "$tmp/pack.ini" <<EOF2
[data]
source = idx
path = $FM
limit = 512
EOF2
"$kiln" pack "$tmp/pack.ini" --out "$tmp/rec" > "$tmp/pack.log" 2>&1 || { cat "$tmp/pack.log"; fail "kiln pack"; }
# records of 28x28 raw bytes: 24-byte header + 784 bytes, from offset 80
/usr/bin/python3 - "$tmp/rec/train-00000.krec" <<'PY' || fail "corrupting the shard"
import sys
with open(sys.argv[1], "r+b") as f:
    for i in range(3, 512, 21):
        at = 80 + i * 808 + 24 + 10
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
PY
{
	ini run seed=5 threads=1
	ini data source=records path="$tmp/rec" on_error=skip shuffle=1
	mlp10_layers 32
	ini train epochs=1 batch=32 lr=0.05 eval=0
} >"$tmp/mlp.ini"
# count NAME: the run's reported count ("" when none)
count() { sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced (on_error = skip)$/\1/p' "$tmp/$1.log"; }
train() {
	_name=$1
	shift
	timeout 300 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/$_name" "$@" > "$tmp/$_name.log" 2>&1 ||
		{ tail -5 "$tmp/$_name.log"; fail "kiln train ($_name) exit $?"; }
	checks=$((checks + 1))
}

# ---- 1. workers = auto counts what workers = 2 counts -------------------------
train two data.workers=2
train auto data.workers=auto
grep -q "workers = auto: .* chose" "$tmp/auto.log" || fail "no probe in the auto run"
n2=$(count two) na=$(count auto)
echo "bad samples skipped: workers = 2: $n2, workers = auto: $na"
[ -n "$n2" ] && [ "$n2" -ge 20 ] || fail "workers = 2 reported '$n2' skips, expected at least 20 of the 24 corrupt records"
[ "$na" = "$n2" ] || fail "workers = auto reported $na skips, workers = 2 $n2 (the probe's counted?)"
w=$(grep -c "\] sample [0-9]* skipped (" "$tmp/auto.log")
[ "$w" = 10 ] || fail "workers = auto: $w skip warnings, expected the run's first 10"

# ---- 2. a resumed run goes on from its checkpoint's count ---------------------
train cut data.workers=2 train.max_steps=5
n1=$(count cut)
[ -n "$n1" ] && [ "$n1" -gt 0 ] && [ "$n1" -lt "$n2" ] || fail "the run cut at step 5 reported '$n1' skips (of $n2)"
cp -r "$tmp/cut" "$tmp/res"
train res data.workers=2 train.resume=1
grep -q "resuming from .*ckpt-5.kiln" "$tmp/res.log" || fail "the resumed run did not resume at step 5"
nr=$(count res)
echo "bad samples skipped: cut at step 5: $n1, resumed: $nr, uninterrupted: $n2"
[ "$nr" = "$n2" ] || fail "the resumed run reported '$nr' skips, the uninterrupted run $n2"
echo "PASS ($checks kiln runs)"
exit 0
