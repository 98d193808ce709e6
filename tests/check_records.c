/* tests/check_records.c - kiln's records format and the `records` source of
 * kiln-loaders.so (docs/formats.md), plus host->crc32c.
 *
 * Every test writes its shards at run time into its own temporary
 * directory with the format's writer (plugins/loaders/records_write.c,
 * linked into this program) and opens them through the core exactly as a
 * run does: registry -> source plugin -> config validated against its keys
 * -> ops->open.  Corrupt shards must give KILN_EDATA with a message naming
 * the file and the problem (and the record, for a record); a fuzz case
 * checks that no mutation of a valid shard crashes, with and without its
 * CRCs recomputed (Check forks each test, so a crash fails it).  The
 * Fashion-MNIST case packs the real test split with `kiln pack` and
 * compares every sample with the idx source's.
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "plugins/loaders/image.h"
#include "plugins/loaders/records.h"

#include <check.h>
#include "check_main.h"
#include "source_fixture.h"
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h> /* setrlimit */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Exported by libkiln (core/crc32c.c), not in the public headers. */
uint32_t kiln_crc32c(uint32_t crc, const void *buf, size_t n);

static const struct kiln_host *host;

/* ---- fixtures ---------------------------------------------------------- */

static void setup(void)
{
	source_setup("records");
	source_find("records");
	ck_assert_uint_ge(ops->version, 2);
	ck_assert_ptr_nonnull(ops->read_image);
	host = kiln_host_table();
	ck_assert_uint_ge(host->version, 2);
}

/* ---- the records of a test ------------------------------------------- */

/* A record to write: record `id` (global, for its pixels), label, size,
 * encoding. */
struct spec {
	int id;
	int32_t label;
	int h, w, c;
	int enc;
};

/* Pixels of record id: an irregular pattern for raw and PNG, a gentle
 * gradient for JPEG (so that lossy coding stays within a few levels). */
static uint8_t pixel(int id, int y, int x, int ch, int smooth)
{
	if (smooth)
		return (uint8_t)(40 + 5 * y + 4 * x + 12 * ch + 3 * (id % 8));
	return (uint8_t)((id * 29 + y * 13 + x * 7 + ch * 71 + 5 + (x * y) % 11) & 0xff);
}

static uint8_t *make_pixels(const struct spec *s)
{
	uint8_t *px = malloc((size_t)s->h * s->w * s->c);
	for (int y = 0; y < s->h; y++)
		for (int x = 0; x < s->w; x++)
			for (int ch = 0; ch < s->c; ch++)
				px[((size_t)y * s->w + x) * s->c + ch] =
					pixel(s->id, y, x, ch, s->enc == REC_JPEG);
	return px;
}

/* Write shard `name` of n records; classes as the header's minimum. */
static void write_shard(const char *name, const struct spec *recs, int n, int64_t classes)
{
	struct rec_writer *w;
	kiln_status st = rec_writer_open(host, tpath(name), classes, &w);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	for (int i = 0; i < n; i++) {
		const struct spec *s = &recs[i];
		uint8_t *px = make_pixels(s), *enc = NULL;
		size_t bytes = (size_t)s->h * s->w * s->c;
		if (s->enc == REC_JPEG)
			st = img_encode_jpeg(host, px, s->h, s->w, s->c, 95, &enc, &bytes);
		else if (s->enc == REC_PNG)
			st = img_encode_png(host, px, s->h, s->w, s->c, &enc, &bytes);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		st = rec_writer_add(w, s->label, s->h, s->w, s->c, s->enc, enc ? enc : px, bytes);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		free(enc);
		free(px);
	}
	st = rec_writer_finish(w);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
}

/* n fixed-size records id first.., 4x3x1, raw, labels id % 5. */
static void fixed_specs(struct spec *v, int n, int first, int enc)
{
	for (int i = 0; i < n; i++)
		v[i] = (struct spec){ first + i, (first + i) % 5, 4, 3, 1, enc };
}

/* ---- opening ----------------------------------------------------------- */

/* Build and validate a config from "section.key=value" overrides (NULL-
 * terminated; data.source=records and data.eval.source are implied),
 * then open the source.  Returns open's status. */
static kiln_status open_src(const char *section, const char *split, ...)
{
	va_list ap;
	va_start(ap, split);
	source_config("records", ap);
	va_end(ap);
	if (ctx)
		ops->close(ctx);
	ctx = NULL;
	kiln_clear_error();
	return ops->open(host, cfg, section, split, &ctx);
}

/* Open the one shard `name` of tmp as [data]. */
static kiln_status open_file(const char *name)
{
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tpath(name));
	return open_src("data", "train", p, NULL);
}

/* Sample i of the open source equals spec s (exactly, or within `tol`
 * levels with a mean error under 2 for JPEG). */
static void check_sample(int64_t i, const struct spec *s, struct kiln_image *img)
{
	int32_t y = -1;
	kiln_status st = ops->read_image(ctx, i, img, &y);
	ck_assert_msg(st == KILN_OK, "sample %lld: %s", (long long)i, kiln_last_error());
	ck_assert_int_eq(y, s->label);
	ck_assert_int_eq(img->h, s->h);
	ck_assert_int_eq(img->w, s->w);
	ck_assert_int_eq(img->c, s->c);
	uint8_t *px = make_pixels(s);
	size_t n = (size_t)s->h * s->w * s->c;
	if (s->enc == REC_JPEG) {
		double sum = 0;
		int worst = 0;
		for (size_t k = 0; k < n; k++) {
			int d = abs((int)img->data[k] - px[k]);
			sum += d;
			worst = d > worst ? d : worst;
		}
		ck_assert_msg(worst <= 8 && sum / n < 2, "sample %lld: JPEG off by up to %d levels (mean %.2f)",
			      (long long)i, worst, sum / n);
	} else {
		ck_assert_msg(!memcmp(img->data, px, n), "sample %lld: pixels differ", (long long)i);
	}
	free(px);
}

/* ---- CRC32C ------------------------------------------------------------ */

static uint32_t crc_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
	}
	return ~crc;
}

