/* plugins/cuda/kernels.cu - kiln's own CUDA kernels: bias add and gradient,
 * ReLU forward/backward, the fused loss (softmax cross-entropy, MSE, BCE:
 * forward, backward and the metric counts in one pass), SGD with momentum
 * and AdamW over the flat buffers, fill, sum, the vector ops, the step
 * counter, the learning-rate schedule, u8 normalisation, the casts,
 * gradient clipping, the activations, the embedding and layer norm,
 * dropout, concat/split, reorder and LAMB, each over f32, bf16 or f16
 * storage (ld/st below).  The formulas
 * are plugin.h's; the reference loops are plugins/cpu/ops.c, optim.c,
 * act.c and layout.c; the pure maps are kern.h (host-tested).
 *
 * Each op has one launcher, cuda_launch_<op>(plan, args, stream), called
 * by run() on the caller's thread: it only enqueues and returns the launch
 * status.  Sizes come from the plan (checked once in prepare); every per-
 * step scalar (lr, the step counter, the optimizer gate) is read from
 * device memory inside the kernel, never from the host, so one plan serves
 * every step and a captured graph replays correct values.
 *
 * Reductions are deterministic: a fixed grid (CUDA_RED_BLOCKS, the loss's
 * CUDA_XENT_BLOCKS, or fewer when the shape is smaller, decided by the
 * shape alone; the loss's kernel by the shape, the dtypes and the
 * alignment: xent_wide_ok), each block sums
 * its fixed share in a fixed order, and one thread adds the block partials
 * in index order.  No float atomics, so a run reproduces bit for bit.  The
 * partials live in a small scratch buffer the plan owns (sz[3] bytes,
 * allocated once in prepare).
 */
#include "cuda.h"
#include "kern.h"       /* the pure maps, the dropout mask, LAMB's grid (host-tested) */
#include "../common/scalar_ops.h" /* LR schedule, loss scaler, clip factor: the CPU's code */

#include <cuda_fp16.h>  /* __half, __half2float, __float2half_rn */
#include <math.h>
#include <stdint.h>

/* ---- dtypes: f32 arithmetic on f32, bf16 or f16 storage ----------------- */

/* Element i of a float tensor of dtype dt (KILN_F32, _BF16, _F16), widened
 * exactly.  dt is a kernel argument, the same for every thread, so the
 * switch never diverges; kernels stay one code path for every dtype, and
 * a low-precision op computes bit for bit what the f32 op computes on the
 * widened operands, rounded once at the store (the CPU device's lowp.c
 * contract, which tests/check_device.c asserts). */
__device__ __forceinline__ float ld(const void *p, int dt, int64_t i) { return kern_ld(p, dt, i); }

/* Store v rounded to nearest even (f16: past 65504 is inf, as _Float16). */
__device__ __forceinline__ void st(void *p, int dt, int64_t i, float v) { kern_st(p, dt, i, v); }

/* the dtypes of an op's tensors */
#define DTI(p, k) ((int)(p)->op.in[k].dtype)
#define DTO(p, k) ((int)(p)->op.out[k].dtype)

/* Grid-stride loop over [0, n). */
#define FOR_N(i, n)                                                                        \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
	     i += (int64_t)gridDim.x * blockDim.x)

/* Blocks for an elementwise kernel over n: enough to fill the GPU a few
 * times over (p->grid, from the SM count), fewer for small n. */
static int blocks_for(const struct cuda_plan *p, int64_t n)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	if (b > p->grid)
		b = p->grid;
	return b < 1 ? 1 : (int)b;
}

/* ---- bias ------------------------------------------------------------- */

/* y (R, N) += b (N); y of dtype dy, b of db */
__global__ void k_bias_add(void *y, int dy, const void *b, int db, int64_t total, int64_t N)
{
	FOR_N(i, total)
		st(y, dy, i, ld(y, dy, i) + ld(b, db, i % N));
}

extern "C" cudaError_t cuda_launch_bias_add(const struct cuda_plan *p, const struct kiln_op_args *a,
					    cudaStream_t s)
{
	const int64_t n = p->rows * p->cols;
	k_bias_add<<<blocks_for(p, n), CUDA_THREADS, 0, s>>>(a->out[0], DTO(p, 0), a->in[0],
							     DTI(p, 0), n, p->cols);
	return cudaGetLastError();
}

/* gemm.c: an f32 bias into a bf16/f16 GEMM output, which cuBLASLt's
 * epilogue takes only into an f32 D (the stage): y (n) = stage, or y + stage (acc), f32 arithmetic, one rounding */
__global__ void k_stage_round(void *y, int ty, const float *stage, int64_t n, int acc)
{
	FOR_N(i, n)
	{
		st(y, ty, i, acc ? ld(y, ty, i) + stage[i] : stage[i]);
	}
}

extern "C" cudaError_t cuda_stage_round(void *y, int dtype, const float *stage, int64_t n, int acc,
					int grid, cudaStream_t s)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	b = b > grid ? grid : b < 1 ? 1 : b;
	k_stage_round<<<(unsigned)b, CUDA_THREADS, 0, s>>>(y, dtype, stage, n, acc);
	return cudaGetLastError();
}

/* ---- column sums (BIAS_GRAD, LAYERNORM_BWD's dgamma, dbeta) -----------
 * s0[j] = sum over rows of dy (R, N), and s1[j] = sum of dy * xhat with
 * xhat = (x - mean_r) * rstd_r (saved [R, 2]) when x is given.  Pass 1:
 * block (32, 8) of column tile t = blockIdx.x % tiles (32 adjacent
 * columns: coalesced rows) and row slice k = blockIdx.x / tiles; row phase
 * ty sums rows r0 + ty, r0 + ty + 8, ... in order, the 8 phase sums are
 * added in order, into part[(k N + j) 2 + {0, 1}] (the plan's scratch).
 * Pass 2: a warp per column adds the K slices (lane l: k = l, l + 32, ...;
 * then a fixed shuffle tree).  A fixed order for a given shape, whatever
 * the GPU; sums in double (the conformance bound is 1e-6 of the
 * magnitude).  One block per 32 columns looping over every row (or one
 * thread per column, layernorm's) left most of an H200 idle: GPT-2's
 * layernorm backward took 57% of its step. */
__global__ void k_col_part(double *part, int K, const void *dy, int tdy, const void *x, int tx,
			   const float *saved, int64_t R, int64_t N)
{
	const int64_t tiles = (N + 31) / 32;
	const int64_t j = (blockIdx.x % tiles) * 32 + threadIdx.x;
	const int k = (int)(blockIdx.x / tiles);
	const int64_t r0 = R * k / K, r1 = R * (k + 1) / K;
	double a = 0, b = 0;
	if (j < N)
		for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
			const double d = ld(dy, tdy, r * N + j);
			a += d;
			if (x)
				b += d * ((ld(x, tx, r * N + j) - saved[2 * r]) * saved[2 * r + 1]);
		}
	__shared__ double sa[8][33], sb[8][33];
	sa[threadIdx.y][threadIdx.x] = a;
	sb[threadIdx.y][threadIdx.x] = b;
	__syncthreads();
	if (threadIdx.y == 0 && j < N) {
		double ta = 0, tb = 0;
		for (int q = 0; q < 8; q++)
			ta += sa[q][threadIdx.x], tb += sb[q][threadIdx.x];
		part[((int64_t)k * N + j) * 2] = ta;
		part[((int64_t)k * N + j) * 2 + 1] = tb;
	}
}

/* o0[j] (dtype t0) (=|+=) s0; o1[j] (f32, when given) (=|+=) s1.  K, the
 * slices: cuda_chan_slices(R, N, 1) (bn_pool.c), the batch norm's rows */
__global__ void k_col_final(void *o0, int t0, float *o1, const double *part, int K, int64_t N,
			    int acc)
{
	const int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	if (j >= N)
		return; /* the whole warp */
	double a = 0, b = 0;
	for (int k = lane; k < K; k += 32) {
		a += part[((int64_t)k * N + j) * 2];
		b += part[((int64_t)k * N + j) * 2 + 1];
	}
	for (int o = 16; o > 0; o >>= 1) {
		a += __shfl_down_sync(0xffffffffu, a, o);
		b += __shfl_down_sync(0xffffffffu, b, o);
	}
	if (lane)
		return;
	st(o0, t0, j, (float)(acc ? (double)ld(o0, t0, j) + a : a));
	if (o1)
		o1[j] = (float)(acc ? (double)o1[j] + b : b);
}

static cudaError_t col_sums(const struct cuda_plan *p, void *o0, int t0, float *o1, const void *dy,
			    int tdy, const void *x, int tx, const float *saved, int64_t R, int64_t N,
			    int acc, cudaStream_t s)
{
	const int K = (int)p->sz[1];
	double *part = (double *)p->scratch;
	const unsigned b1 = (unsigned)(((N + 31) / 32) * K);
	k_col_part<<<b1, dim3(32, 8), 0, s>>>(part, K, dy, tdy, x, tx, saved, R, N);
	const unsigned b2 = (unsigned)((32 * N + CUDA_THREADS - 1) / CUDA_THREADS);
	k_col_final<<<b2, CUDA_THREADS, 0, s>>>(o0, t0, o1, part, K, N, acc);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_bias_grad(const struct cuda_plan *p, const struct kiln_op_args *a,
					     cudaStream_t s)
{
	return col_sums(p, a->out[0], DTO(p, 0), NULL, a->in[0], DTI(p, 0), NULL, 0, NULL, p->rows,
			p->cols, (p->op.flags & KILN_OPF_ACCUMULATE) != 0, s);
}

/* ---- ReLU ------------------------------------------------------------- */

/* y (n) = max(x, 0), x == y allowed; NaN passes through as in PyTorch (and
 * the CPU device), so an overflow stays visible downstream. */
__global__ void k_relu(void *y, int dy, const void *x, int dx, int64_t n)
{
	FOR_N(i, n)
	{
		const float v = ld(x, dx, i);
		st(y, dy, i, v < 0.0f ? 0.0f : v);
	}
}

extern "C" cudaError_t cuda_launch_relu(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_relu<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], DTO(p, 0), a->in[0],
							     DTI(p, 0), p->n);
	return cudaGetLastError();
}

/* dx (n) (=|+=) y > 0 ? dy : 0 with y the forward output: a select, not a
 * product, so an inf dy where y == 0 gives 0, not NaN. */
