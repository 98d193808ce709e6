/* plugins/cuda/cudnn.c - the CNN op set of the CUDA device: convolution
 * (CONV, CONV_BWD_DATA, CONV_BWD_WEIGHTS) through cuDNN 9's graph
 * (backend) API, with autotuning and its persistent cache; batch norm and
 * pooling are prepared in bn_pool.c for kiln's own kernels (dnn_kernels.cu
 * says why).
 *
 * A convolution plan is built once, in prepare:
 *   tensors   x [N,C,H,W], w [O,C/g,KH,KW], y [N,O,OH,OW] as logical dims
 *             plus strides (NCHW or NHWC: dnn_map.c), unique ids 1, 2, 3
 *             (4: the bias [1,O,1,1]; 5: the virtual f32 convolution
 *             output of the fused graph); groups are implied by C / w's C
 *   graph     one convolution operation (forward, backward data or
 *             backward filter) with f32 compute; CONV with a bias is the
 *             graph conv -> pointwise ADD(bias), which cuDNN fuses
 *   engines   heuristics (mode A, then the fallback list); engines are
 *             skipped when their numerical notes break kiln's promises:
 *             TF32 (tensor cores or down-converted inputs on f32 tensors:
 *             f32 convolutions agree with the CPU to f32 rounding, as the
 *             GEMM does), reduced-precision reductions, and with [run]
 *             deterministic = 1 non-deterministic ones; a plan needing
 *             more than [plugin.cuda] workspace_mb is skipped too
 *   choice    without [run] autotune: the first engine left, in the
 *             heuristics' order; with it: each engine left (at most
 *             DNN_TUNE_MAX) timed on scratch buffers, the fastest kept,
 *             and the choice (engine index and knob values) stored in
 *             the cache file keyed by GPU, driver and cuDNN version, so
 *             the next run rebuilds that plan without timing
 * If no engine runs the fused graph, the plan is the convolution alone
 * and kiln's kernel adds the bias after it; CONV_BWD_WEIGHTS's db is
 * always kiln's (a per-channel sum of dy, dnn_kernels.cu).
 *
 * The workspace cuDNN's plan asks for is reported by prepare and comes
 * from the caller at run (the planner owns it; `kiln memory` sees it).
 * run only sets the stream and executes: the variant pack (the pointers)
 * is a finalized descriptor kept per set of pointers (DNN_VP of them,
 * reused round-robin), so steps over a static memory plan allocate
 * nothing after the first.
 *
 * Accumulation (KILN_OPF_ACCUMULATE; on CONV_BWD_WEIGHTS, ABI 2.9) is
 * refused (KILN_ENOTSUP): the caller writes scratch and adds.  (The graph
 * API's wgrad takes no beta; not written.)
 */
#include "cuda.h"
#include "dnn.h"
#include "dnn_be.h" /* struct cuda_dnn, cuda_dnn_ctx; the shared helpers */
#include "dnn_map.h"
#include "attn_map.h" /* cuda_attn_mode */

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The handle attributes of the operation graph and the execution plan are
 * marked deprecated in cuDNN 9 (in favour of device properties, for
 * building plans without a GPU) but are still how a plan gets its handle. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define DNN_WS_ALIGN 256

#define DNN_TUNE_MAX 16   /* engines timed per shape at most */
#define DNN_MAX_CFG 64    /* heuristics results looked at */

static const struct kiln_host *dnn_host;

#if KILN_HAVE_CUDNN
static void keep_all_free(struct cuda_dnn *d)
{
	for (int i = 0; i < d->n_keep; i++)
		if (d->keep[i])
			cudnnBackendDestroyDescriptor(d->keep[i]);
	free(d->keep);
	d->keep = NULL;
	d->n_keep = d->cap_keep = 0;
}

void cuda_dnn_free(struct cuda_dnn *d)
{
	if (!d)
		return;
	for (int i = 0; i < DNN_VP; i++)
		if (d->vp[i].vp)
			cudnnBackendDestroyDescriptor(d->vp[i].vp);
	if (d->plan)
		cudnnBackendDestroyDescriptor(d->plan);
	keep_all_free(d);
	free(d);
}

/* ---- errors ------------------------------------------------------------ */

kiln_status cuda_dnn_fail(struct cuda_ctx *c, const struct kiln_op *op, cudnnStatus_t s,
			    const char *call, int line)
{
	char detail[512];
	detail[0] = 0;
	cudnnGetLastErrorString(detail, sizeof detail);
	const int cat = (int)CUDNN_STATUS_CATEGORY(s);
	const kiln_status st = cat == CUDNN_STATUS_BAD_PARAM ? KILN_EINVAL
			       : cat == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ENOTSUP
								   : KILN_EDEVICE;
	char why[900];
	snprintf(why, sizeof why, "%s:%d: %s: %s%s%s", __FILE__, line, call, cudnnGetErrorString(s),
		 detail[0] ? ": " : "", detail);
	return cuda_bad(c, op, st, why);
}

#define DNN_TRY(call)                                                   \
	do {                                                            \
		cudnnStatus_t s_ = (call);                              \
		if (s_ != CUDNN_STATUS_SUCCESS) {                       \
			st = cuda_dnn_fail(c, op, s_, #call, __LINE__);      \
			goto out;                                       \
		}                                                       \
	} while (0)

/* ---- descriptor helpers ---------------------------------------------- */

static cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
			 cudnnBackendAttributeType_t t, int64_t n, const void *v)
{
	return cudnnBackendSetAttribute(d, a, t, n, v);
}

