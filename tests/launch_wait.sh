#!/bin/sh
# tests/launch_wait.sh - `kiln launch` sleeps between events (cli/cmd_launch.c
# launch_wait: blocked in ppoll until SIGCHLD, a forwarded signal or the
# grace deadline), and still does all it did when it polled every 20 ms.
# Ranks are shell commands (no plugin needed).  Asserts:
#  1. while 2 ranks run, the launcher wakes almost never: under 20
#     voluntary context switches in 2 s (the 20 ms poll made ~100);
#  2. a rank exiting 3 while the other sleeps: the other is stopped at
#     once, the launcher exits 3 naming rank 1, in seconds (not --grace);
#  2b. rank 1 exiting 1 before rank 0 exits 3: rank 0 and exit 3 reported
#     (a config or data error is the cause a peer's plain failure follows);
#  2c. the same with rank 0's exit 4 (kiln train's code for a run
#     directory lost mid-run): exit 4 and rank 0 named (before session 34
#     only 2 and 3 counted as a cause: exit 1, rank 1 named);
#  2d. rank 1 says it failed of its own error (the line kiln train writes
#     to KILN_LAUNCH_WHY_FD, cli/launch.h LAUNCH_FAILED_LINE) and exits 1
#     0.6 s later (a trainer's teardown); rank 0, which saw it (through
#     the store, in kiln), exits 1 at once: rank 1 named, quoted, and
#     rank 0 said to follow from it (before session 39: "rank 0 failed",
#     the first reaped; tests/dist_config_oom.sh's sweep saw it);
#  3. a rank ignoring SIGTERM after the other failed: killed when --grace 1
#     runs out (the deadline wakes the launcher), exit 5 naming rank 0;
#  4. SIGTERM to the launcher reaches both ranks (each writes a mark and
#     exits 0): the launcher exits 0;
#  5. ranks that are a plain `sh -c` wrapper (no exec, so it dies of
#     SIGTERM) around a "trainer" that takes SIGTERM, stops in 1.5 s and
#     exits 0: SIGTERM to the launcher: it reports each rank stopped, not
#     failed, waits for the trainers, and exits 0 (before session 34:
#     "rank 0 failed with signal 15", exit 1, at once, the trainers still
#     running); a trainer below that exits 7 instead fails its rank: exit
#     7, named;
#  6. a rank failing during a stop passed on (SIGTERM to the launcher, rank
#     1 exits 3 6 s on): the other rank, still stopping (a "trainer" that
#     ends at once at a second SIGTERM, as kiln train does 5 s after its
#     first), gets no SIGTERM, stops and exits 0; the launcher exits 3
#     naming rank 1 (before session 36 it sent rank 0 a SIGTERM, which
#     ended it at once, without its checkpoint).
name=launch_wait
. "$(dirname "$0")/lib.sh"

ctxt() { sed -n 's/^voluntary_ctxt_switches:[[:space:]]*//p' "/proc/$1/status"; }

# ---- 1. asleep between events ---------------------------------------------
"$kiln" launch -n 2 --bind none -- sh -c 'sleep 4' >"$tmp/1.log" 2>&1 &
lp=$!
sleep 1
c0=$(ctxt $lp)
sleep 2
c1=$(ctxt $lp)
wait $lp || { cat "$tmp/1.log"; fail "1: kiln launch of two sleeps exited $?"; }
[ -n "$c0" ] && [ -n "$c1" ] || fail "1: no /proc/$lp/status"
[ $((c1 - c0)) -lt 20 ] || fail "1: the launcher woke $((c1 - c0)) times in 2 s (want < 20: no polling)"
echo "ok 1: the launcher woke $((c1 - c0)) times in 2 s while its ranks ran"

# ---- 2. a failed rank stops the other at once -------------------------------
t0=$(date +%s)
"$kiln" launch -n 2 --bind none -- sh -c '[ "$KILN_RANK" = 1 ] && { sleep 0.3; exit 3; }; exec sleep 60' \
	>"$tmp/2.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0))
[ $rc = 3 ] || { cat "$tmp/2.log"; fail "2: kiln launch exited $rc, want 3"; }
grep -q 'kiln launch: error: rank 1 failed (exit status 3)' "$tmp/2.log" ||
	{ cat "$tmp/2.log"; fail "2: rank 1 not named"; }
[ "$dt" -lt 8 ] || fail "2: the launcher took $dt s to stop after rank 1 failed (--grace 10)"
echo "ok 2: rank 1's exit 3 ended the job in $dt s, named"

# ---- 2b. the cause named, not the rank that ended first ----------------------
# rank 1 exits 1 at once (as a rank does whose peer went away), rank 0 a
# moment later with a data error (exit 3): the launcher names rank 0 and
# exits 3 (session 29; it named rank 1 and exited 1)
# (rank 1 ends once rank 0 ignores SIGTERM: the launcher's SIGTERM must
# not reach rank 0 before its trap is set)
"$kiln" launch -n 2 --bind none -- \
	sh -c "trap '' TERM; if [ \"\$KILN_RANK\" = 1 ]; then
		i=0; until [ -e $tmp/2b.armed ] || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i + 1)); done; exit 1
	fi; echo > $tmp/2b.armed; sleep 0.6; exit 3" >"$tmp/2b.log" 2>&1
