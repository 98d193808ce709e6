/* plugins/cuda/cuda.c - the CUDA device plugin: descriptor, probe,
 * open/close, device and page-locked memory, streams and events, and the
 * prepare/run/plan_free dispatch.
 *
 * Memory: alloc is cudaMalloc (the core's planner asks once per arena,
 * never inside a step), host_alloc is cudaHostAlloc (page-locked), so the
 * loader's copies out of its staging ring are truly asynchronous.
 * Streams are non-blocking CUDA streams (they never wait for the legacy
 * default stream); events have timing disabled (cheaper; the profiler
 * synchronises instead).  copy_async is always cudaMemcpyAsync on the
 * given stream: from page-locked memory it returns at once; from pageable
 * memory CUDA itself may make a device-to-host copy wait (DESIGN: the hot
 * path uses host_alloc'd buffers).
 *
 * The CUDA runtime's current device is per thread, and the core calls
 * run/copy_async from the loader's thread too, so every entry point makes
 * the context's device current first (cuda_use).
 *
 * Errors of kernels that meet bad data (a label outside [0, C), an
 * optimizer step count < 1) cannot stop the stream: the kernel records
 * the first one in a record in device memory and the next host sync
 * (stream_sync, event_sync) reports it, once (KILN_EDATA for data,
 * KILN_EINVAL for a bad step count).  Failures of CUDA itself name the call and
 * file:line.
 */
#include "cuda.h"
#include "kern.h" /* kern_err_message */

#include <cuda_runtime_api.h> /* cudaMalloc, cudaHostAlloc, streams, events */
#include <pthread.h>          /* the context's lock over live objects */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_CUDA_MIN_ARCH
#define KILN_CUDA_MIN_ARCH 90 /* configure: the smallest --with-cuda-arch entry */
#endif

static const struct kiln_host *cuda_host; /* from kiln_plugin_init */

/* ---- helpers shared by the other files -------------------------------- */

const char *cuda_op_name(int type)
{
	/* the core's table (host version 3) */
	return common_op_name(cuda_host, type);
}

kiln_status cuda_bad(struct cuda_ctx *c, const struct kiln_op *op, kiln_status st,
		     const char *why)
{
	char list[640];
	return c->host->error(st, "cuda: %s: %s (%s)", cuda_op_name(op->type), why,
			      common_op_tensors(op, list, sizeof list));
}

