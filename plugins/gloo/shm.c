/* plugins/gloo/shm.c - kiln-gloo's one-node path (shm.h) */
#include "shm.h"
#include "../common/shmcoll.h"
#include "../common/shmp2p.h"
#include "../common/shm_stale.h"

#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct gloo_shm {
	struct shmcoll coll;
	int how;       /* how the waits wait: SHMCOLL_SPIN, or SLEEP (a node's group) */
	int fd, rank, world;
	char name[96]; /* the object's, until unlinked */
	void *base;
	size_t size;
	/* for gloo_shm_alloc: the setup's store, keys, timeout ... */
	const struct kiln_host *h;
	struct kiln_store *store;
	char prefix[64];
	int timeout_ms;
	/* ... and the region it made (the gradients) */
	int rfd, rtried;
	char rname[96];
	void *rbase;
	size_t rsize;
	/* point to point (gloo_shm_p2p): ring bytes a channel, 0 when off;
	 * out[p] this rank's channel to p, in[p] p's to this rank, and a lock
	 * for each (streams that send to one peer take turns) */
	size_t ring;
	long long spin_ns; /* [plugin.gloo] p2p_spin_us (gloo_shm_p2p_spin) */
	struct shmp2p *out, *in;
	pthread_mutex_t *out_lock, *in_lock;
	int world_of[SHMCOLL_MAXW]; /* a node's group: its ranks' world ranks (shmcoll_name_node) */
};

/* Ring bytes of the point-to-point channels of `world` ranks:
 * SHMP2P_RING_MAX (4 MiB), halved until all world x (world - 1) of them
 * fit in 8 MiB (2 ranks: 4 MiB a channel, 3: 1 MiB, 4: 512 KiB); 0 (no
 * channels) beyond GLOO_SHM_P2P_MAXW ranks. */
static size_t p2p_ring(int world)
{
	size_t ring = SHMP2P_RING_MAX;
	const size_t pairs = (size_t)world * (size_t)(world - 1);
	if (world > GLOO_SHM_P2P_MAXW || world < 2)
		return 0;
	while (ring * pairs > ((size_t)8 << 20))
		ring /= 2;
	return ring;
}

/* where channel from -> to lies in the object */
static char *p2p_at(const struct gloo_shm *g, int from, int to)
{
	const int k = from * (g->world - 1) + (to < from ? to : to - 1);
	return (char *)g->base + (size_t)g->world * SHMCOLL_SEGMENT +
	       (size_t)k * shmp2p_bytes(g->ring);
}

/* ---- setup ---------------------------------------------------------------- */

struct setup {
	const struct kiln_host *h;
	struct kiln_store *store;
	const char *prefix;
	int rank, world, timeout_ms;
	/* a node's group (gloo_shm_open_node): its ranks' world ranks, in
	 * local order, and the node; NULL for the world's group */
	const int *world_of;
	int node;
};

/* How messages name the group's rank r: "rank R" in the world's group,
 * "rank W (node N's local rank R)" in a node's. */
static const char *who(const struct setup *s, int r, char *buf, size_t n)
{
	if (s->world_of)
		snprintf(buf, n, "rank %d (node %d's local rank %d)", s->world_of[r], s->node, r);
	else
		snprintf(buf, n, "rank %d", r);
	return buf;
}

static void key(char *k, size_t n, const struct setup *s, const char *what, int i)
{
	snprintf(k, n, "%s%s/%d", s->prefix, what, i);
}

/* "hostname boot_id" into id[0..n); 0, or -1 when the boot id is unreadable */
static int host_identity(char *id, size_t n)
{
	char host[256] = "";
	char boot[64] = "";
	gethostname(host, sizeof host - 1);
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	int ok = f && fgets(boot, sizeof boot, f);
	if (f)
		fclose(f);
	boot[strcspn(boot, "\n")] = 0;
	snprintf(id, n, "%s %s", host, boot);
	return ok && *boot ? 0 : -1;
}

/* Step 1: every rank on this node?  Each rank reads the same values, so
 * every rank decides the same.  1 yes, 0 no (why set), or an error. */
