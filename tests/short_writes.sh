#!/bin/sh
# tests/short_writes.sh - kiln pack's stamps in place (a token shard's
# header ints 3..6, cli/pack_tokens.c split_stamp; a records shard's set
# block, plugins/loaders/records_write.c rec_shard_stamp) are whole writes:
# a pwrite() that fails with EINTR or writes part of what it was asked is
# retried (plugins/common/write_full.h).  Before session 36 each was one
# pwrite() compared with its size, and the pack failed with "cannot write".
#
# The LD_PRELOAD shim (tests/shim_fault.c, SHIM_PWRITE_CUT) makes every
# other pwrite() of more than one byte fail with EINTR and the others write half: kiln pack of tokens and of
# records (Fashion-MNIST's first 64 images) succeeds, and the token shards'
# headers hold 1, the shard's index, the shard count.
name=short_writes
. "$(dirname "$0")/lib.sh"
need_source tokens

shim_build || { cat "$tmp/shim.err"; fail "cannot build the pwrite shim"; }

i=0
while [ $i -lt 200 ]; do
	echo "the quick brown fox jumps over the lazy dog $i times; a stitch in time saves nine."
	i=$((i + 1))
done >"$tmp/corpus.txt"
last="pack --format tokens (pwrite shim)"
SHIM_PWRITE_CUT=1 LD_PRELOAD="$shim" "$kiln" pack --format tokens "$tmp/corpus.txt" --out "$tmp/tok" \
	--val-fraction 0.1 >"$out" 2>"$err" || fail "kiln pack --format tokens under short pwrites: exit $?"
n=0
for f in "$tmp"/tok/*; do
	case $f in *.bin) ;; *) continue ;; esac
	# ints 3..5 (little-endian int32 at byte 12): 1, index, count
	set -- $(od -An -t d4 -j 12 -N 12 "$f")
	[ "${1:-}" = 1 ] || fail "$f: header int 3 is '${1:-}', expected 1 (the stamp)"
	n=$((n + 1))
done
[ $n -ge 2 ] || fail "kiln pack --format tokens wrote $n shard(s), expected 2 or more"
echo "ok: kiln pack --format tokens stamps $n shards under short pwrites"

if "$kiln" plugins 2>/dev/null | grep -q "^source  *records .*available" && [ -d "$FM" ]; then
	printf '[data]\nsource = idx\npath = %s\nlimit = 64\n' "$FM" >"$tmp/pack.ini"
	last="pack (records, pwrite shim)"
	SHIM_PWRITE_CUT=1 LD_PRELOAD="$shim" "$kiln" pack "$tmp/pack.ini" --out "$tmp/rec" >"$out" 2>"$err" ||
		fail "kiln pack (records) under short pwrites: exit $?"
	[ -s "$tmp/rec/train-00000.krec" ] || fail "no records shard"
	echo "ok: kiln pack (records) stamps its shard under short pwrites"
else
	echo "(records: no records source or no Fashion-MNIST; that half not run)"
fi
