/* core/dist_data.c - every rank reads the same data: after the data sets'
 * sizes agree (kiln_dist_agree_sizes, dist_config.c), their identities
 * (kiln_dataset_identity: the shapes, the transforms, each file's path,
 * size and ends) are compared through the store, so that a rank whose
 * copy at the same path has the same size but other contents (another
 * node's, an older version, another pack) fails every rank at once,
 * naming the rank, the file and what differs, instead of training on
 * other data without a word (session 35).
 *
 * The texts can be long (a folder of 1.28 million images: a line each),
 * so they never all travel.  Each rank posts one 64-bit FNV-1a digest per
 * set (kiln/data_id/R); rank 0 also posts its text's chunk digests
 * (kiln/data_chunks/I, one per CHUNK_LINES lines).  Where a rank's digest
 * differs from rank 0's, the first such rank r finds the first chunk
 * that differs, asks rank 0 for that chunk's text (kiln/data_want),
 * compares it line by line with its own and posts what differs
 * (kiln/data_verdict), which every rank reports.  A rank that fails or is
 * lost on the way ends the others' waits (dist_peer_read).
 */
#include "data.h" /* DATA_ID_EDGE */
#include "dist_impl.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA_SETS_MAX 4 /* the sections a trainer opens: [data], .eval, .val */
#define CHUNK_LINES 256

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h;
}

/* Chunk c of text (lines [c * CHUNK_LINES, (c + 1) * CHUNK_LINES)) at
 * [*at, *at + *n): 0 when the text has no such chunk. */
static int chunk_span(const char *t, size_t len, size_t c, size_t *at, size_t *n)
{
	size_t p = 0, lines = 0;
	while (p < len && lines < c * CHUNK_LINES) {
		const char *e = memchr(t + p, '\n', len - p);
		p = e ? (size_t)(e - t) + 1 : len;
		lines++;
	}
	if (p >= len)
		return 0;
	size_t q = p;
	for (size_t l = 0; q < len && l < CHUNK_LINES; l++) {
		const char *e = memchr(t + q, '\n', len - q);
		q = e ? (size_t)(e - t) + 1 : len;
	}
	*at = p;
	*n = q - p;
	return 1;
}

/* The chunks' digests, 16 hex digits each (malloc'd; NULL: no memory),
 * in one pass over the text (a folder of 1.28 million images: 5000
 * chunks of 100 MB of lines). */
static char *chunk_digests(const char *t, size_t len)
{
	size_t lines = 0, m = 0;
	for (size_t p = 0; p < len; p++)
		lines += t[p] == '\n';
	char *s = malloc(16 * ((lines + 1) / CHUNK_LINES + 2) + 1);
	for (size_t p = 0; s && p < len;) {
		size_t q = p;
		for (size_t l = 0; q < len && l < CHUNK_LINES; l++) {
			const char *e = memchr(t + q, '\n', len - q);
			q = e ? (size_t)(e - t) + 1 : len;
		}
		m += (size_t)sprintf(s + m, "%016" PRIx64, fnv1a(t + p, q - p));
		p = q;
	}
	if (s)
		s[m] = 0;
	return s;
}

/* Rank 0's chunk digests of each set, then this rank's digests. */
static kiln_status post_mine(struct kiln_dist *d, char *const *texts, const size_t *lens, int k)
{
	char key[48], v[DATA_SETS_MAX * 17 + 1];
	size_t m = 0;
	kiln_status st = KILN_OK;
	for (int i = 0; !st && d->env.rank == 0 && i < k; i++) {
		char *c = chunk_digests(texts[i], lens[i]);
		snprintf(key, sizeof key, "kiln/data_chunks/%d", i);
		st = c ? kiln_store_set(d->store, key, c, strlen(c)) : kiln_error(KILN_ENOMEM, "out of memory");
		free(c);
	}
	for (int i = 0; i < k; i++)
		m += (size_t)snprintf(v + m, sizeof v - m, "%s%016" PRIx64, i ? " " : "",
				      fnv1a(texts[i], lens[i]));
	snprintf(key, sizeof key, "kiln/data_id/%d", d->env.rank);
	return st ? st : kiln_store_set(d->store, key, v, m);
}

/* key's value from a peer; a peer failed or lost first, or a timeout
 * (then the peer blamed, as kiln_dist_agree_sizes does), as an error. */
