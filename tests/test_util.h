/* tests/test_util.h - small fixtures the Check suites share: where the test
 * data lives, scratch directories, files, a config from text (and a
 * training run of it), metrics.jsonl's fields, a tensor description, the
 * warnings logged.
 */
#ifndef KILN_TESTS_TEST_UTIL_H
#define KILN_TESTS_TEST_UTIL_H

#include <check.h>
#include <dirent.h>
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A log sink keeping the warnings: kiln_log_set_sink(test_keep_warning,
 * buf) appends each warning's message and a newline to buf, a string of
 * TEST_WARNED_SIZE bytes (empty it to start afresh). */
#define TEST_WARNED_SIZE 4096
static inline void test_keep_warning(void *user, int level, const char *who, const char *msg)
{
	char *buf = user;
	size_t n = strlen(buf);
	(void)who;
	if (level == KILN_LOG_WARN)
		snprintf(buf + n, TEST_WARNED_SIZE - n, "%s\n", msg);
}

/* $srcdir/tests/data/NAME (srcdir "." when automake's harness did not set
 * it) into buf. */
static inline const char *test_data_path(char *buf, size_t n, const char *name)
{
	const char *srcdir = getenv("srcdir");
	snprintf(buf, n, "%s/tests/data/%s", srcdir ? srcdir : ".", name);
	return buf;
}

/* A fresh directory $TMPDIR/kiln-TAG-XXXXXX (TMPDIR defaults to /tmp) into
 * buf: buf, or NULL when mkdtemp failed. */
static inline char *test_tmpdir_make(char *buf, size_t n, const char *tag)
{
	const char *t = getenv("TMPDIR");
	snprintf(buf, n, "%s/kiln-%s-XXXXXX", t && *t ? t : "/tmp", tag);
	return mkdtemp(buf);
}

/* A fresh file $TMPDIR/kiln-TAG-XXXXXX (TMPDIR defaults to /tmp), its name
 * into buf: its descriptor, or -1 when mkstemp failed. */
static inline int test_tmpfile_make(char *buf, size_t n, const char *tag)
{
	const char *t = getenv("TMPDIR");
	snprintf(buf, n, "%s/kiln-%s-XXXXXX", t && *t ? t : "/tmp", tag);
	return mkstemp(buf);
}

/* Removes dir and everything below it (links are removed, not followed). */
static inline void test_tmpdir_remove(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	char p[4608];
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			struct stat sb;
			const int n = snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
			if (n < 0 || (size_t)n >= sizeof p)
				continue; /* a path too long to name: left */
			if (!lstat(p, &sb) && S_ISDIR(sb.st_mode))
				test_tmpdir_remove(p);
			else
				remove(p);
		}
	closedir(d);
	rmdir(dir);
}

/* PATH's bytes, NUL-terminated, their count in *len. */
static inline char *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = 0;
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* TEXT loaded as the config "test.ini", the overrides ov applied
 * (NULL-terminated; NULL: none), and validated against registry: a failure
 * fails the test, with kiln's message.  The caller frees the config. */
