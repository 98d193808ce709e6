/* core/device.c - the core's wrapper of a device plugin: defaults for
 * optional members, argument checks, the sync/copy counters tests use
 * to prove a training step never waits on the host, and the profiler's
 * timing of runs and copies (core/profile.h). */
#include "profile.h"

#include <kiln/dist.h> /* kiln_dist_env_read: the options' ranks */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h> /* snprintf */

struct kiln_device {
	const struct kiln_plugin *plugin;
	const struct kiln_device_ops *ops;
	void *ctx;
	atomic_uint_fast64_t host_syncs, d2h, allocs, runs, staging, replays;
	int capturing; /* between capture_begin and capture_end */
	struct kiln_profile *prof; /* NULL unless profiling: one test per run */
	/* device bytes live and their peak, counted here at the wrapper (the
	 * device's own figure, independent of the planner): pointer -> size in
	 * an open-addressing table under a lock */
	pthread_mutex_t mem_lock;
	size_t live, peak;
	struct { void *p; size_t n; } *sizes;
	size_t cap, used;
	/* FLOP counting (kiln_model_summary): while flops_rec, every plan
	 * prepared is noted with its op's FLOPs; while flops_acc is set, runs
	 * and copies do nothing but add a noted plan's FLOPs to *flops_acc */
	int flops_rec, flops_n, flops_cap;
	struct flops_entry { void *plan; double flops; } *flops_tab;
	double *flops_acc;
	int layout_only; /* kiln_device_layout_only: prepare nothing */
	uintptr_t tokens; /* the layout-only plans handed out (layout_token) */
	int threads; /* [run] threads as opened (0: one per CPU of the mask) */
	int alone;   /* one process (ranks 1) and one instance (peers 1) */
};

static size_t mem_hash(const void *p, size_t cap)
{
	return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

/* Record (n > 0) or forget (n == 0) the size of p. */
static void mem_note(struct kiln_device *dev, void *p, size_t n)
{
	pthread_mutex_lock(&dev->mem_lock);
	if (n && 2 * (dev->used + 1) > dev->cap) {
		size_t nc = dev->cap ? 2 * dev->cap : 256;
		void *ns = calloc(nc, sizeof *dev->sizes);
		if (ns) {
			__typeof__(dev->sizes) old = dev->sizes;
			size_t oc = dev->cap;
			dev->sizes = ns;
			dev->cap = nc;
			for (size_t i = 0; i < oc; i++)
				if (old[i].p) {
					size_t h = mem_hash(old[i].p, nc);
					while (dev->sizes[h].p)
						h = (h + 1) & (nc - 1);
					dev->sizes[h] = old[i];
				}
			free(old);
		}
	}
	if (dev->cap) {
		size_t h = mem_hash(p, dev->cap);
		while (dev->sizes[h].p && dev->sizes[h].p != p)
			h = (h + 1) & (dev->cap - 1);
		if (n && !dev->sizes[h].p && 2 * (dev->used + 1) <= dev->cap) {
			dev->sizes[h].p = p;
			dev->sizes[h].n = n;
			dev->used++;
			dev->live += n;
			if (dev->live > dev->peak)
				dev->peak = dev->live;
		} else if (!n && dev->sizes[h].p == p) {
			dev->live -= dev->sizes[h].n;
			/* backward-shift deletion keeps the probe chains whole */
			size_t i = h;
			for (size_t j = (i + 1) & (dev->cap - 1); dev->sizes[j].p;
			     j = (j + 1) & (dev->cap - 1)) {
				size_t k = mem_hash(dev->sizes[j].p, dev->cap);
				if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
					dev->sizes[i] = dev->sizes[j];
					i = j;
				}
			}
			dev->sizes[i].p = NULL;
			dev->used--;
		}
	}
	pthread_mutex_unlock(&dev->mem_lock);
}

void kiln_device_mem(struct kiln_device *dev, size_t *live, size_t *peak)
{
	pthread_mutex_lock(&dev->mem_lock);
	if (live)
		*live = dev->live;
	if (peak)
		*peak = dev->peak;
	pthread_mutex_unlock(&dev->mem_lock);
}

#define HAS(dev, member)                                                                  \
	((dev)->ops->version >= 1 && (dev)->ops->member != NULL)
/* a member of version 2 of the table and on */
#define HAS2(dev, member) ((dev)->ops->version >= 2 && (dev)->ops->member != NULL)
/* the captured-step members (version 3), all four or none */
#define HAS_CAPTURE(dev)                                                                  \
	((dev)->ops->version >= 3 && (dev)->ops->capture_begin && (dev)->ops->capture_end &&  \
	 (dev)->ops->graph_launch && (dev)->ops->graph_free)

kiln_status kiln_device_mem_info(struct kiln_device *dev, size_t *free_bytes, size_t *total_bytes)
{
	if (!HAS2(dev, mem_info))
		return kiln_error(KILN_ENOTSUP, "device '%s' cannot report its free memory: set [run] memory_limit",
				  dev->plugin->name);
	return dev->ops->mem_info(dev->ctx, free_bytes, total_bytes);
}