START_TEST(test_crc32c)
{
	const char *s = "123456789";
	ck_assert_uint_eq(host->crc32c(0, s, 9), 0xE3069283u);
	ck_assert_uint_eq(kiln_crc32c(0, s, 9), 0xE3069283u);
	ck_assert_uint_eq(host->crc32c(0, s, 0), 0);
	ck_assert_uint_eq(host->crc32c(0, NULL, 0), 0);
	/* 32 zero bytes and 32 0xff bytes: RFC 3720 (iSCSI) B.4 */
	uint8_t z[32] = { 0 }, f[32];
	memset(f, 0xff, sizeof f);
	ck_assert_uint_eq(host->crc32c(0, z, 32), 0x8A9136AAu);
	ck_assert_uint_eq(host->crc32c(0, f, 32), 0x62A8AB43u);
	/* incremental at every split point equals one-shot */
	for (size_t k = 0; k <= 9; k++)
		ck_assert_uint_eq(host->crc32c(host->crc32c(0, s, k), s + k, 9 - k), 0xE3069283u);
	/* every length and alignment against a bit-at-a-time reference (the
	 * 8-byte SSE4.2 path and its head and tail) */
	uint8_t buf[600];
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (uint8_t)(i * 131 + (i >> 3) * 7 + 1);
	for (size_t off = 0; off < 8; off++)
		for (size_t n = 0; n < 300; n++) {
			uint32_t want = crc_bitwise(0, buf + off, n);
			ck_assert_uint_eq(host->crc32c(0, buf + off, n), want);
			ck_assert_uint_eq(kiln_crc32c(0, buf + off, n), want);
			size_t k = n / 3;
			ck_assert_uint_eq(kiln_crc32c(kiln_crc32c(0, buf + off, k), buf + off + k, n - k),
					  want);
			ck_assert_uint_eq(kiln_crc32c(0x12345678u, buf + off, n),
					  crc_bitwise(0x12345678u, buf + off, n));
		}
	/* lengths around the three-stream blocks (3 x 8 KiB), a start crc,
	 * misaligned starts */
	enum { BIG = 4 * 24576 + 100 };
	uint8_t *big = malloc(BIG);
	ck_assert_ptr_nonnull(big);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (uint8_t)(i * 2654435761u >> 13);
	static const size_t lens[] = { 24575, 24576, 24577, 24576 + 8, 2 * 24576 + 13, 4 * 24576 + 90 };
	for (size_t off = 0; off < 4; off += 3)
		for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
			uint32_t want = crc_bitwise(0x9abcdef0u, big + off, lens[j]);
			ck_assert_msg(kiln_crc32c(0x9abcdef0u, big + off, lens[j]) == want,
				      "offset %zu, %zu bytes", off, lens[j]);
			ck_assert_uint_eq(host->crc32c(0x9abcdef0u, big + off, lens[j]), want);
		}
	free(big);
}
END_TEST

/* ---- valid shards ------------------------------------------------------ */

START_TEST(test_raw_roundtrip)
{
	struct spec v[7];
	fixed_specs(v, 7, 0, REC_RAW);
	write_shard("a.krec", v, 7, 0);
	kiln_status st = open_file("a.krec");
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 7);
	ck_assert_int_eq(info.classes, 5);
	ck_assert_int_eq(info.image_h, 4);
	ck_assert_int_eq(info.image_w, 3);
	ck_assert_int_eq(info.image_c, 1);
	ck_assert_int_eq(info.sample.dtype, KILN_F32);
	ck_assert_int_eq(info.sample.ndim, 3);
	ck_assert_int_eq(info.sample.dims[0], 1);
	ck_assert_int_eq(info.sample.dims[1], 4);
	ck_assert_int_eq(info.sample.dims[2], 3);
	ck_assert_int_eq(info.label.dtype, KILN_I32);
	ck_assert_int_eq(info.label.ndim, 0);
	struct kiln_image img = { 0 };
	for (int i = 0; i < 7; i++)
		check_sample(i, &v[i], &img);
	/* read(): f32 [1, 4, 3] = u8/255, like idx with mean 0, std 1 */
	for (int i = 0; i < 7; i++) {
		float x[12];
		int32_t y;
		ck_assert_int_eq(ops->read(ctx, i, x, &y), KILN_OK);
		ck_assert_int_eq(y, v[i].label);
		for (int r = 0; r < 4; r++)
			for (int c = 0; c < 3; c++)
				ck_assert_float_eq(x[r * 3 + c], (float)(pixel(i, r, c, 0, 0) / 255.0));
	}
	/* label only, range */
	int32_t y = -1;
	ck_assert_int_eq(ops->read(ctx, 3, NULL, &y), KILN_OK);
	ck_assert_int_eq(y, 3);
	ck_assert_int_eq(ops->read_image(ctx, 7, &img, &y), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "index 7"));
	ck_assert_int_eq(ops->read_image(ctx, -1, &img, &y), KILN_EINVAL);
	free(img.data);

	/* the header says what the writer saw: the caller's classes win when
	 * larger (a shard that lacks the top class) */
	write_shard("b.krec", v, 2, 10);
	ck_assert_int_eq(open_file("b.krec"), KILN_OK);
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.classes, 10);
}
END_TEST

START_TEST(test_png_roundtrip)
{
	struct spec v[6];
	for (int i = 0; i < 6; i++)
		v[i] = (struct spec){ i, 6 - i, 9, 7, i % 2 ? 3 : 1, REC_PNG };
	write_shard("p.krec", v, 6, 0);
	ck_assert_int_eq(open_file("p.krec"), KILN_OK);
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.classes, 7);
	ck_assert_int_eq(info.image_h, 9);
	ck_assert_int_eq(info.image_w, 7);
	ck_assert_int_eq(info.image_c, 0); /* gray and RGB mixed */
	struct kiln_image img = { 0 };
	for (int i = 0; i < 6; i++)
		check_sample(i, &v[i], &img);
	free(img.data);
}
END_TEST

START_TEST(test_jpeg_roundtrip)
{
	struct spec v[4];
	for (int i = 0; i < 4; i++)
		v[i] = (struct spec){ i, i, 16, 24, i < 2 ? 3 : 1, REC_JPEG };
	write_shard("j.krec", v, 4, 0);
	ck_assert_int_eq(open_file("j.krec"), KILN_OK);
	struct kiln_image img = { 0 };
	for (int i = 0; i < 4; i++)
		check_sample(i, &v[i], &img);
	/* read() of a fixed-size JPEG shard decodes too (3 channels: CHW) */
	struct spec c3[2] = { { 0, 1, 16, 24, 3, REC_JPEG }, { 1, 0, 16, 24, 3, REC_JPEG } };
	write_shard("j3.krec", c3, 2, 0);
	ck_assert_int_eq(open_file("j3.krec"), KILN_OK);
	float x[3 * 16 * 24];
	int32_t y;
	ck_assert_int_eq(ops->read(ctx, 1, x, &y), KILN_OK);
	ck_assert_int_eq(y, 0);
	ck_assert_int_eq(ops->read_image(ctx, 1, &img, NULL), KILN_OK);
	for (int ch = 0; ch < 3; ch++)
		for (int k = 0; k < 16 * 24; k++)
			ck_assert_float_eq(x[ch * 16 * 24 + k], (float)(img.data[k * 3 + ch] / 255.0));
	free(img.data);
}
END_TEST

