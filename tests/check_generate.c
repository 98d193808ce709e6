/* tests/check_generate.c - generation (core/generate.c, docs/generate.md):
 * the decode plan's logits, one token at a time with the key/value caches,
 * equal the full-sequence forward's at every position (f32; batch 1 and 3;
 * bf16 within its rounding); greedy generation continues with the argmax
 * of the full forward; sampling's draws are deterministic for a seed and
 * follow softmax(logits / temperature) over the top k; top-p: the kept
 * ids and renormalised probabilities equal HuggingFace's TopPLogitsWarper
 * (tests/data/top_p_refs.txt, tests/data/gen_top_p_refs.py), the draws
 * invert them at Philox's u (Random123 here, an independent reference of
 * the draw), top-p 1 draws as before it existed, and only the nucleus is
 * ever drawn; several samples decoded at once are each a one-row
 * decode's draws on their own stream, sample 0 kiln_generate's; the
 * error cases.  Session 42: several samples feed their prompt once (the
 * one-row decode's caches, the prompt's positions only, copied into
 * every row) and draw the tokens of a plan of N rows fed it in every row
 * (the way before), f32 and bf16; a one-row call frees the N-row plan; a
 * step past the positions the caches hold is refused, and after several
 * samples the one-row decode holds the prompt; a plan of more samples
 * than the device's memory holds is KILN_EUSAGE naming them and the
 * bytes the generator allocates; a context below 1 is refused (NULL
 * arguments: tests/check_api_null.c).
 *
 * Model: a 2-block GPT (GPT-2's wiring, tied lm_head) with V = 11, C = 16,
 * 2 heads, context T = 9 (odd, not a multiple of any block size).
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include "graph.h" /* kiln_device_layout_only, a dry plan's workspace and logits: rows_need */
#include <Random123/philox.h> /* the reference of the draws' u */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>       /* mallopt: samples_in_room's heap */
#include <sys/resource.h> /* setrlimit: a device of little free memory */

static struct kiln_registry *reg;

enum { V = 11, T = 9, BMAX = 3 };

static const char block[] =
	"[layer.h%d.ln_1]\ntype = layernorm\ninput = %s\n"
	"[layer.h%d.c_attn]\ntype = linear\nout = 48\n"
	"[layer.h%d.sdpa]\ntype = attention\nheads = 2\n%s"
	"[layer.h%d.c_proj]\ntype = linear\nout = 16\n"
	"[layer.h%d.res_1]\ntype = add\ninputs = h%d.c_proj, %s\n"
	"[layer.h%d.ln_2]\ntype = layernorm\n"
	"[layer.h%d.c_fc]\ntype = linear\nout = 64\n"
	"[layer.h%d.gelu]\ntype = gelu\napproximate = tanh\n"
	"[layer.h%d.mlp_proj]\ntype = linear\nout = 16\n"
	"[layer.h%d.res_2]\ntype = add\ninputs = h%d.mlp_proj, h%d.res_1\n";

/* The tiny GPT's config; `attn` is extra [layer.hN.sdpa] keys, `loss`
 * extra [layer.loss] keys. */
static void gpt_ini(char *out, size_t n, const char *attn, const char *loss)
{
	int k = snprintf(out, n, "[run]\nseed = 3\n"
				 "[layer.wte]\ntype = embedding\nvocab = %d\ndim = 16\n"
				 "[layer.wpe]\ntype = pos_embedding\nmax_len = %d\n", V, T + 2);
	for (int b = 0; b < 2; b++) {
		char in[16];
		snprintf(in, sizeof in, b ? "h0.res_2" : "wpe");
		k += snprintf(out + k, n - (size_t)k, block, b, in, b, b, attn, b, b, b, in, b, b, b,
			      b, b, b, b);
	}
	snprintf(out + k, n - (size_t)k,
		 "[layer.ln_f]\ntype = layernorm\n"
		 "[layer.lm_head]\ntype = linear\nout = %d\nbias = 0\ntie = wte\n"
		 "[layer.loss]\ntype = softmax_xent\n%s", V, loss);
}

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	int32_t *tok, *lab, *pos; /* device */
	float *metrics;
};

static void rig_open(struct rig *r, const char *attn, const char *loss, int dtype)
{
	char ini[8192];
	memset(r, 0, sizeof *r);
	gpt_ini(ini, sizeof ini, attn, loss);
	r->cfg = test_config(reg, ini);
	const int64_t t = T;
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_I32, 1, &t);
	ck_assert(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev) == 0);
	ck_assert_msg(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m) == 0, "%s",
		      kiln_last_error());
	if (dtype != KILN_F32)
		ck_assert(kiln_model_set_compute_dtype(r->m, dtype) == 0);
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert(kiln_model_init_params(r->m, 7, r->stream) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * BMAX * T, (void **)&r->tok) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * BMAX * T, (void **)&r->lab) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->pos) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->metrics) == 0);
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->tok, r->lab, r->pos, r->metrics };
	test_rig_free_bufs(r->dev, r->stream, bufs, 4);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* f32 copies of n values of dtype at host src. */
static void widen(float *y, const void *src, int dtype, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (dtype == KILN_BF16) {
			uint32_t u = (uint32_t)((const uint16_t *)src)[i] << 16;
			memcpy(&y[i], &u, sizeof u);
		} else {
			y[i] = ((const float *)src)[i];
		}
	}
}

/* The full forward's logits of tokens[B][T] into full[B][T][V]. */
static void full_logits(struct rig *r, int B, const int32_t *tokens, float *full)
{
	struct kiln_plan *p;
	struct kiln_plan_opts o = { .keep_all = 1 };
	void *y;
	struct kiln_tensor_desc d;
	static char host[sizeof(float) * BMAX * T * V];
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &o, &p) == 0, "%s", kiln_last_error());
	TEST_H2D(r, r->tok, tokens, sizeof(int32_t) * (size_t)(B * T));
	ck_assert(kiln_device_copy_async(r->dev, r->lab, tokens, sizeof(int32_t) * (size_t)(B * T),
					 KILN_COPY_H2D, r->stream) == 0);
	ck_assert_msg(kiln_plan_forward(p, r->tok, r->lab, r->metrics, r->stream) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_sync(r->dev, r->stream) == 0);
	ck_assert(kiln_plan_tensor(p, "lm_head", "y", &y, &d) == 0);
	ck_assert_int_eq(kiln_tensor_numel(&d), B * T * V);
	TEST_D2H(r, host, y, kiln_tensor_bytes(&d));
	widen(full, host, d.dtype, (size_t)(B * T * V));
	kiln_plan_free(p);
}

/* Decode tokens[B][T] a position at a time; each step's logits against
 * full[b][t]: |a - b| <= tol * (1 + |b|). */
static void decode_matches(struct rig *r, int B, const int32_t *tokens, const float *full,
			   double tol)
{
	struct kiln_plan *p;
	struct kiln_plan_opts o = { .decode = T };
	void *y;
	struct kiln_tensor_desc d;
	char host[sizeof(float) * BMAX * V];
	float got[BMAX * V];
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &o, &p) == 0, "%s", kiln_last_error());
	ck_assert(kiln_plan_logits(p, &y, &d) == 0);
	ck_assert_int_eq(d.ndim, 3);
	ck_assert_int_eq(d.dims[0], B);
	ck_assert_int_eq(d.dims[1], 1);
	ck_assert_int_eq(d.dims[2], V);
	double worst = 0;
	for (int32_t t = 0; t < T; t++) {
		int32_t col[BMAX];
		for (int b = 0; b < B; b++)
			col[b] = tokens[b * T + t];
		TEST_H2D(r, r->tok, col, sizeof(int32_t) * (size_t)B);
		TEST_H2D(r, r->pos, &t, sizeof t);
		ck_assert_msg(kiln_plan_decode(p, r->tok, r->pos, r->stream) == 0, "%s",
			      kiln_last_error());
		TEST_D2H(r, host, y, kiln_tensor_bytes(&d));
		widen(got, host, d.dtype, (size_t)(B * V));
		for (int b = 0; b < B; b++)
			for (int v = 0; v < V; v++) {
				const double want = full[(b * T + t) * V + v], e = fabs(got[b * V + v] - want);
				ck_assert_msg(e <= tol * (1 + fabs(want)),
					      "B=%d row %d position %d logit %d: decoded %.7g, full forward %.7g",
					      B, b, t, v, got[b * V + v], want);
				worst = e > worst ? e : worst;
			}
	}
	kiln_plan_free(p);
}

static void tokens_of(int32_t *tok, int n, unsigned seed)
{
	for (int i = 0; i < n; i++)
		tok[i] = (int32_t)((seed * 7919u + (unsigned)i * 104729u + (unsigned)(i * i) * 31u) % V);
}

START_TEST(test_decode_equals_full)
{
	struct rig r;
	int32_t tok[BMAX * T];
	float full[BMAX * T * V];
	rig_open(&r, "", "", KILN_F32);
	for (int B = 1; B <= BMAX; B += 2) {
		tokens_of(tok, B * T, (unsigned)B);
		full_logits(&r, B, tok, full);
		decode_matches(&r, B, tok, full, 2e-5);
	}
	rig_close(&r);
}
END_TEST

/* bf16 compute: the same computation in another order of roundings. */
START_TEST(test_decode_bf16)
{
	struct rig r;
	int32_t tok[T];
	float full[T * V];
	rig_open(&r, "", "", KILN_BF16);
	tokens_of(tok, T, 5);
	full_logits(&r, 1, tok, full);
	decode_matches(&r, 1, tok, full, 4e-3);
	rig_close(&r);
}
END_TEST

/* Greedy generation from a 3-token prompt to the context: every new token
 * is the argmax of the full forward's logits at the position before it. */
