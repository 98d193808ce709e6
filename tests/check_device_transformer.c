/* tests/check_device_transformer.c - the transformer layers and their device ops
 * (EMBEDDING, EMBEDDING_BWD, LAYERNORM, LAYERNORM_BWD, ACT gelu tanh,
 * SOFTMAX_XENT's ignore_index) against PyTorch and finite differences.
 *
 * tests/data/transformer_refs.safetensors (gen_transformer_refs.py) holds
 * the PyTorch tensors: op cases (ln_*, gelu_*, emb_*, xent_*) run the op on
 * the device under test; model cases (gpt_*: embedding, pos_embedding,
 * layernorm, linear on [B, T, C], gelu, dropout, add, softmax_xent with
 * ignored targets) run a training pass on that device through the public
 * model API and compare the loss and every parameter gradient.  Tolerance:
 * max |got - want| <= 1e-5 * max |want| (f32).  A device suite
 * ($KILN_TEST_DEVICE, tests/device_fixture.h), so tests/gpu/run.sh runs it
 * on the GPU too, with the reference file from $KILN_TEST_SRCDIR.
 *
 * Finite differences: the layernorm and gelu tanh backward ops against
 * central differences of their forward in double-checked f32, and every
 * parameter gradient of the small model against central differences of its
 * evaluation loss.
 */
#include "check_main.h"
#include "device_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL 1e-5

static struct kiln_safetensors *refs;

static int refs_open(void)
{
	char path[1024];
	int rc = dfx_probe();
	if (rc)
		return rc;
	/* KILN_TEST_SRCDIR: the suite run from a carried bundle (tests/gpu/run.sh) */
	const char *src = getenv("KILN_TEST_SRCDIR");
	snprintf(path, sizeof path, "%s/tests/data/transformer_refs.safetensors",
		 src && *src ? src : SRCDIR);
	if (kiln_safetensors_open(path, &refs)) {
		fprintf(stderr, "%s (regenerate: tests/data/gen_transformer_refs.py)\n",
			kiln_last_error());
		return 1;
	}
	return 0;
}

static void refs_close(void) { kiln_safetensors_close(refs); }

/* Reference tensor CASE/NAME. */
static struct kiln_safetensors_tensor ref(const char *c, const char *name)
{
	char key[256];
	struct kiln_safetensors_tensor t;
	snprintf(key, sizeof key, "%s/%s", c, name);
	ck_assert_msg(kiln_safetensors_find(refs, key, &t) == KILN_OK, "%s", kiln_last_error());
	return t;
}

/* max |got - want| <= REL * max |want| over n floats. */
static void near_all(const char *what, const float *got, const float *want, int64_t n)
{
	double mag = 0, err = 0;
	int64_t at = 0;
	for (int64_t i = 0; i < n; i++) {
		mag = fmax(mag, fabs(want[i]));
		if (fabs((double)got[i] - want[i]) > err)
			err = fabs((double)got[i] - want[i]), at = i;
	}
	ck_assert_msg(err <= REL * mag, "%s: element %lld is %.9g, PyTorch %.9g (max |ref| %.4g)",
		      what, (long long)at, got[at], want[at], mag);
}

/* Device output of n floats compared with reference CASE/NAME. */
static void check_out(struct fx *f, const char *c, const char *name, const void *d)
{
	struct kiln_safetensors_tensor t = ref(c, name);
	int64_t n = t.numel;
	float *h = malloc(sizeof(float) * (size_t)n);
	dget(f, h, d, sizeof(float) * (size_t)n);
	char what[160];
	snprintf(what, sizeof what, "%s %s", c, name);
	near_all(what, h, t.data, n);
	free(h);
}

static void *put_ref(struct fx *f, const char *c, const char *name)
{
	struct kiln_safetensors_tensor t = ref(c, name);
	return dput(f, t.data, t.bytes);
}

static struct kiln_tensor_desc rows_desc(int64_t R, int64_t C)
{
	return td(KILN_F32, 2, R, C);
}

/* ---- layernorm -------------------------------------------------------------- */

static void ln_ops(struct kiln_op *fwd, struct kiln_op *bwd, int64_t R, int64_t C, int affine)
{
	memset(fwd, 0, sizeof *fwd);
	fwd->type = KILN_OP_LAYERNORM;
	fwd->n_in = affine ? 3 : 1, fwd->n_out = 2;
	fwd->in[0] = fwd->out[0] = rows_desc(R, C);
	fwd->in[1] = fwd->in[2] = td(KILN_F32, 1, C, 0);
	fwd->out[1] = rows_desc(R, 2);
	fwd->f[0] = 1e-5;
	memset(bwd, 0, sizeof *bwd);
	bwd->type = KILN_OP_LAYERNORM_BWD;
	bwd->n_in = affine ? 4 : 3, bwd->n_out = affine ? 3 : 1;
	bwd->in[0] = bwd->in[1] = bwd->out[0] = rows_desc(R, C);
	bwd->in[2] = rows_desc(R, 2);
	bwd->in[3] = bwd->out[1] = bwd->out[2] = td(KILN_F32, 1, C, 0);
}

