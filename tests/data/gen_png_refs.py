#!/usr/bin/python3
"""tests/data/gen_png_refs.py - the PNG fixtures of tests/check_image and the
pixels kiln must decode from them (tests/data/png/refs.txt).

Run from the source root with Debian's python3 (Pillow 9.4, numpy):
    /usr/bin/python3 tests/data/gen_png_refs.py
Every PNG is written chunk by chunk here (zlib only), so the chunks are
exactly the ones named: gAMA 1.0 and 1/1.8, an sRGB chunk, palette + tRNS,
gray + alpha, RGBA, 2-bit gray + tRNS, RGB + tRNS, 16 bits, Adam7.

The expected pixels are PIL's (what torchvision's loader sees): the stored
samples, whatever gAMA or sRGB says.  Where the file has alpha (an alpha
channel or tRNS), kiln composites onto black in the stored values,
round(v * a / 255), with v and a PIL's RGBA/LA values (docs/data.md: PIL's
convert("RGB") drops alpha instead).  16-bit colour files (RGB, RGBA) are
PIL's: the high byte of every sample, v >> 8 (alpha too, before the
compositing; before session 41 kiln rounded v * 255 / 65535, which differs
by 1 for about a quarter of the values).  16-bit gray follows kiln's
documented rule, v >> 8, not PIL's: Pillow opens it as mode I;16, and
convert("L") clips it at 255 (checked here).  The script checks that PIL's
values are the samples it wrote.

refs.txt: one line per file, `name h w c hex`, hex the h*w*c bytes (HWC).
"""
import os, struct, zlib
import numpy as np
from PIL import Image

OUT = "tests/data/png"


def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)


def gama(g):
    return chunk(b"gAMA", struct.pack(">I", g))


