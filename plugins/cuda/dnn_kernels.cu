/* plugins/cuda/dnn_kernels.cu - kiln's own kernels of the CNN op set:
 * batch normalisation (BN_TRAIN, BN_INFER, BN_BWD and SyncBatchNorm's
 * BN_STATS, BN_APPLY, BN_BWD_REDUCE, BN_BWD_APPLY), pooling (POOL,
 * POOL_BWD), and the per-channel bias add / bias gradient a convolution
 * falls back to when cuDNN has no fused engine (cudnn.c).
 *
 * Why kernels and not cuDNN's NORM_FORWARD / NORM_BACKWARD / RESAMPLE
 * graph operations: in cuDNN 9 those are served by runtime-fusion engines
 * documented for channels-last tensors only, while kiln's ops take NCHW,
 * NHWC and 2-d [N, C] inputs with PyTorch's exact semantics (the unbiased
 * running variance, count_include_pad, the first maximum); these kernels
 * compute exactly what the CPU device does (plugins/cpu/bn.c, pool.c), in
 * a fixed order, so results are the same from run to run.
 *
 * Batch norm, per channel c over its M = N*H*W elements (sz[] below):
 *   pass 1  bn_part (NCHW planes): K blocks per channel, or
 *           bn_part_rows (NHWC, [N, C] rows): blocks of 32 channels x K
 *           row slices; each sums a fixed slice of the channel (double),
 *           in a fixed order -> part[C][K][2]
 *   pass 2  a warp per channel adds its K partials (lane-strided, then a
 *           fixed shuffle tree) and finishes (mean, invstd, running
 *           statistics, the per-channel coefficients of pass 3) ->
 *           coef[3][C] in the workspace
 *   pass 3  an elementwise kernel: y = x*a + b, or
 *           dx = (dy - s - (x - mean)*k) * g
 * Workspace: part (C*K*2 doubles), then coef (3*C floats).
 */
#include "cuda.h"
#include "dnn.h"
#include "../common/scalar_ops.h" /* common_bn_commit: the CPU device's code */
#include "../common/half.h"       /* half_f32_bf16 */
#include "kern.h"                 /* kern_f16 */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

/* ---- element access ----------------------------------------------------- */

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld(const __half *p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
/* bf16: the CPU device's rounding (half.h), which keeps a NaN's sign and
 * payload (a max pool passes a NaN through: __float2bfloat16_rn would
 * make it 0x7fff) */
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v)
{
	((uint16_t *)p)[i] = half_f32_bf16(v);
}
__device__ __forceinline__ void st(__half *p, int64_t i, float v) { p[i] = kern_f16(v); }

/* Index of element j (in [0, M), M = N*HW) of channel c: "rows" (NHWC or
 * 2-d [N, C]: rows of C channels) or planes (NCHW: N planes of HW per c). */
__device__ __forceinline__ int64_t chan_at(int64_t c, int64_t j, int64_t C, int64_t HW, int rows)
{
	return rows ? j * C + c : (j / HW) * C * HW + c * HW + j % HW;
}

/* channel of the stored element e */
__device__ __forceinline__ int64_t chan_of(int64_t e, int64_t C, int64_t HW, int rows)
{
	return rows ? e % C : (e / HW) % C;
}

/* ---- pass 1: per-channel partial sums ----------------------------------- */

enum { PART_STATS = 0, PART_BWD = 1, PART_SUM = 2 };

/* element e's terms of the partial sums below, by mode */
template <typename T>
__device__ __forceinline__ void part_add(const T *x, const T *dy, int64_t e, float shift, int mode,
					 double *a, double *b)
{
	if (mode == PART_STATS) {
		const double v = (double)ld(x, e) - shift;
		*a += v;
		*b += v * v;
	} else {
		const double g = ld(dy, e);
		*a += g;
		if (mode == PART_BWD)
			*b += g * ((double)ld(x, e) - shift);
	}
}

/* mode STATS: s0 = sum(x - k), s1 = sum((x - k)^2), k = the channel's first
 *             element (shifted sums: a large mean does not cancel var)
 * mode BWD:   s0 = sum(dy), s1 = sum(dy * (x - mean[c]))
 * mode SUM:   s0 = sum(dy) (a bias gradient), s1 = 0
 * grid C*K blocks of CUDA_THREADS; block (c, k) sums j in
 * [M k / K, M (k+1) / K) and writes part[(c K + k) 2 + {0, 1}]. */
