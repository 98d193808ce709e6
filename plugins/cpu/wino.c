/* plugins/cpu/wino.c - f32 3x3 convolutions by F(4x4, 3x3) (wino.h says
 * when and why).
 *
 * A 4x4 block of outputs (a tile) of one sample is Y = A^T [U (.) V] A at
 * each output channel, where the 6x6 matrices are V = B^T d B of the
 * tile's 6x6 input block d at each input channel, U = G g G^T of each 3x3
 * filter g, and the product at each of the 36 points is summed over the
 * input channels: M[pt][tile][o] = sum_c V[pt][tile][c] U[pt][c][o], one
 * small GEMM a point.  The matrices are Lavin and Gray's (points 0, 1,
 * -1, 2, -2 and infinity), which compute the correlation a convolution
 * layer means:
 *
 *   B^T = | 4  0 -5  0  1  0 |   G = | 1/4     0     0 |   A^T = | 1 1  1 1  1 0 |
 *         | 0 -4 -4  1  1  0 |       | -1/6 -1/6  -1/6 |         | 0 1 -1 2 -2 0 |
 *         | 0  4 -4 -1  1  0 |       | -1/6  1/6  -1/6 |         | 0 1  1 4  4 0 |
 *         | 0 -2 -1  2  1  0 |       | 1/24 1/12   1/6 |         | 0 1 -1 8 -8 1 |
 *         | 0  2 -1 -2  1  0 |       | 1/24 -1/12  1/6 |
 *         | 0  4  0 -5  0  1 |       | 0       0     1 |
 *
 * NHWC makes every transform a sum of whole vectors: an element of d is
 * 16 input channels of one pixel (one load), of M 16 output channels, so
 * no lane ever moves.  Tiles run over the batch's samples in order (tile
 * rows of 4 output rows, a row's tiles left to right), in blocks of TB
 * tiles whose V and M fit in a core's L2 beside U; a block's tiles are
 * transformed in, multiplied point by point (wg_gemm: registers hold
 * tiles x up to 64 output channels, each V element broadcast once for
 * all of them), and transformed out with the bias, the residual and the
 * ReLU (max(0, v): a NaN kept).  Input beyond the padded edges is zero;
 * outputs beyond OH, OW are computed and not stored.
 *
 * The data gradient (KILN_OP_CONV_BWD_DATA) is the same kernel: dx is dy
 * correlated with each filter turned half a turn and transposed (g of
 * dy's channel c and dx's channel o is w[c][o][2 - a][2 - b]: wg_weights),
 * dy padded by 2 - pad; no bias, residual or ReLU.
 *
 * U is made from the weights (9 gathers and ~100 vector operations per
 * input channel and 16 output channels: ~1% of a layer's time at 16
 * rows) on every run, or once for a frozen plan (struct cpu_wino, shared
 * by the plans of the same weights), the input channels split over the
 * team; which thread makes which part does not change its bytes.  The blocks
 * are split over the team; each output is one thread's, computed by the
 * same code on any team.
 */
#include "wino.h"
#include "v16.h"
#include "wshare.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WG_ALIGN 64
#define WG_PTS 36 /* the 6 x 6 points */
#define WG_MAX_CO (256 * 256) /* input x output channels (cpu_wino_ok) */

/* The geometry of a plan (cpu_wino_prepare keeps it in sz, rows, cols). */
struct wg_geom {
	int64_t N, C, H, W, O, ph, pw;
	int64_t OH, OW, th, tw, tiles; /* output size; tile rows and columns; the batch's tiles */
	int64_t TB;                   /* tiles a block */
	int slots;                    /* thread slots in the workspace */
	int bwd;                      /* the data gradient: x is dy, y dx, the filters turned (wg_weights) */
	size_t u_len;                 /* U's floats */
	size_t slot_at, slot_len, m_at; /* floats: U at 0 (unless kept), the first slot, a slot; M within one */
};

/* What a frozen plan keeps (KILN_OPF_FROZEN and [plugin.cpu]
 * keep_weights): U, made on a run and again only after the core said
 * these weights changed (wshare.c, "Notices"; nothing compared per run,
 * as qconv.c's),
 * one per weight tensor and key, shared by the plans that read it
 * (wshare.c: a model's plans of every row count; before session 40 each
 * plan made and kept its own).  Without it U is made into the workspace
 * on every run. */
struct wg_key {
	int64_t C, O; /* U's input and output channels */
	int bwd;      /* the filters turned (wg_weights) */
};

