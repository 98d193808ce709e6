/* bench/infer_sizes.c - kiln_infer's cost when calls end on other row
 * counts (docs/inference.md, "What is kept across sizes"): a model loaded
 * at batch B (16), one call of B rows, then ITERS calls of each pattern,
 * timed after min(30, ITERS) untimed ones (at B = 16):
 *   fixed 5:          5 rows every call (one remainder plan, kept);
 *   5,6 alternating:  a new remainder plan every call;
 *   1..15 cycle:      rows 1, 2, ..., 15, 1, ... (a server passing each
 *                     request's own count).
 * (At another B: B / 3 rows; B / 3 and one more; 1 .. B - 1.)
 * Prints ms a call (wall time), the process's CPU ms a call (all its
 * threads: what a call costs whatever else the machine runs; since session
 * 41) and the peak resident set (VmHWM) after each.
 * Usage: bench/infer_sizes CONFIG WEIGHTS|- [QUANTIZED] [ITERS] [B]
 *   (WEIGHTS "-": the newest checkpoint of [run] out_dir; QUANTIZED: an
 *   INT8 model of kiln quantize, with WEIGHTS "-"). */
#include <kiln/infer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_time.h"      /* now, cpu_now */
#include "../tests/proc_io.h" /* proc_value */

/* the peak resident set, KiB (VmHWM) */
static long peak_kib(void)
{
	return (long)proc_value("/proc/self/status", "VmHWM:");
}

/* the rows of call i of pattern k at batch b */
static int64_t rows(int k, int i, int64_t b)
{
	const int64_t f = b / 3 > 0 ? b / 3 : 1;
	return k == 0 ? f : k == 1 ? f + i % 2 : 1 + i % (b > 1 ? b - 1 : 1);
}

int main(int argc, char **argv)
{
	static const char *const names[] = { "fixed", "alternating", "cycle" };
	if (argc < 3) {
		fprintf(stderr, "usage: bench/infer_sizes CONFIG WEIGHTS|- [QUANTIZED] [ITERS] [B]\n");
		return 2;
	}
	const char *q = argc > 3 && *argv[3] ? argv[3] : NULL;
	const int iters = argc > 4 ? atoi(argv[4]) : 100, warm = iters < 30 ? iters : 30;
	const int64_t b = argc > 5 ? atoll(argv[5]) : 16;
	struct kiln_infer_opts o = { .quantized = q, .batch = b };
	struct kiln_infer *m;
	char *err;
	kiln_log_set_level(KILN_LOG_ERROR);
	if (kiln_model_load(argv[1], strcmp(argv[2], "-") ? argv[2] : NULL, &o, &m, &err)) {
		fprintf(stderr, "bench/infer_sizes: %s\n", err);
		return 1;
	}
	float *x = calloc((size_t)b, kiln_infer_input_bytes(m));
	float *y = malloc(sizeof(float) * (size_t)b * kiln_infer_output_elems(m));
	if (!x || !y || kiln_infer(m, x, b, y))
		return 1;
	printf("after a call of %lld rows: peak rss %ld KiB\n", (long long)b, peak_kib());
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < warm; i++)
			kiln_infer(m, x, rows(k, i, b), y);
		const double t0 = now(), c0 = cpu_now();
		for (int i = 0; i < iters; i++)
			if (kiln_infer(m, x, rows(k, i, b), y))
				return 1;
		char what[64]; /* "fixed 5", "alternating 5,6", "cycle 1..15" at B = 16 */
		if (k)
			snprintf(what, sizeof what, "%s %lld%s%lld", names[k], (long long)rows(k, 0, b),
				 k == 1 ? "," : "..", (long long)(k == 1 ? rows(k, 1, b) : b - 1));
		else
			snprintf(what, sizeof what, "%s %lld", names[k], (long long)rows(k, 0, b));
		const double t1 = now(), c1 = cpu_now();
		printf("%-18s %.3f ms/call, cpu %.3f ms/call, peak rss %ld KiB\n", what, (t1 - t0) * 1e3 / iters,
		       (c1 - c0) * 1e3 / iters, peak_kib());
	}
	kiln_infer_free(m);
	free(x);
	free(y);
	return 0;
}
