#!/usr/bin/python3
"""What runs in each rank of a run, thread by thread (issue 21, session 19).

  rank_threads.py sample OUT PATTERN
      every 0.1 s, until no matching process is left (3 s) or 600 s: every
      thread of each process whose command line holds PATTERN and " train "
      (the ranks of `kiln launch ... -- kiln train PATTERN.ini`): its name,
      /proc/PID/task/TID/stat (minor faults, CPU), schedstat (CPU ns, ns
      runnable but waiting for a CPU: the runqueue wait, slices) and status
      (voluntary and involuntary switches); /proc/stat (steal) and
      /proc/loadavg.  JSON lines to OUT; start it beside the run.
  rank_threads.py threads OUT [SKIP]
      per rank, each thread's CPU ms, runqueue wait ms, wake-ups (slices),
      involuntary switches and last CPU, from the first sample after SKIP
      (default 0.3) of the process's life (start-up and the warm-up step
      left out) to its last; minor faults, steal.
  rank_threads.py steps LOG OUT [M]
      with a pipeline run's debug log (KILN_LOG_LEVEL=debug: "the ranks'
      stamps: step at T s: the stages' pass pairs", core/pipe_timing.c
      log_step; P = 2): per step, the stages' totals (wall, CPU), their
      signed spread, and each rank's busiest thread's (its stage's stream)
      runqueue wait over the step; then how the stages' wall difference
      follows the differences of their runqueue waits and CPU times.

Names: kiln's threads are kiln-stream-N (the CPU device's stream workers),
kiln-loader, kiln-heartbeat, kiln-store, kiln-watchdog, kiln-signals,
kiln-gemm-split; Gloo's TCP loop threads keep the process's name
(docs/pipeline.md; docs/PERFORMANCE.md, "Session 19: the pipeline's
per-step spread").
"""
import bisect
import json
import math
import os
import re
import statistics
import sys
import time


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def ranks(pattern):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            c = read(f"/proc/{d}/cmdline")
            if c and pattern in c and " train " in c.replace("\0", " ") and "rank_threads" not in c:
                out.append(int(d))
    return out


