#!/usr/bin/python3
"""bench/anchors.sh's summary: one markdown table for one benchmark.

  anchors_table.py [--phase-threshold PCT] BENCH FILE.jsonl LOAD_NOTE [GEMM_PEAK_GFLOPS...]
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

The host's phase (docs/PERFORMANCE.md, "Session 48: anchors.sh's phase
probe").  A run's line may carry probe_before and probe_after: GFLOP/s a
CPU-second of a short GEMM (bench/gemm_peak --n 1024) just before and just
after the run.  Per run, "phase changed" when the two differ by more than
the threshold (the larger over the smaller, less 1), else "slow phase" when
their mean is more than the threshold below the benchmark's fastest probe,
else "ok"; "no probe" without them; "-" for a failed run.  Where no run has
probes (--no-probe, older files) the table is as it was before them: none
of the columns and lines below.  The threshold (PHASE_T, or
--phase-threshold) is set from the probe's own repeat noise.  Per row, beside
the raw median ratio: the phase-matched ratio, the median over the
repetitions whose kiln run and row run had all four probes within the
threshold of each other (one phase, both runs steady) of kiln's rate over
the row's in that repetition, with how many repetitions qualified; and the
probe-normalised ratio, the median of rate / mean probe over the runs that
are not "phase changed", kiln's over the row's, which assumes a row's rate
scales with the probe's across phases.  The raw columns are unchanged."""
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


# a run's probes disagree, or sit below the fastest, beyond this fraction
# (the larger over the smaller, less 1): the probe's repeat noise under
# load 4-9 (session 48, other helpers building) was 9-12% over minutes,
# 23-26% with a lone high probe (a pair with one is left unmatched: a pair
# lost, no bias); the slow phase, ~1.5x, is 50%
PHASE_T = 0.20


def spread(v):
    """the largest over the smallest, less 1"""
    return max(v) / min(v) - 1


def probes(r):
    """a run's (before, after) probe, or None"""
    b, a = r.get("probe_before"), r.get("probe_after")
    return (b, a) if b and a else None


def phase(r, top, t):
    """a run's phase label against the fastest probe `top` ("-": failed)"""
    if "failed" in r:
        return "-"
    p = probes(r)
    if not p:
        return "no probe"
    if spread(p) > t:
        return "phase changed"
    if top / statistics.mean(p) - 1 > t:
        return "slow phase"
    return "ok"


def matched_pairs(kruns, runs, key, t):
    """(kiln's rate / the row's) of each repetition whose kiln run and row
    run both have probes, all four within t of each other; and how many
    repetitions both ran (ok)"""
    kby = {r.get("rep"): r for r in kruns if "failed" not in r}
    out, both = [], 0
    for r in runs:
        k = kby.get(r.get("rep"))
        if "failed" in r or not k or not r[key]:
            continue
        both += 1
        pk, pr = probes(k), probes(r)
        if pk and pr and spread(pk + pr) <= t:
            out.append(k[key] / r[key])
    return out, both


def normalised(runs, key, t):
    """the median of rate / mean probe over the runs not 'phase changed'"""
    return median([r[key] / statistics.mean(probes(r)) for r in runs
                   if "failed" not in r and probes(r) and spread(probes(r)) <= t])


def threshold(pct):
    """--phase-threshold's PCT as a fraction; a clear error (exit 2) unless
    it is a plain non-negative number"""
    try:
        t = float(pct) / 100
    except ValueError:
        t = -1.0
    if not 0 <= t < float("inf"):  # (nan fails too)
        print(f"anchors_table.py: --phase-threshold is a percentage such as 15 or 12.5, not "
              f"'{pct}'", file=sys.stderr)
        sys.exit(2)
    return t


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


def phase_ratios(name, rows, kname, key, t, norm):
    """kiln / NAME (kiln's row kname) phase-matched, "2.00x (2 of 3)" (of
    the repetitions that ran both), and probe-normalised, "2.03x": the
    table's cells and the summary's line"""
    m, both = matched_pairs(rows.get(kname, []), rows[name], key, t)
    mc = f"{median(m):.2f}x ({len(m)} of {both})" if m else f"none (0 of {both})"
    nk, nr = norm.get(kname), norm.get(name)
    return mc, f"{nk / nr:.2f}x" if nk and nr else "n/a"


