/* core/dist_config.c - every rank runs rank 0's config: checked once, at
 * kiln_dist_open, through the store, before the communicator opens.
 *
 * Rank 0 posts its resolved config (kiln_config_write, every default
 * filled in, with its kiln and plugin ABI versions) under kiln/config;
 * every other rank compares its own with it key by key (config_diff.c),
 * values by meaning (config_same.c: `2, 0` is `2,0`, 0.10 is 0.1), and
 * posts its verdict under kiln/config_verdict/<rank>: empty, or the first
 * difference.  Rank 0 reads the verdicts in rank order and posts the first
 * difference (or nothing) under kiln/config_verdict; every rank returns
 * that, so a difference fails every rank at once with the same message,
 * naming the rank, the key and both values, instead of a hang until
 * [dist] timeout (a collective that only some ranks start: another
 * [pipeline] zero_copy, another model) or ranks that silently train
 * different things (another lr, seed, data path).
 *
 * The keys that may differ between ranks (rank_local below) change where a
 * rank writes, how fast it runs or what it waits for, never the numbers
 * every rank must agree on: docs/distributed.md lists them.
 *
 * The same config may still read another node's other copy at the same
 * path: once the data sets are open, kiln_dist_agree_sizes compares their
 * sample counts the same way (session 34).
 */
#include "config_diff.h"
#include "dist_impl.h"
#include "checkpoint.h"
#include "store.h" /* kiln_store_peek */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *section, *key;
} rank_local[] = {
	/* where it writes, what it loads, how many threads, profiling */
	{ "run", "out_dir" },          { "run", "threads" },
	{ "run", "plugin_path" },      { "run", "profile" },
	{ "run", "profile_steps" },    { "run", "bind_stages" },
	{ "run", "infer_block" },
	/* the loader's threads and caches: results are identical for any */
	{ "data*", "workers" },        { "data*", "prefetch" },
	{ "data*", "cache" },          { "data*", "unzip_cache" },
	/* how long it waits for a peer */
	{ "dist", "timeout" },         { "dist", "heartbeat" },
	/* the CPU device's speed settings and its own tune cache file */
	{ "plugin.cpu", "tune_cache" }, { "plugin.cpu", "async" },
	{ "plugin.cpu", "adaptive" },  { "plugin.cpu", "stage_spin_us" },
	{ "plugin.cpu", "graph" },     { "plugin.cpu", "keep_weights" },
	{ "plugin.cpu", "keep_widened" },
	{ "plugin.cuda", "autotune_cache" }, { "plugin.cuda", "graph" },
	/* this node's network and how a rank waits on it */
	{ "plugin.gloo", "hostname" }, { "plugin.gloo", "iface" },
	{ "plugin.gloo", "busy_poll" }, { "plugin.gloo", "p2p_spin_us" },
	{ "plugin.mpi", "wait" },      { "plugin.mpi", "spin_us" },
	{ "plugin.mpi", "sleep_us" },
};

/* The comparison's `wanted`: every key but the rank-local ones. */
static int compared(const char *section, const char *key, void *u)
{
	(void)u;
	for (size_t i = 0; i < KILN_ARRAY_LEN(rank_local); i++) {
		const char *s = rank_local[i].section;
		int match = !strcmp(s, "data*") ? !strncmp(section, "data", 4) &&
							  (!section[4] || section[4] == '.')
						: !strcmp(s, section);
		if (match && !strcmp(rank_local[i].key, key))
			return 0;
	}
	return 1;
}

static int schema_default(const char *section, const char *key, void *u, const char **val,
			  size_t *len)
{
	if (!kiln_config_key_default(u, section, key, val))
		return 0;
	*len = *val ? strlen(*val) : 0;
	return 1;
}

/* The comparison's `same`: by each key's schema type (core/config_same.c),
 * so that `2,0` on one rank and `2, 0` on another, or lr = 0.1 and 0.10,
 * are one config (before session 36 the bytes were compared: refused). */
static int same_meaning(const char *section, const char *key, const char *a, size_t an,
			const char *b, size_t bn, void *u)
{
	return kiln_config_values_same(u, section, key, a, an, b, bn);
}

/* This rank's config as the ranks compare it: the resolved text after a
 * [kiln] section of the versions.  malloc'd; NULL with an error set. */
static char *rank_text(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	char *conf = kiln_ckpt_config_text(cfg, reg), *text = NULL;
	if (!conf)
		return NULL;
	size_t n = strlen(conf) + 128;
	if ((text = malloc(n)))
		snprintf(text, n, "[kiln]\nversion = %s\nplugin_abi = %d.%d\n\n%s", kiln_version(),
			 KILN_ABI_MAJOR, KILN_ABI_MINOR, conf);
	else
		kiln_error(KILN_ENOMEM, "out of memory");
	free(conf);
	return text;
}

