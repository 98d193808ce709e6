/* plugins/cpu/wcache.c - the f32 copies of bf16/f16 weights that lowp.c's
 * GEMMs and convolutions read, kept from one run to the next while the
 * weights do not change.
 *
 * Below avx512_core (cpu_dnn_bf16_native = 0: AVX2) oneDNN has no bf16
 * GEMM or convolution, so lowp.c runs them as f32 ops on widened copies.
 * A weight is read by its layer's forward and again by its data gradient,
 * and it changes once a step (the optimizer's compute copy): widening it on
 * every call widened fc1's 3.2M weights twice a step (docs/PERFORMANCE.md,
 * "Session 16: bf16 on AVX2 without widening every call").  Here a weight is
 * widened once per version and the copy read by every op until a write.
 * The widening is the reader's (lowp.c, in the one parallel region of the
 * op's other inputs; cpu_wc_get's ticket, cpu_wc_filled); a run reading a
 * weight while another widens its copy widens into its own workspace.
 *
 * A copy is never written while a run reads it: every run given a copy
 * (a kept one, or one to widen) holds it until its kernel is done
 * (cpu_wc_done), and a stale copy is refilled only when no run holds it.
 * Otherwise (a host function made every copy stale while an op on another
 * stream reads one: the weights are likely unchanged, but the reader's
 * bytes must not be rewritten under it) the run widens into its own
 * workspace, as when another run is filling the copy.
 *
 * What counts as a weight: an operand inside the low-precision compute
 * copy of the parameters, which the plugin learns from the optimizer ops
 * (SGD, ADAMW, LAMB) that write it as their last output (`ranges`), or,
 * where the op's outputs have no room for it (ADAMW with amsgrad: params
 * and three state slots fill KILN_OP_MAX_OUT), from the CAST of the op's
 * f32 params (`masters`) that writes it next (core/optim/fused.c; before
 * session 44 such a run kept no copy).  Under ZeRO-1 an optimizer op
 * writes only this rank's pieces of the copy (one per gradient bucket,
 * cut without regard to tensors; the communicator's allgather writes the
 * rest): the whole copy is learnt from the CAST that fills it from the
 * whole f32 params (kiln_model_params_sync, before the first forward and
 * after a load), which the pieces identify (`casts`, `pieces`,
 * wc_covers; before session 46 a weight across a piece's end, or in
 * another rank's piece, was widened on every op).  An operand elsewhere
 * (activations, gradients, a loader's buffer read in place) is never
 * kept.  A weight gets a buffer only once it was read twice between two
 * writes (a first layer's weight, read by its forward alone, costs no
 * memory).
 *
 * When a copy is stale: every way device memory is written on this device
 * passes here (cpu_wc_wrote): each op's outputs after it ran (cpu_exec,
 * whichever stream or captured step runs it), each copy (stream.c), each
 * host function (a communicator's collectives, ZeRO's allgather of the
 * compute copy: anything may have been written, so every copy is stale),
 * and a free (cpu.c).  A write marks the copies of the weights it overlaps
 * stale; the next read widens again.  So a run reads exactly the values
 * lowp.c would have widened: the same bits (tests/cpu_widen_cache.sh).
 *
 * One cache for the process, shared by its CPU contexts (a pipeline's
 * stages on contexts of their own may run each other's plans on their
 * streams: a write is seen whichever context runs it).  The hooks watch
 * every context's writes, also of one opened with keep_widened = 0.
 *
 * Memory: 4 bytes per element of each weight read twice in a step (the
 * Fashion-MNIST CNN: fc1, fc2, conv2, 13 MB; see the debug line at the
 * last close).  Buffers live until the last context closes (a run reading
 * one is never left with a freed one). */
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>

#define CPU_WC_MAX 256  /* weights kept (more: widened per call, as before) */
#define CPU_WC_RANGES 8 /* compute copies (one per model, ZeRO's pieces) */
#define CPU_WC_CASTS 8  /* f32 -> bf16/f16 CASTs remembered (the largest kept) */