__global__ void k_relu_bwd(void *dx, int tdx, const void *y, int ty, const void *dy, int tdy,
			   int64_t n, int acc)
{
	FOR_N(i, n)
	{
		const float g = ld(y, ty, i) > 0.0f ? ld(dy, tdy, i) : 0.0f;
		st(dx, tdx, i, acc ? ld(dx, tdx, i) + g : g);
	}
}

extern "C" cudaError_t cuda_launch_relu_bwd(const struct cuda_plan *p, const struct kiln_op_args *a,
					    cudaStream_t s)
{
	k_relu_bwd<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), a->in[1], DTI(p, 1), p->n,
		(p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- the fused loss ---------------------------------------------------- */

__device__ static double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ static int warp_sum_i(int v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* The first-index maximum: (om, oa) replaces (*mx, *am) when it is larger,
 * or equal at a smaller index; an index of C marks a side that saw no
 * element (PyTorch's argmax: the first of equal maxima). */
__device__ static void argmax_take(float *mx, int *am, float om, int oa, int C)
{
	if (oa != C && (*am == C || om > *mx || (om == *mx && oa < *am)))
		*mx = om, *am = oa;
}

/* The warp's (max, first index), to every lane */
__device__ static void warp_argmax(float *mx, int *am, int C)
{
	for (int o = 16; o > 0; o >>= 1) {
		const float om = __shfl_xor_sync(0xffffffffu, *mx, o);
		const int oa = __shfl_xor_sync(0xffffffffu, *am, o);
		argmax_take(mx, am, om, oa, C);
	}
}

/* The block's sum of v: the warps' sums added in warp order, the same
 * bits in every thread (every thread of the block calls it) */
__device__ static double block_sum_d(double v)
{
	__shared__ double sh[CUDA_THREADS / 32];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum_d(v);
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	double t = 0;
	for (int k = 0; k < nw; k++)
		t += sh[k];
	__syncthreads(); /* the scratch is free again */
	return t;
}

/* Block partials of the loss: loss sum, top-1 count, top-5 count, rows
 * with a label outside [0, C).  (ops.c sizes the scratch as 4 doubles per
 * block.) */
struct xent_part {
	double loss, ok, ok5, bad;
};
static_assert(sizeof(struct xent_part) == 4 * sizeof(double), "ops.c sizes the scratch so");

/* Row r's label l is outside [0, K): leave (row, label) in *err, the
 * smallest row winning (device memory: atomic among the GPU's threads) */
__device__ static void xent_bad_label(struct cuda_err_rec *err, int64_t r, int32_t l, int64_t K,
				      int op)
{
	const unsigned long long key = kern_err_key_label(r, l);
	if (atomicMin(&err->key, key) > key) {
		err->val = K;
		err->op = op;
		err->kind = KERN_ERR_LABEL;
	}
}

/* ignore_index: *cnt = the rows r < V whose label is not `ignored` (one
 * block, per-thread counts added in thread order: exact and fixed). */
__global__ void k_xent_count(double *cnt, const int32_t *label, int64_t V, int32_t ignored)
{
	__shared__ double part[CUDA_THREADS];
	double n = 0;
	for (int64_t r = threadIdx.x; r < V; r += blockDim.x)
		n += label[r] != ignored;
	part[threadIdx.x] = n;
	__syncthreads();
	if (threadIdx.x == 0) {
		double t = 0;
		for (int k = 0; k < (int)blockDim.x; k++)
			t += part[k];
		*cnt = t;
	}
}

/* One warp per row: rows r = warp, warp + W, ... with W the warps of the
 * grid (fixed by R).  x (R, C) logits, label (R) i32, dx (R, C) (may be x:
 * a lane writes only elements it read, after the row's reductions), part
 * [gridDim.x] block partials; the first K columns are the classes, the
 * rest padding (zero gradient, never counted).  Rows >= V are padding: zero gradient, not
 * counted; so are rows labelled `ignored` when cnt (the rows counted,
 * k_xent_count) is given, and the scale is then f0 * V / *cnt.  A label
 * outside [0, C) zeroes the row and leaves (row, label) in *err (the
 * smallest row wins), reported by the next host sync. */
__global__ void k_xent(void *dx, int tdx, struct xent_part *part, const void *x, int tx,
		       const int32_t *label,
		       int64_t R, int64_t C, int64_t K, int64_t V, int kind, double f0, const float *lsp,
		       float eps, struct cuda_err_rec *err, int op, const double *cnt,
		       int32_t ignored)
{
	__shared__ struct xent_part wp[CUDA_THREADS / 32];
	/* the gradient scale: f[0] (over the share of rows counted), times
	 * the device loss scale when in2 is given, the product in double
	 * rounded once (the CPU device's) */
	if (cnt && *cnt > 0 && *cnt != (double)V)
		f0 = f0 * (double)V / *cnt;
	const float scale = lsp ? (float)(f0 * (double)*lsp) : (float)f0;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int64_t W = (int64_t)gridDim.x * nw;
	double loss = 0, ok = 0, ok5 = 0, bad = 0; /* lane 0's running sums, in row order */

	for (int64_t r = (int64_t)blockIdx.x * nw + w; r < R; r += W) {
		const int64_t rb = r * C; /* the row: logits and dlogits */
#define XR(j) ld(x, tx, rb + (j))
#define DR(j, v) st(dx, tdx, rb + (j), (v))
		if (r >= V) {
			for (int64_t j = lane; j < C; j += 32)
				DR(j, 0.0f);
			continue;
		}
		const int32_t l = label[r];
		if (cnt && l == ignored) {
			for (int64_t j = lane; j < C; j += 32)
				DR(j, 0.0f);
			continue;
		}
		if (l < 0 || l >= K) {
			for (int64_t j = lane; j < C; j += 32)
				DR(j, 0.0f);
			if (lane == 0)
				xent_bad_label(err, r, l, K, op);
			bad += 1;
			continue;
		}
		/* the row's maximum and its first index */
		float mx = -INFINITY;
		int am = (int)C; /* C: this lane saw no element */
		for (int64_t j = lane; j < K; j += 32)
			if (am == C || XR(j) > mx) {
				mx = XR(j);
				am = (int)j;
			}
		warp_argmax(&mx, &am, (int)C);
		/* top-5: how many logits rank above the label's (ties by index) */
		const float xl = XR(l);
		int above = 0;
		for (int64_t j = lane; j < K; j += 32)
			above += XR(j) > xl || (XR(j) == xl && j < l);
		above = warp_sum_i(above);
		for (int64_t j = K + lane; j < C; j += 32) /* padded classes */
			DR(j, 0.0f);
		double ls;
		if (kind == KILN_LOSS_MSE) {
			double t = 0;
			for (int64_t j = lane; j < K; j += 32) {
				const float d = XR(j) - (j == l ? 1.0f : 0.0f);
				t += (double)d * d;
				DR(j, scale * 2.0f * d / (float)K);
			}
			ls = warp_sum_d(t) / (double)K;
		} else if (kind == KILN_LOSS_BCE) {
			double t = 0;
			for (int64_t j = lane; j < K; j += 32) {
				const float v = XR(j), tj = j == l ? 1.0f : 0.0f;
				t += (v > 0 ? v : 0) - v * tj + log1p(exp(-fabs((double)v)));
				const float sg = v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
				DR(j, scale * (sg - tj) / (float)K);
			}
			ls = warp_sum_d(t) / (double)K;
		} else {
			/* softmax with the max subtracted, so exp never overflows */
			double sum = 0, xsum = 0;
			for (int64_t j = lane; j < K; j += 32) {
				sum += expf(XR(j) - mx);
				xsum += (double)XR(j) - mx;
			}
			sum = warp_sum_d(sum);
			xsum = warp_sum_d(xsum);
			const float inv = (float)(1.0 / sum);
			const float off = eps / (float)K, on = 1.0f - eps + off;
			for (int64_t j = lane; j < K; j += 32)
				DR(j, scale * (expf(XR(j) - mx) * inv - (j == l ? on : off)));
			const double lse = log(sum);
			ls = (1.0 - eps) * (lse - ((double)xl - mx)) +
			     (eps > 0 ? eps * (lse - xsum / (double)K) : 0.0);
		}
#undef XR
#undef DR
		loss += ls;
		ok += am == l;
		ok5 += above < 5;
	}
	if (lane == 0) {
		wp[w].loss = loss;
		wp[w].ok = ok;
		wp[w].ok5 = ok5;
		wp[w].bad = bad;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		struct xent_part t = { 0, 0, 0, 0 };
		for (int k = 0; k < nw; k++) {
			t.loss += wp[k].loss;
			t.ok += wp[k].ok;
			t.ok5 += wp[k].ok5;
			t.bad += wp[k].bad;
		}
		part[blockIdx.x] = t;
	}
}

/* ---- the softmax loss over wide rows (a vocabulary) ---------------------
 *
 * k_xent gives a row a warp and reads it four times an element at a time:
 * fine for 10 classes, slow for GPT-2's 50,304 (6 ms a call on an H200 for
 * 8 x 1024 rows, docs/PERFORMANCE.md "Session 22").  From XENT_WIDE classes
 * the softmax loss gives a row a block, reads it 8 elements a load (16
 * bytes of bf16, 32 of f32), four loads in flight a thread (two blocks an
 * SM: 124-128 registers, no spill; 32 KiB of bf16 in flight an SM), and
 * makes three passes: the
 * maximum (its first index) and the logits above the label's, then the
 * exponentials' sum, then the gradient.  The same formulas as k_xent, each
 * exp(x - max) rounded as there, sums in double; only the order of the
 * double sums differs (a thread's share in index order, then the warps'
 * and the block's in a fixed tree), so a run reproduces bit for bit.
 * Written without a GPU: the conformance cases (check_device_loss's
 * xent_wide, check_device_lowp's 1032-class case) have run on the CPU
 * device only, and its speed is not measured. */
#define XENT_WIDE 1024 /* classes from which k_xent_wide takes a row */
#define XENT_UNROLL 4  /* loads a thread makes before it uses them */

/* A row's elements 8 at a time (16 bytes of bf16 or f16, 32 of f32), so
 * that a thread takes the same elements whatever the dtype: the f32 op on
 * the widened logits sums in the same order (check_device_lowp's bit-for-
 * bit contract). */
#define XV 8

template <int DT> __device__ __forceinline__ void xv_load(const void *p, int v, float *f)
{
	uint4 q[2] = { make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0) };
	q[0] = ((const uint4 *)p)[DT == KILN_F32 ? 2 * v : v];
	if (DT == KILN_F32)
		q[1] = ((const uint4 *)p)[2 * v + 1];
	const uint32_t w[8] = { q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w };
#pragma unroll
	for (int k = 0; k < 8; k++) {
		if (DT == KILN_F32) {
			f[k] = __uint_as_float(w[k]);
		} else if (k < 4 && DT == KILN_BF16) {
			f[2 * k] = half_bf16_f32((uint16_t)(w[k] & 0xffffu));
			f[2 * k + 1] = half_bf16_f32((uint16_t)(w[k] >> 16));
		} else if (k < 4) {
			__half h[2];
			memcpy(h, &w[k], 4);
			f[2 * k] = __half2float(h[0]);
			f[2 * k + 1] = __half2float(h[1]);
		}
	}
}

template <int DT> __device__ __forceinline__ void xv_store(void *p, int v, const float *f)
{
	uint32_t w[8];
#pragma unroll
	for (int k = 0; k < 8; k++) {
		if (DT == KILN_F32) {
			w[k] = __float_as_uint(f[k]);
		} else if (k < 4 && DT == KILN_BF16) {
			w[k] = (uint32_t)half_f32_bf16(f[2 * k]) |
			       (uint32_t)half_f32_bf16(f[2 * k + 1]) << 16;
		} else if (k < 4) {
			const __half h[2] = { kern_f16(f[2 * k]), kern_f16(f[2 * k + 1]) };
			memcpy(&w[k], h, 4);
		}
	}
	((uint4 *)p)[DT == KILN_F32 ? 2 * v : v] = make_uint4(w[0], w[1], w[2], w[3]);
	if (DT == KILN_F32)
		((uint4 *)p)[2 * v + 1] = make_uint4(w[4], w[5], w[6], w[7]);
}

/* A thread's round of loads: pieces v0, v0 + B, ... (XENT_UNROLL of them)
 * below nv, all issued before any is used */
template <int DT>
__device__ __forceinline__ void xv_round(const void *p, int v0, int B, int nv,
					 float f[XENT_UNROLL][XV])
{
#pragma unroll
	for (int u = 0; u < XENT_UNROLL; u++)
		if (v0 + u * B < nv)
			xv_load<DT>(p, v0 + u * B, f[u]);
}

/* fn(x, j) for every class j < k of a row (nvK pieces hold them), the
 * thread's share in index order, a round of loads at a time */
template <int DT, typename F>
__device__ __forceinline__ void xv_classes(const void *xr, int nvK, int k, F fn)
{
	const int B = blockDim.x;
	for (int v0 = threadIdx.x; v0 < nvK; v0 += B * XENT_UNROLL) {
		float f[XENT_UNROLL][XV];
		xv_round<DT>(xr, v0, B, nvK, f);
#pragma unroll
		for (int u = 0; u < XENT_UNROLL; u++)
#pragma unroll
			for (int e = 0; e < XV; e++)
				if (v0 + u * B < nvK && (v0 + u * B) * XV + e < k)
					fn(f[u][e], (v0 + u * B) * XV + e);
	}
}

/* The block's (max, first index) by argmax_take's rule, to every thread */
__device__ static void block_argmax(float *mx, int *am, int C)
{
	__shared__ float shm[CUDA_THREADS / 32];
	__shared__ int sha[CUDA_THREADS / 32];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	warp_argmax(mx, am, C);
	if (lane == 0)
		shm[w] = *mx, sha[w] = *am;
	__syncthreads();
	if (threadIdx.x == 0)
		for (int k = 1; k < nw; k++)
			argmax_take(&shm[0], &sha[0], shm[k], sha[k], C);
	__syncthreads();
	*mx = shm[0];
	*am = sha[0];
	__syncthreads(); /* the scratch is free again */
}

/* One row a block, rows r = block, block + gridDim.x, ...: the arguments,
 * the special rows (padding, ignored, a bad label) and the block partials
 * as k_xent's, the softmax loss only; x and dx of dtype DT, 16-byte
 * aligned, C a multiple of XV (cuda_launch_softmax_xent). */
template <int DT>
__global__ void __launch_bounds__(CUDA_THREADS, 2) k_xent_wide(void *dx, struct xent_part *part, const void *x,
			    const int32_t *label, int64_t R, int64_t C, int64_t K, int64_t V,
			    double f0, const float *lsp, float eps, struct cuda_err_rec *err, int op,
			    const double *cnt, int32_t ignored)
{
	enum { E = XV, U = XENT_UNROLL };
	if (cnt && *cnt > 0 && *cnt != (double)V)
		f0 = f0 * (double)V / *cnt;
	const float scale = lsp ? (float)(f0 * (double)*lsp) : (float)f0;
	const float off = eps / (float)K, on = 1.0f - eps + off;
	const int t = threadIdx.x, B = blockDim.x;
	/* pieces holding classes, all pieces (C < 2^31: the plan's check) */
	const int nvK = (int)((K + E - 1) / E), nvC = (int)(C / E), k = (int)K;
	double loss = 0, ok = 0, ok5 = 0, bad = 0; /* thread 0's, in row order */

	for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
		const char *xr = (const char *)x + r * C * (DT == KILN_F32 ? 4 : 2);
		char *dr = (char *)dx + r * C * (DT == KILN_F32 ? 4 : 2);
		const int32_t l = r < V ? label[r] : 0;
		const int skip = r >= V || (cnt && l == ignored), wrong = !skip && (l < 0 || l >= K);
		if (skip || wrong) {
			const float z[E] = {};
			for (int v = t; v < nvC; v += B)
				xv_store<DT>(dr, v, z);
			if (wrong && t == 0) {
				xent_bad_label(err, r, l, K, op);
				bad += 1;
			}
			continue;
		}
		const float xl = ld(xr, DT, l);
		/* pass 1: the maximum, its first index, the logits ranked above the label's */
		float mx = -INFINITY;
		int am = (int)C, above = 0;
		xv_classes<DT>(xr, nvK, k, [&](float v, int j) {
			if (am == C || v > mx)
				mx = v, am = j;
			above += v > xl || (v == xl && j < l);
		});
		block_argmax(&mx, &am, (int)C);
		above = (int)block_sum_d((double)above);
		/* pass 2: the exponentials' sum (and the logits', for smoothing) */
		double sum = 0, xsum = 0;
		xv_classes<DT>(xr, nvK, k, [&](float v, int) {
			sum += expf(v - mx);
			xsum += (double)v - mx;
		});
		sum = block_sum_d(sum);
		xsum = eps > 0 ? block_sum_d(xsum) : 0;
		/* pass 3: the gradient, each element written by the thread that
		 * read it, after every read of the row's sums (dx may be x) */
		const float inv = (float)(1.0 / sum);
		for (int v0 = t; v0 < nvC; v0 += B * U) {
			float f[U][E];
			xv_round<DT>(xr, v0, B, nvC, f);
#pragma unroll
			for (int u = 0; u < U; u++) {
				const int v = v0 + u * B;
				if (v >= nvC)
					continue;
#pragma unroll
				for (int e = 0; e < E; e++) {
					const int j = v * E + e;
					f[u][e] = j < k ? scale * (expf(f[u][e] - mx) * inv -
								   (j == l ? on : off))
							: 0.0f;
				}
				xv_store<DT>(dr, v, f[u]);
			}
		}
		if (t == 0) {
			const double lse = log(sum);
			loss += (1.0 - eps) * (lse - ((double)xl - mx)) +
				(eps > 0 ? eps * (lse - xsum / (double)K) : 0.0);
			ok += am == l;
			ok5 += above < 5;
		}
	}
	if (t == 0) {
		const struct xent_part s = { loss, ok, ok5, bad };
		part[blockIdx.x] = s;
	}
}

/* k_xent_wide takes the op: the softmax loss over at least XENT_WIDE
 * classes, logits and gradient of one dtype, 16-byte aligned, rows of a
 * multiple of XV elements (so every row is aligned).  The core's loss
 * layer always qualifies (one dtype, a 64-byte aligned arena); an API
 * caller's op that does not runs k_xent, whose double sums add in another
 * order (its metrics may then differ from the wide kernel's in the last
 * bit).  A row with a NaN logit has a NaN loss and gradient in both
 * kernels; which index either takes for its maximum is unspecified. */
static int xent_wide_ok(const struct cuda_plan *p, const struct kiln_op_args *a, int64_t K)
{
	return p->op.i[1] == KILN_LOSS_XENT && K >= XENT_WIDE && DTO(p, 0) == DTI(p, 0) &&
	       p->cols % XV == 0 && (uintptr_t)a->in[0] % 16 == 0 &&
	       (uintptr_t)a->out[0] % 16 == 0;
}

/* m [2..4] += the block partials, in block order; left untouched when
 * a row had a bad label (the run fails with KILN_EDATA at the next sync,
 * and the CPU device leaves the metrics alone then too).  M > 0: as M
 * times the means over the n rows counted (cnt, or V); m[3] += n. */
__global__ void k_xent_sum(float *m, const struct xent_part *part, int nb, int slots,
			   const double *cnt, int64_t V, int64_t M)
{
	double l = 0, o = 0, o5 = 0, bad = 0;
	for (int b = 0; b < nb; b++) {
		l += part[b].loss;
		o += part[b].ok;
		o5 += part[b].ok5;
		bad += part[b].bad;
	}
	if (bad > 0)
		return;
	const double n = cnt ? *cnt : (double)V;
	if (M > 0) {
		const double k = n > 0 ? (double)M / n : 0.0;
		l *= k, o *= k, o5 *= k;
	}
	m[0] = (float)(m[0] + l);
	m[1] = (float)(m[1] + o);
	if (slots >= 3)
		m[2] = (float)(m[2] + o5);
	if (slots >= 4)
		m[3] = (float)(m[3] + n);
}

extern "C" cudaError_t cuda_launch_softmax_xent(const struct cuda_plan *p,
						const struct kiln_op_args *a, cudaStream_t s)
{
	const int64_t R = p->rows, nw = CUDA_THREADS / 32;
	int64_t nb = (R + nw - 1) / nw;
	if (nb > CUDA_XENT_BLOCKS)
		nb = CUDA_XENT_BLOCKS;
	if (nb < 1)
		nb = 1;
	struct xent_part *part = (struct xent_part *)p->scratch;
	/* ignore_index: the rows counted, after the block partials */
	double *cnt = p->op.i[2] == 1 ? (double *)(part + CUDA_XENT_BLOCKS) : NULL;
	const int32_t ignored = (int32_t)p->op.i[3];
	cudaError_t e;
	if (cnt) {
		k_xent_count<<<1, CUDA_THREADS, 0, s>>>(cnt, (const int32_t *)a->in[1], p->op.i[0],
							 ignored);
		if ((e = cudaGetLastError()) != cudaSuccess)
			return e;
	}
	const int64_t K = p->op.i[5] > 0 ? p->op.i[5] : p->cols;
	const float *lsp = p->op.n_in == 3 ? (const float *)a->in[2] : NULL;
	if (xent_wide_ok(p, a, K)) {
		/* a block a row (k_xent_wide), CUDA_XENT_BLOCKS at most */
		nb = R < CUDA_XENT_BLOCKS ? (R > 0 ? R : 1) : CUDA_XENT_BLOCKS;
#define XW(DT)                                                                              \
	k_xent_wide<DT><<<(unsigned)nb, CUDA_THREADS, 0, s>>>(                              \
		a->out[0], part, a->in[0], (const int32_t *)a->in[1], R, p->cols, K, p->op.i[0], \
		p->op.f[0], lsp, (float)p->op.f[1], p->err, p->op.type, cnt, ignored)
		if (DTI(p, 0) == KILN_BF16)
			XW(KILN_BF16);
		else if (DTI(p, 0) == KILN_F16)
			XW(KILN_F16);
		else
			XW(KILN_F32);
#undef XW
	} else {
		k_xent<<<(unsigned)nb, CUDA_THREADS, 0, s>>>(
			a->out[0], DTO(p, 0), part, a->in[0], DTI(p, 0), (const int32_t *)a->in[1],
			R, p->cols, K, p->op.i[0], (int)p->op.i[1], p->op.f[0], lsp,
			(float)p->op.f[1], p->err, p->op.type, cnt, ignored);
	}
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_xent_sum<<<1, 1, 0, s>>>((float *)a->out[1], part, (int)nb, (int)p->sz[0], cnt,
				   p->op.i[0], p->op.i[4]);
	return cudaGetLastError();
}

/* ---- optimizers -------------------------------------------------------- */

/* A step count < 1 (the count is 1-based): the record a sync reports */
__device__ static void err_step(struct cuda_err_rec *err, int64_t t, int op)
{
	const unsigned long long key = kern_err_key_other(KERN_ERR_STEP);
	if (atomicMin(&err->key, key) > key) {
		err->val = t;
		err->op = op;
		err->kind = KERN_ERR_STEP;
	}
}

/* SGD over n: g (n) grads, lr [1] (device), t [1] i64 1-based or NULL
 * (only with a dampening), d (n) weight-decay multiplier or NULL, gate [1]
 * or NULL (0: a skipped step); w (n) params, v (n) momentum or NULL (mu =
 * 0).  kiln/ops.h:
 *   g' = g + l2*d*w;  v = mu*v + g';  w -= lr*dw*d*w + lr*(nesterov ? g' + mu*v : v)
 * omd (1 - f[3], ABI 2.29) with tp: torch.optim.SGD's dampening, v = g'
 * at t = 1 (PyTorch's first buffer) and mu*v + omd*g' after. */
__global__ void k_sgd(float *w, float *v, void *cp, int cdt, const float *g, const float *lrp,
		      const int64_t *tp, const float *d, const float *gate, int64_t n, float mu,
		      float l2, float dwd, int nesterov, float omd, struct cuda_err_rec *err)
{
	if (gate && *gate == 0.0f)
		return;
	const int64_t t = tp ? *tp : 0;
	if (tp && t < 1) {
		/* as k_adamw's: the next host sync returns EINVAL */
		if (blockIdx.x == 0 && threadIdx.x == 0)
			err_step(err, t, KILN_OP_SGD);
		return;
	}
	/* the momentum update's (mv, omd): (0, 1) on a dampened first step */
	const float mv = tp && t == 1 ? 0.0f : mu, om = tp && t == 1 ? 1.0f : omd;
	const float lr = *lrp, lrdw = lr * dwd;
	FOR_N(i, n)
	{
		const float di = d ? d[i] : 1.0f;
		const float wi = w[i];
		const float gi = g[i] + l2 * di * wi;
		const float vi = !v ? gi : tp ? mv * v[i] + om * gi : mu * v[i] + gi;
		if (v)
			v[i] = vi;
		const float wn = wi - lrdw * di * wi - lr * (nesterov ? gi + mu * vi : vi);
		w[i] = wn;
		if (cp)
			st(cp, cdt, i, wn);
	}
}

/* KILN_OPF_GATED: the last input is the gate; the op's own inputs precede it. */
static int own_inputs(const struct kiln_op *op)
{
	return op->n_in - ((op->flags & KILN_OPF_GATED) != 0);
}

static const float *gate_of(const struct cuda_plan *p, const struct kiln_op_args *a)
{
	return (p->op.flags & KILN_OPF_GATED) ? (const float *)a->in[p->op.n_in - 1] : NULL;
}

/* The optimizers' compute copy: an optional last output in bf16/f16 (sz[2]
 * set by ops.c, sz[1] its dtype), the params after the step, rounded,
 * written in the same pass. */
static void *copy_of(const struct cuda_plan *p, const struct kiln_op_args *a)
{
	return p->sz[2] ? a->out[p->op.n_out - 1] : NULL;
}

extern "C" cudaError_t cuda_launch_sgd(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	/* a dampening (f[3], ABI 2.29): in2 is the step count, d follows */
	const int damp = p->op.f[3] != 0.0;
	const float *d = own_inputs(&p->op) > 2 + damp ? (const float *)a->in[2 + damp] : NULL;
	float *v = p->n_out - (p->sz[2] != 0) > 1 ? (float *)a->out[1] : NULL;
	k_sgd<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], v, copy_of(p, a), (int)p->sz[1], (const float *)a->in[0],
		(const float *)a->in[1], damp ? (const int64_t *)a->in[2] : NULL, d,
		gate_of(p, a), p->n, (float)p->op.f[0], (float)p->op.f[1], (float)p->op.f[2],
		p->op.i[1] != 0, (float)(1.0 - p->op.f[3]), p->err);
	return cudaGetLastError();
}

