/* plugins/cpu/wshare.c - what plans make of their weights, kept from run
 * to run and shared by the plans that read the same weights.
 *
 * Three kinds (struct cpu_wkind), each an entry struct whose first member
 * is struct cpu_wkept: qweights.c's INT8 weights (QCONV, QLINEAR:
 * quantized per channel, reordered into the kernel's layout, scales and
 * bias), conv.c's (a frozen CONV's weights in the blocked layout oneDNN's
 * kernel reads) and wino.c's (a frozen Winograd convolution's transformed
 * weights U).  Each is a function of the weights (and bias) and of the
 * kind's key (shapes, layouts, scales), never of the row count.
 *
 * Shared (frozen: KILN_OPF_FROZEN and [plugin.cpu] keep_weights, the
 * inference plans): an entry is listed in its context (struct cpu_wshare)
 * under the addresses of the weights and bias it is made from, and a
 * frozen plan takes the listed entry of its weights, kind and key on its
 * first run (cpu_wref_acquire), or makes and lists one.  So a model's
 * plans for other row counts make nothing again: kiln_infer with a partial
 * batch of each size makes a plan for it, and before session 39 (INT8)
 * and 40 (f32) each such plan quantized, reordered or transformed every
 * weight on its first run and kept its own copy (docs/inference.md, "What
 * is kept across sizes").  A frozen entry's values stay until the core
 * says its weights changed (below, "Notices"); the core tells the device
 * of a write before the next run of any frozen plan of the model, a plan
 * made after the write included (kiln_plan_frozen_sync), so the values
 * another plan made are never older than the weights.  A listed entry
 * stays after its last plan is freed (kiln_infer frees the plan of the
 * last size when another comes) until the memory its weights lie in is
 * freed (cpu_wshare_freed, from cpu_free: a new allocation at that
 * address is other weights) or the context closes: memory, one copy per
 * weight tensor, kind and key, as one plan kept before.
 *
 * Not shared: a plan that is not frozen (an evaluation plan of a training
 * run: INT8 only, whose entry keeps a copy of the f32 weights and makes
 * the values again when they differ, one memcmp a run), and a frozen
 * plan run inside cpu_wshare_private_begin (lowp.c's inner f32 plan of a
 * bf16 or f16 op: its weights are a conversion in the workspace, whose
 * address other layers' conversions share): its own entry, never listed,
 * following the notices of the outer op's weights.
 *
 * Notices: the core tells the device of new weights with
 * KILN_PROC_WEIGHTS_WRITTEN, the range written (each of a model's
 * parameters, buffers and compute copy), or KILN_PROC_WEIGHTS_CHANGED,
 * every weight.  Each notice gets a stamp (1, 2, ...: the list's count),
 * kept for its range.  A frozen entry records, when made, the stamp of
 * the last notice that covers its weights (wk_stamp: its range's, or a
 * later one of every weight; for weights in no range told, the last of
 * any notice), and holds their values while that stays the stamp.  So a
 * model's load makes its own entries again and no other model's: before
 * session 41 one count served the device, and a second model's load (or
 * a plan of it made later, which tells the device once) made every
 * model's entries again on their next run.
 *
 * A run asks for its weights' stamp without the list's lock while
 * nothing changed: the list's epoch moves with every notice and every
 * range forgotten, and a plan keeps the stamp it read with the epoch it
 * read it at (struct cpu_wref.st_*; wk_stamp_of).
 *
 * Locks: the list's (struct cpu_wshare) for the list, the holders, the
 * addresses and the notices; each entry's read-write lock for its values,
 * held to read by a run and to write by the run that makes them, so the
 * plans sharing an entry run side by side and wait only while it is made.
 * Order: a plan's own lock, then the list's or the entry's.
 */
#include "wshare.h"

#include <stdlib.h>

/* ---- entries ---------------------------------------------------------- */

/* A new entry of r's kind and key, one holder, not listed (how: for the
 * debug log, which tests/infer_wreorder.sh counts); NULL: see
 * cpu_wkind.make. */
static struct cpu_wkept *wk_new(const struct cpu_wref *r, const char *how, int *lib)
{
	*lib = 0;
	struct cpu_wkept *e = r->kind->make(r->key, r->frozen, lib);
	if (!e)
		return NULL;
	r->host->log(KILN_LOG_DEBUG, "cpu", "kept weights: a new entry of %s (%s)", r->kind->what, how);
	e->next = NULL;
	e->refs = 1;
	e->listed = 0;
	e->w_src = e->b_src = NULL;
	e->kind = r->kind;
	e->frozen = r->frozen;
	pthread_rwlock_init(&e->lock, NULL);
	e->valid = 0;
	e->made = e->filling = e->ver = 0;
	return e;
}

