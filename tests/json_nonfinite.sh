#!/bin/sh
# tests/json_nonfinite.sh - the JSON lines kiln's commands print have null
# where a number is not finite (cli/kiln.c cli_json_num): JSON has no inf
# or NaN, and printf's "inf" broke the line for every parser.  Before
# session 36 `kiln bench data` printed samples_per_s and mb_per_s with %.1f
# and %.2f: a window timed at 0 s gave "samples_per_s": inf.
#
# An LD_PRELOAD shim built here stops CLOCK_MONOTONIC (every call returns
# the same time): kiln bench data's window is 0 s, its rates are null, and
# the line parses as JSON.
name=json_nonfinite
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
CC=${CC:-cc}
need_source synthetic

cat >"$tmp/clock.c" <<'CEOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
int clock_gettime(clockid_t id, struct timespec *ts)
{
	int (*real)(clockid_t, struct timespec *) =
		(int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	if (id != CLOCK_MONOTONIC)
		return real(id, ts);
	ts->tv_sec = 1000;
	ts->tv_nsec = 0;
	return 0;
}
CEOF
$CC -shared -fPIC -o "$tmp/clock.so" "$tmp/clock.c" -ldl || fail "cannot build the clock shim"

ini_bench_data samples=64 image_size=8 image_channels=1 classes=10 workers=0 >"$tmp/bd.ini"
last="bench data (CLOCK_MONOTONIC stopped)"
LD_PRELOAD="$tmp/clock.so" timeout -k 5 120 "$kiln" bench data "$tmp/bd.ini" --batches 2 \
	>"$out" 2>"$err" || fail "kiln bench data with the clock stopped: exit $?"
grep -q '"samples_per_s": null, "mb_per_s": null,' "$out" ||
	fail "the rates of a 0 s window are not null: $(cat "$out")"
/usr/bin/python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$out" ||
	fail "kiln bench data's line is not JSON: $(cat "$out")"
echo "ok: a 0 s window's rates are null and the line is JSON"