rc=$?
[ $rc = 3 ] || { cat "$tmp/2b.log"; fail "2b: kiln launch exited $rc, want 3 (rank 0's data error)"; }
grep -q 'kiln launch: error: rank 0 failed (exit status 3); rank 1, which ended first, followed from it' "$tmp/2b.log" ||
	{ cat "$tmp/2b.log"; fail "2b: rank 0's data error is not the one named"; }
echo "ok 2b: rank 0's exit 3 named, though rank 1's exit 1 came first"

# ---- 2c. a cause of exit 4 (the run directory lost) ---------------------------
"$kiln" launch -n 2 --bind none -- \
	sh -c "trap '' TERM; if [ \"\$KILN_RANK\" = 1 ]; then
		i=0; until [ -e $tmp/2c.armed ] || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i + 1)); done; exit 1
	fi; echo > $tmp/2c.armed; sleep 0.6; exit 4" >"$tmp/2c.log" 2>&1
rc=$?
[ $rc = 4 ] || { cat "$tmp/2c.log"; fail "2c: kiln launch exited $rc, want 4 (rank 0's own code)"; }
grep -q 'kiln launch: error: rank 0 failed (exit status 4); rank 1, which ended first, followed from it' "$tmp/2c.log" ||
	{ cat "$tmp/2c.log"; fail "2c: rank 0's exit 4 is not the one named"; }
echo "ok 2c: rank 0's exit 4 named, though rank 1's exit 1 came first"

# ---- 2d. the rank that said its failure was its own, not the first reaped ----
"$kiln" launch -n 2 --bind none -- \
	sh -c "trap '' TERM; if [ \"\$KILN_RANK\" = 1 ]; then
		echo \"kiln-failed 1 rank 1 of 2: out of memory\" >&\$KILN_LAUNCH_WHY_FD; echo > $tmp/2d.said
		sleep 0.6; exit 1
	fi; i=0; until [ -e $tmp/2d.said ] || [ \$i -ge 300 ]; do sleep 0.05; i=\$((i + 1)); done; exit 1" \
	>"$tmp/2d.log" 2>&1
rc=$?
[ $rc = 1 ] || { cat "$tmp/2d.log"; fail "2d: kiln launch exited $rc, want 1"; }
grep -q 'kiln launch: rank 0 (pid [0-9]*) failed with exit status 1' "$tmp/2d.log" ||
	{ cat "$tmp/2d.log"; fail "2d: rank 0 did not end first (the case is not set up)"; }
grep -q '^kiln launch: error: rank 1 failed (exit status 1); rank 0, which ended first, followed from it; rank 1 said: rank 1 of 2: out of memory$' "$tmp/2d.log" ||
	{ cat "$tmp/2d.log"; fail "2d: rank 1, which said its failure was its own, is not the one named"; }
echo "ok 2d: rank 1's own failure named and quoted, though rank 0's exit came first"

# ---- 3. the grace deadline ---------------------------------------------------
t0=$(date +%s)
"$kiln" launch -n 2 --bind none --grace 1 -- \
	sh -c 'trap "" TERM; [ "$KILN_RANK" = 0 ] && { sleep 0.3; exit 5; }; exec sleep 60' >"$tmp/3.log" 2>&1
rc=$?
dt=$(($(date +%s) - t0))
[ $rc = 5 ] || { cat "$tmp/3.log"; fail "3: kiln launch exited $rc, want 5"; }
grep -q 'did not exit within 1 s: killing them' "$tmp/3.log" ||
	{ cat "$tmp/3.log"; fail "3: no kill after the grace period"; }
grep -q 'rank 0 failed (exit status 5)' "$tmp/3.log" || { cat "$tmp/3.log"; fail "3: rank 0 not named"; }
[ "$dt" -lt 15 ] || fail "3: the launcher took $dt s with --grace 1"
echo "ok 3: the rank that ignored SIGTERM was killed at the deadline ($dt s)"

# ---- 4. a signal passed on ---------------------------------------------------
# each rank marks itself ready once its trap is set; SIGTERM after both are
"$kiln" launch -n 2 --bind none -- \
	sh -c "trap 'echo \$KILN_RANK > $tmp/term.\$KILN_RANK; kill \$p; exit 0' TERM; sleep 60 & p=\$!
		echo > $tmp/ready.\$KILN_RANK; wait" >"$tmp/4.log" 2>&1 &
lp=$!
i=0
until [ -e "$tmp/ready.0" ] && [ -e "$tmp/ready.1" ]; do
	i=$((i + 1))
	[ $i -le 600 ] || { kill -KILL $lp; cat "$tmp/4.log"; fail "4: the ranks did not start within 60 s"; }
	sleep 0.1