def phase_cells(name, rows, kname, key, top, t, norm):
    """a row's probe, phase and phase ratio cells"""
    runs = rows[name]
    pr = ", ".join(f"{p[0]:.1f}/{p[1]:.1f}" if p else "-" for p in map(probes, runs))
    ph = ", ".join(phase(r, top, t) for r in runs)
    if name.startswith("kiln"):
        return f" {pr} | {ph} |  |  |"
    return " {} | {} | {} | {} |".format(pr, ph, *phase_ratios(name, rows, kname, key, t, norm))


def phase_line(name, rows, kname, key, t, norm):
    """the summary's phase-matched and probe-normalised kiln / NAME"""
    return ("  - the same, phase-matched (repetitions): {}; probe-normalised: {}"
            .format(*phase_ratios(name, rows, kname, key, t, norm)))


def main():
    if sys.argv[1] == "--steady":
        steady(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    args, t = sys.argv[1:], PHASE_T
    if args[0] == "--phase-threshold":
        t, args = threshold(args[1]), args[2:]
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
    top = max([p for runs in rows.values() for r in runs for p in probes(r) or ()], default=None)
    norm = {name: normalised(runs, key, t) for name, runs in rows.items()}
    flops = FLOPS.get(bench)
    print(f"\n### {bench}\n")
    print(f"{load.strip(';').replace(';', ', ')}; GEMM peak {fmt(peak, 1)} GFLOP/s\n")
    head = "| row | samples/s | runs | kiln / row | compile s (run 1; median) |"
    if bench == "gpt":
        head += " tokens/s |"
    if flops:
        head += (" direct-equivalent GFLOP/s (a) (% of GEMM peak) |" if bench in DIRECT_EQ
                 else " GFLOP/s (% of GEMM peak) |")
    if top:  # (no run with probes: --no-probe, older files: the table as before)
        head += (" probe GFLOP/s a CPU-s, before/after | phase | kiln / row, phase-matched "
                 "(repetitions) | kiln / row, probe-normalised |")
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
        print(line + (phase_cells(name, rows, kname, key, top, t, norm) if top else ""))
    if flops and bench in DIRECT_EQ:
        print(f"\n(a) samples/s x {flops:,} FLOPs a sample, its convolutions counted as "
              "direct ones; kiln runs conv2 by FFT (fewer operations; `[plugin.cpu] conv_algo "
              "= rule`: f32, and bf16 where oneDNN has no bf16 kernel or fft16.c runs the widened op), so its figure is the "
              "rate a direct convolution would need, not the FFT's own, and can pass the "
              "GEMM peak")
    if top:
        print(f"\nPhase: `bench/gemm_peak --n 1024` GFLOP/s a CPU-second before and after each "
              f"run (the probe after a run is the probe before the next); the fastest "
              f"{top:.1f}; threshold {100 * t:.0f}%: \"phase changed\" when a run's two "
              f"probes differ by more, \"slow phase\" when their mean is more below the "
              f"fastest.  Phase-matched: the median of kiln / row over the repetitions whose "
              f"two runs' four probes agree within the threshold.  Probe-normalised: "
              f"rate / mean probe, medians over the runs not \"phase changed\" (assumes a "
              f"row's rate scales with the probe's)")
    for name, f in fails.items():
        for why in sorted(set(f)):
            print(f"\n{name} failed: {why}")

    def best(names):
        have = [(med[n], n) for n in names if med.get(n)]
        return max(have) if have else (None, None)

    print()
    if bench == "data":
        for n in ("t2-dataloader", "t113-dataloader"):
            if kiln and med.get(n):
                print(f"- kiln / {LABEL[n]}: **{kiln / med[n]:.2f}x**")
        return
    if med.get("kiln-async0") and med.get("kiln-async1"):
        auto = ("sync or async by the model's size and a probe of contention at the plan, async under "
                "contention (docs/distributed.md, item 6)") if bench.startswith("ddp-") else "off"
        print(f"- `[plugin.cpu] async` 1 / 0: **{med['kiln-async1'] / med['kiln-async0']:.2f}x** "
              f"(the default, auto, is {auto} here)")
    b2, n2 = best(["t2-eager-default", "t2-eager-passive", "t2-eager-omp1", "t2-compile",
                   "t2-compile-max"])
    b113, n113 = best(["t113-default", "t113-passive", "t113-omp1"])
    if kiln and b2:
        print(f"- kiln / best of PyTorch 2.x eager and compile ({n2}): **{kiln / b2:.2f}x** "
              f"(target >= 1.3x)")
        if top:
            print(phase_line(n2, rows, kname, key, t, norm))
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
            print(phase_line(n113, rows, kname, key, t, norm))


if __name__ == "__main__":
    main()
