/* plugins/cpu/qweights.c - the INT8 weights of QCONV and QLINEAR
 * (qconv.c) quantized and reordered, kept, and shared by the plans that
 * read the same weights (the kind cpu_qw_kind of wshare.c, which keeps
 * and shares them).
 *
 * What an entry holds (struct cpu_qweights): the weights quantized per
 * output channel (sw[o] = max|w[o]| / 63, [-63, 63], round half to even),
 * reordered by oneDNN into the kernel's blocked layout, the output scales
 * sc[o] = sx * sw[o] (over the u8 output's scale) and the bias over them,
 * bq[o] = b[o] / sc[o]: all a function of the f32 weights and bias and of
 * the key (struct cpu_qkey: the shapes, the input and output scales, the
 * kernel's weight layout), never of the row count.
 *
 * Frozen (KILN_OPF_FROZEN and [plugin.cpu] keep_weights, the inference
 * plans): shared by a model's plans of every row count (wshare.c;
 * before session 39 each new size quantized every weight again: the
 * Fashion-MNIST MLP alternating 5 and 6 rows at batch 16 took 2.1 ms a
 * call against 0.03 at one size; docs/inference.md, "What is kept across
 * sizes").  Not frozen (evaluation plans of a training run): one entry
 * per plan, its values made again when the f32 weights or bias differ
 * from the copy it keeps of the ones it was made from (one memcmp a run).
 */
#include "qweights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- the values ------------------------------------------------------- */

/* One row of weights into q: its scale sw = max|w| / 63 (1 for a zero
 * row, returned), the values w / sw in [-63, 63], round half to even,
 * times adj.  Inline compares (libm's fmaxf/fminf are calls: this ran
 * 40% of INT8's first batch on the CNN's fc1, docs/PERFORMANCE.md). */
CPU_CLONES static float q_row(const float *restrict row, int64_t per, float adj, int8_t *restrict q)
{
	float m[16] = { 0 }, amax = 0;
	int64_t k = 0;
	for (; k + 16 <= per; k += 16)
#pragma omp simd
		for (int j = 0; j < 16; j++) {
			const float a = fabsf(row[k + j]);
			m[j] = a > m[j] ? a : m[j];
		}
	for (; k < per; k++) {
		const float a = fabsf(row[k]);
		amax = a > amax ? a : amax;
	}
	for (int j = 0; j < 16; j++)
		amax = m[j] > amax ? m[j] : amax;
	const float sw = amax > 0 ? amax / 63.0f : 1.0f;
#pragma omp simd
	for (k = 0; k < per; k++) {
		float v = nearbyintf(row[k] / sw);
		v = v < 63.0f ? v : 63.0f; /* NaN: 63, as fminf */
		v = v > -63.0f ? v : -63.0f;
		q[k] = (int8_t)(adj * v);
	}
	return sw;
}

/* Quantize w (and b) into s: sw[o] = max|w[o]| / 63, [-63, 63], round
 * half to even; the scales and the bias over them (a u8 y: the scales
 * over its scale so too, the bias still in the sums' domain). */
static void qw_quantize(struct cpu_qweights *s, const float *w, const float *b)
{
	const int64_t O = s->k.O, per = s->k.per;
	const float sx = s->k.sx, so = s->k.so;
	const int adj = s->k.adj;
#pragma omp parallel for schedule(static)
	for (int64_t o = 0; o < O; o++) {
		const float sw = q_row(w + o * per, per, (float)adj, s->wq + o * per);
		const float sc = sx * sw / (float)adj;
		s->bq[o] = b ? b[o] / sc : 0.0f;
		s->sc[o] = sc / so;
	}
	if (s->base.frozen) /* nothing to compare with */
		return;
	memcpy(s->w, w, sizeof(float) * (size_t)(O * per));
	if (b)
		memcpy(s->b, b, sizeof(float) * (size_t)O);
}

/* 1 when the n floats at a and b are the same bytes: one memcmp per
 * 64K-float chunk, the chunks shared by the team (the CNN's fc1 compares
 * 12.8 MB a batch: 1.3% of its INT8 evaluation on 2 threads, on one). */
static int q_same(const float *a, const float *b, size_t n)
{
	const int64_t chunk = 65536, nc = (int64_t)((n + (size_t)chunk - 1) / (size_t)chunk);
	int differ = 0;
#pragma omp parallel for schedule(static) reduction(|| : differ) if (nc > 1)
	for (int64_t k = 0; k < nc; k++) {
		const size_t o = (size_t)(k * chunk), m = n - o < (size_t)chunk ? n - o : (size_t)chunk;
		differ = differ || memcmp(a + o, b + o, sizeof(float) * m) != 0;
	}
	return !differ;
}

/* Not frozen: 1 when e was made from w and b (compared). */
static int qw_holds(const struct cpu_wkept *e, const void *w, const void *b)
{
	const struct cpu_qweights *s = (const struct cpu_qweights *)e;
	const size_t O = (size_t)s->k.O, n = O * (size_t)s->k.per;
	return q_same(s->w, w, n) && (!b || !memcmp(s->b, b, sizeof(float) * O));
}

/* s made from w and b: quantized, then reordered into the kernel's
 * layout on d's stream.  Under s->base.lock, to write. */
