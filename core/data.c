/* core/data.c - the data set between a source plugin and the loader; see
 * data.h. */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint16_t kiln_bf16_from_f32(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

void kiln_f32_round_bf16(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const uint32_t u = (uint32_t)kiln_bf16_from_f32(x[i]) << 16;
		memcpy(&x[i], &u, sizeof u);
	}
}

void kiln_data_scratch_free(struct kiln_data_scratch *s)
{
	free(s->img.data);
	free(s->f32);
	kiln_xform_scratch_free(&s->xs);
	memset(s, 0, sizeof *s);
}

kiln_status kiln_data_workers(const struct kiln_config *cfg, int *workers)
{
	const char *v = kiln_config_get(cfg, "data", "workers");
	char *end;
	if (!v || !strcmp(v, "auto")) {
		*workers = v ? -1 : 1;
		return KILN_OK;
	}
	long n = strtol(v, &end, 10);
	if (end == v || *end || n < 0 || n > 256)
		return kiln_error(KILN_ECONFIG, "%s: [data] workers = '%s': expected a count 0..256 or `auto`",
				  kiln_config_where(cfg, "data", "workers"), v);
	*workers = (int)n;
	return KILN_OK;
}

/* Keys that only make sense for a source of images. */
static const char *const image_keys[] = { "size", "resize", "crop", "pad", "scale", "ratio",
					  "flip", "mean", "std", "channels", "transform_on",
					  NULL };

/* d's sample, label, transforms and keys from d->info (an opened source's,
 * or a peek's), with the checks of kiln_dataset_open that need no sample:
 * the config's errors and the source's shape's. */
static kiln_status dataset_shape(const struct kiln_config *cfg, const char *section, int train,
				 struct kiln_dataset *d)
{
	const char *name = kiln_config_get(cfg, section, "source");
	int64_t seed = 0;
	kiln_status st;
	if (d->info.label.dtype != KILN_I32)
		return kiln_error(KILN_ENOTSUP, "[%s] source '%s': labels must be i32 (class numbers or token ids)",
				  section, name);
	d->label = d->info.label;
	d->label_elems = kiln_tensor_numel(&d->label);
	d->label_bytes = (size_t)d->label_elems * sizeof(int32_t);
	d->classes = d->info.classes;
	d->len = d->info.len;
	kiln_config_get_int(cfg, "run", "seed", &seed);
	d->seed = (uint64_t)seed;

	const char *oe = kiln_config_get(cfg, section, "on_error");
	d->on_error = oe && !strcmp(oe, "skip") ? KILN_ON_ERROR_SKIP : KILN_ON_ERROR_FAIL;
	const char *ca = kiln_config_get(cfg, section, "cache");
	d->cache = !ca || !strcmp(ca, "none") ? KILN_CACHE_NONE
		   : !strcmp(ca, "ram")          ? KILN_CACHE_RAM
						 : KILN_CACHE_MMAP;