/* Three shards in a directory, one empty; the split rules; `shards`. */
START_TEST(test_multi_shards)
{
	struct spec a[3], b[5], t[2];
	fixed_specs(a, 3, 0, REC_RAW);
	fixed_specs(b, 5, 3, REC_PNG);
	fixed_specs(t, 2, 100, REC_RAW);
	write_shard("train-00000.krec", a, 3, 0);
	write_shard("train-00001.krec", NULL, 0, 0);
	write_shard("train-00002.krec", b, 5, 0);
	write_shard("test-00000.krec", t, 2, 0);
	write_tmp("train-00003.krec.tmp", "junk", 4); /* an unfinished pack: ignored */
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);

	kiln_status st = open_src("data", "train", p, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 8);
	ck_assert_int_eq(info.image_h, 4);
	ck_assert_int_eq(info.image_c, 1);
	struct kiln_image img = { 0 };
	for (int i = 0; i < 8; i++)
		check_sample(i, i < 3 ? &a[i] : &b[i - 3], &img);

	/* [data.eval] inherits path and finds test-*.krec */
	st = open_src("data.eval", "test", p, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 2);
	check_sample(1, &t[1], &img);

	/* an explicit list, in its order, relative to path */
	st = open_src("data", "train", p, "data.shards=train-00002.krec, test-00000.krec", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 7);
	check_sample(0, &b[0], &img);
	check_sample(6, &t[1], &img);
	/* the source through the public API, with [data] limit */
	struct kiln_source *src;
	ck_assert_int_eq(kiln_config_override(cfg, "data.limit=6"), KILN_OK);
	ck_assert_int_eq(kiln_source_open(cfg, reg, "data", "train", &src), KILN_OK);
	struct kiln_source_info si;
	ck_assert_uint_eq(kiln_source_info(src, &si, sizeof si), sizeof si);
	ck_assert_int_eq(si.len, 6);
	/* the getter takes the caller's size, as the sized structs do
	 * (kiln.h, "Structs the library fills"): an older minor's struct
	 * (before 2.21's classes_from) gets no byte past it, a newer one's
	 * the library's size back, its extra bytes untouched (before session
	 * 35 the library's whole struct was copied: no size to pass) */
	union {
		struct kiln_source_info i;
		unsigned char b[sizeof(struct kiln_source_info) + 64];
	} u;
	const size_t cut = offsetof(struct kiln_source_info, classes_from);
	memset(&u, 0xA5, sizeof u);
	ck_assert_uint_eq(kiln_source_info(src, &u.i, cut), cut);
	ck_assert_int_eq(u.i.len, 6);
	for (size_t i = cut; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu of a %zu-byte kiln_source_info written", i, cut);
	memset(&u, 0xA5, sizeof u);
	ck_assert_uint_eq(kiln_source_info(src, &u.i, sizeof u), sizeof si);
	ck_assert_int_eq(u.i.len, 6);
	for (size_t i = sizeof si; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu past the library's kiln_source_info written", i);
	ck_assert_int_eq(kiln_source_has_images(src), 1);
	ck_assert_str_eq(kiln_source_name(src), "records");
	int32_t y;
	ck_assert_int_eq(kiln_source_read_image(src, 5, &img, &y), KILN_OK);
	ck_assert_int_eq(y, t[0].label);
	ck_assert_int_eq(kiln_source_read_image(src, 6, &img, &y), KILN_EINVAL);
	kiln_source_close(src);

	/* a subdirectory named by the split wins; split = . is path itself */
	ck_assert_int_eq(mkdir(tpath("train"), 0700), 0);
	write_shard("train/x.krec", t, 1, 0);
	st = open_src("data", "train", p, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 1);
	st = open_src("data", "train", p, "data.split=.", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 10); /* test-00000 + train-0000[0-2] */
	check_sample(0, &t[0], &img);

	/* nothing for the split: the split key's is the config's typo
	 * (KILN_ENOTFOUND, a config error: session 37), the run's own split
	 * missing the data's */
	st = open_src("data", "train", p, "data.split=val", NULL);
	ASSERT_FAILS(st, KILN_ENOTFOUND, "[data] split: ", "val-*.krec shards");
	st = open_src("data", "val", p, NULL);
	ASSERT_FAILS(st, KILN_EIO, tmp, "no shards for split 'val'");
	/* [data.eval] never reads the training shard by inheritance */
	char f[1100];
	snprintf(f, sizeof f, "data.path=%s", tpath("train-00000.krec"));
	st = open_src("data.eval", "test", f, NULL);
	ASSERT_FAILS(st, KILN_ECONFIG, "train-00000.krec", "inherits");
	/* but may name it */
	char fe[1100];
	snprintf(fe, sizeof fe, "data.eval.path=%s", tpath("train-00000.krec"));
	ck_assert_int_eq(open_src("data.eval", "test", f, fe, NULL), KILN_OK);
	/* neither path nor shards */
	st = open_src("data", "train", NULL);
	ck_assert_int_eq(st, KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "path"));
	/* a missing file */
	st = open_file("nope.krec");
	ASSERT_FAILS(st, KILN_ENOTFOUND, tpath("nope.krec"), "no such file");
	/* ... which the public open reports as the config's error (exit 2;
	 * KILN_EDATA, exit 3, before session 37), in the plugin's words */
	struct kiln_source *none = NULL;
	ck_assert_int_eq(kiln_source_open(cfg, reg, "data", "train", &none), KILN_ECONFIG);
	ck_assert_ptr_null(none);
	char want[1400];
	snprintf(want, sizeof want, "command line 'data.path=%s': [data] path: %s: no such file (the records data)",
		 tpath("nope.krec"), tpath("nope.krec"));
	ck_assert_str_eq(kiln_last_error(), want);
	free(img.data);
}
END_TEST

/* Shards are read in the order of their numbers: kiln pack's %05d names
 * pass 5 digits at shard 100000, where strcmp put train-100000 between
 * train-10000 and train-10001 (before session 29); a glob of the `shards`
 * list is ordered so too.  (Found by listing the directory, these five
 * of a numbered split lack 10002 .. 99998 inside their range: a data
 * error since session 33; the order is the same.) */
START_TEST(test_shard_number_order)
{
	static const char *const names[] = { "train-100000.krec", "train-10001.krec",
					     "train-99999.krec", "train-10000.krec",
					     "train-100001.krec" };
	/* the order to read them in: 10000 10001 99999 100000 100001 */
	static const int rank[] = { 3, 1, 2, 0, 4 };
	struct spec v[5];
	for (int k = 0; k < 5; k++) {
		fixed_specs(&v[rank[k]], 1, rank[k], REC_RAW);
		write_shard(names[k], &v[rank[k]], 1, 0);
	}
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	struct kiln_image img = { 0 };
	kiln_status st = open_src("data", "train", p, NULL);
	ck_assert_int_eq(st, KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "10002.krec is missing") != NULL, "%s", kiln_last_error());
	st = open_src("data", "train", p, "data.shards=train-*.krec", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 5);
	for (int i = 0; i < 5; i++)
		check_sample(i, &v[i], &img);
	free(img.data);
}
END_TEST

