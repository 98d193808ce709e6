#!/bin/sh
# tests/config_amp.sh - [run] precision = fp16 (and fp16_static) writes the
# loss scaler's [plugin.amp] keys at their defaults into the resolved config
# (`kiln config`, a run's config.ini, a checkpoint's config) though the file
# has no such section (before session 30 they were left out); bf16 and fp32,
# which scale no loss, do not.  A checkpoint written before that (session
# 29's kiln: tests/data/tr_cnn_fp16_s29.kiln, tr_cnn.ini at fp16 with
# data.path = tests/data, step 3 of 12, no [plugin.amp]) still resumes and
# evaluates: an absent key reads as its default.
name=config_amp
. "$(dirname "$0")/lib.sh"
need_source idx
# (from the source tree: the checkpoint's data.path is tests/data)
kiln="$abs_top_builddir/kiln"
top_builddir=$abs_top_builddir
cd "$srcdir" || fail "cannot enter $srcdir"
ini=tests/data/tr_cnn.ini
old=tests/data/tr_cnn_fp16_s29.kiln
"$kiln" plugins 2>/dev/null | grep -q "^precision  *amp .*available" ||
	{ echo "SKIP: no amp plugin"; exit 77; }

kiln 0 config "$ini" run.precision=fp16
sed -n '/^\[plugin.amp\]$/,/^$/p' "$out" > "$tmp/amp.txt"
printf '%s\n' "[plugin.amp]" "init_scale = 65536" "growth_factor = 2" "backoff_factor = 0.5" \
	"growth_interval = 2000" "min_scale = 0" "hysteresis = 1" "; loss_scale = (unset)" "" |
	cmp -s - "$tmp/amp.txt" || fail "precision = fp16: kiln config's [plugin.amp]: $(cat "$tmp/amp.txt")"
# a key the file sets keeps its value there, the others their defaults
kiln 0 config "$ini" run.precision=fp16 plugin.amp.growth_interval=100
grep -q "^growth_interval = 100$" "$out" || fail "plugin.amp.growth_interval=100 not in kiln config"
[ "$(grep -c "^\[plugin.amp\]$" "$out")" = 1 ] || fail "[plugin.amp] written twice"
for p in fp32 bf16; do
	kiln 0 config "$ini" run.precision=$p
	! grep -q "plugin.amp" "$out" || fail "precision = $p: kiln config writes [plugin.amp]"
done

"$top_builddir/tests/ckpt_tool" check "$old" || fail "$old does not verify"

# the old checkpoint resumes: steps 4..12, whose checkpoint's config has the section
run="data.path=tests/data run.precision=fp16 train.max_steps=0 train.epochs=2 train.checkpoint_every=3"
mkdir -p "$tmp/r/checkpoints"
cp "$old" "$tmp/r/checkpoints/ckpt-3.kiln"
kiln 0 train "$ini" $run "run.out_dir=$tmp/r" --resume
stdout_has '"resumed_step": 3'
stdout_has '"steps": 12'
grep -q "^\[plugin.amp\]$" "$tmp/r/config.ini" || fail "the resumed run's config.ini has no [plugin.amp]"
# ... and evaluates (its step-3 weights: the test loss it was written with),
# in f16 with no loss scaler, which nothing would read (before session 42
# eval and predict allocated one and logged "[amp] dynamic loss scale:
# 65536, ..."; tests/oom_named.sh checks no allocation of it is made)
kiln 0 eval "$ini" data.path=tests/data run.precision=fp16 --checkpoint "$old"
stdout_has '"step": 3, "test_loss": 1.599887, "test_acc": 0.208333'
stderr_has "[amp] precision = fp16: f16 compute, no loss scaling (nothing is trained)"
! grep -q "loss scale" "$err" || fail "kiln eval set up a loss scaler: $(grep "loss scale" "$err")"
# and kiln predict, unfolded (eval's graph): each sample's probability of its
# label gives eval's loss
kiln 0 predict "$ini" data.path=tests/data run.precision=fp16 --checkpoint "$old" --eval-set \
	--no-fold --top-k 5
stderr_has "[amp] precision = fp16: f16 compute, no loss scaling (nothing is trained)"
! grep -q "loss scale" "$err" || fail "kiln predict set up a loss scaler: $(grep "loss scale" "$err")"
loss=$(awk '{
	if (!match($0, /"label": *[0-9]+/)) exit 1
	l = substr($0, RSTART, RLENGTH); sub(/.*: */, "", l)
	if (!match($0, "\"index\": *" l ", [^}]*\"prob\": *[0-9.e-]+")) exit 1
	p = substr($0, RSTART, RLENGTH); sub(/.*: */, "", p)
	s -= log(p); n++
} END { if (!n) exit 1; printf "%.6f", s / n }' "$out") || fail "kiln predict's lines: no label or its probability"
awk -v a="$loss" 'BEGIN { d = a - 1.599887; exit !(d < 2e-4 && d > -2e-4) }' ||
	fail "kiln predict under fp16: the labels' loss $loss, eval's 1.599887"
echo "ok: eval and predict under fp16: no loss scaler, eval's loss (predict $loss)"
echo "PASS: config_amp"
