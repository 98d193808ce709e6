#!/usr/bin/env python3
"""tests/log_check.py MODE RUN_DIR [HIST_EVERY]: kiln's loggers against
RUN_DIR/metrics.jsonl, the record every logger writes from the same numbers.

  csv          train.csv and eval.csv: the header names the fields of the
               first train (eval) line, and row k holds the k-th train
               (eval) line's values, a resumed run's repeats included.
  tensorboard  the event files as TensorBoard's own EventAccumulator reads
               them: every scalar tag is "<train|val|test>/<field>", and at
               every step it equals metrics.jsonl's value (float32), after
               TensorBoard dropped what a resumed run redid (SessionLog
               START); with HIST_EVERY, weights/ and grads/ histograms at
               exactly the multiples of it.

Exit 0: equal; 1: the first difference is printed; 77: MODE tensorboard
without the tensorboard package (the reason is printed).
"""
import csv
import json
import math
import os
import struct
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def same(a, b, f32=False):
    """a equals b (metrics.jsonl's value, null for NaN): exactly (the CSV
    tables print the same round-trip digits; before session 37 a tolerance
    hid metrics.jsonl's 7 digits against the tables' 9), or, f32, b rounded
    to float32 (TensorBoard's scalars)."""
    if b is None:
        return a is None or math.isnan(a)
    if a is None:
        return False
    if f32:
        b = struct.unpack("<f", struct.pack("<f", b))[0]
    return a == b


def lines(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(s) for s in f if s.strip()]


def records(run, event):
    return [r for r in lines(run) if r["event"] == event]


def check_csv(run):
    for event in ("train", "eval"):
        recs = records(run, event)
        path = os.path.join(run, event + ".csv")
        if not recs:
            if os.path.exists(path):
                fail(f"{path} exists without {event} lines")
            continue
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        want = [k for k in recs[0] if k != "event"]
        if rows[0] != want:
            fail(f"{path}: header {rows[0]}, metrics.jsonl fields {want}")
        if len(rows) - 1 != len(recs):
            fail(f"{path}: {len(rows) - 1} rows, metrics.jsonl {len(recs)} {event} lines")
        for k, (row, rec) in enumerate(zip(rows[1:], recs)):
            for name, cell in zip(rows[0], row):
                v = rec.get(name)
                if name == "set":
                    ok = cell == v
                elif cell == "":
                    ok = v is None and name not in rec
                else:
                    ok = same(float(cell), v)
                if not ok:
                    fail(f"{path} row {k + 1} {name}: {cell!r}, metrics.jsonl {v!r}")
        print(f"ok: {path}: header and {len(recs)} rows equal metrics.jsonl")


def expected_scalars(run):
    """{tag: [(step, value)]} from metrics.jsonl, as TensorBoard shows it:
    a resume from step s drops what was logged after s."""
    series = {}
    for r in lines(run):
        if r["event"] == "resume":
            for tag in series:
                series[tag] = [(s, v) for s, v in series[tag] if s <= r["step"]]
        if r["event"] not in ("train", "eval"):
            continue
        group = r.get("set", r["event"])
        for k, v in r.items():
            if k not in ("event", "set", "step"):
                series.setdefault(f"{group}/{k}", []).append((r["step"], v))
    return series


def check_tensorboard(run, hist_every):
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except ImportError as e:
        print(f"SKIP: TensorBoard's Python package is not importable here ({e}); "
              "scripts/install-deps --bench installs it into a virtual environment")
        sys.exit(77)
    acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    want = expected_scalars(run)
    if sorted(tags["scalars"]) != sorted(want):
        fail(f"TensorBoard's scalar tags {sorted(tags['scalars'])}, metrics.jsonl's {sorted(want)}")
    n = 0
    for tag, series in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [s for s, _ in series]:
            fail(f"{tag}: TensorBoard's steps {[s for s, _ in got]}, metrics.jsonl's {[s for s, _ in series]}")
        for (step, a), (_, b) in zip(got, series):
            if not same(a, b, f32=True):
                fail(f"{tag} at step {step}: TensorBoard {a!r}, metrics.jsonl {b!r}")
            n += 1
    print(f"ok: {len(want)} scalar tags, {n} values equal metrics.jsonl")
    if hist_every:
        last = max(s for s, _ in want["train/loss"])
        steps = list(range(hist_every, last + 1, hist_every))
        hists = tags["histograms"]
        if not any(h.startswith("weights/") for h in hists) or not any(h.startswith("grads/") for h in hists):
            fail(f"histogram tags {hists}: weights/ and grads/ expected")
        for tag in hists:
            got = acc.Histograms(tag)
            if [h.step for h in got] != steps:
                fail(f"{tag}: histograms at {[h.step for h in got]}, expected {steps}")
            for h in got:
                v = h.histogram_value
                if v.num <= 0 or sum(v.bucket) != v.num or not v.min <= v.max:
                    fail(f"{tag} at {h.step}: num {v.num}, buckets sum {sum(v.bucket)}")
        print(f"ok: {len(hists)} histogram tags at steps {steps}")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("csv", "tensorboard"):
        print(__doc__)
        sys.exit(2)
    run = sys.argv[2]
    if sys.argv[1] == "csv":
        check_csv(run)
    else:
        check_tensorboard(run, int(sys.argv[3]) if len(sys.argv) > 3 else 0)


if __name__ == "__main__":
    main()
