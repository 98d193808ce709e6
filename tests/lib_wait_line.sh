#!/bin/sh
# tests/lib_wait_line.sh - tests/lib.sh's wait_line when its time runs out:
# the background job it waits on is `timeout` over `kiln launch -n 2` whose
# ranks never write the line (each a shell that records its PID in a file,
# then becomes `sleep 600` with SIGHUP ignored: `kiln launch` gives its
# ranks a parent-death SIGHUP, which would end a plain sleep however the
# launcher died, while a real rank takes it as a graceful stop and runs on).  wait_line, with wait_line_s = 1, fails the
# test (run in a subshell here: it exits 1, not killed, as the test script
# above the job is not) after killing the job's whole tree: `timeout`, the
# launcher and both ranks are gone.  Before session 47 it killed `timeout`
# alone (SIGKILL, which `timeout` cannot pass on): the launcher and its
# ranks ran on, here for 600 s.
name=lib_wait_line
. "$(dirname "$0")/lib.sh"
command -v pgrep > /dev/null || { echo "SKIP: no pgrep (procps)"; exit 77; }

# gone PID: no such process, or a zombie its parent has not reaped yet
gone() {
	! kill -0 "$1" 2> /dev/null || [ "$(ps -o stat= -p "$1" | cut -c1)" = Z ]
}

timeout 600 "$kiln" launch -n 2 -- sh -c 'trap "" HUP; echo $$ >> "$0"; exec sleep 600' "$tmp/ranks" \
	> "$tmp/job.log" 2>&1 &
job=$!
for _ in $(seq 300); do
	[ -f "$tmp/ranks" ] && [ "$(wc -l < "$tmp/ranks")" = 2 ] && break
	sleep 0.1
done
ranks=$(cat "$tmp/ranks" 2> /dev/null)
launcher=$(pgrep -P "$job")
[ "$(echo $ranks | wc -w)" = 2 ] && [ -n "$launcher" ] ||
	{ job_kill "$job"; fail "the job did not start its launcher and 2 ranks: $(cat "$tmp/job.log")"; }

( wait_line_s=1; wait_line "$job" "$tmp/never" "a line" "the self-check" "$tmp/job.log" ) \
	> "$tmp/wl.out" 2>&1
rc=$?
sed 's/^/wait_line said: /' "$tmp/wl.out"
[ $rc = 1 ] || { job_kill "$job"; fail "wait_line's time out: exit $rc, 1 expected (the test failing, not killed)"; }
grep -qF "FAIL: the self-check: no 'a line' in $tmp/never within 1 s" "$tmp/wl.out" ||
	fail "wait_line's time out: not its message"
wait "$job"
still=
for p in $launcher $ranks; do
	for _ in $(seq 50); do gone "$p" && break; sleep 0.1; done # (reaped by init)
	gone "$p" || still="$still $p"
done
[ -z "$still" ] || {
	kill -9 $still 2> /dev/null
	fail "after wait_line's time out the job's processes$still (of launcher $launcher, ranks $(echo $ranks)) still ran"
}
echo "ok: wait_line's time out killed the job: timeout ($job), kiln launch ($launcher), its ranks ($(echo $ranks)); the test script ran on"

# 2. The test shell ended in the middle of job_kill's walk: a tree of a
# shell and its `sleep`, walked by job_kill in a subshell whose pgrep is
# slowed (1 s, a stand-in on PATH), so that a SIGTERM lands after the
# shell was stopped and before the kill.  The stopped shell is killed (the
# walk's trap).  Before session 48 the walk ran in a command
# substitution's subshell, which the SIGTERM to the test shell did not
# end: the shell stayed stopped (state T) for good.
mkdir "$tmp/slow"
printf '#!/bin/sh\nsleep 1\nexec %s "$@"\n' "$(command -v pgrep)" > "$tmp/slow/pgrep"
chmod +x "$tmp/slow/pgrep"
sh -c 'sleep 600 & echo $! > "$0"; wait' "$tmp/leaf" &
root=$!
for _ in $(seq 50); do [ -s "$tmp/leaf" ] && break; sleep 0.1; done
leaf=$(cat "$tmp/leaf")
( PATH="$tmp/slow:$PATH"; job_kill "$root" ) &
walker=$!
for _ in $(seq 50); do
	[ "$(ps -o stat= -p "$root" | cut -c1)" = T ] && break
	sleep 0.02
done
[ "$(ps -o stat= -p "$root" | cut -c1)" = T ] ||
	{ kill -9 "$root" "$leaf" "$walker"; fail "job_kill's walk did not stop $root"; }
kill -TERM "$walker"
wait "$walker"
sleep 1.5 # (the old walk's subshell ran on after the test shell's end)
state=$(ps -o stat= -p "$root" | cut -c1)
kill -9 "$leaf" 2> /dev/null
if [ "$state" = T ]; then
	kill -9 "$root"
	fail "the test shell ended in job_kill's walk: process $root stayed stopped"
fi
gone "$root" || { kill -9 "$root"; fail "the test shell ended in job_kill's walk: $root runs on (state $state)"; }
echo "ok: the test shell ended in job_kill's walk: the stopped $root was killed"

# 3. job_kill restores its caller's traps of HUP, INT and TERM (a subshell
# that traps INT and ignores HUP, its `trap` listing the same before and
# after job_kill of a `sleep`).  Before session 48 job_kill reset all
# three to the default after its walk.
sleep 600 &
victim=$!
(
	trap 'echo caller INT' INT
	trap '' HUP
	trap > "$tmp/traps.before"
	job_kill "$victim"
	trap > "$tmp/traps.after"
)
wait "$victim" 2> /dev/null
gone "$victim" || { kill -9 "$victim"; fail "job_kill left its caller's $victim running"; }
grep -qF "caller INT" "$tmp/traps.before" || fail "the caller's INT trap was not listed: $(cat "$tmp/traps.before")"
cmp -s "$tmp/traps.before" "$tmp/traps.after" ||
	fail "job_kill changed its caller's traps: before: $(cat "$tmp/traps.before"); after: $(cat "$tmp/traps.after")"
echo "ok: job_kill kept its caller's traps: $(tr '\n' ';' < "$tmp/traps.after")"
