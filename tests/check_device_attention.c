/* tests/check_device_attention.c - device conformance: the fused attention
 * ops KILN_OP_ATTENTION and KILN_OP_ATTENTION_BWD (kiln/ops.h).
 *
 *   attn_loops    forward (y, lse) and backward (dqkv, written and
 *                 accumulated) against a naive double-precision loop, for
 *                 causal and full attention, T across the CPU's row blocks
 *   attn_torch    the same against PyTorch 1.13's explicit attention and
 *                 autograd (tests/data/attention_refs.safetensors, written by
 *                 tests/data/gen_attention_refs.py)
 *   attn_dropout  with dropout on the probabilities: the mask is
 *                 KILN_OP_DROPOUT's on [B, H, T, T] (taken from the DROPOUT
 *                 op itself and fed to the loop), forward and backward agree
 *                 on it, and another step draws another mask
 *   attn_lowp     bf16 and f16 activations: the f32 op on the widened
 *                 inputs, rounded once
 *   attn_lowp_shapes  bf16 and f16 at the shapes cuDNN's fused attention
 *                 takes (odd T, head dims 64 and 128) against the loop, at
 *                 low-precision tolerances (its comment)
 *   attn_refused  malformed ops (heads not dividing C, a wrong lse, the
 *                 step's dtype, ...) are EINVAL with the op's name
 *   attn_threads  1 and 3 threads give the same bytes
 *   attn_decode_run  ATTENTION_DECODE_RUN (a prompt's prefill, ABI 2.31)
 *                 of T queries at positions t0.., on caches holding
 *                 positions 0..t0-1: y against the causal loop over the
 *                 whole sequence and against T steps of ATTENTION_DECODE,
 *                 the caches' rows t0..t0+T-1 the run's k and v to the
 *                 bit and the rows past them untouched; T across the
 *                 CPU's blocks of 32 queries and 8-row tiles, head dims 8
 *                 (packed) and 16 (read in place)
 *   attn_decode_slots  the CPU's run workspace: a slot for each of at
 *                 most B * H threads
 *
 * Tolerance: max |got - want| <= 1e-5 * max(1, max |want|) per tensor.
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "check_main.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_TOL 1e-5

struct attn_case {
	int B, T, C, H, causal;
	double scale, p; /* scale 0: 1/sqrt(D) */
	int64_t seed, layer, step;
	int64_t row0, rstride; /* the dropout counter's rows (rstride 0: 1) */
};

/* The dropout counter { step, row0, rstride } (kiln/ops.h) on the device
 * (copied before ctr leaves scope: dput's copy is asynchronous). */
static void *attn_ctr(struct fx *f, const struct attn_case *c)
{
	const int64_t ctr[KILN_DROP_CTR] = { c->step, c->row0, c->rstride ? c->rstride : 1 };
	void *d = dput(f, ctr, sizeof ctr);
	OK(kiln_device_stream_sync(f->dev, f->s));
	return d;
}

static double attn_scale(const struct attn_case *c)
{
	return c->scale > 0 ? c->scale : 1.0 / sqrt((double)(c->C / c->H));
}

/* ---- the reference loop ------------------------------------------------- */

/* y [B,T,C], lse [B,H,T], dqkv [B,T,3C] (double) from qkv and dy, with the
 * dropout scale mask[B,H,T,T] (NULL: none), straight from the definition. */
static void attn_loop(const struct attn_case *c, const float *qkv, const float *dy,
		      const float *mask, double *y, double *lse, double *dqkv)
{
	const int B = c->B, T = c->T, C = c->C, H = c->H, D = C / H, ld = 3 * C;
	const double scale = attn_scale(c);
	double *P = malloc(sizeof(double) * (size_t)T), *dP = malloc(sizeof(double) * (size_t)T);
	memset(dqkv, 0, sizeof(double) * (size_t)B * T * ld);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++) {
				const float *q = qkv + ((size_t)b * T + i) * ld + h * D;
				const int valid = c->causal ? i + 1 : T;
				const float *mrow = mask ? mask + (((size_t)b * H + h) * T + i) * T : NULL;
				double mx = -INFINITY, z = 0;
				for (int j = 0; j < valid; j++) {
					const float *k = qkv + ((size_t)b * T + j) * ld + C + h * D;
					double s = 0;
					for (int d = 0; d < D; d++)
						s += (double)q[d] * k[d];
					P[j] = s * scale;
					mx = P[j] > mx ? P[j] : mx;
				}
				for (int j = 0; j < valid; j++)
					z += exp(P[j] - mx);
				lse[((size_t)b * H + h) * T + i] = mx + log(z);
				for (int j = 0; j < valid; j++)
					P[j] = exp(P[j] - mx) / z;
				/* y = P' v;  dP = (dy v^T) * M;  Di = sum P * dP */
				const float *dyi = dy + ((size_t)b * T + i) * C + h * D;
				double *yi = y + ((size_t)b * T + i) * C + h * D, di = 0;
				for (int d = 0; d < D; d++)
					yi[d] = 0;
				for (int j = 0; j < valid; j++) {
					const float *v = qkv + ((size_t)b * T + j) * ld + 2 * C + h * D;
					const double m = mrow ? mrow[j] : 1.0;
					double g = 0;
					for (int d = 0; d < D; d++) {
						yi[d] += P[j] * m * v[d];
						g += (double)dyi[d] * v[d];
					}
					dP[j] = g * m;
					di += P[j] * dP[j];
					/* dv_j += P'_ij dy_i */
					double *dv = dqkv + ((size_t)b * T + j) * ld + 2 * C + h * D;
					for (int d = 0; d < D; d++)
						dv[d] += P[j] * m * dyi[d];
				}
				/* dS = P (dP - Di): dq_i += scale dS k_j, dk_j += scale dS q_i */
				double *dq = dqkv + ((size_t)b * T + i) * ld + h * D;
				for (int j = 0; j < valid; j++) {
					const double ds = P[j] * (dP[j] - di) * scale;
					const float *k = qkv + ((size_t)b * T + j) * ld + C + h * D;
					double *dk = dqkv + ((size_t)b * T + j) * ld + C + h * D;
					for (int d = 0; d < D; d++) {
						dq[d] += ds * k[d];
						dk[d] += ds * q[d];
					}
				}
			}
	free(P);
	free(dP);
}

