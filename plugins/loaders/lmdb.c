/* plugins/loaders/lmdb.c - the `lmdb` data source: an LMDB environment of
 * encoded images (the layout of Caffe-era and many PyTorch ImageNet LMDB
 * conversions, with kiln's fixed value format).
 *
 * Convention (docs/formats.md, section lmdb):
 *
 *   key   "%08d" of the sample index: "00000000", "00000001", ... (indices
 *         of 10^8 and more simply have more digits)
 *   value i32 label, little-endian, 4 bytes
 *         u8  image[]: a complete JPEG or PNG file
 *   key   "__len__" (optional): the sample count as ASCII decimal; without
 *         it the count is the number of entries of the main database.
 *
 * The environment is opened read-only without a lock file (MDB_RDONLY |
 * MDB_NOLOCK; MDB_NOSUBDIR when `path` is the data file itself rather than
 * its directory), so it can live on a read-only file system; nothing may
 * write to it while kiln reads.  MDB_NOTLS lets any thread begin read
 * transactions, MDB_NORDAHEAD suits random access to a database larger
 * than memory.  Every read_image() begins its own read-only transaction,
 * decodes straight from the memory map and aborts the transaction: nothing
 * mutable is shared, so it is thread-safe.
 *
 * classes: [data] classes when set (then open() only checks that the first
 * and last keys exist); otherwise open() reads every value's label (one
 * page per sample, so set `classes` for a large database) and the count
 * is the largest + 1.
 *
 * Limits: liblmdb trusts its pages.  A value is checked (length, label),
 * but a database whose B-tree pages are corrupt can make liblmdb itself
 * fail or crash, and a file truncated while mapped raises SIGBUS.  LMDB
 * suits data sets written once by a trusted tool.
 */
#include "loaders.h"
#include "image.h"

#include <ctype.h>    /* isspace, isdigit */
#include <errno.h>    /* ENOENT */
#include <inttypes.h> /* PRId64 */
#include <limits.h>   /* PATH_MAX */
#include <lmdb.h>     /* mdb_* */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* calloc, free */
#include <string.h>   /* strerror, strcmp */

#define LMDB_WHO "lmdb"
#define LMDB_LEN_KEY "__len__"

struct lmdb_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	char path[PATH_MAX];
	MDB_env *env;
	MDB_dbi dbi;
};

/* An LMDB error code as a status: positive codes are errno values (the
 * file could not be read), negative ones LMDB's own (a corrupt or foreign
 * file, or a bug of ours). */
static kiln_status lmdb_status(int rc)
{
	if (rc > 0)
		return rc == ENOMEM ? KILN_ENOMEM : KILN_EIO;
	switch (rc) {
	case MDB_INVALID:
	case MDB_CORRUPTED:
	case MDB_PAGE_NOTFOUND:
	case MDB_VERSION_MISMATCH:
	case MDB_BAD_VALSIZE:
	case MDB_NOTFOUND:
		return KILN_EDATA;
	case MDB_MAP_RESIZED:
	case MDB_READERS_FULL:
	case MDB_TLS_FULL:
		return KILN_EIO;
	default:
		return KILN_EINTERNAL;
	}
}

static const char *lmdb_key_name(int64_t index, char *buf, size_t n)
{
	snprintf(buf, n, "%08" PRId64, index);
	return buf;
}

/* Look up sample `index` in txn: its label and image bytes (pointing into
 * the map, valid until the transaction ends).  Errors name path and key. */
static kiln_status lmdb_get(const struct lmdb_ctx *c, MDB_txn *txn, int64_t index,
			    int32_t *label, const uint8_t **img, size_t *n)
{
	char k[32];
	MDB_val key, val;
	lmdb_key_name(index, k, sizeof k);
	key.mv_data = k;
	key.mv_size = strlen(k);
	int rc = mdb_get(txn, c->dbi, &key, &val);
	if (rc == MDB_NOTFOUND)
		return c->src.host->error(KILN_EDATA, "%s: key %s: missing (the database has %" PRId64 " samples, keys %08d..%08" PRId64 ")",
				      c->path, k, c->src.n, 0, c->src.n - 1);
	if (rc)
		return c->src.host->error(lmdb_status(rc), "%s: key %s: cannot read: %s", c->path, k,
				      mdb_strerror(rc));
	if (val.mv_size < 4)
		return c->src.host->error(KILN_EDATA, "%s: key %s: value of %zu bytes is shorter than its 4-byte label",
				      c->path, k, val.mv_size);
	const uint8_t *v = val.mv_data;
	uint32_t u = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24;
	int32_t y = (int32_t)u;
	if (y < 0 || (c->src.classes && y >= c->src.classes))
		return c->src.host->error(KILN_EDATA, "%s: key %s: label %d is out of range (0..%" PRId64 ")",
				      c->path, k, y, c->src.classes ? c->src.classes - 1 : (int64_t)INT32_MAX);
	*label = y;
	if (img) {
		*img = v + 4;
		*n = val.mv_size - 4;
	}
	return KILN_OK;
}