struct wg_kept {
	struct cpu_wkept base;
	struct wg_key k;
	float *U; /* [36][C][O] */
};

struct cpu_wino {
	pthread_mutex_t lock; /* one run of the plan at a time */
	struct wg_key k;
	struct cpu_wref r;
	const struct kiln_host *host;
};

static size_t wg_u_len(const struct wg_key *k);

static struct cpu_wkept *wg_kept_make(const void *key, int frozen, int *lib)
{
	const struct wg_key *k = key;
	struct wg_kept *x = calloc(1, sizeof *x);
	(void)frozen, (void)lib;
	if (!x)
		return NULL;
	x->k = *k;
	if (!(x->U = cpu_huge_alloc(WG_ALIGN, wg_u_len(k) * sizeof(float)))) {
		free(x);
		return NULL;
	}
	return &x->base;
}

static void wg_kept_free(struct cpu_wkept *e)
{
	cpu_huge_free(((struct wg_kept *)e)->U);
	free(e);
}

static int wg_kept_same_key(const struct cpu_wkept *e, const void *key)
{
	const struct wg_key *a = &((const struct wg_kept *)e)->k, *b = key;
	return a->C == b->C && a->O == b->O && a->bwd == b->bwd;
}

static const struct cpu_wkind wg_kept_kind = {
	.what = "Winograd-transformed weights",
	.same_key = wg_kept_same_key,
	.make = wg_kept_make,
	.free = wg_kept_free,
	.holds = NULL, /* frozen only */
};

void cpu_wino_free(struct cpu_wino *w)
{
	if (!w)
		return;
	cpu_wref_drop(&w->r);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

void cpu_wino_forget(struct cpu_wino *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	cpu_wref_detach(&w->r);
	pthread_mutex_unlock(&w->lock);
}

static size_t wg_up(size_t floats) { return (floats + 15) & ~(size_t)15; }

static size_t wg_u_len(const struct wg_key *k) { return wg_up((size_t)(WG_PTS * k->C * k->O)); }

static void wg_geom(const struct cpu_plan *p, struct wg_geom *g)
{
	g->N = p->sz[0], g->C = p->sz[1], g->H = p->sz[2], g->W = p->sz[3], g->O = p->sz[4];
	g->slots = (int)p->sz[5];
	g->bwd = (int)p->sz[7];
	g->ph = p->rows, g->pw = p->cols;
	g->OH = g->H + 2 * g->ph - 2, g->OW = g->W + 2 * g->pw - 2;
	g->th = (g->OH + 3) / 4, g->tw = (g->OW + 3) / 4;
	g->tiles = g->N * g->th * g->tw;
	/* a block's V and M (36 TB (C + O) floats) within ~110 KiB, in steps
	 * of the GEMM's 6 tile rows (12 where fewer than 64 output
	 * channels take its 12-row blocks): 24 tiles at 16 -> 16 channels,
	 * 12 at 32 -> 32, 6 at 64 -> 64, each measured the fastest of 6, 12,
	 * 24 and 48 on its shape (bench/wino_ops) */
	const int64_t step = g->O >= 64 ? 6 : 12, tb = 768 / (g->C + g->O) / step * step;
	g->TB = tb < step ? step : tb > 96 ? 96 : tb;
	const struct wg_key k = { g->C, g->O, g->bwd };
	g->u_len = wg_u_len(&k);
	g->slot_at = p->sz[6] ? 0 : g->u_len; /* frozen: U kept (shared), not in the workspace */
	g->m_at = wg_up((size_t)(WG_PTS * g->TB * g->C));
	g->slot_len = g->m_at + wg_up((size_t)(WG_PTS * g->TB * g->O));
}

/* The sizes both directions share: x (the transformed input: the forward's
 * x, the data gradient's dy) and y (the output: y, dx) f32 NHWC of 16k
 * and 16k' channels, w [O, C, 3, 3] f32 with C O <= WG_MAX_CO, stride 1,
 * dilation 1, one group, padding 0-2, y's size x's + 2 pad - 2 (the
 * forward) or - 2 pad + 2 (the data gradient) */
static int wg_shapes_ok(const struct kiln_op *op, const struct kiln_tensor_desc *x,
			const struct kiln_tensor_desc *y, int bwd)
{
	const struct kiln_tensor_desc *w = &op->in[1];
	if (op->i[0] != 1 || op->i[1] != 1 || op->i[4] != 1 || op->i[5] != 1 || op->i[6] > 1 ||
	    op->i[2] < 0 || op->i[3] < 0 || op->i[2] > 2 || op->i[3] > 2)
		return 0;
	if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || !cpu_nhwc(x) || !cpu_nhwc(y) ||
	    x->dtype != KILN_F32 || w->dtype != KILN_F32 || y->dtype != KILN_F32)
		return 0;
	const int64_t N = x->dims[0], O = w->dims[0], C = w->dims[1];
	if (N < 1 || C < 16 || C % 16 || O < 16 || O % 16 || w->dims[2] != 3 || w->dims[3] != 3 ||
	    y->dims[0] != N || x->dims[1] != (bwd ? O : C) || y->dims[1] != (bwd ? C : O))
		return 0;
	/* every block of tiles reads all of U (36 C O floats): up to 256 x 256
	 * channels (9.4 MB) it ran 1.4-2.6x oneDNN's direct kernels, at 512 x
	 * 512 (37.7 MB, from DRAM for every block) 0.52x (bench/wino_ops) */
	if (C * O > WG_MAX_CO)
		return 0;
	const int64_t s = bwd ? -1 : 1;
	const int64_t OH = x->dims[2] + s * (2 * op->i[2] - 2), OW = x->dims[3] + s * (2 * op->i[3] - 2);
	return OH >= 1 && OW >= 1 && y->dims[2] == OH && y->dims[3] == OW;
}

