#!/bin/sh
# tests/stop_setup.sh - kiln train never hangs in setup (session 30).
#  1. a config that is a FIFO no one writes: refused at once, naming it
#     (fopen waited for a writer for ever);
#  2. run files in out_dir that are FIFOs (metrics.jsonl; train.csv with
#     log.csv=1; config.ini's temporary file; profile.txt with
#     run.profile=1): refused at once, naming the file (fopen waited for
#     a reader for ever);
#  3. a stop (SIGTERM) while setup is blocked where no stop is looked for
#     (here reading a config from a pipe whose writer never closes it) ends
#     the process by the signal within 5 s: there is nothing to checkpoint
#     yet (it said "stop requested" and went on waiting for ever).
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
for f in metrics.jsonl train.csv config.ini.tmp profile.txt; do
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
exec 3>&-
[ "$rc" = 143 ] || fail "SIGTERM during a blocked setup: exit $rc, expected 143 (killed by SIGTERM)"
grep -q "stop requested before the first step: nothing to checkpoint" "$tmp/held.log" ||
	fail "SIGTERM during a blocked setup: no message: $(cat "$tmp/held.log")"
[ "$ms" -lt 8000 ] || fail "SIGTERM during a blocked setup: ended after $ms ms, expected about 5 s"
echo "SIGTERM during a blocked setup: ended in $ms ms, exit $rc"
echo PASS