START_TEST(test_greedy_is_full_argmax)
{
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t seq[T], out[T];
	float full[T * V];
	rig_open(&r, "", "", KILN_F32);
	ck_assert_msg(kiln_generator_new(r.m, r.stream, T, &g) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_generator_context(g), T);
	ck_assert_int_eq(kiln_generator_vocab(g), V);
	const struct kiln_sample_opts greedy = { .temperature = 0 };
	ck_assert_msg(kiln_generate(g, prompt, 3, T - 3, &greedy, out, NULL, NULL) == 0, "%s",
		      kiln_last_error());
	memcpy(seq, prompt, sizeof prompt);
	memcpy(seq + 3, out, sizeof(int32_t) * (T - 3));
	full_logits(&r, 1, seq, full);
	for (int t = 2; t < T - 1; t++) {
		int best = 0;
		for (int v = 1; v < V; v++)
			if (full[t * V + v] > full[t * V + best])
				best = v;
		ck_assert_msg(seq[t + 1] == best, "position %d: generated %d, full forward's argmax %d",
			      t + 1, seq[t + 1], best);
	}
	/* sampled: the same seed, the same tokens; another seed, others */
	int32_t a[T], b[T], c[T];
	struct kiln_sample_opts s = { .temperature = 1.5, .seed = 11 };
	ck_assert(kiln_generate(g, prompt, 3, T - 3, &s, a, NULL, NULL) == 0);
	ck_assert(kiln_generate(g, prompt, 3, T - 3, &s, b, NULL, NULL) == 0);
	ck_assert_mem_eq(a, b, sizeof(int32_t) * (T - 3));
	int differ = 0;
	for (s.seed = 12; s.seed < 20 && !differ; s.seed++) {
		ck_assert(kiln_generate(g, prompt, 3, T - 3, &s, c, NULL, NULL) == 0);
		differ = memcmp(a, c, sizeof(int32_t) * (T - 3)) != 0;
	}
	ck_assert_msg(differ, "eight other seeds drew the same tokens");
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* The draws follow softmax(logits / temperature) over the top k. */
START_TEST(test_sampling)
{
	const float logits[5] = { 0.5f, 2.0f, -1.0f, 1.0f, 2.0f };
	const double temp = 0.7;
	enum { N = 40000 };
	for (int k = 0; k <= 3; k += 3) {
		struct kiln_sample_opts o = { .temperature = temp, .top_k = k, .seed = 42 };
		int counts[5] = { 0 };
		for (int i = 0; i < N; i++) {
			int32_t id;
			ck_assert(kiln_sample_token(logits, 5, &o, (uint64_t)i, &id) == 0);
			ck_assert(id >= 0 && id < 5);
			counts[id]++;
			int32_t again;
			ck_assert(kiln_sample_token(logits, 5, &o, (uint64_t)i, &again) == 0);
			ck_assert_int_eq(id, again);
		}
		/* top 3: ids 1 and 4 (2.0, the tie both in), then 3 (1.0) */
		const int in[5] = { k == 0, 1, k == 0, 1, 1 };
		double z = 0;
		for (int v = 0; v < 5; v++)
			z += in[v] ? exp(logits[v] / temp) : 0;
		for (int v = 0; v < 5; v++) {
			const double p = in[v] ? exp(logits[v] / temp) / z : 0;
			const double f = (double)counts[v] / N, sd = sqrt(p * (1 - p) / N);
			ck_assert_msg(fabs(f - p) <= 5 * sd + 1e-12, "top_k %d id %d: frequency %.4f, probability %.4f",
				      k, v, f, p);
		}
	}
	/* greedy: the first largest; top_k 1 too; vocab leaves out ids >= it */
	struct kiln_sample_opts g = { .temperature = 0 };
	int32_t id;
	ck_assert(kiln_sample_token(logits, 5, &g, 0, &id) == 0);
	ck_assert_int_eq(id, 1);
	g = (struct kiln_sample_opts){ .temperature = 3, .top_k = 1, .seed = 5 };
	ck_assert(kiln_sample_token(logits, 5, &g, 9, &id) == 0);
	ck_assert_int_eq(id, 1);
	g = (struct kiln_sample_opts){ .temperature = 0, .vocab = 1 };
	ck_assert(kiln_sample_token(logits, 5, &g, 0, &id) == 0);
	ck_assert_int_eq(id, 0);
}
END_TEST

START_TEST(test_errors)
{
	struct rig r;
	struct kiln_generator *g;
	struct kiln_plan *p;
	const int32_t prompt[T + 1] = { 0 };
	int32_t out[T + 1];
	const float *logits;
	const struct kiln_sample_opts o = { .temperature = 0 };
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert_int_eq(kiln_generate(g, prompt, 4, T - 3, &o, out, NULL, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "exceed the model's context of 9 tokens (ask for at most 5)"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(kiln_generate(g, prompt, T + 1, 0, &o, out, NULL, NULL), KILN_EINVAL);
	ck_assert_int_eq(kiln_generate(g, prompt, 0, 1, &o, out, NULL, NULL), KILN_EINVAL);
	ck_assert_int_eq(kiln_generator_step(g, T, 1, &logits), KILN_EINVAL);
	/* a token outside the vocabulary: the embedding's data error */
	ck_assert_int_eq(kiln_generator_step(g, 0, V, &logits), KILN_EDATA);
	ck_assert_int_eq(kiln_generator_step(g, 0, 3, &logits), KILN_OK);
	kiln_generator_close(g);
	/* a position past the caches, straight to the plan: the op refuses it */
	ck_assert(kiln_model_plan_ex(r.m, 1, &(struct kiln_plan_opts){ .decode = 4 }, &p) == 0);
	const int32_t t = 4, tok = 1;
	TEST_H2D(&r, r.tok, &tok, sizeof tok);
	TEST_H2D(&r, r.pos, &t, sizeof t);
	kiln_status st = kiln_plan_decode(p, r.tok, r.pos, r.stream);
	if (!st)
		st = kiln_device_stream_sync(r.dev, r.stream);
	ck_assert_int_eq(st, KILN_EDATA);
	kiln_plan_free(p);
	/* decoding more positions than the positional embedding holds */
	ck_assert_int_eq(kiln_model_plan_ex(r.m, 1, &(struct kiln_plan_opts){ .decode = T + 3 }, &p),
			 KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "more than max_len"), "%s", kiln_last_error());
	rig_close(&r);
	/* attention that sees later tokens cannot be decoded */
	rig_open(&r, "causal = 0\n", "", KILN_F32);
	ck_assert_int_eq(kiln_generator_new(r.m, r.stream, T, &g), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "cannot be decoded token by token"), "%s",
		      kiln_last_error());
	rig_close(&r);
}
END_TEST

/* A logit that is NaN or +inf has no distribution: a data error naming
 * the id, greedy or sampled, with top-k or not (before session 40 a draw
 * then gave id V - 1, silently, and greedy skipped a NaN); -inf is a
 * probability of 0, never drawn; every logit -inf is an error too. */
START_TEST(test_sample_not_finite)
{
	const struct kiln_sample_opts modes[3] = { { .temperature = 0 },
						   { .temperature = 1, .seed = 3 },
						   { .temperature = 1, .top_k = 2, .seed = 3 } };
	for (int m = 0; m < 3; m++) {
		for (int inf = 0; inf < 2; inf++) {
			float lg[5] = { 0.5f, 2.0f, -1.0f, 1.0f, 0.2f };
			int32_t id = -7;
			lg[3] = inf ? INFINITY : NAN;
			ck_assert_int_eq(kiln_sample_token(lg, 5, &modes[m], 0, &id), KILN_EDATA);
			ck_assert_msg(strstr(kiln_last_error(), inf ? "the logit of id 3 is +inf" : "the logit of id 3 is NaN"),
				      "mode %d: %s", m, kiln_last_error());
		}
		const float lg[5] = { 0.5f, -INFINITY, -1.0f, -INFINITY, 0.2f };
		for (uint64_t d = 0; d < 2000; d++) {
			int32_t id = -7;
			ck_assert_msg(kiln_sample_token(lg, 5, &modes[m], d, &id) == 0, "%s", kiln_last_error());
			ck_assert_msg(id == 0 || id == 2 || id == 4, "mode %d draw %d: id %d, whose logit is -inf",
				      m, (int)d, id);
		}
		const float none[3] = { -INFINITY, -INFINITY, -INFINITY };
		int32_t id;
		ck_assert_int_eq(kiln_sample_token(none, 3, &modes[m], 0, &id), KILN_EDATA);
		ck_assert_msg(strstr(kiln_last_error(), "every logit that may be drawn is -inf"), "%s",
			      kiln_last_error());
	}
	/* through kiln_generate: the error names the new token and its
	 * position (a NaN bias before the tied head: every logit NaN) */
	struct rig r;
	struct kiln_generator *g;
	struct kiln_param_info pi;
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t out[2];
	const float nan = NAN;
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_model_param_find(r.m, "ln_f.bias", &pi) == 0);
	TEST_H2D(&r, pi.param + 5, &nan, sizeof nan);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert_int_eq(kiln_generate(g, prompt, 3, 2, &modes[0], out, NULL, NULL), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "drawing new token 0 (position 3): the logit of id 0 is NaN"),
		      "%s", kiln_last_error());
	/* ... and with several samples, the sample */
	int32_t out2[4];
	ck_assert_int_eq(kiln_generate_samples(g, prompt, 3, 2, 2, &modes[1], out2, NULL, NULL), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "drawing new token 0 (position 3) of sample 0: the logit of id 0 is NaN"),
		      "%s", kiln_last_error());
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* kiln_generate's draws over 40 seeds at temperature 50 (all but
 * uniform): from nothing outside out of the ids ok[0..V) lets through. */
static void draws_within(struct kiln_generator *g, const int *ok, const char *what)
{
	const int32_t prompt[2] = { 4, 6 }; /* below every case's classes */
	int32_t out[T - 2];
	int seen[V] = { 0 };
	struct kiln_sample_opts s = { .temperature = 50 };
	for (s.seed = 1; s.seed <= 40; s.seed++) {
		ck_assert_msg(kiln_generate(g, prompt, 2, T - 2, &s, out, NULL, NULL) == 0, "%s",
			      kiln_last_error());
		for (int k = 0; k < T - 2; k++) {
			ck_assert_msg(out[k] >= 0 && out[k] < V && ok[out[k]], "%s: seed %d drew id %d",
				      what, (int)s.seed, out[k]);
			seen[out[k]]++;
		}
	}
	for (int v = 0; v < V; v++)
		ck_assert_msg(!ok[v] || seen[v], "%s: id %d never drawn in 280 draws", what, v);
}

/* The draws stay below the loss layer's classes (the columns past it are
 * a padded vocabulary's, never trained: before session 40 they were
 * drawn) and among the ids kiln_generator_allow lets through (a
 * tokenizer's vocabulary with gaps); greedy too.  A prompt id past the
 * classes is refused (session 41). */
