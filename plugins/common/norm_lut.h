/* norm_lut.h - the normalisation of a u8 pixel, one rule for every path.
 *
 * lut[u] = (u/255 - mean) / std for every byte value u, computed in f32
 * arithmetic as torchvision's ToTensor (x.float().div(255)) and Normalize
 * ((x - mean) / std on f32 tensors) compute it.  The host transforms
 * (core/transform.c), the IDX loader and the devices' NORMALIZE_U8 op
 * (transform_on = device) all build their tables here, so a sample is
 * bit-equal whichever side normalises it.  No state; any thread. */
#ifndef KILN_COMMON_NORM_LUT_H
#define KILN_COMMON_NORM_LUT_H

#include <math.h> /* isfinite */

static inline void common_norm_lut(float lut[256], float mean, float std)
{
	for (int u = 0; u < 256; u++)
		lut[u] = ((float)u / 255.0f - mean) / std;
}

/* Do mean and std (as the config gives them, in double) normalise every
 * byte to a finite f32: mean and std finite in f32, std > 0 there, and
 * the table's ends finite?  (1e300 was inf in f32: every sample -inf or
 * NaN, and a std of 1e-50 was 0.)  The callers refuse the config when
 * not. */
static inline int common_norm_fits(double mean, double std)
{
	const float m = (float)mean, s = (float)std;
	if (!isfinite(mean) || !isfinite(std) || !isfinite(m) || !(s > 0) || !isfinite(s))
		return 0;
	const float lo = (0.0f - m) / s, hi = (1.0f - m) / s;
	return isfinite(lo) && isfinite(hi);
}

#endif
