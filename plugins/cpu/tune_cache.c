/* plugins/cpu/tune_cache.c - the choices tune.c timed, kept between runs.
 *
 * `auto` (bf16_conv, bf16_gemm, conv_impl) times two or three prepared
 * kernels of every op shape when the op is prepared (tune.c): a bf16 CNN
 * pays most of its set-up there (about 1 CPU-s of 1.2 for the example's
 * bf16 plans; docs/PERFORMANCE.md, "Session 12").  The outcome depends only
 * on the op, the team, the kernels and the CPU, so [plugin.cpu] tune_cache
 * (default $XDG_CACHE_HOME/kiln/cpu_tune-<hash>.bin, else ~/.cache/kiln/...,
 * the hash that of the header below, so each build has its own file;
 * `none`: off) keeps it.  The file:
 *
 *   struct tune_hdr   magic, format, record size, then what the choices
 *                     hold for: kiln's version, the plugin's build ID (its
 *                     GNU build-id note, else a hash of its file), oneDNN's
 *                     version and ISA (cpu_dnn_isa), the CPU's model name;
 *                     the record count and an FNV-1a checksum of the records
 *   struct tune_rec[] the op descriptor (shape, dtype, layout, attributes),
 *                     the team it was timed with, the choice, whether it
 *                     is provisional (timed under contention, tune.c) and
 *                     the run-queue wait of the process's threads then
 *                     (the timing thread's alone before session 36)
 *
 * Format 2 (session 14) added the last two; a format-1 file (read with
 * an explicit tune_cache = PATH: the default name is of the header, so
 * another format has another file) is stale like any other.
 * A file whose header names another kiln, build, oneDNN, ISA or CPU is
 * stale: an info line, every op is timed again and the file rewritten.  A
 * damaged one (short, a wrong length or checksum) is reported with its name
 * as a warning and likewise rebuilt.  Neither stops a run.  A context
 * reads the records of its own team when it opens; when it closes having
 * timed anything new, it merges its choices into what the file then holds
 * (another rank may have written it meanwhile) and replaces the file
 * atomically (common_write_atomic: a reader sees the old file or the new);
 * a provisional choice never replaces a confident one there, a confident
 * or a re-timed one replaces what the file held.
 * Two ranks closing together may each write the union they saw, so one
 * rank's new choices can be lost: they are timed again next run, never
 * read half-written.
 */
#include "build-config.h" /* PACKAGE_VERSION, _GNU_SOURCE (dladdr, dl_iterate_phdr) */
#include "cpu.h"
#include "../common/cache_file.h" /* common_cache_path, common_write_atomic */

#include <dlfcn.h> /* dladdr */
#include <elf.h>   /* NT_GNU_BUILD_ID */
#include <errno.h>
#include <link.h> /* dl_iterate_phdr */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_MAGIC "KILNCTC\n"
#define TUNE_FORMAT 2
#define TUNE_MAX_RECS (1 << 20) /* a file claiming more is damaged */

struct tune_hdr {
	char magic[8];
	uint32_t format, rec_size;
	char kiln[32];   /* PACKAGE_VERSION */
	char build[80];  /* "id:<hex>" or "fnv:<hex>" of the plugin */
	char dnn[160];   /* cpu_dnn_isa: oneDNN's version, ISA, bf16 */
	char cpu[128];   /* /proc/cpuinfo's model name */
	uint64_t count;  /* records after the header */
	uint64_t sum;    /* FNV-1a 64 of the records */
};

struct tune_rec {
	struct kiln_op op;
	int32_t threads; /* the team it was timed with */
	int32_t choice;  /* kern_f32 of a bf16 op, conv_impl of an f32 CONV */
	int32_t provisional; /* 1: timed under contention (tune.c, tune_choose) */
	int32_t wait_milli;  /* the process's threads' run-queue wait then, in
			      * thousandths of a second a second; -1 unmeasured */
};

/* What a file holds, read whole. */
struct tune_file {
	struct tune_hdr h;
	struct tune_rec *r;
	size_t n;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

#define FNV_SEED 0xcbf29ce484222325ull

struct build_id {
	const void *addr;
	char *out;
	size_t n;
};

/* dl_iterate_phdr's visitor: the GNU build-id note of the object that
 * holds b->addr, as hex. */
static int note_of(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct build_id *b = arg;
	(void)size;
	const uintptr_t a = (uintptr_t)b->addr;
	int mine = 0;
	for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		const uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		mine = ph->p_type == PT_LOAD && a >= lo && a < lo + ph->p_memsz;
	}
	if (!mine)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_NOTE)
			continue;
		const char *p = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
		while (p + sizeof(ElfW(Nhdr)) <= end) {
			const ElfW(Nhdr) *nh = (const void *)p;
			const char *name = p + sizeof *nh;
			const unsigned char *desc = (const void *)(name + ((nh->n_namesz + 3) & ~3u));
			if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4) &&
			    (const char *)desc + nh->n_descsz <= end) {
				size_t o = (size_t)snprintf(b->out, b->n, "id:");
				for (uint32_t k = 0; k < nh->n_descsz && o + 3 <= b->n; k++)
					o += (size_t)snprintf(b->out + o, b->n - o, "%02x", desc[k]);
				return 1;
			}
			p = (const char *)desc + ((nh->n_descsz + 3) & ~3u);
		}
	}
	return 1; /* the object, without a build-id */
}

