/* plugins/cpu/convthin_f32.c - convthin.c's kernels in f32 arithmetic:
 * NCHW (16 output columns a vector; bf16 widened on load, rounded on
 * store) and NHWC with one input channel (16 output channels a vector).
 * convthin.c's header comment says how. */
#include "convthin_impl.h"

#include <string.h>

#if CPU_HAVE_V16

/* Sample n's C input planes, padded, into pl (C x HP x WP floats). */
CPU_V16 void ct_plane(const struct ct_geom *g, const void *x, int bf16, int64_t n, float *pl)
{
	memset(pl, 0, (size_t)(g->C * g->HP * g->WP) * sizeof *pl);
	for (int64_t c = 0; c < g->C; c++)
		for (int64_t h = 0; h < g->H; h++) {
			const int64_t src = ((n * g->C + c) * g->H + h) * g->W;
			float *dst = pl + (c * g->HP + h + g->ph) * g->WP + g->pw;
			if (!bf16) {
				memcpy(dst, (const float *)x + src, (size_t)g->W * sizeof *dst);
				continue;
			}
			for (int64_t j = 0; j < g->W; j += 16) {
				const __mmask16 m = g->W - j >= 16 ? 0xffff : (__mmask16)((1u << (g->W - j)) - 1);
				_mm512_mask_storeu_ps(dst + j, m,
						      cpu_v16_bf16_ld((const uint16_t *)x + src + j, m));
			}
		}
}

/* Output rows oy .. oy + NR - 1 of sample n, every channel, from its
 * padded planes pl: wt the tap-major weights, b the bias (CT_OB a block,
 * 0 past O).  NR (1 .. CT_FR) is a constant at each call (ct_fwd_rows). */
CPU_V16 static inline __attribute__((always_inline)) void
ct_fwd_body(const struct ct_geom *g, const float *pl, const float *wt, const float *b, int relu, void *y,
	    int bf16, int64_t n, int64_t oy, const int NR)
{
	const __m512 zero = _mm512_setzero_ps();
	for (int64_t xv = 0; xv < g->nxv; xv++) {
		const __mmask16 m = ct_lanes(g, xv);
		for (int64_t ob = 0; ob < g->nob; ob++) {
			__m512 acc[CT_FR][CT_OB];
#pragma GCC unroll 8
			for (int o = 0; o < CT_OB; o++) {
				const __m512 bo = _mm512_set1_ps(b[ob * CT_OB + o]);
#pragma GCC unroll 3
				for (int r = 0; r < CT_FR; r++)
					acc[r][o] = bo;
			}
			const float *wk = wt + ob * g->T * CT_OB;
			for (int64_t c = 0; c < g->C; c++)
				for (int64_t ky = 0; ky < g->KH; ky++) {
					const float *row = pl + (c * g->HP + oy + ky) * g->WP + xv * 16;
					for (int64_t kx = 0; kx < g->KW; kx++, wk += CT_OB) {
						__m512 v[CT_FR];
#pragma GCC unroll 3
						for (int r = 0; r < NR; r++)
							v[r] = _mm512_loadu_ps(row + r * g->WP + kx);
#pragma GCC unroll 8
						for (int o = 0; o < CT_OB; o++) {
							const __m512 w = _mm512_set1_ps(wk[o]);
#pragma GCC unroll 3
							for (int r = 0; r < NR; r++)
								acc[r][o] = _mm512_fmadd_ps(v[r], w, acc[r][o]);
						}
					}
				}
			const int64_t no = g->O - ob * CT_OB < CT_OB ? g->O - ob * CT_OB : CT_OB;
#pragma GCC unroll 8
			for (int o = 0; o < CT_OB; o++) {
				if (o >= no)
					break;
#pragma GCC unroll 3
				for (int r = 0; r < NR; r++) {
					const __m512 v = relu ? _mm512_max_ps(zero, acc[r][o]) : acc[r][o];
					const int64_t at = ((n * g->O + ob * CT_OB + o) * g->OH + oy + r) * g->OW + xv * 16;
					if (bf16)
						cpu_v16_bf16_st((uint16_t *)y + at, m, v);
					else
						_mm512_mask_storeu_ps((float *)y + at, m, v);
				}
			}
		}
	}
}

/* ct_fwd_body of nr (1 .. CT_FR) rows */
CPU_V16 void ct_fwd_rows(const struct ct_geom *g, const float *pl, const float *wt, const float *b,
				int relu, void *y, int bf16, int64_t n, int64_t oy, int nr)
{
	if (nr == 3)
		ct_fwd_body(g, pl, wt, b, relu, y, bf16, n, oy, 3);
	else if (nr == 2)
		ct_fwd_body(g, pl, wt, b, relu, y, bf16, n, oy, 2);
	else
		ct_fwd_body(g, pl, wt, b, relu, y, bf16, n, oy, 1);
}