START_TEST(test_draw_bounds)
{
	struct rig r;
	struct kiln_generator *g;
	int ok[V];
	/* without classes every id is drawn, those past 7 included */
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert_int_eq(kiln_generator_classes(g), V);
	for (int v = 0; v < V; v++)
		ok[v] = 1;
	draws_within(g, ok, "no classes");
	kiln_generator_close(g);
	rig_close(&r);

	rig_open(&r, "", "classes = 7\n", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert_int_eq(kiln_generator_vocab(g), V);
	ck_assert_int_eq(kiln_generator_classes(g), 7);
	for (int v = 0; v < V; v++)
		ok[v] = v < 7;
	draws_within(g, ok, "classes = 7");
	/* ids 0, 2 and 5 allowed (and 9, past the classes) */
	uint8_t allow[V] = { 0 };
	allow[0] = allow[2] = allow[5] = allow[9] = 1;
	ck_assert_msg(kiln_generator_allow(g, allow, V) == 0, "%s", kiln_last_error());
	for (int v = 0; v < V; v++)
		ok[v] = v == 0 || v == 2 || v == 5;
	draws_within(g, ok, "ids 0, 2, 5");
	/* greedy: the largest of the allowed logits */
	const int32_t prompt[2] = { 4, 6 };
	const float *lg;
	int32_t out;
	ck_assert(kiln_generator_step(g, 0, prompt[0], &lg) == 0);
	ck_assert(kiln_generator_step(g, 1, prompt[1], &lg) == 0);
	const int32_t want = lg[0] >= lg[2] && lg[0] >= lg[5] ? 0 : lg[2] >= lg[5] ? 2 : 5;
	ck_assert(kiln_generate(g, prompt, 2, 1, &(struct kiln_sample_opts){ .temperature = 0 }, &out,
				NULL, NULL) == 0);
	ck_assert_int_eq(out, want);
	/* a prompt id past the classes (an embedding row no training
	 * taught): refused naming its position (before session 41 fed) */
	const int32_t past[3] = { 4, 6, 9 };
	out = -5;
	ck_assert_int_eq(kiln_generate(g, past, 3, 1, &(struct kiln_sample_opts){ .temperature = 0 },
				       &out, NULL, NULL),
			 KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "prompt token 2 is id 9, not below the model's 7 classes"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(out, -5);
	/* nothing allowed below the classes, or n < 0: refused, and the
	 * earlier mask (0, 2, 5) stays in force (before the fix a failed
	 * call dropped it and every id below the classes was drawn) */
	uint8_t only9[V] = { 0 };
	only9[9] = 1;
	ck_assert_int_eq(kiln_generator_allow(g, only9, V), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "no id below 7"), "%s", kiln_last_error());
	draws_within(g, ok, "ids 0, 2, 5 after a mask allowing none");
	ck_assert_int_eq(kiln_generator_allow(g, allow, -1), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "negative"), "%s", kiln_last_error());
	draws_within(g, ok, "ids 0, 2, 5 after n = -1");
	/* a mask shorter than the classes: the ids past it are not allowed */
	ck_assert(kiln_generator_allow(g, allow, 3) == 0);
	for (int v = 0; v < V; v++)
		ok[v] = v == 0 || v == 2;
	draws_within(g, ok, "ids 0, 2 of 3");
	ck_assert(kiln_generator_allow(g, NULL, 0) == 0);
	for (int v = 0; v < V; v++)
		ok[v] = v < 7;
	draws_within(g, ok, "NULL: every id below the classes");
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* ---- top-p and several samples ------------------------------------------ */

/* u of draw `draw` on sample stream `b` under seed: Philox4x32-10 of
 * counter (draw, b, generation's stream 6) and key seed, its first word's
 * top 24 bits (core/rng.c's layout, computed here with Random123 itself:
 * the reference the draws are held to). */
static double ref_u(uint64_t seed, uint64_t draw, uint32_t b)
{
	philox4x32_ctr_t c = { { (uint32_t)draw, (uint32_t)(draw >> 32), b, 6 } };
	philox4x32_key_t k = { { (uint32_t)seed, (uint32_t)(seed >> 32) } };
	return (double)(philox4x32(c, k).v[0] >> 8) * (1.0 / 16777216.0);
}

/* The id a draw at u takes from distribution p[0..V): the inverse of the
 * cumulative distribution over the ids in order[0..n) with a probability. */
static int32_t ref_draw(const double *p, int n, const int *order, double u)
{
	double acc = 0;
	int32_t id = -1;
	for (int k = 0; k < n; k++) {
		if (p[order[k]] <= 0)
			continue;
		acc += p[order[k]];
		id = order[k];
		if (u < acc)
			break;
	}
	return id;
}

static const float *sort_logits; /* by_prob's */

/* qsort order of ids: larger logit first, ties the lower id. */
static int by_prob(const void *a, const void *b)
{
	const int x = *(const int *)a, y = *(const int *)b;
	if (sort_logits[x] != sort_logits[y])
		return sort_logits[x] > sort_logits[y] ? -1 : 1;
	return x - y;
}

enum { REF_VMAX = 512 };

/* One case of tests/data/top_p_refs.txt. */
struct top_p_case {
	char name[64];
	int V;
	int64_t top_k;
	double temperature, top_p;
	float logits[REF_VMAX];
	double probs[REF_VMAX];
};

/* The next case of f into c; 0 at the end. */
static int top_p_case_read(FILE *f, struct top_p_case *c)
{
	static char line[1 << 16];
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#')
			continue;
		char *p = line, *end;
		int n;
		long long k;
		ck_assert(sscanf(p, "%63s %d %lf %lld %lf ;%n", c->name, &c->V, &c->temperature, &k,
				 &c->top_p, &n) == 5);
		ck_assert(c->V > 0 && c->V <= REF_VMAX);
		c->top_k = k;
		p += n;
		for (int i = 0; i < c->V; i++, p = end)
			c->logits[i] = strtof(p, &end);
		ck_assert_msg(strncmp(p, " ;", 2) == 0, "%s: no ';' after %d logits", c->name, c->V);
		p += 2;
		for (int i = 0; i < c->V; i++, p = end) {
			c->probs[i] = strtod(p, &end);
			ck_assert(end != p);
		}
		return 1;
	}
	return 0;
}

/* kiln_sample_probs equals HuggingFace's temperature, top-k (kiln's: k
 * ids, ties to the lower) and TopPLogitsWarper, then softmax: the same
 * ids kept, the same renormalised probabilities; the draws of
 * kiln_sample_token_ex on three streams invert that distribution at
 * Philox's u, over the ids by probability (larger first, ties the lower
 * id), or in id order when neither top-k nor top-p cuts (the order of
 * every draw before top-p: kiln_sample_token's, which top_p 1 on stream
 * 0 equals). */
START_TEST(test_top_p_vs_reference)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/tests/data/top_p_refs.txt", SRCDIR);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	static struct top_p_case c;
	int cases = 0, cut = 0;
	while (top_p_case_read(f, &c)) {
		const struct kiln_sample_opts o = { .temperature = c.temperature, .top_k = c.top_k,
						    .seed = 1000 + (uint64_t)cases };
		double got[REF_VMAX], sum = 0;
		int order[REF_VMAX], kept = 0, ref_kept = 0;
		ck_assert_msg(kiln_sample_probs(c.logits, c.V, &o, c.top_p, got) == 0, "%s: %s", c.name,
			      kiln_last_error());
		for (int i = 0; i < c.V; i++) {
			ck_assert_msg((got[i] > 0) == (c.probs[i] > 0),
				      "%s: id %d %s by kiln (p %.17g), %s by the reference (p %.17g)", c.name, i,
				      got[i] > 0 ? "kept" : "cut", got[i], c.probs[i] > 0 ? "kept" : "cut",
				      c.probs[i]);
			ck_assert_msg(fabs(got[i] - c.probs[i]) <= 1e-12,
				      "%s: id %d probability %.17g, the reference's %.17g", c.name, i, got[i],
				      c.probs[i]);
			sum += got[i];
			kept += got[i] > 0;
			order[i] = i;
		}
		ck_assert_msg(fabs(sum - 1) <= 1e-12, "%s: the kept probabilities sum to %.17g", c.name, sum);
		for (int i = 0; i < c.V; i++)
			ref_kept += c.logits[i] > -INFINITY;
		if (c.top_k && c.top_k < ref_kept)
			ref_kept = (int)c.top_k;
		cut += kept < ref_kept; /* the nucleus left some out */
		const int sorted = c.top_p < 1 || (c.top_k > 0 && c.top_k < c.V);
		sort_logits = c.logits;
		if (sorted)
			qsort(order, (size_t)c.V, sizeof *order, by_prob);
		const uint32_t streams[3] = { 0, 1, 7 };
		for (int s = 0; s < 3; s++)
			for (uint64_t d = 0; d < 400; d++) {
				int32_t id = -1, id0 = -1;
				ck_assert(kiln_sample_token_ex(c.logits, c.V, &o, c.top_p, d, streams[s], &id) == 0);
				const int32_t want = ref_draw(c.probs, c.V, order, ref_u(o.seed, d, streams[s]));
				ck_assert_msg(id == want, "%s: draw %d on stream %u gave id %d, the inverse of the reference's distribution %d",
					      c.name, (int)d, streams[s], id, want);
				if (c.top_p == 1 && streams[s] == 0) {
					ck_assert(kiln_sample_token(c.logits, c.V, &o, d, &id0) == 0);
					ck_assert_int_eq(id0, id);
				}
			}
		cases++;
	}
	fclose(f);
	ck_assert_int_eq(cases, 18);
	ck_assert_msg(cut >= 14, "only %d cases where the nucleus cut ids", cut);
}
END_TEST

/* With top-p 0.5 on probabilities 0.3, 0.25, 0.2, 0.15, 0.1 the nucleus
 * is ids 0 and 1 (0.3 < 0.5 <= 0.55): over 40,000 draws on 4 streams
 * no other id appears, and the two follow 0.3 / 0.55 and 0.25 / 0.55
 * within 5 standard deviations; at top-p 0.9, 0.95 and 1 the nucleus
 * grows (0.9: 0, 1, 2, 3; 0.95 and 1: all) and every id of it is drawn. */
START_TEST(test_top_p_draws)
{
	const double p[5] = { 0.3, 0.25, 0.2, 0.15, 0.1 };
	float logits[5];
	enum { N = 40000 };
	for (int i = 0; i < 5; i++)
		logits[i] = (float)log(p[i]);
	const double tops[4] = { 0.5, 0.9, 0.95, 1 };
	const int in[4] = { 2, 4, 5, 5 }; /* the nucleus: the first in[] ids */
	for (int t = 0; t < 4; t++) {
		const struct kiln_sample_opts o = { .temperature = 1, .seed = 99 };
		int counts[5] = { 0 };
		double z = 0;
		for (int i = 0; i < N; i++) {
			int32_t id;
			ck_assert(kiln_sample_token_ex(logits, 5, &o, tops[t], (uint64_t)(i / 4), (uint32_t)(i % 4),
						       &id) == 0);
			ck_assert_msg(id >= 0 && id < in[t], "top-p %g: draw %d gave id %d, outside the nucleus of ids 0..%d",
				      tops[t], i, id, in[t] - 1);
			counts[id]++;
		}
		for (int i = 0; i < in[t]; i++)
			z += p[i];
		for (int i = 0; i < in[t]; i++) {
			const double q = p[i] / z, fr = (double)counts[i] / N, sd = sqrt(q * (1 - q) / N);
			ck_assert_msg(fabs(fr - q) <= 5 * sd, "top-p %g id %d: frequency %.4f, probability %.4f",
				      tops[t], i, fr, q);
		}
	}
	/* the bound: (0, 1] */
	const struct kiln_sample_opts o = { .temperature = 1 };
	const double bad[4] = { 0, -0.5, 1.5, NAN };
	double probs[5];
	int32_t id;
	for (int b = 0; b < 4; b++) {
		ck_assert_int_eq(kiln_sample_token_ex(logits, 5, &o, bad[b], 0, 0, &id), KILN_EINVAL);
		ck_assert_msg(strstr(kiln_last_error(), "in (0, 1]"), "%s", kiln_last_error());
		ck_assert_int_eq(kiln_sample_probs(logits, 5, &o, bad[b], probs), KILN_EINVAL);
	}
	/* greedy ignores it: the first largest, probability 1 */
	const struct kiln_sample_opts g = { .temperature = 0 };
	ck_assert(kiln_sample_probs(logits, 5, &g, 0.5, probs) == 0);
	ck_assert(probs[0] == 1 && probs[1] == 0 && probs[4] == 0);
}
END_TEST

