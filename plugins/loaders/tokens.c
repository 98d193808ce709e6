/* plugins/loaders/tokens.c - the `tokens` data source: token shards in
 * llm.c's format (docs/formats.md), as `kiln pack --format tokens` and
 * llm.c's data scripts write them.
 *
 *   i32 header[256]   little-endian: [0] magic 20240520, [1] version 1,
 *                     [2] number of tokens N, the rest 0
 *   u16 tokens[N]     little-endian
 *
 * A sample is a window of T+1 consecutive tokens of one shard (T is the
 * `context` key): sample = i32[T] inputs tokens[w .. w+T), label = i32[T]
 * targets tokens[w+1 .. w+T+1).  The sample index space is the
 * non-overlapping windows w = k*T (k = 0, 1, ...) of every shard in turn,
 * windows never crossing a shard's end; so a sample index names a window by
 * itself, and the core's sampler (a counter-based permutation of the
 * indices by (seed, epoch), split across ranks by global position) makes the
 * windows of a step the same for any worker count and world size, and a
 * run resumed at a global sample offset continues with the same windows.
 *
 * `val_fraction` f holds out the last windows: split train reads the first
 * n - round(f*n) windows, every other split (val, test) the rest; so
 * [data.eval] may then inherit a single-file path.
 *
 * Each shard stays open and read() reads a window's 2T+2 bytes with one
 * pread(): the page cache holds a shard once however many workers and
 * processes read it (cache = mmap for free), and a shard truncated or
 * rewritten while the run reads it is a short read, an error naming the
 * shard and the window (before session 38 the shards were mmap()ed, and
 * such a file killed the process with SIGBUS).  open() checks every header
 * and size, and scans every token once (the largest token + 1 is the
 * class count; `vocab`, when set, bounds them).  Thread-safe after open().
 */
#include "loaders.h"
#include "tokens.h" /* TOK_SUFFIX, TOK_PARTIAL */
#include "../common/open_file.h" /* common_open_file */

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <inttypes.h> /* PRId64, PRIu64 */
#include <limits.h>   /* PATH_MAX */
#include <math.h>     /* llround */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* calloc, malloc, free */
#include <string.h>   /* memcpy, strcmp, strerror */
#include <sys/stat.h> /* stat */
#include <unistd.h>   /* close */

#define TOK_WHO "tokens"
#define TOK_MAGIC 20240520      /* llm.c's token shard magic */
#define TOK_MAGIC_MODEL 20240326 /* llm.c's model file magic: a likely mix-up */
#define TOK_MAGIC_U32 20240801   /* llm.c's uint32-token shards (Llama 3) */
#define TOK_VERSION 1
#define TOK_HEADER_INTS 256
#define TOK_HEADER_BYTES (TOK_HEADER_INTS * 4)
#define TOK_MAX_SHARDS 1000000   /* a recorded count past this is a corrupt header */
#define TOK_SCAN_TOKENS (1 << 19) /* tokens one pread of open's scan reads (1 MiB) */

/* One open shard. */
struct tok_shard {
	char path[PATH_MAX];
	int fd;                  /* open from tok_shard_open to tok_close; -1: not open */
	uint64_t size;           /* the file's bytes at open */
	uint64_t ntok;           /* u16 LE tokens at byte TOK_HEADER_BYTES */
	int64_t first;           /* global window index of this shard's window 0 */
	int64_t windows;         /* floor((ntok - 1) / T) */
	struct loaders_set set;  /* its pack, header ints 3..6 (count 0: not recorded) */
};