/* AdamW as torch.optim.AdamW (kiln/ops.h): g (n), lr [1], t [1] i64 1-based,
 * d (n) or NULL, gate or NULL; w, m, v (n).  l2 (f[4], ABI 2.28) != 0:
 * torch.optim.Adam's weight_decay, g + l2*d*w into the moments.  vx (n)
 * or NULL: amsgrad (i[1], ABI 2.29), vx = max(vx, v) and sqrt(vx) in place
 * of sqrt(v).  The bias corrections come
 * from the device's t, in double as PyTorch computes them on the host. */
__global__ void k_adamw(float *w, float *m, float *v, float *vx, void *cp, int cdt,
			const float *g, const float *lrp, const int64_t *tp, const float *d,
			const float *gate, int64_t n, float b1, float b2, float omb1, float omb2,
			float eps, float wd, float l2, struct cuda_err_rec *err)
{
	if (gate && *gate == 0.0f)
		return;
	const int64_t t = *tp;
	if (t < 1) {
		/* the CPU device fails the run with EINVAL; a kernel cannot stop
		 * the stream, so it changes nothing and the next host sync
		 * returns the same EINVAL (cuda.c) */
		if (blockIdx.x == 0 && threadIdx.x == 0)
			err_step(err, t, KILN_OP_ADAMW);
		return;
	}
	const float lr = *lrp;
	const float inv_c1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
	const float inv_sqrt_c2 = (float)(1.0 / sqrt(1.0 - pow((double)b2, (double)t)));
	const float lrwd = lr * wd;
	FOR_N(i, n)
	{
		const float di = d ? d[i] : 1.0f;
		const float gi = l2 != 0.0f ? g[i] + l2 * di * w[i] : g[i];
		const float mi = b1 * m[i] + omb1 * gi;
		const float vi = b2 * v[i] + omb2 * gi * gi;
		m[i] = mi;
		v[i] = vi;
		/* amsgrad: the largest raw v so far (NaN from v kept) */
		const float xi = vx ? (vx[i] >= vi ? vx[i] : vi) : vi;
		if (vx)
			vx[i] = xi;
		const float dir = (mi * inv_c1) / (sqrtf(xi) * inv_sqrt_c2 + eps);
		const float wn = w[i] * (1.0f - lrwd * di) - lr * dir;
		w[i] = wn;
		if (cp)
			st(cp, cdt, i, wn);
	}
}