static kiln_status one_node(const struct setup *s, int *yes, char *why, size_t n)
{
	char id[384], k[256], first[384] = "", name[64];
	kiln_status st;
	*yes = 0;
	if (host_identity(id, sizeof id))
		*id = 0; /* an empty identity: no rank can tell */
	key(k, sizeof k, s, "host", s->rank);
	if ((st = s->h->store_set(s->store, k, id, strlen(id))))
		return st;
	for (int r = 0; r < s->world; r++) {
		void *v = NULL;
		size_t len = 0;
		key(k, sizeof k, s, "host", r);
		if ((st = s->h->store_get(s->store, k, s->timeout_ms, &v, &len)))
			return st;
		char other[384];
		snprintf(other, sizeof other, "%.*s", (int)len, (const char *)v);
		s->h->free(v);
		if (!*other) {
			snprintf(why, n, "%s cannot read /proc/sys/kernel/random/boot_id",
				 who(s, r, name, sizeof name));
			return KILN_OK;
		}
		if (!r)
			snprintf(first, sizeof first, "%s", other);
		else if (strcmp(first, other)) {
			char name0[64];
			snprintf(why, n, "the ranks span several nodes (%s on '%.100s', %s on '%.100s')",
				 who(s, 0, name0, sizeof name0), first, who(s, r, name, sizeof name), other);
			return KILN_OK;
		}
	}
	*yes = 1;
	return KILN_OK;
}

/* A store barrier that also agrees: every rank adds whether it failed
 * (the first to fail posts its reason, which names that rank, under
 * why/<step>) and waits until all `world` arrived.  *all = 1 when no rank
 * failed, else 0 and why = the first failed rank's reason (a failed rank
 * keeps its own). */
static kiln_status agree_named(const struct setup *s, int step, int ok, int *all, char *why,
			       size_t n)
{
	char k[256];
	int64_t in = 0, failed = 0;
	kiln_status st;
	if (!ok) {
		key(k, sizeof k, s, "failed", step);
		if ((st = s->h->store_add(s->store, k, 1, &failed)))
			return st;
		/* set before this rank arrives, so before anyone reads it */
		key(k, sizeof k, s, "why", step);
		if (failed == 1 && (st = s->h->store_set(s->store, k, why, strlen(why))))
			return st;
	}
	key(k, sizeof k, s, "in", step);
	if ((st = s->h->store_add(s->store, k, 1, &in)))
		return st;
	struct timespec nap = { 0, 500000 };
	for (long long waited = 0; in < s->world; waited += nap.tv_nsec) {
		if (waited > (long long)s->timeout_ms * 1000000ll)
		{
			char name[64];
			return s->h->error(KILN_ETIMEOUT, "gloo: %s: %lld of the %d ranks reached the setup of kiln's shared memory within [dist] timeout = %.1f s",
					   who(s, s->rank, name, sizeof name), (long long)in, s->world,
					   s->timeout_ms / 1000.0);
		}
		nanosleep(&nap, NULL);
		if (nap.tv_nsec < 16000000)
			nap.tv_nsec *= 2;
		if ((st = s->h->store_add(s->store, k, 0, &in)))
			return st;
	}
	key(k, sizeof k, s, "failed", step);
	if ((st = s->h->store_add(s->store, k, 0, &failed)))
		return st;
	*all = failed == 0;
	if (!*all && ok) {
		void *v = NULL;
		size_t len = 0;
		key(k, sizeof k, s, "why", step);
		if ((st = s->h->store_get(s->store, k, s->timeout_ms, &v, &len)))
			return st;
		snprintf(why, n, "%.*s", (int)len, (const char *)v);
		s->h->free(v);
	}
	return KILN_OK;
}

/* agree, a failed rank's why given without its name: "rank R: " (who)
 * goes in front */
static kiln_status agree(const struct setup *s, int step, int ok, int *all, char *why, size_t n)
{
	if (!ok) {
		char mine[320], name[64];
		snprintf(mine, sizeof mine, "%s: %s", who(s, s->rank, name, sizeof name), why);
		snprintf(why, n, "%s", mine);
	}
	return agree_named(s, step, ok, all, why, n);
}

