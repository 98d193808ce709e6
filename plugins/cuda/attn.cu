/* plugins/cuda/attn.cu - fused scaled-dot-product attention, KILN_OP_ATTENTION
 * and KILN_OP_ATTENTION_BWD (kiln/ops.h), kiln's own straightforward
 * kernels: one thread block per (query or key row, batch*head), the row's
 * [T] scores in shared memory, f32 arithmetic on f32, bf16 or f16 tensors
 * (kern_ld / kern_st: bit for bit the f32 op on the widened inputs,
 * rounded once at the store; lse is f32).  Deterministic (no atomics).
 * They run what cuDNN's fused attention (sdpa.c) does not take: f32,
 * dropout (kiln's mask), accumulation, head dims cuDNN refuses, or every
 * op with KILN_CUDA_ATTN=kiln.  Compiled here; they have only run where a
 * GPU is (tests/check_device_attention on the cuda device).
 *
 *   forward   block (i, bh): s_j = scale q_i.k_j (j <= i when causal),
 *             lse_i = logsumexp s, P'_j = e^(s_j - lse_i) M_ij,
 *             y_i = sum_j P'_j v_j
 *   backward  block (i, bh), queries: Di = dy_i.y_i (kept in the
 *             workspace), dS_ij = P_ij (M_ij dy_i.v_j - Di),
 *             dq_i = scale sum_j dS_ij k_j
 *             block (j, bh), keys: the same P_ij, dS_ij over the rows i
 *             that see key j, dv_j = sum_i P'_ij dy_i,
 *             dk_j = scale sum_i dS_ij q_i
 * M is DROPOUT's mask of the logical index ((b*H + h)*T + i)*T + j, b
 * the row's place in the step's global batch (kern_drop_global,
 * kern_drop_scale: the CPU's and the tests' Philox).
 */
#include "cuda.h"
#include "kern.h" /* kern_drop*, kern_ld, kern_st */

#include <math.h>
#include <stdint.h>

#define ATTN_THREADS 128

/* The sizes of a plan (ops.c: attn_prepare): rows = B*H pairs, cols = T,
 * sz[0] = C, sz[1] = H. */
struct attn_k {
	int64_t T, C, H, D;
	float scale;
	int causal, drop;
	int dt; /* qkv's, y's, dy's and dqkv's dtype */
	struct kern_drop d;
};

static struct attn_k attn_k(const struct cuda_plan *p)
{
	struct attn_k g;
	g.T = p->cols, g.C = p->sz[0], g.H = p->sz[1], g.D = g.C / g.H;
	g.scale = (float)p->op.f[0];
	g.causal = (int)p->op.i[1];
	g.drop = p->op.f[1] > 0;
	g.dt = p->op.in[p->op.type == KILN_OP_ATTENTION_BWD ? 1 : 0].dtype;
	/* DROPOUT's constants from the attention's seed, layer and p */
	struct kiln_op o = p->op;
	o.i[0] = p->op.i[2], o.i[1] = p->op.i[3], o.f[0] = p->op.f[1];
	kern_drop_setup(&o, &g.d);
	return g;
}

/* Block-wide max (is_max) or sum of v; every thread gets the result.
 * red: 32 floats of shared memory. */
__device__ static float block_reduce(float v, int is_max, float *red)
{
	for (int o = 16; o > 0; o >>= 1) {
		const float w = __shfl_xor_sync(0xffffffffu, v, o);
		v = is_max ? fmaxf(v, w) : v + w;
	}
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	__syncthreads(); /* red may still be read by a previous reduction */
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
	for (int o = 16; o > 0; o >>= 1) {
		const float w = __shfl_xor_sync(0xffffffffu, v, o);
		v = is_max ? fmaxf(v, w) : v + w;
	}
	return v;
}

/* a[ia..ia+D) . b[ib..ib+D), both of dtype dt */
__device__ static float dot(const void *a, int64_t ia, const void *b, int64_t ib, int64_t D,
			    int dt)
{
	float s = 0.0f;
	for (int64_t d = 0; d < D; d++)
		s += kern_ld(a, dt, ia + d) * kern_ld(b, dt, ib + d);
	return s;
}

/* The dropout counter { step, row0, rstride } of a kernel (zeros without
 * dropout: no step input). */