/* A conversion of n f32 elements at in into the elements of cs bytes at
 * out: a CAST that ran, or an optimizer's params piece and its compute
 * copy. */
struct cpu_wc_map {
	uintptr_t in, out;
	int64_t n;
	size_t cs;
};

struct cpu_wc_entry {
	const void *src; /* the weight in the compute copy */
	int64_t n;       /* elements */
	int dtype;       /* KILN_BF16 or KILN_F16 */
	int valid;       /* buf holds src widened, no write since */
	int reads;       /* reads since the last write (buffer made at 2) */
	int filling;     /* a run widens into buf now (cpu_wc_get's ticket) */
	int holders;     /* runs given buf and not done (cpu_wc_done): buf is
			  * written only by a fill begun at holders = 0 */
	unsigned gen;    /* bumped by every write: a fill begun before one is
			  * not valid (cpu_wc_filled) */
	float *buf;      /* n f32, or NULL */
};

struct cpu_wcache {
	pthread_mutex_t lock;
	int n_ranges;
	uintptr_t rlo[CPU_WC_RANGES], rhi[CPU_WC_RANGES];
	/* the f32 params of the optimizer ops that wrote no compute copy: a
	 * CAST of them into bf16/f16 writes it */
	int n_masters;
	uintptr_t mlo[CPU_WC_RANGES], mhi[CPU_WC_RANGES];
	/* the optimizer ops' params pieces with their compute copy, and the
	 * CASTs from f32 into bf16/f16 seen: a CAST whose input holds a
	 * piece, converted to that piece's copy, wrote the whole copy */
	int n_pieces, n_casts;
	struct cpu_wc_map pieces[CPU_WC_RANGES], casts[CPU_WC_CASTS];
	int n;
	struct cpu_wc_entry e[CPU_WC_MAX];
	/* the bytes every entry's source spans, [lo, hi) (0, 0: none): a
	 * write outside needs no lock (read atomically) */
	uintptr_t lo, hi;
	uint64_t fills, hits; /* the debug line at close */
	size_t bytes;
	int users; /* contexts that opened it (under wc_global_lock) */
};

/* the process's cache, made by the first context that wants one */
static struct cpu_wcache *wc_global;
static pthread_mutex_t wc_global_lock = PTHREAD_MUTEX_INITIALIZER;

static struct cpu_wcache *wc_now(void) { return __atomic_load_n(&wc_global, __ATOMIC_ACQUIRE); }

static size_t wc_esize(int dtype) { return dtype == KILN_F32 ? 4 : 2; }

struct cpu_wcache *cpu_wc_open(void)
{
	if (cpu_dnn_bf16_native())
		return NULL; /* oneDNN's own bf16 kernels: nothing widened */
	pthread_mutex_lock(&wc_global_lock);
	struct cpu_wcache *w = wc_global;
	if (!w && (w = calloc(1, sizeof *w))) {
		pthread_mutex_init(&w->lock, NULL);
		__atomic_store_n(&wc_global, w, __ATOMIC_RELEASE);
	}
	if (w)
		w->users++;
	pthread_mutex_unlock(&wc_global_lock);
	return w;
}