/* byte `rank` of the object: rank's liveness lock */
static int lock_op(int fd, int cmd, int rank, short *type)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = rank, .l_len = 1 };
	int rc = fcntl(fd, cmd, &fl);
	*type = fl.l_type;
	return rc;
}

/* shmcoll's liveness check: the first peer whose lock is gone, or -1 */
static int lost(void *arg)
{
	const struct gloo_shm *g = arg;
	for (int r = 0; r < g->world; r++) {
		short type;
		if (r != g->rank && !lock_op(g->fd, F_GETLK, r, &type) && type == F_UNLCK)
			return r;
	}
	return -1;
}

/* Is name what rank 0 makes: /kiln-gloo-<pid>-<16 hex digits><tag>? */
static int name_ok(const char *name, const char *tag)
{
	const char *t;
	return name[0] == '/' && shm_stale_pid(name + 1, &t) > 0 && !strcmp(t, tag);
}

/* how old (s) an object of a process that is gone must be for the sweep
 * to remove it (shm_stale_sweep) */
#define STALE_AGE_S 60

/* The objects a rank 0 before this left, killed before every rank had
 * opened one (plugins/common/shm_stale.h): removed, and said, once a
 * process, before its first object (sweep_once). */
static const struct kiln_host *sweep_host;

static void sweep_run(void)
{
	const int gone = shm_stale_sweep(0, STALE_AGE_S);
	if (gone)
		sweep_host->log(KILN_LOG_INFO, "gloo", "removed %d shared-memory object%s of kiln-gloo's from /dev/shm whose process is gone (it died while setting up its ranks' shared memory)",
				gone, gone > 1 ? "s" : "");
}

static void sweep_once(const struct kiln_host *h)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	sweep_host = h;
	pthread_once(&once, sweep_run);
}

/* The tests' hold (tests/gloo_shm_leak.sh): KILN_TEST_GLOO_SHM_HOLD =
 * "made:MS" holds rank 0 MS ms once it has made an object, before it
 * posts the name; "posted:MS" once it has posted it.  Said, so that a
 * test can kill it there. */
static void test_hold(const struct kiln_host *h, const char *at, const char *name)
{
	const char *v = getenv("KILN_TEST_GLOO_SHM_HOLD");
	const size_t n = strlen(at);
	if (!v || strncmp(v, at, n) || v[n] != ':')
		return;
	const long ms = strtol(v + n + 1, NULL, 10);
	h->log(KILN_LOG_WARN, "gloo", "the tests' hold: rank 0 waits %ld ms having %s shared-memory object %s (KILN_TEST_GLOO_SHM_HOLD)",
	       ms, at, name);
	const struct timespec t = { ms / 1000, ms % 1000 * 1000000 };
	nanosleep(&t, NULL);
}

/* A rank other than 0 has opened the object (rank 0 holds it open since
 * it made it): counted under <prefix><what>/opened, and the last to open
 * it unlinks its name at once.  Before session 40 the ranks unlinked it
 * only after the barrier that follows, which a rank killed meanwhile
 * (SIGKILL) never left: killed together, they left it in /dev/shm.  (A
 * count that fails leaves it to the unlinks after the barrier.) */
static void opened(const struct setup *s, const char *what, const char *name)
{
	char k[256];
	int64_t in = 0;
	snprintf(k, sizeof k, "%s%s/opened", s->prefix, what);
	if (!s->h->store_add(s->store, k, 1, &in) && in == s->world - 1)
		(void)shm_unlink(name);
}

/* Rank 0 makes an object of `size` bytes (named /kiln-gloo-<pid>-<64
 * random bits><tag>) and posts its name under <prefix><what>/0, the others
 * open the one named (the last to open it unlinks the name: opened); every
 * rank maps it (*fd, *base).  0; -1 with why set; 1 when rank 0 posted no
 * name (its own failure says why). */