struct tok_ctx {
	struct loaders_source src; /* first: host, who, n (windows of this split), classes */
	struct tok_shard *shards;
	int nshards;
	int64_t T;                 /* context: tokens per sample */
	int64_t base;              /* global window index of this split's sample 0 */
	/* where the largest token is (its first place), for info's
	 * classes_from: the core names it when the model is too small */
	char max_from[PATH_MAX + 80];
};

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key tok_keys[] = {
	{ "path", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "A token shard (llm.c's format: docs/formats.md), or a directory of them: for split S it reads every *.bin of the subdirectory `path/S` if that is a directory, else the files `path/S-*.bin` (the names `kiln pack --format tokens` writes), in name order. Required unless `shards` is set. [data.eval] inherits a directory, never a single file. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "shards", KILN_KEY_LIST, NULL, 0, 0, NULL,
	  "Shard files, read in this order (instead of searching `path`); relative names are relative to `path` when that is a directory; a name with *, ? or [ is a glob pattern (its matches in name order, e.g. `fineweb_train_*.bin`). A subset of a kiln pack may be listed (a directory's listing must be the whole pack), one shard twice may not. Never inherited by [data.eval]. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37), as is a pattern that matches nothing." },
	{ "split", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "The subdirectory or file-name prefix a directory `path` is searched for (`.` for the directory itself). Unset: the split the run asks for (train for [data], test for [data.eval], val for [data.val]); for test, `val` shards are read when no `test` ones exist." },
	{ "context", KILN_KEY_INT, NULL, 1, 1048576, NULL,
	  "T, the tokens of one sample: a sample is a window of T+1 consecutive tokens of a shard, inputs i32[T] and targets (the label) i32[T] shifted by one. The windows are the non-overlapping ones starting at multiples of T. Required." },
	{ "vocab", KILN_KEY_INT, "0", 0, 65536, NULL,
	  "The vocabulary size: every token must be below it (checked at open, an error names the shard and the token's offset). 0: no bound. The class count the model's output (and a loss's `classes`) must cover is the largest token + 1 either way, so a vocabulary padded for speed (llm.c's 50304 for GPT-2's 50257) may be set here or only on the embedding (before session 38 a set `vocab` was the class count)." },
	{ "val_fraction", KILN_KEY_FLOAT, "0", 0, 0.99, NULL,
	  "Hold out the last fraction of the windows (over all shards, in order): split train reads the others, splits val and test these ([data.eval] may then inherit a single-file `path`). 0: every split reads all its shards' windows (name the held-out shards by split or `shards`)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* ---- one shard -------------------------------------------------------- */

static int32_t tok_le32(const uint8_t *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

static uint16_t tok_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Why a magic number is wrong, in words. */
static const char *tok_magic_hint(int32_t found)
{
	int32_t swapped = (int32_t)__builtin_bswap32((uint32_t)found);
	if (found == TOK_MAGIC_MODEL)
		return " (this is an llm.c model file, not a token shard)";
	if (found == TOK_MAGIC_U32)
		return " (llm.c's shard of uint32 tokens, for Llama 3: only uint16 (GPT-2) shards are read)";
	if (swapped == TOK_MAGIC)
		return " (byte-swapped: the header was written big-endian)";
	return " (not a token shard: expected llm.c's format, 256 int32 header then uint16 tokens)";
}

static void tok_shard_close(struct tok_shard *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}

/* Header ints 3..6 of kiln pack (since session 34; zero in llm.c's and
 * older kiln's shards, which read as before): [3] 1, [4] this shard's
 * index, [5] the split's shard count, [6] the pack's id.  There is no
 * checksum: an index not below the count is refused as corrupt. */
static kiln_status tok_set_read(const struct kiln_host *host, struct tok_shard *s,
				const uint8_t *h)
{
	if (tok_le32(h + 12) == 0)
		return KILN_OK;
	int32_t index = tok_le32(h + 16), count = tok_le32(h + 20);
	if (tok_le32(h + 12) != 1 || index < 0 || count < 1 || index >= count ||
	    count > TOK_MAX_SHARDS)
		return host->error(KILN_EDATA, "%s: header ints 3..5 (%d, %d, %d) are not kiln pack's record of the shard's pack (1, its index, the shard count, index below count): the header is corrupt",
				   s->path, tok_le32(h + 12), index, count);
	s->set.index = (uint32_t)index;
	s->set.count = (uint32_t)count;
	s->set.pack = (uint32_t)tok_le32(h + 24);
	return KILN_OK;
}

/* Open `path` into s (one of the split's nshards) and check its header
 * and size.  KILN_ECONFIG for a file that is not there (naming `at`, where
 * its key was set: loaders_shards_at), KILN_EIO for an unreadable one
 * (naming `from`, the key it came from: loaders_shards_key), KILN_EDATA for
 * a malformed one.  s->fd stays open (tok_shard_close) on failure too. */
static kiln_status tok_shard_open(const struct kiln_host *host, const char *path, const char *from,
				  const char *at, size_t nshards, struct tok_shard *s)
{
	off_t size;
	snprintf(s->path, sizeof s->path, "%s", path);
	char kind[64], hint[320];
	const char *why;
	s->fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (s->fd < 0 && loaders_missing(errno)) /* a name the config gave: exit 2 */
		return loaders_no_such_file(host, at, path, "the token shard");
	if (s->fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the token shard (%s): %s%s", path, from,
				   why, loaders_open_hint(errno, nshards, hint, sizeof hint));
	s->size = (uint64_t)size;
	uint8_t h[TOK_HEADER_BYTES];
	ssize_t got = s->size < TOK_HEADER_BYTES ? 0 : loaders_pread_full(s->fd, h, sizeof h, 0);
	if (got < 0)
		return host->error(KILN_EIO, "%s: cannot read the token shard: %s", path,
				   strerror(errno));
	if ((size_t)got < sizeof h)
		return host->error(KILN_EDATA, "%s: truncated header: a token shard starts with %d bytes (256 int32), the file has %" PRIu64,
				   path, TOK_HEADER_BYTES, got ? (uint64_t)got : s->size);
	int32_t magic = tok_le32(h), version = tok_le32(h + 4), n = tok_le32(h + 8);
	if (magic != TOK_MAGIC)
		return host->error(KILN_EDATA, "%s: bad magic number %d, expected %d%s", path, magic,
				   TOK_MAGIC, tok_magic_hint(magic));
	if (version != TOK_VERSION)
		return host->error(KILN_EDATA, "%s: token shard version %d, only version %d (uint16 tokens) is supported",
				   path, version, TOK_VERSION);
	if (n < 0)
		return host->error(KILN_EDATA, "%s: the header's token count is negative (%d)", path, n);
	/* (fewer bytes than the tokens' is truncated, more a count mismatch,
	 * an odd number of them too: before session 38 that was "truncated") */
	if ((uint64_t)n * 2 > s->size - TOK_HEADER_BYTES)
		return host->error(KILN_EDATA, "%s: truncated: the header promises %d tokens (%" PRIu64 " bytes), the file holds %zu bytes after the header",
				   path, n, (uint64_t)n * 2, s->size - TOK_HEADER_BYTES);
	if ((uint64_t)n * 2 < s->size - TOK_HEADER_BYTES)
		return host->error(KILN_EDATA, "%s: token count mismatch: the header says %d tokens (%" PRIu64 " bytes), the file holds %" PRIu64 " bytes more than the header's tokens",
				   path, n, (uint64_t)n * 2,
				   (uint64_t)(s->size - TOK_HEADER_BYTES) - (uint64_t)n * 2);
	s->ntok = (uint64_t)n;
	return tok_set_read(host, s, h);
}

/* A read of s that came short: the file shrank since open (truncated or
 * rewritten in place while the run reads it).  `what` names the part. */
static kiln_status tok_short(const struct kiln_host *host, const struct tok_shard *s,
			     const char *what, uint64_t off, size_t want, ssize_t got)
{
	if (got < 0)
		return host->error(KILN_EIO, "%s: cannot read %s (bytes %" PRIu64 "..%" PRIu64 "): %s",
				   s->path, what, off, off + want - 1, strerror(errno));
	struct stat sb;
	char now[64] = "";
	if (!fstat(s->fd, &sb))
		snprintf(now, sizeof now, ", it has %lld now", (long long)sb.st_size);
	return host->error(KILN_EDATA, "%s: %s (bytes %" PRIu64 "..%" PRIu64 "): only %zd of %zu bytes are there: the shard had %" PRIu64 " bytes when the run opened it%s (was it truncated or rewritten while the run read it?)",
			   s->path, what, off, off + want - 1, got, want, s->size, now);
}

/* Every token of s below vocab (when vocab > 0); *max the largest seen,
 * and where it first is in c->max_from (a new largest only: the scan
 * costs one compare a token as before).  buf: TOK_SCAN_TOKENS tokens'
 * room, read a chunk at a time. */
static kiln_status tok_shard_scan(const struct kiln_host *host, struct tok_ctx *c,
				  const struct tok_shard *s, int64_t vocab, int64_t *max,
				  uint8_t *buf)
{
	for (uint64_t i = 0; i < s->ntok; i++) {
		const uint64_t k = i % TOK_SCAN_TOKENS;
		if (k == 0) {
			const uint64_t left = s->ntok - i;
			const size_t want = 2 * (size_t)(left < TOK_SCAN_TOKENS ? left : TOK_SCAN_TOKENS);
			const uint64_t off = TOK_HEADER_BYTES + 2 * i;
			ssize_t got = loaders_pread_full(s->fd, buf, want, off);
			if (got != (ssize_t)want)
				return tok_short(host, s, "the tokens", off, want, got);
		}
		int64_t t = tok_u16(buf + 2 * k);
		if (vocab > 0 && t >= vocab)
			return host->error(KILN_EDATA, "%s: token %" PRId64 " at token offset %" PRIu64 " (byte %" PRIu64 ") is not below vocab = %" PRId64,
					   s->path, t, i, (uint64_t)TOK_HEADER_BYTES + 2 * i, vocab);
		if (t > *max) {
			*max = t;
			snprintf(c->max_from, sizeof c->max_from, "%s: token offset %" PRIu64 " (byte %" PRIu64 ")",
				 s->path, i, (uint64_t)TOK_HEADER_BYTES + 2 * i);
		}
	}
	return KILN_OK;
}

/* ---- the source ------------------------------------------------------- */

static void tok_close(void *vctx)
{
	struct tok_ctx *c = vctx;
	if (!c)
		return;
	for (int i = 0; i < c->nshards; i++)
		tok_shard_close(&c->shards[i]);
	free(c->shards);
	free(c);
}

/* The shard files: the split's, or for the run's own split "test" with no
 * test shards, the "val" ones (llm.c names its held-out shards val).  With
 * val_fraction a single-file path serves every split (each reads its part
 * of the windows), inherited by [data.eval] too. */
static kiln_status tok_find(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, double frac,
			    struct loaders_names *names)
{
	const char *key = host->config_get(cfg, section, "split");
	const char *path = host->config_get(cfg, section, "path");
	const char *list = host->config_get(cfg, section, "shards");
	struct stat sb;
	if (frac > 0 && !(list && *list) && path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
		return loaders_names_add(names, NULL, path)
			       ? host->error(KILN_ENOMEM, "out of memory") : KILN_OK;
	kiln_status st = loaders_find_shards(host, cfg, section, TOK_WHO, key ? key : split, TOK_SUFFIX,
					     names);
	if (st != KILN_EIO || key || !split || strcmp(split, "test"))
		return st;
	loaders_names_free(names);
	return loaders_find_shards(host, cfg, section, TOK_WHO, "val", TOK_SUFFIX, names);
}

/* The keys context, vocab and val_fraction into c (vocab in *vocab). */
static kiln_status tok_keys_read(const struct kiln_host *host, const struct kiln_config *cfg,
				 const char *section, struct tok_ctx *c, int64_t *vocab,
				 double *frac)
{
	kiln_status st = host->config_get_int(cfg, section, "context", &c->T);
	if (st == KILN_ENOTFOUND)
		return host->error(KILN_ECONFIG, "[%s] source = tokens needs `context` (the tokens of one sample, e.g. 128)",
				   section);
	if (st)
		return st;
	if (c->T < 1)
		return host->error(KILN_ECONFIG, "%s: [%s] context = %" PRId64 ": at least 1",
				   host->config_where(cfg, section, "context"), section, c->T);
	if ((st = host->config_get_int(cfg, section, "vocab", vocab)) == KILN_ENOTFOUND)
		*vocab = 0;
	else if (st)
		return st;
	if ((st = host->config_get_float(cfg, section, "val_fraction", frac)) == KILN_ENOTFOUND)
		*frac = 0;
	else if (st)
		return st;
	if (!(*frac >= 0 && *frac < 1))
		return host->error(KILN_ECONFIG, "%s: [%s] val_fraction = %g: in [0, 1)",
				   host->config_where(cfg, section, "val_fraction"), section, *frac);
	return KILN_OK;
}

/* This split's windows of the total: all, or the train / held-out part. */
/* Refused at once when the open shards leave the run too few descriptors
 * (loaders_fd_headroom): before session 38's review 200 shards at ulimit
 * -n 205 opened, then the run failed at its out_dir. */
static kiln_status tok_fd_headroom(const struct kiln_host *host, const struct tok_ctx *c,
				   const char *section)
{
	char msg[512];
	int top = -1;
	for (int i = 0; i < c->nshards; i++)
		if (c->shards[i].fd > top)
			top = c->shards[i].fd;
	if (!loaders_fd_headroom(top, (size_t)c->nshards, msg, sizeof msg))
		return KILN_OK;
	return host->error(KILN_EIO, "[%s] %s%s: %s", section, c->shards[0].path,
			   c->nshards > 1 ? " ..." : "", msg);
}

static kiln_status tok_split_range(const struct kiln_host *host, struct tok_ctx *c,
				   const char *section, const char *split, int64_t total,
				   double frac)
{
	int64_t held = frac > 0 ? (int64_t)llround(frac * (double)total) : 0;
	if (frac > 0 && (held < 1 || held >= total))
		return host->error(KILN_EDATA, "%s%s: val_fraction = %g of %" PRId64 " windows leaves %s empty",
				   c->shards[0].path, c->nshards > 1 ? " ..." : "", frac, total,
				   held < 1 ? "the held-out part" : "the training part");
	int train = !split || !strcmp(split, "train");
	c->base = frac > 0 && !train ? total - held : 0;
	c->src.n = frac > 0 ? (train ? total - held : held) : total;
	if (c->src.n < 1)
		return host->error(KILN_EDATA, "%s%s: no window of context + 1 = %" PRId64 " tokens: the [%s] shards hold fewer tokens",
				   c->shards[0].path, c->nshards > 1 ? " ..." : "", c->T + 1, section);
	return KILN_OK;
}

static kiln_status tok_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	struct loaders_names names = { 0 };
	uint8_t *scan = NULL; /* tok_shard_scan's chunk */
	int64_t vocab = 0, max = -1, total = 0;
	double frac = 0;
	kiln_status st;
	*out = NULL;
	struct tok_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	if ((st = tok_keys_read(host, cfg, section, c, &vocab, &frac)) ||
	    (st = tok_find(host, cfg, section, split, frac, &names)))
		goto fail;
	if (!(c->shards = calloc(names.n, sizeof *c->shards))) {
		st = host->error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	char from[PATH_MAX + 64];
	loaders_shards_key(host, cfg, section, from, sizeof from);
	char at[PATH_MAX + 64];
	loaders_shards_at(host, cfg, section, at, sizeof at);
	if (!(scan = malloc(2 * TOK_SCAN_TOKENS))) {
		st = host->error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < names.n; i++) {
		struct tok_shard *s = &c->shards[c->nshards++];
		s->fd = -1;
		if ((st = loaders_not_partial(host, names.v[i], TOK_PARTIAL)) ||
		    (st = tok_shard_open(host, names.v[i], from, at, names.n, s)) ||
		    (st = tok_shard_scan(host, c, s, vocab, &max, scan)))
			goto fail;
		s->first = total;
		s->windows = s->ntok > 0 ? (int64_t)((s->ntok - 1) / (uint64_t)c->T) : 0;
		total += s->windows;
	}
	if ((st = tok_fd_headroom(host, c, section)))
		goto fail;
	/* (the shards' records of their pack agree: a split listed
	 * from a directory must be a whole pack) */
	if ((st = loaders_set_check(c->src.host, names.v, &c->shards[0].set, sizeof *c->shards,
				     (size_t)c->nshards, names.scanned, TOK_SUFFIX)))
		goto fail;
	const char *sp = host->config_get(cfg, section, "split");
	if ((st = tok_split_range(host, c, section, sp ? sp : split, total, frac)))
		goto fail;
	/* the classes are the largest token + 1 with `vocab` set too: a
	 * padded vocab (llm.c's 50304 for GPT-2's 50257) is the embedding's
	 * rows, not classes the loss must count, and the scan knows better
	 * than the key what a target reaches (before session 38 the key's
	 * count, so a loss of classes = 50257 was refused for data it fits) */
	c->src.classes = max + 1;
	c->src.who = c->shards[0].path;
	host->log(KILN_LOG_INFO, TOK_WHO, "[%s] %s%s: %" PRId64 " windows of %" PRId64 "+1 tokens in %d shard(s) (of %" PRId64 "), tokens below %" PRId64 " (vocab %" PRId64 ")",
		  section, c->shards[0].path, c->nshards > 1 ? " ..." : "", c->src.n, c->T,
		  c->nshards, total, c->src.classes, vocab);
	loaders_names_free(&names);
	free(scan);
	*out = c;
	return KILN_OK;
fail:
	loaders_names_free(&names);
	free(scan);
	tok_close(c);
	return st;
}

static kiln_status tok_info(void *vctx, struct kiln_source_info *info)
{
	const struct tok_ctx *c = vctx;
	loaders_sequence_info(&c->src, c->T, info);
	info->flags = KILN_SOURCE_MAPPED; /* shared page cache: pread, not mmap (see the top) */
	info->classes_from = c->max_from[0] ? c->max_from : NULL;
	return KILN_OK;
}

/* The u16 LE tokens raw[0 .. n) widened into dst[0 .. n), in place: raw
 * may lie inside dst's own bytes, from byte 2n - 2 on (tok_read reads n or
 * n + 1 tokens to the end of dst's 4n bytes).  Forward order is then safe:
 * dst[t] (bytes 4t..4t+3) is written after raw[t] is read, and reaches no
 * raw[j], j > t (at byte 2n - 2 + 2j or later), while one is unread. */
static void tok_widen(int32_t *dst, const uint8_t *raw, int64_t n)
{
	for (int64_t t = 0; t < n; t++) {
		const int32_t v = tok_u16(raw + 2 * t);
		dst[t] = v;
	}
}

/* sample: i32 [T] = tokens [w, w+T); label: i32 [T] = tokens [w+1, w+T+1).
 * Either may be NULL.  One pread() of the tokens wanted (T+1 for both,
 * T for one) into the last bytes of the sample's (else the label's) own
 * buffer, widened there: no buffer of its own, whatever T. */
static kiln_status tok_read(void *vctx, int64_t index, void *sample, void *label)
{
	const struct tok_ctx *c = vctx;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	int64_t g = c->base + index;
	/* the last shard whose first <= g (an empty shard shares the next
	 * one's first, so the search passes over it) */
	int lo = 0, hi = c->nshards - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (c->shards[mid].first <= g)
			lo = mid;
		else
			hi = mid - 1;
	}
	const struct tok_shard *s = &c->shards[lo];
	int32_t *x = sample, *y = label, *dst = x ? x : y;
	if (!dst)
		return KILN_OK;
	const int64_t T = c->T, n = T + (x && y); /* tokens read */
	const uint64_t first = (uint64_t)(g - s->first) * (uint64_t)T + (x ? 0 : 1);
	const uint64_t off = TOK_HEADER_BYTES + 2 * first;
	uint8_t *raw = (uint8_t *)dst + 4 * (size_t)T - 2 * (size_t)n;
	const ssize_t got = loaders_pread_full(s->fd, raw, 2 * (size_t)n, off);
	if (got != 2 * (ssize_t)n) {
		char what[160];
		snprintf(what, sizeof what, "window %" PRId64 " (sample %" PRId64 "), tokens %" PRIu64 "..%" PRIu64,
			 g - s->first, index, first, first + (uint64_t)n - 1);
		return tok_short(c->src.host, s, what, off, 2 * (size_t)n, got);
	}
	if (x && y)
		tok_widen(y, raw + 2, T); /* first: x's widening overwrites raw */
	tok_widen(dst, raw, T);
	return KILN_OK;
}

/* The shards read (version 4): an output never replaces them. */
static void tok_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct tok_ctx *c = ctx;
	for (int i = 0; i < c->nshards; i++)
		each(arg, c->shards[i].path);
}

LOADERS_SOURCE_PF(tokens, "tokens",
		  "token shards in llm.c's format (kiln pack --format tokens): windows of context+1 tokens",
		  tok_keys, tok_open, tok_close, tok_info, tok_read, NULL, NULL, tok_files);
