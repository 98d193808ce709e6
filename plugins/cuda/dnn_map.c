/* plugins/cuda/dnn_map.c - pure host functions of the CUDA device's
 * convolution: strides, geometry, autotune keys and the autotune cache
 * file (dnn_map.h has the contracts and the file format).
 */
#include "dnn_map.h"
#include "../common/cache_file.h" /* common_cache_path, common_make_parents */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void cuda_dnn_strides(const int64_t d[4], int nhwc, int64_t s[4])
{
	if (nhwc) {
		s[1] = 1;
		s[3] = d[1];
		s[2] = d[3] * d[1];
		s[0] = d[2] * d[3] * d[1];
	} else {
		s[3] = 1;
		s[2] = d[3];
		s[1] = d[2] * d[3];
		s[0] = d[1] * d[2] * d[3];
	}
}

static int dims4(const struct kiln_tensor_desc *t, int64_t out[4])
{
	if (t->ndim != 4)
		return -1;
	for (int i = 0; i < 4; i++)
		out[i] = t->dims[i];
	return 0;
}

/* Where x, w, y and the bias of each convolution op sit among its
 * tensors, as dnn_map.h's arg_* codes: (0 in, 1 out) << 8 | index; -1
 * none.  The bias is optional. */
static const struct conv_roles {
	int type, x, w, y, b;
} conv_roles[] = {
	{ KILN_OP_CONV, 0 << 8 | 0, 0 << 8 | 1, 1 << 8 | 0, 0 << 8 | 2 },
	{ KILN_OP_CONV_BWD_DATA, 1 << 8 | 0, 0 << 8 | 1, 0 << 8 | 0, -1 },
	{ KILN_OP_CONV_BWD_WEIGHTS, 0 << 8 | 0, 1 << 8 | 0, 0 << 8 | 1, 1 << 8 | 1 },
};

static const struct kiln_tensor_desc *conv_tensor(const struct kiln_op *op, int arg)
{
	return arg >> 8 ? &op->out[arg & 255] : &op->in[arg & 255];
}

int cuda_conv_geom(const struct kiln_op *op, struct cuda_conv_geom *g, char *why, size_t n)
{
	memset(g, 0, sizeof *g);
	g->type = op->type;
	g->arg_b = -1;
	const struct conv_roles *r = NULL;
	for (size_t i = 0; i < sizeof conv_roles / sizeof *conv_roles; i++)
		if (conv_roles[i].type == op->type)
			r = &conv_roles[i];
	if (!r) {
		snprintf(why, n, "not a convolution");
		return -1;
	}
	const struct kiln_tensor_desc *x = conv_tensor(op, r->x), *w = conv_tensor(op, r->w);
	const struct kiln_tensor_desc *y = conv_tensor(op, r->y), *b = NULL;
	g->arg_x = r->x, g->arg_w = r->w, g->arg_y = r->y;
	/* the bias only when the op has exactly that many tensors there */
	if (r->b >= 0 && (r->b >> 8 ? op->n_out : op->n_in) == (r->b & 255) + 1)
		b = conv_tensor(op, r->b), g->arg_b = r->b;
	if (dims4(x, g->x) || dims4(w, g->w) || dims4(y, g->y)) {
		snprintf(why, n, "wants 4-d activations and 4-d weights [O,C/g,KH,KW]");
		return -1;
	}
	if (x->layout == KILN_NHWC ? y->layout != KILN_NHWC : y->layout == KILN_NHWC) {
		snprintf(why, n, "wants x and y in one layout");
		return -1;
	}
	g->nhwc = x->layout == KILN_NHWC;
	g->bias = b != NULL;
	g->dt_x = x->dtype, g->dt_w = w->dtype, g->dt_y = y->dtype;
	g->stride[0] = op->i[0], g->stride[1] = op->i[1];
	g->pad[0] = op->i[2], g->pad[1] = op->i[3];
	g->dil[0] = op->i[4], g->dil[1] = op->i[5];
	g->groups = op->i[6] ? op->i[6] : 1;
	cuda_dnn_strides(g->x, g->nhwc, g->xs);
	cuda_dnn_strides(g->y, g->nhwc, g->ys);
	cuda_dnn_strides(g->w, 0, g->ws); /* OIHW, always */
	return 0;
}

