/* plugins/common/scalar_ops.h - the one-thread scalar steps both devices
 * compute (plugin.h gives each op's contract): the learning-rate schedule,
 * the loss scaler's update, the gradient clipping factor and batch norm's
 * per-channel commit of its statistics.  One copy, so
 * the CPU device (plugins/cpu/ops.c) and the CUDA kernels
 * (plugins/cuda/kernels.cu, __host__ __device__) do the same arithmetic in
 * the same order, in double where the contract says so.
 * Header-only (static inline), C and CUDA C++.
 */
#ifndef KILN_COMMON_SCALAR_OPS_H
#define KILN_COMMON_SCALAR_OPS_H

#include <kiln/plugin.h> /* KILN_SCHED_* */

#include <float.h> /* FLT_MIN, FLT_MAX */
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define COMMON_HD __host__ __device__
#else
#define COMMON_HD
#endif

/* torch.optim.lr_scheduler.OneCycleLR at step u of its U (after the
 * warm-up), max_lr base: its phases' last steps e[k] and the rates r[k]
 * to r[k + 1] they anneal between, in PyTorch's arithmetic (the phase a
 * step falls in: the first whose end it does not pass; the last takes the
 * rest).  Two phases, init -> base -> final; three_phase (i[5]), init ->
 * base -> init -> final, the second as long as the first.  anneal_strategy
 * i[6]: 0 cos, 1 linear. */
static inline COMMON_HD double common_onecycle(int64_t u, int64_t U, double base,
					       const int64_t *i, const double *f)
{
	const double init = base / f[2], fin = init / f[3];
	const double e1 = f[4] * (double)U - 1, last = (double)U - 1;
	const int three = i[5] != 0;
	const double e[3] = { e1, three ? 2.0 * f[4] * (double)U - 2 : last, last };
	const double r[4] = { init, base, three ? init : fin, fin };
	const int n = three ? 3 : 2;
	double start = 0;
	int k = 0;
	while (k < n - 1 && (double)u > e[k])
		start = e[k], k++;
	const double pct = ((double)u - start) / (e[k] - start), from = r[k], to = r[k + 1];
	if (i[6])
		return (to - from) * pct + from;
	return to + (from - to) / 2.0 * (1.0 + cos(M_PI * pct));
}

/* KILN_OP_LR_SCHEDULE: the learning rate at step t (i64), in double, from
 * the op's i[16] (kind, total steps, warm-up steps, ...) and f[8] (base,
 * final, gamma, ...): each schedule the closed form of its PyTorch
 * scheduler (plugin.h). */
static inline COMMON_HD double common_lr_schedule(int64_t t, const int64_t *i, const double *f)
{
	const int64_t T = i[1], W = i[2];
	const double base = f[0], fin = f[1];
	double lr = base;
	const int64_t U = T - W > 1 ? T - W : 1, u = t - W;
	if (t < W) {
		lr = base * (double)(t + 1) / (double)W;
	} else if (i[0] == KILN_SCHED_COSINE) {
		const int64_t v = u < U ? u : U;
		lr = fin + (base - fin) * (1.0 + cos(M_PI * (double)v / (double)U)) / 2.0;
	} else if (i[0] == KILN_SCHED_STEP) {
		lr = base * pow(f[2], (double)(u / i[3]));
	} else if (i[0] == KILN_SCHED_MULTISTEP) {
		int m = 0;
		for (int64_t j = 0; j < i[3]; j++)
			m += i[4 + j] <= u;
		lr = base * pow(f[2], (double)m);
	} else if (i[0] == KILN_SCHED_ONECYCLE) {
		lr = common_onecycle(u, U, base, i, f);
	} else if (i[0] == KILN_SCHED_EXPONENTIAL) {
		lr = base * pow(f[2], (double)u);
	} else if (i[0] == KILN_SCHED_LINEAR) {
		/* the factors weighted, not f2 + (f3 - f2) x m / i3: that
		 * rounds below 0 at m = i3 with f3 = 0 (f2 0.1, i3 101:
		 * -1.39e-17); from i3 on exactly f3 */
		const int64_t m = u, n = i[3];
		lr = base * (m >= n ? f[3] : (f[2] * (double)(n - m) + f[3] * (double)m) / (double)n);
	} else if (i[0] == KILN_SCHED_POLYNOMIAL) {
		const int64_t m = u < i[3] ? u : i[3];
		lr = base * pow(1.0 - (double)m / (double)i[3], f[2]);
	}
	return lr;
}

/* The loss scale s backed off once: s x backoff, never below lo (the
 * op's f[2], min_scale) nor below FLT_MIN, the smallest normal float: a
 * scale of 0 could never leave (the scaled gradients are 0, unscaled by
 * 1/0 = inf they are NaN, every step skips and backs off 0 to 0), nor
 * could a subnormal one whose 1/s overflows.  The trainer reads a backoff
 * that does not lower s as "cannot back off" (core/train_log.c). */