START_TEST(test_layernorm)
{
	static const char *const cases[] = { "ln_b1_t7_c8", "ln_b3_t13_c64", "ln_b3_t7_c8" };
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_LAYERNORM);
	for (int k = 0; k < 3; k++) {
		const char *c = cases[k];
		struct kiln_safetensors_tensor x = ref(c, "x");
		const int64_t C = x.dims[2], R = x.dims[0] * x.dims[1];
		struct kiln_op fwd, bwd;
		ln_ops(&fwd, &bwd, R, C, 1);
		void *dx_ = put_ref(&f, c, "x"), *g = put_ref(&f, c, "weight");
		void *b = put_ref(&f, c, "bias"), *dy = put_ref(&f, c, "dy");
		void *y = dput(&f, NULL, sizeof(float) * (size_t)(R * C));
		void *saved = dput(&f, NULL, sizeof(float) * (size_t)(2 * R));
		void *dx = dput(&f, NULL, sizeof(float) * (size_t)(R * C));
		void *dg = dput(&f, NULL, sizeof(float) * (size_t)C);
		void *db = dput(&f, NULL, sizeof(float) * (size_t)C);
		OK(run_op(&f, &fwd, (const void *[]){ dx_, g, b }, (void *[]){ y, saved }));
		check_out(&f, c, "y", y);
		check_out(&f, c, "saved", saved);
		OK(run_op(&f, &bwd, (const void *[]){ dx_, dy, saved, g }, (void *[]){ dx, dg, db }));
		check_out(&f, c, "dx", dx);
		check_out(&f, c, "dweight", dg);
		check_out(&f, c, "dbias", db);
		/* accumulate: dx += the same again, dgamma, dbeta too (i[0] = 1) */
		bwd.flags = KILN_OPF_ACCUMULATE;
		bwd.i[0] = 1;
		OK(run_op(&f, &bwd, (const void *[]){ dx_, dy, saved, g }, (void *[]){ dx, dg, db }));
		float *h = malloc(sizeof(float) * (size_t)(R * C)), *w = malloc(sizeof(float) * (size_t)(R * C));
		struct kiln_safetensors_tensor want = ref(c, "dx");
		for (int64_t i = 0; i < R * C; i++)
			w[i] = 2.0f * ((const float *)want.data)[i];
		dget(&f, h, dx, sizeof(float) * (size_t)(R * C));
		near_all("layernorm dx accumulated", h, w, R * C);
		want = ref(c, "dbias");
		for (int64_t i = 0; i < C; i++)
			w[i] = 2.0f * ((const float *)want.data)[i];
		dget(&f, h, db, sizeof(float) * (size_t)C);
		near_all("layernorm dbeta accumulated", h, w, C);
		free(h);
		free(w);
		DFREE(&f, dx_, g, b, dy, y, saved, dx, dg, db);
	}
	fx_close(&f);
}
END_TEST

/* sum(w * op(x)) for the finite differences: a scalar of the forward. */
static double ln_probe(struct fx *f, const struct kiln_op *fwd, const float *x, const float *g,
		       const float *b, const float *w, int64_t R, int64_t C)
{
	void *dx = dput(f, x, sizeof(float) * (size_t)(R * C)), *dg = dput(f, g, sizeof(float) * (size_t)C);
	void *db = dput(f, b, sizeof(float) * (size_t)C);
	void *y = dput(f, NULL, sizeof(float) * (size_t)(R * C)), *s = dput(f, NULL, sizeof(float) * (size_t)(2 * R));
	OK(run_op(f, fwd, (const void *[]){ dx, dg, db }, (void *[]){ y, s }));
	float *h = malloc(sizeof(float) * (size_t)(R * C));
	dget(f, h, y, sizeof(float) * (size_t)(R * C));
	double sum = 0;
	for (int64_t i = 0; i < R * C; i++)
		sum += (double)w[i] * h[i];
	free(h);
	DFREE(f, dx, dg, db, y, s);
	return sum;
}

/* Central differences of sum(w * layernorm(x)) against LAYERNORM_BWD with
 * dy = w, for x, gamma and beta (a row of 5 and a row of 64). */
