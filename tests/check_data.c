/* tests/check_data.c - the loader engine around a source: the split of an
 * epoch across ranks, determinism for any worker count with random
 * transforms, bad samples (on_error), the decoded-image cache,
 * normalisation on the device, and `workers = auto`.
 *
 * Data: Fashion-MNIST through the idx source (installed by
 * scripts/install-deps) and the test plugin source "tsrc"
 * (tests/plugins/tgood.c), whose `bad_every` key makes samples corrupt.
 */
#include "../core/internal.h" /* first: build-config.h's _GNU_SOURCE (CPU_SET) */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "data.h"
#include "dist.h" /* kiln_count_limbs, kiln_count_join */
#include "loader.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <dirent.h> /* /proc/self/task: the loader thread's context switches */

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static struct kiln_registry *reg;

#include "data_rig.h" /* struct rig: reads reg */

/* ---- sharding ------------------------------------------------------------ */

START_TEST(test_shard_cover_disjoint)
{
	static const int64_t ns[] = { 1, 7, 10, 11, 13, 100 };
	int64_t order[100], out[100];
	for (int i = 0; i < 100; i++)
		order[i] = (i * 37 + 11) % 100; /* a permutation of 0..99 */
	for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
		int64_t n = ns[a];
		int64_t o[100];
		/* a permutation of 0..n-1 */
		for (int64_t i = 0, k = 0; i < 100; i++)
			if (order[i] < n)
				o[k++] = order[i];
		for (int world = 1; world <= 4; world++)
			for (int drop = 0; drop <= 1; drop++) {
				int seen[100] = { 0 };
				int64_t len = kiln_shard_len(n, 0, world, drop);
				ck_assert_int_eq(len, drop ? n / world : (n + world - 1) / world);
				for (int r = 0; r < world; r++) {
					ck_assert_int_eq(kiln_shard(o, n, 0, r, world, drop, out), len);
					for (int64_t k = 0; k < len; k++)
						seen[out[k]]++;
				}
				int64_t covered = 0, twice = 0;
				for (int64_t i = 0; i < n; i++) {
					covered += seen[i] > 0;
					twice += seen[i] > 1;
				}
				if (drop) {
					/* disjoint; only the tail (< world samples) dropped */
					ck_assert_int_eq(twice, 0);
					ck_assert_int_eq(covered, len * world);
					ck_assert_int_ge(covered, n - world + 1);
				} else {
					/* covering; the padding repeats < world samples */
					ck_assert_int_eq(covered, n);
					ck_assert_int_le(len * world - n, world - 1);
				}
			}
	}
}
END_TEST

/* A run of world W1 stopped after s steps of batch B, resumed with world
 * W2 from the global offset s*B*W1, sees exactly the global order: no
 * sample twice, none missed. */
START_TEST(test_shard_resume_any_world)
{
	enum { N = 96, B = 4 };
	int64_t order[N], out[N];
	for (int i = 0; i < N; i++)
		order[i] = (i * 29 + 5) % N;
	for (int w1 = 1; w1 <= 4; w1++)
		for (int w2 = 1; w2 <= 4; w2++)
			for (int s = 0; s <= 3; s++) {
				int seen[N] = { 0 };
				int64_t g = (int64_t)s * B * w1;
				for (int r = 0; r < w1; r++) {
					kiln_shard(order, N, 0, r, w1, 1, out);
					for (int k = 0; k < s * B; k++)
						seen[out[k]]++;
				}
				int64_t len2 = kiln_shard_len(N, g, w2, 1);
				for (int r = 0; r < w2; r++) {
					kiln_shard(order, N, g, r, w2, 1, out);
					/* rank r's k-th sample is global position g + r + k*w2 */
					for (int64_t k = 0; k < len2; k++) {
						ck_assert_int_eq(out[k], order[g + r + k * w2]);
						seen[out[k]]++;
					}
				}
				int64_t total = 0;
				for (int i = 0; i < N; i++) {
					ck_assert_int_le(seen[i], 1);
					total += seen[i];
				}
				ck_assert_int_eq(total, g + len2 * w2);
				ck_assert_int_gt(total, N - w2);
			}
}
END_TEST

/* ---- the loader over a data set ------------------------------------------ */

/* Read `epochs` epochs of batches of B over the shuffled order with
 * `workers` threads (0: on this thread) into out (epochs * n *
 * sample_bytes) and labels.  Returns the first failure. */
static kiln_status read_epochs(struct rig *r, int workers, int epochs, int64_t B, uint8_t *out,
			       int32_t *labels)
{
	int64_t n = r->d.len / B * B;
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)r->d.len);
	struct kiln_loader *L = NULL;
	struct kiln_data_scratch scr;
	kiln_status st = KILN_OK;
	memset(&scr, 0, sizeof scr);
	if (workers && (st = kiln_loader_open(r->dev, &r->d, B, workers, 2, &L)))
		goto out;
	for (int ep = 0; ep < epochs && !st; ep++) {
		kiln_rng_permutation(r->d.seed, (uint64_t)ep, perm, r->d.len);
		if (L && (st = kiln_loader_start(L, ep, perm, n, B, 0)))
			break;
		for (int64_t b = 0; b < n / B && !st; b++) {
			uint8_t *x = out + (size_t)((ep * n + b * B)) * r->d.sample_bytes;
			int32_t *y = labels + ep * n + b * B;
			if (!L) {
				st = kiln_dataset_read_rows(&r->d, ep, perm + b * B, B, x, y, &scr);
				continue;
			}
			const void *bx;
			const int32_t *by;
			int64_t rows;
			int slot;
			if ((st = kiln_loader_next(L, &bx, &by, &rows, &slot)))
				break;
			ck_assert_int_eq(rows, B);
			memcpy(x, bx, (size_t)B * r->d.sample_bytes);
			memcpy(y, by, (size_t)B * 4);
			st = kiln_loader_release(L, slot, r->copy);
		}
	}
out:
	kiln_loader_close(L);
	kiln_data_scratch_free(&scr);
	free(perm);
	return st;
}

static const char *aug_ini =
	"[run]\nseed = 5\n"
	"[data]\nsource = idx\npath = " FMNIST_DIR "\nlimit = 600\n"
	"crop = random\npad = 4\nflip = 1\nmean = 0.286\nstd = 0.353\n%s\n";

/* The same batches, byte for byte, read inline and with 1 and 4 workers,
 * with random crops and flips; and a different epoch draws differently. */
START_TEST(test_workers_identical)
{
	char ini[1024];
	struct rig r;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing: run scripts/install-deps");
	snprintf(ini, sizeof ini, aug_ini, "");
	ck_assert_msg(rig_open(&r, ini) == 0, "%s", kiln_last_error());
	const int64_t B = 50, n = 600;
	size_t bytes = (size_t)(2 * n) * r.d.sample_bytes;
	uint8_t *ref = malloc(bytes), *got = malloc(bytes);
	int32_t *yref = malloc(sizeof(int32_t) * 2 * n), *ygot = malloc(sizeof(int32_t) * 2 * n);
	ck_assert_msg(read_epochs(&r, 0, 2, B, ref, yref) == 0, "%s", kiln_last_error());
	static const int counts[] = { 1, 4 };
	for (int i = 0; i < 2; i++) {
		memset(got, 0xab, bytes);
		ck_assert_msg(read_epochs(&r, counts[i], 2, B, got, ygot) == 0, "%s",
			      kiln_last_error());
		ck_assert_msg(!memcmp(ref, got, bytes), "%d workers: batches differ", counts[i]);
		ck_assert(!memcmp(yref, ygot, sizeof(int32_t) * 2 * n));
	}
	/* the transforms are random: an unaugmented read differs */
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	int64_t idx = 0;
	float *plain = malloc(r.d.sample_bytes), *aug0 = malloc(r.d.sample_bytes),
	      *aug1 = malloc(r.d.sample_bytes);
	int32_t y;
	for (idx = 0; idx < 20; idx++) {
		ck_assert(kiln_dataset_read_rows(&r.d, 0, &idx, 1, aug0, &y, &scr) == 0);
		ck_assert(kiln_dataset_read_rows(&r.d, 1, &idx, 1, aug1, &y, &scr) == 0);
		if (memcmp(aug0, aug1, r.d.sample_bytes))
			break;
	}
	ck_assert_msg(idx < 20, "epochs 0 and 1 drew the same crops for 20 samples");
	/* without a scratch: buffers of the call alone, the same sample */
	ck_assert(kiln_dataset_read_rows(&r.d, 1, &idx, 1, plain, &y, NULL) == 0);
	ck_assert(!memcmp(plain, aug1, r.d.sample_bytes));
	kiln_data_scratch_free(&scr);
	free(plain), free(aug0), free(aug1);
	free(ref), free(got), free(yref), free(ygot);
	rig_close(&r);
}
END_TEST

