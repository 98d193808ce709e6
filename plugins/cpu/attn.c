/* plugins/cpu/attn.c - fused scaled-dot-product attention, KILN_OP_ATTENTION
 * and KILN_OP_ATTENTION_BWD (the contract, with PyTorch's equivalent, is in
 * kiln/ops.h), and its decoding step with a key/value cache,
 * KILN_OP_ATTENTION_DECODE (one query row per (batch, head), plain
 * loops) and its runs of several positions, KILN_OP_ATTENTION_DECODE_RUN
 * (the forward's blocks over the caches' keys, session 44).
 *
 * Parallel over the B*H (batch, head) pairs with OpenMP; each pair is done
 * by one thread from start to end, so the result does not depend on the
 * thread count.  A pair is walked in blocks of ATTN_BQ query rows: the
 * block's scores S [m, n] = scale * Q_blk K^T are one small product
 * (attn_mm_run: register tiles of 8 rows by 16 or 32 columns, K^T packed
 * once per pair; q read in place through the leading dimension 3C), the
 * softmax is a vectorised row loop, and y_blk = P V is a second product.
 * These products are too small for oneDNN's sgemm, whose per-call cost was
 * most of the attention's time (docs/PERFORMANCE.md, issue 20, session 8).
 * Causal: a block of rows [r0, r0+m) sees keys [0, r0+m) only, and each
 * tile of 8 rows computes only the columns (or sums only the terms) its
 * rows can see, to the vector: the upper-right part of the [T, T] matrix is
 * never computed.  At most one [ATTN_BQ, T] block (forward) or two
 * (backward: P and dP) exist per thread, in the workspace prepare asks for.
 *
 * Backward, flash-attention style: P is recomputed from the saved
 * logsumexp, P = exp(S - lse); with Di = rowsum(dy * y),
 *   dV += P'^T dy,  dP = dy V^T,  dS = P * (dP*M - Di),
 *   dQ = scale * dS K,  dK += scale * dS^T Q      (P' = P*M, M the mask)
 * dK and dV of a pair collect over the row blocks (added into dqkv, which
 * was zeroed first unless the op accumulates).
 *
 * Dropout on the probabilities is KILN_OP_DROPOUT's mask (philox.h) of the
 * logical index ((b*H + h)*T + i)*T + j, b the row's place in the step's
 * global batch (in1's row0 + b * rstride), drawn again in the backward.
 *
 * bf16/f16 tensors run this f32 kernel between conversions (lowp.c).
 */
#include "cpu.h"
#include "vexp.h"
#include "philox.h" /* CPU_DROP_SCALE, cpu_drop_init: the dropout mask */

#include <math.h>
#include <omp.h>
#include <string.h>

/* Query rows per block: the bound on the [ATTN_BQ, T] blocks of scores
 * per thread. */
#define ATTN_BQ 32

/* Floats of one vector of the products' register tiles */
#define ATTN_VL 16

typedef float attn_vec __attribute__((vector_size(ATTN_VL * sizeof(float)), aligned(4)));
typedef int32_t attn_ivec __attribute__((vector_size(ATTN_VL * sizeof(int32_t)), aligned(4)));

/* x rounded up to a whole number of vectors */
static int64_t attn_pad(int64_t x)
{
	return (x + ATTN_VL - 1) / ATTN_VL * ATTN_VL;
}

/* The sizes of one op, fixed at prepare (cpu_plan.sz). */
struct attn_dims {
	int64_t B, T, C, H, D;
	int causal;
	float scale;
	double p; /* dropout probability */
};

static struct attn_dims attn_dims(const struct cpu_plan *p)
{
	return (struct attn_dims){ .B = p->sz[0], .T = p->sz[1], .C = p->sz[2], .H = p->sz[3],
				   .D = p->sz[2] / p->sz[3], .causal = (int)p->op.i[1],
				   .scale = (float)p->op.f[0], .p = p->op.f[1] };
}

/* Floats of one thread's workspace (the layout is in attn_bwd_head, the
 * larger of the two): K^T and V^T [D, pad(T)], the blocks S and dP
 * [ATTN_BQ, pad(T)], and K, Q and dY packed [T, pad(D)] when D is not a
 * whole number of vectors (else they are read in place). */
static int64_t attn_thread_floats(int64_t T, int64_t D)
{
	const int64_t Tp = attn_pad(T), Dp = attn_pad(D);
	return 2 * D * Tp + 2 * ATTN_BQ * Tp + (D % ATTN_VL ? 3 * T * Dp : 0);
}

/* Floats of one thread's workspace in a decoding run over Tmax cached
 * positions (attn_decode_run_head): K^T [D, pad(Tmax)], the block S
 * [ATTN_BQ, pad(Tmax)], and V packed [Tmax, pad(D)] when D is not a
 * whole number of vectors. */
static int64_t attn_run_floats(int64_t Tmax, int64_t D)
{
	const int64_t Tp = attn_pad(Tmax);
	return D * Tp + ATTN_BQ * Tp + (D % ATTN_VL ? Tmax * attn_pad(D) : 0);
}

