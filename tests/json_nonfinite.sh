#!/bin/sh
# tests/json_nonfinite.sh - the JSON lines kiln's commands print have null
# where a number is not finite (cli/kiln.c cli_json_num): JSON has no inf
# or NaN, and printf's "inf" broke the line for every parser.  Before
# session 36 `kiln bench data` printed samples_per_s and mb_per_s with %.1f
# and %.2f: a window timed at 0 s gave "samples_per_s": inf.
#
# The LD_PRELOAD shim (tests/shim_fault.c, SHIM_CLOCK_STOP) stops
# CLOCK_MONOTONIC (every call returns the same time): kiln bench data's
# window is 0 s, its rates are null, and the line parses as JSON.
name=json_nonfinite
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source synthetic

shim_build || { cat "$tmp/shim.err"; fail "cannot build the clock shim"; }

ini_bench_data samples=64 image_size=8 image_channels=1 classes=10 workers=0 >"$tmp/bd.ini"
last="bench data (CLOCK_MONOTONIC stopped)"
SHIM_CLOCK_STOP=1 LD_PRELOAD="$shim" timeout -k 5 120 "$kiln" bench data "$tmp/bd.ini" --batches 2 \
	>"$out" 2>"$err" || fail "kiln bench data with the clock stopped: exit $?"
grep -q '"samples_per_s": null, "mb_per_s": null,' "$out" ||
	fail "the rates of a 0 s window are not null: $(cat "$out")"
/usr/bin/python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$out" ||
	fail "kiln bench data's line is not JSON: $(cat "$out")"
echo "ok: a 0 s window's rates are null and the line is JSON"