extern "C" cudaError_t cuda_launch_adamw(const struct cuda_plan *p, const struct kiln_op_args *a,
					 cudaStream_t s)
{
	const float *d = own_inputs(&p->op) > 3 ? (const float *)a->in[3] : NULL;
	k_adamw<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], (float *)a->out[1], (float *)a->out[2],
		p->op.i[1] ? (float *)a->out[3] : NULL, copy_of(p, a),
		(int)p->sz[1], (const float *)a->in[0], (const float *)a->in[1],
		(const int64_t *)a->in[2], d, gate_of(p, a), p->n,
		(float)p->op.f[0], (float)p->op.f[1],
		/* 1 - beta rounded from double, not 1.0f - (float)beta: for
		 * beta2 = 0.999 the two differ by 1.3e-5 relative */
		(float)(1.0 - p->op.f[0]), (float)(1.0 - p->op.f[1]), (float)p->op.f[2],
		(float)p->op.f[3], (float)p->op.f[4], p->err);
	return cudaGetLastError();
}

/* ---- fill, counters, schedule ----------------------------------------- */

/* y (n elements of `width` bytes) = the bit pattern `bits` (converted to
 * the dtype in prepare, on the host) */
__global__ void k_fill(void *y, int64_t n, int width, unsigned long long bits)
{
	FOR_N(i, n)
	{
		switch (width) {
		case 1: ((uint8_t *)y)[i] = (uint8_t)bits; break;
		case 2: ((uint16_t *)y)[i] = (uint16_t)bits; break;
		case 4: ((uint32_t *)y)[i] = (uint32_t)bits; break;
		default: ((unsigned long long *)y)[i] = bits; break;
		}
	}
}

