#!/usr/bin/python3
"""Generate tests/data/transform_refs.safetensors: torchvision 0.14 / PIL
references for kiln's image transforms (core/transform.c, read by
tests/check_transform.c).

Inputs are small synthetic images (smooth gradients, a hard-edged block and
noise from numpy's seeded generator), made into PIL images; every case
applies torchvision.transforms.functional ops (or PIL's convert) to one of
them and stores the result.  A JPEG (quality 90, encoded by PIL) is stored
as its bytes with PIL's decoded pixels, for the decoder test.

Tensors (all row-major):
  img/<name>      U8 [H, W, C]   the input images (C = 1 for gray)
  <case>          U8 [H, W, C]   PIL output of the case, or
                  F32 [C, H, W]  ToTensor (+ Normalize) output
  jpeg/<name>     U8 [n]         the JPEG file's bytes
Metadata (strings):
  cases           comma-separated case names
  <case>.op       the operation (see OPS below)
  <case>.src      the input image name
  <case>.args     space-separated integers of the operation
  <case>.mean, <case>.std  normalisation values (ops normalize, eval)

Usage: /usr/bin/python3 tests/data/gen_transform_refs.py tests/data/transform_refs.safetensors
"""
import io
import sys

import numpy as np
import PIL
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

from safetensors_io import read_safetensors, write_safetensors

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def make_image(h, w, c, seed):
    """Gradients + a hard-edged block + noise, u8 [h, w, c]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [
        255.0 * x / max(w - 1, 1),
        255.0 * y / max(h - 1, 1),
        127.5 + 127.5 * np.sin(x / 3.0 + y / 5.0),
    ]
    img = np.stack(planes[:c], axis=-1)
    img[h // 4:h // 2, w // 3:2 * w // 3, :] = 255.0 - img[h // 4:h // 2, w // 3:2 * w // 3, :]
    img += rng.normal(0.0, 18.0, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def to_pil(a):
    return Image.fromarray(a[:, :, 0] if a.shape[2] == 1 else a, "L" if a.shape[2] == 1 else "RGB")


def from_pil(im):
    a = np.asarray(im, dtype=np.uint8)
    return a[:, :, None] if a.ndim == 2 else a


IMAGES = {
    "rgb": make_image(37, 53, 3, 1),
    "gray": make_image(29, 31, 1, 2),
    "big": make_image(150, 200, 3, 3),
    "photo": make_image(64, 80, 3, 4),
}

# (name, op, src, args, extra): ops and their torchvision meaning
#   resize        oh ow                  F.resize(img, [oh, ow])
#   resize_short  n                      F.resize(img, n)
#   resized_crop  top left h w oh ow     F.resized_crop(img, top, left, h, w, [oh, ow])
#   center_crop   oh ow                  F.center_crop(img, [oh, ow])
#   pad           p                      F.pad(img, p) (fill 0)
#   hflip                                F.hflip(img)
#   gray          oh ow                  F.resize(img, [oh, ow]).convert("L") (no resize when the size is the same)
#   rgb                                  img.convert("RGB")
#   normalize                            F.normalize(F.to_tensor(img), mean, std)
#   eval          n s                    Compose([Resize(n), CenterCrop(s), ToTensor(), Normalize(mean, std)])
#   jpeg_decode                          PIL's decode of jpeg/<src> (the src image encoded, quality 90)
#   jpeg_resize   oh ow                  F.resize(PIL's decode of jpeg/<src>, [oh, ow])
CASES = []


def case(name, op, src, args=(), **extra):
    CASES.append((name, op, src, list(args), extra))


for oh, ow in [(20, 30), (64, 80), (37, 20), (13, 53), (100, 17), (11, 7), (1, 1), (74, 106),
               (18, 26)]:
    case("resize/rgb/%dx%d" % (oh, ow), "resize", "rgb", (oh, ow))
for oh, ow in [(10, 10), (64, 64), (29, 50), (28, 28), (3, 31)]:
    case("resize/gray/%dx%d" % (oh, ow), "resize", "gray", (oh, ow))
for oh, ow in [(24, 32), (7, 9), (170, 60), (149, 199), (75, 100)]:
    case("resize/big/%dx%d" % (oh, ow), "resize", "big", (oh, ow))
for src, n in [("rgb", 20), ("rgb", 64), ("gray", 28), ("big", 32), ("big", 100)]:
    case("resize_short/%s/%d" % (src, n), "resize_short", src, (n,))
for src, box in [("rgb", (3, 5, 20, 30, 16, 16)), ("rgb", (0, 0, 37, 53, 28, 28)),
                 ("rgb", (10, 2, 27, 40, 50, 60)), ("rgb", (5, 7, 13, 17, 13, 17)),
                 ("rgb", (0, 10, 37, 12, 32, 32)), ("big", (20, 30, 100, 120, 24, 24)),
                 ("big", (0, 0, 150, 200, 96, 112)), ("big", (7, 11, 33, 77, 56, 56)),
                 ("gray", (2, 3, 20, 25, 28, 28))]:
    case("resized_crop/%s/%s" % (src, "_".join(map(str, box))), "resized_crop", src, box)
for src, oh, ow in [("rgb", 20, 20), ("rgb", 36, 52), ("rgb", 37, 53), ("rgb", 40, 60),
                    ("rgb", 30, 60), ("rgb", 41, 50), ("rgb", 1, 1), ("rgb", 34, 50),
                    ("gray", 28, 28), ("gray", 32, 32), ("gray", 28, 34), ("gray", 26, 28)]:
    case("center_crop/%s/%dx%d" % (src, oh, ow), "center_crop", src, (oh, ow))
case("pad/rgb/4", "pad", "rgb", (4,))
case("pad/gray/2", "pad", "gray", (2,))
case("hflip/rgb", "hflip", "rgb")
case("hflip/gray", "hflip", "gray")
case("gray/rgb", "gray", "rgb", (37, 53))
case("gray/big/20x30", "gray", "big", (20, 30))
case("rgb/gray", "rgb", "gray")
case("normalize/rgb", "normalize", "rgb", mean=IMAGENET_MEAN, std=IMAGENET_STD)
case("normalize/gray", "normalize", "gray", mean=(0.286,), std=(0.353,))
case("eval/big", "eval", "big", (64, 56), mean=IMAGENET_MEAN, std=IMAGENET_STD)
case("eval/rgb", "eval", "rgb", (32, 28), mean=IMAGENET_MEAN, std=IMAGENET_STD)
case("eval/gray", "eval", "gray", (20, 16), mean=(0.5,), std=(0.5,))
case("jpeg_decode/photo", "jpeg_decode", "photo")
case("jpeg_decode/gray", "jpeg_decode", "gray")
case("jpeg_resize/photo/24x30", "jpeg_resize", "photo", (24, 30))
case("jpeg_resize/photo/100x120", "jpeg_resize", "photo", (100, 120))


def jpeg_bytes(name):
    buf = io.BytesIO()
    to_pil(IMAGES[name]).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def run_case(op, src, args, extra):
    im = to_pil(IMAGES[src])
    if op == "resize":
        return from_pil(F.resize(im, args))
    if op == "resize_short":
        return from_pil(F.resize(im, args[0]))
    if op == "resized_crop":
        return from_pil(F.resized_crop(im, args[0], args[1], args[2], args[3], args[4:6]))
    if op == "center_crop":
        return from_pil(F.center_crop(im, args))
    if op == "pad":
        return from_pil(F.pad(im, args[0]))
    if op == "hflip":
        return from_pil(F.hflip(im))
    if op == "gray":
        return from_pil(F.resize(im, args).convert("L"))
    if op == "rgb":
        return from_pil(im.convert("RGB"))
    if op == "normalize":
        return F.normalize(F.to_tensor(im), list(extra["mean"]), list(extra["std"])).numpy()
    if op == "eval":
        t = T.Compose([T.Resize(args[0]), T.CenterCrop(args[1]), T.ToTensor(),
                       T.Normalize(list(extra["mean"]), list(extra["std"]))])
        return t(im).numpy()
    if op == "jpeg_decode":
        return from_pil(Image.open(io.BytesIO(jpeg_bytes(src))).convert(im.mode))
    if op == "jpeg_resize":
        dec = Image.open(io.BytesIO(jpeg_bytes(src)))
        dec.load()
        return from_pil(F.resize(dec, args))
    raise ValueError(op)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: %s OUT.safetensors\n" % sys.argv[0])
        return 2
    torch.set_num_threads(1)
    tensors = [("img/" + k, v) for k, v in IMAGES.items()]
    metadata = {"generator": "tests/data/gen_transform_refs.py", "torch": torch.__version__,
                "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                "cases": ",".join(c[0] for c in CASES)}
    for name in sorted({c[2] for c in CASES if c[1].startswith("jpeg")}):
        tensors.append(("jpeg/" + name, np.frombuffer(jpeg_bytes(name), dtype=np.uint8)))
    for name, op, src, args, extra in CASES:
        out = run_case(op, src, args, extra)
        tensors.append((name, out))
        metadata[name + ".op"] = op
        metadata[name + ".src"] = src
        metadata[name + ".args"] = " ".join(map(str, args))
        for k in ("mean", "std"):
            if k in extra:
                metadata[name + "." + k] = " ".join(repr(v) for v in extra[k])
    write_safetensors(sys.argv[1], tensors, metadata)

    back, meta = read_safetensors(sys.argv[1])
    assert meta == metadata
    for name, a in tensors:
        assert back[name].shape == a.shape and np.array_equal(back[name], a), name
    print("%d tensors, %d cases" % (len(tensors), len(CASES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
