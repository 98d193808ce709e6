# tests/config_lib.sh - shell functions that write the INI blocks the
# shell tests and bench/pipeline.sh train with, so that a model, a data
# set or a [train] section is one line of its test rather than a heredoc
# repeated from test to test.  Sourced (not run); each function writes to
# stdout, e.g.
#
#     {
#         ini run seed=5 threads=1
#         ini_synthetic 256 8 16 workers=0
#         ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
#         ini train epochs=1 max_steps=6 batch=32
#     } > "$tmp/mlp.ini"
#
# Keys keep the order given; a value may hold spaces and '=' (everything
# after the first '=').

# ini SECTION KEY=VALUE...: [SECTION] and one `key = value` line a pair
ini() {
	printf '[%s]\n' "$1"
	shift
	for _kv in "$@"; do
		printf '%s = %s\n' "${_kv%%=*}" "${_kv#*=}"
	done
}

# ini_layers NAME:TYPE[:KEY=VALUE...]...: a [layer.NAME] section a word,
# its type and keys (conv1:conv:out=6:kernel=3:padding=1; a value here
# holds no ':', and no space unless the word is quoted)
ini_layers() {
	for _spec in "$@"; do
		_name=${_spec%%:*}
		_rest=${_spec#*:}
		_type=${_rest%%:*}
		printf '[layer.%s]\ntype = %s\n' "$_name" "$_type"
		[ "$_rest" != "$_type" ] || continue
		_rest=${_rest#*:}
		while [ -n "$_rest" ]; do
			_kv=${_rest%%:*}
			printf '%s = %s\n' "${_kv%%=*}" "${_kv#*=}"
			[ "$_rest" != "$_kv" ] || break
			_rest=${_rest#*:}
		done
	done
}

# ini_synthetic SAMPLES IMAGE_SIZE CLASSES [KEY=VALUE...]: [data] of the
# synthetic source (docs/data.md)
ini_synthetic() {
	_s=$1 _i=$2 _c=$3
	shift 3
	ini data source=synthetic samples="$_s" image_size="$_i" classes="$_c" "$@"
}

# ini_fmnist [KEY=VALUE...]: [data] of Fashion-MNIST's idx files,
# normalised as examples/fashion_mnist_*.ini (path= names the folder, else
# data.path= on the command line)
ini_fmnist() {
	ini data source=idx mean=0.286 std=0.353 "$@"
}

# The models several tests train.
# mlp_synthetic_layers: flatten, 3 linear layers (32, 24, 16) with ReLUs,
# softmax cross-entropy: the MLP cut into pipeline stages (tests/pipeline.sh,
# tests/pipeline_dist.sh)
mlp_synthetic_layers() {
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=24 r2:relu \
		fc3:linear:out=16 loss:softmax_xent
}

# linear_layers OUT: flatten, one linear layer (fc) of OUT outputs,
# softmax cross-entropy: the linear classifier of the tests that need a
# model but test something else (tests/oom_named.sh, tests/st_vmem.sh,
# tests/resume_config.sh, ini_bench_data below)
linear_layers() {
	ini_layers flat:flatten fc:linear:out="$1" loss:softmax_xent
}

# mlp10_layers HIDDEN [NAME:TYPE[:KEY=VALUE...]...]: flatten, a linear
# layer of HIDDEN outputs (fc1), the layers given, a ReLU (r1), a linear
# layer of 10 (fc2), softmax cross-entropy: the one-hidden-layer classifier
# of 10 classes (tests/ckpt_frozen.sh with a batchnorm after fc1,
# tests/data_skip_count.sh, tests/openblas_rlimit.sh)
mlp10_layers() {
	_h=$1
	shift
	ini_layers flat:flatten fc1:linear:out="$_h" "$@" r1:relu fc2:linear:out=10 loss:softmax_xent
}

# ini_sgd_steps STEPS [KEY=VALUE...]: [train] of the short SGD runs the
# pipeline tests compare: one epoch, at most STEPS steps, momentum 0.9,
# lr 0.05, no evaluation
ini_sgd_steps() {
	_n=$1
	shift
	ini train epochs=1 max_steps="$_n" optimizer=sgd momentum=0.9 lr=0.05 "$@"
}

# ini_pipeline_mlp SAMPLES [KEY=VALUE...]: the config of the MLP the
# pipeline tests cut (tests/pipeline.sh, tests/pipeline_one_cpu.sh,
# tests/pipeline_dist.sh): seed 5, one thread, SAMPLES synthetic 8x8
# images of 16 classes read in the trainer's thread, mlp_synthetic_layers,
# and ini_sgd_steps 6 with the [train] keys given, logged every 3 steps,
# no evaluation
ini_pipeline_mlp() {
	_s=$1
	shift
	ini run seed=5 threads=1
	ini_synthetic "$_s" 8 16 workers=0
	mlp_synthetic_layers
	ini_sgd_steps 6 "$@" log_every=3 eval=0
}

# ini_tr_cnn_mlp DIR [HIDDEN]: [data] and [data.eval] of the 48 tr_cnn
# images in DIR (tests/data), unshuffled and read in the trainer's thread
# (workers = 0), the same images evaluated, and a small MLP on them:
# flatten, a linear layer (fc1) of HIDDEN outputs and a ReLU (relu1) where
# HIDDEN is given, a linear layer of 5 (fc2, or fc1 without HIDDEN),
# softmax cross-entropy (tests/cache_home.sh, tests/nonfinite_weights.sh,
# tests/progress_tty.sh)
ini_tr_cnn_mlp() {
	ini data source=idx path="$1" images=tr_cnn_images.idx labels=tr_cnn_labels.idx shuffle=0 \
		workers=0
	ini data.eval images=tr_cnn_images.idx labels=tr_cnn_labels.idx
	if [ -n "${2:-}" ]; then
		ini_layers flat:flatten fc1:linear:out="$2" relu1:relu fc2:linear:out=5 loss:softmax_xent
	else
		ini_layers flat:flatten fc1:linear:out=5 loss:softmax_xent
	fi
}

# ini_bench_data [KEY=VALUE...]: a config for `kiln bench data`, which
# reads its [data] and [train] batch: the CPU, [data] of the synthetic
# source with the keys given (docs/data.md), a linear classifier of 10
# classes, batch 8 (tests/bench_data.sh, tests/json_nonfinite.sh)
ini_bench_data() {
	ini run device=cpu
	ini data source=synthetic "$@"
	linear_layers 10
	ini train batch=8
}
