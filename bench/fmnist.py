"""What the PyTorch halves of kiln's benchmarks share: Fashion-MNIST read
straight from the gzipped IDX files, which BLAS library is loaded, and the
timed training loop."""
import gzip
import os
import struct
import time

import numpy as np

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """A uint8 IDX file (gzipped) as a numpy array of its dims."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError("%s: not a uint8 IDX file" % path)
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(dims)


def read_split(data_dir, prefix):
    """Images u8 [N, 28, 28] and labels u8 [N] of split "train" or "t10k"."""
    x = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % prefix))
    y = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % prefix))
    return x, y


def loaded_blas():
    """Which BLAS library this process mapped (reference BLAS is ~10x slower)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                name = os.path.basename(path)
                if "blas" in name.lower() or name.startswith("libmkl"):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(libs)


def train_loop(model, opt, loss_fn, x, y, batch, total_steps, warmup_steps, amp, fmt=None,
               stats=None):
    """total_steps SGD steps of `batch` samples over shuffled epochs of x, y
    (torch.randperm each epoch, the last partial batch dropped), the forward
    and loss under amp(); a batch in memory format fmt when given.  The first
    warmup_steps are not timed; their seconds go to stats["warmup_s"] when
    stats is a dict, and each epoch's timed samples/s (the first from the
    end of the warmup) to stats["epoch_samples_per_s"].  Returns (timed
    samples, their seconds, the last loss)."""
    import torch  # here: the data helpers above serve scripts without torch too
    n = x.shape[0]
    steps_per_epoch = n // batch
    step = 0
    t0 = None
    timed_samples = 0
    last_loss = float("nan")
    t_start = time.perf_counter()
    epoch_rates = []
    while step < total_steps:
        perm = torch.randperm(n)
        e_start, e_samples = time.perf_counter(), 0
        for i in range(steps_per_epoch):
            if step >= total_steps:
                break
            if step == warmup_steps:
                t0 = time.perf_counter()
                if stats is not None:
                    stats["warmup_s"] = t0 - t_start
            idx = perm[i * batch:(i + 1) * batch]
            xb = x.index_select(0, idx)
            if fmt is not None:
                xb = xb.contiguous(memory_format=fmt)
            yb = y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if step >= warmup_steps:
                timed_samples += xb.shape[0]
                e_samples += xb.shape[0]
            step += 1
        last_loss = loss.item()
        if e_samples:
            epoch_rates.append(e_samples / (time.perf_counter() - max(e_start, t0)))
    if stats is not None:
        stats["epoch_samples_per_s"] = epoch_rates
    return timed_samples, time.perf_counter() - t0, last_loss
