#!/usr/bin/python3
"""PyTorch <-> kiln weights through safetensors (docs/safetensors.md).

Generate (the default): tests/data/st_cnn_torch.safetensors and
tests/data/st_cnn_io.safetensors, read by tests/check_safetensors.c.

  st_cnn_torch.safetensors  the state_dict of `Net` below (conv + batchnorm +
                            relu + pool, a Sequential block, linear +
                            BatchNorm1d + linear), written as the
                            safetensors library would: every tensor under
                            its state_dict name, num_batches_tracked an I64
                            scalar, weights random, running stats random.
  st_cnn_io.safetensors     x [4, 3, 8, 8] and the eval-mode logits [4, 10]
                            Net gives for it.

tests/data/st_cnn.ini is the same model as kiln layers; check_safetensors
loads the first file with [model] init_from (init_strict = 1) and compares
kiln's eval-mode logits for x with these.

Check (--check MODEL [LOGITS] [--tracked N]): the other direction, run by
tests/safetensors_torch.sh.  MODEL is a kiln export of st_cnn.ini's model;
this checks the file against the format (header length and padding,
offsets tiling the data, the reference implementation's tensor order),
loads it into Net with load_state_dict(strict=True), checks every
num_batches_tracked is N (when given), and when LOGITS (a file with x and
kiln's eval-mode logits) is given compares Net's logits for x with
kiln's: max |torch - kiln| <= 1e-4 * max |torch|.  Exit 1 on failure.

The safetensors files are written and read by hand with struct + json (the
safetensors package is not needed).  Deterministic: seed 0, one thread.

Usage: /usr/bin/python3 tests/data/gen_safetensors_refs.py [tests/data]
       /usr/bin/python3 tests/data/gen_safetensors_refs.py --check MODEL [LOGITS] [--tracked N]
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors_io import write_file  # the bytes every generator writes

REL = 1e-4  # tests/check_safetensors.c and --check: max |a - ref| <= REL * max |ref|
TRACKED = 7  # num_batches_tracked in the reference state_dict

# ---- the model ----------------------------------------------------------------


class Net(nn.Module):
    """Module names are kiln's layer names in tests/data/st_cnn.ini."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.block = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.fc1 = nn.Linear(6 * 4 * 4, 16)
        self.bn2 = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = torch.flatten(self.block(x), 1)
        return self.fc2(F.relu(self.bn2(self.fc1(x))))


# ---- safetensors by hand ---------------------------------------------------------

# name, bytes per element, numpy dtype; in the reference implementation's
# Dtype order (its writer sorts by this, descending, then by name)
DTYPES = [("BOOL", 1, np.bool_), ("U8", 1, np.uint8), ("I8", 1, np.int8),
          ("F8_E5M2", 1, None), ("F8_E4M3", 1, None), ("I16", 2, np.int16),
          ("U16", 2, np.uint16), ("F16", 2, np.float16), ("BF16", 2, None),
          ("I32", 4, np.int32), ("U32", 4, np.uint32), ("F32", 4, np.float32),
          ("F64", 8, np.float64), ("I64", 8, np.int64), ("U64", 8, np.uint64)]
RANK = {d[0]: i for i, d in enumerate(DTYPES)}
SIZE = {d[0]: d[1] for d in DTYPES}
NP = {d[0]: d[2] for d in DTYPES}