/* a new descriptor, kept with the plan (freed with it) */
cudnnStatus_t cuda_dnn_mk(struct cuda_dnn *d, cudnnBackendDescriptorType_t type,
			cudnnBackendDescriptor_t *out)
{
	*out = NULL;
	if (d->n_keep == d->cap_keep) {
		const int cap = d->cap_keep ? 2 * d->cap_keep : 32;
		cudnnBackendDescriptor_t *k = realloc(d->keep, (size_t)cap * sizeof *k);
		if (!k)
			return CUDNN_STATUS_ALLOC_FAILED;
		d->keep = k, d->cap_keep = cap;
	}
	cudnnStatus_t s = cudnnBackendCreateDescriptor(type, out);
	if (s == CUDNN_STATUS_SUCCESS)
		d->keep[d->n_keep++] = *out;
	return s;
}

static cudnnDataType_t dnn_dt(int dt)
{
	return dt == KILN_BF16 ? CUDNN_DATA_BFLOAT16 : dt == KILN_F16 ? CUDNN_DATA_HALF
								   : CUDNN_DATA_FLOAT;
}

static cudnnStatus_t mk_tensor(struct cuda_dnn *d, cudnnBackendDescriptor_t *t, int64_t uid,
			       int dtype, const int64_t dims[4], const int64_t strides[4],
			       bool virt)
{
	const cudnnDataType_t dt = dnn_dt(dtype);
	/* kiln promises 64-byte aligned buffers; the planner's views keep 16 */
	const int64_t align = 16;
	cudnnStatus_t s;
	if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_TENSOR_DESCRIPTOR, t)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align)) ||
	    (s = set(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt)))
		return s;
	return cudnnBackendFinalize(*t);
}

/* What kiln makes of an engine's numerical notes (dnn_be.h) */
int cuda_dnn_notes_verdict(const cudnnBackendNumericalNote_t *notes, int64_t n, int f32, int det)
{
	int v = DNN_NOTES_OK;
	for (int64_t i = 0; i < n; i++) {
		if ((f32 && (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
			     notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) ||
		    (det && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
			return DNN_NOTES_NO;
		if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
			v = DNN_NOTES_RPR;
	}
	return v;
}

/* the engine behind a config: its global index and the verdict on its
 * notes (cuda_dnn_notes_verdict) */
cudnnStatus_t cuda_dnn_engine_ok(struct cuda_dnn *d, cudnnBackendDescriptor_t cfg, int f32,
			       int det, int64_t *index, int *ok)
{
	cudnnBackendDescriptor_t e;
	cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
	int64_t n = 0;
	cudnnStatus_t s;
	*ok = DNN_NOTES_NO;
	if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e)) ||
	    (s = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e)) ||
	    (s = cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
					  index)) ||
	    (s = cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
					  CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
					  &n, notes)))
		return s;
	*ok = cuda_dnn_notes_verdict(notes, n < CUDNN_NUMERICAL_NOTE_TYPE_COUNT ? n
							: CUDNN_NUMERICAL_NOTE_TYPE_COUNT, f32, det);
	return CUDNN_STATUS_SUCCESS;
}

/* an execution plan of cfg (NULL when the engine cannot build it) */
cudnnBackendDescriptor_t cuda_dnn_build_plan(struct cuda_dnn_ctx *x, cudnnBackendDescriptor_t cfg,
					   size_t *ws)
{
	cudnnBackendDescriptor_t p = NULL;
	int64_t w = 0, n = 0;
	if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p))
		return NULL;
	if (set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &x->h) ||
	    set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) ||
	    cudnnBackendFinalize(p) ||
	    cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
				     &n, &w) ||
	    w < 0) {
		cudnnBackendDestroyDescriptor(p);
		return NULL;
	}
	*ws = (size_t)w;
	return p;
}

/* the variant pack of one set of pointers */
static cudnnStatus_t mk_vp(const struct cuda_dnn *d, void *const *ptr, void *ws,
			   cudnnBackendDescriptor_t *out)
{
	cudnnBackendDescriptor_t v = NULL;
	cudnnStatus_t s;
	*out = NULL;
	if ((s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &v)))
		return s;
	if ((s = set(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, d->n_ptr, d->uid)) ||
	    (s = set(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, d->n_ptr, ptr)) ||
	    (s = set(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ||
	    (s = cudnnBackendFinalize(v))) {
		cudnnBackendDestroyDescriptor(v);
		return s;
	}
	*out = v;
	return CUDNN_STATUS_SUCCESS;
}

/* ---- the knobs of a configuration, for the cache ------------------------ */

static cudnnStatus_t cfg_knobs(struct cuda_dnn *d, cudnnBackendDescriptor_t cfg,
			       struct cuda_atc_entry *e)
{
	cudnnBackendDescriptor_t k[CUDA_ATC_KNOBS];
	int64_t n = 0, got = 0;
	cudnnStatus_t s;
	for (int i = 0; i < CUDA_ATC_KNOBS; i++)
		if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &k[i])))
			return s;
	if ((s = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDA_ATC_KNOBS, &n, k)))
		return s;
	e->n_knobs = 0;
	for (int64_t i = 0; i < n && i < CUDA_ATC_KNOBS; i++) {
		cudnnBackendKnobType_t t;
		int64_t v;
		if ((s = cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
						  CUDNN_TYPE_KNOB_TYPE, 1, &got, &t)) ||
		    (s = cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
						  CUDNN_TYPE_INT64, 1, &got, &v)))
			return s;
		e->knob_type[e->n_knobs] = (int32_t)t;
		e->knob_value[e->n_knobs++] = v;
	}
	return CUDNN_STATUS_SUCCESS;
}

