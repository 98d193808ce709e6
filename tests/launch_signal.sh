#!/bin/sh
# tests/launch_signal.sh - one graceful stop per rank under `kiln launch`
# (docs/distributed.md, "Stopping"): Slurm at its time limit and systemd
# signal the launcher and every rank; `timeout` signals the launcher and
# then its process group, so each rank used to get SIGTERM twice, the
# second meaning "exit now" (no checkpoint, launch exited 1).
#
#  1. 2 ranks (gloo) training: SIGTERM to both ranks, then to the launcher
#     (which forwards it: each rank's second): `kiln launch` exits 0, the
#     run stopped with its checkpoint (metrics.jsonl ends with the "stopped"
#     event), no rank was killed;
#  2. SIGTERM to the launcher twice, 0.1 s apart (what timeout(1) sends):
#     the same;
#  3. `timeout --preserve-status 10 kiln launch ...`: the same, exit 0;
#  4. the rank's rule itself (one process): a second SIGTERM while it stops
#     is ignored: exit 0 with its checkpoint;
#  5. SIGINT (Ctrl-C) to the launcher, which passes it on: the ranks stop as
#     for SIGTERM (before session 28 they died by it, no checkpoint, and
#     launch exited 1);
#  6. a rank waiting before training (rank 1 for a store no rank 0 serves;
#     rank 0 for a rank 1 that never comes) stops on SIGTERM within a
#     second or so, naming the wait, not after [dist] timeout (60 s here:
#     before session 28 the stop was only taken after a step);
#  7. a command that is not kiln runs with SIGPIPE and SIGXFSZ at their
#     defaults, not the launcher's ignored ones;
#  8. Ctrl-Z (SIGTSTP to the launcher, in a process group whose parent's
#     is another of its session, as a shell's job): the ranks stop too,
#     and SIGCONT to the launcher's group (fg, bg) continues them; then
#     SIGTERM stops the run as in 1 (before session 32 only the launcher
#     stopped: the ranks, each in a group of its own, trained on).
name=launch_signal
needs=gloo
. "$(dirname "$0")/dist_common.sh"

mlp_ini "$tmp/mlp.ini" 3 30
# long enough that every signal lands in training; ranks agree on a stop
# at a log point (log_every, the end of an epoch), so epochs of 64 steps
# of a wider MLP keep them running while the second signal comes
long="train.epochs=100000 train.log_every=1000 train.checkpoint_every=0 data.limit=8192 layer.fc1.out=512"

# stopped NAME RC: launch exited 0, a checkpoint written, no rank killed
stopped() {
	[ "$2" = 0 ] || bad "$1: kiln launch exited $2, expected 0"
	grep -q 'checkpoint written to' "$tmp/$1.log" || bad "$1: no stop checkpoint written"
	ls "$tmp/$1"/checkpoints/ckpt-*.kiln > /dev/null 2>&1 || bad "$1: no checkpoint file"
	tail -1 "$tmp/$1/metrics.jsonl" | grep -q '"event": *"stopped"' ||
		bad "$1: metrics.jsonl does not end with the stopped event"
	grep -q 'failed with' "$tmp/$1.log" && bad "$1: a rank failed: $(grep 'failed with' "$tmp/$1.log")"
	[ "$fail" = 0 ] || tail -15 "$tmp/$1.log"
	echo "$1: kiln launch exited $2, checkpoint $(ls "$tmp/$1"/checkpoints/)"
}

# handled NAME N: wait (up to 10 s) until N ranks of NAME took a stop request
handled() {
	_i=0
	until [ "$(grep -c 'stop requested' "$tmp/$1.log")" -ge "$2" ] || [ $_i -ge 1000 ]; do
		sleep 0.01
		_i=$((_i + 1))
	done
}

# ---- 1. every rank and the launcher signalled (Slurm, systemd) ----------
# The ranks first and the launcher once they took it, as a cgroup-wide
# kill does when the launcher runs last: its forwarded copy is the second.
"$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/all" $long \
	> "$tmp/all.log" 2>&1 &