/* `device = auto`: the available device plugin with the highest
 * traits.auto_score (the first found on a tie): the data says which
 * device is best, the core names none. */
kiln_status kiln_device_auto(const struct kiln_registry *reg, const struct kiln_plugin **out)
{
	const struct kiln_plugin *best = NULL, *p;
	*out = NULL;
	for (int i = 0; i < kiln_registry_plugin_count(reg); i++) {
		struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &pi);
		if (pi.kind != KILN_PLUGIN_DEVICE || !pi.available ||
		    kiln_registry_find(reg, KILN_PLUGIN_DEVICE, pi.name, &p))
			continue;
		const struct kiln_device_ops *ops = p->ops;
		if (ops->traits.auto_score > 0 &&
		    (!best || ops->traits.auto_score >
				      ((const struct kiln_device_ops *)best->ops)->traits.auto_score))
			best = p;
	}
	if (!best)
		return kiln_error(KILN_EPLUGIN,
				  "device = auto: no device plugin that auto may choose is available here (run `kiln plugins`)");
	*out = best;
	return KILN_OK;
}

/* The [run] keys a device acts on, read once here for open()
 * (struct kiln_device_options); without a config or a key, the schema's
 * default, 0. */
static kiln_status device_options_read(const struct kiln_config *cfg,
				       struct kiln_device_options *o)
{
	int64_t threads = 0;
	kiln_status st;
	struct kiln_dist_env env;
	memset(o, 0, sizeof *o);
	o->version = KILN_DEVICE_OPTIONS_VERSION;
	o->ranks = kiln_dist_env_read(&env) ? 1 : env.world; /* a bad one is reported when joining */
	o->peers = 1;
	if (!cfg)
		return KILN_OK;
	if (((st = kiln_config_get_int(cfg, "run", "threads", &threads)) && st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_bool(cfg, "run", "deterministic", &o->deterministic)) &&
	     st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_bool(cfg, "run", "autotune", &o->autotune)) &&
	     st != KILN_ENOTFOUND))
		return st;
	if (threads < 0 || threads > INT32_MAX)
		return kiln_error(KILN_ECONFIG, "%s: [run] threads = %lld: expected 0 (every CPU) or a count",
				  kiln_config_where(cfg, "run", "threads"), (long long)threads);
	o->threads = (int32_t)threads;
	return KILN_OK;
}

kiln_status kiln_device_open(const struct kiln_registry *reg, const struct kiln_config *cfg,
			     const char *name, int ordinal, struct kiln_device **out)
{
	if (!reg || !name || !out)
		return kiln_null_arg("kiln_device_open", !reg ? "reg" : !name ? "name" : "out");
	return kiln_device_open_peer(reg, cfg, name, ordinal, -1, 1, out);
}

kiln_status kiln_device_open_peer(const struct kiln_registry *reg, const struct kiln_config *cfg,
				  const char *name, int ordinal, int threads, int peers,
				  struct kiln_device **out)
{
	const struct kiln_plugin *p = NULL;
	struct kiln_device_options opts;
	kiln_status st;
	*out = NULL;
	if (name && !strcmp(name, "auto")) {
		if (!(st = kiln_device_auto(reg, &p)))
			kiln_log(KILN_LOG_INFO, "core", "device = auto: using %s", p->name);
	} else {
		st = kiln_registry_find(reg, KILN_PLUGIN_DEVICE, name, &p);
	}
	if (st || (st = device_options_read(cfg, &opts)))
		return st;
	if (threads >= 0)
		opts.threads = threads;
	opts.peers = peers;
	opts.stage = threads >= 0 && peers > 1;
	name = p->name;
	const struct kiln_device_ops *ops = p->ops;
	if (!ops->open || !ops->alloc || !ops->free || !ops->stream_create || !ops->copy_async ||
	    !ops->event_create || !ops->event_record || !ops->stream_wait || !ops->event_sync ||
	    !ops->stream_sync || !ops->prepare || !ops->run)
		return kiln_error(KILN_EPLUGIN, "device plugin '%s' lacks a required member", name);
	struct kiln_device *dev = calloc(1, sizeof *dev);
	if (!dev)
		return kiln_error(KILN_ENOMEM, "out of memory");
	dev->plugin = p;
	dev->ops = ops;
	dev->threads = opts.threads;
	dev->alone = opts.ranks <= 1 && opts.peers <= 1;
	pthread_mutex_init(&dev->mem_lock, NULL);
	if ((st = ops->open(kiln_host_table(), cfg, ordinal, &opts, &dev->ctx))) {
		pthread_mutex_destroy(&dev->mem_lock);
		free(dev);
		return kiln_error_wrap(st, "device '%s'", name);
	}
	*out = dev;
	return KILN_OK;
}