START_TEST(test_layernorm_fd)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_LAYERNORM);
	const int64_t R = 3, C = 5;
	float x[15], g[5], b[5], w[15];
	for (int i = 0; i < 15; i++)
		x[i] = 2.0f * frand(), w[i] = frand();
	for (int i = 0; i < 5; i++)
		g[i] = 1.0f + 0.5f * frand(), b[i] = frand();
	struct kiln_op fwd, bwd;
	ln_ops(&fwd, &bwd, R, C, 1);
	void *dx_ = dput(&f, x, sizeof x), *dg_ = dput(&f, g, sizeof g), *db_ = dput(&f, b, sizeof b);
	void *dw = dput(&f, w, sizeof w), *y = dput(&f, NULL, sizeof x), *s = dput(&f, NULL, 2 * R * sizeof(float));
	void *dx = dput(&f, NULL, sizeof x), *dg = dput(&f, NULL, sizeof g), *db = dput(&f, NULL, sizeof b);
	OK(run_op(&f, &fwd, (const void *[]){ dx_, dg_, db_ }, (void *[]){ y, s }));
	OK(run_op(&f, &bwd, (const void *[]){ dx_, dw, s, dg_ }, (void *[]){ dx, dg, db }));
	float hx[15], hg[5], hb[5];
	dget(&f, hx, dx, sizeof hx);
	dget(&f, hg, dg, sizeof hg);
	dget(&f, hb, db, sizeof hb);
	float *vars[3] = { x, g, b }, *grads[3] = { hx, hg, hb };
	const int lens[3] = { 15, 5, 5 };
	const float eps = 1e-2f;
	for (int v = 0; v < 3; v++)
		for (int i = 0; i < lens[v]; i++) {
			const float keep = vars[v][i];
			vars[v][i] = keep + eps;
			double lp = ln_probe(&f, &fwd, x, g, b, w, R, C);
			vars[v][i] = keep - eps;
			double lm = ln_probe(&f, &fwd, x, g, b, w, R, C);
			vars[v][i] = keep;
			double fd = (lp - lm) / (2.0 * eps);
			ck_assert_msg(fabs(fd - grads[v][i]) <= 2e-3 + 2e-3 * fabs(fd),
				      "layernorm %s[%d]: analytic %g, finite difference %g",
				      v == 0 ? "x" : v == 1 ? "gamma" : "beta", i, grads[v][i], fd);
		}
	DFREE(&f, dx_, dg_, db_, dw, y, s, dx, dg, db);
	fx_close(&f);
}
END_TEST

/* Without affine parameters (n_in 1 forward, 3 backward): the numbers of
 * gamma = 1, beta = 0. */
START_TEST(test_layernorm_plain)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_LAYERNORM);
	enum { R = 5, C = 37, N = R * C };
	float x[N], dy[N], one[C], zero[C], y[2][N], dx[2][N];
	for (int i = 0; i < N; i++)
		x[i] = 3.0f * frand() - 1.0f, dy[i] = frand();
	for (int i = 0; i < C; i++)
		one[i] = 1.0f, zero[i] = 0.0f;
	for (int affine = 0; affine < 2; affine++) {
		struct kiln_op fwd, bwd;
		ln_ops(&fwd, &bwd, R, C, affine);
		void *dx_ = dput(&f, x, sizeof x), *ddy = dput(&f, dy, sizeof dy);
		void *g = dput(&f, one, sizeof one), *b = dput(&f, zero, sizeof zero);
		void *dy_ = dput(&f, NULL, sizeof x), *s = dput(&f, NULL, 2 * R * sizeof(float));
		void *ddx = dput(&f, NULL, sizeof x), *dg = dput(&f, NULL, sizeof one), *db = dput(&f, NULL, sizeof one);
		const void *fin[3] = { dx_, g, b }, *bin[4] = { dx_, ddy, s, g };
		OK(run_op(&f, &fwd, fin, (void *[]){ dy_, s }));
		OK(run_op(&f, &bwd, bin, (void *[]){ ddx, dg, db }));
		dget(&f, y[affine], dy_, sizeof x);
		dget(&f, dx[affine], ddx, sizeof x);
		DFREE(&f, dx_, ddy, g, b, dy_, s, ddx, dg, db);
	}
	for (int i = 0; i < N; i++)
		ck_assert_msg(y[0][i] == y[1][i] && dx[0][i] == dx[1][i],
			      "element %d: plain y %g dx %g, affine (1, 0) y %g dx %g", i, y[0][i],
			      dx[0][i], y[1][i], dx[1][i]);
	fx_close(&f);
}
END_TEST

/* bf16 activations (mixed precision): y is the f32 op's result on the same
 * values, rounded once; dx likewise, and dgamma, dbeta stay f32. */