/* aug_ini's data set in a, and with cache = ram in b. */
static void open_plain_and_ram(struct rig *a, struct rig *b)
{
	char ini[1024];
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "");
	ck_assert(rig_open(a, ini) == 0);
	snprintf(ini, sizeof ini, aug_ini, "cache = ram");
	ck_assert_msg(rig_open(b, ini) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(b->d.cache, KILN_CACHE_RAM);
}

/* cache = ram gives the same bytes as no cache, and holds the images. */
START_TEST(test_cache_ram)
{
	struct rig a, b;
	open_plain_and_ram(&a, &b);
	const int64_t B = 60, n = 600;
	size_t bytes = (size_t)(3 * n) * a.d.sample_bytes;
	uint8_t *x0 = malloc(bytes), *x1 = malloc(bytes);
	int32_t *y0 = malloc(sizeof(int32_t) * 3 * n), *y1 = malloc(sizeof(int32_t) * 3 * n);
	ck_assert(read_epochs(&a, 2, 3, B, x0, y0) == 0);
	ck_assert(read_epochs(&b, 2, 3, B, x1, y1) == 0);
	ck_assert(!memcmp(x0, x1, bytes));
	ck_assert(!memcmp(y0, y1, sizeof(int32_t) * 3 * n));
	ck_assert_int_eq(atomic_load(&b.d.cached_bytes), n * 28 * 28);
	free(x0), free(x1), free(y0), free(y1);
	rig_close(&a);
	rig_close(&b);
}
END_TEST

/* The source's prefetch hint (source ops version 3): the idx source has one
 * (cache = ram none); read_rows hints every row once, in order, ahead of
 * its read; the bytes are those read without hints; an index out of range
 * is ignored. */
static int64_t hinted[64];
static int n_hinted;
static void (*idx_hint)(void *, int64_t);

static void record_hint(void *ctx, int64_t index)
{
	if (n_hinted < 64)
		hinted[n_hinted] = index;
	n_hinted++;
	idx_hint(ctx, index);
}

START_TEST(test_prefetch_hints)
{
	struct rig a, b;
	open_plain_and_ram(&a, &b);
	ck_assert_uint_ge(a.d.ops->version, 3);
	ck_assert_ptr_nonnull(a.d.prefetch);
	ck_assert_ptr_null(b.d.prefetch);
	enum { B = 11 };
	const int64_t idx[B] = { 599, 3, 3, 250, 0, 17, 598, 42, 1, 300, 77 };
	float x0[B * 28 * 28], x1[B * 28 * 28];
	int32_t y0[B], y1[B];
	idx_hint = a.d.prefetch;
	a.d.prefetch = record_hint;
	for (int rows = 1; rows <= B; rows += 5) {
		n_hinted = 0;
		ck_assert(kiln_dataset_read_rows(&a.d, 1, idx, rows, x0, y0, NULL) == 0);
		ck_assert_int_eq(n_hinted, rows);
		for (int i = 0; i < rows; i++)
			ck_assert_int_eq(hinted[i], idx[i]);
		ck_assert(kiln_dataset_read_rows(&b.d, 1, idx, rows, x1, y1, NULL) == 0);
		ck_assert(!memcmp(x0, x1, sizeof(float) * 28 * 28 * (size_t)rows));
		ck_assert(!memcmp(y0, y1, sizeof(int32_t) * (size_t)rows));
	}
	idx_hint(a.d.ctx, -1);
	idx_hint(a.d.ctx, INT64_MAX);
	idx_hint(a.d.ctx, 60000);
	rig_close(&a);
	rig_close(&b);
}
END_TEST

/* on_error: fail names the sample; skip replaces it alike for any worker
 * count, and counts. */
START_TEST(test_on_error)
{
	struct rig r;
	const char *fail_ini = "[data]\nsource = tsrc\ncount = 40\nbad_every = 7\n";
	ck_assert(rig_open(&r, fail_ini) == 0);
	float x[40 * 3];
	int32_t y[40];
	kiln_status st = read_epochs(&r, 2, 1, 8, (uint8_t *)x, y);
	ck_assert_int_eq(st, KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "[data] sample ") &&
			      strstr(kiln_last_error(), "corrupt"),
		      "%s", kiln_last_error());
	rig_close(&r);

	float xs[3][40 * 3];
	int32_t ys[3][40];
	for (int w = 0; w < 3; w++) {
		ck_assert(rig_open(&r, "[data]\nsource = tsrc\ncount = 40\nbad_every = 7\non_error = skip\n") == 0);
		ck_assert_msg(read_epochs(&r, w, 1, 8, (uint8_t *)xs[w], ys[w]) == 0, "%s",
			      kiln_last_error());
		/* 40 samples, 5 of them (6, 13, 20, 27, 34) bad: at least 5 skips */
		ck_assert_int_ge(atomic_load(&r.d.skipped), 5);
		for (int i = 0; i < 40; i++) {
			/* every row holds a good sample: i*10, i*10+1, i*10+2 */
			int64_t s = (int64_t)xs[w][i * 3] / 10;
			ck_assert_int_ne(s % 7, 6);
			ck_assert(xs[w][i * 3 + 2] == xs[w][i * 3] + 2);
			ck_assert_int_eq(ys[w][i], s % 2);
		}
		rig_close(&r);
	}
	ck_assert(!memcmp(xs[0], xs[1], sizeof xs[0]) && !memcmp(xs[0], xs[2], sizeof xs[0]));
}
END_TEST

/* on_error = skip never replaces a bad sample by itself, nor by a
 * replacement already found bad in the same chain (before session 38 the
 * draw was over every sample: "sample 1 skipped (...); replaced by sample
 * 1", a try and two warnings spent for nothing).  2 samples, 1 bad: sample
 * 0 at the first try, every epoch; 4 samples, 1 and 3 bad: at most two
 * tries.  1 sample, bad: an error saying there is none to replace it by. */
static char pick_log[32][256];
static int pick_n;
static void pick_capture(void *user, int level, const char *who, const char *msg)
{
	(void)user;
	if (level == KILN_LOG_WARN && !strcmp(who, "data") && pick_n < 32)
		snprintf(pick_log[pick_n++], sizeof pick_log[0], "%s", msg);
}

