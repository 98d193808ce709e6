/* tests/check_cpu_convsplit.c - the CPU device's convolution weight
 * gradient in blocks of the minibatch (plugins/cpu/convsplit.c): dw and db
 * are right (against a double-precision reference, with and without
 * KILN_OPF_ACCUMULATE, close to the unsplit oneDNN kernel's), and their
 * bytes are the same on teams of 2, 3 and 4 threads and on an adaptive
 * team that switches between 2 threads and 1 every op
 * ($KILN_CPU_TEAM_FLIP): the plan follows the team with no versions, where
 * oneDNN's own kernel, which splits the minibatch by its thread count,
 * gives other bytes ($KILN_CPU_CONV_SPLIT=0 turns the blocks off).
 * An odd batch (13: no divisor 2..8) runs in unequal blocks.  bf16 weight
 * gradients (bf16 x and dy, f32 dw and db) run in blocks too: right, the
 * same bytes on any team with either kernel ([plugin.cpu] bf16_conv = bf16
 * or f32), and with the f32 kernel the bytes of the f32 op on the same
 * values: the blocks use the kernel the op was given.
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
 * w [64,32,5,5], padding 2 (8 blocks of 4 samples); an odd one:
 * x [12,8,41,39], w [16,8,3,3], stride 2, no padding (6 blocks of 2); and
 * a batch of 13 (no divisor 2..8: 6 blocks, 3 samples, then five of 2) */
struct shape {
	int64_t N, C, H, W, O, KH, KW, stride, pad;
};
static const struct shape shapes[] = { { 32, 32, 14, 14, 64, 5, 5, 1, 2 },
				       { 12, 8, 41, 39, 16, 3, 3, 2, 0 },
				       { 13, 8, 41, 39, 16, 3, 3, 2, 0 } };
#define N_SHAPES ((int)(sizeof shapes / sizeof *shapes))

struct wgrad {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *plan, *stream, *x, *dy, *dw, *db, *ws;
	float *xf, *dyf; /* x and dy as the op reads them (bf16 ones widened) */
	size_t wsb;
	struct shape s;
	int dt; /* x and dy: KILN_F32 or KILN_BF16 */
	int64_t OH, OW, nx, ndy, ndw;
};

static float val(uint32_t i, uint32_t salt) { return test_hash_val(i, salt); }

/* f to bf16, to nearest even (the values here are finite) */
static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h)
{
	const uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* a value of val() as a tensor of dt holds it */
static float val_as(uint32_t i, uint32_t salt, int dt)
{
	return dt == KILN_BF16 ? from_bf16(to_bf16(val(i, salt))) : val(i, salt);
}
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
 * a cpu device of `threads` threads (0: the adaptive team), x and dy of
 * dtype dt (f32 dw and db) filled from val(); kern: [plugin.cpu]
 * bf16_conv, or NULL. */
static void wgrad_open_dt(struct wgrad *g, const struct shape *s, int threads, int acc, int dt,
			  const char *kern)
{
	char ov[64];
	memset(g, 0, sizeof *g);
	g->s = *s;
	g->dt = dt;
	g->OH = (s->H + 2 * s->pad - s->KH) / s->stride + 1;
	g->OW = (s->W + 2 * s->pad - s->KW) / s->stride + 1;
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	ck_assert(kiln_config_new(&g->cfg) == 0);
	ck_assert(kiln_config_override(g->cfg, ov) == 0);
	/* oneDNN's kernel in blocks, not the FFT (conv_algo = rule's choice
	 * for the CNN's conv2 on AVX2) */
	ck_assert(kiln_config_override(g->cfg, "plugin.cpu.conv_algo=direct") == 0);
	if (kern) {
		snprintf(ov, sizeof ov, "plugin.cpu.bf16_conv=%s", kern);
		ck_assert(kiln_config_override(g->cfg, ov) == 0);
	}
	ck_assert_msg(kiln_device_open(reg, g->cfg, "cpu", 0, &g->dev) == 0, "%s", kiln_last_error());
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV_BWD_WEIGHTS;
	op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = 2;
	op.n_out = 2;
	const int64_t dx[4] = { s->N, s->C, s->H, s->W }, dy[4] = { s->N, s->O, g->OH, g->OW },
		      dw[4] = { s->O, s->C, s->KH, s->KW }, db[1] = { s->O };
	kiln_tensor_desc_init(&op.in[0], dt, 4, dx);
	kiln_tensor_desc_init(&op.in[1], dt, 4, dy);
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
	const size_t ex = dt == KILN_BF16 ? 2 : 4;
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->nx * ex, &g->x) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->ndy * ex, &g->dy) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)g->ndw * 4, &g->dw) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)s->O * 4, &g->db) == 0);
	if (g->wsb)
		ck_assert(kiln_device_alloc(g->dev, g->wsb, &g->ws) == 0);
	g->xf = malloc((size_t)g->nx * sizeof *g->xf);
	g->dyf = malloc((size_t)g->ndy * sizeof *g->dyf);
	ck_assert(g->xf && g->dyf);
	for (int64_t i = 0; i < g->nx; i++)
		g->xf[i] = val_as((uint32_t)i, 1, dt);
	for (int64_t i = 0; i < g->ndy; i++)
		g->dyf[i] = val_as((uint32_t)i, 2, dt);
	for (int64_t i = 0; i < g->nx; i++)
		if (dt == KILN_BF16)
			((uint16_t *)g->x)[i] = to_bf16(g->xf[i]);
		else
			((float *)g->x)[i] = g->xf[i];
	for (int64_t i = 0; i < g->ndy; i++)
		if (dt == KILN_BF16)
			((uint16_t *)g->dy)[i] = to_bf16(g->dyf[i]);
		else
			((float *)g->dy)[i] = g->dyf[i];
}

