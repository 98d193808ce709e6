/* plugins/cuda/kernels.cu - kiln's own CUDA kernels: bias add and gradient,
 * ReLU forward/backward, the fused loss (softmax cross-entropy, MSE, BCE:
 * forward, backward and the metric counts in one pass), SGD with momentum
 * and AdamW over the flat buffers, fill, sum, the vector ops, the step
 * counter, the learning-rate schedule, u8 normalisation, the f32/bf16 cast
 * and gradient clipping.  The formulas are plugin.h's; the reference loops
 * are plugins/cpu/ops.c and optim.c.
 *
 * Each op has one launcher, cuda_launch_<op>(plan, args, stream), called
 * by run() on the caller's thread: it only enqueues and returns the launch
 * status.  Sizes come from the plan (checked once in prepare); every per-
 * step scalar (lr, the step counter, the optimizer gate) is read from
 * device memory inside the kernel, never from the host, so one plan serves
 * every step and a captured graph replays correct values.
 *
 * Reductions are deterministic: a fixed grid (CUDA_RED_BLOCKS, or fewer
 * when the shape is smaller, decided by the shape alone), each block sums
 * its fixed share in a fixed order, and one thread adds the block partials
 * in index order.  No float atomics, so a run reproduces bit for bit.  The
 * partials live in a small scratch buffer the plan owns (sz[3] bytes,
 * allocated once in prepare).
 */
#include "cuda.h"

#include <math.h>
#include <stdint.h>

/* Grid-stride loop over [0, n). */
#define FOR_N(i, n)                                                                        \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
	     i += (int64_t)gridDim.x * blockDim.x)

/* Blocks for an elementwise kernel over n: enough to fill the GPU a few
 * times over (p->grid, from the SM count), fewer for small n. */
static int blocks_for(const struct cuda_plan *p, int64_t n)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	if (b > p->grid)
		b = p->grid;
	return b < 1 ? 1 : (int)b;
}

/* ---- bias ------------------------------------------------------------- */

/* y (R, N) += b (N) */
__global__ void k_bias_add(float *y, const float *b, int64_t total, int64_t N)
{
	FOR_N(i, total)
		y[i] += b[i % N];
}

extern "C" cudaError_t cuda_launch_bias_add(const struct cuda_plan *p, const struct kiln_op_args *a,
					    cudaStream_t s)
{
	const int64_t n = p->rows * p->cols;
	k_bias_add<<<blocks_for(p, n), CUDA_THREADS, 0, s>>>((float *)a->out[0],
							     (const float *)a->in[0], n, p->cols);
	return cudaGetLastError();
}

/* db (N) (=|+=) sum over rows of dy (R, N).  Block (32, 8): 32 adjacent
 * columns (coalesced rows), 8 row phases; each phase sums its rows in
 * order, then the 8 phase sums are added in order: a fixed order for a
 * given R, whatever the GPU.  Sums in double: the column is only as wide
 * as a batch, and the result then matches a sequential sum to f32
 * rounding (the conformance bound is 1e-6 of the magnitude). */
__global__ void k_bias_grad(float *db, const float *dy, int64_t R, int64_t N, int acc)
{
	__shared__ double part[8][33];
	const int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x;
	double s = 0.0;
	if (j < N)
		for (int64_t r = threadIdx.y; r < R; r += 8)
			s += dy[r * N + j];
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && j < N) {
		double t = acc ? (double)db[j] : 0.0;
		for (int k = 0; k < 8; k++)
			t += part[k][threadIdx.x];
		db[j] = (float)t;
	}
}

