/* plugins/cuda/graph.c - captured training steps: CUDA graphs ([plugin.cuda]
 * graph = 1), device ops version 3.
 *
 * capture_begin starts stream capture on the compute stream in thread-local
 * mode (cudaStreamCaptureModeThreadLocal: the loader's copy thread keeps
 * synchronising on its own events meanwhile; only the capturing thread is
 * barred from unsafe calls).  Streams that wait on an event recorded during
 * the capture join it (the communicator's stream, through the core's
 * bucket events) and rejoin when the compute stream waits on their events.
 * capture_end instantiates the graph once; graph_launch replays it with
 * cudaGraphLaunch.  The graph keeps the pointers, plans and kernel
 * arguments of the captured step: the core captures only work that reads
 * every per-step value from device memory (docs/plugins.md, "Captured
 * steps").  The host-side rules the core must follow are checked without a
 * GPU by the CPU device's recorder (plugins/cpu/graph.c).
 */
#include "cuda.h"

#include <stdlib.h>

struct cuda_graph {
	cudaGraph_t g;
	cudaGraphExec_t x;
	size_t nodes;
};

kiln_status cuda_capture_begin(void *ctx, void *stream)
{
	struct cuda_ctx *c = ctx;
	const kiln_status st = common_capture_check(c->host, "cuda", c->graph, stream);
	if (st)
		return st;
	CUDA_TRY(c, cudaSetDevice(c->ordinal));
	CUDA_TRY(c, cudaStreamBeginCapture(cuda_stream_of(stream), cudaStreamCaptureModeThreadLocal));
	return KILN_OK;
}

kiln_status cuda_capture_end(void *ctx, void *stream, void **graph)
{
	struct cuda_ctx *c = ctx;
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	cudaError_t e;
	*graph = NULL;
	if (!stream)
		return c->host->error(KILN_EINVAL, "cuda: capture_end: NULL stream");
	CUDA_TRY(c, cudaSetDevice(c->ordinal));
	/* an operation that cannot be captured invalidated the capture: the
	 * end reports it (cudaErrorStreamCaptureInvalidated) and leaves the
	 * stream out of capture mode; the error is not sticky */
	if ((e = cudaStreamEndCapture(cuda_stream_of(stream), &g)) != cudaSuccess) {
		if (g)
			cudaGraphDestroy(g);
		(void)cudaGetLastError();
		return cuda_fail(c, KILN_EDEVICE, e, "cudaStreamEndCapture (something in the step could not be captured: a host sync, an allocation, an event crossing the capture)",
				 __FILE__, __LINE__);
	}
	if ((e = cudaGraphInstantiate(&x, g, 0)) != cudaSuccess) {
		cudaGraphDestroy(g);
		(void)cudaGetLastError();
		return cuda_fail(c, KILN_EDEVICE, e, "cudaGraphInstantiate", __FILE__, __LINE__);
	}
	struct cuda_graph *cg = calloc(1, sizeof *cg);
	if (!cg) {
		cudaGraphExecDestroy(x);
		cudaGraphDestroy(g);
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for a graph");
	}
	cg->g = g;
	cg->x = x;
	if (cudaGraphGetNodes(g, NULL, &cg->nodes) != cudaSuccess)
		cg->nodes = 0;
	c->host->log(KILN_LOG_DEBUG, "cuda", "captured a CUDA graph of %zu nodes", cg->nodes);
	*graph = cg;
	return KILN_OK;
}

kiln_status cuda_graph_launch(void *ctx, void *graph, void *stream)
{
	struct cuda_ctx *c = ctx;
	struct cuda_graph *cg = graph;
	if (!cg || !stream)
		return c->host->error(KILN_EINVAL, "cuda: graph_launch: NULL %s", !cg ? "graph" : "stream");
	CUDA_TRY(c, cudaSetDevice(c->ordinal));
	CUDA_TRY(c, cudaGraphLaunch(cg->x, cuda_stream_of(stream)));
	return KILN_OK;
}

void cuda_graph_free(void *ctx, void *graph)
{
	struct cuda_ctx *c = ctx;
	struct cuda_graph *cg = graph;
	/* NULL: nothing to free; no device to set: the host part only */
	if (cg && cudaSetDevice(c->ordinal) == cudaSuccess) {
		cudaGraphExecDestroy(cg->x);
		cudaGraphDestroy(cg->g);
	}
	free(cg);
}
