#!/bin/sh
# tests/jsonl_paths.sh - metrics.jsonl's records that carry a path
# (checkpoint, best, stopped) when [run] out_dir is not UTF-8 (a Latin-1
# name): json_pack's "s" refused the bytes and the record was dropped
# without a word before session 37 (a resume looks for the checkpoint
# record); each byte that is not UTF-8 is now U+FFFD, and the file stays
# valid JSON; the out_dir_lost record's lines_lost too (session 40).
name=jsonl_paths
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$tmp/mlp.ini"
{
	ini run threads=1
	ini_tr_cnn_mlp "$data"
	ini train batch=8 epochs=1 max_steps=4 log_every=2 checkpoint_every=2 eval_every=2 keep_best=1
} >"$ini"
rd="$(printf '%s/r_lat\351in' "$tmp")"
kiln 0 train "$ini" "run.out_dir=$rd"
for ev in checkpoint best; do
	n=$(grep -c "\"event\":\"$ev\"" "$rd/metrics.jsonl")
	[ "$n" -ge 1 ] || fail "no $ev record in metrics.jsonl of a Latin-1 out_dir"
done
if command -v python3 >/dev/null; then
	python3 - "$rd/metrics.jsonl" <<'PYEOF' || fail "metrics.jsonl is not UTF-8 JSON, or the path is not U+FFFD in place of the byte"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
paths = [r["path"] for r in recs if r.get("event") == "checkpoint"]
assert paths and all("r_lat\ufffdin/checkpoints/ckpt-" in p for p in paths), paths
PYEOF
fi

# the out_dir_lost record's "lines_lost" (the failed copy's message, which
# names the recreated metrics.jsonl) in such a directory: swapped mid-run
# (renameat2's RENAME_EXCHANGE: atomic) for one whose metrics.jsonl is in
# the way of the copy; U+FFFD for the byte (before session 40 it was
# packed with "s": the record was left out, "could not be made")
rd2="$(printf '%s/g_lat\351in' "$tmp")"
mkdir "$rd2.new" && : >"$rd2.new/metrics.jsonl" || fail "cannot lay out $rd2.new"
"$kiln" train "$ini" train.epochs=1000000 train.max_steps=0 train.log_every=1 train.eval=0 \
	train.keep_best=0 "run.out_dir=$rd2" >"$tmp/gone.out" 2>"$tmp/gone.err" &
pid=$!
wait_line $pid "$rd2/metrics.jsonl" '"event":"train"' "the run whose out_dir is swapped" "$tmp/gone.err"
python3 - "$rd2" "$rd2.new" <<'PYEOF' || { kill $pid; fail "renameat2 RENAME_EXCHANGE failed"; }
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
if libc.renameat2(-100, a, -100, b, 2):  # AT_FDCWD, RENAME_EXCHANGE
    sys.exit(os.strerror(ctypes.get_errno()))
PYEOF
wait $pid
rc=$?
[ $rc -eq 4 ] || { tail -5 "$tmp/gone.err"; fail "out_dir swapped mid-run: exit $rc, expected 4"; }
! grep -q "could not be made" "$tmp/gone.err" ||
	fail "a metrics.jsonl record was left out: $(grep 'could not be made' "$tmp/gone.err")"
python3 - "$rd2/metrics.jsonl" <<'PYEOF' || fail "no out_dir_lost record whose lines_lost names the recreated metrics.jsonl with U+FFFD"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
lost = [r for r in recs if r.get("event") == "out_dir_lost"]
assert len(lost) == 1, lost
assert lost[0]["out_dir"].endswith("g_lat\ufffdin"), lost
assert "g_lat\ufffdin/metrics.jsonl: cannot write: File exists" in lost[0]["lines_lost"], lost
PYEOF
echo "ok: out_dir_lost's lines_lost in a Latin-1 out_dir"
echo "PASS: 2 runs"