template <typename T>
__global__ void bn_part(double *part, const T *x, const T *dy, const float *mean, int64_t C,
			int64_t HW, int64_t M, int K, int rows, int mode)
{
	const int64_t c = blockIdx.x / K;
	const int k = blockIdx.x % K;
	const int64_t j0 = M * k / K, j1 = M * (k + 1) / K;
	const float shift = mode == PART_STATS ? ld(x, chan_at(c, 0, C, HW, rows))
			  : mode == PART_BWD ? mean[c] : 0.0f;
	double a = 0, b = 0;
	for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
		part_add(x, dy, chan_at(c, j, C, HW, rows), shift, mode, &a, &b);
	}
	__shared__ double sa[CUDA_THREADS], sb[CUDA_THREADS];
	sa[threadIdx.x] = a;
	sb[threadIdx.x] = b;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if ((int)threadIdx.x < s) {
			sa[threadIdx.x] += sa[threadIdx.x + s];
			sb[threadIdx.x] += sb[threadIdx.x + s];
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		part[(c * K + k) * 2] = sa[0];
		part[(c * K + k) * 2 + 1] = sb[0];
	}
}

/* The same partial sums of channels stored as rows (NHWC, 2-d [N, C]),
 * read coalesced: block (32, 8) of channel tile t = blockIdx.x % tiles
 * (32 adjacent channels, one a lane) and slice k = blockIdx.x / tiles of
 * the M rows; row phase ty sums rows j0 + ty, j0 + ty + 8, ... in order,
 * then the 8 phase sums are added in order (a fixed order for given M, K).
 * The threads of bn_part, one channel a block, read one element per
 * C-strided row each, a sector apiece: ResNet-50's NHWC batch norms took
 * 44% of its step on an H200 that way. */
template <typename T>
__global__ void bn_part_rows(double *part, const T *x, const T *dy, const float *mean,
			     int64_t C, int64_t M, int K, int mode)
{
	const int64_t tiles = (C + 31) / 32;
	const int64_t c = (blockIdx.x % tiles) * 32 + threadIdx.x;
	const int k = (int)(blockIdx.x / tiles);
	const int64_t j0 = M * k / K, j1 = M * (k + 1) / K;
	double a = 0, b = 0;
	if (c < C) {
		const float shift = mode == PART_STATS ? ld(x, c) : mode == PART_BWD ? mean[c] : 0.0f;
		for (int64_t j = j0 + threadIdx.y; j < j1; j += 8) {
			part_add(x, dy, j * C + c, shift, mode, &a, &b);
		}
	}
	__shared__ double sa[8][33], sb[8][33];
	sa[threadIdx.y][threadIdx.x] = a;
	sb[threadIdx.y][threadIdx.x] = b;
	__syncthreads();
	if (threadIdx.y == 0 && c < C) {
		double ta = 0, tb = 0;
		for (int r = 0; r < 8; r++)
			ta += sa[r][threadIdx.x], tb += sb[r][threadIdx.x];
		part[(c * K + k) * 2] = ta;
		part[(c * K + k) * 2 + 1] = tb;
	}
}

/* pass 1 of either layout: part[(c K + k) 2 + {0, 1}] */
template <typename T>
static void part_launch(double *part, const T *x, const T *dy, const float *mean, int64_t C,
			int64_t HW, int64_t M, int K, int rows, int mode, cudaStream_t s)
{
	if (rows) {
		const unsigned b = (unsigned)(((C + 31) / 32) * K);
		bn_part_rows<T><<<b, dim3(32, 8), 0, s>>>(part, x, dy, mean, C, M, K, mode);
	} else {
		bn_part<T><<<(unsigned)(C * K), CUDA_THREADS, 0, s>>>(part, x, dy, mean, C, HW, M, K,
								       rows, mode);
	}
}

/* Channel c's K partials summed by the 32 lanes of a warp (lane l takes
 * k = l, l + 32, ...; then a fixed shuffle tree), broadcast to every lane:
 * the finishing kernels run a warp per channel, so K can be large (the
 * NHWC slices) at no serial cost. */
