# tests/log_common.sh - what tests/log_csv.sh and tests/log_tensorboard.sh
# share; sourced after setting name.  Gives tests/dist_common.sh's helpers
# (one process: the cpu device alone) and
#   log_run DIR   the dist tests' MLP on 1024 samples with every logger on
#                 ([log] tensorboard, csv, histograms = 8): 32 steps, a log
#                 point every 4, an evaluation every 8, a checkpoint every
#                 8; then the same run stopped after step 20 and resumed
#                 from its step-16 checkpoint (DIR/resumed)
needs=cpu
. "$(dirname "$0")/dist_common.sh"
mlp_ini "$tmp/mlp.ini" 3 60
logged="train.batch=64 data.limit=1024 data.eval.limit=256 train.log_every=4 train.eval=1
	train.eval_every=8 train.checkpoint_every=8 log.tensorboard=1 log.csv=1 log.histograms=8"

log_run() {
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$1" $logged
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$1/resumed" train.max_steps=20 $logged
	rm -f "$1/resumed/checkpoints/ckpt-20.kiln"
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$1/resumed" train.resume=1 $logged
	grep -q '"event":"resume".*"step":16,' "$1/resumed/metrics.jsonl" ||
		fail "the second run did not resume from step 16: $(grep resume "$1/resumed/metrics.jsonl")"
}
