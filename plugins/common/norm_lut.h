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

static inline void common_norm_lut(float lut[256], float mean, float std)
{
	for (int u = 0; u < 256; u++)
		lut[u] = ((float)u / 255.0f - mean) / std;
}

#endif
