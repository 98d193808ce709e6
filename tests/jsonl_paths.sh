#!/bin/sh
# tests/jsonl_paths.sh - metrics.jsonl's records that carry a path
# (checkpoint, best, stopped) when [run] out_dir is not UTF-8 (a Latin-1
# name): json_pack's "s" refused the bytes and the record was dropped
# without a word before session 37 (a resume looks for the checkpoint
# record); each byte that is not UTF-8 is now U+FFFD, and the file stays
# valid JSON.
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
echo "PASS: 1 run"
