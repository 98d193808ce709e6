/* tests/check_idx.c - the `idx` data source of kiln-loaders.so.
 *
 * Every test writes small IDX files (plain and gzipped) into its own
 * temporary directory and opens them through the core, exactly as a run
 * does: registry -> source plugin -> config validated against its keys ->
 * ops->open.  Corrupt files must give KILN_EDATA or KILN_EIO with a message
 * naming the file and the problem; a fuzz case checks that no mutation of a
 * valid file crashes (Check forks each test, so a crash fails it).
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "../plugins/common/cache_file.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include "source_fixture.h"
#include <dirent.h>
#include <fcntl.h> /* AT_FDCWD */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h> /* waitpid */
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* The small valid data set: N images of ROWS x COLS and their labels. */
#define N 5
#define ROWS 4
#define COLS 3
static const uint8_t small_labels[N] = { 2, 0, 7, 1, 2 }; /* classes = 8 */

static uint8_t pixel(int i, int r, int c)
{
	return (uint8_t)((i * 53 + r * 17 + c * 91 + 3) & 0xff);
}

/* ---- fixtures ---------------------------------------------------------- */

static void setup(void)
{
	source_setup("idx");
	const struct kiln_plugin *p = source_find("idx");
	ck_assert_int_eq(p->kind, KILN_PLUGIN_SOURCE);
	ck_assert_uint_ge(ops->version, 1);
}

/* ---- writing files ----------------------------------------------------- */

static void write_gz(const char *name, const void *buf, size_t n)
{
	gzFile g = gzopen(tpath(name), "wb");
	ck_assert_ptr_nonnull(g);
	ck_assert_int_eq(gzwrite(g, buf, (unsigned)n), (int)n);
	ck_assert_int_eq(gzclose(g), Z_OK);
}

static void write_file(const char *name, const void *buf, size_t n)
{
	size_t l = strlen(name);
	if (l > 3 && !strcmp(name + l - 3, ".gz"))
		write_gz(name, buf, n);
	else
		write_tmp(name, buf, n);
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* The valid image file: header + N*ROWS*COLS bytes.  Returns its size. */
static size_t make_images(uint8_t *buf)
{
	put32(buf, 0x803);
	put32(buf + 4, N);
	put32(buf + 8, ROWS);
	put32(buf + 12, COLS);
	for (int i = 0; i < N; i++)
		for (int r = 0; r < ROWS; r++)
			for (int c = 0; c < COLS; c++)
				buf[16 + (i * ROWS + r) * COLS + c] = pixel(i, r, c);
	return 16 + N * ROWS * COLS;
}

static size_t make_labels(uint8_t *buf, int n)
{
	put32(buf, 0x801);
	put32(buf + 4, (uint32_t)n);
	for (int i = 0; i < n; i++)
		buf[8 + i] = small_labels[i % N];
	return 8 + (size_t)n;
}

static void write_small(const char *images, const char *labels)
{
	uint8_t b[512];
	write_file(images, b, make_images(b));
	write_file(labels, b, make_labels(b, N));
}

/* ---- opening ----------------------------------------------------------- */

/* Build and validate a config from "section.key=value" overrides (NULL-
 * terminated), then open the source.  Returns open's status. */
static kiln_status open_src(const char *section, const char *split, ...)
{
	va_list ap;
	va_start(ap, split);
	source_config(NULL, ap);
	va_end(ap);
	ctx = NULL;
	kiln_clear_error();
	return ops->open(kiln_host_table(), cfg, section, split, &ctx);
}

/* Open the small files by explicit names in tmp. */
static kiln_status open_named(const char *images, const char *labels)
{
	char p[1100], i[300], l[300];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	snprintf(i, sizeof i, "data.images=%s", images);
	snprintf(l, sizeof l, "data.labels=%s", labels);
	return open_src("data", "train", p, i, l, NULL);
}

/* Check every sample of the small set against mean/std. */
static void check_small(double mean, double sd)
{
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, N);
	ck_assert_int_eq(info.sample.dtype, KILN_F32);
	ck_assert_int_eq(info.sample.layout, KILN_ROW);
	ck_assert_int_eq(info.sample.ndim, 3);
	ck_assert_int_eq(info.sample.dims[0], 1);
	ck_assert_int_eq(info.sample.dims[1], ROWS);
	ck_assert_int_eq(info.sample.dims[2], COLS);
	ck_assert_uint_eq(kiln_tensor_bytes(&info.sample), ROWS * COLS * sizeof(float));
	ck_assert_int_eq(info.label.dtype, KILN_I32);
	ck_assert_int_eq(info.label.ndim, 0);
	ck_assert_int_eq(info.classes, 8);
	for (int i = 0; i < N; i++) {
		float x[ROWS * COLS];
		int32_t y = -1;
		ck_assert_int_eq(ops->read(ctx, i, x, &y), KILN_OK);
		ck_assert_int_eq(y, small_labels[i]);
		for (int r = 0; r < ROWS; r++)
			for (int c = 0; c < COLS; c++)
				ck_assert_double_eq_tol(x[r * COLS + c],
							(pixel(i, r, c) / 255.0 - mean) / sd, 1e-5);
	}
}

