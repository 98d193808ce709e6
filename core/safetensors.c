/* core/safetensors.c - read and write safetensors files (kiln.h,
 * docs/safetensors.md).
 *
 *   [u64 LE N][N bytes of JSON header, space padded][data: the tensors' bytes]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end)} (offsets relative to the data), plus an optional
 * "__metadata__" object of strings.  The reader pread()s the header and
 * refuses the file unless every entry is well formed and the tensors tile
 * the data exactly: sorted by offset, no overlaps, no holes, nothing after
 * the last one (the reference implementation's rules).  It keeps the file
 * open: kiln_safetensors_read pread()s a tensor into the caller's buffer,
 * so a file cut short while it is read (re-exported in place, a network
 * file system) is an error naming the tensor and the sizes, and one
 * rewritten in place (its size or modification time no longer what they
 * were at open: session 40) is an error naming the file.  Before
 * session 39 kiln read the tensors through a mapping of the file, and a
 * page past the new end killed it with SIGBUS (exit 135, nothing said;
 * within the last page, zeros were loaded as weights).  Until session 40
 * every open mapped the file whole, which kiln no longer read: a file
 * larger than the address space left (`ulimit -v`, a batch system's
 * h_vmem) could not be opened ("cannot map").  The mapping is made at the
 * first ask for kiln_safetensors_tensor.data (kiln_safetensors_get,
 * _find), the API's pointer, which kiln's own loaders never ask for
 * (kiln_safetensors_describe); where it cannot be made, _find is KILN_EIO
 * ("cannot map") and the next ask tries again.  The writer orders
 * tensors as the reference does (alignment descending, then name) and
 * pads the header to a multiple of 8, so every tensor starts aligned to
 * its element size.  The CRC32Cs kiln records (metadata kiln.crc32c) are
 * checked by kiln_safetensors_read as it reads each tensor
 * (kiln_safetensors_crc_reads: a load reads each byte once; since session
 * 42 for weights files, 43 for INT8 models, which were checked whole
 * before they were read, kiln_safetensors_check_crc, now gone).
 */
#include "internal.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <fcntl.h>
#include <jansson.h> /* the header */
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as is"
#endif

/* The reference implementation's limit on the header. */
#define MAX_HEADER (100u * 1000u * 1000u)

/* Every dtype of the format, in the reference implementation's order (its
 * Dtype enum), which the writer's sort follows: larger rank first. */
static const struct {
	const char *name;
	size_t size;
	int kiln; /* enum kiln_dtype, -1 for none */
} dtypes[] = {
	{ "BOOL", 1, -1 },     { "U8", 1, KILN_U8 },   { "I8", 1, KILN_I8 },
	{ "F8_E5M2", 1, -1 },  { "F8_E4M3", 1, -1 },   { "I16", 2, -1 },
	{ "U16", 2, -1 },      { "F16", 2, KILN_F16 }, { "BF16", 2, KILN_BF16 },
	{ "I32", 4, KILN_I32 }, { "U32", 4, -1 },      { "F32", 4, KILN_F32 },
	{ "F64", 8, -1 },      { "I64", 8, KILN_I64 }, { "U64", 8, -1 },
};

static int dtype_by_name(const char *s)
{
	for (size_t i = 0; i < KILN_ARRAY_LEN(dtypes); i++)
		if (!strcmp(dtypes[i].name, s))
			return (int)i;
	return -1;
}

static int dtype_by_kiln(int kd)
{
	for (size_t i = 0; i < KILN_ARRAY_LEN(dtypes); i++)
		if (dtypes[i].kiln == kd && kd >= 0)
			return (int)i;
	return -1;
}

/* ---- reader ------------------------------------------------------------- */

struct st_entry {
	char *name;
	int dt;                   /* index into dtypes[] */
	int ndim;
	int64_t dims[KILN_MAX_DIMS];
	int64_t numel;
	uint64_t begin, end;      /* into the data */
};

struct kiln_safetensors {
	char *path;
	int fd;                    /* the file, open until close: tensors are pread */
	struct kiln_file_seen seen; /* its size and mtime when opened */
	size_t size;               /* seen.size */
	/* all of it, read-only, for kiln_safetensors_tensor.data: made at the
	 * first ask that succeeds (file_map; atomic: a reader is shared by
	 * threads), NULL before */
	void *map;
	uint64_t data_off;         /* where the data starts: 8 + the header's length */
	size_t data_len;
	int n;
	struct st_entry *t;        /* sorted by begin */
	int n_meta;
	char **meta;               /* key, value, key, value, ... */
	/* kiln_safetensors_crc_reads: each tensor's recorded CRC32C by index,
	 * which kiln_safetensors_read checks as it reads (NULL: unchecked),
	 * and the metadata key they came from; set before any read */
	uint32_t *crc;
	char *crc_key;
};

