#!/usr/bin/python3
"""Reference learning-rate sequences for tests/check_sched.c and
tests/sched_torch.sh, from PyTorch's own schedulers: for each case, the
rate of optimizer steps 0..T-1, one line per case:

    NAME KIND T W BASE LR_MIN STEP_SIZE GAMMA PCT DIV FDIV START END ITERS POWER THREE ANNEAL MILESTONES... ; LR0 LR1 ...

KIND is kiln's [train] schedule; W the linear warmup in front (LinearLR from
1/W to 1 over W steps, chained with SequentialLR); START, END, ITERS and
POWER LinearLR's start_factor, end_factor, total_iters and PolynomialLR's
total_iters and power; THREE and ANNEAL OneCycleLR's three_phase (0/1) and
anneal_strategy.  Each scheduler is stepped once per optimizer step, as
kiln's.  Run with Debian's python3-torch (1.13):
    /usr/bin/python3 tests/data/gen_sched_refs.py > tests/data/sched_refs.txt
Session 43 checked that torch 2.15 (a venv's) gives the same rates, bit
for bit: `PYTHON tests/data/gen_sched_refs.py --compare tests/data/sched_refs.txt`
prints the largest relative difference from the file's (0 there).
"""
import sys
import warnings

import torch
from torch.optim import lr_scheduler as S

warnings.filterwarnings("ignore")


def run(kind, T, W, base, lr_min=0.0, step_size=1, gamma=0.1, pct=0.3, div=25.0,
        fdiv=1e4, start=1.0 / 3, end=1.0, iters=5, power=1.0, three=False, anneal="cos",
        milestones=()):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    U = max(T - W, 1)
    if kind == "constant":
        main = S.LambdaLR(opt, lambda s: 1.0)
    elif kind == "cosine":
        main = S.CosineAnnealingLR(opt, T_max=U, eta_min=lr_min)
    elif kind == "step":
        main = S.StepLR(opt, step_size=step_size, gamma=gamma)
    elif kind == "multistep":
        main = S.MultiStepLR(opt, milestones=list(milestones), gamma=gamma)
    elif kind == "onecycle":
        main = S.OneCycleLR(opt, max_lr=base, total_steps=U, pct_start=pct, div_factor=div,
                            final_div_factor=fdiv, anneal_strategy=anneal,
                            cycle_momentum=False, three_phase=three)
    elif kind == "exponential":
        main = S.ExponentialLR(opt, gamma=gamma)
    elif kind == "linear":
        main = S.LinearLR(opt, start_factor=start, end_factor=end, total_iters=iters)
    elif kind == "polynomial":
        main = S.PolynomialLR(opt, total_iters=iters, power=power)
    sched = main
    if W > 0:
        warm = S.LinearLR(opt, start_factor=1.0 / W, end_factor=1.0, total_iters=W - 1)
        sched = S.SequentialLR(opt, [warm, main], milestones=[W])
    lrs = []
    for _ in range(T):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