int cpu_wino_ok(const struct kiln_op *op)
{
	const char *env = getenv("KILN_CPU_WINO");
	if (!CPU_HAVE_V16 || !cpu_v16_ok() || (env && !strcmp(env, "0")))
		return 0;
	if (op->flags & (KILN_OPF_KEEP | KILN_OPF_ACCUMULATE))
		return 0;
	if (op->type == KILN_OP_CONV_BWD_DATA) /* dx from dy: no epilogue */
		return !(op->flags & (KILN_OPF_ACT | KILN_OPF_RESIDUAL)) && op->n_in == 2 && op->n_out == 1 &&
		       wg_shapes_ok(op, &op->in[0], &op->out[0], 1);
	if (op->type != KILN_OP_CONV)
		return 0;
	if ((op->flags & KILN_OPF_ACT) && op->i[KILN_OPI_ACT] != KILN_ACT_RELU)
		return 0;
	const int res = (op->flags & KILN_OPF_RESIDUAL) != 0;
	if ((op->n_in != 2 + res && op->n_in != 3 + res) || op->n_out != 1 ||
	    !wg_shapes_ok(op, &op->in[0], &op->out[0], 0))
		return 0;
	const int64_t O = op->in[1].dims[0];
	if (op->n_in == 3 + res &&
	    (op->in[2].ndim != 1 || op->in[2].dims[0] != O || op->in[2].dtype != KILN_F32))
		return 0;
	if (res) {
		const struct kiln_tensor_desc *r = &op->in[op->n_in - 1];
		if (r->ndim != 4 || !cpu_nhwc(r) || r->dtype != KILN_F32 ||
		    memcmp(r->dims, op->out[0].dims, 4 * sizeof r->dims[0]))
			return 0;
	}
	return 1;
}

int cpu_wino_bare_ok(const struct kiln_op *op)
{
	const struct kiln_op bare = cpu_op_unkept(op);
	return cpu_wino_ok(&bare);
}

#if CPU_HAVE_V16
/* G's rows applied to (a0, a1, a2): u[0..5] */
CPU_V16 static inline void wg_g(__m512 a0, __m512 a1, __m512 a2, __m512 *u)
{
	const __m512 s02 = _mm512_add_ps(a0, a2);
	const __m512 e = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 24), a0, _mm512_mul_ps(_mm512_set1_ps(1.0f / 6), a2));
	const __m512 f = _mm512_mul_ps(_mm512_set1_ps(1.0f / 12), a1);
	u[0] = _mm512_mul_ps(_mm512_set1_ps(0.25f), a0);
	u[1] = _mm512_mul_ps(_mm512_set1_ps(-1.0f / 6), _mm512_add_ps(s02, a1));
	u[2] = _mm512_mul_ps(_mm512_set1_ps(-1.0f / 6), _mm512_sub_ps(s02, a1));
	u[3] = _mm512_add_ps(e, f);
	u[4] = _mm512_sub_ps(e, f);
	u[5] = a2;
}

