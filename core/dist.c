/* core/dist.c - data-parallel training: joining the group and the
 * bucketed gradient allreduce (DESIGN.md section 4, docs/distributed.md).
 *
 * Buckets.  The trainable gradients are one flat buffer, laid out in layer
 * order, so the layers backward reaches first own its end.  Walking the
 * trainable tensors from the end, tensors join the current bucket until it
 * holds [dist] bucket_mb; each bucket is one contiguous slice [lo, hi) of
 * the flat buffer (alignment padding included: zero, and averaging zeros
 * keeps it zero).  A bucket is complete once the backward of the
 * lowest-indexed layer with a tensor in it (a tied tensor's: grad_layer,
 * core/tie.c) has run; the graph calls our
 * hook after every layer's backward, and the hook then records an event on
 * the compute stream, makes the comm stream wait for it and enqueues the
 * bucket's allreduce (average) there.  Backward of the earlier layers goes
 * on meanwhile; before the optimizer the compute stream waits for every
 * bucket's completion event.  Nothing here synchronises the host.
 *
 * Accumulation: micro-steps before the last do not communicate (PyTorch's
 * no_sync()); with accumulate > 1 the last micro-step adds into the
 * gradients, each micro-step's already its share of the mean (the loss
 * layers' seed, train_model.c plan_train: nothing scales them here, and
 * the average over the ranks is DDP's).  Where the layers' ops add, a
 * bucket is final after its ready layer's backward of the last
 * micro-step, which then starts it as without accumulation; where a
 * layer writes beside them (the trainer's grads_more, added after the
 * backward) every bucket starts after that add (kiln_dist_finish_grads),
 * without overlap.  kiln_dist_overlap_next says which.
 */
#include "dist_impl.h"
#include "store.h" /* STORE_LINGER_MS */
#include "../plugins/common/c_locale.h" /* common_snprintf_c: messages in the C locale */

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void (*fatal_fn)(const char *msg);

void kiln_set_fatal_handler(void (*fn)(const char *msg))
{
	fatal_fn = fn;
}

int kiln_host_fatal_ends(void)
{
	return fatal_fn != NULL;
}

void kiln_host_fatal(const char *who, const char *fmt, ...)
{
	char msg[KILN_ERROR_MAX];
	va_list ap;
	va_start(ap, fmt);
	common_vsnprintf_c(msg, sizeof msg, fmt, ap);
	va_end(ap);
	kiln_log(KILN_LOG_ERROR, who, "%s", msg);
	if (fatal_fn)
		fatal_fn(msg);
}

int kiln_dist_rank(const struct kiln_dist *d) { return d ? d->env.rank : 0; }
int kiln_dist_world(const struct kiln_dist *d) { return d ? d->env.world : 1; }
const char *kiln_dist_comm_name(const struct kiln_dist *d)
{
	return d && d->plugin ? d->plugin->name : NULL;
}

/* The communicator [run] comm names for a run of env.world > 1 ranks on
 * dev: auto is the device's (its traits), else mpi under Open MPI's
 * mpirun, gloo otherwise. */
static kiln_status comm_choose(const struct kiln_config *cfg, const struct kiln_registry *reg,
			       struct kiln_device *dev, const struct kiln_dist_env *env,
			       const char **out)
{
	const char *comm = kiln_config_get(cfg, "run", "comm");
	comm = comm && *comm ? comm : "auto";
	if (!strcmp(comm, "none"))
		return kiln_error(KILN_ECONFIG, "%s: [run] comm = none, but this process is rank %d of %d (from %s variables): name a communicator (gloo, mpi, nccl) or auto",
				  kiln_config_where(cfg, "run", "comm"), env->rank, env->world, env->source);
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
		else if (!strcmp(env->source, "Open MPI") &&
			 !kiln_registry_find(reg, KILN_PLUGIN_COMM, "mpi", &p))
			comm = "mpi";
		else
			comm = "gloo";
	}
	*out = comm;
	return KILN_OK;
}

int dist_rs_in_place(const struct kiln_comm_ops *ops)
{
	const char *v = getenv("KILN_TEST_RS_SEPARATE");
	return ops->version >= 9 && ops->reduce_scatter_in_place && !(v && *v && strcmp(v, "0"));
}

void kiln_dist_comm_guess(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  struct kiln_device *dev, const struct kiln_dist_env *env,
			  int *grads_shared, int *in_place)
{
	const struct kiln_plugin *p;
	const struct kiln_comm_ops *ops;
	const char *comm;
	char section[80];
	int64_t P = 1;
	int shm = 1, zero_copy = 1;
	*grads_shared = *in_place = 0;
	if (env->world < 2 || comm_choose(cfg, reg, dev, env, &comm) ||
	    kiln_registry_find(reg, KILN_PLUGIN_COMM, comm, &p))
		return;
	ops = p->ops;
	*in_place = dist_rs_in_place(ops);
	kiln_config_get_int(cfg, "dist", "pipeline", &P);
	snprintf(section, sizeof section, "plugin.%s", comm);
	kiln_config_get_bool(cfg, section, "shm", &shm);
	kiln_config_get_bool(cfg, section, "zero_copy", &zero_copy);
	*grads_shared = env->local_world == env->world && P <= 1 && ops->version >= 3 &&
			ops->alloc_shared && shm && zero_copy;
}

