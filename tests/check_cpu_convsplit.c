/* tests/check_cpu_convsplit.c - the CPU device's convolution weight
 * gradient in blocks of the minibatch (plugins/cpu/convsplit.c): dw and db
 * are right (against a double-precision reference, with and without
 * KILN_OPF_ACCUMULATE, close to the unsplit oneDNN kernel's), and their
 * bytes are the same on teams of 2, 3 and 4 threads and on an adaptive
 * team that switches between 2 threads and 1 every op
 * ($KILN_CPU_TEAM_FLIP): the plan follows the team with no versions, where
 * oneDNN's own kernel, which splits the minibatch by its thread count,
 * gives other bytes ($KILN_CPU_CONV_SPLIT=0 turns the blocks off).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity */
#endif
#include <kiln/kiln.h>

#include <check.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_main.h"
#include "test_util.h"

static struct kiln_registry *reg;

/* the CNN's second convolution at a quarter of its batch: x [32,32,14,14],
 * w [64,32,5,5], padding 2 (8 blocks of 4 samples); and an odd one:
 * x [12,8,41,39], w [16,8,3,3], stride 2, no padding (6 blocks of 2) */
struct shape {
	int64_t N, C, H, W, O, KH, KW, stride, pad;
};
static const struct shape shapes[] = { { 32, 32, 14, 14, 64, 5, 5, 1, 2 },
				       { 12, 8, 41, 39, 16, 3, 3, 2, 0 } };

struct wgrad {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *plan, *stream, *x, *dy, *dw, *db, *ws;
	size_t wsb;
	struct shape s;
	int64_t OH, OW, nx, ndy, ndw;
};

static float val(uint32_t i, uint32_t salt) { return test_hash_val(i, salt); }

/* The debug lines of the cpu device about the weight gradient's plan. */
struct plan_log {
	int blocks, stays;
};

static void plan_sink(void *user, int level, const char *who, const char *msg)
{
	struct plan_log *l = user;
	(void)level;
	if (strcmp(who, "cpu") || !strstr(msg, "CONV_BWD_WEIGHTS"))
		return;
	l->blocks += strstr(msg, " blocks of ") != NULL;
	l->stays += strstr(msg, "stays on the opening team") != NULL;
}

/* Count the plan's debug lines into log (NULL: stop, back to `level`). */
static int log_to(struct plan_log *log, int level)
{
	const int was = kiln_log_get_level();
	kiln_log_set_sink(log ? plan_sink : NULL, log);
	kiln_log_set_level(log ? KILN_LOG_DEBUG : level);
	return was;
}

/* A CONV_BWD_WEIGHTS with a bias gradient (added into dw, db with acc) on
 * a cpu device of `threads` threads (0: the adaptive team), x and dy
 * filled from val(). */
static void wgrad_open(struct wgrad *g, const struct shape *s, int threads, int acc)
{
	char ov[64];
	memset(g, 0, sizeof *g);
	g->s = *s;
	g->OH = (s->H + 2 * s->pad - s->KH) / s->stride + 1;
	g->OW = (s->W + 2 * s->pad - s->KW) / s->stride + 1;
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	ck_assert(kiln_config_new(&g->cfg) == 0);
	ck_assert(kiln_config_override(g->cfg, ov) == 0);
	ck_assert_msg(kiln_device_open(reg, g->cfg, "cpu", 0, &g->dev) == 0, "%s", kiln_last_error());
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV_BWD_WEIGHTS;
	op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = 2;
	op.n_out = 2;
	const int64_t dx[4] = { s->N, s->C, s->H, s->W }, dy[4] = { s->N, s->O, g->OH, g->OW },
		      dw[4] = { s->O, s->C, s->KH, s->KW }, db[1] = { s->O };
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 4, dx);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 4, dy);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 4, dw);
	kiln_tensor_desc_init(&op.out[1], KILN_F32, 1, db);
	op.i[0] = op.i[1] = s->stride;
	op.i[2] = op.i[3] = s->pad;
	op.i[4] = op.i[5] = 1;
	op.i[6] = 1;
	ck_assert_msg(kiln_device_prepare(g->dev, &op, &g->plan, &g->wsb) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(g->dev, &g->stream) == 0);
	g->nx = s->N * s->C * s->H * s->W;
	g->ndy = s->N * s->O * g->OH * g->OW;
	g->ndw = s->O * s->C * s->KH * s->KW;
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->nx * 4, &g->x) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->ndy * 4, &g->dy) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->ndw * 4, &g->dw) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)s->O * 4, &g->db) == 0);
	if (g->wsb)
		ck_assert(kiln_device_alloc(g->dev, g->wsb, &g->ws) == 0);
	for (int64_t i = 0; i < g->nx; i++)
		((float *)g->x)[i] = val((uint32_t)i, 1);
	for (int64_t i = 0; i < g->ndy; i++)
		((float *)g->dy)[i] = val((uint32_t)i, 2);
}