static const char *dt_name(int dt)
{
	static const char *const names[] = { "f32", "bf16", "f16", "i8", "u8", "i32", "i64" };
	return dt >= 0 && dt < (int)(sizeof names / sizeof *names) ? names[dt] : "?";
}

int cuda_conv_key(const struct cuda_conv_geom *g, int deterministic, int64_t ws_mb, char *buf,
		  size_t n)
{
	static const char *const type[] = { "CONV", "CONV_BWD_DATA", "CONV_BWD_WEIGHTS" };
	const int t = g->type - KILN_OP_CONV;
	return snprintf(buf, n,
			"%s %s/%s/%s %s x %lld,%lld,%lld,%lld w %lld,%lld,%lld,%lld s %lld,%lld "
			"p %lld,%lld d %lld,%lld g %lld b%d det%d ws %lld",
			t >= 0 && t < 3 ? type[t] : "?", dt_name(g->dt_x), dt_name(g->dt_w),
			dt_name(g->dt_y), g->nhwc ? "NHWC" : "NCHW", (long long)g->x[0],
			(long long)g->x[1], (long long)g->x[2], (long long)g->x[3],
			(long long)g->w[0], (long long)g->w[1], (long long)g->w[2],
			(long long)g->w[3], (long long)g->stride[0], (long long)g->stride[1],
			(long long)g->pad[0], (long long)g->pad[1], (long long)g->dil[0],
			(long long)g->dil[1], (long long)g->groups, g->bias, deterministic != 0,
			(long long)ws_mb);
}

/* ---- the cache ---------------------------------------------------------- */

const struct cuda_atc_entry *cuda_atc_find(const struct cuda_atc *a, const char *key)
{
	for (size_t i = 0; i < a->n; i++)
		if (!strcmp(a->e[i].key, key))
			return &a->e[i];
	return NULL;
}

int cuda_atc_put(struct cuda_atc *a, const struct cuda_atc_entry *e)
{
	struct cuda_atc_entry *old = (struct cuda_atc_entry *)cuda_atc_find(a, e->key);
	if (old) {
		*old = *e;
		return 0;
	}
	if (a->n == a->cap) {
		const size_t cap = a->cap ? 2 * a->cap : 16;
		struct cuda_atc_entry *ne = realloc(a->e, cap * sizeof *ne);
		if (!ne)
			return -1;
		a->e = ne, a->cap = cap;
	}
	a->e[a->n++] = *e;
	return 0;
}

void cuda_atc_clear(struct cuda_atc *a)
{
	free(a->e);
	a->e = NULL;
	a->n = a->cap = 0;
}

/* little-endian writer into a buffer sized beforehand */
struct wr {
	uint8_t *p;
	size_t off;
};

static void put(struct wr *w, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		w->p[w->off++] = (uint8_t)(v >> (8 * i));
}

static void put_str(struct wr *w, const char *s, size_t len)
{
	put(w, len, 2);
	memcpy(w->p + w->off, s, len);
	w->off += len;
}