/* the configuration a cache entry names, on graph g */
static cudnnStatus_t cfg_from_entry(struct cuda_dnn *d, cudnnBackendDescriptor_t g,
				    const struct cuda_atc_entry *e, cudnnBackendDescriptor_t *cfg)
{
	cudnnBackendDescriptor_t eng, k[CUDA_ATC_KNOBS];
	cudnnStatus_t s;
	if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng)) ||
	    (s = set(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g)) ||
	    (s = set(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e->engine)) ||
	    (s = cudnnBackendFinalize(eng)))
		return s;
	for (uint32_t i = 0; i < e->n_knobs; i++) {
		const cudnnBackendKnobType_t t = (cudnnBackendKnobType_t)e->knob_type[i];
		if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &k[i])) ||
		    (s = set(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &t)) ||
		    (s = set(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
			     &e->knob_value[i])) ||
		    (s = cudnnBackendFinalize(k[i])))
			return s;
	}
	if ((s = cuda_dnn_mk(d, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, cfg)) ||
	    (s = set(*cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eng)) ||
	    (e->n_knobs && (s = set(*cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
				    CUDNN_TYPE_BACKEND_DESCRIPTOR, e->n_knobs, k))))
		return s;
	return cudnnBackendFinalize(*cfg);
}

/* ---- autotune --------------------------------------------------------- */

/* scratch buffers for timing: one per variant-pack pointer */
struct tune_bufs {
	void *p[4];
	size_t bytes[4];
};