/* One run from dw = val(salt 3), db = val(salt 4). */
static void wgrad_run(struct wgrad *g)
{
	struct kiln_op_args args = { .in = { g->x, g->dy }, .out = { g->dw, g->db },
				     .workspace = g->ws, .workspace_bytes = g->wsb };
	for (int64_t i = 0; i < g->ndw; i++)
		((float *)g->dw)[i] = val((uint32_t)i, 3);
	for (int64_t i = 0; i < g->s.O; i++)
		((float *)g->db)[i] = val((uint32_t)i, 4);
	ck_assert_msg(kiln_device_run(g->dev, g->plan, &args, g->stream) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_sync(g->dev, g->stream) == 0);
}

static void wgrad_close(struct wgrad *g)
{
	void *bufs[] = { g->x, g->dy, g->dw, g->db, g->ws };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(g->dev, bufs[i]);
	kiln_device_plan_free(g->dev, g->plan);
	kiln_device_stream_destroy(g->dev, g->stream);
	kiln_device_close(g->dev);
	kiln_config_free(g->cfg);
}

/* dw and db against a double-precision sum, relative to the sum of the
 * terms' magnitudes.  ck_abort_msg on a mismatch only. */
static void check_grads(const struct wgrad *g, int acc)
{
	const struct shape *s = &g->s;
	const float *x = g->x, *dy = g->dy, *dw = g->dw, *db = g->db;
	for (int64_t o = 0; o < s->O; o++) {
		double b = acc ? val((uint32_t)o, 4) : 0, bm = fabs(b);
		for (int64_t n = 0; n < s->N; n++)
			for (int64_t i = 0; i < g->OH * g->OW; i++) {
				const double v = dy[(n * s->O + o) * g->OH * g->OW + i];
				b += v, bm += fabs(v);
			}
		if (!(fabs(db[o] - b) <= 1e-5 * bm + 1e-6))
			ck_abort_msg("db[%lld] = %.7g, want %.7g", (long long)o, db[o], b);
		for (int64_t c = 0; c < s->C; c++)
			for (int64_t kh = 0; kh < s->KH; kh++)
				for (int64_t kw = 0; kw < s->KW; kw++) {
					const int64_t at = ((o * s->C + c) * s->KH + kh) * s->KW + kw;
					double w = acc ? val((uint32_t)at, 3) : 0, wm = fabs(w);
					for (int64_t n = 0; n < s->N; n++)
						for (int64_t oh = 0; oh < g->OH; oh++) {
							const int64_t ih = oh * s->stride - s->pad + kh;
							if (ih < 0 || ih >= s->H)
								continue;
							for (int64_t ow = 0; ow < g->OW; ow++) {
								const int64_t iw = ow * s->stride - s->pad + kw;
								if (iw < 0 || iw >= s->W)
									continue;
								const double t =
									(double)x[((n * s->C + c) * s->H + ih) * s->W + iw] *
									dy[((n * s->O + o) * g->OH + oh) * g->OW + ow];
								w += t, wm += fabs(t);
							}
						}
					if (!(fabs(dw[at] - w) <= 1e-5 * wm + 1e-6))
						ck_abort_msg("dw[%lld] = %.7g, want %.7g", (long long)at, dw[at], w);
				}
	}
}