START_TEST(test_skip_never_itself)
{
	static const char *ini = "[data]\nsource = tsrc\ncount = %d\nbad_every = 2\non_error = skip\n";
	for (int count = 2; count <= 4; count += 2) {
		char buf[256];
		struct rig r;
		snprintf(buf, sizeof buf, ini, count);
		ck_assert(rig_open(&r, buf) == 0);
		kiln_log_set_sink(pick_capture, NULL);
		for (int64_t ep = 0; ep < 16; ep++)
			for (int64_t j = 1; j < count; j += 2) {
				float x[3];
				int32_t y;
				pick_n = 0;
				atomic_store(&r.d.skipped, 0); /* every skip logged */
				ck_assert_msg(kiln_dataset_read_rows(&r.d, ep, &j, 1, x, &y, NULL) == 0, "%s",
					      kiln_last_error());
				ck_assert_int_eq((int64_t)x[0] / 10 % 2, 0); /* a good sample */
				const long long tries = atomic_load(&r.d.skipped);
				ck_assert_msg(tries >= 1 && tries <= count / 2,
					      "%d samples, epoch %lld, sample %lld: %lld tries (%s)", count,
					      (long long)ep, (long long)j, tries, pick_n ? pick_log[0] : "");
				ck_assert_int_eq(pick_n, tries);
				int64_t chain[2] = { j, -1 };
				for (int w = 0; w < pick_n; w++) {
					const char *to = strstr(pick_log[w], "; replaced by sample ");
					ck_assert_msg(to, "%s", pick_log[w]);
					const int64_t k = atoll(to + strlen("; replaced by sample "));
					ck_assert_msg(k != chain[0] && k != chain[1] && k >= 0 && k < count,
						      "epoch %lld: %s", (long long)ep, pick_log[w]);
					chain[1] = k;
				}
			}
		kiln_log_set_sink(NULL, NULL);
		rig_close(&r);
	}
	struct rig r;
	ck_assert(rig_open(&r, "[data]\nsource = tsrc\ncount = 1\nbad_every = 1\non_error = skip\n") == 0);
	float x[3];
	int32_t y;
	const int64_t j = 0;
	ck_assert_int_eq(kiln_dataset_read_rows(&r.d, 0, &j, 1, x, &y, NULL), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "[data] sample 0 is bad and the only sample (on_error = skip has no sample left"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(atomic_load(&r.d.skipped), 0);
	rig_close(&r);
}
END_TEST

/* The skip warnings of a data-parallel rank name it (before session 30
 * they did not, so `kiln launch -n 2` printed warnings no one could place);
 * one process's do not. */
static char skip_log[4096];
static void skip_capture(void *user, int level, const char *who, const char *msg)
{
	(void)user;
	if (level == KILN_LOG_WARN && !strcmp(who, "data") && !strstr(skip_log, "\n"))
		snprintf(skip_log, sizeof skip_log, "%s\n", msg); /* the first */
}

START_TEST(test_skip_warning_names_rank)
{
	struct rig r;
	float x[40 * 3];
	int32_t y[40];
	for (int rank = -1; rank <= 1; rank += 2) {
		ck_assert(rig_open(&r, "[data]\nsource = tsrc\ncount = 40\nbad_every = 7\non_error = skip\n") == 0);
		ck_assert_int_eq(r.d.rank, -1); /* kiln_dataset_open's */
		r.d.rank = rank;
		skip_log[0] = 0;
		kiln_log_set_sink(skip_capture, NULL);
		kiln_status st = read_epochs(&r, 0, 1, 8, (uint8_t *)x, y);
		kiln_log_set_sink(NULL, NULL);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		const char *want = rank < 0 ? "[data] sample " : "rank 1: [data] sample ";
		ck_assert_msg(!strncmp(skip_log, want, strlen(want)), "rank %d: the first warning: %s",
			      rank, skip_log);
		rig_close(&r);
	}
}
END_TEST

/* workers = auto with on_error = skip: the probe's trial batches read bad
 * samples the run reads again.  Their replacements are neither counted
 * nor logged (before session 36 the 40-sample set below ended its epoch
 * with d->skipped past the epoch's own and the probe had used up the 10
 * logged warnings, so the run's own skips went unlogged). */
static int skip_warnings;
static void skip_count(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)msg;
	skip_warnings += level == KILN_LOG_WARN && !strcmp(who, "data");
}

START_TEST(test_probe_skips_uncounted)
{
	const char *ini = "[data]\nsource = tsrc\ncount = 40\nbad_every = 7\non_error = skip\n";
	struct rig r, ref;
	float x[40 * 3];
	int32_t y[40];
	int best = 0;
	/* the epoch's own skips and warnings, without a probe */
	ck_assert(rig_open(&ref, ini) == 0);
	skip_warnings = 0;
	kiln_log_set_sink(skip_count, NULL);
	ck_assert_msg(read_epochs(&ref, 2, 1, 4, (uint8_t *)x, y) == 0, "%s", kiln_last_error());
	const int want_warnings = skip_warnings;
	const long long want = atomic_load(&ref.d.skipped);
	ck_assert_int_ge(want, 5); /* 6, 13, 20, 27, 34 and bad replacements */
	ck_assert_int_eq(want_warnings, want < 10 ? want : 10);
	rig_close(&ref);

	ck_assert(rig_open(&r, ini) == 0);
	skip_warnings = 0;
	ck_assert_msg(kiln_loader_probe(r.dev, &r.d, 4, 2, r.copy, &best) == 0, "%s",
		      kiln_last_error());
	const long long after_probe = atomic_load(&r.d.skipped);
	ck_assert_int_eq(after_probe, 0);
	ck_assert_int_eq(r.d.skips_quiet, 0);
	ck_assert_int_eq(skip_warnings, 0);
	ck_assert_msg(read_epochs(&r, best, 1, 4, (uint8_t *)x, y) == 0, "%s", kiln_last_error());
	kiln_log_set_sink(NULL, NULL);
	const long long after_epoch = atomic_load(&r.d.skipped);
	ck_assert_int_eq(after_epoch, want);
	ck_assert_int_eq(skip_warnings, want_warnings);
	rig_close(&r);
}
END_TEST

/* kiln_loader_skipped counts the replacements in the batches handed out,
 * not in the ones the workers read ahead: the count a checkpoint holds,
 * which a run resumed from it reaches again.  Batches of 4 in index
 * order: 0..11 (3 batches) hold bad sample 6, 12..15 holds 13. */
START_TEST(test_loader_skipped_taken)
{
	const char *ini = "[data]\nsource = tsrc\ncount = 40\nbad_every = 7\non_error = skip\n";
	struct rig r;
	int64_t order[40];
	float x[12 * 3];
	int32_t y[12];
	for (int i = 0; i < 40; i++)
		order[i] = i;
	/* the first 3 batches' replacements, read on this thread */
	ck_assert(rig_open(&r, ini) == 0);
	ck_assert(kiln_dataset_read_rows(&r.d, 0, order, 12, x, y, NULL) == 0);
	const long long want = atomic_load(&r.d.skipped);
	ck_assert_int_ge(want, 1);
	rig_close(&r);

	ck_assert(rig_open(&r, ini) == 0);
	struct kiln_loader *L = NULL;
	ck_assert(kiln_loader_open(r.dev, &r.d, 4, 2, 2, &L) == 0);
	ck_assert(kiln_loader_start(L, 0, order, 40, 4, 0) == 0);
	for (int b = 0; b < 3; b++) {
		const void *bx;
		const int32_t *by;
		int64_t rows;
		int slot;
		ck_assert(kiln_loader_next(L, &bx, &by, &rows, &slot) == 0);
		ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
	}
	/* the workers read on into batch 3 (sample 13) and further */
	for (int i = 0; i < 500 && atomic_load(&r.d.skipped) <= want; i++)
		usleep(10000);
	const long long read = atomic_load(&r.d.skipped);
	ck_assert_int_gt(read, want);
	ck_assert_int_eq(kiln_loader_skipped(L), want);
	kiln_loader_close(L);
	rig_close(&r);
}
END_TEST

/* The skip totals over the ranks are exact (kiln_dist_sum_counts): each
 * count's 8-bit limbs summed in f32, as the communicator's allreduce sums
 * them, give the exact total beyond 2^24 (before session 30 the counts
 * themselves went through f32: 16777217 on each of 2 ranks summed to
 * 33554432). */
