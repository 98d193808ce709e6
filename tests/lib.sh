# tests/lib.sh - the preamble the shell tests share.  A test sources it
# after naming itself:
#
#     name=NAME
#     . "$(dirname "$0")/lib.sh"
#
# and gets: set -u; the build's paths (top_builddir, abs_top_builddir,
# srcdir: the source tree, absolute under `make check`, which exports them
# through tests/local.mk); $kiln, the built CLI; no KILN_PLUGIN_PATH of the
# caller's; XDG_CACHE_HOME in the build tree's tests/cache (ccache's
# cache the caller's, not one there); no Python bytecode written
# (PYTHONDONTWRITEBYTECODE); tests/ on PYTHONPATH (tests/st.py, the
# safetensors reader and writer); a scratch directory $tmp, removed on
# exit unless KEEP is set;
# and the helpers below.
set -u

: "${top_builddir:=.}"
: "${abs_top_builddir:=$(cd "$top_builddir" && pwd)}"
srcdir=${abs_top_srcdir:-${srcdir:-.}}
kiln="$top_builddir/kiln"
unset KILN_PLUGIN_PATH
# ccache: the caller's cache, named before XDG_CACHE_HOME moves (below), or
# none (tests/local.mk does the same under `make check`)
if [ -z "${CCACHE_DIR:-}" ] && command -v ccache >/dev/null 2>&1; then
	CCACHE_DIR=$(ccache -k cache_dir 2>/dev/null) || CCACHE_DIR=
	if [ -n "$CCACHE_DIR" ]; then
		export CCACHE_DIR
	else
		unset CCACHE_DIR
		CCACHE_DISABLE=1
		export CCACHE_DISABLE
	fi
fi
# kiln's caches (tune, probe, inflated IDX) in the tests' own directory, as
# `make check` has them (tests/local.mk), also for a test run by hand:
# never the user's $XDG_CACHE_HOME or ~/.cache (tests/cpu_tune_cache.sh)
XDG_CACHE_HOME="$abs_top_builddir/tests/cache"
export XDG_CACHE_HOME
# and no Python bytecode beside the sources (tests/local.mk)
PYTHONDONTWRITEBYTECODE=1
export PYTHONDONTWRITEBYTECODE
# the CPU device's run-queue wait hook at 0 s a second, so that no test's
# [pipeline] defer_wgrad = auto or [plugin.cpu] async = auto follows the
# box's load; a test sets its own (KILN_CPU_RUNWAIT=0.9 kiln ...)
KILN_CPU_RUNWAIT=${KILN_CPU_RUNWAIT-0}
export KILN_CPU_RUNWAIT
# tests/st.py (safetensors files, the standard library only) importable as
# `import st` by a test's Python
PYTHONPATH="$srcdir/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-$name.XXXXXX") || exit 99
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
# the last kiln run's output (the kiln function below)
out="$tmp/stdout"
err="$tmp/stderr"
checks=0

# fail MESSAGE: the test fails (after a kiln run: with its command and output)
fail() {
	echo "FAIL: $*"
	if [ -n "${last+x}" ]; then
		echo "--- command: kiln $last"
		echo "--- stdout:"; cat "$out"
		echo "--- stderr:"; cat "$err"
	fi
	exit 1
}

# field KEY FILE: the last number logged as "KEY": in FILE (kiln's JSON lines)
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$2" | tail -1; }
# rel A B: |A - B| / |B|
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; print d / b }'; }
# losses_agree WHAT A_NAME A_OUT B_NAME B_OUT TOL: the final train_loss and
# test_loss of two runs' outputs (metrics lines) within TOL of each other
# (relative), else the test fails naming both
losses_agree() {
	for _k in train_loss test_loss; do
		_a=$(field $_k "$3")
		_b=$(field $_k "$5")
		_r=$(rel "$_a" "$_b")
		echo "$1 $_k: $2 $_a, $4 $_b, relative difference $_r"
		awk -v r="$_r" -v t="$6" 'BEGIN { exit !(r < t) }' ||
			fail "$1 $_k: $2 $_a and $4 $_b differ by $_r of the loss"
	done
}

# same_metrics A_LABEL A_FILE B_LABEL B_FILE: train_loss, test_loss and
# test_acc logged in both files, and identical (fails naming both values)
same_metrics() {
	for k in train_loss test_loss test_acc; do
		_a=$(field $k "$2")
		_b=$(field $k "$4")
		[ -n "$_a" ] && [ "$_a" = "$_b" ] || fail "$3 $k = $_b, $1 $k = $_a (must be identical)"
	done
}

# kiln EXPECTED_EXIT ARGS...: run kiln into $out and $err, check its exit
# code and that it did not crash.
kiln() {
	want=$1
	shift
	last="$*"
	"$kiln" "$@" >"$out" 2>"$err"
	rc=$?
	checks=$((checks + 1))
	[ "$rc" -lt 128 ] || fail "exit code $rc: killed by a signal"
	! grep -q Segmentation "$out" "$err" || fail "output mentions Segmentation"
	[ "$rc" -eq "$want" ] || fail "exit code $rc, expected $want"
	echo "ok: kiln $* (exit $rc)"
}