/* What kiln_generate_samples' callback saw. */
struct seen {
	int64_t order[4 * T];
	int n;
};

static kiln_status record(void *user, int64_t sample, int32_t token)
{
	struct seen *s = user;
	(void)token;
	s->order[s->n++] = sample;
	return KILN_OK;
}

/* Four samples of one prompt decoded at once (a plan of 4 rows): each
 * sample's tokens are those a one-row decode of its own sequence draws
 * with kiln_sample_token_ex on its stream (its logits are a one-row
 * plan's, to the bit), sample 0 is kiln_generate's text, the samples
 * differ, a second call repeats them; top-p and its errors; greedy
 * samples are all the greedy text. */
START_TEST(test_samples)
{
	enum { NS = 4, NEW = T - 3 };
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t out[NS * NEW], again[NS * NEW], one[NEW];
	const float *lg;
	struct seen seen = { .n = 0 };
	struct kiln_sample_opts s = { .temperature = 1.5, .seed = 11 };
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert_msg(kiln_generator_top_p(g, 0.9) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_generate_samples(g, prompt, 3, NEW, NS, &s, out, record, &seen) == 0, "%s",
		      kiln_last_error());
	ck_assert_int_eq(seen.n, NS * NEW);
	for (int i = 0; i < NS * NEW; i++)
		ck_assert_int_eq(seen.order[i], i % NS); /* token k of every sample, then k + 1 */
	for (int smp = 0; smp < NS; smp++) {
		for (int t = 0; t < 3; t++)
			ck_assert(kiln_generator_step(g, t, prompt[t], &lg) == 0);
		for (int k = 0; k < NEW; k++) {
			int32_t want;
			ck_assert(kiln_sample_token_ex(lg, V, &s, 0.9, (uint64_t)k, (uint32_t)smp, &want) == 0);
			ck_assert_msg(out[smp * NEW + k] == want, "sample %d token %d: %d decoded with the others, %d alone",
				      smp, k, out[smp * NEW + k], want);
			if (k + 1 < NEW)
				ck_assert(kiln_generator_step(g, 3 + k, want, &lg) == 0);
		}
	}
	ck_assert(kiln_generate(g, prompt, 3, NEW, &s, one, NULL, NULL) == 0);
	ck_assert_mem_eq(one, out, sizeof one);
	int distinct = 0;
	for (int a = 1; a < NS; a++)
		distinct += memcmp(out, out + a * NEW, sizeof one) != 0;
	ck_assert_msg(distinct == NS - 1, "only %d of the samples 1..3 differ from sample 0", distinct);
	ck_assert(kiln_generate_samples(g, prompt, 3, NEW, NS, &s, again, NULL, NULL) == 0);
	ck_assert_mem_eq(again, out, sizeof out);
	/* a bad top_p is refused and 0.9 stays */
	const double bad[4] = { 0, 1.5, NAN, -1 };
	for (int b = 0; b < 4; b++) {
		ck_assert_int_eq(kiln_generator_top_p(g, bad[b]), KILN_EINVAL);
		ck_assert_msg(strstr(kiln_last_error(), "kiln_generator_top_p: top_p = "), "%s", kiln_last_error());
	}
	ck_assert(kiln_generate_samples(g, prompt, 3, NEW, NS, &s, again, NULL, NULL) == 0);
	ck_assert_mem_eq(again, out, sizeof out);
	/* at 1 the draws are those of a generator without top-p */
	struct kiln_generator *plain;
	int32_t p1[NEW];
	ck_assert(kiln_generator_new(r.m, r.stream, T, &plain) == 0);
	ck_assert(kiln_generate(plain, prompt, 3, NEW, &s, one, NULL, NULL) == 0);
	ck_assert(kiln_generator_top_p(g, 1) == 0);
	ck_assert(kiln_generate(g, prompt, 3, NEW, &s, p1, NULL, NULL) == 0);
	ck_assert_mem_eq(p1, one, sizeof one);
	kiln_generator_close(plain);
	/* greedy: every sample the greedy text */
	const struct kiln_sample_opts greedy = { .temperature = 0 };
	ck_assert(kiln_generate(g, prompt, 3, NEW, &greedy, one, NULL, NULL) == 0);
	ck_assert(kiln_generate_samples(g, prompt, 3, NEW, 3, &greedy, out, NULL, NULL) == 0);
	for (int smp = 0; smp < 3; smp++)
		ck_assert_mem_eq(out + smp * NEW, one, sizeof one);
	/* errors */
	ck_assert_int_eq(kiln_generate_samples(g, prompt, 3, NEW, 0, &s, out, NULL, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "n_samples = 0"), "%s", kiln_last_error());
	ck_assert_int_eq(kiln_generate_samples(g, prompt, 3, T - 2, 2, &s, out, NULL, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "(ask for at most 6)"), "%s", kiln_last_error());
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* Top-p composes with the loss's classes (7), an allow mask (0, 2, 5
 * and 9, past the classes), top-k and temperature, with several samples:
 * each token of 3 samples of 8 seeds is the draw of kiln_sample_token_ex
 * on its stream from the one-row logits with every id the bounds leave
 * out at -inf (a probability of 0), and one of 0, 2 and 5. */
START_TEST(test_top_p_bounds)
{
	enum { NS = 3, NEW = T - 2 };
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[2] = { 4, 6 }; /* below the classes (7) */
	int32_t out[NS * NEW];
	uint8_t allow[V] = { 0 };
	const float *lg;
	int seen[V] = { 0 };
	allow[0] = allow[2] = allow[5] = allow[9] = 1;
	rig_open(&r, "", "classes = 7\n", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert(kiln_generator_allow(g, allow, V) == 0);
	ck_assert(kiln_generator_top_p(g, 0.7) == 0);
	for (uint64_t seed = 1; seed <= 8; seed++) {
		const struct kiln_sample_opts o = { .temperature = 3, .top_k = 2, .seed = seed };
		ck_assert_msg(kiln_generate_samples(g, prompt, 2, NEW, NS, &o, out, NULL, NULL) == 0, "%s",
			      kiln_last_error());
		for (int smp = 0; smp < NS; smp++) {
			ck_assert(kiln_generator_step(g, 0, prompt[0], &lg) == 0);
			ck_assert(kiln_generator_step(g, 1, prompt[1], &lg) == 0);
			for (int k = 0; k < NEW; k++) {
				float masked[V];
				int32_t want;
				for (int v = 0; v < V; v++)
					masked[v] = v < 7 && allow[v] ? lg[v] : -INFINITY;
				ck_assert(kiln_sample_token_ex(masked, V, &o, 0.7, (uint64_t)k, (uint32_t)smp, &want) == 0);
				const int32_t id = out[smp * NEW + k];
				ck_assert_msg(id == want, "seed %d sample %d token %d: %d, the masked reference's %d",
					      (int)seed, smp, k, id, want);
				ck_assert(id == 0 || id == 2 || id == 5);
				seen[id]++;
				if (k + 1 < NEW)
					ck_assert(kiln_generator_step(g, 2 + k, id, &lg) == 0);
			}
		}
	}
	ck_assert_msg(seen[0] + seen[2] + seen[5] == 8 * NS * NEW && (!!seen[0] + !!seen[2] + !!seen[5]) >= 2,
		      "drawn: id 0 %d times, 2 %d, 5 %d", seen[0], seen[2], seen[5]);
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* ---- session 42: the caches' positions, the prompt fed once ------------- */

/* Refused with KILN_EINVAL and a message holding `text`. */
#define REFUSED(call, text)                                                              \
	do {                                                                             \
		ck_assert_int_eq((call), KILN_EINVAL);                                   \
		ck_assert_msg(strstr(kiln_last_error(), (text)), "%s", kiln_last_error()); \
	} while (0)

/* The logits of a one-row decode of tokens[0..n) from position 0, at
 * its last position, into lg[V]. */
static void step_through(struct kiln_generator *g, const int32_t *tokens, int n, float *lg)
{
	const float *p = NULL;
	for (int t = 0; t < n; t++)
		ck_assert_msg(kiln_generator_step(g, t, tokens[t], &p) == 0, "%s", kiln_last_error());
	memcpy(lg, p, sizeof(float) * V);
}

/* kiln_generator_step at a position past those its caches hold is
 * refused, nothing fed (before session 42 it ran on caches no step
 * wrote): a new generator's position 1; past a sequence; after
 * kiln_generate (which leaves the prompt and every new token but the
 * last: the next step continues it, its logits the fresh decode's of
 * that text); after kiln_generate_samples (the prompt's first n - 1
 * positions, fed once: a step at n - 1 gives the prompt's logits; before
 * session 42 the one-row plan was made anew, its caches empty); a failed
 * step keeps the positions before it.  The logits after a prefilled
 * prompt are the steps' within 1e-5, as test_prefill_equals_steps allows
 * (to the bit before session 44, whose prefill run sums its attention
 * scores in another order than a step). */
static void logits_near(const float *got, const float *ref, const char *what)
{
	for (int v = 0; v < V; v++)
		ck_assert_msg(fabs(got[v] - ref[v]) <= 1e-5 * (1 + fabs(ref[v])),
			      "%s: logit %d is %.9g, %.9g fed a step a position", what, v, got[v], ref[v]);
}

START_TEST(test_step_positions)
{
	enum { NS = 3, NEW = 4 };
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t seq[3 + NEW], outs[NS * NEW];
	const float *lg;
	float ref[V], got[V];
	const struct kiln_sample_opts s = { .temperature = 1.5, .seed = 11 };
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	REFUSED(kiln_generator_step(g, 1, 4, &lg), "position 1 of no sequence: the caches hold no position");
	step_through(g, prompt, 3, ref);
	REFUSED(kiln_generator_step(g, 4, 1, &lg), "position 4, but the caches hold positions 0..2 of the sequence only: feed position 3 first");
	/* the refusal fed nothing: position 3 still continues the prompt */
	ck_assert(kiln_generator_step(g, 3, 1, &lg) == 0);
	/* kiln_generate: its text continues at n_prompt + NEW - 1 */
	ck_assert(kiln_generate(g, prompt, 3, NEW, &s, seq + 3, NULL, NULL) == 0);
	memcpy(seq, prompt, sizeof prompt);
	ck_assert(kiln_generator_step(g, 3 + NEW - 1, seq[3 + NEW - 1], &lg) == 0);
	memcpy(got, lg, sizeof got);
	REFUSED(kiln_generator_step(g, 3 + NEW + 1, 0, &lg), "feed position 7 first");
	step_through(g, seq, 3 + NEW, ref);
	logits_near(got, ref, "after kiln_generate");
	/* kiln_generate_samples: the prompt's first two positions */
	ck_assert(kiln_generate_samples(g, prompt, 3, NEW, NS, &s, outs, NULL, NULL) == 0);
	REFUSED(kiln_generator_step(g, 3, 0, &lg), "position 3, but the caches hold positions 0..1 of the sequence only: feed position 2 first");
	ck_assert(kiln_generator_step(g, 2, prompt[2], &lg) == 0);
	memcpy(got, lg, sizeof got);
	step_through(g, prompt, 3, ref);
	logits_near(got, ref, "after kiln_generate_samples");
	/* a step that fails (a token past the vocabulary: the embedding's
	 * data error) keeps 0..pos-1; a negative token is refused first */
	REFUSED(kiln_generator_step(g, 3, -1, &lg), "token id -1 at position 3 is negative");
	ck_assert_int_eq(kiln_generator_step(g, 3, V, &lg), KILN_EDATA);
	REFUSED(kiln_generator_step(g, 4, 1, &lg), "the caches hold positions 0..2 of the sequence only");
	ck_assert(kiln_generator_step(g, 3, 1, &lg) == 0);
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* The way before session 42: a decode plan of B rows fed the prompt in
 * every row, then each row's draw (kiln_sample_token_ex on its stream,
 * top-p 1) fed back; the tokens into ref[b * n_new + k]. */
static void rows_reference(struct rig *r, int B, const int32_t *prompt, int n_prompt, int n_new,
			   const struct kiln_sample_opts *s, int32_t *ref)
{
	enum { BREF = 4 };
	struct kiln_plan *p;
	struct kiln_plan_opts o = { .decode = T };
	void *y;
	struct kiln_tensor_desc d;
	char host[sizeof(float) * BREF * V];
	float lg[BREF * V];
	int32_t col[BREF];
	ck_assert(B <= BREF && B <= BMAX * T);
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &o, &p) == 0, "%s", kiln_last_error());
	ck_assert(kiln_plan_logits(p, &y, &d) == 0);
	for (int32_t t = 0; t < n_prompt + n_new - 1; t++) {
		for (int b = 0; b < B; b++)
			col[b] = t < n_prompt ? prompt[t] : ref[b * n_new + t - n_prompt];
		TEST_H2D(r, r->tok, col, sizeof(int32_t) * (size_t)B);
		TEST_H2D(r, r->pos, &t, sizeof t);
		ck_assert_msg(kiln_plan_decode(p, r->tok, r->pos, r->stream) == 0, "%s", kiln_last_error());
		if (t < n_prompt - 1)
			continue;
		TEST_D2H(r, host, y, kiln_tensor_bytes(&d));
		widen(lg, host, d.dtype, (size_t)(B * V));
		for (int b = 0; b < B; b++)
			ck_assert(kiln_sample_token_ex(lg + b * V, V, s, 1, (uint64_t)(t - n_prompt + 1),
						       (uint32_t)b, &ref[b * n_new + t - n_prompt + 1]) == 0);
	}
	kiln_plan_free(p);
}