START_TEST(test_count_sum_exact)
{
	const int64_t v[3] = { 16777217, 3, ((int64_t)1 << 40) + 5 };
	ck_assert((double)((float)16777217.0 + (float)16777217.0) != 33554434.0); /* the old way */
	for (int world = 1; world <= 4; world++) {
		float acc[3 * KILN_COUNT_LIMBS] = { 0 };
		double limbs[3 * KILN_COUNT_LIMBS];
		for (int r = 0; r < world; r++) {
			kiln_count_limbs(v, 3, limbs);
			for (int k = 0; k < 3 * KILN_COUNT_LIMBS; k++)
				acc[k] += (float)limbs[k];
		}
		for (int k = 0; k < 3 * KILN_COUNT_LIMBS; k++)
			limbs[k] = acc[k];
		int64_t sum[3];
		kiln_count_join(limbs, 3, sum);
		for (int i = 0; i < 3; i++)
			ck_assert_int_eq(sum[i], v[i] * world);
	}
}
END_TEST

/* NORMALIZE_U8 on rig d's device: u8 [N, C, H, W] (dims) with per-channel
 * mean and std (C of each) into y (host, f32). */
static void normalize_on(struct rig *d, const int64_t dims[4], const float *mean,
			 const float *sd, const uint8_t *u8, float *y)
{
	const size_t n = (size_t)(dims[0] * dims[1] * dims[2] * dims[3]);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_NORMALIZE_U8;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_U8, 4, dims);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 4, dims);
	for (int c = 0; c < dims[1]; c++)
		op.f[c] = mean[c], op.f[3 + c] = sd[c];
	void *plan, *u8d, *yd;
	ck_assert_msg(kiln_device_prepare(d->dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(d->dev, n, &u8d) == 0);
	ck_assert(kiln_device_alloc(d->dev, n * sizeof(float), &yd) == 0);
	ck_assert(kiln_device_copy_async(d->dev, u8d, u8, n, KILN_COPY_H2D, d->copy) == 0);
	struct kiln_op_args a = { .in = { u8d }, .out = { yd } };
	ck_assert(kiln_device_run(d->dev, plan, &a, d->copy) == 0);
	ck_assert(kiln_device_copy_async(d->dev, y, yd, n * sizeof(float), KILN_COPY_D2H, d->copy) == 0);
	ck_assert(kiln_device_stream_sync(d->dev, d->copy) == 0);
	kiln_device_plan_free(d->dev, plan);
	kiln_device_free(d->dev, u8d);
	kiln_device_free(d->dev, yd);
}

/* transform_on = device ships u8 and the NORMALIZE_U8 op gives the host's
 * f32 samples. */
START_TEST(test_normalize_on_device)
{
	char ini[1024];
	struct rig h, d;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "");
	ck_assert(rig_open(&h, ini) == 0);
	snprintf(ini, sizeof ini, aug_ini, "transform_on = device");
	ck_assert_msg(rig_open(&d, ini) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(d.d.sample.dtype, KILN_U8);
	ck_assert_int_eq(h.d.sample_bytes, 4 * d.d.sample_bytes);
	enum { B = 16 };
	int64_t idx[B];
	for (int i = 0; i < B; i++)
		idx[i] = i * 3;
	float *xh = malloc(B * h.d.sample_bytes), *back = malloc(B * h.d.sample_bytes);
	uint8_t *u8 = malloc(B * d.d.sample_bytes);
	int32_t y[B];
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	ck_assert(kiln_dataset_read_rows(&h.d, 0, idx, B, xh, y, &scr) == 0);
	ck_assert(kiln_dataset_read_rows(&d.d, 0, idx, B, u8, y, &scr) == 0);
	static const int64_t dims[4] = { B, 1, 28, 28 };
	static const float mean = 0.286f, sd = 0.353f;
	normalize_on(&d, dims, &mean, &sd, u8, back);
	for (int i = 0; i < B * 28 * 28; i++) /* one rule, one rounding: equal bits */
		ck_assert_msg(back[i] == xh[i], "%d: %.9g vs %.9g", i, back[i], xh[i]);
	kiln_data_scratch_free(&scr);
	free(xh), free(u8), free(back);
	rig_close(&h);
	rig_close(&d);
}
END_TEST

/* NORMALIZE_U8 on u8 [N, 3, H, W] by rig d's device against torchvision's
 * rule, ToTensor's x.float().div(255) then Normalize's (x - mean) / std in
 * f32, with ImageNet's mean and std: every element bit for bit. */
static void normalize_rule_check(struct rig *d, int N, int H, int W)
{
	static const float mean[3] = { 0.485f, 0.456f, 0.406f }, sd[3] = { 0.229f, 0.224f, 0.225f };
	const int C = 3, HW = H * W, all = N * C * HW;
	uint8_t *u8 = malloc((size_t)all);
	float *y = malloc((size_t)all * sizeof(float));
	for (int i = 0; i < all; i++) /* every value in each plane of 256 or more */
		u8[i] = (uint8_t)(i % HW * 7 + i / HW);
	const int64_t dims[4] = { N, C, H, W };
	normalize_on(d, dims, mean, sd, u8, y);
	for (int i = 0; i < all; i++) {
		const int c = i / HW % C;
		volatile float x = (float)u8[i] / 255.0f; /* no contraction, no excess precision */
		const float want = (x - mean[c]) / sd[c];
		ck_assert_msg(y[i] == want, "%dx%dx%dx%d: element %d (plane %d, channel %d), u8 %d: %.9g, torchvision's rule %.9g",
			      N, C, H, W, i, i / HW, c, u8[i], y[i], want);
	}
	free(u8), free(y);
}

/* NORMALIZE_U8 computes torchvision's rule in f32: every byte value of
 * three channels, bit for bit (a table computed in double and then
 * rounded differs in 133-197 of the 256 values); and over more elements
 * than CPU_PAR_MIN (32768), which the CPU device splits by elements among
 * its threads (session 49; by planes before, and a batch of 128 MNIST
 * images ran on one thread), so a thread's span starts inside a plane and
 * must still take that plane's channel (planes of 2500 end in a partial
 * vector). */
START_TEST(test_normalize_rule)
{
	char ini[1024];
	struct rig d;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "transform_on = device");
	ck_assert_msg(rig_open(&d, ini) == 0, "%s", kiln_last_error());
	normalize_rule_check(&d, 1, 16, 16);
	normalize_rule_check(&d, 5, 50, 50);
	rig_close(&d);
}
END_TEST

/* u8 CHW output of an RGB image (transform_on = device): every sample is
 * the image's planes, mirrored or not, whatever path (SIMD or scalar) the
 * row took; widths around the 16-pixel SIMD block. */
START_TEST(test_u8_planes)
{
	static const int widths[] = { 1, 15, 16, 17, 37, 64 };
	for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
		int W = widths[wi], H = 5, seen[2] = { 0, 0 };
		struct kiln_image img = { 0 };
		img.h = H, img.w = W, img.c = 3;
		img.cap = (size_t)H * W * 3;
		img.data = malloc(img.cap);
		for (size_t i = 0; i < img.cap; i++)
			img.data[i] = (uint8_t)(i * 7 + 3);
		struct kiln_xform x;
		memset(&x, 0, sizeof x);
		x.out_h = H, x.out_w = W, x.out_c = 3;
		x.crop = KILN_CROP_NONE;
		x.flip = 1;
		x.out_dtype = KILN_U8;
		for (int c = 0; c < 3; c++)
			x.std[c] = 1;
		struct kiln_xform_scratch xs;
		memset(&xs, 0, sizeof xs);
		uint8_t *out = malloc(img.cap);
		for (int64_t idx = 0; idx < 16; idx++) {
			ck_assert(kiln_xform_apply(&x, &img, 3, 0, idx, out, &xs) == 0);
			int mirrored = -1;
			for (int m = 0; m < 2 && mirrored < 0; m++) {
				int ok = 1;
				for (int c = 0; c < 3 && ok; c++)
					for (int y = 0; y < H && ok; y++)
						for (int xx = 0; xx < W && ok; xx++) {
							int sx = m ? W - 1 - xx : xx;
							ok = out[(c * H + y) * W + xx] ==
							     img.data[(y * W + sx) * 3 + c];
						}
				if (ok)
					mirrored = m;
			}
			ck_assert_msg(mirrored >= 0, "width %d sample %lld: planes wrong", W,
				      (long long)idx);
			seen[mirrored]++;
		}
		ck_assert_msg(W == 1 || (seen[0] && seen[1]), "width %d: flips %d/%d", W, seen[0],
			      seen[1]);
		kiln_xform_scratch_free(&xs);
		free(out);
		free(img.data);
	}
}
END_TEST


