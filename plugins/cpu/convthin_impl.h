/* plugins/cpu/convthin_impl.h - what convthin.c (eligibility, geometry,
 * drivers, prepare) shares with its kernels: convthin_f32.c (f32 NCHW and
 * NHWC, and bf16 in f32 arithmetic) and convthin_bf16.c (bf16 by
 * AVX512_BF16's dot products).  convthin.c's header comment says how
 * they work.  Internal to the CPU plugin (hidden symbols). */
#ifndef KILN_CPU_CONVTHIN_IMPL_H
#define KILN_CPU_CONVTHIN_IMPL_H

#include "convthin.h"
#include "v16.h" /* CPU_V16, CPU_HAVE_V16, cpu_v16_bf16_ld, cpu_v16_bf16_st */

#define CT_ALIGN 64
#define CT_MAX_C 4   /* input channels: beyond, oneDNN's kernels are at home */
#define CT_MAX_K 7   /* kernel height and width */
#define CT_WG_TAPS 25 /* a weight gradient's taps a channel: its registers */
#define CT_MAX_WP 4096 /* padded row, floats */
/* The forward's register block: CT_FR output rows x CT_OB output
 * channels of one column vector (24 accumulators), so that each tap's
 * CT_OB weight broadcasts serve CT_FR rows.  With 16 channels of one row
 * (each FMA broadcasting its weight from memory) a core ran at 61% of its
 * FMA peak on the Zen 4: its broadcasts, not its FMAs, were the limit. */
#define CT_FR 3
#define CT_OB 8
/* The weight gradient's: CT_WR output rows a pass, each input row's
 * shifted vectors loaded once for both (unaligned loads across cache
 * lines held one row at a time to 52% of the FMA peak). */
#define CT_WR 2
/* NHWC: a forward block's pixels (x 2 vectors of 16 channels) */
#define CT_NP 12

/* The geometry of a plan (cpu_convthin_prepare keeps it in sz, rows, cols). */
struct ct_geom {
	int64_t N, C, H, W, O, KH, KW, ph, pw;
	int64_t OH, OW, nxv; /* output rows, columns, column vectors */
	int64_t HP, WP;      /* a padded plane's rows and row length (floats) */
	int64_t T, nob;      /* taps C x KH x KW; blocks of CT_OB output channels */
	int slots;           /* thread slots in the workspace */
	int nat;             /* bf16 by AVX512_BF16's dot products (ct_nat) */
	int nhwc;            /* NHWC activations (one input channel) */
	int64_t nov, OP;     /* NHWC: vectors of 16 output channels, and their floats */
	int64_t NP, nx32, WPB; /* native: tap-row pairs (+ a single); 32-column
				* vectors; a padded bf16 row (halves) */
	/* workspace offsets (floats): the forward's tap-major weights and
	 * bias, the first slot, and the floats between two slots */
	size_t wt_at, b_at, slot_at, slot_len, acc_at;
};

#if CPU_HAVE_V16
/* the lanes of column vector xv that are outputs */
static inline __mmask16 ct_lanes(const struct ct_geom *g, int64_t xv)
{
	const int64_t left = g->OW - xv * 16;
	return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
}

/* the columns of 32-column vector xv that are outputs */
static inline __mmask32 ct_lanes32(const struct ct_geom *g, int64_t xv)
{
	const int64_t left = g->OW - xv * 32;
	return left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
}

/* bf16's dot products (convthin_bf16.c) */
#define CT_BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* ---- convthin_f32.c ---- */
/* Sample n's C input planes, padded, into pl (C x HP x WP floats; bf16
 * widened) */
CPU_V16 void ct_plane(const struct ct_geom *g, const void *x, int bf16, int64_t n, float *pl);
/* NCHW output rows oy .. oy + nr - 1 (nr <= CT_FR) of sample n */
CPU_V16 void ct_fwd_rows(const struct ct_geom *g, const float *pl, const float *wt, const float *b,
			 int relu, void *y, int bf16, int64_t n, int64_t oy, int nr);
/* an NCHW weight gradient's sums for one output and input channel, by
 * kernel width (1 .. CT_MAX_K) */
typedef void (*ct_wg_fn)(const struct ct_geom *, const float *, const void *, int, float *, int);
extern const ct_wg_fn ct_wg_fns[CT_MAX_K + 1];
/* A's sums across their lanes into dw[o] (and db[o]), written or added */
CPU_V16 void ct_wg_out(const struct ct_geom *g, const float *A, int64_t o, float *dw, float *db, int acc);
/* NHWC output row oy of sample n, every pixel and channel */
CPU_V16 void ct_fwd_nhwc_row(const struct ct_geom *g, const float *pl, const float *wt, const float *b,
			     int relu, float *y, int64_t n, int64_t oy);
/* an NHWC weight gradient's sums for one vector of 16 channels over one
 * sample, by kernel width */
typedef void (*ct_wgh_fn)(const struct ct_geom *, const float *, const float *, int64_t, int64_t, float *);
extern const ct_wgh_fn ct_wgh_fns[CT_MAX_K + 1];
/* A's channel vector ov (its lanes are channels) into dw and db */
void ct_wg_nhwc_out(const struct ct_geom *g, const float *A, int64_t ov, float *dw, float *db, int acc);

/* ---- convthin_bf16.c ---- */
/* sample n's Q and S planes of the native forward */
CT_BF void ct_pairs(const struct ct_geom *g, const uint16_t *x, int64_t n, uint32_t *Q, uint32_t *S);
/* native NCHW output rows oy .. oy + nr - 1 */
CT_BF void ct_fwd_nat_rows(const struct ct_geom *g, const uint32_t *Q, const uint32_t *S, const uint32_t *wq,
			   const float *b, int relu, uint16_t *y, int64_t n, int64_t oy, int nr);
/* sample n's padded bf16 planes of the native weight gradient */
void ct_plane_bf(const struct ct_geom *g, const uint16_t *x, int64_t n, uint16_t *pl);
/* the native weight gradient's sums, by kernel width */
typedef void (*ct_wgn_fn)(const struct ct_geom *, const uint16_t *, const uint16_t *, float *, int);
extern const ct_wgn_fn ct_wgn_fns[CT_MAX_K + 1];
#endif /* CPU_HAVE_V16 */

#endif
