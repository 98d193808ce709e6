#!/usr/bin/python3
"""bench/anchors.sh's summary: one markdown table for one benchmark.

  anchors_table.py BENCH FILE.jsonl LOAD_NOTE [GEMM_PEAK_GFLOPS...]
  anchors_table.py --steady METRICS.jsonl WARM BATCH JSON_LINE
    (kiln's line with its steady rate, see steady())

FILE holds one JSON line per run (bench/anchors.sh adds row, rep, run_wall_s and
run_samples to the benchmark's own line, or "failed").  Prints each row's
median samples/s over its runs, the runs, kiln / row, the compile time (run 1,
whose cache was cold, and the median), GFLOP/s against the best GEMM peak
(the CNN's direct-equivalent: its convolutions counted as direct ones, which
kiln's FFT conv2 is not; see DIRECT_EQ), and the ratios issue 22 asks for.

The two Lightning ratios (kiln's whole run and kiln's fit, each over
Lightning's fit) take every kiln figure from ONE kiln run: the median run by
whole-run rate (samples / the process's wall time; of an even count the
lower middle), whose rep the line names.  Its fit rate, set-up and rest of
the process are that run's, so whole run = set-up + fit + rest holds in the
figures printed; before, each was a median over the runs on its own and could
come from different runs.  Lightning's side of both ratios is the table's
median of its fit rate (its samples/s column), the same divisor for both.

The vCPUs' placement (docs/PERFORMANCE.md, "Session 49: the anchors'
placement probe").  A run's line may carry c2c_before and c2c_after (ns of
bench/c2c_latency --rounds 1 just before and after the run; null when the
probe failed) and its placement: "fast" (both under c2c_fast_ns, the
threshold bench/common.sh's C2C_FAST_NS set), "slow" (neither), "mixed",
"no probe".  Where any run has one the table adds each run's probes and
placement ("-" for a failed run), each row's median over its fast runs with
how many of its runs that finished were fast ("73,554 (7 of 8 fast)"), and
kiln / row over fast runs only (kiln's fast median over the row's); each
summary ratio gets a fast-runs line under it.  The medians over all runs
are unchanged; where no run has a placement (--no-probe, files from before
it, session 48's GEMM probe) the table is as it was before: none of the
columns and lines.  fast_median() is shared with bench/lstm.sh."""
import json
import statistics
import sys

# training FLOPs per sample (a multiply-add = 2): bench/mlp.sh, bench/cnn.sh;
# the GPT: 6 x the 819,200 weights of its matmuls (the tied lm_head's
# included) per token x 128 tokens, plus attention's QK^T and AV over the
# full 128 x 128 (3 x 2 x 2 x T x T x C per layer, the causal half not
# subtracted), 4 layers
FLOPS = {"mlp": 2407424, "cnn-nchw": 82049024, "cnn-nhwc": 82049024, "cnn-bf16": 82049024,
         "gpt": 6 * 819200 * 128 + 4 * 3 * 2 * 2 * 128 * 128 * 128}
FLOPS.update({"ddp-mlp": FLOPS["mlp"], "ddp-cnn": FLOPS["cnn-nchw"],
              "ddp-cnn-nhwc": FLOPS["cnn-nhwc"]})
# The CNN's FLOPs are a direct convolution's; kiln runs conv2 by FFT
# (plugins/cpu/fftconv.c, [plugin.cpu] conv_algo = rule; bf16 only where
# oneDNN has no bf16 kernel), which does fewer, so its GFLOP/s is a
# direct-equivalent rate and can pass the GEMM peak: labelled so.
DIRECT_EQ = ("cnn-nchw", "cnn-nhwc", "cnn-bf16", "ddp-cnn", "ddp-cnn-nhwc")
ORDER = ("kiln", "kiln-async0", "kiln-async1", "t2-eager-default", "t2-eager-passive", "t2-eager-omp1", "t2-compile",
         "t2-compile-max", "t2-lightning", "t113-default", "t113-passive", "t113-omp1",
         "kiln-folder", "t2-dataloader", "t113-dataloader")
