/* core/memory.c - `kiln memory`: what a training run will allocate, from
 * the static plans alone, before any training (see kiln.h,
 * kiln_memory_report).  The same model, plans and buffers the trainer
 * builds; nothing is run.  kiln_summary_report builds its model the same
 * way. */
#include "data.h"
#include "graph.h"
#include "loader.h" /* kiln_loader_auto_max: workers = auto */
#include "pipeline.h"
#include "run_config.h"
#include "dist.h" /* kiln_dist_env_read: the ranks share the training set */
#include "../plugins/common/shm_room.h" /* the communicators' rule */
#include "../plugins/common/c_locale.h" /* common_strtod, common_c_numbers_begin */

#include <ctype.h>
#include <pthread.h> /* pthread_attr_getstacksize: auto_as_spare */
#include <stdint.h>  /* SIZE_MAX */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static double mib(size_t b)
{
	return (double)b / 1048576.0;
}

/* Bytes live at schedule position pos (p->sched[pos]: the forwards, then
 * the backwards and recomputations), without packing. */
static size_t live_at(const struct kiln_plan *p, int pos)
{
	size_t t = 0;
	for (int i = 0; i < p->n_store; i++)
		if (p->store[i].start <= pos && pos <= p->store[i].end)
			t += p->store[i].bytes;
	return t;
}

static size_t store_bytes(const struct kiln_plan *p, int s)
{
	return s >= 0 && s < p->n_store ? p->store[s].bytes : 0;
}

/* What every prediction of one config shares: the device, the data sets
 * (their sample shapes and sizes) and the model. */
struct mem_setup {
	const struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_dataset ds, es, vs; /* vs: [data.val], when the config has one */
	struct kiln_tensor_desc input;
	struct kiln_run_cfg run;
	struct kiln_train_cfg tc;
	struct kiln_data_cfg data;
	/* the launcher's ranks (1 without one): the data-parallel world,
	 * ZeRO-1's (0: off), whether the gradients will be in the
	 * communicator's shared memory and ZeRO-1's pieces in place in them
	 * (kiln_dist_comm_guess) */
	int64_t world, zero_world;
	int grads_shared, in_place;
	/* shared gradients /dev/shm has no room for (shm_no_room): the run
	 * keeps them in device memory; what it has and what they want */
	int shm_short;
	unsigned long long shm_have, shm_need;
	/* VmSize while the last prediction's plans were alive (kiln_vm):
	 * batch = auto's measure of the address space they take */
	size_t vm_plans;
};

static void setup_close(struct mem_setup *s)
{
	kiln_model_free(s->m);
	kiln_dataset_close(&s->vs);
	kiln_dataset_close(&s->es);
	kiln_dataset_close(&s->ds);
	kiln_device_close(s->dev);
}

/* [run] precision as training takes it (kiln_model_precision_open): the
 * compute dtype the plans' activations and the weights' compute copy are
 * in, and the loss scaler's state (before session 29 the prediction was
 * fp32's whatever the precision: batch = auto under bf16 planned past
 * memory_limit). */
static kiln_status precision_open(struct mem_setup *s, const struct kiln_registry *reg)
{
	void *stream = NULL;
	kiln_status st = kiln_device_stream_create(s->dev, &stream);
	if (!st)
		st = kiln_model_precision_open(s->m, reg, stream);
	if (stream)
		kiln_device_stream_destroy(s->dev, stream);
	return st;
}

/* The gradients in the communicator's shared memory need room in
 * /dev/shm for every rank's segment (kiln-gloo's and kiln-mpi's rule,
 * shm_room); without it the run keeps them in device memory (and logs
 * why), so the prediction does too, with a warning (before session 30
 * it counted them as shared, the total short by them). */
static void shm_no_room(struct mem_setup *s)
{
	const size_t seg = shm_segment_bytes(s->m->n_elems * sizeof(float));
	if (!s->grads_shared || shm_room(seg * (size_t)s->world, &s->shm_have, &s->shm_need))
		return;
	s->grads_shared = 0;
	s->shm_short = 1;
	kiln_log(KILN_LOG_WARN, "memory", "/dev/shm has %llu MiB free, %llu MiB wanted for the gradients in the communicator's shared memory (%lld ranks' and 64 MiB to spare): the run will keep them in device memory, and they are counted there",
		 s->shm_have >> 20, s->shm_need >> 20, (long long)s->world);
}

/* The setup of a model built as training builds it.  eval: open the
 * evaluation set too, when [train] eval is on (the memory its loader
 * holds counts; `kiln summary`, which needs only the input's shape, does
 * not open it, so a config whose evaluation data is elsewhere or absent
 * still has a summary). */
