#!/usr/bin/python3
"""PyTorch side of the kiln vs PyTorch data-parallel benchmark on Fashion-MNIST.

The models of pytorch_mlp.py and pytorch_cnn.py (imported, not copied),
trained by --world processes on one machine with torch.distributed (gloo)
and DistributedDataParallel, --threads threads each.  --batch is the
global batch: each rank takes --batch / --world samples a step from its
shard of the preloaded set (rank r: samples r, r+W, r+2W, ..., as kiln's
sampler and DistributedSampler interleave), shuffled every epoch by
torch.randperm (fmnist.train_loop).  The first --warmup-steps steps are not
timed, then --steps timed steps; rank 0 prints one JSON line, its rate the
global samples a second.

  --mode eager         DDP(model)
  --mode compile       torch.compile(DDP(model)), mode "default"
  --mode compile-max   the same, mode "max-autotune-no-cudagraphs"
  --mode lightning     Trainer.fit(strategy="ddp", devices=--world) of the
                       same module (torch_modes.lightning_fit; Lightning
                       starts the other ranks by running this script again);
                       the rate is over the whole fit, every step counted

--losses (tests/ddp_torch.sh, MLP only): no shuffle and no dropout to draw,
the model's weights read from --init (kiln's safetensors export), --steps
steps from the first sample on, the global batch k being samples
k*B .. (k+1)*B - 1 as in a kiln DDP run with data.shuffle = 0; prints one
JSON line {"losses": [...]}, each step's loss averaged over the ranks (the
global batch's mean loss, kiln's logged loss with log_every = 1).

PyTorch 2.x (the compile and Lightning modes); PyTorch 1.13 runs eager.
"""
import argparse
import contextlib
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from fmnist import DEFAULT_DATA, loaded_blas, train_loop
from torch_modes import add_mode_arg, compile_seconds, compiled, lightning_fit, mode_fields
import pytorch_cnn
import pytorch_mlp

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """{name: tensor} of a safetensors file (the plain dtypes kiln exports)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        a = np.frombuffer(blob[lo:hi], dtype=ST_DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


def build(args):
    """(model, make_opt, x, y, memory format or None) of --model."""
    if args.model == "mlp":
        model = pytorch_mlp.MLP()
        x, y = pytorch_mlp.load_split(args.data, "train")
        fmt = None
    else:
        fmt = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
        model = pytorch_cnn.CNN().to(memory_format=fmt)
        x, y = pytorch_cnn.load_split(args.data, "train")
    wd = args.weight_decay if args.weight_decay >= 0 else (0.0 if args.model == "mlp" else 0.0005)
    lr = args.lr if args.lr > 0 else (0.1 if args.model == "mlp" else 0.02)

    def make_opt(m):
        return torch.optim.SGD(m.parameters(), lr=lr, momentum=args.momentum, weight_decay=wd)
    return model, make_opt, x, y, fmt


def loss_steps(ddp, opt, loss_fn, x, y, b, steps, world):
    """--losses: `steps` unshuffled steps of b samples of this rank's shard;
    each step's loss averaged over the ranks."""
    losses = []
    for k in range(steps):
        xb, yb = x[k * b:(k + 1) * b], y[k * b:(k + 1) * b]
        if xb.shape[0] < b:
            raise SystemExit("--losses: %d steps need more than this shard's %d samples"
                             % (steps, x.shape[0]))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    return losses


def rank_main(rank, args):
    """One rank of the eager and compile modes (and --losses)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, make_opt, x, y, fmt = build(args)
    if args.init:
        model.load_state_dict(read_safetensors(args.init), strict=True)
    x, y = x[rank::args.world].contiguous(), y[rank::args.world].contiguous()
    b = args.batch // args.world
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = make_opt(ddp)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    if args.losses:
        losses = loss_steps(ddp, opt, loss_fn, x, y, b, args.steps, args.world)
        if rank == 0:
            print(json.dumps({"losses": losses, "torch": torch.__version__}), flush=True)
        dist.destroy_process_group()
        return
    stats = {}
    total = args.warmup_steps + args.steps
    timed, elapsed, last = train_loop(compiled(ddp, args.mode), opt, loss_fn, x, y, b, total,
                                      args.warmup_steps, contextlib.nullcontext,
                                      fmt=fmt, stats=stats)
    if rank == 0:
        extra = {"compile_s": compile_seconds(stats["warmup_s"], args.warmup_steps, elapsed,
                                              args.steps)}
        report(args, timed * args.world, elapsed, last, extra)
    dist.destroy_process_group()


def report(args, samples, elapsed, last_loss, extra):
    out = {
        "impl": "pytorch-ddp",
        "model": args.model,
        "layout": args.layout if args.model == "cnn" else None,
        "world": args.world,
        "train_samples_per_s": samples / elapsed,
        "threads": args.threads,
        "batch": args.batch,
        "steps": args.warmup_steps + args.steps,
        "timed_steps": samples // args.batch,
        "train_s": elapsed,
        "final_loss": last_loss,
        "env": {k: os.environ.get(k) for k in
                ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE")},
        "blas": loaded_blas(),
    }
    out.update(mode_fields(args.mode, extra=extra))
    print(json.dumps(out), flush=True)


def lightning_main(args):
    """--mode lightning: this process is rank 0 (or, run again by
    Lightning's launcher, another rank)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, make_opt, x, y, fmt = build(args)
    samples, fit_s, last, ver = lightning_fit(
        model, make_opt, nn.CrossEntropyLoss(), x, y, args.batch // args.world,
        args.warmup_steps + args.steps, "fp32", fmt=fmt if args.model == "cnn" else None,
        seed=args.seed, devices=args.world, strategy="ddp")
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        report(args, samples, fit_s, last, {"lightning": ver})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads of each rank")
    ap.add_argument("--batch", type=int, default=128, help="the global batch")
    ap.add_argument("--lr", type=float, default=0, help="0: the model's (MLP 0.1, CNN 0.02)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=-1,
                    help="-1: the model's (MLP 0, CNN 0.0005)")
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100, help="timed steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--losses", action="store_true")
    ap.add_argument("--init", default="", help="safetensors weights to start from")
    add_mode_arg(ap)
    args = ap.parse_args()
    if args.world < 1 or args.batch % args.world:
        sys.exit("--batch %d is not a multiple of --world %d" % (args.batch, args.world))
    if args.losses and (args.model != "mlp" or args.mode != "eager"):
        sys.exit("--losses: the MLP, eager (the CNN's dropout draws differ from kiln's)")
    if args.mode == "lightning":
        lightning_main(args)
        return
    if not args.port:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
