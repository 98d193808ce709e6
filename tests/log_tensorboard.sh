#!/bin/sh
# [log] tensorboard = 1: TensorBoard's own reader (the tensorboard package's
# EventAccumulator) finds every scalar of metrics.jsonl at every step, and
# the histograms every 8 steps (tests/log_check.py tensorboard); a resumed
# run's second file makes TensorBoard drop the steps redone.  Needs the
# tensorboard Python package in $KILN_VENV (default: .venv in the build
# tree; scripts/install-deps --bench makes it): skipped without it.
name=log_tensorboard
. "$(dirname "$0")/log_common.sh"
venv=${KILN_VENV:-$abs_top_builddir/.venv}
py="$venv/bin/python"
if ! [ -x "$py" ] || ! "$py" -c 'import tensorboard' 2> /dev/null; then
	echo "SKIP: no tensorboard package in $venv (scripts/install-deps --bench installs it; or set KILN_VENV)"
	exit 77
fi
log_run "$tmp/run"
n=$(ls "$tmp/run/resumed" | grep -c '^events\.out\.tfevents\.')
[ "$n" = 2 ] || fail "the resumed run has $n event files, expected 2"
"$py" "$srcdir/tests/log_check.py" tensorboard "$tmp/run" 8 || fail "TensorBoard reads other values"
"$py" "$srcdir/tests/log_check.py" tensorboard "$tmp/run/resumed" 8 ||
	fail "TensorBoard reads other values after the resume"
echo "PASS: $checks runs"