/* The debug lines of component "generate" logged into a struct said. */
struct said {
	char text[4096];
};

static void said_sink(void *user, int level, const char *who, const char *msg)
{
	struct said *s = user;
	if (level == KILN_LOG_DEBUG && !strcmp(who, "generate"))
		snprintf(s->text + strlen(s->text), sizeof s->text - strlen(s->text), "%s\n", msg);
}

/* Several samples feed their prompt once (session 42: its first n - 1
 * tokens to the one-row decode, whose caches are copied into every row)
 * and draw, for 2, 3 and 4 samples, three seeds and prompts of 2 and 5
 * tokens, a different prompt each call, f32 and bf16 compute, the tokens
 * of the way before (rows_reference): the copied caches are those the
 * rows computed, to the bit.  Each call copies (its debug line), and only
 * the filled positions: 2 blocks x keys and values x B rows x 2 heads x
 * (n - 1) positions x 8 floats (before f42g2 every row's T positions). */
START_TEST(test_samples_prompt_once)
{
	enum { NPMAX = 5 };
	int32_t prompt[NPMAX], out[4 * T], ref[4 * T];
	struct said said;
	const int old_level = kiln_log_get_level();
	kiln_log_set_sink(said_sink, &said);
	kiln_log_set_level(KILN_LOG_DEBUG);
	for (int bf = 0; bf < 2; bf++) {
		struct rig r;
		struct kiln_generator *g;
		rig_open(&r, "", "", bf ? KILN_BF16 : KILN_F32);
		ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
		for (int np = 2; np <= NPMAX; np += 3)
			for (int B = 2; B <= 4; B++)
				for (uint64_t seed = 1; seed <= 3; seed++) {
					const int n_new = T - np;
					const struct kiln_sample_opts s = { .temperature = 1.2, .seed = seed };
					for (int t = 0; t < np; t++) /* a prompt of its own each call */
						prompt[t] = (int32_t)((3 * t + 5 * B + 7 * (int)seed + np) % V);
					said.text[0] = 0;
					ck_assert_msg(kiln_generate_samples(g, prompt, np, n_new, B, &s, out, NULL, NULL) == 0,
						      "%s", kiln_last_error());
					char want[160];
					snprintf(want, sizeof want, "prompt fed once: its %d positions copied into %d rows (%d bytes)\n",
						 np - 1, B, 2 * 2 * B * 2 * (np - 1) * 8 * 4);
					/* (after the prefill plan's line, where it is made) */
					const char *copied = said.text;
					if (!strncmp(copied, "prefill plan of ", 16))
						copied = strchr(copied, '\n') + 1;
					ck_assert_msg(!strcmp(copied, want), "%d samples: logged \"%s\", not \"%s\"", B,
						      said.text, want);
					rows_reference(&r, B, prompt, np, n_new, &s, ref);
					for (int i = 0; i < B * n_new; i++)
						ck_assert_msg(out[i] == ref[i], "%s, %d samples, seed %d, %d-token prompt: sample %d token %d is %d, %d fed in every row",
							      bf ? "bf16" : "f32", B, (int)seed, np, i / n_new, i % n_new,
							      out[i], ref[i]);
				}
		kiln_generator_close(g);
		rig_close(&r);
	}
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(old_level);
}
END_TEST

/* The virtual memory the process has mapped, in bytes (VmSize). */
static size_t vm_bytes(void)
{
	char line[256];
	long kib = 0;
	FILE *st = fopen("/proc/self/status", "r");
	ck_assert_ptr_nonnull(st);
	while (fgets(line, sizeof line, st))
		sscanf(line, "VmSize: %ld kB", &kib);
	fclose(st);
	ck_assert_int_gt(kib, 0);
	return (size_t)kib << 10;
}

/* A one-row call (kiln_generate, kiln_generator_step) frees the decode
 * plan of kiln_generate_samples' N rows, as before session 42 (f42g kept
 * it until another N or the close): the process's mapped memory drops by
 * at least the 20,000-row plan's caches, and N rows afterwards draw as
 * before. */
START_TEST(test_samples_plan_freed)
{
	enum { N = 20000 };
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[2] = { 4, 1 };
	int32_t *out = malloc(sizeof(int32_t) * N), one[1];
	const float *lg;
	const struct kiln_sample_opts s = { .temperature = 1, .seed = 5 };
	/* the N-row plan's caches: 2 blocks x keys and values x 2 heads x T
	 * positions x 8 floats a row (what a free must return at least) */
	const size_t caches = (size_t)N * 2 * 2 * 2 * T * 8 * 4;
	ck_assert_ptr_nonnull(out);
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	for (int call = 0; call < 2; call++) {
		const size_t before = vm_bytes();
		ck_assert_msg(kiln_generate_samples(g, prompt, 2, 1, N, &s, out, NULL, NULL) == 0, "%s",
			      kiln_last_error());
		const size_t with = vm_bytes();
		ck_assert_msg(with - before >= caches, "%zu bytes mapped by %d samples", with - before, N);
		ck_assert(call ? kiln_generator_step(g, 0, 4, &lg) == 0
			       : kiln_generate(g, prompt, 2, 1, &s, one, NULL, NULL) == 0);
		const size_t after = vm_bytes();
		ck_assert_msg(after < with && with - after >= caches, "%s kept the %d-row plan: %zu bytes mapped, %zu with it (its caches: %zu)",
			      call ? "kiln_generator_step" : "kiln_generate", N, after, with, caches);
		ck_assert_int_eq(one[0], out[0]);
	}
	kiln_generator_close(g);
	rig_close(&r);
	free(out);
}
END_TEST

/* The bytes the generator counts for a decode plan of `rows` of rig r's
 * model (generate.c rows_fit): the dry plan's arena and workspace, the
 * f32 logits on the host, and their f32 copy on the device where the
 * plan's logits are not f32. */
static size_t rows_need(struct rig *r, int64_t rows)
{
	struct kiln_plan_opts o = { .decode = T, .dry = 1 };
	struct kiln_plan *p;
	kiln_device_layout_only(r->dev, 1);
	ck_assert_msg(kiln_model_plan_ex(r->m, rows, &o, &p) == 0, "%s", kiln_last_error());
	kiln_device_layout_only(r->dev, 0);
	const struct kiln_tensor_desc *ld = &p->nodes[p->logits_layer].l.out;
	const size_t f32 = sizeof(float) * (size_t)rows * V;
	const size_t need = kiln_plan_arena_bytes(p) + kiln_align_up(p->ws_bytes) + f32 +
			    (ld->dtype != KILN_F32 ? f32 : 0);
	kiln_plan_free(p);
	return need;
}

/* kiln_generate_samples of n rows under an RLIMIT_AS `room` bytes above
 * what the process maps: its status, its message into msg[1024]. */
static kiln_status samples_in_room(struct kiln_generator *g, int64_t n, size_t room, char *msg)
{
	const int32_t prompt[3] = { 4, 1, 7 };
	const struct kiln_sample_opts s = { .temperature = 1, .seed = 3 };
	int32_t *many = malloc(sizeof(int32_t) * 2 * (size_t)n);
	ck_assert_ptr_nonnull(many);
	/* the host's small allocations (the plan's tables, the message) come
	 * from 64 MiB of heap freed and kept, not from new mappings, which a
	 * room smaller than a page would refuse (this test's process alone:
	 * Check forks each test; 8 MiB was short once the session's merges
	 * grew the planning's tables) */
	mallopt(M_MMAP_THRESHOLD, 256 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);
	free(malloc(64 << 20));
	/* and the threads and tables a plan of several rows makes at its
	 * first use in this forked process, made before the limit */
	int32_t two[2 * 2];
	ck_assert_msg(kiln_generate_samples(g, prompt, 3, 2, 2, &s, two, NULL, NULL) == 0, "%s",
		      kiln_last_error());
	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = (rlim_t)(vm_bytes() + room);
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
	const kiln_status got = kiln_generate_samples(g, prompt, 3, 2, n, &s, many, NULL, NULL);
	snprintf(msg, 1024, "%s", kiln_last_error());
	setrlimit(RLIMIT_AS, &old);
	free(many);
	return got;
}

/* A plan of more samples than the device's memory holds (here under an
 * RLIMIT_AS 512 MiB above what the process uses: a million rows need
 * some GiB) is KILN_EUSAGE naming the samples, the bytes and about how
 * many fit, before any allocation (before session 42: KILN_ENOMEM from
 * the allocation, naming "the evaluation plan"); the bytes are the
 * plan's, the logits' f32 host copy, and their f32 device copy only
 * under bf16, whose logits are not f32 (f42g counted it for f32 plans
 * too); where not one sample fits (2 KiB free) it says so (f42g: "about
 * 1 fit"); the generator works on. */