extern "C" cudaError_t cuda_launch_bias_grad(const struct cuda_plan *p, const struct kiln_op_args *a,
					     cudaStream_t s)
{
	const dim3 block(32, 8);
	const unsigned grid = (unsigned)((p->cols + 31) / 32);
	k_bias_grad<<<grid, block, 0, s>>>((float *)a->out[0], (const float *)a->in[0], p->rows,
					   p->cols, (p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- ReLU ------------------------------------------------------------- */

/* y (n) = max(x, 0), x == y allowed; NaN passes through as in PyTorch (and
 * the CPU device), so an overflow stays visible downstream. */
__global__ void k_relu(float *y, const float *x, int64_t n)
{
	FOR_N(i, n)
	{
		const float v = x[i];
		y[i] = v < 0.0f ? 0.0f : v;
	}
}

extern "C" cudaError_t cuda_launch_relu(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_relu<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>((float *)a->out[0],
							     (const float *)a->in[0], p->n);
	return cudaGetLastError();
}

/* dx (n) (=|+=) y > 0 ? dy : 0 with y the forward output: a select, not a
 * product, so an inf dy where y == 0 gives 0, not NaN. */
__global__ void k_relu_bwd(float *dx, const float *y, const float *dy, int64_t n, int acc)
{
	FOR_N(i, n)
	{
		const float g = y[i] > 0.0f ? dy[i] : 0.0f;
		dx[i] = acc ? dx[i] + g : g;
	}
}

extern "C" cudaError_t cuda_launch_relu_bwd(const struct cuda_plan *p, const struct kiln_op_args *a,
					    cudaStream_t s)
{
	k_relu_bwd<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], (const float *)a->in[0], (const float *)a->in[1], p->n,
		(p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- the fused loss ---------------------------------------------------- */

__device__ static double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ static int warp_sum_i(int v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Block partials of the loss: loss sum, top-1 count, top-5 count, rows
 * with a label outside [0, C).  (ops.c sizes the scratch as 4 doubles per
 * block.) */
struct xent_part {
	double loss, ok, ok5, bad;
};
static_assert(sizeof(struct xent_part) == 4 * sizeof(double), "ops.c sizes the scratch so");

/* One warp per row: rows r = warp, warp + W, ... with W the warps of the
 * grid (fixed by R).  x (R, C) logits, label (R) i32, dx (R, C), part
 * [gridDim.x] block partials.  Rows >= V are padding: zero gradient, not
 * counted.  A label outside [0, C) zeroes the row and leaves (row, label)
 * in *err (the smallest row wins), reported by the next host sync. */
__global__ void k_xent(float *dx, struct xent_part *part, const float *x, const int32_t *label,
		       int64_t R, int64_t C, int64_t V, int kind, double f0, const float *lsp,
		       float eps, struct cuda_err_rec *err, int op)
{
	__shared__ struct xent_part wp[CUDA_THREADS / 32];
	/* the gradient scale: f[0], times the device loss scale when in2 is
	 * given, the product in double rounded once (the CPU device's) */
	const float scale = lsp ? (float)(f0 * (double)*lsp) : (float)f0;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int64_t W = (int64_t)gridDim.x * nw;
	double loss = 0, ok = 0, ok5 = 0, bad = 0; /* lane 0's running sums, in row order */

	for (int64_t r = (int64_t)blockIdx.x * nw + w; r < R; r += W) {
		const float *xr = x + r * C;
		float *dr = dx + r * C;
		if (r >= V) {
			for (int64_t j = lane; j < C; j += 32)
				dr[j] = 0.0f;
			continue;
		}
		const int32_t l = label[r];
		if (l < 0 || l >= C) {
			for (int64_t j = lane; j < C; j += 32)
				dr[j] = 0.0f;
			if (lane == 0) {
				err->classes = C;
				err->op = op;
				/* NOTE (unconfirmed without a GPU): a device-scope
				 * atomic on mapped host memory; CUDA only promises it
				 * is not atomic towards the host, which reads it
				 * after a sync.  test_softmax_bad_label checks it. */
				atomicMin(&err->rowlab,
					  ((unsigned long long)r << 32) | (unsigned long long)(uint32_t)l);
			}
			bad += 1;
			continue;
		}
		/* the row's maximum and its first index */
		float mx = -INFINITY;
		int am = (int)C; /* C: this lane saw no element */
		for (int64_t j = lane; j < C; j += 32)
			if (am == C || xr[j] > mx) {
				mx = xr[j];
				am = (int)j;
			}
		for (int o = 16; o > 0; o >>= 1) {
			const float om = __shfl_xor_sync(0xffffffffu, mx, o);
			const int oa = __shfl_xor_sync(0xffffffffu, am, o);
			if (oa != C && (am == C || om > mx || (om == mx && oa < am))) {
				mx = om;
				am = oa;
			}
		}
		/* top-5: how many logits rank above the label's (ties by index) */
		const float xl = xr[l];
		int above = 0;
		for (int64_t j = lane; j < C; j += 32)
			above += xr[j] > xl || (xr[j] == xl && j < l);
		above = warp_sum_i(above);
		double ls;
		if (kind == KILN_LOSS_MSE) {
			double t = 0;
			for (int64_t j = lane; j < C; j += 32) {
				const float d = xr[j] - (j == l ? 1.0f : 0.0f);
				t += (double)d * d;
				dr[j] = scale * 2.0f * d / (float)C;
			}
			ls = warp_sum_d(t) / (double)C;
		} else if (kind == KILN_LOSS_BCE) {
			double t = 0;
			for (int64_t j = lane; j < C; j += 32) {
				const float v = xr[j], tj = j == l ? 1.0f : 0.0f;
				t += (v > 0 ? v : 0) - v * tj + log1p(exp(-fabs((double)v)));
				const float sg = v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
				dr[j] = scale * (sg - tj) / (float)C;
			}
			ls = warp_sum_d(t) / (double)C;
		} else {
			/* softmax with the max subtracted, so exp never overflows */
			double sum = 0, xsum = 0;
			for (int64_t j = lane; j < C; j += 32) {
				sum += expf(xr[j] - mx);
				xsum += (double)xr[j] - mx;
			}
			sum = warp_sum_d(sum);
			xsum = warp_sum_d(xsum);
			const float inv = (float)(1.0 / sum);
			const float off = eps / (float)C, on = 1.0f - eps + off;
			for (int64_t j = lane; j < C; j += 32)
				dr[j] = scale * (expf(xr[j] - mx) * inv - (j == l ? on : off));
			const double lse = log(sum);
			ls = (1.0 - eps) * (lse - ((double)xl - mx)) +
			     (eps > 0 ? eps * (lse - xsum / (double)C) : 0.0);
		}
		loss += ls;
		ok += am == l;
		ok5 += above < 5;
	}
	if (lane == 0) {
		wp[w].loss = loss;
		wp[w].ok = ok;
		wp[w].ok5 = ok5;
		wp[w].bad = bad;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		struct xent_part t = { 0, 0, 0, 0 };
		for (int k = 0; k < nw; k++) {
			t.loss += wp[k].loss;
			t.ok += wp[k].ok;
			t.ok5 += wp[k].ok5;
			t.bad += wp[k].bad;
		}
		part[blockIdx.x] = t;
	}
}

/* m [2 or 3] += the block partials, in block order; left untouched when
 * a row had a bad label (the run fails with KILN_EDATA at the next sync,
 * and the CPU device leaves the metrics alone then too) */
__global__ void k_xent_sum(float *m, const struct xent_part *part, int nb, int top5)
{
	double l = 0, o = 0, o5 = 0, bad = 0;
	for (int b = 0; b < nb; b++) {
		l += part[b].loss;
		o += part[b].ok;
		o5 += part[b].ok5;
		bad += part[b].bad;
	}
	if (bad > 0)
		return;
	m[0] = (float)(m[0] + l);
	m[1] = (float)(m[1] + o);
	if (top5)
		m[2] = (float)(m[2] + o5);
}

extern "C" cudaError_t cuda_launch_softmax_xent(const struct cuda_plan *p,
						const struct kiln_op_args *a, cudaStream_t s)
{
	const int64_t R = p->rows, nw = CUDA_THREADS / 32;
	int64_t nb = (R + nw - 1) / nw;
	if (nb > CUDA_RED_BLOCKS)
		nb = CUDA_RED_BLOCKS;
	if (nb < 1)
		nb = 1;
	struct xent_part *part = (struct xent_part *)p->scratch;
	k_xent<<<(unsigned)nb, CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], part, (const float *)a->in[0], (const int32_t *)a->in[1], R,
		p->cols, p->op.i[0], (int)p->op.i[1], p->op.f[0],
		p->op.n_in == 3 ? (const float *)a->in[2] : NULL, (float)p->op.f[1], p->err,
		p->op.type);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_xent_sum<<<1, 1, 0, s>>>((float *)a->out[1], part, (int)nb, p->sz[0] >= 3);
	return cudaGetLastError();
}

/* ---- optimizers -------------------------------------------------------- */

/* SGD over n: g (n) grads, lr [1] (device), d (n) weight-decay multiplier
 * or NULL, gate [1] or NULL (0: a skipped step); w (n) params, v (n)
 * momentum or NULL (mu = 0).  plugin.h:
 *   g' = g + l2*d*w;  v = mu*v + g';  w -= lr*dw*d*w + lr*(nesterov ? g' + mu*v : v) */
__global__ void k_sgd(float *w, float *v, const float *g, const float *lrp, const float *d,
		      const float *gate, int64_t n, float mu, float l2, float dwd, int nesterov)
{
	if (gate && *gate == 0.0f)
		return;
	const float lr = *lrp, lrdw = lr * dwd;
	FOR_N(i, n)
	{
		const float di = d ? d[i] : 1.0f;
		const float wi = w[i];
		const float gi = g[i] + l2 * di * wi;
		const float vi = v ? mu * v[i] + gi : gi;
		if (v)
			v[i] = vi;
		w[i] = wi - lrdw * di * wi - lr * (nesterov ? gi + mu * vi : vi);
	}
}

/* KILN_OPF_GATED: the last input is the gate; the op's own inputs precede it. */
static int own_inputs(const struct kiln_op *op)
{
	return op->n_in - ((op->flags & KILN_OPF_GATED) != 0);
}

static const float *gate_of(const struct cuda_plan *p, const struct kiln_op_args *a)
{
	return (p->op.flags & KILN_OPF_GATED) ? (const float *)a->in[p->op.n_in - 1] : NULL;
}

extern "C" cudaError_t cuda_launch_sgd(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	const float *d = own_inputs(&p->op) > 2 ? (const float *)a->in[2] : NULL;
	float *v = p->n_out > 1 ? (float *)a->out[1] : NULL;
	k_sgd<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], v, (const float *)a->in[0], (const float *)a->in[1], d,
		gate_of(p, a), p->n, (float)p->op.f[0], (float)p->op.f[1], (float)p->op.f[2],
		p->op.i[1] != 0);
	return cudaGetLastError();
}

/* AdamW as torch.optim.AdamW (plugin.h): g (n), lr [1], t [1] i64 1-based,
 * d (n) or NULL, gate or NULL; w, m, v (n).  The bias corrections come
 * from the device's t, in double as PyTorch computes them on the host. */
__global__ void k_adamw(float *w, float *m, float *v, const float *g, const float *lrp,
			const int64_t *tp, const float *d, const float *gate, int64_t n, float b1,
			float b2, float omb1, float omb2, float eps, float wd)
{
	if (gate && *gate == 0.0f)
		return;
	const int64_t t = *tp;
	if (t < 1)
		return; /* NOTE: the CPU device fails the run with EINVAL here (the
			 * count is 1-based); a kernel cannot, so the step is skipped */
	const float lr = *lrp;
	const float inv_c1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
	const float inv_sqrt_c2 = (float)(1.0 / sqrt(1.0 - pow((double)b2, (double)t)));
	const float lrwd = lr * wd;
	FOR_N(i, n)
	{
		const float di = d ? d[i] : 1.0f;
		const float gi = g[i];
		const float mi = b1 * m[i] + omb1 * gi;
		const float vi = b2 * v[i] + omb2 * gi * gi;
		m[i] = mi;
		v[i] = vi;
		const float dir = (mi * inv_c1) / (sqrtf(vi) * inv_sqrt_c2 + eps);
		w[i] = w[i] * (1.0f - lrwd * di) - lr * dir;
	}
}

extern "C" cudaError_t cuda_launch_adamw(const struct cuda_plan *p, const struct kiln_op_args *a,
					 cudaStream_t s)
{
	const float *d = own_inputs(&p->op) > 3 ? (const float *)a->in[3] : NULL;
	k_adamw<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], (float *)a->out[1], (float *)a->out[2], (const float *)a->in[0],
		(const float *)a->in[1], (const int64_t *)a->in[2], d, gate_of(p, a), p->n,
		(float)p->op.f[0], (float)p->op.f[1],
		/* 1 - beta rounded from double, not 1.0f - (float)beta: for
		 * beta2 = 0.999 the two differ by 1.3e-5 relative */
		(float)(1.0 - p->op.f[0]), (float)(1.0 - p->op.f[1]), (float)p->op.f[2],
		(float)p->op.f[3]);
	return cudaGetLastError();
}