/* ---- row loops ---------------------------------------------------------- */

/* e^x of x <= 0: scores minus their row's maximum or logsumexp (a rounding
 * may leave x a little above 0) */
#define attn_exp cpu_exp

/* The helpers below take and return vectors: always inlined into their
 * callers' clones, so the ABI of a non-AVX-512 call never applies (GCC
 * warns at the end of the file: ignored for all of it). */
#pragma GCC diagnostic ignored "-Wpsabi"

/* cpu_exp (vexp.h) of each lane, the same arithmetic (x first raised to
 * CPU_EXP_MIN, NaN kept) */
static inline __attribute__((always_inline)) attn_vec attn_vexp(attn_vec x)
{
	const attn_vec lo = (attn_vec){ 0 } + CPU_EXP_MIN;
	const attn_ivec below = x < lo;
	x = (attn_vec)(((attn_ivec)lo & below) | ((attn_ivec)x & ~below));
	const attn_vec m = x * 1.44269504089f + 12582912.0f;
	const attn_vec n = m - 12582912.0f;
	const attn_vec r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
	attn_vec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	const attn_ivec e = (attn_ivec)m - 0x4B400000 + 127;
	return p * (attn_vec)((e & ~(e >> 31)) << 23);
}

/* where mask: a, else b */
static inline __attribute__((always_inline)) attn_vec attn_sel(attn_ivec mask, attn_vec a, attn_vec b)
{
	return (attn_vec)(((attn_ivec)a & mask) | ((attn_ivec)b & ~mask));
}

/* the lanes below w */
static inline __attribute__((always_inline)) attn_ivec attn_lanes(int64_t w)
{
	const attn_ivec idx = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
	return idx < (int32_t)w;
}

static inline __attribute__((always_inline)) float attn_hsum(attn_vec v)
{
	float s = 0.0f;
	for (int l = 0; l < ATTN_VL; l++)
		s += v[l];
	return s;
}

/* s[0..n): the scaled scores of one query row, of which [0, valid) are
 * seen, readable and writable to the vector past valid.  Overwrites them
 * with the softmax (0 past valid) and returns the row's logsumexp.  Whole
 * vectors: the last one's lanes past valid are masked. */
CPU_CLONES static float softmax_row(float *restrict s, int64_t valid, int64_t n)
{
	const int64_t nv = (valid + ATTN_VL - 1) / ATTN_VL;
	const attn_ivec tail = attn_lanes(valid - (nv - 1) * ATTN_VL);
	attn_vec *sv = (attn_vec *)s, mxv = (attn_vec){ 0 } - INFINITY, sum = { 0 };
	for (int64_t v = 0; v < nv; v++) {
		const attn_vec x = v == nv - 1 ? attn_sel(tail, sv[v], mxv) : sv[v];
		mxv = attn_sel(x > mxv, x, mxv);
	}
	float mx = mxv[0];
	for (int l = 1; l < ATTN_VL; l++)
		mx = mxv[l] > mx ? mxv[l] : mx;
	for (int64_t v = 0; v < nv; v++) {
		attn_vec e = attn_vexp(sv[v] - mx);
		if (v == nv - 1)
			e = attn_sel(tail, e, (attn_vec){ 0 });
		sv[v] = e;
		sum += e;
	}
	const float tot = attn_hsum(sum), inv = 1.0f / tot;
	for (int64_t v = 0; v < nv; v++)
		sv[v] *= inv;
	for (int64_t j = nv * ATTN_VL; j < n; j++)
		s[j] = 0.0f;
	return mx + logf(tot);
}

/* s[0..valid) *= the dropout scale of logical elements e0 + j. */
CPU_CLONES static void drop_row(float *restrict s, int64_t valid, uint64_t e0,
				const struct drop *d)
{
	const struct drop dd = *d;
#pragma omp simd
	for (int64_t j = 0; j < valid; j++) {
		float k;
		CPU_DROP_SCALE(k, e0 + (uint64_t)j, dd);
		s[j] *= k;
	}
}

/* The backward of one row: s holds the scaled scores, dp = dy V^T.  Turns
 * s into P' = exp(s - lse) * M and dp into dS = P * (dp*M - di); zeros
 * past valid.  d NULL: no dropout (M = 1), and di, rowsum(dy * y), is
 * taken as the same sum over the row's keys, sum_j P_j dp_j (y = P V), so
 * the backward never reads y; with dropout di is the caller's.  s and dp
 * are readable and writable to the vector past valid. */