kiln_status cuda_fail(struct cuda_ctx *c, kiln_status st, cudaError_t e, const char *call,
		      const char *file, int line)
{
	if (e == cudaErrorMemoryAllocation)
		st = KILN_ENOMEM;
	return c->host->error(st, "cuda: %s:%d: %s: %s (%s)", file, line, call,
			      cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Make the context's device current on the calling thread (the runtime's
 * current device is per thread; the loader's thread copies too). */
static cudaError_t cuda_use(const struct cuda_ctx *c)
{
	int cur = -1;
	cudaError_t e = cudaGetDevice(&cur);
	if (e == cudaSuccess && cur == c->ordinal)
		return cudaSuccess;
	return cudaSetDevice(c->ordinal);
}

#define USE(c) CUDA_TRY(c, cuda_use(c))

/* ---- probe ------------------------------------------------------------ */

/* Can this process use a GPU?  The runtime is linked statically and opens
 * libcuda.so.1 on the first call; with no driver installed
 * cudaDriverGetVersion reports version 0 without failing. */
static int cuda_probe(const struct kiln_host *host, char *why, size_t n)
{
	int drv = 0, rt = 0, count = 0, major = 0, minor = 0;
	cudaError_t e;
	(void)host;
	e = cudaDriverGetVersion(&drv);
	if (e != cudaSuccess || drv == 0) {
		snprintf(why, n, "no CUDA driver (libcuda.so.1 not found%s%s)",
			 e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
		return 1;
	}
	cudaRuntimeGetVersion(&rt);
	if (drv < rt) {
		snprintf(why, n, "CUDA driver %d.%d is older than the runtime %d.%d kiln-cuda.so was built with",
			 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
		return 1;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) {
		snprintf(why, n, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return 1;
	}
	if (count < 1) {
		snprintf(why, n, "no CUDA device");
		return 1;
	}
	/* the fat binary holds SASS for the configured architectures and PTX
	 * for the newest of them: older GPUs cannot run it */
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess &&
	    major * 10 + minor < KILN_CUDA_MIN_ARCH) {
		snprintf(why, n, "GPU 0 is sm_%d%d; this build has code for sm_%d and newer (./configure --with-cuda-arch=%d%d)",
			 major, minor, KILN_CUDA_MIN_ARCH, major, minor);
		return 1;
	}
	return 0;
}

/* ---- live objects ------------------------------------------------------ */

/* Streams, events and plans are kept on one list per context so close()
 * can release what the caller left behind. */
struct cuda_obj {
	struct cuda_obj *prev, *next;
	int kind;        /* CUDA_OBJ_* */
	cudaStream_t stream;
	cudaEvent_t event;
	struct cuda_plan *plan;
};

enum { CUDA_OBJ_STREAM, CUDA_OBJ_EVENT, CUDA_OBJ_PLAN };

struct cuda_ctx_priv {
	struct cuda_ctx c;       /* first: the public part */
	pthread_mutex_t lock;
	struct cuda_obj *live;
};

static void obj_link(struct cuda_ctx_priv *x, struct cuda_obj *o)
{
	pthread_mutex_lock(&x->lock);
	COMMON_LIST_PUSH(x->live, o);
	pthread_mutex_unlock(&x->lock);
}

static void obj_unlink(struct cuda_ctx_priv *x, struct cuda_obj *o)
{
	pthread_mutex_lock(&x->lock);
	COMMON_LIST_UNLINK(x->live, o);
	pthread_mutex_unlock(&x->lock);
}

static void plan_release(struct cuda_plan *p)
{
	if (!p)
		return;
	cuda_gemm_free(p->gemm);
	cuda_dnn_free(p->dnn);
	cuda_rnn_free(p->rnn);
	if (p->scratch)
		cudaFree(p->scratch);
	free(p);
}

static void obj_release(struct cuda_obj *o)
{
	switch (o->kind) {
	case CUDA_OBJ_STREAM:
		/* destroying a stream with queued work is legal: CUDA frees it
		 * once the work is done */
		cudaStreamDestroy(o->stream);
		break;
	case CUDA_OBJ_EVENT: cudaEventDestroy(o->event); break;
	case CUDA_OBJ_PLAN: plan_release(o->plan); break;
	}
	free(o);
}

/* ---- open / close ----------------------------------------------------- */

static kiln_status cuda_open(const struct kiln_host *host, const struct kiln_config *cfg,
			     int ordinal, const struct kiln_device_options *opts, void **out)
{
	int count = 0;
	cudaError_t e;
	kiln_status st;
	int graph = 0;
	*out = NULL;
	if (ordinal < 0)
		return host->error(KILN_EINVAL, "cuda: device ordinal %d is negative", ordinal);
	if (cfg && (st = host->config_get_bool(cfg, "plugin.cuda", "graph", &graph)) &&
	    st != KILN_ENOTFOUND)
		return st;
	if ((e = cudaGetDeviceCount(&count)) != cudaSuccess)
		return host->error(KILN_EDEVICE, "cuda: %s:%d: cudaGetDeviceCount: %s", __FILE__,
				   __LINE__, cudaGetErrorString(e));
	if (ordinal >= count)
		return host->error(KILN_EINVAL, "cuda: device ordinal %d, but this machine has %d GPU%s",
				   ordinal, count, count == 1 ? "" : "s");
	/* the probe read GPU 0's architecture: cuda:N on an older card of a
	 * mixed machine would fail at its first kernel ("no kernel image is
	 * available") instead (the cuda explorer's find, session 38) */
	int major = 0, minor = 0;
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) == cudaSuccess &&
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) == cudaSuccess &&
	    major * 10 + minor < KILN_CUDA_MIN_ARCH)
		return host->error(KILN_EDEVICE, "cuda:%d is sm_%d%d; this build has code for sm_%d and newer (./configure --with-cuda-arch=%d%d)",
				   ordinal, major, minor, KILN_CUDA_MIN_ARCH, major, minor);

	struct cuda_ctx_priv *x = calloc(1, sizeof *x);
	if (!x)
		return host->error(KILN_ENOMEM, "cuda: out of memory for the device context");
	struct cuda_ctx *c = &x->c;
	c->host = host;
	c->ordinal = ordinal;
	c->graph = graph;
	c->opts = *opts;
	pthread_mutex_init(&x->lock, NULL);
	if ((e = cudaSetDevice(ordinal)) != cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaSetDevice", __FILE__, __LINE__);
		goto fail;
	}
	/* creates the primary context now rather than on the first kernel */
	if ((e = cudaFree(NULL)) != cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaFree(NULL) (context creation)", __FILE__,
			       __LINE__);
		goto fail;
	}
	if ((e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, ordinal)) !=
	    cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaDeviceGetAttribute", __FILE__, __LINE__);
		goto fail;
	}
	/* the bad-data record: device memory, and a stream of its own to
	 * read and clear it (see the top and cuda.h) */
	cudaStream_t es = NULL;
	if ((e = cudaStreamCreateWithFlags(&es, cudaStreamNonBlocking)) != cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaStreamCreateWithFlags (error record)", __FILE__,
			       __LINE__);
		goto fail;
	}
	c->err_stream = es;
	void *d = NULL;
	if ((e = cudaMalloc(&d, sizeof *c->err_dev)) != cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaMalloc (error record)", __FILE__, __LINE__);
		goto fail;
	}
	c->err_dev = d;
	/* key ~0 (no error): every byte 0xff */
	if ((e = cudaMemsetAsync(d, 0xff, sizeof c->err_dev->key, es)) != cudaSuccess ||
	    (e = cudaStreamSynchronize(es)) != cudaSuccess) {
		st = cuda_fail(c, KILN_EDEVICE, e, "cudaMemsetAsync (error record)", __FILE__, __LINE__);
		goto fail;
	}
	if ((st = cuda_lt_create(c)) || (st = cuda_dnn_open(c, cfg)))
		goto fail;
	host->log(KILN_LOG_DEBUG, "cuda", "opened ordinal %d: %d SMs", ordinal, c->sms);
	*out = c;
	return KILN_OK;
