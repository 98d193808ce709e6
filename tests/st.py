"""tests/st.py - safetensors files for the shell tests, with Python's standard
library only (no numpy, no torch: the tests that use it run wherever python3
does).  tests/lib.sh puts tests/ on PYTHONPATH, so a test's Python says
`import st`.

    st.load(path)              -> File: .header (tensors' entries, no
                                  "__metadata__"), .meta (the metadata or
                                  {}), .raw (the file's bytes), .base (where
                                  the data begins), .data(name) (a tensor's
                                  bytes), .values(name) (its numbers)
    st.tensors(path)           -> {name: (dtype, shape, bytes)}
    st.values(path)            -> {name: [numbers]}
    st.write(path, tensors, meta=None, pad=True)
                                  tensors: {name: (dtype, shape, bytes)} or
                                  {name: (shape, [floats])} (F32), in order
    st.rewrite(src, dst, edit) -> dst: src with edit(header, meta, data)
                                  applied (header and meta dicts, data a
                                  bytearray), its tensors' bytes kept
    st.differ(a, b)            -> the names whose dtype, shape or bytes
                                  differ between two files (metadata aside)
"""
import json
import struct

FORMATS = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h",
           "I8": "b", "U8": "B", "BOOL": "?"}


def unpack(dtype, raw):
    """The numbers of raw bytes of dtype (BF16: widened to f32)."""
    if dtype == "BF16":
        return list(struct.unpack("<%df" % (len(raw) // 2),
                                  b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))))
    fmt = FORMATS[dtype]
    return list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))


class File:
    def __init__(self, raw):
        self.raw = raw
        n = struct.unpack("<Q", raw[:8])[0]
        self.base = 8 + n
        self.header = json.loads(raw[8:8 + n])
        self.meta = self.header.pop("__metadata__", None) or {}

    def span(self, name):
        lo, hi = self.header[name]["data_offsets"]
        return self.base + lo, self.base + hi

    def data(self, name):
        lo, hi = self.span(name)
        return bytes(self.raw[lo:hi])

    def values(self, name):
        return unpack(self.header[name]["dtype"], self.data(name))


def load(path):
    with open(path, "rb") as f:
        return File(f.read())


def tensors(path):
    f = load(path)
    return {k: (v["dtype"], v["shape"], f.data(k)) for k, v in f.header.items()}


def values(path):
    f = load(path)
    return {k: f.values(k) for k in f.header}


def encode(header, meta, pad=True):
    """The length-prefixed JSON header of a file (padded to 8 bytes with
    spaces, as kiln and the safetensors crate write it, when pad)."""
    h = dict(header)
    if meta:
        h = {"__metadata__": meta, **h}
    j = json.dumps(h).encode()
    if pad:
        j += b" " * (-len(j) % 8)
    return struct.pack("<Q", len(j)) + j


def write(path, tensors, meta=None, pad=True):
    header, blob = {}, bytearray()
    for k, t in tensors.items():
        if len(t) == 2:
            shape, vals = t
            dtype, raw = "F32", struct.pack("<%df" % len(vals), *vals)
        else:
            dtype, shape, raw = t
        header[k] = {"dtype": dtype, "shape": list(shape),
                     "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    with open(path, "wb") as f:
        f.write(encode(header, meta, pad) + bytes(blob))


def rewrite(src, dst, edit):
    f = load(src)
    data = bytearray(f.raw[f.base:])
    edit(f.header, f.meta, data)
    with open(dst, "wb") as out:
        out.write(encode(f.header, f.meta) + bytes(data))


def differ(a, b):
    ta, tb = tensors(a), tensors(b)
    return sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
