/* plugins/cpu/convthin_bf16.c - convthin.c's bf16 kernels by
 * AVX512_BF16's dot products (NCHW). */
#include "convthin_impl.h"

#include <string.h>

#if CPU_HAVE_V16

/* ---- bf16 by AVX512_BF16's dot products (ct_nat) ------------------------
 *
 * vdpbf16ps adds two products of bf16 pairs into each f32 lane, so a tap
 * pair costs one instruction.  The forward pairs taps of adjacent rows
 * (ky, ky + 1) at one kx: plane Q holds dwords (x[r][j], x[r + 1][j]), S
 * (x[r][j], 0) for an odd KH's last row, and the weights the matching
 * pairs (w[ky][kx], w[ky + 1][kx]) and (w[KH - 1][kx], 0): 15 dot
 * products for a 5x5 kernel's 25 FMAs.  The weight gradient pairs
 * adjacent columns: a lane adds dy[2l] x[2l + kx] + dy[2l + 1] x[2l + 1 +
 * kx], so one instruction covers 32 output columns (the bf16 rows read as
 * they are, padded).  The products are exact and the sums f32, as oneDNN's
 * bf16 kernels; denormals are flushed (the instruction's rule), so an
 * output is never a denormal and vcvtneps2bf16 rounds it to nearest even
 * as half_f32_bf16 does.  Not the f32 op's bytes: its sums are in another
 * order (tests/check_cpu_convthin bounds both against a double loop). */

/* Sample n's planes for the native forward: S (zero-extended bf16) and Q
 * (S's row r | S's row r + 1 << 16), C x HP x WP dwords each. */
CT_BF void ct_pairs(const struct ct_geom *g, const uint16_t *x, int64_t n, uint32_t *Q, uint32_t *S)
{
	const size_t plane = (size_t)(g->HP * g->WP);
	memset(S, 0, (size_t)g->C * plane * sizeof *S);
	for (int64_t c = 0; c < g->C; c++) {
		uint32_t *sc = S + c * plane, *qc = Q + c * plane;
		for (int64_t h = 0; h < g->H; h++) {
			const uint16_t *src = x + ((n * g->C + c) * g->H + h) * g->W;
			uint32_t *dst = sc + (h + g->ph) * g->WP + g->pw;
			for (int64_t j = 0; j < g->W; j += 16) {
				const __mmask16 m = g->W - j >= 16 ? 0xffff : (__mmask16)((1u << (g->W - j)) - 1);
				_mm512_mask_storeu_epi32(dst + j, m, _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + j)));
			}
		}
		for (int64_t r = 0; r < g->HP; r++)
			for (int64_t j = 0; j < g->WP; j += 16) {
				const __m512i a = _mm512_loadu_si512(sc + r * g->WP + j);
				const __m512i b = r + 1 < g->HP ? _mm512_loadu_si512(sc + (r + 1) * g->WP + j)
								: _mm512_setzero_si512();
				_mm512_storeu_si512(qc + r * g->WP + j, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
			}
	}
}

/* v rounded to bf16 (vcvtneps2bf16: never a denormal here) to y, lanes m */
CT_BF static inline void ct_st_bf(void *y, __mmask16 m, __m512 v)
{
	_mm256_mask_storeu_epi16(y, m, (__m256i)_mm512_cvtneps_pbh(v));
}

/* ct_fwd_body by dot products: wq the weight pairs, [ob][c][p][kx][CT_OB]
 * dwords (p < KH / 2: rows 2p, 2p + 1; p = KH / 2 for an odd KH: the
 * last row and 0). */
CT_BF static inline __attribute__((always_inline)) void
ct_fwd_nat_body(const struct ct_geom *g, const uint32_t *Q, const uint32_t *S, const uint32_t *wq,
		const float *b, int relu, uint16_t *y, int64_t n, int64_t oy, const int NR)
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
			const uint32_t *wk = wq + ob * g->C * g->NP * g->KW * CT_OB;
			for (int64_t c = 0; c < g->C; c++)
				for (int64_t p = 0; p < g->NP; p++) {
					const uint32_t *pl = 2 * p + 1 < g->KH ? Q : S;
					const uint32_t *row = pl + (c * g->HP + oy + 2 * p) * g->WP + xv * 16;
					for (int64_t kx = 0; kx < g->KW; kx++, wk += CT_OB) {
						__m512bh v[CT_FR];
#pragma GCC unroll 3
						for (int r = 0; r < NR; r++)
							v[r] = (__m512bh)_mm512_loadu_si512(row + r * g->WP + kx);
#pragma GCC unroll 8
						for (int o = 0; o < CT_OB; o++) {
							const __m512bh w = (__m512bh)_mm512_set1_epi32((int)wk[o]);
#pragma GCC unroll 3
							for (int r = 0; r < NR; r++)
								acc[r][o] = _mm512_dpbf16_ps(acc[r][o], v[r], w);
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
					ct_st_bf(y + ((n * g->O + ob * CT_OB + o) * g->OH + oy + r) * g->OW + xv * 16, m, v);
				}
			}
		}
	}
}