	d->use_image = d->ops->version >= 2 && d->ops->read_image;
	d->prefetch = d->ops->version >= 3 && d->cache != KILN_CACHE_RAM ? d->ops->prefetch : NULL;
	if (d->use_image && d->label.ndim != 0)
		return kiln_error(KILN_ENOTSUP, "[%s] source '%s': a source of images has class labels (i32 scalars)",
				  section, name);
	if (d->use_image) {
		if ((st = kiln_xform_from_config(cfg, section, train, d->info.image_h,
						 d->info.image_w, d->info.image_c, &d->xf)))
			return st;
		/* samples leave the workers as CHW; with [model] layout = nhwc
		 * the planner reorders the batch on the device (one op), so the
		 * model's input is described alike in both layouts */
		d->xf.nhwc = 0;
		int64_t dims[3] = { d->xf.out_c, d->xf.out_h, d->xf.out_w };
		const char *dt = kiln_config_get(cfg, section, "dtype");
		d->bf16 = dt && !strcmp(dt, "bf16");
		if (d->bf16 && d->xf.out_dtype != KILN_F32)
			return kiln_error(KILN_ECONFIG, "%s: [%s] dtype = bf16 is for transform_on = host (with transform_on = device the workers ship u8 pixels, which are smaller still)",
					  kiln_config_where(cfg, section, "dtype"), section);
		kiln_tensor_desc_init(&d->sample, d->bf16 ? KILN_BF16 : d->xf.out_dtype, 3, dims);
	} else {
		if (strcmp(kiln_config_where(cfg, section, "dtype"), "default"))
			return kiln_error(KILN_ECONFIG, "%s: [%s] dtype: source '%s' hands over finished f32 samples; dtype = bf16 needs a source with images",
					  kiln_config_where(cfg, section, "dtype"), section, name);
		for (int i = 0; image_keys[i]; i++)
			if (strcmp(kiln_config_where(cfg, section, image_keys[i]), "default"))
				return kiln_error(KILN_ECONFIG, "%s: [%s] %s: source '%s' hands over finished samples, not images; transforms need a source with images",
						  kiln_config_where(cfg, section, image_keys[i]),
						  section, image_keys[i], name);
		if (d->info.sample.dtype != KILN_F32 && d->info.sample.dtype != KILN_I32)
			return kiln_error(KILN_ENOTSUP, "[%s] source '%s': read() must yield f32 samples or i32 token ids",
					  section, name);
		d->sample = d->info.sample;
	}
	d->sample_bytes = kiln_tensor_bytes(&d->sample);

	if (d->cache == KILN_CACHE_MMAP && !(d->info.flags & KILN_SOURCE_MAPPED))
		return kiln_error(KILN_ECONFIG, "%s: [%s] cache = mmap shares the files through the page cache: source '%s' does not read them that way (records and tokens do: convert with `kiln pack`); use cache = ram to keep decoded images in memory",
				  kiln_config_where(cfg, section, "cache"), section, name);
	if (d->cache == KILN_CACHE_RAM && !d->use_image) {
		kiln_log(KILN_LOG_INFO, "data", "[%s] cache = ram: source '%s' hands over finished samples; nothing to cache",
			 section, name);
		d->cache = KILN_CACHE_NONE;
	}
	return KILN_OK;
}

kiln_status kiln_dataset_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *section, const char *split, int train,
			      struct kiln_dataset *d)
{
	kiln_status st;
	memset(d, 0, sizeof *d);
	d->section = section;
	d->rank = -1;
	if ((st = kiln_source_open_named(cfg, reg, section, split, &d->src, &d->missing)))
		return st;
	d->ops = d->src->ops;
	d->ctx = d->src->ctx;
	d->name = d->src->name;
	d->info = d->src->info;
	if (d->info.len <= 0)
		return kiln_error(KILN_EDATA, "[%s] source '%s' has no samples", section,
				  kiln_config_get(cfg, section, "source"));
	if ((st = dataset_shape(cfg, section, train, d)))
		return st;
	if (d->cache == KILN_CACHE_RAM &&
	    !(d->cached = calloc((size_t)d->len, sizeof *d->cached)))
		return kiln_error(KILN_ENOMEM, "out of memory for the [%s] cache index", section);
	return KILN_OK;
}

kiln_status kiln_dataset_peek(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *section, const char *split, int train,
			      struct kiln_dataset *d, int *peeked)
{
	const struct kiln_plugin *p = NULL;
	memset(d, 0, sizeof *d);
	d->section = section;
	d->rank = -1;
	kiln_status st = kiln_source_peek(cfg, reg, section, split, &p, &d->info, &d->missing,
					  peeked);
	if (st || !*peeked)
		return st;
	d->ops = p->ops;
	d->name = p->name;
	return dataset_shape(cfg, section, train, d);
}

void kiln_dataset_close(struct kiln_dataset *d)
{
	if (d->cached) {
		for (int64_t i = 0; i < d->len; i++) {
			struct kiln_cached *c = atomic_load(&d->cached[i]);
			if (c)
				free(c->img.data);
			free(c);
		}
		free(d->cached);
	}
	kiln_source_close(d->src);
	memset(d, 0, sizeof *d);
}