/* U[pt][c][o] for input channels c0 .. c1 - 1, all output channels.  The
 * filter g of (c, o) is w[o][c] in the forward; in the data gradient
 * (bwd: c a channel of dy, o one of dx) w[c][o] turned half a turn
 * (g[a][b] = w[c][o][2 - a][2 - b]): dx is dy correlated with it. */
CPU_V16 static void wg_weights(const struct wg_geom *g, const float *w, float *U, int64_t c0, int64_t c1)
{
	const __m512i lane = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
						_mm512_set1_epi32((int)(g->bwd ? 9 : g->C * 9)));
	for (int64_t c = c0; c < c1; c++)
		for (int64_t ov = 0; ov < g->O / 16; ov++) {
			const float *base = w + (g->bwd ? c * g->O + ov * 16 : ov * 16 * g->C + c) * 9;
			__m512 k[9], t[6][3], u[6];
			for (int i = 0; i < 9; i++)
				k[i] = _mm512_i32gather_ps(lane, base + (g->bwd ? 8 - i : i), 4);
			for (int j = 0; j < 3; j++) { /* G g: down each filter column */
				__m512 col[6];
				wg_g(k[j], k[3 + j], k[6 + j], col);
				for (int r = 0; r < 6; r++)
					t[r][j] = col[r];
			}
			for (int r = 0; r < 6; r++) { /* (G g) G^T: along each row */
				wg_g(t[r][0], t[r][1], t[r][2], u);
				for (int s = 0; s < 6; s++)
					_mm512_storeu_ps(U + ((r * 6 + s) * g->C + c) * g->O + ov * 16, u[s]);
			}
		}
}

/* B^T applied to x[0..5] (stride st), into t[0..5] (stride st) */
CPU_V16 static inline void wg_bt(const __m512 *x, int sx, __m512 *t, int st)
{
	const __m512 x0 = x[0], x1 = x[sx], x2 = x[2 * sx], x3 = x[3 * sx], x4 = x[4 * sx], x5 = x[5 * sx];
	const __m512 four = _mm512_set1_ps(4.0f), two = _mm512_set1_ps(2.0f), m5 = _mm512_set1_ps(-5.0f);
	const __m512 a = _mm512_sub_ps(x4, x2), b = _mm512_sub_ps(x1, x3);
	t[0] = _mm512_fmadd_ps(four, x0, _mm512_fmadd_ps(m5, x2, x4));
	t[st] = _mm512_fnmadd_ps(four, _mm512_add_ps(x1, x2), _mm512_add_ps(x3, x4));
	t[2 * st] = _mm512_fmadd_ps(four, _mm512_sub_ps(x1, x2), _mm512_sub_ps(x4, x3));
	t[3 * st] = _mm512_fnmadd_ps(two, b, a);
	t[4 * st] = _mm512_fmadd_ps(two, b, a);
	t[5 * st] = _mm512_fmadd_ps(four, x1, _mm512_fmadd_ps(m5, x3, x5));
}

/* V of one tile: V[pt * C + c] for every input channel c */
CPU_V16 static void wg_in_tile(const struct wg_geom *g, const float *x, int64_t tile, float *V)
{
	const int64_t H = g->H, W = g->W, C = g->C, per = g->th * g->tw;
	const int64_t n = tile / per, iy0 = 4 * (tile % per / g->tw) - g->ph, ix0 = 4 * (tile % g->tw) - g->pw;
	unsigned rows = 0, cols = 0; /* the rows and columns of the 6x6 block inside x */
	for (int i = 0; i < 6; i++) {
		rows |= (unsigned)(iy0 + i >= 0 && iy0 + i < H) << i;
		cols |= (unsigned)(ix0 + i >= 0 && ix0 + i < W) << i;
	}
	const float *xn = x + n * H * W * C;
	const __m512 zero = _mm512_setzero_ps();
	for (int64_t c = 0; c < C; c += 16) {
		__m512 t[36];
		for (int i = 0; i < 6; i++) { /* d B: along each row */
			__m512 d[6];
			for (int j = 0; j < 6; j++)
				d[j] = (rows >> i & cols >> j & 1) ? _mm512_loadu_ps(xn + ((iy0 + i) * W + ix0 + j) * C + c)
								 : zero;
			wg_bt(d, 1, t + i * 6, 1);
		}
		for (int j = 0; j < 6; j++) { /* B^T (d B): down each column */
			__m512 v[6];
			wg_bt(t + j, 6, v, 1);
			for (int i = 0; i < 6; i++)
				_mm512_storeu_ps(V + (i * 6 + j) * C + c, v[i]);
		}
	}
}