START_TEST(test_layernorm_bf16)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_LAYERNORM);
	enum { R = 7, C = 64, N = R * C };
	float x[N], dy[N], g[C], b[C], y32[N], dx32[N], dg32[C], dg16[C];
	uint16_t x16[N], dy16[N], y16[N], dx16[N];
	for (int i = 0; i < N; i++) {
		x16[i] = h_round(2.0f * frand() + 0.3f, KILN_BF16), x[i] = h_wide(x16[i], KILN_BF16);
		dy16[i] = h_round(frand(), KILN_BF16), dy[i] = h_wide(dy16[i], KILN_BF16);
	}
	for (int i = 0; i < C; i++)
		g[i] = 1.0f + 0.5f * frand(), b[i] = frand();
	for (int lp = 0; lp < 2; lp++) {
		struct kiln_op fwd, bwd;
		ln_ops(&fwd, &bwd, R, C, 1);
		const size_t eb = lp ? sizeof(uint16_t) : sizeof(float);
		if (lp)
			fwd.in[0].dtype = fwd.out[0].dtype = bwd.in[0].dtype = bwd.in[1].dtype =
				bwd.out[0].dtype = KILN_BF16;
		void *dx_ = dput(&f, lp ? (void *)x16 : (void *)x, N * eb);
		void *ddy = dput(&f, lp ? (void *)dy16 : (void *)dy, N * eb);
		void *dg_ = dput(&f, g, sizeof g), *db_ = dput(&f, b, sizeof b);
		void *y = dput(&f, NULL, N * eb), *s = dput(&f, NULL, 2 * R * sizeof(float));
		void *dx = dput(&f, NULL, N * eb), *dg = dput(&f, NULL, sizeof g), *db = dput(&f, NULL, sizeof b);
		OK(run_op(&f, &fwd, (const void *[]){ dx_, dg_, db_ }, (void *[]){ y, s }));
		OK(run_op(&f, &bwd, (const void *[]){ dx_, ddy, s, dg_ }, (void *[]){ dx, dg, db }));
		dget(&f, lp ? (void *)y16 : (void *)y32, y, N * eb);
		dget(&f, lp ? (void *)dx16 : (void *)dx32, dx, N * eb);
		dget(&f, lp ? dg16 : dg32, dg, sizeof dg32);
		DFREE(&f, dx_, ddy, dg_, db_, y, s, dx, dg, db);
	}
	for (int i = 0; i < N; i++) {
		ck_assert_msg(y16[i] == h_round(y32[i], KILN_BF16), "bf16 y[%d]", i);
		ck_assert_msg(dx16[i] == h_round(dx32[i], KILN_BF16), "bf16 dx[%d]", i);
	}
	ck_assert(!memcmp(dg16, dg32, sizeof dg32));
	fx_close(&f);
}
END_TEST

/* ---- gelu, exact and tanh ---------------------------------------------------- */

START_TEST(test_gelu)
{
	static const char *const cases[] = { "gelu_none", "gelu_tanh" };
	static const int kinds[] = { KILN_ACT_GELU, KILN_ACT_GELU_TANH };
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ACT);
	for (int k = 0; k < 2; k++) {
		const char *c = cases[k];
		struct kiln_safetensors_tensor xt = ref(c, "x");
		const int64_t n = xt.numel;
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ACT;
		op.n_in = op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_F32, 1, n, 0);
		op.i[0] = kinds[k];
		void *x = put_ref(&f, c, "x"), *dy = put_ref(&f, c, "dy");
		void *y = dput(&f, NULL, sizeof(float) * (size_t)n), *dx = dput(&f, NULL, sizeof(float) * (size_t)n);
		OK(run_op(&f, &op, (const void *[]){ x }, (void *[]){ y }));
		check_out(&f, c, "y", y);
		op.type = KILN_OP_ACT_BWD;
		op.n_in = 3;
		op.in[1] = op.in[2] = op.in[0];
		OK(run_op(&f, &op, (const void *[]){ x, dy, y }, (void *[]){ dx }));
		check_out(&f, c, "dx", dx);
		DFREE(&f, x, dy, y, dx);
	}
	fx_close(&f);
}
END_TEST

/* The tanh GELU's derivative against central differences of its forward,
 * over [-6, 6]. */
START_TEST(test_gelu_tanh_fd)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ACT);
	enum { N = 121 };
	const float eps = 1e-2f;
	float x[3 * N], ones[N], g[N], y[3 * N];
	for (int i = 0; i < N; i++) {
		const float v = -6.0f + 0.1f * (float)i;
		x[i] = v, x[N + i] = v + eps, x[2 * N + i] = v - eps, ones[i] = 1.0f;
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ACT;
	op.n_in = op.n_out = 1;
	op.in[0] = op.out[0] = td(KILN_F32, 1, 3 * N, 0);
	op.i[0] = KILN_ACT_GELU_TANH;
	void *dx_ = dput(&f, x, sizeof x), *dy = dput(&f, ones, sizeof ones);
	void *dyv = dput(&f, NULL, sizeof y), *dg = dput(&f, NULL, sizeof g);
	OK(run_op(&f, &op, (const void *[]){ dx_ }, (void *[]){ dyv }));
	dget(&f, y, dyv, sizeof y);
	op.type = KILN_OP_ACT_BWD;
	op.n_in = 2;
	op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, N, 0);
	OK(run_op(&f, &op, (const void *[]){ dx_, dy }, (void *[]){ dg }));
	dget(&f, g, dg, sizeof g);
	for (int i = 0; i < N; i++) {
		const double fd = ((double)y[N + i] - y[2 * N + i]) / (2.0 * eps);
		ck_assert_msg(fabs(fd - g[i]) <= 1e-3 + 1e-3 * fabs(fd),
			      "gelu tanh at %g: analytic %g, finite difference %g", x[i], g[i], fd);
	}
	DFREE(&f, dx_, dy, dyv, dg);
	fx_close(&f);
}
END_TEST

