#!/bin/sh
# tests/pipe_close_held.sh - the trainer's teardown after a pipeline step
# that failed half enqueued (session 48's drain in core/train_setup.c
# free_device, tested through it in session 49).  Two stages on devices of
# their own (`[run] devices`: each stage stream a worker of its own); the
# last stage's loss layer, tests/plugins/kiln-tlossfail.so, queues a host
# function that holds its stage's stream 1 s and then logs "the held
# stage ran its queue", and fails the backward on the host (the run's
# first): kiln_pipe_step returns with that work still queued, which the
# trainer's own streams never waited for.  trainer_close -> free_device
# must drain the stage before it frees the batch's buffers, graphs and
# loaders: the held stage's line comes after the error's (the premise: it
# was held) and before the train loader's stats line, which free_device
# logs after its drain and before the loaders close.  With the drain
# removed from free_device the stats line came first (the stage then ran
# on during the frees, until kiln_pipe_free's own drain).
name=pipecloseheld
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
plugdir="$abs_top_builddir/tests/plugins/.libs"
[ -f "$plugdir/kiln-tlossfail.so" ] ||
	{ echo "FAIL: test plugins not built in $plugdir (make check builds them)"; exit 99; }
{
	ini run seed=5 threads=2
	ini_synthetic 256 8 16 workers=1
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=24 r2:relu \
		fc3:linear:out=16 loss:tlossfail
	ini_sgd_steps 6 log_every=3 eval=0
} >"$tmp/run.ini"
KILN_LOG_LEVEL=debug kiln 1 train "$tmp/run.ini" "run.plugin_path=$plugdir" \
	"run.out_dir=$tmp/o" layer.fc3.stage=1 pipeline.micro_batches=4 "run.devices=cpu:0,cpu:1"
told=$(grep -n "error: .*tlossfail: the step's backward fails (test)" "$err" | cut -d: -f1)
[ -n "$told" ] || { tail -5 "$err"; fail "the run did not fail at the loss layer's backward"; }
held=$(grep -n "the held stage ran its queue" "$err" | cut -d: -f1)
stats=$(grep -n "loader (train): " "$err" | cut -d: -f1)
[ -n "$held" ] || { tail -5 "$err"; fail "the held stage never ran its queue"; }
[ -n "$stats" ] || { tail -5 "$err"; fail "no train loader stats line"; }
echo "log lines: the error $told, held stage's end $held, train loader's stats $stats"
# the premise: the stage was still held when the run told its error (a
# stream that ran the host function at once would pass whatever the drain)
[ "$held" -gt "$told" ] || fail "the stage's host function ran before the error was told (line $held, $told): not held"
[ "$held" -lt "$stats" ] ||
	fail "free_device went on (the loader stats, line $stats) before the held stage ended (line $held)"
echo "PASS: $checks runs"