fail:
	cuda_dnn_close(c);
	cuda_lt_destroy(c);
	if (c->err_dev)
		cudaFree(c->err_dev);
	if (c->err_stream)
		cudaStreamDestroy((cudaStream_t)c->err_stream);
	pthread_mutex_destroy(&x->lock);
	free(x);
	return st;
}

static void cuda_close(void *ctx)
{
	struct cuda_ctx_priv *x = ctx;
	if (!x)
		return;
	cuda_use(&x->c);
	/* wait for every queued kernel before freeing what they use */
	cudaDeviceSynchronize();
	while (x->live) {
		struct cuda_obj *o = x->live;
		x->live = o->next;
		obj_release(o);
	}
	cuda_lt_destroy(&x->c);
	cuda_dnn_close(&x->c);
	if (x->c.err_dev)
		cudaFree(x->c.err_dev);
	if (x->c.err_stream)
		cudaStreamDestroy((cudaStream_t)x->c.err_stream);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

/* ---- memory ----------------------------------------------------------- */

static int cuda_has_op_ctx(void *ctx, int type)
{
	(void)ctx;
	return cuda_has_op(type);
}

/* cudaMemGetInfo of the context's GPU, for `[train] batch = auto`. */
static kiln_status cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
	struct cuda_ctx *c = ctx;
	USE(c);
	CUDA_TRY(c, cudaMemGetInfo(free_bytes, total_bytes));
	return KILN_OK;
}

static kiln_status cuda_alloc(void *ctx, size_t bytes, void **ptr)
{
	struct cuda_ctx *c = ctx;
	cudaError_t e;
	*ptr = NULL;
	USE(c);
	/* cudaMalloc aligns to 256 bytes, beyond the 64 plugin.h asks */
	if ((e = cudaMalloc(ptr, bytes ? bytes : 1)) != cudaSuccess) {
		size_t fr = 0, tot = 0;
		cudaGetLastError(); /* an allocation failure is not sticky; clear it */
		cudaMemGetInfo(&fr, &tot);
		*ptr = NULL;
		return c->host->error(e == cudaErrorMemoryAllocation ? KILN_ENOMEM : KILN_EDEVICE,
				      "cuda: %s:%d: cudaMalloc(%zu bytes) on GPU %d: %s (%zu of %zu MiB free)",
				      __FILE__, __LINE__, bytes, c->ordinal, cudaGetErrorString(e),
				      fr >> 20, tot >> 20);
	}
	return KILN_OK;
}

