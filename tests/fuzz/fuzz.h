/* tests/fuzz/fuzz.h - what the fuzz targets share.
 *
 * Each tests/fuzz/fuzz_NAME.c defines LLVMFuzzerTestOneInput for one
 * reader of untrusted bytes.  `make fuzz` links it with libFuzzer (clang,
 * -fsanitize=fuzzer,address,undefined); `make check` links it with
 * driver.c, which feeds it every file of tests/fuzz/corpus/NAME, so the
 * corpora are regression tests under gcc too (docs/fuzzing.md).
 *
 * The readers take paths, so an input is written to a file of a scratch
 * directory this process makes once and removes at exit.
 */
#ifndef KILN_TESTS_FUZZ_H
#define KILN_TESTS_FUZZ_H

#include <kiln/kiln.h>

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir[512];

static inline void fuzz_cleanup(void)
{
	DIR *d = opendir(fuzz_dir);
	if (!d)
		return;
	struct dirent *de;
	char p[1024];
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			snprintf(p, sizeof p, "%s/%s", fuzz_dir, de->d_name);
			unlink(p);
		}
	closedir(d);
	rmdir(fuzz_dir);
}

/* Once per process: the scratch directory, errors not logged, a store
 * token. */
static inline void fuzz_init(void)
{
	if (fuzz_dir[0])
		return;
	const char *t = getenv("TMPDIR");
	snprintf(fuzz_dir, sizeof fuzz_dir, "%s/kiln-fuzz-XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(fuzz_dir)) {
		perror(fuzz_dir);
		abort();
	}
	atexit(fuzz_cleanup);
	kiln_log_set_level(KILN_LOG_ERROR);
	/* the rendezvous store needs a token (make check sets one; make fuzz
	 * and a target run by hand did not, and fuzz_store aborted on its
	 * first input); one already set is kept */
	setenv("KILN_STORE_TOKEN", "kiln-fuzz-0123456789abcdef", 0);
}

/* data[0..size) as the file NAME of the scratch directory: its path. */
static inline const char *fuzz_file(const char *name, const void *data, size_t size)
{
	static char path[1024];
	fuzz_init();
	snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f)) {
		perror(path);
		abort();
	}
	return path;
}

/* Little-endian fields, for the harnesses that recompute CRCs. */
static inline uint64_t fuzz_get_le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;
	for (int i = bytes - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline void fuzz_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> 8 * i);
}

/* st, after printing its message when FUZZ_VERBOSE is set (to see what a
 * corpus file reaches: `FUZZ_VERBOSE=1 tests/fuzz/fuzz_NAME FILE`). */
static inline kiln_status fuzz_report(const char *what, kiln_status st)
{
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "%s: %s %s\n", what, kiln_status_name(st),
			st ? kiln_last_error() : "");
	return st;
}

#endif
