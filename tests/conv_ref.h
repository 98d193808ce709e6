/* tests/conv_ref.h - what the convolution tests check_cpu_fftconv,
 * check_cpu_convthin and check_cpu_wino share: the element index of an
 * [N, C, H, W] tensor in either layout, an output size, a double-precision
 * convolution of stride 1, dilation 1 and one group (CONV with bias and
 * ReLU, CONV_BWD_DATA, CONV_BWD_WEIGHTS with the bias gradient and
 * accumulation), the error the tests bound, max |got - ref| / rms(ref) over
 * the tensor (a NaN counts as the worst), whether kiln's own AVX-512
 * kernels run on this CPU, the tally of the plans a kernel made, and a cpu
 * device opened and an op prepared with that kernel's plans counted. */
#ifndef KILN_TESTS_CONV_REF_H
#define KILN_TESTS_CONV_REF_H
#include <kiln/kiln.h>
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when this CPU has AVX-512F, BW and VL: kiln's own convolution kernels
 * (fft16.c, convthin.c, wino.c) run on it */
static inline int conv_ref_avx512(void)
{
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl");
}

/* The output size of n inputs, padding pad, kernel k, dilation dil and
 * stride st (0 meaning 1, as the tests' ops say it). */
static inline int64_t conv_ref_osize(int64_t n, int64_t pad, int64_t k, int64_t dil, int64_t st)
{
	return (n + 2 * pad - (dil ? dil : 1) * (k - 1) - 1) / (st ? st : 1) + 1;
}

/* The plans a kernel made against those expected, the wrong counts
 * checked last (conv_plans_check), after every result. */
struct conv_plans {
	int ops, made, bad; /* prepares the kernel should make; those it made; miscounts */
	char first_bad[256];
};

/* Records `plans` made by the kernel named kernel for an op described by
 * what, where want were expected. */
static inline void conv_plans_add(struct conv_plans *t, int plans, int want, const char *what, const char *kernel)
{
	t->ops += want;
	t->made += plans == 1 && want;
	if (plans != want && !t->bad++)
		snprintf(t->first_bad, sizeof t->first_bad, "%s: %d %s plans, want %d", what, plans, kernel, want);
}

static inline void conv_plans_check(const struct conv_plans *t, const char *test, const char *kernel)
{
	ck_assert_msg(!t->bad, "%s: %d prepares with the wrong number of %s plans (CPU %s AVX-512F, BW and VL); first %s",
		      test, t->bad, kernel, conv_ref_avx512() ? "with" : "without", t->first_bad);
}

/* The cpu device's debug lines naming a kernel ("(wino.c)"): the tag
 * conv_dev_prepare looks for and the lines it found (one per test
 * process's thread of checks). */
static inline const char **conv_dev_tag(void)
{
	static const char *tag;
	return &tag;
}

static inline int *conv_dev_seen(void)
{
	static int seen;
	return &seen;
}

static inline void conv_dev_sink(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)level;
	if (!strcmp(who, "cpu") && strstr(msg, *conv_dev_tag()))
		++*conv_dev_seen();
}

/* A cpu device of reg on `threads` threads with the overrides ov (NULL, or
 * several split at ';') and, when env is not NULL, env=val in the
 * environment (the kernels' A/B switches; the caller unsets it after
 * closing the device).  No tune cache: what `auto` chooses is timed by
 * this process, not read from an earlier run.  Returns the config to free
 * after closing *dev. */
static inline struct kiln_config *conv_dev_open(struct kiln_registry *reg, int threads, const char *ov,
						const char *env, const char *val, struct kiln_device **dev)
{
	char t[128];
	struct kiln_config *cfg;
	ck_assert(kiln_config_new(&cfg) == 0);
	snprintf(t, sizeof t, "run.threads=%d", threads);
	ck_assert(kiln_config_override(cfg, t) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0);
	for (const char *o = ov; o && *o;) {
		const size_t n = strcspn(o, ";");
		snprintf(t, sizeof t, "%.*s", (int)n, o);
		ck_assert_msg(kiln_config_override(cfg, t) == 0, "%s", kiln_last_error());
		o += n + (o[n] == ';');
	}
	if (env)
		setenv(env, val, 1);
	ck_assert_msg(kiln_device_open(reg, cfg, "cpu", 0, dev) == 0, "%s", kiln_last_error());
	return cfg;
}

/* Prepares op on dev, counting the debug lines naming tag (a kernel's
 * plans) into *plans: the status. */