/* ---- valid files ------------------------------------------------------- */

START_TEST(test_raw_normalised)
{
	write_small("img.idx", "lab.idx");
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	kiln_status st = open_src("data", "train", p, "data.images=img.idx",
				  "data.labels=lab.idx", "data.mean=0.2860", "data.std=0.3530", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_small(0.2860, 0.3530);
}
END_TEST

START_TEST(test_gz_default_names)
{
	write_small("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s/", tmp); /* a trailing slash is fine */
	kiln_status st = open_src("data", "train", p, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_small(0, 1);
}
END_TEST

/* [data.eval] inherits path from [data]; split test finds the t10k files,
 * here without .gz. */
START_TEST(test_eval_plain_fallback)
{
	write_small("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte");
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	kiln_status st = open_src("data.eval", "test", p, "data.eval.mean=1", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_small(1, 1);
	ops->close(ctx);
	ctx = NULL;
	/* the `split` key overrides the caller's split */
	st = open_src("data", "train", p, "data.split=test", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_small(0, 1);
	ops->close(ctx);
	ctx = NULL;
	/* no train files there: the error names the .gz and the plain name */
	st = open_src("data", "train", p, NULL);
	ASSERT_FAILS(st, KILN_ENOTFOUND, tpath("train-images-idx3-ubyte.gz"), "no such file");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), tpath("train-images-idx3-ubyte")));
}
END_TEST

START_TEST(test_absolute_and_mixed)
{
	write_small("a.idx.gz", "b.idx");
	char i[1100], l[1100];
	snprintf(i, sizeof i, "data.images=%s", tpath("a.idx.gz"));
	snprintf(l, sizeof l, "data.labels=%s", tpath("b.idx"));
	kiln_status st = open_src("data", "train", "data.path=/nonexistent", i, l, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_small(0, 1);
}
END_TEST

START_TEST(test_read_range_and_position)
{
	write_small("img.idx", "lab.idx");
	ck_assert_int_eq(open_named("img.idx", "lab.idx"), KILN_OK);
	float x[ROWS * COLS];
	int32_t y;
	ck_assert_int_eq(ops->read(ctx, N, x, &y), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "index 5"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "5 samples"));
	ck_assert_int_eq(ops->read(ctx, -1, x, &y), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "-1"));
	/* label only */
	ck_assert_int_eq(ops->read(ctx, 2, NULL, &y), KILN_OK);
	ck_assert_int_eq(y, 7);
}
END_TEST

struct reader {
	int bad;
};

static void *read_all(void *arg)
{
	struct reader *r = arg;
	for (int rep = 0; rep < 2000; rep++)
		for (int i = 0; i < N; i++) {
			float x[ROWS * COLS];
			int32_t y;
			if (ops->read(ctx, i, x, &y) || y != small_labels[i] ||
			    fabs(x[5] - pixel(i, 1, 2) / 255.0) > 1e-6)
				r->bad++;
		}
	return NULL;
}

START_TEST(test_concurrent_reads)
{
	write_small("img.idx.gz", "lab.idx.gz");
	ck_assert_int_eq(open_named("img.idx.gz", "lab.idx.gz"), KILN_OK);
	pthread_t t[4];
	struct reader r[4] = { { 0 } };
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, read_all, &r[i]), 0);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(r[i].bad, 0);
	}
}
END_TEST

/* The descriptor's keys make [data] strict when source = idx. */
START_TEST(test_keys_validated)
{
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.imagez=x"), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "images"));
	kiln_config_free(cfg);

	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.eval.split=val"), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "split"));
	kiln_config_free(cfg);

	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.split=val"), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	kiln_config_free(cfg);

	/* defaults as the schema states them */
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);
	ck_assert_str_eq(kiln_config_get(cfg, "data", "path"), FMNIST_DIR);
	ck_assert_str_eq(kiln_config_get(cfg, "data.eval", "mean"), "0");
	ck_assert_str_eq(kiln_config_get(cfg, "data", "std"), "1");
	ck_assert_ptr_null(kiln_config_get(cfg, "data", "images"));
	ck_assert_ptr_null(kiln_config_get(cfg, "data", "labels"));
}
END_TEST

