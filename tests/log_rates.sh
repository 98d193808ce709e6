#!/bin/sh
# tests/log_rates.sh - the rates a run reports are its steps' (session 40):
# a checkpoint's write and an evaluation are left out of the train lines'
# samples_per_s, of the epoch line's samples/s and of the final line's
# train_samples_per_s, as Lightning's ThroughputMonitor and llm.c time the
# training steps alone; wall_s, fit_s and the epoch line's seconds keep the
# whole time, and each "checkpoint" event says what its write took
# ("checkpoint_s").
#
# A tiny MLP, 6 steps of 8 samples, a log line, an evaluation, a keep_best
# write and a checkpoint every 2 steps, each checkpoint write made 0.6 s
# slower (KILN_TEST_CKPT_DELAY_MS, a slow disk): the train lines of steps 4
# and 6, each after 2 such writes, must time their 16 samples at under
# 0.3 s (a tenth of a second of the steps is plenty for 2 steps of this
# model on a busy machine; before session 40 each timed 1.2 s and more),
# the epoch's 48 samples at under half the writes' time, while wall_s and
# the epoch line's seconds hold every write.
name=log_rates
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source idx
data="$srcdir/tests/data"
{
	ini run threads=1
	ini_tr_cnn_mlp "$data" 16
	ini train batch=8 epochs=1 log_every=2 checkpoint_every=2 eval_every=2 keep_best=2 \
		keep_last=10
} >"$tmp/mlp.ini"
KILN_TEST_CKPT_DELAY_MS=600
export KILN_TEST_CKPT_DELAY_MS
kiln 0 train "$tmp/mlp.ini" "run.out_dir=$tmp/r"
unset KILN_TEST_CKPT_DELAY_MS
# the epoch line: "(S s, R samples/s)"
epoch=$(sed -n 's/^.*epoch 1\/1: train loss .* (\([0-9.]*\) s, \([0-9]*\) samples\/s).*$/\1 \2/p' "$err")
[ -n "$epoch" ] || fail "no epoch line with its seconds and samples/s: $(grep 'epoch 1/1' "$err")"
python3 - "$tmp/r/metrics.jsonl" $epoch <<'EOF' || fail "the rates count the checkpoint writes (above)"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ep_s, ep_rate = float(sys.argv[2]), float(sys.argv[3])
delay = 0.6
ck = [j for j in lines if j["event"] == "checkpoint"]
best = [j for j in lines if j["event"] == "best"]
writes = len(ck) + len(best)
print("checkpoint events", [(j["step"], j.get("checkpoint_s")) for j in ck], "best", [j["step"] for j in best])
assert [j["step"] for j in ck] == [2, 4, 6], ck
assert [j["step"] for j in best][:2] == [2, 4], best
rows = {j["step"]: j for j in lines if j["event"] == "train"}
assert sorted(rows) == [2, 4, 6], rows
for s in (4, 6):  # each after step s - 2's keep_best and periodic writes
    r = rows[s]
    secs = 16 / r["samples_per_s"]
    print("step %d: samples_per_s %.1f, 16 samples in %.4f s" % (s, r["samples_per_s"], secs))
    assert secs < delay / 2, "step %d's line times its steps at %.3f s: the writes counted" % (s, secs)
f = [j for j in lines if j["event"] == "final"][0]
secs = 48 / f["train_samples_per_s"]
print("final: train_samples_per_s %.1f (48 samples in %.4f s), samples_per_s %.1f, wall_s %.3f, fit_s %.3f; %d writes"
      % (f["train_samples_per_s"], secs, f["samples_per_s"], f["wall_s"], f["fit_s"], writes))
assert secs < writes * delay / 2, "the epoch's steps timed at %.3f s: the writes counted" % secs
assert f["samples_per_s"] == f["train_samples_per_s"]
# the whole time is still there
assert f["wall_s"] >= writes * delay and f["fit_s"] >= writes * delay, f
print("epoch line: %.1f s, %.0f samples/s (48 in %.4f s)" % (ep_s, ep_rate, 48 / ep_rate))
assert ep_s >= (writes - 0.5) * delay, "the epoch line's %.1f s lacks the writes" % ep_s
assert 48 / ep_rate < writes * delay / 2, "the epoch line's rate counts the writes"
# each checkpoint event says what its write took
assert all(j.get("checkpoint_s", 0) >= delay for j in ck), ck
EOF
echo "ok: the train lines, the epoch and the final rates leave the checkpoint writes out"
echo "PASS: 1 run"