struct attn_ctr {
	uint64_t t; /* the step, whole (kern_drop_scale) */
	int64_t row0, rstride;
};

__device__ static struct attn_ctr attn_ctr(const struct attn_k *g, const int64_t *ctr)
{
	struct attn_ctr c = { 0, 0, 1 };
	if (g->drop)
		c.t = (uint64_t)ctr[0], c.row0 = ctr[1], c.rstride = ctr[2];
	return c;
}

/* The dropout scale of P[i][j] of pair bh (1 without dropout): the mask
 * of its logical index in [B,H,T,T] with b the row's place in the step's
 * global batch (kern_drop_global, R = H*T*T: the CPU's attn_head e0). */
__device__ static float attn_mask(const struct attn_k *g, struct attn_ctr c, int64_t bh,
				  int64_t i, int64_t j)
{
	if (!g->drop)
		return 1.0f;
	const int64_t R = g->H * g->T * g->T;
	const uint64_t e = (uint64_t)((bh * g->T + i) * g->T + j);
	return kern_drop_scale(&g->d, c.t, kern_drop_global(e, R, c.row0, c.rstride));
}

/* Row i of pair bh = (b, h): its q (k, v: + C, + 2C) and its token offset. */
#define ATTN_QKV(g, bh, i) ((((bh) / (g).H) * (g).T + (i)) * 3 * (g).C + ((bh) % (g).H) * (g).D)
#define ATTN_TOK(g, bh, i) ((((bh) / (g).H) * (g).T + (i)) * (g).C + ((bh) % (g).H) * (g).D)

__global__ void k_attn_fwd(struct attn_k g, const void *qkv, void *y, float *lse,
			   const int64_t *step)
{
	extern __shared__ float sh[]; /* [32 | T] */
	float *red = sh, *s = sh + 32;
	const int64_t i = blockIdx.x, bh = blockIdx.y;
	const int64_t valid = g.causal ? i + 1 : g.T;
	const struct attn_ctr t = attn_ctr(&g, step);
	const int64_t q = ATTN_QKV(g, bh, i);
	float mx = -INFINITY;
	for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
		s[j] = g.scale * dot(qkv, q, qkv, ATTN_QKV(g, bh, j) + g.C, g.D, g.dt);
		mx = fmaxf(mx, s[j]);
	}
	mx = block_reduce(mx, 1, red);
	float z = 0.0f;
	for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
		z += expf(s[j] - mx);
	z = block_reduce(z, 0, red);
	const float l = mx + logf(z);
	for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
		s[j] = expf(s[j] - l) * attn_mask(&g, t, bh, i, j);
	__syncthreads();
	for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) {
		float acc = 0.0f;
		for (int64_t j = 0; j < valid; j++)
			acc += s[j] * kern_ld(qkv, g.dt, ATTN_QKV(g, bh, j) + 2 * g.C + d);
		kern_st(y, g.dt, ATTN_TOK(g, bh, i) + d, acc);
	}
	if (threadIdx.x == 0)
		lse[bh * g.T + i] = l;
}

/* Queries: Di into di[bh*T + i], dq_i (=|+=). */
__global__ void k_attn_bwd_q(struct attn_k g, const void *dy, const void *qkv, const void *y,
			     const float *lse, const int64_t *step, float *di, void *dqkv, int acc)
{
	extern __shared__ float sh[]; /* [32 | T] */
	float *red = sh, *s = sh + 32;
	const int64_t i = blockIdx.x, bh = blockIdx.y;
	const int64_t valid = g.causal ? i + 1 : g.T;
	const struct attn_ctr t = attn_ctr(&g, step);
	const int64_t q = ATTN_QKV(g, bh, i), dyi = ATTN_TOK(g, bh, i);
	float part = 0.0f;
	for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x)
		part += kern_ld(dy, g.dt, dyi + d) * kern_ld(y, g.dt, dyi + d);
	const float D_i = block_reduce(part, 0, red), l = lse[bh * g.T + i];
	for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
		const int64_t kj = ATTN_QKV(g, bh, j) + g.C;
		const float pij = expf(g.scale * dot(qkv, q, qkv, kj, g.D, g.dt) - l);
		const float dp = dot(dy, dyi, qkv, kj + g.C, g.D, g.dt) * attn_mask(&g, t, bh, i, j);
		s[j] = pij * (dp - D_i);
	}
	__syncthreads();
	for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) {
		float a = 0.0f;
		for (int64_t j = 0; j < valid; j++)
			a += s[j] * kern_ld(qkv, g.dt, ATTN_QKV(g, bh, j) + g.C + d);
		kern_st(dqkv, g.dt, q + d, g.scale * a + (acc ? kern_ld(dqkv, g.dt, q + d) : 0.0f));
	}
	if (threadIdx.x == 0)
		di[bh * g.T + i] = D_i;
}