/* ---- corrupt files ----------------------------------------------------- */

START_TEST(test_wrong_image_magic)
{
	uint8_t b[512];
	size_t n = make_images(b);
	put32(b, 0x12345678);
	write_tmp("img.idx", b, n);
	write_tmp("lab.idx", b, make_labels(b, N));
	ASSERT_FAILS(open_named("img.idx", "lab.idx"), KILN_EDATA, tpath("img.idx"), "magic");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "0x12345678"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "0x00000803"));
}
END_TEST

START_TEST(test_wrong_label_magic)
{
	/* the two files swapped: the hint says so */
	write_small("img.idx", "lab.idx");
	ASSERT_FAILS(open_named("lab.idx", "img.idx"), KILN_EDATA, tpath("lab.idx"), "magic");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "swapped"));
	/* labels with a little-endian magic */
	uint8_t b[512];
	size_t n = make_labels(b, N);
	b[0] = 0x01, b[1] = 0x08, b[2] = 0, b[3] = 0;
	write_gz("lab2.idx.gz", b, n);
	ASSERT_FAILS(open_named("img.idx", "lab2.idx.gz"), KILN_EDATA, tpath("lab2.idx.gz"),
		     "0x00000801");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "magic"));
}
END_TEST

START_TEST(test_truncated_header)
{
	uint8_t b[512];
	size_t n = make_images(b);
	(void)n;
	write_tmp("img.idx", b, 10);
	write_tmp("lab.idx", b, make_labels(b, N));
	ASSERT_FAILS(open_named("img.idx", "lab.idx"), KILN_EDATA, tpath("img.idx"),
		     "truncated header");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "16"));
	/* 2 bytes: not even a magic */
	write_gz("lab.idx.gz", b, 2);
	write_small("img.idx", "unused.idx");
	ASSERT_FAILS(open_named("img.idx", "lab.idx.gz"), KILN_EDATA, tpath("lab.idx.gz"),
		     "truncated header");
}
END_TEST

START_TEST(test_truncated_data)
{
	uint8_t b[512];
	size_t n = make_images(b);
	write_tmp("img.idx", b, n - 10);
	write_gz("img.idx.gz", b, n - 10);
	write_tmp("lab.idx", b, make_labels(b, N));
	ASSERT_FAILS(open_named("img.idx", "lab.idx"), KILN_EDATA, tpath("img.idx"), "truncated");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "60 bytes"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "found 50"));
	ASSERT_FAILS(open_named("img.idx.gz", "lab.idx"), KILN_EDATA, tpath("img.idx.gz"),
		     "truncated");
	/* labels short by one */
	write_tmp("img.idx", b, make_images(b));
	write_tmp("lab.idx", b, make_labels(b, N) - 1);
	ASSERT_FAILS(open_named("img.idx", "lab.idx"), KILN_EDATA, tpath("lab.idx"), "truncated");
}
END_TEST

START_TEST(test_count_mismatch)
{
	uint8_t b[512];
	write_tmp("img.idx", b, make_images(b));
	write_tmp("lab.idx", b, make_labels(b, N - 1));
	ASSERT_FAILS(open_named("img.idx", "lab.idx"), KILN_EDATA, tpath("img.idx"), "mismatch");
	const char *e = kiln_last_error();
	ck_assert_ptr_nonnull(strstr(e, tpath("lab.idx")));
	ck_assert_ptr_nonnull(strstr(e, "5 images"));
	ck_assert_ptr_nonnull(strstr(e, "4 labels"));
}
END_TEST

START_TEST(test_missing_file)
{
	write_small("img.idx", "lab.idx");
	/* a config error, exit 2, naming the key (KILN_EIO before session 37) */
	ASSERT_FAILS(open_named("nope.idx", "lab.idx"), KILN_ENOTFOUND, tpath("nope.idx"),
		     "[data] images: ");
	ASSERT_FAILS(open_named("img.idx", "nope2.idx"), KILN_ENOTFOUND, tpath("nope2.idx"),
		     "[data] labels: ");
	/* a directory is not a file */
	ck_assert_int_eq(mkdir(tpath("dir.idx"), 0700), 0);
	ASSERT_FAILS(open_named("dir.idx", "lab.idx"), KILN_EIO, tpath("dir.idx"), "directory");
}
END_TEST