/* A^T applied to m[0..5] (stride sm): o[0..3] (stride so) */
CPU_V16 static inline void wg_at(const __m512 *m, int sm, __m512 *o, int so)
{
	const __m512 s12 = _mm512_add_ps(m[sm], m[2 * sm]), d12 = _mm512_sub_ps(m[sm], m[2 * sm]);
	const __m512 s34 = _mm512_add_ps(m[3 * sm], m[4 * sm]), d34 = _mm512_sub_ps(m[3 * sm], m[4 * sm]);
	o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
	o[so] = _mm512_fmadd_ps(_mm512_set1_ps(2.0f), d34, d12);
	o[2 * so] = _mm512_fmadd_ps(_mm512_set1_ps(4.0f), s34, s12);
	o[3 * so] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.0f), d34, d12), m[5 * sm]);
}

/* The outputs of one tile from M[pt * O + o]: + bias, + residual, ReLU */
CPU_V16 static void wg_out_tile(const struct wg_geom *g, const float *M, int64_t tile, const float *b,
				const float *r, int relu, float *y)
{
	const int64_t per = g->th * g->tw, n = tile / per, oy0 = 4 * (tile % per / g->tw), ox0 = 4 * (tile % g->tw);
	const int nr = g->OH - oy0 < 4 ? (int)(g->OH - oy0) : 4, nc = g->OW - ox0 < 4 ? (int)(g->OW - ox0) : 4;
	const size_t at = (size_t)((n * g->OH + oy0) * g->OW + ox0) * g->O;
	const __m512 zero = _mm512_setzero_ps();
	for (int64_t o = 0; o < g->O; o += 16) {
		__m512 m[36], a[24], q[16];
		for (int k = 0; k < 36; k++)
			m[k] = _mm512_loadu_ps(M + k * g->O + o);
		for (int i = 0; i < 6; i++) /* m A: along each row */
			wg_at(m + i * 6, 1, a + i * 4, 1);
		for (int j = 0; j < 4; j++) /* A^T (m A): down each column */
			wg_at(a + j, 4, q + j, 4);
		const __m512 bv = b ? _mm512_loadu_ps(b + o) : zero;
		for (int i = 0; i < nr; i++)
			for (int j = 0; j < nc; j++) {
				const size_t e = at + (size_t)(i * g->OW + j) * g->O + o;
				__m512 v = _mm512_add_ps(q[i * 4 + j], bv);
				if (r)
					v = _mm512_add_ps(v, _mm512_loadu_ps(r + e));
				_mm512_storeu_ps(y + e, relu ? _mm512_max_ps(zero, v) : v);
			}
	}
}

/* The GEMM's register block: TR tiles x OB vectors of 16 output channels,
 * M[t][o] = sum_c V[t][c] U[c][o] (rows of V: vs floats apart; of U: O;
 * of M: ms) */
#define WG_MK(NAME, TR, OB)                                                                       \
	CPU_V16 static void NAME(const float *V, const float *U, float *M, int64_t C, int64_t O, int64_t vs, int64_t ms) \
	{                                                                                         \
		__m512 acc[TR][OB];                                                               \
		_Pragma("GCC unroll 16") for (int i = 0; i < TR; i++)                             \
			_Pragma("GCC unroll 4") for (int j = 0; j < OB; j++) acc[i][j] =          \
				_mm512_setzero_ps();                                              \
		for (int64_t c = 0; c < C; c++) {                                                 \
			__m512 u[OB];                                                             \
			_Pragma("GCC unroll 4") for (int j = 0; j < OB; j++) u[j] =               \
				_mm512_loadu_ps(U + c * O + 16 * j);                              \
			_Pragma("GCC unroll 16") for (int i = 0; i < TR; i++)                     \
			{                                                                         \
				const __m512 v = _mm512_set1_ps(V[i * vs + c]);                   \
				_Pragma("GCC unroll 4") for (int j = 0; j < OB; j++) acc[i][j] =  \
					_mm512_fmadd_ps(v, u[j], acc[i][j]);                      \
			}                                                                         \
		}                                                                                 \
		_Pragma("GCC unroll 16") for (int i = 0; i < TR; i++)                             \
			_Pragma("GCC unroll 4") for (int j = 0; j < OB; j++)                      \
				_mm512_storeu_ps(M + i * ms + 16 * j, acc[i][j]);                 \
	}
