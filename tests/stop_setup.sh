#!/bin/sh
# tests/stop_setup.sh - kiln train never hangs in setup (session 30).
#  1. a config that is a FIFO no one writes: refused at once, naming it
#     (fopen waited for a writer for ever);
#  2. run files in out_dir that are FIFOs (metrics.jsonl; train.csv with
#     log.csv=1; config.ini (its temporary's name is unique since session
#     33, and a FIFO config.ini is written straight to); profile.txt with
#     run.profile=1): refused at once, naming the file (fopen waited for
#     a reader for ever);
#  3. a stop (SIGTERM) while setup is blocked where no stop is looked for
#     (here reading a config from a pipe whose writer never closes it) ends
#     the process by the signal within 5 s: there is nothing to checkpoint
#     yet (it said "stop requested" and went on waiting for ever);
#  4. the same as PID 1 of a PID namespace (a container without --init;
#     needs `unshare -p`, else skipped with a message): exit 143 within
#     14 s, about 5 (the kernel drops a default-action signal sent to a namespace's
#     init, so the raise() returned and the stop thread spun, a core busy,
#     the process never ending; session 32);
#  5. a repeat 4.3 s after the first stop, the first sent late in its
#     CLOCK_MONOTONIC second (0.85): ignored ("a repeat within 5 s"), the
#     process ends by the timer 5 s after the first (the grace was counted
#     in whole seconds: the repeat ended it at 4.3 s; session 32).
name=stopsetup
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
data=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ ! -r "$data" ]; then
	echo "SKIP: Fashion-MNIST missing (scripts/install-deps)"
	exit 77
fi
{
	ini run seed=1 threads=1
	ini_fmnist path=/usr/share/datasets/fashion-mnist limit=64
	ini_layers f:flatten fc:linear:out=10 loss:softmax_xent
	ini train epochs=1 batch=32 max_steps=2
} > "$tmp/run.ini"

# ---- 1. a FIFO config ----------------------------------------------------
mkfifo "$tmp/fifo.ini"
timeout -s KILL 20 "$kiln" train "$tmp/fifo.ini" > "$tmp/f.log" 2>&1
rc=$?
[ "$rc" = 2 ] || { cat "$tmp/f.log"; fail "FIFO config: exit $rc, expected 2 (137: hung)"; }
grep -q "fifo.ini: cannot open config: it is a FIFO with nothing to read (no writer)" "$tmp/f.log" ||
	{ cat "$tmp/f.log"; fail "FIFO config: the error does not name it"; }
echo "a FIFO config: refused at once"

# ---- 2. FIFO run files -----------------------------------------------------
for f in metrics.jsonl train.csv config.ini profile.txt; do
	mkdir -p "$tmp/o-$f"
	mkfifo "$tmp/o-$f/$f"
	timeout -s KILL 20 "$kiln" train "$tmp/run.ini" run.out_dir="$tmp/o-$f" log.csv=1 run.profile=1 \
		> "$tmp/r.log" 2>&1
	rc=$?
	[ "$rc" = 1 ] || { tail -3 "$tmp/r.log"; fail "a FIFO $f: exit $rc, expected 1 (137: hung)"; }
	grep -q "o-$f/$f: cannot write: it is a FIFO, not a regular file" "$tmp/r.log" ||
		{ tail -3 "$tmp/r.log"; fail "a FIFO $f: the error does not name it"; }
	echo "a FIFO $f in out_dir: refused at once"
done