CPU_CLONES static void bwd_row(float *restrict s, float *restrict dp, int64_t valid, int64_t n,
			       float lse, float di, uint64_t e0, const struct drop *d)
{
	if (d) {
		const struct drop dd = *d;
#pragma omp simd
		for (int64_t j = 0; j < valid; j++) {
			float k;
			CPU_DROP_SCALE(k, e0 + (uint64_t)j, dd);
			const float pj = attn_exp(s[j] - lse);
			dp[j] = pj * (dp[j] * k - di);
			s[j] = pj * k;
		}
		for (int64_t j = valid; j < n; j++)
			s[j] = dp[j] = 0.0f;
		return;
	}
	/* whole vectors, the last one's lanes past valid masked */
	const int64_t nv = (valid + ATTN_VL - 1) / ATTN_VL;
	const attn_ivec tail = attn_lanes(valid - (nv - 1) * ATTN_VL);
	attn_vec *sv = (attn_vec *)s, *dv = (attn_vec *)dp, acc = { 0 };
	for (int64_t v = 0; v < nv; v++) {
		attn_vec pj = attn_vexp(sv[v] - lse);
		if (v == nv - 1)
			pj = attn_sel(tail, pj, (attn_vec){ 0 });
		sv[v] = pj;
		acc += pj * dv[v];
	}
	const float sum = attn_hsum(acc);
	for (int64_t v = 0; v < nv; v++)
		dv[v] = sv[v] * (dv[v] - sum);
	for (int64_t j = nv * ATTN_VL; j < n; j++)
		s[j] = dp[j] = 0.0f;
}

/* sum of a[0..n) * b[0..n) */
CPU_CLONES static float dot_row(const float *restrict a, const float *restrict b, int64_t n)
{
	float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
	for (int64_t j = 0; j < n; j++)
		acc += a[j] * b[j];
	return acc;
}

/* ---- the small products of one (batch, head) pair ----------------------- */

/* Rows of C in one register tile (by one or two vectors of columns). */
#define ATTN_MR 8

/* C [M, n] = (C +) alpha * A B over k in [0, K): A(r, k) = a[r*ar + k*ac];
 * B's rows (ldb floats apart) are readable up to a whole vector past n
 * (packed and zero-padded, or n a multiple of the vector); exactly n
 * columns of each row of C (ldc floats apart) are written.  Every element
 * adds its k terms in order, one FMA each, whatever the thread. */
struct attn_mm {
	const float *a;
	int64_t ar, ac;
	const float *b;
	int64_t ldb;
	float *c;
	int64_t ldc, n;
	float alpha;
	int add;
};

/* Which part of the product a causal mask leaves (off: the block's first
 * query row, r a row of C):
 *   ATTN_ALL   everything;
 *   ATTN_COLS  S = Q K^T: row r needs the columns (keys) <= off + r;
 *   ATTN_KHI   P V, dS K: row r needs k (keys) <= off + r;
 *   ATTN_KLO   P^T dY, dS^T Q: row r (a key) needs k (query rows of the
 *              block) >= r - off. */
enum attn_part { ATTN_ALL, ATTN_COLS, ATTN_KHI, ATTN_KLO };

/* C[r .. r+mr) x [j, j + nv*ATTN_VL) over k in [k0, k1), in registers. */
static inline __attribute__((always_inline)) void attn_tile(const struct attn_mm *g, int64_t r,
							    int64_t j, int64_t k0, int64_t k1,
							    const int mr, const int nv)
{
	attn_vec acc[ATTN_MR][2];
#pragma GCC unroll 8
	for (int i = 0; i < mr; i++)
		acc[i][0] = acc[i][1] = (attn_vec){ 0 };
	const float *a = g->a + r * g->ar;
	for (int64_t k = k0; k < k1; k++) {
		const float *bk = g->b + k * g->ldb + j;
		const attn_vec b0 = *(const attn_vec *)bk;
		const attn_vec b1 = nv > 1 ? *(const attn_vec *)(bk + ATTN_VL) : b0;
#pragma GCC unroll 8
		for (int i = 0; i < mr; i++) {
			const float av = a[i * g->ar + k * g->ac];
			acc[i][0] += av * b0;
			if (nv > 1)
				acc[i][1] += av * b1;
		}
	}
#pragma GCC unroll 8
	for (int i = 0; i < mr; i++)
		for (int v = 0; v < nv; v++) {
			const int64_t c0 = j + v * ATTN_VL;
			const int64_t w = g->n - c0 < ATTN_VL ? g->n - c0 : ATTN_VL;
			float *c = g->c + (r + i) * g->ldc + c0;
			const attn_vec x = g->alpha * acc[i][v];
			if (w == ATTN_VL) {
				attn_vec *cv = (attn_vec *)c;
				*cv = g->add ? *cv + x : x;
			} else
				for (int64_t l = 0; l < w; l++)
					c[l] = g->add ? c[l] + x[l] : x[l];
		}
}

/* The rows r .. r + mr of the product (attn_mm_run), mr a constant where
 * it is inlined: its tiles in registers. */
