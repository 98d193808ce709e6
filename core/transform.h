/* core/transform.h - the image transforms the loader workers apply between
 * a source's read_image() and the staging buffer: the torchvision
 * transforms a PyTorch user writes, with the same pixels.
 *
 * Order (what torchvision's usual Compose does):
 *   1. resize:  shorter side to `resize` pixels (Resize(int)), if set;
 *   2. crop:    none    - resize the whole image to out_h x out_w when its
 *                         size differs (Resize((h, w)));
 *               center  - CenterCrop((out_h, out_w)), zero fill when smaller;
 *               random  - RandomCrop((out_h, out_w), padding=pad), zero pad;
 *               resized - RandomResizedCrop((out_h, out_w), scale, ratio):
 *                         torchvision's box sampling (10 tries, then the
 *                         ratio-clamped centre box), box resized to out;
 *   3. channels: gray -> RGB by copying, RGB -> gray by ITU-R 601-2 luma
 *                (PIL's convert("L"): (19595 R + 38470 G + 7471 B + 32768)
 *                >> 16, the 0.299/0.587/0.114 weights in 16-bit fixed point);
 *   4. flip:    horizontal with p = 0.5 (RandomHorizontalFlip);
 *   5. output:  f32 x = (u/255 - mean[c]) / std[c] (ToTensor + Normalize),
 *               CHW or HWC; or the u8 pixels unchanged (out_dtype U8,
 *               for `transform_on = device`).
 *
 * Every resize is PIL's antialiased bilinear filter (what torchvision's
 * resize does to PIL images): a triangle filter whose support widens by
 * the scale factor when shrinking, separable, horizontal pass first, each
 * pass rounded to 8 bits as PIL does.
 *
 * Randomness: draw k of sample `index` in epoch `epoch` is
 * kiln_rng_uniform(seed, KILN_RNG_AUGMENT, index, epoch * 16 + k), so the
 * output is a pure function of (seed, epoch, index, image): the same for
 * any worker, thread, rank or world size.  k = 0..9: the RandomResizedCrop
 * tries (the counter's four words, kiln_rng_uniform4: scale, ratio, top,
 * left); k = 10: RandomCrop (top, left); k = 11: the flip.
 *
 * Threads: kiln_xform is read-only after setup; each worker owns its
 * scratch.  Functions never exit; errors return a status with a message.
 */
#ifndef KILN_TRANSFORM_H
#define KILN_TRANSFORM_H

#include "internal.h"

#include <kiln/image.h> /* struct kiln_xform_scratch, the resize */

enum kiln_crop { KILN_CROP_NONE = 0, KILN_CROP_CENTER = 1, KILN_CROP_RANDOM = 2,
		 KILN_CROP_RESIZED = 3 };

struct kiln_xform {
	int32_t out_h, out_w, out_c; /* output pixels and channels (1 or 3) */
	int32_t resize;              /* shorter side before cropping; 0: none */
	int32_t crop;                /* enum kiln_crop */
	int32_t pad;                 /* KILN_CROP_RANDOM: zero padding per side */
	float scale[2], ratio[2];    /* KILN_CROP_RESIZED: area fraction, w/h ratio */
	int32_t flip;                /* random horizontal flip, p = 0.5 */
	float mean[3], std[3];       /* per output channel, in [0,1] pixel units */
	int32_t nhwc;                /* 1: HWC output, 0: CHW */
	int32_t out_dtype;           /* KILN_F32 or KILN_U8 */
};

/* Bytes of one output sample: out_h * out_w * out_c * (4 or 1). */
size_t kiln_xform_out_bytes(const struct kiln_xform *x);

/* Read the transform keys of config `section` ([data] or [data.eval]).
 * `train` = 0 turns random crops into centre crops and the flip off (an
 * evaluation pipeline).  src_h/src_w/src_c describe the source's images
 * (0 when they vary); out_h/out_w default to the source's size (after
 * `resize`), and a source whose sizes vary needs `size` set.  nhwc follows
 * [model] layout.  Errors name the key and where it was set: KILN_ECONFIG. */
kiln_status kiln_xform_from_config(const struct kiln_config *cfg, const char *section,
				   int train, int src_h, int src_w, int src_c,
				   struct kiln_xform *x);

/* [data] size: "H W" or "N" (N x N), each 1..65536, separated by blanks
 * or a comma: 0 with *h, *w set, or -1.  The reader
 * (kiln_xform_from_config) and the config check share it. */
int kiln_xform_parse_size(const char *v, int32_t *h, int32_t *w);

/* Transform `in` into out (kiln_xform_out_bytes bytes).  `index` seeds
 * the random draws only: a KILN_EDATA message describes the image and the
 * caller says which sample or file it is (core/data.c, core/infer.c),
 * once ("[data] sample 2: sample 2: ..." before session 31). */
kiln_status kiln_xform_apply(const struct kiln_xform *x, const struct kiln_image *in,
			     uint64_t seed, int64_t epoch, int64_t index, void *out,
			     struct kiln_xform_scratch *s);

/* Building blocks, exposed for the tests. */

/* The RandomResizedCrop box {x0, y0, w, h} for an h x w image. */
void kiln_xform_rrc_box(const struct kiln_xform *x, int h, int w, uint64_t seed,
			int64_t epoch, int64_t index, int box[4]);

#endif /* KILN_TRANSFORM_H */