/* ---- the device ops ----------------------------------------------------- */

/* ATTENTION (bwd 0) or ATTENTION_BWD of case c, activations in dtype dt. */
static void attn_op(struct kiln_op *op, const struct attn_case *c, int dt, int bwd, int acc)
{
	const int64_t dq[3] = { c->B, c->T, 3 * c->C }, dy[3] = { c->B, c->T, c->C };
	const int64_t dl[3] = { c->B, c->H, c->T }, nctr = KILN_DROP_CTR;
	const int drop = c->p > 0;
	memset(op, 0, sizeof *op);
	struct kiln_tensor_desc qkv, y, lse, step;
	kiln_tensor_desc_init(&qkv, dt, 3, dq);
	kiln_tensor_desc_init(&y, dt, 3, dy);
	kiln_tensor_desc_init(&lse, KILN_F32, 3, dl);
	kiln_tensor_desc_init(&step, KILN_I64, 1, &nctr);
	if (bwd) {
		op->type = KILN_OP_ATTENTION_BWD, op->n_in = 4 + drop, op->n_out = 1;
		op->in[0] = op->in[2] = y, op->in[1] = qkv, op->in[3] = lse, op->out[0] = qkv;
		op->flags = acc ? KILN_OPF_ACCUMULATE : 0;
	} else {
		op->type = KILN_OP_ATTENTION, op->n_in = 1 + drop, op->n_out = 2;
		op->in[0] = qkv, op->out[0] = y, op->out[1] = lse;
	}
	if (drop)
		op->in[op->n_in - 1] = step;
	op->i[0] = c->H, op->i[1] = c->causal, op->i[2] = c->seed, op->i[3] = c->layer;
	op->f[0] = attn_scale(c), op->f[1] = c->p;
}

static size_t attn_nq(const struct attn_case *c) { return (size_t)c->B * c->T * 3 * c->C; }
static size_t attn_ny(const struct attn_case *c) { return (size_t)c->B * c->T * c->C; }
static size_t attn_nl(const struct attn_case *c) { return (size_t)c->B * c->H * c->T; }

/* The device's forward of host qkv (elements of es bytes, dtype dt) into
 * host y and lse. */
static void attn_fwd_dev(struct fx *f, const struct attn_case *c, int dt, size_t es,
			 const void *qkv, void *y, float *lse)
{
	void *dQ = dput(f, qkv, attn_nq(c) * es), *dY = dput(f, NULL, attn_ny(c) * es);
	void *dL = dput(f, NULL, attn_nl(c) * 4), *dS = attn_ctr(f, c);
	struct kiln_op op;
	attn_op(&op, c, dt, 0, 0);
	OK(run_op(f, &op, (const void *const[]){ dQ, dS }, (void *const[]){ dY, dL }));
	dget(f, y, dY, attn_ny(c) * es);
	dget(f, lse, dL, attn_nl(c) * 4);
	DFREE(f, dQ, dY, dL, dS);
}

/* The device's backward into host dqkv (added to its contents when acc). */
static void attn_bwd_dev(struct fx *f, const struct attn_case *c, int dt, size_t es,
			 const void *dy, const void *qkv, const void *y, const float *lse,
			 void *dqkv, int acc)
{
	void *dDY = dput(f, dy, attn_ny(c) * es), *dQ = dput(f, qkv, attn_nq(c) * es);
	void *dY = dput(f, y, attn_ny(c) * es), *dL = dput(f, lse, attn_nl(c) * 4);
	void *dG = dput(f, acc ? dqkv : NULL, attn_nq(c) * es), *dS = attn_ctr(f, c);
	struct kiln_op op;
	attn_op(&op, c, dt, 1, acc);
	OK(run_op(f, &op, (const void *const[]){ dDY, dQ, dY, dL, dS }, (void *const[]){ dG }));
	dget(f, dqkv, dG, attn_nq(c) * es);
	DFREE(f, dDY, dQ, dY, dL, dG, dS);
}

/* The device's f32 y, lse and dqkv (dqkv0 + the gradient when given). */
struct attn_out {
	float *y, *lse, *dqkv;
};

static struct attn_out attn_dev(struct fx *f, const struct attn_case *c, const float *qkv,
				const float *dy, const float *dqkv0)
{
	struct attn_out o = { malloc(attn_ny(c) * 4), malloc(attn_nl(c) * 4),
			      malloc(attn_nq(c) * 4) };
	attn_fwd_dev(f, c, KILN_F32, 4, qkv, o.y, o.lse);
	if (dqkv0)
		memcpy(o.dqkv, dqkv0, attn_nq(c) * 4);
	attn_bwd_dev(f, c, KILN_F32, 4, dy, qkv, o.y, o.lse, o.dqkv, dqkv0 != NULL);
	return o;
}

static void attn_out_free(struct attn_out *o)
{
	free(o->y), free(o->lse), free(o->dqkv);
}

/* max |got - want| <= ATTN_TOL * max(1, max |want|); want in double, or
 * in f32 (wantf) when want is NULL.  base: added to want (accumulation). */