static inline __attribute__((always_inline)) void attn_block(const struct attn_mm *g, int64_t r,
							     const int mr, int64_t K,
							     enum attn_part part, int64_t off)
{
	const int64_t last = r + mr - 1;
	int64_t n = g->n, k0 = 0, k1 = K;
	if (part == ATTN_COLS && off + last + 1 < n)
		n = off + last + 1;
	else if (part == ATTN_KHI && off + last + 1 < K)
		k1 = off + last + 1;
	else if (part == ATTN_KLO && r - off > 0)
		k0 = r - off < K ? r - off : K;
	for (int64_t j = 0; j < n; j += 2 * ATTN_VL) {
		if (n - j > ATTN_VL)
			attn_tile(g, r, j, k0, k1, mr, 2);
		else
			attn_tile(g, r, j, k0, k1, mr, 1);
	}
}

/* The last rows of a product, fewer than ATTN_MR (7..5 and 4..1): out of
 * attn_mm_run, whose frame held every unrolled tile's spilled accumulators
 * (19 KiB in the AVX2 and baseline clones, over the frame cap of
 * docs/design-notes.md); called once a product, the full blocks inlined
 * as before. */
CPU_CLONES static void attn_block_5to7(const struct attn_mm *g, int64_t r, int mr, int64_t K,
				       enum attn_part part, int64_t off)
{
	switch (mr) {
	case 7: attn_block(g, r, 7, K, part, off); break;
	case 6: attn_block(g, r, 6, K, part, off); break;
	default: attn_block(g, r, 5, K, part, off); break;
	}
}

CPU_CLONES static void attn_block_1to4(const struct attn_mm *g, int64_t r, int mr, int64_t K,
				       enum attn_part part, int64_t off)
{
	switch (mr) {
	case 4: attn_block(g, r, 4, K, part, off); break;
	case 3: attn_block(g, r, 3, K, part, off); break;
	case 2: attn_block(g, r, 2, K, part, off); break;
	default: attn_block(g, r, 1, K, part, off); break;
	}
}

/* The whole product, C [M, n] over k in [0, K), of which `part` is
 * computed (enum attn_part), to the tile: a tile of rows sums the k range
 * its rows need together, so A must hold zeros at the masked (row, k) it
 * spans (the softmax rows write them); under ATTN_COLS the columns past a
 * tile's last row's limit (to the vector) are left as they were. */
CPU_CLONES static void attn_mm_run(const struct attn_mm *g, int64_t M, int64_t K,
				   enum attn_part part, int64_t off)
{
	for (int64_t r = 0; r < M; r += ATTN_MR) {
		const int mr = M - r < ATTN_MR ? (int)(M - r) : ATTN_MR;
		if (mr == ATTN_MR)
			attn_block(g, r, ATTN_MR, K, part, off);
		else if (mr >= 5)
			attn_block_5to7(g, r, mr, K, part, off);
		else
			attn_block_1to4(g, r, mr, K, part, off);
	}
}

/* dst [rows, pad(cols)] = src [rows, cols] (rows ld floats apart), the
 * padding columns zero. */
static void attn_pack(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols)
{
	const int64_t w = attn_pad(cols);
	for (int64_t t = 0; t < rows; t++) {
		memcpy(dst + t * w, src + t * ld, sizeof(float) * (size_t)cols);
		memset(dst + t * w + cols, 0, sizeof(float) * (size_t)(w - cols));
	}
}

/* 16 rows of 16 (src, ld floats apart) into dst's 16 rows (w floats apart),
 * transposed: four rounds of two-vector shuffles, each swapping the
 * off-diagonal s x s blocks of every 2s x 2s block (s = 8, 4, 2, 1). */
static inline __attribute__((always_inline)) void attn_t16(float *dst, int64_t w, const float *src,
							   int64_t ld)
{
	static const attn_ivec lo[4] = {
		{ 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23 },
		{ 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27 },
		{ 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29 },
		{ 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30 },
	};
	static const attn_ivec hi[4] = {
		{ 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31 },
		{ 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31 },
		{ 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31 },
		{ 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31 },
	};
	attn_vec r[ATTN_VL];
#pragma GCC unroll 16
	for (int i = 0; i < ATTN_VL; i++)
		r[i] = *(const attn_vec *)(src + i * ld);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		const int sw = 8 >> k;
#pragma GCC unroll 16
		for (int i = 0; i < ATTN_VL; i++)
			if (!(i & sw)) {
				const attn_vec a = r[i], b = r[i + sw];
				r[i] = __builtin_shuffle(a, b, lo[k]);
				r[i + sw] = __builtin_shuffle(a, b, hi[k]);
			}
	}
#pragma GCC unroll 16
	for (int i = 0; i < ATTN_VL; i++)
		*(attn_vec *)(dst + i * w) = r[i];
}

/* dst [cols, pad(rows)] = src^T, the padding columns zero: whole 16 x 16
 * blocks through attn_t16, the rest element by element. */