/* Shards kiln pack wrote since session 34 record their index, the split's
 * shard count and the pack's id (the set block): a split found by listing
 * a directory that lacks its last shard (no gap shows it) is refused
 * naming the file, and so are two packs mixed in a directory and one
 * shard read twice from a `shards` list; a listed subset is read, and
 * shards recording nothing (older ones, rec_writer's unstamped) as before. */
START_TEST(test_pack_set)
{
	struct spec v[3];
	char name[64], p[1100], want[1400];
	for (int k = 0; k < 3; k++) {
		fixed_specs(&v[k], 1, k, REC_RAW);
		snprintf(name, sizeof name, "train-%05d.krec", k);
		write_shard(name, &v[k], 1, 0);
		ck_assert_int_eq(rec_shard_stamp(host, tpath(name), (uint32_t)k, 3, 0x5eed), KILN_OK);
	}
	size_t n;
	uint8_t *b = read_whole("train-00001.krec", &n);
	ck_assert_int_eq(b[REC_MINOR_AT], REC_MINOR);
	ck_assert_uint_eq(rec_get32(b + 64), 1);
	ck_assert_uint_eq(rec_get32(b + 68), 3);
	ck_assert_uint_eq(rec_get32(b + 72), 0x5eed);
	ck_assert_uint_eq(rec_get64(b + 24) >= REC_SET_END, 1);
	snprintf(p, sizeof p, "data.path=%s", tmp);
	ck_assert_msg(open_src("data", "train", p, NULL) == KILN_OK, "%s", kiln_last_error());

	/* the last shard gone: before session 34 read as 2 samples */
	ck_assert_int_eq(rename(tpath("train-00002.krec"), tpath("keep.bin")), 0);
	snprintf(want, sizeof want, "%s is missing: the split's shards record a pack of 3 shard(s)",
		 tpath("train-00002.krec"));
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00002.krec"), want);
	/* the first and the last: the count names both */
	ck_assert_int_eq(rename(tpath("train-00000.krec"), tpath("keep0.bin")), 0);
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00000.krec"),
		     "(and 1 more shard(s)) is missing");
	/* a subset named in `shards` is read */
	ck_assert_msg(open_src("data", "train", p, "data.shards=train-00001.krec", NULL) == KILN_OK,
		      "%s", kiln_last_error());
	/* ... once */
	ASSERT_FAILS(open_src("data", "train", p, "data.shards=train-00001.krec, train-00001.krec",
			      NULL),
		     KILN_EDATA, tpath("train-00001.krec"), "are the same shard 1 of a pack of 3");
	ck_assert_int_eq(rename(tpath("keep0.bin"), tpath("train-00000.krec")), 0);

	/* another pack's last shard in its place: two packs */
	write_shard("train-00002.krec", &v[2], 1, 0);
	ck_assert_int_eq(rec_shard_stamp(host, tpath("train-00002.krec"), 2, 3, 0xbad), KILN_OK);
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00002.krec"),
		     "are of two different packs");
	/* an older shard (nothing recorded) among them: a mix too */
	write_shard("train-00002.krec", &v[2], 1, 0);
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00002.krec"),
		     "records no pack");
	/* restored: whole */
	ck_assert_int_eq(rename(tpath("keep.bin"), tpath("train-00002.krec")), 0);
	ck_assert_msg(open_src("data", "train", p, NULL) == KILN_OK, "%s", kiln_last_error());

	/* a corrupt set block, and an index not below the count (its CRC
	 * right: a buggy writer) */
	b[70] ^= 1;
	write_tmp("train-00001.krec", b, n);
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00001.krec"),
		     "set block CRC32C mismatch");
	b[70] ^= 1;
	rec_put32(b + 64, 3);
	rec_put32(b + 76, kiln_crc32c(0, b + 64, 12));
	write_tmp("train-00001.krec", b, n);
	ASSERT_FAILS(open_src("data", "train", p, NULL), KILN_EDATA, tpath("train-00001.krec"),
		     "the set block says shard 3 of 3");
	free(b);
}
END_TEST

/* Sizes and encodings vary from record to record. */
static const struct spec mixed[] = {
	{ 0, 3, 5, 7, 1, REC_RAW },   { 1, 0, 12, 9, 3, REC_PNG }, { 2, 1, 16, 16, 3, REC_JPEG },
	{ 3, 2, 1, 1, 1, REC_RAW },   { 4, 0, 3, 40, 3, REC_RAW }, { 5, 4, 8, 8, 1, REC_JPEG },
	{ 6, 1, 30, 2, 1, REC_PNG },  { 7, 2, 6, 6, 3, REC_RAW },
};
#define NMIXED ((int)(sizeof mixed / sizeof *mixed))

START_TEST(test_mixed_sizes)
{
	write_shard("m-00000.krec", mixed, 5, 0);
	write_shard("m-00001.krec", mixed + 5, NMIXED - 5, 0);
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	kiln_status st = open_src("data", "train", p, "data.split=m", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, NMIXED);
	ck_assert_int_eq(info.classes, 5);
	ck_assert_int_eq(info.image_h, 0);
	ck_assert_int_eq(info.image_w, 0);
	ck_assert_int_eq(info.image_c, 0);
	struct kiln_image img = { 0 };
	for (int i = 0; i < NMIXED; i++)
		check_sample(i, &mixed[i], &img);
	/* no fixed shape: read() of a sample is refused, of a label is fine */
	float x[4096];
	int32_t y;
	ck_assert_int_eq(ops->read(ctx, 0, x, &y), KILN_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "vary"));
	ck_assert_int_eq(ops->read(ctx, 6, NULL, &y), KILN_OK);
	ck_assert_int_eq(y, mixed[6].label);
	free(img.data);
}
END_TEST

struct reader {
	int64_t n;
	uint32_t *sums; /* per sample: CRC of pixels, label, size */
	int bad;
};

static uint32_t sample_sum(int64_t i, struct kiln_image *img)
{
	int32_t y = -1;
	if (ops->read_image(ctx, i, img, &y))
		return 0;
	int32_t meta[4] = { y, img->h, img->w, img->c };
	uint32_t c = host->crc32c(0, meta, sizeof meta);
	return host->crc32c(c, img->data, (size_t)img->h * img->w * img->c);
}