static int by_offset(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON integer in [0, 2^53] (what a JSON parser can carry exactly). */
static int get_u64(json_t *j, uint64_t *v)
{
	if (!json_is_integer(j) || json_integer_value(j) < 0 ||
	    json_integer_value(j) > ((json_int_t)1 << 53))
		return -1;
	*v = (uint64_t)json_integer_value(j);
	return 0;
}

static kiln_status parse_entry(const struct kiln_safetensors *f, const char *name, json_t *v,
			       struct st_entry *e)
{
	const char *p = f->path;
	if (!json_is_object(v))
		return kiln_error(KILN_EDATA, "%s: tensor '%s': header entry is not an object", p, name);
	json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
	json_t *off = json_object_get(v, "data_offsets");
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(off))
		return kiln_error(KILN_EDATA, "%s: tensor '%s': needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (arrays)",
				  p, name);
	/* (a string may hold \u0000, JSON_ALLOW_NUL: "F32\u0000x" is no F32) */
	const int nul = strlen(json_string_value(dt)) != json_string_length(dt);
	e->dt = nul ? -1 : dtype_by_name(json_string_value(dt));
	if (e->dt < 0)
		return kiln_error(KILN_EDATA, "%s: tensor '%s': unknown dtype \"%s%s\"", p, name,
				  json_string_value(dt), nul ? "\\u0000..." : "");
	size_t nd = json_array_size(shape);
	if (nd > KILN_MAX_DIMS)
		return kiln_error(KILN_EDATA, "%s: tensor '%s': %zu dimensions; kiln reads up to %d",
				  p, name, nd, KILN_MAX_DIMS);
	e->ndim = (int)nd;
	e->numel = 1;
	int overflow = 0;
	for (size_t i = 0; i < nd; i++) {
		uint64_t d;
		if (get_u64(json_array_get(shape, i), &d))
			return kiln_error(KILN_EDATA, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
					  p, name, i);
		e->dims[i] = (int64_t)d;
		if (d && (uint64_t)e->numel > ((uint64_t)1 << 62) / d)
			overflow = 1;
		else
			e->numel *= (int64_t)d;
	}
	if (json_array_size(off) != 2 || get_u64(json_array_get(off, 0), &e->begin) ||
	    get_u64(json_array_get(off, 1), &e->end) || e->end < e->begin)
		return kiln_error(KILN_EDATA, "%s: tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end",
				  p, name);
	if (e->end > f->data_len)
		return kiln_error(KILN_EDATA, "%s: tensor '%s': data_offsets [%llu, %llu] are outside the data (%zu bytes)",
				  p, name, (unsigned long long)e->begin, (unsigned long long)e->end,
				  f->data_len);
	uint64_t want = overflow ? 0 : (uint64_t)e->numel * dtypes[e->dt].size;
	if (overflow || want != e->end - e->begin) {
		char shp[160];
		size_t o = 0;
		shp[0] = 0;
		for (int i = 0; i < e->ndim && o < sizeof shp; i++)
			o += (size_t)snprintf(shp + o, sizeof shp - o, i ? ", %lld" : "%lld",
					      (long long)e->dims[i]);
		if (overflow)
			return kiln_error(KILN_EDATA, "%s: tensor '%s': shape [%s] is too large", p,
					  name, shp);
		return kiln_error(KILN_EDATA, "%s: tensor '%s': %s [%s] is %llu bytes but data_offsets [%llu, %llu] hold %llu",
				  p, name, dtypes[e->dt].name, shp, (unsigned long long)want,
				  (unsigned long long)e->begin, (unsigned long long)e->end,
				  (unsigned long long)(e->end - e->begin));
	}
	if (!(e->name = kiln_strdup(name)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	return KILN_OK;
}

static kiln_status parse_meta(struct kiln_safetensors *f, json_t *m)
{
	const char *k;
	json_t *v;
	if (!json_is_object(m))
		return kiln_error(KILN_EDATA, "%s: \"__metadata__\" is not an object", f->path);
	f->meta = calloc(2 * json_object_size(m) + 1, sizeof(char *));
	if (!f->meta)
		return kiln_error(KILN_ENOMEM, "out of memory");
	json_object_foreach(m, k, v) {
		if (!json_is_string(v))
			return kiln_error(KILN_EDATA, "%s: \"__metadata__\" value of '%s' is not a string",
					  f->path, k);
		/* one holding \u0000 (JSON_ALLOW_NUL) is no C string: absent,
		 * not cut short (kiln_safetensors_meta) */
		if (strlen(json_string_value(v)) != json_string_length(v))
			continue;
		if (!(f->meta[2 * f->n_meta] = kiln_strdup(k)) ||
		    !(f->meta[2 * f->n_meta + 1] = kiln_strdup(json_string_value(v))))
			return kiln_error(KILN_ENOMEM, "out of memory");
		f->n_meta++;
	}
	return KILN_OK;
}

/* The header's JSON, n bytes at byte 8, read into a new buffer (*out,
 * the caller's to free). */
static kiln_status read_header(struct kiln_safetensors *f, uint64_t n, char **out)
{
	char *b = malloc((size_t)n + 1);
	if (!b)
		return kiln_error(KILN_ENOMEM, "%s: out of memory for a header of %llu bytes", f->path,
				  (unsigned long long)n);
	kiln_status st = kiln_read_at(f->fd, f->path, &f->seen, "the header", b, (size_t)n, 8);
	if (st) {
		free(b);
		return st;
	}
	*out = b;
	return KILN_OK;
}

/* Whether a file's first 8 bytes are torch.save's (a PyTorch user's file
 * at hand; Lightning's .ckpt is one): a zip archive's "PK\3\4", or before
 * PyTorch 1.6 the pickle of its magic number 0x1950a86a20f9469cfc6c,
 * protocol 2 or 3 (PROTO, LONG1 of 10 bytes, the number's first bytes) or
 * 4 or 5 (PROTO, FRAME of the 13 bytes that pickle it).  Told as such
 * (before session 50 "header length 5787125521... exceeds"); a truncated
 * safetensors file whose length merely starts 0x80 (640) is not one. */
static int torch_save_file(const unsigned char b8[8])
{
	static const unsigned char p2[] = { 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46 },
				   p4[] = { 0x95, 0x0d, 0, 0, 0, 0 };
	return !memcmp(b8, "PK\3\4", 4) ||
	       (b8[0] == 0x80 && (b8[1] == 2 || b8[1] == 3) && !memcmp(b8 + 2, p2, 6)) ||
	       (b8[0] == 0x80 && (b8[1] == 4 || b8[1] == 5) && !memcmp(b8 + 2, p4, 6));
}

static kiln_status parse(struct kiln_safetensors *f)
{
	const char *p = f->path;
	unsigned char b8[8];
	uint64_t n = 0;
	char *b = NULL;
	kiln_status st;
	if (f->size < 8)
		return kiln_error(KILN_EDATA, "%s: %zu bytes: too short for a safetensors file (it starts with an 8-byte header length)",
				  p, f->size);
	if ((st = kiln_read_at(f->fd, p, &f->seen, "the header length", b8, 8, 0)))
		return st;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | b8[i];
	if (n > f->size - 8 && torch_save_file(b8))
		return kiln_error(KILN_EDATA, "%s: a PyTorch file (torch.save's %s; a Lightning .ckpt is one too), not safetensors: write its state_dict as safetensors, `safetensors.torch.save_file(model.state_dict(), \"model.safetensors\")` (docs/safetensors.md)",
				  p, b8[0] == 'P' ? "zip archive" : "pickle");
	if (n > f->size - 8)
		return kiln_error(KILN_EDATA, "%s: header length %llu exceeds the %zu bytes after the length field (truncated, or not a safetensors file)",
				  p, (unsigned long long)n, f->size - 8);
	if (n > MAX_HEADER)
		return kiln_error(KILN_EDATA, "%s: header length %llu is over the format's limit of %u bytes",
				  p, (unsigned long long)n, MAX_HEADER);
	if ((st = read_header(f, n, &b)))
		return st;
	if (n < 2 || b[0] != '{') {
		free(b);
		return kiln_error(KILN_EDATA, "%s: the header does not start with '{' (not a safetensors file?)",
				  p);
	}
	f->data_off = 8 + n;
	f->data_len = f->size - 8 - (size_t)n;
	json_error_t err;
	json_t *h = json_loadb(b, (size_t)n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
	free(b);
	if (!h)
		return kiln_error(KILN_EDATA, "%s: the header is not valid JSON: %s (header byte %d)", p,
				  err.text, err.position);
	if (!json_is_object(h)) {
		st = kiln_error(KILN_EDATA, "%s: the header is not a JSON object", p);
		goto out;
	}
	f->t = calloc(json_object_size(h) + 1, sizeof *f->t);
	if (!f->t) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	const char *k;
	json_t *v;
	json_object_foreach(h, k, v) {
		if (!strcmp(k, "__metadata__"))
			st = parse_meta(f, v);
		else if (!(st = parse_entry(f, k, v, &f->t[f->n])))
			f->n++;
		if (st)
			goto out;
	}
	/* the tensors must tile the data: [0, e0) [e0, e1) ... up to its end */
	qsort(f->t, (size_t)f->n, sizeof *f->t, by_offset);
	uint64_t at = 0;
	const char *prev = NULL;
	for (int i = 0; i < f->n; i++) {
		struct st_entry *e = &f->t[i];
		if (e->begin < at) {
			st = kiln_error(KILN_EDATA, "%s: tensors '%s' and '%s' overlap (data bytes %llu..%llu)",
					p, prev, e->name, (unsigned long long)e->begin,
					(unsigned long long)at);
			goto out;
		}
		if (e->begin > at) {
			st = kiln_error(KILN_EDATA, "%s: data bytes %llu..%llu (before tensor '%s') belong to no tensor",
					p, (unsigned long long)at, (unsigned long long)e->begin, e->name);
			goto out;
		}
		at = e->end;
		prev = e->name;
	}
	if (at != f->data_len)
		st = kiln_error(KILN_EDATA, "%s: %zu data bytes but the tensors end at byte %llu (trailing bytes, or a bad header length)",
				p, f->data_len, (unsigned long long)at);
out:
	json_decref(h);
	return st;
}

/* A new file object for path, open on fd (taken: closed with the
 * object, or here on failure) as *seen saw it, parsed into *out.  The file
 * is not mapped (file_map). */
static kiln_status open_parsed(const char *path, int fd, const struct kiln_file_seen *seen,
			       struct kiln_safetensors **out)
{
	struct kiln_safetensors *f = calloc(1, sizeof *f);
	if (!f || !(f->path = kiln_strdup(path))) {
		free(f);
		close(fd);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	f->fd = fd;
	f->seen = *seen;
	f->size = (size_t)seen->size;
	kiln_status st = parse(f);
	if (st) {
		kiln_safetensors_close(f);
		return st;
	}
	*out = f;
	return KILN_OK;
}

kiln_status kiln_safetensors_open(const char *path, struct kiln_safetensors **out)
{
	if (!path || !out)
		return kiln_null_arg("kiln_safetensors_open", !path ? "path" : "out");
	*out = NULL;
	char kind[64];
	const char *why;
	struct kiln_file_seen seen;
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL);
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot open: %s", path, why);
	kiln_status st = kiln_file_seen_fd(fd, path, &seen);
	if (st) {
		close(fd);
		return st;
	}
	return open_parsed(path, fd, &seen, out);
}

kiln_status kiln_safetensors_open_fd(const char *path, int fd, const struct kiln_file_seen *seen,
				     struct kiln_safetensors **out)
{
	struct kiln_file_seen now;
	*out = NULL;
	/* a duplicate: the same open file, whatever is at path by now */
	int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup < 0)
		return kiln_error(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
	kiln_status st = seen ? KILN_OK : kiln_file_seen_fd(dup, path, &now);
	if (st) {
		close(dup);
		return st;
	}
	return open_parsed(path, dup, seen ? seen : &now, out);
}

/* The mapping of the whole file (read-only, private) in *out, made at
 * the first call that asks and kept until close.  KILN_EIO, "PATH: cannot
 * map: ...", where it cannot be made (the address space: `ulimit -v`), and
 * the next call tries again: until session 40's review a failure was kept
 * for good (raising the limit did not help), and a thread whose mmap
 * failed kept it though another's had succeeded.  Threads that map at
 * once keep the first mapping; one that fails takes another's made
 * meanwhile. */
static kiln_status file_map(const struct kiln_safetensors *f, const unsigned char **out)
{
	/* (the reader is const to its users; the mapping is a cache) */
	struct kiln_safetensors *w = (struct kiln_safetensors *)f;
	void *m = __atomic_load_n(&w->map, __ATOMIC_ACQUIRE), *none = NULL;
	if (!m) {
		m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
		if (m == MAP_FAILED) {
			const int e = errno;
			m = __atomic_load_n(&w->map, __ATOMIC_ACQUIRE);
			if (!m) {
				*out = NULL;
				return kiln_error(KILN_EIO, "%s: cannot map: %s", f->path,
						  strerror(e));
			}
		} else if (!__atomic_compare_exchange_n(&w->map, &none, m, 0, __ATOMIC_ACQ_REL,
						       __ATOMIC_ACQUIRE)) {
			munmap(m, f->size);
			m = none; /* the other thread's */
		}
	}
	*out = m;
	return KILN_OK;
}

/* Tensor i (in range) described, with `data` in the mapping: KILN_EIO,
 * data NULL, where the file cannot be mapped (file_map). */
static kiln_status tensor_mapped(const struct kiln_safetensors *f, int i,
				 struct kiln_safetensors_tensor *o)
{
	const unsigned char *m;
	kiln_safetensors_describe(f, i, o);
	kiln_status st = file_map(f, &m);
	if (!st)
		o->data = m + f->data_off + f->t[i].begin;
	return st;
}

void kiln_safetensors_close(struct kiln_safetensors *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->size);
	close(f->fd); /* (every object has its file: open_parsed) */
	for (int i = 0; f->t && f->t[i].name; i++) /* parsed entries, and a failed one's */
		free(f->t[i].name);
	free(f->t);
	for (int i = 0; i < 2 * f->n_meta; i++)
		free(f->meta[i]);
	if (f->meta)
		free(f->meta[2 * f->n_meta]); /* a half-stored pair */
	free(f->meta);
	free(f->crc);
	free(f->crc_key);
	free(f->path);
	free(f);
}

const char *kiln_safetensors_path(const struct kiln_safetensors *f) { return f ? f->path : NULL; }
int kiln_safetensors_count(const struct kiln_safetensors *f) { return f ? f->n : 0; }

void kiln_safetensors_describe(const struct kiln_safetensors *f, int i,
			       struct kiln_safetensors_tensor *o)
{
	if (!o)
		return;
	if (!f || i < 0 || i >= f->n) {
		memset(o, 0, sizeof *o); /* (documented: kiln/kiln.h) */
		return;
	}
	const struct st_entry *e = &f->t[i];
	memset(o, 0, sizeof *o);
	o->name = e->name;
	o->dtype_name = dtypes[e->dt].name;
	o->dtype = dtypes[e->dt].kiln;
	o->ndim = e->ndim;
	memcpy(o->dims, e->dims, sizeof(int64_t) * (size_t)e->ndim);
	o->numel = e->numel;
	o->bytes = (size_t)(e->end - e->begin);
}

void kiln_safetensors_get(const struct kiln_safetensors *f, int i,
			  struct kiln_safetensors_tensor *o)
{
	if (!o)
		return;
	if (!f || i < 0 || i >= f->n)
		kiln_safetensors_describe(f, i, o); /* zeros */
	else
		(void)tensor_mapped(f, i, o); /* data NULL and the last error set where it fails */
}

static kiln_status read_checked(const struct kiln_safetensors *f, int i, void *dst);

kiln_status kiln_safetensors_read(const struct kiln_safetensors *f, int i, void *dst,
				  size_t dst_bytes)
{
	if (!f || !dst)
		return kiln_null_arg("kiln_safetensors_read", !f ? "f" : "dst");
	if (i < 0 || i >= f->n)
		return kiln_error(KILN_EINVAL, "%s: no tensor %d (the file holds %d)", f->path, i, f->n);
	const struct st_entry *e = &f->t[i];
	const size_t bytes = (size_t)(e->end - e->begin);
	char what[300];
	if (dst_bytes < bytes)
		return kiln_error(KILN_EINVAL, "%s: tensor '%s' is %zu bytes, the buffer holds %zu",
				  f->path, e->name, bytes, dst_bytes);
	if (f->crc) /* its CRC32C checked in the same pass (crc_reads) */
		return read_checked(f, i, dst);
	snprintf(what, sizeof what, "tensor '%s'", e->name);
	return kiln_read_at(f->fd, f->path, &f->seen, what, dst, bytes, f->data_off + e->begin);
}

int kiln_safetensors_index(const struct kiln_safetensors *f, const char *name)
{
	for (int i = 0; f && name && i < f->n; i++)
		if (!strcmp(f->t[i].name, name))
			return i;
	return -1;
}

kiln_status kiln_safetensors_find(const struct kiln_safetensors *f, const char *name,
				  struct kiln_safetensors_tensor *out)
{
	if (!f || !name || !out)
		return kiln_null_arg("kiln_safetensors_find", !f ? "f" : !name ? "name" : "out");
	const int i = kiln_safetensors_index(f, name);
	if (i >= 0)
		return tensor_mapped(f, i, out);
	return kiln_error(KILN_ENOTFOUND, "%s: no tensor '%s'", f->path, name);
}

const char *kiln_safetensors_meta(const struct kiln_safetensors *f, const char *key)
{
	if (!f || !key)
		return NULL;
	for (int i = 0; i < f->n_meta; i++)
		if (!strcmp(f->meta[2 * i], key))
			return f->meta[2 * i + 1];
	return NULL;
}

/* ---- writer ------------------------------------------------------------- */

struct w_entry {
	char *name;
	int dt;
	int ndim;
	int64_t dims[KILN_MAX_DIMS];
	size_t bytes;
	const void *data;
};

struct kiln_safetensors_writer {
	int n, cap;
	struct w_entry *t;
	json_t *meta;
	char *crc_key; /* kiln_safetensors_writer_crc's key, or NULL */
};

kiln_status kiln_safetensors_writer_new(struct kiln_safetensors_writer **out)
{
	if (!out)
		return kiln_null_arg("kiln_safetensors_writer_new", "out");
	*out = calloc(1, sizeof **out);
	if (!*out || !((*out)->meta = json_object())) {
		free(*out);
		*out = NULL;
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	return KILN_OK;
}

void kiln_safetensors_writer_free(struct kiln_safetensors_writer *w)
{
	if (!w)
		return;
	for (int i = 0; i < w->n; i++)
		free(w->t[i].name);
	free(w->t);
	json_decref(w->meta);
	free(w->crc_key);
	free(w);
}

kiln_status kiln_safetensors_writer_add(struct kiln_safetensors_writer *w, const char *name,
					int dtype, int ndim, const int64_t *dims,
					const void *data)
{
	if (!w || !name || (ndim > 0 && !dims))
		return kiln_null_arg("kiln_safetensors_writer_add", !w ? "w" : !name ? "name" : "dims");
	if (!name || !*name || !strcmp(name, "__metadata__"))
		return kiln_error(KILN_EINVAL, "safetensors: tensor name '%s' is empty or reserved",
				  name ? name : "(null)");
	for (int i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return kiln_error(KILN_EINVAL, "safetensors: tensor '%s' added twice", name);
	int dt = dtype_by_kiln(dtype);
	if (dt < 0)
		return kiln_error(KILN_EINVAL, "safetensors: tensor '%s': unknown dtype %d", name, dtype);
	if (ndim < 0 || ndim > KILN_MAX_DIMS)
		return kiln_error(KILN_EINVAL, "safetensors: tensor '%s': %d dimensions", name, ndim);
	if (w->n == w->cap) {
		int nc = w->cap ? 2 * w->cap : 64;
		struct w_entry *nt = realloc(w->t, sizeof *nt * (size_t)nc);
		if (!nt)
			return kiln_error(KILN_ENOMEM, "out of memory");
		w->t = nt;
		w->cap = nc;
	}
	struct w_entry *e = &w->t[w->n];
	memset(e, 0, sizeof *e);
	e->dt = dt;
	e->ndim = ndim;
	e->bytes = dtypes[dt].size;
	for (int i = 0; i < ndim; i++) {
		if (dims[i] < 0)
			return kiln_error(KILN_EINVAL, "safetensors: tensor '%s': dims[%d] = %lld", name,
					  i, (long long)dims[i]);
		e->dims[i] = dims[i];
		e->bytes *= (size_t)dims[i];
	}
	if (!data && e->bytes)
		return kiln_null_arg("kiln_safetensors_writer_add", "data");
	e->data = data;
	if (!(e->name = kiln_strdup(name)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	w->n++;
	return KILN_OK;
}

kiln_status kiln_safetensors_writer_meta(struct kiln_safetensors_writer *w, const char *key,
					 const char *value)
{
	if (!w || !key || !value)
		return kiln_null_arg("kiln_safetensors_writer_meta", !w ? "w" : !key ? "key" : "value");
	if (json_object_set_new(w->meta, key, json_string(value)))
		return kiln_error(KILN_EINVAL, "safetensors: metadata '%s' is not valid UTF-8", key);
	return KILN_OK;
}

/* The reference order: larger dtype rank first (8-byte types before 4-byte
 * ones, ...), then names in byte order. */
static int by_dtype_name(const void *a, const void *b)
{
	const struct w_entry *x = a, *y = b;
	if (x->dt != y->dt)
		return y->dt - x->dt;
	return strcmp(x->name, y->name);
}

static kiln_status build_header(struct kiln_safetensors_writer *w, char **hdr, size_t *len)
{
	json_t *h = json_object();
	if (!h)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (json_object_size(w->meta))
		json_object_set(h, "__metadata__", w->meta);
	uint64_t off = 0;
	for (int i = 0; i < w->n; i++) {
		struct w_entry *e = &w->t[i];
		json_t *shape = json_array();
		for (int d = 0; d < e->ndim; d++)
			json_array_append_new(shape, json_integer(e->dims[d]));
		/* "o" takes shape's reference, also when the pack fails */
		json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[e->dt].name, "shape",
				      shape, "data_offsets", (json_int_t)off,
				      (json_int_t)(off + e->bytes));
		off += e->bytes;
		if (!t || json_object_set_new(h, e->name, t)) {
			json_decref(h);
			return kiln_error(KILN_EINVAL, "safetensors: tensor name '%s' is not valid UTF-8",
					  e->name);
		}
	}
	char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(h);
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	size_t n = strlen(s), padded = (n + 7) & ~(size_t)7;
	char *p = realloc(s, padded + 1);
	if (!p) {
		free(s);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	memset(p + n, ' ', padded - n);
	p[padded] = 0;
	*hdr = p;
	*len = padded;
	return KILN_OK;
}

/* ---- CRC32C of a file's contents (kiln_safetensors_writer_crc) ---------
 * Metadata KEY = "H T1 T2 ... Tn", each 8 lowercase hex digits: H the
 * CRC32C of the header's meaning, T1..Tn of each tensor's bytes, the
 * tensors in byte order of their names (whatever the data order).  The
 * header's meaning: each tensor's name, dtype and shape in that order
 * ("name\0F32\02,3\0"), then every other metadata key and value in byte
 * order of the keys ("key\0value\0").  CRC32C is the checkpoints' own
 * (core/crc32c.c). */

/* One tensor's part of H. */
static uint32_t crc_entry(uint32_t c, const char *name, int dt, int ndim, const int64_t *dims)
{
	char shape[KILN_MAX_DIMS * 24 + 1] = "";
	size_t o = 0;
	for (int d = 0; d < ndim && o < sizeof shape; d++)
		o += (size_t)snprintf(shape + o, sizeof shape - o, d ? ",%lld" : "%lld", (long long)dims[d]);
	c = kiln_crc32c(c, name, strlen(name) + 1);
	c = kiln_crc32c(c, dtypes[dt].name, strlen(dtypes[dt].name) + 1);
	return kiln_crc32c(c, shape, strlen(shape) + 1);
}

/* The metadata's part of H: pairs kv[2i], kv[2i + 1] (n of them) but
 * `skip`'s, in byte order of the keys. */
static uint32_t crc_meta(uint32_t c, const char **kv, int n, const char *skip)
{
	const char *last = NULL;
	for (int k = 0; k < n; k++) { /* the next key after last (n is small) */
		int at = -1;
		for (int i = 0; i < n; i++)
			if ((!last || strcmp(kv[2 * i], last) > 0) && (at < 0 || strcmp(kv[2 * i], kv[2 * at]) < 0))
				at = i;
		if (at < 0)
			break;
		last = kv[2 * at];
		if (!strcmp(last, skip))
			continue;
		c = kiln_crc32c(c, kv[2 * at], strlen(kv[2 * at]) + 1);
		c = kiln_crc32c(c, kv[2 * at + 1], strlen(kv[2 * at + 1]) + 1);
	}
	return c;
}

/* The indices 0..n-1 of the names name(i), in byte order of the names:
 * a new array (NULL: out of memory). */
static int *name_order(int n, const char *(*name)(const void *, int), const void *ctx)
{
	int *o = malloc(sizeof *o * (size_t)(n + 1));
	for (int i = 0; o && i < n; i++) { /* insertion: files hold hundreds of tensors at most */
		int j = i;
		while (j > 0 && strcmp(name(ctx, o[j - 1]), name(ctx, i)) > 0) {
			o[j] = o[j - 1];
			j--;
		}
		o[j] = i;
	}
	return o;
}

static const char *w_name(const void *ctx, int i) { return ((const struct kiln_safetensors_writer *)ctx)->t[i].name; }
static const char *f_name(const void *ctx, int i) { return ((const struct kiln_safetensors *)ctx)->t[i].name; }

kiln_status kiln_safetensors_writer_crc(struct kiln_safetensors_writer *w, const char *key)
{
	if (!w || !key)
		return kiln_null_arg("kiln_safetensors_writer_crc", !w ? "w" : "key");
	free(w->crc_key);
	if (!(w->crc_key = kiln_strdup(key)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	return KILN_OK;
}

/* writer_write's step: w->crc_key's value computed and set. */
static kiln_status writer_add_crc(struct kiln_safetensors_writer *w)
{
	const size_t nm = json_object_size(w->meta);
	const char **kv = calloc(2 * nm + 1, sizeof *kv);
	int *order = name_order(w->n, w_name, w);
	char *v = malloc(9 * (size_t)(w->n + 1) + 1);
	kiln_status st = KILN_OK;
	if (!kv || !order || !v) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	const char *k;
	json_t *j;
	int m = 0;
	json_object_foreach(w->meta, k, j) {
		kv[2 * m] = k;
		kv[2 * m + 1] = json_string_value(j);
		m++;
	}
	uint32_t h = 0;
	for (int i = 0; i < w->n; i++) {
		const struct w_entry *e = &w->t[order[i]];
		h = crc_entry(h, e->name, e->dt, e->ndim, e->dims);
	}
	h = crc_meta(h, kv, m, w->crc_key);
	size_t o = (size_t)sprintf(v, "%08x", h);
	for (int i = 0; i < w->n; i++) {
		const struct w_entry *e = &w->t[order[i]];
		o += (size_t)sprintf(v + o, " %08x", kiln_crc32c(0, e->data, e->bytes));
	}
	st = kiln_safetensors_writer_meta(w, w->crc_key, v);
out:
	free(kv);
	free(order);
	free(v);
	return st;
}

/* A CRC mismatch's cause, after "(..., in metadata KEY)": its argument is
 * the key again, for a file changed on purpose. */
#define CRC_WHY ": the file is damaged, changed since it was written; a tool that changes a kiln file must drop metadata %s"

/* The piece of a tensor read and CRC'd at a time: small enough to be
 * in the cache still when the CRC reads what pread just wrote. */
#define CRC_PIECE ((size_t)1 << 18)

/* The CRC32C of tensor i's bytes, read from the file (kiln_read_at: a
 * file cut short names the tensor) CRC_PIECE bytes at a time, each piece
 * into its place in buf (which holds the tensor after: the bytes a load
 * reads, CRC'd in the same pass). */
static kiln_status crc_tensor(const struct kiln_safetensors *f, int i, char *buf, uint32_t *crc)
{
	const struct st_entry *e = &f->t[i];
	char what[300];
	uint32_t c = 0;
	snprintf(what, sizeof what, "tensor '%s'", e->name);
	for (uint64_t at = e->begin; at < e->end;) {
		const size_t k = e->end - at < CRC_PIECE ? (size_t)(e->end - at) : CRC_PIECE;
		char *to = buf + (at - e->begin);
		kiln_status st = kiln_read_at(f->fd, f->path, &f->seen, what, to, k, f->data_off + at);
		if (st)
			return st;
		c = kiln_crc32c(c, to, k);
		at += k;
	}
	*crc = c;
	return KILN_OK;
}

/* Tensor i's bytes do not match the CRC32C `want` its file records in
 * metadata key (c: theirs). */
static kiln_status crc_mismatch(const struct kiln_safetensors *f, int i, uint32_t c, uint32_t want,
				const char *key)
{
	return kiln_error(KILN_EDATA, "%s: tensor '%s' does not match its CRC32C (%08x, the file records %08x in metadata %s)" CRC_WHY,
			  f->path, f->t[i].name, c, want, key, key);
}

/* kiln_safetensors_read of a file whose CRC32Cs are checked
 * (kiln_safetensors_crc_reads): tensor i read into dst and CRC'd piece by
 * piece, one pass; KILN_EDATA naming the tensor where they differ. */
static kiln_status read_checked(const struct kiln_safetensors *f, int i, void *dst)
{
	uint32_t c;
	kiln_status st = crc_tensor(f, i, dst, &c);
	if (!st && c != f->crc[i])
		st = crc_mismatch(f, i, c, f->crc[i], f->crc_key);
	return st;
}

/* The value of metadata key (the CRCs) parsed into want[0..n]: 0, or -1
 * when it is not n + 1 of them. */
static int crc_parse(const char *v, uint32_t *want, int n)
{
	for (int i = 0; i <= n; i++) {
		char *end;
		if (i && *v++ != ' ')
			return -1;
		if (strspn(v, "0123456789abcdef") < 8)
			return -1;
		want[i] = (uint32_t)strtoul(v, &end, 16);
		if (end != v + 8)
			return -1;
		v = end;
	}
	return *v ? -1 : 0;
}

/* The CRC32Cs of metadata key (its value v) parsed into want[0..n] (the
 * header's, then the tensors' in byte order of their names: order, the
 * tensors' indices in that order), and the header checked against
 * want[0]. */
static kiln_status crc_header(const struct kiln_safetensors *f, const char *key, const char *v,
			      uint32_t *want, const int *order)
{
	const char **kv = calloc(2 * (size_t)f->n_meta + 1, sizeof *kv);
	if (!kv)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_status st = KILN_OK;
	if (crc_parse(v, want, f->n)) {
		st = kiln_error(KILN_EDATA, "%s: metadata %s is not %d CRC32Cs of 8 hex digits (the header's, then one per tensor): the file is damaged",
				f->path, key, f->n + 1);
		goto out;
	}
	for (int i = 0; i < 2 * f->n_meta; i++)
		kv[i] = f->meta[i];
	uint32_t h = 0;
	for (int i = 0; i < f->n; i++) {
		const struct st_entry *e = &f->t[order[i]];
		h = crc_entry(h, e->name, e->dt, e->ndim, e->dims);
	}
	h = crc_meta(h, kv, f->n_meta, key);
	if (h != want[0])
		st = kiln_error(KILN_EDATA, "%s: the header (tensor names, dtypes, shapes, metadata) does not match its CRC32C (%08x, the file records %08x in metadata %s)" CRC_WHY,
				f->path, h, want[0], key, key);
out:
	free(kv);
	return st;
}

kiln_status kiln_safetensors_crc_reads(struct kiln_safetensors *f, const char *key, int *had)
{
	const char *v = kiln_safetensors_meta(f, key);
	*had = v != NULL;
	if (!v)
		return KILN_OK;
	uint32_t *want = malloc(sizeof *want * (size_t)(f->n + 1));
	int *order = name_order(f->n, f_name, f);
	uint32_t *crc = malloc(sizeof *crc * (size_t)(f->n + 1));
	char *k = kiln_strdup(key);
	kiln_status st = want && order && crc && k ? crc_header(f, key, v, want, order)
						   : kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; !st && i < f->n; i++)
		crc[order[i]] = want[i + 1];
	if (!st) {
		free(f->crc);
		free(f->crc_key);
		f->crc = crc;
		f->crc_key = k;
		crc = NULL;
		k = NULL;
	}
	free(want);
	free(order);
	free(crc);
	free(k);
	return st;
}

/* The file's bytes: the header's length, the header, the tensors. */
struct st_bytes {
	const struct kiln_safetensors_writer *w;
	const char *hdr;
	size_t hlen;
};

static int fill_file(FILE *fp, void *ctx)
{
	const struct st_bytes *b = ctx;
	unsigned char len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)b->hlen >> (8 * i));
	int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(b->hdr, 1, b->hlen, fp) == b->hlen;
	for (int i = 0; ok && i < b->w->n; i++)
		ok = !b->w->t[i].bytes ||
		     fwrite(b->w->t[i].data, 1, b->w->t[i].bytes, fp) == b->w->t[i].bytes;
	return ok ? 0 : errno ? errno : EIO;
}

kiln_status kiln_safetensors_writer_write(struct kiln_safetensors_writer *w, const char *path)
{
	if (!w || !path)
		return kiln_null_arg("kiln_safetensors_writer_write", !w ? "w" : "path");
	if (w->n > 1)
		qsort(w->t, (size_t)w->n, sizeof *w->t, by_dtype_name);
	char *hdr = NULL;
	size_t hlen = 0;
	kiln_status st = w->crc_key ? writer_add_crc(w) : KILN_OK;
	if (!st)
		st = build_header(w, &hdr, &hlen);
	if (st)
		return st;
	/* through path.kiln-tmp<pid>.<n>, renamed over path (core/out_file.c) */
	struct st_bytes b = { w, hdr, hlen };
	int err = kiln_file_write(path, fill_file, &b);
	if (err)
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(err));
	free(hdr);
	return st;
}