/* ---- embedding ------------------------------------------------------------- */

static void emb_op(struct kiln_op *op, int bwd, int64_t B, int64_t T, int64_t V, int64_t C)
{
	memset(op, 0, sizeof *op);
	op->type = bwd ? KILN_OP_EMBEDDING_BWD : KILN_OP_EMBEDDING;
	op->n_in = 2, op->n_out = 1;
	op->in[0] = td(KILN_I32, 2, B, T);
	int64_t dims[3] = { B, T, C };
	struct kiln_tensor_desc rows, table = td(KILN_F32, 2, V, C);
	kiln_tensor_desc_init(&rows, KILN_F32, 3, dims);
	op->in[1] = bwd ? rows : table;
	op->out[0] = bwd ? table : rows;
}

START_TEST(test_embedding)
{
	static const char *const cases[] = { "emb_b1_t7_c8", "emb_b3_t13_c64" };
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_EMBEDDING);
	for (int k = 0; k < 2; k++) {
		const char *c = cases[k];
		struct kiln_safetensors_tensor it = ref(c, "idx"), wt = ref(c, "weight");
		const int64_t B = it.dims[0], T = it.dims[1], V = wt.dims[0], C = wt.dims[1];
		struct kiln_op fwd, bwd;
		emb_op(&fwd, 0, B, T, V, C);
		emb_op(&bwd, 1, B, T, V, C);
		void *idx = put_ref(&f, c, "idx"), *w = put_ref(&f, c, "weight");
		void *dy = put_ref(&f, c, "dy");
		void *y = dput(&f, NULL, sizeof(float) * (size_t)(B * T * C));
		void *dw = dput(&f, NULL, sizeof(float) * (size_t)(V * C));
		OK(run_op(&f, &fwd, (const void *[]){ idx, w }, (void *[]){ y }));
		check_out(&f, c, "y", y);
		OK(run_op(&f, &bwd, (const void *[]){ idx, dy }, (void *[]){ dw }));
		check_out(&f, c, "dweight", dw);
		DFREE(&f, idx, w, dy, y, dw);
	}
	/* an id outside [0, V): EDATA naming it, nothing read past the table
	 * (last: in async mode the error stays with the stream) */
	int32_t bad[2] = { 0, 5 };
	float table[5 * 3] = { 0 };
	void *bidx = dput(&f, bad, sizeof bad), *w = dput(&f, table, sizeof table);
	void *y = dput(&f, NULL, 2 * 3 * sizeof(float));
	struct kiln_op fwd;
	emb_op(&fwd, 0, 1, 2, 5, 3);
	kiln_status st = run_op(&f, &fwd, (const void *[]){ bidx, w }, (void *[]){ y });
	ck_assert_msg(st == KILN_EDATA && strstr(kiln_last_error(), "index 5 at position 1"),
		      "a bad id gave %d: %s", st, kiln_last_error());
	DFREE(&f, bidx, w, y);
	fx_close(&f);
}
END_TEST

/* The backward's sums do not depend on the thread count: 1 and 3 threads
 * give the same bytes over many repeated ids. */
START_TEST(test_embedding_deterministic)
{
	const int64_t B = 4, T = 33, V = 7, C = 19, N = B * T;
	int32_t idx[4 * 33];
	float *dyh = frandv((size_t)(N * C)), out[2][7 * 19];
	for (int i = 0; i < N; i++)
		idx[i] = (i * 5 + i / 3) % (int)V;
	for (int mode = 0; mode < 2; mode++) {
		struct fx f;
		fx_open(&f, mode);
		SKIP_UNSUPPORTED(&f, KILN_OP_EMBEDDING_BWD);
		struct kiln_op op;
		emb_op(&op, 1, B, T, V, C);
		void *di = dput(&f, idx, sizeof idx), *dy = dput(&f, dyh, sizeof(float) * (size_t)(N * C));
		void *dw = dput(&f, NULL, sizeof(float) * (size_t)(V * C));
		OK(run_op(&f, &op, (const void *[]){ di, dy }, (void *[]){ dw }));
		dget(&f, out[mode], dw, sizeof out[mode]);
		DFREE(&f, di, dy, dw);
		fx_close(&f);
	}
	ck_assert_msg(!memcmp(out[0], out[1], sizeof out[0]), "EMBEDDING_BWD depends on the thread count");
	/* and equals the sum in index order */
	for (int64_t v = 0; v < V; v++)
		for (int64_t c = 0; c < C; c++) {
			float s = 0;
			for (int64_t n = 0; n < N; n++)
				if (idx[n] == v)
					s += dyh[n * C + c];
			ck_assert_msg(out[0][v * C + c] == s, "dtable[%lld][%lld] %g, want %g",
				      (long long)v, (long long)c, out[0][v * C + c], s);
		}
	free(dyh);
}
END_TEST

