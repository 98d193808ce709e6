/* tests/check_sources.c - the image sources of kiln-loaders.so: folder,
 * tar, lmdb and synthetic.
 *
 * Every test builds its fixtures at run time in its own temporary
 * directory: PNG and JPEG files written with img_encode_png/_jpeg
 * (plugins/loaders/image.c is linked in), tar archives written block by
 * block here (ustar headers, GNU long names, pax headers), LMDB
 * environments written with liblmdb.  Sources are opened through the core
 * exactly as a run does: registry -> plugin -> config validated against its
 * keys -> ops->open.  Checked: sample count and order, class assignment,
 * labels, decoded pixels (exact for PNG, within a few levels for JPEG at
 * quality 95), reads from 4 threads equal to serial reads, and corrupt or
 * missing inputs giving the right status with a message naming the file.
 * A fuzz case mutates a valid tar 2000 times; Check forks each test, so a
 * crash fails it.
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "../plugins/loaders/image.h"

#include <check.h>
#include "check_main.h"
#include "source_fixture.h"
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixtures ---------------------------------------------------------- */

static void setup(void)
{
	source_setup("src");
}

static void use(const char *source)
{
	source_find(source);
	ck_assert_uint_ge(ops->version, 2);
	/* image sources decode; seq2seq reads token samples */
	ck_assert(ops->read_image != NULL || (ops->read != NULL && !strcmp(source, "seq2seq")));
}

/* ---- files ------------------------------------------------------------- */

/* mkdir -p of tmp/rel's directory part (or of rel itself when dir). */
static void mkdirs(const char *rel, int dir)
{
	char p[1024];
	snprintf(p, sizeof p, "%s/%s", tmp, rel);
	size_t tl = strlen(tmp);
	for (char *s = p + tl + 1; *s; s++)
		if (*s == '/') {
			*s = 0;
			mkdir(p, 0700);
			*s = '/';
		}
	if (dir)
		mkdir(p, 0700);
}

static void write_raw(const char *name, const void *buf, size_t n)
{
	mkdirs(name, 0);
	/* a new file, not a truncated one: ext4 flushes files rewritten in
	 * place on close (auto_da_alloc), which makes the fuzz loop slow */
	remove(tpath(name));
	FILE *f = fopen(tpath(name), "wb");
	ck_assert_msg(f != NULL, "cannot write %s", tpath(name));
	ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* ---- images ------------------------------------------------------------ */

#define FMT_PNG 0
#define FMT_JPEG 1
#define JPEG_TOL 8 /* max level difference at quality 95 on smooth images */

/* A smooth image (JPEG-friendly) that differs with the seed. */
static void gen(uint8_t *px, int h, int w, int c, int seed)
{
	for (int y = 0; y < h; y++)
		for (int x = 0; x < w; x++)
			for (int ch = 0; ch < c; ch++)
				px[(y * w + x) * c + ch] = (uint8_t)(20 + x * 70 / w + y * 70 / h +
								     (seed * 37) % 40 + ch * 15);
}

/* Encode the seed's image; *out malloc()ed. */
static void encode(int fmt, int h, int w, int c, int seed, uint8_t **out, size_t *n)
{
	uint8_t px[64 * 64 * 3];
	ck_assert_int_le(h * w * c, (int)sizeof px);
	gen(px, h, w, c, seed);
	kiln_status st = fmt == FMT_PNG ? img_encode_png(kiln_host_table(), px, h, w, c, out, n) :
					  img_encode_jpeg(kiln_host_table(), px, h, w, c, 95, out, n);
	ck_assert_msg(st == KILN_OK, "encode: %s", kiln_last_error());
}

static void write_image(const char *name, int fmt, int h, int w, int c, int seed)
{
	uint8_t *b;
	size_t n;
	encode(fmt, h, w, c, seed, &b, &n);
	write_raw(name, b, n);
	free(b);
}

/* The decoded image equals the seed's pixels (exactly for PNG). */
static void check_image(const struct kiln_image *img, int fmt, int h, int w, int c, int seed,
			const char *what)
{
	uint8_t px[64 * 64 * 3];
	ck_assert_msg(img->h == h && img->w == w && img->c == c, "%s: %dx%dx%d, expected %dx%dx%d",
		      what, img->h, img->w, img->c, h, w, c);
	ck_assert_uint_ge(img->cap, (size_t)h * w * c);
	gen(px, h, w, c, seed);
	int tol = fmt == FMT_PNG ? 0 : JPEG_TOL, worst = 0;
	for (int i = 0; i < h * w * c; i++) {
		int d = abs((int)img->data[i] - (int)px[i]);
		if (d > worst)
			worst = d;
	}
	ck_assert_msg(worst <= tol, "%s: pixels differ by up to %d (tolerance %d)", what, worst, tol);
}

/* ---- opening ----------------------------------------------------------- */

/* Build and validate a config from "section.key=value" overrides (NULL-
 * terminated) plus data.source=source, then open [section].  Returns
 * open's status. */
static kiln_status open_src(const char *source, const char *section, const char *split, ...)
{
	va_list ap;
	use(source);
	if (ctx)
		ops->close(ctx);
	ctx = NULL;
	va_start(ap, split);
	source_config(source, ap);
	va_end(ap);
	kiln_clear_error();
	return ops->open(kiln_host_table(), cfg, section, split, &ctx);
}

/* "data.path=<tmp>/<rel>" in a rotating static buffer. */
static const char *kv(const char *key, const char *rel)
{
	static char buf[8][1100];
	static int k;
	char *b = buf[k++ & 7];
	if (rel[0] == '/')
		snprintf(b, sizeof buf[0], "%s=%s", key, rel);
	else
		snprintf(b, sizeof buf[0], "%s=%s/%s", key, tmp, rel);
	return b;
}

#define ASSERT_ERR(st, want, file, word)                                                     \
	do {                                                                                 \
		kiln_status st_ = (st);                                                      \
		const char *e_ = kiln_last_error();                                          \
		ck_assert_msg(st_ == (want), "status %s, expected %s (%s)",                  \
			      kiln_status_name(st_), kiln_status_name(want), e_);            \
		ck_assert_msg(strstr(e_, (file)) != NULL, "message lacks '%s': %s", (file),  \
			      e_);                                                           \
		ck_assert_msg(strstr(e_, (word)) != NULL, "message lacks '%s': %s", (word),  \
			      e_);                                                           \
	} while (0)

/* open() failed: ctx stays NULL. */
#define ASSERT_OPEN_FAILS(st, want, file, word)                                              \
	do {                                                                                 \
		ASSERT_ERR(st, want, file, word);                                            \
		ck_assert_ptr_null(ctx);                                                     \
	} while (0)

static void close_src(void)
{
	if (ctx)
		ops->close(ctx);
	ctx = NULL;
}

static struct kiln_source_info info_of(void)
{
	struct kiln_source_info info;
	memset(&info, 0xab, sizeof info);
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.label.dtype, KILN_I32);
	ck_assert_int_eq(info.label.ndim, 0);
	return info;
}

/* info of a source whose image sizes vary. */
static void check_varying_info(int64_t len, int64_t classes)
{
	struct kiln_source_info info = info_of();
	ck_assert_int_eq(info.len, len);
	ck_assert_int_eq(info.classes, classes);
	ck_assert_int_eq(info.sample.ndim, 0);
	ck_assert_int_eq(info.image_h, 0);
	ck_assert_int_eq(info.image_w, 0);
	ck_assert_int_eq(info.image_c, 0);
}

/* Read sample i; returns the status, image in *img. */
static kiln_status read_one(int64_t i, struct kiln_image *img, int32_t *label)
{
	kiln_clear_error();
	return ops->read_image(ctx, i, img, label);
}

/* The expected content of one sample. */
struct want {
	int fmt, h, w, c, seed;
	int32_t label;
};