/* workers = auto: the probe picks a count in 1..cores and the loader
 * then reads with it. */
START_TEST(test_workers_auto_probe)
{
	char ini[1024];
	struct rig r;
	int best = 0;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "workers = auto");
	ck_assert(rig_open(&r, ini) == 0);
	ck_assert_msg(kiln_loader_probe(r.dev, &r.d, 50, 2, r.copy, &best) == 0, "%s",
		      kiln_last_error());
	ck_assert_int_ge(best, 1);
	ck_assert_int_le(best, sysconf(_SC_NPROCESSORS_ONLN));
	rig_close(&r);
}
END_TEST


/* workers = auto on a set of 10^12 samples (synthetic): the probe reads
 * its few batches from the end of epoch 0's order, without the whole
 * permutation (before session 38 it allocated 8 bytes a sample, 8 TB
 * here, and failed out of memory; 10^8 samples took ~3 s and 800 MB). */
START_TEST(test_workers_auto_huge)
{
	struct rig r;
	int best = 0;
	ck_assert(rig_open(&r, "[data]\nsource = synthetic\nsamples = 1000000000000\n") == 0);
	const double t0 = kiln_now_s();
	ck_assert_msg(kiln_loader_probe(r.dev, &r.d, 8, 2, r.copy, &best) == 0, "%s",
		      kiln_last_error());
	ck_assert_int_ge(best, 1);
	ck_assert_msg(kiln_now_s() - t0 < 30, "the probe took %.1f s", kiln_now_s() - t0);
	rig_close(&r);
}
END_TEST

/* workers = auto with cache = ram: each count the probe times reads
 * samples of its own (the earlier ones are cached, decoded: timing them
 * against cold ones measured the cache).  600 samples in batches of 10,
 * prefetch 2: 1 worker reads 13 batches, 2 workers 16 more, so at least
 * 290 samples are cached on 2 or more cores (the probe always times 1
 * and 2 there); before, the 2 workers re-read the 130 the 1 had read: 160
 * cached. */
START_TEST(test_workers_auto_cold)
{
	char ini[1024];
	struct rig r;
	int best = 0;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "workers = auto\ncache = ram");
	ck_assert_msg(rig_open(&r, ini) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_loader_probe(r.dev, &r.d, 10, 2, r.copy, &best) == 0, "%s",
		      kiln_last_error());
	int64_t cached = 0;
	for (int64_t i = 0; i < r.d.len; i++)
		cached += atomic_load(&r.d.cached[i]) != NULL;
	if (sysconf(_SC_NPROCESSORS_ONLN) >= 2)
		ck_assert_msg(cached >= 290, "%lld samples cached after the probe, want >= 290 (each count reads its own)",
			      (long long)cached);
	else
		ck_assert_int_eq(cached, 130);
	rig_close(&r);
}
END_TEST

/* workers = auto on one CPU of the affinity mask (taskset -c 0 on a
 * machine of 2 or more): the probe times 1 worker only (it counted the
 * machine's CPUs before, and timed 2 workers on the one CPU). */
START_TEST(test_workers_auto_mask)
{
	char ini[1024];
	struct rig r;
	int best = 0;
	cpu_set_t all, one;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
	if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
		fprintf(stderr, "%s: skipped: one CPU online, the mask and the machine agree\n", __func__);
		return;
	}
	int cpu = 0;
	while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all))
		cpu++;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	snprintf(ini, sizeof ini, aug_ini, "workers = auto");
	ck_assert(rig_open(&r, ini) == 0);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
	check_log_clear();
	kiln_log_set_sink(check_log_sink, NULL);
	const kiln_status st = kiln_loader_probe(r.dev, &r.d, 50, 2, r.copy, &best);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof all, &all), 0);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	rig_close(&r);
	ck_assert_msg(check_log_count("workers = auto: 1: ", "samples/s; chose 1") == 1 &&
			      check_log_count(" 2: ", NULL) == 0,
		      "want 1 worker timed alone:\n%s", check_log_text());
	ck_assert_int_eq(best, 1);
}
END_TEST

/* Resume: an epoch read from global offset g (any world size, any rank)
 * gives exactly the samples, augmented alike, that the uninterrupted
 * one-process epoch has at those global positions. */
START_TEST(test_resume_position)
{
	char ini[1024];
	struct rig r;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "");
	ck_assert(rig_open(&r, ini) == 0);
	enum { B = 20 };
	const int64_t n = r.d.len, ep = 3;
	size_t sb = r.d.sample_bytes;
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)n), *mine = malloc(sizeof(int64_t) * (size_t)n);
	uint8_t *full = malloc((size_t)n * sb), *part = malloc((size_t)n * sb);
	int32_t *yf = malloc(sizeof(int32_t) * (size_t)n), *yp = malloc(sizeof(int32_t) * (size_t)n);
	struct kiln_loader *L = NULL;
	kiln_rng_permutation(r.d.seed, (uint64_t)ep, perm, n);
	ck_assert(kiln_loader_open(r.dev, &r.d, B, 2, 2, &L) == 0);
	/* the uninterrupted epoch, one process */
	ck_assert(kiln_loader_start(L, ep, perm, n, B, 0) == 0);
	for (int64_t b = 0; b < n / B; b++) {
		const void *x;
		const int32_t *y;
		int64_t rows;
		int slot;
		ck_assert(kiln_loader_next(L, &x, &y, &rows, &slot) == 0);
		memcpy(full + (size_t)(b * B) * sb, x, (size_t)rows * sb);
		memcpy(yf + b * B, y, sizeof(int32_t) * (size_t)rows);
		ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
	}
	/* resumed at g = 7 steps of batch B x 2 ranks, as 3 ranks */
	const int64_t g = 7 * B * 2;
	for (int rank = 0; rank < 3; rank++) {
		int64_t len = kiln_shard(perm, n, g, rank, 3, 1, mine);
		ck_assert(kiln_loader_start(L, ep, mine, len / B * B, B, 0) == 0);
		for (int64_t b = 0; b < len / B; b++) {
			const void *x;
			const int32_t *y;
			int64_t rows;
			int slot;
			ck_assert(kiln_loader_next(L, &x, &y, &rows, &slot) == 0);
			for (int64_t i = 0; i < rows; i++) {
				int64_t k = b * B + i, pos = g + rank + k * 3; /* global position */
				ck_assert_msg(!memcmp((const uint8_t *)x + (size_t)i * sb,
						      full + (size_t)pos * sb, sb),
					      "rank %d row %lld (global %lld) differs", rank,
					      (long long)k, (long long)pos);
				ck_assert_int_eq(y[i], yf[pos]);
			}
			ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
		}
	}
	kiln_loader_close(L);
	free(perm), free(mine), free(full), free(part), free(yf), free(yp);
	rig_close(&r);
}
END_TEST

/* dtype = bf16: each element is the f32 sample rounded to nearest even
 * (half the bytes), and the device's CAST widens it back exactly. */