static kiln_status setup_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      int eval, struct mem_setup *s)
{
	kiln_status st;
	memset(s, 0, sizeof *s);
	s->cfg = cfg;
	if ((st = kiln_run_cfg_read(cfg, &s->run)) || (st = kiln_train_cfg_fill(cfg, NULL, &s->tc)) ||
	    (st = kiln_data_cfg_read(cfg, &s->data)))
		return st;
	if ((st = kiln_device_open(reg, cfg, s->run.device, 0, &s->dev)) ||
	    (st = kiln_dataset_open(cfg, reg, "data", "train", 1, &s->ds)) ||
	    (eval && s->tc.eval && (st = kiln_dataset_open(cfg, reg, "data.eval", "test", 0, &s->es))))
		goto fail;
	/* [data.val], which the trainer opens beside them (train_setup.c):
	 * its cache counts (session 37's review: 8.6 MB of a 44.6 MB peak) */
	int have_val = 0;
	for (int i = 0; eval && s->tc.eval && kiln_config_section(cfg, i); i++)
		have_val |= !strcmp(kiln_config_section(cfg, i), "data.val");
	if (have_val && (st = kiln_dataset_open(cfg, reg, "data.val", "val", 0, &s->vs)))
		goto fail;
	kiln_dataset_input_desc(&s->ds, &s->input);
	if ((st = kiln_model_create(cfg, reg, s->dev, &s->input, &s->m)) ||
	    (st = precision_open(s, reg)))
		goto fail;
	struct kiln_dist_env env;
	int64_t zero = 0, P = 1;
	if (kiln_dist_env_read(&env))
		env.world = 1;
	s->world = env.world;
	kiln_dist_comm_guess(cfg, reg, s->dev, &env, &s->grads_shared, &s->in_place);
	shm_no_room(s);
	kiln_config_get_int(cfg, "dist", "zero", &zero);
	kiln_config_get_int(cfg, "dist", "pipeline", &P);
	s->zero_world = s->world > 1 && zero == 1 && P <= 1 ? s->world : 0;
	return KILN_OK;
fail:
	setup_close(s);
	return st;
}

static kiln_status predict(struct mem_setup *s, int64_t B, FILE *f, struct kiln_memory *out);

/* The host memory the trainer itself holds besides the loaders' rings
 * (core/train_buffers.c, trainer_open): its two host input slots (x_host, y_host:
 * `rows` samples and labels each, from kiln_device_host_alloc, which the
 * CPU device commits like any allocation, whether or not a loader fills
 * them), the epoch's permutation and order (perm, order: an int64 per
 * training sample) and, with a loader, the evaluation order (eval_order). */
static size_t trainer_host_bytes(const struct kiln_dataset *ds, const struct kiln_dataset *es,
				 const struct kiln_dataset *vs, int64_t rows, int eval_order)
{
	/* (the evaluation order serves [data.eval] and [data.val]: the
	 * larger's length, train_setup.c open_loaders) */
	const int64_t n_order = vs->len > es->len ? vs->len : es->len;
	return 2 * (size_t)rows * (ds->sample_bytes + ds->label_bytes) +
	       2 * (size_t)ds->len * sizeof(int64_t) +
	       (eval_order ? (size_t)n_order * sizeof(int64_t) : 0);
}

/* A decimal number (digits, at most one '.', a digit on one side of it)
 * at s: its length, 0 when there is none.  No sign, exponent, hex, inf or
 * nan (strtod's). */
static size_t decimal_len(const char *s)
{
	size_t n = 0, digits = 0;
	while (isdigit((unsigned char)s[n]))
		n++, digits++;
	if (s[n] == '.')
		for (n++; isdigit((unsigned char)s[n]); n++)
			digits++;
	return digits ? n : 0;
}