START_TEST(test_samples_too_many)
{
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t out[2 * 2], one[2];
	const struct kiln_sample_opts s = { .temperature = 1, .seed = 3 };
	char msg[1024];
	for (int bf = 0; bf < 2; bf++) {
		struct rig r;
		struct kiln_generator *g;
		rig_open(&r, "", "", bf ? KILN_BF16 : KILN_F32);
		ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
		kiln_status got = samples_in_room(g, 1000000, (size_t)512 << 20, msg);
		ck_assert_msg(got == KILN_EUSAGE, "%s: %s", kiln_status_name(got), msg);
		ck_assert_msg(strstr(msg, "1000000 samples decoded at once need a decode plan of "), "%s", msg);
		ck_assert_msg(strstr(msg, "more than the free memory of the cpu device"), "%s", msg);
		unsigned long long need = 0;
		long long fit = 0;
		const char *b = strstr(msg, "need a decode plan of ");
		ck_assert(b && sscanf(b, "need a decode plan of %llu bytes", &need) == 1);
		ck_assert_msg(need == rows_need(&r, 1000000), "%s: %llu bytes counted, %zu the plan's and logits'",
			      bf ? "bf16" : "f32", need, rows_need(&r, 1000000));
		/* at least a million rows' key/value caches (2 layers, keys
		 * and values, 2 heads x 9 positions x 8 floats) */
		ck_assert_msg(need >= 1000000ull * 2 * 2 * 2 * T * 8 * 4, "%s", msg);
		const char *f = strstr(msg, "GiB free: about ");
		ck_assert_msg(f && sscanf(f, "GiB free: about %lld fit", &fit) == 1, "%s", msg);
		ck_assert_msg(fit >= 1 && fit < 1000000, "%s", msg);
		got = samples_in_room(g, 1000, 2048, msg);
		ck_assert_msg(got == KILN_EUSAGE && strstr(msg, "GiB free: not one fits): ask for fewer samples"),
			      "%s: %s", kiln_status_name(got), msg);
		/* the generator works on: two samples, one */
		ck_assert_msg(kiln_generate_samples(g, prompt, 3, 2, 2, &s, out, NULL, NULL) == 0, "%s",
			      kiln_last_error());
		ck_assert(kiln_generate(g, prompt, 3, 2, &s, one, NULL, NULL) == 0);
		ck_assert_mem_eq(one, out, sizeof one);
		kiln_generator_close(g);
		rig_close(&r);
	}
}
END_TEST

/* A context below 1 is refused (the NULL arguments of the generation
 * functions: tests/check_api_null.c). */
START_TEST(test_context_refused)
{
	struct rig r;
	struct kiln_generator *none = NULL;
	rig_open(&r, "", "", KILN_F32);
	REFUSED(kiln_generator_new(r.m, r.stream, 0, &none), "kiln_generator_new: context = 0");
	ck_assert_ptr_null(none);
	rig_close(&r);
}
END_TEST

/* A shard of tokens in llm.c's format at path: magic, version and count
 * in a 1024-byte header, then n uint16 tokens (each < V). */
static void write_shard(const char *path, int n)
{
	uint8_t b[1024 + 2 * 64] = { 0 };
	const int32_t h[3] = { 20240520, 1, n };
	ck_assert(n <= 64);
	memcpy(b, h, sizeof h); /* (little-endian, as the format) */
	for (int i = 0; i < n; i++)
		b[1024 + 2 * i] = (uint8_t)((i * 5 + 3) % V);
	FILE *f = fopen(path, "wb");
	ck_assert(f && fwrite(b, 1, 1024 + 2 * (size_t)n, f) == 1024 + 2 * (size_t)n);
	fclose(f);
}

/* kiln_generator_open of the tiny GPT's weights ([model] init_from) under
 * [run] precision = bf16 and fp32: each decodes as the full forward of
 * its compute dtype (before session 40 it ran f32 whatever [run]
 * precision said: bf16's logits were f32's to the bit). */
START_TEST(test_open_precision)
{
	char dir[4096], w[4200], shard[4200], base[8192], ini[20480], over[4200];
	struct rig r32, r16;
	int32_t tok[T];
	float full32[T * V], full16[T * V];
	ck_assert(test_tmpdir_make(dir, sizeof dir, "gen-prec"));
	snprintf(w, sizeof w, "%s/w.safetensors", dir);
	snprintf(shard, sizeof shard, "%s/train.bin", dir);
	write_shard(shard, 40);
	tokens_of(tok, T, 9);
	rig_open(&r32, "", "", KILN_F32);
	ck_assert_msg(kiln_model_save_safetensors(r32.m, w, r32.stream) == 0, "%s", kiln_last_error());
	full_logits(&r32, 1, tok, full32);
	rig_close(&r32);
	rig_open(&r16, "", "", KILN_BF16); /* the same weights (seed 7) */
	full_logits(&r16, 1, tok, full16);
	rig_close(&r16);
	gpt_ini(base, sizeof base, "", "");
	snprintf(ini, sizeof ini, "%s[data]\nsource = tokens\npath = %s\ncontext = %d\n[model]\ninit_from = %s\n",
		 base, shard, T, w);
	for (int bf = 0; bf < 2; bf++) {
		struct kiln_config *cfg;
		struct kiln_generator *g;
		const float *lg;
		ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == 0);
		snprintf(over, sizeof over, "run.out_dir=%.4000s/run", dir);
		ck_assert(kiln_config_override(cfg, over) == 0);
		ck_assert(kiln_config_override(cfg, "run.device=cpu") == 0);
		ck_assert(kiln_config_override(cfg, bf ? "run.precision=bf16" : "run.precision=fp32") == 0);
		ck_assert_msg(kiln_config_validate(cfg, reg) == 0, "%s", kiln_last_error());
		ck_assert_msg(kiln_generator_open(cfg, reg, NULL, &g) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(kiln_generator_context(g), T);
		int f32_bits = 0; /* logits that are no bf16 value */
		for (int t = 0; t < T; t++) {
			ck_assert_msg(kiln_generator_step(g, t, tok[t], &lg) == 0, "%s", kiln_last_error());
			for (int v = 0; v < V; v++) {
				const double want = bf ? full16[t * V + v] : full32[t * V + v];
				const double tol = bf ? 4e-3 : 2e-5;
				uint32_t u;
				ck_assert_msg(fabs(lg[v] - want) <= tol * (1 + fabs(want)),
					      "%s position %d logit %d: decoded %.7g, full forward %.7g",
					      bf ? "bf16" : "fp32", t, v, lg[v], want);
				memcpy(&u, &lg[v], sizeof u);
				f32_bits += (u & 0xffff) != 0;
			}
		}
		/* bf16 compute: the plan's logits are bf16, widened (f32 ones
		 * all had their low 16 bits zero with a chance of 2^-1584) */
		if (bf)
			ck_assert_msg(f32_bits == 0, "bf16: %d of %d logits are no bf16 value: not bf16 compute",
				      f32_bits, T * V);
		else
			ck_assert_msg(f32_bits > 0, "fp32: every logit is a bf16 value");
		kiln_generator_close(g);
		kiln_config_free(cfg);
	}
	test_tmpdir_remove(dir);
}
END_TEST

/* ---- session 43: the prompt prefilled ---------------------------------- */

/* A decode plan of k positions a run (kiln_model_plan_prefill: ATTENTION_
 * DECODE of T = k queries, pos_embedding's k rows) run once at position
 * 0 on tokens[0..k) gives at its position t the logits of the full
 * forward's position t (f32 within 2e-5, as the steps), for k = 1 to T;
 * then a second run of k' = T - k positions at position k, on the caches
 * the first left, gives positions k..T-1 alike (a prompt of two runs). */
START_TEST(test_prefill_plan_logits)
{
	struct rig r;
	int32_t tok[T], pos[T];
	float full[T * V], got[T * V];
	void *y;
	struct kiln_tensor_desc d;
	rig_open(&r, "", "", KILN_F32);
	tokens_of(tok, T, 4);
	full_logits(&r, 1, tok, full);
	for (int k = 1; k < T; k++) {
		struct kiln_plan *p[2];
		for (int run = 0; run < 2; run++) {
			const int at = run ? k : 0, n = run ? T - k : k;
			ck_assert_msg(kiln_model_plan_prefill(r.m, T, n, 1, &p[run]) == 0, "%s", kiln_last_error());
			ck_assert(kiln_plan_logits(p[run], &y, &d) == 0);
			ck_assert_int_eq(d.dims[0], 1);
			ck_assert_int_eq(d.dims[1], n);
			if (run) { /* the first run's positions 0..k-1, into the second's caches */
				size_t bytes;
				ck_assert(kiln_plan_decode_copy_rows(p[1], p[0], k, r.stream, &bytes) == 0);
			}
			for (int t = 0; t < n; t++)
				pos[t] = at + t;
			TEST_H2D(&r, r.tok, tok + at, sizeof(int32_t) * (size_t)n);
			TEST_H2D(&r, r.pos, pos, sizeof(int32_t) * (size_t)n);
			ck_assert_msg(kiln_plan_decode(p[run], r.tok, r.pos, r.stream) == 0, "%s", kiln_last_error());
			TEST_D2H(&r, got, y, kiln_tensor_bytes(&d));
			for (int t = 0; t < n; t++)
				for (int v = 0; v < V; v++) {
					const double want = full[(at + t) * V + v];
					ck_assert_msg(fabs(got[t * V + v] - want) <= 2e-5 * (1 + fabs(want)),
						      "runs of %d and %d positions: position %d logit %d: %.7g, full forward %.7g",
						      k, T - k, at + t, v, got[t * V + v], want);
				}
		}
		kiln_plan_free(p[0]);
		kiln_plan_free(p[1]);
	}
	/* positions past the caches: the op's data error, naming them */
	struct kiln_plan *p;
	ck_assert(kiln_model_plan_prefill(r.m, T, 4, 1, &p) == 0);
	for (int t = 0; t < 4; t++)
		pos[t] = T - 2 + t;
	TEST_H2D(&r, r.tok, tok, sizeof(int32_t) * 4);
	TEST_H2D(&r, r.pos, pos, sizeof(int32_t) * 4);
	ck_assert_int_eq(kiln_plan_decode(p, r.tok, r.pos, r.stream), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "positions 7..10 outside the cache's [0, 9)"), "%s",
		      kiln_last_error());
	kiln_device_stream_sync(r.dev, r.stream);
	kiln_plan_free(p);
	ck_assert_int_eq(kiln_model_plan_prefill(r.m, T, T + 1, 1, &p), KILN_EINTERNAL);
	rig_close(&r);
}
END_TEST