extern "C" cudaError_t cuda_launch_fill(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_fill<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], p->n, (int)p->sz[1],
							     (unsigned long long)p->sz[0]);
	return cudaGetLastError();
}

/* c i64[1] += k: the trainer's counters (micro-steps, dropout's step and
 * row0: k may be negative); with a gate (NULL: none), the optimizer's step
 * count, not advanced by a skipped step */
__global__ void k_counter_add(int64_t *c, int64_t k, const float *gate)
{
	if (gate && *gate == 0.0f)
		return;
	*c += k;
}

extern "C" cudaError_t cuda_launch_counter_add(const struct cuda_plan *p,
					       const struct kiln_op_args *a, cudaStream_t s)
{
	k_counter_add<<<1, 1, 0, s>>>((int64_t *)a->out[0], p->op.i[0], gate_of(p, a));
	return cudaGetLastError();
}

/* The schedule's constants, passed by value (the step is on the device). */
struct sched_k {
	int64_t i[16];
	double f[8];
};

/* lr f32[1] = schedule(step i64[1]): KILN_OP_LR_SCHEDULE in plugin.h, in
 * double like the CPU device's loop. */
__global__ void k_lr_schedule(float *out, const int64_t *step, struct sched_k k)
{
	const double lr = common_lr_schedule(*step, k.i, k.f);
	*out = (float)lr;
}

extern "C" cudaError_t cuda_launch_lr_schedule(const struct cuda_plan *p,
					       const struct kiln_op_args *a, cudaStream_t s)
{
	struct sched_k k;
	for (int j = 0; j < 16; j++)
		k.i[j] = p->op.i[j];
	for (int j = 0; j < 8; j++)
		k.f[j] = p->op.f[j];
	k_lr_schedule<<<1, 1, 0, s>>>((float *)a->out[0], (const int64_t *)a->in[0], k);
	return cudaGetLastError();
}

/* ---- sums --------------------------------------------------------------- */

/* part[block] = sum of x (n) over the block's grid-stride share,
 * accumulated in double.  sq: the sum of squares of x * (1/s) instead (s =
 * *sp, the loss scale of UNSCALE, or 1 when sp is NULL), each square taken
 * in f32; a finite v whose square overflows f32 (|v| above ~1.8e19) has
 * it taken in double instead, as the CPU device sums such a block again
 * in double (plugins/cpu/ops.c sumsq_block_wide): the sum is finite
 * exactly when every element is, and the non-finite verdict is the
 * elements' on every device (before session 39 such finite gradients
 * skipped the step). */
__global__ void k_partial_sum(double *part, const void *x, int tx, int64_t n, int sq,
			      const float *sp)
{
	const float inv = sp ? 1.0f / *sp : 1.0f;
	double t = 0;
	FOR_N(i, n)
	{
		if (sq) {
			const float v = ld(x, tx, i) * inv, q = v * v;
			t += isinf(q) && isfinite(v) ? (double)v * v : (double)q;
		} else {
			t += (double)ld(x, tx, i);
		}
	}
	t = block_sum_d(t);
	if (threadIdx.x == 0)
		part[blockIdx.x] = t;
}

/* the number of partial-sum blocks for n elements: fixed by n */
static int red_blocks(int64_t n)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	return b > CUDA_RED_BLOCKS ? CUDA_RED_BLOCKS : b < 1 ? 1 : (int)b;
}

/* s [1] (=|+=) the partials, in block order */
__global__ void k_sum_final(void *s, int ts, const double *part, int nb, int acc)
{
	double t = acc ? (double)ld(s, ts, 0) : 0.0;
	for (int b = 0; b < nb; b++)
		t += part[b];
	st(s, ts, 0, (float)t);
}

extern "C" cudaError_t cuda_launch_reduce_sum(const struct cuda_plan *p,
					      const struct kiln_op_args *a, cudaStream_t s)
{
	const int nb = red_blocks(p->n);
	double *part = (double *)p->scratch;
	k_partial_sum<<<nb, CUDA_THREADS, 0, s>>>(part, a->in[0], DTI(p, 0), p->n, 0, NULL);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_sum_final<<<1, 1, 0, s>>>(a->out[0], DTO(p, 0), part, nb,
				    (p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- vector ops ------------------------------------------------------- */

enum { VEC_SCALE, VEC_ADD, VEC_MUL };

/* y (n) (=|+=) s*x0, x0 + x1 or x0 * x1; y may alias an input; any mix
 * of f32, bf16 and f16 */
__global__ void k_vec(void *y, int ty, const void *x0, int t0, const void *x1, int t1, float sc,
		      int64_t n, int kind, int acc)
{
	FOR_N(i, n)
	{
		const float a = ld(x0, t0, i);
		const float v = kind == VEC_SCALE ? sc * a : kind == VEC_ADD ? a + ld(x1, t1, i)
									    : a * ld(x1, t1, i);
		st(y, ty, i, acc ? ld(y, ty, i) + v : v);
	}
}

static cudaError_t launch_vec(const struct cuda_plan *p, const struct kiln_op_args *a,
			      cudaStream_t s, int kind)
{
	k_vec<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), kind == VEC_SCALE ? NULL : a->in[1],
		kind == VEC_SCALE ? KILN_F32 : DTI(p, 1), (float)p->op.f[0], p->n, kind,
		(p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_scale(const struct cuda_plan *p, const struct kiln_op_args *a,
					 cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_SCALE);
}

extern "C" cudaError_t cuda_launch_add(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_ADD);
}

extern "C" cudaError_t cuda_launch_mul(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_MUL);
}

/* ---- input conversion -------------------------------------------------- */

/* The normalisation table: (u/255 - mean[c]) / std[c] for every u8 value
 * of each channel, computed on the host at prepare exactly as
 * the CPU device does (common/norm_lut.h, f32), passed by value (3 KiB
 * of kernel parameters). */
struct norm_lut {
	float v[3][256];
};

/* y f32 (n) = lut[c][x u8], c the channel of element i: (i / HW) % C for
 * NCHW, i % C for NHWC */
__global__ void k_normalize_u8(void *y, int ty, const uint8_t *x, int64_t n, int64_t C,
			       int64_t hw, int nhwc, struct norm_lut lut)
{
	FOR_N(i, n)
	{
		const int64_t c = C == 1 ? 0 : nhwc ? i % C : (i / hw) % C;
		st(y, ty, i, lut.v[c][x[i]]);
	}
}

extern "C" cudaError_t cuda_launch_normalize_u8(const struct cuda_plan *p,
						const struct kiln_op_args *a, cudaStream_t s)
{
	struct norm_lut lut;
	for (int c = 0; c < 3; c++)
		for (int u = 0; u < 256; u++)
			lut.v[c][u] = p->lut[c][u];
	k_normalize_u8<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), (const uint8_t *)a->in[0], p->n, p->sz[0], p->sz[1],
		p->op.in[0].layout == KILN_NHWC, lut);
	return cudaGetLastError();
}

/* y = x converted between f32 and bf16/f16 either way (exact widening,
 * one rounding to nearest even) */
__global__ void k_cast(void *y, int ty, const void *x, int tx, int64_t n)
{
	FOR_N(i, n)
		st(y, ty, i, ld(x, tx, i));
}

extern "C" cudaError_t cuda_launch_cast(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_cast<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], DTO(p, 0), a->in[0],
							     DTI(p, 0), p->n);
	return cudaGetLastError();
}

/* ---- gradient clipping and the non-finite check ------------------------ */

/* state f32[4] (plugin.h KILN_OP_GRAD_CLIP, KILN_OP_UNSCALE) from the
 * squared partials; k[0] = the factor to apply (the clip factor times 1/s
 * for UNSCALE, rounded once as the CPU device does), k[1] = 1 when the
 * gradients are to be rewritten (finite and: scaled, clamped or copied).
 * sp: UNSCALE's scaler state (s = sp[0]), NULL for GRAD_CLIP. */
__global__ void k_clip_norm(float *state, float *k, const double *part, int nb, double max_norm,
			    float lim, int copy, const float *sp)
{
	const float inv = sp ? 1.0f / *sp : 1.0f;
	double ss = 0;
	for (int b = 0; b < nb; b++)
		ss += part[b];
	float scale;
	if (!common_clip_factor(state, ss, max_norm, inv, &scale)) {
		k[0] = 1.0f; /* not finite: the gradients stay as they are */
		k[1] = 0.0f;
		return;
	}
	k[0] = scale;
	k[1] = scale != 1.0f || lim > 0 || copy ? 1.0f : 0.0f;
}

/* y (n) = clamp(g * k[0], -lim, lim) when k[1] says so */
__global__ void k_clip_apply(void *y, int ty, const void *g, int tg, const float *k, int64_t n,
			     float lim)
{
	if (k[1] == 0.0f)
		return;
	const float scale = k[0];
	FOR_N(i, n)
	{
		float v = ld(g, tg, i) * scale;
		if (lim > 0)
			v = v > lim ? lim : v < -lim ? -lim : v;
		st(y, ty, i, v);
	}
}

/* GRAD_CLIP, and UNSCALE (the same three kernels with in1 the scaler
 * state): at s = 1 both give the same bits. */
extern "C" cudaError_t cuda_launch_grad_clip(const struct cuda_plan *p,
					     const struct kiln_op_args *a, cudaStream_t s)
{
	const int nb = red_blocks(p->n);
	double *part = (double *)p->scratch;
	float *k = (float *)(part + CUDA_RED_BLOCKS);
	const void *g = a->in[0];
	const float *sp = p->op.type == KILN_OP_UNSCALE ? (const float *)a->in[1] : NULL;
	void *y = a->out[0];
	k_partial_sum<<<nb, CUDA_THREADS, 0, s>>>(part, g, DTI(p, 0), p->n, 1, sp);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_clip_norm<<<1, 1, 0, s>>>((float *)a->out[1], k, part, nb, p->op.f[0], (float)p->op.f[1],
				    y != g, sp);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_clip_apply<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(y, DTO(p, 0), g, DTI(p, 0), k, p->n,
								  (float)p->op.f[1]);
	return cudaGetLastError();
}

/* ---- dynamic loss scaling ------------------------------------------------ */

/* KILN_OP_SCALER_UPDATE (plugin.h), one thread: gate f32[4] (GRAD_CLIP's,
 * [1] the finite flag), st f32[4] (scale, growth tracker, hysteresis left,
 * overflows) updated in place; the CPU device's arithmetic exactly. */
