#!/bin/sh
# tests/cpu_widen_cache.sh - the widened weights kept between runs
# ([plugin.cpu] keep_widened; plugins/cpu/wcache.c).  Where oneDNN has no
# bf16 kernels (AVX2: "bf16 none"), a bf16 weight read twice between two
# writes keeps its f32 copy, and every write the device sees makes it
# stale.  A stale copy changes the numbers: a run that read last step's
# weights would train differently.  So each run here is compared bit for
# bit (tolerance 0) with keep_widened = 0, which widens on every op:
#   - the bf16 CNN (GEMMs and convolutions, SGD with momentum), 4 steps;
#   - the bf16 MLP with 2 micro-batches per step (four reads of a weight
#     per optimizer step) and an evaluation plan's forward between steps;
#   - the MLP resumed from its step-2 checkpoint (the weights written by
#     the load, then the compute copy's CAST);
#   - the bf16 MLP with adamw and amsgrad = 1 (the op's four f32 outputs
#     leave no room for the compute copy: a CAST of the params writes it;
#     before session 44 no weight was kept), on oneDNN capped at AVX2
#     (ONEDNN_MAX_CPU_ISA), so that it runs on an AVX-512 machine too;
#   - the MLP on 2 ranks with ZeRO-1 (each rank's optimizer writes its
#     slice of the compute copy, the communicator's allgather the rest, in
#     a host function; fc2 widened so that each slice holds a whole
#     weight), where the gloo plugin is built: as oneDNN is here,
#     and on an AVX-512 machine capped at AVX2 as well (before session 45
#     not capped: there the slices' kept copies were never checked);
#   - the MLP as it is on 2 ranks with ZeRO-1, capped at AVX2 where oneDNN
#     has bf16 kernels: fc1's 401,408 weights lie across the slices' end
#     (rank 0's slice ends at element 267,904), and each rank keeps them
#     too, 1.6 MB of the 2.1 MB of the MLP's weights (session 46; before,
#     no weight outside a rank's slice was kept: rank 0 kept nothing, rank
#     1 fc2's and fc3's, 0.5 MB).
# On AVX2 the kept copies must have been read (the debug line at close,
# one from each rank); where oneDNN has bf16 kernels (AVX-512) nothing is kept
# (no line), and the runs still agree.
name=cpu_widen_cache
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

# the bf16 kernels fixed, not timed (`auto` with no cache times each run's
# own: two kernels within noise of each other then differ between the runs
# compared, 4e-9 apart in the MLP's weights under a loaded make check -j2,
# session 23)
common="data.path=$FM train.eval=0 run.precision=bf16 run.threads=2 plugin.cpu.tune_cache=none plugin.cpu.bf16_gemm=bf16 plugin.cpu.bf16_conv=bf16"

# run LABEL KEEP CONFIG ARGS...: a bf16 run with keep_widened = KEEP, its
# debug log kept as $tmp/LABEL.err
run() {
	_l=$1 _k=$2 _c=$3
	shift 3
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug kiln 0 train "$_c" $common "plugin.cpu.keep_widened=$_k" \
		"run.out_dir=$tmp/$_l" "$@"
	cp "$err" "$tmp/$_l.err"
}

# on_avx2 CMD ARGS...: CMD with oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA,
# so that it has no bf16 kernels on an AVX-512 machine either; capped=1
# tells kept), the caller's own ONEDNN_MAX_CPU_ISA, if any, back after it
capped=
on_avx2() {
	_isa_was=${ONEDNN_MAX_CPU_ISA+set} _isa=${ONEDNN_MAX_CPU_ISA:-}
	ONEDNN_MAX_CPU_ISA=AVX2
	export ONEDNN_MAX_CPU_ISA
	capped=1
	"$@"
	capped=
	if [ -n "$_isa_was" ]; then ONEDNN_MAX_CPU_ISA=$_isa; else unset ONEDNN_MAX_CPU_ISA; fi
}

# kept LABEL [RANKS]: on AVX2 (native empty: the first run had no bf16
# kernels), or under on_avx2 (where the run must have had none), the run
# kept widened weights and read them again: RANKS (default 1) debug lines
# at close, one a rank, each with reads
kept() {
	_line=$(grep "widened weights:" "$tmp/$1.err")
	if [ -n "$capped" ]; then
		grep -q "ISA [a-z0-9_]*, bf16 none" "$tmp/$1.err" ||
			fail "$1: capped at AVX2, yet: $(grep -o "oneDNN [^,]*, ISA [^,]*, bf16 [a-z]*" "$tmp/$1.err" | head -1)"
	elif [ -n "$native" ]; then
		[ -z "$_line" ] || fail "$1: oneDNN has bf16 kernels here, yet: $_line"
		return
	fi
	_n=$(echo "$_line" | grep -c "widened weights:")
	_read=$(echo "$_line" | grep -c " [1-9][0-9]* reads of a kept copy$")
	[ "$_n" = "${2:-1}" ] && [ "$_read" = "$_n" ] ||
		fail "$1: ${2:-1} line(s) with reads of kept widened weights wanted, $_n lines, $_read with reads: '$_line'"
	echo "ok: $1: $_line"
}