/* The optional "__len__" entry: 1 and *n when present, 0 when absent. */
static kiln_status lmdb_len_key(const struct lmdb_ctx *c, MDB_txn *txn, int *found,
				int64_t *n)
{
	MDB_val key = { strlen(LMDB_LEN_KEY), (void *)LMDB_LEN_KEY }, val;
	int rc = mdb_get(txn, c->dbi, &key, &val);
	*found = 0;
	if (rc == MDB_NOTFOUND)
		return KILN_OK;
	if (rc)
		return c->src.host->error(lmdb_status(rc), "%s: key %s: cannot read: %s", c->path,
				      LMDB_LEN_KEY, mdb_strerror(rc));
	const char *t = val.mv_data;
	size_t i = 0, len = val.mv_size, d0;
	int64_t v = 0;
	while (i < len && isspace((unsigned char)t[i]))
		i++;
	for (d0 = i; i < len && isdigit((unsigned char)t[i]); i++)
		if ((v = v * 10 + (t[i] - '0')) > ((int64_t)1 << 40))
			break;
	size_t d1 = i;
	while (i < len && (isspace((unsigned char)t[i]) || t[i] == 0))
		i++;
	if (d1 == d0 || i != len || v > ((int64_t)1 << 40))
		return c->src.host->error(KILN_EDATA, "%s: key %s: '%.*s' is not a sample count (ASCII decimal)",
				      c->path, LMDB_LEN_KEY, (int)(len > 40 ? 40 : len), t);
	*found = 1;
	*n = v;
	return KILN_OK;
}

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key lmdb_keys[] = {
	{ "path", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "The LMDB environment (required): its directory (holding data.mdb) or the data file itself. Keys are the sample index as 8-digit decimal (00000000), values a 4-byte little-endian i32 label followed by a JPEG or PNG file; see docs/formats.md. When `path/split` exists it is used instead (path = /x: [data] reads /x/train, [data.eval] /x/test); [data.eval] inheriting path without it is an error. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "split", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Environment under `path` to read (e.g. val); it must exist. Unset: the split the run asks for when `path/split` exists, else `path` itself. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "classes", KILN_KEY_INT, "0", 0, 2147483647.0, NULL,
	  "Number of classes; every label must be below it. 0: open() reads every label and uses the largest + 1 (one page read per sample: set it for a large database)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* ---- the source ------------------------------------------------------- */

static void lmdb_close(void *vctx)
{
	struct lmdb_ctx *c = vctx;
	if (!c)
		return;
	if (c->env)
		mdb_env_close(c->env);
	free(c);
}

static kiln_status lmdb_open(const struct kiln_host *host, const struct kiln_config *cfg,
			     const char *section, const char *split, void **out)
{
	kiln_status st;
	int is_dir, rc, found;
	int64_t classes = 0;
	MDB_txn *txn = NULL;
	*out = NULL;
	const char *path = host->config_get(cfg, section, "path");
	const char *ksplit = host->config_get(cfg, section, "split");
	if ((st = loaders_classes_key(host, cfg, section, &classes)))
		return st;

	struct lmdb_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	if ((st = loaders_max_pixels_key(host, cfg, section, &c->src)))
		goto fail;
	if ((st = loaders_split_root(host, cfg, section, LMDB_WHO, path, ksplit ? ksplit : split,
				     ksplit != NULL, c->path, sizeof c->path, &is_dir)))
		goto fail;
	if ((rc = mdb_env_create(&c->env))) {
		st = host->error(lmdb_status(rc), "%s: cannot create an LMDB environment: %s", c->path,
				 mdb_strerror(rc));
		goto fail;
	}
	unsigned flags = MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS | MDB_NORDAHEAD |
			 (is_dir ? 0 : MDB_NOSUBDIR);
	if ((rc = mdb_env_open(c->env, c->path, flags, 0444))) {
		st = host->error(lmdb_status(rc), "%s: cannot open the LMDB environment: %s%s", c->path,
				 mdb_strerror(rc),
				 rc == ENOENT && is_dir ? " (a directory environment holds data.mdb)" :
				 rc == MDB_INVALID ? " (not an LMDB file)" : "");
		goto fail;
	}
	if ((rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, &txn)) ||
	    (rc = mdb_dbi_open(txn, NULL, 0, &c->dbi))) {
		st = host->error(lmdb_status(rc), "%s: cannot read the LMDB environment: %s", c->path,
				 mdb_strerror(rc));
		goto fail;
	}
	if ((st = lmdb_len_key(c, txn, &found, &c->src.n)))
		goto fail;
	if (!found) {
		MDB_stat ms;
		if ((rc = mdb_stat(txn, c->dbi, &ms))) {
			st = host->error(lmdb_status(rc), "%s: cannot read the LMDB environment: %s", c->path,
					 mdb_strerror(rc));
			goto fail;
		}
		c->src.n = (int64_t)ms.ms_entries;
	}
	if (c->src.n <= 0) {
		st = host->error(KILN_EDATA, "%s: no samples (%s)", c->path,
				 found ? "key " LMDB_LEN_KEY " says 0" : "the database is empty");
		goto fail;
	}
	/* With classes unknown every label is read (and checked); else the two
	 * ends of the key range show that the count and the keys agree. */
	int32_t y, max = 0;
	c->src.classes = classes;
	if (classes) {
		if ((st = lmdb_get(c, txn, 0, &y, NULL, NULL)) ||
		    (st = lmdb_get(c, txn, c->src.n - 1, &y, NULL, NULL)))
			goto fail;
	} else {
		for (int64_t i = 0; i < c->src.n; i++) {
			if ((st = lmdb_get(c, txn, i, &y, NULL, NULL)))
				goto fail;
			if (y > max)
				max = y;
		}
		c->src.classes = (int64_t)max + 1;
	}
	/* committing a read-only transaction keeps the dbi handle open */
	rc = mdb_txn_commit(txn);
	txn = NULL;
	if (rc) {
		st = host->error(lmdb_status(rc), "%s: cannot read the LMDB environment: %s", c->path,
				 mdb_strerror(rc));
		goto fail;
	}
	host->log(KILN_LOG_INFO, LMDB_WHO, "[%s] %s: %" PRId64 " samples, %" PRId64 " classes",
		  section, c->path, c->src.n, c->src.classes);
	c->src.who = c->path;
	*out = c;
	return KILN_OK;

fail:
	if (txn)
		mdb_txn_abort(txn);
	lmdb_close(c);
	return st;
}

/* image: u8 [h, w, c] as decoded; label: i32 []. */
static kiln_status lmdb_read_image(void *vctx, int64_t index, struct kiln_image *img,
				   void *label)
{
	const struct lmdb_ctx *c = vctx;
	const struct kiln_host *host = c->src.host;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	MDB_txn *txn;
	int rc = mdb_txn_begin(c->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return host->error(lmdb_status(rc), "%s: cannot begin a read transaction: %s", c->path,
				   mdb_strerror(rc));
	int32_t y;
	const uint8_t *p;
	size_t n;
	st = lmdb_get(c, txn, index, &y, &p, &n);
	if (!st) {
		char what[PATH_MAX + 64], k[32];
		snprintf(what, sizeof what, "%s: key %s", c->path, lmdb_key_name(index, k, sizeof k));
		st = img_decode(host, p, n, what, c->src.max_pixels, img);
	}
	mdb_txn_abort(txn);
	if (!st && label)
		*(int32_t *)label = y;
	return st;
}

/* The data file read (version 4): `path` itself, or its data.mdb when it
 * is a directory; an output never replaces it. */
static void lmdb_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct lmdb_ctx *c = ctx;
	char data[PATH_MAX + 16];
	each(arg, c->path);
	snprintf(data, sizeof data, "%s/data.mdb", c->path);
	each(arg, data);
}

LOADERS_SOURCE_PF(lmdb, "lmdb",
		  "LMDB environment: key %08d -> i32 label + JPEG/PNG bytes",
		  lmdb_keys, lmdb_open, lmdb_close, loaders_varying_info, NULL, lmdb_read_image, NULL,
		  lmdb_files);
