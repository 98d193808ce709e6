/* plugins/cuda/kern.h - the pure pieces of the CUDA device's own kernels:
 * index maps, dtype conversions, the dropout mask, LAMB's piece grid and
 * the bad-data record's message.  Compiled three ways from this one text:
 * by nvcc into the kernels (kernels.cu), by gcc into the plugin's host
 * code (ops.c, cuda.c), and by gcc into tests/check_cuda_host.c, which
 * checks every function here on a machine without a GPU against the CPU
 * device and against Random123 itself.  So a map a kernel uses is tested
 * even where no kernel can run.
 *
 * Nothing here allocates, synchronises or touches device memory.
 */
#ifndef KILN_CUDA_KERN_H
#define KILN_CUDA_KERN_H

#include <kiln/plugin.h>        /* struct kiln_op, dtypes, op types */
#include "../common/half.h"      /* half_f32_bf16, half_bf16_f32 */
#include <Random123/philox.h>   /* philox4x32_R: the dropout mask (CUDA and C) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __CUDACC__
#define KERN_HD static __host__ __device__ __forceinline__
#define KERN_D static __device__ __forceinline__
#else
#define KERN_HD static inline
#define KERN_D static inline
#endif

/* ---- dtypes -------------------------------------------------------------- */

#ifdef __CUDACC__
#include <cuda_fp16.h> /* __half, __half2float, __float2half_rn */
/* Element i of a float tensor of dtype dt (KILN_F32, _BF16, _F16), widened
 * exactly, and the store of v rounded to nearest even (f16: past 65504 is
 * inf, as _Float16): kernels.cu's ld / st, and attn.cu's. */
KERN_D float kern_ld(const void *p, int dt, int64_t i)
{
	if (dt == KILN_BF16)
		return half_bf16_f32(((const uint16_t *)p)[i]);
	if (dt == KILN_F16)
		return __half2float(((const __half *)p)[i]);
	return ((const float *)p)[i];
}

/* f16 from f32, round to nearest even; a NaN keeps its sign and its
 * payload's top 10 bits, quiet (as the CPU's _Float16 conversion does;
 * __float2half_rn gives 0x7fff for any NaN) */
KERN_D __half kern_f16(float v)
{
	if (v != v) {
		uint32_t u;
		memcpy(&u, &v, 4);
		const uint16_t b = (uint16_t)(((u >> 16) & 0x8000) | 0x7c00 | 0x200 | ((u >> 13) & 0x3ff));
		__half h;
		memcpy(&h, &b, 2);
		return h;
	}
	return __float2half_rn(v);
}

KERN_D void kern_st(void *p, int dt, int64_t i, float v)
{
	if (dt == KILN_BF16)
		((uint16_t *)p)[i] = half_f32_bf16(v);
	else if (dt == KILN_F16)
		((__half *)p)[i] = kern_f16(v);
	else
		((float *)p)[i] = v;
}
#endif

/* bf16 from f32, round to nearest even, NaN kept (quiet), and back: the
 * CPU device's functions (plugins/common/half.h), bit for bit. */
KERN_HD uint16_t kern_bf16_round(float f) { return half_f32_bf16(f); }
KERN_HD float kern_bf16_f32(uint16_t h) { return half_bf16_f32(h); }

/* The float dtypes a kernel loads and stores through kern_ld/kern_st
 * (kernels.cu): f32, bf16, f16.  Everything is computed in f32 and each
 * stored value is rounded once, to nearest even: what the CPU device's
 * low-precision wrapper (plugins/cpu/lowp.c) computes. */
KERN_HD int kern_float_dtype(int dt)
{
	return dt == KILN_F32 || dt == KILN_BF16 || dt == KILN_F16;
}

/* ---- layouts -------------------------------------------------------------- */

/* The logical (N, C, H, W row-major) index of element i of an NHWC
 * tensor with C channels and HW = H*W pixels per image: i = (n*HW + hw)*C
 * + c is logical (n*C + c)*HW + hw.  Dropout draws by logical index, so
 * NCHW and NHWC runs drop the same elements. */
KERN_HD int64_t kern_nhwc_logical(int64_t i, int64_t C, int64_t HW)
{
	const int64_t c = i % C, r = i / C;
	const int64_t n = r / HW, hw = r % HW;
	return (n * C + c) * HW + hw;
}

/* CONCAT/SPLIT geometry, in elements.  In storage order the whole is
 * [outer, row] with row = extent_d * inner; part k owns the contiguous
 * chunk[k] = extent_d(k) * inner of each row, starting at off[k]
 * (off[parts] = row).  For a 4-d NHWC tensor the stored order is N, H, W,
 * C, so channels (d = 1) are innermost.  Returns 0, or -1 when d is out
 * of range. */