/* Device memory (cuda_alloc's) or page-locked host memory (cuda_host_alloc's),
 * with this context current.  cudaFree waits for the device: never inside a
 * step. */
static void mem_free(struct cuda_ctx *c, void *ptr, int pinned)
{
	if (!ptr)
		return;
	cuda_use(c);
	if (pinned)
		cudaFreeHost(ptr);
	else
		cudaFree(ptr);
}

static void cuda_free(void *ctx, void *ptr)
{
	mem_free(ctx, ptr, 0);
}

static kiln_status cuda_host_alloc(void *ctx, size_t bytes, void **ptr)
{
	struct cuda_ctx *c = ctx;
	cudaError_t e;
	*ptr = NULL;
	USE(c);
	/* portable: page-locked for every context, so one staging ring can
	 * feed any GPU of the process */
	if ((e = cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable)) != cudaSuccess) {
		cudaGetLastError();
		*ptr = NULL;
		return c->host->error(KILN_ENOMEM, "cuda: %s:%d: cudaHostAlloc(%zu bytes): %s",
				      __FILE__, __LINE__, bytes, cudaGetErrorString(e));
	}
	return KILN_OK;
}

static void cuda_host_free(void *ctx, void *ptr)
{
	mem_free(ctx, ptr, 1);
}

/* ---- streams and events ----------------------------------------------- */

/* A stream (non-blocking) or an event (no timing), by kind, linked into the
 * context's list of live objects. */
static kiln_status obj_create(void *ctx, int kind, void **out)
{
	struct cuda_ctx_priv *x = ctx;
	struct cuda_ctx *c = &x->c;
	const int is_stream = kind == CUDA_OBJ_STREAM;
	*out = NULL;
	USE(c);
	struct cuda_obj *o = calloc(1, sizeof *o);
	if (!o)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for %s",
				      is_stream ? "a stream" : "an event");
	o->kind = kind;
	cudaError_t e = is_stream ? cudaStreamCreateWithFlags(&o->stream, cudaStreamNonBlocking)
				  : cudaEventCreateWithFlags(&o->event, cudaEventDisableTiming);
	if (e != cudaSuccess) {
		free(o);
		return cuda_fail(c, KILN_EDEVICE, e,
				 is_stream ? "cudaStreamCreateWithFlags" : "cudaEventCreateWithFlags",
				 __FILE__, __LINE__);
	}
	obj_link(x, o);
	*out = o;
	return KILN_OK;
}

/* A stream, event or plan: unlinked, and released when the last use of it
 * is done. */
static void obj_destroy(void *ctx, void *obj)
{
	struct cuda_ctx_priv *x = ctx;
	if (!obj)
		return;
	cuda_use(&x->c);
	obj_unlink(x, obj);
	obj_release(obj);
}

static kiln_status cuda_stream_create(void *ctx, void **stream)
{
	return obj_create(ctx, CUDA_OBJ_STREAM, stream);
}

static void cuda_stream_destroy(void *ctx, void *stream)
{
	obj_destroy(ctx, stream);
}

static kiln_status cuda_event_create(void *ctx, void **event)
{
	return obj_create(ctx, CUDA_OBJ_EVENT, event);
}

static void cuda_event_destroy(void *ctx, void *event)
{
	obj_destroy(ctx, event);
}

static cudaStream_t S(void *stream) { return ((struct cuda_obj *)stream)->stream; }
cudaStream_t cuda_stream_of(void *stream) { return S(stream); }
static cudaEvent_t E(void *event) { return ((struct cuda_obj *)event)->event; }

static kiln_status cuda_copy_async(void *ctx, void *dst, const void *src, size_t bytes, int kind,
				   void *stream)
{
	struct cuda_ctx *c = ctx;
	static const enum cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
						     cudaMemcpyDeviceToDevice };
	if (kind < KILN_COPY_H2D || kind > KILN_COPY_D2D)
		return c->host->error(KILN_EINVAL, "cuda: copy_async: unknown kind %d", kind);
	if (!stream)
		return c->host->error(KILN_EINVAL, "cuda: copy_async: NULL stream");
	if (!bytes)
		return KILN_OK;
	USE(c);
	CUDA_TRY(c, cudaMemcpyAsync(dst, src, bytes, kinds[kind], S(stream)));
	return KILN_OK;
}

