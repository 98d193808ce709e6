/* include/kiln/image.h - resizing 8-bit images exactly as PIL does
 * (antialiased bilinear: torchvision's Resize on PIL images), the resize of
 * the [data] transforms (core/transform.h), for tools that resize ahead of
 * a run such as `kiln pack --resize`.
 *
 * Threads: each thread owns its scratch.  Functions never exit; errors
 * return a status with a message (kiln_last_error).
 */
#ifndef KILN_IMAGE_H
#define KILN_IMAGE_H

#include <kiln/plugin.h> /* struct kiln_image */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per-worker scratch buffers, grown on demand.  Zero-initialise; free with
 * kiln_xform_scratch_free. */
struct kiln_xform_scratch {
	uint8_t *a, *b; /* resized images, each followed by its resize's rows */
	size_t a_cap, b_cap;   /* (capacities in bytes) */
	float *w;     /* the normalisation table, then one assembled output row */
	int32_t *wi;  /* filter bounds, fixed-point weights, a row of sums */
	size_t w_cap, wi_cap;
	/* the table in w was built for these (rebuilt only when they change) */
	int lut_c;
	float lut_mean[3], lut_std[3];
};
void kiln_xform_scratch_free(struct kiln_xform_scratch *s);

/* torchvision's Resize(int) of an h x w image: the shorter side to n, the
 * longer one to int(n * long / short), into *nh x *nw.  A result with a
 * side past the transforms' 65536 pixels (a long, thin image) is refused:
 * KILN_EDATA with a message ending "too long and thin for `resize = n`",
 * and *nh = *nw = 0 (KILN_EINVAL for h, w or n below 1). */
kiln_status kiln_xform_resize_shorter(int h, int w, int n, int *nh, int *nw);

/* Resize box {x0, y0, bw, bh} of `in` (which must lie inside it) to
 * oh x ow with PIL's antialiased bilinear filter: out is u8 [oh, ow, in->c]. */
kiln_status kiln_xform_resize_box(const struct kiln_image *in, const int box[4], int oh,
				  int ow, uint8_t *out, struct kiln_xform_scratch *s);

#ifdef __cplusplus
}
#endif

#endif /* KILN_IMAGE_H */