static void attn_close(const char *tag, const char *what, const float *got, const double *want,
		       const float *wantf, const float *base, size_t n)
{
	double mag = 1, err = 0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		const double w = (want ? want[i] : wantf[i]) + (base ? base[i] : 0);
		mag = fabs(w) > mag ? fabs(w) : mag;
		const double e = fabs(got[i] - w);
		if (!(e <= err))
			err = isnan(e) ? INFINITY : e, at = i;
	}
	ck_assert_msg(err <= ATTN_TOL * mag, "%s: %s: max |error| %g at %zu (got %.8g); allowed %g",
		      tag, what, err, at, got[at], ATTN_TOL * mag);
}

/* Device against the loop for case c (mask: see attn_loop), written and
 * accumulated. */
static void attn_check(struct fx *f, const char *tag, const struct attn_case *c,
		       const float *mask)
{
	const size_t nq = attn_nq(c), ny = attn_ny(c), nl = attn_nl(c);
	float *qkv = frandv(nq), *dy = frandv(ny), *g0 = frandv(nq);
	for (size_t i = 0; i < nq; i++)
		qkv[i] *= 2.0f; /* scores of a few units: a peaked softmax */
	double *y = malloc(ny * 8), *lse = malloc(nl * 8), *dqkv = malloc(nq * 8);
	attn_loop(c, qkv, dy, mask, y, lse, dqkv);
	for (int acc = 0; acc < 2; acc++) {
		struct attn_out o = attn_dev(f, c, qkv, dy, acc ? g0 : NULL);
		attn_close(tag, "y", o.y, y, NULL, NULL, ny);
		attn_close(tag, "lse", o.lse, lse, NULL, NULL, nl);
		attn_close(tag, acc ? "dqkv (accumulated)" : "dqkv", o.dqkv, dqkv, NULL,
			   acc ? g0 : NULL, nq);
		attn_out_free(&o);
	}
	free(qkv), free(dy), free(g0), free(y), free(lse), free(dqkv);
}

START_TEST(test_attn_loops)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	static const struct attn_case cases[] = {
		{ .B = 1, .T = 1, .C = 4, .H = 1, .causal = 1 },
		{ .B = 2, .T = 7, .C = 16, .H = 2, .causal = 1 },
		{ .B = 3, .T = 33, .C = 24, .H = 3, .causal = 1 },
		{ .B = 2, .T = 70, .C = 32, .H = 4, .causal = 1, .scale = 0.2 },
		{ .B = 2, .T = 45, .C = 64, .H = 1, .causal = 0 },
		{ .B = 1, .T = 100, .C = 128, .H = 2, .causal = 1 },
		/* the CPU kernel's register tiles (8 rows by 16 or 32 columns):
		 * head dims of 2 vectors and of 1.5 read in place, 3 packed,
		 * T past 2 row blocks with rows that end inside a vector */
		{ .B = 2, .T = 130, .C = 96, .H = 3, .causal = 1 },
		{ .B = 1, .T = 67, .C = 48, .H = 1, .causal = 1 },
		{ .B = 1, .T = 67, .C = 48, .H = 1, .causal = 0 },
		{ .B = 1, .T = 19, .C = 6, .H = 2, .causal = 1 },
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		char tag[96];
		const struct attn_case *c = &cases[k];
		snprintf(tag, sizeof tag, "B=%d T=%d C=%d H=%d causal=%d", c->B, c->T, c->C, c->H,
			 c->causal);
		attn_check(&f, tag, c, NULL);
	}
	fx_close(&f);
}
END_TEST

/* Scores far apart (session 30: the CPU's vectorised e^x took x below
 * about -8.7e6 to garbage and below -1e30 to NaN, so a scale of 1e6 and
 * over gave NaN where the softmax is one-hot): the forward's y and lse
 * against the loop.  (The backward is left out: there dS = P (dP - Di)
 * scale multiplies the f32 rounding of dP - Di by the scale.) */
START_TEST(test_attn_far_scores)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	static const double scales[] = { 3e5, 1e7, 1e12, 1e35 };
	for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++)
		for (int causal = 0; causal < 2; causal++) {
			const struct attn_case c = { .B = 1, .T = 37, .C = 32, .H = 2, .causal = causal,
						     .scale = scales[k] };
			const size_t nq = attn_nq(&c), ny = attn_ny(&c), nl = attn_nl(&c);
			float *qkv = frandv(nq), *dy = frandv(ny), *y = malloc(ny * 4), *lse = malloc(nl * 4);
			double *yr = malloc(ny * 8), *lr = malloc(nl * 8), *dr = malloc(nq * 8);
			char tag[96];
			attn_loop(&c, qkv, dy, NULL, yr, lr, dr);
			attn_fwd_dev(&f, &c, KILN_F32, 4, qkv, y, lse);
			snprintf(tag, sizeof tag, "scale %g causal %d", scales[k], causal);
			attn_close(tag, "y", y, yr, NULL, NULL, ny);
			attn_close(tag, "lse", lse, lr, NULL, NULL, nl);
			free(qkv), free(dy), free(y), free(lse), free(yr), free(lr), free(dr);
		}
	fx_close(&f);
}
END_TEST

/* ---- against PyTorch ---------------------------------------------------- */

static const float *st_f32(struct kiln_safetensors *st, const char *cs, const char *key, size_t n)
{
	char name[128];
	struct kiln_safetensors_tensor t;
	snprintf(name, sizeof name, "%s/%s", cs, key);
	OK(kiln_safetensors_find(st, name, &t));
	ck_assert_msg(t.dtype == KILN_F32 && (size_t)t.numel == n, "%s: %lld elements, want %zu",
		      name, (long long)t.numel, n);
	return t.data;
}