static void wk_free(struct cpu_wkept *e)
{
	pthread_rwlock_destroy(&e->lock);
	e->kind->free(e);
}

/* Under sh->lock. */
static void wk_unlist(struct cpu_wshare *sh, struct cpu_wkept *e)
{
	struct cpu_wkept **at = &sh->head;
	while (*at && *at != e)
		at = &(*at)->next;
	if (*at)
		*at = e->next;
	e->next = NULL;
	e->listed = 0;
	e->w_src = e->b_src = NULL;
}

/* One holder fewer: a listed entry stays for the next plan of its
 * weights (freed with them, cpu_wshare_freed); another is freed with its
 * last holder.  Under the list's lock. */
static void wk_unref(struct cpu_wkept *e)
{
	if (--e->refs || e->listed)
		return;
	wk_free(e);
}

/* e listed under w, b with no values (under sh->lock; e is its holder's
 * alone). */
static void wk_list(struct cpu_wshare *sh, struct cpu_wkept *e, const void *w, const void *b)
{
	if (!e->listed) {
		e->next = sh->head;
		sh->head = e;
		e->listed = 1;
	}
	e->w_src = w;
	e->b_src = b;
	e->valid = 0;
}

/* The listed entry of w, b, r's kind and key other than r's own, or NULL.
 * Under sh->lock. */
static struct cpu_wkept *wk_find(const struct cpu_wref *r, const void *w, const void *b)
{
	for (struct cpu_wkept *x = r->sh->head; x; x = x->next)
		if (x != r->e && x->kind == r->kind && x->w_src == w && x->b_src == b &&
		    r->kind->same_key(x, r->key))
			return x;
	return NULL;
}

/* r's entry for w, b: the listed one of another plan (whose values then
 * serve), r's own listed under w, b (values to be made), or a new one
 * listed where r's serves other plans too (or r has none).  The new one
 * is made outside the list's lock (a oneDNN reorder primitive), then
 * looked for again. */
static kiln_status wk_attach(struct cpu_wref *r, const void *w, const void *b, int *lib)
{
	struct cpu_wshare *sh = r->sh;
	struct cpu_wkept *x, *made = NULL;
	pthread_mutex_lock(&sh->lock);
	for (;;) {
		if ((x = wk_find(r, w, b))) { /* another plan's: its values serve */
			x->refs++;
			break;
		}
		if (r->e && r->e->refs == 1) { /* r's own */
			wk_list(sh, r->e, w, b);
			x = r->e;
			break;
		}
		if (made) {
			wk_list(sh, made, w, b);
			x = made, made = NULL;
			break;
		}
		pthread_mutex_unlock(&sh->lock);
		made = wk_new(r, "frozen: shared by the plans that read the same weights", lib);
		pthread_mutex_lock(&sh->lock);
		if (!made) {
			pthread_mutex_unlock(&sh->lock);
			return *lib ? KILN_EDEVICE : KILN_ENOMEM;
		}
	}
	if (x != r->e) {
		if (r->e)
			wk_unref(r->e);
		r->e = x;
		r->taken++;
	}
	if (made) /* another plan listed one meanwhile */
		wk_free(made);
	pthread_mutex_unlock(&sh->lock);
	r->w_at = w, r->b_at = b;
	return KILN_OK;
}

/* r's own entry, never listed (cpu_wshare_private_begin): kept while it is
 * r's alone and unlisted, else a new one. */
static kiln_status wk_private(struct cpu_wref *r, const void *w, const void *b, int *lib)
{
	struct cpu_wkept *e = r->e;
	if (!e || e->listed || e->refs > 1) {
		if (!(e = wk_new(r, "frozen, the plan's own: its weights are converted", lib)))
			return *lib ? KILN_EDEVICE : KILN_ENOMEM;
		cpu_wref_drop(r);
		r->e = e;
		r->taken++;
	}
	r->w_at = w, r->b_at = b;
	return KILN_OK;
}

/* ---- notices of new weights ------------------------------------------ */

/* The stamp of the last notice that covers the weights at w: their
 * range's, or a later one of every weight; in no range told (weights
 * that are no model's parameters: a layer's own memory), the last notice
 * of any.  *epoch: the list's epoch it holds for. */
static uint64_t wk_stamp(struct cpu_wshare *sh, const void *w, uint64_t *epoch)
{
	const uintptr_t a = (uintptr_t)w;
	pthread_mutex_lock(&sh->lock);
	uint64_t s = sh->seq;
	for (int i = 0; i < sh->n_ranges; i++)
		if (a >= sh->ranges[i].lo && a < sh->ranges[i].hi) {
			s = sh->ranges[i].stamp > sh->all ? sh->ranges[i].stamp : sh->all;
			break;
		}
	*epoch = sh->epoch;
	pthread_mutex_unlock(&sh->lock);
	return s;
}