kiln_status kiln_parse_size(const char *s, size_t *out)
{
	if (!s || !out)
		return kiln_null_arg("kiln_parse_size", !s ? "s" : "out");
	const char *p = s;
	while (isspace((unsigned char)*p))
		p++;
	const size_t n = decimal_len(p);
	if (!n)
		return KILN_EINVAL;
	const double v = common_strtod(p, NULL); /* what decimal_len took, nothing more */
	const char *end = p + n;
	double mult = 1;
	switch (*end) {
	case 'k': case 'K': mult = 1024.0; end++; break;
	case 'm': case 'M': mult = 1048576.0; end++; break;
	case 'g': case 'G': mult = 1073741824.0; end++; break;
	case 't': case 'T': mult = 1099511627776.0; end++; break;
	default: break;
	}
	if (mult > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	while (isspace((unsigned char)*end))
		end++;
	if (*end || v * mult >= 1.8e19)
		return KILN_EINVAL;
	*out = (size_t)(v * mult);
	return KILN_OK;
}

/* Whether batch = auto counts host memory too: on a device whose memory
 * is the host's (the CPU), measured against what it reports free (not a
 * [run] memory_limit, which bounds the device total only: docs/memory.md). */
static int auto_counts_host(const struct mem_setup *s)
{
	return !s->run.memory_limit_bytes && (kiln_device_traits(s->dev)->caps & KILN_DEVICE_HOST_MEMORY);
}

/* What batch = auto fits in the limit: the device total and, where
 * auto_counts_host, the host staging and the library memory, which take
 * the same RAM: what the process's resident memory grew since rss0 (the
 * search's start: the predictions' library objects stay, and the free
 * memory was read before them), with a margin of 1/16.  Before session 31
 * they were left out,
 * and a batch whose device memory alone filled MemAvailable (or a
 * cgroup's room) was OOM-killed. */
static size_t auto_fit_bytes(const struct mem_setup *s, const struct kiln_memory *mem, size_t rss0)
{
	size_t rss = 0;
	if (!auto_counts_host(s))
		return mem->total;
	kiln_rss(&rss, NULL, 0);
	/* and 1/16 more: what no prediction holds (another thread team's
	 * oneDNN plans, the page cache the data sets read through); the run
	 * in a 400M cgroup peaked within 10 MB of its limit without it */
	const size_t need = mem->total + mem->host + mem->cache + (rss > rss0 ? rss - rss0 : 0);
	return need + need / 16;
}

/* batch = auto's step: lcm(8, micro_batches), so that the micro-batches
 * divide the batch chosen. */
static int64_t auto_batch_step(int64_t M)
{
	int64_t a = 8, b = M < 1 ? 1 : M;
	while (b) {
		const int64_t t = a % b;
		a = b, b = t;
	}
	return 8 / a * (M < 1 ? 1 : M);
}

/* batch = auto's budgets, read at the search's start (before its
 * predictions' library objects and the thread team they start). */
struct auto_room {
	size_t limit; /* [run] memory_limit, or what the device reports free */
	size_t rss0;  /* VmRSS then */
	/* under RLIMIT_AS, on a device whose memory is the host's (with or
	 * without a memory_limit): the address space the
	 * limit leaves then (SIZE_MAX: no such limit), VmSize then, the
	 * limit, and the stacks of the threads a run starts after its plans
	 * (auto_as_stacks) */
	size_t as_room, vm0, as_limit, stacks;
};

/* The address space the CPU device keeps free for JIT code while it makes
 * a oneDNN primitive (plugins/cpu/dnn.c, CPU_JIT_ROOM). */
#define AUTO_AS_JIT ((size_t)16 << 20)

/* The stacks of the threads a training run starts after its plans, which
 * no prediction sees: each loader's workers, and two more (an
 * asynchronous device's stream workers, the run's clock); a pthread's
 * default stack each (8 MiB under the usual ulimit -s). */
static size_t auto_as_stacks(const struct mem_setup *s)
{
	size_t stack = (size_t)8 << 20;
	pthread_attr_t a;
	if (!pthread_attr_init(&a)) {
		if (pthread_attr_getstacksize(&a, &stack))
			stack = (size_t)8 << 20;
		pthread_attr_destroy(&a);
	}
	const int workers = s->data.workers < 0 ? kiln_loader_auto_max() : s->data.workers;
	const int loaders = 1 + (s->tc.eval && s->es.len > 0) + (s->tc.eval && s->vs.len > 0);
	return (size_t)(workers * loaders + 2) * stack;
}

static kiln_status auto_room_read(struct mem_setup *s, struct auto_room *r)
{
	memset(r, 0, sizeof *r);
	r->limit = s->run.memory_limit_bytes; /* kiln_run_cfg_read's */
	size_t total = 0;
	kiln_status st;
	if (!r->limit && (st = kiln_device_mem_info(s->dev, &r->limit, &total)))
		return st;
	kiln_rss(&r->rss0, NULL, 0);
	kiln_vm(&r->vm0, &r->as_limit);
	r->as_room = SIZE_MAX;
	/* the address space on a device whose memory is the host's, with a
	 * memory_limit too (before session 41 not: under ulimit -v 800000 a
	 * memory_limit of 2G chose the wide CNN's batch 4560, whose 1.97 GiB
	 * of activations then failed to allocate) */
	if ((kiln_device_traits(s->dev)->caps & KILN_DEVICE_HOST_MEMORY) &&
	    r->as_limit != SIZE_MAX) {
		r->as_room = r->as_limit > r->vm0 ? r->as_limit - r->vm0 : 0;
		r->stacks = auto_as_stacks(s);
		if (s->run.memory_limit_bytes && r->as_room < r->limit)
			kiln_log(KILN_LOG_WARN, "train",
				 "%s: [run] memory_limit = %s (%.1f MiB) is more than the %.1f MiB of address space RLIMIT_AS (ulimit -v) leaves: [train] batch = auto fits the smaller (docs/memory.md, \"Under ulimit -v\")",
				 kiln_config_where(s->cfg, "run", "memory_limit"), s->run.memory_limit,
				 (double)r->limit / 1048576.0, (double)r->as_room / 1048576.0);
	}
	return KILN_OK;
}

/* Whether prediction mem fits r: its need (auto_fit_bytes) in the free
 * memory, and under RLIMIT_AS its address space in what the limit left:
 * the device total, what VmSize grew since the search's start (the thread
 * team, and the library objects and JIT code of the plans being made,
 * which VmRSS counts only as far as touched), and what the run takes
 * after its plans (host staging, data cache, auto_as_stacks), at least
 * the JIT room its primitives were made in (AUTO_AS_JIT), with a margin of
 * 1/16.  *need, *of: the need and the budget of the tighter of the two
 * (*as_bound: the address space).  Before session 40 the address space
 * was not counted: under ulimit -v the search itself filled it (oneDNN's
 * primitive cache kept every prediction's JIT code; SIGSEGV in oneDNN) or
 * chose a batch whose allocations then failed. */
static int auto_fits(const struct mem_setup *s, const struct kiln_memory *mem,
		     const struct auto_room *r, size_t *need, size_t *of, int *as_bound)
{
	const size_t fit = auto_fit_bytes(s, mem, r->rss0);
	*need = fit, *of = r->limit, *as_bound = 0;
	if (r->as_room == SIZE_MAX)
		return fit <= r->limit;
	const size_t later = mem->host + mem->cache + r->stacks;
	size_t as = mem->total + (s->vm_plans > r->vm0 ? s->vm_plans - r->vm0 : 0) +
		    (later > AUTO_AS_JIT ? later : AUTO_AS_JIT);
	as += as / 16;
	if (!r->as_room || (double)as / (double)r->as_room > (double)fit / (double)r->limit)
		*need = as, *of = r->as_room, *as_bound = 1;
	return fit <= r->limit && as <= r->as_room;
}

/* The least address space any batch needs beyond the device total and
 * VmSize's growth (auto_fits). */
static size_t auto_as_floor(const struct auto_room *r)
{
	return r->stacks > AUTO_AS_JIT ? r->stacks : AUTO_AS_JIT;
}

/* Whether another prediction may be made: under RLIMIT_AS, with
 * auto_as_floor left (a prediction makes its plans' library objects and
 * JIT code; before session 40 they filled the address space and oneDNN
 * crashed), else no batch could fit anyway. */
static int auto_room_to_predict(const struct auto_room *r)
{
	size_t vm = 0;
	if (r->as_room == SIZE_MAX)
		return 1;
	kiln_vm(&vm, NULL);
	return vm < r->as_limit && r->as_limit - vm >= auto_as_floor(r);
}

/* The error of a search where no batch fits r (need: the smallest
 * batch's, 0 when it was not predicted). */
static kiln_status auto_none_fits(const struct mem_setup *s, const struct auto_room *r, int64_t q,
				  size_t need, size_t of, int as_bound)
{
	const char *where = kiln_config_where(s->cfg, "train", "batch");
	if (!need)
		return kiln_error(KILN_ENOMEM, "%s: [train] batch = auto: RLIMIT_AS (ulimit -v) leaves %.1f MiB of address space, less than the %.1f MiB kept free for JIT code or the stacks of the run's threads; raise the limit",
				  where, (double)r->as_room / 1048576.0,
				  (double)auto_as_floor(r) / 1048576.0);
	return kiln_error(KILN_ENOMEM, "%s: [train] batch = auto: batch %lld needs %.1f MiB, more than the %.1f MiB %s",
			  where, (long long)q, (double)need / 1048576.0, (double)of / 1048576.0,
			  as_bound ? "of address space RLIMIT_AS (ulimit -v) leaves (with the stacks of the run's threads and JIT code)"
			  : *s->run.memory_limit ? "of [run] memory_limit" : "the device has free");
}

/* batch = auto: the largest multiple of lcm(8, micro_batches) (at most the
 * training set) whose prediction fits (auto_fits); double while it fits,
 * then bisect (the prediction grows with the batch).  Logged. */
static kiln_status auto_batch(struct mem_setup *s, int64_t *batch)
{
	const struct kiln_config *cfg = s->cfg;
	const char *lim = s->run.memory_limit;
	struct kiln_memory mem;
	struct auto_room r;
	kiln_status st;
	if ((st = auto_room_read(s, &r)))
		return st;
	/* a rank's batch: the data-parallel ranks (the world over [dist]
	 * pipeline) and accumulate take their share of the training set */
	int64_t acc = 1, P = 1, M = 1;
	kiln_config_get_int(cfg, "train", "accumulate", &acc);
	kiln_config_get_int(cfg, "dist", "pipeline", &P);
	kiln_config_get_int(cfg, "pipeline", "micro_batches", &M);
	int64_t D = s->world / (P > 0 ? P : 1);
	D = D < 1 ? 1 : D;
	acc = acc < 1 ? 1 : acc;
	/* the step: a multiple of 8 that [pipeline] micro_batches divides
	 * (before session 38 micro_batches = 3 chose 256 and was refused) */
	const int64_t q = auto_batch_step(M);
	const int64_t most = s->ds.len / (D * acc) / q * q;
	if (most < q)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch = auto: the training set has %lld samples, fewer than %lld (a multiple of 8 and of [pipeline] micro_batches = %lld) a rank's batch for %lld data-parallel rank(s) x accumulate %lld",
				  kiln_config_where(cfg, "train", "batch"), (long long)s->ds.len,
				  (long long)q, (long long)M, (long long)D, (long long)acc);
	int64_t lo = 0, hi = q; /* lo fits (0: none yet), hi does not or is past `most` */
	size_t fit = 0, of = r.limit, lo_bytes = 0, lo_of = r.limit;
	int as_bound = 0, lo_as = 0;
	for (;;) {
		if (!auto_room_to_predict(&r))
			break;
		if ((st = predict(s, hi, NULL, &mem)))
			return st;
		if (!auto_fits(s, &mem, &r, &fit, &of, &as_bound))
			break;
		lo = hi, lo_bytes = fit, lo_of = of, lo_as = as_bound;
		if (hi == most)
			break;
		hi = hi * 2 > most ? most : hi * 2;
	}
	if (!lo)
		return auto_none_fits(s, &r, q, fit, of, as_bound);
	while (hi != lo && hi - lo > q && auto_room_to_predict(&r)) {
		int64_t mid = (lo + hi) / 2 / q * q;
		if ((st = predict(s, mid, NULL, &mem)))
			return st;
		if (auto_fits(s, &mem, &r, &fit, &of, &as_bound))
			lo = mid, lo_bytes = fit, lo_of = of, lo_as = as_bound;
		else
			hi = mid;
	}
	kiln_log(KILN_LOG_INFO, "train",
		 "batch = auto: %lld, predicted to need %.1f MiB%s of the %.1f MiB %s", (long long)lo,
		 (double)lo_bytes / 1048576.0,
		 lo_as ? " (device, host staging, library, and the stacks of the run's threads and JIT code)"
		 : auto_counts_host(s) ? " (device, host staging and library: the same memory)" : "",
		 (double)lo_of / 1048576.0,
		 lo_as ? "of address space RLIMIT_AS (ulimit -v) leaves"
		 : *lim ? "[run] memory_limit" : "the device reports free");
	*batch = lo;
	return KILN_OK;
}