__device__ __forceinline__ void part_sum(const double *part, int64_t c, int K, double *s0,
					 double *s1)
{
	const int lane = threadIdx.x & 31;
	double a = 0, b = 0;
	for (int k = lane; k < K; k += 32) {
		a += part[(c * K + k) * 2];
		b += part[(c * K + k) * 2 + 1];
	}
	for (int o = 16; o > 0; o >>= 1) {
		a += __shfl_down_sync(0xffffffffu, a, o);
		b += __shfl_down_sync(0xffffffffu, b, o);
	}
	*s0 = __shfl_sync(0xffffffffu, a, 0);
	*s1 = __shfl_sync(0xffffffffu, b, 0);
}

/* a finishing kernel's channel: one warp each (launched over 32 C threads) */
__device__ __forceinline__ int64_t warp_chan(void)
{
	return ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}

/* ---- pass 2: per-channel finishes --------------------------------------- */

/* BN_TRAIN (and BN_STATS with stats != NULL): mean, biased var, invstd,
 * saved, running statistics, y = x*a + b coefficients. */
template <typename T>
__global__ void bn_train_finish(const double *part, const T *x, int64_t C, int64_t HW,
				int64_t M, int K, int rows, const float *gamma, const float *beta,
				float *saved, float *rmean, float *rvar, float *coef, float *stats,
				double eps, double mom)
{
	const int64_t c = warp_chan();
	if (c >= C)
		return; /* the whole warp */
	double s0, s1;
	part_sum(part, c, K, &s0, &s1);
	if (threadIdx.x & 31)
		return;
	const double m = s0 / M;
	const double mean = (double)ld(x, chan_at(c, 0, C, HW, rows)) + m;
	double var = s1 / M - m * m;
	if (var < 0)
		var = 0;
	if (stats) { /* BN_STATS: mean, biased variance */
		stats[c] = (float)mean;
		stats[C + c] = (float)var;
		return;
	}
	common_bn_commit(c, C, mean, var, (double)M, eps, mom, gamma, beta, saved, rmean, rvar, coef,
			 coef + C);
}

/* BN_APPLY: merge G groups' (mean, var) of n elements each. */
__global__ void bn_apply_finish(const float *gstats, int G, int64_t C, int64_t n,
				const float *gamma, const float *beta, float *saved, float *rmean,
				float *rvar, float *coef, double eps, double mom)
{
	const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	double mean = 0, var = 0;
	for (int g = 0; g < G; g++)
		mean += gstats[(int64_t)g * 2 * C + c];
	mean /= G;
	for (int g = 0; g < G; g++) {
		const double d = gstats[(int64_t)g * 2 * C + c] - mean;
		var += gstats[(int64_t)g * 2 * C + C + c] + d * d;
	}
	var /= G;
	const double M = (double)G * n;
	common_bn_commit(c, C, mean, var, (double)M, eps, mom, gamma, beta, saved, rmean, rvar, coef,
			 coef + C);
}

/* BN_INFER: coefficients from the running statistics. */
__global__ void bn_infer_finish(int64_t C, const float *gamma, const float *beta,
				const float *rmean, const float *rvar, float *coef, double eps)
{
	const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	const double a = gamma[c] / sqrt((double)rvar[c] + eps);
	coef[c] = (float)a;
	coef[C + c] = (float)(beta[c] - rmean[c] * a);
}

/* BN_BWD (sums = NULL: from part) and BN_BWD_APPLY (sums = the groups'
 * summed [dgamma, dbeta], M the global count): dx coefficients
 *   g = gamma*invstd, s = dbeta/M, k = dgamma*invstd/M.
 * BN_BWD and BN_BWD_REDUCE also write dgamma, dbeta (and out2). */
