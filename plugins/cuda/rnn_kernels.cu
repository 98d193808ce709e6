/* plugins/cuda/rnn_kernels.cu - the RNN ops' own kernels (rnn.c): the
 * rows' lengths from the pad id, the gather into cuDNN's reading order
 * (and back), the final hidden state (i[4]: picked from that order, and
 * its gradient put back), and copying the weight gradients out of
 * cuDNN's buffer.
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

/* y[b,h] = seq[b, len[b]-1, h] (0 when len[b] = 0): plugins/cpu/rnn.c's
 * rnn_last */
__global__ void rnn_last_kernel(float *y, const float *seq, int64_t B, int64_t T, int64_t H,
				const int32_t *len)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < B * H;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t b = e / H, h = e % H;
		y[e] = len[b] > 0 ? seq[(b * T + len[b] - 1) * H + h] : 0.0f;
	}
}

cudaError_t cuda_rnn_last(float *y, const float *seq, int64_t B, int64_t T, int64_t H,
			  const int32_t *len, int grid, cudaStream_t s)
{
	rnn_last_kernel<<<grid, CUDA_THREADS, 0, s>>>(y, seq, B, T, H, len);
	return cudaGetLastError();
}

/* dseq[b,t,h] = t == len[b]-1 ? dy[b,h] : 0: rnn_last_dy's */
__global__ void rnn_last_dy_kernel(float *dseq, const float *dy, int64_t B, int64_t T, int64_t H,
				   const int32_t *len)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < B * T * H;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t h = e % H, t = (e / H) % T, b = e / (H * T);
		dseq[e] = t == len[b] - 1 ? dy[b * H + h] : 0.0f;
	}
}

cudaError_t cuda_rnn_last_dy(float *dseq, const float *dy, int64_t B, int64_t T, int64_t H,
			     const int32_t *len, int grid, cudaStream_t s)
{
	rnn_last_dy_kernel<<<grid, CUDA_THREADS, 0, s>>>(dseq, dy, B, T, H, len);
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
