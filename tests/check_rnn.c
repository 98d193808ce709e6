/* tests/check_rnn.c - the recurrent layers `lstm` and `gru`
 * (core/layers/rnn.c, KILN_OP_RNN / RNN_BWD on the CPU device, or on
 * $KILN_TEST_DEVICE: tests/gpu/run.sh runs it on cuda) against
 * PyTorch's nn.LSTM / nn.GRU: the loss, every parameter gradient and the
 * input gradient of a training pass, for 1 and 2 layers, one and two
 * directions, with and without masking by a pad id, the whole sequence
 * or the final hidden state (`last = 1`, PyTorch's h_n)
 * (tests/data/rnn_refs.safetensors, written by tests/data/gen_rnn_refs.py);
 * the parameter gradients against central differences of the loss; the
 * ops alone at a size that runs the CPU kernel's gather on its OpenMP team
 * (rows of length 0 to T against the same rows run alone); the
 * configuration errors.
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* max |got - ref| <= REL * max(FLOOR, max |ref|), as tests/check_layers.c */
#define REL 1e-4
#define FLOOR 0.1

static struct kiln_registry *reg;
static struct kiln_safetensors *refs;

struct rig {
	const char *tag;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	void *stream;
	void *x, *labels, *metrics;
	int64_t B, T, I;
	int masked;
};

/* Reference tensor `<tag>/<what>` copied to aligned host memory (free it). */
static void *ref_copy(const char *tag, const char *what, int64_t *numel)
{
	char key[256];
	struct kiln_safetensors_tensor t;
	snprintf(key, sizeof key, "%s/%s", tag, what);
	ck_assert_msg(kiln_safetensors_find(refs, key, &t) == KILN_OK, "no reference %s", key);
	void *h = malloc(t.bytes);
	memcpy(h, t.data, t.bytes);
	if (numel)
		*numel = t.numel;
	return h;
}

static void rig_open(struct rig *r, const char *tag)
{
	char key[128];
	memset(r, 0, sizeof *r);
	r->tag = tag;
	snprintf(key, sizeof key, "%s.ini", tag);
	const char *ini = kiln_safetensors_meta(refs, key);
	snprintf(key, sizeof key, "%s.masked", tag);
	const char *masked = kiln_safetensors_meta(refs, key);
	snprintf(key, sizeof key, "%s.shape", tag); /* a case's own, else the file's */
	const char *shape = kiln_safetensors_meta(refs, key);
	if (!shape)
		shape = kiln_safetensors_meta(refs, "shape");
	ck_assert_msg(ini && masked && shape, "%s: metadata missing", tag);
	r->masked = atoi(masked);
	long long B, T, I;
	ck_assert(sscanf(shape, "%lld,%lld,%lld", &B, &T, &I) == 3);
	r->B = B, r->T = T, r->I = I;
	r->cfg = test_config(reg, ini);
	ck_assert_msg(kiln_device_open(reg, r->cfg, check_test_device(), 0, &r->dev) == 0, "%s: %s",
		      check_test_device(), kiln_last_error());
	const int64_t dims[2] = { T, I };
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, r->masked ? KILN_I32 : KILN_F32, r->masked ? 1 : 2, dims);
	ck_assert_msg(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m) == 0, "%s: %s", tag,
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &(struct kiln_plan_opts){ .training = 1, .input_grad = !r->masked },
					 &r->train) == 0,
		      "%s: %s", tag, kiln_last_error());
	ck_assert_msg(kiln_model_plan(r->m, B, 0, &r->eval) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(r->dev, sizeof(float) * (size_t)(B * T * I), &r->x) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * (size_t)B, &r->labels) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, &r->metrics) == 0);
	/* every parameter from the reference, the input and the labels */
	for (int i = 0; i < kiln_model_param_count(r->m); i++) {
		struct kiln_param_info info;
		int64_t n;
		kiln_model_param_get(r->m, i, &info);
		snprintf(key, sizeof key, "param/%s", info.name);
		float *h = ref_copy(tag, key, &n);
		ck_assert_msg(n == kiln_tensor_numel(&info.desc), "%s: %s has %lld elements, PyTorch %lld",
			      tag, info.name, (long long)kiln_tensor_numel(&info.desc), (long long)n);
		TEST_H2D(r, info.param, h, sizeof(float) * (size_t)n);
		free(h);
	}
	int64_t n;
	void *x = ref_copy(tag, r->masked ? "ids" : "x", &n), *y = ref_copy(tag, "labels", NULL);
	TEST_H2D(r, r->x, x, (size_t)n * 4);
	TEST_H2D(r, r->labels, y, sizeof(int32_t) * (size_t)B);
	free(x);
	free(y);
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->x, r->labels, r->metrics };
	test_rig_free_bufs(r->dev, r->stream, bufs, 3);
	kiln_plan_free(r->train);
	kiln_plan_free(r->eval);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* The mean loss of one pass of p. */