static kiln_status qw_fill(struct cpu_qweights *s, const float *w, const float *b,
			   struct cpu_dnn *d, const char *what, struct cpu_err *e)
{
	qw_quantize(s, w, b);
	dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, s->mwp }, { DNNL_ARG_TO, s->mwk } };
	pthread_mutex_lock(&d->lock);
	dnnl_status_t st = s->rw ? dnnl_primitive_execute(s->rw, d->stream, 2, args) : dnnl_success;
	if (st == dnnl_success)
		st = dnnl_stream_wait(d->stream);
	pthread_mutex_unlock(&d->lock);
	if (st != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s: %s:%d: the weights' reorder: %s", what,
				__FILE__, __LINE__, cpu_dnnl_str(st));
	s->k.host->log(KILN_LOG_DEBUG, "cpu", "%s O %lld x %lld: weights quantized (%s)", what,
		       (long long)s->k.O, (long long)s->k.per,
		       s->base.frozen ? "frozen: kept until the weights change, shared by the plans that read them"
				      : "compared every run");
	return KILN_OK;
}

kiln_status cpu_qw_acquire(struct cpu_wref *r, const float *w, const float *b, struct cpu_dnn *d,
			   const char *what, struct cpu_err *e)
{
	const struct cpu_qkey *k = r->key;
	int fill, lib;
	kiln_status st = cpu_wref_acquire(r, w, b, &fill, &lib);
	if (st == KILN_ENOMEM)
		return cpu_fail(e, st, "cpu: %s O %lld x %lld: out of memory for the quantized weights", what,
				(long long)k->O, (long long)k->per);
	if (st)
		return cpu_fail(e, st, "cpu: %s O %lld x %lld: the weights' reorder: %s", what,
				(long long)k->O, (long long)k->per, cpu_dnnl_str((dnnl_status_t)lib));
	if (!fill)
		return KILN_OK;
	if ((st = qw_fill((struct cpu_qweights *)r->e, w, b, d, what, e))) {
		cpu_wref_release(r);
		return st;
	}
	cpu_wref_filled(r);
	return KILN_OK;
}

/* ---- the kind ----------------------------------------------------------- */

static void qw_free(struct cpu_wkept *e)
{
	struct cpu_qweights *s = (struct cpu_qweights *)e;
	dnnl_primitive_destroy(s->rw);
	dnnl_memory_destroy(s->mwp);
	dnnl_memory_destroy(s->mwk);
	if (s->wk != s->wq)
		cpu_huge_free(s->wk);
	cpu_huge_free(s->w), cpu_huge_free(s->wq);
	free(s->b), free(s->sc), free(s->bq);
	free(s);
}

static struct cpu_wkept *qw_make(const void *key, int frozen, int *lib)
{
	const struct cpu_qkey *k = key;
	const size_t n = (size_t)(k->O * k->per), O = (size_t)k->O;
	const int plain = dnnl_memory_desc_equal(&k->w_kern, &k->w_user);
	const dnnl_engine_t eng = k->engine;
	dnnl_primitive_desc_t rpd = NULL;
	dnnl_status_t st = dnnl_success;
	struct cpu_qweights *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->k = *k;
	s->w = frozen ? NULL : cpu_huge_alloc(64, sizeof(float) * n);
	s->b = !frozen && k->has_bias ? malloc(sizeof(float) * O) : NULL;
	s->wq = cpu_huge_alloc(64, al64(n));
	s->wk = plain ? s->wq : cpu_huge_alloc(64, al64(dnnl_memory_desc_get_size(&k->w_kern)));
	s->sc = malloc(sizeof(float) * O);
	s->bq = calloc(O, sizeof(float));
	if ((!frozen && (!s->w || (k->has_bias && !s->b))) || !s->wq || !s->wk || !s->sc || !s->bq)
		goto fail;
	if (!plain) {
		if ((st = dnnl_reorder_primitive_desc_create(&rpd, &k->w_user, eng, &k->w_kern, eng, NULL)) ||
		    (st = cpu_dnn_primitive(&s->rw, rpd)) ||
		    (st = dnnl_memory_create(&s->mwp, &k->w_user, eng, s->wq)) ||
		    (st = dnnl_memory_create(&s->mwk, &k->w_kern, eng, s->wk)))
			goto fail;
		dnnl_primitive_desc_destroy(rpd);
	}
	return &s->base;
fail:
	dnnl_primitive_desc_destroy(rpd);
	*lib = (int)st;
	qw_free(&s->base);
	return NULL;
}

/* 1 when e holds the values of key k for the same weights. */
static int qw_same_key(const struct cpu_wkept *e, const void *key)
{
	const struct cpu_qkey *a = &((const struct cpu_qweights *)e)->k, *b = key;
	return a->O == b->O && a->per == b->per && a->sx == b->sx && a->so == b->so &&
	       a->adj == b->adj && a->has_bias == b->has_bias &&
	       dnnl_memory_desc_equal(&a->w_user, &b->w_user) &&
	       dnnl_memory_desc_equal(&a->w_kern, &b->w_kern);
}

const struct cpu_wkind cpu_qw_kind = {
	.what = "INT8 weights",
	.same_key = qw_same_key,
	.make = qw_make,
	.free = qw_free,
	.holds = qw_holds,
};
