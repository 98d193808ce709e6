/* tests/infer_threads.c - the inference API (include/kiln/infer.h) from
 * threads, run by tests/predict.sh: `infer_threads CONFIG CHECKPOINT`.
 * Single-threaded reference logits for 23 and 7 samples (batch 5: full
 * batches and two different remainders), then four threads at once, each
 * inferring 23 and 7 samples alternately 10 times: two share one model
 * (the lock serialises them; their remainder plans alternate), two load
 * a model each.  Every result equals its reference bit for bit, as do the
 * logits of an input at a 64-byte-aligned address (which the CPU reads in
 * place) and at an unaligned one (copied), which stay unchanged.  Also:
 * the shapes, n = 0, a negative n, and kiln_model_load's error text. */
#include <kiln/infer.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *config, *ckpt;
static struct kiln_infer *shared;
static float *x, *ref23, *ref7;
static size_t out_elems;

static int check(struct kiln_infer *m, const char *who)
{
	float *y = malloc(sizeof(float) * out_elems * 23);
	int bad = !y;
	for (int it = 0; it < 10 && !bad; it++) {
		const int n = it % 2 ? 7 : 23;
		if (kiln_infer(m, x, n, y)) {
			fprintf(stderr, "%s: kiln_infer: %s\n", who, kiln_last_error());
			bad = 1;
		} else if (memcmp(y, n == 7 ? ref7 : ref23, sizeof(float) * out_elems * (size_t)n)) {
			fprintf(stderr, "%s: iteration %d: logits differ from the reference\n", who, it);
			bad = 1;
		}
	}
	free(y);
	return bad;
}

static void *shared_thread(void *arg)
{
	return (void *)(intptr_t)check(shared, arg);
}

static void *own_thread(void *arg)
{
	struct kiln_infer_opts o = { .batch = 5 };
	struct kiln_infer *m;
	char *err;
	if (kiln_model_load(config, ckpt, &o, &m, &err)) {
		fprintf(stderr, "%s: kiln_model_load: %s\n", (const char *)arg, err);
		free(err);
		return (void *)1;
	}
	int bad = check(m, arg);
	kiln_infer_free(m);
	return (void *)(intptr_t)bad;
}

/* kiln's OpenMP rule in an embedding program (core/registry.c): set by
 * the library before the CPU plugin loaded OpenMP (predict.sh runs this
 * program with neither variable set). */
static int omp_rule(void)
{
	const char *w = getenv("OMP_WAIT_POLICY"), *s = getenv("GOMP_SPINCOUNT");
	if (w && !strcmp(w, "PASSIVE") && s && (!strcmp(s, "0") || !strcmp(s, "100000")))
		return 0;
	fprintf(stderr, "OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s after kiln_model_load: want PASSIVE and kiln's spin rule\n",
		w ? w : "(unset)", s ? s : "(unset)");
	return 1;
}

int main(int argc, char **argv)
{
	struct kiln_infer_opts o = { .batch = 5 };
	char *err = NULL;
	int64_t dims[KILN_MAX_DIMS];
	int dtype, bad = 0;
	if (argc != 3) {
		fprintf(stderr, "usage: infer_threads CONFIG CHECKPOINT\n");
		return 2;
	}
	config = argv[1];
	ckpt = argv[2];
	kiln_log_set_level(KILN_LOG_WARN);
	/* a bad load: an error naming the file, no model */
	if (!kiln_model_load("/nonexistent/x.ini", ckpt, &o, &shared, &err) || shared || !err ||
	    !strstr(err, "/nonexistent/x.ini")) {
		fprintf(stderr, "kiln_model_load of a missing config: %s\n", err ? err : "(no error)");
		return 1;
	}
	free(err);
	if (kiln_model_load(config, ckpt, &o, &shared, &err)) {
		fprintf(stderr, "kiln_model_load: %s\n", err);
		return 1;
	}
	if (omp_rule())
		return 1;
	int nd = kiln_infer_input_shape(shared, dims, &dtype);
	if (nd != 3 || dims[0] != 1 || dims[1] != 8 || dims[2] != 8 || dtype != KILN_F32 ||
	    kiln_infer_input_bytes(shared) != 256) {
		fprintf(stderr, "input shape: rank %d [%lld, %lld, %lld]\n", nd, (long long)dims[0],
			(long long)dims[1], (long long)dims[2]);
		return 1;
	}
	if (kiln_infer_output_shape(shared, dims) != 1 || dims[0] != 5 ||
	    (out_elems = kiln_infer_output_elems(shared)) != 5) {
		fprintf(stderr, "output shape: expected [5]\n");
		return 1;
	}
	x = malloc(256 * 23);
	ref23 = malloc(sizeof(float) * 5 * 23);
	ref7 = malloc(sizeof(float) * 5 * 7);
	uint32_t s = 12345;
	for (int i = 0; i < 64 * 23; i++) {
		s = s * 1664525u + 1013904223u;
		((float *)x)[i] = (float)(s >> 8) / 16777216.0f * 2 - 1;
	}
	if (kiln_infer(shared, x, 23, ref23) || kiln_infer(shared, x, 7, ref7) ||
	    kiln_infer(shared, x, 0, ref7) || kiln_infer(shared, x, -1, ref7) != KILN_EINVAL) {
		fprintf(stderr, "kiln_infer: %s\n", kiln_last_error());
		return 1;
	}
	/* the first 5 rows ran in the same batch plan both times */
	if (memcmp(ref23, ref7, sizeof(float) * 5 * 5)) {
		fprintf(stderr, "the first batch's logits differ between calls\n");
		return 1;
	}
	/* the same samples at a 64-byte-aligned address (read in place on the
	 * CPU) and at one 4 bytes past it (copied first): the same logits,
	 * and the caller's buffer left as it was */
	void *al = NULL;
	float *y = malloc(sizeof(float) * 5 * 23);
	if (posix_memalign(&al, 64, 256 * 23 + 64) || !y) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	for (int shift = 0; shift <= 4; shift += 4) {
		char *xa = (char *)al + shift;
		memcpy(xa, x, 256 * 23);
		const kiln_status st = kiln_infer(shared, xa, 23, y);
		if (st || memcmp(y, ref23, sizeof(float) * 5 * 23) || memcmp(xa, x, 256 * 23)) {
			fprintf(stderr, "kiln_infer on an input %s: %s\n",
				shift ? "4 bytes past 64-byte alignment" : "64-byte aligned",
				st ? kiln_last_error() : "logits differ from the reference, or the input changed");
			return 1;
		}
	}
	free(al);
	free(y);
	pthread_t th[4];
	const char *who[4] = { "shared 1", "shared 2", "own 1", "own 2" };
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, i < 2 ? shared_thread : own_thread, (void *)who[i]);
	for (int i = 0; i < 4; i++) {
		void *r;
		pthread_join(th[i], &r);
		bad |= r != NULL;
	}
	kiln_infer_free(shared);
	free(x);
	free(ref23);
	free(ref7);
	if (!bad)
		printf("ok: 4 threads (2 on one model, 2 with their own) x 10 runs equal the reference\n");
	return bad;
}