/* ---- fill, counters, schedule ----------------------------------------- */

/* y (n elements of `width` bytes) = the bit pattern `bits` (converted to
 * the dtype in prepare, on the host) */
__global__ void k_fill(void *y, int64_t n, int width, unsigned long long bits)
{
	FOR_N(i, n)
	{
		switch (width) {
		case 1: ((uint8_t *)y)[i] = (uint8_t)bits; break;
		case 2: ((uint16_t *)y)[i] = (uint16_t)bits; break;
		case 4: ((uint32_t *)y)[i] = (uint32_t)bits; break;
		default: ((unsigned long long *)y)[i] = bits; break;
		}
	}
}

extern "C" cudaError_t cuda_launch_fill(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_fill<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], p->n, (int)p->sz[1],
							     (unsigned long long)p->sz[0]);
	return cudaGetLastError();
}

/* c i64[1] += k: the trainer's micro-step counter; with a gate (NULL:
 * none), the optimizer's step count, not advanced by a skipped step */
__global__ void k_counter_add(int64_t *c, int64_t k, const float *gate)
{
	if (gate && *gate == 0.0f)
		return;
	*c += k;
}

extern "C" cudaError_t cuda_launch_counter_add(const struct cuda_plan *p,
					       const struct kiln_op_args *a, cudaStream_t s)
{
	k_counter_add<<<1, 1, 0, s>>>((int64_t *)a->out[0], p->op.i[0], gate_of(p, a));
	return cudaGetLastError();
}

