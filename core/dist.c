/* core/dist.c - data-parallel training: joining the group and the
 * bucketed gradient allreduce (DESIGN.md section 4, docs/distributed.md).
 *
 * Buckets.  The trainable gradients are one flat buffer, laid out in layer
 * order, so the layers backward reaches first own its end.  Walking the
 * trainable tensors from the end, tensors join the current bucket until it
 * holds [dist] bucket_mb; each bucket is one contiguous slice [lo, hi) of
 * the flat buffer (alignment padding included: zero, and averaging zeros
 * keeps it zero).  A bucket is complete once the backward of the
 * lowest-indexed layer with a tensor in it has run; the graph calls our
 * hook after every layer's backward, and the hook then records an event on
 * the compute stream, makes the comm stream wait for it and enqueues the
 * bucket's allreduce (average) there.  Backward of the earlier layers goes
 * on meanwhile; before the optimizer the compute stream waits for every
 * bucket's completion event.  Nothing here synchronises the host.
 *
 * Accumulation: micro-steps before the last do not communicate; with
 * accumulate > 1 the last micro-step writes beside the gradients and the
 * trainer adds and scales afterwards, so every bucket starts after that
 * (kiln_dist_finish_grads), without overlap.
 */
#include "dist.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bucket {
	size_t lo, hi;    /* elements of the flat gradient buffer */
	/* ZeRO-1: this rank's piece [lo + rank*c, lo + (rank+1)*c) of the
	 * bucket, at zoff in its compact shard (zgrad, zstate); the
	 * optimizer over c floats (own_plan: freed with this bucket) */
	size_t c, zoff;
	void *plan;
	int own_plan;
	int ready_layer;  /* complete after this layer's backward */
	void *done;       /* event: the allreduce finished (comm stream) */
	int started;
	/* ZeRO-1: the first layer whose forward reads a parameter in
	 * [lo, hi) (n_layers: none, padding only); gdone: the event of the
	 * bucket's parameter allgather, which the next forward waits for
	 * before that layer while gpending */
	int need_layer;
	void *gdone;
	int gpending;
	/* [dist] timing: when the comm stream began and ended its allreduce
	 * (host clock, seconds; written by host functions on that stream),
	 * and when the parameter allgather ended (ZeRO-1) */
	double t0, t1, tg;
	struct stamp { struct kiln_dist *d; int b, end; } s0, s1, sg, sw;
};

struct kiln_dist {
	struct kiln_dist_env env;
	struct kiln_store *store;
	const struct kiln_plugin *plugin;
	const struct kiln_comm_ops *ops;
	void *ctx;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *comm_stream;
	void *ready;      /* event on the compute stream, reused per bucket */
	struct bucket *b;
	int n_b;
	double bucket_mb;
	int overlap, overlap_now;
	int sync_bn;      /* [dist] sync_bn: layers' collectives (host->group_*) */
	void *sync_done;  /* event on the comm stream: a layer's collective done */
	int timeout_ms;
	float *scratch_d;  /* device f32[64]: host sums */
	float *scratch_h;
	int failed;       /* a collective failed: do not wait for peers */
	int finished;     /* kiln_dist_finish met every rank */
	/* ZeRO-1 ([dist] zero = 1): this rank owns the optimizer state of
	 * 1/world of every bucket (zc floats in all), and the tail
	 * [zwc, n_trainable) (zt < 16*world floats) is replicated */
	int zero, zero_gather;  /* zero_gather: the averaged gradient is
				 * gathered back whole (a clip or the
				 * non-finite check reads all of it) */
	size_t zc, zt, zwc;
	float *zstate;          /* [state_slots][zc + zt]: pieces, then the tail */
	float *zgrad;           /* f32[zc]: this rank's averaged pieces */
	void *ztplan;           /* the optimizer over the tail */
	void *zt_done;          /* event: the tail's allreduce finished */
	float *zfull;           /* the whole state while a checkpoint is taken */
	int zpending;           /* some bucket's parameter allgather is not yet
				 * waited for on the compute stream */
	/* [dist] timing = 1: host functions stamp, on the streams, when the
	 * backward ended (compute), when each bucket's allreduce ran (comm)
	 * and when the optimizer could start (compute, after the waits); the
	 * last one adds the step into the sums.  No synchronisation added. */
	int timing;
	double t_bwd_end;
	double sum_exposed, sum_comm;  /* seconds, over sum_steps steps */
	int64_t sum_steps;
	int64_t early, runs;  /* bucket collectives begun before the backward
			       * ended (overlapped), of all */
	struct stamp s_bwd, s_opt;
	/* ZeRO-1's parameter allgathers: when the compute stream reached the
	 * first reader of the parameters after them (the next forward), and
	 * how many of them completed after that (overlapped), of all */
	double t_read;
	int read_stamped;
	int64_t glate, gruns;
	struct stamp s_read;
};

static void (*fatal_fn)(const char *msg);

void kiln_set_fatal_handler(void (*fn)(const char *msg))
{
	fatal_fn = fn;
}

void kiln_host_fatal(const char *who, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	kiln_log(KILN_LOG_ERROR, who, "%s", msg);
	if (fatal_fn)
		fatal_fn(msg);
}

int kiln_dist_rank(const struct kiln_dist *d) { return d ? d->env.rank : 0; }
int kiln_dist_world(const struct kiln_dist *d) { return d ? d->env.world : 1; }