static int open_object(const struct setup *s, const char *what, const char *tag, size_t size,
		       int *fd, void **base, char *name, size_t name_n, char *why, size_t n,
		       kiln_status *st)
{
	char k[256];
	key(k, sizeof k, s, what, 0);
	if (!s->rank) {
		unsigned long long rnd = 0;
		sweep_once(s->h);
		if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
			snprintf(why, n, "getrandom: %s", strerror(errno));
		} else {
			snprintf(name, name_n, "/kiln-gloo-%ld-%016llx%s", (long)getpid(), rnd, tag);
			*fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
			if (*fd < 0)
				snprintf(why, n, "shm_open(%s): %s", name, strerror(errno));
			else if ((errno = posix_fallocate(*fd, 0, (off_t)size))) {
				/* the pages reserved now: a full tmpfs fails here
				 * (ENOSPC), not with SIGBUS at a first touch later */
				snprintf(why, n, "posix_fallocate(%s, %zu): %s", name, size, strerror(errno));
				/* its name is dropped below: no one else could
				 * unlink it (one empty object left per run) */
				(void)shm_unlink(name);
			} else
				test_hold(s->h, "made", name);
		}
		/* an empty name tells the others rank 0 has none */
		if (*why)
			*name = 0;
		const char *post = name;
		if ((*st = s->h->store_set(s->store, k, post, strlen(post))))
			return -1;
		if (*why)
			return -1;
		test_hold(s->h, "posted", name);
	} else {
		void *v = NULL;
		size_t len = 0;
		if ((*st = s->h->store_get(s->store, k, s->timeout_ms, &v, &len)))
			return -1;
		snprintf(name, name_n, "%.*s", (int)len, (const char *)v);
		s->h->free(v);
		if (!*name)
			return 1;
		if (!name_ok(name, tag)) {
			snprintf(why, n, "the store names shared-memory object '%.80s', not /kiln-gloo-<pid>-<16 hex digits>%s: not opened",
				 name, tag);
			return -1;
		}
		struct stat sb;
		*fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
		if (*fd < 0) {
			snprintf(why, n, "shm_open(%s): %s (is /dev/shm shared between the ranks?)", name,
				 strerror(errno));
			return -1;
		}
		opened(s, what, name);
		if (fstat(*fd, &sb)) {
			snprintf(why, n, "fstat(%s): %s", name, strerror(errno));
			return -1;
		}
		if (sb.st_uid != geteuid() || (sb.st_mode & 077)) {
			snprintf(why, n, "%s belongs to uid %u with mode %03o, not to this user (uid %u) with 0600: not used",
				 name, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777), (unsigned)geteuid());
			return -1;
		}
		if ((size_t)sb.st_size != size) {
			snprintf(why, n, "%s has %lld bytes, not %zu", name, (long long)sb.st_size, size);
			return -1;
		}
	}
	*base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (*base == MAP_FAILED) {
		*base = NULL;
		snprintf(why, n, "mmap of %zu bytes: %s", size, strerror(errno));
		return -1;
	}
	return 0;
}

/* Step 2 on this rank: the object (open_object), and this rank's lock on
 * its byte.  As open_object. */