START_TEST(test_attn_torch)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	struct kiln_safetensors *st;
	char path[1024];
	/* KILN_TEST_SRCDIR: the suite run from a carried bundle (tests/gpu/run.sh) */
	const char *src = getenv("KILN_TEST_SRCDIR");
	snprintf(path, sizeof path, "%s/tests/data/attention_refs.safetensors",
		 src && *src ? src : SRCDIR);
	OK(kiln_safetensors_open(path, &st));
	const char *list = kiln_safetensors_meta(st, "cases");
	ck_assert_ptr_nonnull(list);
	char *cases = strdup(list), *save = NULL;
	int n_cases = 0;
	for (char *cs = strtok_r(cases, ",", &save); cs; cs = strtok_r(NULL, ",", &save)) {
		char key[96];
		struct attn_case c = { 0 };
		snprintf(key, sizeof key, "%s.shape", cs);
		const char *shape = kiln_safetensors_meta(st, key);
		ck_assert_msg(shape && sscanf(shape, "%d,%d,%d,%d,%d,%lf", &c.B, &c.T, &c.C, &c.H,
					      &c.causal, &c.scale) == 6,
			      "%s: bad shape metadata", cs);
		const size_t nq = attn_nq(&c), ny = attn_ny(&c), nl = attn_nl(&c);
		/* the mapping is not aligned: copy */
		float *qkv = malloc(nq * 4), *dy = malloc(ny * 4), *g0 = frandv(nq);
		memcpy(qkv, st_f32(st, cs, "qkv", nq), nq * 4);
		memcpy(dy, st_f32(st, cs, "dy", ny), ny * 4);
		float *y = malloc(ny * 4), *lse = malloc(nl * 4), *dqkv = malloc(nq * 4);
		memcpy(y, st_f32(st, cs, "y", ny), ny * 4);
		memcpy(lse, st_f32(st, cs, "lse", nl), nl * 4);
		memcpy(dqkv, st_f32(st, cs, "dqkv", nq), nq * 4);
		for (int acc = 0; acc < 2; acc++) {
			struct attn_out o = attn_dev(&f, &c, qkv, dy, acc ? g0 : NULL);
			attn_close(cs, "y vs PyTorch", o.y, NULL, y, NULL, ny);
			attn_close(cs, "lse vs PyTorch", o.lse, NULL, lse, NULL, nl);
			attn_close(cs, "dqkv vs PyTorch", o.dqkv, NULL, dqkv, acc ? g0 : NULL, nq);
			attn_out_free(&o);
		}
		free(qkv), free(dy), free(g0), free(y), free(lse), free(dqkv);
		n_cases++;
	}
	ck_assert_int_ge(n_cases, 6);
	free(cases);
	kiln_safetensors_close(st);
	fx_close(&f);
}
END_TEST

/* ---- dropout ------------------------------------------------------------ */

/* The DROPOUT op's scale (0 or 1/(1-p)) for every element of [B,H,T,T]
 * (4-d: rows of H*T*T, b's global row from the counter's row0 and
 * rstride): the mask the attention's dropout must be. */
static float *dropout_mask(struct fx *f, const struct attn_case *c)
{
	const int64_t n = (int64_t)c->B * c->H * c->T * c->T;
	float *ones = malloc((size_t)n * 4), *m = malloc((size_t)n * 4);
	for (int64_t i = 0; i < n; i++)
		ones[i] = 1.0f;
	void *dX = dput(f, ones, (size_t)n * 4), *dS = attn_ctr(f, c);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
	op.in[0] = op.out[0] = td4(c->B, c->H, c->T, c->T, 0);
	op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
	op.i[0] = c->seed, op.i[1] = c->layer, op.f[0] = c->p;
	OK(run_op(f, &op, (const void *const[]){ dX, dS }, (void *const[]){ dX }));
	dget(f, m, dX, (size_t)n * 4);
	DFREE(f, dX, dS);
	free(ones);
	return m;
}

START_TEST(test_attn_dropout)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	SKIP_UNSUPPORTED(&f, KILN_OP_DROPOUT);
	struct attn_case c = { .B = 2, .T = 37, .C = 24, .H = 3, .causal = 1, .p = 0.25,
			       .seed = 0x5eed1234abcLL, .layer = 9, .step = 41 };
	float *mask = dropout_mask(&f, &c);
	const size_t nm = (size_t)c.B * c.H * c.T * c.T;
	size_t dropped = 0;
	for (size_t i = 0; i < nm; i++)
		dropped += mask[i] == 0.0f;
	ck_assert_msg(dropped > nm / 8 && dropped < nm * 3 / 8, "dropped %zu of %zu", dropped, nm);
	/* forward and backward both against the loop fed DROPOUT's mask */
	attn_check(&f, "dropout", &c, mask);
	c.causal = 0;
	attn_check(&f, "dropout, full", &c, mask);
	/* another step: another mask, so the step input is read */
	c.causal = 1;
	c.step++;
	float *mask2 = dropout_mask(&f, &c);
	ck_assert(memcmp(mask, mask2, nm * 4) != 0);
	attn_check(&f, "dropout, next step", &c, mask2);
	/* rows of the global batch: rank 1 of 2's (rows 1, 3 of 4), drawn
	 * with b's global row (the DROPOUT mask by rows: check_device_
	 * elementwise's dropout_rows) */
	c.row0 = 1, c.rstride = 2;
	float *mask3 = dropout_mask(&f, &c);
	ck_assert(memcmp(mask2, mask3, nm * 4) != 0);
	attn_check(&f, "dropout, rank 1 of 2", &c, mask3);
	/* a step past 2^32: its own mask, attention's the DROPOUT op's
	 * (the step's high word in the counter since session 38; the CPU's
	 * attn.c and CUDA's attn_ctr carry it whole: a 32-bit step there
	 * would draw step 42's mask, which this tells apart) */
	c.row0 = 0, c.rstride = 0;
	c.step = ((int64_t)1 << 32) + 42;
	float *mask4 = dropout_mask(&f, &c);
	ck_assert(memcmp(mask2, mask4, nm * 4) != 0);
	attn_check(&f, "dropout, step 2^32 + 42", &c, mask4);
	free(mask), free(mask2), free(mask3), free(mask4);
	fx_close(&f);
}
END_TEST

