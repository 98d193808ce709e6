/* bench/weights_load.c - the time kiln_model_load_safetensors takes to
 * load a weights file into the model of a config (docs/PERFORMANCE.md,
 * session 42: a file with kiln's CRC32Cs read once, its CRCs checked in
 * the same pass, where it was read twice).  The model is built once on
 * the CPU, then the file loaded ITERS times (the page cache warm after
 * the first: drop it between runs for cold numbers), each timed: wall
 * ms, the process's CPU ms and the bytes it read (/proc/self/io rchar)
 * per load, then the minimum and median wall ms.  With `cold` the file's
 * pages are dropped from the page cache before each load
 * (posix_fadvise DONTNEED: no root needed; what a virtual machine's host
 * caches below it stays).  A WEIGHTS that is not
 * there is written first (kiln_model_save_safetensors of the initial
 * weights, seed 1), so no data set is needed for a large one.
 * Usage: bench/weights_load CONFIG WEIGHTS SAMPLE [ITERS] [cold]
 *   SAMPLE: the model input's dtype and one sample's dims, "i32:1024"
 *   (GPT-2 small's tokens) or "f32:3,224,224" (an image). */
#include <kiln/kiln.h>

#include <fcntl.h> /* posix_fadvise */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench_time.h"      /* now, cpu_now, cmp_double */
#include "../tests/proc_io.h" /* proc_bytes_read */

/* path's pages out of the page cache (written back first). */
static void drop_cached(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

/* "i32:1024" or "f32:3,224,224" into *d; -1 when it is neither. */
static int parse_sample(const char *s, struct kiln_tensor_desc *d)
{
	int64_t dims[8];
	int n = 0, dt = !strncmp(s, "i32:", 4) ? KILN_I32 : !strncmp(s, "f32:", 4) ? KILN_F32 : -1;
	char *end;
	if (dt < 0)
		return -1;
	for (s += 4; n < 8; s = end + 1) {
		dims[n++] = strtoll(s, &end, 10);
		if (*end != ',')
			break;
	}
	if (*end)
		return -1;
	kiln_tensor_desc_init(d, dt, n, dims);
	return 0;
}

int main(int argc, char **argv)
{
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_tensor_desc sample;
	void *s;
	if (argc < 4 || parse_sample(argv[3], &sample)) {
		fprintf(stderr, "usage: bench/weights_load CONFIG WEIGHTS i32:D0|f32:D0,D1,... [ITERS]\n");
		return 2;
	}
	const int iters = argc > 4 ? atoi(argv[4]) : 5, cold = argc > 5 && !strcmp(argv[5], "cold");
	kiln_log_set_level(KILN_LOG_ERROR);
	if (kiln_registry_open(NULL, &reg) || kiln_config_load(argv[1], &cfg) ||
	    kiln_config_validate(cfg, reg) || kiln_device_open(reg, cfg, "cpu", 0, &dev) ||
	    kiln_model_create(cfg, reg, dev, &sample, &m) || kiln_device_stream_create(dev, &s)) {
		fprintf(stderr, "bench/weights_load: %s\n", kiln_last_error());
		return 1;
	}
	FILE *there = fopen(argv[2], "rb");
	if (there) {
		fclose(there);
	} else if (kiln_model_init_params(m, 1, s) || kiln_model_save_safetensors(m, argv[2], s)) {
		fprintf(stderr, "bench/weights_load: %s\n", kiln_last_error());
		return 1;
	}
	double *t = calloc((size_t)iters + 1, sizeof *t);
	for (int i = 0; i < iters; i++) {
		if (cold)
			drop_cached(argv[2]);
		const long long r0 = proc_bytes_read();
		const double t0 = now(), c0 = cpu_now();
		if (kiln_model_load_safetensors(m, argv[2], 1, s)) {
			fprintf(stderr, "bench/weights_load: %s\n", kiln_last_error());
			return 1;
		}
		t[i] = 1e3 * (now() - t0);
		printf("load %d: %.1f ms wall, %.1f ms cpu, %.1f MB read\n", i, t[i],
		       1e3 * (cpu_now() - c0),
		       (double)(proc_bytes_read() - r0) / 1e6);
	}
	qsort(t, (size_t)iters, sizeof *t, cmp_double);
	printf("%s: min %.1f ms, median %.1f ms over %d loads (%s)\n", argv[2], t[0], t[iters / 2],
	       iters, cold ? "cold: its pages dropped before each" : "warm after the first");
	free(t);
	kiln_model_free(m);
	kiln_device_stream_destroy(dev, s);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return 0;
}