/* Keep a private copy of a decoded image (cache = ram).  The first thread
 * to publish wins; a loser frees its copy. */
static void cache_put(struct kiln_dataset *d, int64_t j, const struct kiln_image *img,
		      int32_t label)
{
	size_t bytes = (size_t)img->h * (size_t)img->w * (size_t)img->c;
	struct kiln_cached *c = malloc(sizeof *c);
	if (!c)
		return; /* the cache is an optimisation: no memory, no cache */
	c->img = *img;
	c->label = label;
	if (!(c->img.data = malloc(bytes ? bytes : 1))) {
		free(c);
		return;
	}
	memcpy(c->img.data, img->data, bytes);
	c->img.cap = bytes;
	struct kiln_cached *none = NULL;
	if (atomic_compare_exchange_strong(&d->cached[j], &none, c))
		atomic_fetch_add(&d->cached_bytes, (long long)bytes);
	else {
		free(c->img.data);
		free(c);
	}
}

/* One sample j into out and *y.  A failure leaves a message.  ns[0], ns[1]
 * (when ns is not NULL) gather the time in the source and in the
 * transforms. */
static kiln_status read_one(struct kiln_dataset *d, int64_t epoch, int64_t j, void *out,
			    int32_t *y, struct kiln_data_scratch *s, int64_t *ns)
{
	kiln_status st;
	int64_t t0 = ns ? kiln_now_ns() : 0;
	if (!d->use_image) {
		if ((st = d->ops->read(d->ctx, j, out, y)))
			return st;
		if (ns)
			ns[0] += kiln_now_ns() - t0;
	} else {
		const struct kiln_cached *c = d->cached ? atomic_load(&d->cached[j]) : NULL;
		const struct kiln_image *img = c ? &c->img : NULL;
		if (c) {
			*y = c->label;
		} else {
			if ((st = d->ops->read_image(d->ctx, j, &s->img, y)))
				return st;
			img = &s->img;
			if (d->cached)
				cache_put(d, j, img, *y);
		}
		int64_t t1 = ns ? kiln_now_ns() : 0;
		if (ns)
			ns[0] += t1 - t0;
		if (d->bf16) {
			/* transform in f32, then round to bf16 (nearest even) */
			const size_t n = d->sample_bytes / 2;
			if (s->f32_cap < n) {
				float *f = realloc(s->f32, n * sizeof(float));
				if (!f)
					return kiln_error(KILN_ENOMEM, "out of memory");
				s->f32 = f;
				s->f32_cap = n;
			}
			if ((st = kiln_xform_apply(&d->xf, img, d->seed, epoch, j, s->f32, &s->xs)))
				return st;
			uint16_t *o = out;
			for (size_t i = 0; i < n; i++)
				o[i] = kiln_bf16_from_f32(s->f32[i]);
		} else if ((st = kiln_xform_apply(&d->xf, img, d->seed, epoch, j, out, &s->xs))) {
			return st;
		}
		if (ns)
			ns[1] += kiln_now_ns() - t1;
	}
	for (int64_t k = 0; k < d->label_elems; k++) {
		if (y[k] >= 0 && y[k] < d->classes)
			continue;
		if (d->label_elems == 1)
			return kiln_error(KILN_EDATA, "label %d outside [0, %lld)", y[k],
					  (long long)d->classes);
		return kiln_error(KILN_EDATA, "label %d (target %lld of the sample) outside [0, %lld)",
				  y[k], (long long)k, (long long)d->classes);
	}
	return KILN_OK;
}

int kiln_dataset_widened(const struct kiln_dataset *d)
{
	return d->sample.dtype == KILN_U8 || d->sample.dtype == KILN_BF16;
}

void kiln_dataset_input_desc(const struct kiln_dataset *d, struct kiln_tensor_desc *out)
{
	*out = d->sample;
	if (kiln_dataset_widened(d))
		out->dtype = KILN_F32; /* u8 samples are normalised on the device */
}