START_TEST(test_bf16_samples)
{
	char ini[1024];
	struct rig h, d;
	ck_assert_msg(access(FMNIST_DIR, R_OK) == 0, "Fashion-MNIST missing");
	snprintf(ini, sizeof ini, aug_ini, "");
	ck_assert(rig_open(&h, ini) == 0);
	snprintf(ini, sizeof ini, aug_ini, "dtype = bf16");
	ck_assert_msg(rig_open(&d, ini) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(d.d.sample.dtype, KILN_BF16);
	ck_assert_int_eq(h.d.sample_bytes, 2 * d.d.sample_bytes);
	enum { B = 8 };
	int64_t idx[B];
	for (int i = 0; i < B; i++)
		idx[i] = i * 5 + 1;
	const int64_t n = B * 28 * 28;
	float *xf = malloc(h.d.sample_bytes * B), *back = malloc(h.d.sample_bytes * B);
	uint16_t *xb = malloc(d.d.sample_bytes * B);
	int32_t y[B];
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	ck_assert(kiln_dataset_read_rows(&h.d, 2, idx, B, xf, y, &scr) == 0);
	ck_assert(kiln_dataset_read_rows(&d.d, 2, idx, B, xb, y, &scr) == 0);
	for (int64_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &xf[i], 4);
		uint16_t want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
		ck_assert_msg(xb[i] == want, "element %lld: bf16 %04x, want %04x (f32 %g)", (long long)i,
			      xb[i], want, xf[i]);
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CAST;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_BF16, 1, &n);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &n);
	void *plan, *db, *df;
	ck_assert_msg(kiln_device_prepare(d.dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(d.dev, (size_t)n * 2, &db) == 0);
	ck_assert(kiln_device_alloc(d.dev, (size_t)n * 4, &df) == 0);
	ck_assert(kiln_device_copy_async(d.dev, db, xb, (size_t)n * 2, KILN_COPY_H2D, d.copy) == 0);
	struct kiln_op_args a = { .in = { db }, .out = { df } };
	ck_assert(kiln_device_run(d.dev, plan, &a, d.copy) == 0);
	ck_assert(kiln_device_copy_async(d.dev, back, df, (size_t)n * 4, KILN_COPY_D2H, d.copy) == 0);
	ck_assert(kiln_device_stream_sync(d.dev, d.copy) == 0);
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)xb[i] << 16;
		float want;
		memcpy(&want, &u, 4);
		ck_assert(back[i] == want);
		ck_assert(fabsf(back[i] - xf[i]) <= fabsf(xf[i]) / 256.0f);
	}
	kiln_device_plan_free(d.dev, plan);
	kiln_device_free(d.dev, db);
	kiln_device_free(d.dev, df);
	kiln_data_scratch_free(&scr);
	free(xf), free(xb), free(back);
	rig_close(&h);
	rig_close(&d);
}
END_TEST

START_TEST(test_workers_key)
{
	int w;
	struct kiln_config *cfg = test_config(reg, "[data]\nworkers = auto\n");
	ck_assert(kiln_data_workers(cfg, &w) == 0);
	ck_assert_int_eq(w, -1);
	kiln_config_free(cfg);
	cfg = test_config(reg, "[data]\nworkers = 3\n");
	ck_assert(kiln_data_workers(cfg, &w) == 0);
	ck_assert_int_eq(w, 3);
	kiln_config_free(cfg);
	/* a bad value: the schema refuses it when the config is checked
	 * (kiln config said OK before session 31), so does the reader */
	ck_assert_int_eq(kiln_config_load_string("[data]\nworkers = many\n", "test.ini", &cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "test.ini:2") && strstr(kiln_last_error(), "auto"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(kiln_data_workers(cfg, &w), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "test.ini:2") && strstr(kiln_last_error(), "auto"),
		      "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* Transform keys on a source that hands over finished samples. */
START_TEST(test_transform_needs_images)
{
	struct rig r;
	ck_assert_int_eq(rig_open(&r, "[data]\nsource = tsrc\nflip = 1\n"), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "test.ini:3") && strstr(kiln_last_error(), "flip"),
		      "%s", kiln_last_error());
	rig_close(&r);
}
END_TEST

/* kiln_rng_uniform_run (the initial weights' draws, 16 lanes at once) gives
 * kiln_rng_uniform's numbers bit for bit, with the best vector code, AVX2's
 * and the portable code: lengths around the 16-lane
 * blocks, a start b0 that is not a multiple of 16 (and one whose block
 * wraps past 2^32), counters and seeds with their high words set. */
START_TEST(test_uniform_run_equals_scalar)
{
	static const struct { uint64_t seed, a; uint32_t b0; int64_t n; } c[] = {
		{ 1, 0x13, 0, 1000 },
		{ 0x123456789abcdef0ull, 0xfedcba9876543210ull, 5, 37 },
		{ 7, 1ull << 40, 0xfffffff8u, 33 },
		{ 0, 0, 0, 15 },
		{ 42, 0x55, 16, 16 },
	};
	float out[1000 + 1];
	static const char *const code[] = { "portable", "vector", "avx2" };
	for (size_t j = 0; j < 3 * sizeof c / sizeof c[0]; j++) {
		size_t i = j / 3; /* each case with each code */
		out[c[i].n] = -7.0f; /* the run writes n values, no more */
		kiln_rng_uniform_run_isa(c[i].seed, KILN_RNG_INIT, c[i].a, c[i].b0, c[i].n, out,
					 (int)(j % 3));
		for (int64_t k = 0; k < c[i].n; k++) {
			float want = kiln_rng_uniform(c[i].seed, KILN_RNG_INIT, c[i].a,
						      c[i].b0 + (uint32_t)k);
			ck_assert_msg(memcmp(&out[k], &want, sizeof want) == 0,
				      "case %zu (%s) element %lld: %.9g, want %.9g", i,
				      code[j % 3], (long long)k, out[k], want);
		}
		ck_assert(out[c[i].n] == -7.0f);
	}
	/* and the numbers are the ones main drew before (its kiln_rng_u32:
	 * 0x8f9d1f70, 0xaffd26c4), so that initial weights do not move */
	kiln_rng_uniform_run(1, KILN_RNG_INIT, 0x13, 0, 17, out);
	ck_assert_uint_eq(0x8f9d1f70u >> 8, (uint32_t)(out[16] * 16777216.0f));
	kiln_rng_uniform_run(0x123456789abcdef0ull, KILN_RNG_INIT, 0xfedcba9876543210ull, 5, 37, out);
	ck_assert_uint_eq(0xaffd26c4u >> 8, (uint32_t)(out[36] * 16777216.0f));
}
END_TEST

/* The voluntary context switches (sleeps) of this process's one thread
 * named "kiln-loader" (/proc/self/task/TID/status), or -1 */
static long loader_thread_sleeps(void)
{
	DIR *dir = opendir("/proc/self/task");
	long n = -1;
	if (!dir)
		return -1;
	for (struct dirent *de; n < 0 && (de = readdir(dir));) {
		char path[300], line[128];
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		int mine = f && fgets(line, sizeof line, f) && !strcmp(line, "kiln-loader\n");
		if (f)
			fclose(f);
		snprintf(path, sizeof path, "/proc/self/task/%s/status", de->d_name);
		if (!mine || !(f = fopen(path, "r")))
			continue;
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1)
				break;
		fclose(f);
	}
	closedir(dir);
	return n;
}

/* Batches nb of B from an idx set's epoch-0 order through a loader of one
 * worker, the consumer pausing `step_us` after each before batch busy_to
 * (a training step) and not after (waiting on data),
 * each batch compared byte for byte with a read on this thread; the
 * worker thread's sleeps over batches 40..nb in *sleeps, the stats in *k. */
static void consume_batches(struct rig *r, int64_t B, int64_t nb, int step_us, int64_t busy_to,
			    long *sleeps, struct kiln_loader_stats *k)
{
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)r->d.len);
	uint8_t *want = malloc((size_t)B * r->d.sample_bytes);
	int32_t *wy = malloc(sizeof(int32_t) * (size_t)B);
	struct kiln_data_scratch scr;
	struct kiln_loader *L = NULL;
	long s0 = -1;
	memset(&scr, 0, sizeof scr);
	ck_assert(perm && want && wy && nb * B <= r->d.len && nb > 40);
	kiln_rng_permutation(r->d.seed, 0, perm, r->d.len);
	ck_assert(kiln_loader_open(r->dev, &r->d, B, 1, 2, &L) == 0);
	ck_assert(kiln_loader_start(L, 0, perm, nb * B, B, 0) == 0);
	for (int64_t b = 0; b < nb; b++) {
		const void *bx;
		const int32_t *by;
		int64_t rows;
		int slot;
		ck_assert_msg(kiln_loader_next(L, &bx, &by, &rows, &slot) == 0, "%s",
			      kiln_last_error());
		ck_assert(kiln_dataset_read_rows(&r->d, 0, perm + b * B, B, want, wy, &scr) == 0);
		ck_assert_int_eq(rows, B);
		ck_assert_msg(!memcmp(bx, want, (size_t)B * r->d.sample_bytes) &&
				      !memcmp(by, wy, sizeof(int32_t) * (size_t)B),
			      "batch %lld differs from a read on this thread", (long long)b);
		ck_assert(kiln_loader_release(L, slot, r->copy) == 0);
		if (b == 39)
			s0 = loader_thread_sleeps();
		if (step_us && b < busy_to)
			usleep((useconds_t)step_us);
	}
	const long s1 = loader_thread_sleeps();
	ck_assert_msg(s0 >= 0 && s1 >= s0, "no thread named kiln-loader (%ld, %ld)", s0, s1);
	*sleeps = s1 - s0;
	kiln_loader_stats(L, k);
	ck_assert_int_eq(k->taken, nb);
	ck_assert_int_eq(k->worker_fills + k->inline_fills, nb);
	kiln_loader_close(L);
	kiln_data_scratch_free(&scr);
	free(wy);
	free(want);
	free(perm);
}