kiln_status kiln_memory_auto_batch(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   int64_t *batch)
{
	struct mem_setup s;
	kiln_status st = setup_open(cfg, reg, 1, &s);
	if (st) /* (closed what it opened; before session 40 closed twice:
		 * SIGSEGV where a data set failed to open under ulimit -v) */
		return st;
	st = auto_batch(&s, batch);
	setup_close(&s);
	return st;
}

/* kiln_memory_report into the library's own struct (out: whole). */
static kiln_status memory_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
				 FILE *f, struct kiln_memory *out)
{
	if (!cfg || !reg || !out)
		return kiln_null_arg("kiln_memory_report", !cfg ? "cfg" : !reg ? "reg" : "out");
	struct mem_setup s;
	int64_t B = 0;
	kiln_status st;
	if ((st = setup_open(cfg, reg, 1, &s)))
		return st;
	if (s.tc.batch_auto)
		st = auto_batch(&s, &B);
	else
		B = s.tc.batch;
	if (!st) { /* the table in the C locale, whatever the application's */
		const locale_t old = common_c_numbers_begin();
		st = predict(&s, B, f, out);
		common_c_numbers_end(old);
	}
	setup_close(&s);
	return st;
}

/* Into a report of this library's size, copied into the caller's as far
 * as its size goes (kiln/kiln.h, "Structs the library fills"). */
