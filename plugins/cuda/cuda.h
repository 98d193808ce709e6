/* plugins/cuda/cuda.h - shared state of the CUDA device plugin (kiln-cuda.so).
 *
 * The plugin is split by job: cuda.c (descriptor, probe, open/close,
 * memory, streams and events, prepare/run dispatch), ops.c (shape checks
 * of the loop ops and the optimizer, choosing a launcher), gemm.c (GEMM
 * through cuBLASLt), kernels.cu (kiln's own kernels and their
 * launchers, compiled by nvcc), and the CNN op set: cudnn.c (convolution
 * through cuDNN's graph API, autotuning), dnn_map.c (its pure host
 * logic: strides, keys, the autotune cache file) and dnn_kernels.cu
 * (batch norm, pooling); the INT8 ops: qops.c (int8 im2col and cuBLASLt's
 * int8 GEMM), int8_kernels.cu and its pure pieces qkern.h; the recurrent
 * ops: rnn.c (cuDNN's RNN API) and rnn_kernels.cu (lengths, gathers); the
 * fused attention: sdpa.c (cuDNN's fused SDPA graph; dnn_be.h shares
 * cudnn.c's plan helpers), attn_map.c (its pure host logic) and attn.cu
 * (kiln's kernels, where cuDNN does not take an op).
 * This header is read by gcc and by nvcc:
 * it holds only C declarations.  Nothing here links libkiln: the core is
 * reached through the host table.
 *
 * Why one cudart per plugin: the runtime is linked statically
 * (libcudart_static.a), so loading kiln-cuda.so needs no libcudart.so and
 * no driver; the runtime opens libcuda.so.1 itself on the first call, and
 * the probe turns its failure into "unavailable: <reason>".
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include "../common/describe.h" /* common_numel, common_desc_str, common_op_tensors */
#include "../common/device.h"   /* common_op_name, common_run_args_check, lists */
#include "qkern.h"               /* struct cuda_qgeom (the INT8 ops) */
#include <kiln/plugin.h>          /* the ABI: ops tables, kiln_op, kiln_op_args */
#include <cuda_runtime_api.h>     /* cudaStream_t, cudaError_t */
#include <pthread.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_gemm;
struct cuda_dnn;      /* cudnn.c: a convolution's cuDNN plan */
struct cuda_sdpa;     /* sdpa.c: a fused attention's cuDNN plan */
struct cuda_dnn_ctx;  /* cudnn.c: the cuDNN handle, autotune settings and cache */
struct cuda_rnn;      /* rnn.c: an RNN op's cuDNN descriptors */

/* The record a kernel leaves when it meets bad data (a label outside
 * [0, C), an optimizer step count < 1, bad LAMB offsets), in DEVICE memory
 * (one per context): kernels keep the smallest key (atomicMin on device
 * memory, which is atomic among the GPU's threads; an atomic on mapped
 * host memory is not promised to be, and needs PCIe atomics), so the first
 * bad row is reported whatever the block order; the winner then writes
 * val, op and kind.  The next host sync copies it back on the context's
 * own stream and turns it into a status (kern_err_message in kern.h).
 * key ~0 means no error. */
struct cuda_err_rec {
	unsigned long long key; /* kern_err_key_label / kern_err_key_other */
	long long val;          /* C of a bad label, the bad step count, ... */
	int op;                 /* the enum kiln_op_type that failed */
	int kind;               /* KERN_ERR_* (kern.h) */
};

#define CUDA_ERR_NONE (~0ull)

/* One device context (one per kiln_device_open). */
struct cuda_ctx {
	const struct kiln_host *host;
	int ordinal;
	int sms;                        /* streaming multiprocessors: grid sizes */
	void *lt;                       /* cublasLtHandle_t, shared by every GEMM plan */
	struct cuda_err_rec *err_dev;   /* device memory (see above), passed to kernels */
	void *err_stream;               /* cudaStream_t: reads and clears the record */
	int graph;                      /* [plugin.cuda] graph: captured steps (graph.c) */
	struct kiln_device_options opts; /* the core's [run] options, from open() */
	struct cuda_dnn_ctx *dnn;       /* cudnn.c */
};

struct cuda_plan;