def threads_of(pid):
    th = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return th
    for tid in tids:
        s = read(f"/proc/{pid}/task/{tid}/stat")
        ss = read(f"/proc/{pid}/task/{tid}/schedstat")
        st = read(f"/proc/{pid}/task/{tid}/status")
        if not s or not ss or not st:
            continue
        r = s[s.rfind(")") + 2:].split()
        vol = nvol = 0
        for line in st.splitlines():
            if line.startswith("voluntary_ctxt"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt"):
                nvol = int(line.split()[1])
        a = ss.split()
        # name, minflt, utime + stime (ticks), last CPU, CPU ns, wait ns, slices, vol, nvol
        th[tid] = [s[s.find("(") + 1:s.rfind(")")], int(r[7]), int(r[11]) + int(r[12]), int(r[36]),
                   int(a[0]), int(a[1]), int(a[2]), vol, nvol]
    return th


def sample(out, pattern):
    seen, gone, t0 = False, None, time.time()
    with open(out, "w") as f:
        while time.time() - t0 < 600:
            pids = ranks(pattern)
            now = time.monotonic()
            if pids:
                seen, gone = True, None
            elif seen:
                gone = gone or now
                if now - gone > 3:
                    break
            rec = {"mono": now, "load": read("/proc/loadavg").split()[:3],
                   "cpus": [l.split() for l in read("/proc/stat").splitlines() if l.startswith("cpu")],
                   "p": {}}
            for pid in pids:
                env = read(f"/proc/{pid}/environ") or ""
                rank = [e[10:] for e in env.split("\0") if e.startswith("KILN_RANK=")]
                rec["p"][pid] = {"rank": rank[0] if rank else "?", "th": threads_of(pid)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            time.sleep(0.1)


def load(out):
    return [json.loads(l) for l in open(out)]


def steal(a, b):
    ca = {c[0]: c for c in a["cpus"]}
    cb = {c[0]: c for c in b["cpus"]}
    return {k: int(cb[k][8]) - int(ca[k][8]) for k in cb if k != "cpu" and k in ca}


def threads(out, skip):
    recs = load(out)
    life = {}
    for r in recs:
        for pid in r["p"]:
            life.setdefault(pid, [r["mono"], r["mono"]])[1] = r["mono"]
    for pid, (lo, hi) in sorted(life.items()):
        mine = [r for r in recs if pid in r["p"]]
        a = next(r for r in mine if r["mono"] >= lo + skip * (hi - lo))
        b = mine[-1]
        pa, pb = a["p"][pid], b["p"][pid]
        who = f"rank {pb['rank']}" if pb["rank"] != "?" else "no KILN_RANK (kiln launch, timeout)"
        print(f"{who} (pid {pid}): {b['mono'] - a['mono']:.2f} s, load {' '.join(a['load'])} -> "
              f"{' '.join(b['load'])}; steal ticks {steal(a, b)}; minor faults "
              f"{sum(x[1] for x in pb['th'].values()) - sum(x[1] for x in pa['th'].values())}")
        print(f"  {'tid':>7} {'name':16} {'CPU ms':>9} {'wait ms':>9} {'wake-ups':>8} {'invol':>6} {'cpu':>3}")
        for tid in sorted(pb["th"], key=int):
            x = pb["th"][tid]
            y = pa["th"].get(tid, [x[0], x[1], 0, x[3], 0, 0, 0, 0, 0])
            print(f"  {tid:>7} {x[0]:16} {(x[4] - y[4]) / 1e6:9.1f} {(x[5] - y[5]) / 1e6:9.1f} "
                  f"{x[6] - y[6]:8d} {x[8] - y[8]:6d} {x[3]:3d}")


def corr(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / sx / sy if sx and sy else float("nan")


def steps(log, out, M):
    pat = re.compile(r"the ranks' stamps: step at ([\d.]+) s: the stages' pass pairs, ms \(CPU\): "
                     r"([\d.]+) \(([\d.]+)\) ([\d.]+) \(([\d.]+)\)")
    st = [tuple(map(float, m.groups())) for m in map(pat.search, open(log)) if m]
    recs = load(out)
    mono = [r["mono"] for r in recs]
    # each rank's stage thread: its busiest over the run
    stage = {}
    for r in recs:
        for pid, p in r["p"].items():
            if p["th"]:
                stage[pid] = (p["rank"], max(p["th"].items(), key=lambda kv: kv[1][4])[0])

    def at(t):
        return recs[min(bisect.bisect_left(mono, t), len(recs) - 1)]

    def waits(a, b):
        q = {}
        for pid, (rk, tid) in stage.items():
            if tid in a["p"].get(pid, {}).get("th", {}) and tid in b["p"].get(pid, {}).get("th", {}):
                q[rk] = (b["p"][pid]["th"][tid][5] - a["p"][pid]["th"][tid][5]) / 1e6
        return q

    print(f"{'step':>4} {'at s':>10} {'wall 0':>7} {'wall 1':>7} {'CPU 0':>7} {'CPU 1':>7} {'spread':>7} "
          f"{'(CPU)':>7} {'wait 0':>7} {'wait 1':>7}")
    rows, sw, sc = [], [], []
    for k, (t, w0, c0, w1, c1) in enumerate(st):
        q = waits(at(t), at(st[k + 1][0])) if k + 1 < len(st) else {}
        sw.append(200 * (w0 - w1) / (w0 + w1))
        sc.append(200 * (c0 - c1) / (c0 + c1))
        print(f"{k:4d} {t:10.3f} {w0:7.2f} {w1:7.2f} {c0:7.2f} {c1:7.2f} {sw[-1]:+6.1f}% {sc[-1]:+6.1f}% "
              f"{q.get('0', float('nan')):7.1f} {q.get('1', float('nan')):7.1f}")
        if "0" in q and "1" in q:
            rows.append((M * (w0 - w1), M * (c0 - c1), q["0"] - q["1"]))
    if sw:
        print(f"mean |spread| wall {statistics.mean(map(abs, sw)):.1f}%, CPU {statistics.mean(map(abs, sc)):.1f}%; "
              f"stage 0 the slower in {sum(x > 0 for x in sw)} of {len(sw)} steps")
    if len(rows) > 2:
        dw, dc, dq = ([r[i] for r in rows] for i in range(3))
        print(f"stage 0 - stage 1, ms a step ({len(rows)} steps): wall against runqueue wait: correlation "
              f"{corr(dw, dq):.2f}, against CPU {corr(dw, dc):.2f}, against both {corr(dw, [a + b for a, b in zip(dq, dc)]):.2f}; "
              f"mean |difference| wall {statistics.mean(map(abs, dw)):.0f}, wait {statistics.mean(map(abs, dq)):.0f}, "
              f"CPU {statistics.mean(map(abs, dc)):.0f}")


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "sample":
        sample(a[1], a[2])
    elif len(a) in (2, 3) and a[0] == "threads":
        threads(a[1], float(a[2]) if len(a) > 2 else 0.3)
    elif len(a) in (3, 4) and a[0] == "steps":
        steps(a[1], a[2], int(a[3]) if len(a) > 3 else 8)
    else:
        sys.exit(__doc__)