static double loss_of(struct rig *r, struct kiln_plan *p)
{
	float m[2] = { 0, 0 };
	TEST_H2D(r, r->metrics, m, sizeof m);
	ck_assert_msg(kiln_plan_run(p, r->x, r->labels, r->metrics, r->stream) == 0, "%s: %s",
		      r->tag, kiln_last_error());
	TEST_D2H(r, m, r->metrics, sizeof m);
	return m[0] / (double)r->B;
}

/* max |got - want| (INFINITY for a NaN), the first element where it is
 * in *at, and max(FLOOR, max |want|) in *scale. */
static double max_error(const float *got, const float *want, int64_t n, double *scale,
			int64_t *at)
{
	double err = 0;
	*scale = FLOOR, *at = 0;
	for (int64_t i = 0; i < n; i++)
		*scale = fabs(want[i]) > *scale ? fabs(want[i]) : *scale;
	for (int64_t i = 0; i < n; i++) {
		const double e = fabs((double)got[i] - want[i]);
		if (!(e <= err)) {
			err = isnan(e) ? INFINITY : e;
			*at = i;
		}
	}
	return err;
}

/* Device tensor of n floats against reference `<tag>/<what>`. */
static void check_against(struct rig *r, const char *what, const void *dptr, int64_t n)
{
	int64_t rn;
	float *want = ref_copy(r->tag, what, &rn), *got = malloc(sizeof(float) * (size_t)n);
	ck_assert_msg(rn == n, "%s: %s has %lld elements, PyTorch %lld", r->tag, what,
		      (long long)n, (long long)rn);
	TEST_D2H(r, got, dptr, sizeof(float) * (size_t)n);
	double scale;
	int64_t at;
	const double err = max_error(got, want, n, &scale, &at);
	ck_assert_msg(err <= REL * scale,
		      "%s: %s: max |error| %g at element %lld (kiln %.8g, PyTorch %.8g); allowed %g",
		      r->tag, what, err, (long long)at, got[at], want[at], REL * scale);
	free(want);
	free(got);
}

/* ..._b1t1: one row of one step, weight_hh's gradient 0 (h0 = 0), where
 * oneDNN 2.6 took h1 for h0 (plugins/cpu/rnn.c, "the initial state");
 * lstm_l1_b1t2 and gru_l1_b1t1 are their controls.  ..._last: the top
 * layer's final hidden state into the classifier, PyTorch's h_n (at each
 * row's length - 1 forward, t = 0 reverse; before session 41 there was
 * no way to take it) */
static const char *const cases[] = { "lstm_l1",      "gru_l1",      "lstm_l2_bi",
				     "gru_l2_bi",    "lstm_l1_mask", "gru_l1_mask",
				     "lstm_l2_bi_mask", "gru_l2_bi_mask", "lstm_l1_b1t1",
				     "lstm_l2_bi_b1t1", "gru_l1_b1t1", "lstm_l1_b1t2",
				     "lstm_l1_last", "gru_l1_last", "lstm_l2_bi_last",
				     "gru_l2_bi_last", "lstm_l1_last_mask", "gru_l1_last_mask",
				     "lstm_l2_bi_last_mask", "gru_l2_bi_last_mask" };