/* A launcher enqueues a plan's kernels on a stream.  It runs on the
 * caller's thread, only enqueues, and returns the launch status
 * (cudaGetLastError or the library status turned into a cudaError_t). */
typedef cudaError_t (*cuda_launch_fn)(const struct cuda_plan *p, const struct kiln_op_args *a,
				      cudaStream_t s);

/* A prepared op: a copy of the op, the sizes its kernels need (fixed at
 * prepare; kernels trust them), and its launcher. */
struct cuda_plan {
	struct kiln_op op;
	int64_t rows, cols;        /* kernel-specific sizes */
	int64_t n;                 /* element count */
	int64_t sz[4];             /* more kernel-specific sizes */
	int n_in, n_out;           /* arguments run() requires to be non-NULL */
	size_t workspace;          /* bytes run() requires in args->workspace */
	int grid;                  /* blocks of grid-stride kernels (from the SM count) */
	struct cuda_err_rec *err;  /* the context's error record (device memory) */
	/* Device scratch the plan owns (reductions' block partials, at most
	 * a few KiB, allocated once in prepare): plugin.h has these ops
	 * report no workspace, as the CPU device does. */
	void *scratch;
	cuda_launch_fn launch;
	struct cuda_gemm *gemm;    /* gemm.c */
	void *lt;                  /* the context's cublasLtHandle_t (gemm.c) */
	float lut[3][256];         /* NORMALIZE_U8: (u/255 - mean)/std per channel */
	struct cuda_dnn *dnn;      /* cudnn.c: convolutions */
	struct cuda_rnn *rnn;      /* rnn.c: cuDNN's RNN descriptors */
	struct cuda_sdpa *sdpa;    /* sdpa.c: the context's cached attention plan (not owned) */
	/* byte offsets into the workspace (qops.c: the INT8 ops' buffers) or
	 * the aux and the plan's scratch (rnn.c) */
	int64_t off[8];
};

/* ---- cuda.c ---- */
const char *cuda_op_name(int type);
/* EINVAL/ENOTSUP naming the op, what is wrong and every tensor it got. */
kiln_status cuda_bad(struct cuda_ctx *c, const struct kiln_op *op, kiln_status st,
		     const char *why);
/* A failed CUDA runtime call: status plus "file:line: call: error". */
kiln_status cuda_fail(struct cuda_ctx *c, kiln_status st, cudaError_t e, const char *call,
		      const char *file, int line);