__global__ void bn_bwd_finish(const double *part, int K, const float *sums, int64_t C,
			      double M, const float *gamma, const float *saved, float *dgamma,
			      float *dbeta, float *both, float *coef)
{
	const int64_t c = warp_chan();
	if (c >= C)
		return; /* the whole warp */
	double s0 = 0, s1 = 0;
	if (!sums)
		part_sum(part, c, K, &s0, &s1);
	if (threadIdx.x & 31)
		return;
	const double inv = saved[C + c];
	double dg, db;
	if (sums) {
		dg = sums[c];
		db = sums[C + c];
	} else {
		dg = s1 * inv;
		db = s0;
		if (dgamma)
			dgamma[c] = (float)dg, dbeta[c] = (float)db;
		if (both)
			both[c] = (float)dg, both[C + c] = (float)db;
	}
	if (coef) {
		coef[c] = (float)(gamma[c] * inv);
		coef[C + c] = (float)(db / M);
		coef[2 * C + c] = (float)(dg * inv / M);
	}
}

/* a bias gradient: db[c] = the channel's sum */
__global__ void chan_sum_finish(const double *part, int K, int64_t C, float *db)
{
	const int64_t c = warp_chan();
	if (c >= C)
		return; /* the whole warp */
	double s0, s1;
	part_sum(part, c, K, &s0, &s1);
	if (!(threadIdx.x & 31))
		db[c] = (float)s0;
}

/* ---- pass 3: elementwise ------------------------------------------------ */

/* y = x*coef[c] + coef[C + c] */
template <typename T>
__global__ void bn_y(T *y, const T *x, const float *coef, int64_t n, int64_t C, int64_t HW,
		     int rows)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t c = chan_of(e, C, HW, rows);
		st(y, e, ld(x, e) * coef[c] + coef[C + c]);
	}
}

/* dx = (dy - coef[C+c] - (x - mean[c]) * coef[2C+c]) * coef[c] */
template <typename T>
__global__ void bn_dx(T *dx, const T *x, const T *dy, const float *mean, const float *coef,
		      int64_t n, int64_t C, int64_t HW, int rows)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t c = chan_of(e, C, HW, rows);
		st(dx, e, (ld(dy, e) - coef[C + c] - (ld(x, e) - mean[c]) * coef[2 * C + c]) * coef[c]);
	}
}

/* y[e] += b[c] (a convolution's bias, after a cuDNN engine without it) */
template <typename T>
__global__ void chan_bias(T *y, const float *b, int64_t n, int64_t C, int64_t HW, int rows)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x)
		st(y, e, ld(y, e) + b[chan_of(e, C, HW, rows)]);
}

/* ---- launchers ---------------------------------------------------------- */

/* sz[] of the batch-norm and bias plans (cudnn.c fills them) */
#define N_ (p->rows)
#define C_ (p->cols)
#define HW_ (p->n)
#define ROWS_ ((int)p->sz[0])
#define K_ ((int)p->sz[1])