__global__ void k_scaler_update(float *st, const float *gate, double growth, double backoff,
				double lo, double hi, int64_t interval, int64_t hyst)
{
	common_scaler_update(st, gate, growth, backoff, lo, hi, interval, hyst);
}

extern "C" cudaError_t cuda_launch_scaler_update(const struct cuda_plan *p,
						 const struct kiln_op_args *a, cudaStream_t s)
{
	k_scaler_update<<<1, 1, 0, s>>>((float *)a->out[0], (const float *)a->in[0], p->op.f[0],
					p->op.f[1], p->op.f[2], p->op.f[3], p->op.i[0], p->op.i[1]);
	return cudaGetLastError();
}

/* ---- activations ------------------------------------------------------- */

/* y (n) = act(x), plugin.h's KILN_OP_ACT with alpha = f[0]; the CPU
 * device's formulas (plugins/cpu/act.c) in f32 */
__global__ void k_act(void *y, int ty, const void *x, int tx, int64_t n, int kind, float alpha)
{
	FOR_N(i, n)
	{
		const float v = ld(x, tx, i);
		float r;
		switch (kind) {
		case KILN_ACT_RELU: r = v < 0.0f ? 0.0f : v; break;
		case KILN_ACT_LEAKY_RELU: r = v > 0.0f ? v : alpha * v; break;
		case KILN_ACT_GELU: r = 0.5f * v * (1.0f + erff(v * (float)M_SQRT1_2)); break;
		case KILN_ACT_GELU_TANH: r = common_gelu_tanh(v); break;
		case KILN_ACT_SIGMOID: r = 1.0f / (1.0f + expf(-v)); break;
		default: r = tanhf(v); break;
		}
		st(y, ty, i, r);
	}
}

/* dx (n) (=|+=) dy * act'(.): from x (in0) for relu, leaky_relu and the gelus,
 * from y (in2) for sigmoid and tanh */
__global__ void k_act_bwd(void *dx, int tdx, const void *x, int tx, const void *dy, int tdy,
			  const void *y, int ty, int64_t n, int kind, float alpha, int acc)
{
	const float k = 0.3989422804014327f; /* 1/sqrt(2 pi) */
	FOR_N(i, n)
	{
		const float d = ld(dy, tdy, i);
		float g;
		switch (kind) {
		case KILN_ACT_RELU: g = ld(x, tx, i) > 0.0f ? d : 0.0f; break;
		case KILN_ACT_LEAKY_RELU: g = ld(x, tx, i) > 0.0f ? d : alpha * d; break;
		case KILN_ACT_GELU: {
			const float v = ld(x, tx, i);
			const float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
			const float pdf = k * expf(-0.5f * v * v);
			g = d * (cdf + v * pdf);
			break;
		}
		case KILN_ACT_GELU_TANH: g = d * common_gelu_tanh_grad(ld(x, tx, i)); break;
		case KILN_ACT_SIGMOID: {
			const float u = ld(y, ty, i);
			g = d * u * (1.0f - u);
			break;
		}
		default: {
			const float u = ld(y, ty, i);
			g = d * (1.0f - u * u);
			break;
		}
		}
		st(dx, tdx, i, acc ? ld(dx, tdx, i) + g : g);
	}
}

extern "C" cudaError_t cuda_launch_act(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	k_act<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], DTO(p, 0), a->in[0],
							    DTI(p, 0), p->n, (int)p->op.i[0],
							    (float)p->op.f[0]);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_act_bwd(const struct cuda_plan *p,
					   const struct kiln_op_args *a, cudaStream_t s)
{
	const int has_y = p->op.n_in > 2;
	k_act_bwd<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), a->in[1], DTI(p, 1),
		has_y ? a->in[2] : NULL, has_y ? DTI(p, 2) : KILN_F32, p->n, (int)p->op.i[0],
		(float)p->op.f[0], (p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- transformers: embedding and layer norm ------------------------------
 * The CPU device's formulas (plugins/cpu/embedding.c, layernorm.c).  No
 * float atomics: the embedding's backward gives each thread one column of
 * the table and walks the ids in order; layer norm's parameter gradients
 * give each thread one channel and walk the rows in order.  So a run
 * repeats bit for bit. */

/* An id outside [0, V) at position n: the first position wins. */
__device__ static void err_index(struct cuda_err_rec *err, int64_t n, int32_t v, int64_t V, int op)
{
	const unsigned long long key = kern_err_key_label(n, v);
	if (atomicMin(&err->key, key) > key) {
		err->val = V;
		err->op = op;
		err->kind = KERN_ERR_INDEX;
	}
}

/* y (N, C) = table[idx[n]]; a bad id's row is zeroed and recorded */
__global__ void k_embedding(void *y, int ty, const void *table, int tt, const int32_t *idx,
			    int64_t N, int64_t C, int64_t V, struct cuda_err_rec *err, int op)
{
	FOR_N(i, N * C)
	{
		const int64_t n = i / C, c = i % C;
		const int32_t v = idx[n];
		if (v < 0 || v >= V) {
			st(y, ty, i, 0.0f);
			if (c == 0)
				err_index(err, n, v, V, op);
			continue;
		}
		st(y, ty, i, ld(table, tt, (int64_t)v * C + c));
	}
}

__global__ void k_zero_f32(float *y, int64_t n)
{
	FOR_N(i, n)
		y[i] = 0.0f;
}

/* dtable (V, C) += dy rows by id.  Thread (c, b) owns column c of the
 * rows v with v % EMB_BUCKETS == b and adds their dy rows in increasing n:
 * each element's sum in the order of a sequential loop (bad ids skipped
 * and recorded), with EMB_BUCKETS times the threads (one thread per
 * column, 768 for GPT-2, took 3.5 ms of a 42 ms step on an H200) */
enum { EMB_BUCKETS = 64 };

__global__ void k_embedding_bwd(float *dt, const void *dy, int tdy, const int32_t *idx, int64_t N,
				int64_t C, int64_t V, struct cuda_err_rec *err, int op)
{
	const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	const int32_t b = (int32_t)blockIdx.y;
	if (c >= C)
		return;
	for (int64_t n = 0; n < N; n++) {
		const int32_t v = idx[n];
		if (v < 0 || v >= V) {
			if (c == 0 && b == 0)
				err_index(err, n, v, V, op);
			continue;
		}
		if ((v & (EMB_BUCKETS - 1)) == b)
			dt[(int64_t)v * C + c] += ld(dy, tdy, n * C + c);
	}
}

extern "C" cudaError_t cuda_launch_embedding(const struct cuda_plan *p, const struct kiln_op_args *a,
					     cudaStream_t s)
{
	const int64_t N = p->rows, C = p->cols, V = p->sz[0];
	if (p->op.type == KILN_OP_EMBEDDING) {
		k_embedding<<<blocks_for(p, N * C), CUDA_THREADS, 0, s>>>(
			a->out[0], DTO(p, 0), a->in[1], DTI(p, 1), (const int32_t *)a->in[0], N, C, V,
			p->err, p->op.type);
		return cudaGetLastError();
	}
	float *dt = (float *)a->out[0];
	if (!(p->op.flags & KILN_OPF_ACCUMULATE)) {
		k_zero_f32<<<blocks_for(p, V * C), CUDA_THREADS, 0, s>>>(dt, V * C);
		cudaError_t e = cudaGetLastError();
		if (e != cudaSuccess)
			return e;
	}
	const int64_t nb = (C + CUDA_THREADS - 1) / CUDA_THREADS;
	k_embedding_bwd<<<dim3((unsigned)nb, EMB_BUCKETS), CUDA_THREADS, 0, s>>>(dt, a->in[1], DTI(p, 1),
							      (const int32_t *)a->in[0], N, C, V,
							      p->err, p->op.type);
	return cudaGetLastError();
}

/* One warp per row of C: mean and variance in double (two passes), then
 * y and the row's saved (mean, rstd). */
__global__ void k_layernorm(void *y, int ty, float *saved, const void *x, int tx, const float *g,
			    const float *b, int64_t R, int64_t C, float eps)
{
	const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	const int64_t W = (int64_t)gridDim.x * nw;
	for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < R; r += W) {
		const int64_t rb = r * C;
		double s = 0, q = 0;
		for (int64_t j = lane; j < C; j += 32)
			s += ld(x, tx, rb + j);
		const double mean = warp_sum_d(s) / (double)C;
		for (int64_t j = lane; j < C; j += 32) {
			const double d = (double)ld(x, tx, rb + j) - mean;
			q += d * d;
		}
		q = warp_sum_d(q);
		const float m = (float)mean, rs = (float)(1.0 / sqrt(q / (double)C + eps));
		if (lane == 0)
			saved[2 * r] = m, saved[2 * r + 1] = rs;
		for (int64_t j = lane; j < C; j += 32) {
			const float v = (ld(x, tx, rb + j) - m) * rs;
			st(y, ty, rb + j, g ? v * g[j] + b[j] : v);
		}
	}
}

/* dx (=|+=) rstd (gd - mean(gd) - xh mean(gd xh)), gd = dy * gamma: one
 * warp per row */
__global__ void k_layernorm_dx(void *dx, int tdx, const void *x, int tx, const void *dy, int tdy,
			       const float *saved, const float *g, int64_t R, int64_t C, int acc)
{
	const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	const int64_t W = (int64_t)gridDim.x * nw;
	for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < R; r += W) {
		const int64_t rb = r * C;
		const float m = saved[2 * r], rs = saved[2 * r + 1];
		double s1 = 0, s2 = 0;
		for (int64_t j = lane; j < C; j += 32) {
			const float xh = (ld(x, tx, rb + j) - m) * rs;
			const float gd = g ? ld(dy, tdy, rb + j) * g[j] : ld(dy, tdy, rb + j);
			s1 += gd, s2 += (double)gd * xh;
		}
		const float k1 = (float)(warp_sum_d(s1) / (double)C);
		const float k2 = (float)(warp_sum_d(s2) / (double)C);
		for (int64_t j = lane; j < C; j += 32) {
			const float xh = (ld(x, tx, rb + j) - m) * rs;
			const float gd = g ? ld(dy, tdy, rb + j) * g[j] : ld(dy, tdy, rb + j);
			const float v = rs * (gd - k1 - xh * k2);
			st(dx, tdx, rb + j, acc ? ld(dx, tdx, rb + j) + v : v);
		}
	}
}