static float time_plan(struct cuda_dnn *d, cudnnBackendDescriptor_t plan, size_t ws_bytes,
		       struct tune_bufs *b, cudaStream_t s)
{
	void *ws = NULL;
	cudnnBackendDescriptor_t vp = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	float ms[3] = { -1, -1, -1 }, best = -1;
	if ((ws_bytes && cudaMalloc(&ws, ws_bytes) != cudaSuccess) || mk_vp(d, b->p, ws, &vp) ||
	    cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
		goto out;
	/* one warm-up run (loads kernels, compiles runtime-fused ones), then three */
	if (cudnnBackendExecute(d->x->h, plan, vp))
		goto out;
	for (int r = 0; r < 3; r++) {
		if (cudaEventRecord(e0, s) != cudaSuccess || cudnnBackendExecute(d->x->h, plan, vp) ||
		    cudaEventRecord(e1, s) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
		    cudaEventElapsedTime(&ms[r], e0, e1) != cudaSuccess)
			goto out;
	}
	/* the median of three */
	best = ms[0] > ms[1] ? (ms[1] > ms[2] ? ms[1] : ms[0] > ms[2] ? ms[2] : ms[0])
			     : (ms[0] > ms[2] ? ms[0] : ms[1] > ms[2] ? ms[2] : ms[1]);
out:
	cudaStreamSynchronize(s);
	cudaGetLastError(); /* a failed candidate is skipped, not sticky */
	if (vp)
		cudnnBackendDestroyDescriptor(vp);
	if (ws)
		cudaFree(ws);
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	return best;
}

static uint32_t crc_host(uint32_t crc, const void *buf, size_t n)
{
	return dnn_host->crc32c(crc, buf, n);
}

/* this machine's key of the cache file: GPU model, driver, cuDNN (dnn_map.h) */
static void device_key(struct cuda_ctx *c, char *buf, size_t n)
{
	struct cudaDeviceProp pr;
	int drv = 0;
	memset(&pr, 0, sizeof pr);
	cudaGetDeviceProperties(&pr, c->ordinal);
	cudaDriverGetVersion(&drv);
	cuda_atc_device_string(buf, n, pr.name, pr.major, pr.minor, pr.multiProcessorCount, drv,
			       cudnnGetVersion());
}

static void cache_load(struct cuda_ctx *c, struct cuda_dnn_ctx *x)
{
	char why[600];
	if (x->atc_loaded || !x->cache_path[0])
		return;
	x->atc_loaded = 1;
	device_key(c, x->atc.device, sizeof x->atc.device);
	const int r = cuda_atc_load(&x->atc, x->cache_path, crc_host, why, sizeof why);
	if (r < 0)
		c->host->log(KILN_LOG_WARN, "cuda", "autotune cache ignored (%s); it will be rewritten",
			     why);
	else if (r > 0)
		c->host->log(KILN_LOG_INFO, "cuda", "autotune cache %s is another machine's (%s); it will be rewritten",
			     x->cache_path, why);
	else
		c->host->log(KILN_LOG_DEBUG, "cuda", "autotune cache %s: %zu entries", x->cache_path,
			     x->atc.n);
}

/* ---- convolution prepare ---------------------------------------------- */

static const void *arg_ptr(const struct kiln_op_args *a, int arg)
{
	return (arg >> 8) ? a->out[arg & 0xff] : a->in[arg & 0xff];
}

cudaError_t cuda_dnn_execute(struct cuda_dnn *d, void *const *ptr, void *ws, cudaStream_t s)
{
	const size_t bytes = (size_t)d->n_ptr * sizeof *ptr;
	int slot = -1;
	for (int k = 0; k < DNN_VP && slot < 0; k++)
		if (d->vp[k].vp && d->vp[k].ws == ws && !memcmp(d->vp[k].ptr, ptr, bytes))
			slot = k;
	if (slot < 0) {
		/* new pointers: the one host allocation of this plan's pointer set */
		slot = d->vp_next;
		d->vp_next = (d->vp_next + 1) % DNN_VP;
		if (d->vp[slot].vp)
			cudnnBackendDestroyDescriptor(d->vp[slot].vp);
		d->vp[slot].vp = NULL;
		cudnnStatus_t st = mk_vp(d, ptr, ws, &d->vp[slot].vp);
		if (st) {
			d->host->log(KILN_LOG_ERROR, "cuda", "%s: variant pack: %s", d->what,
				     cudnnGetErrorString(st));
			return cudaErrorInvalidValue;
		}
		memcpy(d->vp[slot].ptr, ptr, bytes);
		d->vp[slot].ws = ws;
	}
	pthread_mutex_lock(&d->x->lock);
	cudnnStatus_t st = cudnnSetStream(d->x->h, s);
	const char *call = "cudnnSetStream";
	if (!st)
		st = cudnnBackendExecute(d->x->h, d->plan, d->vp[slot].vp), call = "cudnnBackendExecute";
	pthread_mutex_unlock(&d->x->lock);
	if (st) {
		char detail[400];
		detail[0] = 0;
		cudnnGetLastErrorString(detail, sizeof detail);
		d->host->log(KILN_LOG_ERROR, "cuda", "%s: %s: %s %s", d->what, call,
			     cudnnGetErrorString(st), detail);
		return cudaErrorLaunchFailure;
	}
	return cudaSuccess;
}

static cudaError_t dnn_conv_launch(const struct cuda_plan *p, const struct kiln_op_args *a,
				   cudaStream_t s)
{
	struct cuda_dnn *d = p->dnn;
	void *ptr[DNN_MAX_PTR] = { 0 };
	for (int i = 0; i < d->n_ptr; i++)
		ptr[i] = (void *)arg_ptr(a, d->arg[i]);
	if (d->widen) { /* x (uid 1) and dy (uid 3) as f32 copies in the workspace */
		ptr[0] = (char *)a->workspace + d->off_x;
		ptr[2] = (char *)a->workspace + d->off_y;
		cudaError_t e = cuda_dnn_widen(ptr[0], a->in[0], d->nx, d->widen, s);
		if (e == cudaSuccess)
			e = cuda_dnn_widen(ptr[2], a->in[1], d->ny, d->widen, s);
		if (e != cudaSuccess)
			return e;
	}
	float *dw = NULL;
	if (d->narrow) { /* dw (uid 2) in x's dtype in the workspace, widened after */
		dw = ptr[1];
		ptr[1] = (char *)a->workspace + d->off_w;
	}
	cudaError_t e = cuda_dnn_execute(d, ptr, a->workspace, s);
	if (e == cudaSuccess && dw)
		e = cuda_dnn_widen(dw, ptr[1], d->nw, d->narrow, s);
	if (e != cudaSuccess)
		return e;
	if (d->bias_kernel == 1) /* CONV: y += b */
		return cuda_dnn_bias(p, a->out[0], NULL, (float *)a->in[2], d->y_dtype, 0, NULL, s);
	if (d->bias_kernel == 2) /* CONV_BWD_WEIGHTS: db = sum of dy */
		return cuda_dnn_bias(p, NULL, a->in[1], (float *)a->out[1], d->y_dtype, 1,
				     (char *)a->workspace + p->sz[2], s);
	return cudaGetLastError();
}

static kiln_status dnn_handle(struct cuda_ctx *c)
{
	struct cuda_dnn_ctx *x = c->dnn;
	if (x->h)
		return KILN_OK;
	cudnnStatus_t s = cudnnCreate(&x->h);
	if (s != CUDNN_STATUS_SUCCESS) {
		char detail[400];
		detail[0] = 0;
		cudnnGetLastErrorString(detail, sizeof detail);
		x->h = NULL;
		return c->host->error(KILN_EDEVICE, "cuda: %s:%d: cudnnCreate: %s %s (is libcudnn.so.9 with its engine libraries on the library path?)",
				      __FILE__, __LINE__, cudnnGetErrorString(s), detail);
	}
	c->host->log(KILN_LOG_DEBUG, "cuda", "cuDNN %zu (built against %d.%d.%d)", cudnnGetVersion(),
		     CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
	return KILN_OK;
}

kiln_status cuda_dnn_handle(struct cuda_ctx *c, void **handle, pthread_mutex_t **lock)
{
	kiln_status st = dnn_handle(c);
	if (!st) {
		*handle = c->dnn->h;
		*lock = &c->dnn->lock;
	}
	return st;
}

/* Build the operation graph of g into d (fused: with the bias add); with
 * graph NULL only the operations (no handle needed, so no GPU). */
static kiln_status conv_graph(struct cuda_ctx *c, const struct kiln_op *op, struct cuda_dnn *d,
			      const struct cuda_conv_geom *g, int fused,
			      cudnnBackendDescriptor_t *graph)
{
	kiln_status st = KILN_OK;
	cudnnBackendDescriptor_t tx, tw, ty, tb = NULL, tv = NULL, conv, cop, pw, pop;
	const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
	const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
	const int64_t sdims = 2;
	const float alpha = 1.0f, beta = 0.0f;
	const int type = g->type;
	DNN_TRY(mk_tensor(d, &tx, 1, g->dt_x, g->x, g->xs, false));
	DNN_TRY(mk_tensor(d, &tw, 2, g->dt_w, g->w, g->ws, false));
	DNN_TRY(mk_tensor(d, &ty, 3, g->dt_y, g->y, g->ys, false));
	if (fused) {
		const int64_t bd[4] = { 1, g->y[1], 1, 1 }, bs[4] = { g->y[1], 1, 1, 1 };
		DNN_TRY(mk_tensor(d, &tb, 4, KILN_F32, bd, bs, false));
		DNN_TRY(mk_tensor(d, &tv, 5, KILN_F32, g->y, g->ys, true));
	}
	DNN_TRY(cuda_dnn_mk(d, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sdims));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, g->dil));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, g->stride));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, g->pad));
	DNN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, g->pad));
	DNN_TRY(cudnnBackendFinalize(conv));
	/* the operation of each op type and its attributes: x, w, y, conv
	 * desc, alpha, beta (the backward ops name dx / dw / dy) */
	static const struct {
		cudnnBackendDescriptorType_t desc;
		cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
	} opd[3] = {
		{ CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA },
		{ CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA },
		{ CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
		  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA },
	};
	const int t = type - KILN_OP_CONV;
	const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
	DNN_TRY(cuda_dnn_mk(d, opd[t].desc, &cop));
	DNN_TRY(set(cop, opd[t].x, D, 1, &tx));
	DNN_TRY(set(cop, opd[t].w, D, 1, &tw));
	/* the forward's output is the virtual tensor the bias add reads */
	DNN_TRY(set(cop, opd[t].y, D, 1, fused ? &tv : &ty));
	DNN_TRY(set(cop, opd[t].conv, D, 1, &conv));
	DNN_TRY(set(cop, opd[t].alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
	DNN_TRY(set(cop, opd[t].beta, CUDNN_TYPE_FLOAT, 1, &beta));
	DNN_TRY(cudnnBackendFinalize(cop));
	cudnnBackendDescriptor_t ops[2] = { cop, NULL };
	int n_ops = 1;
	if (fused) {
		const cudnnPointwiseMode_t add = CUDNN_POINTWISE_ADD;
		DNN_TRY(cuda_dnn_mk(d, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
		DNN_TRY(set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &add));
		DNN_TRY(set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &comp));
		DNN_TRY(cudnnBackendFinalize(pw));
		DNN_TRY(cuda_dnn_mk(d, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &pop));
		DNN_TRY(set(pop, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
		DNN_TRY(set(pop, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tv));
		DNN_TRY(set(pop, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tb));
		DNN_TRY(set(pop, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
		DNN_TRY(cudnnBackendFinalize(pop));
		ops[n_ops++] = pop;
	}
	if (!graph) /* cuda_dnn_conv_check: the operations only */
		goto out;
	DNN_TRY(cuda_dnn_mk(d, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
	DNN_TRY(set(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->dnn->h));
	DNN_TRY(set(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, ops));
	DNN_TRY(cudnnBackendFinalize(*graph));
out:
	return st;
}

/* The engine configurations of graph, heuristics mode A then the
 * fallback list, in order: up to DNN_MAX_CFG into cfg[]. */
int cuda_dnn_graph_cfgs(struct cuda_dnn *d, cudnnBackendDescriptor_t graph,
		      cudnnBackendDescriptor_t *cfg)
{
	static const cudnnBackendHeurMode_t modes[2] = { CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK };
	int n = 0;
	for (int m = 0; m < 2 && n < DNN_MAX_CFG; m++) {
		cudnnBackendDescriptor_t h;
		int64_t count = 0;
		if (cuda_dnn_mk(d, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &h) ||
		    set(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
		    set(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]) ||
		    cudnnBackendFinalize(h) ||
		    cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS,
					     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL))
			continue;
		if (count > DNN_MAX_CFG - n)
			count = DNN_MAX_CFG - n;
		int ok = 1;
		for (int64_t i = 0; i < count && ok; i++)
			ok = cuda_dnn_mk(d, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[n + i]) == CUDNN_STATUS_SUCCESS;
		int64_t got = 0;
		if (!ok || cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS,
						    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
						    &cfg[n]))
			continue;
		n += (int)got;
	}
	return n;
}

/* Choose a plan for graph into d->plan (and d->ws); 0 when none passed.
 * cnt[]: the heuristics' configurations, those skipped for their notes,
 * those whose plan failed to build, those over workspace_mb (for the
 * message when none passed). */
static int choose(struct cuda_ctx *c, struct cuda_dnn *d, cudnnBackendDescriptor_t graph,
		  const struct cuda_conv_geom *g, const char *key, struct tune_bufs *bufs,
		  int64_t *engine, int cnt[4])
{
	struct cuda_dnn_ctx *x = c->dnn;
	const size_t limit = (size_t)x->ws_mb << 20;
	const int f32 = g->dt_x == KILN_F32;
	cudnnBackendDescriptor_t cfg[DNN_MAX_CFG];
	/* the cached choice */
	if (x->autotune && x->cache_path[0]) {
		cache_load(c, x);
		const struct cuda_atc_entry *e = cuda_atc_find(&x->atc, key);
		cudnnBackendDescriptor_t one;
		if (e && !cfg_from_entry(d, graph, e, &one) && (d->plan = cuda_dnn_build_plan(x, one, &d->ws))) {
			if (d->ws <= limit) {
				*engine = e->engine;
				return 1;
			}
			cudnnBackendDestroyDescriptor(d->plan);
			d->plan = NULL;
		}
	}
	const int n = cuda_dnn_graph_cfgs(d, graph, cfg);
	cudaStream_t s = NULL;
	float best_ms = -1;
	int tried = 0, best = -1;
	cnt[0] = n, cnt[1] = cnt[2] = cnt[3] = 0;
	for (int i = 0; i < n; i++) {
		int64_t idx = -1;
		int ok = 0;
		size_t ws = 0;
		/* a convolution keeps its f32 accumulation: no reduced-precision
		 * reduction, ever */
		if (cuda_dnn_engine_ok(d, cfg[i], f32, x->deterministic, &idx, &ok) ||
		    ok != DNN_NOTES_OK) {
			cnt[1]++;
			continue;
		}
		cudnnBackendDescriptor_t p = cuda_dnn_build_plan(x, cfg[i], &ws);
		if (!p) {
			cnt[2]++;
			continue;
		}
		if (ws > limit) {
			cudnnBackendDestroyDescriptor(p);
			cnt[3]++;
			continue;
		}
		if (!x->autotune) { /* the heuristics' first choice that passed */
			d->plan = p, d->ws = ws, *engine = idx;
			return 1;
		}
		if (!s && (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
			   cudnnSetStream(x->h, s))) {
			cudnnBackendDestroyDescriptor(p);
			break;
		}
		const float ms = time_plan(d, p, ws, bufs, s);
		tried++;
		if (ms >= 0 && (best < 0 || ms < best_ms)) {
			if (d->plan)
				cudnnBackendDestroyDescriptor(d->plan);
			d->plan = p, d->ws = ws, best = i, best_ms = ms, *engine = idx;
		} else {
			cudnnBackendDestroyDescriptor(p);
		}
		if (tried >= DNN_TUNE_MAX)
			break;
	}
	if (s) {
		/* the timing stream goes; runs set theirs (cudnnSetStream per run) */
		cudnnSetStream(x->h, NULL);
		cudaStreamDestroy(s);
	}
	if (best < 0)
		return 0;
	c->host->log(KILN_LOG_DEBUG, "cuda", "autotune %s: engine %lld, %.3f ms, %zu bytes (%d timed)",
		     key, (long long)*engine, best_ms, d->ws, tried);
	if (x->cache_path[0]) {
		struct cuda_atc_entry *e = calloc(1, sizeof *e);
		char why[600] = "out of memory"; /* cuda_atc_put sets no message */
		if (e && strlen(key) < sizeof e->key && !cfg_knobs(d, cfg[best], e)) {
			strcpy(e->key, key);
			e->engine = *engine;
			e->workspace = (int64_t)d->ws;
			e->ms = best_ms;
			if (cuda_atc_put(&x->atc, e) ||
			    cuda_atc_save(&x->atc, x->cache_path, crc_host, why, sizeof why))
				c->host->log(KILN_LOG_WARN, "cuda", "autotune cache not saved: %s",
					     why);
		}
		free(e);
	}
	return 1;
}

static void tune_bufs_free(struct tune_bufs *b)
{
	for (int i = 0; i < 4; i++)
		if (b->p[i])
			cudaFree(b->p[i]);
	memset(b, 0, sizeof *b);
}

/* [plugin.cuda] conv_wgrad = lowp: the weight gradient's graph with dw in
 * x's dtype (PyTorch AMP's), dw then widened by dnn_conv_launch; 1 when an
 * engine took it (d->narrow set), 0 to go on as conv_wgrad = f32. */
static int wgrad_narrow(struct cuda_ctx *c, const struct kiln_op *op, struct cuda_dnn *d,
			const struct cuda_conv_geom *g, struct tune_bufs *bufs, int64_t *engine,
			int cnt[4])
{
	struct cuda_conv_geom g16 = *g;
	char k16[CUDA_ATC_KEY];
	cudnnBackendDescriptor_t graph;
	g16.dt_w = g->dt_x;
	cuda_conv_key(&g16, c->dnn->deterministic, c->dnn->ws_mb, k16, sizeof k16);
	d->n_ptr = 3;
	d->bias_kernel = g->bias ? 2 : 0;
	const kiln_status st = conv_graph(c, op, d, &g16, 0, &graph);
	const int found = !st && choose(c, d, graph, &g16, k16, bufs, engine, cnt);
	if (found) {
		d->narrow = g->dt_x;
		d->nw = g->w[0] * g->w[1] * g->w[2] * g->w[3];
	} else if (st) {
		c->host->log(KILN_LOG_DEBUG, "cuda",
			     "%s: conv_wgrad = lowp: the graph with dw in the activations' dtype was refused (%s): as conv_wgrad = f32",
			     k16, c->host->last_error());
	} else {
		c->host->log(KILN_LOG_DEBUG, "cuda",
			     "%s: conv_wgrad = lowp: no engine writes dw in the activations' dtype (%d engine configs, %d refused by their notes, %d not buildable, %d over the workspace): as conv_wgrad = f32",
			     k16, cnt[0], cnt[1], cnt[2], cnt[3]);
	}
	memset(cnt, 0, 4 * sizeof *cnt); /* the next graph's counts */
	return found;
}

static kiln_status conv_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	struct cuda_conv_geom g;
	char why[400], key[CUDA_ATC_KEY];
	kiln_status st = KILN_OK;
	struct tune_bufs bufs;
	memset(&bufs, 0, sizeof bufs);
	if (cuda_conv_geom(op, &g, why, sizeof why))
		return cuda_bad(c, op, KILN_EINVAL, why);
	if (op->flags & KILN_OPF_ACCUMULATE)
		return cuda_bad(c, op, KILN_ENOTSUP, "cannot accumulate (write to scratch and add)");
	const int lowp = g.dt_x == KILN_BF16 || g.dt_x == KILN_F16;
	const int want_w = op->type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : g.dt_x;
	if ((g.dt_x != KILN_F32 && !lowp) || g.dt_y != g.dt_x || g.dt_w != want_w ||
	    (g.bias && (op->type == KILN_OP_CONV ? op->in[2].dtype : op->out[1].dtype) != KILN_F32))
		return cuda_bad(c, op, KILN_ENOTSUP,
				"f32, bf16 or f16 activations and weights of one dtype, an f32 bias (weight and bias gradients f32)");
	if ((st = dnn_handle(c)))
		return st;
	struct cuda_dnn *d = calloc(1, sizeof *d);
	if (!d)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for a convolution plan");
	p->dnn = d; /* freed with the plan, on failure too */
	d->host = c->host;
	d->x = c->dnn;
	d->y_dtype = g.dt_y;
	snprintf(d->what, sizeof d->what, "%s", cuda_op_name(op->type));
	cuda_conv_key(&g, c->dnn->deterministic, c->dnn->ws_mb, key, sizeof key);

	/* scratch buffers for timing (autotune only): x, w, y, bias */
	if (c->dnn->autotune) {
		const int64_t nx = g.x[0] * g.x[1] * g.x[2] * g.x[3];
		const int64_t nw = g.w[0] * g.w[1] * g.w[2] * g.w[3];
		const int64_t ny = g.y[0] * g.y[1] * g.y[2] * g.y[3];
		/* f32-sized: the widened graph below may be timed on them too */
		const size_t bytes[4] = { (size_t)nx * 4, (size_t)nw * 4, (size_t)ny * 4,
					  (size_t)g.y[1] * 4 };
		for (int i = 0; i < 4; i++) {
			cudaError_t e = cudaMalloc(&bufs.p[i], bytes[i]);
			if (e == cudaSuccess)
				e = cudaMemset(bufs.p[i], 0, bytes[i]);
			if (e != cudaSuccess) {
				st = cuda_fail(c, KILN_EDEVICE, e, "cudaMalloc (autotune scratch)",
					       __FILE__, __LINE__);
				goto out;
			}
		}
	}
	/* the variant pack's order: x, w, y (, bias) */
	d->uid[0] = 1, d->uid[1] = 2, d->uid[2] = 3, d->uid[3] = 4;
	d->arg[0] = g.arg_x, d->arg[1] = g.arg_w, d->arg[2] = g.arg_y, d->arg[3] = g.arg_b;
	int64_t engine = -1;
	int found = 0, cnt[4] = { 0, 0, 0, 0 };
	cudnnBackendDescriptor_t graph;
	if (op->type == KILN_OP_CONV && g.bias) { /* conv + bias, fused */
		char fkey[CUDA_ATC_KEY];
		snprintf(fkey, sizeof fkey, "%.240s fused", key);
		d->n_ptr = 4;
		if (!conv_graph(c, op, d, &g, 1, &graph))
			found = choose(c, d, graph, &g, fkey, &bufs, &engine, cnt);
	}
	const int widenable = op->type == KILN_OP_CONV_BWD_WEIGHTS && lowp;
	if (!found) {
		d->n_ptr = 3;
		d->bias_kernel = !g.bias ? 0 : op->type == KILN_OP_CONV ? 1 : 2;
		st = conv_graph(c, op, d, &g, 0, &graph);
		if (!st)
			found = choose(c, d, graph, &g, key, &bufs, &engine, cnt);
		else if (!widenable)
			goto out;
		/* why the mixed graph (bf16/f16 x, dy -> f32 dw) found no engine:
		 * for the next GPU session (ResNet-50's widened weight gradients
		 * took 43% of its step on an H200) */
		if (!found && widenable)
			c->host->log(KILN_LOG_DEBUG, "cuda",
				     "%s: the mixed graph %s: %d engine configs, %d refused by their notes, %d not buildable, %d over the workspace",
				     key, st ? "was refused" : "has no engine", cnt[0], cnt[1], cnt[2], cnt[3]);
		st = KILN_OK;
		memset(cnt, 0, sizeof cnt); /* the next graph's counts */
	}
	/* conv_wgrad = lowp: dw in x's dtype, widened after, rather than
	 * widened operands (where no engine writes the f32 dw directly) */
	if (!found && widenable && c->dnn->wgrad_lowp)
		found = wgrad_narrow(c, op, d, &g, &bufs, &engine, cnt);
	if (!found && widenable) {
		/* no engine writes an f32 dw from bf16/f16 x, dy (or cuDNN refused
		 * the mixed graph): widen them and run the f32 convolution, whose
		 * f32 products of the same values are what the op promises */
		struct cuda_conv_geom g32 = g;
		char k32[CUDA_ATC_KEY];
		g32.dt_x = g32.dt_y = KILN_F32;
		cuda_conv_key(&g32, c->dnn->deterministic, c->dnn->ws_mb, k32, sizeof k32);
		if ((st = conv_graph(c, op, d, &g32, 0, &graph)))
			goto out;
		found = choose(c, d, graph, &g32, k32, &bufs, &engine, cnt);
		d->widen = g.dt_x;
		d->nx = g.x[0] * g.x[1] * g.x[2] * g.x[3];
		d->ny = g.y[0] * g.y[1] * g.y[2] * g.y[3];
	}
	if (!found) {
		snprintf(why, sizeof why,
			 "no cuDNN engine runs this convolution within workspace_mb = %lld%s%s (%d configurations from the heuristics: %d skipped for their numerical notes, %d failed to build a plan, %d over the workspace)",
			 (long long)c->dnn->ws_mb, g.dt_x == KILN_F32 ? " without TF32" : "",
			 c->dnn->deterministic ? " deterministically" : "", cnt[0], cnt[1], cnt[2],
			 cnt[3]);
		st = cuda_bad(c, op, KILN_ENOTSUP, why);
		goto out;
	}
	snprintf(d->what, sizeof d->what, "%s (engine %lld)", cuda_op_name(op->type),
		 (long long)engine);
	/* sizes of the bias kernels (dnn.h): y's N, O, OH*OW */
	p->rows = g.y[0], p->cols = g.y[1], p->n = g.y[2] * g.y[3];
	p->sz[0] = g.nhwc;
	p->sz[1] = cuda_chan_slices(g.y[0] * g.y[2] * g.y[3], g.y[1], g.nhwc);
	/* workspace: [cuDNN's | widened x | widened dy | dw in x's dtype | db
	 * partials], aligned */
#define WS_UP(n) (((n) + DNN_WS_ALIGN - 1) / DNN_WS_ALIGN * DNN_WS_ALIGN)
	size_t end = d->ws;
	if (d->widen) {
		d->off_x = WS_UP(end);
		d->off_y = WS_UP(d->off_x + (size_t)d->nx * 4);
		end = d->off_y + (size_t)d->ny * 4;
	}
	if (d->narrow) {
		d->off_w = WS_UP(end);
		end = d->off_w + (size_t)d->nw * 2;
	}
	p->sz[2] = (int64_t)WS_UP(end);
#undef WS_UP
	p->workspace = end;
	if (d->bias_kernel == 2)
		p->workspace = (size_t)p->sz[2] + cuda_bn_workspace(p->cols, (int)p->sz[1]);
	p->launch = dnn_conv_launch;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	c->host->log(KILN_LOG_DEBUG, "cuda", "%s: %s, engine %lld%s, workspace %zu bytes", key,
		     d->bias_kernel == 1 ? "conv then kiln's bias" : g.bias && op->type == KILN_OP_CONV ? "conv+bias fused" : d->widen ? "f32 conv on widened x, dy" : d->narrow ? "dw in x's dtype, widened after (conv_wgrad = lowp)" : "conv",
		     (long long)engine, c->dnn->autotune ? " (autotuned)" : "", p->workspace);
out:
	tune_bufs_free(&bufs);
	return st;
}

kiln_status cuda_dnn_conv_check(struct cuda_ctx *c, const struct kiln_op *op, int fused)
{
	struct cuda_conv_geom g;
	char why[200];
	if (cuda_conv_geom(op, &g, why, sizeof why))
		return cuda_bad(c, op, KILN_EINVAL, why);
	struct cuda_dnn *d = calloc(1, sizeof *d);
	if (!d)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory");
	const kiln_status st = conv_graph(c, op, d, &g, fused, NULL);
	cuda_dnn_free(d);
	return st;
}

#else /* !KILN_HAVE_CUDNN */

void cuda_dnn_free(struct cuda_dnn *d)
{
	(void)d; /* no convolution plan is ever made */
}

static kiln_status conv_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	return cuda_bad(c, &p->op, KILN_ENOTSUP,
			"kiln-cuda.so was built without cuDNN (configure found no cudnn.h / libcudnn): no convolutions");
}
#endif

kiln_status cuda_dnn_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	switch (p->op.type) {
	case KILN_OP_CONV:
	case KILN_OP_CONV_BWD_DATA:
	case KILN_OP_CONV_BWD_WEIGHTS: return conv_prepare(c, p);
	case KILN_OP_POOL:
	case KILN_OP_POOL_BWD: return cuda_pool_prepare(c, p);
	default: return cuda_bn_prepare(c, p);
	}
}

/* ---- open / close ----------------------------------------------------- */

kiln_status cuda_dnn_open(struct cuda_ctx *c, const struct kiln_config *cfg)
{
	const struct kiln_host *h = c->host;
	struct cuda_dnn_ctx *x = calloc(1, sizeof *x);
	kiln_status st;
	int64_t mb = 1024;
	if (!x)
		return h->error(KILN_ENOMEM, "cuda: out of memory");
	pthread_mutex_init(&x->lock, NULL);
	pthread_mutex_init(&x->sdpa_lock, NULL);
	c->dnn = x;
	dnn_host = h;
	/* the fused attention's path (attn_map.h; tests/gpu/run.sh forces each) */
	char why[120];
	if ((x->attn_mode = cuda_attn_mode(getenv("KILN_CUDA_ATTN"), why, sizeof why)) < 0)
		return h->error(KILN_EINVAL, "cuda: %s", why);
	/* [run] autotune and deterministic: the core's options (open()) */
	x->autotune = c->opts.autotune;
	x->deterministic = c->opts.deterministic;
	if (!cfg)
		return KILN_OK;
	/* [plugin.cuda] workspace_mb and autotune_cache (docs/config.md).  A
	 * key without a value (a config not validated against the registry
	 * has no [plugin.cuda] defaults) keeps the default above, as cuda.c
	 * does for `graph`. */
	if ((st = h->config_get_int(cfg, "plugin.cuda", "workspace_mb", &mb)) &&
	    st != KILN_ENOTFOUND)
		return st;
	x->ws_mb = mb;
	const char *wg = h->config_get(cfg, "plugin.cuda", "conv_wgrad");
	x->wgrad_lowp = wg && !strcmp(wg, "lowp");
	const char *path = h->config_get(cfg, "plugin.cuda", "autotune_cache");
	if (!path || !*path) {
		if (cuda_atc_default_path(x->cache_path, sizeof x->cache_path))
			x->cache_path[0] = 0;
	} else if (strcmp(path, "none")) {
		snprintf(x->cache_path, sizeof x->cache_path, "%s", path);
	}
	return KILN_OK;
}

void cuda_dnn_close(struct cuda_ctx *c)
{
	struct cuda_dnn_ctx *x = c->dnn;
	if (!x)
		return;
	cuda_sdpa_close(x); /* its plans, before the handle */
#if KILN_HAVE_CUDNN
	if (x->h)
		cudnnDestroy(x->h);
#endif
	cuda_atc_clear(&x->atc);
	pthread_mutex_destroy(&x->lock);
	pthread_mutex_destroy(&x->sdpa_lock);
	free(x);
	c->dnn = NULL;
}