/* dy's column vector xv of row oy (masked lanes 0) */
CPU_V16 static inline __m512 ct_dy(const struct ct_geom *g, const void *dyp, int bf16, int64_t oy, int64_t xv,
				   __mmask16 m)
{
	const int64_t at = oy * g->OW + xv * 16;
	return bf16 ? cpu_v16_bf16_ld((const uint16_t *)dyp + at, m)
		    : _mm512_maskz_loadu_ps(m, (const float *)dyp + at);
}

/* One output channel's sums over one sample for input channel c: A (T + 1
 * lines of 16: the taps, then db) loaded, dy's OH x OW plane (dyp)
 * against the padded plane pc, stored back.  KWC, the kernel width, is a
 * constant at each call (ct_wg_kw), so the KH x KWC <= 25 accumulators
 * are registers.  CT_WR output rows at a time: input row oy + i (i <
 * KH + CT_WR - 1) is loaded once, shift by shift, for the rows it meets. */
CPU_V16 static inline __attribute__((always_inline)) void
ct_wg_body(const struct ct_geom *g, const float *pc, const void *dyp, int bf16, float *A, int with_db,
	   const int KWC)
{
	enum { R = CT_WG_TAPS };
	const int KH = (int)g->KH, nt = KH * KWC;
	__m512 acc[R], db = _mm512_setzero_ps();
#pragma GCC unroll 25
	for (int k = 0; k < R; k++) /* (the unused ones zeroed, never read) */
		acc[k] = k < nt ? _mm512_load_ps(A + k * 16) : _mm512_setzero_ps();
	if (with_db)
		db = _mm512_load_ps(A + (size_t)g->T * 16);
	for (int64_t xv = 0; xv < g->nxv; xv++) {
		const __mmask16 m = ct_lanes(g, xv);
		const float *col = pc + xv * 16;
		int64_t oy = 0;
		for (; oy + CT_WR <= g->OH; oy += CT_WR) {
			__m512 d[CT_WR];
#pragma GCC unroll 2
			for (int r = 0; r < CT_WR; r++) {
				d[r] = ct_dy(g, dyp, bf16, oy + r, xv, m);
				db = _mm512_add_ps(db, d[r]);
			}
			/* input row oy + i meets output row oy + r at tap row i - r */
#pragma GCC unroll 26
			for (int i = 0; i < R / KWC + CT_WR - 1; i++) {
				if (i >= KH + CT_WR - 1)
					break;
				const float *row = col + (oy + i) * g->WP;
#pragma GCC unroll 7
				for (int kx = 0; kx < KWC; kx++) {
					const __m512 v = _mm512_loadu_ps(row + kx);
#pragma GCC unroll 2
					for (int r = 0; r < CT_WR; r++)
						if (i - r >= 0 && i - r < KH && (i - r) * KWC + kx < R)
							acc[(i - r) * KWC + kx] = _mm512_mask3_fmadd_ps(
								d[r], v, acc[(i - r) * KWC + kx], m);
				}
			}
		}
		for (; oy < g->OH; oy++) { /* the last row alone */
			const __m512 d = ct_dy(g, dyp, bf16, oy, xv, m);
			db = _mm512_add_ps(db, d);
			const float *row = col + oy * g->WP;
#pragma GCC unroll 25
			for (int k = 0; k < R; k++)
				if (k < nt)
					acc[k] = _mm512_mask3_fmadd_ps(
						d, _mm512_loadu_ps(row + (k / KWC) * g->WP + k % KWC), acc[k], m);
		}
	}
#pragma GCC unroll 25
	for (int k = 0; k < R; k++)
		if (k < nt)
			_mm512_store_ps(A + k * 16, acc[k]);
	if (with_db)
		_mm512_store_ps(A + (size_t)g->T * 16, db);
}

#define CT_WG_KW(K)                                                                           \
	CPU_V16 static void ct_wg_kw##K(const struct ct_geom *g, const float *pc, const void *dyp, \
					int bf16, float *A, int with_db)                           \
	{                                                                                     \
		ct_wg_body(g, pc, dyp, bf16, A, with_db, K);                                  \
	}
CT_WG_KW(1)
CT_WG_KW(2)
CT_WG_KW(3)
CT_WG_KW(4)
CT_WG_KW(5)
CT_WG_KW(6)
CT_WG_KW(7)