static kiln_status cuda_event_record(void *ctx, void *event, void *stream)
{
	struct cuda_ctx *c = ctx;
	USE(c);
	CUDA_TRY(c, cudaEventRecord(E(event), S(stream)));
	return KILN_OK;
}

static kiln_status cuda_stream_wait(void *ctx, void *stream, void *event)
{
	struct cuda_ctx *c = ctx;
	USE(c);
	CUDA_TRY(c, cudaStreamWaitEvent(S(stream), E(event), 0));
	return KILN_OK;
}

/* After a host sync: a bad-data record left by a kernel becomes this
 * sync's error (once; the record is cleared).  The record is per
 * context, not per stream: whichever thread syncs first after the kernel
 * (the trainer's stream, or an event the loader waits on) reports it.
 * Reading it is one 24-byte copy on the context's own stream (about ten
 * microseconds), paid only at host syncs, which the trainer makes at log
 * points, never per step. */
static kiln_status cuda_check_data(struct cuda_ctx *c)
{
	struct cuda_err_rec r;
	cudaStream_t es = (cudaStream_t)c->err_stream;
	CUDA_TRY(c, cudaMemcpyAsync(&r, c->err_dev, sizeof r, cudaMemcpyDeviceToHost, es));
	CUDA_TRY(c, cudaStreamSynchronize(es));
	if (r.key == CUDA_ERR_NONE)
		return KILN_OK;
	CUDA_TRY(c, cudaMemsetAsync(c->err_dev, 0xff, sizeof r.key, es));
	CUDA_TRY(c, cudaStreamSynchronize(es));
	char msg[256];
	const kiln_status st = kern_err_message(r.key, r.val, r.kind, cuda_op_name(r.op), msg,
						sizeof msg);
	return c->host->error(st, "%s", msg);
}

static kiln_status cuda_event_sync(void *ctx, void *event)
{
	struct cuda_ctx *c = ctx;
	USE(c);
	CUDA_TRY(c, cudaEventSynchronize(E(event)));
	return cuda_check_data(c);
}

static kiln_status cuda_stream_sync(void *ctx, void *stream)
{
	struct cuda_ctx *c = ctx;
	USE(c);
	CUDA_TRY(c, cudaStreamSynchronize(S(stream)));
	return cuda_check_data(c);
}

/* ---- prepare / run ---------------------------------------------------- */

static kiln_status cuda_prepare(void *ctx, const struct kiln_op *op, void **plan,
				size_t *workspace)
{
	struct cuda_ctx_priv *x = ctx;
	struct cuda_ctx *c = &x->c;
	kiln_status st;
	*plan = NULL;
	if (workspace)
		*workspace = 0;
	USE(c);
	/* fused activations (KILN_OPF_ACT): cuBLASLt's epilogues on GEMM, the
	 * INT8 ops' ReLU in their epilogue (qops.c); the convolution and
	 * batchnorm run theirs apart (the layer adds an ACT) */
	if ((op->flags & KILN_OPF_ACT) && op->type != KILN_OP_GEMM && op->type != KILN_OP_QCONV &&
	    op->type != KILN_OP_QLINEAR)
		return c->host->error(KILN_ENOTSUP, "cuda: %s: no fused activation here",
				      cuda_op_name(op->type));
	if (op->flags & KILN_OPF_KEEP) /* cuDNN's convolutions read the tensors as they are */
		return c->host->error(KILN_ENOTSUP, "cuda: %s: no kept copies", cuda_op_name(op->type));
	if (op->flags & KILN_OPF_RESIDUAL) /* the layer runs the CONV, an ADD and the ACT */
		return c->host->error(KILN_ENOTSUP, "cuda: %s: no residual epilogue", cuda_op_name(op->type));
	struct cuda_plan *p = calloc(1, sizeof *p);
	struct cuda_obj *o = calloc(1, sizeof *o);
	if (!p || !o) {
		free(p);
		free(o);
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for a %s plan",
				      cuda_op_name(op->type));
	}
	p->op = *op;
	p->err = c->err_dev;
	/* grid-stride kernels: 8 blocks of 256 per SM keep every SM busy */
	p->grid = c->sms > 0 ? c->sms * 8 : 1024;
	st = op->type == KILN_OP_GEMM ? cuda_gemm_prepare(c, p) : cuda_ops_prepare(c, p);
	if (!st && p->sz[3] > 0) {
		cudaError_t e = cudaMalloc(&p->scratch, (size_t)p->sz[3]);
		if (e != cudaSuccess)
			st = cuda_fail(c, KILN_EDEVICE, e, "cudaMalloc (plan scratch)", __FILE__,
				       __LINE__);
	}
	if (st) {
		plan_release(p);
		free(o);
		return st;
	}
	o->kind = CUDA_OBJ_PLAN;
	o->plan = p;
	obj_link(x, o);
	if (workspace)
		*workspace = p->workspace;
	*plan = o;
	return KILN_OK;
}