static void check_all(const struct want *w, int n)
{
	struct kiln_image img = { 0 };
	for (int i = 0; i < n; i++) {
		int32_t y = -1;
		char what[64];
		kiln_status st = read_one(i, &img, &y);
		ck_assert_msg(st == KILN_OK, "sample %d: %s", i, kiln_last_error());
		ck_assert_msg(y == w[i].label, "sample %d: label %d, expected %d", i, y, w[i].label);
		snprintf(what, sizeof what, "sample %d", i);
		check_image(&img, w[i].fmt, w[i].h, w[i].w, w[i].c, w[i].seed, what);
	}
	/* out of range */
	int32_t y;
	ck_assert_int_eq(read_one(n, &img, &y), KILN_EINVAL);
	ck_assert_int_eq(read_one(-1, &img, &y), KILN_EINVAL);
	free(img.data);
}

/* ---- concurrency -------------------------------------------------------- */

struct serial {
	int64_t n;
	uint8_t **px;
	size_t *bytes;
	int32_t *label;
};

struct worker {
	const struct serial *ref;
	int id, bad;
	char err[256];
};

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	struct kiln_image img = { 0 };
	const struct serial *r = w->ref;
	for (int rep = 0; rep < 6; rep++)
		for (int64_t k = 0; k < r->n; k++) {
			/* a different order in every thread */
			int64_t i = (k * 7 + w->id * 3 + rep) % r->n;
			int32_t y = -1;
			kiln_status st = ops->read_image(ctx, i, &img, &y);
			size_t b = (size_t)img.h * img.w * img.c;
			if (st || y != r->label[i] || b != r->bytes[i] || memcmp(img.data, r->px[i], b)) {
				if (!w->bad++)
					snprintf(w->err, sizeof w->err, "sample %lld: %s", (long long)i,
						 st ? kiln_last_error() : "differs from the serial read");
			}
		}
	free(img.data);
	return NULL;
}