static inline COMMON_HD float common_scaler_backoff(float s, double backoff, double lo)
{
	double v = (double)s * backoff;
	if (v < lo)
		v = lo;
	if (v < (double)FLT_MIN)
		v = (double)FLT_MIN;
	return (float)v;
}

/* KILN_OP_SCALER_UPDATE: gate f32[4] (GRAD_CLIP's: [1] the finite flag),
 * st f32[4] (scale, growth tracker, hysteresis left, overflows) updated in
 * place; growth, backoff, lo, hi, interval, hyst: the op's f[0..3], i[0..1]. */
static inline COMMON_HD void common_scaler_update(float *st, const float *gate, double growth,
						  double backoff, double lo, double hi,
						  int64_t interval, int64_t hyst)
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
		/* (at 0 it stays: every overflow backs off until the scale
		 * grows, as below 0; a checkpoint holds no negative count) */
		st[2] = st[2] > 0.0f ? st[2] - 1.0f : 0.0f;
		if (st[2] <= 0.0f)
			st[0] = common_scaler_backoff(st[0], backoff, lo);
	}
}

/* GRAD_CLIP and UNSCALE after the gradients' sum of squares ss (in
 * double: finite whenever every element is, its squares no longer
 * overflowing f32 first): state f32[4] (norm, finite flag, non-finite
 * count, clip count) updated; *factor = the clip factor times inv = 1/s,
 * rounded once.  The clip factor is max_norm / (norm + 1e-6) when that is
 * below 1 and max_norm > 0 (clip_grad_norm_'s min(1, ...): a norm within
 * 1e-6 under max_norm is scaled too), and 0 when max_norm > 0 and ss exceeds FLT_MAX (a norm
 * above ~1.8e19): PyTorch's clip_grad_norm_ takes the norm in f32, where
 * that sum of squares is inf, and multiplies by max_norm / (inf + 1e-6) =
 * 0 (torch 1.13 and 2.x alike); else 1.  The norm recorded saturates at
 * FLT_MAX: an inf there would read as non-finite gradients where a
 * pipeline's stages exchange their norms as elements.  Returns 0 when ss
 * is not finite (an element is NaN or inf: the gradients are left as
 * they are), 1 otherwise. */
static inline COMMON_HD int common_clip_factor(float *state, double ss, double max_norm,
					       float inv, float *factor)
{
	const double norm = sqrt(ss);
	if (!isfinite(ss)) {
		state[0] = (float)norm;
		state[1] = 0.0f;
		state[2] += 1.0f;
		return 0;
	}
	state[0] = norm > FLT_MAX ? FLT_MAX : (float)norm;
	state[1] = 1.0f;
	float scale = 1.0f;
	const int f32_inf = ss > FLT_MAX;
	/* clip_grad_norm_'s min(1, max_norm / (norm + 1e-6)): below 1 also
	 * for a norm up to 1e-6 under max_norm (before session 42 only
	 * norm > max_norm scaled) */
	const double coef = max_norm / (norm + 1e-6);
	if (max_norm > 0 && (f32_inf || coef < 1.0)) {
		scale = f32_inf ? 0.0f : (float)coef;
		state[3] += 1.0f;
	}
	*factor = scale * inv;
	return 1;
}

/* Batch norm's training step for channel c of C, from the mean and the
 * biased variance of its M values: saved (mean, invstd), the running
 * statistics (momentum mom; the unbiased variance), and the coefficients
 * of y = x * a[c] + b[c]. */
static inline COMMON_HD void common_bn_commit(int64_t c, int64_t C, double mean, double var,
					      double M, double eps, double mom,
					      const float *gamma, const float *beta, float *saved,
					      float *rmean, float *rvar, float *a, float *b)
{
	const double inv = 1.0 / sqrt(var + eps);
	saved[c] = (float)mean;
	saved[C + c] = (float)inv;
	rmean[c] = (float)((1 - mom) * rmean[c] + mom * mean);
	rvar[c] = (float)((1 - mom) * rvar[c] + mom * var * M / (M - 1));
	const double sc = gamma[c] * inv;
	a[c] = (float)sc;
	b[c] = (float)(beta[c] - mean * sc);
}

/* GELU's tanh approximation (KILN_ACT_GELU_TANH, nn.GELU(approximate =
 * 'tanh')) in f32: y = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * and its derivative dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx, t = tanh(u). */
static inline COMMON_HD float common_gelu_tanh(float x)
{
	const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
	return 0.5f * x * (1.0f + tanhf(u));
}

static inline COMMON_HD float common_gelu_tanh_grad(float x)
{
	const float k = 0.7978845608028654f;
	const float t = tanhf(k * (x + 0.044715f * x * x * x));
	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif /* KILN_COMMON_SCALAR_OPS_H */