/* ---- cross-entropy with ignore_index ----------------------------------------- */

START_TEST(test_xent_ignore)
{
	static const char *const cases[] = { "xent_b3_t7", "xent_b1_t13" };
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_SOFTMAX_XENT);
	for (int k = 0; k < 2; k++) {
		const char *c = cases[k];
		struct kiln_safetensors_tensor lt = ref(c, "logits"), yt = ref(c, "labels");
		const int64_t B = lt.dims[0], R = lt.dims[0] * lt.dims[1], V = lt.dims[2];
		int64_t ignored = 0;
		for (int64_t r = 0; r < R; r++)
			ignored += ((const int32_t *)yt.data)[r] == -100;
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SOFTMAX_XENT;
		op.n_in = 2, op.n_out = 2;
		op.in[0] = op.out[0] = rows_desc(R, V);
		op.in[1] = td(KILN_I32, 1, R, 0);
		op.out[1] = td(KILN_F32, 1, 4, 0);
		op.i[0] = R, op.i[1] = KILN_LOSS_XENT, op.i[2] = 1, op.i[3] = -100, op.i[4] = B;
		op.f[0] = 1.0 / (double)R;
		float m[4] = { 0, 0, 0, 0 };
		void *x = put_ref(&f, c, "logits"), *y = put_ref(&f, c, "labels");
		void *dx = dput(&f, NULL, sizeof(float) * (size_t)(R * V)), *dm = dput(&f, m, sizeof m);
		OK(run_op(&f, &op, (const void *[]){ x, y }, (void *[]){ dx, dm }));
		check_out(&f, c, "dlogits", dx);
		dget(&f, m, dm, sizeof m);
		const float want = *(const float *)ref(c, "loss").data;
		/* B times the mean over the rows counted; [3] the rows counted */
		NEAR(m[0] / (float)B, want, fabs(want), REL, "%s: loss %g, PyTorch %g", c, m[0] / B, want);
		ck_assert_msg(m[3] == (float)(R - ignored), "%s: %g rows counted, want %lld", c, m[3],
			      (long long)(R - ignored));
		DFREE(&f, x, y, dx, dm);
	}
	fx_close(&f);
}
END_TEST

/* ---- the model: a transformer block through the public API ------------------- */

struct model {
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	void *s, *x, *labels, *metrics;
	int64_t B, T;
};

static void model_open_dt(struct model *r, const char *c, int dtype);

static void model_open(struct model *r, const char *c) { model_open_dt(r, c, KILN_F32); }

/* The model of case c on the device under test, computing in dtype, its
 * parameters PyTorch's, its batch loaded. */
static void model_open_dt(struct model *r, const char *c, int dtype)
{
	char key[256];
	memset(r, 0, sizeof *r);
	snprintf(key, sizeof key, "%s/ini", c);
	const char *ini = kiln_safetensors_meta(refs, key);
	ck_assert_msg(ini != NULL, "no %s", key);
	OK(kiln_registry_open(NULL, &r->reg));
	OK(kiln_config_load_string(ini, c, &r->cfg));
	OK(kiln_config_validate(r->cfg, r->reg));
	OK(kiln_device_open(r->reg, r->cfg, g_name, 0, &r->dev));
	OK(kiln_device_stream_create(r->dev, &r->s));
	struct kiln_safetensors_tensor x = ref(c, "x");
	r->B = x.dims[0], r->T = x.dims[1];
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_I32, 1, &r->T);
	OK(kiln_model_create(r->cfg, r->reg, r->dev, &sample, &r->m));
	if (dtype != KILN_F32)
		OK(kiln_model_set_compute_dtype(r->m, dtype));
	OK(kiln_model_plan(r->m, r->B, 1, &r->train));
	OK(kiln_model_plan(r->m, r->B, 0, &r->eval));
	OK(kiln_device_alloc(r->dev, x.bytes, &r->x));
	OK(kiln_device_alloc(r->dev, x.bytes, &r->labels));
	OK(kiln_device_alloc(r->dev, 64, &r->metrics));
	OK(kiln_device_copy_async(r->dev, r->x, x.data, x.bytes, KILN_COPY_H2D, r->s));
	struct kiln_safetensors_tensor y = ref(c, "labels");
	OK(kiln_device_copy_async(r->dev, r->labels, y.data, y.bytes, KILN_COPY_H2D, r->s));
	for (int i = 0; i < kiln_model_param_count(r->m); i++) {
		struct kiln_param_info info;
		kiln_model_param_get(r->m, i, &info);
		snprintf(key, sizeof key, "param/%s", info.name);
		struct kiln_safetensors_tensor t = ref(c, key);
		ck_assert_msg(t.numel == kiln_tensor_numel(&info.desc), "%s: %s differs in size",
			      c, info.name);
		OK(kiln_device_copy_async(r->dev, info.param, t.data, t.bytes, KILN_COPY_H2D, r->s));
	}
	OK(kiln_device_stream_sync(r->dev, r->s));
}

