"""tests/data/safetensors_io.py - the safetensors writer and reader the
reference generators (tests/data/gen_*_refs.py, gen_mlp_ref.py) share.

write_safetensors(path, tensors, metadata): tensors is a list of
(name, np.ndarray) kept in that order, f32, i32 or u8, stored little-endian
and row-major; metadata a dict of strings.  read_safetensors(path): the
tensors as {name: np.ndarray} and the metadata, to self-check a written
file.
"""

import json
import struct

import numpy as np

DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}
NUMPY = {"F32": "<f4", "I32": "<i4", "U8": "u1"}


def write_safetensors(path, tensors, metadata):
    header = {}
    blobs = []
    offset = 0
    for name, a in tensors:
        if a.dtype not in DTYPES:
            raise ValueError("unsupported dtype %s for %s" % (a.dtype, name))
        assert name not in header, name
        data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    write_file(path, header, blobs)


def write_file(path, header, blobs):
    """The file itself: the header's length (u64 little-endian), the JSON
    header padded with spaces to a multiple of 8, then the blobs in order."""
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((-len(hdr)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + b:base + e],
                                  dtype=NUMPY[info["dtype"]]).reshape(info["shape"])
    return out, meta
