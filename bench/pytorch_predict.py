#!/usr/bin/python3
"""PyTorch side of bench/predict.sh: classify a folder of PNGs at its best.

The CNN of bench/cnn_bench.ini (bench/pytorch_cnn.py's CNN) with the weights
kiln exported (--weights, safetensors, read here with numpy), in eval mode
under torch.inference_mode(): each batch's PNGs decoded by PIL, ToTensor and
Normalize(0.286, 0.353) as in torchvision, one forward, softmax and top-5,
one line per image written to --out.  One untimed warm-up batch first; then
the whole folder is timed (decode, transform, forward, top-k), like the
timing `kiln predict` logs.  Prints one JSON line: images, batch, threads,
wall_s, images_per_s, ms_per_image.
"""
import argparse
import json
import os
import struct
import time

import numpy as np
import torch
from PIL import Image

from pytorch_cnn import CNN

MEAN, STD = 0.286, 0.353


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[v["dtype"]]
        out[k] = torch.from_numpy(np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(v["shape"]).copy())
    return out


def images(root):
    files = []
    for d, _, names in sorted(os.walk(root)):
        files += [os.path.join(d, f) for f in sorted(names) if f.lower().endswith(".png")]
    return files


def batch_tensor(files):
    x = np.stack([np.asarray(Image.open(f).convert("L"), dtype=np.float32) for f in files])
    x = (x / 255.0 - MEAN) / STD
    return torch.from_numpy(x.astype(np.float32)).unsqueeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.devnull)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = CNN()
    model.load_state_dict(load_safetensors(args.weights))
    model.eval()
    files = images(args.folder)
    with torch.inference_mode(), open(args.out, "w") as out:
        model(batch_tensor(files[:args.batch]))  # warm-up, untimed
        t0 = time.perf_counter()
        for i in range(0, len(files), args.batch):
            fs = files[i:i + args.batch]
            p = torch.softmax(model(batch_tensor(fs)), 1)
            top = torch.topk(p, 5, 1)
            for f, v, k in zip(fs, top.values.tolist(), top.indices.tolist()):
                out.write(json.dumps({"file": f, "top": [{"index": c, "prob": q} for c, q in zip(k, v)]}) + "\n")
        wall = time.perf_counter() - t0
    print(json.dumps({"images": len(files), "batch": args.batch, "threads": args.threads,
                      "torch": torch.__version__, "wall_s": round(wall, 4),
                      "images_per_s": round(len(files) / wall, 1),
                      "ms_per_image": round(1000 * wall / len(files), 4)}))


if __name__ == "__main__":
    main()
