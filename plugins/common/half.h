/* plugins/common/half.h - bf16 and f16 <-> f32 for the communicators'
 * reductions and both devices' storage (compiled into each plugin; C, C++
 * and, for bf16, CUDA device code).  bf16 rounds to nearest even and keeps
 * NaNs quiet (the CPU device and the CUDA kernels round with this one
 * function, so they agree bit for bit); f16 goes through _Float16 (C) or
 * the same bit manipulation's compiler builtin type (C++: _Float16 as well,
 * GCC >= 12; not in nvcc's device code, which has its own __half). */
#ifndef KILN_PLUGINS_COMMON_HALF_H
#define KILN_PLUGINS_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HALF_HD __host__ __device__
#else
#define HALF_HD
#endif

static inline HALF_HD float half_bf16_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline HALF_HD uint16_t half_f32_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

#ifndef __CUDACC__
static inline float half_f16_f32(uint16_t h)
{
	_Float16 x;
	memcpy(&x, &h, 2);
	return (float)x;
}

static inline uint16_t half_f32_f16(float f)
{
	_Float16 x = (_Float16)f;
	uint16_t h;
	memcpy(&h, &x, 2);
	return h;
}
#endif

#endif