CPU_CLONES static void attn_pack_t(float *dst, const float *src, int64_t ld, int64_t rows,
				   int64_t cols)
{
	const int64_t w = attn_pad(rows), rb = rows / ATTN_VL * ATTN_VL;
	const int64_t cb = cols / ATTN_VL * ATTN_VL;
	for (int64_t t = 0; t < rb; t += ATTN_VL)
		for (int64_t d = 0; d < cb; d += ATTN_VL)
			attn_t16(dst + d * w + t, w, src + t * ld + d, ld);
	for (int64_t d = 0; d < cols; d++) {
		float *o = dst + d * w;
		for (int64_t t = d < cb ? rb : 0; t < rows; t++)
			o[t] = src[t * ld + d];
		for (int64_t t = rows; t < w; t++)
			o[t] = 0.0f;
	}
}

/* A B operand [rows, cols] at src (rows ld floats apart) as attn_mm reads
 * it: in place when its rows can be read a vector at a time, else packed
 * into buf.  Returns the pointer; *ldb its row stride. */
static const float *attn_rows(float *buf, const float *src, int64_t ld, int64_t rows,
			      int64_t cols, int64_t *ldb)
{
	if (cols % ATTN_VL == 0) {
		*ldb = ld;
		return src;
	}
	attn_pack(buf, src, ld, rows, cols);
	*ldb = attn_pad(cols);
	return buf;
}

/* ---- one (batch, head) pair -------------------------------------------- */

/* Where pair (b, h) lives: q, k, v (row stride 3C) and its slice of a
 * [B,T,C] tensor (row stride C). */
struct attn_head {
	int64_t q, tok; /* offsets: q in qkv, the head in y / dy */
	uint64_t e0;    /* logical index of its P[0][0] in the global batch's
			 * [B,H,T,T] (b its global row: cpu_drop_row) */
	int64_t lse;    /* offset of its rows in lse [B,H,T] */
};

static struct attn_head attn_head(const struct attn_dims *g, int64_t b, int64_t h,
				  const struct drop *d)
{
	const int64_t bg = d ? cpu_drop_row(d, b) : b;
	return (struct attn_head){ .q = b * g->T * 3 * g->C + h * g->D,
				   .tok = b * g->T * g->C + h * g->D,
				   .e0 = (uint64_t)((bg * g->H + h) * g->T) * (uint64_t)g->T,
				   .lse = (b * g->H + h) * g->T };
}

/* Row block [r0, r0 + m): how many keys it spans (n) and row i sees. */
static int64_t attn_keys(const struct attn_dims *g, int64_t r0, int64_t m)
{
	return g->causal ? r0 + m : g->T;
}

static int64_t attn_valid(const struct attn_dims *g, int64_t row)
{
	return g->causal ? row + 1 : g->T;
}

/* The forward's blocks of one pair: its T query rows (q, 3C floats
 * apart) at positions t0.. (0 but in a decoding run) over the keys Kt
 * (K^T [D, keys], rows ldk floats apart) and values vb (rows ldv apart),
 * into y (rows C apart), lse (NULL: not kept) and the dropout of d (NULL:
 * none; e0 its P[0][0]'s logical index); S: ATTN_BQ rows of ldk floats.
 * Causal: query i sees keys 0..t0 + i; else (t0 0) all T. */
static void attn_fwd_blocks(const struct attn_dims *g, const float *q, int64_t t0,
			    const float *Kt, int64_t ldk, const float *vb, int64_t ldv, float *S,
			    float *y, float *lse, uint64_t e0, const struct drop *d)
{
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C;
	const enum attn_part cols = g->causal ? ATTN_COLS : ATTN_ALL;
	const enum attn_part khi = g->causal ? ATTN_KHI : ATTN_ALL;
	for (int64_t r0 = 0; r0 < T; r0 += ATTN_BQ) {
		const int64_t m = T - r0 < ATTN_BQ ? T - r0 : ATTN_BQ, n = t0 + attn_keys(g, r0, m);
		/* S [m, n] = scale * q_blk [m, D] k^T [D, n] */
		attn_mm_run(&(struct attn_mm){ .a = q + r0 * ld, .ar = ld, .ac = 1, .b = Kt,
					       .ldb = ldk, .c = S, .ldc = ldk, .n = n,
					       .alpha = g->scale },
			    m, D, cols, t0 + r0);
		for (int64_t i = 0; i < m; i++) {
			const int64_t row = r0 + i, valid = t0 + attn_valid(g, row);
			const float l = softmax_row(S + i * ldk, valid, n);
			if (lse)
				lse[row] = l;
			if (d)
				drop_row(S + i * ldk, valid, e0 + (uint64_t)(row * T), d);
		}
		/* y_blk [m, D] = P' [m, n] v [n, D] */
		attn_mm_run(&(struct attn_mm){ .a = S, .ar = ldk, .ac = 1, .b = vb, .ldb = ldv,
					       .c = y + r0 * C, .ldc = C, .n = D, .alpha = 1.0f },
			    m, n, khi, t0 + r0);
	}
}