/* ---- bf16 and f16 -------------------------------------------------------
 * Low-precision activations (docs/plugins.md): the f32 op on the widened
 * inputs, each output rounded once; lse stays f32. */

static uint16_t *lowp_of(const float *x, size_t n, int dt, float *wide)
{
	uint16_t *h = malloc(n * 2);
	for (size_t i = 0; i < n; i++)
		h[i] = h_round(x[i], dt), wide[i] = h_wide(h[i], dt);
	return h;
}

START_TEST(test_attn_lowp)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	const struct attn_case c = { .B = 2, .T = 37, .C = 16, .H = 2, .causal = 1, .p = 0.2,
				     .seed = 77, .layer = 1, .step = 3 };
	const size_t nq = attn_nq(&c), ny = attn_ny(&c), nl = attn_nl(&c);
	for (int dt = KILN_BF16; dt <= KILN_F16; dt++) {
		const char *name = dt == KILN_BF16 ? "bf16" : "f16";
		struct kiln_op op;
		void *plan = NULL;
		attn_op(&op, &c, dt, 0, 0);
		kiln_status st = kiln_device_prepare(f.dev, &op, &plan, NULL);
		if (plan)
			kiln_device_plan_free(f.dev, plan);
		if (st == KILN_ENOTSUP && strcmp(g_name, "cpu")) { /* a device without lowp attention */
			printf("device '%s': skipping %s attention: %s\n", g_name, name, kiln_last_error());
			continue;
		}
		float *qkv = frandv(nq), *dy = frandv(ny), *qw = malloc(nq * 4), *dyw = malloc(ny * 4);
		uint16_t *q16 = lowp_of(qkv, nq, dt, qw), *dy16 = lowp_of(dy, ny, dt, dyw);
		/* forward: y16 = round(f32 forward of the widened qkv) */
		float *y = malloc(ny * 4), *lse = malloc(nl * 4), *lse16 = malloc(nl * 4);
		uint16_t *y16 = malloc(ny * 2), *g16 = malloc(nq * 2);
		attn_fwd_dev(&f, &c, KILN_F32, 4, qw, y, lse);
		attn_fwd_dev(&f, &c, dt, 2, q16, y16, lse16);
		for (size_t i = 0; i < ny; i++)
			ck_assert_msg(y16[i] == h_round(y[i], dt), "%s y[%zu] = %g, want %g", name, i,
				      h_wide(y16[i], dt), h_wide(h_round(y[i], dt), dt));
		ck_assert(!memcmp(lse, lse16, nl * 4));
		/* backward from the low-precision y */
		float *yw = malloc(ny * 4), *g = malloc(nq * 4);
		for (size_t i = 0; i < ny; i++)
			yw[i] = h_wide(y16[i], dt);
		attn_bwd_dev(&f, &c, KILN_F32, 4, dyw, qw, yw, lse, g, 0);
		attn_bwd_dev(&f, &c, dt, 2, dy16, q16, y16, lse, g16, 0);
		for (size_t i = 0; i < nq; i++)
			ck_assert_msg(g16[i] == h_round(g[i], dt), "%s dqkv[%zu] = %g, want %g", name, i,
				      h_wide(g16[i], dt), g[i]);
		free(qkv), free(dy), free(qw), free(dyw), free(q16), free(dy16), free(y), free(lse);
		free(lse16), free(y16), free(g16), free(yw), free(g);
	}
	fx_close(&f);
}
END_TEST

/* ---- bf16 / f16 at the shapes cuDNN's fused attention takes ----------------
 * Against the double loop on the rounded inputs, with tolerances of the
 * low-precision path whichever runs it: on the cuda device cuDNN's fused
 * attention (P rounded to bf16/f16 before P V, dS before dS^T Q, ...) or
 * kiln's kernels (f32 on the widened inputs, rounded once), as
 * KILN_CUDA_ATTN picks (tests/gpu/run.sh runs this case both ways); on the
 * cpu the f32 op rounded once.  Odd T, head dims 64 and 128, causal and
 * full, no dropout, written (not accumulated):
 *   y     max |err| <= 2e-2 * max(1, max |y|)
 *   lse   max |err| <= 1e-3 * max(1, max |lse|)   (f32 stats)
 *   dqkv  max |err| <= 4e-2 * max(1, max |dqkv|)
 * A layout or mask error is off by O(1) of the values. */

static const struct attn_case attn_cudnn_cases[] = {
	{ .B = 2, .T = 37, .C = 128, .H = 2, .causal = 1 },  /* D 64 */
	{ .B = 2, .T = 37, .C = 256, .H = 2, .causal = 0 },  /* D 128 */
	{ .B = 1, .T = 129, .C = 512, .H = 8, .causal = 1 }, /* D 64, past a 128 tile */
	{ .B = 3, .T = 5, .C = 128, .H = 1, .causal = 1 },   /* D 128, short */
};

/* max |got - want| <= tol * max(1, max |want|) */
static void tol_close(const char *tag, const char *what, const float *got, const double *want,
		      size_t n, double tol)
{
	double mag = 1, err = 0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		mag = fabs(want[i]) > mag ? fabs(want[i]) : mag;
		const double e = fabs(got[i] - want[i]);
		if (!(e <= err))
			err = isnan(e) ? INFINITY : e, at = i;
	}
	ck_assert_msg(err <= tol * mag, "%s: %s: max |error| %g at %zu (got %.6g, want %.6g); allowed %g",
		      tag, what, err, at, got[at], want[at], tol * mag);
}