static kiln_status cuda_run(void *ctx, void *plan, const struct kiln_op_args *args, void *stream)
{
	struct cuda_ctx *c = ctx;
	const struct cuda_plan *p = plan ? ((struct cuda_obj *)plan)->plan : NULL;
	COMMON_RUN_CHECK(c->host, "cuda", p, args, stream);
	USE(c);
	cudaError_t e = p->launch(p, args, S(stream));
	if (e != cudaSuccess)
		return c->host->error(KILN_EDEVICE, "cuda: %s: %s:%d: launch failed: %s (%s)",
				      cuda_op_name(p->op.type), __FILE__, __LINE__,
				      cudaGetErrorString(e), cudaGetErrorName(e));
	return KILN_OK;
}

static void cuda_plan_free(void *ctx, void *plan)
{
	obj_destroy(ctx, plan);
}

/* The bytes a prepared training RNN forward leaves for its backward. */
static size_t cuda_aux_bytes(void *ctx, void *plan)
{
	(void)ctx;
	const struct cuda_plan *p = plan ? ((struct cuda_obj *)plan)->plan : NULL;
	return p ? cuda_rnn_aux_bytes(p) : 0;
}

/* ---- descriptor ------------------------------------------------------- */

/* KILN_PROC_NATIVE_STREAM: the cudaStream_t behind a kiln stream, for
 * communicators that enqueue on it (NCCL). */
static void *cuda_native_stream(void *ctx, void *stream)
{
	(void)ctx;
	struct cuda_obj *o = stream;
	return o && o->kind == CUDA_OBJ_STREAM ? (void *)o->stream : NULL;
}

static void *cuda_get_proc_address(void *ctx, const char *name)
{
	(void)ctx;
	if (!strcmp(name, KILN_PROC_NATIVE_STREAM))
		return (void *)cuda_native_stream;
	return NULL;
}

static const struct kiln_device_ops cuda_ops = {
	/* cuda_open .. cuda_graph_free; host_alloc is page-locked */
	COMMON_DEVICE_OPS(cuda),
	/* GPU memory, moved between ranks by NCCL; auto prefers it to the
	 * CPU when a GPU is there (the probe) */
	.traits = { .type = KILN_DEVICE_GPU, .auto_score = 100, .caps = 0, .comm = "nccl" },
	.aux_bytes = cuda_aux_bytes, /* the RNN's (rnn.c) */
	.has_op = cuda_has_op_ctx,
};

static const struct kiln_key cuda_keys[] = {
	{ "graph", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Capture the whole training step (forward, backward, the gradients' allreduce, "
	  "the optimizer) as a CUDA graph after a warm-up step and replay it every step: "
	  "one launch instead of one per op.  On by default; where a step cannot be "
	  "captured ([train] accumulate > 1, a gradient hook, profiling) the run issues "
	  "every step and says why (a warning when graph = 1 was set)." },
	CUDA_DNN_KEYS
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

COMMON_DEVICE_PLUGIN(cuda_host, cuda_plugin, "cuda", &cuda_ops, cuda_keys, cuda_probe,
		     "NVIDIA GPU: cuBLASLt GEMM, cuDNN convolution, kiln's CUDA kernels, pinned staging, streams and events")
