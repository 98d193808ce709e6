"""bench/pytorch_cnn_ops.py - what each op of the Fashion-MNIST CNN
(bench/cnn_bench.ini: conv5x5-32, pool, conv5x5-64, pool, fc1024) costs in
PyTorch eager on this CPU: the least process CPU time (user + sys, every
thread's: time.process_time) of ITERS calls, in ms, so that a neighbour's
load inflates it little.  kiln's counterparts: bench/fftconv_ops (conv2's
three passes, direct and FFT; --shape 1,28,32,5,2 for conv1) and
bench/gemm_shapes --set cnn (fc1's GEMMs).

A backward pass is torch.autograd.grad over the inputs of that pass alone,
on one forward's graph (retained): bwd_data the gradient of x (not for
conv1, whose input needs none), bwd_weights that of the weight and bias.

Usage: python3 bench/pytorch_cnn_ops.py [--iters N] [--threads T] [--batch B]
(OMP_WAIT_POLICY=PASSIVE where T > 1, so that idle threads do not count)."""
import argparse
import time

import torch
import torch.nn.functional as F


def least(fn, iters):
    """the least CPU ms of iters calls of fn, after one untimed call"""
    fn()
    best = float("inf")
    for _ in range(iters):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best * 1e3


def grad_pass(fwd, outs, dy):
    y = fwd()
    return lambda: torch.autograd.grad(y, outs, dy, retain_graph=True)


def conv_row(layout, mf, batch, c, hw, o, iters):
    x = torch.randn(batch, c, hw, hw).to(memory_format=mf).requires_grad_(c > 1)
    w = torch.randn(o, c, 5, 5).to(memory_format=mf).requires_grad_(True)
    b = torch.randn(o).requires_grad_(True)
    fwd = lambda: F.conv2d(x, w, b, padding=2)
    dy = torch.randn_like(fwd())
    f = least(fwd, iters)
    dw = least(grad_pass(fwd, (w, b), dy), iters)
    dx = least(grad_pass(fwd, (x,), dy), iters) if c > 1 else float("nan")
    print("%s conv %d->%d %dx%d: forward %.2f  bwd_data %.2f  bwd_weights %.2f"
          % (layout, c, o, hw, hw, f, dx, dw))


def pool_row(layout, mf, batch, c, hw, iters):
    x = torch.randn(batch, c, hw, hw).to(memory_format=mf).requires_grad_(True)
    fwd = lambda: F.max_pool2d(x, 2)
    dy = torch.randn_like(fwd())
    f = least(fwd, iters)
    bwd = least(grad_pass(fwd, (x,), dy), iters)
    print("%s maxpool %d %dx%d: forward %.2f  backward %.2f" % (layout, c, hw, hw, f, bwd))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("PyTorch %s, %d thread(s), batch %d, least CPU ms of %d calls"
          % (torch.__version__, args.threads, args.batch, args.iters))
    for layout, mf in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        conv_row(layout, mf, args.batch, 1, 28, 32, args.iters)
        conv_row(layout, mf, args.batch, 32, 14, 64, args.iters)
        pool_row(layout, mf, args.batch, 32, 28, args.iters)
        pool_row(layout, mf, args.batch, 64, 14, args.iters)
    x = torch.randn(args.batch, 3136, requires_grad=True)
    w = torch.randn(1024, 3136, requires_grad=True)
    b = torch.randn(1024, requires_grad=True)
    fwd = lambda: F.linear(x, w, b)
    dy = torch.randn_like(fwd())
    f = least(fwd, args.iters)
    dx = least(grad_pass(fwd, (x,), dy), args.iters)
    dw = least(grad_pass(fwd, (w, b), dy), args.iters)
    print("fc1 3136->1024: forward %.2f  bwd_data %.2f  bwd_weights %.2f" % (f, dx, dw))


if __name__ == "__main__":
    main()