/* Forward of one pair.  ws: the thread's workspace. */
static void attn_fwd_head(const struct attn_dims *g, const float *qkv, float *y, float *lse,
			  float *ws, int64_t b, int64_t h, const struct drop *d)
{
	const struct attn_head at = attn_head(g, b, h, d);
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C, Tp = attn_pad(T);
	const float *q = qkv + at.q, *k = q + C, *v = q + 2 * C;
	float *Kt = ws, *S = Kt + D * Tp, *Vp = S + ATTN_BQ * Tp;
	int64_t ldv;
	attn_pack_t(Kt, k, ld, T, D);
	const float *vb = attn_rows(Vp, v, ld, T, D, &ldv);
	attn_fwd_blocks(g, q, 0, Kt, Tp, vb, ldv, S, y + at.tok, lse + at.lse, at.e0, d);
}

/* Backward of one pair.  ws: the thread's workspace. */
static void attn_bwd_head(const struct attn_dims *g, const float *dy, const float *qkv,
			  const float *y, const float *lse, float *dqkv, float *ws, int64_t b,
			  int64_t h, const struct drop *d, int acc)
{
	const struct attn_head at = attn_head(g, b, h, d);
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C, Tp = attn_pad(T);
	const int64_t Dp = attn_pad(D);
	const float *q = qkv + at.q, *k = q + C, *v = q + 2 * C;
	float *dq = dqkv + at.q, *dk = dq + C, *dv = dq + 2 * C;
	float *Kt = ws, *Vt = Kt + D * Tp, *S = Vt + D * Tp, *dP = S + ATTN_BQ * Tp;
	float *Kp = dP + ATTN_BQ * Tp, *Qp = Kp + T * Dp, *dYp = Qp + T * Dp;
	int64_t ldk, ldq, lddy;
	attn_pack_t(Kt, k, ld, T, D);
	attn_pack_t(Vt, v, ld, T, D);
	const float *kb = attn_rows(Kp, k, ld, T, D, &ldk);
	const float *qb = attn_rows(Qp, q, ld, T, D, &ldq);
	const float *dyr = attn_rows(dYp, dy + at.tok, C, T, D, &lddy);
	const enum attn_part cols = g->causal ? ATTN_COLS : ATTN_ALL;
	const enum attn_part khi = g->causal ? ATTN_KHI : ATTN_ALL;
	const enum attn_part klo = g->causal ? ATTN_KLO : ATTN_ALL;
	if (!acc) /* dK and dV collect over the blocks: start from zero */
		for (int64_t t = 0; t < T; t++) {
			memset(dk + t * ld, 0, sizeof(float) * (size_t)D);
			memset(dv + t * ld, 0, sizeof(float) * (size_t)D);
		}
	for (int64_t r0 = 0; r0 < T; r0 += ATTN_BQ) {
		const int64_t m = T - r0 < ATTN_BQ ? T - r0 : ATTN_BQ, n = attn_keys(g, r0, m);
		const float *dyb = dy + at.tok + r0 * C, *yb = y + at.tok + r0 * C;
		/* S [m, n] = scale * q_blk k^T;  dP [m, n] = dy_blk v^T */
		attn_mm_run(&(struct attn_mm){ .a = q + r0 * ld, .ar = ld, .ac = 1, .b = Kt,
					       .ldb = Tp, .c = S, .ldc = Tp, .n = n,
					       .alpha = g->scale },
			    m, D, cols, r0);
		attn_mm_run(&(struct attn_mm){ .a = dyb, .ar = C, .ac = 1, .b = Vt, .ldb = Tp,
					       .c = dP, .ldc = Tp, .n = n, .alpha = 1.0f },
			    m, D, cols, r0);
		for (int64_t i = 0; i < m; i++) {
			const int64_t row = r0 + i;
			const float di = d ? dot_row(dyb + i * C, yb + i * C, D) : 0.0f;
			bwd_row(S + i * Tp, dP + i * Tp, attn_valid(g, row), n, lse[at.lse + row],
				di, at.e0 + (uint64_t)(row * T), d);
		}
		/* dV [n, D] += P'^T dy_blk */
		attn_mm_run(&(struct attn_mm){ .a = S, .ar = 1, .ac = Tp, .b = dyr + r0 * lddy,
					       .ldb = lddy, .c = dv, .ldc = ld, .n = D,
					       .alpha = 1.0f, .add = 1 },
			    n, m, klo, r0);
		/* dQ_blk = scale * dS K */
		attn_mm_run(&(struct attn_mm){ .a = dP, .ar = Tp, .ac = 1, .b = kb, .ldb = ldk,
					       .c = dq + r0 * ld, .ldc = ld, .n = D,
					       .alpha = g->scale, .add = acc },
			    m, n, khi, r0);
		/* dK [n, D] += scale * dS^T q_blk */
		attn_mm_run(&(struct attn_mm){ .a = dP, .ar = 1, .ac = Tp, .b = qb + r0 * ldq,
					       .ldb = ldq, .c = dk, .ldc = ld, .n = D,
					       .alpha = g->scale, .add = 1 },
			    n, m, klo, r0);
	}
}

/* ---- kernels ------------------------------------------------------------ */

