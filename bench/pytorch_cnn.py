#!/usr/bin/python3
"""PyTorch side of the kiln vs PyTorch CNN benchmark on Fashion-MNIST.

Model of examples/fashion_mnist_cnn.ini: conv5x5-32 (padding 2), ReLU, maxpool 2,
conv5x5-64 (padding 2), ReLU, maxpool 2, flatten, linear 1024, ReLU, dropout 0.4,
linear 10; mean cross-entropy, SGD with momentum and weight decay. Inputs are
(x/255 - 0.286) / 0.353, preloaded as one float32 N x 1 x 28 x 28 tensor, with no
DataLoader; each epoch is shuffled with torch.randperm. --warmup-steps steps run
first and are not timed, then --steps timed steps. --layout nhwc converts the
model to channels-last and each batch with .contiguous(channels_last).
--precision bf16 runs forward and loss under torch.autocast("cpu",
dtype=torch.bfloat16) (PyTorch's CPU mixed precision: f32 master weights, bf16
convolutions and linear layers through oneDNN), evaluation too.

After training, evaluation throughput: model.eval() + torch.no_grad() forward
passes over the first --eval-samples test samples in batches of --eval-batch
(one untimed warm-up batch first), reported as eval_samples_per_s together with
test_acc over those samples. Prints a single JSON line on stdout.

Run with Debian's PyTorch: /usr/bin/python3 bench/pytorch_cnn.py [options];
with PyTorch 2.x also --mode compile, compile-max or lightning (torch_modes.py;
lightning: the whole fit of --warmup-steps + --steps steps, all counted;
the untimed probe step that reports conv_ops runs after that fit, not before).
--profile N: after the timed steps, N more steps under torch.profiler, whose
table of self CPU time per op (ms a step) goes to stderr, beside kiln's
--profile (docs/PERFORMANCE.md, "Issue 22, session 8").
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np
import torch
import torch.nn as nn

from fmnist import DEFAULT_DATA, loaded_blas, read_split, train_loop
from torch_modes import add_mode_arg, compile_seconds, compiled, lightning_fit, mode_fields

MEAN = 0.286
STD = 0.353


def load_split(data_dir, prefix):
    x, y = read_split(data_dir, prefix)
    x = x.reshape(x.shape[0], 1, x.shape[1], x.shape[2]).astype(np.float32)
    x = (x / 255.0 - MEAN) / STD
    x = torch.from_numpy(x.astype(np.float32))
    y = torch.from_numpy(y.astype(np.int64))
    return x.contiguous(), y


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 1024)
        self.drop = nn.Dropout(0.4)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(x)


def mkldnn_info():
    m = re.search(r"MKL-DNN (v[0-9.]+)|oneDNN (v[0-9.]+)", torch.__config__.show())
    return {
        "available": torch.backends.mkldnn.is_available(),
        "enabled": bool(torch.backends.mkldnn.enabled),
        "version": (m.group(1) or m.group(2)) if m else None,
    }


def profile_steps(model, opt, loss_fn, x, y, batch, steps, amp, fmt):
    """steps training steps under torch.profiler; the self CPU time of each
    op, ms a step, to stderr (kiln's --profile lists the same per op)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_loop(model, opt, loss_fn, x, y, batch, steps, 0, amp, fmt)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows)
    print("[torch profile] %d steps, self CPU ms a step: %.3f" % (steps, total / 1e3 / steps),
          file=sys.stderr)
    for e in rows[:30]:
        print("[torch profile] %-44s %6d calls %9.3f ms/step %6.2f%%"
              % (e.key[:44], e.count, e.self_cpu_time_total / 1e3 / steps,
                 100.0 * e.self_cpu_time_total / total), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16), "
                         "f32 master weights (PyTorch's CPU mixed precision)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0005)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200,
                    help="timed training steps after the warm-up steps (default 200)")
    ap.add_argument("--eval-samples", type=int, default=5000,
                    help="test samples for the evaluation timing and test_acc (default 5000)")
    ap.add_argument("--eval-batch", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="N more steps under torch.profiler; the self CPU table to stderr")
    add_mode_arg(ap)
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("--steps must be >= 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    fmt = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format

    x_train, y_train = load_split(args.data, "train")
    x_test, y_test = load_split(args.data, "t10k")
    n_eval = min(args.eval_samples, x_test.shape[0])
    x_test, y_test = x_test[:n_eval], y_test[:n_eval]
    total_steps = args.warmup_steps + args.steps

    model = CNN().to(memory_format=fmt)
    def make_opt(m):
        return torch.optim.SGD(m.parameters(), lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)
    opt = make_opt(model)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    # fp32: a context that does nothing; bf16: CPU autocast
    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    # Which convolution kernel PyTorch picks here (one extra untimed step).
    # Lightning's fit is timed whole, first step included, as kiln's run is:
    # there this step comes after the fit, so that it does not warm the fit's
    # first step (oneDNN's primitives, the allocator) beforehand.
    def probe_conv_ops():
        with torch.autograd.profiler.profile() as prof:
            xb = x_train[:args.batch].contiguous(memory_format=fmt)
            with amp():
                loss = loss_fn(model(xb), y_train[:args.batch])
            loss.backward()
            opt.zero_grad(set_to_none=True)
        ops = []
        for ev in prof.key_averages():
            if "conv" in ev.key and ev.key not in ("aten::conv2d", "aten::convolution",
                                                    "aten::_convolution"):
                ops.append(ev.key)
        return sorted(set(ops))

    conv_ops = probe_conv_ops() if args.mode != "lightning" else None

    extra = {}
    if args.mode == "lightning":  # every step of the whole fit counts
        timed_samples, train_s, last_loss, ver = lightning_fit(
            model, make_opt, loss_fn, x_train, y_train, args.batch, total_steps,
            args.precision, fmt, seed=args.seed)
        extra["lightning"] = ver
        model.train()
        conv_ops = probe_conv_ops()
    else:
        stats = {}
        run = compiled(model, args.mode)
        cpu0 = time.process_time()
        timed_samples, train_s, last_loss = train_loop(run, opt, loss_fn, x_train, y_train,
                                                       args.batch, total_steps,
                                                       args.warmup_steps, amp, fmt, stats)
        # the process's CPU seconds over every step, warm-up included: under
        # load, the difference of two runs' train_cpu_s over their step
        # difference is the CPU cost of a step (docs/PERFORMANCE.md, "Issue
        # 22, session 8")
        extra["train_cpu_s"] = time.process_time() - cpu0
        extra["compile_s"] = compile_seconds(stats["warmup_s"], args.warmup_steps, train_s,
                                             args.steps)
        if args.profile > 0:
            profile_steps(run, opt, loss_fn, x_train, y_train, args.batch, args.profile, amp, fmt)
        model = run  # evaluation compiled too (its warm-up batch compiles, untimed)

    model.eval()
    correct = 0
    eb = args.eval_batch
    with torch.no_grad(), amp():
        model(x_test[:eb].contiguous(memory_format=fmt))  # warm-up, untimed
        t1 = time.perf_counter()
        for i in range(0, n_eval, eb):
            pred = model(x_test[i:i + eb].contiguous(memory_format=fmt)).argmax(dim=1)
            correct += (pred == y_test[i:i + eb]).sum().item()
        eval_s = time.perf_counter() - t1
    test_acc = correct / n_eval if n_eval else float("nan")

    out = {
        "impl": "pytorch",
        "layout": args.layout,
        "precision": args.precision,
        "train_samples_per_s": timed_samples / train_s,
        "eval_samples_per_s": n_eval / eval_s if eval_s > 0 else float("nan"),
        "test_acc": test_acc,
        "eval_samples": n_eval,
        "threads": args.threads,
        "batch": args.batch,
        "eval_batch": eb,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "train_s": train_s,
        "eval_s": eval_s,
        "final_loss": last_loss,
        "env": {k: os.environ.get(k) for k in
                ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE")},
        "mkldnn": mkldnn_info(),
        "conv_ops": conv_ops,
        "blas": loaded_blas(),
    }
    out.update(mode_fields(args.mode, extra=extra))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