START_TEST(test_torch)
{
	struct rig r;
	rig_open(&r, cases[_i]);
	const double loss = loss_of(&r, r.train);
	float *want = ref_copy(r.tag, "loss", NULL);
	ck_assert_msg(fabs(loss - want[0]) <= 1e-5 * fabs(want[0]), "%s: loss %.8g vs PyTorch %.8g",
		      r.tag, loss, want[0]);
	free(want);
	char what[160];
	int rnn_params = 0;
	for (int i = 0; i < kiln_model_param_count(r.m); i++) {
		struct kiln_param_info info;
		kiln_model_param_get(r.m, i, &info);
		snprintf(what, sizeof what, "grad/%s", info.name);
		check_against(&r, what, info.grad, kiln_tensor_numel(&info.desc));
		rnn_params += strstr(info.name, "_l") != NULL;
	}
	ck_assert_int_gt(rnn_params, 3);
	if (!r.masked) {
		void *dx;
		struct kiln_tensor_desc d;
		ck_assert_msg(kiln_plan_tensor(r.train, NULL, "dx", &dx, &d) == 0, "%s",
			      kiln_last_error());
		check_against(&r, "dx", dx, kiln_tensor_numel(&d));
	}
	/* evaluation runs the same forward */
	const double le = loss_of(&r, r.eval);
	ck_assert_msg(fabs(le - loss) <= 1e-6 * fabs(loss), "%s: eval loss %.8g vs train %.8g",
		      r.tag, le, loss);
	rig_close(&r);
}
END_TEST

/* Every 31st element of every recurrent parameter: the training pass's
 * gradient against central differences of the evaluation loss. */
static void fd_case(const char *tag)
{
	struct rig r;
	rig_open(&r, tag);
	loss_of(&r, r.train);
	int bad = 0, checked = 0;
	for (int i = 0; i < kiln_model_param_count(r.m); i++) {
		struct kiln_param_info info;
		kiln_model_param_get(r.m, i, &info);
		if (!strstr(info.name, "_l"))
			continue;
		const int64_t n = kiln_tensor_numel(&info.desc);
		float *g = malloc(sizeof(float) * (size_t)n);
		TEST_D2H(&r, g, info.grad, sizeof(float) * (size_t)n);
		for (int64_t e = i % 31; e < n; e += 31) {
			float v;
			const float eps = 1e-2f;
			TEST_D2H(&r, &v, info.param + e, sizeof v);
			const float vp = v + eps, vm = v - eps;
			TEST_H2D(&r, info.param + e, &vp, sizeof vp);
			const double lp = loss_of(&r, r.eval);
			TEST_H2D(&r, info.param + e, &vm, sizeof vm);
			const double lm = loss_of(&r, r.eval);
			TEST_H2D(&r, info.param + e, &v, sizeof v);
			const double fd = (lp - lm) / (2.0 * eps);
			checked++;
			if (fabs(fd - g[e]) > 2e-4 + 2e-2 * fabs(fd)) {
				bad++;
				fprintf(stderr, "%s: %s[%lld]: analytic %g vs finite difference %g\n",
					tag, info.name, (long long)e, g[e], fd);
			}
		}
		free(g);
	}
	ck_assert_msg(bad == 0, "%s: %d of %d gradient elements disagree (stderr lists them)", tag,
		      bad, checked);
	ck_assert_int_gt(checked, 30);
	rig_close(&r);
}

START_TEST(test_fd_lstm) { fd_case("lstm_l2_bi"); }
END_TEST

START_TEST(test_fd_gru_masked) { fd_case("gru_l2_bi_mask"); }
END_TEST

START_TEST(test_fd_lstm_last_masked) { fd_case("lstm_l2_bi_last_mask"); }
END_TEST

/* ---- the parallel gather ---------------------------------------------
 * plugins/cpu/rnn.c's rnn_gather (x and dy into the time-major copy, y
 * and dx back) runs on the OpenMP team when B*T*C >= CPU_PAR_MIN (32768;
 * C = I for x and dx, H for y and dy), which the cases above (B = 3,
 * T = 5) never reach.  Here the ops alone, on a fixed team of 2 ([run]
 * threads = 2: never adapted), B*T*I = 49152 and B*T*H = 40960, rows of
 * length 0 to T: every row's y, dx (and h_n with `last`) against the
 * same rows run unmasked in a batch of their own length (at most
 * 8*32*24 = 6144 elements: the serial gather), the weight and bias
 * gradients against those batches' sums, and every padded step's y and
 * dx exactly 0 (the outputs start as garbage; dy is nonzero there). */