void kiln_device_close(struct kiln_device *dev)
{
	if (!dev)
		return;
	/* every command's device high-water mark (kiln train's result has it,
	 * device_peak_bytes; predict, eval, export and generate tell it here:
	 * tests/memory.sh reads it) */
	kiln_log(KILN_LOG_DEBUG, "core", "device %s: peak %zu bytes allocated, %zu still live at close",
		 dev->plugin->name, dev->peak, dev->live);
	if (dev->ops->close)
		dev->ops->close(dev->ctx);
	pthread_mutex_destroy(&dev->mem_lock);
	free(dev->sizes);
	free(dev->flops_tab);
	free(dev);
}

const char *kiln_device_name(const struct kiln_device *dev) { return dev ? dev->plugin->name : NULL; }

int kiln_device_threads(const struct kiln_device *dev) { return dev ? dev->threads : 0; }

int kiln_device_alone(const struct kiln_device *dev) { return dev ? dev->alone : 1; }

int kiln_device_streams_async(struct kiln_device *dev)
{
	typedef int (*streams_async_t)(void *);
	streams_async_t f = dev ? (streams_async_t)kiln_device_proc(dev, KILN_PROC_STREAMS_ASYNC) : NULL;
	return f ? f(dev->ctx) != 0 : -1;
}

int64_t kiln_device_run_wait_ns(struct kiln_device *dev)
{
	typedef int64_t (*run_wait_t)(void *);
	run_wait_t f = dev ? (run_wait_t)kiln_device_proc(dev, KILN_PROC_RUN_WAIT) : NULL;
	return f ? f(dev->ctx) : -1;
}

kiln_status kiln_device_stream_side(struct kiln_device *dev, void *stream, void **side)
{
	typedef kiln_status (*side_t)(void *, void *, void **);
	side_t f = (side_t)kiln_device_proc(dev, KILN_PROC_STREAM_SIDE);
	*side = NULL;
	if (!f)
		return kiln_error(KILN_ENOTSUP, "device '%s' has no side streams (%s)", kiln_device_name(dev),
				  KILN_PROC_STREAM_SIDE);
	return f(dev->ctx, stream, side);
}

unsigned kiln_device_abi_minor(const struct kiln_device *dev) { return dev->plugin->abi_minor; }

const struct kiln_device_traits *kiln_device_traits(const struct kiln_device *dev)
{
	return &dev->ops->traits;
}

const char *kiln_device_type_name(int type)
{
	switch (type) {
	case KILN_DEVICE_CPU: return "cpu";
	case KILN_DEVICE_GPU: return "gpu";
	case KILN_DEVICE_OTHER: return "other";
	}
	return "?";
}

void kiln_device_counters_get(const struct kiln_device *dev, struct kiln_device_counters *c)
{
	c->host_syncs = atomic_load(&dev->host_syncs);
	c->d2h_copies = atomic_load(&dev->d2h);
	c->allocs = atomic_load(&dev->allocs);
	c->runs = atomic_load(&dev->runs);
	c->staging_waits = atomic_load(&dev->staging);
	c->replays = atomic_load(&dev->replays);
}

kiln_status kiln_device_alloc(struct kiln_device *dev, size_t bytes, void **ptr)
{
	atomic_fetch_add(&dev->allocs, 1);
	kiln_status st = dev->ops->alloc(dev->ctx, bytes ? bytes : 1, ptr);
	if (!st)
		mem_note(dev, *ptr, bytes ? bytes : 1);
	return st;
}

kiln_status kiln_device_alloc_named(struct kiln_device *dev, size_t bytes, void **ptr,
				    const char *what)
{
	kiln_status st = kiln_device_alloc(dev, bytes, ptr);
	return st ? kiln_error_wrap(st, "%s", what) : KILN_OK;
}

kiln_status kiln_device_host_alloc_named(struct kiln_device *dev, size_t bytes, void **ptr,
					 const char *what)
{
	kiln_status st = kiln_device_host_alloc(dev, bytes, ptr);
	return st ? kiln_error_wrap(st, "%s", what) : KILN_OK;
}

void kiln_device_free(struct kiln_device *dev, void *ptr)
{
	if (ptr) {
		mem_note(dev, ptr, 0);
		dev->ops->free(dev->ctx, ptr);
	}
}

kiln_status kiln_device_host_alloc(struct kiln_device *dev, size_t bytes, void **ptr)
{
	atomic_fetch_add(&dev->allocs, 1);
	if (HAS(dev, host_alloc) && HAS(dev, host_free))
		return dev->ops->host_alloc(dev->ctx, bytes, ptr);
	/* default: 64-byte aligned pageable memory */
	*ptr = NULL;
	if (posix_memalign(ptr, 64, bytes ? (bytes + 63) & ~(size_t)63 : 64))
		return kiln_error(KILN_ENOMEM, "host_alloc(%zu bytes) failed", bytes);
	return KILN_OK;
}