LABEL = {"kiln": "**kiln**", "kiln-async0": "kiln, `plugin.cpu.async=0`",
         "kiln-async1": "kiln, `plugin.cpu.async=1`", "t2-eager-default": "PyTorch 2.x eager, default OpenMP",
         "t2-eager-passive": "PyTorch 2.x eager, `OMP_WAIT_POLICY=PASSIVE`",
         "t2-eager-omp1": "PyTorch 2.x eager, 1 thread (per rank in DDP)",
         "t2-compile": "PyTorch 2.x `torch.compile` (default)",
         "t2-compile-max": "PyTorch 2.x `torch.compile` (max-autotune-no-cudagraphs)",
         "t2-lightning": "Lightning `Trainer.fit` (whole fit)",
         "t113-default": "PyTorch 1.13, default OpenMP",
         "t113-passive": "PyTorch 1.13, `OMP_WAIT_POLICY=PASSIVE`",
         "t113-omp1": "PyTorch 1.13, 1 thread (per rank in DDP)",
         "kiln-folder": "**kiln** folder loader (libjpeg-turbo)",
         "t2-dataloader": "PyTorch 2.x DataLoader (torchvision ImageFolder)",
         "t113-dataloader": "PyTorch 1.13 DataLoader (torchvision ImageFolder)"}


def placed(runs):
    """whether any run carries a placement (anchors.sh without --no-probe)"""
    return any("placement" in r for r in runs)


def fast_median(runs, key):
    """(the median of key over the finished runs placed "fast" (None when
    none), how many were fast, how many finished)"""
    ok = [r for r in runs if "failed" not in r and r.get(key) is not None]
    fast = [r[key] for r in ok if r.get("placement") == "fast"]
    return median(fast), len(fast), len(ok)


def fast_cell(runs, key):
    """"73,554 (7 of 8 fast)": the median over the fast runs, and the count"""
    m, nf, n = fast_median(runs, key)
    return f"{fmt(m)} ({nf} of {n} fast)"


def ns(v):
    """a probe's ns as c2c_latency printed it (one decimal, none when .0)"""
    return "-" if v is None else f"{v:g}"


def place_cells(name, rows, key, kfast):
    """a row's probe, placement, fast-median and fast-ratio cells"""
    runs = rows[name]
    pr = ", ".join(f"{ns(r.get('c2c_before'))}/{ns(r.get('c2c_after'))}" for r in runs)
    pl = ", ".join("-" if "failed" in r else r.get("placement", "no probe") for r in runs)
    m = fast_median(runs, key)[0]
    ratio = "" if name.startswith("kiln") else (f"{kfast / m:.2f}x" if kfast and m else "n/a")
    return f" {pr} | {pl} | {fast_cell(runs, key)} | {ratio} |"


def fast_line(name, rows, kname, key):
    """the summary's line under a ratio: kiln / NAME over fast runs only"""
    k, r = fast_median(rows.get(kname, []), key)[0], fast_median(rows[name], key)[0]
    ratio = f"**{k / r:.2f}x**" if k and r else "n/a"
    return (f"  - fast runs only: kiln {fast_cell(rows.get(kname, []), key)} / {name} "
            f"{fast_cell(rows[name], key)}: {ratio}")


def median(v):
    return statistics.median(v) if v else None


def whole_rate(r):
    """samples / the process's wall time, start-up included"""
    return r["run_samples"] / r.get("run_wall_s", r.get("wall_s"))