lpid=$!
if await_train all "$lpid"; then
	ranks=$(cat "/proc/$lpid/task/$lpid/children")
	[ "$(echo $ranks | wc -w)" = 2 ] || bad "expected 2 ranks under the launcher, found '$ranks'"
	kill -TERM $ranks
	handled all 2
	kill -TERM "$lpid" 2>/dev/null || echo "(all: the run had stopped before the launcher's signal)"
fi
wait "$lpid"
stopped all $?

# ---- 2. the launcher signalled twice (timeout(1): the launcher, then its
# process group), 0.1 s apart: it passes on one ----------------------------
"$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/twice" $long \
	> "$tmp/twice.log" 2>&1 &
lpid=$!
if await_train twice "$lpid"; then
	kill -TERM "$lpid"
	sleep 0.1
	kill -TERM "$lpid" 2>/dev/null
fi
wait "$lpid"
stopped twice $?
grep -q 'again within 10 s: already passed on, ignored' "$tmp/twice.log" ||
	echo "(the run had stopped before the second signal)"

# ---- 3. timeout(1) itself ---------------------------------------------------
# (judged only when training had begun: a rank still starting up, before
# kiln train takes the signal, ends by it, as any program would)
timeout --preserve-status 10 "$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" \
	run.out_dir="$tmp/timeout" $long > "$tmp/timeout.log" 2>&1
rc=$?
if grep -q '"event":"train"' "$tmp/timeout/metrics.jsonl" 2>/dev/null; then
	stopped timeout $rc
else
	echo "timeout: fired before training began (a loaded machine): not judged"
fi

# ---- 4. one process: a repeat within 5 s is ignored ----------------------
KILN_MASTER_PORT=$(free_port 3) "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/one" $long \
	> "$tmp/one.log" 2>&1 &
pid=$!
if await_train one "$pid"; then
	kill -TERM "$pid"
	# the second once the first is handled (two pending signals merge)
	i=0
	until grep -q 'stop requested' "$tmp/one.log" || [ $i -ge 100 ]; do sleep 0.05; i=$((i + 1)); done
	kill -TERM "$pid" 2>/dev/null && echo "one process: a second SIGTERM sent while it stopped"
fi
wait "$pid"
rc=$?
[ $rc = 0 ] || bad "one process, SIGTERM twice at once: exit $rc, expected 0"
grep -q 'checkpoint written to' "$tmp/one.log" || bad "one process: no stop checkpoint"

# ---- 5. SIGINT to the launcher (Ctrl-C) ---------------------------------
"$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/int" $long \
	> "$tmp/int.log" 2>&1 &
lpid=$!
await_train int "$lpid" && kill -INT "$lpid"
wait "$lpid"
stopped int $?

# ---- 6. a stop before training: waiting at the rendezvous ---------------
for r in 1 0; do
	port=$(free_port 6$r)
	KILN_RANK=$r KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$port \
		KILN_STORE_TOKEN=kiln-test-token-0123456789abcdef timeout 120 "$kiln" train \
		"$tmp/mlp.ini" run.out_dir="$tmp/wait$r" dist.timeout=60 > "$tmp/wait$r.log" 2>&1 &
	pid=$!
	sleep 2
	t0=$(date +%s%N)
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
	ms=$(( ($(date +%s%N) - t0) / 1000000 ))
	echo "rank $r waiting at the rendezvous: SIGTERM, exit $rc in $ms ms"
	[ "$rc" != 0 ] && [ "$rc" != 124 ] || bad "wait$r: exit $rc"
	[ "$ms" -lt 20000 ] || bad "wait$r: $ms ms after SIGTERM (the timeout is 60 s)"
	grep -q "rank $r of 2: a stop was requested (a signal) while" "$tmp/wait$r.log" ||
		{ bad "wait$r: the error does not name the wait"; tail -3 "$tmp/wait$r.log"; }
done

# ---- 7. a non-kiln command gets the default SIGPIPE and SIGXFSZ ---------
# (the launcher ignores both itself, since session 30 SIGXFSZ too; its
# ranks inherited that: `kiln launch -- sh -c 'yes | head'` had a `yes`
# that never died of its broken pipe)
ign=$("$kiln" launch -n 1 -- sh -c 'sed -n "s/^SigIgn:[[:space:]]*//p" /proc/self/status' 2>/dev/null)
echo "a launched sh: SigIgn $ign"
case $ign in
"") bad "no SigIgn line from the launched command" ;;
*) [ $(( 0x$ign & 0x1001000 )) -eq 0 ] || bad "the launched command ignores SIGPIPE or SIGXFSZ (SigIgn $ign)" ;;
esac

