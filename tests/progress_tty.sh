#!/bin/sh
# tests/progress_tty.sh - the progress bar on a terminal and the log lines
# that come while it is drawn (cli/cmd_train.c bar_log; session 36).  The
# bar is a line without its newline, redrawn after "\r\033[K"; a log line
# (here "[train] checkpoint ...", every 2 steps) was printed straight after
# it, glued onto the bar's text ("... ETA 0:00[train] checkpoint ...").
# Now the bar's line is cleared first and the message starts its own line;
# the bar is drawn again at the next step.  The terminal is util-linux's
# `script`.
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
echo "PASS: 3 checkpoint lines on their own lines under the bar"