static void *read_all(void *arg)
{
	struct reader *r = arg;
	struct kiln_image img = { 0 };
	for (int rep = 0; rep < 100; rep++)
		for (int64_t k = 0; k < r->n; k++) {
			int64_t i = (k * 7 + rep) % r->n; /* a different order per pass */
			if (sample_sum(i, &img) != r->sums[i])
				r->bad++;
		}
	free(img.data);
	return NULL;
}

START_TEST(test_concurrent_reads)
{
	write_shard("train-00000.krec", mixed, NMIXED, 0);
	struct spec f[20];
	fixed_specs(f, 20, 50, REC_PNG);
	write_shard("train-00001.krec", f, 20, 0);
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tmp);
	ck_assert_int_eq(open_src("data", "train", p, NULL), KILN_OK);
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	uint32_t *sums = malloc((size_t)info.len * sizeof *sums);
	struct kiln_image img = { 0 };
	for (int64_t i = 0; i < info.len; i++) {
		sums[i] = sample_sum(i, &img);
		ck_assert_uint_ne(sums[i], 0);
	}
	free(img.data);
	pthread_t t[4];
	struct reader r[4];
	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){ info.len, sums, 0 };
		ck_assert_int_eq(pthread_create(&t[i], NULL, read_all, &r[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(r[i].bad, 0);
	}
	free(sums);
}
END_TEST

/* The keys are validated like every source's. */
/* How many lines of /proc/self/maps (mode 0) or links of /proc/self/fd
 * (mode 1) name `path`. */
static int self_refs(const char *path, int mode)
{
	int hits = 0;
	if (mode == 0) {
		FILE *f = fopen("/proc/self/maps", "r");
		char line[1400];
		while (f && fgets(line, sizeof line, f))
			hits += strstr(line, path) != NULL;
		if (f)
			fclose(f);
		return hits;
	}
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char link[300], to[1200];
		snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(link, to, sizeof to - 1);
		if (n > 0) {
			to[n] = 0;
			hits += !strcmp(to, path);
		}
	}
	if (d)
		closedir(d);
	return hits;
}

/* A shard is mapped, its descriptor closed at open: a record's read is a
 * copy from memory, no system call.  Session 38 read each record with
 * preadv() (the shard kept open) to make a truncation in place an error
 * rather than SIGBUS: the call and its page-cache lookup cost about 1 us a
 * record against 0.15 us, and the records example lost 35% of its
 * samples/s on a quiet 2-core VM (docs/PERFORMANCE.md); the hazard is
 * documented instead (docs/data.md). */
START_TEST(test_read_through_mapping)
{
	struct spec v[7];
	fixed_specs(v, 7, 0, REC_RAW);
	write_shard("m.krec", v, 7, 0);
	char real[1200];
	ck_assert_ptr_nonnull(realpath(tpath("m.krec"), real));
	ck_assert_int_eq(open_file("m.krec"), KILN_OK);
	ck_assert_msg(self_refs(real, 0) >= 1, "%s is not mapped", real);
	ck_assert_msg(self_refs(real, 1) == 0, "%s is held open", real);
	struct kiln_image img = { 0 };
	for (int i = 0; i < 7; i++)
		check_sample(i, &v[i], &img);
	free(img.data);
	ops->close(ctx);
	ctx = NULL;
	ck_assert_int_eq(self_refs(real, 0), 0); /* close unmaps */
}
END_TEST

START_TEST(test_keys_validated)
{
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.source=records"), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.shard=x"), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "shards"));
	kiln_config_free(cfg);
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.source=records"), KILN_OK);
	ck_assert_int_eq(kiln_config_override(cfg, "data.images=x"), KILN_OK); /* idx's key */
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
}
END_TEST

/* ---- corrupt shards ---------------------------------------------------- */

/* The small valid shard the corruption tests start from: 3 records of
 * differing lengths.  Returns its bytes (malloc()ed). */
static uint8_t *small_shard(size_t *n)
{
	struct spec v[3] = { { 0, 1, 4, 3, 1, REC_RAW }, { 1, 0, 5, 5, 1, REC_RAW },
			     { 2, 2, 2, 3, 3, REC_RAW } };
	write_shard("small.krec", v, 3, 0);
	return read_whole("small.krec", n);
}

START_TEST(test_header_and_index_flips)
{
	size_t n;
	uint8_t *good = small_shard(&n), *m = malloc(n);
	uint64_t index_at = rec_get64(good + 24);
	ck_assert_uint_eq(index_at + 3 * 16 + 4, n);
	static const uint8_t flips[] = { 0x01, 0x80, 0xff };
	for (size_t at = 0; at < n; at++) {
		if (at == REC_HEADER_BYTES)
			at = index_at; /* records: test_record_flips */
		for (size_t f = 0; f < sizeof flips; f++) {
			memcpy(m, good, n);
			m[at] ^= flips[f];
			write_tmp("m.krec", m, n);
			kiln_status st = open_file("m.krec");
			const char *e = kiln_last_error();
			ck_assert_msg(st == KILN_EDATA, "byte %zu ^ 0x%02x: status %s (%s)", at, flips[f],
				      kiln_status_name(st), e);
			ck_assert_ptr_null(ctx);
			ck_assert_msg(strstr(e, tpath("m.krec")) != NULL, "byte %zu: %s", at, e);
			const char *want = at < 8 ? "magic" : at < 12 ? "version" :
					   at < REC_HEADER_BYTES ? "header CRC32C mismatch" :
					   "index CRC32C mismatch";
			ck_assert_msg(strstr(e, want) != NULL, "byte %zu ^ 0x%02x: '%s' lacks '%s'", at,
				      flips[f], e, want);
		}
	}
	/* the version message tells a newer file from a damaged one */
	memcpy(m, good, n);
	m[8] = 2;
	rec_put32(m + REC_HEADER_CRC_AT, host->crc32c(0, m, REC_HEADER_CRC_AT));
	write_tmp("m.krec", m, n);
	ASSERT_FAILS(open_file("m.krec"), KILN_EDATA, tpath("m.krec"), "version 2");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "newer kiln"));
	free(m);
	free(good);
}
END_TEST