kiln_status kiln_dist_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   struct kiln_device *dev, struct kiln_dist **out)
{
	struct kiln_dist *d;
	kiln_status st;
	struct kiln_dist_env env;
	const char *comm = kiln_config_get(cfg, "run", "comm");
	double timeout = 300;
	*out = NULL;
	if ((st = kiln_dist_env_read(&env)))
		return st;
	if (!comm || !*comm)
		comm = "auto";
	if (env.world == 1) {
		/* one process has nothing to communicate: no store, no port
		 * bound (two single-process runs on one machine must not
		 * collide on the default port), the same numbers */
		if (strcmp(comm, "auto") && strcmp(comm, "none"))
			kiln_log(KILN_LOG_INFO, "dist",
				 "one process (world size 1): [run] comm = %s is not opened", comm);
		return KILN_OK;
	}
	if (!strcmp(comm, "none"))
		return kiln_error(KILN_ECONFIG, "%s: [run] comm = none, but this process is rank %d of %d (from %s variables): name a communicator (gloo, mpi, nccl) or auto",
				  kiln_config_where(cfg, "run", "comm"), env.rank, env.world, env.source);
	if (!strcmp(comm, "auto")) {
		/* the device's traits: the communicator that moves its memory,
		 * else (host memory) mpi under Open MPI's mpirun, gloo otherwise */
		const struct kiln_device_traits *tr = kiln_device_traits(dev);
		const struct kiln_plugin *p;
		if (tr->comm)
			comm = tr->comm;
		else if (!(tr->caps & KILN_DEVICE_HOST_MEMORY))
			return kiln_error(KILN_ECONFIG, "%s: [run] comm = auto: device '%s' names no communicator for its memory; name one",
					  kiln_config_where(cfg, "run", "comm"), kiln_device_name(dev));
		else if (!strcmp(env.source, "Open MPI") &&
			 !kiln_registry_find(reg, KILN_PLUGIN_COMM, "mpi", &p))
			comm = "mpi";
		else
			comm = "gloo";
	}
	if (!(d = calloc(1, sizeof *d)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	d->env = env;
	d->dev = dev;
	d->bucket_mb = 25;
	d->overlap = 1;
	kiln_config_get_float(cfg, "dist", "timeout", &timeout);
	kiln_config_get_float(cfg, "dist", "bucket_mb", &d->bucket_mb);
	kiln_config_get_bool(cfg, "dist", "overlap", &d->overlap);
	kiln_config_get_bool(cfg, "dist", "timing", &d->timing);
	kiln_config_get_bool(cfg, "dist", "sync_bn", &d->sync_bn);
	{
		int64_t z = 0;
		kiln_config_get_int(cfg, "dist", "zero", &z);
		if (z > 1) {
			st = kiln_error(KILN_ECONFIG, "%s: [dist] zero = %lld: only ZeRO stage 1 (optimizer-state sharding) is implemented; stages 2 and 3 (gradient and parameter sharding) are not",
					kiln_config_where(cfg, "dist", "zero"), (long long)z);
			free(d);
			return st;
		}
		d->zero = z == 1;
	}
	d->timeout_ms = (int)(timeout * 1000);
	if ((st = kiln_registry_find(reg, KILN_PLUGIN_COMM, comm, &d->plugin)))
		goto fail;
	d->ops = d->plugin->ops;
	if (d->ops->version < 1 || !d->ops->open || !d->ops->allreduce || !d->ops->broadcast) {
		st = kiln_error(KILN_EPLUGIN, "comm plugin '%s' lacks open, allreduce or broadcast",
				comm);
		goto fail;
	}
	if ((st = kiln_store_open(env.master_addr, env.master_port, env.rank == 0, env.rank,
				  env.world, d->timeout_ms, &d->store)) ||
	    (st = kiln_store_rendezvous(d->store, env.rank, env.world, d->timeout_ms)))
		goto fail;
	if ((st = d->ops->open(kiln_host_table(), cfg, d->store, dev, env.rank, env.world,
			       d->timeout_ms, &d->ctx))) {
		st = kiln_error_wrap(st, "rank %d of %d: opening the %s communicator", env.rank,
				     env.world, comm);
		goto fail;
	}
	if ((st = kiln_device_stream_create(dev, &d->comm_stream)) ||
	    (st = kiln_device_event_create(dev, &d->ready)) ||
	    (st = kiln_device_event_create(dev, &d->sync_done)) ||
	    (st = kiln_device_alloc(dev, 64 * sizeof(float), (void **)&d->scratch_d)) ||
	    (st = kiln_device_host_alloc(dev, 64 * sizeof(float), (void **)&d->scratch_h)))
		goto fail;
	{
		const char *desc = d->ops->version >= 2 && d->ops->describe ? d->ops->describe(d->ctx) : NULL;
		kiln_log(KILN_LOG_INFO, "dist", "rank %d of %d (local %d; from %s), comm %s%s%s, store %s:%d",
			 env.rank, env.world, env.local_rank, env.source, comm, desc ? ": " : "",
			 desc ? desc : "", env.master_addr, kiln_store_port(d->store));
	}
	*out = d;
	return KILN_OK;
fail:
	kiln_dist_close(d);
	return st;
}

static void free_buckets(struct kiln_dist *d)
{
	for (int i = 0; i < d->n_b; i++) {
		kiln_device_event_destroy(d->dev, d->b[i].done);
		kiln_device_event_destroy(d->dev, d->b[i].gdone);
		if (d->b[i].own_plan)
			kiln_device_plan_free(d->dev, d->b[i].plan);
	}
	free(d->b);
	d->b = NULL;
	d->n_b = 0;
}

kiln_status kiln_dist_finish(struct kiln_dist *d)
{
	if (!d || !d->store || d->env.world < 2)
		return KILN_OK;
	kiln_status st = d->comm_stream ? kiln_device_stream_sync(d->dev, d->comm_stream) : KILN_OK;
	int64_t n = 0;
	if (!st)
		st = kiln_store_add(d->store, "kiln/finished", 1, &n);
	if (!st && n == d->env.world)
		st = kiln_store_set(d->store, "kiln/finished_all", "1", 1);
	/* Polled, not a get: a peer that failed after its last collective
	 * says so in the same key (kiln_dist_close), and one that died is
	 * recorded lost by the store; neither would wake a get of "1". */
	static const char *const keys[] = { "kiln/finished_all", "kiln/lost" };
	int which = -1;
	void *v = NULL;
	if (!st)
		st = kiln_store_poll(d->store, keys, 2, d->timeout_ms, &which, &v);
	if (!st && which == 0 && !strcmp(v, "1"))
		d->finished = 1;
	else if (!st && which == 0)
		st = kiln_error(KILN_EIO, "%s after the last collective", (const char *)v);
	else if (!st)
		st = kiln_error(KILN_EIO, "rank %s was lost after the last collective (its process exited or its connection closed)",
				(const char *)v);
	free(v);
	if (st)
		return kiln_error_wrap(st, "rank %d of %d: waiting for every rank to finish",
				       d->env.rank, d->env.world);
	return KILN_OK;
}

void kiln_dist_close(struct kiln_dist *d)
{
	if (!d)
		return;
	/* leaving may fail too (peers gone): keep the message that matters */
	char *msg = kiln_strdup(kiln_last_error());
	if (d->comm_stream)
		kiln_device_stream_sync(d->dev, d->comm_stream);
	if (d->timing && d->runs)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d: %lld of %lld bucket %s began before the backward ended",
			 d->env.rank, (long long)d->early, (long long)d->runs,
			 d->zero ? "reduce-scatters" : "allreduces");
	if (d->timing && d->gruns)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d: %lld of %lld parameter allgathers completed after the next forward began",
			 d->env.rank, (long long)d->glate, (long long)d->gruns);
	if (d->m && d->m->bwd_user == d) {
		d->m->bwd_hook = NULL;
		d->m->bwd_user = NULL;
	}
	if (d->m && d->m->fwd_user == d) {
		d->m->fwd_hook = NULL;
		d->m->fwd_user = NULL;
	}
	free_buckets(d);
	kiln_device_plan_free(d->dev, d->ztplan);
	kiln_device_event_destroy(d->dev, d->zt_done);
	kiln_device_free(d->dev, d->zstate);
	kiln_device_free(d->dev, d->zgrad);
	if (d->m && d->zfull && d->m->state_d == d->zfull)
		d->m->state_d = NULL;
	kiln_device_free(d->dev, d->zfull);
	/* a rank leaving without having finished tells the peers waiting
	 * in kiln_dist_finish, which then fail at once, naming it */
	if (d->store && d->env.world > 1 && !d->finished) {
		char why[64];
		int k = snprintf(why, sizeof why, "rank %d failed", d->env.rank);
		kiln_store_set(d->store, "kiln/finished_all", why, (size_t)k);
	}
	if (d->ctx)
		d->ops->close(d->ctx);
	kiln_device_event_destroy(d->dev, d->ready);
	kiln_device_event_destroy(d->dev, d->sync_done);
	kiln_device_stream_destroy(d->dev, d->comm_stream);
	kiln_device_free(d->dev, d->scratch_d);
	kiln_device_host_free(d->dev, d->scratch_h);
	if (d->store) {
		/* rank 0 hosts the store: it leaves last (unless a peer is gone) */
		int64_t n = 0;
		if (!kiln_store_add(d->store, "kiln/left", 1, &n)) {
			if (n == d->env.world)
				kiln_store_set(d->store, "kiln/left_all", "1", 1);
			void *v = NULL;
			if (d->env.rank == 0 && n < d->env.world && !d->failed &&
			    !kiln_store_get(d->store, "kiln/left_all", 10000, &v, NULL))
				free(v);
		}
		kiln_store_close(d->store);
	}
	free(d);
	if (msg && *msg)
		kiln_error(KILN_EIO, "%s", msg);
	free(msg);
}