kiln_status kiln_memory_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
			       FILE *f, struct kiln_memory *out)
{
	struct kiln_memory full = { 0 };
	kiln_status st = kiln_sized_check(out, "kiln_memory_report", "kiln_memory", "KILN_MEMORY_INIT");
	if (st)
		return st;
	st = memory_report(cfg, reg, f, &full);
	kiln_sized_out(out, &full, sizeof full);
	return st;
}

/* What the report says of the model's state beyond its totals. */
struct mem_parts {
	size_t pf32;    /* the f32 parameters (params less the compute copy) */
	size_t pcopy;   /* [run] precision's compute copy of them (bf16, f16) */
	size_t zpieces; /* ZeRO-1: the gradient pieces reduce-scattered here */
	size_t shared;  /* gradients in the communicator's shared memory */
	int second;     /* accumulate: a second gradient buffer */
};

/* The model's buffers: parameters (and their compute copy), gradients,
 * optimizer state (ZeRO-1: this rank's shard), batchnorm buffers. */
static void model_state_bytes(const struct mem_setup *s, struct kiln_memory *out,
			      struct mem_parts *pt)
{
	struct kiln_model *m = s->m;
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	for (int i = 0; i < nb; i++) {
		if (!strcmp(sb[i].name, "params"))
			out->params = sb[i].bytes;
		else if (!strcmp(sb[i].name, "buffers"))
			out->buffers = sb[i].bytes;
		else if (!strncmp(sb[i].name, "optim.", 6) && strcmp(sb[i].name, "optim.step"))
			out->optim_state += sb[i].bytes;
	}
	pt->pcopy = m->cdtype != KILN_F32 && m->params_c ? m->n_elems * kiln_dtype_size(m->cdtype) : 0;
	pt->pf32 = out->params;
	out->params += pt->pcopy;
	/* ZeRO-1: a rank's shard of the state, and the pieces of the
	 * gradients reduce-scattered to it, unless they stay in the
	 * gradients (core/dist_zero.c) */
	if (s->zero_world) {
		const size_t W = (size_t)s->zero_world, zt = kiln_dist_zero_tail(m->n_trainable, W);
		out->optim_state = (size_t)m->state_slots * ((m->n_trainable - zt) / W + zt) *
				   sizeof(float);
		pt->zpieces = s->in_place ? 0 : (m->n_trainable - zt) / W;
	}
	/* (and the tied weights' other users' gradients, core/tie.c) */
	/* (a second buffer only where a layer cannot add in its own ops) */
	/* (in the communicator's shared memory: host memory, not the
	 * device's, kiln_dist_share_grads) */
	pt->second = s->tc.accumulate > 1 && !kiln_model_grad_accum_ok(m);
	pt->shared = s->grads_shared ? m->n_elems * sizeof(float) : 0;
	out->grads = (m->n_elems * (pt->second ? 2 : 1) + m->n_tie_elems + pt->zpieces) *
			     sizeof(float) - pt->shared;
}