/* the same of bf16 / f16 (dt) got */
static void lowp_close(const char *tag, const char *what, const uint16_t *got, int dt,
		       const double *want, size_t n, double tol)
{
	float *w = malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		w[i] = h_wide(got[i], dt);
	tol_close(tag, what, w, want, n, tol);
	free(w);
}

START_TEST(test_attn_lowp_shapes)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	for (size_t k = 0; k < sizeof attn_cudnn_cases / sizeof attn_cudnn_cases[0]; k++)
		for (int dt = KILN_BF16; dt <= KILN_F16; dt++) {
			const struct attn_case *c = &attn_cudnn_cases[k];
			char tag[96];
			snprintf(tag, sizeof tag, "%s B %d T %d C %d H %d causal %d",
				 dt == KILN_BF16 ? "bf16" : "f16", c->B, c->T, c->C, c->H, c->causal);
			const size_t nq = attn_nq(c), ny = attn_ny(c), nl = attn_nl(c);
			float *qkv = frandv(nq), *dy = frandv(ny), *qw = malloc(nq * 4), *dyw = malloc(ny * 4);
			for (size_t i = 0; i < nq; i++)
				qkv[i] *= 2.0f;
			uint16_t *q16 = lowp_of(qkv, nq, dt, qw), *dy16 = lowp_of(dy, ny, dt, dyw);
			double *y = malloc(ny * 8), *lse = malloc(nl * 8), *g = malloc(nq * 8);
			attn_loop(c, qw, dyw, NULL, y, lse, g);
			uint16_t *y16 = malloc(ny * 2), *g16 = malloc(nq * 2);
			float *l = malloc(nl * 4);
			attn_fwd_dev(&f, c, dt, 2, q16, y16, l);
			lowp_close(tag, "y", y16, dt, y, ny, 2e-2);
			tol_close(tag, "lse", l, lse, nl, 1e-3);
			attn_bwd_dev(&f, c, dt, 2, dy16, q16, y16, l, g16, 0);
			lowp_close(tag, "dqkv", g16, dt, g, nq, 4e-2);
			free(qkv), free(dy), free(qw), free(dyw), free(q16), free(dy16), free(y);
			free(lse), free(g), free(y16), free(g16), free(l);
		}
	fx_close(&f);
}
END_TEST

/* ---- malformed ops: the core's check refuses them on every device ------- */

START_TEST(test_attn_refused)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION);
	const struct attn_case c = { .B = 2, .T = 5, .C = 12, .H = 3, .causal = 1, .p = 0.1 };
	static const char *const why[] = { "heads", "lse", "step", "causal", "scale", "dy" };
	for (int k = 0; k < 6; k++) {
		struct kiln_op op;
		void *plan = NULL;
		attn_op(&op, &c, KILN_F32, k >= 5, 0);
		switch (k) {
		case 0: op.i[0] = 5; break;                   /* 12 % 5 */
		case 1: op.out[1].dims[2] = 4; break;         /* lse [B,H,T-1] */
		case 2: op.in[1].dtype = KILN_F32; break;     /* the step */
		case 3: op.i[1] = 2; break;
		case 4: op.f[0] = 0; break;
		case 5: op.in[0].dims[2] = 11; break;         /* dy [B,T,C-1] */
		}
		kiln_status st = kiln_device_prepare(f.dev, &op, &plan, NULL);
		ck_assert_msg(st == KILN_EINVAL && !plan, "case %d (%s): status %d", k, why[k], st);
		ck_assert_msg(strstr(kiln_last_error(), k == 5 ? "ATTENTION_BWD" : "ATTENTION") != NULL,
			      "case %d: %s", k, kiln_last_error());
	}
	fx_close(&f);
}
END_TEST

/* ---- thread counts ------------------------------------------------------ */

/* The device under test with [run] threads = n (fx_close closes it). */
static void fx_threads(struct fx *f, int n)
{
	char kv[32];
	snprintf(kv, sizeof kv, "run.threads=%d", n);
	memset(f, 0, sizeof *f);
	OK(kiln_registry_open(NULL, &f->reg));
	OK(kiln_config_new(&f->cfg));
	OK(kiln_config_override(f->cfg, kv));
	OK(kiln_config_validate(f->cfg, f->reg));
	OK(kiln_device_open(f->reg, f->cfg, g_name, 0, &f->dev));
	OK(kiln_device_stream_create(f->dev, &f->s));
}

START_TEST(test_attn_threads)
{
	const struct attn_case c = { .B = 2, .T = 50, .C = 32, .H = 4, .causal = 1, .p = 0.1,
				     .seed = 3, .layer = 2, .step = 7 };
	const size_t nq = attn_nq(&c), ny = attn_ny(&c);
	float *qkv = frandv(nq), *dy = frandv(ny);
	struct attn_out o[2];
	for (int t = 0; t < 2; t++) {
		struct fx f;
		fx_threads(&f, t ? 3 : 1);
		if (unsupported(&f, KILN_OP_ATTENTION)) {
			fx_close(&f);
			free(qkv), free(dy);
			if (t)
				attn_out_free(&o[0]);
			return;
		}
		o[t] = attn_dev(&f, &c, qkv, dy, NULL);
		fx_close(&f);
	}
	ck_assert(!memcmp(o[0].y, o[1].y, ny * 4));
	ck_assert(!memcmp(o[0].dqkv, o[1].dqkv, nq * 4));
	attn_out_free(&o[0]), attn_out_free(&o[1]);
	free(qkv), free(dy);
}
END_TEST