/* glibc malloc's chunk for a request of n bytes: n and its 8-byte size
 * field rounded up to 16, at least 32 (another allocator: an estimate). */
static size_t heap_chunk(size_t n)
{
	const size_t c = (n + 8 + 15) & ~(size_t)15;
	return c < 32 ? 32 : c;
}

size_t kiln_dataset_cache_bytes(const struct kiln_dataset *d)
{
	if (!d->cached)
		return 0;
	size_t px = (size_t)d->info.image_h * (size_t)d->info.image_w * (size_t)d->info.image_c;
	if (!px) {
		/* the images' sizes vary: sample 0's, decoded, stands for all
		 * (unreadable: the model's input, one byte a value) */
		struct kiln_image img = { 0 };
		int32_t y;
		const kiln_status st = d->ops->read_image(d->ctx, 0, &img, &y);
		px = !st ? (size_t)img.h * (size_t)img.w * (size_t)img.c
			 : (size_t)kiln_tensor_numel(&d->sample);
		if (st)
			kiln_clear_error();
		free(img.data);
		kiln_log(KILN_LOG_DEBUG, "data", "[%s] cache = ram: images of varying sizes, counted as %zu bytes each (%s)",
			 d->section, px, st ? "the model's input" : "sample 0's");
	}
	/* cache_put's two allocations a sample, the image and its entry */
	return (size_t)d->len * (heap_chunk(px ? px : 1) + heap_chunk(sizeof(struct kiln_cached)));
}

/* How far ahead of its read a sample is hinted to the source: a few
 * images' lines in flight at once (measured for the IDX source's 784-byte
 * images, docs/PERFORMANCE.md "session 9"). */
enum { PREFETCH_AHEAD = 4 };

/* The source's hint for sample j; its time (the misses it waits on) counts
 * as the source's read in ns[0] when timed. */
static void hint(const struct kiln_dataset *d, int64_t j, int64_t *ns)
{
	int64_t t0 = ns ? kiln_now_ns() : 0;
	d->prefetch(d->ctx, j);
	if (ns)
		ns[0] += kiln_now_ns() - t0;
}

/* The sample that replaces bad[nbad - 1] at try t of on_error = skip:
 * drawn from (seed, epoch, that sample, t) among the samples not in
 * bad[0..nbad) (distinct: the sample the chain began with and the
 * replacements that failed), so it depends on nothing a worker or rank
 * has of its own; -1 when no other sample is left.  Before session 38 the
 * draw was over every sample and could return the failing one itself
 * ("sample 29 skipped ...; replaced by sample 29"), spending a try and
 * two warnings. */
static int64_t skip_pick(const struct kiln_dataset *d, int64_t epoch, const int64_t *bad,
			 int nbad, int t)
{
	if (d->len <= nbad)
		return -1;
	int64_t k = (int64_t)kiln_rng_below(d->seed ^ ((uint64_t)t << 56), KILN_RNG_SKIP,
					    (uint64_t)epoch << 40 | (uint64_t)bad[nbad - 1],
					    (uint64_t)(d->len - nbad));
	/* the k-th sample not in bad: past each bad one at or below it, in
	 * ascending order (nbad <= KILN_SKIP_TRIES + 1: a selection sort) */
	int64_t sorted[KILN_SKIP_TRIES + 1];
	memcpy(sorted, bad, sizeof(int64_t) * (size_t)nbad);
	for (int a = 0; a < nbad; a++) {
		for (int b = a + 1; b < nbad; b++)
			if (sorted[b] < sorted[a]) {
				int64_t x = sorted[a];
				sorted[a] = sorted[b];
				sorted[b] = x;
			}
		k += sorted[a] <= k;
	}
	return k;
}