# same A B STEP: params, and the step's train loss, identical
same() {
	near "$(ck "$1" "$3")" "$(ck "$2" "$3")" 0 params
	_a=$(grep "\"event\":\"train\",.*\"step\":$3," "$tmp/$1/metrics.jsonl" | sed -n 's/.*"loss":\([^,]*\),.*/\1/p')
	_b=$(grep "\"event\":\"train\",.*\"step\":$3," "$tmp/$2/metrics.jsonl" | sed -n 's/.*"loss":\([^,]*\),.*/\1/p')
	[ -n "$_a" ] && [ "$_a" = "$_b" ] || fail "step $3 loss: $1 $_a, $2 $_b"
	echo "ok: $1 = $2 at step $3 (loss $_a, params bit for bit)"
}

cnn="$srcdir/bench/cnn_bench.ini"
cnn_args="data.limit=256 train.max_steps=4 train.batch=64 train.log_every=1"
# shellcheck disable=SC2086
run cnn0 0 "$cnn" $cnn_args
native=yes
grep -q "ISA [a-z0-9_]*, bf16 none" "$tmp/cnn0.err" && native=
# shellcheck disable=SC2086
run cnn1 1 "$cnn" $cnn_args
kept cnn1
same cnn0 cnn1 4

mlp="$srcdir/bench/mlp_bench.ini"
mlp_args="data.limit=512 train.max_steps=4 train.batch=32 train.accumulate=2 train.log_every=1 train.checkpoint_every=2 train.eval=1 train.eval_every=2 data.eval.limit=64"
# shellcheck disable=SC2086
run mlp0 0 "$mlp" $mlp_args
# shellcheck disable=SC2086
run mlp1 1 "$mlp" $mlp_args
kept mlp1
same mlp0 mlp1 2
same mlp0 mlp1 4

# resumed at step 2: the loaded weights reach the compute copy by a CAST
for k in 0 1; do
	mkdir -p "$tmp/res$k/checkpoints"
	cp "$(ck "mlp$k" 2)" "$tmp/res$k/checkpoints/"
	# shellcheck disable=SC2086
	run "res$k" $k "$mlp" $mlp_args train.resume=1
done
kept res1
same res0 res1 4
same mlp0 res1 4

# amsgrad: the compute copy written by a CAST after the optimizer
ams() {
	for k in 0 1; do
		# shellcheck disable=SC2086
		run "ams$k" $k "$mlp" $mlp_args train.optimizer=adamw train.amsgrad=1 train.lr=0.001
	done
	kept ams1
}
on_avx2 ams
same ams0 ams1 4

if [ ! -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ]; then
	echo "ok: no gloo plugin: the 2-rank ZeRO-1 runs left out"
	echo "PASS: $checks runs"
	exit 0
fi
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
	echo $(( 20000 + $$ % 20000 )))
# zero LABEL PORT OVERRIDE...: the MLP on 2 ranks with ZeRO-1,
# keep_widened 0 and 1 (LABEL0, LABEL1 on ports PORT and PORT + 1): the
# same bits, and a debug line from each rank with reads of kept copies
zero() {
	_zl=$1 _zp=$2
	shift 2
	for k in 0 1; do
		# shellcheck disable=SC2086
		KILN_LOG_LEVEL=debug KILN_MASTER_PORT=$((_zp + k)) kiln 0 launch -n 2 -- "$abs_top_builddir/kiln" \
			train "$mlp" $common $mlp_args train.eval=0 dist.zero=1 "plugin.cpu.keep_widened=$k" \
			"run.out_dir=$tmp/$_zl$k" "$@"
		cp "$err" "$tmp/$_zl$k.err"
		cat "$out" >> "$tmp/$_zl$k.err"
	done
	kept "${_zl}1" 2
	same "${_zl}0" "${_zl}1" 4
}
# fc2 2048 wide: each rank's slice of the compute copy holds a whole
# weight (rank 0 fc1's, rank 1 fc3's), which each rank kept before
# session 46 too
zero zero "$port" layer.fc2.out=2048
[ -z "$native" ] || on_avx2 zero zavx "$((port + 2))" layer.fc2.out=2048
# the MLP as it is (535,824 parameters: rank 0's slice is [0, 267904),
# fc1's weights [0, 401408)): fc1's copy kept on both ranks, 1.6 MB each
# (the debug line's MB: every weight read twice between two writes)
if [ -n "$native" ]; then on_avx2 zero zcross "$((port + 4))"; else zero zcross "$((port + 4))"; fi
_mb=$(sed -n 's/.*widened weights: [0-9]* kept, \([0-9.]*\) MB,.*/\1/p' "$tmp/zcross1.err")
[ "$(echo "$_mb" | awk '$1 >= 1.6 { n++ } END { print n + 0 }')" = 2 ] ||
	fail "zcross: not both ranks kept fc1's widened weights (1.6 MB, across the slices' end): $(grep "widened weights:" "$tmp/zcross1.err")"
echo "ok: zcross: both ranks kept fc1's weights across the ZeRO-1 slices' end ($(echo $_mb) MB)"
echo "PASS: $checks runs"
