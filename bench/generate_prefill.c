/* bench/generate_prefill.c - where a prompt's time goes in kiln_generate
 * (docs/generate.md, "Measured: prefill plans held, blocked attention",
 * session 44): one generator of CONFIG's model and checkpoint, prompts of
 * the given lengths (bytes of a fixed text, the byte tokenizer's ids),
 * each fed REPS times in turn, and per length the least wall time of
 *   first    the prompt and 1 new token, prefilled, just after a prompt of
 *            another run length (warm_len: the prefill plan made, as at
 *            every prompt before session 44)
 *   again    the same prompt once more (the plan held, session 44)
 *   steps    the same fed a step a position (kiln_generator_prefill_max 1)
 *   decode   (the prompt and 33 new tokens - the prompt and 1) / 32: one
 *            new token's step
 * and the prompt's rates, (length - 1) / (first, again or steps - one
 * step) tokens/s (its last token is a step either way).  Prints one line
 * a length.  LEN: 2 to MAX_LEN tokens, at most MAX_LENS of them.
 *
 * Usage: bench/generate_prefill CONFIG CHECKPOINT REPS LEN... [key=value...]
 * (from the top of a built tree; OMP_WAIT_POLICY=PASSIVE as the CLI sets).
 */
#include <kiln/kiln.h>
#include "graph.h" /* kiln_generator_prefill_max */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds of kiln_generate of prompt[0..n) and n_new greedy tokens. */
static double gen_time(struct kiln_generator *g, const int32_t *prompt, int64_t n, int64_t n_new)
{
	static int32_t out[64];
	const struct kiln_sample_opts o = { .temperature = 0 };
	const double t0 = now();
	if (kiln_generate(g, prompt, n, n_new, &o, out, NULL, NULL)) {
		fprintf(stderr, "generate_prefill: %s\n", kiln_last_error());
		exit(1);
	}
	return now() - t0;
}

static double least(double a, double b) { return a < b ? a : b; }

enum { MAX_LENS = 16, MAX_LEN = 4096 };

/* A prompt's length whose prefill run length (core/generate.c's
 * prefill_plan: the least power of two >= its length - 1, at least 2)
 * is not that of a prompt of n tokens: 3 tokens (a run of 2) before a
 * prompt of 4 or more, else 5 (a run of 4). */
static int64_t warm_len(int64_t n) { return n - 1 > 2 ? 3 : 5; }

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s CONFIG CHECKPOINT REPS LEN... [key=value...]\n", argv[0]);
		return 2;
	}
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_generator *g;
	int reps = atoi(argv[3]), n_len = 0;
	int64_t lens[MAX_LENS];
	if (reps < 1) {
		fprintf(stderr, "generate_prefill: REPS = '%s': expected a count of at least 1\n", argv[3]);
		return 2;
	}
	for (int i = 4; i < argc; i++) {
		if (strchr(argv[i], '='))
			continue;
		const int64_t n = atoll(argv[i]);
		if (n_len == MAX_LENS || n < 2 || n > MAX_LEN) {
			fprintf(stderr, n_len == MAX_LENS ? "generate_prefill: LEN '%s': more than %d lengths\n"
							  : "generate_prefill: LEN '%s': expected 2 to %d tokens\n",
				argv[i], n_len == MAX_LENS ? MAX_LENS : MAX_LEN);
			return 2;
		}
		lens[n_len++] = n;
	}
	if (kiln_config_load(argv[1], &cfg))
		goto fail;
	for (int i = 4; i < argc; i++)
		if (strchr(argv[i], '=') && kiln_config_override(cfg, argv[i]))
			goto fail;
	if (kiln_config_validate(cfg, NULL) || kiln_registry_open(NULL, &reg) ||
	    kiln_config_validate(cfg, reg) || kiln_generator_open(cfg, reg, argv[2], &g))
		goto fail;
	const char text[] = "Q: What is the difference between a duck? A: One of its legs is both the same. ";
	int32_t *prompt = malloc(sizeof *prompt * MAX_LEN);
	if (!prompt) {
		fprintf(stderr, "generate_prefill: out of memory\n");
		return 1;
	}
	for (int i = 0; i < MAX_LEN; i++)
		prompt[i] = (unsigned char)text[i % (sizeof text - 1)];
	printf("%6s %9s %9s %9s %9s %9s %11s %11s %11s\n", "length", "first_ms", "again_ms", "steps_ms",
	       "decode_ms", "plan_ms", "tok/s_first", "tok/s_again", "tok/s_steps");
	for (int k = 0; k < n_len; k++) {
		const int64_t n = lens[k];
		double first = 1e9, again = 1e9, steps = 1e9, one = 1e9, many = 1e9;
		for (int r = 0; r < reps; r++) {
			kiln_generator_prefill_max(g, 256);
			gen_time(g, prompt, warm_len(n), 1); /* another run length */
			first = least(first, gen_time(g, prompt, n, 1));
			again = least(again, gen_time(g, prompt, n, 1));
			one = least(one, gen_time(g, prompt, n, 1));
			many = least(many, gen_time(g, prompt, n, 33));
			kiln_generator_prefill_max(g, 1);
			steps = least(steps, gen_time(g, prompt, n, 1));
		}
		const double step = (many - one) / 32;
		printf("%6lld %9.2f %9.2f %9.2f %9.3f %9.2f %11.0f %11.0f %11.0f\n", (long long)n, 1e3 * first,
		       1e3 * again, 1e3 * steps, 1e3 * step, 1e3 * (first - again), (double)(n - 1) / (first - step),
		       (double)(n - 1) / (again - step), (double)(n - 1) / (steps - step));
	}
	kiln_generator_close(g);
	free(prompt);
	return 0;
fail:
	fprintf(stderr, "generate_prefill: %s\n", kiln_last_error());
	return 1;
}
