/* core/data.h - a data set as the trainer sees it: a source plugin, the
 * transforms between its images and the model's input, bad-sample
 * handling, the decoded-image cache, and the split of each epoch's sample
 * order across ranks.
 *
 * Sources with read_image() hand over 8-bit pixels and the core transforms
 * them (core/transform.h); sources with only read() hand over finished f32
 * samples.  Either way kiln_dataset_read_rows() is what a loader worker
 * (or the training thread) calls for one batch, and its output depends
 * only on (seed, epoch, the sample indices): never on the worker, thread,
 * rank or world size.
 *
 * Threads: after open, read_rows may be called from any number of threads
 * at once, each with its own scratch.  Nothing here exits.
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include "internal.h"
#include "transform.h"

#include <stdatomic.h>

enum kiln_on_error { KILN_ON_ERROR_FAIL = 0, KILN_ON_ERROR_SKIP = 1 };
enum kiln_cache { KILN_CACHE_NONE = 0, KILN_CACHE_RAM = 1, KILN_CACHE_MMAP = 2 };

/* How many other samples a bad one may be replaced by before the run fails. */
#define KILN_SKIP_TRIES 16

struct kiln_cached {
	struct kiln_image img;
	int32_t label;
};

struct kiln_dataset {
	struct kiln_source *src;   /* kiln_source_open */
	int missing;               /* the open failed for a file the config names that is not there */
	const struct kiln_source_ops *ops; /* src's, for short */
	void *ctx;
	const char *section;       /* "data" or "data.eval" */
	const char *name;          /* the source plugin's name */
	struct kiln_source_info info;
	int64_t len;               /* after [data] limit */
	int64_t classes;
	int use_image;             /* read_image + transforms, else read() */
	/* the source's prefetch hint (ops version 3), NULL without one or
	 * with cache = ram */
	void (*prefetch)(void *ctx, int64_t index);
	int bf16;                  /* [data] dtype = bf16: samples rounded to bf16 */
	struct kiln_xform xf;
	struct kiln_tensor_desc sample; /* one sample as staged: f32 [C,H,W], or u8;
					 * i32 [T] token ids (source tokens) */
	size_t sample_bytes;
	struct kiln_tensor_desc label;  /* one label: i32 [] (a class), or i32 [T]
					 * (the targets of a token window) */
	int64_t label_elems;       /* i32 per label: 1, or T */
	size_t label_bytes;        /* label_elems * 4 */
	uint64_t seed;
	int on_error, cache;
	/* cache = ram: decoded images and their labels by sample index,
	 * published once */
	_Atomic(struct kiln_cached *) *cached;
	atomic_llong cached_bytes;
	atomic_llong skipped;      /* bad samples replaced (on_error = skip) */
	/* 1 while kiln_loader_probe reads: replacements not logged (the
	 * probe puts skipped back, and with it the 10 logged warnings) */
	int skips_quiet;
	int rank;                  /* this process's rank, named in the skip
				    * warnings when it is one of several;
				    * -1 (kiln_dataset_open's): one process */
	/* timed = 1 (kiln bench data): worker time in the source and in the
	 * transforms, added once per batch; the clock is not read otherwise */
	int timed;
	atomic_llong read_ns, xform_ns;
};

/* Per-thread buffers of read_rows.  Zero-initialise; free with
 * kiln_data_scratch_free. */
struct kiln_data_scratch {
	struct kiln_image img;
	struct kiln_xform_scratch xs;
	float *f32;        /* [data] dtype = bf16: the f32 sample before rounding */
	size_t f32_cap;
	int64_t skipped;   /* bad samples the reads with this scratch replaced
			    * (d->skipped counts every thread's): the loader
			    * tells which batch they were in */
};
void kiln_data_scratch_free(struct kiln_data_scratch *s);

/* Open config `section` ("data" or "data.eval") with `split` ("train" or
 * "test"); `train` selects the training transforms (random crops, flip).
 * Errors: KILN_ECONFIG (keys), KILN_EDATA (unreadable or corrupt data,
 * no samples), KILN_ENOTSUP. */
kiln_status kiln_dataset_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *section, const char *split, int train,
			      struct kiln_dataset *d);
void kiln_dataset_close(struct kiln_dataset *d);
/* kiln_dataset_open's shape of the set without opening it, when its source
 * can tell it (source ops version 5, peek: a header read, or the config):
 * *peeked 1 and d as the open would fill it, with the open's checks of
 * the config and of that shape, but with no source context (d->src and
 * d->ctx NULL: nothing can be read), len, classes and the cache index 0
 * (so a set with no samples is not refused here).  *peeked 0 with
 * KILN_OK: it cannot tell (or an output is watched: kiln_source_peek);
 * open the set.  Errors as kiln_dataset_open's, d->missing alike.  Close
 * d with kiln_dataset_close either way.  For what needs only the images'
 * shape: [data.eval]'s transforms for image files (core/infer.c). */
