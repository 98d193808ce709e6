#!/bin/sh
# tests/progress_tty.sh - the progress bar on a terminal and the log lines
# that come while it is drawn (cli/cmd_train.c bar_log; session 36).  The
# bar is a line without its newline, redrawn after "\r\033[K"; a log line
# (here "[train] checkpoint ...", every 2 steps) was printed straight after
# it, glued onto the bar's text ("... ETA 0:00[train] checkpoint ...").
# Now the bar's line is cleared first and the message starts its own line;
# the bar is drawn again at the next step.  The terminal is util-linux's
# `script`.  Then the ETA: counted to max_steps, clamped at ">9999h"
# (session 37).
name=progress_tty
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
command -v script >/dev/null || { echo "SKIP: no script(1) to give kiln a terminal"; exit 77; }
need_source idx
data="$srcdir/tests/data"
{
	ini run threads=1 out_dir="$tmp/run"
	ini_tr_cnn_mlp "$data"
	ini train batch=8 epochs=1 checkpoint_every=2
} >"$tmp/mlp.ini"
script -qec "\"$kiln\" train \"$tmp/mlp.ini\"" /dev/null >"$tmp/tty.out" 2>&1 </dev/null ||
	fail "kiln train under script(1) failed: $(tail -5 "$tmp/tty.out")"
# CR -> R, ESC -> E: the escapes as text
tr '\r\033' 'RE' <"$tmp/tty.out" >"$tmp/tty.txt"
grep -q 'RE\[Kepoch 1 \[' "$tmp/tty.txt" || fail "no progress bar drawn: $(head -c 2000 "$tmp/tty.txt")"
all=$(grep -o '.\[train\] checkpoint [^ ]*ckpt-[246]\.kiln (epoch' "$tmp/tty.txt" | wc -l)
cleared=$(grep -o 'RE\[K\[train\] checkpoint [^ ]*ckpt-[246]\.kiln (epoch' "$tmp/tty.txt" | wc -l)
[ "$all" = 3 ] || fail "expected 3 checkpoint lines (steps 2, 4, 6), got $all: $(head -c 3000 "$tmp/tty.txt")"
[ "$cleared" = 3 ] ||
	fail "$((all - cleared)) of 3 checkpoint lines glued onto the bar: $(grep -o '.\{40\}\[train\] checkpoint' "$tmp/tty.txt" | head -3)"
echo "ok: 3 checkpoint lines on their own lines under the bar"

# The ETA is the run's: to its last step, [train] max_steps when that comes
# before epochs x steps per epoch, and past 9999 hours ">9999h".  Before
# session 37 it counted every epoch (epochs = 1e9 and max_steps = 2500 of
# 1000-step epochs: "ETA 877192:59" for a run of a second) in an int of
# minutes (past 2^31 s: "ETA 50050050:-8"); the bar of the epoch that
# max_steps ends now runs to that step (500/500, not 500/1000).
{
	ini run threads=1 out_dir="$tmp/eta"
	ini data source=synthetic image_size="1 1" classes=2 samples=4000 workers=0
	linear_layers 2
	ini train epochs=1000000000 batch=4 max_steps=2500 log_every=1000 checkpoint_last=0
} >"$tmp/eta.ini"
TERM=xterm script -qec "\"$kiln\" train \"$tmp/eta.ini\"" /dev/null >"$tmp/eta.out" 2>&1 </dev/null ||
	fail "kiln train under script(1) failed: $(tail -5 "$tmp/eta.out")"
tr '\r\033' 'RE' <"$tmp/eta.out" | grep -o 'RE\[Kepoch [^R]*' >"$tmp/eta.bars"
grep -q 'ETA 0:[0-5][0-9]$' "$tmp/eta.bars" || fail "no ETA drawn: $(tail -3 "$tmp/eta.bars")"
grep -v 'ETA 0:[0-5][0-9]$' "$tmp/eta.bars" | grep 'ETA' >"$tmp/eta.long" &&
	fail "an ETA past a minute for a 2500-step run: $(head -3 "$tmp/eta.long")"
grep -q '^RE\[Kepoch 3 \[#\{30\}\] 100% 500/500 ' "$tmp/eta.bars" ||
	fail "epoch 3's bar does not end at max_steps' 500/500: $(grep 'epoch 3' "$tmp/eta.bars" | tail -2)"
grep -q 'epoch 3 .*/1000 ' "$tmp/eta.bars" && fail "epoch 3 drawn of 1000 steps: $(grep 'epoch 3 .*/1000 ' "$tmp/eta.bars" | head -1)"
echo "ok: the ETA counts to max_steps (2500 steps: under a minute), epoch 3 ends at 500/500"