/* The plans' arenas and workspaces, and where the training plan's
 * activations peak. */
static void plan_bytes(const struct kiln_plan *ptrain, const struct kiln_plan *peval,
		       const struct kiln_plan *prem, struct kiln_memory *out)
{
	out->activations = ptrain->arena_bytes;
	out->recompute_segments = ptrain->n_segments;
	out->recomputed = ptrain->n_recomputed;
	out->activations_unpacked = kiln_plan_naive_bytes(ptrain);
	out->workspace = ptrain->ws_bytes;
	out->eval = peval ? peval->arena_bytes + peval->ws_bytes : 0;
	if (prem)
		out->eval += prem->arena_bytes + prem->ws_bytes;
	for (int pos = 0; pos < ptrain->n_pos; pos++) {
		size_t live = live_at(ptrain, pos);
		if (live > out->peak_live) {
			out->peak_live = live;
			out->peak_layer = ptrain->sched[pos].layer;
			out->peak_pass = ptrain->sched[pos].kind;
		}
	}
}

/* The gradients' block sums (core/train_gradsums.c; a few KiB) where
 * the trainer takes them: the check runs and kiln_grad_sums_why_not has
 * no objection (before session 44's review counted wherever the check
 * ran: fp16, accumulate, DDP, ZeRO-1, pipeline and CUDA too). */
static size_t grad_sums_bytes(const struct mem_setup *s)
{
	int pipe = 0;
	if (!(s->tc.skip_nonfinite || s->tc.clip_norm > 0 || s->tc.clip_value > 0))
		return 0;
	if (kiln_pipe_wanted(s->cfg, s->m, &pipe)) { /* (said by the pipeline's print) */
		kiln_clear_error();
		return 0;
	}
	if (kiln_grad_sums_why_not(s->m, s->world > 1, pipe, s->tc.accumulate))
		return 0;
	return (s->m->n_trainable + 1023) / 1024 * sizeof(float);
}

/* The optimizer's extras, the device input slots, and the host side:
 * the loaders' staging rings and the trainer's host slots and orders
 * (and the shared gradients). */