START_TEST(test_record_flips)
{
	size_t n;
	uint8_t *good = small_shard(&n), *m = malloc(n);
	struct kiln_image img = { 0 };
	const uint8_t *e1 = good + rec_get64(good + 24) + REC_INDEX_ENTRY; /* record 1's entry */
	uint64_t off = rec_get64(e1);
	uint32_t len = rec_get32(e1 + 8);
	for (uint64_t at = off; at < off + len; at++) {
		memcpy(m, good, n);
		m[at] ^= 0x10;
		write_tmp("m.krec", m, n);
		ck_assert_msg(open_file("m.krec") == KILN_OK, "%s", kiln_last_error());
		int32_t y;
		ck_assert_int_eq(ops->read_image(ctx, 0, &img, &y), KILN_OK);
		ck_assert_int_eq(ops->read_image(ctx, 2, &img, &y), KILN_OK);
		kiln_status st = ops->read_image(ctx, 1, &img, &y);
		const char *e = kiln_last_error();
		ck_assert_msg(st == KILN_EDATA, "byte %llu: %s %s", (unsigned long long)at,
			      kiln_status_name(st), e);
		ck_assert_msg(strstr(e, tpath("m.krec")) && strstr(e, "record 1:"), "%s", e);
		/* 16..19 is the payload length; the rest fails the CRC */
		const char *want = at - off >= 16 && at - off < 20 ? "payload length" : "CRC32C mismatch";
		ck_assert_msg(strstr(e, want) != NULL, "byte %llu: '%s' lacks '%s'",
			      (unsigned long long)at, e, want);
		ck_assert_int_eq(ops->read(ctx, 1, NULL, &y), KILN_EDATA);
	}
	free(img.data);
	free(m);
	free(good);
}
END_TEST

START_TEST(test_truncation)
{
	size_t n;
	uint8_t *good = small_shard(&n);
	for (size_t len = 0; len < n; len++) {
		write_tmp("m.krec", good, len);
		kiln_status st = open_file("m.krec");
		const char *e = kiln_last_error();
		ck_assert_msg(st == KILN_EDATA, "length %zu: %s (%s)", len, kiln_status_name(st), e);
		ck_assert_ptr_null(ctx);
		const char *want = len == 0 ? "empty" : len < REC_HEADER_BYTES ? "truncated header" :
				   "truncated";
		ck_assert_msg(strstr(e, want) && strstr(e, tpath("m.krec")), "length %zu: %s", len, e);
	}
	/* a byte appended */
	uint8_t *longer = malloc(n + 1);
	memcpy(longer, good, n);
	longer[n] = 0;
	write_tmp("m.krec", longer, n + 1);
	ASSERT_FAILS(open_file("m.krec"), KILN_EDATA, tpath("m.krec"), "1 bytes follow");
	free(longer);
	free(good);
}
END_TEST

START_TEST(test_wrong_magic)
{
	/* an IDX image file where a shard should be */
	uint8_t idx[16 + 80] = { 0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 4 };
	write_tmp("m.krec", idx, sizeof idx);
	ASSERT_FAILS(open_file("m.krec"), KILN_EDATA, tpath("m.krec"), "wrong magic");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "00 00 08 03"));
	/* a few bytes: still "magic" when there are 8, else truncated */
	write_tmp("m.krec", "KILNREX", 8);
	ASSERT_FAILS(open_file("m.krec"), KILN_EDATA, tpath("m.krec"), "wrong magic");
	write_tmp("m.krec", "KILN", 4);
	ASSERT_FAILS(open_file("m.krec"), KILN_EDATA, tpath("m.krec"), "truncated header");
	/* a directory */
	ck_assert_int_eq(mkdir(tpath("d.krec"), 0700), 0);
	ASSERT_FAILS(open_file("d.krec"), KILN_EIO, "d.krec", "no shards"); /* a dir: searched */
}
END_TEST

/* mmap() failing with ENOMEM (forced here with an address-space limit below
 * a sparse 8 GiB shard; with many shards it is vm.max_map_count that runs
 * out) says what to raise: vm.max_map_count, with its value now, and the
 * split's shard count (before session 30 the message only named it). */
START_TEST(test_map_enomem_names_max_map_count)
{
	char p[1100], want[128];
	snprintf(p, sizeof p, "%s", tpath("big.krec"));
	FILE *f = fopen(p, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(ftruncate(fileno(f), (off_t)8 << 30), 0);
	fclose(f);
	long vm_kib = 0, max = 0;
	char line[256];
	FILE *st = fopen("/proc/self/status", "r");
	ck_assert_ptr_nonnull(st);
	while (fgets(line, sizeof line, st))
		sscanf(line, "VmSize: %ld kB", &vm_kib);
	fclose(st);
	FILE *mm = fopen("/proc/sys/vm/max_map_count", "r");
	ck_assert_ptr_nonnull(mm);
	ck_assert_int_eq(fscanf(mm, "%ld", &max), 1);
	fclose(mm);
	ck_assert_int_gt(vm_kib, 0);
	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = ((rlim_t)vm_kib << 10) + ((rlim_t)1 << 30); /* 1 GiB of room */
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
	kiln_status s_ = open_file("big.krec");
	setrlimit(RLIMIT_AS, &old);
	ck_assert_ptr_null(ctx);
	snprintf(want, sizeof want, "raise vm.max_map_count (now %ld)", max);
	ck_assert_msg(s_ == KILN_ENOMEM, "%s: %s", kiln_status_name(s_), kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), tpath("big.krec")), "%s", kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), "Each of the split's 1 shard(s) is one memory mapping"),
		      "%s", kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), want), "no '%s' in: %s", want, kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), "sysctl -w vm.max_map_count="), "%s", kiln_last_error());
}
END_TEST

/* Corrupt but CRC-consistent files: what a buggy writer could produce. */
static void refresh_crcs(uint8_t *b, size_t n);

START_TEST(test_consistent_but_invalid)
{
	size_t n;
	uint8_t *good = small_shard(&n), *m = malloc(n);
	uint64_t index_at = rec_get64(good + 24);
	uint64_t off1 = rec_get64(good + index_at + 16);
	static const struct {
		size_t at;      /* 0: header; else relative to record 1 (+1000) or entry 1 (+2000) */
		int size;       /* 1 or 4 bytes */
		uint32_t value;
		int at_open;    /* refused at open (else at read of record 1) */
		const char *want;
	} cases[] = {
		{ 12, 4, 128, 1, "header size 128" },
		{ 40, 4, 1, 1, "unknown header flags" },
		{ 44, 4, 0, 1, "0 classes" },
		/* (before session 33 accepted: the run asked for out = 4294967295) */
		{ 44, 4, 0xffffffffu, 1, "the header declares 4294967295 classes, more than a label (i32) can name" },
		{ 44, 4, 0x80000000u, 1, "the header declares 2147483648 classes" },
		{ 56, 1, 2, 1, "image size" },
		{ 48, 4, 7, 1, "image size" }, /* h without w */
		{ 2000, 4, 12, 1, "not a multiple of 8" },
		{ 2000, 4, 8, 1, "inside the previous record" },
		{ 2008, 4, 3, 1, "shorter than a record header" },
		{ 2008, 4, 100000, 1, "extends past the records area" },
		{ 1000, 4, 0xffffffffu, 0, "negative label -1" },
		{ 1000, 4, 3, 0, "label 3 is out of range: the shard declares 3 classes" },
		{ 1004, 4, 0, 0, "invalid image size" },
		{ 1012, 1, 2, 0, "invalid image size" },
		{ 1013, 1, 7, 0, "unknown encoding 7" },
		{ 1013, 1, REC_PNG, 0, "not a JPEG or PNG image" },
		{ 1004, 4, 4, 0, "raw payload of 25 bytes for a 4x5x1 image" },
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		memcpy(m, good, n);
		size_t at = cases[k].at >= 2000 ? index_at + 16 + cases[k].at - 2000 :
			    cases[k].at >= 1000 ? off1 + cases[k].at - 1000 : cases[k].at;
		if (cases[k].size == 1)
			m[at] = (uint8_t)cases[k].value;
		else
			rec_put32(m + at, cases[k].value);
		refresh_crcs(m, n);
		write_tmp("m.krec", m, n);
		kiln_status st = open_file("m.krec");
		if (!cases[k].at_open) {
			ck_assert_msg(st == KILN_OK, "case %zu: %s", k, kiln_last_error());
			struct kiln_image img = { 0 };
			int32_t y;
			st = ops->read_image(ctx, 1, &img, &y);
			free(img.data);
			ck_assert_msg(strstr(kiln_last_error(), "record 1"), "case %zu: %s", k,
				      kiln_last_error());
		}
		const char *e = kiln_last_error();
		ck_assert_msg(st == KILN_EDATA, "case %zu: %s (%s)", k, kiln_status_name(st), e);
		ck_assert_msg(strstr(e, cases[k].want) && strstr(e, tpath("m.krec")),
			      "case %zu: '%s' lacks '%s'", k, e, cases[k].want);
	}
	free(m);
	free(good);
}
END_TEST