/* kiln launch --max-restarts started this rank again (KILN_RESTART > 0):
 * rank 0 of the failed run serves its last clients for up to
 * STORE_LINGER_MS before it exits, and a rank restarted at once (its
 * launcher saw it die first) would join that store, whose keys say the
 * rendezvous is done (it hung in Gloo's connect, then failed, spending the
 * restart).  So a restarted rank other than 0 waits that long first. */
int kiln_dist_restart_wait_ms(const struct kiln_dist_env *env)
{
	const char *v = getenv("KILN_RESTART");
	return env->rank && v && atoi(v) > 0 ? STORE_LINGER_MS + 1000 : 0;
}

static void restart_wait(const struct kiln_dist_env *env)
{
	const int ms = kiln_dist_restart_wait_ms(env);
	if (!ms)
		return;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d, restart %d: waiting %.1f s for the previous run's store to close",
		 env->rank, atoi(getenv("KILN_RESTART")), ms / 1000.0);
	for (int t = 0; t < ms && !kiln_stop_pending(); t += 50)
		usleep(50000);
}

kiln_status kiln_dist_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   struct kiln_device *dev, struct kiln_dist **out, int *own)
{
	struct kiln_dist *d;
	kiln_status st;
	struct kiln_dist_env env;
	const char *comm = kiln_config_get(cfg, "run", "comm");
	double timeout = 0, heartbeat = 0;
	*out = NULL;
	if (own)
		*own = 1; /* (until the store: nothing of the group's) */
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
	if ((st = comm_choose(cfg, reg, dev, &env, &comm)))
		return st;
	if (!(d = calloc(1, sizeof *d)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	d->env = env;
	d->dev = dev;
	/* unset, the schema's defaults (core/schema.c): no second copy here
	 * (overlap's 1 stood here and in core/train_buffers.c) */
	if ((st = kiln_config_get_float(cfg, "dist", "timeout", &timeout)) ||
	    (st = kiln_config_get_float(cfg, "dist", "heartbeat", &heartbeat)) ||
	    (st = kiln_config_get_float(cfg, "dist", "bucket_mb", &d->bucket_mb)) ||
	    (st = kiln_config_get_bool(cfg, "dist", "overlap", &d->overlap))) {
		free(d);
		return st;
	}
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
	restart_wait(&env);
	/* every deadline of the run's waits on the run clock, which a job
	 * suspended whole past [dist] timeout does not expire (session 33) */
	if ((st = kiln_run_clock_start()))
		goto fail;
	d->run_clock = 1;
	if ((st = kiln_store_open(env.master_addr, env.master_port, env.rank == 0, env.rank,
				  env.world, d->timeout_ms, &d->store)))
		goto fail;
	/* (the rendezvous posts kiln/host/RANK once this process's claim of
	 * the rank is won: posted before it, a second process for the rank
	 * replaced the real one's host name) */
	if ((st = kiln_store_rendezvous(d->store, env.rank, env.world, d->timeout_ms))) {
		d->failed = 1; /* rank 0 waits for no rank to leave: some never came */
		goto fail;
	}
	d->joined = 1;
	/* this rank's [dist] heartbeat posted for its peers' watchdogs
	 * (kiln/hb_limit/RANK: each judges a peer by the peer's own), then
	 * the watchdog from the rendezvous on, before the communicator
	 * connects: a peer cut off or stopped while the mesh connected went
	 * unnamed until the comm plugin's own timeouts (Gloo's: 6 and 12
	 * [dist] timeouts, session 34).  Its thread has a store connection
	 * of its own; every rank's claim is won here, so kiln/host/RANK,
	 * which it reads for its messages, is posted; a peer's limit not
	 * posted yet is read at the watchdog's later beats (dist_heartbeat.c
	 * read_limit) */
	if ((st = kiln_heartbeat_post(d->store, env.rank, heartbeat)) ||
	    (st = kiln_heartbeat_start(&env, env.master_addr, kiln_store_port(d->store), heartbeat,
				       &d->hb)))
		goto fail;
	if ((st = dist_config_agree(d, cfg, reg)))
		goto fail;
	if ((st = d->ops->open(kiln_host_table(), cfg, d->store, dev, env.rank, env.world,
			       d->timeout_ms, &d->ctx))) {
		/* the mesh's connect fails for a peer late or gone (or a
		 * link): no FAILED mark of this rank (review of session 34),
		 * unless its own allocation failed (kiln_dist_failed_own) */
		d->peer_blamed = 1;
		st = kiln_error_wrap(st, "rank %d of %d: opening the %s communicator", env.rank,
				     env.world, comm);
		goto fail;
	}
	if ((st = kiln_device_stream_create(dev, &d->comm_stream)) ||
	    (st = kiln_device_event_create(dev, &d->ready)) ||
	    (st = kiln_device_event_create(dev, &d->sync_done)) ||
	    (st = kiln_device_alloc_named(dev, 64 * sizeof(float), (void **)&d->scratch_d,
					  "the communicator's scratch sums")) ||
	    (st = kiln_device_host_alloc_named(dev, 64 * sizeof(float), (void **)&d->scratch_h,
					       "the communicator's scratch sums, their host copy")) ||
	    (st = kiln_device_alloc_named(dev, DIST_TOKEN_BYTES, &d->tok_d,
					  "the communicator's checkpoint token")) ||
	    (st = kiln_device_host_alloc_named(dev, DIST_TOKEN_BYTES, &d->tok_h,
					       "the communicator's checkpoint token, its host copy")))
		goto fail;
	{
		const char *desc = d->ops->version >= 2 && d->ops->describe ? d->ops->describe(d->ctx) : NULL;
		kiln_log(KILN_LOG_INFO, "dist", "rank %d of %d (local %d; from %s), comm %s%s%s, store " KILN_AT_FMT,
			 env.rank, env.world, env.local_rank, env.source, comm, desc ? ": " : "",
			 desc ? desc : "", KILN_AT_ARG(env.master_addr, kiln_store_port(d->store)));
	}
	/* open: an answer of the store this process had no memory for on
	 * the way (a plugin's read it did without, a try made again) was not
	 * its failure, and a peer's later is not told as this rank's own out
	 * of memory (session 40) */
	kiln_store_oom_clear(d->store);
	*out = d;
	return KILN_OK;
fail:
	if (st == KILN_ENOMEM) /* (its store's answers: named as a rank's) */
		st = kiln_dist_name_own(d, st);
	if (own)
		*own = st == KILN_ENOMEM || kiln_store_oom(d->store) ||
		       (d->joined && kiln_dist_failed_own(d));
	kiln_dist_close(d);
	return st;
}

/* After this rank copied its share of the whole optimizer state on
 * `compute` (ZeRO-1's shard, a pipeline stage's slice): wait for the
 * copies, then free the whole state and the whole-model optimizer plan. */
kiln_status dist_drop_whole_state(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	kiln_status st = kiln_device_stream_sync(d->dev, compute);
	if (st)
		return st;
	kiln_device_free(d->dev, m->state_d);
	m->state_d = NULL;
	kiln_model_optim_plan_free(m, m->optim_plan);
	m->optim_plan = NULL;
	return KILN_OK;
}

void dist_free_buckets(struct kiln_dist *d)
{
	for (int i = 0; i < d->n_b; i++) {
		kiln_device_event_destroy(d->dev, d->b[i].done);
		kiln_device_event_destroy(d->dev, d->b[i].gdone);
		if (d->b[i].own_plan)
			kiln_model_optim_plan_free(d->m, d->b[i].plan);
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
	/* past its last collective this rank's silence is no fault: the
	 * finish below is bounded by [dist] timeout */
	kiln_heartbeat_stop(d->hb, !st);
	d->hb = NULL;
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
	else if (!st && which == 0) { /* "rank N failed": what it said */
		char said[FAILED_SAID_MAX];
		int r = -1;
		sscanf(v, "rank %d", &r);
		kiln_dist_failed_said(d->store, r, said, sizeof said);
		st = kiln_error(KILN_EIO, "%s after the last collective%s", (const char *)v, said);
	}
	else if (!st)
		st = kiln_error(KILN_EIO, "rank %s was lost after the last collective (its process exited or its connection closed)",
				(const char *)v);
	free(v);
	/* a peer's failure, loss or lateness, not this rank's own
	 * (close_mark_failed) */
	d->peer_blamed = !!st;
	if (st)
		return kiln_error_wrap(st, "rank %d of %d: waiting for every rank to finish",
				       d->env.rank, d->env.world);
	return KILN_OK;
}

#define CLOSE_MARK_MS 5000 /* close_mark_failed's store calls, all together */

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ms left until end_ms (mono_ms), at least 1 */
static int ms_left(int64_t end_ms)
{
	const int64_t left = end_ms - mono_ms();
	return left > 1 ? (int)left : 1;
}

int kiln_dist_failed_own(struct kiln_dist *d)
{
	if (!d || d->env.world < 2)
		return 1;
	/* an allocation of this process failed asking the store: its own
	 * failure, whatever the caller (a communicator's connect, a wait for
	 * a peer's key) made of the status, a lost connection or a peer's
	 * silence (session 39) */
	if (kiln_store_oom(d->store))
		return 1;
	return !d->agreed && !d->peer_blamed && !kiln_stop_pending();
}

/* the most of a failed rank's message its peers quote: its start and
 * its end (the cause, last) around "..." */
#define FAILED_WHY_MAX 1000

/* Post d->why as kiln/failed_why within ms (at most FAILED_WHY_MAX
 * bytes). */
static void failed_why_post(struct kiln_dist *d, int ms)
{
	char cut[FAILED_WHY_MAX + 1];
	const char *w = d->why;
	size_t n = strlen(w);
	if (n > FAILED_WHY_MAX) {
		const size_t head = FAILED_WHY_MAX / 4, tail = FAILED_WHY_MAX - head - 3;
		memcpy(cut, w, head);
		memcpy(cut + head, "...", 3);
		memcpy(cut + head + 3, w + n - tail, tail);
		w = cut;
		n = FAILED_WHY_MAX;
	}
	kiln_store_set_within(d->store, "kiln/failed_why", w, n, ms);
}

void kiln_dist_failed_said(struct kiln_store *s, int r, char *out, size_t n)
{
	void *v = NULL;
	size_t len = 0;
	out[0] = 0;
	/* (rank r's: the first rank to fail posts both, its message first;
	 * read best-effort: a quote this process had no memory for is left
	 * out, not its own failure, session 40) */
	if (kiln_store_peek(s, "kiln/failed_rank", &v, NULL) || !v || atoi(v) != r) {
		free(v);
		return;
	}
	free(v);
	v = NULL;
	if (!kiln_store_peek(s, "kiln/failed_why", &v, &len) && v && len)
		snprintf(out, n, "; rank %d said: %s", r, (const char *)v);
	free(v);
}

/* A rank leaving unfinished after the rendezvous with an error of its
 * own (a data file, the device; not a peer's loss or failure the
 * communicator or the store showed it, nor an outcome every rank agreed
 * on, nor a stop asked for), and the first to: it posts its rank as
 * kiln/failed_rank, which kiln_dist_explain reads, and marks its
 * heartbeat counter FAILED, which the peers' watchdogs read, so they end
 * at once naming it (before session 34 they waited for [dist] heartbeat
 * or timeout and blamed silence, a frozen peer or no rank at all). */
static void close_mark_failed(struct kiln_dist *d)
{
	int64_t n = 0;
	void *v = NULL;
	if (!d->store || d->env.world < 2 || !d->joined || d->finished || !kiln_dist_failed_own(d))
		return;
	/* within CLOSE_MARK_MS in all, as the finished_all set in
	 * kiln_dist_close: a rank whose link to the store is cut waited a
	 * whole [dist] timeout on its first call here (its connection then
	 * broken, the others fail at once), after its own error (review of
	 * session 34) */
	const int64_t end = mono_ms() + CLOSE_MARK_MS;
	const int lost = !kiln_store_check_within(d->store, "kiln/lost", &v, NULL, ms_left(end)) && v;
	free(v);
	if (lost || kiln_store_add_within(d->store, "kiln/failed", 1, &n, ms_left(end)) || n != 1)
		return;
	/* its message before its rank: a peer that reads the rank (or the
	 * heartbeat's FAILED mark) finds the message there (session 39:
	 * before, "its log says why", on another node for a multi-node run) */
	if (d->why && *d->why)
		failed_why_post(d, ms_left(end));
	char r[24];
	const int k = snprintf(r, sizeof r, "%d", d->env.rank);
	if (!kiln_store_set_within(d->store, "kiln/failed_rank", r, (size_t)k, ms_left(end)))
		kiln_heartbeat_mark_failed(d->store, d->env.rank, ms_left(end));
}

void kiln_dist_leave(struct kiln_dist *d)
{
	if (!d)
		return;
	kiln_heartbeat_leave(d->hb);
	if (!d->why)
		d->why = kiln_strdup(kiln_last_error());
}

void kiln_dist_close(struct kiln_dist *d)
{
	if (!d)
		return;
	/* leaving may fail too (peers gone): keep the message that matters */
	char *msg = kiln_strdup(kiln_last_error());
	/* (a rank closed after kiln_dist_open failed: its own message) */
	kiln_dist_leave(d);
	close_mark_failed(d);
	kiln_heartbeat_stop(d->hb, 0);
	d->hb = NULL;
	if (d->comm_stream)
		kiln_device_stream_sync(d->dev, d->comm_stream);
	if (d->timing && d->runs)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d: %lld of %lld bucket %s began before the backward ended",
			 d->env.rank, (long long)d->early, (long long)d->runs,
			 d->zero ? "reduce-scatters" : "allreduces");
	if (d->starts && d->pipe_P)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): %lld of %lld bucket %s started during the stage's last micro-batch's backward",
			 d->env.rank, d->pipe_stage, (long long)d->hooked, (long long)d->starts,
			 d->zero ? "reduce-scatters" : "allreduces");
	else if (d->starts) /* (enqueued by the hook: during the backward) */
		kiln_log(KILN_LOG_INFO, "dist", "rank %d: %lld of %lld bucket %s started during the backward",
			 d->env.rank, (long long)d->hooked, (long long)d->starts,
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
	dist_free_buckets(d);
	if (d->ztplan)
		kiln_model_optim_plan_free(d->m, d->ztplan);
	kiln_device_event_destroy(d->dev, d->zt_done);
	kiln_device_free(d->dev, d->zstate);
	kiln_device_free(d->dev, d->zgrad);
	if (d->m && d->zfull && d->m->state_d == d->zfull)
		d->m->state_d = NULL;
	kiln_device_free(d->dev, d->zfull);
	/* a rank leaving without having finished tells the peers waiting
	 * in kiln_dist_finish, which then fail at once, naming it; one that
	 * never joined is none of theirs (refused at the rendezvous); at
	 * most 5 s: a rank whose link to the store is cut waited a whole
	 * [dist] timeout more here, after its own had failed it (session 34) */
	if (d->store && d->env.world > 1 && d->joined && !d->finished) {
		char why[64];
		int k = snprintf(why, sizeof why, "rank %d failed", d->env.rank);
		kiln_store_set_within(d->store, "kiln/finished_all", why, (size_t)k, 5000);
	}
	if (d->pipe_measure)
		kiln_device_plan_free(d->dev, d->pipe_measure);
	if (d->pipe_plan)
		kiln_model_optim_plan_free(d->m, d->pipe_plan);
	kiln_device_free(d->dev, d->pipe_state);
	kiln_device_free(d->dev, d->pipe_norms);
	kiln_dist_pipe_mem_free(d);
	free(d->pipe_lo);
	free(d->pipe_hi);
	if (d->gctx)
		d->ops->close(d->gctx);
	if (d->pctx)
		d->ops->close(d->pctx);
	if (d->ctx)
		d->ops->close(d->ctx);
	kiln_device_event_destroy(d->dev, d->ready);
	kiln_device_event_destroy(d->dev, d->sync_done);
	kiln_device_stream_destroy(d->dev, d->comm_stream);
	kiln_device_free(d->dev, d->scratch_d);
	kiln_device_host_free(d->dev, d->scratch_h);
	kiln_device_free(d->dev, d->tok_d);
	kiln_device_host_free(d->dev, d->tok_h);
	if (d->store) {
		/* rank 0 hosts the store: it leaves last (unless a peer is gone);
		 * a process refused at the rendezvous is not one of the ranks
		 * that leave (counted, rank 0 stopped the store one rank early) */
		int64_t n = 0;
		if (d->joined && !kiln_store_add(d->store, "kiln/left", 1, &n)) {
			if (n == d->env.world)
				kiln_store_set(d->store, "kiln/left_all", "1", 1);
			/* polled with kiln/lost, not a get of left_all: a
			 * peer that died (or that its watchdog ended before
			 * session 35, uncounted: dist_heartbeat.c, post_left)
			 * never leaves, and rank 0 waited the whole 10 s
			 * before its caller could print its own error (the
			 * store lingers for the ranks still there once one
			 * was lost, store_server.c) */
			static const char *const keys[] = { "kiln/left_all", "kiln/lost" };
			int which = -1;
			void *v = NULL;
			if (d->env.rank == 0 && n < d->env.world && !d->failed)
				kiln_store_poll(d->store, keys, 2,
						d->timeout_ms < 10000 ? d->timeout_ms : 10000, &which, &v);
			free(v);
		}
		kiln_store_close(d->store);
	}
	if (d->run_clock)
		kiln_run_clock_stop();
	free(d->why);
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
	/* (with [dist] pipeline: the stage's D ranks) */
	st = d->ops->allreduce(d->gctx ? d->gctx : d->ctx, buf, count, dtype, op, d->comm_stream,
			       d->sync_done);
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
	st = d->ops->allgather(d->gctx ? d->gctx : d->ctx, send, recv, count, dtype, d->comm_stream,
			       d->sync_done);
	return group_end(d, st, "allgather", count, stream);
}

/* ---- buckets ------------------------------------------------------------- */

/* [dist] timing's host functions */
kiln_status dist_stamp_bucket(void *arg)
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
	d->starts++;
	if (d->timing && (st = kiln_device_host_fn(d->dev, d->comm_stream, dist_stamp_bucket, &b->s0)))
		return st;
	void *done = d->timing ? NULL : b->done;
	if ((st = d->zero ? d->ops->reduce_scatter(dist_zero_comm(d), d->m->grads_d + b->lo,
						   dist_zero_piece(d, b), b->c, KILN_F32,
						   KILN_REDUCE_AVG, d->comm_stream, done)
			  : d->ops->allreduce(d->gctx ? d->gctx : d->ctx, d->m->grads_d + b->lo, b->hi - b->lo, KILN_F32,
					      KILN_REDUCE_AVG, d->comm_stream, done)))
		return st;
	if (d->timing &&
	    ((st = kiln_device_host_fn(d->dev, d->comm_stream, dist_stamp_bucket, &b->s1)) ||
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
	/* (a pipeline stage's: during its last micro-batch's backward) */
	if (!d->overlap_now && !(d->pipe_overlap && d->m->grad_final))
		return KILN_OK;
	for (int i = 0; i < d->n_b; i++) {
		struct bucket *b = &d->b[i];
		kiln_status st;
		if (b->started || b->ready_layer != layer)
			continue;
		if ((st = start_bucket(d, b, stream)))
			return st;
		d->hooked++;
	}
	return KILN_OK;
}

kiln_status kiln_dist_attach(struct kiln_dist *d, struct kiln_model *m, void *compute)
{
	kiln_status st;
	d->m = m;
	if (!m->n_trainable)
		return KILN_OK;
	/* the gradients averaged: all, or with [dist] pipeline this stage's
	 * slice over its D ranks (none when the stage has one rank) */
	size_t glo = 0, ghi = m->n_trainable;
	if (d->pipe_P) {
		glo = d->pipe_lo[d->pipe_stage];
		ghi = d->pipe_D > 1 ? d->pipe_hi[d->pipe_stage] : glo;
	}
	/* trainable tensors by descending offset */
	int n = 0;
	int *idx = malloc(sizeof(int) * (size_t)(m->n_params ? m->n_params : 1));
	if (!idx)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < m->n_params; i++)
		if (m->params[i].trainable && !m->params[i].buffer && m->params[i].off >= glo &&
		    m->params[i].off < ghi)
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
	size_t hi = ghi;
	for (int k = 0; k < n;) {
		struct bucket *b = &d->b[d->n_b++];
		b->hi = hi;
		b->ready_layer = m->params[idx[k]].grad_layer;
		do {
			const struct model_param *p = &m->params[idx[k]];
			b->lo = p->off;
			if (p->grad_layer < b->ready_layer)
				b->ready_layer = p->grad_layer;
			k++;
		} while (k < n && b->hi - b->lo < cap);
		if (k == n)
			b->lo = glo;
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
		float *g = m->grads_d;
		size_t gn = m->n_trainable;
		kiln_dist_pipe_grad_span(d, &g, &gn); /* (the stage's, when cut) */
		int64_t ne = (int64_t)gn;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_FILL;
		op.n_out = 1;
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &ne);
		if ((st = kiln_device_prepare(d->dev, &op, &fill, NULL)))
			return st;
		struct kiln_op_args a = { .out = { g } };
		st = kiln_device_run(d->dev, fill, &a, compute);
		kiln_status st2 = kiln_device_stream_sync(d->dev, compute);
		kiln_device_plan_free(d->dev, fill);
		if (st || st2)
			return st ? st : st2;
	}
	m->bwd_hook = bwd_hook;
	m->bwd_user = d;
	if (d->pipe_P && !d->n_b)
		kiln_log(KILN_LOG_INFO, "dist", "no gradient buckets: pipeline stage %d has %s (nothing to average)",
			 d->pipe_stage, d->pipe_D > 1 ? "no trainable parameters" : "one rank");
	else
		kiln_log(KILN_LOG_INFO, "dist", "%d gradient bucket(s) of up to %.3g MiB over %zu floats [%zu, %zu); allreduce %s backward",
			 d->n_b, d->bucket_mb, ghi - glo, glo, ghi,
			 d->pipe_P    ? "by the end of the stage's last micro-batch's"
			 : d->overlap ? "overlapped with"
				      : "after");
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

int kiln_dist_overlap(const struct kiln_dist *d)
{
	return d && d->overlap;
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
	     (st = d->ops->allreduce(dist_zero_comm(d), d->m->grads_d + d->zwc, d->zt, KILN_F32, KILN_REDUCE_AVG,
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
	/* ZeRO-1 with a clip: the averaged pieces back into the whole gradient
	 * (zgrad NULL: from their place in it) */
	if (d->zero && d->zero_gather)
		return dist_zero_allgather(d, d->zgrad, d->m->grads_d, compute, 0);
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
	/* (a stage's rank holding its slice since start-up drew it as every
	 * rank of its stage did, and rank 0 has no other stage's) */
	size_t lo, hi;
	const int held = d->m->held && kiln_dist_pipe_held(d, &lo, &hi);
	for (int i = 0; i < n; i++)
		if ((!held || strcmp(bufs[i].name, "params")) &&
		    (st = d->ops->broadcast(d->ctx, bufs[i].ptr, bufs[i].bytes, KILN_U8, 0, compute,
					    NULL)))
			return kiln_error_wrap(st, "broadcasting '%s' from rank 0", bufs[i].name);
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	/* (held: no rank starts its stage's hand-offs while another is still
	 * in these collectives, as the parameters' broadcast made them wait
	 * before: without, 4 stages on kiln-mpi hung at times under load,
	 * tests/pipeline_dist.sh section 3; not diagnosed further) */
	if (held && d->ops->barrier && (st = d->ops->barrier(d->ctx)))
		return kiln_dist_explain(d, kiln_error_wrap(st, "rank %d of %d: the barrier after rank 0's training state",
							     d->env.rank, d->env.world));
	kiln_log(KILN_LOG_INFO, "dist", "rank 0's training state broadcast (%d buffers)", n);
	return KILN_OK;
}

kiln_status kiln_dist_eval_buffers(struct kiln_dist *d, void *compute)
{
	const struct kiln_model *m = d ? d->m : NULL;
	const int P = d && d->pipe_P > 1 ? d->pipe_P : 1;
	const int staged = kiln_dist_pipe_eval_staged(d);
	kiln_status st;
	if (!m || !m->n_buf_elems || d->sync_bn || d->env.world / P < 2 || (P > 1 && !staged))
		return KILN_OK;
	/* (after the comm stream's work, as every collective on compute) */
	kiln_status own = kiln_dist_ckpt_fault_at(d, "evalbuf", "waiting for the comm stream");
	if (!own && d->comm_stream &&
	    !(own = kiln_device_event_record(d->dev, d->ready, d->comm_stream)))
		own = kiln_device_stream_wait(d->dev, compute, d->ready);
	if (!own)
		own = kiln_dist_zero_settle(d, compute);
	/* the local steps' outcome agreed before the broadcast: a rank that
	 * failed in them alone would leave its peers in the broadcast until
	 * [dist] timeout (session 43's review) */
	double none = 0;
	if ((st = kiln_dist_sum_agreed(d, own, &none, 0, "rank 0's batchnorm running statistics for the evaluation",
				       compute)))
		return st;
	if ((st = d->ops->broadcast(staged ? d->gctx : d->ctx, m->buffers_d,
				    m->n_buf_elems * sizeof(float), KILN_U8, 0, compute, NULL)))
		return kiln_dist_explain(d, kiln_error_wrap(st, "rank %d of %d: rank 0's batchnorm running statistics for the evaluation",
							    d->env.rank, d->env.world));
	return KILN_OK;
}

/* A collective over host bytes staged through device memory (a sync
 * point): buf[off, off + n) to the device, then rank 0's broadcast of
 * buf[0, total) (gather 0: off 0, n total) or the allgather of every
 * rank's n bytes at its offset (gather 1: off = rank x n), and the whole
 * back into buf.  The caller's own step `mine` and this rank's buffers
 * (a device buffer and pinned host memory, either of which one rank can
 * fail alone) are agreed on first: every rank fails together, before the
 * collective (kiln_dist_sum_agreed; before session 41 a rank whose
 * allocation failed returned and its peers learnt of it only from its
 * exit, "Connection closed by peer"). */
static kiln_status host_staged(struct kiln_dist *d, kiln_status mine, const char *what, void *buf,
			       size_t total, size_t off, size_t n, int gather, void *compute)
{
	void *dev_buf = NULL, *host = NULL;
	kiln_status st = mine;
	double none = 0;
	if (!st && !(st = kiln_dist_zero_settle(d, compute)) &&
	    !(st = kiln_device_alloc(d->dev, total, &dev_buf)) &&
	    !(st = kiln_device_host_alloc(d->dev, total, &host)))
		st = kiln_dist_ckpt_fault_at(d, "staged", "the staged collective's buffers");
	if ((st = kiln_dist_sum_agreed(d, st, &none, 0, what, compute)))
		goto out;
	memcpy((char *)host + off, (char *)buf + off, n);
	char *dev = (char *)dev_buf + off;
	if ((st = kiln_device_copy_async(d->dev, dev, (char *)host + off, n, KILN_COPY_H2D,
					 compute)) ||
	    (st = gather ? d->ops->allgather(d->ctx, dev, dev_buf, n, KILN_U8, compute, NULL)
			 : d->ops->broadcast(d->ctx, dev_buf, total, KILN_U8, 0, compute, NULL)) ||
	    (st = kiln_device_copy_async(d->dev, host, dev_buf, total, KILN_COPY_D2H, compute)) ||
	    (st = kiln_device_stream_sync(d->dev, compute))) {
		st = kiln_error_wrap(kiln_dist_explain(d, st), "rank %d of %d: %s", d->env.rank,
				     d->env.world, what);
		goto out;
	}
	memcpy(buf, host, total);
out:
	kiln_device_free(d->dev, dev_buf);
	kiln_device_host_free(d->dev, host);
	return st;
}

kiln_status kiln_dist_broadcast_host(struct kiln_dist *d, kiln_status mine, const char *what,
				     void *buf, size_t bytes, void *compute)
{
	if (!d)
		return mine;
	return host_staged(d, mine, what, buf, bytes, 0, bytes, 0, compute);
}

kiln_status kiln_dist_allgather_host(struct kiln_dist *d, kiln_status mine, const char *what,
				     const void *v, void *all, size_t bytes, void *compute)
{
	const size_t off = d ? bytes * (size_t)d->env.rank : 0;
	if (!mine)
		memcpy((char *)all + off, v, bytes);
	if (!d)
		return mine;
	if (!d->ops->allgather)
		return kiln_error(KILN_EPLUGIN, "rank %d of %d: comm plugin '%s' has no allgather",
				  d->env.rank, d->env.world, kiln_dist_comm_name(d));
	return host_staged(d, mine, what, all, bytes * (size_t)d->env.world, off, bytes, 1,
			   compute);
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

kiln_status kiln_dist_sum_agreed(struct kiln_dist *d, kiln_status st, double *v, int n,
				 const char *what, void *compute)
{
	double w[64];
	if (!d)
		return st;
	if (n > 62)
		return kiln_error(KILN_EINTERNAL, "kiln_dist_sum_agreed: %d values", n);
	/* (this rank's message, kept whole past the sums' own) */
	char *mine = st ? kiln_strdup(kiln_last_error()) : NULL;
	memcpy(w, v, (size_t)n * sizeof *w);
	w[n] = st != KILN_OK;                   /* the failed ranks */
	w[n + 1] = st ? d->env.rank + 1.0 : 0; /* their numbers + 1: one's, alone */
	kiln_status st2 = kiln_dist_sum_host(d, w, n + 2, compute);
	if (!st2)
		memcpy(v, w, (size_t)n * sizeof *w);
	if (!st2 && w[n] > 0) {
		/* every rank holds the sum before a failed one can leave (its
		 * connections close as it exits): a trailing sum, its own
		 * failure no matter to a rank that has the flag
		 * (kiln_dist_ckpt_agree's ack) */
		double ack = 0;
		(void)kiln_dist_sum_host(d, &ack, 1, compute);
		d->agreed = 1;
	}
	const char *m = mine ? mine : "out of memory";
	if (st2) {
		/* the sum itself failed: no agreement was possible, the peers are
		 * gone or stuck, and kiln_dist_sum_host's message says which
		 * (kiln_dist_explain; a local failure that was the collective's,
		 * surfaced by a stream sync, is the same failure).  CI round 6:
		 * wrapping this rank's own message lost that explanation */
		free(mine);
		return st2;
	}
	if (st && dist_names_rank(d, m))
		st = kiln_error(st, "%s", m);
	else if (st)
		st = kiln_error(st, "rank %d of %d: %s: %s", d->env.rank, d->env.world, what, m);
	else if (w[n] == 1)
		st = kiln_error(KILN_EIO, "rank %d of %d: %s: rank %d failed (its message says why)",
				d->env.rank, d->env.world, what, (int)w[n + 1] - 1);
	else if (w[n] > 0)
		st = kiln_error(KILN_EIO, "rank %d of %d: %s: %g ranks failed (their messages say why)",
				d->env.rank, d->env.world, what, w[n]);
	free(mine);
	return st;
}

void kiln_count_limbs(const int64_t *v, int n, double *limbs)
{
	for (int i = 0; i < n; i++)
		for (int k = 0; k < KILN_COUNT_LIMBS; k++)
			limbs[i * KILN_COUNT_LIMBS + k] = (double)(((uint64_t)v[i] >> (8 * k)) & 0xff);
}

void kiln_count_join(const double *limbs, int n, int64_t *v)
{
	for (int i = 0; i < n; i++) {
		v[i] = 0;
		for (int k = 0; k < KILN_COUNT_LIMBS; k++)
			v[i] += (int64_t)limbs[i * KILN_COUNT_LIMBS + k] << (8 * k);
	}
}

kiln_status kiln_dist_sum_counts(struct kiln_dist *d, int64_t *v, int n, void *compute)
{
	double limbs[64];
	if (!d)
		return KILN_OK;
	if (n * KILN_COUNT_LIMBS > 64)
		return kiln_error(KILN_EINTERNAL, "kiln_dist_sum_counts: %d values", n);
	kiln_count_limbs(v, n, limbs);
	kiln_status st = kiln_dist_sum_host(d, limbs, n * KILN_COUNT_LIMBS, compute);
	if (!st)
		kiln_count_join(limbs, n, v);
	return st;
}

#define DIST_STOP_CAUSE_KEY "kiln/stop_cause"

kiln_status kiln_dist_stop_cause_post(struct kiln_dist *d, const char *cause)
{
	char host[64] = "", msg[600];
	if (gethostname(host, sizeof host - 1))
		snprintf(host, sizeof host, "?");
	/* (kiln launch numbers a node's ranks node x nproc + local rank) */
	const int node = d->env.local_world > 0 ? d->env.rank / d->env.local_world : 0;
	int k = snprintf(msg, sizeof msg, "rank %d of %d (node %d, host %s): %s", d->env.rank,
			 d->env.world, node, host, cause);
	return kiln_store_set(d->store, DIST_STOP_CAUSE_KEY, msg,
			      k < (int)sizeof msg ? (size_t)k : sizeof msg - 1);
}

kiln_status kiln_dist_stop_cause_read(struct kiln_dist *d, char *out, size_t n)
{
	void *v = NULL;
	kiln_status st = kiln_store_check(d->store, DIST_STOP_CAUSE_KEY, &v, NULL);
	if (!st && v)
		snprintf(out, n, "%s", (const char *)v);
	free(v);
	return st;
}

kiln_status kiln_dist_share_grads(struct kiln_dist *d, struct kiln_model *m)
{
	void *mem = NULL;
	/* (ZeRO-1 reduce-scatters from them as DDP allreduces; with [dist]
	 * pipeline it keeps them in device memory, kiln_dist_pipe_cut_grads) */
	if (!d || d->env.world < 2 || (d->zero && d->pipe_P))
		return KILN_OK;
	const size_t bytes = m->n_elems * sizeof(float);
	/* (with [dist] pipeline: the stage group's, which averages them) */
	kiln_status st = d->ops->version >= 3 && d->ops->alloc_shared
				 ? d->ops->alloc_shared(d->gctx ? d->gctx : d->ctx, bytes, &mem)
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