/* 3840 Fashion-MNIST images, resident: a batch's fill is cheap */
static const char idx_3840[] = "[data]\nsource = idx\npath = " FMNIST_DIR "\nlimit = 3840\n";

/* consume_batches of 120 batches of 32 from idx_3840, a 1 ms step before
 * batch busy_to, on the cpu device as rig_open opens it */
static void consume_idx(int64_t busy_to, long *sleeps, struct kiln_loader_stats *k)
{
	struct rig r;
	ck_assert(rig_open(&r, idx_3840) == 0);
	consume_batches(&r, 32, 120, 1000, busy_to, sleeps, k);
	rig_close(&r);
}

/* The MLP's quiet step (issue 22, session 45): on the cpu device with
 * every CPU for compute ([run] threads = 0), the worker woke for each
 * batch, preempting a compute thread (0.10-0.14 ms of a 1.6 ms step,
 * `perf sched`).  Now a cheap resident batch (32 idx images, ~10 us)
 * against a 1 ms step is filled on the consumer's thread once the rule has
 * watched batches 4..20: the worker sleeps through batches 40..120 (it
 * slept once a batch, 80 times, before), and every batch is the bytes a
 * read on this thread gives.  A run that leaves a CPU to the workers keeps
 * them, and so does a device opened as a [run] devices stage. */
START_TEST(test_loader_consumer_fills)
{
	const char *ini = idx_3840;
	struct kiln_loader_stats k;
	long sleeps;
	struct rig r;
	consume_idx(120, &sleeps, &k);
	ck_assert_msg(sleeps <= 2, "the loader worker slept %ld times over 80 batches", sleeps);
	ck_assert_int_eq(k.inline_from, 20);
	ck_assert_msg(k.rule_fill_s > 0 && k.rule_fill_s <= 0.1 * k.rule_gap_s,
		      "fill %g s, gap %g s", k.rule_fill_s, k.rule_gap_s);
	/* the 20 the rule watched and at most the 3 slots read ahead */
	ck_assert_int_le(k.worker_fills, 23);
	ck_assert_int_le(k.wakeups, 23);

	/* a CPU left to the worker: [run] threads below the mask's CPUs */
	cpu_set_t set;
	ck_assert(sched_getaffinity(0, sizeof set, &set) == 0);
	if (CPU_COUNT(&set) > 1) {
		char spare[256];
		snprintf(spare, sizeof spare, "[run]\nthreads = %d\n%s", CPU_COUNT(&set) - 1, ini);
		ck_assert(rig_open(&r, spare) == 0);
		consume_batches(&r, 32, 120, 1000, 120, &sleeps, &k);
		/* (the count above can see a sleep a batch) */
		ck_assert_msg(sleeps >= 40, "%ld sleeps over 80 batches", sleeps);
		ck_assert_int_eq(k.inline_fills, 0);
		ck_assert_int_eq(k.worker_fills, 120);
		rig_close(&r);
	}

	/* the device opened as one of two [run] devices stages (peers 2:
	 * its streams async, the training thread no compute thread) */
	ck_assert(rig_open(&r, ini) == 0);
	kiln_device_stream_destroy(r.dev, r.copy);
	kiln_device_close(r.dev);
	ck_assert_msg(kiln_device_open_peer(reg, r.cfg, "cpu", 0, -1, 2, &r.dev) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r.dev, &r.copy) == 0);
	consume_batches(&r, 32, 120, 1000, 120, &sleeps, &k);
	ck_assert_int_eq(k.inline_fills, 0);
	ck_assert_int_eq(k.worker_fills, 120);
	rig_close(&r);
}
END_TEST

/* `starts` starts of nb batches of 32 from an idx set through a loader of
 * one worker, the consumer waiting on data (no step) but for a pause of
 * pause_us after batch pause_at of each start: the stats in *k. */
static void rule_pauses(int starts, int nb, int pause_at, int pause_us, struct kiln_loader_stats *k)
{
	struct rig r;
	struct kiln_loader *L = NULL;
	ck_assert(rig_open(&r, idx_3840) == 0);
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)r.d.len);
	ck_assert(perm && nb * 32 <= r.d.len);
	kiln_rng_permutation(r.d.seed, 0, perm, r.d.len);
	ck_assert(kiln_loader_open(r.dev, &r.d, 32, 1, 2, &L) == 0);
	for (int e = 0; e < starts; e++) {
		ck_assert(kiln_loader_start(L, 0, perm, nb * 32, 32, 0) == 0);
		for (int b = 0; b < nb; b++) {
			const void *bx;
			const int32_t *by;
			int64_t rows;
			int slot;
			ck_assert(kiln_loader_next(L, &bx, &by, &rows, &slot) == 0);
			ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
			if (b == pause_at)
				usleep((useconds_t)pause_us);
		}
	}
	kiln_loader_stats(L, k);
	kiln_loader_close(L);
	free(perm);
	rig_close(&r);
}

/* An evaluation loader (session 45's review): started for 8 batches at a
 * time, 100 ms of training apart, the consumer waiting on data (no step):
 * the rule counted batches over the loader's life and its window's mean
 * gap held two pauses (12.5 ms against a fill of ~20 us): the training
 * thread filled, though the consumer waited ~21 us a batch for the
 * workers.  Each start now begins the window again: 8 batches never fill
 * it, and the workers keep every batch. */
START_TEST(test_loader_rule_per_start)
{
	struct kiln_loader_stats k;
	rule_pauses(6, 8, 7, 100000, &k);
	ck_assert_msg(k.inline_fills == 0 && k.worker_fills == 48,
		      "%lld batches filled on the consumer's thread (from %lld: fill %.1f us, gap %.1f us)",
		      (long long)k.inline_fills, (long long)k.inline_from, 1e6 * k.rule_fill_s,
		      1e6 * k.rule_gap_s);
}
END_TEST

/* A pause inside the rule's window (a checkpoint of 200 ms after batch
 * 10), the consumer otherwise waiting on data: the mean gap was the pause
 * over 16 (12.5 ms) and chose the training thread; the median is a
 * batch's (the worker's fill, ~20 us): the workers go on. */
START_TEST(test_loader_rule_median)
{
	struct kiln_loader_stats k;
	rule_pauses(1, 40, 10, 200000, &k);
	ck_assert_msg(k.rule_gap_s > 0 && k.rule_gap_s < 0.005,
		      "the rule's gap %.1f us (the pause's mean: 12,500)", 1e6 * k.rule_gap_s);
	ck_assert_msg(k.inline_fills == 0 && k.worker_fills == 40,
		      "%lld batches filled on the consumer's thread (fill %.1f us, gap %.1f us)",
		      (long long)k.inline_fills, 1e6 * k.rule_fill_s, 1e6 * k.rule_gap_s);
}
END_TEST

