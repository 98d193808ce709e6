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
#  3. a rank ignoring SIGTERM after the other failed: killed when --grace 1
#     runs out (the deadline wakes the launcher), exit 5 naming rank 0;
#  4. SIGTERM to the launcher reaches both ranks (each writes a mark and
#     exits 0): the launcher exits 0.
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