/* r's stamp of the weights at src: the one it read before while no
 * notice came and no range was forgotten since (one atomic load: every
 * run of a frozen plan asks, and before session 42 each took the list's
 * lock and searched the ranges), else wk_stamp's, kept.  Measured
 * performance-neutral (docs/PERFORMANCE.md, session 42), kept as it is
 * simple; every change to sh->ranges or sh->all must bump the epoch
 * (wk_epoch_next), or a run keeps a stale stamp. */
static uint64_t wk_stamp_of(struct cpu_wref *r, const void *src)
{
	const uint64_t ep = __atomic_load_n(&r->sh->epoch, __ATOMIC_ACQUIRE);
	if (src && r->st_src == src && r->st_epoch == ep)
		return r->st_gen;
	r->st_gen = wk_stamp(r->sh, src, &r->st_epoch);
	r->st_src = src;
	return r->st_gen;
}

/* Under sh->lock: a stamp may have changed (wk_stamp_of reads again). */
static void wk_epoch_next(struct cpu_wshare *sh)
{
	__atomic_store_n(&sh->epoch, sh->epoch + 1, __ATOMIC_RELEASE);
}

/* Under sh->lock: the ranges that overlap [lo, hi) forgotten (their
 * weights fall back to the last notice of any, as late or later). */
static void wk_ranges_drop(struct cpu_wshare *sh, uintptr_t lo, uintptr_t hi)
{
	int k = 0;
	for (int i = 0; i < sh->n_ranges; i++)
		if (sh->ranges[i].hi <= lo || sh->ranges[i].lo >= hi)
			sh->ranges[k++] = sh->ranges[i];
	if (k != sh->n_ranges)
		wk_epoch_next(sh);
	sh->n_ranges = k;
}

void cpu_wshare_written(struct cpu_wshare *sh, const void *ptr, size_t bytes)
{
	const uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
	pthread_mutex_lock(&sh->lock);
	const uint64_t s = ++sh->seq;
	wk_epoch_next(sh);
	if (!ptr) {
		sh->all = s;
	} else if (bytes) {
		wk_ranges_drop(sh, lo, hi);
		if (sh->n_ranges == sh->cap_ranges) {
			const int cap = sh->cap_ranges ? 2 * sh->cap_ranges : 8;
			struct cpu_wrange *g = realloc(sh->ranges, sizeof *g * (size_t)cap);
			if (g)
				sh->ranges = g, sh->cap_ranges = cap;
			else /* out of memory: as a notice of every weight */
				sh->all = s;
		}
		if (sh->n_ranges < sh->cap_ranges)
			sh->ranges[sh->n_ranges++] = (struct cpu_wrange){ lo, hi, s };
	}
	pthread_mutex_unlock(&sh->lock);
}

/* ---- a plan's reference ----------------------------------------------- */

/* cpu_wshare_private sections open, and the outer op's weights */
static __thread int wk_private_run;
static __thread const void *wk_private_src;

void cpu_wshare_private_begin(const void *src)
{
	wk_private_run++;
	wk_private_src = src;
}

void cpu_wshare_private_end(void) { wk_private_run--; }

kiln_status cpu_wref_init(struct cpu_wref *r, struct cpu_ctx *c, const struct cpu_wkind *kind,
			  const void *key, int frozen, int *lib)
{
	*r = (struct cpu_wref){ .sh = &c->wshare, .kind = kind, .key = key, .frozen = frozen,
				.host = c->host };
	*lib = 0;
	if (frozen)
		return KILN_OK; /* taken on the first run (cpu_wref_acquire) */
	if (!(r->e = wk_new(r, "the plan's own, compared every run", lib)))
		return *lib ? KILN_EDEVICE : KILN_ENOMEM;
	r->taken++;
	return KILN_OK;
}

void cpu_wref_drop(struct cpu_wref *r)
{
	if (!r->e)
		return;
	pthread_mutex_lock(&r->sh->lock);
	wk_unref(r->e);
	pthread_mutex_unlock(&r->sh->lock);
	r->e = NULL;
	r->w_at = r->b_at = NULL;
}

void cpu_wref_detach(struct cpu_wref *r)
{
	if (r->frozen)
		cpu_wref_drop(r);
}

/* 1 when e holds w and b: frozen, made since the device last heard of
 * new weights there (no look at w: the flag says its values stay); else
 * made from these values (compared).  gen: the stamp of the weights'
 * last notice (wk_stamp).  Under e->lock. */
static int wk_current(const struct cpu_wkept *e, const void *w, const void *b, uint64_t gen)
{
	if (!e->valid)
		return 0;
	return e->frozen ? e->made == gen : e->kind->holds(e, w, b);
}

