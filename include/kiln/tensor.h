/* kiln/tensor.h - N-dimensional tensor descriptors shared by the core and
 * every plugin.  A descriptor describes memory; it never owns it. */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MAX_DIMS 8

enum kiln_dtype {
	KILN_F32 = 0,
	KILN_BF16 = 1,
	KILN_F16 = 2,
	KILN_I8 = 3,
	KILN_U8 = 4,
	KILN_I32 = 5,
	KILN_I64 = 6,
	KILN_DTYPE_COUNT
};

/* Layout is a property of 4-d activations only; other tensors are KILN_ROW
 * (row-major, last dimension contiguous).  dims[] of a 4-d activation are
 * always listed as N, C, H, W whatever the layout, so shapes do not change
 * meaning when `[model] layout` changes; the layout says how they are stored. */
enum kiln_layout {
	KILN_ROW = 0,  /* row-major over dims as listed */
	KILN_NCHW = 1, /* 4-d: stored N, C, H, W (same as ROW) */
	KILN_NHWC = 2  /* 4-d: stored N, H, W, C (channels-last) */
};

struct kiln_tensor_desc {
	int32_t dtype;   /* enum kiln_dtype */
	int32_t layout;  /* enum kiln_layout */
	int32_t ndim;    /* 0..KILN_MAX_DIMS; 0 is a scalar */
	int32_t reserved;
	int64_t dims[KILN_MAX_DIMS];
};

/* Bytes per element of a dtype (0 for an unknown dtype). */
size_t kiln_dtype_size(int dtype);
const char *kiln_dtype_name(int dtype);

/* The largest tensor kiln describes: 2^48 bytes (256 TiB).  Any larger
 * (a config's shapes multiplying past it) is refused where it is made, so
 * sums of a model's tensor sizes cannot wrap either. */
#define KILN_TENSOR_MAX_BYTES ((uint64_t)1 << 48)

/* The element count (1 for a scalar) and byte size of d, checked: 0 when
 * every dimension is >= 0 and the bytes are at most KILN_TENSOR_MAX_BYTES,
 * nonzero otherwise (then *numel = INT64_MAX, *bytes = SIZE_MAX).  Either
 * pointer may be NULL. */
int kiln_tensor_size(const struct kiln_tensor_desc *d, int64_t *numel, size_t *bytes);

/* Number of elements (1 for a scalar) and bytes; saturated (INT64_MAX,
 * SIZE_MAX: an allocation that fails) where kiln_tensor_size refuses. */
int64_t kiln_tensor_numel(const struct kiln_tensor_desc *d);
size_t kiln_tensor_bytes(const struct kiln_tensor_desc *d);

/* Fill `d` as a contiguous row-major tensor of `ndim` dims. */
void kiln_tensor_desc_init(struct kiln_tensor_desc *d, int dtype, int ndim,
			   const int64_t *dims);

/* Write "f32[128, 784]" into buf (always NUL-terminated); returns buf. */
char *kiln_tensor_desc_str(const struct kiln_tensor_desc *d, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* KILN_TENSOR_H */