def png(name, rows, w, h, depth, ctype, extra=b"", interlace=False):
    """rows(x0, dx, y) -> the packed bytes of row y's pixels x0, x0+dx, ..."""
    if interlace:  # Adam7: (x0, y0, dx, dy) per pass
        raw = b""
        for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                               (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
            if x0 < w and y0 < h:
                raw += b"".join(b"\0" + rows(x0, dx, y) for y in range(y0, h, dy))
    else:
        raw = b"".join(b"\0" + rows(0, 1, y) for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1 if interlace else 0)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def from_array(a):  # a: (h, w[, c]) uint8 or >u2 -> rows()
    a = a.reshape(a.shape[0], a.shape[1], -1)
    return lambda x0, dx, y: a[y, x0::dx].tobytes()


def over_black(px):  # (h, w, c+1) 8-bit -> (h, w, c): round(v * a / 255)
    v, a = px[..., :-1].astype(np.int64), px[..., -1:].astype(np.int64)
    return ((v * a + 127) // 255).astype(np.uint8)


def high16(v):  # the high byte, v >> 8
    return (v.astype(np.int64) >> 8).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    refs = []

    def ref(name, want, pil_is=None):
        if pil_is is not None:  # PIL returns the stored samples
            assert np.array_equal(np.asarray(pil_is), want), name
        want = want.reshape(want.shape[0], want.shape[1], -1)
        refs.append("%s %d %d %d %s" % (name, want.shape[0], want.shape[1], want.shape[2],
                                        want.tobytes().hex()))

    def pil(name, mode=None):
        im = Image.open(os.path.join(OUT, name))
        return np.asarray(im.convert(mode) if mode else im)

    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16)
    rgb = np.stack([ramp, 255 - ramp, ramp // 2 + 64], -1)
    alpha = np.ascontiguousarray(ramp.T)  # every alpha 0..255 once

    # gamma 1.0 and 1/1.8: the simplified API mapped 4..7 to 39 43 46 50
    png("gray_gamma10.png", from_array(ramp), 16, 16, 8, 0, gama(100000))
    ref("gray_gamma10.png", ramp, pil("gray_gamma10.png"))
    png("gray_gamma055.png", from_array(ramp), 16, 16, 8, 0, gama(55556))
    ref("gray_gamma055.png", ramp, pil("gray_gamma055.png"))
    png("rgb_gamma10.png", from_array(rgb), 16, 16, 8, 2, gama(100000))
    ref("rgb_gamma10.png", rgb, pil("rgb_gamma10.png"))
    png("rgb_srgb.png", from_array(rgb), 16, 16, 8, 2, chunk(b"sRGB", b"\0") + gama(45455))
    ref("rgb_srgb.png", rgb, pil("rgb_srgb.png"))

    # alpha: gray 200 at alpha 64 is 50 (it was 106, composited in linear light)
    la = np.stack([np.full((16, 16), 200, np.uint8), alpha], -1)
    png("gray_alpha.png", from_array(la), 16, 16, 8, 4, gama(100000))
    ref("gray_alpha.png", over_black(pil("gray_alpha.png", "LA")))
    assert la[0, 4, 1] == 64 and over_black(la)[0, 4, 0] == 50
    rgba = np.concatenate([rgb, alpha[..., None]], -1)
    png("rgba.png", from_array(rgba), 16, 16, 8, 6, gama(100000))
    ref("rgba.png", over_black(pil("rgba.png", "RGBA")))

    # palette of 16 colours, the first 8 partly transparent (tRNS)
    pal = np.array([[(i * 37) % 256, (i * 91 + 30) % 256, 255 - i * 13] for i in range(16)],
                   np.uint8)
    idx = ((np.arange(16)[:, None] * 3 + np.arange(16)[None, :]) % 16).astype(np.uint8)
    png("palette_trns.png", from_array(idx), 16, 16, 8, 3,
        gama(100000) + chunk(b"PLTE", pal.tobytes()) +
        chunk(b"tRNS", bytes([0, 1, 64, 127, 128, 200, 254, 30])))
    ref("palette_trns.png", over_black(pil("palette_trns.png", "RGBA")))

    # 2-bit gray (0 85 170 255) whose sample 1 is transparent: 85 -> 0
    g2 = (np.arange(32).reshape(4, 8) * 5 % 4).astype(np.uint8)
    pack2 = lambda x0, dx, y: bytes(  # four 2-bit samples a byte, MSB first
        sum(int(s) << (6 - 2 * k) for k, s in enumerate(g2[y, x0::dx][i:i + 4]))
        for i in range(0, len(g2[y, x0::dx]), 4))
    png("gray2_trns.png", pack2, 8, 4, 2, 0, chunk(b"tRNS", struct.pack(">H", 1)))
    ref("gray2_trns.png", np.where(g2 == 1, 0, g2 * 85).astype(np.uint8),
        np.where(g2 == 1, 0, pil("gray2_trns.png", "L")))

    # RGB whose colour (10, 20, 30) is transparent
    c = np.zeros((4, 4, 3), np.uint8) + np.array([10, 20, 30], np.uint8)
    c[::2, 1::2] = [200, 100, 50]
    png("rgb_trns.png", from_array(c), 4, 4, 8, 2, chunk(b"tRNS", struct.pack(">HHH", 10, 20, 30)))
    ref("rgb_trns.png", over_black(pil("rgb_trns.png", "RGBA")))

    # 16 bits: 257 k + 128 and 257 k + 129 (k < 128), where round(v * 255 /
    # 65535) gives k and k + 1, the high byte k twice
    v16 = np.array([[257 * k + 128, 257 * k + 129] for k in range(128)], ">u2").reshape(16, 16)
    png("gray16_gamma10.png", from_array(v16), 16, 16, 16, 0, gama(100000))
    ref("gray16_gamma10.png", high16(v16))
    assert np.array_equal(pil("gray16_gamma10.png", "L"), np.minimum(v16, 255))  # PIL clips
    rgba16 = np.stack([v16, v16[::-1], v16.T, 65535 - v16.T], -1).astype(">u2")
    png("rgba16.png", from_array(rgba16), 16, 16, 16, 6)
    assert np.array_equal(pil("rgba16.png", "RGBA"), high16(rgba16))
    ref("rgba16.png", over_black(pil("rgba16.png", "RGBA")))
    rgb16 = rgba16[..., :3]
    png("rgb16.png", from_array(rgb16), 16, 16, 16, 2)
    ref("rgb16.png", high16(rgb16), pil("rgb16.png", "RGB"))

    # Adam7, an odd size (every pass partial)
    il = rgb[:11, :13].copy()
    png("rgb_interlaced.png", from_array(il), 13, 11, 8, 2, gama(100000), interlace=True)
    ref("rgb_interlaced.png", il, pil("rgb_interlaced.png"))
    assert Image.open(os.path.join(OUT, "rgb_interlaced.png")).info.get("interlace") == 1

    with open(os.path.join(OUT, "refs.txt"), "w") as f:
        f.write("# written by tests/data/gen_png_refs.py: name h w c pixels (HWC hex)\n")
        f.write("\n".join(refs) + "\n")


if __name__ == "__main__":
    main()
