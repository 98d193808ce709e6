/* tests/proc_io.h - the bytes this process has read so far (read and
 * pread: /proc/self/io's rchar), for the tests and benches that count what
 * a load reads (tests/check_safetensors.c, tests/check_infer_passes.c,
 * bench/weights_load.c). */
#ifndef KILN_TESTS_PROC_IO_H
#define KILN_TESTS_PROC_IO_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rchar, or -1 where /proc/self/io cannot be read */
static inline long long proc_bytes_read(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	char l[128];
	long long v = -1;
	while (f && fgets(l, sizeof l, f))
		if (!strncmp(l, "rchar:", 6))
			v = atoll(l + 6);
	if (f)
		fclose(f);
	return v;
}
#endif