static void io_bytes(const struct mem_setup *s, int64_t B, int64_t EB, size_t shared,
		     struct kiln_memory *out)
{
	const struct kiln_model *m = s->m;
	const struct kiln_dataset *ds = &s->ds, *es = &s->es, *vs = &s->vs;
	const int do_eval = s->tc.eval;
	/* the optimizer's extras (no_decay multiplier, LAMB's offsets and
	 * workspace) and the small device scalars (step counters, lr, metrics,
	 * the clip state, the parameters' finite check, with accumulation the
	 * loss seed: 64 bytes each) */
	out->other = (m->wd_groups ? m->n_trainable * sizeof(float) : 0) +
		     (m->offsets_d ? (size_t)(m->n_tensors + 1) * sizeof(int64_t) : 0) +
		     m->optim_ws_bytes + (s->tc.accumulate > 1 ? 8 : 7) * 64 + grad_sums_bytes(s);
	/* the trainer's two device input slots (samples and labels), and the
	 * f32 input the device widens u8/bf16 samples into: rows of the
	 * larger batch that will run (core/train_buffers.c alloc_buffers;
	 * eval_batch only with [train] eval on: before session 41 counted
	 * with eval = 0 too, which over-counted kiln memory and batch = auto) */
	int64_t rows = do_eval && EB > B ? EB : B;
	out->inputs = 2 * (size_t)rows * (ds->sample_bytes + ds->label_bytes);
	if (kiln_dataset_widened(ds))
		out->inputs += (size_t)rows * kiln_tensor_bytes(&s->input);
	/* the loaders' staging rings: workers + prefetch slots of a batch of
	 * samples and labels, for training and evaluation (workers = auto:
	 * the most the probe may choose, kiln_loader_auto_max; before session
	 * 37 every online CPU: 36 of a 36-CPU machine, where the probe tries
	 * 32 at most, and CPUs outside the affinity mask; 0: no loader) */
	int workers = s->data.workers;
	const int64_t prefetch = s->data.prefetch;
	if (workers < 0)
		workers = kiln_loader_auto_max();
	if (workers > 0)
		out->host = (size_t)(workers + prefetch) *
			    ((size_t)B * (ds->sample_bytes + ds->label_bytes) +
			     (do_eval ? (size_t)EB * (es->sample_bytes + es->label_bytes +
						      vs->sample_bytes + vs->label_bytes) : 0));
	out->host += trainer_host_bytes(ds, es, vs, rows, do_eval && workers > 0) + shared;
	/* [data] cache = ram, full after the first epoch (the evaluation
	 * set's after the first evaluation); before session 37 left out, the
	 * folder example's 60 MB of a 102 MB peak */
	out->cache = kiln_dataset_cache_bytes(&s->ds) +
		     (do_eval ? kiln_dataset_cache_bytes(&s->es) + kiln_dataset_cache_bytes(&s->vs) : 0);
}

/* The report of out to f: the totals, then each layer's tensors (and each
 * pipeline stage's, when the model has stages). */
static kiln_status print_report(const struct mem_setup *s, const struct kiln_plan *ptrain,
				int64_t B, int64_t EB, const struct mem_parts *pt,
				const struct kiln_memory *out, FILE *f)
{
	static const char *const pass_name[] = { "forward", "recomputation", "backward" };
	struct kiln_model *m = s->m;
	fprintf(f, "memory of a training run, batch %lld%s (device %s), before any step:\n",
		(long long)B, s->tc.accumulate > 1 ? " per micro-step" : "", s->run.device);
	fprintf(f, "  %-22s %10.2f MiB  %zu floats", "parameters", mib(out->params), pt->pf32 / 4);
	if (pt->pcopy)
		fprintf(f, " (and their %s compute copy, %.2f MiB)", kiln_dtype_name(m->cdtype),
			mib(pt->pcopy));
	fputc('\n', f);
	fprintf(f, "  %-22s %10.2f MiB%s%s%s", "gradients", mib(out->grads),
		pt->second ? "  (and the accumulation buffer)" : "",
		m->n_tie_elems ? "  (and the tied weights' other users')" : "",
		pt->zpieces ? "  (ZeRO-1: the pieces reduce-scattered to this rank)" : "");
	if (pt->shared)
		fprintf(f, "  (%.2f MiB in the communicator's shared memory: host staging)",
			mib(pt->shared));
	if (s->shm_short)
		fprintf(f, "  (not in the communicator's shared memory: /dev/shm has %llu MiB free, %llu MiB wanted)",
			s->shm_have >> 20, s->shm_need >> 20);
	fprintf(f, "\n  %-22s %10.2f MiB  [train] optimizer = %s", "optimizer state",
		mib(out->optim_state), s->tc.optimizer);
	if (s->zero_world)
		fprintf(f, "  (ZeRO-1: this rank's shard of %lld ranks')", (long long)s->zero_world);
	fprintf(f, "\n");
	fprintf(f, "  %-22s %10.2f MiB\n", "buffers (batchnorm)", mib(out->buffers));
	fprintf(f, "  %-22s %10.2f MiB  packed by lifetime (%.2f MiB without packing)\n",
		"activations", mib(out->activations), mib(out->activations_unpacked));
	if (out->recompute_segments || out->recomputed)
		fprintf(f, "  %-22s %10s      %d segments, %d layers' outputs recomputed in the backward\n",
			"  recompute", "", out->recompute_segments, out->recomputed);
	fprintf(f, "  %-22s %10.2f MiB\n", "workspace", mib(out->workspace));
	if (s->tc.eval)
		fprintf(f, "  %-22s %10.2f MiB  batch %lld, no backward\n", "evaluation plan",
			mib(out->eval), (long long)EB);
	else
		fprintf(f, "  %-22s %10.2f MiB  none: [train] eval = 0\n", "evaluation plan",
			mib(out->eval));
	fprintf(f, "  %-22s %10.2f MiB  2 slots of samples and labels\n", "input buffers",
		mib(out->inputs));
	fprintf(f, "  %-22s %10.2f MiB  optimizer extras, counters, lr, metrics\n", "other",
		mib(out->other));
	fprintf(f, "  %-22s %10.2f MiB\n", "total", mib(out->total));
	fprintf(f, "  %-22s %10.2f MiB  the loaders' pinned staging, the trainer's host slots and sample orders%s (host memory)\n",
		"host staging", mib(out->host), pt->shared ? ", the shared gradients" : "");
	fprintf(f, "  %-22s %10.2f MiB  library objects (host memory; measured while planning)\n",
		"device library", mib(out->library));
	if (out->cache)
		fprintf(f, "  %-22s %10.2f MiB  [data] cache = ram: %lld decoded images%s, full after the first epoch (host memory)\n",
			"data cache", mib(out->cache),
			(long long)s->ds.len + (s->es.cached ? s->es.len : 0) + (s->vs.cached ? s->vs.len : 0),
			s->es.cached || s->vs.cached ? " of the training and evaluation sets" : "");
	fprintf(f, "  activations peak at the %s of layer '%s': %.2f MiB live\n",
		pass_name[out->peak_pass], m->layers[out->peak_layer].name, mib(out->peak_live));
	fprintf(f, "\n  %-16s %-14s %12s %12s %12s\n", "layer", "type", "output MiB", "saved MiB",
		"grad MiB");
	for (int i = 0; i < m->n_layers; i++) {
		const struct plan_node *nd = &ptrain->nodes[i];
		size_t y = nd->l.is_view ? 0 : store_bytes(ptrain, nd->ystore);
		fprintf(f, "  %-16s %-14s %12.3f %12.3f %12.3f%s%s\n", m->layers[i].name,
			m->layers[i].type->name, mib(y), mib(store_bytes(ptrain, nd->sstore)),
			mib(store_bytes(ptrain, nd->gstore)), nd->l.is_view ? "  (view)" : "",
			nd->trig >= 0 ? "  recomputed" : "");
	}
	int pipe = 0;
	kiln_status st = kiln_pipe_wanted(m->cfg, m, &pipe);
	if (!st && m->n_stages > 1)
		st = kiln_pipe_memory_print(m, B, f);
	return st;
}

