/* plugins/cpu/optim.c - the fused optimizer steps: SGD (momentum with
 * dampening, Nesterov, L2 or decoupled weight decay), AdamW (and Adam, with
 * amsgrad) and LAMB, each one op over the flat parameter buffer (kiln/ops.h
 * states the exact formulas).
 *
 * Every per-step scalar (lr, the step count t) is read from the op's
 * device arguments when the kernel runs, never baked into the plan.  The
 * elementwise parts are span functions cloned for AVX-512/AVX2
 * (CPU_CLONES) and run over one contiguous span per thread (CPU_SPANS);
 * with $KILN_CPU_AFFINE=1 SGD and AdamW give each thread the rows of each
 * weight gradient that thread wrote (CPU_AFFINE_FOR, split.c: with the
 * vCPUs on two CCDs the whole SGD update took 5-6x as long, 314-387
 * against 62 us in session 48's profiles, and in bench/affine_split the
 * affine split took 22-54% off the far placement's update; no gain
 * measured in kiln's runs: docs/PERFORMANCE.md, "Session 50").
 * The optional weight-decay multiplier d (parameter groups) selects a
 * separate loop, so the common case (no groups) reads no extra stream.
 * The plugin is built with -fno-math-errno: otherwise sqrtf's errno keeps
 * the Adam loops scalar (the square root is the same IEEE one).
 *
 * LAMB's trust ratio needs the 2-norms of every parameter tensor before
 * the update: pass 1 updates the moments and sums p*p and u*u over fixed
 * pieces (a tensor cut at a fixed 16384-element grid), pass 2 applies
 * p -= lr*r*u recomputing u from the stored moments.  The pieces do not
 * depend on the thread count and are summed per tensor in order, so the
 * result is bit-identical for any [run] threads.
 *
 * Optimizer state (SGD's momentum, the Adam moments, amsgrad's vmax) whose
 * magnitude falls below FLT_MIN is stored as a zero of its sign
 * (opt_state; kiln/ops.h, "Optimizer state below FLT_MIN").  The momentum
 * of a unit whose gradient is 0 (a dead ReLU) decays geometrically, v =
 * 0.9 v, and reaches the subnormal range after some 800 steps; from then
 * on every multiply that reads it or writes it costs x86 a microcode
 * assist (session 45: the Fashion-MNIST MLP's epochs 3 and 4 ran at 56-70k
 * samples/s against 80-86k).  Flushing the state here, with a compare and
 * a mask in each clone's vectors, leaves the caller's floating-point
 * environment (MXCSR) alone: kiln is also a library (kiln_infer).  The
 * update reads the state as stored, so LAMB's two passes agree.  The Adam
 * family flushes only with eps >= 1e-10 (ADAM_FLUSH_EPS).
 */
#include "cpu.h"

static int own_inputs(const struct kiln_op *op);

#include <float.h>    /* FLT_MIN */
#include <math.h>     /* sqrtf, sqrt, pow, fabsf, copysignf */
#include <stdio.h>
#include <string.h>

/* The compute copy (an optional last output of bf16 or f16, see plugin.h):
 * written block by block right after the block's update, while the block
 * is in cache, so the step stays one pass over the parameters. */
#define OPT_BLOCK 4096
#define OPT_COPY(p, a) ((p)->sz[7] ? (a)->out[(p)->n_out - 1] : NULL)
#define OPT_BLOCKS(b, en, bb, be, body)                                                   \
	for (int64_t bb = (b); bb < (en); bb += OPT_BLOCK) {                              \
		const int64_t be = bb + OPT_BLOCK < (en) ? bb + OPT_BLOCK : (en);         \
		body;                                                                     \
	}
static inline void opt_copy(void *cp, int dtype, const float *w, int64_t b, int64_t e)
{
	if (cp)
		cpu_cvt_span_from_f32((uint16_t *)cp + b, w + b, dtype, e - b);
}

/* A new value x of optimizer state as it is stored: a zero of x's sign
 * when |x| < FLT_MIN (a subnormal), else x itself (NaN and infinities
 * too).  Bit operations on the compared lanes (no arithmetic, which would
 * itself take the assist), vectorized in every clone; the same bits on
 * every ISA. */
