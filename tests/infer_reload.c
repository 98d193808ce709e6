/* tests/infer_reload.c - new weights loaded into a model that already has
 * inference plans (frozen weights, ABI 2.15: KILN_OPF_FROZEN; the CPU
 * device keeps its convolutions' reordered weights from run to run), run
 * by tests/infer_wreorder.sh: `infer_reload CONFIG A.safetensors
 * B.safetensors`.  With batches of 4, 12 samples are 3 runs of one plan:
 *  - logits with A loaded (kiln_model_load), then B loaded into the same
 *    model (kiln_infer_model, core/infer_passes.h, which onnx_export.c
 *    uses, + kiln_model_load_safetensors), then the same
 *    samples again: these must be, byte for byte, the logits of a model
 *    loaded from B alone, and differ from A's (a kept copy made from A's
 *    weights and used after the load gives A's logits again);
 *  - A loaded back into it: A's logits again.
 * `infer_reload --quantized CONFIG QA QB`: INT8 models of `kiln quantize`
 * (the CPU's QCONV and QLINEAR keep their quantized weights, frozen, ABI
 * 2.15): QB's weights are loaded into QA's model (kiln_quant_load, as
 * kiln_infer_open does), which keeps QA's input scales (from the
 * config), so B's logits are those of a model loaded from QA with QB's
 * weights loaded before its first run.
 * `infer_reload --quantized --sizes CONFIG QA QB`: calls of 5, 6, 5, 6, 5
 * and 6 rows at batch 16 (each a partial batch: a plan for each size,
 * made again when the other comes, core/infer.c) give the bytes of a
 * fresh model's one call of that size, and quantize each INT8 layer's
 * weights once, not once per plan (the CPU shares them between a model's
 * plans, plugins/cpu/qweights.c; the script counts the debug log's
 * `weights quantized` per phase); then QB's weights loaded into the model
 * and a call of 7 rows (a new plan, run first after the load) and one of
 * 5 give a fresh QA-with-QB model's bytes: the values shared from before
 * the load are not used.
 * `infer_reload --sizes CONFIG A B` (session 40): the same with f32
 * weights (safetensors files of the unfolded model): the CPU shares a
 * frozen convolution's reordered and Winograd-transformed weights between
 * the plans the same way (plugins/cpu/wshare.c), which the script counts
 * from the debug log. */
#include <kiln/infer.h>
#include <kiln/kiln.h>
#include "infer_passes.h" /* kiln_infer_model: the library's own path, not public API */
#include "quant.h"        /* kiln_quant_load: the same */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 12

static const char *config;
static int quantized; /* --quantized: the files are INT8 models */
static int batch = 4; /* --sizes: 16 */
static float *x;
static size_t out_elems;

static struct kiln_infer *load(const char *weights)
{
	/* fp32: unfolded, so B's weights fit the model's parameters; an INT8
	 * model is folded (no_fold with it is refused) */
	struct kiln_infer_opts o = { .batch = batch, .no_fold = !quantized,
				     .quantized = quantized ? weights : NULL };
	struct kiln_infer *m;
	char *err;
	if (kiln_model_load(config, quantized ? NULL : weights, &o, &m, &err)) {
		fprintf(stderr, "kiln_model_load %s: %s\n", weights, err);
		free(err);
		return NULL;
	}
	return m;
}

static int logits(struct kiln_infer *m, float *y, const char *what)
{
	fprintf(stderr, "infer_reload: logits: %s\n", what); /* the script counts the log by phase */
	if (!kiln_infer(m, x, N, y))
		return 0;
	fprintf(stderr, "%s: kiln_infer: %s\n", what, kiln_last_error());
	return 1;
}

static int reload(struct kiln_infer *m, const char *weights)
{
	void *stream;
	struct kiln_model *km = kiln_infer_model(m, &stream);
	if (quantized) {
		struct kiln_safetensors *f;
		kiln_status st = kiln_safetensors_open(weights, &f);
		if (!st) {
			st = kiln_quant_load(km, f, stream);
			kiln_safetensors_close(f);
		}
		if (!st)
			return 0;
	} else if (!kiln_model_load_safetensors(km, weights, 1, stream)) {
		return 0;
	}
	fprintf(stderr, "kiln_model_load_safetensors %s: %s\n", weights, kiln_last_error());
	return 1;
}

/* The logits of n rows of model m (phase `what`) into y, compared with
 * ref's when ref is not NULL: 0 when equal, byte for byte. */
static int rows(struct kiln_infer *m, int64_t n, float *y, const float *ref, const char *what)
{
	if (*what) /* a phase begins */
		fprintf(stderr, "infer_reload: logits: %s\n", what);
	if (kiln_infer(m, x, n, y)) {
		fprintf(stderr, "%s: kiln_infer: %s\n", what, kiln_last_error());
		return 1;
	}
	if (ref && memcmp(y, ref, sizeof(float) * out_elems * (size_t)n)) {
		fprintf(stderr, "%s: the logits differ from a fresh model's call of %lld rows\n", what,
			(long long)n);
		return 1;
	}
	return 0;
}