CASES = [
    ("constant_warm", "constant", 20, 5, 0.1, {}),
    ("cosine", "cosine", 40, 0, 0.1, {"lr_min": 0.001}),
    ("cosine_warm", "cosine", 40, 6, 0.1, {"lr_min": 0.001}),
    ("step", "step", 40, 0, 0.2, {"step_size": 7, "gamma": 0.5}),
    ("step_warm", "step", 40, 3, 0.2, {"step_size": 7, "gamma": 0.5}),
    ("multistep", "multistep", 40, 0, 0.3, {"milestones": (5, 12, 20), "gamma": 0.3}),
    ("multistep_warm", "multistep", 40, 4, 0.3, {"milestones": (5, 12, 20), "gamma": 0.3}),
    ("onecycle", "onecycle", 50, 0, 0.4, {"pct": 0.3, "div": 25.0, "fdiv": 1e4}),
    ("onecycle_b", "onecycle", 37, 0, 1.0, {"pct": 0.25, "div": 10.0, "fdiv": 100.0}),
    # session 43: ExponentialLR, LinearLR, PolynomialLR, OneCycleLR's
    # three_phase and anneal_strategy = linear.  (No onecycle with a
    # warmup: OneCycleLR sets initial_lr to max_lr / div_factor, so a
    # SequentialLR's LinearLR warm-up in front of it rises to that, not to
    # lr as kiln's warmup does; kiln warns of a warmup with onecycle.)
    ("exponential", "exponential", 40, 0, 0.2, {"gamma": 0.9}),
    ("exponential_warm", "exponential", 40, 5, 0.2, {"gamma": 0.9}),
    ("linear", "linear", 20, 0, 0.1, {}),
    ("linear_down", "linear", 40, 0, 0.3, {"start": 1.0, "end": 0.05, "iters": 25}),
    ("linear_warm", "linear", 30, 4, 0.1, {"start": 0.5, "end": 0.1, "iters": 10}),
    ("polynomial", "polynomial", 12, 0, 0.1, {}),
    ("polynomial_p2", "polynomial", 40, 0, 0.3, {"iters": 30, "power": 2.0}),
    ("polynomial_warm", "polynomial", 30, 3, 0.1, {"iters": 20, "power": 0.5}),
    ("onecycle_3", "onecycle", 50, 0, 0.4, {"pct": 0.3, "three": True}),
    ("onecycle_lin", "onecycle", 37, 0, 1.0, {"pct": 0.25, "div": 10.0, "fdiv": 100.0,
                                               "anneal": "linear"}),
    ("onecycle_3lin", "onecycle", 41, 0, 0.5, {"pct": 0.2, "three": True, "anneal": "linear"}),
    # tests/sched_torch.sh's runs of tests/data/tr_cnn.ini: 3 epochs of 6
    # steps, lr 0.1
    ("tr_exponential", "exponential", 18, 3, 0.1, {"gamma": 0.8}),
    ("tr_linear", "linear", 18, 2, 0.1, {"start": 0.25, "end": 0.5, "iters": 8}),
    ("tr_polynomial", "polynomial", 18, 2, 0.1, {"iters": 10, "power": 2.0}),
    ("tr_onecycle", "onecycle", 18, 0, 0.1, {"pct": 0.25, "three": True, "anneal": "linear"}),
]


def table():
    rows = []
    for name, kind, T, W, base, kw in CASES:
        lrs = run(kind, T, W, base, **kw)
        ms = " ".join(str(m) for m in kw.get("milestones", ()))
        rows.append((name, "%s %s %d %d %r %r %d %r %r %r %r %r %r %d %r %d %s %s ; %s" % (
            name, kind, T, W, base, kw.get("lr_min", 0.0), kw.get("step_size", 1),
            kw.get("gamma", 0.1), kw.get("pct", 0.3), kw.get("div", 25.0), kw.get("fdiv", 1e4),
            kw.get("start", 1.0 / 3), kw.get("end", 1.0), kw.get("iters", 5),
            kw.get("power", 1.0), int(kw.get("three", False)), kw.get("anneal", "cos"), ms,
            " ".join(repr(x) for x in lrs)), lrs))
    return rows


if len(sys.argv) == 3 and sys.argv[1] == "--compare":
    want = {}
    for line in open(sys.argv[2]):
        if not line.startswith("#"):
            want[line.split()[0]] = [float(x) for x in line.split(";")[1].split()]
    worst = 0.0
    for name, _, lrs in table():
        for a, b in zip(lrs, want[name]):
            worst = max(worst, abs(a - b) / max(abs(b), 1e-300))
        assert len(lrs) == len(want[name]), name
    print("torch %s: largest relative difference from %s: %.3g" % (torch.__version__, sys.argv[2],
                                                                    worst))
    sys.exit(0 if worst < 1e-12 else 1)

print("# generated by tests/data/gen_sched_refs.py with torch %s" % torch.__version__)
for _, line, _ in table():
    print(line)