static unsigned blocks_for(int64_t n)
{
	const int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

/* blocks of the per-channel kernels (one thread per channel, no
 * grid-stride loop): every channel, uncapped */
static unsigned chan_blocks(int64_t C)
{
	return (unsigned)((C + CUDA_THREADS - 1) / CUDA_THREADS);
}

/* the workspace: part[C*K*2] doubles, then coef[3*C] floats */
static double *ws_part(const struct cuda_plan *p, const struct kiln_op_args *a)
{
	return (double *)((char *)a->workspace + p->sz[2]);
}
static float *ws_coef(const struct cuda_plan *p, const struct kiln_op_args *a)
{
	return (float *)(ws_part(p, a) + (size_t)C_ * K_ * 2);
}

extern "C" size_t cuda_bn_workspace(int64_t C, int K)
{
	return (size_t)C * K * 2 * sizeof(double) + 3 * (size_t)C * sizeof(float);
}

/* x, y, dy, dx are T (f32, bf16 or f16: f32 arithmetic, one rounding of
 * y / dx); every per-channel tensor is f32 */
template <typename T>
static cudaError_t bn_run(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s)
{
	const int64_t M = N_ * HW_, n = M * C_;
	const unsigned cb = chan_blocks(C_), wb = chan_blocks(32 * C_), eb = blocks_for(n);
	double *part = ws_part(p, a);
	float *coef = ws_coef(p, a);
	const T *x = (const T *)a->in[0];
	const double eps = p->op.f[0], mom = p->op.f[1];
	switch (p->op.type) {
	case KILN_OP_BN_TRAIN:
		part_launch<T>(part, x, NULL, NULL, C_, HW_, M, K_, ROWS_, PART_STATS, s);
		bn_train_finish<T><<<wb, CUDA_THREADS, 0, s>>>(part, x, C_, HW_, M, K_, ROWS_,
							    (const float *)a->in[1], (const float *)a->in[2],
							    (float *)a->out[1], (float *)a->out[2],
							    (float *)a->out[3], coef, NULL, eps, mom);
		bn_y<T><<<eb, CUDA_THREADS, 0, s>>>((T *)a->out[0], x, coef, n, C_, HW_, ROWS_);
		break;
	case KILN_OP_BN_STATS:
		part_launch<T>(part, x, NULL, NULL, C_, HW_, M, K_, ROWS_, PART_STATS, s);
		bn_train_finish<T><<<wb, CUDA_THREADS, 0, s>>>(part, x, C_, HW_, M, K_, ROWS_, NULL, NULL,
							    NULL, NULL, NULL, NULL, (float *)a->out[0],
							    eps, mom);
		break;
	case KILN_OP_BN_APPLY:
		bn_apply_finish<<<cb, CUDA_THREADS, 0, s>>>((const float *)a->in[3], (int)p->op.i[0], C_, M,
							    (const float *)a->in[1], (const float *)a->in[2],
							    (float *)a->out[1], (float *)a->out[2],
							    (float *)a->out[3], coef, eps, mom);
		bn_y<T><<<eb, CUDA_THREADS, 0, s>>>((T *)a->out[0], x, coef, n, C_, HW_, ROWS_);
		break;
	case KILN_OP_BN_INFER:
		bn_infer_finish<<<cb, CUDA_THREADS, 0, s>>>(C_, (const float *)a->in[1], (const float *)a->in[2],
							    (const float *)a->in[3], (const float *)a->in[4],
							    coef, eps);
		bn_y<T><<<eb, CUDA_THREADS, 0, s>>>((T *)a->out[0], x, coef, n, C_, HW_, ROWS_);
		break;
	case KILN_OP_BN_BWD:
	case KILN_OP_BN_BWD_REDUCE: {
		/* BN_BWD: in0 x, in1 dy, in2 gamma, in3 saved; out0 dx, out1 dgamma, out2 dbeta.
		 * BN_BWD_REDUCE: in0 x, in1 dy, in2 saved; out0 dgamma, out1 dbeta, out2 [2,C].
		 * with_dx is also the index of dgamma among the outputs. */
		const int with_dx = p->op.type == KILN_OP_BN_BWD;
		const T *dy = (const T *)a->in[1];
		const float *saved = (const float *)a->in[2 + with_dx];
		part_launch<T>(part, x, dy, saved, C_, HW_, M, K_, ROWS_, PART_BWD, s);
		bn_bwd_finish<<<wb, CUDA_THREADS, 0, s>>>(part, K_, NULL, C_, (double)M,
							  with_dx ? (const float *)a->in[2] : NULL, saved,
							  (float *)a->out[with_dx], (float *)a->out[with_dx + 1],
							  with_dx ? NULL : (float *)a->out[2],
							  with_dx ? coef : NULL);
		if (with_dx)
			bn_dx<T><<<eb, CUDA_THREADS, 0, s>>>((T *)a->out[0], x, dy, saved, coef, n, C_, HW_,
							     ROWS_);
		break;
	}
	case KILN_OP_BN_BWD_APPLY: {
		/* in0 x, in1 dy, in2 gamma, in3 saved, in4 sums [2,C]; out0 dx */
		const T *dy = (const T *)a->in[1];
		const float *saved = (const float *)a->in[3];
		bn_bwd_finish<<<wb, CUDA_THREADS, 0, s>>>(NULL, 0, (const float *)a->in[4], C_,
							  (double)p->op.i[0] * M, (const float *)a->in[2],
							  saved, NULL, NULL, NULL, coef);
		bn_dx<T><<<eb, CUDA_THREADS, 0, s>>>((T *)a->out[0], x, dy, saved, coef, n, C_, HW_, ROWS_);
		break;
	}
	default: return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_bn(const struct cuda_plan *p, const struct kiln_op_args *a,
				      cudaStream_t s)
{
	switch (p->op.in[0].dtype) {
	case KILN_F32: return bn_run<float>(p, a, s);
	case KILN_BF16: return bn_run<__nv_bfloat16>(p, a, s);
	case KILN_F16: return bn_run<__half>(p, a, s);
	default: return cudaErrorInvalidValue;
	}
}

/* A convolution's bias when cuDNN ran without it (cudnn.c): CONV adds
 * b[O] to y; CONV_BWD_WEIGHTS sums dy per channel into db.  The plan's
 * N_, C_ (= O), HW_ (= OH*OW), ROWS_, K_ describe y; dtype its dtype. */
extern "C" cudaError_t cuda_dnn_bias(const struct cuda_plan *p, void *y, const void *dy,
				     float *bias_or_db, int dtype, int grad, void *workspace,
				     cudaStream_t s)
{
	const int64_t M = N_ * HW_, n = M * C_;
	if (!grad) {
		const unsigned eb = blocks_for(n);
		switch (dtype) {
		case KILN_F32: chan_bias<float><<<eb, CUDA_THREADS, 0, s>>>((float *)y, bias_or_db, n, C_, HW_, ROWS_); break;
		case KILN_BF16: chan_bias<__nv_bfloat16><<<eb, CUDA_THREADS, 0, s>>>((__nv_bfloat16 *)y, bias_or_db, n, C_, HW_, ROWS_); break;
		case KILN_F16: chan_bias<__half><<<eb, CUDA_THREADS, 0, s>>>((__half *)y, bias_or_db, n, C_, HW_, ROWS_); break;
		default: return cudaErrorInvalidValue;
		}
		return cudaGetLastError();
	}
	double *part = (double *)workspace;
	switch (dtype) {
	case KILN_F32: part_launch<float>(part, NULL, (const float *)dy, NULL, C_, HW_, M, K_, ROWS_, PART_SUM, s); break;
	case KILN_BF16: part_launch<__nv_bfloat16>(part, NULL, (const __nv_bfloat16 *)dy, NULL, C_, HW_, M, K_, ROWS_, PART_SUM, s); break;
	case KILN_F16: part_launch<__half>(part, NULL, (const __half *)dy, NULL, C_, HW_, M, K_, ROWS_, PART_SUM, s); break;
	default: return cudaErrorInvalidValue;
	}
	chan_sum_finish<<<chan_blocks(32 * C_), CUDA_THREADS, 0, s>>>(part, K_, C_, bias_or_db);
	return cudaGetLastError();
}

/* dst[n] f32 = src[n] of dtype (a low-precision x or dy widened for an
 * f32 convolution: cudnn.c) */
template <typename T>
__global__ void widen(float *dst, const T *src, int64_t n)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x)
		dst[e] = ld(src, e);
}

extern "C" cudaError_t cuda_dnn_widen(float *dst, const void *src, int64_t n, int dtype,
				      cudaStream_t s)
{
	const unsigned b = blocks_for(n);
	switch (dtype) {
	case KILN_BF16: widen<__nv_bfloat16><<<b, CUDA_THREADS, 0, s>>>(dst, (const __nv_bfloat16 *)src, n); break;
	case KILN_F16: widen<__half><<<b, CUDA_THREADS, 0, s>>>(dst, (const __half *)src, n); break;
	default: return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}

/* ---- pooling -------------------------------------------------------------
 * PyTorch's semantics (plugins/cpu/pool.c): max over the window's elements
 * inside the input (the first maximum wins, a NaN over any number, the
 * last NaN over the others), average dividing by KH*KW
 * when counting padding, else by the elements inside.  The backward of max
 * finds each window's maximum again from x (in2), the same way, into the
 * workspace (one int32 a window: pool_arg), and every input element then
 * gathers the dy of the windows whose maximum it is, so no index tensor is
 * kept between the passes (aux_bytes 0) and no atomics are needed.
 * (Finding the maxima per input element, 4 windows of 9 for ResNet's
 * 3x3/2, took 33 ms of ResNet-50's 274 ms step on an H200.) */

struct pool_geom {
	int64_t N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw;
	int nhwc, max, cip;
	int i32; /* every index fits 32 bits: coords divides in 32 bits */
};

__device__ __forceinline__ int64_t at4(const pool_geom &g, int64_t n, int64_t c, int64_t h,
				       int64_t w, int64_t Hd, int64_t Wd)
{
	return g.nhwc ? ((n * Hd + h) * Wd + w) * g.C + c : ((n * g.C + c) * Hd + h) * Wd + w;
}

/* the window (oh, ow): its maximum's position (h * W + w) and value, or
 * its average */
template <typename T>
__device__ float pool_window(const pool_geom &g, const T *x, int64_t n, int64_t c, int64_t oh,
			     int64_t ow, int64_t *arg)
{
	const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
	float best = -INFINITY, sum = 0;
	int64_t cnt = 0, where = -1;
	for (int64_t kh = 0; kh < g.KH; kh++) {
		const int64_t h = h0 + kh;
		if (h < 0 || h >= g.H)
			continue;
		for (int64_t kw = 0; kw < g.KW; kw++) {
			const int64_t w = w0 + kw;
			if (w < 0 || w >= g.W)
				continue;
			const float v = ld(x, at4(g, n, c, h, w, g.H, g.W));
			if (where < 0 || v > best || isnan(v)) /* the last NaN wins, as PyTorch's scan */
				best = v, where = h * g.W + w;
			sum += v;
			cnt++;
		}
	}
	if (arg)
		*arg = where;
	if (g.max)
		return best;
	return sum / (float)(g.cip ? g.KH * g.KW : cnt);
}

/* decompose a stored index of a [N, C, Hd, Wd] tensor (in 32 bits where
 * the tensors allow: a 64-bit division is a long software sequence, and
 * pooling's backward made three per element, 4.8 ms a call on ResNet-50) */
template <typename I>
__device__ __forceinline__ void coords_t(I e, I C, I Hd, I Wd, int nhwc, int64_t *n, int64_t *c,
					 int64_t *h, int64_t *w)
{
	if (nhwc) {
		*c = e % C;
		e /= C;
		*w = e % Wd;
		e /= Wd;
		*h = e % Hd;
		*n = e / Hd;
	} else {
		*w = e % Wd;
		e /= Wd;
		*h = e % Hd;
		e /= Hd;
		*c = e % C;
		*n = e / C;
	}
}

__device__ __forceinline__ void coords(const pool_geom &g, int64_t e, int64_t Hd, int64_t Wd,
				       int64_t *n, int64_t *c, int64_t *h, int64_t *w)
{
	if (g.i32)
		coords_t<uint32_t>((uint32_t)e, (uint32_t)g.C, (uint32_t)Hd, (uint32_t)Wd, g.nhwc, n, c,
				   h, w);
	else
		coords_t<int64_t>(e, g.C, Hd, Wd, g.nhwc, n, c, h, w);
}

template <typename T>
__global__ void pool_fwd(pool_geom g, T *y, const T *x)
{
	const int64_t n_out = g.N * g.C * g.OH * g.OW;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_out;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t n, c, oh, ow;
		coords(g, e, g.OH, g.OW, &n, &c, &oh, &ow);
		st(y, e, pool_window(g, x, n, c, oh, ow, (int64_t *)NULL));
	}
}

/* max pooling's backward, pass 1: each window's maximum position (h*W+w
 * in its plane, pool_window's rule) into arg, stored as y is */
template <typename T>
__global__ void pool_arg(pool_geom g, int32_t *arg, const T *x)
{
	const int64_t n_out = g.N * g.C * g.OH * g.OW;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_out;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t n, c, oh, ow, where;
		coords(g, e, g.OH, g.OW, &n, &c, &oh, &ow);
		pool_window(g, x, n, c, oh, ow, &where);
		arg[e] = (int32_t)where;
	}
}