CT_BF void ct_fwd_nat_rows(const struct ct_geom *g, const uint32_t *Q, const uint32_t *S,
				  const uint32_t *wq, const float *b, int relu, uint16_t *y, int64_t n,
				  int64_t oy, int nr)
{
	if (nr == 3)
		ct_fwd_nat_body(g, Q, S, wq, b, relu, y, n, oy, 3);
	else if (nr == 2)
		ct_fwd_nat_body(g, Q, S, wq, b, relu, y, n, oy, 2);
	else
		ct_fwd_nat_body(g, Q, S, wq, b, relu, y, n, oy, 1);
}

/* Sample n's padded bf16 planes for the native weight gradient: C x HP x
 * WPB halves. */
void ct_plane_bf(const struct ct_geom *g, const uint16_t *x, int64_t n, uint16_t *pl)
{
	memset(pl, 0, (size_t)(g->C * g->HP * g->WPB) * sizeof *pl);
	for (int64_t c = 0; c < g->C; c++)
		for (int64_t h = 0; h < g->H; h++)
			memcpy(pl + (c * g->HP + h + g->ph) * g->WPB + g->pw, x + ((n * g->C + c) * g->H + h) * g->W,
			       (size_t)g->W * sizeof *pl);
}

/* dy's 32 columns from xv32 * 32 of row oy, as bf16 pairs (masked 0) */
CT_BF static inline __m512bh ct_dy_bf(const struct ct_geom *g, const uint16_t *dyp, int64_t oy, int64_t xv,
				      __mmask32 m)
{
	return (__m512bh)_mm512_maskz_loadu_epi16(m, dyp + oy * g->OW + xv * 32);
}

/* ct_wg_body by dot products of column pairs (32 columns a vector), the
 * bias gradient as dy's pairs dotted with ones */
CT_BF static inline __attribute__((always_inline)) void
ct_wg_nat_body(const struct ct_geom *g, const uint16_t *pc, const uint16_t *dyp, float *A, int with_db,
	       const int KWC)
{
	enum { R = CT_WG_TAPS };
	const int KH = (int)g->KH, nt = KH * KWC;
	const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);
	__m512 acc[R], db = _mm512_setzero_ps();
#pragma GCC unroll 25
	for (int k = 0; k < R; k++) /* (the unused ones zeroed, never read) */
		acc[k] = k < nt ? _mm512_load_ps(A + k * 16) : _mm512_setzero_ps();
	if (with_db)
		db = _mm512_load_ps(A + (size_t)g->T * 16);
	for (int64_t xv = 0; xv < g->nx32; xv++) {
		const __mmask32 m = ct_lanes32(g, xv);
		const uint16_t *col = pc + xv * 32;
		int64_t oy = 0;
		for (; oy + CT_WR <= g->OH; oy += CT_WR) {
			__m512bh d[CT_WR];
#pragma GCC unroll 2
			for (int r = 0; r < CT_WR; r++) {
				d[r] = ct_dy_bf(g, dyp, oy + r, xv, m);
				db = _mm512_dpbf16_ps(db, d[r], ones);
			}
#pragma GCC unroll 26
			for (int i = 0; i < R / KWC + CT_WR - 1; i++) {
				if (i >= KH + CT_WR - 1)
					break;
				const uint16_t *row = col + (oy + i) * g->WPB;
#pragma GCC unroll 7
				for (int kx = 0; kx < KWC; kx++) {
					const __m512bh v = (__m512bh)_mm512_maskz_loadu_epi16(m, row + kx);
#pragma GCC unroll 2
					for (int r = 0; r < CT_WR; r++)
						if (i - r >= 0 && i - r < KH && (i - r) * KWC + kx < R)
							acc[(i - r) * KWC + kx] =
								_mm512_dpbf16_ps(acc[(i - r) * KWC + kx], d[r], v);
				}
			}
		}
		for (; oy < g->OH; oy++) { /* the last row alone */
			const __m512bh d = ct_dy_bf(g, dyp, oy, xv, m);
			db = _mm512_dpbf16_ps(db, d, ones);
			const uint16_t *row = col + oy * g->WPB;
#pragma GCC unroll 25
			for (int k = 0; k < R; k++)
				if (k < nt)
					acc[k] = _mm512_dpbf16_ps(
						acc[k], d,
						(__m512bh)_mm512_maskz_loadu_epi16(m, row + (k / KWC) * g->WPB + k % KWC));
		}
	}
#pragma GCC unroll 25
	for (int k = 0; k < R; k++)
		if (k < nt)
			_mm512_store_ps(A + k * 16, acc[k]);
	if (with_db)
		_mm512_store_ps(A + (size_t)g->T * 16, db);
}

#define CT_WGN_KW(K)                                                                              \
	CT_BF static void ct_wgn_kw##K(const struct ct_geom *g, const uint16_t *pc, const uint16_t *dyp, \
				       float *A, int with_db)                                           \
	{                                                                                        \
		ct_wg_nat_body(g, pc, dyp, A, with_db, K);                                       \
	}
CT_WGN_KW(1)
CT_WGN_KW(2)
CT_WGN_KW(3)
CT_WGN_KW(4)
CT_WGN_KW(5)
CT_WGN_KW(6)
CT_WGN_KW(7)

const ct_wgn_fn ct_wgn_fns[CT_MAX_K + 1] = { NULL,	 ct_wgn_kw1, ct_wgn_kw2, ct_wgn_kw3,
						    ct_wgn_kw4, ct_wgn_kw5, ct_wgn_kw6, ct_wgn_kw7 };

#endif /* CPU_HAVE_V16 */