/* ---- layers' collectives ([dist] sync_bn) ---------------------------------- */

int kiln_dist_sync_bn(const struct kiln_dist *d) { return d ? d->sync_bn : 0; }

/* Order a collective on the comm stream between `stream`'s work before
 * and after it; `run` enqueues it (recording d->sync_done). */
static kiln_status group_begin(struct kiln_dist *d, void *stream)
{
	kiln_status st;
	if ((st = kiln_device_event_record(d->dev, d->ready, stream)) ||
	    (st = kiln_device_stream_wait(d->dev, d->comm_stream, d->ready)))
		return kiln_error_wrap(st, "rank %d of %d: ordering a layer's collective",
				       d->env.rank, d->env.world);
	return KILN_OK;
}

static kiln_status group_end(struct kiln_dist *d, kiln_status st, const char *what, size_t count,
			     void *stream)
{
	if (!st)
		st = kiln_device_stream_wait(d->dev, stream, d->sync_done);
	if (st) {
		d->failed = 1;
		return kiln_error_wrap(st, "rank %d of %d: %s of %zu elements (sync_bn)", d->env.rank,
				       d->env.world, what, count);
	}
	return KILN_OK;
}

kiln_status kiln_dist_group_allreduce(void *group, void *buf, size_t count, int dtype, int op,
				      void *stream)
{
	struct kiln_dist *d = group;
	kiln_status st;
	if (!d)
		return kiln_error(KILN_EINVAL, "group_allreduce: no data-parallel group");
	if ((st = group_begin(d, stream)))
		return st;
	st = d->ops->allreduce(d->ctx, buf, count, dtype, op, d->comm_stream, d->sync_done);
	return group_end(d, st, "allreduce", count, stream);
}

kiln_status kiln_dist_group_allgather(void *group, const void *send, void *recv, size_t count,
				      int dtype, void *stream)
{
	struct kiln_dist *d = group;
	kiln_status st;
	if (!d)
		return kiln_error(KILN_EINVAL, "group_allgather: no data-parallel group");
	if (!d->ops->allgather)
		return kiln_error(KILN_EPLUGIN, "rank %d of %d: comm plugin '%s' has no allgather (sync_bn needs it)",
				  d->env.rank, d->env.world, d->plugin->name);
	if ((st = group_begin(d, stream)))
		return st;
	st = d->ops->allgather(d->ctx, send, recv, count, dtype, d->comm_stream, d->sync_done);
	return group_end(d, st, "allgather", count, stream);
}

/* ---- buckets ------------------------------------------------------------- */

/* [dist] timing's host functions */
static kiln_status stamp_bucket(void *arg)
{
	struct stamp *s = arg;
	struct bucket *b = &s->d->b[s->b];
	/* end: 0 the collective began, 1 it ended, 2 the parameter
	 * allgather (ZeRO-1) ended */
	*(s->end == 2 ? &b->tg : s->end ? &b->t1 : &b->t0) = kiln_now_s();
	return KILN_OK;
}

static kiln_status stamp_bwd(void *arg)
{
	struct stamp *s = arg;
	s->d->t_bwd_end = kiln_now_s();
	return KILN_OK;
}

static kiln_status stamp_opt(void *arg)
{
	struct kiln_dist *d = ((struct stamp *)arg)->d;
	double exposed = kiln_now_s() - d->t_bwd_end, comm = 0;
	for (int i = 0; i < d->n_b; i++) {
		comm += d->b[i].t1 - d->b[i].t0;
		d->early += d->b[i].t0 < d->t_bwd_end;
	}
	d->runs += d->n_b;
	d->sum_exposed += exposed > 0 ? exposed : 0;
	d->sum_comm += comm;
	d->sum_steps++;
	return KILN_OK;
}

