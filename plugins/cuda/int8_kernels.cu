/* plugins/cuda/int8_kernels.cu - the kernels of the INT8 ops (qops.c):
 * quantizing the weights per output channel, the input's patches
 * (im2col) into s8 rows, and the epilogue from the exact s32 sums.  Each
 * element is qkern.h's function (the maps, roundings and the u8 shift),
 * which tests/check_cuda_host.c runs on the host against the CPU device.
 */
#include "cuda.h" /* qkern.h: the geometry, the roundings, the maps */

#include <stdint.h>

/* One block per output channel: the max |w| (tree in shared memory), its
 * scale, the 7-bit weights (0 past the filter) and their sum (for the u8
 * shift). */
__global__ void q_weights_kernel(const float *w, struct cuda_qgeom g, int8_t *wq, float *sc,
				 int32_t *wsum)
{
	__shared__ float smax[CUDA_THREADS];
	__shared__ int32_t ssum[CUDA_THREADS];
	const int64_t o = blockIdx.x, per = g.c / g.groups * g.kh * g.kw, at = qkern_wrow(&g, o);
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
	const float sw = qkern_wscale(smax[0]);
	int32_t sum = 0;
	for (int64_t k = threadIdx.x; k < g.kp; k += blockDim.x) {
		const int q = k < per ? qkern_wq(row[k], sw) : 0;
		wq[at * g.kp + k] = (int8_t)q;
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
		sc[o] = __fmul_rn(g.sx, sw);
		wsum[o] = ssum[0];
	}
}

cudaError_t cuda_q_weights(const float *w, const struct cuda_qgeom *g, void *wq, float *sc,
			   int32_t *wsum, cudaStream_t s)
{
	q_weights_kernel<<<(unsigned)g->o, CUDA_THREADS, 0, s>>>(w, *g, (int8_t *)wq, sc, wsum);
	return cudaGetLastError();
}

__global__ void q_im2col_kernel(const float *x, struct cuda_qgeom g, int8_t *xq)
{
	const int64_t total = g.groups * g.rowsp * g.kp;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x)
		xq[e] = qkern_im2col(x, &g, e);
}

cudaError_t cuda_q_im2col(const float *x, const struct cuda_qgeom *g, void *xq, int grid,
			  cudaStream_t s)
{
	q_im2col_kernel<<<grid, CUDA_THREADS, 0, s>>>(x, *g, (int8_t *)xq);
	return cudaGetLastError();
}

__global__ void q_epilogue_kernel(const int32_t *acc, const float *sc, const int32_t *wsum,
				  const float *b, struct cuda_qgeom g, float *y)
{
	const int64_t total = g.n * g.oh * g.ow * g.o;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x)
		y[e] = qkern_out(acc, sc, wsum, b, &g, e);
}

cudaError_t cuda_q_epilogue(const int32_t *acc, const float *sc, const int32_t *wsum,
			    const float *b, const struct cuda_qgeom *g, float *y, int grid,
			    cudaStream_t s)
{
	q_epilogue_kernel<<<grid, CUDA_THREADS, 0, s>>>(acc, sc, wsum, b, *g, y);
	return cudaGetLastError();
}