void kiln_device_host_free(struct kiln_device *dev, void *ptr)
{
	if (!ptr)
		return;
	if (HAS(dev, host_alloc) && HAS(dev, host_free))
		dev->ops->host_free(dev->ctx, ptr);
	else
		free(ptr);
}

kiln_status kiln_device_stream_create(struct kiln_device *dev, void **stream)
{
	return dev->ops->stream_create(dev->ctx, stream);
}

void kiln_device_stream_destroy(struct kiln_device *dev, void *stream)
{
	if (stream && dev->ops->stream_destroy)
		dev->ops->stream_destroy(dev->ctx, stream);
}

kiln_status kiln_device_event_create(struct kiln_device *dev, void **event)
{
	return dev->ops->event_create(dev->ctx, event);
}

void kiln_device_event_destroy(struct kiln_device *dev, void *event)
{
	if (event && dev->ops->event_destroy)
		dev->ops->event_destroy(dev->ctx, event);
}

/* ---- profiling ----------------------------------------------------------
 * While the profiler records a step, a run or copy is timed on the host
 * around enqueue + stream sync, after a first sync that drains what the
 * stream held (waits on other streams), so the span is the op's own time
 * even on an asynchronous device.  This serialises the device: no overlap
 * between streams or with the host, hence "self time".  The syncs call
 * the plugin directly and are not counted in host_syncs (they are the
 * profiler's, not the step's). */

void kiln_device_set_profile(struct kiln_device *dev, struct kiln_profile *p) { dev->prof = p; }

struct kiln_profile *kiln_device_profile(const struct kiln_device *dev) { return dev->prof; }

static kiln_status run_profiled(struct kiln_device *dev, void *plan,
				const struct kiln_op_args *args, void *stream)
{
	if (!kiln_profile_recording(dev->prof))
		return dev->ops->run(dev->ctx, plan, args, stream);
	kiln_status st = dev->ops->stream_sync(dev->ctx, stream);
	if (st)
		return st;
	int64_t t0 = kiln_now_ns();
	st = dev->ops->run(dev->ctx, plan, args, stream);
	if (!st)
		st = dev->ops->stream_sync(dev->ctx, stream);
	kiln_profile_op(dev->prof, plan, stream, t0, kiln_now_ns());
	return st;
}

static kiln_status copy_profiled(struct kiln_device *dev, void *dst, const void *src,
				 size_t bytes, int kind, void *stream)
{
	if (!kiln_profile_recording(dev->prof))
		return dev->ops->copy_async(dev->ctx, dst, src, bytes, kind, stream);
	kiln_status st = dev->ops->stream_sync(dev->ctx, stream);
	if (st)
		return st;
	int64_t t0 = kiln_now_ns();
	st = dev->ops->copy_async(dev->ctx, dst, src, bytes, kind, stream);
	if (!st)
		st = dev->ops->stream_sync(dev->ctx, stream);
	kiln_profile_copy(dev->prof, kind, stream, t0, kiln_now_ns());
	return st;
}

kiln_status kiln_device_copy_async(struct kiln_device *dev, void *dst, const void *src,
				   size_t bytes, int kind, void *stream)
{
	if (dev->flops_acc)
		return KILN_OK;
	if (!stream)
		return kiln_error(KILN_EINVAL, "copy_async: NULL stream");
	if (kind == KILN_COPY_D2H)
		atomic_fetch_add(&dev->d2h, 1);
	if (!bytes)
		return KILN_OK;
	if (dev->prof)
		return copy_profiled(dev, dst, src, bytes, kind, stream);
	return dev->ops->copy_async(dev->ctx, dst, src, bytes, kind, stream);
}

kiln_status kiln_device_event_record(struct kiln_device *dev, void *event, void *stream)
{
	return dev->ops->event_record(dev->ctx, event, stream);
}

kiln_status kiln_device_stream_wait(struct kiln_device *dev, void *stream, void *event)
{
	return dev->ops->stream_wait(dev->ctx, stream, event);
}

kiln_status kiln_device_event_sync(struct kiln_device *dev, void *event)
{
	atomic_fetch_add(&dev->host_syncs, 1);
	return dev->ops->event_sync(dev->ctx, event);
}

kiln_status kiln_device_staging_wait(struct kiln_device *dev, void *event)
{
	atomic_fetch_add(&dev->staging, 1);
	return dev->ops->event_sync(dev->ctx, event);
}

kiln_status kiln_device_stream_sync(struct kiln_device *dev, void *stream)
{
	atomic_fetch_add(&dev->host_syncs, 1);
	return dev->ops->stream_sync(dev->ctx, stream);
}

/* ---- FLOP counting (kiln_model_summary) --------------------------------- */

