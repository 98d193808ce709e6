/* plugins/cpu/philox.h - KILN_OP_DROPOUT's mask (kiln/ops.h) as the CPU
 * kernels draw it: dropout (act.c) and the attention probabilities'
 * dropout (attn.c) share it, so both are the same function of (seed,
 * layer, step, element).
 *
 * The mask, which every device must reproduce bit for bit.  With p = f[0],
 * seed = (uint64_t)i[0], layer = (uint32_t)i[1], in1 the i64[3] counter
 * { step, row0, rstride } (ABI 2.20), and e the element's LOGICAL index
 * (row-major over the dims as listed: for a 4-d NHWC activation
 * ((n*C + c)*H + h)*W + w, so NCHW and NHWC runs drop the same elements),
 * n = e / R its row (R = elements per dims[0] row) and g its index in the
 * optimizer step's global batch, whatever rank or micro-batch holds it:
 *
 *   g   = (row0 + n * rstride) * R + e % R
 *   ctr = { (uint32_t)g, (uint32_t)(g >> 32), layer ^ (step >> 32) << 16,
 *           (uint32_t)step }                   (cpu_drop_word2, below)
 *   key = { (uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x44524f50 }  ("DROP")
 *   r   = philox4x32_10(ctr, key)              (Random123, 10 rounds)
 *   keep  iff  (r.v[0] >> 8) >= ceil(p * 2^24)
 *   y   = x * (keep ? s : 0),   s = (float)(1.0 / (1.0 - p))  (double, rounded)
 *
 * The keep rule is u >= p for u = (r.v[0] >> 8) / 2^24 in exact arithmetic
 * (an integer compare, so no float rounding can differ across devices).
 * s is multiplied, as PyTorch does (x * mask * (1/(1-p))), not divided, and
 * like PyTorch a dropped inf or NaN gives NaN (it is a product, not a
 * select).  p = 0 copies; p = 1 gives 0 * x. */
#ifndef KILN_CPU_PHILOX_H
#define KILN_CPU_PHILOX_H

#include <math.h>   /* ceil */
#include <stdint.h>

/* r.v[0] of Philox4x32-10 (Random123's philox4x32_R(10, ctr, key)) into
 * `out`, written out in plain integer operations so `omp simd` vectorises
 * it: Random123's struct-returning rounds, and even a static inline
 * function inlined into a target_clones one, stay scalar with GCC 12.
 * tests/check_device.c checks the result against Random123 itself. */
#define CPU_PHILOX_ROUND(c0, c1, c2, c3, k0, k1)                                          \
	do {                                                                              \
		const uint64_t p0_ = (uint64_t)0xD2511F53u * c0;                          \
		const uint64_t p1_ = (uint64_t)0xCD9E8D57u * c2;                          \
		const uint32_t n0_ = (uint32_t)(p1_ >> 32) ^ c1 ^ k0;                     \
		const uint32_t n2_ = (uint32_t)(p0_ >> 32) ^ c3 ^ k1;                     \
		c1 = (uint32_t)p1_, c3 = (uint32_t)p0_, c0 = n0_, c2 = n2_;               \
		k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;                                     \
	} while (0)
#define CPU_PHILOX_V0(out, e, layer, step, key0, key1)                                    \
	do {                                                                              \
		uint32_t c0_ = (uint32_t)(e), c1_ = (uint32_t)((uint64_t)(e) >> 32);      \
		uint32_t c2_ = (layer), c3_ = (step), k0_ = (key0), k1_ = (key1);         \
		/* ten rounds, unrolled by hand: a loop here is not vectorised */         \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		CPU_PHILOX_ROUND(c0_, c1_, c2_, c3_, k0_, k1_);                           \
		(out) = c0_;                                                              \
	} while (0)

struct drop {
	uint32_t k0, k1; /* the key */
	uint32_t layer, step, thr; /* layer: the counter's word 2 (cpu_drop_word2) */
	float s;
	/* row n of this tensor is row row0 + n * rstride of the step's global
	 * batch (the counter's in1[1], in1[2]) */
	int64_t row0, rstride;
	/* added to every index CPU_DROP_SCALE draws for: (global row - local
	 * row) * R while one row's elements are drawn (0: the caller passes
	 * global indices, as attention does) */
	uint64_t off;
};

/* s for a kept element e (+ d.off), 0 for a dropped one, into `out`. */
#define CPU_DROP_SCALE(out, e, d)                                                         \
	do {                                                                              \
		uint32_t v0_;                                                             \
		CPU_PHILOX_V0(v0_, (uint64_t)(e) + (d).off, (d).layer, (d).step, (d).k0,   \
			      (d).k1);                                                    \
		(out) = (v0_ >> 8) >= (d).thr ? (d).s : 0.0f;                             \
	} while (0)

/* The global row of local row n (the sample's place in the optimizer
 * step's global batch: rank, accumulation micro-step and pipeline micro-
 * batch all map to it). */
static inline int64_t cpu_drop_row(const struct drop *d, int64_t n)
{
	return d->row0 + n * d->rstride;
}

/* The offset that makes row n's local indices (n * R + c) global. */
static inline uint64_t cpu_drop_off(const struct drop *d, int64_t n, int64_t R)
{
	return (uint64_t)(cpu_drop_row(d, n) - n) * (uint64_t)R;
}

/* The counter's word 2: the layer id with the step's high word above bit
 * 16, so a step's mask is distinct from every other step's below 2^48 for
 * layer ids below 2^16 (kiln's are below KILN_MAX_LAYERS).  That high word
 * is 0 below step 2^32, where the masks are the ones drawn before session
 * 38, when the step was cut to 32 bits and the masks of step s and
 * s + 2^32 were the same.  The CUDA device's kern_drop_scale computes it
 * too (plugins/cuda/kern.h). */
static inline uint32_t cpu_drop_word2(int64_t layer, int64_t step)
{
	return (uint32_t)layer ^ (uint32_t)((uint64_t)step >> 32) << 16;
}

/* The draw's constants for one run: seed, layer id, the device counter
 * ctr i64[3] = { step, row0, rstride } and the probability p. */
static inline struct drop cpu_drop_init(uint64_t seed, int64_t layer, const int64_t *ctr, double p)
{
	return (struct drop){
		.k0 = (uint32_t)seed,
		.k1 = (uint32_t)(seed >> 32) ^ 0x44524f50u,
		.layer = cpu_drop_word2(layer, ctr[0]),
		.step = (uint32_t)ctr[0],
		.thr = (uint32_t)ceil(p * 16777216.0),
		.s = p >= 1.0 ? 0.0f : (float)(1.0 / (1.0 - p)),
		.row0 = ctr[1],
		.rstride = ctr[2],
		.off = 0,
	};
}

#endif /* KILN_CPU_PHILOX_H */
