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
 * bias is not scaled).  Without a bias the epilogue is DEFAULT.  A fused
 * activation (KILN_OPF_ACT) picks RELU(_BIAS) or GELU(_BIAS).
 *
 * Everything Lt creates (descriptors, layouts, the heuristic's algorithm)
 * is made in prepare; run passes the caller's pointers and the plan's
 * workspace.  Compute is CUBLAS_COMPUTE_32F: full fp32, no TF32, so the
 * results agree with the CPU device to fp32 rounding (TF32 would be a
 * config switch of a later issue).  The workspace the chosen algorithm
 * needs is reported to the caller, who owns it.
 *
 * Low precision (plugin.h, ABI 1.3): in0 and in1 both bf16 or both f16,
 * out0 that dtype or f32 (weight gradients), bias f32 or out0's dtype.
 * Still CUBLAS_COMPUTE_32F (f32 accumulation; 16-bit inputs run on the
 * tensor cores) with f32 alpha and beta, and the result rounded once to
 * out0's dtype.  An f32 bias into a 16-bit out0 is asked of the BIAS
 * epilogue first (BIAS_DATA_TYPE f32, added before the rounding); when
 * cuBLASLt has no algorithm for that pair (an H200's cuBLASLt 13 has none:
 * its f32 bias takes an f32 D only) the plan stages D in f32 in the
 * workspace (M*N floats after cuBLASLt's own), the bias and any
 * activation included, and kiln's k_stage_round rounds it once into out0
 * (adding out0 when accumulating): the CPU device's single rounding.
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
	int stage;       /* f32 bias, 16-bit output: D staged in f32 (cuda_stage_round) */
	size_t ws_lt;    /* cuBLASLt's workspace; the f32 stage follows it */
	int out_dtype;
	int64_t M, N;
};

/* Most workspace a GEMM plan may ask for: enough for Hopper's split-K
 * kernels on the MLP's shapes, small next to any arena. */
#define CUDA_GEMM_WS_MAX ((size_t)32 << 20)

/* A failed cuBLASLt call in prepare: status plus file:line of the call. */
#define CUDA_LT(call)                                                                          \
	do {                                                                                   \
		cublasStatus_t s_ = (call);                                                    \
		COMMON_TRY(c->host, s_ != CUBLAS_STATUS_SUCCESS, s_ == CUBLAS_STATUS_NOT_SUPPORTED, \
			   #call, cublasLt_status_str(s_), "cuda: GEMM M=%lld N=%lld K=%lld",    \
			   (long long)M, (long long)N, (long long)K);                            \
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

/* A heuristic preference into *pref (the caller destroys it, also on
 * failure): algorithms within CUDA_GEMM_WS_MAX of workspace, on buffers
 * aligned to 16 bytes.  The pointers are unknown at prepare and Lt assumes
 * 256-byte alignment unless told otherwise; kiln promises 64 (plugin.h:
 * device memory, and the planner's views of it), so ask only for the 16
 * that vector loads need: an algorithm chosen here then runs on any kiln
 * buffer.  The first failing call's status. */
static cublasStatus_t lt_preference(cublasLtMatmulPreference_t *pref)
{
	static const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
	};
	const size_t ws_max = CUDA_GEMM_WS_MAX;
	const uint32_t align = 16;
	cublasStatus_t s = cublasLtMatmulPreferenceCreate(pref);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
							 &ws_max, sizeof ws_max);
	for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
		s = cublasLtMatmulPreferenceSetAttribute(*pref, aligns[i], &align, sizeof align);
	return s;
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

/* A cublasLtMatmul status as the launch status run() reports with the
 * op's name: the nearest runtime error.  NOT_SUPPORTED is what Lt says for
 * pointers less aligned than the 16 bytes the algorithm was chosen for. */
static cudaError_t lt_error(cublasStatus_t r)
{
	switch (r) {
	case CUBLAS_STATUS_SUCCESS: return cudaGetLastError();
	case CUBLAS_STATUS_NOT_SUPPORTED: return cudaErrorNotSupported;
	case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
	case CUBLAS_STATUS_EXECUTION_FAILED: return cudaErrorLaunchFailure;
	default: return cudaErrorUnknown;
	}
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
	/* Lt's A is kiln's in1, Lt's B is kiln's in0 (see the top of the file);
	 * a staged D is f32 in the workspace, after Lt's, written (beta 0)
	 * and then rounded once into out0, added to it when accumulating */
	static const float zero = 0.0f;
	void *d = g->stage ? (char *)a->workspace + g->ws_lt : a->out[0];
	r = cublasLtMatmul((cublasLtHandle_t)p->lt, g->desc, &g->alpha, a->in[1], g->la, a->in[0],
			   g->lb, g->stage ? &zero : &g->beta, d, g->lc, d, g->lc, &g->algo,
			   a->workspace, g->ws_lt, s);
	if (r == CUBLAS_STATUS_SUCCESS && g->stage)
		return cuda_stage_round(a->out[0], g->out_dtype, (const float *)d, g->M * g->N,
					g->beta != 0.0f, p->grid, s);
	return lt_error(r);
}

/* The epilogue: the bias, and a fused activation (KILN_OPF_ACT) where
 * cuBLASLt has it: ReLU, and GELU's tanh form (Lt's GELU); others
 * KILN_ENOTSUP, for the layer to run apart. */
static kiln_status cuda_gemm_epilogue(struct cuda_ctx *c, const struct kiln_op *op,
				      cublasLtEpilogue_t *epi)
{
	const int bias = op->n_in == 3;
	*epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	if (!(op->flags & KILN_OPF_ACT))
		return KILN_OK;
	switch (op->i[KILN_OPI_ACT]) {
	case KILN_ACT_RELU:
		*epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
		return KILN_OK;
	case KILN_ACT_GELU_TANH:
		*epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
		return KILN_OK;
	default:
		return cuda_bad(c, op, KILN_ENOTSUP, "cuBLASLt fuses relu and tanh-GELU only");
	}
}

kiln_status cuda_gemm_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int ta = op->i[0] != 0, tb = op->i[1] != 0;
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	kiln_status st = KILN_OK;
	cublasLtMatmulPreference_t pref = NULL;

	/* f32 x f32 -> f32; bf16 x bf16 or f16 x f16 -> that or f32 (the core
	 * checked the counts and M, N, K against the tensors) */
	const int dt = op->in[0].dtype, dto = op->out[0].dtype;
	const int bias_dt = op->n_in == 3 ? op->in[2].dtype : dto;
	const int lowp = dt == KILN_BF16 || dt == KILN_F16;
	if (!(dt == KILN_F32 || lowp) || op->in[1].dtype != dt || !(dto == dt || dto == KILN_F32) ||
	    (dt == KILN_F32 && dto != KILN_F32) || !(bias_dt == KILN_F32 || bias_dt == dto))
		return cuda_bad(c, op, KILN_ENOTSUP,
				"GEMM takes f32, bf16 or f16 operands of one dtype, an output of that dtype or f32, and a bias of f32 or the output's dtype");
	const cudaDataType_t ct = dt == KILN_BF16 ? CUDA_R_16BF : dt == KILN_F16 ? CUDA_R_16F : CUDA_R_32F;
	const cudaDataType_t cto = dto == KILN_BF16 ? CUDA_R_16BF : dto == KILN_F16 ? CUDA_R_16F : CUDA_R_32F;

	struct cuda_gemm *g = calloc(1, sizeof *g);
	if (!g)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for a GEMM plan");
	p->gemm = g;
	p->lt = c->lt;
	g->alpha = (float)op->f[0];
	g->beta = (op->flags & KILN_OPF_ACCUMULATE) ? 1.0f : 0.0f;
	g->has_bias = op->n_in == 3;
	g->out_dtype = dto;
	g->M = M;
	g->N = N;

	/* Column-major views of kiln's row-major buffers: cuda_gemm_map (cuda.h) */
	struct cuda_gemm_map mp;
	cuda_gemm_map(ta, tb, M, N, K, &mp);
	const cublasOperation_t opa = mp.a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	const cublasOperation_t opb = mp.b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	CUDA_LT(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
	cublasLtEpilogue_t epi;
	if ((st = cuda_gemm_epilogue(c, op, &epi)))
		goto out;
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
	if (g->has_bias) {
		const int32_t bt = bias_dt == KILN_F32 ? CUDA_R_32F : (int32_t)cto;
		CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
						       &bt, sizeof bt));
	}
	/* layouts: (rows, cols, leading dimension) of the stored col-major
	 * view; A, B in the operands' dtype, C = D in the output's */
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->la, ct, mp.a_rows, mp.a_cols, mp.lda));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lb, ct, mp.b_rows, mp.b_cols, mp.ldb));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lc, cto, mp.c_rows, mp.c_cols, mp.ldc));

	/* The heuristic's first choice within the workspace limit. */
	CUDA_LT(lt_preference(&pref));
	cublasLtMatmulHeuristicResult_t res;
	int found = 0;
	cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, g->desc, g->la,
							   g->lb, g->lc, g->lc, pref, 1, &res,
							   &found);
	if (g->has_bias && bias_dt != dto &&
	    (hs != CUBLAS_STATUS_SUCCESS || found < 1 || res.state != CUBLAS_STATUS_SUCCESS)) {
		/* cuBLASLt's bias epilogue takes an f32 bias with an f32 output
		 * only (not a 16-bit one: seen on an H200), so D, the bias and any
		 * activation are computed in f32 into the workspace and rounded
		 * once into the 16-bit output: the CPU device's single rounding */
		cublasLtMatrixLayoutDestroy(g->lc);
		g->lc = NULL;
		CUDA_LT(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, mp.c_rows, mp.c_cols, mp.ldc));
		g->stage = 1;
		c->host->log(KILN_LOG_DEBUG, "cuda",
			     "GEMM M=%lld N=%lld K=%lld: an f32 bias into a %s output: staged in f32 (%.1f MiB of workspace), rounded once",
			     (long long)M, (long long)N, (long long)K, dto == KILN_BF16 ? "bf16" : "f16",
			     (double)M * (double)N * 4.0 / 1048576.0);
		found = 0;
		hs = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, g->desc, g->la, g->lb,
						    g->lc, g->lc, pref, 1, &res, &found);
	}
	CUDA_LT(hs);
	if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
		st = cuda_bad(c, op, KILN_ENOTSUP, "cuBLASLt has no algorithm for this shape");
		goto out;
	}
	g->algo = res.algo;
	/* a stage follows cuBLASLt's workspace, 256-byte aligned */
	g->ws_lt = g->stage ? (res.workspaceSize + 255) / 256 * 256 : res.workspaceSize;
	p->workspace = g->ws_lt + (g->stage ? sizeof(float) * (size_t)(M * N) : 0);
	p->launch = cuda_gemm_launch;
	p->n_in = op->n_in;
	p->n_out = 1;
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	return st; /* on failure the caller frees p->gemm */
}