struct kern_cat {
	int64_t outer, row;
	int64_t chunk[KILN_OP_MAX_IN], off[KILN_OP_MAX_IN + 1];
	int parts;
};

static inline int kern_cat_geom(const struct kiln_op *op, struct kern_cat *g)
{
	const int split = op->type == KILN_OP_SPLIT;
	const struct kiln_tensor_desc *whole = split ? &op->in[0] : &op->out[0];
	const struct kiln_tensor_desc *part = split ? op->out : op->in;
	const int d = (int)op->i[0];
	const int nhwc = whole->ndim == 4 && whole->layout == KILN_NHWC;
	static const int pos[4] = { 0, 3, 1, 2 }; /* NHWC: stored position of N, C, H, W */
	if (d < 0 || d >= whole->ndim)
		return -1;
	int64_t sd[KILN_MAX_DIMS];
	for (int i = 0; i < whole->ndim; i++)
		sd[nhwc ? pos[i] : i] = whole->dims[i];
	const int ax = nhwc ? pos[d] : d;
	int64_t outer = 1, inner = 1;
	for (int i = 0; i < ax; i++)
		outer *= sd[i];
	for (int i = ax + 1; i < whole->ndim; i++)
		inner *= sd[i];
	g->parts = split ? op->n_out : op->n_in;
	g->outer = outer;
	g->row = whole->dims[d] * inner;
	g->off[0] = 0;
	for (int k = 0; k < g->parts; k++) {
		g->chunk[k] = part[k].dims[d] * inner;
		g->off[k + 1] = g->off[k] + g->chunk[k];
	}
	return 0;
}

/* REORDER geometry: per sample, an NCHW [C, HW] matrix and an NHWC [HW, C]
 * one are transposes of each other.  *R, *S: rows and columns of the
 * SOURCE matrix of each of *N samples; *R = 0 when the layouts agree (a
 * flat copy of the whole tensor). */
static inline void kern_reorder_geom(const struct kiln_tensor_desc *x,
				     const struct kiln_tensor_desc *y, int64_t *N, int64_t *R,
				     int64_t *S)
{
	const int xn = x->ndim == 4 && x->layout == KILN_NHWC;
	const int yn = y->ndim == 4 && y->layout == KILN_NHWC;
	*N = *R = *S = 0;
	if (x->ndim != 4 || xn == yn)
		return;
	const int64_t C = x->dims[1], HW = x->dims[2] * x->dims[3];
	*N = x->dims[0];
	*R = xn ? HW : C;
	*S = xn ? C : HW;
}

/* ---- dropout ------------------------------------------------------------- */

/* The constants of plugin.h's DROPOUT mask, computed on the host from the
 * op (the step is read on the device): key from the seed, the layer, the
 * integer threshold ceil(p * 2^24) and the scale of kept values. */
struct kern_drop {
	uint32_t k0, k1, layer, thr;
	float s;
};

static inline void kern_drop_setup(const struct kiln_op *op, struct kern_drop *d)
{
	const uint64_t seed = (uint64_t)op->i[0];
	const double p = op->f[0];
	d->k0 = (uint32_t)seed;
	d->k1 = (uint32_t)(seed >> 32) ^ 0x44524f50u; /* "DROP" */
	d->layer = (uint32_t)op->i[1];
	d->thr = (uint32_t)ceil(p * 16777216.0);
	d->s = p >= 1.0 ? 0.0f : (float)(1.0 / (1.0 - p));
}

/* The multiplier of logical element e at `step` (the counter's whole
 * i64: its high word goes above bit 16 of the layer word, as the CPU's
 * cpu_drop_word2 does; 0 below 2^32, where the masks are those drawn
 * before session 38, when the step was cut to 32 bits): d->s when kept,
 * 0 when dropped.  Random123's Philox4x32-10, the same code the CPU device
 * and tests/check_device.c use. */
KERN_D float kern_drop_scale(const struct kern_drop *d, uint64_t step, uint64_t e)
{
	philox4x32_ctr_t c = { { (uint32_t)e, (uint32_t)(e >> 32),
				 d->layer ^ (uint32_t)(step >> 32) << 16, (uint32_t)step } };
	philox4x32_key_t k = { { d->k0, d->k1 } };
	philox4x32_ctr_t r = philox4x32_R(10, c, k);
	return (r.v[0] >> 8) >= d->thr ? d->s : 0.0f;
}

/* The global index of logical element e of a tensor of R elements per
 * dims[0] row, whose row n is row row0 + n * rstride of the optimizer
 * step's global batch (the counter's in1[1], in1[2]; kiln/ops.h DROPOUT,
 * the CPU device's philox.h): g = (row0 + n * rstride) * R + e % R. */