static int map(const struct setup *s, struct gloo_shm *g, char *why, size_t n, kiln_status *st)
{
	const int r = open_object(s, "name", "", g->size, &g->fd, &g->base, g->name, sizeof g->name,
				  why, n, st);
	if (r)
		return r;
	short type;
	if (lock_op(g->fd, F_SETLK, s->rank, &type)) {
		snprintf(why, n, "fcntl(F_SETLK): %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* The point-to-point channels' ends on this rank (the object is new: their
 * headers read as zeros).  0, or -1 with why set. */
static int p2p_start(const struct setup *s, struct gloo_shm *g, char *why, size_t n)
{
	const size_t W = (size_t)s->world;
	g->out = calloc(W, sizeof *g->out);
	g->in = calloc(W, sizeof *g->in);
	g->out_lock = calloc(W, sizeof *g->out_lock);
	g->in_lock = calloc(W, sizeof *g->in_lock);
	if (!g->out || !g->in || !g->out_lock || !g->in_lock) {
		snprintf(why, n, "out of memory");
		return -1;
	}
	for (int p = 0; p < s->world; p++) {
		pthread_mutex_init(&g->out_lock[p], NULL);
		pthread_mutex_init(&g->in_lock[p], NULL);
		if (p == s->rank)
			continue;
		shmp2p_init(&g->out[p], s->h, "gloo", s->rank, s->world, p, p2p_at(g, s->rank, p),
			    g->ring, s->timeout_ms, SHMP2P_SPIN_NS, lost, g);
		shmp2p_init(&g->in[p], s->h, "gloo", s->rank, s->world, p, p2p_at(g, p, s->rank),
			    g->ring, s->timeout_ms, SHMP2P_SPIN_NS, lost, g);
	}
	return 0;
}

/* The channels' waits poll spin_ns before they sleep, or not at all when
 * the ranks (or a split's parent's) outnumber their CPUs: known once every
 * rank posted its CPUs (after the second barrier). */
static void p2p_spin(struct gloo_shm *g)
{
	const long long spin = shmcoll_yields(&g->coll) ? 0 : g->spin_ns;
	for (int p = 0; g->ring && p < g->world; p++)
		g->out[p].spin_ns = g->in[p].spin_ns = spin;
}

/* Step 3 on this rank, after every rank mapped: every peer's lock visible,
 * this rank's header zeroed.  0, or -1 with why set. */
static int start(const struct setup *s, struct gloo_shm *g, char *why, size_t n)
{
	void *seg[SHMCOLL_MAXW];
	for (int r = 0; r < s->world; r++) {
		short type;
		if (r == s->rank)
			continue;
		if (lock_op(g->fd, F_GETLK, r, &type) || type == F_UNLCK) {
			char name[64];
			snprintf(why, n, "%s's lock on the segments is not visible here (file locks do not work on /dev/shm?): a lost rank would go unnoticed",
				 who(s, r, name, sizeof name));
			return -1;
		}
	}
	for (int r = 0; r < s->world; r++)
		seg[r] = (char *)g->base + (size_t)r * SHMCOLL_SEGMENT;
	if (shmcoll_init(&g->coll, s->h, "gloo", s->rank, s->world, seg, s->timeout_ms, 0, 0)) {
		snprintf(why, n, "%s", s->h->last_error());
		return -1;
	}
	g->coll.grace_ns = 0; /* no watchdog to report first: fail at [dist] timeout */
	shmcoll_watch(&g->coll, lost, g);
	if (s->world_of) { /* a node's group: its messages name world and local ranks */
		memcpy(g->world_of, s->world_of, (size_t)s->world * sizeof *g->world_of);
		shmcoll_name_node(&g->coll, g->world_of, s->node);
	}
	if (g->ring && p2p_start(s, g, why, n))
		return -1;
	return 0;
}

/* gloo_shm_open for the group s describes (the world's or a node's) */
static kiln_status open_group(const struct setup *s, int p2p, struct gloo_shm **out, char *why,
			      size_t n)
{
	const struct kiln_host *host = s->h;
	const int rank = s->rank, world = s->world;
	kiln_status st = KILN_OK;
	int yes = 0, all = 0;
	*out = NULL;
	*why = 0;
	if (world < 2) {
		snprintf(why, n, "one rank");
		return KILN_OK;
	}
	if (world > SHMCOLL_MAXW) {
		snprintf(why, n, "more than %d ranks", SHMCOLL_MAXW);
		return KILN_OK;
	}
	if ((st = one_node(s, &yes, why, n)) || !yes)
		return st;
	struct gloo_shm *g = calloc(1, sizeof *g);
	if (!g)
		return host->error(KILN_ENOMEM, "gloo: out of memory");
	g->fd = g->rfd = -1;
	g->rank = rank;
	g->world = world;
	g->h = host;
	g->store = s->store;
	snprintf(g->prefix, sizeof g->prefix, "%s", s->prefix);
	g->timeout_ms = s->timeout_ms;
	g->ring = p2p ? p2p_ring(world) : 0;
	g->spin_ns = SHMP2P_SPIN_NS;
	g->size = (size_t)world * SHMCOLL_SEGMENT +
		  (g->ring ? (size_t)world * (size_t)(world - 1) * shmp2p_bytes(g->ring) : 0);
	int ok = map(s, g, why, n, &st) >= 0;
	if (!st)
		st = agree(s, 1, ok, &all, why, n);
	/* every rank has opened it or given up: the name can go (gone
	 * already where every rank opened it: opened; a rank that finds it
	 * gone is fine; any other failure leaves a file in /dev/shm, harmless
	 * to this run, which kiln launch or a later run removes: shm_stale.h) */
	if (*g->name)
		(void)shm_unlink(g->name);
	if (!st && all) {
		ok = ok && !start(s, g, why, n);
		st = agree(s, 2, ok, &all, why, n);
	}
	if (st || !all) {
		gloo_shm_close(g);
		return st;
	}
	p2p_spin(g);
	*out = g;
	return KILN_OK;
}

kiln_status gloo_shm_open(const struct kiln_host *host, struct kiln_store *store,
			  const char *prefix, int rank, int world, int timeout_ms, int p2p,
			  struct gloo_shm **out, char *why, size_t n)
{
	const struct setup s = { host, store, prefix, rank, world, timeout_ms, NULL, 0 };
	return open_group(&s, p2p, out, why, n);
}

/* The second object (gloo_shm_alloc, gloo_shm_map): world slices of
 * `bytes` (rounded up to pages), base[r] rank r's; `off` says why not when
 * want = 0, `what` what it is for (the room's message). */
static kiln_status region_open(struct gloo_shm *g, size_t bytes, int want, const char *off,
			       const char *what, void **base)
{
	/* the world's group: gloo.cc asks only c->shm for the region */
	const struct setup s = { g->h, g->store, g->prefix, g->rank, g->world, g->timeout_ms,
				 NULL, 0 };
	char why[320] = "";
	kiln_status st = KILN_OK;
	int all = 0;
	if (g->rtried)
		return g->h->error(KILN_ENOTSUP, "gloo: the shared buffer was asked for already");
	g->rtried = 1; /* its store keys are used up, whatever the outcome */
	const size_t per = shm_segment_bytes(bytes);
	g->rsize = per * (size_t)g->world;
	/* a tmpfs without room would end the process with SIGBUS at the
	 * first touch: ask first (every rank, and agree) */
	unsigned long long have, need;
	const int room = shm_room(g->rsize, &have, &need);
	if (!want)
		snprintf(why, sizeof why, "%s", off);
	else if (!room)
		snprintf(why, sizeof why, "/dev/shm has %llu MiB free, %llu MiB wanted for %s",
			 have >> 20, need >> 20, what);
	/* every rank takes part, so ranks configured apart agree on "no" */
	if ((st = agree(&s, 3, want && room, &all, why, sizeof why)))
		return st;
	if (all) {
		const int ok = open_object(&s, "region", "-g", g->rsize, &g->rfd, &g->rbase, g->rname,
					   sizeof g->rname, why, sizeof why, &st) >= 0;
		if (!st)
			st = agree(&s, 4, ok, &all, why, sizeof why);
		if (*g->rname)
			(void)shm_unlink(g->rname);
	}
	if (st || !all) {
		if (g->rbase)
			munmap(g->rbase, g->rsize);
		if (g->rfd >= 0)
			close(g->rfd);
		g->rbase = NULL, g->rfd = -1;
		return st ? st : g->h->error(KILN_ENOTSUP, "gloo: %s", why);
	}
	/* a new object reads as zeros: nothing to clear, nothing to wait for */
	for (int r = 0; r < g->world; r++)
		base[r] = (char *)g->rbase + (size_t)r * per;
	return KILN_OK;
}

kiln_status gloo_shm_alloc(struct gloo_shm *g, size_t bytes, int want, void **ptr)
{
	void *base[SHMCOLL_MAXW];
	*ptr = NULL;
	kiln_status st = region_open(g, bytes, want, "[plugin.gloo] zero_copy = 0",
				     "the shared gradients", base);
	if (st)
		return st;
	shmcoll_region(&g->coll, base, (bytes + 4095) / 4096 * 4096);
	*ptr = base[g->rank];
	return KILN_OK;
}

kiln_status gloo_shm_map(struct gloo_shm *g, size_t bytes, void **base)
{
	for (int r = 0; r < g->world; r++)
		base[r] = NULL;
	return region_open(g, bytes, 1, "", "the mapped buffers", base);
}

/* ---- several nodes: the node groups (gloo_shm_open_node) ------------------- */

/* Every rank's identity from the store (posted under <prefix>host/ by
 * one_node) into node_of[], numbering the nodes in order of their first
 * rank; *nodes their count.  0, or -1 when a rank's identity is empty
 * (why set). */
static kiln_status node_map(const struct setup *s, int *node_of, int *nodes, char *why, size_t n,
			    int *bad)
{
	char (*ids)[384] = calloc((size_t)s->world, sizeof *ids);
	char k[256];
	kiln_status st = KILN_OK;
	*nodes = 0;
	*bad = 0;
	if (!ids)
		return s->h->error(KILN_ENOMEM, "gloo: out of memory");
	for (int r = 0; r < s->world && !st && !*bad; r++) {
		void *v = NULL;
		size_t len = 0;
		key(k, sizeof k, s, "host", r);
		if ((st = s->h->store_get(s->store, k, s->timeout_ms, &v, &len)))
			break;
		snprintf(ids[r], sizeof ids[r], "%.*s", (int)len, (const char *)v);
		s->h->free(v);
		if (!*ids[r]) {
			snprintf(why, n, "rank %d cannot read /proc/sys/kernel/random/boot_id", r);
			*bad = 1;
		}
		int q = 0;
		while (q < r && strcmp(ids[q], ids[r]))
			q++;
		node_of[r] = q < r ? node_of[q] : (*nodes)++;
	}
	free(ids);
	return st;
}

kiln_status gloo_shm_open_node(const struct kiln_host *host, struct kiln_store *store,
			       const char *prefix, int rank, int world, int timeout_ms,
			       struct gloo_node *nd, struct gloo_shm **out, char *why, size_t n)
{
	const struct setup s = { host, store, prefix, rank, world, timeout_ms, NULL, 0 };
	char id[384], k[256], sub[96];
	/* node_of[r]: rank r's node; local[l]: the world rank of this node's
	 * local rank l */
	int *node_of = calloc(2 * (size_t)world, sizeof *node_of), bad = 0, all = 0, most = 0;
	int *local = node_of + world;
	kiln_status st;
	memset(nd, 0, sizeof *nd);
	*out = NULL;
	*why = 0;
	if (!node_of)
		return host->error(KILN_ENOMEM, "gloo: out of memory");
	if (host_identity(id, sizeof id))
		*id = 0;
	key(k, sizeof k, &s, "host", rank);
	if ((st = host->store_set(store, k, id, strlen(id))) ||
	    (st = node_map(&s, node_of, &nd->nodes, why, n, &bad)) || bad)
		goto out;
	for (int r = 0; r < world; r++) {
		int in = 0;
		for (int q = 0; q < world; q++)
			in += node_of[q] == node_of[r];
		most = in > most ? in : most;
		if (node_of[r] == node_of[rank]) {
			nd->local_rank += r < rank;
			local[nd->local_world++] = r;
		}
	}
	nd->node = node_of[rank];
	if (nd->nodes < 2 || most < 2 || most > SHMCOLL_MAXW) {
		snprintf(why, n, "%s", nd->nodes < 2 ? "one node" : most < 2 ? "one rank per node" : "too many ranks on a node");
		goto out;
	}
	/* the node's own shared memory (none for a node of one rank), and
	 * every rank agrees that every node has it: a node's reason names
	 * its rank already (world and local rank, who) */
	snprintf(sub, sizeof sub, "%snode/%d/", prefix, nd->node);
	const struct setup ns = { host, store, sub, nd->local_rank, nd->local_world, timeout_ms,
				  local, nd->node };
	if (nd->local_world > 1 && (st = open_group(&ns, 0, out, why, n)))
		goto out;
	if ((st = agree_named(&s, 1, nd->local_world == 1 || *out, &all, why, n)))
		goto out;
	nd->on = all;
	/* a node's ranks wait for its first rank's allreduce over the
	 * network: 20 us of spinning, then 50 us naps, so a waiting rank
	 * leaves the CPU to the first rank's Gloo threads, and from a late
	 * nap or 5 ms on a futex sleep (shmcoll.h, SHMCOLL_SPIN) */
	if (*out) {
		(*out)->how = SHMCOLL_SLEEP;
		(*out)->coll.spin_ns = 20000;
		(*out)->coll.nap = (struct timespec){ 0, 50000 };
	}
out:
	if (!nd->on) {
		gloo_shm_close(*out);
		*out = NULL;
	}
	free(node_of);
	return st;
}

/* ---- collectives ------------------------------------------------------------ */

kiln_status gloo_shm_run(struct gloo_shm *g, int kind, const void *send, void *buf, size_t count,
			 int dtype, float scale)
{
	if (kind == GLOO_SHM_ALLREDUCE)
		return shmcoll_allreduce(&g->coll, g->how, buf, count, dtype, scale);
	if (kind == GLOO_SHM_REDUCE_SCATTER)
		return shmcoll_reduce_scatter(&g->coll, g->how, send, buf, count, dtype, scale);
	return shmcoll_allgather(&g->coll, g->how, send, buf, count);
}

size_t gloo_shm_p2p(const struct gloo_shm *g)
{
	return g ? g->ring : 0;
}

size_t gloo_shm_p2p_buffered(const struct gloo_shm *g)
{
	return g && g->ring > SHMP2P_FRAME ? g->ring - SHMP2P_FRAME : 0;
}

void gloo_shm_p2p_spin(struct gloo_shm *g, long long ns)
{
	g->spin_ns = ns;
	p2p_spin(g);
}

kiln_status gloo_shm_send(struct gloo_shm *g, int peer, const void *buf, size_t bytes)
{
	pthread_mutex_lock(&g->out_lock[peer]);
	kiln_status st = shmp2p_send(&g->out[peer], buf, bytes);
	pthread_mutex_unlock(&g->out_lock[peer]);
	return st;
}

int gloo_shm_try_send(struct gloo_shm *g, int peer, const void *buf, size_t bytes)
{
	pthread_mutex_lock(&g->out_lock[peer]);
	const int sent = shmp2p_try_send(&g->out[peer], buf, bytes);
	pthread_mutex_unlock(&g->out_lock[peer]);
	return sent;
}

kiln_status gloo_shm_recv(struct gloo_shm *g, int peer, void *buf, size_t bytes)
{
	pthread_mutex_lock(&g->in_lock[peer]);
	kiln_status st = shmp2p_recv(&g->in[peer], buf, bytes);
	pthread_mutex_unlock(&g->in_lock[peer]);
	return st;
}

size_t gloo_shm_chunk(void)
{
	return SHMCOLL_CHUNK;
}

void gloo_shm_close(struct gloo_shm *g)
{
	if (!g)
		return;
	if (g->rbase) {
		g->h->log(KILN_LOG_INFO, "gloo", "rank %d of %d: %ld allreduces of the shared gradients, copy-free",
			  g->rank, g->world, g->coll.region_calls);
		munmap(g->rbase, g->rsize);
	}
	if (g->rfd >= 0)
		close(g->rfd);
	unsigned long long sent = 0, received = 0;
	for (int p = 0; g->ring && g->out && g->in && p < g->world; p++)
		if (g->out[p].h && g->in[p].h) /* (not this rank's, nor ends never set up) */
			sent += g->out[p].h->sent, received += g->in[p].h->received;
	if (sent || received)
		g->h->log(KILN_LOG_INFO, "gloo", "rank %d of %d: %llu messages sent and %llu received through the shared-memory channels",
			  g->rank, g->world, sent, received);
	if (g->base)
		munmap(g->base, g->size);
	if (g->fd >= 0)
		close(g->fd); /* drops the lock */
	for (int p = 0; g->out_lock && g->in_lock && p < g->world; p++) {
		pthread_mutex_destroy(&g->out_lock[p]);
		pthread_mutex_destroy(&g->in_lock[p]);
	}
	free(g->out), free(g->in), free(g->out_lock), free(g->in_lock);
	free(g);
}

void gloo_shm_inherit(struct gloo_shm *g, struct gloo_shm *parent)
{
	shmcoll_inherit(&g->coll, &parent->coll);
	p2p_spin(g);
}

int gloo_shm_yields(struct gloo_shm *g)
{
	return shmcoll_yields(&g->coll);
}
