/* plugins/cuda/gemm.c - KILN_OP_GEMM through cuBLASLt.
 *
 *   out0[M,N] = alpha * op(in0)[M,K] op(in1)[K,N] + beta * out0 (+ in2[N])
 *
 * kiln's matrices are row-major; cuBLASLt's default order is column-major.
 * A row-major [M,N] matrix is the column-major [N,M] one, so the plan
 * computes the transposed product C^T[N,M] = op(B)^T op(A)^T: Lt's "A" is
 * kiln's in1 (transposed as kiln's transB says), Lt's "B" is in0.  kiln's
 * bias[N] then runs along Lt's rows, which is exactly what the BIAS
 * epilogue broadcasts (over columns, added after alpha and beta: kiln's
 * bias is not scaled).  Without a bias the epilogue is DEFAULT.
 *
 * Everything Lt creates (descriptors, layouts, the heuristic's algorithm)
 * is made in prepare; run passes the caller's pointers and the plan's
 * workspace.  Compute is CUBLAS_COMPUTE_32F: full fp32, no TF32, so the
 * results agree with the CPU device to fp32 rounding (TF32 would be a
 * config switch of a later issue).  The workspace the chosen algorithm
 * needs is reported to the caller, who owns it.
 */
#include "cuda.h"

#include <cublasLt.h>  /* cublasLtMatmul, descriptors, heuristics */
#include <stdio.h>
#include <stdlib.h>

struct cuda_gemm {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
	float alpha, beta;
	int has_bias;
};

/* Most workspace a GEMM plan may ask for: enough for Hopper's split-K
 * kernels on the MLP's shapes, small next to any arena. */
#define CUDA_GEMM_WS_MAX ((size_t)32 << 20)

/* A failed cuBLASLt call in prepare: status plus file:line of the call. */
#define CUDA_LT(call)                                                                     \
	do {                                                                              \
		cublasStatus_t s_ = (call);                                               \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
			st = c->host->error(s_ == CUBLAS_STATUS_NOT_SUPPORTED ? KILN_ENOTSUP \
									     : KILN_EDEVICE, \
					    "cuda: GEMM M=%lld N=%lld K=%lld: %s:%d: %s: %s",    \
					    (long long)M, (long long)N, (long long)K, __FILE__, \
					    __LINE__, #call, cublasLt_status_str(s_));            \
			goto out;                                                         \
		}                                                                         \
	} while (0)

static const char *cublasLt_status_str(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized (no driver or device?)";
	case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
	case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
	default: return "unknown cuBLAS status";
	}
}

kiln_status cuda_lt_create(struct cuda_ctx *c)
{
	cublasLtHandle_t h;
	cublasStatus_t s = cublasLtCreate(&h);
	if (s != CUBLAS_STATUS_SUCCESS)
		return c->host->error(KILN_EDEVICE, "cuda: %s:%d: cublasLtCreate: %s", __FILE__,
				      __LINE__, cublasLt_status_str(s));
	c->lt = h;
	return KILN_OK;
}

void cuda_lt_destroy(struct cuda_ctx *c)
{
	if (c->lt)
		cublasLtDestroy((cublasLtHandle_t)c->lt);
	c->lt = NULL;
}

void cuda_gemm_free(struct cuda_gemm *g)
{
	if (!g)
		return;
	if (g->la)
		cublasLtMatrixLayoutDestroy(g->la);
	if (g->lb)
		cublasLtMatrixLayoutDestroy(g->lb);
	if (g->lc)
		cublasLtMatrixLayoutDestroy(g->lc);
	if (g->desc)
		cublasLtMatmulDescDestroy(g->desc);
	free(g);
}