# ---- 3. SIGTERM while setup is blocked --------------------------------------
# the shell holds the FIFO open read-write: kiln's read waits for ever
mkfifo "$tmp/held.ini"
exec 3<>"$tmp/held.ini"
"$kiln" train "$tmp/held.ini" > "$tmp/held.log" 2>&1 &
pid=$!
# until the stop thread is there (a SIGTERM before it kills at once)
for i in $(seq 100); do
	grep -qx kiln-signals /proc/$pid/task/*/comm 2>/dev/null && break
	sleep 0.1
done
sleep 0.5
t0=$(date +%s%N)
kill -TERM $pid
for i in $(seq 150); do
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
if kill -0 $pid 2>/dev/null; then
	kill -KILL $pid
	wait $pid
	fail "SIGTERM during a blocked setup: still running $ms ms later: $(cat "$tmp/held.log")"
fi
wait $pid
rc=$?
[ "$rc" = 143 ] || fail "SIGTERM during a blocked setup: exit $rc, expected 143 (killed by SIGTERM)"
grep -q "stop requested before the first step: nothing to checkpoint" "$tmp/held.log" ||
	fail "SIGTERM during a blocked setup: no message: $(cat "$tmp/held.log")"
# about 5 s; on a machine loaded past 4 runnable threads a CPU (a CI round
# beside other work: 11.3 s at a load of 17 on 2 CPUs, session 36) up to
# 12 s, still short of the 15-s hang this checks for
limit=8000
load=$(cut -d. -f1 /proc/loadavg 2>/dev/null)
[ "${load:-0}" -lt $((4 * $(nproc))) ] || limit=12000
[ "$ms" -lt $limit ] ||
	fail "SIGTERM during a blocked setup: ended after $ms ms, expected about 5 s (at most $limit ms at load $load)"
echo "SIGTERM during a blocked setup: ended in $ms ms, exit $rc"

# held_stop LOG GAP CMD...: start CMD (kiln train held.ini, perhaps under
# unshare), output to LOG; once kiln's stop thread is there, SIGTERM it at
# 0.85 of a CLOCK_MONOTONIC second, and again GAP s later (GAP 0: once);
# prints "rc=RC ms=MS" (RC as a shell reports it; MS since the first
# signal; rc=timeout after 15 s, kiln then killed, its threads' CPU time
# printed)
held_stop() {
	/usr/bin/python3 - "$@" <<'PY'
import os, signal, subprocess, sys, time
log, gap, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
def children(pid):
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and int(open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out
def has_stop_thread(pid):
    try:
        return any(open("/proc/%d/task/%s/comm" % (pid, t)).read().strip() == "kiln-signals"
                   for t in os.listdir("/proc/%d/task" % pid))
    except OSError:
        return False
# kiln: the process itself, or unshare's child
pid, end = None, time.time() + 60
while time.time() < end and p.poll() is None:
    for c in [p.pid] + children(p.pid):
        if has_stop_thread(c):
            pid = c
    if pid:
        break
    time.sleep(0.1)
if pid is None:
    p.kill(); p.wait()
    print("rc=nostart ms=0"); sys.exit()
time.sleep(0.5)
time.sleep((0.85 - time.monotonic() % 1) % 1)
t1 = time.monotonic()
os.kill(pid, signal.SIGTERM)
if gap > 0:
    time.sleep(max(0.0, gap - (time.monotonic() - t1)))
    os.kill(pid, signal.SIGTERM)
try:
    rc = p.wait(timeout=15 - (time.monotonic() - t1))
except subprocess.TimeoutExpired:
    for t in os.listdir("/proc/%d/task" % pid):
        st = open("/proc/%d/task/%s/stat" % (pid, t)).read().rsplit(")", 1)[1].split()
        print("  thread %s: %d CPU ticks" % (open("/proc/%d/task/%s/comm" % (pid, t)).read().strip(),
                                            int(st[11]) + int(st[12])))
    os.kill(pid, signal.SIGKILL); p.wait()
    print("rc=timeout ms=15000"); sys.exit()
ms = int(1000 * (time.monotonic() - t1))
print("rc=%d ms=%d" % (128 - rc if rc < 0 else rc, ms))
PY
}

# ---- 4. the same as PID 1 of a PID namespace ---------------------------------
if unshare -p -f --mount-proc true 2>/dev/null; then
	res=$(held_stop "$tmp/pid1.log" 0 unshare -p -f --mount-proc "$kiln" train "$tmp/held.ini")
	echo "$res" | grep -q "^rc=143 " ||
		fail "SIGTERM to kiln as PID 1 during a blocked setup: $res, expected rc=143 (exit by it) within 14 s: $(cat "$tmp/pid1.log")"
	ms=${res##*ms=}
	# (the failure this catches never ends: the harness kills it at 15 s;
	# a loaded machine took 9.7 s in a CI run of session 32)
	[ "$ms" -lt 14000 ] || fail "SIGTERM to kiln as PID 1: ended after $ms ms, expected about 5 s"
	echo "SIGTERM to kiln as PID 1 during a blocked setup: ended in $ms ms, exit 143"
else
	echo "SKIP part 4: unshare -p -f --mount-proc fails here (not root, or no user namespaces): kiln as PID 1 not checked"
fi

# ---- 5. a repeat 4.3 s after the first, late in its second ---------------------
res=$(held_stop "$tmp/repeat.log" 4.3 "$kiln" train "$tmp/held.ini")
exec 3>&-
grep -q "stop already requested (a repeat within 5 s is ignored)" "$tmp/repeat.log" ||
	fail "a repeat 4.3 s after the first stop was not ignored ($res): $(cat "$tmp/repeat.log")"
ms=${res##*ms=}
# (the lower bound is the point: the old code ended at the repeat, 4.3 s;
# the upper one leaves a loaded machine room)
echo "$res" | grep -q "^rc=143 " && [ "$ms" -ge 4900 ] && [ "$ms" -lt 14000 ] ||
	fail "a repeat 4.3 s after the first stop: $res, expected rc=143 5 s after the first: $(cat "$tmp/repeat.log")"
echo "a repeat 4.3 s after the first stop: ignored; ended by the timer $ms ms after the first"
echo PASS