/* ---- decoding: a run of T positions against the loop and the steps ------ */

/* ATTENTION_DECODE (T = 1) or ATTENTION_DECODE_RUN: qkv [B,T,3C], the
 * caches f32 [B,H,Tmax,D]. */
static void attn_decode_op(struct kiln_op *op, int B, int T, int C, int H, int Tmax, double scale)
{
	const int64_t dq[3] = { B, T, 3 * C }, dy[3] = { B, T, C }, dc[4] = { B, H, Tmax, C / H };
	const int64_t one = 1;
	memset(op, 0, sizeof *op);
	op->type = T > 1 ? KILN_OP_ATTENTION_DECODE_RUN : KILN_OP_ATTENTION_DECODE;
	op->n_in = 2, op->n_out = 3;
	kiln_tensor_desc_init(&op->in[0], KILN_F32, 3, dq);
	kiln_tensor_desc_init(&op->in[1], KILN_I32, 1, &one);
	kiln_tensor_desc_init(&op->out[0], KILN_F32, 3, dy);
	kiln_tensor_desc_init(&op->out[1], KILN_F32, 4, dc);
	op->out[2] = op->out[1];
	op->i[0] = H;
	op->f[0] = scale;
}

/* qkv [B, n, 3C] rows t0..t0+n-1 of seq [B, Tmax, 3C] */
static float *attn_rows_of(const float *seq, int B, int Tmax, int C, int t0, int n)
{
	float *o = malloc(sizeof(float) * (size_t)B * n * 3 * C);
	for (int b = 0; b < B; b++)
		memcpy(o + (size_t)b * n * 3 * C, seq + ((size_t)b * Tmax + t0) * 3 * C,
		       sizeof(float) * (size_t)n * 3 * C);
	return o;
}

/* kc, vc [B,H,TM,D]: the k and v of seq's positions < n (seq [B,TM,3C]),
 * a sentinel past them (rows no run wrote). */
static void attn_caches_of(float *kc, float *vc, const float *seq, int B, int H, int TM, int D,
			   int n)
{
	const int C = H * D;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int j = 0; j < TM; j++)
				for (int d = 0; d < D; d++) {
					const size_t at = (((size_t)b * H + h) * TM + j) * D + d;
					const float *row = seq + ((size_t)b * TM + j) * 3 * C + h * D + d;
					kc[at] = j < n ? row[C] : 1e30f;
					vc[at] = j < n ? row[2 * C] : -1e30f;
				}
}

START_TEST(test_attn_decode_run)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ATTENTION_DECODE_RUN);
	enum { B = 2, H = 2, TM = 80 };
	static const int dims[2] = { 8, 16 }, t0s[3] = { 0, 5, 37 }, Ts[4] = { 2, 7, 33, 40 };
	for (int di = 0; di < 2; di++) {
		const int D = dims[di], C = H * D;
		const struct attn_case whole = { .B = B, .T = TM, .C = C, .H = H, .causal = 1 };
		const double scale = attn_scale(&whole);
		const size_t nseq = attn_nq(&whole), ncache = (size_t)B * H * TM * D;
		float *seq = frandv(nseq), *dy0 = calloc(attn_ny(&whole), 4);
		for (size_t i = 0; i < nseq; i++)
			seq[i] *= 2.0f;
		double *want = malloc(attn_ny(&whole) * 8), *lse = malloc(attn_nl(&whole) * 8);
		double *g = malloc(nseq * 8);
		attn_loop(&whole, seq, dy0, NULL, want, lse, g); /* y of every position */
		/* what the runs before t0 leave: k and v of positions < t0; a
		 * sentinel past them */
		float *kc = malloc(ncache * 4), *vc = malloc(ncache * 4);
		for (int t0i = 0; t0i < 3; t0i++)
			for (int ti = 0; ti < 4; ti++) {
				const int t0 = t0s[t0i], T = Ts[ti];
				char tag[96];
				snprintf(tag, sizeof tag, "D %d, positions %d..%d", D, t0, t0 + T - 1);
				attn_caches_of(kc, vc, seq, B, H, TM, D, t0);
				/* the run */
				float *q = attn_rows_of(seq, B, TM, C, t0, T), *y = malloc(sizeof(float) * B * T * C);
				float *kr = malloc(ncache * 4), *vr = malloc(ncache * 4);
				const int32_t pos = t0;
				struct kiln_op op;
				attn_decode_op(&op, B, T, C, H, TM, scale);
				void *dq = dput(&f, q, sizeof(float) * (size_t)B * T * 3 * C), *dp = dput(&f, &pos, 4);
				void *dy = dput(&f, NULL, sizeof(float) * (size_t)B * T * C);
				void *dk = dput(&f, kc, ncache * 4), *dv = dput(&f, vc, ncache * 4);
				OK(run_op(&f, &op, (const void *const[]){ dq, dp }, (void *const[]){ dy, dk, dv }));
				dget(&f, y, dy, sizeof(float) * (size_t)B * T * C);
				dget(&f, kr, dk, ncache * 4);
				dget(&f, vr, dv, ncache * 4);
				DFREE(&f, dq, dp, dy, dk, dv);
				/* against the loop */
				double *w = malloc(sizeof(double) * (size_t)B * T * C);
				for (int b = 0; b < B; b++)
					memcpy(w + (size_t)b * T * C, want + ((size_t)b * TM + t0) * C,
					       sizeof(double) * (size_t)T * C);
				tol_close(tag, "y", y, w, (size_t)B * T * C, ATTN_TOL);
				/* the caches: the run's rows its k and v, the rest as they were */
				float *ke = malloc(ncache * 4), *ve = malloc(ncache * 4);
				attn_caches_of(ke, ve, seq, B, H, TM, D, t0 + T);
				ck_assert_msg(!memcmp(kr, ke, ncache * 4) && !memcmp(vr, ve, ncache * 4),
					      "%s: the caches are not the k and v of positions 0..%d, the rest untouched",
					      tag, t0 + T - 1);
				free(ke), free(ve);
				/* against T steps on the same caches */
				void *sk = dput(&f, kc, ncache * 4), *sv = dput(&f, vc, ncache * 4);
				float *ys = malloc(sizeof(float) * (size_t)B * T * C);
				double *yr = malloc(sizeof(double) * (size_t)B * T * C);
				for (int i = 0; i < T; i++) {
					float *q1 = attn_rows_of(seq, B, TM, C, t0 + i, 1), y1[B * 16 * H];
					const int32_t p1 = t0 + i;
					attn_decode_op(&op, B, 1, C, H, TM, scale);
					void *d1 = dput(&f, q1, sizeof(float) * (size_t)B * 3 * C), *dp1 = dput(&f, &p1, 4);
					void *dy1 = dput(&f, NULL, sizeof(float) * (size_t)B * C);
					OK(run_op(&f, &op, (const void *const[]){ d1, dp1 }, (void *const[]){ dy1, sk, sv }));
					dget(&f, y1, dy1, sizeof(float) * (size_t)B * C);
					DFREE(&f, d1, dp1, dy1);
					for (int b = 0; b < B; b++)
						memcpy(ys + ((size_t)b * T + i) * C, y1 + b * C, sizeof(float) * (size_t)C);
					free(q1);
				}
				DFREE(&f, sk, sv);
				for (size_t i = 0; i < (size_t)B * T * C; i++)
					yr[i] = ys[i];
				tol_close(tag, "y against the steps", y, yr, (size_t)B * T * C, ATTN_TOL);
				free(q), free(y), free(kr), free(vr), free(w), free(ys), free(yr);
			}
		free(seq), free(dy0), free(want), free(lse), free(g), free(kc), free(vc);
	}
	fx_close(&f);
}
END_TEST

