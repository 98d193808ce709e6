/* plugins/cuda/rnn.c - KILN_OP_RNN and RNN_BWD (one direction of one layer
 * of nn.LSTM / nn.GRU, kiln/ops.h) through cuDNN's RNN API:
 * cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8.
 *
 * What cuDNN runs is the CPU device's plan (plugins/cpu/rnn.c), so the two
 * devices share one contract and one reading of it:
 *   - the cell: CUDNN_LSTM (gates i, f, g, o: PyTorch's order) or
 *     CUDNN_GRU, which is PyTorch's GRU (gates r, z, n; the recurrent
 *     term inside r * (W_hn h + b_hn): "linear before reset"), both with
 *     CUDNN_RNN_DOUBLE_BIAS (b_ih and b_hh apart, as PyTorch);
 *     unidirectional, one layer, zero initial state, f32 with
 *     CUDNN_FMA_MATH (no tensor cores, no TF32: f32 rounding as the GEMM);
 *   - the weights: cuDNN's matrix of linear layer L (0..G-1 the input
 *     gates, G..2G-1 the recurrent ones, in PyTorch's gate order) is a
 *     row-major [H, I] or [H, H] block, the rows g*H.. of PyTorch's w_ih or
 *     w_hh (PyTorch's own cuDNN path lays its parameters over these
 *     blocks); cudnnGetRNNWeightParams gives their places in the weight
 *     space, which each run fills from kiln's parameters (device copies);
 *   - the direction and the lengths: every row's first len steps are
 *     gathered in reading order (reversed for the reverse direction) into
 *     a zero-padded sequence that cuDNN runs left to right over all T
 *     steps, and scattered back; the padded steps come after the valid
 *     ones, so they never touch a valid output, their y is zeroed, and
 *     their dy is zero in the backward (they add nothing to any gradient):
 *     pack_padded_sequence's result.  The lengths come from the ids on the
 *     device (rnn_kernels.cu), so a run never waits for the host, and
 *     cuDNN's data descriptors (host lengths) are fixed at prepare: every
 *     sequence T long.
 *
 * The final hidden state (i[4], `last`): each row's last step run is at
 * len - 1 of the sequence in reading order, for either direction: the
 * forward picks it from cuDNN's y (cuda_rnn_last) and the backward builds
 * cuDNN's dy from it, zeros at every other step (cuda_rnn_last_dy).
 *
 * aux (the forward's out1, the backward's in4): cuDNN's reserve space, the
 * sequence cuDNN produced (f32 [B,T,H] in reading order) and the rows'
 * lengths (i32 [B]).  Workspace (the caller's): cuDNN's work space, the
 * gathered x, then the gathered y (inference) or dy, then dx (backward).
 * The plan's scratch: the weight space, the weight gradients' space (the
 * backward) and cuDNN's device lengths (T for every row).
 *
 * cuDNN's handle and its stream are the context's, shared with cudnn.c
 * under its lock.
 */
#include "cuda.h"

#if KILN_HAVE_CUDNN
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RNN_AL(n) (((size_t)(n) + 255) & ~(size_t)255)

struct cuda_rnn {
	const struct kiln_host *host;
	cudnnHandle_t h;
	pthread_mutex_t *lock;
	cudnnRNNDescriptor_t rnn;
	cudnnDropoutDescriptor_t drop;
	cudnnRNNDataDescriptor_t xd, yd;
	cudnnTensorDescriptor_t hd, md, bd;
	int64_t B, T, I, H, G;
	size_t wspace, work, reserve;   /* cuDNN's sizes in bytes */
	size_t mat[8], bias[8];         /* places in the weight space, by linear layer */
	size_t s_dw, s_seq, s_len;      /* the plan's scratch: dweights, seq lengths, lengths */
	size_t a_y, a_len, a_end;       /* the aux */
	size_t w_x, w_y, w_dx;          /* the workspace after cuDNN's */
	char what[160];                 /* for messages: "RNN LSTM x [4,7,5] hidden 6" */
};