static kiln_status start_bucket(struct kiln_dist *d, struct bucket *b, void *compute)
{
	kiln_status st;
	if ((st = kiln_device_event_record(d->dev, d->ready, compute)) ||
	    (st = kiln_device_stream_wait(d->dev, d->comm_stream, d->ready)))
		return st;
	b->started = 1;
	if (d->timing && (st = kiln_device_host_fn(d->dev, d->comm_stream, stamp_bucket, &b->s0)))
		return st;
	void *done = d->timing ? NULL : b->done;
	if ((st = d->zero ? d->ops->reduce_scatter(d->ctx, d->m->grads_d + b->lo, d->zgrad + b->zoff,
						   b->c, KILN_F32, KILN_REDUCE_AVG, d->comm_stream,
						   done)
			  : d->ops->allreduce(d->ctx, d->m->grads_d + b->lo, b->hi - b->lo, KILN_F32,
					      KILN_REDUCE_AVG, d->comm_stream, done)))
		return st;
	if (d->timing &&
	    ((st = kiln_device_host_fn(d->dev, d->comm_stream, stamp_bucket, &b->s1)) ||
	     (st = kiln_device_event_record(d->dev, b->done, d->comm_stream))))
		return st;
	return KILN_OK;
}

void kiln_dist_timing(struct kiln_dist *d, double *exposed_s, double *comm_s, int64_t *steps)
{
	*exposed_s = d ? d->sum_exposed : 0;
	*comm_s = d ? d->sum_comm : 0;
	*steps = d ? d->sum_steps : 0;
}

static kiln_status bwd_hook(void *user, int layer, void *stream)
{
	struct kiln_dist *d = user;
	if (!d->overlap_now)
		return KILN_OK;
	for (int i = 0; i < d->n_b; i++) {
		struct bucket *b = &d->b[i];
		kiln_status st;
		if (!b->started && b->ready_layer == layer && (st = start_bucket(d, b, stream)))
			return st;
	}
	return KILN_OK;
}

kiln_status kiln_dist_attach(struct kiln_dist *d, struct kiln_model *m, void *compute)
{
	kiln_status st;
	d->m = m;
	if (!m->n_trainable)
		return KILN_OK;
	/* trainable tensors by descending offset */
	int n = 0;
	int *idx = malloc(sizeof(int) * (size_t)(m->n_params ? m->n_params : 1));
	if (!idx)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < m->n_params; i++)
		if (m->params[i].trainable && !m->params[i].buffer)
			idx[n++] = i;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && m->params[idx[j]].off > m->params[idx[j - 1]].off; j--) {
			int x = idx[j];
			idx[j] = idx[j - 1];
			idx[j - 1] = x;
		}
	size_t cap = (size_t)(d->bucket_mb * 1048576.0 / sizeof(float));
	if (cap < 1)
		cap = 1;
	d->b = calloc((size_t)(n ? n : 1), sizeof *d->b);
	if (!d->b) {
		free(idx);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	size_t hi = m->n_trainable;
	for (int k = 0; k < n;) {
		struct bucket *b = &d->b[d->n_b++];
		b->hi = hi;
		b->ready_layer = m->params[idx[k]].layer;
		do {
			const struct model_param *p = &m->params[idx[k]];
			b->lo = p->off;
			if (p->layer < b->ready_layer)
				b->ready_layer = p->layer;
			k++;
		} while (k < n && b->hi - b->lo < cap);
		if (k == n)
			b->lo = 0;
		hi = b->lo;
	}
	free(idx);
	for (int i = 0; i < d->n_b; i++) {
		if ((st = kiln_device_event_create(d->dev, &d->b[i].done)))
			return st;
		d->b[i].s0 = (struct stamp){ d, i, 0 };
		d->b[i].s1 = (struct stamp){ d, i, 1 };
	}
	d->s_bwd.d = d->s_opt.d = d;
	/* the padding between tensors is never written by backward: zero it,
	 * so averaging it is harmless */
	{
		struct kiln_op op;
		void *fill;
		int64_t ne = (int64_t)m->n_trainable;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_FILL;
		op.n_out = 1;
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &ne);
		if ((st = kiln_device_prepare(d->dev, &op, &fill, NULL)))
			return st;
		struct kiln_op_args a = { .out = { m->grads_d } };
		st = kiln_device_run(d->dev, fill, &a, compute);
		kiln_status st2 = kiln_device_stream_sync(d->dev, compute);
		kiln_device_plan_free(d->dev, fill);
		if (st || st2)
			return st ? st : st2;
	}
	m->bwd_hook = bwd_hook;
	m->bwd_user = d;
	kiln_log(KILN_LOG_INFO, "dist", "%d gradient bucket(s) of up to %.3g MiB over %zu floats; allreduce %s backward",
		 d->n_b, d->bucket_mb, m->n_trainable, d->overlap ? "overlapped with" : "after");
	for (int i = 0; i < d->n_b; i++)
		kiln_log(KILN_LOG_DEBUG, "dist", "bucket %d: [%zu, %zu) after the backward of '%s'", i,
			 d->b[i].lo, d->b[i].hi, m->layers[d->b[i].ready_layer].name);
	return KILN_OK;
}

void kiln_dist_overlap_next(struct kiln_dist *d, int on)
{
	if (d)
		d->overlap_now = on && d->overlap;
}


/* ---- ZeRO-1 ---------------------------------------------------------------
 * The trainable range [0, n) is cut into buckets of whole units of
 * 16*world floats covering [0, zwc) (of about [dist] bucket_mb, cut from
 * the end like DDP's, without regard to tensor boundaries) and the
 * replicated tail [zwc, n), zt = n - zwc < 16*world floats.  Rank r
 * owns piece r of every bucket: the c = (hi - lo) / world floats from
 * lo + r*c (lo and c multiples of 16: 64-byte aligned), kept at zoff in
 * its compact shard, zc floats in all.  During
 * backward each bucket's gradients are reduce-scattered (average) into
 * zgrad as soon as they are final (the same hook and comm stream as DDP's
 * allreduces); the tail is allreduced after backward.  Each rank updates
 * its pieces of the parameters (and the tail, identically on every rank)
 * with the fused optimizer op over each piece and its own slice of the
 * state, then every bucket's pieces are allgathered in place.  The
 * optimizer state held is (zc + zt) floats a slot instead of n.
 * Checkpoints gather the state whole first (kiln_dist_zero_gather), so
 * their files do not depend on the world size.  When a clip op runs
 * (GRAD_CLIP or UNSCALE: [train] clip_norm, clip_value, skip_nonfinite,
 * loss scaling) the averaged pieces are allgathered back into the
 * gradient buffer first, so the norm and the finite flag are the global
 * ones and identical on every rank. */