START_TEST(test_corrupt_gzip)
{
	/* a valid gzip header (deflate, no flags, OS unix), then garbage */
	uint8_t b[256] = { 0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03 };
	for (int i = 10; i < 256; i++)
		b[i] = 0xff;
	write_tmp("img.idx.gz", b, sizeof b);
	write_small("unused.idx", "lab.idx");
	ASSERT_FAILS(open_named("img.idx.gz", "lab.idx"), KILN_EDATA, tpath("img.idx.gz"), "gzip");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "corrupt"));

	/* a valid gzip file cut in the middle of its stream */
	uint8_t img[512];
	write_gz("whole.idx.gz", img, make_images(img));
	size_t n;
	uint8_t *z = read_whole("whole.idx.gz", &n);
	write_tmp("cut.idx.gz", z, n / 2);
	ASSERT_FAILS(open_named("cut.idx.gz", "lab.idx"), KILN_EDATA, tpath("cut.idx.gz"),
		     "truncated");
	/* a flipped CRC in the trailer */
	z[n - 6] ^= 0x55;
	write_tmp("crc.idx.gz", z, n);
	ASSERT_FAILS(open_named("crc.idx.gz", "lab.idx"), KILN_EDATA, tpath("crc.idx.gz"), "gzip");
	/* the trailer missing */
	write_tmp("notrailer.idx.gz", z, n - 8);
	ASSERT_FAILS(open_named("notrailer.idx.gz", "lab.idx"), KILN_EDATA,
		     tpath("notrailer.idx.gz"), "gzip");
	free(z);
}
END_TEST

START_TEST(test_empty_file)
{
	write_small("img.idx", "lab.idx");
	write_tmp("empty.idx", "", 0);
	ASSERT_FAILS(open_named("empty.idx", "lab.idx"), KILN_EDATA, tpath("empty.idx"), "empty");
	write_gz("empty.idx.gz", "", 0);
	ASSERT_FAILS(open_named("img.idx", "empty.idx.gz"), KILN_EDATA, tpath("empty.idx.gz"),
		     "empty");
}
END_TEST

START_TEST(test_huge_and_zero_dims)
{
	uint8_t b[512], l[64];
	write_tmp("lab.idx", l, make_labels(l, N));
	size_t n = make_images(b);

	/* claims 60000 x 28 x 28 (47 MB), holds 60 bytes */
	put32(b + 4, 60000), put32(b + 8, 28), put32(b + 12, 28);
	write_tmp("big.idx", b, n);
	ASSERT_FAILS(open_named("big.idx", "lab.idx"), KILN_EDATA, tpath("big.idx"), "truncated");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "47040000"));

	/* 2^32-1 cubed: overflow guard */
	put32(b + 4, 0xffffffffu), put32(b + 8, 0xffffffffu), put32(b + 12, 0xffffffffu);
	write_gz("absurd.idx.gz", b, n);
	ASSERT_FAILS(open_named("absurd.idx.gz", "lab.idx"), KILN_EDATA, tpath("absurd.idx.gz"),
		     "absurd");
	/* 2^17 x 2^9 x 2^9 = 2^35 bytes: just over the limit */
	put32(b + 4, 1u << 17), put32(b + 8, 1u << 9), put32(b + 12, 1u << 9);
	write_tmp("absurd2.idx", b, n);
	ASSERT_FAILS(open_named("absurd2.idx", "lab.idx"), KILN_EDATA, tpath("absurd2.idx"),
		     "absurd");

	/* zero rows */
	n = make_images(b);
	put32(b + 8, 0);
	write_tmp("zero.idx", b, n);
	ASSERT_FAILS(open_named("zero.idx", "lab.idx"), KILN_EDATA, tpath("zero.idx"), "zero");
	/* zero labels */
	write_tmp("img.idx", b, make_images(b));
	write_tmp("lab0.idx", b, make_labels(b, 0));
	ASSERT_FAILS(open_named("img.idx", "lab0.idx"), KILN_EDATA, tpath("lab0.idx"), "zero");
}
END_TEST

/* ---- fuzz -------------------------------------------------------------- */

/* Mutate `src` (n bytes) into dst: truncate, flip bytes, or rewrite a
 * header word.  Returns the new size. */
static size_t mutate(uint8_t *dst, const uint8_t *src, size_t n)
{
	memcpy(dst, src, n);
	switch (next() % 4) {
	case 0: /* truncate */
		return next() % n;
	case 1: /* flip 1..4 bytes anywhere */
		for (int k = 1 + (int)(next() % 4); k > 0; k--)
			dst[next() % n] ^= (uint8_t)(1 + next() % 255);
		return n;
	case 2: /* a random word somewhere in the first 16 bytes (the header) */
		put32(dst + next() % (n < 16 ? n - 3 : 13), next() ^ (next() << 21));
		return n;
	default: /* flip and truncate */
		dst[next() % n] ^= 0x80;
		return n - next() % (n / 2 + 1);
	}
}