void cpu_wc_close(struct cpu_wcache *w, const struct kiln_host *host)
{
	if (!w)
		return;
	pthread_mutex_lock(&wc_global_lock);
	const int last = --w->users == 0;
	if (last)
		__atomic_store_n(&wc_global, NULL, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&wc_global_lock);
	if (!last)
		return;
	if (w->fills)
		host->log(KILN_LOG_DEBUG, "cpu",
			  "widened weights: %d kept, %.1f MB, %llu widenings, %llu reads of a kept copy",
			  w->n, (double)w->bytes / 1e6, (unsigned long long)w->fills,
			  (unsigned long long)w->hits);
	for (int i = 0; i < w->n; i++)
		cpu_huge_free(w->e[i].buf);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

/* every copy stale, and (drop) every range forgotten (caller holds lock) */
static void wc_stale_all(struct cpu_wcache *w, int drop)
{
	for (int i = 0; i < w->n; i++) {
		w->e[i].valid = 0;
		w->e[i].reads = 0;
		w->e[i].gen++;
	}
	if (drop) {
		__atomic_store_n(&w->n_ranges, 0, __ATOMIC_RELEASE);
		w->n_masters = 0;
		w->n_pieces = w->n_casts = 0;
	}
}

void cpu_wc_wrote(const void *dst, size_t bytes)
{
	struct cpu_wcache *w = wc_now();
	const uintptr_t a = (uintptr_t)dst, b = a + bytes;
	if (!w || !dst || !bytes || b <= __atomic_load_n(&w->lo, __ATOMIC_ACQUIRE) ||
	    a >= __atomic_load_n(&w->hi, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->n; i++) {
		struct cpu_wc_entry *x = &w->e[i];
		const uintptr_t s = (uintptr_t)x->src;
		if (a < s + (size_t)x->n * wc_esize(x->dtype) && s < b) {
			x->valid = 0;
			x->reads = 0;
			x->gen++;
		}
	}
	pthread_mutex_unlock(&w->lock);
}

void cpu_wc_wrote_any(int freed)
{
	struct cpu_wcache *w = wc_now();
	if (!w || !__atomic_load_n(&w->hi, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&w->lock);
	wc_stale_all(w, freed);
	pthread_mutex_unlock(&w->lock);
}

/* [lo, hi) added to the n ranges of lo_[], hi_[] unless inside one of
 * them, the ones inside it dropped (a ZeRO-1 rank's pieces once the whole
 * copy is known) (caller holds lock; the count stored atomically, never
 * 0 between: cpu_wc_get reads n_ranges without it); full: not added */
static void wc_range_add(uintptr_t *lo_, uintptr_t *hi_, int *n, uintptr_t lo, uintptr_t hi)
{
	int k = 0, m = 0;
	for (k = 0; k < *n; k++)
		if (lo_[k] <= lo && hi <= hi_[k])
			return;
	for (k = 0; k < *n; k++)
		if (!(lo <= lo_[k] && hi_[k] <= hi))
			lo_[m] = lo_[k], hi_[m] = hi_[k], m++;
	if (m < CPU_WC_RANGES) {
		lo_[m] = lo;
		hi_[m] = hi;
		m++;
	}
	__atomic_store_n(n, m, __ATOMIC_RELEASE);
}

/* Whether the CAST c wrote the compute copy of the optimizer's params
 * piece p: p's f32 elements inside c's input, and c's output at their
 * element p's copy.  Then c's output is the copy of the tensor that
 * holds p (an op's operand lies in one allocation: the f32 params), and
 * all of it lies in the copy's allocation, whose every write the hooks
 * see as they do the pieces'. */
static int wc_covers(const struct cpu_wc_map *c, const struct cpu_wc_map *p)
{
	if (c->cs != p->cs || p->in < c->in || (p->in - c->in) % 4 ||
	    p->in + (size_t)p->n * 4 > c->in + (size_t)c->n * 4)
		return 0;
	return c->out + (p->in - c->in) / 4 * c->cs == p->out;
}

/* m added to the n maps of a[] (cap of them) unless there; full: in place
 * of the smallest if m is larger (the whole copy's CAST outlives a
 * batch's) (caller holds lock) */
static void wc_map_add(struct cpu_wc_map *a, int *n, int cap, const struct cpu_wc_map *m)
{
	int k, small = 0;
	for (k = 0; k < *n; k++)
		if (a[k].in == m->in && a[k].out == m->out && a[k].n == m->n && a[k].cs == m->cs)
			return;
	if (*n < cap) {
		a[(*n)++] = *m;
		return;
	}
	for (k = 1; k < cap; k++)
		if (a[k].n < a[small].n)
			small = k;
	if (a[small].n < m->n)
		a[small] = *m;
}

/* the output of map c as a compute copy's range (caller holds lock) */
static void wc_map_copy(struct cpu_wcache *w, const struct cpu_wc_map *c)
{
	wc_range_add(w->rlo, w->rhi, &w->n_ranges, c->out, c->out + (size_t)c->n * c->cs);
}

/* pc, params and their compute copy written (by an optimizer, or the CAST
 * after it): its copy a range, and the whole copy's where a CAST seen
 * covers it (caller holds lock) */
static void wc_piece(struct cpu_wcache *w, const struct cpu_wc_map *pc)
{
	wc_map_copy(w, pc);
	wc_map_add(w->pieces, &w->n_pieces, CPU_WC_RANGES, pc);
	for (int k = 0; k < w->n_casts; k++)
		if (wc_covers(&w->casts[k], pc))
			wc_map_copy(w, &w->casts[k]);
}

/* the end of a tensor d at p */
static uintptr_t wc_end(const struct kiln_tensor_desc *d, const void *p)
{
	return (uintptr_t)p + (size_t)cpu_numel(d) * wc_esize(d->dtype);
}

/* An optimizer ran: its last output in bf16/f16 is the compute copy;
 * without one (AdamW with amsgrad, i[1]: its four outputs are f32 and
 * core/optim/fused.c CASTs the copy after it), its f32 params (out0) are
 * what that CAST copies from.  Only that case records the params: a CAST
 * of f32 weights elsewhere (a layer's into its workspace, which no write
 * marks stale) must not count as a compute copy. */
static void wc_optimizer_ran(struct cpu_wcache *w, const struct kiln_op *op,
			     const struct kiln_op_args *a)
{
	const int last = op->n_out - 1;
	if (op->n_out >= 2 && cpu_lowp(op->out[last].dtype) && a->out[last]) {
		const struct cpu_wc_map pc = { (uintptr_t)a->out[0], (uintptr_t)a->out[last],
					       cpu_numel(&op->out[last]),
					       wc_esize(op->out[last].dtype) };
		pthread_mutex_lock(&w->lock);
		if (a->out[0] && op->out[0].dtype == KILN_F32)
			wc_piece(w, &pc);
		else
			wc_map_copy(w, &pc);
		pthread_mutex_unlock(&w->lock);
	} else if (op->type == KILN_OP_ADAMW && op->i[1] && op->n_out >= 1 &&
		   op->out[0].dtype == KILN_F32 && a->out[0]) {
		pthread_mutex_lock(&w->lock);
		wc_range_add(w->mlo, w->mhi, &w->n_masters, (uintptr_t)a->out[0],
			     wc_end(&op->out[0], a->out[0]));
		pthread_mutex_unlock(&w->lock);
	}
}

/* A CAST ran: from f32 inside an optimizer's params into bf16/f16, its
 * output is (a slice of) the compute copy; one that covers an optimizer's
 * piece and its copy (wc_covers) is the whole copy.  Remembered, for the
 * pieces of optimizer runs to come. */
static void wc_cast_ran(struct cpu_wcache *w, const struct kiln_op *op,
			const struct kiln_op_args *a)
{
	if (op->n_in != 1 || op->n_out != 1 || op->in[0].dtype != KILN_F32 ||
	    !cpu_lowp(op->out[0].dtype) || !a->in[0] || !a->out[0])
		return;
	const uintptr_t lo = (uintptr_t)a->in[0], hi = wc_end(&op->in[0], a->in[0]);
	const struct cpu_wc_map c = { lo, (uintptr_t)a->out[0], cpu_numel(&op->in[0]),
				      wc_esize(op->out[0].dtype) };
	int k = 0;
	pthread_mutex_lock(&w->lock);
	while (k < w->n_masters && !(w->mlo[k] <= lo && hi <= w->mhi[k]))
		k++;
	if (k < w->n_masters) { /* (amsgrad's copy, a piece of it under ZeRO-1) */
		wc_piece(w, &c);
	} else {
		for (k = 0; k < w->n_pieces; k++)
			if (wc_covers(&c, &w->pieces[k])) {
				wc_map_copy(w, &c);
				break;
			}
	}
	wc_map_add(w->casts, &w->n_casts, CPU_WC_CASTS, &c);
	pthread_mutex_unlock(&w->lock);
}

void cpu_wc_ran(const struct cpu_plan *p, const struct kiln_op_args *a)
{
	struct cpu_wcache *w = wc_now();
	const struct kiln_op *op = &p->op;
	if (!w)
		return;
	for (int i = 0; i < op->n_out; i++)
		if (a->out[i])
			cpu_wc_wrote(a->out[i], (size_t)cpu_numel(&op->out[i]) *
						       wc_esize(op->out[i].dtype));
	const int t = op->type;
	if (t == KILN_OP_SGD || t == KILN_OP_ADAMW || t == KILN_OP_LAMB)
		wc_optimizer_ran(w, op, a);
	else if (t == KILN_OP_CAST)
		wc_cast_ran(w, op, a);
}

/* The entry of (src, n, dtype) when src lies in a compute copy (caller
 * holds lock); NULL: not a weight, or no room. */
static struct cpu_wc_entry *wc_entry(struct cpu_wcache *w, const void *src, int64_t n, int dtype)
{
	const uintptr_t s = (uintptr_t)src, e = s + (size_t)n * wc_esize(dtype);
	int k = 0;
	while (k < w->n_ranges && !(w->rlo[k] <= s && e <= w->rhi[k]))
		k++;
	if (k == w->n_ranges)
		return NULL;
	for (int i = 0; i < w->n; i++)
		if (w->e[i].src == src && w->e[i].n == n && w->e[i].dtype == dtype)
			return &w->e[i];
	if (w->n == CPU_WC_MAX)
		return NULL;
	struct cpu_wc_entry *x = &w->e[w->n++];
	*x = (struct cpu_wc_entry){ .src = src, .n = n, .dtype = dtype };
	uintptr_t lo = __atomic_load_n(&w->lo, __ATOMIC_RELAXED), hi = w->hi;
	if (!hi || s < lo)
		lo = s;
	if (e > hi)
		hi = e;
	__atomic_store_n(&w->lo, lo, __ATOMIC_RELEASE);
	__atomic_store_n(&w->hi, hi, __ATOMIC_RELEASE);
	return x;
}

const float *cpu_wc_get(struct cpu_wcache *w, const void *src, int dtype, int64_t n,
			unsigned *fill)
{
	const float *r = NULL;
	*fill = 0;
	if (!w || !src || !cpu_lowp(dtype) || !__atomic_load_n(&w->n_ranges, __ATOMIC_ACQUIRE))
		return NULL;
	pthread_mutex_lock(&w->lock);
	struct cpu_wc_entry *x = wc_entry(w, src, n, dtype);
	if (x && x->valid) {
		w->hits++;
		x->holders++;
		r = x->buf;
	} else if (x && !x->filling && !x->holders && (++x->reads >= 2 || x->buf)) {
		if (!x->buf && (x->buf = cpu_huge_alloc(64, (size_t)n * sizeof(float))))
			w->bytes += (size_t)n * sizeof(float);
		if (x->buf) { /* the caller widens (lowp.c, one region for all) */
			x->filling = 1;
			x->holders = 1;
			w->fills++;
			*fill = x->gen * 2u + 1u; /* odd: never 0 */
			r = x->buf;
		}
	}
	pthread_mutex_unlock(&w->lock);
	return r;
}

void cpu_wc_filled(struct cpu_wcache *w, const float *buf, unsigned ticket)
{
	if (!w || !ticket)
		return;
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->n; i++) {
		struct cpu_wc_entry *x = &w->e[i];
		if (x->buf != buf || !x->filling)
			continue;
		x->filling = 0;
		x->valid = x->gen * 2u + 1u == ticket; /* no write since the ticket */
		break;
	}
	pthread_mutex_unlock(&w->lock);
}

void cpu_wc_done(struct cpu_wcache *w, const float *buf)
{
	if (!w || !buf)
		return;
	pthread_mutex_lock(&w->lock);
	for (int i = 0; i < w->n; i++)
		if (w->e[i].buf == buf && w->e[i].holders > 0) {
			w->e[i].holders--;
			break;
		}
	pthread_mutex_unlock(&w->lock);
}