static inline struct kiln_config *test_config_ov(struct kiln_registry *registry, const char *text,
						 const char *const *ov)
{
	struct kiln_config *cfg;
	ck_assert_msg(kiln_config_load_string(text, "test.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	for (; ov && *ov; ov++)
		ck_assert_msg(kiln_config_override(cfg, *ov) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_config_validate(cfg, registry) == KILN_OK, "%s", kiln_last_error());
	return cfg;
}

/* test_config_ov with no overrides. */
static inline struct kiln_config *test_config(struct kiln_registry *registry, const char *text)
{
	return test_config_ov(registry, text, NULL);
}

/* kiln_train of test_config_ov(registry, text, ov), progress (may be NULL) its
 * callback: kiln_train's status, its result in *res. */
static inline kiln_status test_train_text(struct kiln_registry *registry, const char *text,
					  const char *const *ov, kiln_progress_fn progress,
					  struct kiln_train_result *res)
{
	struct kiln_config *cfg = test_config_ov(registry, text, ov);
	kiln_status st = kiln_train(cfg, registry, progress, NULL, res);
	kiln_config_free(cfg);
	return st;
}

/* The integer field `key` of the last "train" event in dir/metrics.jsonl;
 * -1 when none has it. */
static inline long long test_last_train_field(const char *dir, const char *key)
{
	char path[300], line[2048], want[64];
	long long v = -1;
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	snprintf(want, sizeof want, "\"%s\":", key);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	while (fgets(line, sizeof line, f)) {
		const char *p = strstr(line, want);
		if (!strncmp(line, "{\"event\":\"train\",", 17) && p)
			v = atoll(p + strlen(want));
	}
	fclose(f);
	return v;
}

/* A pseudo-random value in [-1, 1] in steps of 0.001 for element i of
 * the tensor numbered salt: the same on every machine. */
static inline float test_hash_val(uint32_t i, uint32_t salt)
{
	uint32_t x = i * 2654435761u ^ salt * 40503u;
	x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
	return (float)(x % 2001) / 1000.0f - 1.0f;
}

/* A 4-d tensor description [a, b, c, d] of dtype dt in layout. */
static inline struct kiln_tensor_desc test_desc4(int dt, int64_t a, int64_t b, int64_t c, int64_t d,
						 int layout)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = dt, t.ndim = 4, t.layout = layout;
	t.dims[0] = a, t.dims[1] = b, t.dims[2] = c, t.dims[3] = d;
	return t;
}

/* Whether the Fashion-MNIST training set scripts/install-deps fetches is
 * on this machine. */
static inline int test_have_fashion(void)
{
	return access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0;
}

/* A suite's check_main setup for suites that all train on Fashion-MNIST:
 * 0, or 77 (skip the suite) saying how to fix it. */
static inline int test_need_fashion(void)
{
	if (test_have_fashion())
		return 0;
	fprintf(stderr, "Fashion-MNIST missing: run scripts/install-deps\n");
	return 77;
}

/* Fails the test, saying how to fix it, when Fashion-MNIST is missing. */
#define TEST_REQUIRE_FASHION()                                                                  \
	ck_assert_msg(test_have_fashion(), "Fashion-MNIST missing: run scripts/install-deps")

/* bytes from src to dst in direction kind (KILN_COPY_H2D, _D2H) on stream,
 * waited for: a failure fails the test. */
static inline void test_copy_sync(struct kiln_device *dev, void *stream,
				  void *dst, const void *src, size_t bytes, int kind)
{
	ck_assert_msg(kiln_device_copy_async(dev, dst, src, bytes, kind, stream) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert_msg(kiln_device_stream_sync(dev, stream) == KILN_OK, "%s", kiln_last_error());
}

/* test_copy_sync on the device and stream of a rig R (any struct with
 * members dev and stream). */
#define TEST_H2D(r, dst, src, bytes)                                                    \
	test_copy_sync((r)->dev, (r)->stream, (dst), (src), (bytes), KILN_COPY_H2D)
#define TEST_D2H(r, dst, src, bytes)                                                    \
	test_copy_sync((r)->dev, (r)->stream, (dst), (src), (bytes), KILN_COPY_D2H)

/* The first half of a test rig's teardown: waits for stream, then frees
 * the n device buffers bufs[] (NULL entries skipped). The caller then
 * frees what needs the device still (plans, the model) and calls
 * test_rig_close_device. */
static inline void test_rig_free_bufs(struct kiln_device *dev, void *stream,
				      void *const *bufs, size_t n)
{
	kiln_device_stream_sync(dev, stream);
	for (size_t i = 0; i < n; i++)
		if (bufs[i])
			kiln_device_free(dev, bufs[i]);
}

/* The second half: destroys stream, closes dev, frees cfg (may be NULL). */
static inline void test_rig_close_device(struct kiln_device *dev, void *stream,
					 struct kiln_config *cfg)
{
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

/* The model `ini` builds on device `device` from a sample of dtype [dims]
 * must be refused (by validation or by kiln_model_create) with a message
 * that contains `want`. */
static inline void test_model_refused(struct kiln_registry *reg, const char *device,
				      const char *ini, int dtype, int nd, const int64_t *dims,
				      const char *want)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m = NULL;
	ck_assert(kiln_config_load_string(ini, "bad.ini", &cfg) == KILN_OK);
	kiln_status st = kiln_config_validate(cfg, reg);
	if (!st) {
		ck_assert(kiln_device_open(reg, cfg, device, 0, &dev) == 0);
		struct kiln_tensor_desc sample;
		kiln_tensor_desc_init(&sample, dtype, nd, dims);
		st = kiln_model_create(cfg, reg, dev, &sample, &m);
		kiln_model_free(m);
		kiln_device_close(dev);
	}
	ck_assert_msg(st != KILN_OK, "%s: built", ini);
	ck_assert_msg(strstr(kiln_last_error(), want) != NULL, "message '%s' lacks '%s'",
		      kiln_last_error(), want);
	kiln_config_free(cfg);
}

#endif