static kiln_status flops_note(struct kiln_device *dev, void *plan, double flops)
{
	for (int i = 0; i < dev->flops_n; i++)
		if (dev->flops_tab[i].plan == plan) { /* an address freed and reused */
			dev->flops_tab[i].flops = flops;
			return KILN_OK;
		}
	struct flops_entry *t = kiln_grow(dev->flops_tab, dev->flops_n, &dev->flops_cap,
					 sizeof *t, 64);
	if (!t)
		return kiln_error(KILN_ENOMEM, "counting FLOPs: out of memory");
	dev->flops_tab = t;
	t[dev->flops_n++] = (struct flops_entry){ plan, flops };
	return KILN_OK;
}

static kiln_status flops_add(struct kiln_device *dev, void *plan)
{
	for (int i = 0; i < dev->flops_n; i++)
		if (dev->flops_tab[i].plan == plan) {
			*dev->flops_acc += dev->flops_tab[i].flops;
			break;
		}
	return KILN_OK;
}

/* A layout-only plan (kiln_device_layout_only): NULL, or while FLOPs are
 * recorded (kiln_model_summary) a token noted with op's FLOPs: an odd
 * address no allocation has, which counting runs (flops_add) and
 * kiln_device_plan_free take and nothing else does. */
static int is_token(const void *plan) { return ((uintptr_t)plan & 1) != 0; }

static kiln_status layout_token(struct kiln_device *dev, const struct kiln_op *op, void **plan)
{
	if (!dev->flops_rec)
		return KILN_OK;
	void *t = (void *)(2 * ++dev->tokens + 1);
	kiln_status st = flops_note(dev, t, kiln_op_flops(op));
	if (!st)
		*plan = t;
	return st;
}

void kiln_device_flops_record(struct kiln_device *dev, int on)
{
	if (on)
		dev->flops_n = 0;
	dev->flops_rec = on;
}

void kiln_device_flops_count(struct kiln_device *dev, double *acc)
{
	dev->flops_acc = acc;
	if (!acc) {
		free(dev->flops_tab);
		dev->flops_tab = NULL;
		dev->flops_n = dev->flops_cap = 0;
	}
}

int kiln_device_has_op(const struct kiln_device *dev, int type)
{
	/* an op added after the device's ABI minor is one it never knew: its
	 * has_op is not asked (a table sized by its KILN_OP_TYPE_COUNT would
	 * be read past its end), and it has none */
	if (dev->plugin->abi_minor < kiln_op_abi_minor(type))
		return 0;
	return dev->ops->version < 3 || !dev->ops->has_op || dev->ops->has_op(dev->ctx, type);
}

/* What an LR_SCHEDULE op asks of ABI 2.30, in the [train] keys' words
 * (kiln/ops.h): NULL when nothing (the schedules and the onecycle of
 * before). */
static const char *sched_2_30(const struct kiln_op *op)
{
	switch (op->i[0]) {
	case KILN_SCHED_ONECYCLE:
		return op->i[5]   ? "onecycle's `three_phase = 1`"
		       : op->i[6] ? "onecycle's `anneal_strategy = linear`"
				  : NULL;
	case KILN_SCHED_EXPONENTIAL: return "`schedule = exponential`";
	case KILN_SCHED_LINEAR: return "`schedule = linear`";
	case KILN_SCHED_POLYNOMIAL: return "`schedule = polynomial`";
	}
	return op->i[0] > KILN_SCHED_ONECYCLE ? "the schedules of 2.30 and after" : NULL;
}

/* A device built before the ABI minor that gave an op what the config
 * asks of it (`what`: the addition and its minor, in the config's words):
 * refused before the run starts, nothing falls back, so a config error
 * (exit 2, as a loss layer plugin's of ABI 2.23, core/graph_infer.c):
 * the same config runs on a device rebuilt against these headers, or on
 * another device.  Exit 1 (KILN_ENOTSUP) before session 45. */
static kiln_status too_old(const struct kiln_device *dev, const char *what)
{
	return kiln_error(KILN_ECONFIG, "%s: built for ABI %u.%u, before %s: rebuild it against this kiln's headers",
			  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor, what);
}

/* An op family dev lacks (kiln_device_has_op): KILN_ENOTSUP naming it,
 * whatever its operands. */
static kiln_status not_implemented(const struct kiln_device *dev, int type)
{
	return kiln_error(KILN_ENOTSUP,
			  "%s: %s is not implemented by this device yet (use device = cpu for this model)",
			  dev->plugin->name, kiln_op_name(type));
}