#define CUDA_TRY(c, call)                                                                 \
	do {                                                                              \
		cudaError_t e_ = (call);                                                  \
		if (e_ != cudaSuccess)                                                    \
			return cuda_fail((c), KILN_EDEVICE, e_, #call, __FILE__, __LINE__); \
	} while (0)

/* ---- graph.c: captured steps, device ops version 3 ([plugin.cuda] graph) ---- */
kiln_status cuda_capture_begin(void *ctx, void *stream);
kiln_status cuda_capture_end(void *ctx, void *stream, void **graph);
kiln_status cuda_graph_launch(void *ctx, void *graph, void *stream);
void cuda_graph_free(void *ctx, void *graph);
/* The cudaStream_t behind a kiln stream of this device (cuda.c). */
cudaStream_t cuda_stream_of(void *stream);

/* ---- ops.c: fill in p->launch and sizes, or set an error through
 * host->error (EINVAL bad shape, ENOTSUP an op or dtype not done here). */
kiln_status cuda_ops_prepare(struct cuda_ctx *c, struct cuda_plan *p);
/* 1 for the op types this device implements (the device table's has_op).
 * A new op: add it here and to the prepare that takes it. */
int cuda_has_op(int type);

/* ---- gemm.c's mapping of kiln's row-major GEMM onto column-major
 * cuBLASLt, as a pure function so that it is tested on any machine
 * (plugins/cuda/gemm_map_test.c, run by tests/gpu/run.sh --prepare)
 * against a row-major reference, with no GPU.
 *
 *   kiln: out0[M,N] = alpha op(in0)[M,K] op(in1)[K,N] + beta out0 (+ bias[N])
 *
 * A row-major [R,C] matrix is the column-major [C,R] one, so the problem
 * is the transposed product out^T[N,M] = op(in1)^T[N,K] op(in0)^T[K,M]:
 * Lt's A is kiln's in1, Lt's B is in0, Lt's D is out0 seen as
 * column-major [N,M] (leading dimension N).  Lt's bias runs along D's rows
 * (N of them), broadcast over its columns: kiln's bias[N] over out's rows.
 *
 *   in1 stored row-major [K,N] (!tb) = col-major [N,K], ld N: used as is
 *       stored row-major [N,K] ( tb) = col-major [K,N], ld K: transposed
 *   in0 stored row-major [M,K] (!ta) = col-major [K,M], ld K: used as is
 *       stored row-major [K,M] ( ta) = col-major [M,K], ld M: transposed
 */
struct cuda_gemm_map {
	/* Lt's A (kiln's in1) and B (kiln's in0): transposed?, the stored
	 * column-major rows, columns and leading dimension */
	int a_trans, b_trans;
	uint64_t a_rows, a_cols, b_rows, b_cols, c_rows, c_cols;
	int64_t lda, ldb, ldc;
};

static inline void cuda_gemm_map(int ta, int tb, int64_t M, int64_t N, int64_t K,
				 struct cuda_gemm_map *g)
{
	g->a_trans = tb != 0;
	g->a_rows = (uint64_t)(tb ? K : N);
	g->a_cols = (uint64_t)(tb ? N : K);
	g->lda = tb ? K : N;
	g->b_trans = ta != 0;
	g->b_rows = (uint64_t)(ta ? M : K);
	g->b_cols = (uint64_t)(ta ? K : M);
	g->ldb = ta ? M : K;
	g->c_rows = (uint64_t)N;
	g->c_cols = (uint64_t)M;
	g->ldc = N;
}


/* ---- gemm.c ---- */
kiln_status cuda_gemm_prepare(struct cuda_ctx *c, struct cuda_plan *p);
void cuda_gemm_free(struct cuda_gemm *g);
kiln_status cuda_lt_create(struct cuda_ctx *c);
void cuda_lt_destroy(struct cuda_ctx *c);

/* ---- cudnn.c: the CNN op set (convolution through cuDNN's graph API,
 * batch norm and pooling through dnn_kernels.cu).  open takes autotune /
 * deterministic from c->opts (the core's [run] options) and reads
 * [plugin.cuda] workspace_mb / conv_wgrad / autotune_cache (the key rows
 * below);
 * prepare handles CONV*, BN_*, POOL*. */
kiln_status cuda_dnn_open(struct cuda_ctx *c, const struct kiln_config *cfg);
void cuda_dnn_close(struct cuda_ctx *c);
kiln_status cuda_dnn_prepare(struct cuda_ctx *c, struct cuda_plan *p);
void cuda_dnn_free(struct cuda_dnn *d);
/* The cuDNN operations of a convolution op (fused: CONV's bias add too),
 * created and finalized without a handle: cuDNN checks the attribute types
 * and the shapes there, so tests/check_cuda_conv.c runs this on machines
 * with cuDNN but no GPU.  (Built with cuDNN only.) */
kiln_status cuda_dnn_conv_check(struct cuda_ctx *c, const struct kiln_op *op, int fused);

/* ---- sdpa.c: ATTENTION / ATTENTION_BWD through cuDNN's fused attention
 * (graph API), or kiln's kernels (attn.cu, prepared by ops.c's
 * cuda_attn_kiln_prepare) where cuDNN does not take the op; KILN_CUDA_ATTN
 * = auto | cudnn | kiln forces a path (plugins/cuda/attn_map.h). */
kiln_status cuda_sdpa_prepare(struct cuda_ctx *c, struct cuda_plan *p);
kiln_status cuda_attn_kiln_prepare(struct cuda_ctx *c, struct cuda_plan *p);
/* The cuDNN operations of an attention op's graph, built and finalized
 * up to the operation graph (which needs a handle, so a GPU): cuDNN checks
 * them on a machine without one (tests/check_cuda_sdpa.c).  trace (n
 * bytes, may be NULL) gets the operations' names in order ("matmul mul
 * index index ge select max ..."), for the test of their order. */
kiln_status cuda_sdpa_check(struct cuda_ctx *c, const struct kiln_op *op, char *trace, size_t n);
#define CUDA_DNN_KEYS                                                                           \
	{ "workspace_mb", KILN_KEY_INT, "1024", 0, 1048576, NULL,                              \
	  "Most device memory one convolution's cuDNN plan may use as workspace, in MiB: "   \
	  "engines needing more are skipped (the planner allocates the workspace; "          \
	  "`kiln memory` counts it)." },                                                      \
	{ "conv_wgrad", KILN_KEY_ENUM, "f32", 0, 0, "f32|lowp",                                 \
	  "A bf16 or f16 convolution's weight gradient.  `f32` (the default): cuDNN's "       \
	  "engine writing an f32 gradient from the bf16/f16 x and dy, else x and dy widened " \
	  "and an f32 convolution (the CPU device's arithmetic: f32 products of the same "    \
	  "values).  `lowp`: where no engine writes the f32 gradient directly, cuDNN's "      \
	  "gradient in the activations' dtype, widened into the f32 gradient after "          \
	  "(PyTorch AMP's semantics: the gradient rounded once to bf16/f16) rather than "     \
	  "widened operands.  Written for ResNet-50's weight gradients, 43% of its "          \
	  "bf16 step on an H200 with `f32`; not yet run on a GPU (docs/gpu.md)." },           \
	{ "autotune_cache", KILN_KEY_STR, "", 0, 0, NULL,                                      \
	  "File of the convolution engines `[run] autotune = 1` chose, keyed by GPU, driver " \
	  "and cuDNN version, so the next run skips the timing; empty = "                     \
	  "$XDG_CACHE_HOME/kiln/cudnn_autotune.bin (else ~/.cache/kiln/...), `none` = no file." },

/* The context's cuDNN handle (created on first use) and the lock that
 * guards its stream: cudnnSetStream and the call that uses it go under
 * the lock (cudnn.c; rnn.c shares it). */
kiln_status cuda_dnn_handle(struct cuda_ctx *c, void **handle, pthread_mutex_t **lock);

/* ---- qops.c: KILN_OP_QCONV and KILN_OP_QLINEAR (ABI 2.6) as an int8
 * im2col and one cuBLASLt int8 GEMM per group, then kiln's epilogue. */
kiln_status cuda_q_prepare(struct cuda_ctx *c, struct cuda_plan *p);
/* gemm.c: the exact int8 GEMM under it, acc s32 [rows, ldc] (row-major)
 * = x s8 [rows, kp] . w s8 [n, kp]^T (CUBLAS_COMPUTE_32I; kp a multiple
 * of 16, ldc of 4, every pointer 16-byte aligned); *ws: Lt's workspace. */
kiln_status cuda_gemm_i8_prepare(struct cuda_ctx *c, struct cuda_plan *p, int64_t rows, int64_t n,
				 int64_t kp, int64_t ldc, size_t *ws);
cudaError_t cuda_gemm_i8_run(const struct cuda_plan *p, const void *x, const void *w, void *acc,
			     void *ws, size_t ws_bytes, cudaStream_t s);

/* ---- rnn.c: KILN_OP_RNN and RNN_BWD (ABI 2.5) through cuDNN's RNN API;
 * aux_bytes: the bytes a training forward leaves for its backward. */
kiln_status cuda_rnn_prepare(struct cuda_ctx *c, struct cuda_plan *p);
void cuda_rnn_free(struct cuda_rnn *r);
size_t cuda_rnn_aux_bytes(const struct cuda_plan *p);

/* ---- int8_kernels.cu: the INT8 ops' kernels (qops.c), over the pure
 * pieces of qkern.h (struct cuda_qgeom: the geometry and its padding). */
/* wq [groups][ogp][kp] = round_half_even(w / sw[o]) in [-63, 63] (0 past
 * the filter; the padding rows are left alone: the caller zeroes them),
 * sc[o] = sx * sw[o], wsum[o] = sum of wq[o] */
cudaError_t cuda_q_weights(const float *w, const struct cuda_qgeom *g, void *wq, float *sc,
			   int32_t *wsum, cudaStream_t s);
/* xq [groups][rowsp][kp]: x's patches quantized (u8 stored as xq - 128;
 * 0 past the rows and the filter) */
cudaError_t cuda_q_im2col(const float *x, const struct cuda_qgeom *g, void *xq, int grid,
			  cudaStream_t s);
/* y = act(sc[o] * (acc + 128 wsum[o] when u8) + b[o]) in x's layout, acc
 * [groups][rowsp][ogp] */
cudaError_t cuda_q_epilogue(const int32_t *acc, const float *sc, const int32_t *wsum,
			    const float *b, const struct cuda_qgeom *g, float *y, int grid,
			    cudaStream_t s);

/* ---- rnn_kernels.cu: the rows' lengths and reading order (rnn.c) ---- */
/* len[b] = the first t with ids[b,t] == pad (T when none; ids NULL: T) */
cudaError_t cuda_rnn_lengths(const int32_t *ids, int32_t pad, int64_t B, int64_t T, int32_t *len,
			     cudaStream_t s);
/* dst[b,t] (=|+=) src[b, reading order t] for t < len[b], else 0 (or
 * nothing when acc): reverse reads len[b]-1-t; its own inverse */
cudaError_t cuda_rnn_gather(float *dst, const float *src, int64_t B, int64_t T, int64_t C,
			    const int32_t *len, int reverse, int acc, int grid, cudaStream_t s);
/* the final hidden state (i[4], last): y[b] = seq[b, len[b]-1] of the
 * sequence in reading order [B,T,H] (0 when len[b] = 0) */
cudaError_t cuda_rnn_last(float *y, const float *seq, int64_t B, int64_t T, int64_t H,
			  const int32_t *len, int grid, cudaStream_t s);
/* its backward: dseq[b,t] = dy[b] at t = len[b]-1, else 0 */
cudaError_t cuda_rnn_last_dy(float *dseq, const float *dy, int64_t B, int64_t T, int64_t H,
			     const int32_t *len, int grid, cudaStream_t s);
/* dst[k] (=|+=) src[k] for k < n: the weight gradients out of cuDNN's */
cudaError_t cuda_rnn_put(float *dst, const float *src, int64_t n, int acc, int grid, cudaStream_t s);

/* ---- bn_pool.c: prepare of batch norm (every BN_* op) and pooling, for
 * dnn_kernels.cu; the slices of a per-channel sum over M elements of C
 * channels, stored as rows (NHWC, [N, C]) or planes (the shape alone
 * fixes them, so results never depend on the GPU). */
kiln_status cuda_bn_prepare(struct cuda_ctx *c, struct cuda_plan *p);
kiln_status cuda_pool_prepare(struct cuda_ctx *c, struct cuda_plan *p);
int cuda_chan_slices(int64_t M, int64_t C, int rows);
/* (rows = 1 also slices the column sums of BIAS_GRAD and LAYERNORM_BWD,
 * kernels.cu: R rows of N columns, K in the plan's sz[1]) */

/* ---- kernels.cu: one launcher per op ---- */
cudaError_t cuda_launch_bias_add(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_bias_grad(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_relu(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_relu_bwd(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_softmax_xent(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_sgd(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_adamw(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_fill(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_reduce_sum(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_scale(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_add(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_mul(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_counter_add(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_lr_schedule(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_normalize_u8(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_cast(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_grad_clip(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_scaler_update(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_act(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_act_bwd(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_dropout(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_attention(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_attention_bwd(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_concat_split(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_reorder(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_lamb(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_embedding(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);
cudaError_t cuda_launch_layernorm(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s);

/* GEMM with an f32 bias into a bf16/f16 output, which cuBLASLt computes
 * into an f32 stage (gemm.c): y (n, dtype) = stage rounded once, or
 * y + stage when acc */
cudaError_t cuda_stage_round(void *y, int dtype, const float *stage, int64_t n, int acc, int grid,
			     cudaStream_t s);

/* Blocks of the reduction kernels (grad-clip and sum partials):
 * a fixed count, so the order of every sum is fixed by the shape alone
 * and results do not change from run to run. */
#define CUDA_RED_BLOCKS 256
/* ... and of the fused loss, a warp a row: 8,192 warps, one per row of
 * GPT-2's 8 x 1024 tokens (256 blocks left 3/4 of an H200's warp slots
 * empty while each warp walked four rows of 50,304 logits) */
#define CUDA_XENT_BLOCKS 1024
#define CUDA_THREADS 256

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_H */