/* The switch back (session 45's review): the rule chose the training
 * thread at batch 20 (a 1 ms step), and from batch 60 the consumer waits
 * on data (no step; each batch checked against a read on this thread, as
 * costly as the fill): its own fills, measured over each 16 batches, now
 * cost half the gap, and the workers fill again from the first window of
 * those alone (batch 84; before, the training thread filled to the end). */
START_TEST(test_loader_rule_back)
{
	struct kiln_loader_stats k;
	long sleeps;
	consume_idx(60, &sleeps, &k);
	ck_assert_int_eq(k.inline_from, 20);
	ck_assert_msg(k.workers_from >= 68 && k.workers_from <= 100,
		      "back to the workers at batch %lld (fill %.1f us, gap %.1f us)",
		      (long long)k.workers_from, 1e6 * k.rule_fill_s, 1e6 * k.rule_gap_s);
	/* the 20 watched, and every batch from the switch back */
	ck_assert_int_ge(k.worker_fills, 20 + 120 - k.workers_from);
	ck_assert_msg(k.rule_fill_s > 0.1 * k.rule_gap_s, "fill %.1f us, gap %.1f us",
		      1e6 * k.rule_fill_s, 1e6 * k.rule_gap_s);
}
END_TEST

/* The consumer-fill rule with 4 workers (slots they claimed when the
 * consumer took over), random crops and flips, 3 epochs of 60 batches
 * (the boundaries after the switch at batch 20), a 3 ms step: each batch
 * is the bytes of a read on this thread (session 45's review).  Each
 * batch the consumer fills is in the buffer the batch before it was
 * released from (session 49: its lines still in the caches), not its
 * slot's own of 6 batches ago. */
START_TEST(test_loader_switch_multi)
{
	const char *ini = "[run]\nseed = 5\n"
			  "[data]\nsource = idx\npath = " FMNIST_DIR "\nlimit = 1920\n"
			  "crop = random\npad = 4\nflip = 1\nmean = 0.286\nstd = 0.353\n";
	struct rig r;
	struct kiln_loader *L = NULL;
	struct kiln_loader_stats k;
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	ck_assert(rig_open(&r, ini) == 0);
	const int64_t B = 32, nb = r.d.len / B;
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)r.d.len);
	uint8_t *want = malloc((size_t)B * r.d.sample_bytes);
	int32_t wy[32];
	ck_assert(kiln_loader_open(r.dev, &r.d, B, 4, 2, &L) == 0);
	int64_t total = 0, warm = 0;
	const void *last = NULL;
	for (int ep = 0; ep < 3; ep++) {
		kiln_rng_permutation(r.d.seed, (uint64_t)ep, perm, r.d.len);
		ck_assert(kiln_loader_start(L, ep, perm, nb * B, B, 0) == 0);
		for (int64_t b = 0; b < nb; b++, total++) {
			const void *bx;
			const int32_t *by;
			int64_t rows;
			int slot;
			ck_assert_msg(kiln_loader_next(L, &bx, &by, &rows, &slot) == 0, "%s", kiln_last_error());
			ck_assert(kiln_dataset_read_rows(&r.d, ep, perm + b * B, B, want, wy, &scr) == 0);
			ck_assert_msg(!memcmp(bx, want, (size_t)B * r.d.sample_bytes) && !memcmp(by, wy, sizeof wy),
				      "epoch %d batch %lld differs", ep, (long long)b);
			warm += bx == last;
			last = bx;
			ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
			usleep(3000);
		}
	}
	kiln_loader_stats(L, &k);
	ck_assert_int_eq(k.taken, total);
	ck_assert_int_eq(k.worker_fills + k.inline_fills, total);
	ck_assert_msg(k.inline_from == 20 && k.inline_fills > 100,
		      "the consumer filled %lld batches from %lld (fill %.1f us, gap %.1f us)",
		      (long long)k.inline_fills, (long long)k.inline_from, 1e6 * k.rule_fill_s,
		      1e6 * k.rule_gap_s);
	ck_assert_msg(warm == k.inline_fills, "%lld of the consumer's %lld fills in the buffer just released",
		      (long long)warm, (long long)k.inline_fills);
	kiln_loader_close(L);
	kiln_data_scratch_free(&scr);
	free(want);
	free(perm);
	rig_close(&r);
}
END_TEST

/* A fill error after the switch (sample 999 of an unshuffled order, batch
 * 249 of 4): its status, its message in msg, the stats in *k. */
static kiln_status fill_error_at_249(const char *ini, char *msg, size_t cap, struct kiln_loader_stats *k)
{
	struct rig r;
	struct kiln_loader *L = NULL;
	ck_assert(rig_open(&r, ini) == 0);
	int64_t *ord = malloc(sizeof(int64_t) * 1000);
	for (int i = 0; i < 1000; i++)
		ord[i] = i;
	ck_assert(kiln_loader_open(r.dev, &r.d, 4, 1, 2, &L) == 0);
	ck_assert(kiln_loader_start(L, 0, ord, 1000, 4, 0) == 0);
	kiln_status st = KILN_OK;
	for (int b = 0; b < 250 && !st; b++) {
		const void *bx;
		const int32_t *by;
		int64_t rows;
		int slot;
		if ((st = kiln_loader_next(L, &bx, &by, &rows, &slot)))
			break;
		ck_assert(kiln_loader_release(L, slot, r.copy) == 0);
		usleep(300);
	}
	snprintf(msg, cap, "st %d: %s", (int)st, kiln_last_error());
	kiln_loader_stats(L, k);
	kiln_loader_close(L);
	free(ord);
	rig_close(&r);
	return st;
}

/* An error in the training thread's fill is reported as a worker's is
 * ([run] threads = 1 leaves the worker a CPU: no switch) (session 45's
 * review). */
START_TEST(test_loader_inline_error)
{
	char a[600], b[600];
	struct kiln_loader_stats ka, kb;
	ck_assert(fill_error_at_249("[data]\nsource = tsrc\ncount = 1000\nbad_every = 500\n", a,
				    sizeof a, &ka) != KILN_OK);
	fill_error_at_249("[run]\nthreads = 1\n[data]\nsource = tsrc\ncount = 1000\nbad_every = 500\n", b, sizeof b, &kb);
	ck_assert_msg(ka.inline_from > 0 && ka.inline_fills > 0 && kb.inline_fills == 0,
		      "inline from %lld, %lld and %lld fills", (long long)ka.inline_from,
		      (long long)ka.inline_fills, (long long)kb.inline_fills);
	ck_assert_str_eq(a, b);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("data");
	check_add_case(s, "shard", 0, NULL, NULL, (const TTest *[]){
		test_shard_cover_disjoint, test_shard_resume_any_world, test_workers_key,
		test_u8_planes, test_uniform_run_equals_scalar, NULL });
	check_add_case(s, "loader", 120, NULL, NULL, (const TTest *[]){
		test_workers_identical, test_cache_ram, test_on_error, test_skip_never_itself,
		test_skip_warning_names_rank,
		test_count_sum_exact, test_normalize_on_device, test_normalize_rule,
		test_bf16_samples, test_transform_needs_images, test_workers_auto_probe,
		test_workers_auto_cold, test_workers_auto_huge, test_probe_skips_uncounted, test_loader_skipped_taken,
		test_workers_auto_mask,
		test_resume_position, test_prefetch_hints, test_loader_consumer_fills,
		test_loader_rule_per_start, test_loader_rule_median, test_loader_rule_back,
		test_loader_switch_multi, test_loader_inline_error, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_suite, .reg = &reg,
					       .plugin_dir = TEST_PLUGIN_DIR, .omp_passive = 1 };