kiln_status kiln_device_prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan,
				size_t *workspace)
{
	size_t ws = 0;
	*plan = NULL;
	if (workspace)
		*workspace = 0;
	/* first, an op family the device lacks, whatever the operands: asked
	 * of has_op for the types of the device's ABI minor (a 2.24 device
	 * without RNN is refused RNN, never told to rebuild for `last`); a
	 * type added later is left to the ABI refusals below, which say what
	 * the device was built before, and to the end of them */
	if (kiln_op_abi_minor(op->type) <= dev->plugin->abi_minor &&
	    !kiln_device_has_op(dev, op->type))
		return not_implemented(dev, op->type);
	/* a device built before ABI 2.3 would ignore the epilogue: the
	 * caller falls back to the op and an ACT (kiln/ops.h) */
	if ((op->flags & KILN_OPF_ACT) && dev->plugin->abi_minor < 3)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before fused activations",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... nor fold a ReLU's backward into a max pooling's (ABI 2.16) */
	if (op->type == KILN_OP_POOL && (op->flags & KILN_OPF_ACT) && dev->plugin->abi_minor < 16)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before the ReLU folded into max pooling",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... nor draw dropout by global row: it would read the counter's
	 * step alone, every rank and micro-batch the same masks (ABI 2.20) */
	if ((op->type == KILN_OP_DROPOUT || op->type == KILN_OP_DROPOUT_BWD ||
	     ((op->type == KILN_OP_ATTENTION || op->type == KILN_OP_ATTENTION_BWD) &&
	      op->f[1] != 0.0)) &&
	    dev->plugin->abi_minor < 20)
		return too_old(dev, "dropout's global-batch counter (2.20)");
	/* ... nor pool NHWC into NCHW (ABI 2.17) */
	if ((op->type == KILN_OP_POOL || op->type == KILN_OP_POOL_BWD) && dev->plugin->abi_minor < 17 &&
	    op->n_out >= 1 && op->n_in >= 1 &&
	    (op->in[0].layout == KILN_NHWC) != (op->out[0].layout == KILN_NHWC))
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before pooling NHWC into NCHW",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and a loss's padded classes (SOFTMAX_XENT's i[5], ABI 2.4) */
	if (op->type == KILN_OP_SOFTMAX_XENT && op->i[5] && dev->plugin->abi_minor < 4)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before a loss's classes",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and its fourth metric, the rows counted (2.1): an older device
	 * leaves it unwritten, an evaluation's count (kiln_layer.eval_counted) */
	if (op->type == KILN_OP_SOFTMAX_XENT && op->n_out >= 2 && op->out[1].dims[0] >= 4 &&
	    dev->plugin->abi_minor < 1)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before a loss's fourth metric (the rows counted, 2.1)",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* the INT8 ops came with ABI 2.6 */
	if ((op->type == KILN_OP_QCONV || op->type == KILN_OP_QLINEAR) && dev->plugin->abi_minor < 6)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before the INT8 ops",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and their u8 activations, u8 max pooling (chained INT8, 2.8) */
	if (((op->type == KILN_OP_QCONV || op->type == KILN_OP_QLINEAR || op->type == KILN_OP_POOL) &&
	     (op->in[0].dtype == KILN_U8 || op->out[0].dtype == KILN_U8)) &&
	    dev->plugin->abi_minor < 8)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before u8 activations between INT8 layers",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and the accumulated weight gradient of a convolution (2.9):
	 * an older device would overwrite */
	if (op->type == KILN_OP_CONV_BWD_WEIGHTS && (op->flags & KILN_OPF_ACCUMULATE) &&
	    dev->plugin->abi_minor < 9)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before accumulated convolution weight gradients",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and kept convolution copies (KILN_OPF_KEEP, 2.9) */
	if ((op->flags & KILN_OPF_KEEP) && dev->plugin->abi_minor < 9)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before kept convolution copies",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and ADD's u8 output (2.10) */
	if (op->type == KILN_OP_ADD && op->out[0].dtype == KILN_U8 && dev->plugin->abi_minor < 10)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before ADD's u8 output",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and the residual in a convolution's epilogue (KILN_OPF_RESIDUAL,
	 * 2.11) */
	if ((op->flags & KILN_OPF_RESIDUAL) && dev->plugin->abi_minor < 11)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before a convolution's residual epilogue",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and frozen weights (KILN_OPF_FROZEN, 2.15): only where the
	 * device can be told of new ones */
	if ((op->flags & KILN_OPF_FROZEN) && !kiln_device_takes_frozen(dev))
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, or without KILN_PROC_WEIGHTS_CHANGED: no frozen weights",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and the ReLU backward's bias gradient (2.9) */
	if (op->type == KILN_OP_RELU_BWD && op->n_out == 2 && dev->plugin->abi_minor < 9)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before RELU_BWD's bias gradient",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and a recurrent layer's final hidden state (RNN's i[4], 2.25):
	 * an older device would write the whole [B,T,H] sequence into y */
	if ((op->type == KILN_OP_RNN || op->type == KILN_OP_RNN_BWD) && op->i[4] &&
	    dev->plugin->abi_minor < 25)
		return too_old(dev, "a recurrent layer's final hidden state (`last`, 2.25)");
	/* ... and Adam's L2 weight decay in ADAMW (f[4], 2.28): an older
	 * device would ignore it and step as Adam without weight decay */
	if (op->type == KILN_OP_ADAMW && op->f[4] != 0.0 && dev->plugin->abi_minor < 28)
		return too_old(dev, "ADAMW's L2 weight decay (`optimizer = adam` with weight_decay, 2.28)");
	/* ... and SGD's dampening (f[3], with the step count as in2) and
	 * ADAMW's amsgrad (i[1], a fourth output), 2.29: an older device would
	 * step without them (or read the step count as the multiplier) */
	if (op->type == KILN_OP_SGD && op->f[3] != 0.0 && dev->plugin->abi_minor < 29)
		return too_old(dev, "SGD's dampening (`dampening` with momentum, 2.29)");
	if (op->type == KILN_OP_ADAMW && op->i[1] != 0 && dev->plugin->abi_minor < 29)
		return too_old(dev, "ADAMW's amsgrad (`amsgrad = 1`, 2.29)");
	/* ... and the schedules and onecycle options of 2.30: an older
	 * device would compute another schedule's rates */
	if (op->type == KILN_OP_LR_SCHEDULE && dev->plugin->abi_minor < 30 && sched_2_30(op)) {
		char what[96];
		snprintf(what, sizeof what, "%s (2.30)", sched_2_30(op));
		return too_old(dev, what);
	}
	/* ... nor a decoding attention of several positions a run (a
	 * prompt's prefill, 2.31): a type it may not know */
	if (op->type == KILN_OP_ATTENTION_DECODE_RUN && dev->plugin->abi_minor < 31)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before the decoding attention of several positions a run (2.31): a prompt is fed a position a step",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... nor the gradients' block sums or GRAD_CLIP taking them (2.32) */
	if ((op->type == KILN_OP_GRAD_SUMSQ || (op->type == KILN_OP_GRAD_CLIP && op->n_in > 1)) &&
	    dev->plugin->abi_minor < 32)
		return kiln_error(KILN_ENOTSUP, "%s: built for ABI %u.%u, before the gradients' block sums (2.32): one GRAD_CLIP pass over them",
				  dev->plugin->name, dev->plugin->abi_major, dev->plugin->abi_minor);
	/* ... and an op newer than the device's ABI without a refusal of its
	 * own above: one the device lacks (never asked of its has_op) */
	if (op->type > 0 && op->type < KILN_OP_TYPE_COUNT &&
	    kiln_op_abi_minor(op->type) > dev->plugin->abi_minor)
		return not_implemented(dev, op->type);
	kiln_status st = kiln_op_check(op, dev->plugin->name);
	if (st || dev->layout_only)
		return st ? st : layout_token(dev, op, plan);
	st = dev->ops->prepare(dev->ctx, op, plan, &ws);
	if (workspace)
		*workspace = ws;
	if (!st && dev->flops_rec && (st = flops_note(dev, *plan, kiln_op_flops(op)))) {
		if (dev->ops->plan_free)
			dev->ops->plan_free(dev->ctx, *plan);
		*plan = NULL;
	}
	if (!st && dev->prof)
		kiln_profile_plan(dev->prof, *plan, op->type);
	return st;
}

void kiln_op_grad_clip(struct kiln_op *op, int64_t n)
{
	int64_t four = 4;
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_GRAD_CLIP;
	op->n_in = 1;
	op->n_out = 2;
	kiln_tensor_desc_init(&op->in[0], KILN_F32, 1, &n);
	op->out[0] = op->in[0];
	kiln_tensor_desc_init(&op->out[1], KILN_F32, 1, &four);
	op->i[0] = n;
}

void kiln_op_grad_sumsq(struct kiln_op *op, int64_t n, int64_t k0, int64_t k1)
{
	const int64_t nb = (n + 1023) / 1024;
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_GRAD_SUMSQ;
	op->n_in = op->n_out = 1;
	kiln_tensor_desc_init(&op->in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op->out[0], KILN_F32, 1, &nb);
	op->i[0] = n;
	op->i[1] = k0;
	op->i[2] = k1;
}

kiln_status kiln_device_prepare_add(struct kiln_device *dev, int64_t n, void **plan)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ADD;
	op.n_in = 2;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	op.in[1] = op.out[0] = op.in[0];
	return kiln_device_prepare(dev, &op, plan, NULL);
}