/* The prefill plan generation makes (kiln_model_plan_prefill, logits 0:
 * session 45) holds no [T, V] logits: on a GPT of a vocabulary of 4096
 * (C = 16: the logits dwarf the rest), its arena and workspace are less
 * than those of the plan with logits (what generation made before, which
 * kiln_plan_decode runs) by at least (T - 1) x V x 4 bytes, for runs of
 * 2, 4 and 8 positions; kiln_plan_decode and kiln_plan_logits refuse it,
 * and its state run writes caches the one-row plan then decodes from as
 * it does from the plan with logits' (the next position's logits within
 * 1e-6: the same kernels on the same rows). */
START_TEST(test_prefill_state_alone)
{
	enum { BIGV = 4096 };
	char ini[8192];
	const int64_t t = T;
	struct kiln_tensor_desc sample, d;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream, *y;
	int32_t *tok, *pos, host_pos[T];
	int32_t tokens[T] = { 5, 1, 4, 1, 9, 2, 6, 5, 3 };
	int k = snprintf(ini, sizeof ini, "[run]\nseed = 3\n"
				 "[layer.wte]\ntype = embedding\nvocab = %d\ndim = 16\n"
				 "[layer.wpe]\ntype = pos_embedding\nmax_len = %d\n", BIGV, T);
	snprintf(ini + k, sizeof ini - (size_t)k, block, 0, "wpe", 0, 0, "", 0, 0, 0, "wpe", 0, 0, 0, 0, 0,
		 0, 0);
	strcat(ini, "[layer.ln_f]\ntype = layernorm\n"
		    "[layer.lm_head]\ntype = linear\nout = 4096\nbias = 0\n"
		    "[layer.loss]\ntype = softmax_xent\n");
	struct kiln_config *cfg = test_config(reg, ini);
	kiln_tensor_desc_init(&sample, KILN_I32, 1, &t);
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0);
	ck_assert_msg(kiln_model_create(cfg, reg, dev, &sample, &m) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	ck_assert(kiln_model_init_params(m, 7, stream) == 0);
	ck_assert(kiln_device_alloc(dev, sizeof(int32_t) * T, (void **)&tok) == 0);
	ck_assert(kiln_device_alloc(dev, sizeof(int32_t) * T, (void **)&pos) == 0);
	for (int n = 2; n <= 8; n *= 2) {
		struct kiln_plan *with, *alone, *one[2];
		float next[2][BIGV];
		ck_assert_msg(kiln_model_plan_prefill(m, T, n, 1, &with) == 0, "%s", kiln_last_error());
		ck_assert_msg(kiln_model_plan_prefill(m, T, n, 0, &alone) == 0, "%s", kiln_last_error());
		const size_t bw = kiln_plan_arena_bytes(with) + kiln_align_up(with->ws_bytes);
		const size_t ba = kiln_plan_arena_bytes(alone) + kiln_align_up(alone->ws_bytes);
		const size_t drop = (size_t)(n - 1) * BIGV * sizeof(float);
		ck_assert_msg(ba + drop <= bw, "runs of %d: the prefill plan holds %zu bytes, with its logits %zu: not %zu less",
			      n, ba, bw, drop);
		ck_assert_int_eq(kiln_plan_logits(alone, &y, &d), KILN_EINVAL);
		ck_assert_int_eq(kiln_plan_decode(alone, tok, pos, stream), KILN_EINVAL);
		ck_assert_int_eq(kiln_plan_tensor(alone, "lm_head", "y", &y, &d), KILN_ENOTFOUND);
		/* both fill a one-row plan's caches; its step at n alike */
		for (int i = 0; i < n; i++)
			host_pos[i] = i;
		for (int w = 0; w < 2; w++) {
			struct kiln_plan *pf = w ? alone : with;
			struct kiln_plan_opts o = { .decode = T };
			size_t bytes;
			char lg[sizeof(float) * BIGV];
			ck_assert(kiln_model_plan_ex(m, 1, &o, &one[w]) == 0);
			ck_assert(kiln_device_copy_async(dev, tok, tokens, sizeof(int32_t) * (size_t)n, KILN_COPY_H2D, stream) == 0);
			ck_assert(kiln_device_copy_async(dev, pos, host_pos, sizeof(int32_t) * (size_t)n, KILN_COPY_H2D, stream) == 0);
			ck_assert_msg(kiln_plan_decode_state(pf, tok, pos, stream) == 0, "%s", kiln_last_error());
			ck_assert(kiln_plan_decode_copy_rows(one[w], pf, n, stream, &bytes) == 0);
			ck_assert(kiln_device_copy_async(dev, tok, &tokens[n], sizeof(int32_t), KILN_COPY_H2D, stream) == 0);
			ck_assert(kiln_device_copy_async(dev, pos, &n, sizeof(int32_t), KILN_COPY_H2D, stream) == 0);
			ck_assert(kiln_plan_decode(one[w], tok, pos, stream) == 0);
			ck_assert(kiln_plan_logits(one[w], &y, &d) == 0);
			ck_assert(kiln_device_copy_async(dev, lg, y, sizeof lg, KILN_COPY_D2H, stream) == 0);
			ck_assert(kiln_device_stream_sync(dev, stream) == 0);
			memcpy(next[w], lg, sizeof lg);
		}
		for (int v = 0; v < BIGV; v++)
			ck_assert_msg(fabs(next[0][v] - next[1][v]) <= 1e-6 * (1 + fabs(next[0][v])),
				      "runs of %d: logit %d at position %d: %.7g after the plan with logits, %.7g after the state alone",
				      n, v, n, next[0][v], next[1][v]);
		kiln_plan_free(one[0]);
		kiln_plan_free(one[1]);
		kiln_plan_free(with);
		kiln_plan_free(alone);
	}
	void *bufs[] = { tok, pos };
	test_rig_free_bufs(dev, stream, bufs, 2);
	kiln_model_free(m);
	test_rig_close_device(dev, stream, cfg);
}
END_TEST

/* The tokens of kiln_generate_samples (n_samples 1: kiln_generate's) of
 * a prompt prefilled (session 43: its positions but the last in runs of
 * at most `max`, the caches copied into the one-row plan) equal those of
 * the prompt fed a step a position (the way before: a generator with
 * kiln_generator_prefill_max 1), under f32 and bf16 compute, for prompts
 * of 2 to T tokens (the rest of the context drawn), runs of at most 2, 4
 * and 256 positions (several runs, the last overlapping the one before;
 * one run padded past the prompt), 1 and 3 samples, greedy, temperature
 * 1.2 on two seeds, top-k 3, top-p 0.8 and both (bf16: the greedy tokens
 * alone); that each prompt of 3 tokens or more was prefilled (np - 1
 * fewer copies of logits to the host than the steps make); and the
 * one-row caches a prompt leaves give the next step's logits within 1e-5
 * (bf16 4e-3) of those the steps' caches give. */
START_TEST(test_prefill_equals_steps)
{
	static const int64_t maxes[3] = { 2, 4, 256 };
	static const struct kiln_sample_opts modes[5] = {
		{ .temperature = 0 },
		{ .temperature = 1.2, .seed = 1 },
		{ .temperature = 1.2, .seed = 2 },
		{ .temperature = 1.0, .top_k = 3, .seed = 4 },
		{ .temperature = 1.0, .top_k = 3, .seed = 5 },
	};
	static const double top_ps[5] = { 1, 1, 0.8, 1, 0.8 };
	for (int bf = 0; bf < 2; bf++) {
		struct rig r;
		struct kiln_generator *g, *steps;
		rig_open(&r, "", "", bf ? KILN_BF16 : KILN_F32);
		ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
		ck_assert(kiln_generator_new(r.m, r.stream, T, &steps) == 0);
		kiln_generator_prefill_max(steps, 1);
		for (int ns = 1; ns <= 3; ns += 2)
			for (int mx = 0; mx < 3; mx++) {
				kiln_generator_prefill_max(g, maxes[mx]);
				for (int np = 2; np <= T; np++) {
					int32_t prompt[T], a[3 * T], b[3 * T];
					const int n_new = T - np;
					for (int t = 0; t < np; t++)
						prompt[t] = (int32_t)((5 * t + 3 * np + mx + ns) % V);
					for (int md = 0; md < 5; md++) {
						struct kiln_device_counters c0, c1, c2;
						ck_assert(kiln_generator_top_p(g, top_ps[md]) == 0);
						ck_assert(kiln_generator_top_p(steps, top_ps[md]) == 0);
						kiln_device_counters_get(r.dev, &c0);
						ck_assert_msg(kiln_generate_samples(g, prompt, np, n_new, ns, &modes[md], a, NULL, NULL) == 0,
							      "%s", kiln_last_error());
						kiln_device_counters_get(r.dev, &c1);
						ck_assert(kiln_generate_samples(steps, prompt, np, n_new, ns, &modes[md], b, NULL, NULL) == 0);
						kiln_device_counters_get(r.dev, &c2);
						/* prefilled: the prompt's first np - 1
						 * positions copy no logits to the host (one
						 * position, np = 2, is a step either way) */
						const uint64_t saved = np > 2 ? (uint64_t)(np - 1) : 0;
						ck_assert_msg((c2.d2h_copies - c1.d2h_copies) - (c1.d2h_copies - c0.d2h_copies) == saved,
							      "%s, runs of at most %d, a %d-token prompt, %d samples, mode %d: %llu copies of logits to the host prefilled, %llu a step a position (not prefilled?)",
							      bf ? "bf16" : "f32", (int)maxes[mx], np, ns, md,
							      (unsigned long long)(c1.d2h_copies - c0.d2h_copies),
							      (unsigned long long)(c2.d2h_copies - c1.d2h_copies));
						/* bf16: greedy tokens alone (a drawn token
						 * may turn on a rounding the kernels'
						 * choice, by timing, decides) */
						for (int i = 0; (!bf || md == 0) && i < ns * n_new; i++)
							ck_assert_msg(a[i] == b[i], "%s, runs of at most %d, a %d-token prompt, %d samples, mode %d: sample %d token %d is %d prefilled, %d fed a step a position",
								      bf ? "bf16" : "f32", (int)maxes[mx], np, ns, md,
								      i / (n_new ? n_new : 1), i % (n_new ? n_new : 1), a[i], b[i]);
					}
				}
			}
		/* the caches: the step after a prompt (and one greedy token) */
		const struct kiln_sample_opts greedy = { .temperature = 0 };
		for (int mx = 0; mx < 3; mx++) {
			kiln_generator_prefill_max(g, maxes[mx]);
			for (int np = 2; np < T; np++) {
				int32_t prompt[T], ta, tb;
				const float *lg;
				float la[V];
				for (int t = 0; t < np; t++)
					prompt[t] = (int32_t)((7 * t + np) % V);
				struct kiln_device_counters c0, c1, c2;
				kiln_device_counters_get(r.dev, &c0);
				ck_assert(kiln_generate(g, prompt, np, 1, &greedy, &ta, NULL, NULL) == 0);
				kiln_device_counters_get(r.dev, &c1);
				ck_assert(kiln_generate(steps, prompt, np, 1, &greedy, &tb, NULL, NULL) == 0);
				kiln_device_counters_get(r.dev, &c2);
				ck_assert_msg((c2.d2h_copies - c1.d2h_copies) - (c1.d2h_copies - c0.d2h_copies) ==
						      (np > 2 ? (uint64_t)(np - 1) : 0),
					      "%s, runs of at most %d, a %d-token prompt: not prefilled", bf ? "bf16" : "f32",
					      (int)maxes[mx], np);
				ck_assert_int_eq(ta, tb);
				ck_assert(kiln_generator_step(g, np, ta, &lg) == 0);
				memcpy(la, lg, sizeof la);
				ck_assert(kiln_generator_step(steps, np, tb, &lg) == 0);
				for (int v = 0; v < V; v++)
					ck_assert_msg(fabs(la[v] - lg[v]) <= (bf ? 4e-3 : 1e-5) * (1 + fabs(lg[v])),
						      "%s, runs of at most %d, a %d-token prompt: logit %d after it %.7g prefilled, %.7g fed a step a position",
						      bf ? "bf16" : "f32", (int)maxes[mx], np, v, la[v], lg[v]);
			}
		}
		kiln_generator_close(steps);
		kiln_generator_close(g);
		rig_close(&r);
	}
}
END_TEST

