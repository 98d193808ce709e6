/* plugins/cuda/int8_kernels.cu - the kernels of the INT8 ops (qops.c):
 * quantizing the weights per output channel, the input's patches
 * (im2col) into s8 rows, and the epilogue from the exact s32 sums.
 *
 * The rounding is the contract's (kiln/ops.h, KILN_OP_QCONV) and the CPU
 * device's: round half to even (rintf, __float2int_rn), IEEE division and
 * products (__fdiv_rn, __fmul_rn, __fadd_rn: no contraction into an FMA,
 * which the CPU's epilogue does not do either).
 *
 * u8 inputs [0, 255] do not fit cuBLASLt's s8 operands: they are stored
 * as xq - 128, and the epilogue adds back 128 * sum_k wq[o,k] (exact in
 * int32: 128 * 63 * K < 2^31 for K < 266,000).
 */
#include "cuda.h"

#include <stdint.h>

/* One activation quantized: sat(round_half_even(x * r)), u8 shifted by -128 */
static __device__ __forceinline__ int8_t q_act(float x, float r, int u8)
{
	float v = __fmul_rn(x, r);
	v = u8 ? fminf(fmaxf(v, 0.0f), 255.0f) : fminf(fmaxf(v, -128.0f), 127.0f);
	const int q = __float2int_rn(v);
	return (int8_t)(u8 ? q - 128 : q);
}

/* One block per output channel: the max |w| (tree in shared memory),
 * sw = amax / 63 (1 for an all-zero filter), the 7-bit weights and their
 * sum (for the u8 shift). */
__global__ void q_weights_kernel(const float *w, int64_t per, int64_t kp, int64_t og, int64_t ogp,
				 float sx, int8_t *wq, float *sc, int32_t *wsum)
{
	__shared__ float smax[CUDA_THREADS];
	__shared__ int32_t ssum[CUDA_THREADS];
	const int64_t o = blockIdx.x, at = (o / og) * ogp + o % og; /* wq's row of o */
	const float *row = w + o * per;
	float m = 0.0f;
	for (int64_t k = threadIdx.x; k < per; k += blockDim.x)
		m = fmaxf(m, fabsf(row[k]));
	smax[threadIdx.x] = m;
	__syncthreads();
	for (int h = blockDim.x / 2; h > 0; h /= 2) {
		if ((int)threadIdx.x < h)
			smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + h]);
		__syncthreads();
	}
	const float amax = smax[0];
	const float sw = amax > 0.0f ? __fdiv_rn(amax, 63.0f) : 1.0f;
	int32_t sum = 0;
	for (int64_t k = threadIdx.x; k < kp; k += blockDim.x) {
		int q = 0;
		if (k < per)
			q = (int)fmaxf(-63.0f, fminf(63.0f, rintf(__fdiv_rn(row[k], sw))));
		wq[at * kp + k] = (int8_t)q;
		sum += q;
	}
	ssum[threadIdx.x] = sum;
	__syncthreads();
	for (int h = blockDim.x / 2; h > 0; h /= 2) {
		if ((int)threadIdx.x < h)
			ssum[threadIdx.x] += ssum[threadIdx.x + h];
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		sc[o] = __fmul_rn(sx, sw);
		wsum[o] = ssum[0];
	}
}

cudaError_t cuda_q_weights(const float *w, const struct cuda_qgeom *g, void *wq, float *sc,
			   int32_t *wsum, cudaStream_t s)
{
	const int64_t per = g->c / g->groups * g->kh * g->kw;
	q_weights_kernel<<<(unsigned)g->o, CUDA_THREADS, 0, s>>>(w, per, g->kp, g->o / g->groups,
								 g->ogp, g->sx, (int8_t *)wq, sc,
								 wsum);
	return cudaGetLastError();
}

/* xq[grp][r][k], r = (n, p, q) the output pixel, k = (c, i, j) within the
 * group's filter; outside the image the input is 0 (quantized: 0, or -128
 * shifted), past the filter (k >= per) 0, which meets wq's zeros, and
 * past the rows (r >= n*oh*ow) 0, rows the epilogue never reads. */
__global__ void q_im2col_kernel(const float *x, struct cuda_qgeom g, float r, int8_t *xq)
{
	const int64_t cg = g.c / g.groups, per = cg * g.kh * g.kw;
	const int64_t rows = g.n * g.oh * g.ow, total = g.groups * g.rowsp * g.kp;
	const int8_t zero = g.u8 ? (int8_t)-128 : (int8_t)0;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t k = e % g.kp, row = (e / g.kp) % g.rowsp, grp = e / (g.kp * g.rowsp);
		if (k >= per || row >= rows) {
			xq[e] = 0;
			continue;
		}
		const int64_t c = grp * cg + k / (g.kh * g.kw), i = (k / g.kw) % g.kh, j = k % g.kw;
		const int64_t q = row % g.ow, p = (row / g.ow) % g.oh, n = row / (g.ow * g.oh);
		const int64_t ih = p * g.sh - g.ph + i * g.dh, iw = q * g.sw - g.pw + j * g.dw;
		if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) {
			xq[e] = zero;
			continue;
		}
		const int64_t at = g.nhwc ? ((n * g.h + ih) * g.w + iw) * g.c + c
					  : ((n * g.c + c) * g.h + ih) * g.w + iw;
		xq[e] = q_act(x[at], r, g.u8);
	}
}

cudaError_t cuda_q_im2col(const float *x, const struct cuda_qgeom *g, void *xq, int grid,
			  cudaStream_t s)
{
	q_im2col_kernel<<<grid, CUDA_THREADS, 0, s>>>(x, *g, g->r, (int8_t *)xq);
	return cudaGetLastError();
}

/* y[n,o,p,q] (x's layout) = act(acc * sc[o] + b[o]); acc of output
 * channel o in group grp = o / (O/groups) at [grp][row][o % (O/groups)]
 * with rowsp rows of ogp int32 per group. */
__global__ void q_epilogue_kernel(const int32_t *acc, const float *sc, const int32_t *wsum,
				  const float *b, struct cuda_qgeom g, float *y)
{
	const int64_t og = g.o / g.groups, rows = g.n * g.oh * g.ow, total = rows * g.o;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t o, row;
		if (g.nhwc) {
			o = e % g.o;
			row = e / g.o;
		} else {
			const int64_t hw = g.oh * g.ow, n = e / (g.o * hw);
			o = (e / hw) % g.o;
			row = n * hw + e % hw;
		}
		int32_t a = acc[((o / og) * g.rowsp + row) * g.ogp + o % og];
		if (g.u8)
			a += 128 * wsum[o];
		float v = __fmul_rn((float)a, sc[o]);
		v = __fadd_rn(v, b ? b[o] : 0.0f);
		y[e] = g.relu && v < 0.0f ? 0.0f : v;
	}
}

cudaError_t cuda_q_epilogue(const int32_t *acc, const float *sc, const int32_t *wsum,
			    const float *b, const struct cuda_qgeom *g, float *y, int grid,
			    cudaStream_t s)
{
	q_epilogue_kernel<<<grid, CUDA_THREADS, 0, s>>>(acc, sc, wsum, b, *g, y);
	return cudaGetLastError();
}