kiln_status kiln_device_run(struct kiln_device *dev, void *plan, const struct kiln_op_args *args,
			    void *stream)
{
	if (dev->flops_acc)
		return flops_add(dev, plan);
	if (is_token(plan))
		return kiln_error(KILN_EINVAL, "%s: a plan laid out with the device preparing nothing (kiln_device_layout_only) cannot run",
				  dev->plugin->name);
	atomic_fetch_add(&dev->runs, 1);
	if (dev->prof)
		return run_profiled(dev, plan, args, stream);
	return dev->ops->run(dev->ctx, plan, args, stream);
}

void kiln_device_layout_only(struct kiln_device *dev, int on) { dev->layout_only = on; }

void kiln_device_plan_free(struct kiln_device *dev, void *plan)
{
	if (is_token(plan))
		return;
	if (plan && dev->prof)
		kiln_profile_plan_forget(dev->prof, plan);
	if (plan && dev->ops->plan_free)
		dev->ops->plan_free(dev->ctx, plan);
}

void *kiln_device_proc(struct kiln_device *dev, const char *name)
{
	return HAS(dev, get_proc_address) ? dev->ops->get_proc_address(dev->ctx, name) : NULL;
}

kiln_status kiln_device_workload(struct kiln_device *dev, const struct kiln_workload *w)
{
	typedef kiln_status (*workload_t)(void *, const struct kiln_workload *);
	workload_t f = dev->plugin->abi_minor >= 14
			       ? (workload_t)kiln_device_proc(dev, KILN_PROC_WORKLOAD)
			       : NULL;
	return f ? f(dev->ctx, w) : KILN_OK;
}