WG_MK(wg_mk_6x4, 6, 4)
WG_MK(wg_mk_12x2, 12, 2)
WG_MK(wg_mk_12x1, 12, 1)
WG_MK(wg_mk_1x4, 1, 4)
WG_MK(wg_mk_1x2, 1, 2)
WG_MK(wg_mk_1x1, 1, 1)

/* M = V U at one point for nt tiles (V: nt rows of C, vs floats apart; U:
 * C x O; M: nt rows of O, ms apart) */
CPU_V16 static void wg_gemm(const float *V, const float *U, float *M, int64_t nt, int64_t C, int64_t O, int64_t vs,
			    int64_t ms)
{
	for (int64_t ov = 0, nov = O / 16; ov < nov;) {
		const int64_t ob = nov - ov >= 4 ? 4 : nov - ov >= 2 ? 2 : 1;
		const float *Uo = U + ov * 16;
		float *Mo = M + ov * 16;
		int64_t t = 0;
		if (ob == 4)
			for (; t + 6 <= nt; t += 6)
				wg_mk_6x4(V + t * vs, Uo, Mo + t * ms, C, O, vs, ms);
		else if (ob == 2)
			for (; t + 12 <= nt; t += 12)
				wg_mk_12x2(V + t * vs, Uo, Mo + t * ms, C, O, vs, ms);
		else
			for (; t + 12 <= nt; t += 12)
				wg_mk_12x1(V + t * vs, Uo, Mo + t * ms, C, O, vs, ms);
		for (; t < nt; t++)
			(ob == 4 ? wg_mk_1x4 : ob == 2 ? wg_mk_1x2 : wg_mk_1x1)(V + t * vs, Uo, Mo + t * ms, C, O, vs, ms);
		ov += ob;
	}
}

/* One block of nt tiles from tile t0: in, 36 GEMMs, out.  V and M hold
 * a tile's 36 points together (V[t][pt][c], M[t][pt][o]), so that the
 * transforms read and write whole lines in order. */
CPU_V16 static void wg_block(const struct wg_geom *g, const float *x, const float *U, const float *b, const float *r,
			     int relu, float *y, float *slot, int64_t t0, int64_t nt)
{
	float *V = slot, *M = slot + g->m_at;
	const int64_t vs = WG_PTS * g->C, ms = WG_PTS * g->O;
	for (int64_t i = 0; i < nt; i++)
		wg_in_tile(g, x, t0 + i, V + i * vs);
	for (int k = 0; k < WG_PTS; k++)
		wg_gemm(V + k * g->C, U + k * g->C * g->O, M + k * g->O, nt, g->C, g->O, vs, ms);
	for (int64_t i = 0; i < nt; i++)
		wg_out_tile(g, M + i * ms, t0 + i, b, r, relu, y);
}
#endif

static kiln_status wg_run(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
#if CPU_HAVE_V16
	struct wg_geom g;
	wg_geom(p, &g);
	float *ws = (float *)(((uintptr_t)a->workspace + WG_ALIGN - 1) & ~(uintptr_t)(WG_ALIGN - 1));
	const int res = (p->op.flags & KILN_OPF_RESIDUAL) != 0, relu = (p->op.flags & KILN_OPF_ACT) != 0;
	const float *x = a->in[0], *w = a->in[1];
	const float *b = p->op.n_in == 3 + res ? a->in[2] : NULL, *r = res ? a->in[p->op.n_in - 1] : NULL;
	float *y = a->out[0], *U = ws;
	/* a frozen plan's U: made here only when the weights changed since
	 * (held to write until it is), else read where another run made it */
	struct cpu_wino *k = p->wino;
	int make = 1;
	if (k) {
		int lib;
		pthread_mutex_lock(&k->lock);
		if (cpu_wref_acquire(&k->r, w, NULL, &make, &lib)) {
			pthread_mutex_unlock(&k->lock);
			return cpu_fail(e, KILN_ENOMEM, "cpu: out of memory for a Winograd plan's weights (%zu bytes)",
					g.u_len * sizeof(float));
		}
		U = ((struct wg_kept *)k->r.e)->U;
	}
	const int64_t nb = (g.tiles + g.TB - 1) / g.TB;
	/* a team where there are two blocks and ~150k FMAs (36 C O a tile):
	 * the ResNet's 28x28 layer of one sample takes both threads */
#pragma omp parallel if (nb >= 2 && g.tiles * g.C * g.O >= 4096)
	{
		const int64_t team = cpu_num_threads(), t = cpu_thread_num();
		const int64_t T = team < g.slots ? team : g.slots;
		if (make && t < T)
			wg_weights(&g, w, U, g.C * t / T, g.C * (t + 1) / T);
#pragma omp barrier
		if (t < T)
			for (int64_t q = nb * t / T, q1 = nb * (t + 1) / T; q < q1; q++)
				wg_block(&g, x, U, b, r, relu, y, ws + g.slot_at + (size_t)t * g.slot_len,
					 q * g.TB, g.tiles - q * g.TB < g.TB ? g.tiles - q * g.TB : g.TB);
	}
	if (k) {
		if (make) {
			cpu_wref_filled(&k->r);
			k->host->log(KILN_LOG_DEBUG, "cpu", "%s: Winograd-transformed weights made (%lld x %lld channels; frozen: kept until the weights change, shared by the plans that read them)",
				     cpu_op_name(p->op.type), (long long)g.C, (long long)g.O);
		}
		cpu_wref_release(&k->r);
		pthread_mutex_unlock(&k->lock);
	}
#else
	(void)p, (void)a, (void)e;
#endif
	return KILN_OK;
}