# job_tree PID: PID and every process under it (pgrep -P), each stopped
# (SIGSTOP) before its children are listed, so that none starts another
# after the walk, added to $_jk_pids (in this shell: no subshell holds the
# list).  job_kill PID: SIGKILL for all of them: a background job's
# `timeout`, the `kiln launch` under it and its ranks, which lead process
# groups of their own (so neither killing PID alone nor its process group,
# the test script's own, reaches them); the caller, the test script, is
# above PID and stays.  Were the test shell ended (SIGINT, SIGTERM,
# SIGHUP: make's or the user's) between the walk's stops and the SIGKILL,
# the processes stopped so far would stay stopped for good (before
# session 48: the walk ran in a command substitution's subshell, which a
# signal to the test shell did not end); the traps set for the walk kill
# them first.  The caller's own traps of those signals are restored
# after (before session 48 job_kill reset them to the default): saved by
# `trap > FILE`, which prints this shell's traps in a form `.` sets again
# (dash has no `trap -p`, and prints none in `$(trap)`, a subshell).
job_tree() {
	kill -STOP "$1" 2>/dev/null
	_jk_pids="$_jk_pids $1"
	for _c in $(pgrep -P "$1"); do job_tree "$_c"; done
}
job_kill() {
	_jk_pids=
	trap > "$tmp/.job_kill_traps" 2>/dev/null
	trap 'kill -9 $_jk_pids 2>/dev/null; exit 129' HUP
	trap 'kill -9 $_jk_pids 2>/dev/null; exit 130' INT
	trap 'kill -9 $_jk_pids 2>/dev/null; exit 143' TERM
	job_tree "$1"
	kill -9 $_jk_pids 2>/dev/null
	trap - HUP INT TERM
	! [ -f "$tmp/.job_kill_traps" ] || . "$tmp/.job_kill_traps"
}

# wait_line PID FILE PATTERN WHAT LOG: until FILE has a line matching
# PATTERN (grep's basic regex) while process PID runs in the background,
# polling every 0.1 s for at most $wait_line_s s (300 unless the test
# sets it); the test fails, naming WHAT (and the end of LOG, PID's
# output), when PID ends first or the time runs out, then after killing
# PID and every process under it (job_kill: before session 47 PID alone,
# which left a launcher's ranks running).
wait_line_s=300
wait_line() {
	_n=0
	until grep -q -- "$3" "$2" 2>/dev/null; do
		_n=$((_n + 1))
		[ $_n -le $((wait_line_s * 10)) ] ||
			{ job_kill "$1"; fail "$4: no '$3' in $2 within $wait_line_s s"; }
		kill -0 "$1" 2>/dev/null || fail "$4: kiln ended early: $(tail -3 "$5")"
		sleep 0.1
	done
}

# stdout_has/stderr_has TEXT: a fixed string in the last run's output.
stdout_has() { grep -qF -- "$1" "$out" || fail "stdout lacks: $1"; }
stderr_has() { grep -qF -- "$1" "$err" || fail "stderr lacks: $1"; }
# stdout_matches REGEX (extended)
stdout_matches() { grep -qE -- "$1" "$out" || fail "stdout does not match: $1"; }

# st_mut SRC DST WHAT [ARG]: a safetensors file with one thing changed
# (tests/st_mut.py says what)
st_mut() {
	/usr/bin/python3 "$srcdir/tests/st_mut.py" "$@" || fail "python3 could not rewrite $1"
}

# crc_flips FILE FLAG CMD [ARGS...]: FILE, a safetensors file kiln wrote with
# its CRC32Cs (kiln.crc32c), with a bit of one tensor flipped, each tensor in
# turn (tests/st_mut.py), into $flipped: `kiln CMD ARGS FLAG $flipped` exits
# 3 naming the file, the tensor and the CRCs.  Sets $tensors (all of them)
# and $t (the last: $flipped has its bit flipped).
crc_flips() {
	_src=$1 _flag=$2
	shift 2
	tensors=$(/usr/bin/python3 "$srcdir/tests/st_mut.py" "$_src" - tensors) ||
		fail "$_src: no kiln.crc32c of 1 + one CRC32C a tensor (tensors: $tensors)"
	flipped="$tmp/flipped.st"
	for t in $tensors; do
		st_mut "$_src" "$flipped" flip "$t"
		kiln 3 "$@" "$_flag" "$flipped"
		grep -qE "^kiln: error: $flipped: (.*: )?tensor '$t' does not match its CRC32C \([0-9a-f]{8}, the file records [0-9a-f]{8} in metadata kiln.crc32c\): the file is damaged, changed since it was written; a tool that changes a kiln file must drop metadata kiln.crc32c\$" "$err" ||
			fail "a bit of '$t' flipped: no error naming the file, the tensor and the CRCs"
	done
}