/* ---- fuzz -------------------------------------------------------------- */

/* Recompute every CRC that can be found (header, index, records) so that
 * a mutation gets past the checksums to the checks behind them.  Trusts
 * nothing: each offset is bounds-checked first. */
static void refresh_crcs(uint8_t *b, size_t n)
{
	if (n < REC_HEADER_BYTES)
		return;
	uint64_t count = rec_get64(b + 16), index_at = rec_get64(b + 24);
	if (index_at <= n && count <= (n - index_at) / REC_INDEX_ENTRY &&
	    n - index_at - count * REC_INDEX_ENTRY >= 4) {
		for (uint64_t i = 0; i < count; i++) {
			const uint8_t *e = b + index_at + i * REC_INDEX_ENTRY;
			uint64_t off = rec_get64(e);
			if (off < REC_HEADER_BYTES || off > n || n - off < REC_RECORD_HEADER)
				continue;
			uint32_t pl = rec_get32(b + off + 16);
			if (pl > n - off - REC_RECORD_HEADER)
				continue;
			uint32_t c = host->crc32c(0, b + off, REC_RECORD_CRC_AT);
			rec_put32(b + off + REC_RECORD_CRC_AT,
				  host->crc32c(c, b + off + REC_RECORD_HEADER, pl));
		}
		uint8_t *crc = b + index_at + count * REC_INDEX_ENTRY;
		rec_put32(crc, host->crc32c(0, b + index_at, (size_t)(count * REC_INDEX_ENTRY)));
	}
	rec_put32(b + REC_HEADER_CRC_AT, host->crc32c(0, b, REC_HEADER_CRC_AT));
}

static size_t mutate(uint8_t *dst, const uint8_t *src, size_t n, uint64_t index_at)
{
	memcpy(dst, src, n);
	switch (next() % 6) {
	case 0: /* truncate */
		return next() % n;
	case 1: /* flip 1..4 bytes anywhere */
		for (int k = 1 + (int)(next() % 4); k > 0; k--)
			dst[next() % n] ^= (uint8_t)(1 + next() % 255);
		return n;
	case 2: /* a random word in the header */
		rec_put32(dst + 4 * (next() % 15), next() ^ (next() << 21));
		return n;
	case 3: /* a random or nearby word in the index */
	{
		size_t at = index_at + 4 * (next() % ((n - index_at) / 4));
		uint32_t v = rec_get32(dst + at);
		rec_put32(dst + at, next() % 2 ? v + next() % 64 - 32 : next());
		return n;
	}
	case 4: /* a small change to a record header field */
	{
		size_t at = REC_HEADER_BYTES + 4 * (next() % ((index_at - REC_HEADER_BYTES) / 4));
		dst[at] = (uint8_t)(dst[at] + 1 + next() % 3);
		return n;
	}
	default: /* flip and truncate */
		dst[next() % n] ^= 0x80;
		return n - next() % (n / 2 + 1);
	}
}

START_TEST(test_fuzz)
{
	/* a shard of every encoding and several sizes */
	write_shard("base.krec", mixed, NMIXED, 0);
	size_t n;
	uint8_t *good = read_whole("base.krec", &n), *m = malloc(n);
	uint64_t index_at = rec_get64(good + 24);
	struct kiln_image img = { 0 };
	int opened = 0, refused = 0, bad_reads = 0;
	for (int it = 0; it < 2000; it++) {
		size_t len = mutate(m, good, n, index_at);
		if (it % 2)
			refresh_crcs(m, len); /* half of them get past the CRCs */
		write_tmp("m.krec", m, len);
		kiln_status st = open_file("m.krec");
		if (st != KILN_OK) {
			ck_assert_msg(st == KILN_EDATA || st == KILN_EIO, "iteration %d: %s: %s", it,
				      kiln_status_name(st), kiln_last_error());
			ck_assert_ptr_null(ctx);
			ck_assert_ptr_nonnull(strstr(kiln_last_error(), tmp));
			refused++;
			continue;
		}
		opened++;
		struct kiln_source_info info;
		ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
		ck_assert_int_le(info.len, NMIXED);
		for (int64_t i = 0; i < info.len; i++) {
			int32_t y = -1;
			st = ops->read_image(ctx, i, &img, &y);
			if (st == KILN_OK) {
				ck_assert(y >= 0 && y < info.classes);
				ck_assert(img.h > 0 && img.w > 0 && (img.c == 1 || img.c == 3));
			} else {
				ck_assert_msg(st == KILN_EDATA, "iteration %d: %s: %s", it,
					      kiln_status_name(st), kiln_last_error());
				ck_assert_ptr_nonnull(strstr(kiln_last_error(), "record"));
				bad_reads++;
			}
			float *x = info.image_h && info.image_c ? malloc(kiln_tensor_bytes(&info.sample)) : NULL;
			st = ops->read(ctx, i, x, &y);
			ck_assert(st == KILN_OK || st == KILN_EDATA);
			free(x);
		}
		ops->close(ctx);
		ctx = NULL;
	}
	fprintf(stderr, "check_records: fuzz: %d mutations opened, %d refused at open, %d record reads refused\n",
		opened, refused, bad_reads);
	ck_assert_int_gt(refused, 500);
	ck_assert_int_gt(opened, 100);
	ck_assert_int_gt(bad_reads, 50);
	free(img.data);
	free(m);
	free(good);
}
END_TEST

