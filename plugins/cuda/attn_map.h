/* plugins/cuda/attn_map.h - the host-only logic of the CUDA device's
 * fused attention through cuDNN (sdpa.c): kiln's ATTENTION /
 * ATTENTION_BWD operands as cuDNN's [B,H,T,D] tensors (logical dims plus
 * strides into kiln's [B,T,3C] qkv and [B,T,C] y / dy), the decision
 * whether cuDNN's fused scaled-dot-product attention may take an op or
 * kiln's own kernel (attn.cu) must, the path a run forces
 * (KILN_CUDA_ATTN), the plan cache's key, and the backward's workspace.
 *
 * Nothing here includes a CUDA or cuDNN header: these are pure functions,
 * tested on any machine (tests/check_cuda_dnn.c) with no GPU.
 */
#ifndef KILN_CUDA_ATTN_MAP_H
#define KILN_CUDA_ATTN_MAP_H

#include <kiln/plugin.h> /* struct kiln_op */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of cuDNN's graph: logical dims, strides (elements), the
 * element offset of its first element in the kiln buffer it views, and
 * the byte alignment cuDNN may assume of that address (16 at most: kiln's
 * buffers are 16-byte aligned at least). */
struct cuda_sdpa_view {
	int64_t dims[4], strides[4];
	int64_t off;
	int64_t align;
};

/* An ATTENTION (bwd 0) or ATTENTION_BWD op as cuDNN's SDPA graph sees it.
 * With D = C/H, head h of token t of batch b:
 *   q, k, v  [B,H,T,D]  strides { T*3C, D, 3C, 1 }, offsets 0, C, 2C of
 *            qkv (dqkv's dq, dk, dv alike)
 *   kt, vt   k and v transposed, [B,H,D,T], strides { T*3C, D, 1, 3C }
 *   o, dO    [B,H,T,D]  strides { T*C, D, C, 1 } (kiln's y and dy)
 *   stats    [B,H,T,1]  strides { H*T, T, 1, 1 } (kiln's lse)
 *   s, st    the [B,H,T,T] scores and their transpose (virtual)
 *   dq_acc   [B,H,T,D] f32, contiguous (the backward's workspace)
 * The scores are never in memory: only stats, the backward's row sums
 * (softmax_sum, [B,H,T,1] f32) and dq_acc are, in the workspace. */
struct cuda_sdpa_geom {
	int bwd;
	int64_t B, T, C, H, D;
	int dtype;     /* qkv's (and y's, dy's, dqkv's) kiln dtype */
	int esize;     /* its bytes */
	int causal;
	double scale, p;
	int acc;       /* ATTENTION_BWD with KILN_OPF_ACCUMULATE */
	struct cuda_sdpa_view q, k, v, kt, vt, o, stats, s, st, dq_acc;
};

/* Fill g from op (the core has checked its shapes: opcheck.c).  0, or -1
 * with a reason in why for what the mapping cannot express. */
int cuda_sdpa_geom(const struct kiln_op *op, struct cuda_sdpa_geom *g, char *why, size_t n);

/* The element offset of logical index (i0, i1, i2, i3) of view v. */
int64_t cuda_sdpa_at(const struct cuda_sdpa_view *v, int64_t i0, int64_t i1, int64_t i2,
		     int64_t i3);

/* Which path a run of the fused attention takes (KILN_CUDA_ATTN):
 *   auto   cuDNN where it takes the op, kiln's kernel elsewhere (default)
 *   cudnn  cuDNN only: an op cuDNN refuses is refused (KILN_ENOTSUP)
 *   kiln   kiln's kernel only (attn.cu; f32) */
enum { CUDA_ATTN_AUTO, CUDA_ATTN_CUDNN, CUDA_ATTN_KILN };
/* The mode of the variable's value (NULL or "": auto); -1 with why for
 * any other value. */
int cuda_attn_mode(const char *value, char *why, size_t n);

/* Whether cuDNN's fused attention may take g on a GPU of compute
 * capability cc (major*10 + minor) with cuDNN version ver (cudnnGetVersion,
 * e.g. 91900): 1, or 0 with the reason in why.  kiln's side of it: bf16 or
 * f16 tensors (f32 is kiln's kernel's: cuDNN's fused attention has no f32
 * path), no dropout (kiln's mask is DROPOUT's Philox stream, bit for bit,
 * which cuDNN's RNG is not), no accumulation (cuDNN writes dq, dk, dv);
 * cuDNN's documented limits: compute capability 8.0 or later, cuDNN 9.0
 * or later but not 9.10.0 / 9.10.1 (known SDPA bugs), the head dim a
 * multiple of 8 and at most 128.  The heuristics have the last word at
 * prepare (a graph no engine runs is refused there).  cc < 0: kiln's
 * side only (no device asked yet). */
int cuda_sdpa_supported(const struct cuda_sdpa_geom *g, int cc, size_t ver, char *why, size_t n);

/* The key of a plan in the per-shape cache: every property the graph
 * depends on ("SDPA bwd bf16 B 8 T 1024 H 12 D 64 causal 1 scale
 * 0.125"), as text.  Returns its length (truncated like snprintf). */
int cuda_sdpa_key(const struct cuda_sdpa_geom *g, char *buf, size_t n);

/* The backward's workspace beyond cuDNN's own (cudnn_ws bytes, first):
 * softmax_sum f32 [B,H,T] at *off_sum and dq_acc f32 [B,H,T,D] at
 * *off_dq, each 256-byte aligned.  Returns the total bytes.  The forward
 * needs cudnn_ws alone. */
size_t cuda_sdpa_workspace(const struct cuda_sdpa_geom *g, size_t cudnn_ws, size_t *off_sum,
			   size_t *off_dq);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_ATTN_MAP_H */
