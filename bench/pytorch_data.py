#!/usr/bin/python3
"""PyTorch's side of bench/data.sh: torchvision ImageFolder + transforms
through a DataLoader, the way a PyTorch user writes it, timed for N batches
after W warm-up batches.  Prints one JSON line.

  pytorch_data.py ROOT --workers 2 --batch 128 --batches 40 --size 96
                  [--crop resized|random|none] [--flip] [--pad 4]
                  [--mean 0.5 ...] [--std 0.25 ...] [--gray]
"""
import argparse
import json
import time

import torch
import torchvision
from torchvision import transforms as T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--crop", default="resized", choices=["resized", "random", "none"])
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--flip", action="store_true")
    ap.add_argument("--gray", action="store_true")
    ap.add_argument("--mean", type=float, nargs="+", default=[0.5])
    ap.add_argument("--std", type=float, nargs="+", default=[0.25])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    tf = []
    if a.gray:
        tf.append(T.Grayscale(1))
    if a.crop == "resized":
        tf.append(T.RandomResizedCrop(a.size))
    elif a.crop == "random":
        tf.append(T.RandomCrop(a.size, padding=a.pad))
    else:
        tf.append(T.Resize((a.size, a.size)))
    if a.flip:
        tf.append(T.RandomHorizontalFlip())
    tf += [T.ToTensor(), T.Normalize(a.mean, a.std)]
    ds = torchvision.datasets.ImageFolder(a.root, transform=T.Compose(tf))
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                     num_workers=a.workers, drop_last=True,
                                     persistent_workers=a.workers > 0)
    need = a.warmup + a.batches
    taken = 0
    t0 = None
    while taken < need:
        for x, y in dl:
            taken += 1
            if taken == a.warmup:
                t0 = time.perf_counter()
            if taken == need:
                break
    dt = time.perf_counter() - t0
    n = a.batches * a.batch
    print(json.dumps({"impl": "pytorch", "samples_per_s": n / dt, "batches": a.batches,
                      "batch": a.batch, "workers": a.workers, "images": len(ds),
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    main()