static cudaError_t cuda_gemm_launch(const struct cuda_plan *p, const struct kiln_op_args *a,
				    cudaStream_t s)
{
	const struct cuda_gemm *g = p->gemm;
	cublasStatus_t r;
	if (g->has_bias) {
		/* the bias pointer is an attribute of the descriptor, not an
		 * argument; plans run on one stream at a time (as on the CPU
		 * device), so setting it per run is safe */
		const void *bias = a->in[2];
		r = cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
						   &bias, sizeof bias);
		if (r != CUBLAS_STATUS_SUCCESS)
			return cudaErrorInvalidValue;
	}
	/* Lt's A is kiln's in1, Lt's B is kiln's in0 (see the top of the file) */
	r = cublasLtMatmul((cublasLtHandle_t)p->lt, g->desc, &g->alpha, a->in[1], g->la, a->in[0],
			   g->lb, &g->beta, a->out[0], g->lc, a->out[0], g->lc, &g->algo,
			   a->workspace, p->workspace, s);
	if (r == CUBLAS_STATUS_SUCCESS)
		return cudaGetLastError();
	/* run() reports it with the op's name; the nearest runtime error:
	 * NOT_SUPPORTED is what Lt says for pointers less aligned than the
	 * 16 bytes the algorithm was chosen for */
	switch (r) {
	case CUBLAS_STATUS_NOT_SUPPORTED: return cudaErrorNotSupported;
	case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
	case CUBLAS_STATUS_EXECUTION_FAILED: return cudaErrorLaunchFailure;
	default: return cudaErrorUnknown;
	}
}

kiln_status cuda_gemm_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int ta = op->i[0] != 0, tb = op->i[1] != 0;
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	kiln_status st = KILN_OK;
	cublasLtMatmulPreference_t pref = NULL;

	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].dtype != KILN_F32)
			return cuda_bad(c, op, KILN_ENOTSUP, "only f32 GEMM is implemented");
	if (op->out[0].dtype != KILN_F32)
		return cuda_bad(c, op, KILN_ENOTSUP, "only f32 GEMM is implemented");

	struct cuda_gemm *g = calloc(1, sizeof *g);
	if (!g)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for a GEMM plan");
	p->gemm = g;
	p->lt = c->lt;
	g->alpha = (float)op->f[0];
	g->beta = (op->flags & KILN_OPF_ACCUMULATE) ? 1.0f : 0.0f;
	g->has_bias = op->n_in == 3;

	/* Column-major views of kiln's row-major buffers: cuda_gemm_map (cuda.h) */
	struct cuda_gemm_map mp;
	cuda_gemm_map(ta, tb, M, N, K, &mp);
	const cublasOperation_t opa = mp.a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	const cublasOperation_t opb = mp.b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	CUDA_LT(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
	const cublasLtEpilogue_t epi = g->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
	if (g->has_bias) {
		const cudaDataType_t bt = CUDA_R_32F;
		CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
						       &bt, sizeof bt));
	}
	/* layouts: (rows, cols, leading dimension) of the stored col-major view */
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_32F, mp.a_rows, mp.a_cols, mp.lda));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_32F, mp.b_rows, mp.b_cols, mp.ldb));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, mp.c_rows, mp.c_cols, mp.ldc));

	/* The heuristic's first choice within the workspace limit.  The
	 * pointers are unknown here and Lt assumes 256-byte alignment unless
	 * told otherwise; kiln promises 64 (plugin.h: device memory, and the
	 * planner's views of it), so ask only for the 16 that vector loads
	 * need: an algorithm chosen here then runs on any kiln buffer. */
	size_t ws_max = CUDA_GEMM_WS_MAX;
	const uint32_t align = 16;
	CUDA_LT(cublasLtMatmulPreferenceCreate(&pref));
	CUDA_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						     &ws_max, sizeof ws_max));
	CUDA_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
						     &align, sizeof align));
	CUDA_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
						     &align, sizeof align));
	CUDA_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
						     &align, sizeof align));
	CUDA_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
						     &align, sizeof align));
	cublasLtMatmulHeuristicResult_t res;
	int found = 0;
	CUDA_LT(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, g->desc, g->la, g->lb,
					       g->lc, g->lc, pref, 1, &res, &found));
	if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
		st = cuda_bad(c, op, KILN_ENOTSUP, "cuBLASLt has no algorithm for this shape");
		goto out;
	}
	g->algo = res.algo;
	p->workspace = res.workspaceSize;
	p->launch = cuda_gemm_launch;
	p->n_in = op->n_in;
	p->n_out = 1;
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	return st; /* on failure the caller frees p->gemm */
}