/* Keys: dk_j, dv_j (=|+=) over the rows that see key j. */
__global__ void k_attn_bwd_kv(struct attn_k g, const void *dy, const void *qkv,
			      const float *lse, const int64_t *step, const float *di, void *dqkv,
			      int acc)
{
	extern __shared__ float sh[]; /* [32 | T: P' | T: dS] */
	float *pm = sh + 32, *ds = sh + 32 + g.T;
	const int64_t j = blockIdx.x, bh = blockIdx.y;
	const int64_t first = g.causal ? j : 0;
	const struct attn_ctr t = attn_ctr(&g, step);
	const int64_t kj = ATTN_QKV(g, bh, j) + g.C, vj = kj + g.C;
	for (int64_t i = first + threadIdx.x; i < g.T; i += blockDim.x) {
		const int64_t dyi = ATTN_TOK(g, bh, i);
		const float pij = expf(g.scale * dot(qkv, ATTN_QKV(g, bh, i), qkv, kj, g.D, g.dt) -
				       lse[bh * g.T + i]);
		const float m = attn_mask(&g, t, bh, i, j);
		pm[i] = pij * m;
		ds[i] = pij * (dot(dy, dyi, qkv, vj, g.D, g.dt) * m - di[bh * g.T + i]);
	}
	__syncthreads();
	for (int64_t d = threadIdx.x; d < g.D; d += blockDim.x) {
		float ak = 0.0f, av = 0.0f;
		for (int64_t i = first; i < g.T; i++) {
			ak += ds[i] * kern_ld(qkv, g.dt, ATTN_QKV(g, bh, i) + d);
			av += pm[i] * kern_ld(dy, g.dt, ATTN_TOK(g, bh, i) + d);
		}
		kern_st(dqkv, g.dt, kj + d, g.scale * ak + (acc ? kern_ld(dqkv, g.dt, kj + d) : 0.0f));
		kern_st(dqkv, g.dt, vj + d, av + (acc ? kern_ld(dqkv, g.dt, vj + d) : 0.0f));
	}
}

extern "C" cudaError_t cuda_launch_attention(const struct cuda_plan *p,
					     const struct kiln_op_args *a, cudaStream_t s)
{
	const struct attn_k g = attn_k(p);
	const dim3 grid((unsigned)g.T, (unsigned)p->rows);
	const size_t sh = sizeof(float) * (size_t)(32 + g.T);
	const int64_t *step = g.drop ? (const int64_t *)a->in[p->op.n_in - 1] : NULL;
	k_attn_fwd<<<grid, ATTN_THREADS, sh, s>>>(g, a->in[0], a->out[0], (float *)a->out[1], step);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_attention_bwd(const struct cuda_plan *p,
						 const struct kiln_op_args *a, cudaStream_t s)
{
	const struct attn_k g = attn_k(p);
	const dim3 grid((unsigned)g.T, (unsigned)p->rows);
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const int64_t *step = g.drop ? (const int64_t *)a->in[p->op.n_in - 1] : NULL;
	const void *dy = a->in[0], *qkv = a->in[1];
	const float *lse = (const float *)a->in[3];
	float *di = (float *)a->workspace;
	void *dqkv = a->out[0];
	k_attn_bwd_q<<<grid, ATTN_THREADS, sizeof(float) * (size_t)(32 + g.T), s>>>(
		g, dy, qkv, a->in[2], lse, step, di, dqkv, acc);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_attn_bwd_kv<<<grid, ATTN_THREADS, sizeof(float) * (size_t)(32 + 2 * g.T), s>>>(
		g, dy, qkv, lse, step, di, dqkv, acc);
	return cudaGetLastError();
}