/* KILN_PROC_WEIGHTS_CHANGED (ABI 2.15), or NULL: the device then gets no
 * KILN_OPF_FROZEN. */
typedef void (*weights_changed_t)(void *);
static weights_changed_t weights_changed(struct kiln_device *dev)
{
	return dev->plugin->abi_minor >= 15
		       ? (weights_changed_t)kiln_device_proc(dev, KILN_PROC_WEIGHTS_CHANGED)
		       : NULL;
}

int kiln_device_takes_frozen(struct kiln_device *dev) { return weights_changed(dev) != NULL; }

void kiln_device_weights_changed(struct kiln_device *dev)
{
	weights_changed_t f = weights_changed(dev);
	if (f)
		f(dev->ctx);
}

typedef void (*weights_written_t)(void *, const void *, size_t);
void kiln_device_weights_written(struct kiln_device *dev, const void *const *ptr,
				 const size_t *bytes, int n)
{
	weights_written_t f = weights_changed(dev)
				      ? (weights_written_t)kiln_device_proc(dev, KILN_PROC_WEIGHTS_WRITTEN)
				      : NULL;
	if (!f) {
		kiln_device_weights_changed(dev);
		return;
	}
	for (int i = 0; i < n; i++)
		if (ptr[i] && bytes[i])
			f(dev->ctx, ptr[i], bytes[i]);
}

size_t kiln_device_aux_bytes(struct kiln_device *dev, void *plan)
{
	return plan && !is_token(plan) && HAS(dev, aux_bytes) ? dev->ops->aux_bytes(dev->ctx, plan) : 0;
}

/* host->device_host_fn (ABI 1.3): the device's KILN_PROC_HOST_FN, or, where
 * it has none, the stream drained and fn called here.  The core's own host
 * functions (the timing stamps of dist.c, dist_zero.c and pipe_timing.c,
 * the rank transport's in pipe_rank.c) hold nothing that a failed stream
 * passing them must give back, so none needs KILN_PROC_HOST_FN_SKIP's skip
 * (pipe_rank.c, above send_try, says why for each of the transport's). */
kiln_status kiln_device_host_fn(struct kiln_device *dev, void *stream, kiln_status (*fn)(void *),
				void *arg)
{
	typedef kiln_status (*host_fn_t)(void *, void *, kiln_status (*)(void *), void *);
	host_fn_t f = (host_fn_t)kiln_device_proc(dev, KILN_PROC_HOST_FN);
	if (f)
		return f(dev->ctx, stream, fn, arg);
	kiln_status st = kiln_device_stream_sync(dev, stream);
	return st ? st : fn(arg);
}

/* ---- captured steps (device ops version 3) ----------------------------- */

kiln_status kiln_device_capture_begin(struct kiln_device *dev, void *stream)
{
	if (!HAS_CAPTURE(dev))
		return kiln_error(KILN_ENOTSUP, "device '%s' does not capture steps",
				  dev->plugin->name);
	if (dev->prof)
		return kiln_error(KILN_ENOTSUP, "no capture while profiling (the profiler times every op)");
	if (dev->capturing)
		return kiln_error(KILN_EINVAL, "capture_begin: a capture is already under way");
	kiln_status st = dev->ops->capture_begin(dev->ctx, stream);
	if (!st)
		dev->capturing = 1;
	return st;
}

int kiln_device_capturing(struct kiln_device *dev)
{
	return dev && dev->capturing;
}

kiln_status kiln_device_capture_end(struct kiln_device *dev, void *stream, void **graph)
{
	*graph = NULL;
	if (!dev->capturing)
		return kiln_error(KILN_EINVAL, "capture_end without capture_begin");
	dev->capturing = 0;
	return dev->ops->capture_end(dev->ctx, stream, graph);
}

kiln_status kiln_device_graph_launch(struct kiln_device *dev, void *graph, void *stream)
{
	atomic_fetch_add(&dev->replays, 1);
	return dev->ops->graph_launch(dev->ctx, graph, stream);
}

void kiln_device_graph_free(struct kiln_device *dev, void *graph)
{
	if (graph && HAS_CAPTURE(dev))
		dev->ops->graph_free(dev->ctx, graph);
}