/* The prediction for batch B (plans laid out, nothing allocated for
 * them), printed to f when f is not NULL. */
static kiln_status predict(struct mem_setup *s, int64_t B, FILE *f, struct kiln_memory *out)
{
	struct kiln_model *m = s->m;
	struct kiln_plan *ptrain = NULL, *peval = NULL, *prem = NULL;
	int64_t EB = s->tc.eval_batch ? s->tc.eval_batch : B;
	const int do_eval = s->tc.eval;
	const struct kiln_dataset *es = &s->es;
	struct mem_parts pt = { 0 };
	kiln_status st;
	struct kiln_plan_opts train = { .training = 1, .dry = 1 }, eval = { .dry = 1 };

	memset(out, 0, sizeof *out);
	/* evaluation: the trainer's plan of eval_batch (at most the data) and
	 * the remainder's */
	if (do_eval && EB > es->len)
		EB = es->len;
	size_t rss0, rss1;
	kiln_rss(&rss0, NULL, 0);
	if ((st = kiln_model_plan_ex(m, B, &train, &ptrain)) ||
	    (do_eval && (st = kiln_model_plan_ex(m, EB, &eval, &peval))) ||
	    (do_eval && es->len % EB && (st = kiln_model_plan_ex(m, es->len % EB, &eval, &prem))))
		goto out;
	kiln_rss(&rss1, NULL, 0);
	kiln_vm(&s->vm_plans, NULL);
	out->library = rss1 > rss0 ? rss1 - rss0 : 0;
	out->batch = B;
	model_state_bytes(s, out, &pt);
	plan_bytes(ptrain, peval, prem, out);
	io_bytes(s, B, EB, pt.shared, out);
	out->total = out->params + out->grads + out->optim_state + out->buffers + out->activations +
		     out->workspace + out->eval + out->inputs + out->other;
	if (f)
		st = print_report(s, ptrain, B, EB, &pt, out, f);
out:
	kiln_plan_free(ptrain);
	kiln_plan_free(peval);
	kiln_plan_free(prem);
	return st;
}

/* `kiln summary`: the same model as `kiln memory` builds (summary.c
 * counts and prints). */
kiln_status kiln_summary_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
				int64_t batch, FILE *f, struct kiln_summary *out)
{
	if (!cfg || !reg || !out)
		return kiln_null_arg("kiln_summary_report", !cfg ? "cfg" : !reg ? "reg" : "out");
	struct mem_setup s;
	kiln_status st;
	memset(out, 0, sizeof *out);
	if ((st = setup_open(cfg, reg, 0, &s)))
		return st;
	st = kiln_model_summary(s.m, batch > 0 ? batch : 1, out);
	if (!st && f)
		kiln_summary_print(out, f);
	setup_close(&s);
	return st;
}