/* The plugin's identity: its build-id, else an FNV-1a hash of its file,
 * else its file's name. */
static void plugin_build_id(char *out, size_t n)
{
	struct build_id b = { (const void *)plugin_build_id, out, n };
	out[0] = 0;
	dl_iterate_phdr(note_of, &b);
	if (out[0])
		return;
	Dl_info di;
	if (!dladdr((const void *)plugin_build_id, &di) || !di.dli_fname) {
		snprintf(out, n, "unknown");
		return;
	}
	FILE *f = fopen(di.dli_fname, "rb");
	uint64_t h = FNV_SEED;
	/* on the heap: 64 KiB on the stack overflowed a main thread of
	 * `ulimit -s 64` here, opening the device (cli/kiln.c's minimum) */
	enum { BUF = 1 << 16 };
	char *buf = f ? malloc(BUF) : NULL;
	size_t got;
	if (f && !buf) {
		fclose(f);
		f = NULL;
	}
	while (f && (got = fread(buf, 1, BUF, f)) > 0)
		h = fnv1a(h, buf, got);
	free(buf);
	if (f) {
		fclose(f);
		snprintf(out, n, "fnv:%016llx", (unsigned long long)h);
	} else {
		snprintf(out, n, "file:%.70s", di.dli_fname);
	}
}

static void cpu_model(char *out, size_t n)
{
	snprintf(out, n, "unknown");
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f)) {
		const char *v = strchr(line, ':');
		if (!strncmp(line, "model name", 10) && v) {
			v += 1 + (v[1] == ' ');
			snprintf(out, n, "%.*s", (int)strcspn(v, "\n"), v);
			break;
		}
	}
	if (f)
		fclose(f);
}

/* The header this build on this CPU writes and accepts (count, sum 0). */
static void this_header(struct tune_hdr *h)
{
	memset(h, 0, sizeof *h);
	memcpy(h->magic, TUNE_MAGIC, sizeof h->magic);
	h->format = TUNE_FORMAT;
	h->rec_size = sizeof(struct tune_rec);
#ifdef PACKAGE_VERSION
	snprintf(h->kiln, sizeof h->kiln, "%s", PACKAGE_VERSION);
#endif
	plugin_build_id(h->build, sizeof h->build);
	cpu_dnn_isa(h->dnn, sizeof h->dnn);
	cpu_model(h->cpu, sizeof h->cpu);
}

/* What of the header differs from want's ("another %s"), or NULL. */
static const char *stale_field(const struct tune_hdr *got, const struct tune_hdr *want)
{
	if (got->format != want->format || got->rec_size != want->rec_size)
		return "file format";
	if (strncmp(got->kiln, want->kiln, sizeof got->kiln))
		return "kiln version";
	if (strncmp(got->build, want->build, sizeof got->build))
		return "build of the CPU plugin";
	if (strncmp(got->dnn, want->dnn, sizeof got->dnn))
		return "oneDNN version or ISA";
	if (strncmp(got->cpu, want->cpu, sizeof got->cpu))
		return "CPU model";
	return NULL;
}

enum { TUNE_NONE, TUNE_OK, TUNE_STALE, TUNE_DAMAGED };

/* Read path into f (f->r malloc'd): TUNE_OK, TUNE_NONE (no file),
 * TUNE_STALE or TUNE_DAMAGED with why set. */