extern "C" cudaError_t cuda_launch_layernorm(const struct cuda_plan *p, const struct kiln_op_args *a,
					     cudaStream_t s)
{
	const int64_t R = p->rows, C = p->cols, nw = CUDA_THREADS / 32;
	int64_t nb = (R + nw - 1) / nw;
	nb = nb > p->grid ? p->grid : nb < 1 ? 1 : nb;
	const int affine = p->sz[0] != 0;
	if (p->op.type == KILN_OP_LAYERNORM) {
		k_layernorm<<<(unsigned)nb, CUDA_THREADS, 0, s>>>(
			a->out[0], DTO(p, 0), (float *)a->out[1], a->in[0], DTI(p, 0),
			affine ? (const float *)a->in[1] : NULL, affine ? (const float *)a->in[2] : NULL,
			R, C, (float)p->op.f[0]);
		return cudaGetLastError();
	}
	const float *saved = (const float *)a->in[2];
	k_layernorm_dx<<<(unsigned)nb, CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), a->in[1], DTI(p, 1), saved,
		affine ? (const float *)a->in[3] : NULL, R, C,
		(p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess || p->op.n_out < 3)
		return e;
	/* dgamma (out1) = sum dy * xhat, dbeta (out2) = sum dy: the column sums */
	return col_sums(p, a->out[2], KILN_F32, (float *)a->out[1], a->in[1], DTI(p, 1), a->in[0],
			DTI(p, 0), saved, R, C, p->op.i[0] == 1, s);
}

/* ---- dropout ------------------------------------------------------------ */

/* y (n) (=|+=) x * (kept ? s : 0), the mask of plugin.h's DROPOUT drawn by
 * global logical index (kern_drop_scale, kern_nhwc_logical,
 * kern_drop_global: host-tested against the CPU device).  ctr: the
 * device's i64[3] counter { step, row0, rstride }, read here.  C, HW:
 * channels and pixels of an NHWC tensor, C = 0 for a flat one; R the
 * elements per dims[0] row.  Forward and backward are the same masked
 * scale; x may be y. */
__global__ void k_dropout(void *y, int ty, const void *x, int tx, const int64_t *ctr,
			  struct kern_drop d, int64_t n, int64_t C, int64_t HW, int64_t R, int acc)
{
	const uint64_t t = (uint64_t)ctr[0];
	const int64_t row0 = ctr[1], rstride = ctr[2];
	FOR_N(i, n)
	{
		const int64_t e = C ? kern_nhwc_logical(i, C, HW) : i;
		const uint64_t g = kern_drop_global((uint64_t)e, R, row0, rstride);
		/* a NaN passes as it is, kept or dropped: the GPU's multiply
		 * would give the canonical NaN, the CPU's keeps its sign and
		 * payload (bit for bit with the CPU device) */
		const float xv = ld(x, tx, i);
		const float v = isnan(xv) ? xv : xv * kern_drop_scale(&d, t, g);
		st(y, ty, i, acc && !isnan(v) ? ld(y, ty, i) + v : v);
	}
}

extern "C" cudaError_t cuda_launch_dropout(const struct cuda_plan *p,
					   const struct kiln_op_args *a, cudaStream_t s)
{
	struct kern_drop d;
	kern_drop_setup(&p->op, &d); /* a few host operations, no allocation */
	k_dropout<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), (const int64_t *)a->in[1], d, p->n,
		p->sz[0], p->sz[1], p->sz[2],
		p->op.type == KILN_OP_DROPOUT_BWD && (p->op.flags & KILN_OPF_ACCUMULATE));
	return cudaGetLastError();
}

/* ---- concat / split ------------------------------------------------------ */

/* The parts and the geometry (kern_cat_geom), by value. */
struct cat_args {
	void *part[KILN_OP_MAX_IN];
	int64_t chunk[KILN_OP_MAX_IN], off[KILN_OP_MAX_IN + 1];
	int parts;
	int acc; /* SPLIT: bit k adds into part k (float path only) */
};

/* Element i of the whole [outer, row] -> its part k and index j there. */
__device__ __forceinline__ int cat_part(const struct cat_args *g, int64_t i, int64_t row,
					int64_t *j)
{
	const int64_t o = i / row, r = i - o * row;
	int k = 0;
	while (k + 1 < g->parts && r >= g->off[k + 1])
		k++;
	*j = o * g->chunk[k] + (r - g->off[k]);
	return k;
}

/* Same dtype everywhere, no accumulation: a move of T-sized elements. */
template <typename T>
__global__ void k_cat_raw(T *whole, struct cat_args g, int64_t total, int64_t row, int split)
{
	FOR_N(i, total)
	{
		int64_t j;
		const int k = cat_part(&g, i, row, &j);
		if (split)
			((T *)g.part[k])[j] = whole[i];
		else
			whole[i] = ((const T *)g.part[k])[j];
	}
}

/* SPLIT adding into some parts: f32 arithmetic on a float dtype dt. */
__global__ void k_split_acc(const void *whole, int dt, struct cat_args g, int64_t total,
			    int64_t row)
{
	FOR_N(i, total)
	{
		int64_t j;
		const int k = cat_part(&g, i, row, &j);
		const float v = ld(whole, dt, i);
		st(g.part[k], dt, j, (g.acc >> k & 1) ? ld(g.part[k], dt, j) + v : v);
	}
}

extern "C" cudaError_t cuda_launch_concat_split(const struct cuda_plan *p,
						const struct kiln_op_args *a, cudaStream_t s)
{
	const int split = p->op.type == KILN_OP_SPLIT;
	struct kern_cat geo;
	struct cat_args g;
	kern_cat_geom(&p->op, &geo); /* checked in prepare */
	memset(&g, 0, sizeof g);
	g.parts = geo.parts;
	for (int k = 0; k < geo.parts; k++) {
		g.part[k] = split ? a->out[k] : (void *)a->in[k];
		g.chunk[k] = geo.chunk[k];
		g.off[k] = geo.off[k];
	}
	g.off[geo.parts] = geo.off[geo.parts];
	g.acc = split ? (int)p->op.i[1] : 0;
	const int64_t total = geo.outer * geo.row;
	const unsigned nb = (unsigned)blocks_for(p, total);
	void *whole = split ? (void *)a->in[0] : a->out[0];
	if (total == 0)
		return cudaSuccess;
	if (g.acc) {
		k_split_acc<<<nb, CUDA_THREADS, 0, s>>>(whole, DTI(p, 0), g, total, geo.row);
		return cudaGetLastError();
	}
	switch (p->cols) { /* the element size */
	case 1: k_cat_raw<uint8_t><<<nb, CUDA_THREADS, 0, s>>>((uint8_t *)whole, g, total, geo.row, split); break;
	case 2: k_cat_raw<uint16_t><<<nb, CUDA_THREADS, 0, s>>>((uint16_t *)whole, g, total, geo.row, split); break;
	case 4: k_cat_raw<uint32_t><<<nb, CUDA_THREADS, 0, s>>>((uint32_t *)whole, g, total, geo.row, split); break;
	default: k_cat_raw<uint64_t><<<nb, CUDA_THREADS, 0, s>>>((uint64_t *)whole, g, total, geo.row, split); break;
	}
	return cudaGetLastError();
}

/* ---- reorder (NCHW <-> NHWC) ---------------------------------------------- */

/* Per sample n: dst [S, R] = src [R, S] transposed, in 32 x 32 tiles
 * through shared memory so both sides are read and written along rows.
 * Block (32, 8); grid (S tiles, R tiles up to 65535, samples up to 65535),
 * striding over the R tiles and n beyond (NHWC -> NCHW has R = H x W:
 * before session 32 a grid of more than 65535 R tiles, H x W > 2,097,120,
 * failed to launch). */
template <typename T>
__global__ void k_transpose_raw(T *dst, const T *src, int64_t N, int64_t R, int64_t S)
{
	__shared__ T tile[32][33];
	const int64_t s0 = (int64_t)blockIdx.x * 32;
	for (int64_t n = blockIdx.z; n < N; n += gridDim.z)
	for (int64_t r0 = (int64_t)blockIdx.y * 32; r0 < R; r0 += (int64_t)gridDim.y * 32) {
		const T *x = src + n * R * S;
		T *y = dst + n * R * S;
		for (int k = threadIdx.y; k < 32; k += 8) {
			const int64_t r = r0 + k, c = s0 + threadIdx.x;
			if (r < R && c < S)
				tile[k][threadIdx.x] = x[r * S + c];
		}
		__syncthreads();
		for (int k = threadIdx.y; k < 32; k += 8) {
			const int64_t c = s0 + k, r = r0 + threadIdx.x;
			if (r < R && c < S)
				y[c * R + r] = tile[threadIdx.x][k];
		}
		__syncthreads();
	}
}

/* The same between float dtypes (a conversion too), accumulating or not. */
__global__ void k_transpose_f(void *dst, int td, const void *src, int ts, int64_t N, int64_t R,
			      int64_t S, int acc)
{
	__shared__ float tile[32][33];
	const int64_t s0 = (int64_t)blockIdx.x * 32;
	for (int64_t n = blockIdx.z; n < N; n += gridDim.z)
	for (int64_t r0 = (int64_t)blockIdx.y * 32; r0 < R; r0 += (int64_t)gridDim.y * 32) {
		const int64_t base = n * R * S;
		for (int k = threadIdx.y; k < 32; k += 8) {
			const int64_t r = r0 + k, c = s0 + threadIdx.x;
			if (r < R && c < S)
				tile[k][threadIdx.x] = ld(src, ts, base + r * S + c);
		}
		__syncthreads();
		for (int k = threadIdx.y; k < 32; k += 8) {
			const int64_t c = s0 + k, r = r0 + threadIdx.x;
			if (r < R && c < S) {
				const int64_t o = base + c * R + r;
				const float v = tile[threadIdx.x][k];
				st(dst, td, o, acc ? ld(dst, td, o) + v : v);
			}
		}
		__syncthreads();
	}
}