static kiln_status peer_value(struct kiln_dist *d, const char *key, const char *what, char **out)
{
	int who, lost;
	void *v = NULL;
	kiln_status st = dist_peer_read(d, key, &v, &who, &lost);
	*out = v;
	if (st) {
		d->peer_blamed = 1;
		return kiln_error_wrap(st, "rank %d of %d: waiting for %s", d->env.rank, d->env.world,
				       what);
	}
	if (who >= 0)
		return dist_peer_gone(d, who, lost, "the ranks compared their data");
	return KILN_OK;
}

/* Every rank's digests into id[r * k + i]. */
static kiln_status read_ids(struct kiln_dist *d, uint64_t *id, int k)
{
	char key[48], what[64];
	kiln_status st = KILN_OK;
	for (int r = 0; !st && r < d->env.world; r++) {
		char *v = NULL;
		snprintf(key, sizeof key, "kiln/data_id/%d", r);
		snprintf(what, sizeof what, "rank %d's data digests", r);
		st = peer_value(d, key, what, &v);
		const char *p = v;
		for (int i = 0; v && i < k; i++) {
			char *e;
			id[r * k + i] = strtoull(p, &e, 16);
			p = e;
		}
		free(v);
	}
	return st;
}

/* Line l of t into out (without its newline; "" past the end): 0 there. */
static int line_at(const char *t, size_t len, size_t l, char *out, size_t n)
{
	size_t p = 0;
	for (; p < len && l; l--) {
		const char *e = memchr(t + p, '\n', len - p);
		p = e ? (size_t)(e - t) + 1 : len;
	}
	const char *e = p < len ? memchr(t + p, '\n', len - p) : NULL;
	size_t m = p < len ? (e ? (size_t)(e - t) : len) - p : 0;
	snprintf(out, n, "%.*s", (int)m, t + p);
	return p < len;
}

/* 1 when the paths a and b name the same file, gzipped at one (a name
 * ending ".gz") and not at the other: the idx source reads either */
static int gz_pair(const char *a, const char *b)
{
	const size_t na = strlen(a), nb = strlen(b);
	if (na < nb)
		return gz_pair(b, a);
	return na == nb + 3 && !strcmp(a + nb, ".gz") && !strncmp(a, b, nb);
}

/* What differs between two lines of the same gzip file fa and fb (fields:
 * path, compressed size, ends, contents; core/data_identity.c) into out. */
static void describe_gz(char fa[][PATH_MAX], char fb[][PATH_MAX], int r, char *out, size_t n)
{
	static const char *const check = "files are compared, not what they inflate to: `gzip -dc FILE | cksum` on each node tells whether their contents are the same; store the same file on every rank";
	if (strcmp(fa[4], fb[4]))
		snprintf(out, n, "%.1500s: its contents differ, by its gzip trailer (%.64s on rank 0; %.64s on rank %d)",
			 fa[0], fa[4], fb[4], r);
	else if (strcmp(fa[1], fb[1]))
		snprintf(out, n, "%.1500s: the same contents by its gzip trailer (%.64s), compressed otherwise (%lld compressed bytes after its header on rank 0 but %lld on rank %d): %s",
			 fa[0], fa[4], atoll(fa[1]), atoll(fb[1]), r, check);
	else
		snprintf(out, n, "%.1500s: the same contents by its gzip trailer (%.64s), compressed otherwise (its %s %d compressed bytes after its header differ, CRC32C %.16s on rank 0, %.16s on rank %d): %s",
			 fa[0], fa[4], strcmp(fa[2], fb[2]) ? "first" : "last", DATA_ID_EDGE,
			 strcmp(fa[2], fb[2]) ? fa[2] : fa[3], strcmp(fa[2], fb[2]) ? fb[2] : fb[3], r,
			 check);
}

/* describe's fields fa, fb (5 each, PATH_MAX bytes: empty) parsed from a
 * and b and compared. */