/* pass 2 (and average pooling's only pass): every input element gathers,
 * in a fixed order, the dy of the windows holding it whose maximum it is
 * (max: arg from pass 1) or its share of each (average) */
template <typename T>
__global__ void pool_bwd(pool_geom g, T *dx, const T *dy, const int32_t *arg)
{
	const int64_t n_in = g.N * g.C * g.H * g.W;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_in;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t n, c, h, w;
		coords(g, e, g.H, g.W, &n, &c, &h, &w);
		/* the windows holding (h, w): oh*sh - ph <= h <= oh*sh - ph + KH - 1 */
		const int64_t lh = h + g.ph - g.KH + 1, lw = w + g.pw - g.KW + 1;
		const int64_t oh0 = lh <= 0 ? 0 : (lh + g.sh - 1) / g.sh;
		const int64_t ow0 = lw <= 0 ? 0 : (lw + g.sw - 1) / g.sw;
		int64_t oh1 = (h + g.ph) / g.sh, ow1 = (w + g.pw) / g.sw;
		if (oh1 > g.OH - 1)
			oh1 = g.OH - 1;
		if (ow1 > g.OW - 1)
			ow1 = g.OW - 1;
		float acc = 0;
		for (int64_t oh = oh0; oh <= oh1; oh++)
			for (int64_t ow = ow0; ow <= ow1; ow++) {
				const int64_t o = at4(g, n, c, oh, ow, g.OH, g.OW);
				if (g.max) {
					if (arg[o] == h * g.W + w)
						acc += ld(dy, o);
				} else {
					int64_t cnt = g.KH * g.KW;
					if (!g.cip) {
						const int64_t hh0 = oh * g.sh - g.ph, ww0 = ow * g.sw - g.pw;
						const int64_t ch = min(hh0 + g.KH, g.H) - max(hh0, (int64_t)0);
						const int64_t cw = min(ww0 + g.KW, g.W) - max(ww0, (int64_t)0);
						cnt = ch * cw;
					}
					acc += ld(dy, o) / (float)cnt;
				}
			}
		st(dx, e, acc);
	}
}