/* A label past the shard's class count in a CRC-consistent record (what
 * a buggy writer could store; kiln pack stores max label + 1 at least)
 * never reaches the loss: `kiln train` ends with exit 3 and the error
 * naming the file and the record, read on the training thread (workers =
 * 0) and in the loader's workers (2), whose error travels to the trainer. */
START_TEST(test_label_out_of_range_train)
{
	struct spec v[4];
	for (int i = 0; i < 4; i++)
		v[i] = (struct spec){ i, i % 3, 4, 3, 1, REC_RAW };
	write_shard("lab.krec", v, 4, 3);
	size_t n;
	uint8_t *b = read_whole("lab.krec", &n);
	const uint8_t *e2 = b + rec_get64(b + 24) + 2 * REC_INDEX_ENTRY; /* record 2's entry */
	rec_put32(b + rec_get64(e2), 7);
	refresh_crcs(b, n);
	write_tmp("lab.krec", b, n);
	free(b);
	char ini[2048], cmd[4096], want[1200];
	int len = snprintf(ini, sizeof ini, "[data]\nsource = records\npath = %s\n[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 3\n[layer.loss]\ntype = softmax_xent\n[train]\nepochs = 1\nbatch = 2\neval = 0\n",
			   tpath("lab.krec"));
	write_tmp("lab.ini", ini, (size_t)len);
	snprintf(want, sizeof want, "%s: record 2: label 7 is out of range: the shard declares 3 classes",
		 tpath("lab.krec"));
	for (int workers = 0; workers <= 2; workers += 2) {
		snprintf(cmd, sizeof cmd, "'%s' train '%s' run.out_dir= data.workers=%d >'%s' 2>&1",
			 KILN_BIN, tpath("lab.ini"), workers, tpath("lab.log"));
		int rc = system(cmd);
		size_t ln;
		uint8_t *log = read_whole("lab.log", &ln);
		log[ln] = 0;
		ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 3, "workers %d: status %d: %s",
			      workers, rc, (char *)log);
		ck_assert_msg(strstr((char *)log, want), "workers %d: no '%s' in: %s", workers, want,
			      (char *)log);
		free(log);
	}
}
END_TEST

/* ---- Fashion-MNIST through kiln pack ------------------------------------- */

START_TEST(test_fashion_mnist_pack)
{
	if (access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK)) {
		fprintf(stderr, "check_records: %s absent, skipping the Fashion-MNIST case\n",
			FMNIST_DIR);
		return;
	}
	write_tmp("pack.ini", "[data]\nsource = idx\n", 20);
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "'%s' pack '%s' --section data.eval --store raw --out '%s' >'%s' 2>&1",
		 KILN_BIN, tpath("pack.ini"), tpath("out"), tpath("pack.log"));
	int rc = system(cmd);
	size_t ln;
	uint8_t *log = read_whole("pack.log", &ln);
	log[ln] = 0;
	ck_assert_msg(rc == 0, "kiln pack: status %d: %s", rc, (char *)log);
	ck_assert_msg(strstr((char *)log, "packed 10000 samples into 1 shard(s)"), "%s", (char *)log);
	free(log);
	ck_assert_int_eq(access(tpath("out/test-00000.krec"), R_OK), 0);

	/* the records source ([data.eval] inherits the directory) against idx */
	char p[1100];
	snprintf(p, sizeof p, "data.path=%s", tpath("out"));
	kiln_status st = open_src("data.eval", "test", p, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 10000);
	ck_assert_int_eq(info.classes, 10);
	ck_assert_int_eq(info.image_h, 28);
	ck_assert_int_eq(info.image_w, 28);
	ck_assert_int_eq(info.image_c, 1);

	const struct kiln_plugin *ip;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "idx", &ip), KILN_OK);
	const struct kiln_source_ops *iops = ip->ops;
	struct kiln_config *icfg;
	void *ictx;
	ck_assert_int_eq(kiln_config_new(&icfg), KILN_OK);
	ck_assert_int_eq(kiln_config_validate(icfg, reg), KILN_OK);
	ck_assert_int_eq(iops->open(host, icfg, "data.eval", "test", &ictx), KILN_OK);
	struct kiln_image a = { 0 }, b = { 0 };
	for (int64_t i = 0; i < info.len; i++) {
		int32_t ya = -1, yb = -2;
		ck_assert_int_eq(ops->read_image(ctx, i, &a, &ya), KILN_OK);
		ck_assert_int_eq(iops->read_image(ictx, i, &b, &yb), KILN_OK);
		ck_assert_int_eq(ya, yb);
		ck_assert_int_eq(a.h, b.h);
		ck_assert_int_eq(a.w, b.w);
		ck_assert_int_eq(a.c, b.c);
		ck_assert_msg(!memcmp(a.data, b.data, (size_t)a.h * a.w * a.c), "sample %lld differs",
			      (long long)i);
	}
	/* read(): the same f32 tensor as idx with mean 0, std 1 */
	float xa[784], xb[784];
	for (int64_t i = 0; i < 100; i++) {
		int32_t ya, yb;
		ck_assert_int_eq(ops->read(ctx, i, xa, &ya), KILN_OK);
		ck_assert_int_eq(iops->read(ictx, i, xb, &yb), KILN_OK);
		ck_assert(!memcmp(xa, xb, sizeof xa) && ya == yb);
	}
	free(a.data);
	free(b.data);
	iops->close(ictx);
	kiln_config_free(icfg);
}
END_TEST

static Suite *make_records_suite(void)
{
	Suite *s = suite_create("records");
	check_add_case(s, "crc32c", 0, setup, teardown, (const TTest *[]){ test_crc32c, NULL });

	check_add_case(s, "valid", 0, setup, teardown, (const TTest *[]){
		test_raw_roundtrip, test_png_roundtrip, test_jpeg_roundtrip, test_multi_shards,
		test_mixed_sizes, test_concurrent_reads, test_keys_validated,
		test_shard_number_order, test_pack_set, test_read_through_mapping, NULL });

	check_add_case(s, "corrupt", 60, setup, teardown, (const TTest *[]){
		test_header_and_index_flips, test_record_flips, test_truncation, test_wrong_magic,
		test_consistent_but_invalid, test_map_enomem_names_max_map_count, NULL });

	check_add_case(s, "train", 120, setup, teardown, (const TTest *[]){
		test_label_out_of_range_train, NULL });

	check_add_case(s, "fuzz", 120, setup, teardown, (const TTest *[]){ test_fuzz, NULL });

	check_add_case(s, "fashion_mnist", 120, setup, teardown, (const TTest *[]){
		test_fashion_mnist_pack, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_records_suite };