static void model_close(struct model *r)
{
	kiln_device_free(r->dev, r->x);
	kiln_device_free(r->dev, r->labels);
	kiln_device_free(r->dev, r->metrics);
	kiln_plan_free(r->train);
	kiln_plan_free(r->eval);
	kiln_model_free(r->m);
	kiln_device_stream_destroy(r->dev, r->s);
	kiln_device_close(r->dev);
	kiln_config_free(r->cfg);
	kiln_registry_close(r->reg);
}

/* The mean loss over the rows counted, from a run of plan p. */
static double model_loss(struct model *r, struct kiln_plan *p, int train)
{
	float m[4] = { 0, 0, 0, 0 };
	OK(kiln_device_copy_async(r->dev, r->metrics, m, sizeof m, KILN_COPY_H2D, r->s));
	OK(train ? kiln_plan_run(p, r->x, r->labels, r->metrics, r->s)
		 : kiln_plan_forward(p, r->x, r->labels, r->metrics, r->s));
	OK(kiln_device_copy_async(r->dev, m, r->metrics, sizeof m, KILN_COPY_D2H, r->s));
	OK(kiln_device_stream_sync(r->dev, r->s));
	return m[0] / (double)r->B; /* B times the batch's token mean */
}

START_TEST(test_model)
{
	static const char *const cases[] = { "gpt_b1_t7_c8", "gpt_b3_t13_c64", "gpt_b3_t7_c8_exact" };
	for (int k = 0; k < 3; k++) {
		const char *c = cases[k];
		struct model r;
		model_open(&r, c);
		const float want = *(const float *)ref(c, "loss").data;
		const double got = model_loss(&r, r.train, 1);
		ck_assert_msg(fabs(got - want) <= REL * fabs(want), "%s: loss %.9g, PyTorch %.9g", c,
			      got, want);
		const double ev = model_loss(&r, r.eval, 0);
		ck_assert_msg(fabs(ev - want) <= REL * fabs(want), "%s: eval loss %.9g, PyTorch %.9g",
			      c, ev, want);
		for (int i = 0; i < kiln_model_param_count(r.m); i++) {
			struct kiln_param_info info;
			char key[256], what[300];
			kiln_model_param_get(r.m, i, &info);
			snprintf(key, sizeof key, "grad/%s", info.name);
			struct kiln_safetensors_tensor t = ref(c, key);
			const int64_t n = t.numel;
			float *h = malloc(sizeof(float) * (size_t)n);
			OK(kiln_device_copy_async(r.dev, h, info.grad, t.bytes, KILN_COPY_D2H, r.s));
			OK(kiln_device_stream_sync(r.dev, r.s));
			snprintf(what, sizeof what, "%s grad %s", c, info.name);
			near_all(what, h, t.data, n);
			free(h);
		}
		model_close(&r);
	}
}
END_TEST

/* bf16 compute (the embedding's rows, every activation and the weights the
 * products read in bf16, f32 parameters and gradients): the loss within
 * 2% of PyTorch's f32, every gradient within 10% of its largest element. */
START_TEST(test_model_bf16)
{
	const char *c = "gpt_b3_t13_c64";
	struct model r;
	model_open_dt(&r, c, KILN_BF16);
	const float want = *(const float *)ref(c, "loss").data;
	const double got = model_loss(&r, r.train, 1);
	ck_assert_msg(fabs(got - want) <= 2e-2 * fabs(want), "%s bf16: loss %.6g, PyTorch f32 %.6g",
		      c, got, want);
	for (int i = 0; i < kiln_model_param_count(r.m); i++) {
		struct kiln_param_info info;
		char key[256];
		kiln_model_param_get(r.m, i, &info);
		snprintf(key, sizeof key, "grad/%s", info.name);
		struct kiln_safetensors_tensor t = ref(c, key);
		float *h = malloc(t.bytes);
		OK(kiln_device_copy_async(r.dev, h, info.grad, t.bytes, KILN_COPY_D2H, r.s));
		OK(kiln_device_stream_sync(r.dev, r.s));
		double mag = 0, err = 0;
		for (int64_t e = 0; e < t.numel; e++) {
			const float w = ((const float *)t.data)[e];
			mag = fmax(mag, fabs(w));
			err = fmax(err, fabs((double)h[e] - w));
		}
		ck_assert_msg(err <= 0.1 * mag, "%s bf16: grad %s off by %g (max |ref| %g)", c,
			      info.name, err, mag);
		free(h);
	}
	model_close(&r);
}
END_TEST

