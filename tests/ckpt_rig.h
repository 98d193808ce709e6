/* tests/ckpt_rig.h - checkpoint files as the Check suites compare and
 * rewrite them (tests/check_ckpt.c, tests/check_count_exact.c, the resume
 * suites through tests/resume_rig.h): sections compared byte for byte, a
 * u64 of a section or of the header set with its CRCs made good again
 * (docs/checkpoints.md: a 64-byte header, its CRC at byte 60; each section
 * a 48-byte header, its tag, length at 32, data CRC at 40 and header CRC
 * at 44, then its data). */
#ifndef KILN_TESTS_CKPT_RIG_H
#define KILN_TESTS_CKPT_RIG_H

#include "checkpoint.h"
#include "test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t kiln_crc32c(uint32_t crc, const void *buf, size_t n); /* core/internal.h */

/* The sections `tags` (NULL-terminated) of two checkpoint files are
 * byte-identical; a section absent from both counts as equal where
 * absent_ok, else fails. */
static inline void same_sections(const char *a, const char *b, const char *const *tags,
				 int absent_ok)
{
	struct kiln_ckpt *ca, *cb;
	ck_assert_msg(kiln_ckpt_open(a, &ca) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_open(b, &cb) == 0, "%s", kiln_last_error());
	for (int i = 0; tags[i]; i++) {
		uint64_t na = 0, nb = 0;
		const int fa = kiln_ckpt_find(ca, tags[i], &na) == 0;
		const int fb = kiln_ckpt_find(cb, tags[i], &nb) == 0;
		ck_assert_msg(fa == fb, "section '%s' is in %s alone", tags[i], fa ? a : b);
		ck_assert_msg(fa || absent_ok, "section '%s' is in neither %s nor %s", tags[i], a, b);
		if (!fa)
			continue;
		ck_assert_uint_eq(na, nb);
		char *x = malloc(na), *y = malloc(nb);
		ck_assert(kiln_ckpt_read(ca, tags[i], x, na) == 0);
		ck_assert(kiln_ckpt_read(cb, tags[i], y, nb) == 0);
		ck_assert_msg(memcmp(x, y, na) == 0, "section '%s' differs between %s and %s",
			      tags[i], a, b);
		free(x);
		free(y);
	}
	kiln_ckpt_close(ca);
	kiln_ckpt_close(cb);
}

/* In the checkpoint file at path: the u64 at byte `at` of section `tag`
 * set to v (its CRCs made again), or of the header (tag NULL: its CRC),
 * as an older kiln or a longer run would have written it. */
static inline void patch_u64(const char *path, const char *tag, size_t at, uint64_t v)
{
	size_t n;
	uint8_t *d = (uint8_t *)test_read_file(path, &n);
	uint32_t count, crc;
	uint64_t off = KILN_CKPT_HEADER_BYTES, len;
	int found = 0;
	if (!tag) {
		memcpy(d + at, &v, 8);
		crc = kiln_crc32c(0, d, 60);
		memcpy(d + 60, &crc, 4);
		found = 1;
	}
	memcpy(&count, d + 24, 4);
	for (uint32_t i = 0; tag && i < count; i++, off += KILN_CKPT_SECTION_BYTES + len) {
		memcpy(&len, d + off + 32, 8);
		if (strcmp((const char *)d + off, tag))
			continue;
		ck_assert_uint_le(at + 8, len);
		memcpy(d + off + KILN_CKPT_SECTION_BYTES + at, &v, 8);
		crc = kiln_crc32c(0, d + off + KILN_CKPT_SECTION_BYTES, len);
		memcpy(d + off + 40, &crc, 4);
		crc = kiln_crc32c(0, d + off, 44);
		memcpy(d + off + 44, &crc, 4);
		found = 1;
	}
	ck_assert_msg(found, "%s: no section '%s'", path, tag);
	FILE *f = fopen(path, "wb");
	ck_assert(f && fwrite(d, 1, n, f) == n && fclose(f) == 0);
	free(d);
}

#endif
