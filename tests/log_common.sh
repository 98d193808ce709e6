# tests/log_common.sh - what tests/log_csv.sh and tests/log_tensorboard.sh
# share; sourced after setting name.  Gives tests/lib.sh's helpers and
#   log_run DIR [overrides...]   a small MLP trained on Fashion-MNIST with
#                                every logger on ([log] tensorboard, csv,
#                                histograms = 8): 32 steps, a log point
#                                every 4, an evaluation every 8, a
#                                checkpoint every 8; then the same run
#                                stopped after step 20 and resumed from
#                                its step-16 checkpoint (DIR/resumed)
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
cat > "$tmp/mlp.ini" <<'INI'
[run]
seed = 3
threads = 1
[data]
source = idx
path = /usr/share/datasets/fashion-mnist
limit = 1024
mean = 0.286
std = 0.353
[data.eval]
limit = 256
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 32
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 2
batch = 64
lr = 0.05
momentum = 0.9
log_every = 4
eval_every = 8
checkpoint_every = 8
[log]
tensorboard = 1
csv = 1
histograms = 8
INI

log_run() {
	_d=$1
	shift
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$_d" "$@"
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$_d/resumed" train.max_steps=20 "$@"
	rm -f "$_d/resumed/checkpoints/ckpt-20.kiln"
	kiln 0 train "$tmp/mlp.ini" run.out_dir="$_d/resumed" train.resume=1 "$@"
	grep -q '"event":"resume".*"step":16,' "$_d/resumed/metrics.jsonl" ||
		fail "the second run did not resume from step 16: $(grep resume "$_d/resumed/metrics.jsonl")"
}