enum { PB = 64, PT = 32, PI = 24, PH = 20, PAD = 0 };
#define PGROUPS 8 /* rows b and b + 8k share a length, plens[b % 8] */
static const int plens[PGROUPS] = { 0, PT, 1, 7, PT - 1, 16, 3, 25 };

struct pcell {
	int gru, rev;
	int64_t G;
	float *w[4]; /* w_ih [G*H, I], w_hh [G*H, H], b_ih, b_hh [G*H] */
};

struct pout {
	float *y, *dx, *dw[3]; /* y, dx, and dw_ih, dw_hh, db [2, G*H] */
};

/* n values scale * [-1, 1] (test_hash_val, tensor number salt) */
static float *prandv(uint32_t salt, int64_t n, float scale)
{
	float *v = malloc(sizeof(float) * (size_t)n);
	for (int64_t k = 0; k < n; k++)
		v[k] = scale * test_hash_val((uint32_t)k, salt);
	return v;
}

/* Device buffer of `bytes` holding h, or 0xff bytes (NaN) when h is NULL. */
static void *pput(struct rig *r, const void *h, size_t bytes)
{
	void *d, *fill = NULL;
	ck_assert_msg(kiln_device_alloc(r->dev, bytes, &d) == KILN_OK, "%s", kiln_last_error());
	if (!h)
		h = fill = memset(malloc(bytes), 0xff, bytes);
	TEST_H2D(r, d, h, bytes);
	free(fill);
	return d;
}

static void *pprep(struct rig *r, const struct kiln_op *op, size_t *ws)
{
	void *plan = NULL;
	size_t w = 0;
	ck_assert_msg(kiln_device_prepare(r->dev, op, &plan, &w) == KILN_OK, "%s",
		      kiln_last_error());
	*ws = w > *ws ? w : *ws;
	return plan;
}

/* One training forward and backward of cell c over x [B,T,I] (ids [B,T]
 * with pad id PAD, or NULL: every row of length T), dy [B,T,H] ([B,H]
 * with last); the results in o (the caller frees them). */