static int read_file(const char *path, const struct tune_hdr *want, struct tune_file *f, char *why,
		     size_t n)
{
	memset(f, 0, sizeof *f);
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		if (errno == ENOENT)
			return TUNE_NONE;
		snprintf(why, n, "cannot read it: %s", strerror(errno));
		return TUNE_DAMAGED;
	}
	int st = TUNE_DAMAGED;
	if (fread(&f->h, sizeof f->h, 1, fp) != 1 || memcmp(f->h.magic, TUNE_MAGIC, 8)) {
		snprintf(why, n, "too short or not a kiln tune cache");
		goto out;
	}
	const char *s = stale_field(&f->h, want);
	if (s) {
		snprintf(why, n, "written for another %s", s);
		st = TUNE_STALE;
		goto out;
	}
	if (f->h.count > TUNE_MAX_RECS) {
		snprintf(why, n, "claims %llu records", (unsigned long long)f->h.count);
		goto out;
	}
	f->n = (size_t)f->h.count;
	f->r = malloc(f->n ? f->n * sizeof *f->r : 1);
	if (!f->r) {
		snprintf(why, n, "out of memory for %zu records", f->n);
		goto out;
	}
	char extra;
	if (fread(f->r, sizeof *f->r, f->n, fp) != f->n || fread(&extra, 1, 1, fp) != 0) {
		snprintf(why, n, "its length is not that of its %zu records", f->n);
		goto out;
	}
	if (fnv1a(FNV_SEED, f->r, f->n * sizeof *f->r) != f->h.sum) {
		snprintf(why, n, "bad checksum");
		goto out;
	}
	st = TUNE_OK;
out:
	fclose(fp);
	if (st != TUNE_OK) {
		free(f->r);
		f->r = NULL;
		f->n = 0;
	}
	return st;
}

/* The default file's name, "cpu_tune-<hash>.bin": the hash (FNV-1a, 64
 * bits) is of the header this build on this CPU writes, so two builds (a
 * worktree and main, alternating) keep a file each instead of finding the
 * one file stale and rewriting it every run. */
static void default_name(char *out, size_t n)
{
	struct tune_hdr h;
	this_header(&h);
	snprintf(out, n, "cpu_tune-%016llx.bin", (unsigned long long)fnv1a(FNV_SEED, &h, sizeof h));
}

kiln_status cpu_tune_cache_config(struct cpu_ctx *c, const struct kiln_config *cfg)
{
	char name[64];
	c->tune_path[0] = 0;
	const char *v = cfg ? c->host->config_get(cfg, "plugin.cpu", "tune_cache") : NULL;
	if (!cfg || (v && !strcmp(v, "none")))
		return KILN_OK; /* no config (tests, embedders): nothing kept */
	if (v && *v) {
		if (strlen(v) >= sizeof c->tune_path)
			return c->host->error(KILN_ECONFIG, "cpu: [plugin.cpu] tune_cache: a path of %zu bytes is too long",
					      strlen(v));
		snprintf(c->tune_path, sizeof c->tune_path, "%s", v);
	} else {
		default_name(name, sizeof name);
		if (common_cache_path(c->tune_path, sizeof c->tune_path, name)) {
			static int noted; /* once a process: every device opens one */
			char why[300];
			if (errno == ENOENT && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED)) {
				common_cache_note(why, sizeof why);
				c->host->log(KILN_LOG_INFO, "cpu", "tune cache: %s", why);
			}
			c->tune_path[0] = 0; /* none */
		}
	}
	return KILN_OK;
}

void cpu_tune_cache_load(struct cpu_ctx *c)
{
	if (!c->tune_path[0])
		return;
	struct tune_hdr want;
	struct tune_file f;
	char why[160];
	this_header(&want);
	switch (read_file(c->tune_path, &want, &f, why, sizeof why)) {
	case TUNE_NONE:
		c->host->log(KILN_LOG_INFO, "cpu", "tune cache %s: none yet; a choice timed in this run is written at its end", c->tune_path);
		return;
	case TUNE_STALE:
		c->host->log(KILN_LOG_INFO, "cpu", "tune cache %s: stale (%s); timing again", c->tune_path,
			     why);
		return;
	case TUNE_DAMAGED:
		c->host->log(KILN_LOG_WARN, "cpu", "tune cache %s: damaged (%s); ignored, timing again",
			     c->tune_path, why);
		return;
	default: break;
	}
	int read = 0, prov = 0;
	/* a choice no candidate list has (a file written by hand) is skipped:
	 * that op is timed */
	const int most = CPU_CONV_IMPLS > 2 ? CPU_CONV_IMPLS : 2;
	for (size_t i = 0; i < f.n; i++)
		if (f.r[i].threads == c->threads && f.r[i].choice >= 0 && f.r[i].choice < most) {
			const struct cpu_tune_val v = { f.r[i].choice, f.r[i].provisional != 0,
							f.r[i].wait_milli < 0 ? -1 : f.r[i].wait_milli / 1e3 };
			cpu_tune_add(c, &f.r[i].op, &v);
			read++;
			prov += v.provisional;
		}
	free(f.r);
	c->tune_read = read;
	c->host->log(KILN_LOG_INFO, "cpu", "tune cache %s: %d choices read for %d threads (%d provisional)",
		     c->tune_path, read, c->threads, prov);
}

