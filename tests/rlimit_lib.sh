# tests/rlimit_lib.sh - what the address-space tests of [train] batch = auto
# share (tests/memory_rlimit.sh, tests/memory_limit_rlimit.sh): the model,
# tests/data/wide_conv.ini, and its run under `ulimit -v`.  A test sources
# it after lib.sh, having set rl_data, its [data] overrides (words without
# spaces: `data.image_size=28x28`).
cfg="$srcdir/tests/data/wide_conv.ini"

# train_under KIB ARGS...: kiln train $cfg with rl_data, run.out_dir
# $tmp/run and ARGS (train.batch=auto, ...), under ulimit -v KIB (KiB);
# output in $out and $err; its exit status (a signal: 128 + its number;
# a hang, killed after 120 s: 137)
train_under() {
	_lim=$1
	shift
	last="train $cfg $rl_data $* (under ulimit -v $_lim)"
	(
		ulimit -v "$_lim" || exit 98
		# shellcheck disable=SC2086
		exec timeout -s KILL 120 "$kiln" train "$cfg" $rl_data run.out_dir="$tmp/run" \
			plugin.cpu.adaptive=0 "$@" >"$out" 2>"$err"
	)
}
# the batch batch = auto logged in $err (empty if none)
auto_batch() { sed -n 's/.*batch = auto: \([0-9]*\), predicted.*/\1/p' "$err" | tail -1; }