static void ppass(struct rig *r, const struct pcell *c, int last, int64_t B, int64_t T,
		  const float *x, const int32_t *ids, const float *dy, struct pout *o)
{
	const int64_t GH = c->G * PH, ny = last ? B * PH : B * T * PH, nx = B * T * PI;
	const int64_t nw[3] = { GH * PI, GH * PH, 2 * GH };
	struct kiln_op f, b;
	memset(&f, 0, sizeof f);
	memset(&b, 0, sizeof b);
	f.type = KILN_OP_RNN, f.n_in = ids ? 6 : 5, f.n_out = 2;
	b.type = KILN_OP_RNN_BWD, b.n_in = 5, b.n_out = 4;
	kiln_tensor_desc_init(&f.in[0], KILN_F32, 3, (const int64_t[]){ B, T, PI });
	kiln_tensor_desc_init(&f.in[1], KILN_F32, 2, (const int64_t[]){ GH, PI });
	kiln_tensor_desc_init(&f.in[2], KILN_F32, 2, (const int64_t[]){ GH, PH });
	kiln_tensor_desc_init(&f.in[3], KILN_F32, 1, &GH);
	f.in[4] = f.in[3];
	kiln_tensor_desc_init(&f.in[5], KILN_I32, 2, (const int64_t[]){ B, T });
	kiln_tensor_desc_init(&f.out[0], KILN_F32, last ? 2 : 3,
			      last ? (const int64_t[]){ B, PH } : (const int64_t[]){ B, T, PH });
	kiln_tensor_desc_init(&f.out[1], KILN_U8, 1, (const int64_t[]){ 1 });
	f.i[0] = b.i[0] = c->gru, f.i[1] = b.i[1] = c->rev, f.i[2] = PAD, f.i[4] = b.i[4] = last;
	b.in[0] = b.out[0] = f.in[0];
	b.in[1] = f.out[0];
	b.in[2] = b.out[1] = f.in[1];
	b.in[3] = b.out[2] = f.in[2];
	b.in[4] = f.out[1];
	kiln_tensor_desc_init(&b.out[3], KILN_F32, 2, (const int64_t[]){ 2, GH });
	size_t wsb = 0;
	void *pf = pprep(r, &f, &wsb), *pb = pprep(r, &b, &wsb);
	void *d[] = { pput(r, x, sizeof(float) * (size_t)nx),
		      pput(r, c->w[0], sizeof(float) * (size_t)nw[0]),
		      pput(r, c->w[1], sizeof(float) * (size_t)nw[1]),
		      pput(r, c->w[2], sizeof(float) * (size_t)GH),
		      pput(r, c->w[3], sizeof(float) * (size_t)GH),
		      ids ? pput(r, ids, sizeof(int32_t) * (size_t)(B * T)) : NULL,
		      pput(r, NULL, sizeof(float) * (size_t)ny),
		      pput(r, NULL, kiln_device_aux_bytes(r->dev, pf)),
		      pput(r, dy, sizeof(float) * (size_t)ny),
		      pput(r, NULL, sizeof(float) * (size_t)nx),
		      pput(r, NULL, sizeof(float) * (size_t)nw[0]),
		      pput(r, NULL, sizeof(float) * (size_t)nw[1]),
		      pput(r, NULL, sizeof(float) * (size_t)nw[2]),
		      pput(r, NULL, wsb) };
	struct kiln_op_args fa = { .in = { d[0], d[1], d[2], d[3], d[4], d[5] },
				   .out = { d[6], d[7] }, .workspace = d[13],
				   .workspace_bytes = wsb };
	struct kiln_op_args ba = { .in = { d[0], d[8], d[1], d[2], d[7] },
				   .out = { d[9], d[10], d[11], d[12] }, .workspace = d[13],
				   .workspace_bytes = wsb };
	ck_assert_msg(kiln_device_run(r->dev, pf, &fa, r->stream) == KILN_OK &&
			      kiln_device_run(r->dev, pb, &ba, r->stream) == KILN_OK &&
			      kiln_device_stream_sync(r->dev, r->stream) == KILN_OK,
		      "%s", kiln_last_error());
	o->y = malloc(sizeof(float) * (size_t)ny);
	o->dx = malloc(sizeof(float) * (size_t)nx);
	TEST_D2H(r, o->y, d[6], sizeof(float) * (size_t)ny);
	TEST_D2H(r, o->dx, d[9], sizeof(float) * (size_t)nx);
	for (int k = 0; k < 3; k++) {
		o->dw[k] = malloc(sizeof(float) * (size_t)nw[k]);
		TEST_D2H(r, o->dw[k], d[10 + k], sizeof(float) * (size_t)nw[k]);
	}
	test_rig_free_bufs(r->dev, r->stream, d, sizeof d / sizeof d[0]);
	kiln_device_plan_free(r->dev, pf);
	kiln_device_plan_free(r->dev, pb);
}

static void pout_free(struct pout *o)
{
	free(o->y);
	free(o->dx);
	for (int k = 0; k < 3; k++)
		free(o->dw[k]);
}

/* pnear: max |got - want| <= REL * max(FLOOR, max |want|) */
static void pnear(const char *what, int i, const float *got, const float *want, int64_t n)
{
	double scale;
	int64_t at;
	const double err = max_error(got, want, n, &scale, &at);
	ck_assert_msg(err <= REL * scale,
		      "gather case %d: %s: max |error| %g at element %lld (batch %.8g, rows alone "
		      "%.8g); allowed %g",
		      i, what, err, (long long)at, got[at], want[at], REL * scale);
}

/* v exactly 0 where no step ran: [B,T,C] at t >= the row's length, or
 * (rows, [B,C]: y with last) the rows of length 0. */
static void pzero(const char *what, int i, const float *v, int64_t C, int rows)
{
	for (int64_t b = 0; b < PB; b++) {
		const int len = plens[b % PGROUPS];
		const int64_t from = rows ? 0 : len, to = rows ? (len == 0) : PT;
		for (int64_t t = from; t < to; t++)
			for (int64_t k = 0; k < C; k++) {
				const float got = v[(rows ? b : b * PT + t) * C + k];
				ck_assert_msg(got == 0.0f,
					      "gather case %d: %s[%lld, %lld, %lld] = %g, row length %d: "
					      "not 0",
					      i, what, (long long)b, (long long)t, (long long)k, got, len);
			}
	}
}

