#!/bin/sh
# tests/thread_limit.sh - the CPU device under a limit on threads: each
# OpenMP team (the opening thread's, an async stream worker's at its first
# op) is made where a failure is a kiln error naming the limit, never
# libgomp's "Thread creation failed" and exit(1) inside the plugin
# (teamstart.h).
#
# kiln trains under a limit of 2, 3, ... 12 tasks: every run either
# trains, or fails with "kiln: error:" naming the limit, no libgomp line,
# no signal; the limits that fail include one at the opening thread's
# team and, with [plugin.cpu] async = 1, one at a stream worker's; and
# with a loader worker (data.workers = 1).  The
# limit is a cgroup's pids.max (root, cgroup v1's pids controller or v2
# with it enabled), else ulimit -u as nobody (root with setpriv); else the
# test skips: ulimit -u counts every process of the user, and the rest of
# the suite's would move the limits that fail.
name=thread_limit
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (a pids cgroup, or setpriv to nobody with ulimit -u)"; exit 77; }

# a pids cgroup of the test's own: v1's controller, or v2's where enabled
cg=
for root in /sys/fs/cgroup/pids /sys/fs/cgroup; do
	[ -w "$root" ] || continue
	d="$root/kiln-$name-$$"
	if mkdir "$d" 2>/dev/null; then
		if [ -w "$d/pids.max" ]; then
			cg=$d
			break
		fi
		rmdir "$d"
	fi
done
trap '[ -n "$cg" ] && rmdir "$cg" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

# the binary itself: libtool's wrapper forks on its way to it, a task
# the limit would count
bin="$abs_top_builddir/.libs/kiln"
[ -x "$bin" ] || bin="$abs_top_builddir/kiln"
LD_LIBRARY_PATH="$abs_top_builddir/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
args="data.limit=256 train.batch=64 train.max_steps=2 train.eval=0 data.workers=0 run.threads=2"
if [ -z "$cg" ]; then
	# (bash: dash's ulimit has no -u)
	command -v setpriv >/dev/null 2>&1 && command -v bash >/dev/null 2>&1 ||
		{ echo "SKIP: no pids cgroup, and no setpriv or bash for ulimit -u"; exit 77; }
	# nobody reads the build and writes its own scratch and caches
	su_ok=$(setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c \
		"test -r '$bin' && echo yes" 2>/dev/null)
	[ "$su_ok" = yes ] || { echo "SKIP: no pids cgroup, and nobody cannot read the build"; exit 77; }
	mkdir -p "$tmp/nobody" && chmod 777 "$tmp/nobody" && chmod 755 "$tmp"
	echo "limits: ulimit -u as nobody"
else
	echo "limits: $cg/pids.max"
fi

# limited M TAG ARGS...: kiln train under a limit of M tasks, output in
# $tmp/TAG.M; its exit code in $rc
limited() {
	_m=$1 _t=$2
	shift 2
	_o="$tmp/nobody/$_t.$_m"
	mkdir -p "$tmp/nobody"
	if [ -n "$cg" ]; then
		echo "$_m" >"$cg/pids.max"
		sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" \
			"$bin" train "$srcdir/examples/fashion_mnist_mlp.ini" $args "run.out_dir=$_o.run" "$@" \
			>"$_o" 2>&1
		rc=$?
	else
		# nobody's other processes count too
		_n=$(($(ps -L -u nobody --no-headers 2>/dev/null | wc -l) + _m))
		setpriv --reuid=nobody --regid=nogroup --clear-groups \
			env XDG_CACHE_HOME="$tmp/nobody/cache" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
			bash -c 'ulimit -u "$0" && exec "$@"' "$_n" \
			"$bin" train "$srcdir/examples/fashion_mnist_mlp.ini" $args "run.out_dir=$_o.run" "$@" \
			>"$_o" 2>&1
		rc=$?
	fi
	out=$_o
}

opening=0 worker=0 trained=0
for tag in sync async workers; do
	extra=
	[ $tag = async ] && extra="plugin.cpu.async=1"
	# a loader worker started after the device opened, before its first op
	[ $tag = workers ] && extra="data.workers=1"
	m=2
	while [ $m -le 12 ]; do
		limited $m $tag $extra
		[ $rc -lt 128 ] || { cat "$out"; fail "$tag, limit $m: killed by a signal (exit $rc)"; }
		! grep -q "libgomp" "$out" || { cat "$out"; fail "$tag, limit $m: libgomp's own exit"; }
		if [ $rc -eq 0 ]; then
			echo "ok: $tag, limit $m: trained"
			trained=$((trained + 1))
			break
		fi
		grep -q "^kiln: error: .*\(pids.max\|ulimit -u\)" "$out" ||
			{ cat "$out"; fail "$tag, limit $m: exit $rc without a kiln error naming the limit"; }
		if grep -q "cannot start the OpenMP team of 2 threads on the device's opening thread: 0 of the 1 more" "$out"; then
			opening=$((opening + 1))
		elif grep -q "cannot start the OpenMP team of 2 threads on thread 'kiln-stream-[0-9]*': 0 of the 1 more" "$out"; then
			worker=$((worker + 1))
		fi
		echo "ok: $tag, limit $m: $(grep '^kiln: error:' "$out" | cut -c1-120)..."
		m=$((m + 1))
	done
done
[ $trained -eq 3 ] || fail "sync, async, workers: $trained of them trained under a limit of 12 tasks"
[ $opening -ge 1 ] || fail "no limit failed at the opening thread's team"
[ $worker -ge 1 ] || fail "no limit failed at a stream worker's team (async)"
echo "ok: $opening limits failed at the opening thread's team, $worker at a stream worker's"