static void describe_fields(const char *a, int ha, const char *b, int hb, int r,
			    char fa[][PATH_MAX], char fb[][PATH_MAX], char *out, size_t n)
{
	static const char *const fmt = "%4095[^\t]\t%4095[^\t]\t%4095[^\t]\t%4095[^\t]\t%4095[^\n]";
	if (!ha || !hb) {
		snprintf(out, n, "rank %d reads %.1500s, which rank %d does not (another list of files)",
			 ha ? 0 : r, ha ? a : b, ha ? r : 0);
		return;
	}
	int na = sscanf(a, fmt, fa[0], fa[1], fa[2], fa[3], fa[4]);
	int nb = sscanf(b, fmt, fb[0], fb[1], fb[2], fb[3], fb[4]);
	const int gza = na >= 2 && strstr(fa[1], " gzip"), gzb = nb >= 2 && strstr(fb[1], " gzip");
	if (!strncmp(a, "samples ", 8) || !strncmp(a, "transforms ", 11) || na < 1 || nb < 1)
		snprintf(out, n, "'%.1500s' on rank 0 but '%.1500s' on rank %d", a, b, r);
	else if (strcmp(fa[0], fb[0]) && gz_pair(fa[0], fb[0]))
		snprintf(out, n, "rank 0 reads %.1500s where rank %d reads %.1500s (another list of files: the same name, gzip-compressed on one rank only; files are compared, not what they inflate to: store them alike on every rank, all compressed or none)",
			 fa[0], r, fb[0]);
	else if (strcmp(fa[0], fb[0]))
		snprintf(out, n, "rank 0 reads %.1500s where rank %d reads %.1500s (another list of files)",
			 fa[0], r, fb[0]);
	else if (gza != gzb && na >= 2 && nb >= 2)
		snprintf(out, n, "%.1500s: a gzip file on rank %d, not on rank %d", fa[0], gza ? 0 : r,
			 gza ? r : 0);
	else if (gza && na == 5 && nb == 5)
		describe_gz(fa, fb, r, out, n);
	else if (na >= 2 && nb >= 2 && strcmp(fa[1], fb[1]))
		snprintf(out, n, "%.1500s: %.32s bytes on rank 0 but %.32s on rank %d", fa[0], fa[1],
			 fb[1], r);
	else if (na == 4 && nb == 4 && strcmp(fa[2], fb[2]))
		snprintf(out, n, "%.1500s: its first %d bytes differ (CRC32C %.16s on rank 0, %.16s on rank %d)",
			 fa[0], DATA_ID_EDGE, fa[2], fb[2], r);
	else if (na == 4 && nb == 4)
		snprintf(out, n, "%.1500s: its last %d bytes differ (CRC32C %.16s on rank 0, %.16s on rank %d)",
			 fa[0], DATA_ID_EDGE, fa[3], fb[3], r);
	else
		snprintf(out, n, "%.1500s: '%.1500s' on rank 0 but '%.1500s' on rank %d", fa[0],
			 a + strlen(fa[0]), b + strlen(fb[0]), r);
}

/* What differs between rank 0's line a and rank r's line b (ha, hb:
 * whether each has it) into out. */
static void describe(const char *a, int ha, const char *b, int hb, int r, char *out, size_t n)
{
	/* (40 KiB of fields: on the heap, as every buffer of this path; a
	 * thread's stack is no place for them: see configure.ac's
	 * KILN_FRAME_CFLAGS) */
	char(*fa)[PATH_MAX] = calloc(10, PATH_MAX), (*fb)[PATH_MAX] = fa ? fa + 5 : NULL;
	if (!fa) {
		snprintf(out, n, "out of memory");
		return;
	}
	describe_fields(a, ha, b, hb, r, fa, fb, out, n);
	free(fa);
}

/* The first line of chunk c that differs between rank 0's text z and
 * this rank's t, described into out. */
static void chunk_verdict(struct kiln_dist *d, const char *z, size_t zn, const char *t, size_t tn,
			  char *out, size_t n)
{
	enum { LINE = 8192 };
	char *a = malloc(2 * LINE), *b = a + LINE; /* (on the heap: see describe) */
	if (!a) {
		snprintf(out, n, "out of memory");
		return;
	}
	for (size_t l = 0;; l++) {
		int ha = line_at(z, zn, l, a, LINE), hb = line_at(t, tn, l, b, LINE);
		if ((ha || hb) && (ha != hb || strcmp(a, b))) {
			describe(a, ha, b, hb, d->env.rank, out, n);
			free(a);
			return;
		}
		if (!ha && !hb)
			break;
	}
	free(a);
	snprintf(out, n, "the same lines, another digest (a chunk of another length)");
}

/* This rank differs first in set i: the first chunk that differs (by
 * rank 0's chunk digests), rank 0's text of it, the verdict posted. */
