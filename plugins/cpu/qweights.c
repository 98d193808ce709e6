/* plugins/cpu/qweights.c - the INT8 weights of QCONV and QLINEAR
 * (qconv.c) quantized and reordered, kept, and shared by the plans that
 * read the same weights.
 *
 * What an entry holds (struct cpu_qweights): the weights quantized per
 * output channel (sw[o] = max|w[o]| / 63, [-63, 63], round half to even),
 * reordered by oneDNN into the kernel's blocked layout, the output scales
 * sc[o] = sx * sw[o] (over the u8 output's scale) and the bias over them,
 * bq[o] = b[o] / sc[o]: all a function of the f32 weights and bias and of
 * the key (struct cpu_qkey: the shapes, the input and output scales, the
 * kernel's weight layout), never of the row count.
 *
 * Shared (frozen: KILN_OPF_FROZEN and [plugin.cpu] keep_weights, the
 * inference plans): an entry is listed in its context (struct cpu_qshare)
 * under the addresses of the weights and bias it is made from, and a
 * frozen plan takes the listed entry of its weights and key on its first
 * run (cpu_qw_attach).  So a model's plans for other row counts quantize
 * nothing again: kiln_infer with a partial batch of each size makes a plan
 * for it, and before this each such plan quantized and reordered every
 * weight on its first run (the Fashion-MNIST MLP alternating 5 and 6 rows
 * at batch 16: 2.1 ms a call against 0.03 at one size; docs/inference.md,
 * "What is kept across sizes").  A frozen entry's values stay while the
 * device's count of KILN_PROC_WEIGHTS_CHANGED calls is the one it was made
 * at; the core tells the device of a write before the next run of any
 * frozen plan of the model, a plan made after the write included
 * (kiln_plan_frozen_sync), so the values another plan made are never
 * older than the weights.  A listed entry stays after its last plan is
 * freed (kiln_infer frees the plan of the last size when another comes)
 * until the memory its weights lie in is freed (cpu_qshare_freed: a new
 * allocation at that address is other weights) or the context closes:
 * memory, the quantized weights once per weight tensor and key (the
 * blocked copy too where the kernel's layout is not plain), as one plan
 * kept before.
 *
 * Not frozen (evaluation plans of a training run): one entry per plan,
 * never listed, its values made again when the f32 weights or bias differ
 * from the copy it keeps of the ones it was made from (one memcmp a run).
 *
 * Locks: the list's (struct cpu_qshare) for the list, the holders and the
 * addresses; each entry's read-write lock for its values, held to read by
 * a run and to write by the run that makes them (cpu_qw_acquire), so the
 * plans sharing an entry run side by side and wait only while it is made.
 * Order: a plan's own lock (qconv.c), then the list's or the entry's.
 */
#include "qweights.h"

#include <malloc.h> /* malloc_usable_size */
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
	if (s->frozen) /* nothing to compare with */
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

/* 1 when s holds w and b: frozen, made since the device last heard of
 * new weights (no look at w: the flag says its values stay); else made
 * from these values (compared).  gen: the count now.  Under s->lock. */
static int qw_current(const struct cpu_qweights *s, const float *w, const float *b, uint64_t gen)
{
	const size_t O = (size_t)s->k.O, n = O * (size_t)s->k.per;
	if (!s->valid)
		return 0;
	if (s->frozen)
		return s->made == gen;
	return q_same(s->w, w, n) && (!b || !memcmp(s->b, b, sizeof(float) * O));
}

/* s made from w and b: quantized, then reordered into the kernel's
 * layout on d's stream.  Under s->lock, to write. */
static kiln_status qw_fill(struct cpu_qweights *s, const float *w, const float *b, uint64_t gen,
			   struct cpu_dnn *d, const char *what, struct cpu_err *e)
{
	s->valid = 0;
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
	s->made = gen;
	s->ver++;
	s->valid = 1;
	s->host->log(KILN_LOG_DEBUG, "cpu", "%s O %lld x %lld: weights quantized (%s)", what,
		     (long long)s->k.O, (long long)s->k.per,
		     s->frozen ? "frozen: kept until the weights change, shared by the plans that read them"
			       : "compared every run");
	return KILN_OK;
}

kiln_status cpu_qw_acquire(struct cpu_qweights *s, const float *w, const float *b,
			   struct cpu_dnn *d, const char *what, struct cpu_err *e)
{
	/* read before the weights: a change after it makes the next run's */
	const uint64_t gen = __atomic_load_n(s->gen, __ATOMIC_ACQUIRE);
	pthread_rwlock_rdlock(&s->lock);
	if (qw_current(s, w, b, gen))
		return KILN_OK;
	pthread_rwlock_unlock(&s->lock);
	pthread_rwlock_wrlock(&s->lock); /* another plan may have made them meanwhile */
	const kiln_status st = qw_current(s, w, b, gen) ? KILN_OK : qw_fill(s, w, b, gen, d, what, e);
	if (st)
		pthread_rwlock_unlock(&s->lock);
	return st;
}

void cpu_qw_release(struct cpu_qweights *s) { pthread_rwlock_unlock(&s->lock); }

/* ---- entries ---------------------------------------------------------- */

static void qw_free(struct cpu_qweights *s)
{
	dnnl_primitive_destroy(s->rw);
	dnnl_memory_destroy(s->mwp);
	dnnl_memory_destroy(s->mwk);
	pthread_rwlock_destroy(&s->lock);
	if (s->wk != s->wq)
		free(s->wk);
	free(s->w), free(s->b), free(s->wq), free(s->sc), free(s->bq);
	free(s);
}