kiln_status kiln_dataset_read_rows(struct kiln_dataset *d, int64_t epoch, const int64_t *idx,
				   int64_t rows, void *x, int32_t *y,
				   struct kiln_data_scratch *s)
{
	int64_t ns_buf[2] = { 0, 0 }, *ns = d->timed ? ns_buf : NULL;
	kiln_status st = KILN_OK;
	struct kiln_data_scratch own = { 0 };
	if (!s)
		s = &own; /* a one-off read: buffers live for this call only */
	/* the source's hint, PREFETCH_AHEAD samples ahead of the read */
	for (int64_t i = 0; d->prefetch && i < rows && i < PREFETCH_AHEAD; i++)
		hint(d, idx[i], ns);
	for (int64_t i = 0; i < rows && !st; i++) {
		if (d->prefetch && i + PREFETCH_AHEAD < rows)
			hint(d, idx[i + PREFETCH_AHEAD], ns);
		void *out = (char *)x + (size_t)i * d->sample_bytes;
		int32_t *yi = y + i * d->label_elems;
		int64_t j = idx[i];
		st = read_one(d, epoch, j, out, yi, s, ns);
		if (!st)
			continue;
		if (d->on_error != KILN_ON_ERROR_SKIP || st != KILN_EDATA) {
			st = kiln_error_wrap(st, "[%s] sample %lld", d->section, (long long)j);
			break;
		}
		/* replace it by a sample every rank would pick alike, never one
		 * this chain found bad (bad[0..nbad): the sample, then each
		 * failed replacement) */
		int64_t bad[KILN_SKIP_TRIES + 1] = { j };
		int nbad = 1;
		for (int t = 1; st == KILN_EDATA && t <= KILN_SKIP_TRIES; t++) {
			int64_t k = skip_pick(d, epoch, bad, nbad, t);
			if (k < 0)
				break; /* every sample of the set is bad */
			long long n = atomic_fetch_add(&d->skipped, 1) + 1;
			s->skipped++;
			char rank[24] = "";
			if (d->rank >= 0)
				snprintf(rank, sizeof rank, "rank %d: ", d->rank);
			if (n <= 10 && !d->skips_quiet)
				kiln_log(KILN_LOG_WARN, "data", "%s[%s] sample %lld skipped (%s); replaced by sample %lld%s",
					 rank, d->section, (long long)j, kiln_last_error(), (long long)k,
					 n == 10 ? " (further skips are counted, not logged)" : "");
			j = k;
			if ((st = read_one(d, epoch, j, out, yi, s, ns)) == KILN_EDATA)
				bad[nbad++] = j;
		}
		if (st == KILN_EDATA && nbad >= d->len)
			st = kiln_error_wrap(st, "[%s] sample %lld is bad and %s (on_error = skip has no sample left to replace it by)",
					     d->section, (long long)idx[i],
					     d->len == 1 ? "the only sample" : "so is every other sample");
		else if (st == KILN_EDATA)
			st = kiln_error_wrap(st, "[%s] sample %lld and its %d replacements are all bad (on_error = skip gives up)",
					     d->section, (long long)idx[i], KILN_SKIP_TRIES);
		else if (st)
			st = kiln_error_wrap(st, "[%s] sample %lld", d->section, (long long)j);
	}
	if (ns) {
		atomic_fetch_add(&d->read_ns, ns[0]);
		atomic_fetch_add(&d->xform_ns, ns[1]);
	}
	kiln_data_scratch_free(&own);
	return st;
}

int64_t kiln_shard_len(int64_t n, int64_t start, int world, int drop_last)
{
	int64_t left = n - start;
	if (left <= 0 || world < 1)
		return 0;
	return drop_last ? left / world : (left + world - 1) / world;
}

int64_t kiln_shard(const int64_t *order, int64_t n, int64_t start, int rank, int world,
		   int drop_last, int64_t *out)
{
	int64_t len = kiln_shard_len(n, start, world, drop_last);
	for (int64_t k = 0; k < len; k++) {
		int64_t g = start + rank + k * (int64_t)world;
		/* padding wraps around to the order's beginning */
		out[k] = order[g < n ? g : (g - n) % n];
	}
	return len;
}