/* --sizes (see the top): references from fresh models, then one model's
 * calls of alternating sizes, then QB loaded into it. */
static int sizes(const char *qa, const char *qb)
{
	const size_t ob = sizeof(float) * out_elems * N;
	float *y5 = malloc(ob), *y6 = malloc(ob), *b7 = malloc(ob), *b5 = malloc(ob), *y = malloc(ob);
	struct kiln_infer *r5 = load(qa), *r6 = load(qa), *rb = load(qa), *m = load(qa);
	int bad = !y5 || !y6 || !b7 || !b5 || !y || !r5 || !r6 || !rb || !m || reload(rb, qb) ||
		  rows(r5, 5, y5, NULL, "fresh A, 5 rows") || rows(r6, 6, y6, NULL, "fresh A, 6 rows") ||
		  rows(rb, 7, b7, NULL, "fresh A with B loaded, 7 rows") ||
		  rows(rb, 5, b5, NULL, "fresh A with B loaded, then 5 rows");
	if (!bad && !memcmp(y5, b5, sizeof(float) * out_elems * 5)) {
		fprintf(stderr, "A and B give the same logits: no test\n");
		bad = 1;
	}
	for (int i = 0; i < 6 && !bad; i++)
		bad = rows(m, 5 + i % 2, y, i % 2 ? y6 : y5, i ? "" : "A, 5 6 5 6 5 6 rows");
	bad = bad || reload(m, qb) || rows(m, 7, y, b7, "A, then B loaded, 7 rows") ||
	      rows(m, 5, y, b5, "A, then B loaded, then 5 rows");
	if (!bad)
		printf("ok: calls of 5 and 6 rows at batch %d give a fresh model's bytes; after a load, 7 and 5 rows the new weights'\n",
		       batch);
	kiln_infer_free(r5), kiln_infer_free(r6), kiln_infer_free(rb), kiln_infer_free(m);
	free(y5), free(y6), free(b7), free(b5), free(y);
	return bad;
}

int main(int argc, char **argv)
{
	int by_size = 0;
	if (argc >= 5 && !strcmp(argv[1], "--quantized"))
		quantized = 1, argc--, argv++;
	if (argc == 5 && !strcmp(argv[1], "--sizes"))
		by_size = 1, batch = 16, argc--, argv++;
	if (argc != 4) {
		fprintf(stderr, "usage: infer_reload [--quantized] [--sizes] CONFIG A.safetensors B.safetensors\n");
		return 2;
	}
	config = argv[1];
	const char *lv = getenv("KILN_LOG_LEVEL");
	if (lv && !strcmp(lv, "debug")) /* as the CLI: the device's debug lines */
		kiln_log_set_level(KILN_LOG_DEBUG);
	struct kiln_infer *a = load(argv[2]), *b = NULL;
	if (!a)
		return 1;
	const size_t in = kiln_infer_input_bytes(a);
	out_elems = kiln_infer_output_elems(a);
	const size_t ob = sizeof(float) * out_elems * N;
	x = malloc(in * N);
	if (!x)
		return 1;
	uint32_t r = 12345; /* the samples: pseudo-random in [0, 1) */
	for (size_t i = 0; i < in * N / sizeof(float); i++) {
		r = r * 1664525u + 1013904223u;
		x[i] = (float)(r >> 8) / 16777216.0f;
	}
	if (by_size) {
		kiln_infer_free(a);
		const int bad = sizes(argv[2], argv[3]);
		free(x);
		return bad;
	}
	b = load(quantized ? argv[2] : argv[3]);
	if (!b || (quantized && reload(b, argv[3]))) /* QA's model, QB's weights, not run yet */
		return 1;
	float *la = malloc(ob), *lb = malloc(ob), *l1 = malloc(ob), *l2 = malloc(ob);
	if (!la || !lb || !l1 || !l2)
		return 1;
	if (logits(a, la, "A") || logits(b, lb, "B"))
		return 1;
	if (!memcmp(la, lb, ob)) {
		fprintf(stderr, "A and B give the same logits: no test\n");
		return 1;
	}
	if (reload(a, argv[3]) || logits(a, l1, "A, then B loaded"))
		return 1;
	if (memcmp(l1, lb, ob)) {
		fprintf(stderr, "B loaded into A's model: logits differ from B's (%s A's)\n",
			memcmp(l1, la, ob) ? "nor are they" : "they are");
		return 1;
	}
	if (reload(a, argv[2]) || logits(a, l2, "B, then A loaded back"))
		return 1;
	if (memcmp(l2, la, ob)) {
		fprintf(stderr, "A loaded back: logits differ from A's\n");
		return 1;
	}
	printf("ok: %d samples in runs of 4: the logits follow the weights loaded (A, B, A), byte for byte\n", N);
	kiln_infer_free(a);
	kiln_infer_free(b);
	free(x), free(la), free(lb), free(l1), free(l2);
	return 0;
}