int cuda_atc_encode(const struct cuda_atc *a, cuda_crc_fn crc, uint8_t **buf, size_t *len)
{
	const size_t dl = strlen(a->device);
	size_t n = 8 + 4 + 4 + 2 + dl + 4;
	*buf = NULL;
	*len = 0;
	if (a->n > UINT32_MAX)
		return -1;
	for (size_t i = 0; i < a->n; i++) {
		if (a->e[i].n_knobs > CUDA_ATC_KNOBS)
			return -1;
		n += 2 + strlen(a->e[i].key) + 8 + 8 + 4 + 4 + a->e[i].n_knobs * 12u;
	}
	struct wr w = { malloc(n), 0 };
	if (!w.p)
		return -1;
	memcpy(w.p, CUDA_ATC_MAGIC, 8);
	w.off = 8;
	put(&w, CUDA_ATC_VERSION, 4);
	put(&w, a->n, 4);
	put_str(&w, a->device, dl);
	for (size_t i = 0; i < a->n; i++) {
		const struct cuda_atc_entry *e = &a->e[i];
		uint32_t ms;
		memcpy(&ms, &e->ms, 4);
		put_str(&w, e->key, strlen(e->key));
		put(&w, (uint64_t)e->engine, 8);
		put(&w, (uint64_t)e->workspace, 8);
		put(&w, ms, 4);
		put(&w, e->n_knobs, 4);
		for (uint32_t k = 0; k < e->n_knobs; k++) {
			put(&w, (uint32_t)e->knob_type[k], 4);
			put(&w, (uint64_t)e->knob_value[k], 8);
		}
	}
	put(&w, crc(0, w.p, w.off), 4);
	*buf = w.p;
	*len = w.off;
	return 0;
}

/* little-endian reader that refuses to run past the end */
struct rd {
	const uint8_t *p;
	size_t off, len;
	int bad;
};

static uint64_t get(struct rd *r, int bytes)
{
	uint64_t v = 0;
	if (r->bad || r->len - r->off < (size_t)bytes) {
		r->bad = 1;
		return 0;
	}
	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)r->p[r->off++] << (8 * i);
	return v;
}

/* a u16-prefixed string into dst[cap] (NUL-terminated); too long is bad */
static void get_str(struct rd *r, char *dst, size_t cap)
{
	const size_t l = (size_t)get(r, 2);
	if (r->bad || l >= cap || r->len - r->off < l) {
		r->bad = 1;
		return;
	}
	memcpy(dst, r->p + r->off, l);
	dst[l] = 0;
	r->off += l;
}

int cuda_atc_decode(struct cuda_atc *a, const uint8_t *buf, size_t len, cuda_crc_fn crc,
		    char *why, size_t n)
{
	struct rd r = { buf, 0, len, 0 };
	char dev[sizeof a->device];
	if (len < 8 + 4 + 4 + 2 + 4 || memcmp(buf, CUDA_ATC_MAGIC, 8)) {
		snprintf(why, n, "not a kiln autotune cache (bad magic or too short)");
		return -1;
	}
	const uint32_t want = (uint32_t)buf[len - 4] | (uint32_t)buf[len - 3] << 8 |
			      (uint32_t)buf[len - 2] << 16 | (uint32_t)buf[len - 1] << 24;
	if (crc(0, buf, len - 4) != want) {
		snprintf(why, n, "checksum mismatch (a damaged or half-written file)");
		return -1;
	}
	r.len = len - 4; /* the fields end where the checksum starts */
	r.off = 8;
	const uint32_t ver = (uint32_t)get(&r, 4), count = (uint32_t)get(&r, 4);
	if (ver != CUDA_ATC_VERSION) {
		snprintf(why, n, "format version %u, this build reads %u", ver, CUDA_ATC_VERSION);
		return 1;
	}
	get_str(&r, dev, sizeof dev);
	if (r.bad) {
		snprintf(why, n, "truncated header");
		return -1;
	}
	if (strcmp(dev, a->device)) {
		snprintf(why, n, "written for '%s', this is '%s'", dev, a->device);
		return 1;
	}
	struct cuda_atc t = { { 0 }, NULL, 0, 0 };
	struct cuda_atc_entry *e = calloc(1, sizeof *e);
	if (!e) {
		snprintf(why, n, "out of memory");
		return -1;
	}
	for (uint32_t i = 0; i < count && !r.bad; i++) {
		uint32_t ms;
		memset(e, 0, sizeof *e);
		get_str(&r, e->key, sizeof e->key);
		e->engine = (int64_t)get(&r, 8);
		e->workspace = (int64_t)get(&r, 8);
		ms = (uint32_t)get(&r, 4);
		memcpy(&e->ms, &ms, 4);
		e->n_knobs = (uint32_t)get(&r, 4);
		if (e->n_knobs > CUDA_ATC_KNOBS || e->engine < 0 || e->workspace < 0)
			r.bad = 1;
		for (uint32_t k = 0; k < e->n_knobs && !r.bad; k++) {
			e->knob_type[k] = (int32_t)(uint32_t)get(&r, 4);
			e->knob_value[k] = (int64_t)get(&r, 8);
		}
		if (!r.bad && cuda_atc_put(&t, e)) {
			snprintf(why, n, "out of memory");
			free(e);
			cuda_atc_clear(&t);
			return -1;
		}
	}
	free(e);
	if (r.bad || r.off != r.len) {
		snprintf(why, n, r.bad ? "entry %zu is truncated or out of range"
				       : "bytes left after the last entry (%zu)",
			 r.bad ? t.n : r.len - r.off);
		cuda_atc_clear(&t);
		return -1;
	}
	cuda_atc_clear(a);
	a->e = t.e, a->n = t.n, a->cap = t.cap;
	return 0;
}