const ct_wg_fn ct_wg_fns[CT_MAX_K + 1] = { NULL,	      ct_wg_kw1, ct_wg_kw2, ct_wg_kw3,
						  ct_wg_kw4, ct_wg_kw5, ct_wg_kw6, ct_wg_kw7 };

/* A's sums across their lanes into dw[o] (and db[o]), written or added */
CPU_V16 void ct_wg_out(const struct ct_geom *g, const float *A, int64_t o, float *dw, float *db,
			      int acc)
{
	for (int64_t k = 0; k < g->T; k++) {
		const float s = _mm512_reduce_add_ps(_mm512_load_ps(A + k * 16));
		dw[o * g->T + k] = acc ? dw[o * g->T + k] + s : s;
	}
	if (db) {
		const float s = _mm512_reduce_add_ps(_mm512_load_ps(A + g->T * 16));
		db[o] = acc ? db[o] + s : s;
	}
}

/* ---- NHWC (one input channel) -----------------------------------------
 *
 * The output's channels are its vectors: a block of CT_NP pixels of one
 * output row x up to 2 vectors of 16 channels (24 accumulators), each tap
 * 2 weight vectors ([tap][OP], 0 past O) and one broadcast of the input a
 * pixel (serving both vectors).  The weight gradient takes one vector of
 * 16 channels at a time: a tap's 16 sums are one register (KH x KW <= 25
 * of them), each input broadcast serving two adjacent pixels (x[ox + j]
 * is tap j of pixel ox and tap j - 1 of pixel ox + 1). */


CPU_V16 static inline __attribute__((always_inline)) void
ct_fwd_nhwc_body(const struct ct_geom *g, const float *pl, const float *wt, const float *b, int relu,
		 float *y, int64_t n, int64_t oy, int64_t ox0, int np, int64_t ov0, const int NV)
{
	const __m512 zero = _mm512_setzero_ps();
	__m512 acc[CT_NP][2];
#pragma GCC unroll 12
	for (int q = 0; q < CT_NP; q++)
#pragma GCC unroll 2
		for (int v = 0; v < NV; v++)
			acc[q][v] = _mm512_load_ps(b + (ov0 + v) * 16);
	const float *wk = wt + ov0 * 16;
	for (int64_t ky = 0; ky < g->KH; ky++) {
		const float *row = pl + (oy + ky) * g->WP + ox0;
		for (int64_t kx = 0; kx < g->KW; kx++, wk += g->OP) {
			__m512 w[2];
#pragma GCC unroll 2
			for (int v = 0; v < NV; v++)
				w[v] = _mm512_load_ps(wk + v * 16);
#pragma GCC unroll 12
			for (int q = 0; q < CT_NP; q++) {
				if (q >= np)
					break;
				const __m512 xq = _mm512_set1_ps(row[q + kx]);
#pragma GCC unroll 2
				for (int v = 0; v < NV; v++)
					acc[q][v] = _mm512_fmadd_ps(xq, w[v], acc[q][v]);
			}
		}
	}
#pragma GCC unroll 12
	for (int q = 0; q < CT_NP; q++) {
		if (q >= np)
			break;
		float *yq = y + ((n * g->OH + oy) * g->OW + ox0 + q) * g->O;
#pragma GCC unroll 2
		for (int v = 0; v < NV; v++) {
			const int64_t left = g->O - (ov0 + v) * 16;
			const __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
			_mm512_mask_storeu_ps(yq + (ov0 + v) * 16, m,
					      relu ? _mm512_max_ps(zero, acc[q][v]) : acc[q][v]);
		}
	}
}

/* Output row oy of sample n, every pixel and channel (NHWC) */
CPU_V16 void ct_fwd_nhwc_row(const struct ct_geom *g, const float *pl, const float *wt, const float *b,
				    int relu, float *y, int64_t n, int64_t oy)
{
	for (int64_t ox = 0; ox < g->OW; ox += CT_NP) {
		const int np = g->OW - ox < CT_NP ? (int)(g->OW - ox) : CT_NP;
		int64_t ov = 0;
		for (; ov + 2 <= g->nov; ov += 2)
			ct_fwd_nhwc_body(g, pl, wt, b, relu, y, n, oy, ox, np, ov, 2);
		if (ov < g->nov)
			ct_fwd_nhwc_body(g, pl, wt, b, relu, y, n, oy, ox, np, ov, 1);
	}
}

/* dy's vector ov of pixel (n, oy, ox), NHWC (channels past O: 0) */
CPU_V16 static inline __m512 ct_dy_nhwc(const struct ct_geom *g, const float *dy, int64_t n, int64_t oy,
					int64_t ox, int64_t ov)
{
	const int64_t left = g->O - ov * 16;
	const __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
	return _mm512_maskz_loadu_ps(m, dy + ((n * g->OH + oy) * g->OW + ox) * g->O + ov * 16);
}