/* The schedule's constants, passed by value (the step is on the device). */
struct sched_k {
	int64_t i[16];
	double f[8];
};

/* lr f32[1] = schedule(step i64[1]): KILN_OP_LR_SCHEDULE in plugin.h, in
 * double like the CPU device's loop. */
__global__ void k_lr_schedule(float *out, const int64_t *step, struct sched_k k)
{
	const int64_t t = *step, T = k.i[1], W = k.i[2];
	const double base = k.f[0], fin = k.f[1];
	double lr = base;
	const int64_t U = T - W > 1 ? T - W : 1, u = t - W;
	if (t < W) {
		lr = base * (double)(t + 1) / (double)W;
	} else if (k.i[0] == KILN_SCHED_COSINE) {
		const int64_t v = u < U ? u : U;
		lr = fin + (base - fin) * (1.0 + cos(M_PI * (double)v / (double)U)) / 2.0;
	} else if (k.i[0] == KILN_SCHED_STEP) {
		lr = base * pow(k.f[2], (double)(u / k.i[3]));
	} else if (k.i[0] == KILN_SCHED_MULTISTEP) {
		int m = 0;
		for (int64_t j = 0; j < k.i[3]; j++)
			m += k.i[4 + j] <= u;
		lr = base * pow(k.f[2], (double)m);
	} else if (k.i[0] == KILN_SCHED_ONECYCLE) {
		/* torch.optim.lr_scheduler.OneCycleLR, two phases, cosine */
		const double init = base / k.f[2], end = init / k.f[3];
		const double e1 = k.f[4] * (double)U - 1, e2 = (double)U - 1;
		double from, to, pct;
		if ((double)u <= e1) {
			from = init, to = base, pct = (double)u / e1;
		} else {
			from = base, to = end, pct = ((double)u - e1) / (e2 - e1);
		}
		lr = to + (from - to) / 2.0 * (1.0 + cos(M_PI * pct));
	}
	*out = (float)lr;
}