def dtype_of(arr):
    for name, _, npd in DTYPES:
        if npd is not None and arr.dtype == npd:
            return name
    raise ValueError("unsupported dtype %s" % arr.dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: np.ndarray}; written in the reference order."""
    order = sorted(tensors, key=lambda n: (-RANK[dtype_of(tensors[n])], n))
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs, off = [], 0
    for name in order:
        arr = np.array(tensors[name], order="C")  # (ascontiguousarray makes scalars 1-d)
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype_of(arr), "shape": list(arr.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    write_file(path, header, blobs)


def read_safetensors(path, check_order=False):
    """{name: np.ndarray}, metadata; asserts the format's rules."""
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8, "%s: too short" % path
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "%s: header length %d past the end" % (path, n)
    assert raw[8:9] == b"{", "%s: header does not start with {" % path
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    at, out = 0, {}
    for name, info in entries:
        b, e = info["data_offsets"]
        assert b == at, "%s: %s starts at %d, expected %d" % (path, name, b, at)
        count = int(np.prod(info["shape"], dtype=np.int64))
        assert e - b == count * SIZE[info["dtype"]], "%s: %s size" % (path, name)
        arr = np.frombuffer(data[b:e], dtype=np.dtype(NP[info["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).copy()
        at = e
    assert at == len(data), "%s: %d trailing bytes" % (path, len(data) - at)
    if check_order:
        assert n % 8 == 0, "%s: header length %d is not a multiple of 8" % (path, n)
        names = [kv[0] for kv in entries]
        want = sorted(names, key=lambda k: (-RANK[header[k]["dtype"]], k))
        assert names == want, "%s: tensors not in the reference order" % path
        for name, info in entries:
            assert info["data_offsets"][0] % SIZE[info["dtype"]] == 0, "%s: %s unaligned" % (path, name)
    return out, meta


def state_dict_arrays(model):
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def max_rel(a, ref):
    scale = float(np.abs(ref).max())
    err = float(np.abs(a.astype(np.float64) - ref.astype(np.float64)).max())
    return err / scale if scale > 0 else err


# ---- generate -----------------------------------------------------------------------


def generate(outdir):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = Net()
    with torch.no_grad():
        # batchnorm away from its defaults, so loading them is visible
        for bn in (net.bn1, net.bn2):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0, 0.2)
            bn.running_mean.normal_(0, 0.3)
            bn.running_var.uniform_(0.5, 2.0)
            bn.num_batches_tracked.fill_(TRACKED)
    net.eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        logits = net(x)
        ref64 = net.double()(x.double())
    net.float()
    # float32 PyTorch must be well inside the tolerance of float64
    r = max_rel(logits.numpy(), ref64.numpy())
    print("float32 vs float64 logits: max rel %.3g (tolerance %g)" % (r, REL))
    assert r < REL / 4, "float32 reference too far from float64"
    meta = {"generator": "tests/data/gen_safetensors_refs.py", "torch": torch.__version__}
    sd = state_dict_arrays(net)
    p1 = os.path.join(outdir, "st_cnn_torch.safetensors")
    p2 = os.path.join(outdir, "st_cnn_io.safetensors")
    write_safetensors(p1, sd, {"format": "pt"})
    io = {"x": x.numpy(), "logits": logits.numpy()}
    write_safetensors(p2, io, meta)
    for path, want in ((p1, sd), (p2, io)):
        got, _ = read_safetensors(path, check_order=True)
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(got[k], want[k]), k
    print("wrote %s (%d tensors), %s" % (p1, len(sd), p2))


# ---- check a kiln export ----------------------------------------------------------


def check(model_path, logits_path, tracked):
    torch.set_num_threads(1)
    tensors, meta = read_safetensors(model_path, check_order=True)
    for key in ("format", "kiln_version", "config_hash"):
        assert key in meta, "%s: no metadata %s" % (model_path, key)
    net = Net()
    sd = {k: torch.from_numpy(v) for k, v in tensors.items()}
    net.load_state_dict(sd, strict=True)  # raises on missing/unexpected/shape
    for name, m in net.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            assert m.num_batches_tracked.dtype == torch.int64 and m.num_batches_tracked.dim() == 0
            if tracked is not None:
                assert int(m.num_batches_tracked) == tracked, \
                    "%s.num_batches_tracked = %d, expected %d" % (name, int(m.num_batches_tracked), tracked)
    print("%s: load_state_dict(strict=True) took all %d tensors" % (model_path, len(sd)))
    if logits_path is None:
        return 0
    io, _ = read_safetensors(logits_path)
    net.eval()
    with torch.no_grad():
        ref = net(torch.from_numpy(io["x"])).numpy()
    r = max_rel(io["logits"], ref)
    print("kiln vs PyTorch eval logits (%s): max rel diff %.3g (tolerance %g)"
          % (logits_path, r, REL))
    return 0 if r <= REL else 1


def main(argv):
    if argv and argv[0] == "--check":
        args = argv[1:]
        tracked = None
        if "--tracked" in args:
            i = args.index("--tracked")
            tracked = int(args[i + 1])
            del args[i:i + 2]
        if not 1 <= len(args) <= 2:
            sys.exit(__doc__)
        return check(args[0], args[1] if len(args) == 2 else None, tracked)
    if len(argv) > 1:
        sys.exit(__doc__)
    generate(argv[0] if argv else os.path.dirname(os.path.abspath(__file__)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