/* _i: bit 0 GRU, bit 1 the reverse direction, bit 2 `last` */
START_TEST(test_par_gather)
{
	const int last = _i >> 2 & 1;
	struct pcell c = { .gru = _i & 1, .rev = _i >> 1 & 1, .G = _i & 1 ? 3 : 4 };
	const int64_t GH = c.G * PH, nw[3] = { GH * PI, GH * PH, 2 * GH }, ny = last ? PH : PT * PH;
	struct rig r;
	memset(&r, 0, sizeof r);
	r.cfg = test_config(reg, "[run]\nthreads = 2\n");
	ck_assert_msg(kiln_device_open(reg, r.cfg, check_test_device(), 0, &r.dev) == 0, "%s: %s",
		      check_test_device(), kiln_last_error());
	ck_assert(kiln_device_stream_create(r.dev, &r.stream) == 0);
	const uint32_t salt = 48u * 8u + (uint32_t)_i * 8u;
	const float k = 1.0f / sqrtf((float)PH); /* PyTorch's init range */
	for (int w = 0; w < 4; w++)
		c.w[w] = prandv(salt + (uint32_t)w, w < 2 ? nw[w] : GH, k);
	float *x = prandv(salt + 4, PB * PT * PI, 1), *dy = prandv(salt + 5, PB * ny, 1);
	int32_t *ids = malloc(sizeof(int32_t) * PB * PT);
	for (int64_t b = 0; b < PB; b++) /* the first pad at the length, tokens after it */
		for (int64_t t = 0; t < PT; t++)
			ids[b * PT + t] = t == plens[b % PGROUPS] ? PAD : 1 + (int32_t)((b + t) % 9);
	struct pout got;
	ppass(&r, &c, last, PB, PT, x, ids, dy, &got);
	/* what the rows run alone give, 0 where no step ran */
	float *want_y = calloc((size_t)(PB * ny), sizeof(float));
	float *want_dx = calloc((size_t)(PB * PT * PI), sizeof(float));
	float *want_dw[3];
	for (int w = 0; w < 3; w++)
		want_dw[w] = calloc((size_t)nw[w], sizeof(float));
	for (int g = 0; g < PGROUPS; g++) {
		const int64_t L = plens[g], n = PB / PGROUPS, s = c.rev ? 0 : L - 1;
		if (L == 0)
			continue;
		float *gx = malloc(sizeof(float) * (size_t)(n * L * PI));
		float *gdy = calloc((size_t)(n * L * PH), sizeof(float));
		for (int64_t j = 0; j < n; j++) {
			const int64_t b = g + j * PGROUPS;
			memcpy(gx + j * L * PI, x + b * PT * PI, sizeof(float) * (size_t)(L * PI));
			if (last) /* h_n's gradient at the last step run */
				memcpy(gdy + (j * L + s) * PH, dy + b * PH, sizeof(float) * PH);
			else
				memcpy(gdy + j * L * PH, dy + b * PT * PH, sizeof(float) * (size_t)(L * PH));
		}
		struct pout o;
		ppass(&r, &c, 0, n, L, gx, NULL, gdy, &o);
		for (int64_t j = 0; j < n; j++) {
			const int64_t b = g + j * PGROUPS;
			if (last)
				memcpy(want_y + b * PH, o.y + (j * L + s) * PH, sizeof(float) * PH);
			else
				memcpy(want_y + b * PT * PH, o.y + j * L * PH, sizeof(float) * (size_t)(L * PH));
			memcpy(want_dx + b * PT * PI, o.dx + j * L * PI, sizeof(float) * (size_t)(L * PI));
		}
		for (int w = 0; w < 3; w++)
			for (int64_t e = 0; e < nw[w]; e++)
				want_dw[w][e] += o.dw[w][e];
		pout_free(&o);
		free(gx);
		free(gdy);
	}
	pzero("y", _i, got.y, PH, last);
	pzero("dx", _i, got.dx, PI, 0);
	pnear("y", _i, got.y, want_y, PB * ny);
	pnear("dx", _i, got.dx, want_dx, PB * PT * PI);
	pnear("dw_ih", _i, got.dw[0], want_dw[0], nw[0]);
	pnear("dw_hh", _i, got.dw[1], want_dw[1], nw[1]);
	pnear("db", _i, got.dw[2], want_dw[2], nw[2]);
	pout_free(&got);
	for (int w = 0; w < 3; w++)
		free(want_dw[w]);
	for (int w = 0; w < 4; w++)
		free(c.w[w]);
	free(want_y);
	free(want_dx);
	free(x);
	free(dy);
	free(ids);
	test_rig_close_device(r.dev, r.stream, r.cfg);
}
END_TEST