extern "C" cudaError_t cuda_launch_lr_schedule(const struct cuda_plan *p,
					       const struct kiln_op_args *a, cudaStream_t s)
{
	struct sched_k k;
	for (int j = 0; j < 16; j++)
		k.i[j] = p->op.i[j];
	for (int j = 0; j < 8; j++)
		k.f[j] = p->op.f[j];
	k_lr_schedule<<<1, 1, 0, s>>>((float *)a->out[0], (const int64_t *)a->in[0], k);
	return cudaGetLastError();
}

/* ---- sums --------------------------------------------------------------- */

/* Block-wide sum of one double per thread, in a fixed tree order. */
__device__ static double block_sum_d(double v)
{
	__shared__ double sh[CUDA_THREADS / 32];
	v = warp_sum_d(v);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	double t = 0;
	if (threadIdx.x == 0)
		for (int k = 0; k < (int)(blockDim.x >> 5); k++)
			t += sh[k];
	__syncthreads();
	return t; /* valid in thread 0 */
}

/* part[block] = sum of x (n) over the block's grid-stride share,
 * accumulated in double.  sq: the sum of squares of x * (1/s) instead (s =
 * *sp, the loss scale of UNSCALE, or 1 when sp is NULL), each square taken
 * in f32 as the CPU device (and PyTorch's f32 norm) does, so an element
 * whose square overflows f32 makes the norm infinite on every device and
 * the step is skipped alike. */
