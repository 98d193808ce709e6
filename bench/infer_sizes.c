/* bench/infer_sizes.c - kiln_infer's cost when calls end on other row
 * counts (docs/inference.md, "What is kept across sizes"): a model loaded
 * at batch 16, one call of 16 rows, then ITERS calls of each pattern,
 * timed after 30 untimed ones:
 *   fixed 5:          5 rows every call (one remainder plan, kept);
 *   5,6 alternating:  a new remainder plan every call;
 *   1..15 cycle:      rows 1, 2, ..., 15, 1, ... (a server passing each
 *                     request's own count).
 * Prints ms a call and the peak resident set (VmHWM) after each.
 * Usage: bench/infer_sizes CONFIG WEIGHTS|- [QUANTIZED] [ITERS]
 *   (WEIGHTS "-": the newest checkpoint of [run] out_dir; QUANTIZED: an
 *   INT8 model of kiln quantize, with WEIGHTS "-"). */
#include <kiln/infer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long peak_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char l[256];
	long v = 0;
	while (f && fgets(l, sizeof l, f))
		if (!strncmp(l, "VmHWM:", 6))
			v = atol(l + 6);
	if (f)
		fclose(f);
	return v;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the rows of call i of pattern k */
static int64_t rows(int k, int i) { return k == 0 ? 5 : k == 1 ? 5 + i % 2 : 1 + i % 15; }

int main(int argc, char **argv)
{
	static const char *const names[] = { "fixed 5", "5,6 alternating", "1..15 cycle" };
	if (argc < 3) {
		fprintf(stderr, "usage: bench/infer_sizes CONFIG WEIGHTS|- [QUANTIZED] [ITERS]\n");
		return 2;
	}
	const char *q = argc > 3 && *argv[3] ? argv[3] : NULL;
	const int iters = argc > 4 ? atoi(argv[4]) : 100;
	struct kiln_infer_opts o = { .quantized = q, .batch = 16 };
	struct kiln_infer *m;
	char *err;
	kiln_log_set_level(KILN_LOG_ERROR);
	if (kiln_model_load(argv[1], strcmp(argv[2], "-") ? argv[2] : NULL, &o, &m, &err)) {
		fprintf(stderr, "bench/infer_sizes: %s\n", err);
		return 1;
	}
	float *x = calloc(16, kiln_infer_input_bytes(m));
	float *y = malloc(sizeof(float) * 16 * kiln_infer_output_elems(m));
	if (!x || !y || kiln_infer(m, x, 16, y))
		return 1;
	printf("after a call of 16 rows: peak rss %ld KiB\n", peak_kib());
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 30; i++)
			kiln_infer(m, x, rows(k, i), y);
		const double t0 = now_s();
		for (int i = 0; i < iters; i++)
			if (kiln_infer(m, x, rows(k, i), y))
				return 1;
		printf("%-16s %.3f ms/call, peak rss %ld KiB\n", names[k], (now_s() - t0) * 1e3 / iters,
		       peak_kib());
	}
	kiln_infer_free(m);
	free(x);
	free(y);
	return 0;
}