/* The threads for `pairs` heads: at most the workspace's slots and the
 * team now (threads.c).  Each head runs on one thread: its sums never
 * depend on the team. */
static int attn_team(int64_t pairs, int64_t slots)
{
	int64_t nt = pairs < slots ? pairs : slots;
	if (nt > omp_get_max_threads())
		nt = omp_get_max_threads();
	return nt < 1 ? 1 : (int)nt;
}

/* One run, forward or backward: every (b, h) pair once, dynamically
 * spread over at most sz[4] threads (the workspace has a slot per thread). */
static kiln_status cpu_attention(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	const struct attn_dims g = attn_dims(p);
	const int bwd = p->op.type == KILN_OP_ATTENTION_BWD;
	const int acc = bwd && (p->op.flags & KILN_OPF_ACCUMULATE);
	const int64_t pairs = g.B * g.H, per = attn_thread_floats(g.T, g.D);
	const int nt = attn_team(pairs, p->sz[4]);
	struct drop dd;
	const struct drop *d = NULL;
	(void)e;
	if (g.p > 0.0) {
		dd = cpu_drop_init((uint64_t)p->op.i[2], p->op.i[3],
				   (const int64_t *)a->in[p->op.n_in - 1], g.p);
		d = &dd;
	}
	int64_t next = 0; /* the pairs, dynamically over members [0, nt): cpu_team_whole */
#pragma omp parallel num_threads(cpu_team_whole(nt))
	{
		const int64_t t = cpu_thread_num();
		float *ws = t < nt ? (float *)a->workspace + per * t : NULL;
		for (int64_t bh; t < nt && (bh = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < pairs;) {
			const int64_t b = bh / g.H, h = bh % g.H;
			if (bwd)
				attn_bwd_head(&g, a->in[0], a->in[1], a->in[2], a->in[3], a->out[0], ws, b,
					      h, d, acc);
			else
				attn_fwd_head(&g, a->in[0], a->out[0], a->out[1], ws, b, h, d);
		}
	}
	return KILN_OK;
}

/* ---- decoding with a key/value cache (ATTENTION_DECODE) ----------------- */

/* One (b, h) pair of a decoding step: query i of row b (of T) at position
 * t (a step: i = 0, T = 1): store its k and v in the caches' row t, then
 * y = softmax(scale * q K[0..t]^T) V[0..t].  s: the thread's Tmax floats
 * (rounded up to a whole vector). */
static void attn_decode_head(const struct attn_dims *g, int64_t Tmax, const float *qkv,
			     float *y, float *kc, float *vc, float *s, int64_t b, int64_t h,
			     int64_t i, int64_t t)
{
	const int64_t C = g->C, D = g->D;
	const float *q = qkv + (b * g->T + i) * 3 * C + h * D;
	float *K = kc + (b * g->H + h) * Tmax * D, *V = vc + (b * g->H + h) * Tmax * D;
	float *yh = y + (b * g->T + i) * C + h * D;
	memcpy(K + t * D, q + C, sizeof(float) * (size_t)D);
	memcpy(V + t * D, q + 2 * C, sizeof(float) * (size_t)D);
	for (int64_t j = 0; j <= t; j++)
		s[j] = g->scale * dot_row(q, K + j * D, D);
	softmax_row(s, t + 1, t + 1);
	for (int64_t d = 0; d < D; d++)
		yh[d] = 0.0f;
	for (int64_t j = 0; j <= t; j++) {
		const float pj = s[j];
		const float *vj = V + j * D;
#pragma omp simd
		for (int64_t d = 0; d < D; d++)
			yh[d] += pj * vj[d];
	}
}

/* One (b, h) pair of a run of T > 1 queries at positions t0..t0+T-1
 * (ATTENTION_DECODE_RUN, a prompt's prefill), blocked as attn_fwd_head
 * (session 44; before, T steps of attn_decode_head): store the run's k
 * and v in the caches' rows t0.., then over blocks of ATTN_BQ queries
 * at t0 + r0.., S [m, n] = scale * q_blk K[0..n)^T, n = t0 + r0 + m,
 * with the causal mask at offset t0 + r0, softmax rows of t0 + r0 + i + 1
 * keys, y_blk = P V[0..n).  A score sums its D terms in order (one FMA
 * each) where the step's dot_row sums them in vector lanes: the same
 * math, another rounding (the prefill tests' 1e-5 against the steps);
 * P V adds in the step's order but with FMA tiles (attn_mm_run: rounded
 * once) where the step multiplies then adds: another rounding again.
 * ws: the thread's attn_run_floats(Tmax, D) floats. */
static void attn_decode_run_head(const struct attn_dims *g, int64_t Tmax, int64_t t0,
				 const float *qkv, float *y, float *kc, float *vc, float *ws,
				 int64_t b, int64_t h)
{
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C, n_all = t0 + T;
	const int64_t Tp = attn_pad(Tmax), Np = attn_pad(n_all);
	const float *q = qkv + b * T * ld + h * D;
	float *K = kc + (b * g->H + h) * Tmax * D, *V = vc + (b * g->H + h) * Tmax * D;
	float *Kt = ws, *S = Kt + D * Tp, *Vp = S + ATTN_BQ * Tp;
	int64_t ldv;
	for (int64_t i = 0; i < T; i++) {
		memcpy(K + (t0 + i) * D, q + i * ld + C, sizeof(float) * (size_t)D);
		memcpy(V + (t0 + i) * D, q + i * ld + 2 * C, sizeof(float) * (size_t)D);
	}
	attn_pack_t(Kt, K, D, n_all, D); /* K^T [D, Np] */
	const float *vb = attn_rows(Vp, V, D, n_all, D, &ldv);
	struct attn_dims gc = *g; /* (a decode op's i[1] is 0: causal it is) */
	gc.causal = 1;
	attn_fwd_blocks(&gc, q, t0, Kt, Np, vb, ldv, S, y + b * T * C + h * D, NULL, 0, NULL);
}

/* qkv [B,T,3C] at positions t0..t0+T-1 of every row (T = 1: a step,
 * ATTENTION_DECODE; more: ATTENTION_DECODE_RUN, ABI 2.31). */
static kiln_status cpu_attention_decode(const struct cpu_plan *p, const struct kiln_op_args *a,
					struct cpu_err *e)
{
	const struct attn_dims g = attn_dims(p);
	const int64_t Tmax = p->sz[5], t0 = *(const int32_t *)a->in[1], pairs = g.B * g.H;
	if (t0 < 0 || t0 + g.T > Tmax)
		return g.T == 1 ? cpu_fail(e, KILN_EDATA, "cpu: ATTENTION_DECODE: position %lld outside the cache's [0, %lld)",
					   (long long)t0, (long long)Tmax)
				: cpu_fail(e, KILN_EDATA, "cpu: ATTENTION_DECODE_RUN: positions %lld..%lld outside the cache's [0, %lld)",
					   (long long)t0, (long long)(t0 + g.T - 1), (long long)Tmax);
	const int nt = attn_team(pairs, p->sz[4]);
	const int64_t per = g.T > 1 ? attn_run_floats(Tmax, g.D) : attn_pad(Tmax);
	int64_t next = 0; /* as cpu_attention's */
#pragma omp parallel num_threads(cpu_team_whole(nt))
	{
		const int64_t me = cpu_thread_num();
		float *ws = me < nt ? (float *)a->workspace + per * me : NULL;
		for (int64_t bh; me < nt && (bh = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < pairs;) {
			if (g.T > 1)
				attn_decode_run_head(&g, Tmax, t0, a->in[0], a->out[0], a->out[1],
						     a->out[2], ws, bh / g.H, bh % g.H);
			else
				attn_decode_head(&g, Tmax, a->in[0], a->out[0], a->out[1], a->out[2], ws,
						 bh / g.H, bh % g.H, 0, t0);
		}
	}
	return KILN_OK;
}

kiln_status cpu_attn_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int decode = op->type == KILN_OP_ATTENTION_DECODE || op->type == KILN_OP_ATTENTION_DECODE_RUN;
	for (int k = 0; k < op->n_in + op->n_out; k++) {
		const struct kiln_tensor_desc *t = k < op->n_in ? &op->in[k] : &op->out[k - op->n_in];
		if (t->dtype != KILN_F32 && !(t->dtype == KILN_I64 && k == op->n_in - 1) &&
		    !(t->dtype == KILN_I32 && decode && k == 1))
			return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors (and the i64 step, or i32 position)");
	}
	const struct kiln_tensor_desc *qkv = &op->in[op->type == KILN_OP_ATTENTION_BWD ? 1 : 0];
	p->sz[0] = qkv->dims[0];
	p->sz[1] = qkv->dims[1];
	p->sz[2] = qkv->dims[2] / 3;
	p->sz[3] = op->i[0];
	/* workspace slots: a thread's for each of at most B * H threads
	 * (attn_team runs no more; session 44's run slot is ~100x a step's,
	 * held by the generator's prefill plan between prompts) */
	p->sz[4] = c->threads < p->sz[0] * p->sz[3] ? c->threads : p->sz[0] * p->sz[3];
	p->n = cpu_numel(qkv);
	p->workspace = sizeof(float) * (size_t)(attn_thread_floats(p->sz[1], p->sz[2] / p->sz[3]) * p->sz[4]);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = cpu_attention;
	if (decode) { /* a step: a row of Tmax scores per thread; a run:
		       * attn_decode_run_head's blocks over Tmax keys */
		p->sz[5] = op->out[1].dims[2];
		const int64_t per = p->sz[1] > 1 ? attn_run_floats(p->sz[5], p->sz[2] / p->sz[3])
						 : attn_pad(p->sz[5]);
		p->workspace = sizeof(float) * (size_t)(per * p->sz[4]);
		p->kernel = cpu_attention_decode;
	}
	return KILN_OK;
}
