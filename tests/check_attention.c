/* tests/check_attention.c - the `attention` layer (core/layers/attention.c)
 * in a model: its input gradient against central differences of the loss
 * (causal and full, with and without dropout, a custom scale), and its
 * configuration errors.  The device ops themselves are checked against
 * reference loops and PyTorch in tests/check_device_attention.c.
 *
 * Model: x [B, T, 3C] -> attention -> flatten -> linear(5) -> softmax_xent.
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	void *stream;
	float *x, *metrics;
	int32_t *y;
};

enum { B = 3, T = 9, C3 = 24 }; /* C = 8: 2 heads of 4, or 4 of 2 */

static void rig_open(struct rig *r, const char *ini)
{
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	const int64_t dims[2] = { T, C3 };
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 2, dims);
	ck_assert(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev) == 0);
	ck_assert_msg(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert(kiln_model_init_params(r->m, 5, r->stream) == 0);
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &(struct kiln_plan_opts){ .training = 1, .input_grad = 1 },
					 &r->train) == 0,
		      "%s", kiln_last_error());
	ck_assert_msg(kiln_model_plan(r->m, B, 0, &r->eval) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(r->dev, sizeof(float) * B * T * C3, (void **)&r->x) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * B, (void **)&r->y) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->metrics) == 0);
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->x, r->y, r->metrics };
	test_rig_free_bufs(r->dev, r->stream, bufs, 3);
	kiln_plan_free(r->train);
	kiln_plan_free(r->eval);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* The loss sum of one pass of p on host input x. */
static double loss_of(struct rig *r, struct kiln_plan *p, const float *x)
{
	float m[2] = { 0, 0 };
	TEST_H2D(r, r->x, x, sizeof(float) * B * T * C3);
	TEST_H2D(r, r->metrics, m, sizeof m);
	ck_assert_msg(kiln_plan_run(p, r->x, r->y, r->metrics, r->stream) == 0, "%s",
		      kiln_last_error());
	TEST_D2H(r, m, r->metrics, sizeof m);
	return m[0];
}

/* d(mean loss)/dx of the training plan against central differences of the
 * loss of `fd_plan` (the evaluation plan, or the training plan itself when
 * dropout is on: its mask stays while the step counter does). */
static void fd_case(const char *keys, int fd_on_train)
{
	char ini[512];
	snprintf(ini, sizeof ini,
		 "[layer.att]\ntype = attention\n%s"
		 "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 5\n"
		 "[layer.loss]\ntype = softmax_xent\n",
		 keys);
	struct rig r;
	rig_open(&r, ini);
	static float x[B * T * C3];
	const int32_t y[B] = { 1, 4, 0 };
	for (int i = 0; i < B * T * C3; i++)
		x[i] = (float)sin(0.37 * i + 0.2) * 1.5f;
	TEST_H2D(&r, r.y, y, sizeof y);
	loss_of(&r, r.train, x);
	void *dxp;
	struct kiln_tensor_desc d;
	ck_assert_msg(kiln_plan_tensor(r.train, NULL, "dx", &dxp, &d) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_tensor_numel(&d), B * T * C3);
	static float g[B * T * C3];
	TEST_D2H(&r, g, dxp, sizeof g);
	struct kiln_plan *p = fd_on_train ? r.train : r.eval;
	int bad = 0, checked = 0;
	double gmax = 0;
	for (int e = 0; e < B * T * C3; e += 5) {
		const float eps = 2e-3f, orig = x[e];
		x[e] = orig + eps;
		const double lp = loss_of(&r, p, x);
		x[e] = orig - eps;
		const double lm = loss_of(&r, p, x);
		x[e] = orig;
		const double fd = (lp - lm) / (2.0 * eps) / B;
		gmax = fabs(fd) > gmax ? fabs(fd) : gmax;
		checked++;
		if (fabs(fd - g[e]) > 1e-3 + 2e-2 * fabs(fd)) {
			bad++;
			fprintf(stderr, "%s: dx[%d]: analytic %g vs finite difference %g\n", keys, e,
				g[e], fd);
		}
	}
	ck_assert_msg(bad == 0, "%s: %d of %d input gradient elements disagree (stderr lists them)",
		      keys, bad, checked);
	ck_assert_msg(gmax > 1e-2, "%s: gradients too small to test (%g)", keys, gmax);
	rig_close(&r);
}

START_TEST(test_fd_causal) { fd_case("heads = 2\n", 0); }
END_TEST

START_TEST(test_fd_full_scale) { fd_case("heads = 4\ncausal = 0\nscale = 0.7\n", 0); }
END_TEST

START_TEST(test_fd_dropout) { fd_case("heads = 2\ndropout = 0.3\n", 1); }
END_TEST

/* With dropout 0, training and evaluation compute the same loss; with
 * dropout they differ (the mask is applied in training only). */
START_TEST(test_train_eval)
{
	for (int drop = 0; drop < 2; drop++) {
		struct rig r;
		rig_open(&r, drop ? "[layer.att]\ntype = attention\nheads = 2\ndropout = 0.5\n"
				    "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 5\n"
				    "[layer.loss]\ntype = softmax_xent\n"
				  : "[layer.att]\ntype = attention\nheads = 2\n"
				    "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 5\n"
				    "[layer.loss]\ntype = softmax_xent\n");
		static float x[B * T * C3];
		for (int i = 0; i < B * T * C3; i++)
			x[i] = (float)cos(0.21 * i) * 2.0f;
		const int32_t y[B] = { 0, 1, 2 };
		TEST_H2D(&r, r.y, y, sizeof y);
		const double lt = loss_of(&r, r.train, x), le = loss_of(&r, r.eval, x);
		if (drop)
			ck_assert_msg(fabs(lt - le) > 1e-4, "dropout 0.5 changed nothing: %g %g", lt, le);
		else
			ck_assert_msg(fabs(lt - le) <= 1e-6 * fabs(le), "train %g vs eval %g", lt, le);
		rig_close(&r);
	}
}
END_TEST

/* A model that must not build: the message names the layer and the cause. */
START_TEST(test_config_errors)
{
	const int64_t tc[2] = { T, C3 }, flat[1] = { C3 };
	const char *tail = "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 5\n"
			   "[layer.loss]\ntype = softmax_xent\n";
	char ini[512];
	snprintf(ini, sizeof ini, "[layer.att]\ntype = attention\nheads = 3\n%s", tail);
	test_model_refused(reg, "cpu", ini, KILN_F32, 2, tc, "layer 'att' (attention): the input's last dimension 24 is not divisible by 3 * heads = 9");
	snprintf(ini, sizeof ini, "[layer.att]\ntype = attention\n%s", tail);
	test_model_refused(reg, "cpu", ini, KILN_F32, 2, tc, "needs 'heads'");
	snprintf(ini, sizeof ini, "[layer.att]\ntype = attention\nheads = 2\n%s", tail);
	test_model_refused(reg, "cpu", ini, KILN_F32, 1, flat, "layer 'att' (attention) needs [B, T, 3C] input");
	snprintf(ini, sizeof ini, "[layer.att]\ntype = attention\nheads = 2\ndropout = 1\n%s", tail);
	test_model_refused(reg, "cpu", ini, KILN_F32, 2, tc, "dropout");
}
END_TEST

static Suite *make_attention_suite(void)
{
	Suite *s = suite_create("attention");
	check_add_case(s, "layer", 120, NULL, NULL, (const TTest *[]){
		test_fd_causal, test_fd_full_scale, test_fd_dropout, test_train_eval,
		test_config_errors, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_attention_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