static kiln_status find_difference(struct kiln_dist *d, int i, const char *t, size_t tn)
{
	enum { VERDICT = 3 * PATH_MAX, FULL = VERDICT + 64 };
	char key[48], *zd = NULL, *z = NULL, want[48];
	char *verdict = NULL, *full = NULL; /* (on the heap: see describe) */
	size_t c = 0, at = 0, n = 0;
	snprintf(key, sizeof key, "kiln/data_chunks/%d", i);
	kiln_status st = peer_value(d, key, "rank 0's data chunk digests", &zd);
	char *mine = st ? NULL : chunk_digests(t, tn);
	if (!st && !mine)
		st = kiln_error(KILN_ENOMEM, "out of memory");
	while (!st && mine[16 * c] && zd[16 * c] && !strncmp(mine + 16 * c, zd + 16 * c, 16))
		c++;
	free(zd);
	free(mine);
	int k = snprintf(want, sizeof want, "%d %zu", i, c);
	if (!st && !(st = kiln_store_set(d->store, "kiln/data_want", want, (size_t)k)) &&
	    !(st = peer_value(d, "kiln/data_chunk", "rank 0's data chunk", &z)) &&
	    (!(verdict = malloc(VERDICT)) || !(full = malloc(FULL))))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	if (!st) {
		if (!chunk_span(t, tn, c, &at, &n))
			at = n = 0;
		chunk_verdict(d, z, strlen(z), t + at, n, verdict, VERDICT);
		k = snprintf(full, FULL, "rank %d's data differ from rank 0's: %s", d->env.rank,
			     verdict);
		st = kiln_store_set(d->store, "kiln/data_verdict", full,
				    k < FULL ? (size_t)k : FULL - 1);
	}
	free(verdict);
	free(full);
	free(z);
	return st;
}

/* Rank 0: the chunk the differing rank asks for (kiln/data_want: "I C"). */
static kiln_status serve_chunk(struct kiln_dist *d, char *const *texts, const size_t *lens, int k)
{
	char *w = NULL;
	size_t at = 0, n = 0;
	kiln_status st = peer_value(d, "kiln/data_want", "the differing rank's question", &w);
	if (st)
		return st;
	int i = -1;
	size_t c = 0;
	if (sscanf(w, "%d %zu", &i, &c) != 2 || i < 0 || i >= k ||
	    !chunk_span(texts[i], lens[i], c, &at, &n))
		at = n = 0;
	free(w);
	return kiln_store_set(d->store, "kiln/data_chunk", n ? texts[i] + at : "", n);
}

kiln_status kiln_dist_agree_data(struct kiln_dist *d, const char *const *names, char *const *texts,
				 const size_t *lens, int k)
{
	if (!d || d->env.world < 2)
		return KILN_OK;
	if (k > DATA_SETS_MAX)
		return kiln_error(KILN_EINTERNAL, "kiln_dist_agree_data: %d sets", k);
	uint64_t *id = calloc((size_t)d->env.world * (size_t)k, sizeof *id);
	if (!id)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_status st = post_mine(d, texts, lens, k);
	if (!st)
		st = read_ids(d, id, k);
	int fi = -1, fr = -1; /* the first set, and in it the first rank, that differ */
	for (int i = 0; !st && fi < 0 && i < k; i++)
		for (int r = 1; fi < 0 && r < d->env.world; r++)
			if (id[r * k + i] != id[i])
				fi = i, fr = r;
	free(id);
	if (st || fi < 0)
		return st;
	char *verdict = NULL;
	if (d->env.rank == fr)
		st = find_difference(d, fi, texts[fi], lens[fi]);
	else if (d->env.rank == 0)
		st = serve_chunk(d, texts, lens, k);
	if (!st)
		st = peer_value(d, "kiln/data_verdict", "the ranks' verdict on their data", &verdict);
	if (!st) {
		/* every rank reaches the same verdict: no one's own failure
		 * to tell the peers (close_mark_failed) */
		d->agreed = 1;
		st = kiln_error(KILN_EDATA, "rank %d of %d: %s: %s: every rank must read the same data (a node's other copy at the same path? docs/distributed.md \"The same data on every rank\")",
				d->env.rank, d->env.world, names[fi], verdict);
	}
	free(verdict);
	return st;
}