kiln_status kiln_dataset_peek(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *section, const char *split, int train,
			      struct kiln_dataset *d, int *peeked);

/* Samples idx[0..rows) of `epoch` into x (rows * sample_bytes) and their
 * labels into y (rows * label_elems i32, row-major: [rows, T] for tokens).  A bad sample (KILN_EDATA from the source, a label out of
 * range) fails the call with a message naming the section, sample and
 * reason, or with on_error = skip is replaced by another sample chosen by
 * (seed, epoch, index, try): the same replacement on every rank, never
 * the bad sample itself nor one of its replacements found bad.
 * s is the calling thread's scratch (kept between calls); NULL uses
 * buffers that live for this call only. */
kiln_status kiln_dataset_read_rows(struct kiln_dataset *d, int64_t epoch, const int64_t *idx,
				   int64_t rows, void *x, int32_t *y,
				   struct kiln_data_scratch *s);

/* ---- the order of an epoch, split across ranks --------------------------
 *
 * Every rank draws the same global order (a permutation of 0..n from (seed,
 * epoch), or 0..n-1 unshuffled).  The epoch consumes it from a global
 * sample offset `start` in rounds of world samples: rank r takes global
 * positions start + r, start + r + world, ... (torch's DistributedSampler
 * interleaving).  With drop_last, each rank gets floor((n - start) / world)
 * samples and the tail is dropped; without it, ceil(...) and the order
 * wraps around to pad the last round.  So the shards are disjoint (up to
 * the padding), cover the order, are equally long, and a run resumed at
 * global offset g continues with exactly the samples it would have seen,
 * for any world size.  Returns the count written to out (at most
 * kiln_shard_len). */
int64_t kiln_shard_len(int64_t n, int64_t start, int world, int drop_last);
int64_t kiln_shard(const int64_t *order, int64_t n, int64_t start, int rank, int world,
		   int drop_last, int64_t *out);

/* What the opened set d is, cheaply, as text (malloc'd, *len bytes, no
 * NUL inside) that the ranks of a data-parallel run compare line by line
 * (kiln_dist_agree_data): the samples' and labels' shapes, the classes,
 * the resolved transforms, and each file the source reads (ops version
 * 4), its path, size and the CRC32C of its first and last DATA_ID_EDGE
 * bytes (a gzip file's past its header, and its trailer's CRC32 and size
 * of its contents); beyond DATA_ID_EDGES_MAX files only every k-th file's ends are
 * read, the others' sizes stat'ed, beyond DATA_ID_STATS_MAX every k-th
 * stat'ed, the others only named (core/data_identity.c says what it
 * cannot see).  KILN_ENOMEM. */
#define DATA_ID_EDGE 4096
#define DATA_ID_EDGES_MAX 4096
#define DATA_ID_STATS_MAX 16384
kiln_status kiln_dataset_identity(const struct kiln_dataset *d, char **text, size_t *len);

/* [data] workers: "auto" -> -1, else the count.  KILN_ECONFIG naming the
 * line for anything else. */
kiln_status kiln_data_workers(const struct kiln_config *cfg, int *workers);

/* Whether the staged samples are widened to f32 on the device before the
 * model (u8 pixels normalised, bf16 cast); f32 and i32 (token ids) samples
 * go to the model as they are. */
int kiln_dataset_widened(const struct kiln_dataset *d);

/* f32 to bf16, round to nearest even (NaN stays a quiet NaN): the
 * devices' KILN_OP_CAST rounding, and the loader's for [data] dtype = bf16. */
uint16_t kiln_bf16_from_f32(float f);
/* x[n] rounded to bf16 values in place, kept f32: what a bf16 sample is
 * once the device widens it (the inference API's dtype = bf16, which
 * hands the model f32 samples). */
void kiln_f32_round_bf16(float *x, size_t n);

/* [data] cache = ram: the host bytes the cache holds once every sample
 * has been read (the decoded images, before the transforms, and their
 * entries, each a malloc chunk); 0 without the cache.  Where the source's
 * images vary in size, sample 0 is decoded and its size stands for every
 * image's.  For `kiln memory` (core/memory.c). */
size_t kiln_dataset_cache_bytes(const struct kiln_dataset *d);

/* The model's input sample as the device hands it over: the staged sample,
 * f32 when widened. */
void kiln_dataset_input_desc(const struct kiln_dataset *d, struct kiln_tensor_desc *out);

#endif /* KILN_DATA_H */
