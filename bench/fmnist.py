"""What the PyTorch halves of kiln's benchmarks share: Fashion-MNIST read
straight from the gzipped IDX files, and which BLAS library is loaded."""
import gzip
import os
import struct

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
