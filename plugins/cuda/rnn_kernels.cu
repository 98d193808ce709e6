/* plugins/cuda/rnn_kernels.cu - the RNN ops' own kernels (rnn.c): the
 * rows' lengths from the pad id, the gather into cuDNN's reading order
 * (and back), and copying the weight gradients out of cuDNN's buffer.
 * What each computes is the CPU device's (plugins/cpu/rnn.c). */
#include "cuda.h"

#include <stdint.h>

__global__ void rnn_lengths_kernel(const int32_t *ids, int32_t pad, int64_t B, int64_t T,
				   int32_t *len)
{
	for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < B;
	     b += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = 0;
		while (ids && t < T && ids[b * T + t] != pad)
			t++;
		len[b] = (int32_t)(ids ? t : T);
	}
}

cudaError_t cuda_rnn_lengths(const int32_t *ids, int32_t pad, int64_t B, int64_t T, int32_t *len,
			     cudaStream_t s)
{
	const int blocks = (int)((B + CUDA_THREADS - 1) / CUDA_THREADS);
	rnn_lengths_kernel<<<blocks > 0 ? blocks : 1, CUDA_THREADS, 0, s>>>(ids, pad, B, T, len);
	return cudaGetLastError();
}

__global__ void rnn_gather_kernel(float *dst, const float *src, int64_t B, int64_t T, int64_t C,
				  const int32_t *len, int reverse, int acc)
{
	const int64_t total = B * T * C;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t c = e % C, t = (e / C) % T, b = e / (C * T);
		if (t >= len[b]) {
			if (!acc)
				dst[e] = 0.0f;
			continue;
		}
		const int64_t st = reverse ? len[b] - 1 - t : t;
		const float v = src[(b * T + st) * C + c];
		dst[e] = acc ? dst[e] + v : v;
	}
}

cudaError_t cuda_rnn_gather(float *dst, const float *src, int64_t B, int64_t T, int64_t C,
			    const int32_t *len, int reverse, int acc, int grid, cudaStream_t s)
{
	rnn_gather_kernel<<<grid, CUDA_THREADS, 0, s>>>(dst, src, B, T, C, len, reverse, acc);
	return cudaGetLastError();
}

__global__ void rnn_put_kernel(float *dst, const float *src, int64_t n, int acc)
{
	for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n;
	     k += (int64_t)gridDim.x * blockDim.x)
		dst[k] = acc ? dst[k] + src[k] : src[k];
}

cudaError_t cuda_rnn_put(float *dst, const float *src, int64_t n, int acc, int grid, cudaStream_t s)
{
	rnn_put_kernel<<<grid, CUDA_THREADS, 0, s>>>(dst, src, n, acc);
	return cudaGetLastError();
}