/* A model that must not build: the message names the layer and the cause. */
START_TEST(test_config_errors)
{
	const int64_t ti[2] = { 5, 4 }, flat[1] = { 20 };
	const char *tail = "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 5\n"
			   "[layer.loss]\ntype = softmax_xent\n";
	char ini[512];
	snprintf(ini, sizeof ini, "[layer.r]\ntype = lstm\n%s", tail);
	test_model_refused(reg, check_test_device(), ini, KILN_F32, 2, ti, "needs 'hidden'");
	/* the layer's own place in the file (since session 38), and the
	 * second input's shape a sample, not at the build's batch of 1 */
	snprintf(ini, sizeof ini, "[layer.r]\ntype = gru\nhidden = 3\n%s", tail);
	test_model_refused(reg, check_test_device(), ini, KILN_F32, 1, flat, "bad.ini:2: layer 'r' (gru) needs f32 [batch, time, channels], got f32[1, 20]");
	snprintf(ini, sizeof ini, "[layer.r]\ntype = lstm\nhidden = 3\ninputs = data, data\n%s", tail);
	test_model_refused(reg, check_test_device(), ini, KILN_F32, 2, ti, "bad.ini:2: layer 'r' (lstm): its second input must be the token ids of the sequence, i32[5] a sample (i32 [time]), got f32[5, 4] a sample");
	/* pad_id on a layer of one input masked nothing, silently, before
	 * session 38: refused, naming where it is set */
	const int64_t tok[1] = { 5 };
	const char *emb = "[layer.e]\ntype = embedding\nvocab = 10\ndim = 4\n";
	snprintf(ini, sizeof ini, "%s[layer.r]\ntype = gru\nhidden = 3\ninput = e\npad_id = 0\n%s", emb, tail);
	test_model_refused(reg, check_test_device(), ini, KILN_I32, 1, tok, "bad.ini:9: layer 'r' (gru): pad_id needs the token ids as a second input (inputs = e, data); with one input nothing is masked");
	snprintf(ini, sizeof ini, "%s[layer.r]\ntype = lstm\nhidden = 3\npad_id = 2\n%s", emb, tail);
	test_model_refused(reg, check_test_device(), ini, KILN_I32, 1, tok, "bad.ini:8: layer 'r' (lstm): pad_id needs the token ids as a second input (inputs = <the layer before it>, data)");
	/* (bf16 compute's refusal, which a plan meets: tests/rnn_config.sh) */
	snprintf(ini, sizeof ini,
		 "[layer.a]\ntype = lstm\nhidden = 3\n[layer.b]\ntype = lstm\nhidden = 2\ninput = data\n"
		 "[layer.c]\ntype = concat\ninputs = a, b\ndim = 2\n%s", tail);
	test_model_refused(reg, check_test_device(), ini, KILN_F32, 2, ti, "dim");
}
END_TEST

static Suite *make_rnn_suite(void)
{
	Suite *s = suite_create("rnn");
	TCase *tc = tcase_create("torch");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_torch, 0, (int)(sizeof cases / sizeof cases[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("gather");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_par_gather, 0, 8);
	suite_add_tcase(s, tc);
	check_add_case(s, "layer", 120, NULL, NULL, (const TTest *[]){
		test_fd_lstm, test_fd_gru_masked, test_fd_lstm_last_masked, test_config_errors,
		NULL });
	return s;
}

static int rnn_setup(void)
{
	char path[512];
	test_data_path(path, sizeof path, "rnn_refs.safetensors");
	if (kiln_safetensors_open(path, &refs)) {
		fprintf(stderr, "%s (regenerate: /usr/bin/python3 tests/data/gen_rnn_refs.py %s)\n",
			kiln_last_error(), path);
		return 1;
	}
	return 0;
}

static void rnn_teardown(void)
{
	kiln_safetensors_close(refs);
}

static const struct check_main check_suite = { .suite = make_rnn_suite, .reg = &reg,
					       .need_test_device = 1, .omp_passive = 1,
					       .setup = rnn_setup, .teardown = rnn_teardown };