/* The CPU's workspace for ATTENTION_DECODE_RUN (the prefill plan holds
 * it between prompts): a slot a thread for at most B * H threads, the
 * most attn_team runs: 3 threads on 2 pairs ask for 2 slots, on 8 pairs
 * for 3 (before, a slot for every thread of [run] threads); the run on 2
 * pairs gives the same bytes on 1 and 3 threads. */
START_TEST(test_attn_decode_slots)
{
	if (strcmp(g_name, "cpu"))
		return; /* (the slots are the CPU plugin's) */
	enum { T = 5, C = 2 * 64, TM = 256, NQ = T * 3 * C, NC = 2 * TM * 64 };
	static const int Bs[2] = { 1, 4 };
	size_t ws[2][2];
	float *q = frandv(NQ), *kc = frandv(NC), *vc = frandv(NC), *y[2], *kr[2];
	for (int t = 0; t < 2; t++) {
		struct fx f;
		fx_threads(&f, t ? 3 : 1);
		for (int k = 0; k < 2; k++) {
			struct kiln_op op;
			void *plan = NULL;
			attn_decode_op(&op, Bs[k], T, C, 2, TM, 0.125);
			OK(kiln_device_prepare(f.dev, &op, &plan, &ws[t][k]));
			kiln_device_plan_free(f.dev, plan);
		}
		/* the run at positions 3..7 of one row on the fewer slots */
		struct kiln_op op;
		const int32_t pos = 3;
		attn_decode_op(&op, 1, T, C, 2, TM, 0.125);
		void *dq = dput(&f, q, NQ * 4), *dp = dput(&f, &pos, 4), *dy = dput(&f, NULL, T * C * 4);
		void *dk = dput(&f, kc, NC * 4), *dv = dput(&f, vc, NC * 4);
		OK(run_op(&f, &op, (const void *const[]){ dq, dp }, (void *const[]){ dy, dk, dv }));
		y[t] = malloc(T * C * 4), kr[t] = malloc(NC * 4);
		dget(&f, y[t], dy, T * C * 4);
		dget(&f, kr[t], dk, NC * 4);
		DFREE(&f, dq, dp, dy, dk, dv);
		fx_close(&f);
	}
	ck_assert_msg(!memcmp(y[0], y[1], T * C * 4) && !memcmp(kr[0], kr[1], NC * 4),
		      "the run on 1 and 3 threads: not the same bytes");
	free(q), free(kc), free(vc), free(y[0]), free(y[1]), free(kr[0]), free(kr[1]);
	ck_assert_msg(ws[0][0] > 0 && ws[0][0] == ws[0][1], "1 thread: %zu and %zu bytes", ws[0][0], ws[0][1]);
	ck_assert_msg(ws[1][0] == 2 * ws[0][0], "3 threads, 2 pairs: %zu bytes, not 2 slots of %zu", ws[1][0],
		      ws[0][0]);
	ck_assert_msg(ws[1][1] == 3 * ws[0][0], "3 threads, 8 pairs: %zu bytes, not 3 slots of %zu", ws[1][1],
		      ws[0][0]);
}
END_TEST

DEVICE_SUITE(attention, DFX_CASE(attn_loops), DFX_CASE(attn_far_scores), DFX_CASE(attn_torch), DFX_CASE(attn_dropout),
	     DFX_CASE(attn_lowp), DFX_CASE(attn_refused), DFX_ONCE(attn_threads, 60),
	     DFX_CASE(attn_lowp_shapes), DFX_CASE(attn_decode_run), DFX_ONCE(attn_decode_slots, 60));