__global__ void k_partial_sum(double *part, const float *x, int64_t n, int sq, const float *sp)
{
	const float inv = sp ? 1.0f / *sp : 1.0f;
	double t = 0;
	FOR_N(i, n)
	{
		if (sq) {
			const float v = x[i] * inv;
			t += (double)(v * v);
		} else {
			t += (double)x[i];
		}
	}
	t = block_sum_d(t);
	if (threadIdx.x == 0)
		part[blockIdx.x] = t;
}

/* the number of partial-sum blocks for n elements: fixed by n */
static int red_blocks(int64_t n)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	return b > CUDA_RED_BLOCKS ? CUDA_RED_BLOCKS : b < 1 ? 1 : (int)b;
}

/* s [1] (=|+=) the partials, in block order */
__global__ void k_sum_final(float *s, const double *part, int nb, int acc)
{
	double t = acc ? (double)s[0] : 0.0;
	for (int b = 0; b < nb; b++)
		t += part[b];
	s[0] = (float)t;
}

extern "C" cudaError_t cuda_launch_reduce_sum(const struct cuda_plan *p,
					      const struct kiln_op_args *a, cudaStream_t s)
{
	const int nb = red_blocks(p->n);
	double *part = (double *)p->scratch;
	k_partial_sum<<<nb, CUDA_THREADS, 0, s>>>(part, (const float *)a->in[0], p->n, 0, NULL);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_sum_final<<<1, 1, 0, s>>>((float *)a->out[0], part, nb,
				    (p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

/* ---- vector ops ------------------------------------------------------- */

enum { VEC_SCALE, VEC_ADD, VEC_MUL };

/* y (n) (=|+=) s*x0, x0 + x1 or x0 * x1; y may alias an input */
__global__ void k_vec(float *y, const float *x0, const float *x1, float sc, int64_t n, int kind,
		      int acc)
{
	FOR_N(i, n)
	{
		const float v = kind == VEC_SCALE ? sc * x0[i] : kind == VEC_ADD ? x0[i] + x1[i]
									    : x0[i] * x1[i];
		y[i] = acc ? y[i] + v : v;
	}
}

static cudaError_t launch_vec(const struct cuda_plan *p, const struct kiln_op_args *a,
			      cudaStream_t s, int kind)
{
	k_vec<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], (const float *)a->in[0],
		kind == VEC_SCALE ? NULL : (const float *)a->in[1], (float)p->op.f[0], p->n, kind,
		(p->op.flags & KILN_OPF_ACCUMULATE) != 0);
	return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_scale(const struct cuda_plan *p, const struct kiln_op_args *a,
					 cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_SCALE);
}

extern "C" cudaError_t cuda_launch_add(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_ADD);
}