extern "C" cudaError_t cuda_launch_reorder(const struct cuda_plan *p,
					   const struct kiln_op_args *a, cudaStream_t s)
{
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const int same = DTI(p, 0) == DTO(p, 0);
	const int64_t N = p->sz[0], R = p->sz[1], S = p->sz[2], es = p->cols;
	if (p->n == 0)
		return cudaSuccess;
	if (!R) { /* same layout: a copy (or an add, or a conversion) */
		if (same && !acc)
			return a->in[0] == a->out[0]
				       ? cudaSuccess
				       : cudaMemcpyAsync(a->out[0], a->in[0], (size_t)(p->n * es),
							 cudaMemcpyDeviceToDevice, s);
		k_vec<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], DTO(p, 0), a->in[0],
								    DTI(p, 0), NULL, KILN_F32, 1.0f,
								    p->n, VEC_SCALE, acc);
		return cudaGetLastError();
	}
	const dim3 block(32, 8);
	const int64_t rt = (R + 31) / 32; /* (the kernels stride over the rest) */
	const dim3 grid((unsigned)((S + 31) / 32), (unsigned)(rt < 65535 ? rt : 65535),
			(unsigned)(N < 65535 ? N : 65535));
	if (!same || acc) {
		k_transpose_f<<<grid, block, 0, s>>>(a->out[0], DTO(p, 0), a->in[0], DTI(p, 0), N, R,
						      S, acc);
		return cudaGetLastError();
	}
	switch (es) {
	case 1: k_transpose_raw<uint8_t><<<grid, block, 0, s>>>((uint8_t *)a->out[0], (const uint8_t *)a->in[0], N, R, S); break;
	case 2: k_transpose_raw<uint16_t><<<grid, block, 0, s>>>((uint16_t *)a->out[0], (const uint16_t *)a->in[0], N, R, S); break;
	case 4: k_transpose_raw<uint32_t><<<grid, block, 0, s>>>((uint32_t *)a->out[0], (const uint32_t *)a->in[0], N, R, S); break;
	default: k_transpose_raw<uint64_t><<<grid, block, 0, s>>>((uint64_t *)a->out[0], (const uint64_t *)a->in[0], N, R, S); break;
	}
	return cudaGetLastError();
}

/* ---- LAMB ----------------------------------------------------------------- */

/* Checks before the step, one block: the gate, the step count t >= 1, and
 * the offsets (0 .. n, nondecreasing).  go[0] = 1 when the step is to be
 * taken; a bad count or bad offsets leave the record a sync reports. */
__global__ void k_lamb_check(int *go, const float *gate, const int64_t *tp, const int64_t *off,
			     int64_t T, int64_t n, struct cuda_err_rec *err)
{
	__shared__ int bad;
	if (threadIdx.x == 0)
		bad = INT32_MAX; /* none yet; else the first entry below its predecessor */
	__syncthreads();
	for (int64_t k = threadIdx.x; k < T; k += blockDim.x)
		if (off[k + 1] < off[k])
			atomicMin(&bad, (int)(k + 1 < INT32_MAX ? k + 1 : INT32_MAX - 1));
	__syncthreads();
	if (threadIdx.x != 0)
		return;
	const int64_t t = *tp;
	int ok = !(gate && *gate == 0.0f);
	if (ok && t < 1) {
		err_step(err, t, KILN_OP_LAMB);
		ok = 0;
	} else if (ok && (off[0] != 0 || off[T] != n || bad != INT32_MAX)) {
		const unsigned long long key = kern_err_key_other(KERN_ERR_OFFSETS);
		if (atomicMin(&err->key, key) > key) {
			err->val = off[0] != 0 ? 0 : bad != INT32_MAX ? bad : T;
			err->op = KILN_OP_LAMB;
			err->kind = KERN_ERR_OFFSETS;
		}
		ok = 0;
	}
	*go = ok;
}

/* The Adam scalars of step t, from the op's constants (passed by value). */
struct lamb_k {
	float b1, b2, omb1, omb2, eps, wd;
	double b1d, b2d;
};

/* The bias corrections of step t (in double, as PyTorch) and this
 * block's chunk [*b, *e) of the n elements. */
__device__ static void lamb_block(const struct lamb_k *q, int64_t t, int64_t n, float *inv_c1,
				  float *inv_sqrt_c2, int64_t *b, int64_t *e)
{
	*inv_c1 = (float)(1.0 / (1.0 - pow(q->b1d, (double)t)));
	*inv_sqrt_c2 = (float)(1.0 / sqrt(1.0 - pow(q->b2d, (double)t)));
	*b = (int64_t)blockIdx.x * KERN_LAMB_CHUNK;
	*e = *b + KERN_LAMB_CHUNK < n ? *b + KERN_LAMB_CHUNK : n;
}

/* Pass 1, block c over chunk c: update m, v; per piece (chunk c, tensor
 * k) the sums of p*p and u*u (u = m^/vh + wd*d*p, p before the step) into
 * slot c + k (kern.h). */
__global__ void k_lamb_moments(double *slot, const int *go, float *w, float *m, float *v,
			       const float *g, const float *d, const int64_t *tp,
			       const int64_t *off, int64_t T, int64_t n, struct lamb_k q)
{
	if (!*go)
		return;
	float inv_c1, inv_sqrt_c2;
	int64_t b, e;
	lamb_block(&q, *tp, n, &inv_c1, &inv_sqrt_c2, &b, &e);
	const int64_t c = blockIdx.x;
	for (int64_t k = kern_tensor_of(off, T, b); k < T && off[k] < e; k++) {
		const int64_t lo = off[k] > b ? off[k] : b, hi = off[k + 1] < e ? off[k + 1] : e;
		if (hi <= lo)
			continue; /* an empty tensor: no piece */
		double pp = 0, uu = 0;
		for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
			const float di = d ? d[i] : 1.0f;
			const float gi = g[i];
			const float mi = q.b1 * m[i] + q.omb1 * gi;
			const float vi = q.b2 * v[i] + q.omb2 * gi * gi;
			m[i] = mi;
			v[i] = vi;
			const float u = (mi * inv_c1) / (sqrtf(vi) * inv_sqrt_c2 + q.eps) + q.wd * di * w[i];
			pp += (double)w[i] * (double)w[i];
			uu += (double)u * (double)u;
		}
		pp = block_sum_d(pp);
		uu = block_sum_d(uu);
		if (threadIdx.x == 0) {
			slot[2 * (c + k)] = pp;
			slot[2 * (c + k) + 1] = uu;
		}
	}
}

/* Per tensor k: r = ||p_k|| / ||u_k|| (1 when either is 0), step[k] =
 * lr * r; the slots of tensor k added in chunk order. */
__global__ void k_lamb_norms(float *step, const int *go, const double *slot, const float *lrp,
			     const int64_t *off, int64_t T)
{
	if (!*go)
		return;
	const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (k >= T)
		return;
	double pp = 0, uu = 0;
	if (off[k + 1] > off[k])
		for (int64_t c = off[k] / KERN_LAMB_CHUNK; c <= (off[k + 1] - 1) / KERN_LAMB_CHUNK; c++) {
			pp += slot[2 * (c + k)];
			uu += slot[2 * (c + k) + 1];
		}
	const double r = pp > 0 && uu > 0 ? sqrt(pp) / sqrt(uu) : 1.0;
	step[k] = (float)((double)*lrp * r);
}

/* Pass 2, block c over chunk c: p -= step[k] * u, u from the updated
 * moments; the compute copy written alongside. */
__global__ void k_lamb_update(float *w, void *cp, int cdt, const int *go, const float *m,
			      const float *v, const float *d, const float *step, const int64_t *tp,
			      const int64_t *off, int64_t T, int64_t n, struct lamb_k q)
{
	if (!*go)
		return;
	float inv_c1, inv_sqrt_c2;
	int64_t b, e;
	lamb_block(&q, *tp, n, &inv_c1, &inv_sqrt_c2, &b, &e);
	for (int64_t k = kern_tensor_of(off, T, b); k < T && off[k] < e; k++) {
		const int64_t lo = off[k] > b ? off[k] : b, hi = off[k + 1] < e ? off[k + 1] : e;
		const float sk = step[k];
		for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
			const float di = d ? d[i] : 1.0f;
			const float u = (m[i] * inv_c1) / (sqrtf(v[i]) * inv_sqrt_c2 + q.eps) +
					q.wd * di * w[i];
			const float wn = w[i] - sk * u;
			w[i] = wn;
			if (cp)
				st(cp, cdt, i, wn);
		}
	}
}

/* LAMB (plugin.h): in0 g, in1 lr, in2 t, in3 offsets i64[T+1], in4 d
 * (optional), gate (optional, last); out0 p, out1 m, out2 v, out3 the
 * compute copy (optional).  Workspace (kern_lamb_workspace): the slots,
 * the per-tensor steps, and the go flag lives in the plan's scratch. */
extern "C" cudaError_t cuda_launch_lamb(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	const int64_t n = p->n, T = p->sz[0];
	const int64_t nc = kern_lamb_chunks(n);
	const float *d = own_inputs(&p->op) > 4 ? (const float *)a->in[4] : NULL;
	const int64_t *tp = (const int64_t *)a->in[2], *off = (const int64_t *)a->in[3];
	double *slot = (double *)a->workspace;
	float *step = (float *)((char *)a->workspace + (kern_lamb_workspace(n, T) -
							  (((size_t)T * sizeof(float) + 63) & ~(size_t)63)));
	int *go = (int *)p->scratch;
	struct lamb_k q;
	q.b1d = p->op.f[0], q.b2d = p->op.f[1];
	q.b1 = (float)q.b1d, q.b2 = (float)q.b2d;
	q.omb1 = (float)(1.0 - q.b1d), q.omb2 = (float)(1.0 - q.b2d);
	q.eps = (float)p->op.f[2], q.wd = (float)p->op.f[3];
	k_lamb_check<<<1, CUDA_THREADS, 0, s>>>(go, gate_of(p, a), tp, off, T, n, p->err);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_lamb_moments<<<(unsigned)nc, CUDA_THREADS, 0, s>>>(
		slot, go, (float *)a->out[0], (float *)a->out[1], (float *)a->out[2],
		(const float *)a->in[0], d, tp, off, T, n, q);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_lamb_norms<<<(unsigned)((T + CUDA_THREADS - 1) / CUDA_THREADS), CUDA_THREADS, 0, s>>>(
		step, go, slot, (const float *)a->in[1], off, T);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_lamb_update<<<(unsigned)nc, CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], copy_of(p, a), (int)p->sz[1], go, (const float *)a->out[1],
		(const float *)a->out[2], d, step, tp, off, T, n, q);
	return cudaGetLastError();
}