START_TEST(test_fuzz)
{
	uint8_t img[512], lab[512], mut[1024];
	size_t ni = make_images(img), nl = make_labels(lab, N);
	write_gz("img.gz", img, ni);
	write_gz("lab.gz", lab, nl);
	size_t nzi, nzl;
	uint8_t *zi = read_whole("img.gz", &nzi), *zl = read_whole("lab.gz", &nzl);
	write_tmp("img.idx", img, ni);
	write_tmp("lab.idx", lab, nl);
	int ok = 0, failed = 0;
	for (int it = 0; it < 300; it++) {
		const char *im = "img.idx", *la = "lab.idx";
		size_t m;
		switch (it % 4) {
		case 0:
			m = mutate(mut, img, ni), write_tmp("m.idx", mut, m), im = "m.idx";
			break;
		case 1:
			m = mutate(mut, zi, nzi), write_tmp("m.gz", mut, m), im = "m.gz";
			break;
		case 2:
			m = mutate(mut, lab, nl), write_tmp("m.idx", mut, m), la = "m.idx";
			break;
		default:
			m = mutate(mut, zl, nzl), write_tmp("m.gz", mut, m), la = "m.gz";
			break;
		}
		kiln_status st = open_named(im, la);
		if (st == KILN_OK) {
			struct kiln_source_info info;
			ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
			ck_assert_int_ge(info.len, 1);
			float *x = malloc(kiln_tensor_bytes(&info.sample));
			int32_t y;
			for (int64_t i = 0; i < info.len; i++) {
				ck_assert_int_eq(ops->read(ctx, i, x, &y), KILN_OK);
				ck_assert_int_lt(y, info.classes);
			}
			free(x);
			ops->close(ctx);
			ctx = NULL;
			ok++;
		} else {
			ck_assert_msg(st == KILN_EDATA || st == KILN_EIO, "iteration %d: %s: %s", it,
				      kiln_status_name(st), kiln_last_error());
			ck_assert_ptr_null(ctx);
			ck_assert_ptr_nonnull(strstr(kiln_last_error(), tmp));
			failed++;
		}
	}
	ck_assert_int_gt(failed, 100);
	free(zi);
	free(zl);
}
END_TEST

/* ---- the inflated copy (unzip_cache) ---------------------------------- */

/* Warnings the source logs, kept for the cache test to read. */
static char warned[TEST_WARNED_SIZE];

/* The one file in dir (a cache file) into out; how many there are. */
static int only_file(const char *dir, char *out, size_t n)
{
	DIR *d = opendir(dir);
	int count = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		if (e->d_name[0] != '.' && ++count == 1)
			snprintf(out, n, "%s/%s", dir, e->d_name);
	if (d)
		closedir(d);
	return count;
}

/* Whether this process maps the file `path` (/proc/self/maps). */
static int mapped(const char *path)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1400];
	int hit = 0;
	while (f && fgets(line, sizeof line, f))
		hit |= strstr(line, path) != NULL;
	if (f)
		fclose(f);
	return hit;
}

/* Open big.gz through the cache folder and compare every image with img
 * byte for byte. */
