/* tests/source_fixture.h - the fixture the data source suites share
 * (tests/check_idx.c, check_records.c, check_sources.c): a scratch
 * directory, the registry, the source under test, its config and its open
 * context, with helpers for files in the scratch directory.  A suite's
 * setup calls source_setup and picks its source with source_find; the
 * teardown here closes everything and removes the directory.
 */
#ifndef KILN_TESTS_SOURCE_FIXTURE_H
#define KILN_TESTS_SOURCE_FIXTURE_H

#include "test_util.h"

#include <check.h>
#include <kiln/kiln.h>
#include <kiln/plugin.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tmp[512];
static struct kiln_registry *reg;
static const struct kiln_source_ops *ops;
static struct kiln_config *cfg;
static void *ctx;

/* A scratch directory kiln-TAG-XXXXXX, a quiet log, the registry. */
static inline void source_setup(const char *tag)
{
	ck_assert_ptr_nonnull(test_tmpdir_make(tmp, sizeof tmp, tag));
	kiln_log_set_level(KILN_LOG_ERROR);
	ck_assert_int_eq(kiln_registry_open(NULL, &reg), KILN_OK);
	cfg = NULL;
	ctx = NULL;
	ops = NULL;
}

/* The source plugin NAME; ops becomes its table. */
static inline const struct kiln_plugin *source_find(const char *name)
{
	const struct kiln_plugin *p = NULL;
	kiln_status st = kiln_registry_find(reg, KILN_PLUGIN_SOURCE, name, &p);
	ck_assert_msg(st == KILN_OK, "%s source not found: %s", name, kiln_last_error());
	ops = p->ops;
	return p;
}

static void teardown(void)
{
	if (ctx)
		ops->close(ctx);
	ctx = NULL;
	kiln_config_free(cfg);
	cfg = NULL;
	kiln_registry_close(reg);
	reg = NULL;
	test_tmpdir_remove(tmp);
}

/* cfg: a new config with [data] source = SOURCE (unless NULL) and the
 * overrides of ap (up to NULL), validated. */
static inline void source_config(const char *source, va_list ap)
{
	const char *o;
	kiln_config_free(cfg);
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	if (source) {
		char s[64];
		snprintf(s, sizeof s, "data.source=%s", source);
		ck_assert_int_eq(kiln_config_override(cfg, s), KILN_OK);
	}
	while ((o = va_arg(ap, const char *)))
		ck_assert_msg(kiln_config_override(cfg, o) == KILN_OK, "override %s: %s", o,
			      kiln_last_error());
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "validate: %s", kiln_last_error());
}

/* tmp/NAME, in one of 8 buffers used in turn. */
static inline const char *tpath(const char *name)
{
	static char buf[8][1024];
	static int k;
	char *b = buf[k++ & 7];
	snprintf(b, sizeof buf[0], "%s/%s", tmp, name);
	return b;
}

/* tmp/NAME's bytes (a terminating byte's room after them), their count in *n. */
static inline uint8_t *read_whole(const char *name, size_t *n)
{
	FILE *f = fopen(tpath(name), "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(*n + 1);
	ck_assert_uint_eq(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

/* buf[0..n) written to tmp/NAME. */
static inline void write_tmp(const char *name, const void *buf, size_t n)
{
	FILE *f = fopen(tpath(name), "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* A failed open: status want, no context, a message naming the file and
 * the word. */
#define ASSERT_FAILS(st, want, file, word)                                                   \
	do {                                                                                 \
		kiln_status st_ = (st);                                                      \
		const char *e_ = kiln_last_error();                                          \
		ck_assert_msg(st_ == (want), "status %s, expected %s (%s)",                  \
			      kiln_status_name(st_), kiln_status_name(want), e_);            \
		ck_assert_ptr_null(ctx);                                                     \
		ck_assert_msg(strstr(e_, (file)) != NULL, "message lacks the path %s: %s",   \
			      (file), e_);                                                   \
		ck_assert_msg(strstr(e_, (word)) != NULL, "message lacks '%s': %s", (word),  \
			      e_);                                                           \
	} while (0)

/* The fuzz cases' mutations: a fixed xorshift sequence (each test forks). */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

#endif