# A resume that changes the global batch changes the steps per epoch but
# keeps the checkpoint's step count: the bar counts to the run's last step
# as the library gives it (kiln_train_progress_steps).  Before session 38
# it took (epoch - 1) x steps per epoch for the steps done: 400 samples,
# batch 4 to step 120 (epoch 2, 20 steps in) and resumed with batch 8 to
# max_steps 130 ended at "20/50"; batch 8 to step 30 resumed with batch 4
# to max_steps 90 drew epoch 1 to "90/90" (then "91/100") and epoch 2 of
# 100 steps where it ends at 20.
sed -e 's/^samples = 4000/samples = 400/' -e "s#^out_dir = .*#out_dir = $tmp/rb#" \
	-e 's/^epochs = .*/epochs = 2/' -e 's/^max_steps = .*/max_steps = 120/' \
	-e 's/^checkpoint_last = 0/checkpoint_last = 1/' "$tmp/eta.ini" >"$tmp/rb.ini"
resumed_bars() { # FROM_BATCH FROM_MAX TO_BATCH TO_MAX: the resumed run's bars
	rm -rf "$tmp/rb"
	"$kiln" train "$tmp/rb.ini" train.batch="$1" train.max_steps="$2" >"$tmp/rb.out" 2>&1 ||
		fail "kiln train (batch $1 to $2) failed: $(tail -5 "$tmp/rb.out")"
	TERM=xterm script -qec "\"$kiln\" train \"$tmp/rb.ini\" --resume train.batch=$3 train.max_steps=$4" \
		/dev/null >"$tmp/rb.out" 2>&1 </dev/null ||
		fail "kiln train --resume (batch $3 to $4) failed: $(tail -5 "$tmp/rb.out")"
	tr '\r\033' 'RE' <"$tmp/rb.out" | grep -o 'RE\[Kepoch [0-9]* \[[^R]*' >"$tmp/rb.bars"
}
resumed_bars 4 120 8 130
tail -1 "$tmp/rb.bars" | grep -q '^RE\[Kepoch 2 \[#\{30\}\] 100% 20/20 ' ||
	fail "batch 4 -> 8: the last bar is not epoch 2's 20/20: $(tail -1 "$tmp/rb.bars")"
resumed_bars 8 30 4 90
grep -q '^RE\[Kepoch 1 \[#\{30\}\] 100% 100/100 ' "$tmp/rb.bars" ||
	fail "batch 8 -> 4: epoch 1's bar does not end at 100/100: $(grep 'epoch 1' "$tmp/rb.bars" | tail -1)"
grep -q '/90 ' "$tmp/rb.bars" && fail "batch 8 -> 4: epoch 1 drawn to 90: $(grep '/90 ' "$tmp/rb.bars" | head -1)"
tail -1 "$tmp/rb.bars" | grep -q '^RE\[Kepoch 2 \[#\{30\}\] 100% 20/20 ' ||
	fail "batch 8 -> 4: the last bar is not epoch 2's 20/20: $(tail -1 "$tmp/rb.bars")"
echo "ok: resumed with batch 4 -> 8 and 8 -> 4, the bars end at the run's last step"

# 1e9 epochs of 100000 steps, stopped (SIGINT) after 5 s: over 1e14 steps
# left, far past 2^31 s at any speed
sed -e 's/^samples = 4000/samples = 100000/' -e 's/^out_dir = .*/out_dir = /' -e 's/^batch = 4/batch = 1/' -e '/^max_steps/d' \
	"$tmp/eta.ini" >"$tmp/long.ini"
TERM=xterm script -qec "timeout -s INT 5 \"$kiln\" train \"$tmp/long.ini\"" /dev/null \
	>"$tmp/long.out" 2>&1 </dev/null
tr '\r\033' 'RE' <"$tmp/long.out" | grep -o 'RE\[Kepoch [^R]*' >"$tmp/long.bars"
if ! grep -q 'samples/s ETA' "$tmp/long.bars"; then
	# (a machine so busy that setup outlasted the 5 s: nothing to check)
	echo "SKIP (part): no bar with an ETA drawn in 5 s: $(tail -c 300 "$tmp/long.out")"
	exit 0
fi
grep -q 'stopped on request' "$tmp/long.out" || fail "the long run did not stop on SIGINT: $(tail -c 600 "$tmp/long.out")"
grep -q 'samples/s ETA >9999h$' "$tmp/long.bars" || fail "no ETA >9999h: $(tail -2 "$tmp/long.bars")"
grep 'ETA' "$tmp/long.bars" | grep -v 'ETA >9999h$' >"$tmp/long.other" &&
	fail "an ETA other than >9999h for 1e14 steps: $(head -2 "$tmp/long.other")"
echo "PASS: the ETA counts to max_steps and is clamped at >9999h"