/* ---- the INT8 ops' exact int8 GEMM (qops.c) -----------------------------
 * acc s32 row-major [rows, ldc] = x s8 [rows, kp] . w s8 [n, kp]^T: in
 * Lt's column-major terms D[n, rows] (ld ldc) = A^T B with A = w stored
 * [kp, n] (ld kp, transposed) and B = x stored [kp, rows] (ld kp): the
 * "TN" form cuBLASLt's int8 kernels take, CUBLAS_COMPUTE_32I with int32
 * alpha 1 and beta 0 (exact: no scaling in Lt; the epilogue is kiln's,
 * int8_kernels.cu).  qops.c pads kp to 16 bytes, and rows and n to
 * multiples of 4 (ldc = n), so every row starts 16-byte aligned. */
kiln_status cuda_gemm_i8_prepare(struct cuda_ctx *c, struct cuda_plan *p, int64_t rows, int64_t n,
				 int64_t kp, int64_t ldc, size_t *ws)
{
	const int64_t M = rows, N = n, K = kp; /* for CUDA_LT's message */
	kiln_status st = KILN_OK;
	cublasLtMatmulPreference_t pref = NULL;
	struct cuda_gemm *g = calloc(1, sizeof *g);
	if (!g)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for an int8 GEMM plan");
	p->gemm = g;
	p->lt = c->lt;
	g->M = rows;
	g->N = n;
	const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
	CUDA_LT(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
	CUDA_LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_8I, (uint64_t)kp, (uint64_t)n, kp));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_8I, (uint64_t)kp, (uint64_t)rows, kp));
	CUDA_LT(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32I, (uint64_t)n, (uint64_t)rows, ldc));
	CUDA_LT(lt_preference(&pref));
	cublasLtMatmulHeuristicResult_t res;
	int found = 0;
	CUDA_LT(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->lt, g->desc, g->la, g->lb, g->lc,
					       g->lc, pref, 1, &res, &found));
	if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
		st = cuda_bad(c, &p->op, KILN_ENOTSUP, "cuBLASLt has no int8 algorithm for this shape");
		goto out;
	}
	g->algo = res.algo;
	*ws = res.workspaceSize;
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	return st; /* on failure the caller frees p->gemm */
}

cudaError_t cuda_gemm_i8_run(const struct cuda_plan *p, const void *x, const void *w, void *acc,
			     void *ws, size_t ws_bytes, cudaStream_t s)
{
	const struct cuda_gemm *g = p->gemm;
	const int32_t one = 1, zero = 0;
	cublasStatus_t r = cublasLtMatmul((cublasLtHandle_t)p->lt, g->desc, &one, w, g->la, x, g->lb,
					  &zero, acc, g->lc, acc, g->lc, &g->algo, ws, ws_bytes, s);
	return lt_error(r);
}