/* Channel vector ov's sums over sample n: A ([tap][16], then db) loaded,
 * the pixels added, stored back; KWC a constant (ct_wgh_kw). */
CPU_V16 static inline __attribute__((always_inline)) void
ct_wg_nhwc_body(const struct ct_geom *g, const float *pl, const float *dy, int64_t n, int64_t ov, float *A,
		const int KWC)
{
	enum { R = CT_WG_TAPS };
	const int KH = (int)g->KH, nt = KH * KWC;
	__m512 acc[R];
	/* this sample's sums from 0, added to A's at the end: a lane is one
	 * channel, so one register would otherwise carry a sum over every
	 * pixel of the batch (at batch 16 that was 1.1e-5 of the rms off
	 * the double loop, against 2.2e-6 with the sample's sums apart) */
#pragma GCC unroll 25
	for (int k = 0; k < R; k++)
		acc[k] = _mm512_setzero_ps();
	__m512 db = _mm512_setzero_ps();
	for (int64_t oy = 0; oy < g->OH; oy++) {
		int64_t ox = 0;
		for (; ox + 2 <= g->OW; ox += 2) {
			const __m512 d0 = ct_dy_nhwc(g, dy, n, oy, ox, ov), d1 = ct_dy_nhwc(g, dy, n, oy, ox + 1, ov);
			db = _mm512_add_ps(db, _mm512_add_ps(d0, d1));
#pragma GCC unroll 25
			for (int ky = 0; ky < R / KWC; ky++) {
				if (ky >= KH)
					break;
				const float *row = pl + (oy + ky) * g->WP + ox;
#pragma GCC unroll 8
				for (int j = 0; j <= KWC; j++) {
					const __m512 xj = _mm512_set1_ps(row[j]);
					if (j < KWC)
						acc[ky * KWC + j] = _mm512_fmadd_ps(d0, xj, acc[ky * KWC + j]);
					if (j >= 1)
						acc[ky * KWC + j - 1] = _mm512_fmadd_ps(d1, xj, acc[ky * KWC + j - 1]);
				}
			}
		}
		if (ox < g->OW) { /* an odd row's last pixel */
			const __m512 d0 = ct_dy_nhwc(g, dy, n, oy, ox, ov);
			db = _mm512_add_ps(db, d0);
#pragma GCC unroll 25
			for (int k = 0; k < R; k++)
				if (k < nt)
					acc[k] = _mm512_fmadd_ps(d0, _mm512_set1_ps(pl[(oy + k / KWC) * g->WP + ox + k % KWC]),
								 acc[k]);
		}
	}
#pragma GCC unroll 25
	for (int k = 0; k < R; k++)
		if (k < nt)
			_mm512_store_ps(A + k * 16, _mm512_add_ps(_mm512_load_ps(A + k * 16), acc[k]));
	_mm512_store_ps(A + (size_t)g->T * 16, _mm512_add_ps(_mm512_load_ps(A + (size_t)g->T * 16), db));
}

#define CT_WGH_KW(K)                                                                              \
	CPU_V16 static void ct_wgh_kw##K(const struct ct_geom *g, const float *pl, const float *dy,   \
					 int64_t n, int64_t ov, float *A)                              \
	{                                                                                        \
		ct_wg_nhwc_body(g, pl, dy, n, ov, A, K);                                         \
	}
CT_WGH_KW(1)
CT_WGH_KW(2)
CT_WGH_KW(3)
CT_WGH_KW(4)
CT_WGH_KW(5)
CT_WGH_KW(6)
CT_WGH_KW(7)

const ct_wgh_fn ct_wgh_fns[CT_MAX_K + 1] = { NULL,	 ct_wgh_kw1, ct_wgh_kw2, ct_wgh_kw3,
						    ct_wgh_kw4, ct_wgh_kw5, ct_wgh_kw6, ct_wgh_kw7 };

/* A's channel vector ov (its lanes are channels) into dw and db */
void ct_wg_nhwc_out(const struct ct_geom *g, const float *A, int64_t ov, float *dw, float *db, int acc)
{
	for (int64_t l = 0; l < 16 && ov * 16 + l < g->O; l++) {
		const int64_t o = ov * 16 + l;
		for (int64_t k = 0; k < g->T; k++)
			dw[o * g->T + k] = acc ? dw[o * g->T + k] + A[k * 16 + l] : A[k * 16 + l];
		if (db)
			db[o] = acc ? db[o] + A[g->T * 16 + l] : A[g->T * 16 + l];
	}
}

#endif /* CPU_HAVE_V16 */
