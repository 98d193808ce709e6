#!/usr/bin/python3
"""Write an ImageFolder of RGB JPEGs for bench/data.sh: Fashion-MNIST
training images upscaled to SIZE x SIZE (PIL bicubic) and tinted with a
colour drawn per image, so they are photo-like in size and in what the JPEG
coder sees (smooth colour, edges), not noise.  ROOT/<class>/<index>.jpg,
quality 90, the first N images.

  make_image_folder.py ROOT [--n 10000] [--size 128] [--quality 90]
"""
import argparse
import os

import numpy as np
from PIL import Image

from fmnist import DEFAULT_DATA, read_split


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--data", default=DEFAULT_DATA)
    a = ap.parse_args()
    x, y = read_split(a.data, "train")
    rng = np.random.default_rng(0)
    for c in range(10):
        os.makedirs(os.path.join(a.root, "%d" % c), exist_ok=True)
    for i in range(min(a.n, len(x))):
        g = Image.fromarray(x[i]).resize((a.size, a.size), Image.BICUBIC)
        lo = rng.integers(0, 96, 3)
        hi = rng.integers(160, 256, 3)
        px = np.asarray(g, dtype=np.float32)[:, :, None] / 255.0
        rgb = (lo + px * (hi - lo)).clip(0, 255).astype(np.uint8)
        Image.fromarray(rgb, "RGB").save(
            os.path.join(a.root, "%d" % y[i], "%05d.jpg" % i), quality=a.quality)


if __name__ == "__main__":
    main()