/* The records to write: the file's of other teams and ops, then ours. */
struct merge {
	struct tune_rec *r;
	size_t n, cap;
	int threads;
	int fail;
	int kept; /* confident records a provisional choice of ours left alone */
};

/* Add or replace op's record for the team; a provisional choice does not
 * replace a confident one (counted in m->kept). */
static void put(struct merge *m, const struct kiln_op *op, int threads, int choice, int provisional,
		int32_t wait_milli)
{
	for (size_t i = 0; i < m->n; i++)
		if (m->r[i].threads == threads && !memcmp(&m->r[i].op, op, sizeof *op)) {
			if (provisional && !m->r[i].provisional) {
				m->kept++;
				return;
			}
			m->r[i].choice = choice;
			m->r[i].provisional = provisional;
			m->r[i].wait_milli = wait_milli;
			return;
		}
	if (m->n == m->cap) {
		const size_t cap = m->cap ? 2 * m->cap : 64;
		struct tune_rec *r = realloc(m->r, cap * sizeof *r);
		if (!r) {
			m->fail = 1;
			return;
		}
		m->r = r, m->cap = cap;
	}
	memset(&m->r[m->n], 0, sizeof m->r[m->n]);
	m->r[m->n].op = *op;
	m->r[m->n].threads = threads;
	m->r[m->n].choice = choice;
	m->r[m->n].provisional = provisional;
	m->r[m->n].wait_milli = wait_milli;
	m->n++;
}

static void put_ours(void *arg, const struct kiln_op *op, const struct cpu_tune_val *v)
{
	struct merge *m = arg;
	const double w = v->wait < 0 ? -1 : v->wait > 1e6 ? 1e6 : v->wait;
	put(m, op, m->threads, v->choice, v->provisional, w < 0 ? -1 : (int32_t)(w * 1e3 + 0.5));
}

/* The default file's first write also removes the cache of builds before
 * per-build files ($XDG_CACHE_HOME/kiln/cpu_tune.bin, else under ~/.cache:
 * nothing reads it any more, and nothing else would remove it); a
 * tune_cache = PATH leaves it alone (a file of the user's choosing might
 * be that very name).  Once: afterwards there is none to remove. */
static void remove_legacy(struct cpu_ctx *c)
{
	char name[64], def[sizeof c->tune_path], old[sizeof c->tune_path];
	default_name(name, sizeof name);
	if (common_cache_path(def, sizeof def, name) || strcmp(def, c->tune_path) ||
	    common_cache_path(old, sizeof old, "cpu_tune.bin"))
		return;
	if (!unlink(old))
		c->host->log(KILN_LOG_INFO, "cpu", "tune cache %s: removed, the file of builds before per-build caches (no longer read)",
			     old);
}

void cpu_tune_cache_save(struct cpu_ctx *c)
{
	if (!c->tune_path[0])
		return;
	pthread_mutex_lock(c->lock);
	const int timed = c->tune_timed; /* new or re-timed */
	pthread_mutex_unlock(c->lock);
	if (timed <= 0)
		return; /* nothing new */
	if (getenv("KILN_CPU_TUNEPICK"))
		return; /* the tests' hook set choices (tune.c): none is the machine's */
	struct tune_hdr h;
	struct tune_file f;
	char why[160];
	this_header(&h);
	struct merge m = { .threads = c->threads };
	if (read_file(c->tune_path, &h, &f, why, sizeof why) == TUNE_OK) {
		for (size_t i = 0; i < f.n; i++)
			put(&m, &f.r[i].op, f.r[i].threads, f.r[i].choice, f.r[i].provisional != 0,
			    f.r[i].wait_milli);
		free(f.r);
	}
	cpu_tune_each(c, put_ours, &m);
	if (m.fail) {
		c->host->log(KILN_LOG_WARN, "cpu", "tune cache %s: out of memory; not written", c->tune_path);
		free(m.r);
		return;
	}
	h.count = m.n;
	h.sum = fnv1a(FNV_SEED, m.r, m.n * sizeof *m.r);
	const void *part[2] = { &h, m.r };
	const size_t len[2] = { sizeof h, m.n * sizeof *m.r };
	if (common_write_atomic(c->tune_path, part, len, 2))
		c->host->log(KILN_LOG_WARN, "cpu", "tune cache %s: not written: %s", c->tune_path,
			     strerror(errno));
	else {
		size_t prov = 0;
		for (size_t i = 0; i < m.n; i++)
			prov += m.r[i].provisional != 0;
		c->host->log(KILN_LOG_INFO, "cpu",
			     "tune cache %s: %d choices timed, %zu written (%zu provisional; %d provisional of ours left out for confident ones)",
			     c->tune_path, timed, m.n, prov, m.kept);
		remove_legacy(c);
	}
	free(m.r);
}
