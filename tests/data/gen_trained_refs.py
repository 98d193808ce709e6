#!/usr/bin/python3
"""A network trained K steps from PyTorch's weights, for tests/trained_export.sh.

Generate (the default) into tests/data:

  tr_cnn_images.idx, tr_cnn_labels.idx
        48 random 8x8 u8 images and labels 0..4 (IDX files, not gzipped)
  tr_cnn_init.safetensors
        the initial state_dict of `Net` below (tests/data/tr_cnn.ini is the
        same model as kiln layers): random weights, random batchnorm running
        statistics, num_batches_tracked = 3 (I64)
  tr_cnn_trained.safetensors
        the state_dict after K = 5 steps of torch.optim.SGD (lr 0.1, momentum
        0.9) on batches of 8 in file order (x = u8 / 255, CrossEntropyLoss),
        train mode: num_batches_tracked = 3 + 5
  tr_cnn_finetuned.safetensors
        then fine-tuned: the trained weights alone, a new SGD (lr 0.05,
        momentum 0.9, fresh momentum buffers) for 2 steps on batches 0 and 1
        (a new run starts its epoch anew): num_batches_tracked = 3 + 5 + 2

Check (--check FILE REF): every tensor of REF is in FILE with the same dtype
and shape (and FILE holds nothing else); F32 tensors agree within
max |file - ref| <= 1e-4 * max(max |ref|, 1), I64 exactly.  Only the standard
library: the test needs neither numpy nor torch.  Exit 1 on a difference.

Deterministic: seed 0, one thread.  PyTorch 1.13 (Debian's python3-torch).

Usage: /usr/bin/python3 tests/data/gen_trained_refs.py [tests/data]
       /usr/bin/python3 tests/data/gen_trained_refs.py --check FILE REF
"""
import json
import os
import struct
import sys

N, H, W, CLASSES = 48, 8, 8, 5
BATCH, STEPS, FT_STEPS = 8, 5, 2
LR, FT_LR, MOMENTUM = 0.1, 0.05, 0.9
TRACKED0 = 3
REL = 1e-4

# ---- reading (standard library only) ------------------------------------------

SIZES = {"F32": (4, "f"), "I64": (8, "q"), "I32": (4, "i"), "U8": (1, "B")}


def read(path):
    """{name: (dtype, shape, values)} of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        size, code = SIZES[e["dtype"]]
        b, end = e["data_offsets"]
        count = (end - b) // size
        vals = struct.unpack_from("<%d%s" % (count, code), blob, 8 + n + b)
        out[name] = (e["dtype"], e["shape"], vals)
    return out


def check(path, ref_path):
    got, ref = read(path), read(ref_path)
    bad = []
    for name in sorted(set(got) | set(ref)):
        if name not in got or name not in ref:
            bad.append("%s: only in %s" % (name, path if name in got else ref_path))
            continue
        (da, sa, a), (db, sb, b) = got[name], ref[name]
        if da != db or sa != sb:
            bad.append("%s: %s %s, reference %s %s" % (name, da, sa, db, sb))
            continue
        if da == "I64":
            if a != b:
                bad.append("%s: %s, reference %s" % (name, a, b))
            else:
                print("ok %-24s %s" % (name, a))
            continue
        scale = max([abs(v) for v in b] + [1.0])
        err = max(abs(x - y) for x, y in zip(a, b))
        if err > REL * scale:
            bad.append("%s: max |kiln - torch| = %.3g > %.3g" % (name, err, REL * scale))
        else:
            print("ok %-24s max |kiln - torch| = %.3g" % (name, err))
    for line in bad:
        print("MISMATCH " + line)
    return 1 if bad else 0


# ---- generation (torch) --------------------------------------------------------


def generate(out_dir):
    import numpy as np
    import torch
    import torch.nn as nn

    from safetensors_io import write_file

    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    class Net(nn.Module):
        """Module names are kiln's layer names in tests/data/tr_cnn.ini."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(4)
            self.fc1 = nn.Linear(4 * (H // 2) * (W // 2), CLASSES)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = nn.functional.max_pool2d(x, 2)
            return self.fc1(torch.flatten(x, 1))

    images = rng.integers(0, 256, size=(N, H, W), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, size=(N,), dtype=np.uint8)
    with open(os.path.join(out_dir, "tr_cnn_images.idx"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, N, H, W) + images.tobytes())
    with open(os.path.join(out_dir, "tr_cnn_labels.idx"), "wb") as f:
        f.write(struct.pack(">II", 0x801, N) + labels.tobytes())
    # kiln's idx source: (u / 255 - mean) / std in f32 (mean 0 and std 1 here, where
    # f64 then f32 gives the same bits; plugins/common/norm_lut.h)
    x_all = torch.from_numpy(images.astype(np.float64) / 255.0).float().unsqueeze(1)
    y_all = torch.from_numpy(labels.astype(np.int64))

    net = Net()
    with torch.no_grad():
        net.bn1.weight.copy_(torch.rand(4) + 0.5)
        net.bn1.bias.copy_(torch.randn(4) * 0.1)
        net.bn1.running_mean.copy_(torch.randn(4) * 0.1)
        net.bn1.running_var.copy_(torch.rand(4) + 0.5)
        net.bn1.num_batches_tracked.fill_(TRACKED0)

    def save(name):
        tensors, blobs, off = {}, [], 0
        for key, t in net.state_dict().items():
            t = t.detach().contiguous()
            if t.dtype == torch.int64:
                dtype, data = "I64", struct.pack("<q", int(t.item()))
            else:
                dtype, data = "F32", t.numpy().astype("<f4").tobytes()
            tensors[key] = {"dtype": dtype, "shape": list(t.shape),
                            "data_offsets": [off, off + len(data)]}
            blobs.append(data)
            off += len(data)
        tensors["__metadata__"] = {"format": "pt"}
        write_file(os.path.join(out_dir, name), tensors, blobs)

    def train(lr, steps):
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM)
        net.train()
        for k in range(steps):
            x, y = x_all[k * BATCH:(k + 1) * BATCH], y_all[k * BATCH:(k + 1) * BATCH]
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

    save("tr_cnn_init.safetensors")
    train(LR, STEPS)
    save("tr_cnn_trained.safetensors")
    train(FT_LR, FT_STEPS)
    save("tr_cnn_finetuned.safetensors")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        return check(sys.argv[2], sys.argv[3])
    generate(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