void cuda_rnn_free(struct cuda_rnn *r)
{
	if (!r)
		return;
	if (r->rnn)
		cudnnDestroyRNNDescriptor(r->rnn);
	if (r->drop)
		cudnnDestroyDropoutDescriptor(r->drop);
	if (r->xd)
		cudnnDestroyRNNDataDescriptor(r->xd);
	if (r->yd)
		cudnnDestroyRNNDataDescriptor(r->yd);
	if (r->hd)
		cudnnDestroyTensorDescriptor(r->hd);
	if (r->md)
		cudnnDestroyTensorDescriptor(r->md);
	if (r->bd)
		cudnnDestroyTensorDescriptor(r->bd);
	free(r);
}

size_t cuda_rnn_aux_bytes(const struct cuda_plan *p)
{
	return p->rnn && p->op.type == KILN_OP_RNN && p->op.n_out == 2 ? p->rnn->a_end : 0;
}

/* A failed cuDNN call in prepare: the op, the call, cuDNN's words. */
#define RNN_TRY(call)                                                                             \
	do {                                                                                      \
		cudnnStatus_t s_ = (call);                                                        \
		if (s_ != CUDNN_STATUS_SUCCESS) {                                                 \
			char d_[400];                                                             \
			d_[0] = 0;                                                                \
			cudnnGetLastErrorString(d_, sizeof d_);                                   \
			return c->host->error(s_ == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ENOTSUP      \
									       : KILN_EDEVICE,    \
					      "cuda: %s: %s:%d: %s: %s %s", r->what, __FILE__,    \
					      __LINE__, #call, cudnnGetErrorString(s_), d_);      \
		}                                                                                 \
	} while (0)

/* In a launcher: log cuDNN's failure and return a launch error (run()
 * reports it with the op's name). */
static cudaError_t rnn_run_fail(const struct cuda_rnn *r, cudnnStatus_t s, const char *call)
{
	char d[400];
	d[0] = 0;
	cudnnGetLastErrorString(d, sizeof d);
	r->host->log(KILN_LOG_ERROR, "cuda", "%s: %s: %s %s", r->what, call, cudnnGetErrorString(s), d);
	return cudaErrorLaunchFailure;
}

/* kiln's w_ih, w_hh (and b_ih, b_hh, or zeros) into the weight space. */
static cudaError_t rnn_weights_in(const struct cuda_plan *p, const struct kiln_op_args *a, int bwd,
				  cudaStream_t s)
{
	const struct cuda_rnn *r = p->rnn;
	char *ws = p->scratch;
	const size_t f = sizeof(float);
	const int64_t H = r->H, I = r->I, G = r->G;
	const char *wih = a->in[bwd ? 2 : 1], *whh = a->in[bwd ? 3 : 2];
	cudaError_t e = bwd ? cudaMemsetAsync(ws, 0, r->wspace, s) : cudaSuccess;
	for (int64_t g = 0; g < G && e == cudaSuccess; g++) {
		e = cudaMemcpyAsync(ws + r->mat[g], wih + g * H * I * f, (size_t)(H * I) * f,
				    cudaMemcpyDeviceToDevice, s);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(ws + r->mat[G + g], whh + g * H * H * f, (size_t)(H * H) * f,
					    cudaMemcpyDeviceToDevice, s);
		if (e == cudaSuccess && !bwd)
			e = cudaMemcpyAsync(ws + r->bias[g], (const char *)a->in[3] + g * H * f,
					    (size_t)H * f, cudaMemcpyDeviceToDevice, s);
		if (e == cudaSuccess && !bwd)
			e = cudaMemcpyAsync(ws + r->bias[G + g], (const char *)a->in[4] + g * H * f,
					    (size_t)H * f, cudaMemcpyDeviceToDevice, s);
	}
	return e;
}

static cudaError_t rnn_forward(const struct cuda_plan *p, const struct kiln_op_args *a,
			       cudaStream_t s)
{
	const struct cuda_rnn *r = p->rnn;
	const int64_t B = r->B, T = r->T, rev = p->op.i[1];
	const int training = p->op.n_out == 2;
	char *sc = p->scratch, *ws = a->workspace, *aux = training ? a->out[1] : NULL;
	int32_t *len = (int32_t *)(training ? aux + r->a_len : sc + r->s_len);
	float *xg = (float *)(ws + r->w_x), *yc = (float *)(training ? aux + r->a_y : ws + r->w_y);
	const int32_t *ids = p->op.n_in == 6 ? a->in[5] : NULL;
	cudaError_t e = cuda_rnn_lengths(ids, (int32_t)p->op.i[2], B, T, len, s);
	if (e == cudaSuccess)
		e = rnn_weights_in(p, a, 0, s);
	if (e == cudaSuccess)
		e = cuda_rnn_gather(xg, a->in[0], B, T, r->I, len, (int)rev, 0, p->grid, s);
	if (e != cudaSuccess)
		return e;
	pthread_mutex_lock(r->lock);
	cudnnStatus_t st = cudnnSetStream(r->h, s);
	if (!st)
		st = cudnnRNNForward(r->h, r->rnn,
				     training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
				     (const int32_t *)(sc + r->s_seq), r->xd, xg, r->yd, yc, r->hd,
				     NULL, NULL, r->hd, NULL, NULL, r->wspace, sc, r->work, ws,
				     training ? r->reserve : 0, training ? aux : NULL);
	pthread_mutex_unlock(r->lock);
	if (st)
		return rnn_run_fail(r, st, "cudnnRNNForward");
	if (p->op.i[4])
		return cuda_rnn_last(a->out[0], yc, B, T, r->H, len, p->grid, s);
	return cuda_rnn_gather(a->out[0], yc, B, T, r->H, len, (int)rev, 0, p->grid, s);
}

/* The weight and bias gradients out of cuDNN's space, in PyTorch's order
 * (the same gate order: one copy per linear layer). */
static cudaError_t rnn_grads_out(const struct cuda_plan *p, const struct kiln_op_args *a,
				 cudaStream_t s)
{
	const struct cuda_rnn *r = p->rnn;
	const char *dw = (const char *)p->scratch + r->s_dw;
	const int64_t H = r->H, I = r->I, G = r->G;
	const int acc = p->op.i[3] != 0;
	float *dwih = a->out[1], *dwhh = a->out[2], *dbih = a->out[3], *dbhh = dbih + G * H;
	cudaError_t e = cudaSuccess;
	for (int64_t g = 0; g < G && e == cudaSuccess; g++) {
		e = cuda_rnn_put(dwih + g * H * I, (const float *)(dw + r->mat[g]), H * I, acc, p->grid, s);
		if (e == cudaSuccess)
			e = cuda_rnn_put(dwhh + g * H * H, (const float *)(dw + r->mat[G + g]), H * H,
					 acc, p->grid, s);
		if (e == cudaSuccess)
			e = cuda_rnn_put(dbih + g * H, (const float *)(dw + r->bias[g]), H, 0, p->grid, s);
		if (e == cudaSuccess)
			e = cuda_rnn_put(dbhh + g * H, (const float *)(dw + r->bias[G + g]), H, 0,
					 p->grid, s);
	}
	return e;
}

static cudaError_t rnn_backward(const struct cuda_plan *p, const struct kiln_op_args *a,
				cudaStream_t s)
{
	const struct cuda_rnn *r = p->rnn;
	const int64_t B = r->B, T = r->T, rev = p->op.i[1];
	char *sc = p->scratch, *ws = a->workspace, *aux = (char *)a->in[4];
	const int32_t *len = (const int32_t *)(aux + r->a_len), *seq = (const int32_t *)(sc + r->s_seq);
	float *xg = (float *)(ws + r->w_x), *dyg = (float *)(ws + r->w_y), *dxg = (float *)(ws + r->w_dx);
	const float *yc = (const float *)(aux + r->a_y);
	cudaError_t e = rnn_weights_in(p, a, 1, s);
	if (e == cudaSuccess)
		e = cuda_rnn_gather(xg, a->in[0], B, T, r->I, len, (int)rev, 0, p->grid, s);
	if (e == cudaSuccess)
		e = p->op.i[4] ? cuda_rnn_last_dy(dyg, a->in[1], B, T, r->H, len, p->grid, s)
			       : cuda_rnn_gather(dyg, a->in[1], B, T, r->H, len, (int)rev, 0, p->grid, s);
	/* cuDNN adds into the weight gradients (CUDNN_WGRAD_MODE_ADD) */
	if (e == cudaSuccess)
		e = cudaMemsetAsync(sc + r->s_dw, 0, r->wspace, s);
	if (e != cudaSuccess)
		return e;
	pthread_mutex_lock(r->lock);
	const char *call = "cudnnSetStream";
	cudnnStatus_t st = cudnnSetStream(r->h, s);
	if (!st) {
		call = "cudnnRNNBackwardData_v8";
		st = cudnnRNNBackwardData_v8(r->h, r->rnn, seq, r->yd, yc, dyg, r->xd, dxg, r->hd, NULL,
					     NULL, NULL, r->hd, NULL, NULL, NULL, r->wspace, sc,
					     r->work, ws, r->reserve, aux);
	}
	if (!st) {
		call = "cudnnRNNBackwardWeights_v8";
		st = cudnnRNNBackwardWeights_v8(r->h, r->rnn, CUDNN_WGRAD_MODE_ADD, seq, r->xd, xg,
						r->hd, NULL, r->yd, yc, r->wspace, sc + r->s_dw,
						r->work, ws, r->reserve, aux);
	}
	pthread_mutex_unlock(r->lock);
	if (st)
		return rnn_run_fail(r, st, call);
	e = cuda_rnn_gather(a->out[0], dxg, B, T, r->I, len, (int)rev,
			    (p->op.flags & KILN_OPF_ACCUMULATE) != 0, p->grid, s);
	return e == cudaSuccess ? rnn_grads_out(p, a, s) : e;
}

static cudaError_t rnn_launch(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s)
{
	return p->op.type == KILN_OP_RNN_BWD ? rnn_backward(p, a, s) : rnn_forward(p, a, s);
}

/* The descriptors: the cell, cuDNN's data (every row T long, batch-major
 * padded: kiln's [B,T,C]), the zero initial state's shape. */
static kiln_status rnn_descriptors(struct cuda_ctx *c, struct cuda_rnn *r, int gru)
{
	const int B = (int)r->B, T = (int)r->T, I = (int)r->I, H = (int)r->H;
	RNN_TRY(cudnnCreateDropoutDescriptor(&r->drop));
	/* no dropout (one layer): no states, no random numbers */
	RNN_TRY(cudnnSetDropoutDescriptor(r->drop, r->h, 0.0f, NULL, 0, 0));
	RNN_TRY(cudnnCreateRNNDescriptor(&r->rnn));
	RNN_TRY(cudnnSetRNNDescriptor_v8(r->rnn, CUDNN_RNN_ALGO_STANDARD, gru ? CUDNN_GRU : CUDNN_LSTM,
					 CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
					 CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
					 CUDNN_FMA_MATH, I, H, H, 1, r->drop,
					 CUDNN_RNN_PADDED_IO_ENABLED));
	int *seq = malloc(sizeof(int) * (size_t)B);
	if (!seq)
		return c->host->error(KILN_ENOMEM, "cuda: %s: out of memory", r->what);
	for (int b = 0; b < B; b++)
		seq[b] = T;
	float fill = 0.0f;
	cudnnStatus_t s1 = cudnnCreateRNNDataDescriptor(&r->xd), s2 = CUDNN_STATUS_SUCCESS;
	if (!s1)
		s1 = cudnnSetRNNDataDescriptor(r->xd, CUDNN_DATA_FLOAT,
					       CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, T, B, I,
					       seq, &fill);
	if (!s1)
		s2 = cudnnCreateRNNDataDescriptor(&r->yd);
	if (!s1 && !s2)
		s2 = cudnnSetRNNDataDescriptor(r->yd, CUDNN_DATA_FLOAT,
					       CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, T, B, H,
					       seq, &fill);
	free(seq);
	RNN_TRY(s1);
	RNN_TRY(s2);
	const int dims[3] = { 1, B, H }, strides[3] = { B * H, H, 1 };
	RNN_TRY(cudnnCreateTensorDescriptor(&r->hd));
	RNN_TRY(cudnnSetTensorNdDescriptor(r->hd, CUDNN_DATA_FLOAT, 3, dims, strides));
	RNN_TRY(cudnnCreateTensorDescriptor(&r->md));
	RNN_TRY(cudnnCreateTensorDescriptor(&r->bd));
	return KILN_OK;
}

/* Elements a tensor descriptor cudnnGetRNNWeightParams filled describes. */
static int64_t rnn_desc_numel(cudnnTensorDescriptor_t d)
{
	cudnnDataType_t t;
	int n = 0, dims[8], strides[8];
	if (cudnnGetTensorNdDescriptor(d, 8, &t, &n, dims, strides) != CUDNN_STATUS_SUCCESS)
		return -1;
	int64_t e = 1;
	for (int k = 0; k < n && k < 8; k++)
		e *= dims[k];
	return e;
}

/* The plan's scratch (weight space, its gradients' space, cuDNN's lengths,
 * the inference lengths) and the places of the gate matrices in it. */
static kiln_status rnn_scratch(struct cuda_ctx *c, struct cuda_plan *p)
{
	struct cuda_rnn *r = p->rnn;
	const int bwd = p->op.type == KILN_OP_RNN_BWD;
	r->s_dw = RNN_AL(r->wspace);
	r->s_seq = r->s_dw + (bwd ? RNN_AL(r->wspace) : 0);
	r->s_len = r->s_seq + RNN_AL(sizeof(int32_t) * (size_t)r->B);
	const size_t bytes = r->s_len + RNN_AL(sizeof(int32_t) * (size_t)r->B);
	CUDA_TRY(c, cudaMalloc(&p->scratch, bytes));
	int32_t *seq = malloc(sizeof(int32_t) * (size_t)r->B);
	if (!seq)
		return c->host->error(KILN_ENOMEM, "cuda: %s: out of memory", r->what);
	for (int64_t b = 0; b < r->B; b++)
		seq[b] = (int32_t)r->T;
	cudaError_t e = cudaMemcpy((char *)p->scratch + r->s_seq, seq, sizeof(int32_t) * (size_t)r->B,
				   cudaMemcpyHostToDevice);
	free(seq);
	CUDA_TRY(c, e);
	for (int L = 0; L < 2 * r->G; L++) {
		void *m = NULL, *b = NULL;
		RNN_TRY(cudnnGetRNNWeightParams(r->h, r->rnn, 0, r->wspace, p->scratch, L, r->md, &m,
						r->bd, &b));
		const int64_t want = r->H * (L < r->G ? r->I : r->H);
		if (!m || !b || rnn_desc_numel(r->md) != want || rnn_desc_numel(r->bd) != r->H)
			return c->host->error(KILN_EINTERNAL,
					      "cuda: %s: cuDNN's linear layer %d is not the [%lld, %lld] matrix and [%lld] bias this plugin maps PyTorch's gates onto",
					      r->what, L, (long long)r->H,
					      (long long)(L < r->G ? r->I : r->H), (long long)r->H);
		r->mat[L] = (size_t)((char *)m - (char *)p->scratch);
		r->bias[L] = (size_t)((char *)b - (char *)p->scratch);
	}
	return KILN_OK;
}

kiln_status cuda_rnn_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_RNN_BWD, gru = (int)op->i[0];
	const int training = bwd || op->n_out == 2;
	for (int k = 0; k < op->n_in; k++)
		if (op->in[k].dtype != KILN_F32 && !(k == 5 && op->in[k].dtype == KILN_I32) &&
		    !(bwd && k == 4))
			return cuda_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	const struct kiln_tensor_desc *x = &op->in[0], *y = bwd ? &op->in[1] : &op->out[0];
	const int64_t H = y->dims[y->ndim - 1]; /* y [B,T,H], or [B,H] (i[4], last) */
	if (x->dims[0] > INT32_MAX / 4 || x->dims[1] > INT32_MAX / 4 || x->dims[2] > INT32_MAX / 4 ||
	    H > INT32_MAX / 4 || x->dims[0] * H > INT32_MAX)
		return cuda_bad(c, op, KILN_ENOTSUP, "sizes past cuDNN's int");
	struct cuda_rnn *r = calloc(1, sizeof *r);
	if (!r)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for an RNN plan");
	p->rnn = r; /* the caller frees it on failure */
	r->host = c->host;
	r->B = x->dims[0], r->T = x->dims[1], r->I = x->dims[2], r->H = H;
	r->G = gru ? 3 : 4;
	snprintf(r->what, sizeof r->what, "%s %s%s x [%lld,%lld,%lld] hidden %lld%s",
		 cuda_op_name(op->type), gru ? "GRU" : "LSTM", op->i[1] ? " reverse" : "",
		 (long long)r->B, (long long)r->T, (long long)r->I, (long long)r->H,
		 op->i[4] ? " last" : "");
	void *h = NULL;
	kiln_status st = cuda_dnn_handle(c, &h, &r->lock);
	if (st)
		return st;
	r->h = h;
	if ((st = rnn_descriptors(c, r, gru)))
		return st;
	RNN_TRY(cudnnGetRNNWeightSpaceSize(r->h, r->rnn, &r->wspace));
	RNN_TRY(cudnnGetRNNTempSpaceSizes(r->h, r->rnn,
					  training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
					  r->xd, &r->work, &r->reserve));
	if ((st = rnn_scratch(c, p)))
		return st;
	const size_t f = sizeof(float), bt = (size_t)(r->B * r->T);
	r->a_y = training ? RNN_AL(r->reserve) : 0;
	r->a_len = r->a_y + RNN_AL(bt * (size_t)r->H * f);
	r->a_end = training ? r->a_len + RNN_AL(sizeof(int32_t) * (size_t)r->B) : 0;
	r->w_x = RNN_AL(r->work);
	r->w_y = r->w_x + RNN_AL(bt * (size_t)r->I * f);
	r->w_dx = r->w_y + RNN_AL(bt * (size_t)r->H * f);
	p->workspace = r->w_dx + (bwd ? RNN_AL(bt * (size_t)r->I * f) : 0);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->launch = rnn_launch;
	c->host->log(KILN_LOG_DEBUG, "cuda",
		     "%s: weight space %zu, work %zu, reserve %zu, workspace %zu, aux %zu bytes",
		     r->what, r->wspace, r->work, r->reserve, p->workspace, r->a_end);
	return KILN_OK;
}
#else
/* Built without cuDNN: has_op says no RNN; nothing here runs. */
void cuda_rnn_free(struct cuda_rnn *r)
{
	(void)r;
}

size_t cuda_rnn_aux_bytes(const struct cuda_plan *p)
{
	(void)p;
	return 0;
}
#endif