/* Every parameter gradient of the small model against central differences
 * of its evaluation loss. */
START_TEST(test_model_fd)
{
	struct model r;
	model_open(&r, "gpt_b1_t7_c8");
	model_loss(&r, r.train, 1);
	int checked = 0;
	for (int i = 0; i < kiln_model_param_count(r.m); i++) {
		struct kiln_param_info info;
		kiln_model_param_get(r.m, i, &info);
		const int64_t n = kiln_tensor_numel(&info.desc);
		float *g = malloc(sizeof(float) * (size_t)n);
		OK(kiln_device_copy_async(r.dev, g, info.grad, sizeof(float) * (size_t)n, KILN_COPY_D2H, r.s));
		OK(kiln_device_stream_sync(r.dev, r.s));
		for (int64_t e = 0; e < n; e++) {
			const float eps = 1e-2f;
			float w, v;
			OK(kiln_device_copy_async(r.dev, &w, info.param + e, sizeof w, KILN_COPY_D2H, r.s));
			OK(kiln_device_stream_sync(r.dev, r.s));
			v = w + eps;
			OK(kiln_device_copy_async(r.dev, info.param + e, &v, sizeof v, KILN_COPY_H2D, r.s));
			const double lp = model_loss(&r, r.eval, 0);
			v = w - eps;
			OK(kiln_device_copy_async(r.dev, info.param + e, &v, sizeof v, KILN_COPY_H2D, r.s));
			const double lm = model_loss(&r, r.eval, 0);
			OK(kiln_device_copy_async(r.dev, info.param + e, &w, sizeof w, KILN_COPY_H2D, r.s));
			const double fd = (lp - lm) / (2.0 * eps);
			ck_assert_msg(fabs(fd - g[e]) <= 1e-3 + 1e-2 * fabs(fd),
				      "%s[%lld]: analytic %g, finite difference %g", info.name,
				      (long long)e, g[e], fd);
			checked++;
		}
		free(g);
	}
	OK(kiln_device_stream_sync(r.dev, r.s));
	ck_assert(checked > 400);
	model_close(&r);
}
END_TEST

/* pos_embedding: more tokens than max_len is a config error naming the
 * layer; the embedding wants i32 ids. */
START_TEST(test_config_errors)
{
	static const char ini[] = "[layer.wte]\ntype = embedding\nvocab = 5\ndim = 4\n"
				  "[layer.pos]\ntype = pos_embedding\nmax_len = 4\n"
				  "[layer.loss]\ntype = softmax_xent\n";
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m = NULL;
	OK(kiln_registry_open(NULL, &reg));
	OK(kiln_config_load_string(ini, "errors", &cfg));
	OK(kiln_config_validate(cfg, reg));
	OK(kiln_device_open(reg, cfg, g_name, 0, &dev));
	int64_t T = 5;
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_I32, 1, &T);
	ck_assert(kiln_model_create(cfg, reg, dev, &sample, &m) == KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "'pos'") && strstr(kiln_last_error(), "max_len"),
		      "%s", kiln_last_error());
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &T);
	ck_assert(kiln_model_create(cfg, reg, dev, &sample, &m) == KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "'wte'") && strstr(kiln_last_error(), "i32"), "%s",
		      kiln_last_error());
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
}
END_TEST

static Suite *make_transformer_suite(void)
{
	Suite *s = dfx_suite((const struct dfx_case[]){
		DFX_CASE(layernorm), DFX_CASE(layernorm_fd), DFX_CASE(layernorm_plain),
		DFX_CASE(layernorm_bf16), DFX_CASE(gelu),
		DFX_CASE(gelu_tanh_fd), DFX_CASE(embedding), DFX_ONCE(embedding_deterministic, 60),
		DFX_CASE(xent_ignore), DFX_ONCE(model, 120), DFX_ONCE(model_bf16, 120),
		DFX_ONCE(model_fd, 300),
		DFX_ONCE(config_errors, 60), { NULL, NULL, 0 } });
	return s;
}

static const struct check_main check_suite = { .suite = make_transformer_suite,
					       .setup = refs_open,
					       .teardown = refs_close,
					       .omp_passive = 1 };