struct cpu_qweights *cpu_qw_new(const struct cpu_qkey *k, int frozen, dnnl_engine_t eng,
				const uint64_t *gen, const struct kiln_host *host,
				dnnl_status_t *s_out)
{
	const size_t n = (size_t)(k->O * k->per), O = (size_t)k->O;
	const int plain = dnnl_memory_desc_equal(&k->w_kern, &k->w_user);
	dnnl_primitive_desc_t rpd = NULL;
	dnnl_status_t st = dnnl_success;
	struct cpu_qweights *s = calloc(1, sizeof *s);
	*s_out = dnnl_success;
	if (!s)
		return NULL;
	pthread_rwlock_init(&s->lock, NULL);
	s->refs = 1;
	s->k = *k;
	s->frozen = frozen;
	s->gen = gen;
	s->host = host;
	s->engine = eng;
	s->w = frozen ? NULL : malloc(sizeof(float) * n);
	s->b = !frozen && k->has_bias ? malloc(sizeof(float) * O) : NULL;
	s->wq = aligned_alloc(64, al64(n));
	s->wk = plain ? s->wq : aligned_alloc(64, al64(dnnl_memory_desc_get_size(&k->w_kern)));
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
	return s;
fail:
	dnnl_primitive_desc_destroy(rpd);
	*s_out = st;
	qw_free(s);
	return NULL;
}

/* Under sh->lock. */
static void qw_unlist(struct cpu_qshare *sh, struct cpu_qweights *s)
{
	struct cpu_qweights **at = &sh->head;
	while (*at && *at != s)
		at = &(*at)->next;
	if (*at)
		*at = s->next;
	s->next = NULL;
	s->listed = 0;
	s->w_src = s->b_src = NULL;
}

/* One holder fewer: a listed entry stays for the next plan of its
 * weights (freed with them, cpu_qshare_freed); another is freed with its
 * last holder.  Under the list's lock. */
static void qw_unref(struct cpu_qweights *s)
{
	if (--s->refs || s->listed)
		return;
	qw_free(s);
}

void cpu_qw_drop(struct cpu_qshare *sh, struct cpu_qweights *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&sh->lock);
	qw_unref(s);
	pthread_mutex_unlock(&sh->lock);
}

/* 1 when a and b hold the same values for the same weights. */
static int qw_same_key(const struct cpu_qkey *a, const struct cpu_qkey *b)
{
	return a->O == b->O && a->per == b->per && a->sx == b->sx && a->so == b->so &&
	       a->adj == b->adj && a->has_bias == b->has_bias &&
	       dnnl_memory_desc_equal(&a->w_user, &b->w_user) &&
	       dnnl_memory_desc_equal(&a->w_kern, &b->w_kern);
}

/* s listed under w, b with no values (under sh->lock; s is its holder's
 * alone). */
static void qw_list(struct cpu_qshare *sh, struct cpu_qweights *s, const float *w, const float *b)
{
	if (!s->listed) {
		s->next = sh->head;
		sh->head = s;
		s->listed = 1;
	}
	s->w_src = w;
	s->b_src = b;
	s->valid = 0;
}

kiln_status cpu_qw_attach(struct cpu_qshare *sh, struct cpu_qweights **sp, const float *w,
			  const float *b)
{
	struct cpu_qweights *s = *sp, *x;
	kiln_status st = KILN_OK;
	pthread_mutex_lock(&sh->lock);
	for (x = sh->head; x; x = x->next)
		if (x != s && x->w_src == w && x->b_src == b && qw_same_key(&x->k, &s->k))
			break;
	if (x) { /* another plan's: its values serve */
		x->refs++;
		qw_unref(s);
		*sp = x;
	} else if (s->refs == 1) {
		qw_list(sh, s, w, b);
	} else { /* s serves other plans with other weights: one of its own */
		dnnl_status_t ds;
		x = cpu_qw_new(&s->k, s->frozen, s->engine, s->gen, s->host, &ds);
		if (x) {
			qw_list(sh, x, w, b);
			qw_unref(s);
			*sp = x;
		} else {
			st = KILN_ENOMEM;
		}
	}
	pthread_mutex_unlock(&sh->lock);
	return st;
}

/* ---- the context's list ----------------------------------------------- */

void cpu_qshare_init(struct cpu_qshare *sh)
{
	pthread_mutex_init(&sh->lock, NULL);
	sh->head = NULL;
}

void cpu_qshare_destroy(struct cpu_qshare *sh)
{
	while (sh->head) { /* no holder is left */
		struct cpu_qweights *s = sh->head;
		sh->head = s->next;
		qw_free(s);
	}
	pthread_mutex_destroy(&sh->lock);
}

void cpu_qshare_freed(struct cpu_qshare *sh, void *ptr)
{
	if (!ptr)
		return;
	const uintptr_t lo = (uintptr_t)ptr, hi = lo + malloc_usable_size(ptr);
	pthread_mutex_lock(&sh->lock);
	for (struct cpu_qweights *s = sh->head, *nx; s; s = nx) {
		nx = s->next;
		if (((uintptr_t)s->w_src >= lo && (uintptr_t)s->w_src < hi) ||
		    (s->b_src && (uintptr_t)s->b_src >= lo && (uintptr_t)s->b_src < hi)) {
			qw_unlist(sh, s);
			if (!s->refs)
				qw_free(s);
		}
	}
	pthread_mutex_unlock(&sh->lock);
}