static void wgrad_open(struct wgrad *g, const struct shape *s, int threads, int acc)
{
	wgrad_open_dt(g, s, threads, acc, KILN_F32, NULL);
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
	free(g->xf);
	free(g->dyf);
}

/* dw and db against a double-precision sum, relative to the sum of the
 * terms' magnitudes.  ck_abort_msg on a mismatch only. */
static void check_grads(const struct wgrad *g, int acc)
{
	const struct shape *s = &g->s;
	const float *x = g->xf, *dy = g->dyf, *dw = g->dw, *db = g->db;
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

/* dw and db of shape s (acc) on `threads`, x and dy of dt (kern: bf16_conv
 * or NULL), as one buffer; *blocks (unless NULL): plans made in blocks. */
static float *grads_on_dt(const struct shape *s, int threads, int acc, int dt, const char *kern,
			  int *blocks)
{
	struct wgrad g;
	struct plan_log log = { 0, 0 };
	const int level = log_to(&log, 0);
	wgrad_open_dt(&g, s, threads, acc, dt, kern);
	log_to(NULL, level);
	if (blocks)
		*blocks = log.blocks;
	wgrad_run(&g);
	float *out = malloc((size_t)(g.ndw + s->O) * sizeof *out);
	memcpy(out, g.dw, (size_t)g.ndw * sizeof *out);
	memcpy(out + g.ndw, g.db, (size_t)s->O * sizeof *out);
	wgrad_close(&g);
	return out;
}

static float *grads_on(const struct shape *s, int threads, int acc)
{
	return grads_on_dt(s, threads, acc, KILN_F32, NULL, NULL);
}

START_TEST(test_blocks_right)
{
	for (int k = 0; k < N_SHAPES; k++)
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

/* The bytes of shape k (x and dy of dt, kern: bf16_conv) on teams of 3
 * and 4 threads and on the adaptive team that switches between 2 threads
 * and 1 every op are the 2-thread team's, every plan in blocks; the
 * adaptive plan needs no version for one thread (none is made, none
 * refused). */
static void bytes_any_team(int k, int dt, const char *kern)
{
	cpu_set_t set;
	const int adapt = !sched_getaffinity(0, sizeof set, &set) && CPU_COUNT(&set) >= 2;
	const char *what = dt == KILN_BF16 ? (kern ? kern : "bf16 auto") : "f32";
	const struct shape *s = &shapes[k];
	const size_t bytes = (size_t)(s->O * s->C * s->KH * s->KW + s->O) * sizeof(float);
	int blocks = 0;
	float *two = grads_on_dt(s, 2, 1, dt, kern, &blocks);
	ck_assert_msg(blocks == 1, "shape %d, %s: the 2-thread plan is not in blocks", k, what);
	for (int threads = 3; threads <= 4; threads++) {
		float *other = grads_on_dt(s, threads, 1, dt, kern, &blocks);
		ck_assert_msg(blocks == 1, "shape %d, %s: the %d-thread plan is not in blocks", k, what,
			      threads);
		ck_assert_msg(!memcmp(two, other, bytes), "shape %d, %s: other bytes on %d threads than on 2",
			      k, what, threads);
		free(other);
	}
	if (!adapt) { /* run.threads = 0 opens one thread: nothing adapts */
		free(two);
		return;
	}
	struct wgrad g;
	struct plan_log log = { 0, 0 };
	const int level = log_to(&log, 0);
	setenv("KILN_CPU_TEAM_FLIP", "1", 1);
	wgrad_open_dt(&g, s, 0, 1, dt, kern);
	unsetenv("KILN_CPU_TEAM_FLIP");
	for (int r = 0; r < 6; r++) { /* 2 threads, 1, 2, ... */
		wgrad_run(&g);
		ck_assert_msg(!memcmp(two, g.dw, (size_t)g.ndw * sizeof(float)) &&
				      !memcmp(two + g.ndw, g.db, (size_t)s->O * sizeof(float)),
			      "shape %d, %s, run %d of the adaptive team: other bytes than 2 threads'", k,
			      what, r);
	}
	wgrad_close(&g);
	log_to(NULL, level);
	ck_assert_msg(log.blocks == 1 && log.stays == 0,
		      "shape %d, %s: %d plans in blocks, %d kept on the opening team", k, what,
		      log.blocks, log.stays);
	free(two);
}

START_TEST(test_blocks_bytes_any_team)
{
	for (int k = 0; k < N_SHAPES; k++)
		bytes_any_team(k, KILN_F32, NULL);
}
END_TEST

/* bf16 x and dy: the same bytes on any team with oneDNN's bf16 kernel and
 * with its f32 one (bf16_conv = f32), in equal and unequal blocks. */
START_TEST(test_bf16_bytes_any_team)
{
	static const int which[] = { 0, 2 };
	for (int i = 0; i < 2; i++) {
		bytes_any_team(which[i], KILN_BF16, "bf16");
		bytes_any_team(which[i], KILN_BF16, "f32");
	}
}
END_TEST

/* bf16 gradients in blocks (2 threads, with and without accumulation)
 * against the double-precision sum of the bf16 values (exact products, f32
 * sums: the f32 bound) and against oneDNN's whole f32 kernel on the same
 * values (the blocks off) within bf16's tolerance. */
START_TEST(test_bf16_blocks_right)
{
	static const int which[] = { 0, 2 };
	for (int i = 0; i < 2; i++) {
		const struct shape *s = &shapes[which[i]];
		for (int acc = 0; acc < 2; acc++) {
			struct wgrad g;
			struct plan_log log = { 0, 0 };
			const int level = log_to(&log, 0);
			wgrad_open_dt(&g, s, 2, acc, KILN_BF16, "bf16");
			log_to(NULL, level);
			ck_assert_msg(log.blocks == 1, "shape %d: the bf16 plan is not in blocks", which[i]);
			wgrad_run(&g);
			wgrad_run(&g);
			check_grads(&g, acc);
			wgrad_close(&g);
		}
		const int64_t n = s->O * s->C * s->KH * s->KW + s->O;
		float *split = grads_on_dt(s, 2, 0, KILN_BF16, "bf16", NULL);
		setenv("KILN_CPU_CONV_SPLIT", "0", 1);
		/* the f32 op on the same (bf16) values, whole */
		struct wgrad g;
		wgrad_open_dt(&g, s, 2, 0, KILN_F32, NULL);
		for (int64_t j = 0; j < g.nx; j++)
			((float *)g.x)[j] = g.xf[j] = val_as((uint32_t)j, 1, KILN_BF16);
		for (int64_t j = 0; j < g.ndy; j++)
			((float *)g.dy)[j] = g.dyf[j] = val_as((uint32_t)j, 2, KILN_BF16);
		unsetenv("KILN_CPU_CONV_SPLIT");
		wgrad_run(&g);
		double worst = 0;
		for (int64_t j = 0; j < n; j++) {
			const float w = j < g.ndw ? ((float *)g.dw)[j] : ((float *)g.db)[j - g.ndw];
			const double d = fabs((double)split[j] - w) / (1.0 + fabs((double)w));
			worst = d > worst ? d : worst;
		}
		wgrad_close(&g);
		free(split);
		ck_assert_msg(worst < 1e-3, "shape %d: the bf16 blocks differ from the whole f32 kernel by %.3g",
			      which[i], worst);
	}
}
END_TEST

/* With bf16_conv = f32 every block runs oneDNN's f32 kernel on the widened
 * values (the kernel tune.c chose for the op): the bytes of the f32 op on
 * the same values in the same blocks, equal and unequal ones. */
START_TEST(test_bf16_blocks_take_kernel)
{
	static const int which[] = { 0, 2 };
	for (int i = 0; i < 2; i++) {
		const struct shape *s = &shapes[which[i]];
		int blocks = 0;
		float *lowp = grads_on_dt(s, 2, 1, KILN_BF16, "f32", &blocks);
		ck_assert_msg(blocks == 1, "shape %d: the bf16 plan is not in blocks", which[i]);
		struct wgrad g;
		wgrad_open_dt(&g, s, 2, 1, KILN_F32, NULL);
		for (int64_t j = 0; j < g.nx; j++)
			((float *)g.x)[j] = val_as((uint32_t)j, 1, KILN_BF16);
		for (int64_t j = 0; j < g.ndy; j++)
			((float *)g.dy)[j] = val_as((uint32_t)j, 2, KILN_BF16);
		wgrad_run(&g);
		ck_assert_msg(!memcmp(lowp, g.dw, (size_t)g.ndw * sizeof(float)) &&
				      !memcmp(lowp + g.ndw, g.db, (size_t)s->O * sizeof(float)),
			      "shape %d: bf16 with the f32 kernel, other bytes than the f32 op's", which[i]);
		wgrad_close(&g);
		free(lowp);
	}
}
END_TEST

static Suite *make_cpu_convsplit_suite(void)
{
	Suite *s = suite_create("cpu_convsplit");
	check_add_case(s, "blocks", 120, NULL, NULL, (const TTest *[]){
		test_blocks_right, test_blocks_near_whole, test_blocks_bytes_any_team, NULL });
	check_add_case(s, "bf16", 240, NULL, NULL, (const TTest *[]){
		test_bf16_blocks_right, test_bf16_bytes_any_team, test_bf16_blocks_take_kernel, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_convsplit_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