extern "C" cudaError_t cuda_launch_mul(const struct cuda_plan *p, const struct kiln_op_args *a,
				       cudaStream_t s)
{
	return launch_vec(p, a, s, VEC_MUL);
}

/* ---- input conversion -------------------------------------------------- */

/* The normalisation table: (u/255 - mean[c]) / std[c] for every u8 value
 * of each channel, computed in double on the host at prepare exactly as
 * the CPU device does, passed by value (3 KiB of kernel parameters). */
struct norm_lut {
	float v[3][256];
};

/* y f32 (n) = lut[c][x u8], c the channel of element i: (i / HW) % C for
 * NCHW, i % C for NHWC */
__global__ void k_normalize_u8(float *y, const uint8_t *x, int64_t n, int64_t C, int64_t hw,
			       int nhwc, struct norm_lut lut)
{
	FOR_N(i, n)
	{
		const int64_t c = C == 1 ? 0 : nhwc ? i % C : (i / hw) % C;
		y[i] = lut.v[c][x[i]];
	}
}

extern "C" cudaError_t cuda_launch_normalize_u8(const struct cuda_plan *p,
						const struct kiln_op_args *a, cudaStream_t s)
{
	struct norm_lut lut;
	for (int c = 0; c < 3; c++)
		for (int u = 0; u < 256; u++)
			lut.v[c][u] = p->lut[c][u];
	k_normalize_u8<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(
		(float *)a->out[0], (const uint8_t *)a->in[0], p->n, p->sz[0], p->sz[1],
		p->op.in[0].layout == KILN_NHWC, lut);
	return cudaGetLastError();
}

/* bf16 from f32, round to nearest even, NaN kept quiet (the CPU device's) */
__device__ static uint16_t to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* y = x converted f32 -> bf16 (to_bf16) or bf16 -> f32 (exact) */
__global__ void k_cast(void *y, const void *x, int64_t n, int from_bf16)
{
	FOR_N(i, n)
	{
		if (from_bf16)
			((float *)y)[i] = __uint_as_float((uint32_t)((const uint16_t *)x)[i] << 16);
		else
			((uint16_t *)y)[i] = to_bf16(((const float *)x)[i]);
	}
}

extern "C" cudaError_t cuda_launch_cast(const struct cuda_plan *p, const struct kiln_op_args *a,
					cudaStream_t s)
{
	k_cast<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(a->out[0], a->in[0], p->n,
							     p->op.in[0].dtype == KILN_BF16);
	return cudaGetLastError();
}

/* ---- gradient clipping and the non-finite check ------------------------ */

/* state f32[4] (plugin.h KILN_OP_GRAD_CLIP, KILN_OP_UNSCALE) from the
 * squared partials; k[0] = the factor to apply (the clip factor times 1/s
 * for UNSCALE, rounded once as the CPU device does), k[1] = 1 when the
 * gradients are to be rewritten (finite and: scaled, clamped or copied).
 * sp: UNSCALE's scaler state (s = sp[0]), NULL for GRAD_CLIP. */
