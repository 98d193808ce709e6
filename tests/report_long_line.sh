#!/bin/sh
# tests/report_long_line.sh - kiln report reads metrics.jsonl a line of at
# most 1 MiB at a time (cli/report.h REPORT_LINE_MAX): a longer line is
# skipped as a bad line and noted in the report, and memory stays bounded.
# Before session 36 getline() read a 20 MB line whole, and jansson parsed
# it again (a file without newlines: all of it in memory, twice).
#
# A metrics.jsonl of a train line, a valid 20 MB train line (a string
# field of 20,000,000 bytes) and another train line: the report plots the
# two short lines' losses, says "1 longer than 1 MiB: skipped", and kiln
# report's peak RSS stays under 20 MB more than a report of the short lines
# alone.
name=report_long_line
. "$(dirname "$0")/lib.sh"

small="$tmp/small" big="$tmp/big"
mkdir "$small" "$big"
line() { printf '{"event":"train","epoch":1,"step":%d,"loss":%s}\n' "$1" "$2"; }
{ line 1 2.5; line 3 1.5; } >"$small/metrics.jsonl"
{
	line 1 2.5
	printf '{"event":"train","epoch":1,"step":2,"loss":2.0,"pad":"'
	head -c 20000000 /dev/zero | tr '\0' x
	printf '"}\n'
	line 3 1.5
} >"$big/metrics.jsonl"

rss() { # rss DIR: kiln report DIR's peak resident set, KiB (0: GNU time missing)
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f '%M' -o "$tmp/rss" "$kiln" report "$1" >"$out" 2>"$err" ||
			fail "kiln report $1: exit $?: $(tail -3 "$err")"
		tail -1 "$tmp/rss"
	else
		"$kiln" report "$1" >"$out" 2>"$err" || fail "kiln report $1: exit $?: $(tail -3 "$err")"
		echo 0
	fi
}
[ -x /usr/bin/time ] || echo "(no /usr/bin/time: peak RSS not checked)"
base=$(rss "$small")
peak=$(rss "$big")
n=$(grep -o '<circle class="pt" data-series="train.loss"' "$big/report.html" | wc -l)
[ "$n" -eq 2 ] || fail "train.loss has $n points, expected 2 (the long line skipped)"
grep -q "metrics.jsonl: 3 lines (1 longer than 1 MiB: skipped)" "$big/report.html" ||
	fail "the report does not note the long line: $(grep -o 'metrics.jsonl: [^<]*' "$big/report.html")"
[ $((peak - base)) -lt 20000 ] ||
	fail "kiln report's peak RSS: $peak KiB with the 20 MB line, $base KiB without (over 20 MB more)"
echo "ok: a 20 MB line skipped and noted; peak RSS $peak KiB (without it $base KiB)"

# a file of no newline at all: one bad line, the report written
head -c 20000000 /dev/zero | tr '\0' x >"$big/metrics.jsonl"
peak=$(rss "$big")
grep -q "metrics.jsonl: 1 lines (1 longer than 1 MiB: skipped)" "$big/report.html" ||
	fail "newline-free file: $(grep -o 'metrics.jsonl: [^<]*' "$big/report.html")"
[ $((peak - base)) -lt 20000 ] || fail "newline-free file: peak RSS $peak KiB (without it $base KiB)"
echo "ok: a newline-free 20 MB metrics.jsonl: one bad line; peak RSS $peak KiB"