static void open_big_check(const char *cache, const uint8_t *img, int n, int rows, int cols)
{
	char p[1100], c[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	snprintf(c, sizeof c, "data.unzip_cache=%s", cache);
	kiln_status st = open_src("data", "train", p, "data.images=big.gz",
				  "data.labels=big_labels", c, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_image im = { 0 };
	int32_t y;
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(ops->read_image(ctx, i, &im, &y), KILN_OK);
		ck_assert_int_eq(im.h, rows);
		ck_assert_int_eq(im.w, cols);
		ck_assert_int_eq(memcmp(im.data, img + 16 + (size_t)i * rows * cols,
					(size_t)rows * cols), 0);
		ck_assert_int_eq(y, i % 10);
	}
	free(im.data);
}

static void close_src(void)
{
	ops->close(ctx);
	ctx = NULL;
	kiln_config_free(cfg);
	cfg = NULL;
}

/* A gzip file of 1 MiB or more leaves its inflated copy in unzip_cache;
 * the next open maps it and reads the same bytes; a corrupted or truncated
 * copy is rebuilt with a warning, never trusted. */
START_TEST(test_unzip_cache)
{
	enum { BN = 1500, BR = 28, BC = 28 }; /* random bytes: 1.1 MB gzipped */
	size_t bytes = 16 + (size_t)BN * BR * BC;
	uint8_t *img = malloc(bytes), lab[8 + BN];
	ck_assert_ptr_nonnull(img);
	put32(img, 0x803);
	put32(img + 4, BN);
	put32(img + 8, BR);
	put32(img + 12, BC);
	uint64_t x = 88172645463325252u;
	for (size_t i = 16; i < bytes; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		img[i] = (uint8_t)(x >> 32);
	}
	put32(lab, 0x801);
	put32(lab + 4, BN);
	for (int i = 0; i < BN; i++)
		lab[8 + i] = (uint8_t)(i % 10);
	write_gz("big.gz", img, bytes);
	write_tmp("big_labels", lab, sizeof lab);
	struct stat sb;
	ck_assert_int_eq(stat(tpath("big.gz"), &sb), 0);
	ck_assert_int_ge(sb.st_size, 1 << 20);

	char cache[600], file[1200];
	snprintf(cache, sizeof cache, "%s/cache", tmp);
	kiln_log_set_sink(test_keep_warning, warned);
	kiln_log_set_level(KILN_LOG_WARN);

	/* first open: inflates and keeps the copy (header, path, raw file) */
	open_big_check(cache, img, BN, BR, BC);
	close_src();
	ck_assert_int_eq(only_file(cache, file, sizeof file), 1);
	ck_assert_int_eq(stat(file, &sb), 0);
	off_t copy_size = sb.st_size;
	ck_assert_int_gt(copy_size, (off_t)bytes);
	ck_assert_str_eq(warned, "");

	/* second: served from the mapped copy, the same bytes */
	open_big_check(cache, img, BN, BR, BC);
	ck_assert_msg(mapped(file), "the second open did not map %s", file);
	close_src();
	ck_assert_str_eq(warned, "");

	/* a flipped byte in the data: refused, warned, rebuilt */
	FILE *f = fopen(file, "r+b");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fseek(f, copy_size - 1000, SEEK_SET), 0);
	int b = fgetc(f);
	ck_assert_int_eq(fseek(f, copy_size - 1000, SEEK_SET), 0);
	fputc(b ^ 0x40, f);
	ck_assert_int_eq(fclose(f), 0);
	open_big_check(cache, img, BN, BR, BC);
	ck_assert_msg(!mapped(file), "a corrupt copy was mapped");
	close_src();
	ck_assert_msg(strstr(warned, "corrupt: CRC32C mismatch; rebuilding it"), "%s", warned);
	ck_assert_int_eq(stat(file, &sb), 0);
	ck_assert_int_eq(sb.st_size, copy_size);
	warned[0] = 0;
	open_big_check(cache, img, BN, BR, BC); /* the rebuilt copy serves */
	ck_assert(mapped(file));
	close_src();
	ck_assert_str_eq(warned, "");

	/* cut short: refused, warned, rebuilt */
	ck_assert_int_eq(truncate(file, copy_size / 2), 0);
	open_big_check(cache, img, BN, BR, BC);
	close_src();
	ck_assert_msg(strstr(warned, "truncated or padded"), "%s", warned);
	ck_assert_int_eq(stat(file, &sb), 0);
	ck_assert_int_eq(sb.st_size, copy_size);

	/* the source changed (new bytes, another mtime): the copy of the old
	 * one is not served; the new bytes are, and a new copy replaces it */
	for (size_t i = 16; i < 16 + BR * BC; i++)
		img[i] ^= 0xff;
	write_gz("big.gz", img, bytes);
	struct timespec when[2] = { { 1000000000, 0 }, { 1000000000, 0 } };
	ck_assert_int_eq(utimensat(AT_FDCWD, tpath("big.gz"), when, 0), 0);
	warned[0] = 0;
	open_big_check(cache, img, BN, BR, BC);
	close_src();
	ck_assert_str_eq(warned, ""); /* stale is not a fault */
	ck_assert_int_eq(only_file(cache, file, sizeof file), 1);
	open_big_check(cache, img, BN, BR, BC);
	ck_assert(mapped(file));
	close_src();

	/* `none`: no copy is read or written */
	warned[0] = 0;
	ck_assert_int_eq(unlink(file), 0);
	open_big_check("none", img, BN, BR, BC);
	close_src();
	ck_assert_int_eq(only_file(cache, file, sizeof file), 0);
	kiln_log_set_sink(NULL, NULL);
	free(img);
}
END_TEST

/* ---- the real Fashion-MNIST ------------------------------------------- */