template <typename T>
static void pool_run(const pool_geom &g, int bwd, const struct kiln_op_args *a, int grid,
		     cudaStream_t s)
{
	if (bwd) {
		/* max: the windows' maxima first, into the workspace */
		int32_t *arg = g.max ? (int32_t *)a->workspace : NULL;
		if (g.max)
			pool_arg<T><<<grid, CUDA_THREADS, 0, s>>>(g, arg, (const T *)a->in[2]);
		pool_bwd<T><<<grid, CUDA_THREADS, 0, s>>>(g, (T *)a->out[0], (const T *)a->in[0], arg);
	} else
		pool_fwd<T><<<grid, CUDA_THREADS, 0, s>>>(g, (T *)a->out[0], (const T *)a->in[0]);
}

extern "C" cudaError_t cuda_launch_pool(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD;
	const struct kiln_tensor_desc *x = bwd ? &p->op.out[0] : &p->op.in[0];
	const struct kiln_tensor_desc *y = bwd ? &p->op.in[0] : &p->op.out[0];
	pool_geom g;
	g.N = x->dims[0], g.C = x->dims[1], g.H = x->dims[2], g.W = x->dims[3];
	g.OH = y->dims[2], g.OW = y->dims[3];
	g.KH = p->op.i[1], g.KW = p->op.i[2], g.sh = p->op.i[3], g.sw = p->op.i[4];
	g.ph = p->op.i[5], g.pw = p->op.i[6];
	g.nhwc = x->layout == KILN_NHWC;
	g.max = p->op.i[0] == KILN_POOL_MAX;
	g.cip = p->op.i[7] != 0;
	/* nothing to pool: an empty input, or no window (dx then all +0) */
	const int64_t nx = g.N * g.C * g.H * g.W, ny = g.N * g.C * g.OH * g.OW;
	if (nx == 0 || ny == 0)
		return bwd && nx ? cudaMemsetAsync(a->out[0], 0, (size_t)nx * (x->dtype == KILN_F32 ? 4 : 2), s)
				 : cudaSuccess;
	g.i32 = nx < ((int64_t)1 << 31) && ny < ((int64_t)1 << 31);
	if (bwd && g.max && (!a->in[2] || !a->workspace))
		return cudaErrorInvalidValue; /* max's backward reads x (in2), its workspace */
	switch (x->dtype) {
	case KILN_F32: pool_run<float>(g, bwd, a, p->grid, s); break;
	case KILN_BF16: pool_run<__nv_bfloat16>(g, bwd, a, p->grid, s); break;
	case KILN_F16: pool_run<__half>(g, bwd, a, p->grid, s); break;
	default: return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}