kiln_status cpu_wref_acquire(struct cpu_wref *r, const void *w, const void *b, int *fill, int *lib)
{
	kiln_status st = KILN_OK;
	*fill = 0;
	*lib = 0;
	if (r->frozen && wk_private_run)
		st = wk_private(r, w, b, lib);
	else if (r->frozen && (!r->e || r->w_at != w || r->b_at != b))
		st = wk_attach(r, w, b, lib);
	if (st)
		return st;
	struct cpu_wkept *e = r->e;
	/* read before the weights: a change after it makes the next run's */
	const uint64_t gen = r->frozen ? wk_stamp_of(r, wk_private_run ? wk_private_src : w) : 0;
	pthread_rwlock_rdlock(&e->lock);
	if (wk_current(e, w, b, gen))
		return KILN_OK;
	pthread_rwlock_unlock(&e->lock);
	pthread_rwlock_wrlock(&e->lock); /* another plan may have made them meanwhile */
	if (!wk_current(e, w, b, gen)) {
		e->valid = 0; /* until the caller's fill is done */
		e->filling = gen;
		*fill = 1;
	}
	return KILN_OK;
}

int cpu_wref_seen(struct cpu_wref *r, const void *w)
{
	struct cpu_wshare *sh = r->sh;
	const uint64_t gen = wk_stamp_of(r, w);
	int seen = 0, i;
	pthread_mutex_lock(&sh->lock);
	for (i = 0; i < sh->n_seen && sh->seen[i].w != w; i++)
		;
	if (i < sh->n_seen) {
		seen = sh->seen[i].stamp == gen;
		sh->seen[i].stamp = gen;
	} else {
		if (sh->n_seen == sh->cap_seen) {
			const int cap = sh->cap_seen ? 2 * sh->cap_seen : 16;
			struct cpu_wseen *g = realloc(sh->seen, sizeof *g * (size_t)cap);
			if (g)
				sh->seen = g, sh->cap_seen = cap;
		}
		if (sh->n_seen < sh->cap_seen) /* (out of memory: seen, kept now) */
			sh->seen[sh->n_seen++] = (struct cpu_wseen){ w, gen };
		else
			seen = 1;
	}
	pthread_mutex_unlock(&sh->lock);
	return seen;
}

void cpu_wref_filled(struct cpu_wref *r)
{
	r->e->made = r->e->filling;
	r->e->ver++;
	r->e->valid = 1;
}

void cpu_wref_release(struct cpu_wref *r) { pthread_rwlock_unlock(&r->e->lock); }

/* ---- the context's list ----------------------------------------------- */

void cpu_wshare_init(struct cpu_wshare *sh, const struct kiln_host *host)
{
	pthread_mutex_init(&sh->lock, NULL);
	sh->head = NULL;
	sh->host = host;
	sh->seq = sh->all = sh->epoch = 0;
	sh->ranges = NULL;
	sh->n_ranges = sh->cap_ranges = 0;
	sh->seen = NULL;
	sh->n_seen = sh->cap_seen = 0;
}

void cpu_wshare_destroy(struct cpu_wshare *sh)
{
	while (sh->head) { /* no holder is left */
		struct cpu_wkept *e = sh->head;
		sh->head = e->next;
		wk_free(e);
	}
	free(sh->ranges);
	free(sh->seen);
	pthread_mutex_destroy(&sh->lock);
}

void cpu_wshare_freed(struct cpu_wshare *sh, void *ptr)
{
	if (!ptr)
		return;
	const uintptr_t lo = (uintptr_t)ptr, hi = lo + cpu_huge_usable(ptr);
	int unlisted = 0, freed = 0;
	pthread_mutex_lock(&sh->lock);
	for (struct cpu_wkept *e = sh->head, *nx; e; e = nx) {
		nx = e->next;
		if (((uintptr_t)e->w_src >= lo && (uintptr_t)e->w_src < hi) ||
		    (e->b_src && (uintptr_t)e->b_src >= lo && (uintptr_t)e->b_src < hi)) {
			wk_unlist(sh, e);
			unlisted++;
			if (!e->refs) {
				wk_free(e);
				freed++;
			}
		}
	}
	wk_ranges_drop(sh, lo, hi);
	int k = 0; /* other weights may come at these addresses */
	for (int i = 0; i < sh->n_seen; i++)
		if ((uintptr_t)sh->seen[i].w < lo || (uintptr_t)sh->seen[i].w >= hi)
			sh->seen[k++] = sh->seen[i];
	sh->n_seen = k;
	pthread_mutex_unlock(&sh->lock);
	if (unlisted) /* (tests/check_cpu_wshare counts it) */
		sh->host->log(KILN_LOG_DEBUG, "cpu", "kept weights: %d entries made from freed memory listed no more, %d of them freed (no plan holds them)",
			      unlisted, freed);
}