START_TEST(test_fashion_mnist)
{
	if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) ||
	    access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK)) {
		fprintf(stderr, "check_idx: %s absent, skipping the Fashion-MNIST case\n",
			FMNIST_DIR);
		return;
	}
	static const struct {
		const char *section, *split;
		int64_t len;
	} cases[] = { { "data", "train", 60000 }, { "data.eval", "test", 10000 } };
	for (size_t k = 0; k < 2; k++) {
		/* the defaults alone find the data set */
		kiln_status st = open_src(cases[k].section, cases[k].split, NULL);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		struct kiln_source_info info;
		ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
		ck_assert_int_eq(info.len, cases[k].len);
		ck_assert_int_eq(info.sample.ndim, 3);
		ck_assert_int_eq(info.sample.dims[0], 1);
		ck_assert_int_eq(info.sample.dims[1], 28);
		ck_assert_int_eq(info.sample.dims[2], 28);
		ck_assert_int_eq(info.classes, 10);
		float x[28 * 28];
		int32_t y;
		double sum = 0;
		int counts[10] = { 0 };
		for (int64_t i = 0; i < info.len; i++) {
			ck_assert_int_eq(ops->read(ctx, i, i < 100 ? x : NULL, &y), KILN_OK);
			ck_assert(y >= 0 && y < 10);
			counts[y]++;
			if (i < 100)
				for (int j = 0; j < 28 * 28; j++) {
					ck_assert(x[j] >= 0 && x[j] <= 1);
					sum += x[j];
				}
		}
		for (int c = 0; c < 10; c++) /* Fashion-MNIST is balanced */
			ck_assert_int_eq(counts[c], cases[k].len / 10);
		ck_assert(sum > 0);
		if (k == 0) {
			ck_assert_int_eq(ops->read(ctx, 0, x, &y), KILN_OK);
			ck_assert_int_eq(y, 9); /* the first training image is an ankle boot */
		}
		ops->close(ctx);
		ctx = NULL;
	}
}
END_TEST

/* common_write_atomic (plugins/common/cache_file.h, which the unzipped
 * IDX cache, the plugin probe and the tune caches save through) from two
 * threads of one process at once, as two devices saving one cache: every
 * save succeeds, the file is always one save whole, and no temporary file
 * is left.  With the temporary named by the pid alone both threads wrote
 * one file, and one's rename found it gone. */
enum { SAVE_BYTES = 256 << 10, SAVES = 150 };
struct saver {
	const char *path;
	unsigned char fill;
	int failed, err;
};

static void *saver_main(void *arg)
{
	struct saver *sv = arg;
	unsigned char *buf = malloc(SAVE_BYTES);
	if (!buf) {
		sv->failed = SAVES;
		return NULL;
	}
	memset(buf, sv->fill, SAVE_BYTES);
	const void *part[2] = { buf, buf + SAVE_BYTES / 2 };
	const size_t len[2] = { SAVE_BYTES / 2, SAVE_BYTES - SAVE_BYTES / 2 };
	for (int i = 0; i < SAVES; i++)
		if (common_write_atomic(sv->path, part, len, 2))
			sv->failed++, sv->err = errno;
	free(buf);
	return NULL;
}

START_TEST(test_cache_write_threads)
{
	char dir[1024], path[4200];
	ck_assert(test_tmpdir_make(dir, sizeof dir, "cachew") != NULL);
	snprintf(path, sizeof path, "%s/sub/cache.bin", dir);
	struct saver sv[2] = { { path, 0xa1, 0, 0 }, { path, 0x5c, 0, 0 } };
	pthread_t th[2];
	for (int t = 0; t < 2; t++)
		ck_assert_int_eq(pthread_create(&th[t], NULL, saver_main, &sv[t]), 0);
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	for (int t = 0; t < 2; t++)
		ck_assert_msg(sv[t].failed == 0, "thread %d: %d of %d saves failed (last: %s)", t,
			      sv[t].failed, SAVES, strerror(sv[t].err));
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "%s", path);
	unsigned char *got = malloc(SAVE_BYTES + 1);
	ck_assert(got != NULL);
	size_t n = fread(got, 1, SAVE_BYTES + 1, f);
	fclose(f);
	ck_assert_uint_eq(n, SAVE_BYTES);
	ck_assert(got[0] == 0xa1 || got[0] == 0x5c);
	for (size_t i = 1; i < n; i++)
		ck_assert_msg(got[i] == got[0], "byte %zu is %#x, byte 0 %#x: two saves mixed", i,
			      got[i], got[0]);
	free(got);
	snprintf(path, sizeof path, "%s/sub", dir);
	DIR *d = opendir(path);
	ck_assert(d != NULL);
	int entries = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			entries++;
			ck_assert_msg(!strcmp(e->d_name, "cache.bin"), "left behind: %s", e->d_name);
		}
	closedir(d);
	ck_assert_int_eq(entries, 1);
	snprintf(path, sizeof path, "%s/sub/cache.bin", dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/sub", dir);
	rmdir(path);
	rmdir(dir);
}
END_TEST