static inline float opt_state(float x)
{
	return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

/* The Adam family flushes its state only when eps >= ADAM_FLUSH_EPS
 * (kiln/ops.h): sqrt(v) of a subnormal v is below 1.1e-19, negligible
 * beside such an eps, while with eps = 0 a flushed v divides m by 0 (inf)
 * and flushed m and v give 0/0 (NaN) where IEEE stayed finite.  Below it
 * the state is IEEE (a separate loop: ADAM_STATE's FL = 0). */
#define ADAM_FLUSH_EPS 1e-10
#define ADAM_STATE(FL, x) ((FL) ? opt_state(x) : (x))

/* ---- SGD -------------------------------------------------------------- */

/* One element of SGD; the flags are constants at every call site, so each
 * variant compiles to its own branch-free loop.  w, v, g, d, c: (n).
 * The momentum is stored through opt_state, and the update reads it so.
 * DAMP (with HAS_V): torch.optim.SGD's dampening, v = mv*v + omd*g, where
 * (mv, omd) = (0, 1) on the first step (v = g) and (mu, 1 - dampening)
 * after; a separate loop, so that the undamped arithmetic is unchanged. */
#define SGD_BODY(HAS_V, NESTEROV, HAS_D, HAS_C, DAMP)                                    \
	do {                                                                             \
		const float di = (HAS_D) ? d[i] : 1.0f;                                  \
		const float wi = w[i];                                                   \
		const float gi = g[i] + l2 * di * wi;                                    \
		const float vi = !(HAS_V) ? gi                                           \
				 : opt_state((DAMP) ? mv * v[i] + omd * gi : mu * v[i] + gi); \
		if (HAS_V)                                                               \
			v[i] = vi;                                                       \
		const float wn = wi - lrdw * di * wi - lr * ((NESTEROV) ? gi + mu * vi : vi);   \
		w[i] = wn;                                                               \
		if (HAS_C)                                                               \
			c[i] = cpu_bf16_round(wn);                                       \
	} while (0)

#define SGD_LOOP(HAS_V, NESTEROV, HAS_D, HAS_C)                                          \
	do {                                                                             \
		_Pragma("omp simd")                                                      \
		for (int64_t i = 0; i < n; i++)                                          \
			SGD_BODY(HAS_V, NESTEROV, HAS_D, HAS_C, 0);                      \
	} while (0)

#define SGD_DAMP_LOOP(NESTEROV, HAS_D, HAS_C)                                            \
	do {                                                                             \
		_Pragma("omp simd")                                                      \
		for (int64_t i = 0; i < n; i++)                                          \
			SGD_BODY(1, NESTEROV, HAS_D, HAS_C, 1);                          \
	} while (0)

/* The constants of SGD's momentum update: mu (nesterov's look-ahead),
 * and with a dampening (damp) the update's mv and omd of SGD_BODY. */
struct sgd_k {
	float mu, mv, omd;
	int damp;
};

/* The update of n elements; c (n) NULL, or the bf16 compute copy of the
 * updated w, rounded in the same loop (session 15: one pass over the
 * block instead of the update and then f32_to_bf16_span re-reading w;
 * the same expressions, so the same bytes). */
CPU_CLONES static void sgd_span(float *restrict w, float *restrict v, const float *restrict g,
				const float *restrict d, uint16_t *restrict c, int64_t n, float lr,
				struct sgd_k k, float l2, float lrdw, int nesterov)
{
	const float mu = k.mu, mv = k.mv, omd = k.omd;
	if (v && k.damp) {
		switch ((c != NULL) * 4 + (nesterov != 0) * 2 + (d != NULL)) {
		case 0: SGD_DAMP_LOOP(0, 0, 0); break;
		case 1: SGD_DAMP_LOOP(0, 1, 0); break;
		case 2: SGD_DAMP_LOOP(1, 0, 0); break;
		case 3: SGD_DAMP_LOOP(1, 1, 0); break;
		case 4: SGD_DAMP_LOOP(0, 0, 1); break;
		case 5: SGD_DAMP_LOOP(0, 1, 1); break;
		case 6: SGD_DAMP_LOOP(1, 0, 1); break;
		default: SGD_DAMP_LOOP(1, 1, 1); break;
		}
		return;
	}
	switch ((c != NULL) * 8 + (v != NULL) * 4 + (nesterov != 0) * 2 + (d != NULL)) {
	case 0: SGD_LOOP(0, 0, 0, 0); break;
	case 1: SGD_LOOP(0, 0, 1, 0); break;
	case 2: SGD_LOOP(0, 1, 0, 0); break;
	case 3: SGD_LOOP(0, 1, 1, 0); break;
	case 4: SGD_LOOP(1, 0, 0, 0); break;
	case 5: SGD_LOOP(1, 0, 1, 0); break;
	case 6: SGD_LOOP(1, 1, 0, 0); break;
	case 7: SGD_LOOP(1, 1, 1, 0); break;
	case 8: SGD_LOOP(0, 0, 0, 1); break;
	case 9: SGD_LOOP(0, 0, 1, 1); break;
	case 10: SGD_LOOP(0, 1, 0, 1); break;
	case 11: SGD_LOOP(0, 1, 1, 1); break;
	case 12: SGD_LOOP(1, 0, 0, 1); break;
	case 13: SGD_LOOP(1, 0, 1, 1); break;
	case 14: SGD_LOOP(1, 1, 0, 1); break;
	default: SGD_LOOP(1, 1, 1, 1); break;
	}
}

/* SGD over n elements: g (n) grads, lr [1] (device), t [1] (i64, 1-based;
 * only with a dampening f[3] != 0), d (n) weight-decay multiplier or
 * absent, w (n) params, v (n) momentum (absent when mu = 0):
 *   g' = g + l2*d*w;  v = mu*v + g';  w -= lr*dw*d*w + lr*(nesterov ? g' + mu*v : v)
 * with w on the right the params before the step; with a dampening, v =
 * g' at t = 1 and mu*v + (1 - f[3])*g' after (torch.optim.SGD). */
static kiln_status cpu_sgd(const struct cpu_plan *p, const struct kiln_op_args *a,
			   struct cpu_err *e)
{
	const int damp = p->op.f[3] != 0.0; /* in2 is the step count */
	const float *g = a->in[0];
	const float lr = *(const float *)a->in[1];
	const float *d = own_inputs(&p->op) > 2 + damp ? a->in[2 + damp] : NULL;
	if (cpu_optim_gated_off(p, a))
		return KILN_OK; /* a skipped step */
	float *w = a->out[0];
	float *v = p->n_out - (p->sz[7] != 0) > 1 ? a->out[1] : NULL;
	void *cp = OPT_COPY(p, a);
	const int cdt = (int)p->sz[6];
	const float l2 = (float)p->op.f[1];
	const float lrdw = lr * (float)p->op.f[2];
	const int nesterov = p->op.i[1] != 0;
	struct sgd_k k = { (float)p->op.f[0], (float)p->op.f[0], 1.0f, damp };
	if (damp) {
		const int64_t t = *(const int64_t *)a->in[2];
		if (t < 1)
			return cpu_fail(e, KILN_EINVAL, "cpu: SGD: step count %lld; it is 1-based (advance it before the step)",
					(long long)t);
		/* PyTorch's first momentum buffer is the gradient, undamped */
		k.mv = t == 1 ? 0.0f : k.mu;
		k.omd = t == 1 ? 1.0f : (float)(1.0 - p->op.f[3]);
	}
	uint16_t *cb = cdt == KILN_BF16 ? cp : NULL; /* bf16: rounded inside the update */
	CPU_AFFINE_FOR(g, p->n, b, en, OPT_BLOCKS(b, en, bb, be, {
		sgd_span(w + bb, v ? v + bb : NULL, g + bb, d ? d + bb : NULL, cb ? cb + bb : NULL,
			 be - bb, lr, k, l2, lrdw, nesterov);
		if (!cb)
			opt_copy(cp, cdt, w, bb, be);
	}));
	return KILN_OK;
}

/* ---- Adam moments, shared by AdamW and LAMB ------------------------------ */

/* The per-step scalars of an Adam-style step, from the op's constants and
 * the device's step count t (1-based). */
struct adam_k {
	float b1, b2, omb1, omb2; /* beta1, beta2, 1 - beta1, 1 - beta2 */
	float eps, wd;
	float l2;                 /* ADAMW's L2 weight decay f[4] (Adam's) */
	float inv_c1;             /* 1 / (1 - beta1^t) */
	float inv_sqrt_c2;        /* 1 / sqrt(1 - beta2^t) */
	int flush;                /* eps >= ADAM_FLUSH_EPS: state through opt_state */
};

/* The constants of step t = in[2] (i64, 1-based) of an Adam-family op
 * (f: beta1, beta2, eps, wd, l2); KILN_EINVAL naming `name` when t < 1. */
static kiln_status adam_scalars(const struct cpu_plan *p, const struct kiln_op_args *a,
				const char *name, struct adam_k *k, struct cpu_err *e)
{
	const struct kiln_op *op = &p->op;
	const int64_t t = *(const int64_t *)a->in[2];
	if (t < 1)
		return cpu_fail(e, KILN_EINVAL, "cpu: %s: step count %lld; it is 1-based (advance it before the step)",
				name, (long long)t);
	const double b1 = op->f[0], b2 = op->f[1];
	k->b1 = (float)b1;
	k->b2 = (float)b2;
	k->omb1 = (float)(1.0 - b1);
	k->omb2 = (float)(1.0 - b2);
	k->eps = (float)op->f[2];
	k->wd = (float)op->f[3];
	k->l2 = (float)op->f[4];
	k->flush = op->f[2] >= ADAM_FLUSH_EPS;
	/* in double, as PyTorch computes them on the host */
	k->inv_c1 = (float)(1.0 / (1.0 - pow(b1, (double)t)));
	k->inv_sqrt_c2 = (float)(1.0 / sqrt(1.0 - pow(b2, (double)t)));
	return KILN_OK;
}

/* Moments of one element with gradient `gi`: m, v updated in place (with
 * FL, as opt_state stores them); returns m/c1 / vh of the stored moments. */
#define ADAM_DIR(i, gi, FL)                                                              \
	({                                                                               \
		const float gi_ = (gi);                                                  \
		const float mi_ = ADAM_STATE(FL, k.b1 * m[i] + k.omb1 * gi_);            \
		const float vi_ = ADAM_STATE(FL, k.b2 * v[i] + k.omb2 * gi_ * gi_);      \
		m[i] = mi_;                                                              \
		v[i] = vi_;                                                              \
		(mi_ * k.inv_c1) / (sqrtf(vi_) * k.inv_sqrt_c2 + k.eps);                 \
	})

/* AMSGrad's moments of one element with gradient `gi`: m, v and the
 * largest v so far, vx, updated in place (the max of the stored moments,
 * NaN from v kept, as torch.maximum; with FL vx through opt_state too, for
 * a subnormal vx of a checkpoint written before session 45); returns
 * m/c1 / vh of vx. */
#define ADAM_DIR_AMS(i, gi, FL)                                                          \
	({                                                                               \
		const float gi_ = (gi);                                                  \
		const float mi_ = ADAM_STATE(FL, k.b1 * m[i] + k.omb1 * gi_);            \
		const float vi_ = ADAM_STATE(FL, k.b2 * v[i] + k.omb2 * gi_ * gi_);      \
		const float xi_ = ADAM_STATE(FL, vx[i] >= vi_ ? vx[i] : vi_);            \
		m[i] = mi_;                                                              \
		v[i] = vi_;                                                              \
		vx[i] = xi_;                                                             \
		(mi_ * k.inv_c1) / (sqrtf(xi_) * k.inv_sqrt_c2 + k.eps);                 \
	})

/* ---- AdamW ------------------------------------------------------------ */

/* HAS_L2: Adam's L2 term added to the gradient before the moments; AMS:
 * amsgrad (ADAM_DIR_AMS); FL: the state flushed (ADAM_STATE).  Separate
 * loops, so that AdamW's arithmetic is unchanged. */
#define ADAMW_LOOP(HAS_D, HAS_L2, AMS, FL)                                               \
	do {                                                                             \
		_Pragma("omp simd")                                                      \
		for (int64_t i = 0; i < n; i++) {                                        \
			const float di = (HAS_D) ? d[i] : 1.0f;                          \
			const float gi = (HAS_L2) ? g[i] + k.l2 * di * w[i] : g[i];      \
			const float dir = (AMS) ? ADAM_DIR_AMS(i, gi, FL)                \
						: ADAM_DIR(i, gi, FL);                   \
			w[i] = w[i] * (1.0f - lrwd * di) - lr * dir;                     \
		}                                                                        \
	} while (0)

/* vx (n): amsgrad's largest second moments, or NULL (amsgrad off) */
CPU_CLONES static void adamw_span(float *restrict w, float *restrict m, float *restrict v,
				  float *restrict vx, const float *restrict g,
				  const float *restrict d, int64_t n, float lr, struct adam_k k)
{
	const float lrwd = lr * k.wd;
	switch ((k.flush != 0) * 8 + (vx != NULL) * 4 + (k.l2 != 0.0f) * 2 + (d != NULL)) {
	case 0: ADAMW_LOOP(0, 0, 0, 0); break;
	case 1: ADAMW_LOOP(1, 0, 0, 0); break;
	case 2: ADAMW_LOOP(0, 1, 0, 0); break;
	case 3: ADAMW_LOOP(1, 1, 0, 0); break;
	case 4: ADAMW_LOOP(0, 0, 1, 0); break;
	case 5: ADAMW_LOOP(1, 0, 1, 0); break;
	case 6: ADAMW_LOOP(0, 1, 1, 0); break;
	case 7: ADAMW_LOOP(1, 1, 1, 0); break;
	case 8: ADAMW_LOOP(0, 0, 0, 1); break;
	case 9: ADAMW_LOOP(1, 0, 0, 1); break;
	case 10: ADAMW_LOOP(0, 1, 0, 1); break;
	case 11: ADAMW_LOOP(1, 1, 0, 1); break;
	case 12: ADAMW_LOOP(0, 0, 1, 1); break;
	case 13: ADAMW_LOOP(1, 0, 1, 1); break;
	case 14: ADAMW_LOOP(0, 1, 1, 1); break;
	default: ADAMW_LOOP(1, 1, 1, 1); break;
	}
}

/* AdamW over n elements: g (n), lr [1], t [1] (i64, 1-based), d (n) or
 * absent; w (n) params, m (n), v (n) moments, and with amsgrad (i[1]) vx
 * (n), the largest v so far.  torch.optim.AdamW, and with l2 = f[4]
 * torch.optim.Adam's weight_decay (g += l2*d*w first):
 *   w *= 1 - lr*wd*d;  m, v updated;  w -= lr * (m/c1) / (sqrt(v)/sqrt(c2) + eps)
 * (amsgrad: vx = max(vx, v), and sqrt(vx) in place of sqrt(v)). */
static kiln_status cpu_adamw(const struct cpu_plan *p, const struct kiln_op_args *a,
			     struct cpu_err *e)
{
	const float *g = a->in[0];
	const float lr = *(const float *)a->in[1];
	const float *d = own_inputs(&p->op) > 3 ? a->in[3] : NULL;
	if (cpu_optim_gated_off(p, a))
		return KILN_OK; /* a skipped step */
	float *w = a->out[0], *m = a->out[1], *v = a->out[2];
	float *vx = p->op.i[1] ? a->out[3] : NULL;
	struct adam_k k;
	kiln_status st = adam_scalars(p, a, "ADAMW", &k, e);
	if (st)
		return st;
	void *cp = OPT_COPY(p, a);
	const int cdt = (int)p->sz[6];
	CPU_AFFINE_FOR(g, p->n, b, en, OPT_BLOCKS(b, en, bb, be, {
		adamw_span(w + bb, m + bb, v + bb, vx ? vx + bb : NULL, g + bb, d ? d + bb : NULL,
			   be - bb, lr, k);
		opt_copy(cp, cdt, w, bb, be);
	}));
	return KILN_OK;
}

/* ---- LAMB ------------------------------------------------------------- */

/* Pieces: tensors cut at multiples of LAMB_CHUNK elements.  A fixed grid,
 * so the sums (and the result) do not depend on the thread count. */
#define LAMB_CHUNK 16384

struct lamb_piece {
	int64_t b, e;   /* elements [b, e) of the flat buffer */
	int64_t k;      /* the tensor */
	double pp, uu;  /* sum of p*p and of u*u over the piece */
};

/* Upper bound of the pieces of n elements in T tensors: each tensor
 * boundary inside a chunk adds at most one piece. */
static int64_t lamb_max_pieces(int64_t n, int64_t T)
{
	return (n + LAMB_CHUNK - 1) / LAMB_CHUNK + T;
}

#define LAMB_DIR_LOOP(HAS_D, FL)                                                         \
	do {                                                                             \
		_Pragma("omp simd reduction(+ : pp, uu)")                                \
		for (int64_t i = 0; i < n; i++) {                                        \
			const float di = (HAS_D) ? d[i] : 1.0f;                          \
			const float u = ADAM_DIR(i, g[i], FL) + k.wd * di * w[i];        \
			pp += (double)w[i] * (double)w[i];                               \
			uu += (double)u * (double)u;                                     \
		}                                                                        \
	} while (0)

/* Pass 1 over one piece: update m, v (n); sum w*w and u*u. */
CPU_CLONES static void lamb_moments_span(const float *restrict w, float *restrict m,
					 float *restrict v, const float *restrict g,
					 const float *restrict d, int64_t n, struct adam_k k,
					 double *pp_out, double *uu_out)
{
	double pp = 0, uu = 0;
	switch ((k.flush != 0) * 2 + (d != NULL)) {
	case 0: LAMB_DIR_LOOP(0, 0); break;
	case 1: LAMB_DIR_LOOP(1, 0); break;
	case 2: LAMB_DIR_LOOP(0, 1); break;
	default: LAMB_DIR_LOOP(1, 1); break;
	}
	*pp_out = pp;
	*uu_out = uu;
}

#define LAMB_UPDATE_LOOP(HAS_D)                                                          \
	do {                                                                             \
		_Pragma("omp simd")                                                      \
		for (int64_t i = 0; i < n; i++) {                                        \
			const float di = (HAS_D) ? d[i] : 1.0f;                          \
			const float u = (m[i] * k.inv_c1) /                              \
						(sqrtf(v[i]) * k.inv_sqrt_c2 + k.eps) +  \
					k.wd * di * w[i];                                \
			w[i] -= step * u;                                                \
		}                                                                        \
	} while (0)

/* Pass 2 over one piece: w (n) -= step * u, u from the updated m, v (n). */
CPU_CLONES static void lamb_update_span(float *restrict w, const float *restrict m,
					const float *restrict v, const float *restrict d, int64_t n,
					struct adam_k k, float step)
{
	if (d)
		LAMB_UPDATE_LOOP(1);
	else
		LAMB_UPDATE_LOOP(0);
}

/* LAMB over n elements in T tensors: g (n), lr [1], t [1], off (T+1) i64,
 * d (n) or absent; w (n), m (n), v (n).  Workspace: the pieces, then the
 * per-tensor step lr * r (T floats).  See KILN_OP_LAMB in plugin.h. */
static kiln_status cpu_lamb(const struct cpu_plan *p, const struct kiln_op_args *a,
			    struct cpu_err *e)
{
	const float *g = a->in[0];
	const float lr = *(const float *)a->in[1];
	const int64_t *off = a->in[3];
	const float *d = own_inputs(&p->op) > 4 ? a->in[4] : NULL;
	if (cpu_optim_gated_off(p, a))
		return KILN_OK; /* a skipped step */
	float *w = a->out[0], *m = a->out[1], *v = a->out[2];
	void *cp = OPT_COPY(p, a);
	const int cdt = (int)p->sz[6];
	const int64_t n = p->n, T = p->sz[0], cap = p->sz[1];
	struct lamb_piece *pc = a->workspace;
	float *step = (float *)(pc + cap); /* [T] */
	struct adam_k k;
	int64_t np = 0;

	kiln_status st = adam_scalars(p, a, "LAMB", &k, e);
	if (st)
		return st;
	if (off[0] != 0 || off[T] != n)
		return cpu_fail(e, KILN_EINVAL, "cpu: LAMB: tensor offsets run from %lld to %lld, want 0 to n = %lld",
				(long long)off[0], (long long)off[T], (long long)n);
	for (int64_t q = 0; q < T; q++) {
		if (off[q + 1] < off[q])
			return cpu_fail(e, KILN_EINVAL, "cpu: LAMB: tensor offsets decrease at %lld (%lld > %lld)",
					(long long)q, (long long)off[q], (long long)off[q + 1]);
		for (int64_t b = off[q]; b < off[q + 1];) {
			int64_t en = (b / LAMB_CHUNK + 1) * LAMB_CHUNK;
			if (en > off[q + 1])
				en = off[q + 1];
			pc[np++] = (struct lamb_piece){ b, en, q, 0, 0 };
			b = en;
		}
	}
	if (np > cap) /* cannot happen: lamb_max_pieces is an upper bound */
		return cpu_fail(e, KILN_EINTERNAL, "cpu: LAMB: %lld pieces, workspace for %lld",
				(long long)np, (long long)cap);
#pragma omp parallel if (n >= CPU_PAR_MIN)
	{
#pragma omp for schedule(dynamic)
		for (int64_t q = 0; q < np; q++) {
			const int64_t b = pc[q].b, l = pc[q].e - pc[q].b;
			lamb_moments_span(w + b, m + b, v + b, g + b, d ? d + b : NULL, l, k, &pc[q].pp,
					  &pc[q].uu);
		}
#pragma omp single
		{
			/* pieces are in tensor order: add each tensor's in order */
			for (int64_t q = 0, j = 0; q < T; q++) {
				double pp = 0, uu = 0;
				for (; j < np && pc[j].k == q; j++) {
					pp += pc[j].pp;
					uu += pc[j].uu;
				}
				const double r = pp > 0 && uu > 0 ? sqrt(pp) / sqrt(uu) : 1.0;
				step[q] = (float)((double)lr * r);
			}
		}
#pragma omp for schedule(dynamic)
		for (int64_t q = 0; q < np; q++) {
			const int64_t b = pc[q].b, l = pc[q].e - pc[q].b;
			lamb_update_span(w + b, m + b, v + b, d ? d + b : NULL, l, k, step[pc[q].k]);
			opt_copy(cp, cdt, w, b, b + l);
		}
	}
	return KILN_OK;
}

/* ---- prepare ---------------------------------------------------------- */

/* KILN_OPF_GATED: the last input is the gate; the op's own inputs are the
 * ones before it. */
static int own_inputs(const struct kiln_op *op)
{
	return op->n_in - ((op->flags & KILN_OPF_GATED) != 0);
}

int cpu_optim_gated_off(const struct cpu_plan *p, const struct kiln_op_args *a)
{
	return (p->op.flags & KILN_OPF_GATED) && *(const float *)a->in[p->op.n_in - 1] == 0.0f;
}

kiln_status cpu_optim_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int lamb = op->type == KILN_OP_LAMB;
	int out_n;
	/* an optional last output in bf16 or f16: the compute copy */
	const int copy = op->n_out > 1 && cpu_lowp(op->out[op->n_out - 1].dtype);
	p->sz[6] = copy ? op->out[op->n_out - 1].dtype : 0;
	p->sz[7] = copy;

	switch (op->type) {
	case KILN_OP_SGD:
		/* plain SGD (mu == 0) keeps no momentum buffer */
		out_n = op->f[0] == 0.0 && op->n_out - copy == 1 ? 1 : 2;
		p->kernel = cpu_sgd;
		break;
	case KILN_OP_ADAMW:
		/* amsgrad (ABI 2.29): the largest second moments, a fourth */
		out_n = 3 + (op->i[1] != 0);
		p->kernel = cpu_adamw;
		break;
	case KILN_OP_LAMB: out_n = 3; p->kernel = cpu_lamb; break;
	default:
		return c->host->error(KILN_EINTERNAL, "cpu: op %d is not an optimizer", op->type);
	}
	p->n_in = op->n_in;
	p->n_out = out_n + copy;
	p->n = op->i[0];
	if (lamb) {
		const int64_t T = cpu_numel(&op->in[3]) - 1;
		p->sz[0] = T;
		p->sz[1] = lamb_max_pieces(p->n, T);
		p->workspace = (size_t)p->sz[1] * sizeof(struct lamb_piece) +
			       (size_t)T * sizeof(float);
	}
	return KILN_OK;
}