/* A prompt costs one copy of logits to the host, that of its last token,
 * not one a token (session 43: before, each of its positions was a step
 * whose logits were copied back, as prefill_max 1 still does):
 * kiln_generate_samples of a 6-token prompt and n_new tokens copies
 * n_new blocks of logits to the host, for 1 and 3 samples and 1 and 3
 * new tokens, against 6 + n_new - 1 fed a step a position. */
START_TEST(test_prefill_fewer_copies)
{
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[6] = { 4, 1, 7, 2, 9, 3 };
	int32_t out[3 * 3];
	const struct kiln_sample_opts s = { .temperature = 1, .seed = 2 };
	rig_open(&r, "", "", KILN_F32);
	for (int way = 0; way < 2; way++) {
		ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0); /* as it comes */
		if (way)
			kiln_generator_prefill_max(g, 1);
		for (int ns = 1; ns <= 3; ns += 2)
			for (int n_new = 1; n_new <= 3; n_new += 2) {
				struct kiln_device_counters c0, c1;
				/* (the plans made by a first call) */
				ck_assert(kiln_generate_samples(g, prompt, 6, n_new, ns, &s, out, NULL, NULL) == 0);
				kiln_device_counters_get(r.dev, &c0);
				ck_assert(kiln_generate_samples(g, prompt, 6, n_new, ns, &s, out, NULL, NULL) == 0);
				kiln_device_counters_get(r.dev, &c1);
				const uint64_t want = way ? (uint64_t)(6 + n_new - 1) : (uint64_t)n_new;
				ck_assert_msg(c1.d2h_copies - c0.d2h_copies == want,
					      "%s, %d samples, %d new tokens: %llu copies of logits to the host, not %llu",
					      way ? "a step a position" : "prefilled", ns, n_new,
					      (unsigned long long)(c1.d2h_copies - c0.d2h_copies),
					      (unsigned long long)want);
			}
		kiln_generator_close(g);
	}
	rig_close(&r);
}
END_TEST

/* The prefill plan is held between prompts (session 44; session 43 made
 * and freed it at every prompt): one generator fed prompts of 6, 7, 4,
 * 5, 3, 6, 8 and 2 tokens (runs of 8, 8, 4, 4, 2, 8 and 8 positions; the
 * last a step) draws the tokens a generator fed them a step a position
 * draws (greedy and sampled), allocates nothing at a prompt whose run
 * length is the held plan's (nor at the step-fed one) and allocates at
 * one of another length (the plan made anew; a shorter prompt padded in
 * the held plan was measured in session 45 and not taken up:
 * core/generate.c prefill_fits); fed a step a position it never
 * allocates. */
START_TEST(test_prefill_held)
{
	static const int lens[8] = { 6, 7, 4, 5, 3, 6, 8, 2 };
	static const int replan[8] = { 1, 0, 1, 0, 1, 1, 0, 0 };
	static const struct kiln_sample_opts modes[2] = { { .temperature = 0 },
							  { .temperature = 1.3, .seed = 5 } };
	struct rig r;
	struct kiln_generator *g, *steps;
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &steps) == 0);
	kiln_generator_prefill_max(steps, 1);
	{ /* (warm: whatever a first call makes) */
		const int32_t p3[3] = { 1, 2, 3 };
		int32_t o1;
		ck_assert(kiln_generate(steps, p3, 3, 1, &modes[0], &o1, NULL, NULL) == 0);
	}
	for (int md = 0; md < 2; md++)
		for (int k = 0; k < 8; k++) {
			const int np = lens[k], n_new = T - np;
			int32_t prompt[T], a[T], b[T];
			struct kiln_device_counters c0, c1, c2;
			for (int t = 0; t < np; t++)
				prompt[t] = (int32_t)((3 * t + 2 * k + 1) % V);
			kiln_device_counters_get(r.dev, &c0);
			ck_assert_msg(kiln_generate(g, prompt, np, n_new, &modes[md], a, NULL, NULL) == 0, "%s",
				      kiln_last_error());
			kiln_device_counters_get(r.dev, &c1);
			ck_assert(kiln_generate(steps, prompt, np, n_new, &modes[md], b, NULL, NULL) == 0);
			kiln_device_counters_get(r.dev, &c2);
			/* (the second mode's first prompt: the plan of 8 the
			 * first mode's last prefilled prompt left) */
			const int made = replan[k] && !(md == 1 && k == 0);
			ck_assert_msg(made ? c1.allocs > c0.allocs : c1.allocs == c0.allocs,
				      "mode %d, prompt %d of %d tokens: %llu allocations (%s)", md, k, np,
				      (unsigned long long)(c1.allocs - c0.allocs),
				      made ? "a plan of another run length to make" : "the held plan's run length");
			ck_assert_msg(c2.allocs == c1.allocs, "fed a step a position: %llu allocations",
				      (unsigned long long)(c2.allocs - c1.allocs));
			for (int i = 0; i < n_new; i++)
				ck_assert_msg(a[i] == b[i], "mode %d, prompt %d of %d tokens: token %d is %d prefilled, %d fed a step a position",
					      md, k, np, i, a[i], b[i]);
		}
	kiln_generator_close(steps);
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

/* Not held (kiln_generator_prefill_keep 0: [run] memory_limit, which
 * kiln_generator_open reads, tests/generate.sh): the prefill plan, a
 * second copy of the caches, is freed after every prompt, so each repeat
 * of a prompt on a warm generator allocates it again (session 43's
 * test_prefill_freed); held, a repeat allocates nothing. */
START_TEST(test_prefill_freed)
{
	struct rig r;
	const int32_t prompt[6] = { 4, 1, 7, 2, 9, 3 };
	int32_t out[2];
	const struct kiln_sample_opts s = { .temperature = 0 };
	rig_open(&r, "", "", KILN_F32);
	for (int keep = 0; keep < 2; keep++) {
		struct kiln_generator *g;
		ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
		kiln_generator_prefill_keep(g, keep);
		ck_assert(kiln_generate(g, prompt, 6, 2, &s, out, NULL, NULL) == 0); /* warm */
		for (int rep = 0; rep < 3; rep++) {
			struct kiln_device_counters c0, c1;
			kiln_device_counters_get(r.dev, &c0);
			ck_assert(kiln_generate(g, prompt, 6, 2, &s, out, NULL, NULL) == 0);
			kiln_device_counters_get(r.dev, &c1);
			ck_assert_msg(keep ? c1.allocs == c0.allocs : c1.allocs > c0.allocs,
				      "plan %s: %llu allocations at repeat %d of the prompt", keep ? "held" : "not held",
				      (unsigned long long)(c1.allocs - c0.allocs), rep + 1);
		}
		kiln_generator_close(g);
	}
	rig_close(&r);
}
END_TEST

/* kiln_generator_plan_samples makes the plan kiln_generate_samples uses
 * (a call of as many samples then makes none: no allocation), refuses
 * what does not fit as it does (KILN_EUSAGE naming the samples, here a
 * million under an RLIMIT_AS 512 MiB above the process), and 0 samples
 * (KILN_EINVAL); `kiln generate` calls it before it allocates the
 * samples' tokens (tests/generate.sh).  (The prompt is fed a step a
 * position: the prefill plan, freed as an N-row plan is made, would be
 * made again at the prompt.) */
START_TEST(test_plan_samples)
{
	struct rig r;
	struct kiln_generator *g;
	const int32_t prompt[3] = { 4, 1, 7 };
	int32_t out[4 * 2];
	const struct kiln_sample_opts s = { .temperature = 1, .seed = 3 };
	struct kiln_device_counters c0, c1;
	rig_open(&r, "", "", KILN_F32);
	ck_assert(kiln_generator_new(r.m, r.stream, T, &g) == 0);
	/* (the prompt a step a position: the prefill plan is freed when
	 * an N-row plan is made, docs/generate.md) */
	kiln_generator_prefill_max(g, 1);
	ck_assert(kiln_generate_samples(g, prompt, 3, 2, 2, &s, out, NULL, NULL) == 0); /* warm */
	ck_assert_msg(kiln_generator_plan_samples(g, 4) == 0, "%s", kiln_last_error());
	kiln_device_counters_get(r.dev, &c0);
	ck_assert(kiln_generate_samples(g, prompt, 3, 2, 4, &s, out, NULL, NULL) == 0);
	kiln_device_counters_get(r.dev, &c1);
	ck_assert_msg(c1.allocs == c0.allocs, "%llu allocations after the plan was made",
		      (unsigned long long)(c1.allocs - c0.allocs));
	ck_assert_int_eq(kiln_generator_plan_samples(g, 0), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "n_samples = 0"), "%s", kiln_last_error());
	struct rlimit old, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = (rlim_t)(vm_bytes() + ((size_t)512 << 20));
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
	const kiln_status st = kiln_generator_plan_samples(g, 1000000);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", kiln_last_error());
	setrlimit(RLIMIT_AS, &old);
	ck_assert_int_eq(st, KILN_EUSAGE);
	ck_assert_msg(strstr(msg, "1000000 samples decoded at once need a decode plan of "), "%s", msg);
	ck_assert(kiln_generate(g, prompt, 3, 2, &s, out, NULL, NULL) == 0);
	kiln_generator_close(g);
	rig_close(&r);
}
END_TEST

static Suite *make_generate_suite(void)
{
	Suite *s = suite_create("generate");
	check_add_case(s, "decode", 120, NULL, NULL, (const TTest *[]){
		test_decode_equals_full, test_decode_bf16, test_greedy_is_full_argmax,
		test_sampling, test_errors, test_sample_not_finite, test_draw_bounds,
		test_open_precision, test_top_p_vs_reference, test_top_p_draws, test_samples, test_top_p_bounds,
		test_step_positions, test_samples_prompt_once, test_samples_plan_freed, test_samples_too_many,
		test_context_refused, NULL });
	check_add_case(s, "prefill", 240, NULL, NULL, (const TTest *[]){
		test_prefill_plan_logits, test_prefill_state_alone, test_prefill_equals_steps, test_prefill_fewer_copies,
		test_prefill_held, test_prefill_freed,
		test_plan_samples, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_generate_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