static kiln_status zero_plan(struct kiln_dist *d, size_t len, void **plan)
{
	struct kiln_model *m = d->m;
	struct kiln_op op = m->optim_op;
	const int64_t n = (int64_t)m->n_trainable;
	/* the per-element inputs and outputs: grads, the multiplier, state */
	op.i[0] = (int64_t)len;
	for (int k = 0; k < op.n_in; k++)
		if (op.in[k].ndim == 1 && op.in[k].dtype == KILN_F32 && op.in[k].dims[0] == n &&
		    (k == 0 || (m->wd_mult_d && k == op.n_in - 1 - !!(op.flags & KILN_OPF_GATED))))
			op.in[k].dims[0] = (int64_t)len;
	for (int k = 0; k < op.n_out; k++)
		op.out[k].dims[0] = (int64_t)len;
	size_t ws = 0;
	kiln_status st = kiln_device_prepare(d->dev, &op, plan, &ws);
	if (!st && ws)
		st = kiln_error(KILN_EINTERNAL, "ZeRO-1: the optimizer op asks for workspace");
	return st;
}

/* ZeRO-1's buckets in place of DDP's, with their pieces and plans */
static kiln_status zero_buckets(struct kiln_dist *d)
{
	struct kiln_model *m = d->m;
	const size_t n = m->n_trainable, W = (size_t)d->env.world, u = 16 * W;
	size_t cap = (size_t)(d->bucket_mb * 1048576.0 / sizeof(float)) / u * u;
	kiln_status st;
	if (cap < u)
		cap = u;
	free_buckets(d);
	d->zt = n % u;
	d->zwc = n - d->zt;
	d->zc = 0;
	const size_t nb = (d->zwc + cap - 1) / cap;
	if (!(d->b = calloc(nb ? nb : 1, sizeof *d->b)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (size_t hi = d->zwc; hi > 0; d->n_b++) {
		struct bucket *b = &d->b[d->n_b];
		b->hi = hi;
		b->lo = hi > cap ? hi - cap : 0;
		b->c = (b->hi - b->lo) / W;
		b->zoff = d->zc;
		d->zc += b->c;
		/* final after the backward of the first layer with a tensor
		 * in it (-1: padding only, started after backward) */
		b->ready_layer = -1;
		for (int i = 0; i < m->n_params; i++) {
			const struct model_param *p = &m->params[i];
			if (p->trainable && !p->buffer && p->off < b->hi &&
			    p->off + (size_t)p->numel > b->lo &&
			    (b->ready_layer < 0 || p->layer < b->ready_layer))
				b->ready_layer = p->layer;
		}
		/* the next forward needs the bucket's parameters whole before
		 * the first layer that reads one of them (a tied weight's
		 * readers included) */
		b->need_layer = m->n_layers;
		for (int l = 0; l < m->n_layers && b->need_layer == m->n_layers; l++)
			for (int k = 0; k < m->layers[l].n_params; k++) {
				const struct model_param *p = &m->params[m->layers[l].pidx[k]];
				if (!p->buffer && p->off < b->hi && p->off + (size_t)p->numel > b->lo)
					b->need_layer = l;
			}
		b->s0 = (struct stamp){ d, d->n_b, 0 };
		b->s1 = (struct stamp){ d, d->n_b, 1 };
		b->sg = (struct stamp){ d, d->n_b, 2 };
		b->sw = (struct stamp){ d, d->n_b, 0 };
		/* (a failure counts this bucket in, so free_buckets
		 * releases what it has) */
		if ((st = kiln_device_event_create(d->dev, &b->done)) ||
		    (st = kiln_device_event_create(d->dev, &b->gdone))) {
			d->n_b++;
			return st;
		}
		for (int k = 0; k < d->n_b && !b->plan; k++)
			if (d->b[k].c == b->c)
				b->plan = d->b[k].plan;
		if (!b->plan) {
			if ((st = zero_plan(d, b->c, &b->plan))) {
				d->n_b++;
				return st;
			}
			b->own_plan = 1;
		}
		hi = b->lo;
	}
	if ((d->zt && (st = zero_plan(d, d->zt, &d->ztplan))) ||
	    (st = kiln_device_event_create(d->dev, &d->zt_done)))
		return st;
	return KILN_OK;
}

static kiln_status fwd_hook(void *user, int layer, void *stream);

kiln_status kiln_dist_zero_init(struct kiln_dist *d, void *compute, int clip)
{
	kiln_status st;
	if (!d || !d->zero)
		return KILN_OK;
	struct kiln_model *m = d->m;
	const size_t n = m->n_trainable, r = (size_t)d->env.rank;
	if (m->optim_op.type == KILN_OP_LAMB)
		return kiln_error(KILN_ECONFIG, "%s: [dist] zero = 1 with [train] optimizer = lamb: LAMB's trust ratio needs each tensor whole, and ZeRO-1's shards cut tensors; use sgd or adamw, or zero = 0",
				  kiln_config_where(m->cfg, "dist", "zero"));
	if (!d->ops->reduce_scatter || !d->ops->allgather)
		return kiln_error(KILN_EPLUGIN, "%s: [dist] zero = 1: comm plugin '%s' has no reduce_scatter or allgather",
				  kiln_config_where(m->cfg, "dist", "zero"), d->plugin->name);
	d->zero_gather = clip;
	if ((st = zero_buckets(d)))
		return kiln_error_wrap(st, "ZeRO-1: the optimizer over a shard");
	const size_t L = d->zc + d->zt, slots = (size_t)m->state_slots;
	if ((slots && L && (st = kiln_device_alloc(d->dev, slots * L * sizeof(float), (void **)&d->zstate))) ||
	    (d->zc && (st = kiln_device_alloc(d->dev, d->zc * sizeof(float), (void **)&d->zgrad))))
		return st;
	/* keep this rank's pieces of the (broadcast) state, free the rest */
	for (size_t s = 0; s < slots && m->state_d; s++) {
		const float *src = m->state_d + s * n;
		float *dst = d->zstate + s * L;
		for (int i = 0; i < d->n_b; i++) {
			const struct bucket *b = &d->b[i];
			if ((st = kiln_device_copy_async(d->dev, dst + b->zoff, src + b->lo + r * b->c,
							 b->c * sizeof(float), KILN_COPY_D2D, compute)))
				return st;
		}
		if (d->zt && (st = kiln_device_copy_async(d->dev, dst + d->zc, src + d->zwc,
							   d->zt * sizeof(float), KILN_COPY_D2D,
							   compute)))
			return st;
	}
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return st;
	kiln_device_free(d->dev, m->state_d);
	m->state_d = NULL;
	kiln_device_plan_free(d->dev, m->optim_plan);
	m->optim_plan = NULL;
	d->s_read.d = d;
	m->fwd_hook = fwd_hook;
	m->fwd_user = d;
	kiln_log(KILN_LOG_INFO, "dist", "ZeRO-1: rank %d updates %zu floats, 1/%d of each of %d gradient bucket(s), and the replicated tail [%zu, %zu); optimizer state %.2f MiB instead of %.2f MiB; gradients reduce-scattered %s backward%s; parameters allgathered %s",
		 d->env.rank, d->zc, d->env.world, d->n_b, d->zwc, n,
		 (double)(slots * L * sizeof(float)) / 1048576.0,
		 (double)(slots * n * sizeof(float)) / 1048576.0,
		 d->overlap ? "overlapped with" : "after",
		 clip ? ", then gathered whole for the clip / non-finite check" : "",
		 d->overlap ? "on the comm stream, overlapped with the next forward"
			    : "after the optimizer, before the next forward");
	return KILN_OK;
}

int kiln_dist_zero(const struct kiln_dist *d)
{
	return d && d->zero;
}

/* the optimizer over [lo, ...) of the flat parameters, its state at st0 */
static kiln_status zero_run(struct kiln_dist *d, void *plan, const float *grads, size_t lo,
			    float *st0, const float *lr, void *compute)
{
	struct kiln_model *m = d->m;
	const struct kiln_op *op = &m->optim_op;
	struct kiln_op_args a;
	int k = 0;
	memset(&a, 0, sizeof a);
	a.in[k++] = grads;
	a.in[k++] = lr;
	if (op->type != KILN_OP_SGD)
		a.in[k++] = m->opt_step_d;
	if (m->wd_mult_d)
		a.in[k++] = m->wd_mult_d + lo;
	if (op->flags & KILN_OPF_GATED)
		a.in[k++] = m->step_ok_d;
	a.out[0] = m->params_d + lo;
	for (int s = 0; s < m->state_slots; s++)
		a.out[1 + s] = st0 ? st0 + (size_t)s * (d->zc + d->zt) : NULL;
	/* low-precision compute: the piece's compute copy, in the same pass */
	if (m->params_c)
		a.out[op->n_out - 1] = (char *)m->params_c + lo * kiln_dtype_size(m->cdtype);
	return kiln_device_run(d->dev, plan, &a, compute);
}

/* [dist] timing's host functions for the parameter allgathers (their
 * ends: stamp_bucket): the first reader's start (compute), and, once the
 * compute stream waited for bucket b, whether it ended after that start */
static kiln_status stamp_read(void *arg)
{
	struct stamp *s = arg;
	s->d->t_read = kiln_now_s();
	return KILN_OK;
}

static kiln_status stamp_waited(void *arg)
{
	struct stamp *s = arg;
	s->d->glate += s->d->b[s->b].tg > s->d->t_read;
	s->d->gruns++;
	return KILN_OK;
}

/* Make `stream` wait for the parameter allgather of every pending bucket
 * the forward of layers [0, layer] reads (layer >= n_layers: all of
 * them).  No-op when none is pending: only the first reader after a
 * ZeRO-1 step waits. */
static kiln_status zero_wait_params(struct kiln_dist *d, int layer, void *stream)
{
	kiln_status st;
	int left = 0;
	if (!d->zpending)
		return KILN_OK;
	if (d->timing && !d->read_stamped) {
		if ((st = kiln_device_host_fn(d->dev, stream, stamp_read, &d->s_read)))
			return st;
		d->read_stamped = 1;
	}
	for (int i = d->n_b - 1; i >= 0; i--) {
		struct bucket *b = &d->b[i];
		if (!b->gpending)
			continue;
		if (b->need_layer > layer) {
			left = 1;
			continue;
		}
		if ((st = kiln_device_stream_wait(d->dev, stream, b->gdone)) ||
		    (d->timing && (st = kiln_device_host_fn(d->dev, stream, stamp_waited, &b->sw))))
			return st;
		b->gpending = 0;
	}
	d->zpending = left;
	return KILN_OK;
}

static kiln_status fwd_hook(void *user, int layer, void *stream)
{
	return zero_wait_params(user, layer, stream);
}

kiln_status kiln_dist_zero_settle(struct kiln_dist *d, void *stream)
{
	return d && d->zero ? zero_wait_params(d, INT_MAX, stream) : KILN_OK;
}

/* Every bucket's pieces, from this rank's compact `mine` (zoff) into the
 * whole `full` (lo), or in place (mine NULL), on `stream`, the buckets
 * the first layers read first.  `params`: the parameters after a step
 * (and their low-precision compute copy, when there is one); each bucket
 * then records its gdone and is pending for the next forward
 * (zero_wait_params). */
static kiln_status zero_allgather(struct kiln_dist *d, const float *mine, float *full, void *stream,
				  int params)
{
	const struct kiln_model *m = d->m;
	const size_t r = (size_t)d->env.rank;
	const int lp = params && m->params_c;
	const size_t cs = lp ? kiln_dtype_size(m->cdtype) : 0;
	kiln_status st;
	for (int i = d->n_b - 1; i >= 0; i--) {
		struct bucket *b = &d->b[i];
		void *done = params && !d->timing ? b->gdone : NULL;
		char *pc = lp ? (char *)m->params_c + b->lo * cs : NULL;
		if ((st = d->ops->allgather(d->ctx, mine ? mine + b->zoff : full + b->lo + r * b->c,
					    full + b->lo, b->c, KILN_F32, stream, lp ? NULL : done)) ||
		    (lp && (st = d->ops->allgather(d->ctx, pc + r * b->c * cs, pc, b->c, m->cdtype,
						   stream, done))))
			return st;
		if (params && d->timing &&
		    ((st = kiln_device_host_fn(d->dev, stream, stamp_bucket, &b->sg)) ||
		     (st = kiln_device_event_record(d->dev, b->gdone, stream))))
			return st;
		b->gpending |= params;
	}
	if (params) {
		d->zpending = d->n_b > 0;
		d->read_stamped = 0;
	}
	return KILN_OK;
}

kiln_status kiln_dist_zero_step(struct kiln_dist *d, const float *lr, void *compute)
{
	struct kiln_model *m = d->m;
	kiln_status st;
	const size_t r = (size_t)d->env.rank;
	if (!m->n_trainable)
		return KILN_OK;
	/* the previous step's allgathers write the parameters this one
	 * updates (the forward waited for them all unless it skipped a
	 * layer) */
	if ((st = zero_wait_params(d, INT_MAX, compute)))
		return st;
	/* advance first (gated like the step: a skipped step is not counted):
	 * the op reads the (1-based) number of the step it takes */
	if ((st = kiln_model_opt_step_advance(m, compute)))
		return st;
	/* each piece reads the gradients the clip saw (whole, gathered back)
	 * or its own averaged piece */
	for (int i = 0; i < d->n_b; i++) {
		const struct bucket *b = &d->b[i];
		const size_t lo = b->lo + r * b->c;
		if ((st = zero_run(d, b->plan, d->zero_gather ? m->grads_d + lo : d->zgrad + b->zoff,
				   lo, d->zstate ? d->zstate + b->zoff : NULL, lr, compute)))
			return st;
	}
	if (d->zt && (st = zero_run(d, d->ztplan, m->grads_d + d->zwc, d->zwc,
				    d->zstate ? d->zstate + d->zc : NULL, lr, compute)))
		return st;
	/* every rank's updated pieces, in place: with overlap on the comm
	 * stream once the update is done, while the compute stream goes on
	 * to the next forward, whose layers wait for their buckets (fwd_hook);
	 * without, on the compute stream before it */
	void *s = compute;
	if (d->overlap && d->n_b) { /* (no buckets: nothing to gather) */
		if ((st = kiln_device_event_record(d->dev, d->ready, compute)) ||
		    (st = kiln_device_stream_wait(d->dev, d->comm_stream, d->ready)))
			return st;
		s = d->comm_stream;
	}
	return zero_allgather(d, NULL, m->params_d, s, 1);
}

kiln_status kiln_dist_zero_gather(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d ? d->m : NULL;
	kiln_status st;
	if (!d || !d->zero)
		return KILN_OK;
	/* the checkpoint reads the parameters whole, and no collective runs
	 * on the compute stream while the comm stream's do */
	if ((st = zero_wait_params(d, INT_MAX, compute)) || !d->zstate)
		return st;
	const size_t n = m->n_trainable, L = d->zc + d->zt;
	const int slots = m->state_slots;
	if (!d->zfull &&
	    (st = kiln_device_alloc(d->dev, (size_t)slots * n * sizeof(float), (void **)&d->zfull)))
		return st;
	for (int s = 0; s < slots; s++) {
		float *full = d->zfull + (size_t)s * n, *mine = d->zstate + (size_t)s * L;
		if ((st = zero_allgather(d, mine, full, compute, 0)) ||
		    (d->zt && (st = kiln_device_copy_async(d->dev, full + d->zwc, mine + d->zc,
							   d->zt * sizeof(float), KILN_COPY_D2D,
							   compute))))
			return st;
	}
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	m->state_d = d->zfull;
	return KILN_OK;
}

void kiln_dist_zero_release(struct kiln_dist *d)
{
	if (!d || !d->zfull)
		return;
	if (d->m && d->m->state_d == d->zfull)
		d->m->state_d = NULL;
	kiln_device_free(d->dev, d->zfull);
	d->zfull = NULL;
}

kiln_status kiln_dist_finish_grads(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	/* the backward (and accumulation) ends here on the compute stream */
	if (d->timing && (st = kiln_device_host_fn(d->dev, compute, stamp_bwd, &d->s_bwd)))
		return st;
	for (int i = 0; i < d->n_b; i++)
		if (!d->b[i].started && (st = start_bucket(d, &d->b[i], compute)))
			return st;
	/* ZeRO-1's replicated tail, final now */
	if (d->zero && d->zt &&
	    ((st = kiln_device_event_record(d->dev, d->ready, compute)) ||
	     (st = kiln_device_stream_wait(d->dev, d->comm_stream, d->ready)) ||
	     (st = d->ops->allreduce(d->ctx, d->m->grads_d + d->zwc, d->zt, KILN_F32, KILN_REDUCE_AVG,
				     d->comm_stream, d->zt_done)) ||
	     (st = kiln_device_stream_wait(d->dev, compute, d->zt_done))))
		return st;
	for (int i = 0; i < d->n_b; i++) {
		d->b[i].started = 0;
		if ((st = kiln_device_stream_wait(d->dev, compute, d->b[i].done)))
			return st;
	}
	/* the optimizer can start: what it waited since the backward ended is
	 * the exposed communication */
	if (d->timing && (st = kiln_device_host_fn(d->dev, compute, stamp_opt, &d->s_opt)))
		return st;
	d->overlap_now = 0;
	/* ZeRO-1 with a clip: the averaged pieces back into the whole gradient */
	if (d->zero && d->zero_gather)
		return zero_allgather(d, d->zgrad, d->m->grads_d, compute, 0);
	return KILN_OK;
}

kiln_status kiln_dist_broadcast_state(struct kiln_dist *d, void *compute)
{
	struct kiln_state_buf bufs[KILN_MAX_STATE_BUFS];
	int n = kiln_model_state_buffers(d->m, bufs, KILN_MAX_STATE_BUFS);
	kiln_status st;
	/* (collectives on the compute stream wait for the comm stream's) */
	if ((st = kiln_dist_zero_settle(d, compute)))
		return st;
	for (int i = 0; i < n; i++)
		if ((st = d->ops->broadcast(d->ctx, bufs[i].ptr, bufs[i].bytes, KILN_U8, 0, compute,
					    NULL)))
			return kiln_error_wrap(st, "broadcasting '%s' from rank 0", bufs[i].name);
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	kiln_log(KILN_LOG_INFO, "dist", "rank 0's training state broadcast (%d buffers)", n);
	return KILN_OK;
}

kiln_status kiln_dist_broadcast_host(struct kiln_dist *d, void *buf, size_t bytes, void *compute)
{
	void *dev_buf = NULL, *host = NULL;
	kiln_status st;
	if ((st = kiln_dist_zero_settle(d, compute)) ||
	    (st = kiln_device_alloc(d->dev, bytes, &dev_buf)) ||
	    (st = kiln_device_host_alloc(d->dev, bytes, &host)))
		goto out;
	memcpy(host, buf, bytes);
	if ((st = kiln_device_copy_async(d->dev, dev_buf, host, bytes, KILN_COPY_H2D, compute)) ||
	    (st = d->ops->broadcast(d->ctx, dev_buf, bytes, KILN_U8, 0, compute, NULL)) ||
	    (st = kiln_device_copy_async(d->dev, host, dev_buf, bytes, KILN_COPY_D2H, compute)) ||
	    (st = kiln_device_stream_sync(d->dev, compute))) {
		st = kiln_dist_explain(d, st);
		goto out;
	}
	memcpy(buf, host, bytes);
out:
	kiln_device_free(d->dev, dev_buf);
	kiln_device_host_free(d->dev, host);
	return st;
}

kiln_status kiln_dist_sum_host(struct kiln_dist *d, double *v, int n, void *compute)
{
	kiln_status st;
	if (!d)
		return KILN_OK;
	if (n > 64)
		return kiln_error(KILN_EINTERNAL, "kiln_dist_sum_host: %d values", n);
	for (int i = 0; i < n; i++)
		d->scratch_h[i] = (float)v[i];
	if ((st = kiln_dist_zero_settle(d, compute)) ||
	    (st = kiln_device_copy_async(d->dev, d->scratch_d, d->scratch_h, (size_t)n * 4,
					 KILN_COPY_H2D, compute)) ||
	    (st = d->ops->allreduce(d->ctx, d->scratch_d, (size_t)n, KILN_F32, KILN_REDUCE_SUM,
				    compute, NULL)) ||
	    (st = kiln_device_copy_async(d->dev, d->scratch_h, d->scratch_d, (size_t)n * 4,
					 KILN_COPY_D2H, compute)) ||
	    (st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	for (int i = 0; i < n; i++)
		v[i] = d->scratch_h[i];
	return KILN_OK;
}

kiln_status kiln_dist_share_grads(struct kiln_dist *d, struct kiln_model *m)
{
	void *mem = NULL;
	if (!d || d->env.world < 2 || d->zero)
		return KILN_OK;
	const size_t bytes = m->n_elems * sizeof(float);
	kiln_status st = d->ops->version >= 3 && d->ops->alloc_shared
				 ? d->ops->alloc_shared(d->ctx, bytes, &mem)
				 : kiln_error(KILN_ENOTSUP, "%s: no alloc_shared", d->plugin->name);
	if (st == KILN_ENOTSUP) {
		kiln_log(KILN_LOG_INFO, "dist", "gradients in device memory, allreduced through the communicator's own buffers (%s)",
			 kiln_last_error());
		return KILN_OK;
	}
	if (st)
		return st;
	/* the gradients are zero before the first step; copied all the same */
	memcpy(mem, m->grads_d, bytes);
	if (!m->grads_foreign)
		kiln_device_free(m->dev, m->grads_d);
	m->grads_d = mem;
	m->grads_foreign = 1;
	kiln_log(KILN_LOG_INFO, "dist", "gradients (%.3g MiB) in memory every rank's %s reaches: bucket allreduces copy nothing",
		 (double)bytes / 1048576.0, d->plugin->name);
	return KILN_OK;
}

/* whether a message begins with `word` (at its start or after ": ",
 * where a stream's or the caller's prefix ends) */
static int begins(const char *msg, const char *word)
{
	const size_t n = strlen(word);
	for (const char *p = msg; p; p = strstr(p, ": ")) {
		if (p != msg)
			p += 2;
		if (!strncmp(p, word, n))
			return 1;
	}
	return 0;
}

/* whether an error message is the communicator's (its plugin's messages
 * begin "NAME: ") or the store's and the rendezvous' ("store ",
 * "store: ", "rendezvous ") */
static int from_comm(const struct kiln_dist *d, const char *msg)
{
	char want[64];
	if (!msg)
		return 0;
	snprintf(want, sizeof want, "%s: ", d->plugin->name);
	return begins(msg, want) || begins(msg, "store ") || begins(msg, "store: ") ||
	       begins(msg, "rendezvous ");
}

kiln_status kiln_dist_explain(struct kiln_dist *d, kiln_status st)
{
	if (!d || !st || (st != KILN_EIO && st != KILN_ETIMEOUT && st != KILN_EDEVICE))
		return st;
	d->failed = 1;
	/* the store notices a dead process when its connection closes;
	 * give it a moment to have seen it (the query sets its own message) */
	char *msg = kiln_strdup(kiln_last_error());
	int lost = kiln_store_lost_rank(d->store, 3000);
	if (lost >= 0)
		st = kiln_error(st, "rank %d of %d: rank %d was lost (its process exited or its connection closed): %s",
				d->env.rank, d->env.world, lost, msg ? msg : "");
	else if (from_comm(d, msg))
		st = kiln_error(st, "rank %d of %d: a collective failed (no rank was reported lost; a peer may be stuck or unreachable; [dist] timeout = %.0f s): %s",
				d->env.rank, d->env.world, d->timeout_ms / 1000.0, msg ? msg : "");
	else /* this rank's own failure (a file, the device): as it was */
		st = kiln_error(st, "rank %d of %d: %s", d->env.rank, d->env.world, msg ? msg : "");
	free(msg);
	return st;
}