def median_run(runs, rate):
    """the run whose rate is the median (of an even count the lower middle):
    one run, so that figures taken from it belong together; None when none"""
    rs = sorted(runs, key=rate)
    return rs[(len(rs) - 1) // 2] if rs else None


def fmt(v, nd=0):
    return "n/a" if v is None else f"{v:,.{nd}f}"


def steady(path, warm, batch, line):
    """anchors.sh's kiln line with train_samples_per_s the rate of the
    steps after the first `warm`, from the times of metrics.jsonl's train
    lines (logged every `warm` steps); the old rate, which counts the
    warm-up, as kiln_all_steps_per_s.  Exits 1 when there are too few."""
    pts, final = {}, {}
    for ln in open(path):
        r = json.loads(ln) if ln.strip() else {}
        if r.get("event") == "train" and "time" in r:
            pts[int(r["step"])] = float(r["time"])
        if r.get("event") == "final":
            final = r
    last = max(pts, default=0)
    if warm not in pts or last <= warm or pts[last] <= pts[warm]:
        sys.exit(1)
    out = json.loads(line)
    out["kiln_all_steps_per_s"] = out.get("train_samples_per_s")
    out["train_samples_per_s"] = (last - warm) * batch / (pts[last] - pts[warm])
    out["timed_steps"] = last - warm
    for k in ("setup_s", "fit_s"):  # kiln's set-up; first step to the end
        if k in final:
            out[k] = final[k]
    print(json.dumps(out))


def lightning_fast_line(rows, key):
    """the Lightning ratios (kiln's whole run and its fit, each over
    Lightning's fit) from fast runs only: kiln's median fast run by whole
    rate, Lightning's median over its fast runs"""
    kf = median_run([r for r in rows.get("kiln", []) if "failed" not in r and r.get("run_samples")
                     and r.get("placement") == "fast"], whole_rate)
    lt = fast_median(rows["t2-lightning"], key)[0]
    out = (f"  - fast runs only: kiln's median fast run by whole rate "
           f"({'run ' + str(kf.get('rep', '?')) if kf else 'none'}) / Lightning's fit "
           f"{fast_cell(rows['t2-lightning'], key)}: ")
    if not (kf and lt):
        return out + "n/a"
    out += f"whole run **{whole_rate(kf) / lt:.2f}x**"
    if kf.get("fit_s"):
        out += f", fit **{kf['run_samples'] / kf['fit_s'] / lt:.2f}x**"
    return out


def main():
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    if first == "--phase-threshold" or first.startswith("--phase-threshold="):
        # session 48's docs ran it so on kept files
        print("anchors_table.py: --phase-threshold was removed in session 49: the GEMM "
              "probe's phases gave way to the placement probe (docs/PERFORMANCE.md, "
              "\"Session 49: the anchors' placement probe\"); run it without the flag: "
              "anchors_table.py BENCH FILE.jsonl LOAD_NOTE", file=sys.stderr)
        sys.exit(2)
    if first == "--steady":
        steady(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    args = sys.argv[1:]
    bench, path, load = args[:3]
    peak = max([float(p) for p in args[3:]] + [0.0]) or None
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            rows.setdefault(r["row"], []).append(r)
    key = "samples_per_s" if bench == "data" else "train_samples_per_s"
    med, whole, comp, fails = {}, {}, {}, {}
    for name, runs in rows.items():
        ok = [r for r in runs if "failed" not in r]
        fails[name] = [r["failed"] for r in runs if "failed" in r]
        med[name] = median([r[key] for r in ok])
        whole[name] = median([whole_rate(r) for r in ok if r.get("run_samples")])
        cs = [r["compile_s"] for r in ok if "compile_s" in r]
        comp[name] = (cs[0], median(cs)) if cs else None
    kiln = med.get("kiln") or med.get("kiln-folder")
    kname = "kiln" if med.get("kiln") else "kiln-folder"
    top = placed([r for runs in rows.values() for r in runs])
    kfast = fast_median(rows.get(kname, []), key)[0]
    fast_ns = max([r.get("c2c_fast_ns", 0) for runs in rows.values() for r in runs] + [0])
    flops = FLOPS.get(bench)
    print(f"\n### {bench}\n")
    print(f"{load.strip(';').replace(';', ', ')}; GEMM peak {fmt(peak, 1)} GFLOP/s\n")
    head = "| row | samples/s | runs | kiln / row | compile s (run 1; median) |"
    if bench == "gpt":
        head += " tokens/s |"
    if flops:
        head += (" direct-equivalent GFLOP/s (a) (% of GEMM peak) |" if bench in DIRECT_EQ
                 else " GFLOP/s (% of GEMM peak) |")
    if top:  # (no run with a placement: --no-probe, older files: the table as before)
        head += (" c2c ns before/after | placement | samples/s, fast runs | "
                 "kiln / row, fast runs |")
    print(head)
    print("|---|" + "---:|" * (head.count(" |") - 1))
    for name in sorted(rows, key=lambda n: ORDER.index(n) if n in ORDER else 99):
        runs = ", ".join("failed" if "failed" in r else f"{r[key]:,.0f}" for r in rows[name])
        ratio = f"{kiln / med[name]:.2f}x" if kiln and med[name] and not name.startswith("kiln") else ""
        c = comp[name]
        cs = f"{c[0]:.1f}; {c[1]:.1f}" if c and name.startswith("t2-compile") else ""
        line = f"| {LABEL.get(name, name)} | {fmt(med[name])} | {runs} | {ratio} | {cs} |"
        if bench == "gpt":
            line += f" {fmt(med[name] and med[name] * 128)} |"
        if flops:
            g = med[name] and med[name] * flops / 1e9
            line += f" {fmt(g, 1)}" + (f" ({100 * g / peak:.0f}%)" if g and peak else "") + " |"
        print(line + (place_cells(name, rows, key, kfast) if top else ""))
    if flops and bench in DIRECT_EQ:
        print(f"\n(a) samples/s x {flops:,} FLOPs a sample, its convolutions counted as "
              "direct ones; kiln runs conv2 by FFT (fewer operations; `[plugin.cpu] conv_algo "
              "= rule`: f32, and bf16 where oneDNN has no bf16 kernel or fft16.c runs the widened op), so its figure is the "
              "rate a direct convolution would need, not the FFT's own, and can pass the "
              "GEMM peak")
    if top:
        print(f"\nPlacement: `bench/c2c_latency --rounds 1`, one cache line's round trip between "
              f"CPU 0 and CPU 1, in ns before and after each run (the probe after a run is the "
              f"probe before the next): \"fast\" when both are under {fast_ns:g} ns (the two "
              f"vCPUs sharing an L3), \"slow\" when neither is (on two CCDs, or a CPU "
              f"shared with other processes), \"mixed\" otherwise, \"no probe\" when one "
              f"failed.  Fast runs: the median over a row's fast runs (how many of its "
              f"finished runs were fast), and kiln's fast median over the row's")
    for name, f in fails.items():
        for why in sorted(set(f)):
            print(f"\n{name} failed: {why}")

    def best(names):
        have = [(med[n], n) for n in names if med.get(n)]
        return max(have) if have else (None, None)

    def best_fast(names, other):
        """the row of the best median over fast runs (else `other`)"""
        have = [(fast_median(rows[n], key)[0], n) for n in names if n in rows]
        have = [h for h in have if h[0]]
        return max(have)[1] if have else other

    print()
    if bench == "data":
        for n in ("t2-dataloader", "t113-dataloader"):
            if kiln and med.get(n):
                print(f"- kiln / {LABEL[n]}: **{kiln / med[n]:.2f}x**")
                if top:
                    print(fast_line(n, rows, kname, key))
        return
    if med.get("kiln-async0") and med.get("kiln-async1"):
        auto = ("sync or async by the model's size and a probe of contention at the plan, async under "
                "contention (docs/distributed.md, item 6)") if bench.startswith("ddp-") else "off"
        print(f"- `[plugin.cpu] async` 1 / 0: **{med['kiln-async1'] / med['kiln-async0']:.2f}x** "
              f"(the default, auto, is {auto} here)")
    n2s = ["t2-eager-default", "t2-eager-passive", "t2-eager-omp1", "t2-compile", "t2-compile-max"]
    n113s = ["t113-default", "t113-passive", "t113-omp1"]
    b2, n2 = best(n2s)
    b113, n113 = best(n113s)
    if kiln and b2:
        print(f"- kiln / best of PyTorch 2.x eager and compile ({n2}): **{kiln / b2:.2f}x** "
              f"(target >= 1.3x)")
        if top:
            print(fast_line(best_fast(n2s, n2), rows, kname, key))
    lt = med.get("t2-lightning")
    kr = median_run([r for r in rows.get("kiln", []) if "failed" not in r and r.get("run_samples")],
                    whole_rate)
    if kr and lt:
        print(f"- kiln whole run (samples / the process's wall time, start-up included: "
              f"{fmt(whole_rate(kr))}, kiln's median run by this rate: run {kr.get('rep', '?')}) / "
              f"Lightning's whole fit: **{whole_rate(kr) / lt:.2f}x** (target >= 2x); Lightning "
              f"counted from its own process start (median): "
              f"{fmt(whole.get('t2-lightning'))} samples/s")
    if kr and lt and kr.get("fit_s") and "setup_s" in kr:
        fit = kr["run_samples"] / kr["fit_s"]
        rest = kr["run_wall_s"] - kr["setup_s"] - kr["fit_s"]
        print(f"- like for like, kiln's fit (its first step to its final checkpoint written, "
              f"as Lightning's fit: neither validates, both checkpoint once; the same kiln "
              f"run {kr.get('rep', '?')}): {fmt(fit)} samples/s, / Lightning's fit: "
              f"**{fit / lt:.2f}x** (target >= 2x); that run's set-up before it (config, "
              f"device, data, model, loaders) {kr['setup_s']:.2f} s, the rest of its process "
              f"(start, plugins, exit) {rest:.2f} s")
    if top and lt:
        print(lightning_fast_line(rows, key))
    ref = sorted({n for n in rows if n.startswith("t113") for r in rows[n]
                  if any("/blas/libblas" in b for b in r.get("blas", []))})
    if ref:
        print(f"- **{', '.join(ref)} ran on the reference BLAS** (/usr/lib/.../blas/libblas.so.3, "
              f"no OpenBLAS installed): not PyTorch 1.13's best; scripts/install-deps --bench "
              f"installs libopenblas0-pthread")
    if kiln and b113:
        want = {"mlp": " (target >= 1.7x)", "cnn-nchw": " (target >= 2x)",
                "cnn-nhwc": " (target >= 2x)"}.get(bench, "")
        print(f"- kiln / PyTorch 1.13 best ({n113}): **{kiln / b113:.2f}x**{want}")
        if top:
            print(fast_line(best_fast(n113s, n113), rows, kname, key))


if __name__ == "__main__":
    main()
