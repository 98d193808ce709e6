#!/usr/bin/python3
"""tests/data/gen_jpeg_refs.py - the JPEG fixtures of tests/check_image and
the pixels kiln must decode from them (tests/data/jpeg/refs.txt): PIL's
Image.open(f).convert("RGB") (or "L" for gray), what torchvision's loader sees.

Run from the source root with a Python that has Pillow and numpy (session
41: a venv's Pillow 13.0, its libjpeg-turbo 3.2):
    python tests/data/gen_jpeg_refs.py

- clean.jpg: PIL's JPEG of a 20x24 RGB image (quality 90, 4:2:0);
- extra3.jpg: clean.jpg with 3 bytes before its EOI marker (libjpeg's
  warning "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9");
- extra_sos.jpg: clean.jpg with 3 bytes before its SOS marker (the same
  warning, for marker 0xda, before the scan: tests/check_image cuts this
  file mid-scan, where a first warning must not hide the truncation);
- jfif201.jpg: clean.jpg claiming JFIF version 2.01 ("Warning: unknown
  JFIF revision number 2.01").
PIL ignores libjpeg's warnings: each of these decodes to clean.jpg's
pixels (checked here).  PIL refuses every cut of extra_sos.jpg inside or
after its scan ("image file is truncated"; checked here too).
- cmyk.jpg: PIL's CMYK JPEG (Adobe APP14, transform 0: CMYK stored as is,
  inverted, as PIL writes and reads every CMYK JPEG) of a 16x20 image;
- ycck.jpg: TurboJPEG's (libturbojpeg.so.0 through ctypes) of the same
  CMYK samples, stored as YCCK (APP14 transform 2), as Photoshop writes
  them.  Their refs are PIL's convert("RGB") (Convert.c cmyk2rgb).

refs.txt: one line per file, `name h w c hex`, hex the h*w*c bytes (HWC).
"""
import ctypes, io, os
import numpy as np
from PIL import Image

OUT = "tests/data/jpeg"


def tj_cmyk(px):
    """TurboJPEG's JPEG of h x w x 4 CMYK samples: YCCK, 4:2:0, quality 90."""
    tj = ctypes.CDLL("libturbojpeg.so.0")
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    out, size = ctypes.POINTER(ctypes.c_ubyte)(), ctypes.c_ulong(0)
    TJPF_CMYK, TJSAMP_420, TJFLAG_ACCURATEDCT = 11, 2, 4096
    src = np.ascontiguousarray(px)
    r = tj.tjCompress2(handle, src.ctypes.data_as(ctypes.c_void_p), src.shape[1], 0,
                       src.shape[0], TJPF_CMYK, ctypes.byref(out), ctypes.byref(size),
                       TJSAMP_420, 90, TJFLAG_ACCURATEDCT)
    assert r == 0, "tjCompress2 failed"
    data = ctypes.string_at(out, size.value)
    tj.tjFree(out)
    tj.tjDestroy(handle)
    return data


def main():
    os.makedirs(OUT, exist_ok=True)
    refs = []

    def write(name, data):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)

    def ref(name, mode="RGB"):
        want = np.asarray(Image.open(os.path.join(OUT, name)).convert(mode))
        want = want.reshape(want.shape[0], want.shape[1], -1)
        refs.append("%s %d %d %d %s" % (name, want.shape[0], want.shape[1], want.shape[2],
                                        want.tobytes().hex()))
        return want

    y, x = np.mgrid[0:20, 0:24]
    rgb = np.stack([x * 11, y * 13, (x * 7 + y * 5) % 256], -1).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(rgb).save(b, "JPEG", quality=90)
    clean = b.getvalue()
    assert clean[-2:] == b"\xff\xd9" and clean[6:11] == b"JFIF\0" and clean[11:13] == b"\1\1"
    write("clean.jpg", clean)
    want = ref("clean.jpg")

    sos = clean.index(b"\xff\xda")
    variants = {
        "extra3.jpg": clean[:-2] + b"\0\0\0" + clean[-2:],
        "extra_sos.jpg": clean[:sos] + b"\0\0\0" + clean[sos:],
        "jfif201.jpg": clean[:11] + b"\2\1" + clean[13:],
    }
    for name, data in variants.items():
        write(name, data)
        assert np.array_equal(ref(name), want), name

    # PIL refuses extra_sos.jpg cut anywhere from its scan on
    data = variants["extra_sos.jpg"]
    for cut in range(sos + 3 + 2, len(data)):
        try:
            Image.open(io.BytesIO(data[:cut])).convert("RGB")
        except OSError:
            continue
        raise AssertionError("PIL decoded extra_sos.jpg cut at %d" % cut)

    # CMYK: every ink level against every K across the image
    y, x = np.mgrid[0:16, 0:20]
    cmyk = np.stack([x * 13, y * 17, (x * y * 5) % 256, 255 - ((x + y) * 8) % 256],
                    -1).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(cmyk, "CMYK").save(b, "JPEG", quality=90)
    write("cmyk.jpg", b.getvalue())
    assert Image.open(os.path.join(OUT, "cmyk.jpg")).info.get("adobe_transform") == 0
    ref("cmyk.jpg")
    write("ycck.jpg", tj_cmyk(cmyk))
    assert Image.open(os.path.join(OUT, "ycck.jpg")).info.get("adobe_transform") == 2
    ref("ycck.jpg")

    with open(os.path.join(OUT, "refs.txt"), "w") as f:
        f.write("# written by tests/data/gen_jpeg_refs.py: name h w c pixels (HWC hex)\n")
        f.write("\n".join(refs) + "\n")


if __name__ == "__main__":
    main()
