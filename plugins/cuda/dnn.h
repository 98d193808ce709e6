/* plugins/cuda/dnn.h - the CNN op set of the CUDA device, shared by
 * cudnn.c (convolution through cuDNN's graph API, prepare of every CNN op)
 * and dnn_kernels.cu (batch norm, pooling, the convolution's fallback bias
 * kernels).  Read by gcc and nvcc: C declarations only.
 *
 * Plan sizes of the batch-norm and bias plans (struct cuda_plan):
 *   rows = N, cols = C (O for a convolution's bias), n = H*W (1 for 2-d),
 *   sz[0] = 1 for channels-last storage (NHWC or 2-d [N, C]), 0 for NCHW,
 *   sz[1] = K, the fixed number of slices each channel's sums are split
 *           into (a function of the shape only: results never depend on
 *           the GPU),
 *   sz[2] = byte offset of the kernels' part of the workspace.
 */
#ifndef KILN_CUDA_DNN_H
#define KILN_CUDA_DNN_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_plan;
struct kiln_op_args;

/* workspace of the batch-norm kernels for C channels in K slices */
size_t cuda_bn_workspace(int64_t C, int K);
/* every BN op (BN_TRAIN .. BN_BWD_APPLY) */
cudaError_t cuda_launch_bn(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
/* POOL and POOL_BWD */
cudaError_t cuda_launch_pool(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
/* grad = 0: y[N, C, HW] += b[c] (y of `dtype`); grad = 1: db[c] = sum of
 * dy over N, HW (workspace: cuda_bn_workspace(C, K) bytes) */
cudaError_t cuda_dnn_bias(const struct cuda_plan *p, void *y, const void *dy, float *bias_or_db,
			  int dtype, int grad, void *workspace, cudaStream_t s);

/* dst[n] f32 = src[n] of dtype (bf16 or f16) */
cudaError_t cuda_dnn_widen(float *dst, const void *src, int64_t n, int dtype, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_DNN_H */