# ---- 8. Ctrl-Z: the ranks stop with the launcher ------------------------
# A session of its own with the launcher in a group of its own below it:
# the group is not orphaned, so the kernel stops it by SIGTSTP (it would
# not in an orphaned one, as the test's own may be).  Prints what it saw.
# tstp NAME CMD...: CMD's launcher Ctrl-Z'd, every process below it
# (ranks, and what a wrapping rank command forks) stopped, then continued
tstp() {
	_n=$1
	shift
	/usr/bin/python3 - "$tmp/$_n" "$@" > "$tmp/$_n.out" 2>&1 <<'PY'
import os, signal, subprocess, sys, time
d, cmd = sys.argv[1], sys.argv[2:]
os.setsid()
p = subprocess.Popen(cmd, stdout=open(d + ".log", "w"), stderr=subprocess.STDOUT,
                     preexec_fn=lambda: os.setpgid(0, 0))
def state(pid):
    try:
        return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
def below(pid):
    try:
        kids = [int(x) for x in open("/proc/%d/task/%d/children" % (pid, pid)).read().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in below(k)]
def trains():
    try:
        return open(d + "/metrics.jsonl").read().count('"event":"train"')
    except OSError:
        return 0
def until(what, secs):
    end = time.time() + secs
    while time.time() < end and not what():
        time.sleep(0.05)
    return what()
if not until(lambda: trains() > 0 or p.poll() is not None, 120):
    print("training did not start"); p.kill(); sys.exit(1)
ranks = [int(x) for x in open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()]
procs = below(p.pid)
os.kill(p.pid, signal.SIGTSTP)
if until(lambda: all(state(x) == "T" for x in [p.pid] + procs), 20):
    n = trains(); time.sleep(1.5)
    print("stopped: the launcher and %d ranks (%d processes); train lines %d -> %d in 1.5 s" % (len(ranks), len(procs), n, trains()))
else:
    print("not stopped: launcher %s, below it %s" % (state(p.pid), " ".join(state(x) for x in procs)))
os.killpg(p.pid, signal.SIGCONT)
if until(lambda: all(state(x) not in ("T", "gone") for x in procs), 20):
    print("continued: every rank")
else:
    print("not continued: below it %s" % " ".join(state(x) for x in procs))
if os.environ.get("TSTP_KILL"):  # (its wrapper, a plain sh, dies of SIGTERM: tests/launch_group.sh)
    for x in [p.pid] + procs:
        try:
            os.kill(x, signal.SIGKILL)
        except OSError:
            pass
    p.wait(); print("rc=killed"); sys.exit(0)
os.kill(p.pid, signal.SIGTERM)
try:
    print("rc=%d" % p.wait(timeout=120))
except subprocess.TimeoutExpired:
    p.kill(); p.wait(); print("rc=timeout")
PY
	cat "$tmp/$_n.out"
	grep -q "^stopped: the launcher and 2 ranks" "$tmp/$_n.out" || bad "$_n: Ctrl-Z: the ranks did not stop with the launcher"
	grep -q "^continued: every rank" "$tmp/$_n.out" || bad "$_n: Ctrl-Z: SIGCONT did not continue the ranks"
	[ -n "${TSTP_KILL:-}" ] || stopped "$_n" "$(sed -n 's/^rc=//p' "$tmp/$_n.out")"
	grep -q "kiln launch: SIGTSTP (Ctrl-Z): stopping the ranks too" "$tmp/$_n.log" ||
		bad "$_n: Ctrl-Z: the launcher did not say it stops the ranks"
}
tstp tstp "$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/tstp" $long
# a rank command that forks the trainer (a wrapper: sh -c, timeout, a
# profiler): the rank's whole group stops (before the review of session
# 32 only the wrapper did, and the trainer trained on)
TSTP_KILL=1 tstp tstpw "$kiln" launch -n 2 -- sh -c '"$@"; exit $?' sh "$kiln" train "$tmp/mlp.ini" \
	run.out_dir="$tmp/tstpw" $long
exit $fail