/* Rank r > 0: into *out "" when its config is rank 0's but for the
 * rank-local keys, else the difference as a message (malloc'd).  The
 * status of what failed, with its message: the store's, the diff's, or
 * KILN_ENOMEM "out of memory" (before session 38 a failed
 * kiln_strdup("") set no error and the caller called it a config error,
 * exit 2 with an empty message). */
static kiln_status rank_verdict(struct kiln_dist *d, const struct kiln_config *cfg,
				const char *mine, char **out)
{
	void *theirs = NULL;
	size_t len = 0;
	struct kiln_config_delta delta;
	int differs = 0;
	*out = NULL;
	kiln_status st = kiln_store_get(d->store, "kiln/config", d->timeout_ms, &theirs, &len);
	if (st)
		return st;
	char *t = realloc(theirs, len + 1);
	if (!t) {
		free(theirs);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	t[len] = 0;
	st = kiln_config_diff(t, mine, compared, schema_default, same_meaning, (void *)cfg, 1, &differs,
			      &delta);
	free(t);
	if (st)
		return st;
	const size_t n = differs ? 1024 : 1;
	if (!(*out = malloc(n)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	**out = 0;
	if (differs)
		snprintf(*out, n,
			 "rank %d's config differs from rank 0's: [%s] %s is %s on rank 0 but %s on rank %d (%s)",
			 d->env.rank, delta.section, delta.key, delta.a, delta.b, d->env.rank,
			 kiln_config_where(cfg, delta.section, delta.key));
	return KILN_OK;
}

/* Rank 0: every other rank's verdict, the first difference in rank order
 * posted as the run's (empty: none); *first gets a copy (malloc'd). */
static kiln_status collect_verdicts(struct kiln_dist *d, char **first)
{
	char key[64];
	kiln_status st = KILN_OK;
	*first = NULL;
	for (int r = 1; r < d->env.world && !st; r++) {
		void *v = NULL;
		size_t len = 0;
		snprintf(key, sizeof key, "kiln/config_verdict/%d", r);
		if ((st = kiln_store_get(d->store, key, d->timeout_ms, &v, &len)))
			break;
		if (len && !*first && (*first = malloc(len + 1))) {
			memcpy(*first, v, len);
			(*first)[len] = 0;
		}
		free(v);
	}
	if (!st)
		st = kiln_store_set(d->store, "kiln/config_verdict", *first ? *first : "",
				    *first ? strlen(*first) : 0);
	return st;
}

/* Rank 0, after a difference: wait (a few seconds at most) until every
 * rank has read the verdict, since rank 0's store stops serving as its
 * process exits. */
static void seen_by_all(struct kiln_dist *d)
{
	int n = d->env.world - 1;
	char (*names)[32] = calloc((size_t)n, sizeof *names);
	const char **keys = calloc((size_t)n, sizeof *keys);
	if (names && keys) {
		for (int r = 1; r <= n; r++) {
			snprintf(names[r - 1], sizeof names[r - 1], "kiln/config_seen/%d", r);
			keys[r - 1] = names[r - 1];
		}
		/* a rank that never reads it has failed on its own */
		kiln_store_wait(d->store, keys, n, d->timeout_ms < 5000 ? d->timeout_ms : 5000);
	}
	free(names);
	free(keys);
}

kiln_status dist_config_agree(struct kiln_dist *d, const struct kiln_config *cfg,
			      const struct kiln_registry *reg)
{
	char *mine = rank_text(cfg, reg), *verdict = NULL, key[64];
	kiln_status st = KILN_OK;
	if (!mine)
		return kiln_error_wrap(KILN_ENOMEM, "rank %d: the config the ranks compare",
				       d->env.rank);
	if (d->env.rank == 0) {
		if (!(st = kiln_store_set(d->store, "kiln/config", mine, strlen(mine))))
			st = collect_verdicts(d, &verdict);
		if (!st && verdict)
			seen_by_all(d);
	} else {
		char *own;
		void *v = NULL;
		size_t len = 0;
		snprintf(key, sizeof key, "kiln/config_verdict/%d", d->env.rank);
		if ((st = rank_verdict(d, cfg, mine, &own)))
			st = kiln_error_wrap(st, "rank %d: comparing its config with rank 0's",
					     d->env.rank);
		else if (!(st = kiln_store_set(d->store, key, own, strlen(own))) &&
			 !(st = kiln_store_get(d->store, "kiln/config_verdict", d->timeout_ms, &v,
					       &len)) &&
			 len && (verdict = malloc(len + 1))) {
			memcpy(verdict, v, len);
			verdict[len] = 0;
		}
		free(own);
		free(v);
		snprintf(key, sizeof key, "kiln/config_seen/%d", d->env.rank);
		if (!st && verdict)
			kiln_store_set(d->store, key, "1", 1);
	}
	free(mine);
	if (!st && verdict)
		d->agreed = 1; /* every rank's verdict: none's own failure (kiln_dist_close) */
	if (!st && verdict)
		st = kiln_error(KILN_ECONFIG,
				"%s. Every rank must run the same config and kiln, but for the keys that may differ between ranks (docs/distributed.md, \"The same config on every rank\")",
				verdict);
	free(verdict);
	return st;
}

/* ---- the data sets' sizes (kiln_dist_agree_sizes) -------------------------- */

#define SIZES_MAX 4 /* the sections a trainer opens: [data], .eval, .val */

kiln_status dist_peer_read(struct kiln_dist *d, const char *key, void **val, int *who, int *lost)
{
	const char *const keys[] = { key, "kiln/failed_rank", "kiln/lost" };
	int which = -1;
	void *v = NULL;
	kiln_status st = kiln_store_poll(d->store, keys, 3, d->timeout_ms, &which, &v);
	*val = NULL;
	*who = -1;
	*lost = which == 2;
	if (!st && which > 0) {
		*who = atoi(v);
		free(v);
	} else if (!st)
		*val = v;
	return st;
}

/* Rank r's posted counts into n[k] (kiln/data_sizes/R: "N N N"); *who
 * as dist_peer_read's. */
static kiln_status sizes_read(struct kiln_dist *d, int r, int64_t *n, int k, int *who, int *lost)
{
	char key[48];
	void *v = NULL;
	snprintf(key, sizeof key, "kiln/data_sizes/%d", r);
	kiln_status st = dist_peer_read(d, key, &v, who, lost);
	const char *p = v;
	for (int i = 0; v && i < k; i++) {
		char *e;
		n[i] = strtoll(p, &e, 10);
		p = e;
	}
	free(v);
	return st;
}

kiln_status dist_peer_gone(struct kiln_dist *d, int who, int lost, const char *before)
{
	char key[48], host[64] = "?";
	void *v = NULL;
	snprintf(key, sizeof key, "kiln/host/%d", who);
	if (!kiln_store_peek(d->store, key, &v, NULL) && v)
		snprintf(host, sizeof host, "%s", (const char *)v);
	free(v);
	d->peer_blamed = 1;
	if (lost)
		return kiln_error(KILN_EIO, "rank %d of %d: rank %d was lost (host %s: its process exited, its host went down or its connection closed) before %s",
				  d->env.rank, d->env.world, who, host, before);
	char said[FAILED_SAID_MAX];
	kiln_dist_failed_said(d->store, who, said, sizeof said);
	return kiln_error(KILN_EIO, "rank %d of %d: rank %d (host %s) failed with its own error (its log says why) before %s%s",
			  d->env.rank, d->env.world, who, host, before, said);
}

kiln_status kiln_dist_agree_sizes(struct kiln_dist *d, const char *const *names,
				  const int64_t *n, int k)
{
	char key[48], v[SIZES_MAX * 24] = "", msg[1024];
	size_t m = 0;
	if (!d || d->env.world < 2)
		return KILN_OK;
	if (k > SIZES_MAX)
		return kiln_error(KILN_EINTERNAL, "kiln_dist_agree_sizes: %d sets", k);
	for (int i = 0; i < k; i++)
		m += (size_t)snprintf(v + m, sizeof v - m, "%s%lld", i ? " " : "", (long long)n[i]);
	snprintf(key, sizeof key, "kiln/data_sizes/%d", d->env.rank);
	kiln_status st = kiln_store_set(d->store, key, v, m);
	int64_t (*all)[SIZES_MAX] = calloc((size_t)d->env.world, sizeof *all);
	if (!all)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int r = 0; !st && r < d->env.world; r++) {
		int who, lost;
		if ((st = sizes_read(d, r, all[r], k, &who, &lost))) {
			/* a peer late (or the store): not this rank's own
			 * failure, no FAILED mark (kiln_dist_close; review of
			 * session 34) */
			d->peer_blamed = 1;
			st = kiln_error_wrap(st, "rank %d of %d: waiting for rank %d's data set sizes",
					     d->env.rank, d->env.world, r);
		}
		else if (who >= 0 && who != d->env.rank)
			st = dist_peer_gone(d, who, lost, "the ranks compared their data set sizes");
	}
	for (int i = 0; !st && i < k; i++) {
		int r = 1;
		while (r < d->env.world && all[r][i] == all[0][i])
			r++;
		if (r == d->env.world)
			continue;
		m = 0;
		for (r = 0; r < d->env.world && m + 64 < sizeof msg; r++)
			m += (size_t)snprintf(msg + m, sizeof msg - m, "%srank %d has %lld", r ? ", " : "",
					      r, (long long)all[r][i]);
		if (r < d->env.world)
			snprintf(msg + m, sizeof msg - m, ", ...");
		/* every rank reaches the same verdict: no one's own failure
		 * to tell the peers (close_mark_failed) */
		d->agreed = 1;
		st = kiln_error(KILN_EDATA, "rank %d of %d: %s: the ranks' data sets differ in size (%s samples): every rank must read the same data (a node's other copy at the same path? docs/distributed.md \"The same data on every rank\")",
				d->env.rank, d->env.world, names[i], msg);
	}
	free(all);
	return st;
}