/* Read every sample serially, then from 4 threads at once: same bytes. */
static void check_concurrent(void)
{
	struct kiln_source_info info = info_of();
	struct serial r = { info.len, calloc((size_t)info.len, sizeof(uint8_t *)),
			    calloc((size_t)info.len, sizeof(size_t)),
			    calloc((size_t)info.len, sizeof(int32_t)) };
	struct kiln_image img = { 0 };
	for (int64_t i = 0; i < r.n; i++) {
		ck_assert_int_eq(read_one(i, &img, &r.label[i]), KILN_OK);
		r.bytes[i] = (size_t)img.h * img.w * img.c;
		r.px[i] = malloc(r.bytes[i]);
		memcpy(r.px[i], img.data, r.bytes[i]);
	}
	free(img.data);
	pthread_t t[4];
	struct worker w[4];
	for (int i = 0; i < 4; i++) {
		memset(&w[i], 0, sizeof w[i]);
		w[i].ref = &r;
		w[i].id = i;
		ck_assert_int_eq(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(w[i].bad == 0, "thread %d: %d bad reads; first: %s", i, w[i].bad,
			      w[i].err);
	}
	for (int64_t i = 0; i < r.n; i++)
		free(r.px[i]);
	free(r.px);
	free(r.bytes);
	free(r.label);
}

/* ======================================================================
 * folder
 * ====================================================================== */

struct fimg {
	const char *rel;
	int fmt, h, w, c;
	int32_t label;
};

/* In torchvision's order: per class, directories sorted by path, files
 * sorted by name within each (so cat/zz.png precedes cat/sub/c.png). */
static const struct fimg folder_train[] = {
	{ "cat/Z.PNG", FMT_PNG, 5, 7, 3, 0 },
	{ "cat/a.jpg", FMT_JPEG, 8, 6, 1, 0 },
	{ "cat/b.jpeg", FMT_JPEG, 9, 9, 3, 0 },
	{ "cat/zz.png", FMT_PNG, 4, 6, 1, 0 },
	{ "cat/sub/c.png", FMT_PNG, 4, 4, 1, 0 },
	{ "cat/sub2/deep/d.Png", FMT_PNG, 3, 5, 3, 0 },
	{ "dog/1.png", FMT_PNG, 6, 6, 3, 1 },
	{ "zebra/z.jpg", FMT_JPEG, 10, 12, 3, 3 },
};
#define N_FOLDER ((int)(sizeof folder_train / sizeof folder_train[0]))

static void make_folder(const char *root)
{
	char p[512];
	for (int i = 0; i < N_FOLDER; i++) {
		const struct fimg *f = &folder_train[i];
		snprintf(p, sizeof p, "%s/%s", root, f->rel);
		write_image(p, f->fmt, f->h, f->w, f->c, i);
	}
	/* not images, or formats we skip; an empty class; a file at the root */
	snprintf(p, sizeof p, "%s/cat/notes.txt", root);
	write_raw(p, "hello", 5);
	snprintf(p, sizeof p, "%s/cat/x.bmp", root);
	write_raw(p, "BM", 2);
	snprintf(p, sizeof p, "%s/empty/readme", root);
	write_raw(p, "x", 1);
	snprintf(p, sizeof p, "%s/root.jpg", root);
	write_image(p, FMT_JPEG, 4, 4, 1, 99);
}

static void folder_wants(struct want *w)
{
	for (int i = 0; i < N_FOLDER; i++) {
		const struct fimg *f = &folder_train[i];
		w[i] = (struct want){ f->fmt, f->h, f->w, f->c, i, f->label };
	}
}

START_TEST(test_folder_valid)
{
	make_folder("ds/train");
	struct want w[N_FOLDER];
	folder_wants(w);
	/* path = ds: the train split subdirectory is used */
	kiln_status st = open_src("folder", "data", "train", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_FOLDER, 4); /* cat dog empty zebra */
	check_all(w, N_FOLDER);
	close_src();
	/* path = ds/train directly: no train/ below it, the root itself */
	st = open_src("folder", "data", "train", kv("data.path", "ds/train"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_all(w, N_FOLDER);
}
END_TEST

START_TEST(test_folder_splits)
{
	make_folder("ds/train");
	/* the evaluation splits have the training split's classes (cat dog
	 * empty zebra), some of them empty */
	write_image("ds/test/dog/t.png", FMT_PNG, 3, 3, 1, 7);
	write_image("ds/test/cat/u.png", FMT_PNG, 4, 3, 3, 8);
	mkdirs("ds/test/empty", 1);
	mkdirs("ds/test/zebra", 1);
	write_image("ds/val/cat/v.png", FMT_PNG, 2, 2, 1, 9);
	mkdirs("ds/val/dog", 1);
	mkdirs("ds/val/empty", 1);
	mkdirs("ds/val/zebra", 1);
	/* [data.eval] inherits path and reads ds/test */
	kiln_status st = open_src("folder", "data.eval", "test", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(2, 4);
	struct want w[2] = { { FMT_PNG, 4, 3, 3, 8, 0 }, { FMT_PNG, 3, 3, 1, 7, 1 } };
	check_all(w, 2);
	/* the split key names another subdirectory */
	st = open_src("folder", "data.eval", "test", kv("data.path", "ds"), "data.eval.split=val",
		      NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(1, 4);
	/* one whose class folders differ: its labels would name other classes
	 * (session 31: dog's images labelled 0, cat's index in training) */
	write_image("ds/odd/dog/o.png", FMT_PNG, 2, 2, 1, 10);
	st = open_src("folder", "data.eval", "test", kv("data.path", "ds"), "data.eval.split=odd",
		      NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("ds/odd"), "class 0 is 'dog' in [data.eval] but 'cat' in [data]");
	/* ... which must exist */
	st = open_src("folder", "data", "train", kv("data.path", "ds"), "data.split=nope", NULL);
	ASSERT_OPEN_FAILS(st, KILN_ENOTFOUND, tpath("ds/nope"), "[data] split: ");
	/* [data.eval] inheriting a path without test/: never the training data */
	st = open_src("folder", "data.eval", "test", kv("data.path", "ds/train"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_ECONFIG, tpath("ds/train"), "inherited");
	/* ... unless it sets its own */
	st = open_src("folder", "data.eval", "test", kv("data.path", "ds/train"),
		      kv("data.eval.path", "ds/train"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_FOLDER, 4);
}
END_TEST

/* [data]'s root holding [data.eval]'s (no train/: [data] is the root, and
 * the folder holding the test split is one of its classes).  Before
 * session 32 such a pair was not compared: D/{a,test,zebra} against
 * D/test/{a,zebra} labelled zebra 2 in training and 1 in evaluation, exit 0. */
START_TEST(test_folder_nested_eval)
{
	char want[2048];
	write_image("D/a/0.png", FMT_PNG, 2, 2, 1, 1);
	write_image("D/zebra/0.png", FMT_PNG, 2, 2, 1, 2);
	write_image("D/test/a/0.png", FMT_PNG, 2, 2, 1, 3);
	write_image("D/test/zebra/0.png", FMT_PNG, 2, 2, 1, 4);
	kiln_status st = open_src("folder", "data.eval", "test", kv("data.path", "D"),
				  kv("data.eval.path", "D/test"), NULL);
	snprintf(want, sizeof want, "[data.eval] %s/D/test has 2 class folders and [data] %s/D has 3, and class 1 is 'zebra' in [data.eval] but 'test' in [data]: a label would name another class in each; make the class folders the same (an empty folder keeps its label); [data] holds it in its class folder 'test', which must sort after the others, or put [data]'s classes in its train/",
		 tmp, tmp);
	ck_assert_int_eq(st, KILN_EDATA);
	ck_assert_str_eq(kiln_last_error(), want);
	ck_assert_ptr_null(ctx);
	/* inherited path, D/test found as the split: the same */
	st = open_src("folder", "data.eval", "test", kv("data.path", "D"), NULL);
	ck_assert_int_eq(st, KILN_EDATA);
	ck_assert_str_eq(kiln_last_error(), want);
	/* the test folder sorting last keeps every label: D/{a,b,test} */
	write_image("E/a/0.png", FMT_PNG, 2, 2, 1, 1);
	write_image("E/b/0.png", FMT_PNG, 2, 2, 1, 2);
	write_image("E/test/a/0.png", FMT_PNG, 2, 2, 1, 3);
	write_image("E/test/b/0.png", FMT_PNG, 2, 2, 1, 4);
	st = open_src("folder", "data.eval", "test", kv("data.path", "E"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	/* ... and a class it does not have is refused, nested or not */
	write_image("E/test/c/0.png", FMT_PNG, 2, 2, 1, 5);
	st = open_src("folder", "data.eval", "test", kv("data.path", "E"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("E/test"), "class 2 is 'c' in [data.eval] but 'test' in [data]");
	/* only split folders at hand (kiln eval with the test data alone): the
	 * root is no training set, not compared */
	write_image("F/test/a/0.png", FMT_PNG, 2, 2, 1, 1);
	write_image("F/val/a/0.png", FMT_PNG, 2, 2, 1, 1);
	st = open_src("folder", "data.eval", "test", kv("data.path", "F"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	/* a root deeper inside: G/x/test against G/{a,x}: x holds it */
	write_image("G/a/0.png", FMT_PNG, 2, 2, 1, 1);
	write_image("G/x/test/a/0.png", FMT_PNG, 2, 2, 1, 1);
	st = open_src("folder", "data.eval", "test", kv("data.path", "G"),
		      kv("data.eval.path", "G/x/test"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	write_image("G/b/0.png", FMT_PNG, 2, 2, 1, 1);
	st = open_src("folder", "data.eval", "test", kv("data.path", "G"),
		      kv("data.eval.path", "G/x/test"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("G/x/test"), "class 1 is '(none)' in [data.eval] but 'b' in [data]");
}
END_TEST

START_TEST(test_folder_concurrent)
{
	make_folder("ds");
	kiln_status st = open_src("folder", "data", "train", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_concurrent();
}
END_TEST

START_TEST(test_folder_corrupt_images)
{
	uint8_t *b;
	size_t n;
	write_image("ds/a/0.png", FMT_PNG, 4, 4, 1, 0);
	encode(FMT_JPEG, 16, 16, 3, 1, &b, &n);
	write_raw("ds/a/1.jpg", b, n / 2); /* truncated JPEG */
	free(b);
	uint8_t junk[300];
	for (int i = 0; i < 300; i++)
		junk[i] = (uint8_t)(i * 131 + 7);
	write_raw("ds/a/2.jpg", junk, sizeof junk); /* garbage */
	encode(FMT_PNG, 8, 8, 3, 2, &b, &n);
	write_raw("ds/a/3.png", b, n - 20); /* truncated PNG */
	free(b);
	write_raw("ds/a/4.jpg", "", 0); /* empty */
	kiln_status st = open_src("folder", "data", "train", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(5, 1);
	struct kiln_image img = { 0 };
	int32_t y;
	ck_assert_int_eq(read_one(0, &img, &y), KILN_OK);
	ASSERT_ERR(read_one(1, &img, &y), KILN_EDATA, tpath("ds/a/1.jpg"), "JPEG");
	ASSERT_ERR(read_one(2, &img, &y), KILN_EDATA, tpath("ds/a/2.jpg"), "not a JPEG or PNG");
	ASSERT_ERR(read_one(3, &img, &y), KILN_EDATA, tpath("ds/a/3.png"), "PNG");
	ASSERT_ERR(read_one(4, &img, &y), KILN_EDATA, tpath("ds/a/4.jpg"), "empty");
	/* the buffer stays valid after failures */
	ck_assert_int_eq(read_one(0, &img, &y), KILN_OK);
	/* a file that vanished after open */
	ck_assert_int_eq(remove(tpath("ds/a/0.png")), 0);
	ASSERT_ERR(read_one(0, &img, &y), KILN_EIO, tpath("ds/a/0.png"), "No such file");
	free(img.data);
}
END_TEST

START_TEST(test_folder_bad_roots)
{
	/* no class subdirectories */
	write_raw("flat/a.png", "x", 1);
	kiln_status st = open_src("folder", "data", "train", kv("data.path", "flat"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("flat"), "no class");
	/* classes, but no images at all */
	mkdirs("noimg/a", 1);
	mkdirs("noimg/b", 1);
	st = open_src("folder", "data", "train", kv("data.path", "noimg"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("noimg"), "no .jpg");
	/* nonexistent */
	st = open_src("folder", "data", "train", kv("data.path", "nope"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_ENOTFOUND, tpath("nope"), "no such file (the folder data)");
	/* a file */
	st = open_src("folder", "data", "train", kv("data.path", "flat/a.png"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EIO, tpath("flat/a.png"), "not a directory");
	/* unset */
	st = open_src("folder", "data", "train", NULL);
	ASSERT_OPEN_FAILS(st, KILN_ECONFIG, "[data] path", "not set");
}
END_TEST

/* ======================================================================
 * tar
 * ====================================================================== */

struct tarbuf {
	uint8_t *p;
	size_t n, cap;
};

static void tb_put(struct tarbuf *t, const void *d, size_t n)
{
	if (t->n + n > t->cap) {
		t->cap = (t->n + n) * 2 + 4096;
		t->p = realloc(t->p, t->cap);
		ck_assert_ptr_nonnull(t->p);
	}
	memcpy(t->p + t->n, d, n);
	t->n += n;
}

static void tb_pad(struct tarbuf *t)
{
	static const uint8_t z[512];
	if (t->n % 512)
		tb_put(t, z, 512 - t->n % 512);
}

/* Fill a header's checksum field. */
static void tar_sum(uint8_t *h)
{
	unsigned sum = 0;
	memset(h + 148, ' ', 8);
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	h[155] = ' ';
}

/* One header: ustar (POSIX magic), name split into prefix/name when
 * `prefix` is given. */
static void tb_header(struct tarbuf *t, const char *prefix, const char *name, size_t size,
		      char type)
{
	uint8_t h[512];
	memset(h, 0, sizeof h);
	strncpy((char *)h, name, 100);
	memcpy(h + 100, "0000644", 8);
	memcpy(h + 108, "0001750", 8);
	memcpy(h + 116, "0001750", 8);
	snprintf((char *)h + 124, 12, "%011o", (unsigned)size);
	memcpy(h + 136, "14544463740", 12);
	h[156] = (uint8_t)type;
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	if (prefix)
		strncpy((char *)h + 345, prefix, 155);
	tar_sum(h);
	tb_put(t, h, 512);
}

/* A regular member; names over 100 bytes get a GNU 'L' header first. */
static void tb_file(struct tarbuf *t, const char *name, const void *d, size_t n)
{
	if (strlen(name) >= 100) {
		tb_header(t, NULL, "././@LongLink", strlen(name) + 1, 'L');
		tb_put(t, name, strlen(name) + 1);
		tb_pad(t);
	}
	tb_header(t, NULL, name, n, '0');
	tb_put(t, d, n);
	tb_pad(t);
}

/* A regular member named by a pax header (its own name field is junk). */
static void tb_pax_file(struct tarbuf *t, const char *name, const void *d, size_t n)
{
	char rec[600], body[700];
	snprintf(rec, sizeof rec, " path=%s\n", name);
	/* the record's length counts its own digits */
	size_t len = strlen(rec) + 2;
	if (len >= 100)
		len++;
	snprintf(body, sizeof body, "%zu%s", len, rec);
	ck_assert_uint_eq(strlen(body), len);
	snprintf(body + len, sizeof body - len, "20 mtime=1700000000\n");
	tb_header(t, NULL, "PaxHeaders/x", strlen(body), 'x');
	tb_put(t, body, strlen(body));
	tb_pad(t);
	tb_header(t, NULL, "truncated-name-ignored", n, '0');
	tb_put(t, d, n);
	tb_pad(t);
}

static void tb_end(struct tarbuf *t)
{
	static const uint8_t z[1024];
	tb_put(t, z, sizeof z);
}

static void tb_image(struct tarbuf *t, const char *name, int fmt, int h, int w, int c, int seed)
{
	uint8_t *b;
	size_t n;
	encode(fmt, h, w, c, seed, &b, &n);
	tb_file(t, name, b, n);
	free(b);
}

static void tb_cls(struct tarbuf *t, const char *name, const char *text)
{
	tb_file(t, name, text, strlen(text));
}

/* The valid shard: 6 samples, every header kind. */
#define N_TAR 6
static const struct want tar_want[N_TAR] = {
	{ FMT_JPEG, 8, 8, 3, 0, 3 }, { FMT_PNG, 5, 6, 1, 1, 1 }, { FMT_PNG, 7, 3, 3, 2, 0 },
	{ FMT_JPEG, 6, 9, 1, 3, 2 }, { FMT_PNG, 4, 4, 3, 4, 5 }, { FMT_PNG, 3, 7, 1, 5, 4 },
};
static const char *long_key =
	"very/long/directory/name/that/goes/on/and/on/beyond/the/hundred/bytes/of/a/ustar/name/field/sample";

static void make_tar(struct tarbuf *t)
{
	const struct want *w = tar_want;
	char name[300];
	memset(t, 0, sizeof *t);
	tb_header(t, NULL, "a/", 0, '5'); /* a directory: ignored */
	tb_image(t, "a/000.jpg", w[0].fmt, w[0].h, w[0].w, w[0].c, w[0].seed);
	tb_cls(t, "a/000.cls", "3\n");
	tb_file(t, "a/000.json", "{}", 2);       /* other extensions: ignored */
	tb_file(t, "README", "no key", 6);        /* no dot: no sample */
	tb_cls(t, "a/001.cls", "  1 ");           /* label before the image */
	tb_image(t, "a/001.PNG", w[1].fmt, w[1].h, w[1].w, w[1].c, w[1].seed);
	/* png and jpg both: jpg wins (to_tuple("jpg;jpeg;png")) */
	tb_image(t, "a/002.png", FMT_PNG, 2, 2, 1, 77);
	tb_image(t, "a/002.jpg", FMT_PNG, w[2].h, w[2].w, w[2].c, w[2].seed); /* sniffed, not named */
	tb_cls(t, "a/002.cls", "0");
	/* a GNU long name */
	snprintf(name, sizeof name, "%s.jpeg", long_key);
	tb_image(t, name, w[3].fmt, w[3].h, w[3].w, w[3].c, w[3].seed);
	snprintf(name, sizeof name, "%s.cls", long_key);
	tb_cls(t, name, "2");
	/* pax path= names */
	uint8_t *b;
	size_t n;
	encode(w[4].fmt, w[4].h, w[4].w, w[4].c, w[4].seed, &b, &n);
	tb_pax_file(t, "pax/dir/sample4.png", b, n);
	free(b);
	tb_pax_file(t, "pax/dir/sample4.cls", "5", 1);
	/* a ustar prefix */
	encode(w[5].fmt, w[5].h, w[5].w, w[5].c, w[5].seed, &b, &n);
	tb_header(t, "prefix/part", "s5.seg.png", n, '0'); /* ext "seg.png": not the image */
	tb_put(t, b, n);
	tb_pad(t);
	tb_header(t, "prefix/part", "s5.png", n, '0');
	tb_put(t, b, n);
	tb_pad(t);
	free(b);
	tb_header(t, "prefix/part", "s5.cls", 1, '0');
	tb_put(t, "4", 1);
	tb_pad(t);
	tb_end(t);
}

/* ---- fuzz -------------------------------------------------------------- */

/* Offsets of the headers of a tar in buf (walks it as written). */
static int header_offsets(const uint8_t *p, size_t n, size_t *out, int max)
{
	int k = 0;
	size_t off = 0;
	while (off + 512 <= n && k < max) {
		int zero = 1;
		for (int i = 0; i < 512 && zero; i++)
			zero = p[off + i] == 0;
		if (zero)
			break;
		out[k++] = off;
		size_t size = strtoul((const char *)p + off + 124, NULL, 8);
		off += 512 + (size + 511) / 512 * 512;
	}
	return k;
}

START_TEST(test_tar_valid)
{
	struct tarbuf t;
	make_tar(&t);
	write_raw("one.tar", t.p, t.n);
	kiln_status st = open_src("tar", "data", "train", kv("data.path", "one.tar"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_TAR, 6);
	check_all(tar_want, N_TAR);
	close_src();
	/* classes given */
	st = open_src("tar", "data", "train", kv("data.path", "one.tar"), "data.classes=10", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_TAR, 10);
	close_src();
	/* ... smaller than a label: that sample (4) is bad when read, a data
	 * error naming its member (on_error = skip skips it), the others read */
	st = open_src("tar", "data", "train", kv("data.path", "one.tar"), "data.classes=5", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_image img = { 0 };
	int32_t y;
	ASSERT_ERR(read_one(4, &img, &y), KILN_EDATA, tpath("one.tar"),
		   "member pax/dir/sample4.png (offset ");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "): label 5 is out of range: classes = 5"));
	ck_assert_int_eq(read_one(5, &img, &y), KILN_OK);
	ck_assert_int_eq(y, 4);
	free(img.data);
	close_src();
	/* GNU-style trailing padding to a 10240-byte record is fine */
	uint8_t *z = calloc(1, 10240);
	tb_put(&t, z, 10240 - t.n % 10240);
	free(z);
	write_raw("padded.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "padded.tar"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	free(t.p);
}
END_TEST

START_TEST(test_tar_shards)
{
	/* two shards in a directory, read in sorted order */
	struct tarbuf a = { 0 }, b = { 0 };
	tb_image(&a, "x/0.png", FMT_PNG, 3, 3, 1, 10);
	tb_cls(&a, "x/0.cls", "0");
	tb_image(&a, "x/1.png", FMT_PNG, 3, 4, 1, 11);
	tb_cls(&a, "x/1.cls", "1");
	tb_end(&a);
	tb_image(&b, "y/0.png", FMT_PNG, 4, 3, 3, 12);
	tb_cls(&b, "y/0.cls", "2");
	tb_end(&b);
	write_raw("ds/train/shard-000.tar", a.p, a.n);
	write_raw("ds/train/shard-001.tar", b.p, b.n);
	write_raw("ds/train/notes.txt", "x", 1);
	write_raw("ds/test/t-000.tar", b.p, b.n);
	const struct want fwd[3] = { { FMT_PNG, 3, 3, 1, 10, 0 }, { FMT_PNG, 3, 4, 1, 11, 1 },
				     { FMT_PNG, 4, 3, 3, 12, 2 } };
	kiln_status st = open_src("tar", "data", "train", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(3, 3);
	check_all(fwd, 3);
	check_concurrent();
	/* [data.eval] inherits path: ds/test */
	st = open_src("tar", "data.eval", "test", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_all(fwd + 2, 1);
	/* shards in the order given, relative to path; commas or spaces */
	st = open_src("tar", "data", "train", kv("data.path", "ds/train"),
		      "data.shards=shard-001.tar, shard-000.tar", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	const struct want rev[3] = { fwd[2], fwd[0], fwd[1] };
	check_all(rev, 3);
	/* absolute shards without path */
	char sh[1200];
	snprintf(sh, sizeof sh, "data.shards=%s %s", tpath("ds/train/shard-001.tar"),
		 tpath("ds/test/t-000.tar"));
	st = open_src("tar", "data", "train", sh, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(2, 3);
	/* a missing shard */
	st = open_src("tar", "data", "train", kv("data.path", "ds/train"),
		      "data.shards=shard-000.tar,shard-009.tar", NULL);
	ASSERT_OPEN_FAILS(st, KILN_ENOTFOUND, tpath("ds/train/shard-009.tar"), "no such file (the tar shard)");
	/* numbers with a gap: read as they are (tar shards are numbered by
	 * other tools, 1-based or a subset; kiln pack writes no tar) */
	write_raw("gap/train/shard-000001.tar", a.p, a.n);
	write_raw("gap/train/shard-000003.tar", b.p, b.n);
	st = open_src("tar", "data", "train", kv("data.path", "gap"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	/* a directory without shards */
	mkdirs("empty", 1);
	st = open_src("tar", "data", "train", kv("data.path", "empty"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("empty"), "no .tar");
	/* nonexistent path */
	st = open_src("tar", "data", "train", kv("data.path", "nope.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_ENOTFOUND, tpath("nope.tar"), "no such file (the tar data)");
	/* neither path nor shards */
	st = open_src("tar", "data", "train", NULL);
	ASSERT_OPEN_FAILS(st, KILN_ECONFIG, "[data] path", "shards");
	free(a.p);
	free(b.p);
}
END_TEST

START_TEST(test_tar_truncated)
{
	struct tarbuf t;
	make_tar(&t);
	/* in the middle of a member's data: the member runs past the end */
	write_raw("cut.tar", t.p, 512 * 2 + 10);
	kiln_status st = open_src("tar", "data", "train", kv("data.path", "cut.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("cut.tar"), "truncated");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "a/000.jpg"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "offset 512"));
	/* in a header */
	size_t hdr[64];
	ck_assert_int_ge(header_offsets(t.p, t.n, hdr, 64), 4);
	write_raw("cut2.tar", t.p, hdr[3] + 200);
	st = open_src("tar", "data", "train", kv("data.path", "cut2.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("cut2.tar"), "truncated");
	/* at a member boundary, without the end-of-archive blocks */
	write_raw("cut3.tar", t.p, t.n - 1024);
	st = open_src("tar", "data", "train", kv("data.path", "cut3.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("cut3.tar"), "end-of-archive");
	/* empty file */
	write_raw("empty.tar", "", 0);
	st = open_src("tar", "data", "train", kv("data.path", "empty.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("empty.tar"), "truncated");
	/* only the end blocks: no samples */
	write_raw("none.tar", t.p + t.n - 1024, 1024);
	st = open_src("tar", "data", "train", kv("data.path", "none.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("none.tar"), "no samples");
	/* a shard shrunk after open */
	write_raw("ok.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "ok.tar"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(truncate(tpath("ok.tar"), 1024), 0);
	struct kiln_image img = { 0 };
	int32_t y;
	ASSERT_ERR(read_one(0, &img, &y), KILN_EDATA, tpath("ok.tar"), "a/000.jpg");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "truncated"));
	free(img.data);
	free(t.p);
}
END_TEST

START_TEST(test_tar_checksum)
{
	struct tarbuf t;
	make_tar(&t);
	t.p[512 + 10] ^= 0x20; /* a name byte of the second header: a/000.jpg */
	write_raw("flip.tar", t.p, t.n);
	kiln_status st = open_src("tar", "data", "train", kv("data.path", "flip.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("flip.tar"), "checksum");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "offset 512"));
	/* not a tar at all */
	uint8_t junk[2048];
	for (int i = 0; i < 2048; i++)
		junk[i] = (uint8_t)(i * 31 + 1);
	write_raw("junk.tar", junk, sizeof junk);
	st = open_src("tar", "data", "train", kv("data.path", "junk.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("junk.tar"), "checksum");
	free(t.p);
}
END_TEST

START_TEST(test_tar_bad_samples)
{
	struct tarbuf t = { 0 };
	kiln_status st;
	/* missing .cls */
	tb_image(&t, "s/0.png", FMT_PNG, 3, 3, 1, 0);
	tb_cls(&t, "s/0.cls", "1");
	tb_image(&t, "s/1.png", FMT_PNG, 3, 3, 1, 1);
	tb_image(&t, "s/2.png", FMT_PNG, 3, 3, 1, 2);
	tb_cls(&t, "s/2.cls", "0");
	tb_end(&t);
	write_raw("nocls.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "nocls.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("nocls.tar"), "s/1");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), ".cls"));
	/* missing image */
	t.n = 0;
	tb_cls(&t, "s/0.cls", "1");
	tb_file(&t, "s/0.txt", "hi", 2);
	tb_end(&t);
	write_raw("noimg.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "noimg.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("noimg.tar"), "s/0");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), ".jpg"));
	/* label text */
	static const char *const bad[] = { "abc", "-1", "1 2", "", "99999999999", "0x10" };
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		t.n = 0;
		tb_image(&t, "s/0.png", FMT_PNG, 3, 3, 1, 0);
		tb_cls(&t, "s/0.cls", bad[k]);
		tb_end(&t);
		write_raw("label.tar", t.p, t.n);
		st = open_src("tar", "data", "train", kv("data.path", "label.tar"), NULL);
		ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("label.tar"), "s/0.cls");
		ck_assert_ptr_nonnull(strstr(kiln_last_error(), "label"));
	}
	/* duplicate .cls */
	t.n = 0;
	tb_image(&t, "s/0.png", FMT_PNG, 3, 3, 1, 0);
	tb_cls(&t, "s/0.cls", "1");
	tb_cls(&t, "s/0.cls", "2");
	tb_end(&t);
	write_raw("dup.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "dup.tar"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("dup.tar"), "two .cls");
	/* an undecodable image member: found at read time */
	t.n = 0;
	tb_file(&t, "s/0.jpg", "\xff\xd8\xff garbage garbage", 20);
	tb_cls(&t, "s/0.cls", "0");
	tb_end(&t);
	write_raw("garbage.tar", t.p, t.n);
	st = open_src("tar", "data", "train", kv("data.path", "garbage.tar"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_image img = { 0 };
	int32_t y;
	ASSERT_ERR(read_one(0, &img, &y), KILN_EDATA, tpath("garbage.tar"), "s/0.jpg");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "JPEG"));
	free(img.data);
	free(t.p);
}
END_TEST

/* Mutate src into dst; returns the new size. */
static size_t mutate(uint8_t *dst, const uint8_t *src, size_t n, const size_t *hdr, int nh)
{
	static const char types[] = "0\0005Lx7Kg12S";
	memcpy(dst, src, n);
	size_t h = hdr[next() % (uint32_t)nh];
	switch (next() % 7) {
	case 0: /* truncate anywhere */
		return next() % n;
	case 1: /* flip 1..4 bytes anywhere */
		for (int k = 1 + (int)(next() % 4); k > 0; k--)
			dst[next() % n] ^= (uint8_t)(1 + next() % 255);
		return n;
	case 2: /* flip bytes of a header, then fix its checksum */
		for (int k = 1 + (int)(next() % 3); k > 0; k--)
			dst[h + next() % 512] ^= (uint8_t)(1 + next() % 255);
		tar_sum(dst + h);
		return n;
	case 3: { /* a new size, valid checksum */
		static const uint64_t sizes[] = { 0, 1, 511, 512, 513, 4096, 077777777777ull };
		uint64_t s = next() % 2 ? sizes[next() % 7] : next() % 8192;
		char f[16];
		snprintf(f, sizeof f, "%011llo", (unsigned long long)s);
		memcpy(dst + h + 124, f, 11);
		if (next() % 8 == 0) /* base-256 */
			dst[h + 124] = 0x80, memset(dst + h + 125, 0xff, 3);
		tar_sum(dst + h);
		return n;
	}
	case 4: /* a new type, valid checksum */
		dst[h + 156] = (uint8_t)types[next() % (sizeof types - 1)];
		tar_sum(dst + h);
		return n;
	case 5: /* rewrite a data byte after a header (a .cls text, a pax record) */
		if (h + 512 < n)
			dst[h + 512 + next() % (n - h - 512 < 64 ? n - h - 512 : 64)] =
				(uint8_t)" 0123456789\n=a.\0/"[next() % 17];
		if (next() % 3 == 0)
			return n - next() % 2048 % n;
		return n;
	default: /* rename: the name field, valid checksum */
		snprintf((char *)dst + h, 100, "%s", (const char *[]){ "a/000.cls", "a/000.jpg", "x",
								       ".hidden", "a/b.c.d", "" }[next() % 6]);
		tar_sum(dst + h);
		return n;
	}
}

START_TEST(test_tar_fuzz)
{
	struct tarbuf t;
	make_tar(&t);
	size_t hdr[64];
	int nh = header_offsets(t.p, t.n, hdr, 64);
	ck_assert_int_ge(nh, 10);
	uint8_t *mut = malloc(t.n);
	char path[1100];
	snprintf(path, sizeof path, "data.path=%s/m.tar", tmp);
	struct kiln_image img = { 0 };
	int opened = 0, failed = 0, read_failed = 0;
	use("tar");
	for (int it = 0; it < 2000; it++) {
		size_t m = mutate(mut, t.p, t.n, hdr, nh);
		write_raw("m.tar", mut, m);
		kiln_status st = open_src("tar", "data", "train", path, NULL);
		if (st == KILN_OK) {
			struct kiln_source_info info = info_of();
			ck_assert_int_ge(info.len, 1);
			for (int64_t i = 0; i < info.len; i++) {
				int32_t y = -1;
				st = read_one(i, &img, &y);
				if (st == KILN_OK) {
					ck_assert(y >= 0 && y < info.classes);
					ck_assert(img.h > 0 && img.w > 0 && (img.c == 1 || img.c == 3));
				} else {
					ck_assert_msg(st == KILN_EDATA, "iteration %d sample %lld: %s: %s", it,
						      (long long)i, kiln_status_name(st), kiln_last_error());
					ck_assert_ptr_nonnull(strstr(kiln_last_error(), tmp));
					read_failed++;
				}
			}
			close_src();
			opened++;
		} else {
			ck_assert_msg(st == KILN_EDATA || st == KILN_EIO, "iteration %d: %s: %s", it,
				      kiln_status_name(st), kiln_last_error());
			ck_assert_ptr_null(ctx);
			ck_assert_msg(strstr(kiln_last_error(), tmp) != NULL, "iteration %d: %s", it,
				      kiln_last_error());
			failed++;
		}
	}
	fprintf(stderr, "check_sources: tar fuzz: %d opened (%d reads failed), %d refused\n",
		opened, read_failed, failed);
	ck_assert_int_gt(failed, 500);
	ck_assert_int_gt(opened, 100);
	free(img.data);
	free(mut);
	free(t.p);
}
END_TEST

/* ======================================================================
 * lmdb
 * ====================================================================== */

#define N_LMDB 5
static const struct want lmdb_want[N_LMDB] = {
	{ FMT_PNG, 4, 5, 3, 20, 2 }, { FMT_JPEG, 8, 8, 1, 21, 0 }, { FMT_PNG, 6, 3, 1, 22, 4 },
	{ FMT_JPEG, 9, 7, 3, 23, 1 }, { FMT_PNG, 2, 2, 3, 24, 2 },
};

struct lmdb_entry {
	const char *key;
	const uint8_t *val;
	size_t n;
};

/* Write an environment at tmp/rel (a directory, or a file when nosubdir). */
static void lmdb_write(const char *rel, int nosubdir, const struct lmdb_entry *e, int n)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	if (!nosubdir)
		mkdirs(rel, 1);
	else
		mkdirs(rel, 0);
	ck_assert_int_eq(mdb_env_create(&env), 0);
	ck_assert_int_eq(mdb_env_set_mapsize(env, 1 << 24), 0);
	/* no fsync: a test fixture, and fsync is slow on some disks */
	ck_assert_int_eq(mdb_env_open(env, tpath(rel), (nosubdir ? MDB_NOSUBDIR : 0) | MDB_NOSYNC, 0644), 0);
	ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
	ck_assert_int_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
	for (int i = 0; i < n; i++) {
		MDB_val k = { strlen(e[i].key), (void *)e[i].key }, v = { e[i].n, (void *)e[i].val };
		ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
	}
	ck_assert_int_eq(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* label (LE i32) + encoded image, malloc()ed. */
static uint8_t *lmdb_value(const struct want *w, int32_t label, size_t *n)
{
	uint8_t *b, *v;
	size_t bn;
	encode(w->fmt, w->h, w->w, w->c, w->seed, &b, &bn);
	v = malloc(bn + 4);
	uint32_t u = (uint32_t)label;
	v[0] = (uint8_t)u, v[1] = (uint8_t)(u >> 8), v[2] = (uint8_t)(u >> 16), v[3] = (uint8_t)(u >> 24);
	memcpy(v + 4, b, bn);
	free(b);
	*n = bn + 4;
	return v;
}

/* The valid database, optionally with __len__; entry `skip` left out. */
static void make_lmdb(const char *rel, int nosubdir, const char *len, int skip)
{
	struct lmdb_entry e[N_LMDB + 1];
	char keys[N_LMDB][16];
	uint8_t *vals[N_LMDB];
	int n = 0;
	for (int i = 0; i < N_LMDB; i++) {
		snprintf(keys[i], sizeof keys[i], "%08d", i);
		vals[i] = lmdb_value(&lmdb_want[i], lmdb_want[i].label, &e[n].n);
		if (i == skip)
			continue;
		e[n].key = keys[i];
		e[n].val = vals[i];
		n++;
	}
	if (len) {
		e[n].key = "__len__";
		e[n].val = (const uint8_t *)len;
		e[n].n = strlen(len);
		n++;
	}
	lmdb_write(rel, nosubdir, e, n);
	for (int i = 0; i < N_LMDB; i++)
		free(vals[i]);
}

START_TEST(test_lmdb_valid)
{
	make_lmdb("db", 0, NULL, -1);
	kiln_status st = open_src("lmdb", "data", "train", kv("data.path", "db"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_LMDB, 5);
	check_all(lmdb_want, N_LMDB);
	check_concurrent();
	/* __len__, classes given, the data file itself (MDB_NOSUBDIR) */
	make_lmdb("file.mdb", 1, "5\n", -1);
	st = open_src("lmdb", "data", "train", kv("data.path", "file.mdb"), "data.classes=7", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_LMDB, 7);
	check_all(lmdb_want, N_LMDB);
	/* __len__ smaller than the entries: a prefix of the samples */
	make_lmdb("db3", 0, "3", -1);
	st = open_src("lmdb", "data", "train", kv("data.path", "db3"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(3, 5);
	/* splits: ds/train and ds/test */
	make_lmdb("ds/train", 0, NULL, -1);
	make_lmdb("ds/test", 0, "2", -1);
	st = open_src("lmdb", "data.eval", "test", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(2, 3);
	st = open_src("lmdb", "data", "train", kv("data.path", "ds"), NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	check_varying_info(N_LMDB, 5);
}
END_TEST

START_TEST(test_lmdb_corrupt)
{
	kiln_status st;
	struct kiln_image img = { 0 };
	int32_t y;
	/* a missing key: found at open when it scans the labels */
	make_lmdb("gap", 0, "5", 2);
	st = open_src("lmdb", "data", "train", kv("data.path", "gap"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("gap"), "00000002");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "missing"));
	/* ... and at read when classes is given (open checks only the ends) */
	st = open_src("lmdb", "data", "train", kv("data.path", "gap"), "data.classes=5", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(read_one(1, &img, &y), KILN_OK);
	ASSERT_ERR(read_one(2, &img, &y), KILN_EDATA, tpath("gap"), "00000002");
	/* __len__ beyond the keys: the last key is missing */
	make_lmdb("long", 0, "6", -1);
	st = open_src("lmdb", "data", "train", kv("data.path", "long"), "data.classes=5", NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("long"), "00000005");

	/* a value shorter than its label; a negative label; a bad image */
	uint8_t *v0, *v2;
	size_t n0, n2;
	v0 = lmdb_value(&lmdb_want[0], 1, &n0);
	v2 = lmdb_value(&lmdb_want[2], -3, &n2);
	uint8_t garbage[40] = { 1, 0, 0, 0, 0xff, 0xd8, 0xff, 1, 2, 3 };
	const struct lmdb_entry e[] = { { "00000000", v0, n0 },
					{ "00000001", (const uint8_t *)"\x01\x00", 2 },
					{ "00000002", v2, n2 },
					{ "00000003", garbage, sizeof garbage } };
	lmdb_write("bad", 0, e, 4);
	st = open_src("lmdb", "data", "train", kv("data.path", "bad"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("bad"), "00000001");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "shorter"));
	st = open_src("lmdb", "data", "train", kv("data.path", "bad"), "data.classes=4", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(read_one(0, &img, &y), KILN_OK);
	ck_assert_int_eq(y, 1);
	ASSERT_ERR(read_one(1, &img, &y), KILN_EDATA, tpath("bad"), "00000001");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "2 bytes"));
	ASSERT_ERR(read_one(2, &img, &y), KILN_EDATA, tpath("bad"), "00000002");
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "label -3"));
	ASSERT_ERR(read_one(3, &img, &y), KILN_EDATA, tpath("bad"), "00000003");
	ck_assert_msg(strstr(kiln_last_error(), "JPEG") != NULL, "%s", kiln_last_error());
	/* a label beyond classes (key 0 is checked at open) */
	st = open_src("lmdb", "data", "train", kv("data.path", "bad"), "data.classes=1", NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("bad"), "label 1");
	free(v0);
	free(v2);

	/* __len__ not a number */
	make_lmdb("badlen", 0, "five", -1);
	st = open_src("lmdb", "data", "train", kv("data.path", "badlen"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("badlen"), "__len__");
	/* nonexistent; a directory without data.mdb; not an LMDB file */
	st = open_src("lmdb", "data", "train", kv("data.path", "nope"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_ENOTFOUND, tpath("nope"), "no such file (the lmdb data)");
	mkdirs("emptydir", 1);
	st = open_src("lmdb", "data", "train", kv("data.path", "emptydir"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EIO, tpath("emptydir"), "data.mdb");
	uint8_t junk[8192];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)(i * 7 + 3);
	write_raw("junk.mdb", junk, sizeof junk);
	st = open_src("lmdb", "data", "train", kv("data.path", "junk.mdb"), NULL);
	ck_assert_msg(st == KILN_EDATA || st == KILN_EIO, "%s", kiln_status_name(st));
	ck_assert_ptr_null(ctx);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), tpath("junk.mdb")));
	/* an empty database */
	lmdb_write("nothing", 0, e, 0);
	st = open_src("lmdb", "data", "train", kv("data.path", "nothing"), NULL);
	ASSERT_OPEN_FAILS(st, KILN_EDATA, tpath("nothing"), "no samples");
	free(img.data);
}
END_TEST

/* ======================================================================
 * synthetic
 * ====================================================================== */

START_TEST(test_synthetic)
{
	kiln_status st = open_src("synthetic", "data", "train", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	struct kiln_source_info info = info_of();
	ck_assert_int_eq(info.len, 60000);
	ck_assert_int_eq(info.classes, 10);
	ck_assert_int_eq(info.sample.dtype, KILN_U8);
	ck_assert_int_eq(info.sample.ndim, 3);
	ck_assert_int_eq(info.sample.dims[0], 28);
	ck_assert_int_eq(info.sample.dims[1], 28);
	ck_assert_int_eq(info.sample.dims[2], 1);
	ck_assert_int_eq(info.image_h, 28);
	ck_assert_int_eq(info.image_w, 28);
	ck_assert_int_eq(info.image_c, 1);

	st = open_src("synthetic", "data", "train", "data.samples=50", "data.image_size=6 5",
		      "data.image_channels=3", "data.classes=7", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	info = info_of();
	ck_assert_int_eq(info.len, 50);
	ck_assert_int_eq(info.classes, 7);
	ck_assert_int_eq(info.image_h, 6);
	ck_assert_int_eq(info.image_w, 5);
	ck_assert_int_eq(info.image_c, 3);
	ck_assert_int_eq(kiln_tensor_bytes(&info.sample), 90);
	struct kiln_image a = { 0 }, b = { 0 };
	int32_t y;
	long hist[256] = { 0 };
	for (int i = 0; i < 50; i++) {
		ck_assert_int_eq(read_one(i, &a, &y), KILN_OK);
		ck_assert_int_eq(y, i % 7);
		ck_assert(a.h == 6 && a.w == 5 && a.c == 3);
		for (int k = 0; k < 90; k++)
			hist[a.data[k]]++;
		ck_assert_int_eq(read_one(i, &b, &y), KILN_OK); /* deterministic */
		ck_assert_int_eq(memcmp(a.data, b.data, 90), 0);
		if (i) { /* differs from the previous sample */
			ck_assert_int_eq(read_one(i - 1, &b, &y), KILN_OK);
			ck_assert_int_ne(memcmp(a.data, b.data, 90), 0);
		}
	}
	int used = 0;
	for (int v = 0; v < 256; v++)
		used += hist[v] > 0;
	ck_assert_int_gt(used, 200); /* 4500 bytes spread over the byte values */
	check_concurrent();
	ck_assert_int_eq(read_one(50, &a, &y), KILN_EINVAL);
	/* the test split has other images; square size */
	ck_assert_int_eq(read_one(3, &a, &y), KILN_OK);
	uint8_t keep[90];
	memcpy(keep, a.data, 90);
	st = open_src("synthetic", "data.eval", "test", "data.samples=50", "data.image_size=6 5",
		      "data.image_channels=3", "data.classes=7", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(read_one(3, &a, &y), KILN_OK);
	ck_assert_int_ne(memcmp(keep, a.data, 90), 0);
	st = open_src("synthetic", "data", "train", "data.image_size=224", "data.image_channels=3", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(read_one(59999, &a, &y), KILN_OK);
	ck_assert(a.h == 224 && a.w == 224 && a.c == 3 && y == 9);
	st = open_src("synthetic", "data", "train", "data.image_size=32x16", NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	info = info_of();
	ck_assert(info.image_h == 32 && info.image_w == 16);
	free(a.data);
	free(b.data);
}
END_TEST

START_TEST(test_synthetic_bad_keys)
{
	static const char *const bad[] = { "data.image_size=", "data.image_size=0", "data.image_size=28 28 28",
					   "data.image_size=abc", "data.image_size=100000", "data.image_size=28 x" };
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		kiln_status st = open_src("synthetic", "data", "train", bad[k], NULL);
		ASSERT_OPEN_FAILS(st, KILN_ECONFIG, "size", "H W");
	}
	/* channels and samples are checked by the schema */
	use("synthetic");
	static const char *const schema_bad[] = { "data.image_channels=2", "data.samples=0",
						  "data.classes=0", "data.sizes=3" };
	for (size_t k = 0; k < sizeof schema_bad / sizeof schema_bad[0]; k++) {
		kiln_config_free(cfg);
		ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
		ck_assert_int_eq(kiln_config_override(cfg, "data.source=synthetic"), KILN_OK);
		ck_assert_int_eq(kiln_config_override(cfg, schema_bad[k]), KILN_OK);
		ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_ECONFIG, "%s accepted",
			      schema_bad[k]);
	}
}
END_TEST

/* The sources' keys make [data] strict. */
START_TEST(test_keys_validated)
{
	static const char *const cases[][2] = {
		{ "folder", "data.shards=x" }, { "tar", "data.pth=x" },
		{ "lmdb", "data.classes=-1" }, { "tar", "data.eval.classes=x" },
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		char s[64];
		kiln_config_free(cfg);
		ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
		snprintf(s, sizeof s, "data.source=%s", cases[k][0]);
		ck_assert_int_eq(kiln_config_override(cfg, s), KILN_OK);
		ck_assert_int_eq(kiln_config_override(cfg, cases[k][1]), KILN_OK);
		ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_ECONFIG, "%s: %s accepted",
			      cases[k][0], cases[k][1]);
	}
}
END_TEST

/* ======================================================================
 * seq2seq: digit strings and their reversal or sorting
 * ====================================================================== */

/* The string of sample i (ids 1..10, then pads 0) and its label, checked
 * against the task; returns the string's length. */
static int s2s_read_checked(int64_t i, int T, int sort, int32_t *x, int32_t *y)
{
	ck_assert_int_eq(ops->read(ctx, i, x, y), KILN_OK);
	int n = 0;
	while (n < T && x[n])
		n++;
	for (int t = n; t < T; t++)
		ck_assert_msg(x[t] == 0 && y[t] == 0, "sample %lld: padding at %d", (long long)i, t);
	int counts[11] = { 0 }, prev = 0;
	for (int t = 0; t < n; t++) {
		ck_assert(x[t] >= 1 && x[t] <= 10);
		counts[x[t]]++;
	}
	for (int t = 0; t < n; t++) {
		if (!sort) {
			ck_assert_int_eq(y[t], x[n - 1 - t]);
		} else {
			ck_assert(y[t] >= prev && y[t] >= 1 && y[t] <= 10 && counts[y[t]]-- > 0);
			prev = y[t];
		}
	}
	return n;
}

START_TEST(test_seq2seq)
{
	enum { N = 400, T = 9 };
	int32_t x[T], y[T], x2[T], y2[T];
	static int32_t train[N][T];
	for (int sort = 0; sort < 2; sort++) {
		kiln_status st = open_src("seq2seq", "data", "train", "data.samples=400",
					  "data.length=9", "data.min_length=3",
					  sort ? "data.task=sort" : "data.task=reverse", NULL);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		struct kiln_source_info info;
		memset(&info, 0xab, sizeof info);
		ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
		ck_assert_int_eq(info.len, N);
		ck_assert_int_eq(info.classes, 11);
		ck_assert(info.image_h == 0 && info.flags == 0 && info.label.dtype == KILN_I32);
		ck_assert(info.sample.dtype == KILN_I32 && info.sample.ndim == 1 &&
			  info.sample.dims[0] == T && info.label.dims[0] == T);
		int lens[T + 1] = { 0 };
		for (int i = 0; i < N; i++) {
			lens[s2s_read_checked(i, T, sort, x, y)]++;
			memcpy(train[i], x, sizeof x);
			ck_assert_int_eq(ops->read(ctx, i, x2, y2), KILN_OK); /* deterministic */
			ck_assert(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y));
		}
		for (int n = 3; n <= T; n++) /* every length in [min_length, length] occurs */
			ck_assert_msg(lens[n] > 20, "length %d: %d strings", n, lens[n]);
		ck_assert_int_eq(lens[0] + lens[1] + lens[2], 0);
		ck_assert_int_eq(ops->read(ctx, N, x, y), KILN_EINVAL);
		/* the held-out split: other strings, none of them a training one */
		st = open_src("seq2seq", "data.eval", "test", "data.samples=400", "data.length=9",
			      "data.min_length=3", sort ? "data.task=sort" : "data.task=reverse", NULL);
		ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
		int same = 0;
		for (int i = 0; i < N; i++) {
			s2s_read_checked(i, T, sort, x, y);
			for (int j = 0; j < N; j++) /* plain compares: ck_assert is slow */
				same += !memcmp(x, train[j], sizeof x);
		}
		ck_assert_msg(same == 0, "%d held-out strings are training strings", same);
	}
	ck_assert_int_eq(open_src("seq2seq", "data", "train", "data.length=4", "data.min_length=5", NULL),
			 KILN_ECONFIG);
	/* length 1: none of the ten strings is held out, so the evaluation's
	 * split has none (its reads drew forever before session 28); the
	 * training split has all ten, and length 2 has both */
	ck_assert_int_eq(open_src("seq2seq", "data.eval", "test", "data.length=1", NULL), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "no string of 1..1 digits falls in the held-out split"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(open_src("seq2seq", "data", "train", "data.length=1", NULL), KILN_OK);
	close_src();
	ck_assert_int_eq(open_src("seq2seq", "data.eval", "test", "data.length=2", NULL), KILN_OK);
	int32_t x_2[2], y_2[2];
	s2s_read_checked(0, 2, 0, x_2, y_2);
	close_src();
}
END_TEST

/* task = sum: one class per string (a scalar label), the digit sum mod 10,
 * the strings those of task = reverse (session 41: a sequence classifier's
 * data, examples/seq_classify.ini) */
START_TEST(test_seq2seq_sum)
{
	enum { N = 300, T = 7 };
	int32_t y[T], xr[T], yr[T];
	const char *keys[] = { "data.samples=300", "data.length=7", "data.min_length=1" };
	ck_assert_int_eq(open_src("seq2seq", "data", "train", keys[0], keys[1], keys[2],
				  "data.task=sum", NULL), KILN_OK);
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.classes, 10);
	ck_assert(info.label.dtype == KILN_I32 && info.label.ndim == 0 && info.sample.ndim == 1 &&
		  info.sample.dims[0] == T);
	static int32_t xs[N][T];
	int seen[10] = { 0 };
	for (int i = 0; i < N; i++) {
		y[1] = -7; /* one label only: the rest of the buffer untouched */
		ck_assert_int_eq(ops->read(ctx, i, xs[i], y), KILN_OK);
		ck_assert_int_eq(y[1], -7);
		int sum = 0;
		for (int t = 0; t < T && xs[i][t]; t++)
			sum += xs[i][t] - 1;
		ck_assert_msg(y[0] == sum % 10, "sample %d: label %d, digit sum %d", i, y[0], sum);
		seen[y[0]]++;
	}
	for (int k = 0; k < 10; k++)
		ck_assert_msg(seen[k] > 5, "class %d: %d strings of %d", k, seen[k], N);
	close_src();
	ck_assert_int_eq(open_src("seq2seq", "data", "train", keys[0], keys[1], keys[2],
				  "data.task=reverse", NULL), KILN_OK);
	for (int i = 0; i < N; i++) {
		s2s_read_checked(i, T, 0, xr, yr);
		ck_assert(!memcmp(xr, xs[i], sizeof xr));
	}
	close_src();
}
END_TEST

static Suite *make_sources_suite(void)
{
	Suite *s = suite_create("sources");
	check_add_case(s, "folder", 0, setup, teardown, (const TTest *[]){
		test_folder_valid, test_folder_splits, test_folder_nested_eval, test_folder_concurrent,
		test_folder_corrupt_images, test_folder_bad_roots, NULL });

	check_add_case(s, "tar", 0, setup, teardown, (const TTest *[]){
		test_tar_valid, test_tar_shards, test_tar_truncated, test_tar_checksum,
		test_tar_bad_samples, NULL });

	check_add_case(s, "tar_fuzz", 120, setup, teardown, (const TTest *[]){
		test_tar_fuzz, NULL });

	check_add_case(s, "lmdb", 0, setup, teardown, (const TTest *[]){
		test_lmdb_valid, test_lmdb_corrupt, NULL });

	check_add_case(s, "synthetic", 0, setup, teardown, (const TTest *[]){
		test_synthetic, test_synthetic_bad_keys, test_keys_validated, NULL });

	check_add_case(s, "seq2seq", 60, setup, teardown, (const TTest *[]){
		test_seq2seq, test_seq2seq_sum, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_sources_suite };