# ck NAME STEP: the checkpoint at STEP of the run whose out_dir is $tmp/NAME
ck() { echo "$tmp/$1/checkpoints/ckpt-$2.kiln"; }
# newest_ck NAME: that run's checkpoint of the highest step, by number (name
# order, `ls | tail -1`, puts ckpt-9 after ckpt-10)
newest_ck() {
	ck "$1" "$(ls "$tmp/$1/checkpoints" | sed -n 's/^ckpt-\([0-9]*\)\.kiln$/\1/p' | sort -n | tail -1)"
}
# near A B TOL SECTIONS...: checkpoints A and B agree within TOL in
# SECTIONS (tests/ckpt_tool close), else the test fails naming both runs
near() {
	_a=$1 _b=$2 _tol=$3
	shift 3
	"$top_builddir/tests/ckpt_tool" close "$_a" "$_b" "$_tol" "$@" ||
		fail "$(basename "$(dirname "$(dirname "$_a")")") and $(basename "$(dirname "$(dirname "$_b")")") differ"
}

# sig_default SIG CMD...: exec CMD with signal SIG (a number, or a name
# like SIGHUP) at its default action, as a terminal's child has it: a
# shell cannot undo a signal ignored on its entry (nohup ignores SIGHUP;
# some CI runners SIGINT).  Run it in the background (CMD &: $! is then
# CMD's pid) or in a subshell: it replaces the shell it runs in.
sig_default() {
	_sig=$1
	shift
	exec /usr/bin/python3 -c 'import os, signal, sys; s = sys.argv[1]; signal.signal(int(s) if s.isdigit() else getattr(signal, s), signal.SIG_DFL); os.execv(sys.argv[2], sys.argv[2:])' "$_sig" "$@"
}

# need_fashion_mnist: $FM, the dataset scripts/install-deps puts in place
# (a test that needs it fails without it)
FM=/usr/share/datasets/fashion-mnist
need_fashion_mnist() {
	[ -d "$FM" ] || { echo "FAIL: $FM missing: run scripts/install-deps"; exit 1; }
}

# need_python3 [WHY]: $py, the system's python3 (the standard library
# only: tests/st.py, the reference scripts' checks); skip (exit 77),
# saying WHY it is needed, without it
need_python3() {
	py=/usr/bin/python3
	[ -x "$py" ] || { echo "SKIP: no $py${1:+ $1}"; exit 77; }
}

# data_folder_ini ROOT IN OUT: config IN written to OUT with [data] the
# folder source at ROOT (size 8, 1 channel: tests/data/tr_cnn.ini's images)
# in place of its source, images and labels keys
data_folder_ini() {
	awk -v d="$1" '/^\[/ { sec = $0 }
		sec == "[data]" && /^(images|labels|source) =/ { next }
		{ print }
		$0 == "[data]" { print "source = folder\npath = " d "\nsize = 8\nchannels = 1" }' \
		"$2" >"$3"
}

# need_source NAME: skip (exit 77) when the loaders plugin that provides the
# data source NAME was not built
need_source() {
	"$kiln" plugins 2>/dev/null | grep -q "^source  *$1 .*available" ||
		{ echo "SKIP: no $1 source (configure without loaders)"; exit 77; }
}

# shim_build: tests/shim_fault.c, the LD_PRELOAD shim whose faults (failed
# allocations, cut pwrites and reads, a stopped clock) its environment
# variables choose, built into $shim; non-zero, the compiler's messages in
# $tmp/shim.err, where it cannot be (not glibc: no __libc_malloc)
shim="$tmp/shim.so"
shim_build() {
	${CC:-cc} -shared -fPIC -o "$shim" "$srcdir/tests/shim_fault.c" -ldl 2>"$tmp/shim.err"
}

# mlp_fixture SEED THREADS: 512 random 28x28 images and labels in idx files
# in $tmp and the benchmark's MLP (784-512-256-10, SGD momentum 0.9, batch 64,
# a train line every step, no eval) over them on THREADS threads in $ini
# (tests/grad_sums.sh, tests/affine.sh)
mlp_fixture() {
	python3 - "$tmp" "$1" <<'EOF' || fail "python3 could not write the data"
import random, struct, sys
d, n = sys.argv[1], 512
r = random.Random(int(sys.argv[2]))
with open(d + "/img.idx", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(r.randrange(256) for _ in range(n * 784)))
with open(d + "/lab.idx", "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(r.randrange(10) for _ in range(n)))
EOF
	ini="$tmp/m.ini"
	cat > "$ini" <<EOF
[run]
device = cpu
threads = $2
seed = 1
[data]
source = idx
images = $tmp/img.idx
labels = $tmp/lab.idx
workers = 0
[layer.fc1]
type = linear
out = 512
[layer.relu1]
type = relu
[layer.fc2]
type = linear
out = 256
[layer.relu2]
type = relu
[layer.fc3]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 1
batch = 64
lr = 0.1
momentum = 0.9
log_every = 1
eval = 0
EOF
}