int cuda_atc_load(struct cuda_atc *a, const char *path, cuda_crc_fn crc, char *why, size_t n)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (errno == ENOENT)
			return 0;
		snprintf(why, n, "%s: %s", path, strerror(errno));
		return -1;
	}
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len == cap) {
			cap = cap ? 2 * cap : 1 << 16;
			uint8_t *nb = cap > (64u << 20) ? NULL : realloc(buf, cap);
			if (!nb) {
				snprintf(why, n, "%s: larger than 64 MiB or out of memory", path);
				free(buf);
				fclose(f);
				return -1;
			}
			buf = nb;
		}
		const size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	const int bad = ferror(f);
	fclose(f);
	if (bad) {
		snprintf(why, n, "%s: read error", path);
		free(buf);
		return -1;
	}
	char r[200];
	const int st = cuda_atc_decode(a, buf, len, crc, r, sizeof r);
	free(buf);
	if (st)
		snprintf(why, n, "%s: %s", path, r);
	return st;
}

int cuda_atc_save(const struct cuda_atc *a, const char *path, cuda_crc_fn crc, char *why,
		  size_t n)
{
	uint8_t *buf;
	size_t len;
	char tmp[4200];
	if (cuda_atc_encode(a, crc, &buf, &len)) {
		snprintf(why, n, "cannot encode the cache (out of memory or a field too long)");
		return -1;
	}
	/* a temporary of this call's own (two GPUs of one process may save
	 * at once) */
	int ok = common_make_parents(path) == 0;
	const int fd = ok ? common_open_tmp(path, tmp, sizeof tmp) : -1;
	FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
	if (fd >= 0 && !f) {
		close(fd);
		unlink(tmp);
	}
	ok = f && fwrite(buf, 1, len, f) == len;
	if (f) {
		if (fflush(f) || fsync(fileno(f)))
			ok = 0;
		if (fclose(f))
			ok = 0;
	}
	ok = ok && rename(tmp, path) == 0;
	free(buf);
	if (!ok) {
		snprintf(why, n, "%s: %s", path, strerror(errno));
		if (f)
			unlink(tmp);
		return -1;
	}
	common_clean_tmp(path); /* what killed savers left (cache_file.h) */
	return 0;
}

void cuda_atc_device_string(char *buf, size_t n, const char *name, int cc_major, int cc_minor,
			    int sms, int driver, size_t cudnn)
{
	snprintf(buf, n, "%.180s sm_%d%d %d SMs driver %d cudnn %zu", name, cc_major, cc_minor, sms,
		 driver, cudnn);
}

int cuda_atc_default_path(char *buf, size_t n)
{
	return common_cache_path(buf, n, "cudnn_autotune.bin");
}