/* The temporaries of savers killed mid-save (path.tmp.<pid>.<tid>.<k>)
 * are removed by the next save: those untouched for 10 minutes whose
 * process is gone, and any untouched for a day; a live or recent writer's
 * temporary, another file's, and a file of another pattern (bench's
 * plugin_probe.<cksum>) stay.  Before, each killed save left its
 * temporary (an unzipped IDX copy: tens of MB) for good. */
static void leftover(const char *dir, const char *name, double age_s)
{
	char p[4200];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	FILE *f = fopen(p, "wb");
	ck_assert_msg(f != NULL, "%s", p);
	fputs("partial", f);
	fclose(f);
	const struct timespec t = { time(NULL) - (time_t)age_s, 0 };
	ck_assert(utimensat(AT_FDCWD, p, (const struct timespec[2]){ t, t }, 0) == 0);
}

static int exists_in(const char *dir, const char *name)
{
	char p[4200];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

START_TEST(test_cache_write_leftovers)
{
	char dir[1024], path[4200], name[8][256];
	ck_assert(test_tmpdir_make(dir, sizeof dir, "cachel") != NULL);
	/* a pid that is gone: a child's, reaped */
	const pid_t dead = fork();
	ck_assert(dead >= 0);
	if (!dead)
		_exit(0);
	ck_assert(waitpid(dead, NULL, 0) == dead);
	const long me = (long)getpid();
	const struct {
		const char *fmt;
		long pid;
		double age;
		int kept;
	} c[] = {
		{ "cache.bin.tmp.%ld.11.0", dead, 1200, 0 },   /* killed 20 min ago */
		{ "cache.bin.tmp.%ld.12.3", me, 1200, 1 },     /* a live writer */
		{ "cache.bin.tmp.%ld.13.0", dead, 60, 1 },     /* recent: not judged yet */
		{ "cache.bin.tmp.%ld.14.0", me, 2 * 86400, 0 },  /* a day: gone whatever the pid */
		{ "cache.bin.%ld", 7, 2 * 86400, 1 },        /* plugin_probe.<cksum>: a cache */
		{ "other.bin.tmp.%ld.15.0", dead, 1200, 1 },   /* another file's */
		{ "cache.bin.tmp.%ld.x.0", dead, 2 * 86400, 1 }, /* not the pattern */
	};
	const int nc = (int)(sizeof c / sizeof *c);
	for (int i = 0; i < nc; i++) {
		snprintf(name[i], sizeof name[i], c[i].fmt, c[i].pid);
		leftover(dir, name[i], c[i].age);
	}
	snprintf(path, sizeof path, "%s/cache.bin", dir);
	const char data[] = "whole";
	const void *part[1] = { data };
	const size_t len[1] = { sizeof data };
	ck_assert_int_eq(common_write_atomic(path, part, len, 1), 0);
	for (int i = 0; i < nc; i++)
		ck_assert_msg(exists_in(dir, name[i]) == c[i].kept, "%s: %s after a save", name[i],
			      c[i].kept ? "removed" : "still there");
	for (int i = 0; i < nc; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, name[i]);
		unlink(path);
	}
	snprintf(path, sizeof path, "%s/cache.bin", dir);
	unlink(path);
	rmdir(dir);
}
END_TEST

static Suite *make_idx_suite(void)
{
	Suite *s = suite_create("idx");
	check_add_case(s, "valid", 0, setup, teardown, (const TTest *[]){
		test_raw_normalised, test_gz_default_names, test_eval_plain_fallback,
		test_absolute_and_mixed, test_read_range_and_position, test_concurrent_reads,
		test_keys_validated, NULL });

	check_add_case(s, "corrupt", 0, setup, teardown, (const TTest *[]){
		test_wrong_image_magic, test_wrong_label_magic, test_truncated_header,
		test_truncated_data, test_count_mismatch, test_missing_file, test_corrupt_gzip,
		test_empty_file, test_huge_and_zero_dims, NULL });

	check_add_case(s, "fuzz", 120, setup, teardown, (const TTest *[]){ test_fuzz, NULL });

	check_add_case(s, "unzip_cache", 60, setup, teardown, (const TTest *[]){
		test_unzip_cache, test_cache_write_threads, test_cache_write_leftovers, NULL });

	check_add_case(s, "fashion_mnist", 120, setup, teardown, (const TTest *[]){
		test_fashion_mnist, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_idx_suite };