kiln_status cpu_wino_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (!cpu_wino_ok(op))
		return cpu_bad(c, op, KILN_ENOTSUP,
			       "the Winograd convolution (wino.c): a forward or data gradient, f32 NHWC, 3x3, "
			       "stride 1, channels multiples of 16, AVX-512");
	/* the data gradient: dy [N, O, OH, OW] correlated with the turned
	 * filters, padded by 2 - pad, gives dx [N, C, H, W] */
	const int bwd = op->type == KILN_OP_CONV_BWD_DATA;
	const struct kiln_tensor_desc *x = &op->in[0], *y = &op->out[0];
	p->sz[0] = x->dims[0], p->sz[1] = x->dims[1], p->sz[2] = x->dims[2], p->sz[3] = x->dims[3];
	p->sz[4] = y->dims[1];
	p->sz[5] = c->threads > 0 ? c->threads : 1;
	p->sz[6] = (op->flags & KILN_OPF_FROZEN) && c->keep_weights; /* U kept (struct cpu_wino) */
	p->sz[7] = bwd;
	p->rows = bwd ? 2 - op->i[2] : op->i[2], p->cols = bwd ? 2 - op->i[3] : op->i[3];
	struct wg_geom g;
	wg_geom(p, &g);
	p->n = cpu_numel(&op->out[0]);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = wg_run;
	p->workspace = (g.slot_at + (size_t)g.slots * g.slot_len) * sizeof(float) + WG_ALIGN;
	if (p->sz[6]) {
		struct cpu_wino *k = p->wino = calloc(1, sizeof *k);
		int lib;
		if (!k)
			return c->host->error(KILN_ENOMEM, "cpu: out of memory for a Winograd plan's weights");
		pthread_mutex_init(&k->lock, NULL);
		k->k = (struct wg_key){ g.C, g.O, g.bwd };
		k->host = c->host;
		/* frozen: no entry until the first run (cannot fail here) */
		(void)cpu_wref_init(&k->r, c, &wg_kept_kind, &k->k, 1, &lib);
	}
	c->host->log(KILN_LOG_DEBUG, "cpu",
		     "%s %s [%lld,%lld,%lld,%lld] -> [%lld,%lld,%lld,%lld] pad %lldx%lld NHWC%s%s: Winograd "
		     "F(4x4, 3x3) (wino.c), %lld tiles in blocks of %lld, workspace %zu bytes%s",
		     cpu_op_name(op->type), bwd ? "dy" : "x", (long long)g.N, (long long)g.C, (long long)g.H,
		     (long long)g.W, (long long)g.N, (long long)g.O, (long long)g.OH, (long long)g.OW,
		     (long long)op->i[2], (long long)op->i[3],
		     op->flags & KILN_OPF_RESIDUAL ? ", residual" : "", op->flags & KILN_OPF_ACT ? ", ReLU" : "",
		     (long long)g.tiles, (long long)g.TB, p->workspace,
		     p->wino ? ", transformed weights kept (frozen)" : "");
	return KILN_OK;
}