done
kill -TERM $lp
wait $lp
rc=$?
[ $rc = 0 ] || { cat "$tmp/4.log"; fail "4: kiln launch exited $rc after SIGTERM, want 0"; }
[ -s "$tmp/term.0" ] && [ -s "$tmp/term.1" ] || { cat "$tmp/4.log"; fail "4: a rank did not get SIGTERM"; }
grep -q 'passing Terminated to every rank' "$tmp/4.log" || { cat "$tmp/4.log"; fail "4: not passed on"; }
echo "ok 4: SIGTERM to the launcher reached both ranks; exit 0"

# ---- 5. a wrapper that dies of the signal passed on ------------------------
# wrapped CODE: 2 ranks, each `sh -c 'sh -c TRAINER; echo'` (the outer
# shell waits in the foreground and dies of SIGTERM), the trainer taking
# SIGTERM and exiting CODE 1.5 s later, marking its end; SIGTERM to the
# launcher once both are ready.  The launcher's exit code into $rc.
wrapped() {
	rm -f "$tmp"/ready.* "$tmp"/done.*
	"$kiln" launch -n 2 --bind none -- sh -c "sh -c 'trap \"sleep 1.5; echo > $tmp/done.\$KILN_RANK; exit $1\" TERM
		echo > $tmp/ready.\$KILN_RANK; while :; do sleep 0.1; done'; echo wrapper: done" >"$tmp/5.$1.log" 2>&1 &
	_lp=$!
	_i=0
	until [ -e "$tmp/ready.0" ] && [ -e "$tmp/ready.1" ]; do
		_i=$((_i + 1))
		[ $_i -le 600 ] || { kill -KILL $_lp; fail "5: the ranks did not start within 60 s"; }
		sleep 0.1
	done
	kill -TERM $_lp
	wait $_lp
	rc=$?
	[ -e "$tmp/done.0" ] && [ -e "$tmp/done.1" ] ||
		{ cat "$tmp/5.$1.log"; fail "5: kiln launch exited before the trainers below its ranks ended"; }
}
wrapped 0
[ "$rc" = 0 ] || { cat "$tmp/5.0.log"; fail "5: kiln launch exited $rc after SIGTERM, want 0"; }
grep -q 'failed with' "$tmp/5.0.log" && { cat "$tmp/5.0.log"; fail "5: a rank reported failed"; }
[ "$(grep -c "kiln launch: rank [01] stopped: its command ended by Terminated, which this launcher passed on, and the processes below it exited 0" "$tmp/5.0.log")" = 2 ] ||
	{ cat "$tmp/5.0.log"; fail "5: the ranks are not both reported stopped"; }
grep -q 'wrapper: done' "$tmp/5.0.log" && fail "5: the wrapper did not die of SIGTERM (the test's premise)"
echo "ok 5: wrappers dead of SIGTERM, trainers exited 0: both ranks stopped, exit 0"
wrapped 7
[ "$rc" = 7 ] || { cat "$tmp/5.7.log"; fail "5: a trainer below exited 7: kiln launch exited $rc, want 7"; }
grep -q "kiln launch: rank [01] (its process group's pid [0-9]*) failed with exit status 7" "$tmp/5.7.log" ||
	{ cat "$tmp/5.7.log"; fail "5: the trainer's exit 7 is not named"; }
echo "ok 5: a trainer below a dead wrapper exiting 7 fails its rank: exit 7"

# ---- 6. a rank failing during a stop passed on --------------------------
# (rank 0 stops 9 s after the SIGTERM unless a second one ends it at once;
# rank 1 fails 6 s after it)
cat > "$tmp/6.sh" <<'EOS'
if [ "$KILN_RANK" = 1 ]; then
	trap 'sleep 6; echo "r1: exit 3"; exit 3' TERM
else
	trap 'stopping' TERM
fi
stopping() {
	trap 'echo "r0: ended at once by a second SIGTERM"; exit 143' TERM
	echo "r0: stopping"
	_i=0
	while [ $_i -lt 90 ]; do sleep 0.1; _i=$((_i + 1)); done
	echo "r0: stopped"
	exit 0
}
while :; do sleep 0.1; done
EOS
"$kiln" launch -n 2 --bind none -- sh "$tmp/6.sh" > "$tmp/6.log" 2>&1 &
lp=$!
sleep 1
kill -TERM $lp
wait $lp
rc=$?
[ "$rc" = 3 ] || { cat "$tmp/6.log"; fail "6: kiln launch exited $rc, want 3 (rank 1's)"; }
grep -q "r0: ended at once" "$tmp/6.log" &&
	{ cat "$tmp/6.log"; fail "6: rank 0, stopping, got a SIGTERM at rank 1's failure"; }
grep -q "r0: stopped" "$tmp/6.log" || { cat "$tmp/6.log"; fail "6: rank 0 did not stop"; }
grep -q "kiln launch: rank 1 (pid [0-9]*) failed with exit status 3; the other ranks, stopping already by the signal passed on, get 10 s, then SIGKILL" "$tmp/6.log" ||
	{ cat "$tmp/6.log"; fail "6: rank 1's failure not named so"; }
echo "ok 6: a rank failing during the stop: the other stops undisturbed, exit 3"