KERN_D uint64_t kern_drop_global(uint64_t e, int64_t R, int64_t row0, int64_t rstride)
{
	const int64_t n = (int64_t)(e / (uint64_t)R);
	return (uint64_t)(row0 + n * rstride) * (uint64_t)R + e % (uint64_t)R;
}

/* ---- LAMB ---------------------------------------------------------------- */

/* The flat buffer is cut into chunks of KERN_LAMB_CHUNK elements; a piece
 * is a chunk's share of one tensor.  Piece (chunk c, tensor k) has the
 * slot c + k of the partial sums: along the buffer c and k never
 * decrease and one of them grows from one piece to the next, so slots are
 * distinct, and there are at most chunks + T of them.  The norms of
 * tensor k add its slots in chunk order: a fixed order for a given shape. */
#define KERN_LAMB_CHUNK 4096

KERN_HD int64_t kern_lamb_chunks(int64_t n)
{
	return (n + KERN_LAMB_CHUNK - 1) / KERN_LAMB_CHUNK;
}

KERN_HD int64_t kern_lamb_slots(int64_t n, int64_t T)
{
	return kern_lamb_chunks(n) + T;
}

/* Workspace of a LAMB plan: two doubles per slot (sum of p*p, of u*u),
 * then the per-tensor step lr*r (T floats), 64-byte aligned parts. */
static inline size_t kern_lamb_workspace(int64_t n, int64_t T)
{
	const size_t a = ((size_t)kern_lamb_slots(n, T) * 2 * sizeof(double) + 63) & ~(size_t)63;
	return a + (((size_t)T * sizeof(float) + 63) & ~(size_t)63);
}

/* The first tensor k with off[k+1] > e (e < n = off[T]): a binary search
 * over the nondecreasing offsets; empty tensors are skipped. */
KERN_HD int64_t kern_tensor_of(const int64_t *off, int64_t T, int64_t e)
{
	int64_t lo = 0, hi = T - 1;
	while (lo < hi) {
		const int64_t mid = (lo + hi) / 2;
		if (off[mid + 1] > e)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* ---- the bad-data record --------------------------------------------------- */

/* A kernel that meets bad data cannot stop its stream: it records what
 * it found in the context's record in device memory (struct
 * cuda_err_rec, cuda.h) and the next host sync turns the record into a
 * status and a message (kern_err_message).  kind: */
enum {
	KERN_ERR_LABEL = 1,   /* SOFTMAX_XENT: a label outside [0, C); val = C */
	KERN_ERR_STEP = 2,    /* ADAMW/LAMB, dampened SGD: a step count < 1; val = the count */
	KERN_ERR_OFFSETS = 3, /* LAMB: tensor offsets not 0 .. n nondecreasing; val = the first bad index */
	KERN_ERR_INDEX = 4    /* EMBEDDING(_BWD): an id outside [0, V) (keyed as a label); val = V */
};

/* The record's key orders errors: the smallest key wins (atomicMin), so
 * the first bad row of a batch is the one reported whatever the block
 * order.  Label errors key by (row << 32 | label); the others come after
 * every label error. */
KERN_HD unsigned long long kern_err_key_label(int64_t row, int32_t label)
{
	return ((unsigned long long)row << 32) | (unsigned long long)(uint32_t)label;
}

KERN_HD unsigned long long kern_err_key_other(int kind)
{
	return (1ull << 63) | (unsigned long long)kind;
}

/* The message of a record (key != ~0): KILN_EDATA for a bad label or id,
 * KILN_EINVAL for the others.  name: the op's name. */
static inline kiln_status kern_err_message(unsigned long long key, long long val, int kind,
					   const char *name, char *buf, size_t n)
{
	switch (kind) {
	case KERN_ERR_LABEL:
		snprintf(buf, n, "cuda: %s: label %d of row %lld is outside [0, %lld)", name,
			 (int)(int32_t)(uint32_t)(key & 0xffffffffu), (long long)(key >> 32), val);
		return KILN_EDATA;
	case KERN_ERR_INDEX:
		snprintf(buf, n, "cuda: %s: index %d at position %lld is outside [0, %lld)", name,
			 (int)(int32_t)(uint32_t)(key & 0xffffffffu), (long long)(key >> 32), val);
		return KILN_EDATA;
	case KERN_ERR_STEP:
		snprintf(buf, n, "cuda: %s: step count %lld; it is 1-based (advance it before the step)",
			 name, val);
		return KILN_EINVAL;
	case KERN_ERR_OFFSETS:
		snprintf(buf, n, "cuda: %s: tensor offsets must run from 0 to n, nondecreasing; entry %lld is not",
			 name, val);
		return KILN_EINVAL;
	default:
		snprintf(buf, n, "cuda: %s: a kernel left an unknown error record (kind %d)", name, kind);
		return KILN_EINTERNAL;
	}
}

#endif /* KILN_CUDA_KERN_H */