__global__ void k_clip_norm(float *state, float *k, const double *part, int nb, double max_norm,
			    float lim, int copy, const float *sp)
{
	const float inv = sp ? 1.0f / *sp : 1.0f;
	double ss = 0;
	for (int b = 0; b < nb; b++)
		ss += part[b];
	const double norm = sqrt(ss);
	state[0] = (float)norm;
	if (!isfinite(norm)) {
		state[1] = 0.0f;
		state[2] += 1.0f;
		k[0] = 1.0f;
		k[1] = 0.0f;
		return;
	}
	state[1] = 1.0f;
	float scale = 1.0f;
	if (max_norm > 0 && norm > max_norm) {
		scale = (float)(max_norm / (norm + 1e-6));
		state[3] += 1.0f;
	}
	scale *= inv;
	k[0] = scale;
	k[1] = scale != 1.0f || lim > 0 || copy ? 1.0f : 0.0f;
}

/* y (n) = clamp(g * k[0], -lim, lim) when k[1] says so */
__global__ void k_clip_apply(float *y, const float *g, const float *k, int64_t n, float lim)
{
	if (k[1] == 0.0f)
		return;
	const float scale = k[0];
	FOR_N(i, n)
	{
		float v = g[i] * scale;
		if (lim > 0)
			v = v > lim ? lim : v < -lim ? -lim : v;
		y[i] = v;
	}
}

/* GRAD_CLIP, and UNSCALE (the same three kernels with in1 the scaler
 * state): at s = 1 both give the same bits. */
extern "C" cudaError_t cuda_launch_grad_clip(const struct cuda_plan *p,
					     const struct kiln_op_args *a, cudaStream_t s)
{
	const int nb = red_blocks(p->n);
	double *part = (double *)p->scratch;
	float *k = (float *)(part + CUDA_RED_BLOCKS);
	const float *g = (const float *)a->in[0];
	const float *sp = p->op.type == KILN_OP_UNSCALE ? (const float *)a->in[1] : NULL;
	float *y = (float *)a->out[0];
	k_partial_sum<<<nb, CUDA_THREADS, 0, s>>>(part, g, p->n, 1, sp);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_clip_norm<<<1, 1, 0, s>>>((float *)a->out[1], k, part, nb, p->op.f[0], (float)p->op.f[1],
				    y != g, sp);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_clip_apply<<<blocks_for(p, p->n), CUDA_THREADS, 0, s>>>(y, g, k, p->n, (float)p->op.f[1]);
	return cudaGetLastError();
}

/* ---- dynamic loss scaling ------------------------------------------------ */

/* KILN_OP_SCALER_UPDATE (plugin.h), one thread: gate f32[4] (GRAD_CLIP's,
 * [1] the finite flag), st f32[4] (scale, growth tracker, hysteresis left,
 * overflows) updated in place; the CPU device's arithmetic exactly. */
__global__ void k_scaler_update(float *st, const float *gate, double growth, double backoff,
				double lo, double hi, int64_t interval, int64_t hyst)
{
	if (gate[1] != 0.0f) {
		st[1] += 1.0f;
		if (st[1] >= (float)interval) {
			const float grown = (float)((double)st[0] * growth);
			if (isfinite(grown) && (hi <= 0 || grown <= hi))
				st[0] = grown;
			st[1] = 0.0f;
			st[2] = (float)hyst;
		}
	} else {
		st[3] += 1.0f;
		st[1] = 0.0f;
		st[2] -= 1.0f;
		if (st[2] <= 0.0f) {
			const double v = (double)st[0] * backoff;
			st[0] = (float)(v > lo ? v : lo);
		}
	}
}

extern "C" cudaError_t cuda_launch_scaler_update(const struct cuda_plan *p,
						 const struct kiln_op_args *a, cudaStream_t s)
{
	k_scaler_update<<<1, 1, 0, s>>>((float *)a->out[0], (const float *)a->in[0], p->op.f[0],
					p->op.f[1], p->op.f[2], p->op.f[3], p->op.i[0], p->op.i[1]);
	return cudaGetLastError();
}