/* dw and db of shape s (acc) on `threads`, as one buffer. */
static float *grads_on(const struct shape *s, int threads, int acc)
{
	struct wgrad g;
	wgrad_open(&g, s, threads, acc);
	wgrad_run(&g);
	float *out = malloc((size_t)(g.ndw + s->O) * sizeof *out);
	memcpy(out, g.dw, (size_t)g.ndw * sizeof *out);
	memcpy(out + g.ndw, g.db, (size_t)s->O * sizeof *out);
	wgrad_close(&g);
	return out;
}

START_TEST(test_blocks_right)
{
	for (int k = 0; k < 2; k++)
		for (int acc = 0; acc < 2; acc++) {
			struct wgrad g;
			struct plan_log log = { 0, 0 };
			const int level = log_to(&log, 0);
			wgrad_open(&g, &shapes[k], 2, acc);
			log_to(NULL, level);
			ck_assert_msg(log.blocks == 1, "shape %d: the plan is not in blocks", k);
			wgrad_run(&g);
			wgrad_run(&g); /* a second run: the partials start afresh */
			check_grads(&g, acc);
			wgrad_close(&g);
		}
}
END_TEST

/* The split plan's gradients against oneDNN's whole kernel (the blocks
 * off): the same to float tolerance. */
START_TEST(test_blocks_near_whole)
{
	const struct shape *s = &shapes[0];
	const int64_t n = s->O * s->C * s->KH * s->KW + s->O;
	float *split = grads_on(s, 2, 0);
	setenv("KILN_CPU_CONV_SPLIT", "0", 1);
	float *whole = grads_on(s, 2, 0);
	unsetenv("KILN_CPU_CONV_SPLIT");
	double worst = 0;
	for (int64_t i = 0; i < n; i++) {
		const double d = fabs((double)split[i] - whole[i]) / (1.0 + fabs((double)whole[i]));
		worst = d > worst ? d : worst;
	}
	ck_assert_msg(worst < 1e-4, "the blocks' gradients differ from the whole kernel's by %.3g", worst);
	free(split);
	free(whole);
}
END_TEST

/* The bytes on teams of 3 and 4 threads and on the adaptive team that
 * switches between 2 threads and 1 every op are the 2-thread team's; the
 * adaptive plan needs no version for one thread (none is made, none
 * refused). */
START_TEST(test_blocks_bytes_any_team)
{
	cpu_set_t set;
	const int adapt = !sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) >= 2;
	for (int k = 0; k < 2; k++) {
		const struct shape *s = &shapes[k];
		const size_t bytes = (size_t)(s->O * s->C * s->KH * s->KW + s->O) * sizeof(float);
		float *two = grads_on(s, 2, 1);
		for (int threads = 3; threads <= 4; threads++) {
			float *other = grads_on(s, threads, 1);
			ck_assert_msg(!memcmp(two, other, bytes),
				      "shape %d: other bytes on %d threads than on 2", k, threads);
			free(other);
		}
		if (!adapt) { /* run.threads = 0 opens one thread: nothing adapts */
			free(two);
			continue;
		}
		struct wgrad g;
		struct plan_log log = { 0, 0 };
		const int level = log_to(&log, 0);
		setenv("KILN_CPU_TEAM_FLIP", "1", 1);
		wgrad_open(&g, s, 0, 1);
		unsetenv("KILN_CPU_TEAM_FLIP");
		for (int r = 0; r < 6; r++) { /* 2 threads, 1, 2, ... */
			wgrad_run(&g);
			ck_assert_msg(!memcmp(two, g.dw, (size_t)g.ndw * sizeof(float)) &&
					      !memcmp(two + g.ndw, g.db, (size_t)s->O * sizeof(float)),
				      "shape %d, run %d of the adaptive team: other bytes than 2 threads'", k, r);
		}
		wgrad_close(&g);
		log_to(NULL, level);
		ck_assert_msg(log.blocks == 1 && log.stays == 0,
			      "shape %d: %d plans in blocks, %d kept on the opening team", k, log.blocks,
			      log.stays);
		free(two);
	}
}
END_TEST

static Suite *make_cpu_convsplit_suite(void)
{
	Suite *s = suite_create("cpu_convsplit");
	check_add_case(s, "blocks", 120, NULL, NULL, (const TTest *[]){
		test_blocks_right, test_blocks_near_whole, test_blocks_bytes_any_team, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_convsplit_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
