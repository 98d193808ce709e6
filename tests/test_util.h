/* tests/test_util.h - small fixtures the Check suites share: where the test
 * data lives, scratch directories, files, a config from text, a tensor
 * description.
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

/* Removes dir and everything below it (links are removed, not followed). */
static inline void test_tmpdir_remove(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	char p[1024];
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			struct stat sb;
			snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
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

/* TEXT loaded as the config "test.ini" and validated against reg: a
 * failure fails the test, with kiln's message. */
static inline struct kiln_config *test_config(struct kiln_registry *reg, const char *text)
{
	struct kiln_config *cfg;
	ck_assert_msg(kiln_config_load_string(text, "test.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	return cfg;
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

#endif
