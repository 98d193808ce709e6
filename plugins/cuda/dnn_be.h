/* plugins/cuda/dnn_be.h - what cudnn.c (convolution) and sdpa.c (fused
 * attention) share of cuDNN's graph (backend) API: the context's cuDNN
 * part, a plan's descriptors and variant packs, and the helpers that
 * build, choose and run a plan.  C only (gcc); the cuDNN parts exist when
 * configure found cuDNN (KILN_HAVE_CUDNN).
 */
#ifndef KILN_CUDA_DNN_BE_H
#define KILN_CUDA_DNN_BE_H

#include "cuda.h"
#include "dnn_map.h"

#ifndef KILN_HAVE_CUDNN
#define KILN_HAVE_CUDNN 0
#endif
#if KILN_HAVE_CUDNN
#include <cudnn.h>         /* cudnnCreate, cudnnBackend*, cudnnGetVersion */
typedef cudnnHandle_t dnn_handle_t;
#else
typedef void *dnn_handle_t; /* built without cuDNN: convolutions are refused */
#endif
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define DNN_VP 4          /* variant packs kept per plan */
#define DNN_MAX_PTR 16    /* tensors with memory in a plan's variant pack */

/* ---- the context's part ---------------------------------------------- */

struct cuda_dnn_ctx {
	dnn_handle_t h;           /* created by the first convolution's prepare */
	pthread_mutex_t lock;     /* the handle's stream is one per handle */
	int autotune, deterministic;
	int wgrad_lowp;           /* [plugin.cuda] conv_wgrad = lowp */
	int64_t ws_mb;
	char cache_path[4096];    /* "" = no cache file */
	struct cuda_atc atc;
	int atc_loaded;
	/* sdpa.c: the fused attention's plans, one per shape (cuda_sdpa_key),
	 * kept until close; the path KILN_CUDA_ATTN forces (attn_map.h); the
	 * fallback to kiln's kernel logged once */
	struct cuda_sdpa *sdpa;
	pthread_mutex_t sdpa_lock;
	int attn_mode;
	int sdpa_logged;
};

#if KILN_HAVE_CUDNN
/* ---- the plan's part ---------------------------------------------------- */

struct cuda_dnn {
	const struct kiln_host *host;
	struct cuda_dnn_ctx *x;
	cudnnBackendDescriptor_t plan;   /* the execution plan */
	cudnnBackendDescriptor_t *keep;  /* descriptors the plan was built from */
	int n_keep, cap_keep;
	int n_ptr;
	int64_t uid[DNN_MAX_PTR];
	int arg[DNN_MAX_PTR];            /* (k << 8 | i): k = 0 in, 1 out */
	size_t ws;                       /* cuDNN's part of the workspace */
	int bias_kernel;                 /* 1: add b after; 2: db from dy */
	/* CONV_BWD_WEIGHTS of bf16/f16 x and dy when no engine writes an f32
	 * dw from them: x and dy widened into the workspace (at off_x, off_y)
	 * and the f32 convolution run; widen = their dtype, 0 otherwise */
	int widen;
	size_t off_x, off_y;
	int64_t nx, ny;
	/* conv_wgrad = lowp: dw in x's dtype (narrow = that dtype, 0 otherwise)
	 * into the workspace at off_w, widened into the f32 gradient after */
	int narrow;
	size_t off_w;
	int64_t nw;
	int y_dtype;
	struct {
		void *ptr[DNN_MAX_PTR], *ws;
		cudnnBackendDescriptor_t vp;
	} vp[DNN_VP];
	int vp_next;
	char what[64];                   /* for messages: "CONV (engine 12)" */
};

/* A failed cuDNN call of op's prepare: the status (EINVAL, ENOTSUP or
 * EDEVICE by its category) with "file:line: call: error: detail". */
kiln_status cuda_dnn_fail(struct cuda_ctx *c, const struct kiln_op *op, cudnnStatus_t s,
			  const char *call, int line);
/* A new descriptor, kept with d (destroyed by cuda_dnn_free). */
cudnnStatus_t cuda_dnn_mk(struct cuda_dnn *d, cudnnBackendDescriptorType_t type,
			  cudnnBackendDescriptor_t *out);
/* What kiln makes of an engine's numerical notes[n]: DNN_NOTES_NO when
 * one breaks a promise (f32 tensors: TF32 or down-converted inputs; det:
 * a non-deterministic engine), else DNN_NOTES_RPR when it reduces in
 * reduced precision (a convolution never takes it; the fused attention,
 * whose P is rounded to bf16/f16 anyway, takes it when no engine without
 * it builds a plan), else DNN_NOTES_OK. */
enum { DNN_NOTES_NO, DNN_NOTES_OK, DNN_NOTES_RPR };
int cuda_dnn_notes_verdict(const cudnnBackendNumericalNote_t *notes, int64_t n, int f32, int det);
/* The engine behind cfg: its global index and, in *ok, the verdict on its
 * numerical notes (cuda_dnn_notes_verdict). */
cudnnStatus_t cuda_dnn_engine_ok(struct cuda_dnn *d, cudnnBackendDescriptor_t cfg, int f32,
				 int det, int64_t *index, int *ok);
/* An execution plan of cfg and its workspace (NULL when the engine cannot
 * build it). */
cudnnBackendDescriptor_t cuda_dnn_build_plan(struct cuda_dnn_ctx *x, cudnnBackendDescriptor_t cfg,
					     size_t *ws);
/* The heuristics' configurations of graph (mode A, then the fallback
 * list), at most 64 into cfg[]; their count. */
int cuda_dnn_graph_cfgs(struct cuda_dnn *d, cudnnBackendDescriptor_t graph,
			cudnnBackendDescriptor_t *cfg);
/* Run d->plan on stream s with the n_ptr pointers ptr[] (in d->uid's
 * order) and workspace ws: the variant pack of that pointer set is built
 * once and kept (DNN_VP of them, round-robin); the handle's stream is set
 * and the plan executed under the context's lock.  A failure is logged
 * naming the call and d->what. */
cudaError_t cuda_dnn_execute(struct cuda_dnn *d, void *const *ptr, void *ws, cudaStream_t s);
#endif

/* sdpa.c: the fused attention's plans live in the context; close frees
 * them (before the handle). */
void cuda_sdpa_close(struct cuda_dnn_ctx *x);

#endif /* KILN_CUDA_DNN_BE_H */
