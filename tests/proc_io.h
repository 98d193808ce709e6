/* tests/proc_io.h - numbers of this process that /proc keeps, for the
 * tests and benches that count what a load reads or maps
 * (tests/check_safetensors.c, tests/check_infer_passes.c,
 * tests/openblas_host.c, bench/weights_load.c, bench/infer_sizes.c). */
#ifndef KILN_TESTS_PROC_IO_H
#define KILN_TESTS_PROC_IO_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after `key` ("rchar:", "VmSize:") at the start of a line of
 * the file `path` ("/proc/self/io"), or -1 where it has none. */
static inline long long proc_value(const char *path, const char *key)
{
	FILE *f = fopen(path, "r");
	char l[256];
	long long v = -1;
	const size_t k = strlen(key);
	while (f && fgets(l, sizeof l, f))
		if (!strncmp(l, key, k))
			v = atoll(l + k);
	if (f)
		fclose(f);
	return v;
}

/* The bytes this process has read so far (read and pread: rchar), -1
 * where the kernel does not say. */
static inline long long proc_bytes_read(void)
{
	return proc_value("/proc/self/io", "rchar:");
}
#endif