static inline int conv_dev_prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan, size_t *wsb,
				   const char *tag, int *plans)
{
	*conv_dev_tag() = tag;
	*conv_dev_seen() = 0;
	const int level = kiln_log_get_level();
	kiln_log_set_sink(conv_dev_sink, NULL);
	kiln_log_set_level(KILN_LOG_DEBUG);
	const int st = kiln_device_prepare(dev, op, plan, wsb);
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	*plans = *conv_dev_seen();
	return st;
}

/* A convolution's geometry and layout (weights OIHW). */
struct conv_ref {
	int64_t N, C, H, W, O, KH, KW, ph, pw;
	int nhwc;
};

static inline int64_t conv_ref_oh(const struct conv_ref *g) { return g->H + 2 * g->ph - g->KH + 1; }
static inline int64_t conv_ref_ow(const struct conv_ref *g) { return g->W + 2 * g->pw - g->KW + 1; }

/* element (n, c, h, w) of a [N, C, H, W] tensor in layout nhwc */
static inline int64_t conv_ref_at(int nhwc, int64_t C, int64_t H, int64_t W, int64_t n, int64_t c, int64_t h,
				  int64_t w)
{
	return nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

/* Op type t of g in double precision, malloc'ed, *n its elements: CONV
 * (x, w, bias b or NULL, ReLU when relu) gives y; CONV_BWD_DATA (dy, w)
 * dx; CONV_BWD_WEIGHTS (x, dy) dw, then db when bias_grad, each added to
 * dw0 and db0 when they are not NULL (KILN_OPF_ACCUMULATE). */
static inline double *conv_ref_run(int t, const struct conv_ref *g, const float *x, const float *w,
				   const float *dy, const float *b, int relu, int bias_grad, const float *dw0,
				   const float *db0, int64_t *n)
{
	const int64_t OH = conv_ref_oh(g), OW = conv_ref_ow(g), nx = g->N * g->C * g->H * g->W,
		      ny = g->N * g->O * OH * OW, nw = g->O * g->C * g->KH * g->KW;
	const int64_t nout = t == KILN_OP_CONV ? ny : t == KILN_OP_CONV_BWD_DATA ? nx : nw + (bias_grad ? g->O : 0);
	double *r = calloc((size_t)nout, sizeof *r);
	ck_assert(r);
	for (int64_t bn = 0; bn < g->N; bn++)
		for (int64_t o = 0; o < g->O; o++)
			for (int64_t i = 0; i < OH; i++)
				for (int64_t j = 0; j < OW; j++) {
					const int64_t yi = conv_ref_at(g->nhwc, g->O, OH, OW, bn, o, i, j);
					for (int64_t c = 0; c < g->C; c++)
						for (int64_t a = 0; a < g->KH; a++)
							for (int64_t q = 0; q < g->KW; q++) {
								const int64_t h = i + a - g->ph, v = j + q - g->pw;
								if (h < 0 || h >= g->H || v < 0 || v >= g->W)
									continue;
								const int64_t xi =
									conv_ref_at(g->nhwc, g->C, g->H, g->W, bn, c, h, v);
								const int64_t wi = ((o * g->C + c) * g->KH + a) * g->KW + q;
								if (t == KILN_OP_CONV)
									r[yi] += (double)x[xi] * w[wi];
								else if (t == KILN_OP_CONV_BWD_DATA)
									r[xi] += (double)dy[yi] * w[wi];
								else
									r[wi] += (double)dy[yi] * x[xi];
							}
					if (t == KILN_OP_CONV_BWD_WEIGHTS && bias_grad)
						r[nw + o] += dy[yi];
				}
	if (t == KILN_OP_CONV)
		for (int64_t i = 0; i < ny; i++) {
			const int64_t o = g->nhwc ? i % g->O : i / (OH * OW) % g->O;
			if (b)
				r[i] += b[o];
			if (relu && r[i] < 0)
				r[i] = 0;
		}
	if (t == KILN_OP_CONV_BWD_WEIGHTS && dw0)
		for (int64_t i = 0; i < nout; i++)
			r[i] += i < nw ? dw0[i] : db0[i - nw];
	*n = nout;
	return r;
}

/* max |got - ref| / rms(ref) */
static inline double conv_ref_err(const float *got, const double *ref, int64_t n)
{
	double ss = 0, worst = 0;
	for (int64_t i = 0; i < n; i++)
		ss += ref[i] * ref[i];
	const double rms = sqrt(ss / (double)n) + 1e-300;
	for (int64_t i = 0; i < n; i++) {
		const double d = fabs((double)got[i] - ref[i]);
		if (!(d <= worst)) /* NaN too */
			worst = d;
	}
	return worst / rms;
}
#endif
