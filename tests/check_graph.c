/* tests/check_graph.c - captured training steps (device ops version 3;
 * [plugin.cuda] graph = 1 on a GPU) tested on the CPU device, whose
 * [plugin.cpu] graph = 1 records the captured tasks and issues them again
 * with CUDA stream capture's rules enforced (plugins/cpu/graph.c).
 *
 *  - the rules: a host sync, an allocation, a wait on an outside event, an
 *    unjoined stream each fail the capture; a stream that joins through an
 *    event and rejoins is replayed in order; a replay reads the captured
 *    pointers' current contents;
 *  - the trainer: a run whose steps are replays of a captured step gives
 *    bit-identical losses, accuracy and loss scale to a run that issues
 *    every step, with everything that varies per step in play (shuffled
 *    batches through the loader's rotating ring, a warmup + cosine lr,
 *    AdamW's step count, dropout's RNG counter, batchnorm's running
 *    statistics, clipping, fp16 dynamic loss scaling), in the synchronous
 *    and the asynchronous CPU device; a run that captured anything a step
 *    changes on the host would drift from the plain one.
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <kiln/plugin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

/* ---- the device's capture rules ------------------------------------------ */

struct dev {
	struct kiln_config *cfg;
	struct kiln_device *d;
	void *a, *b;          /* streams: compute, comm */
	void *ev1, *ev2;
	void *fill, *add;     /* FILL 1.0 over n, out = in0 + in1 over n */
	float *x, *y;         /* device f32[n] */
	int64_t n;
};

static void dev_open(struct dev *v, int async)
{
	char ini[256];
	struct kiln_op op;
	memset(v, 0, sizeof *v);
	snprintf(ini, sizeof ini, "[run]\ndevice = cpu\nthreads = 1\n[plugin.cpu]\ngraph = 1\nasync = %d\n",
		 async);
	v->cfg = test_config(reg, ini);
	ck_assert_msg(kiln_device_open(reg, v->cfg, "cpu", 0, &v->d) == KILN_OK, "%s",
		      kiln_last_error());
	v->n = 1000;
	ck_assert(kiln_device_stream_create(v->d, &v->a) == KILN_OK);
	ck_assert(kiln_device_stream_create(v->d, &v->b) == KILN_OK);
	ck_assert(kiln_device_event_create(v->d, &v->ev1) == KILN_OK);
	ck_assert(kiln_device_event_create(v->d, &v->ev2) == KILN_OK);
	ck_assert(kiln_device_alloc(v->d, (size_t)v->n * 4, (void **)&v->x) == KILN_OK);
	ck_assert(kiln_device_alloc(v->d, (size_t)v->n * 4, (void **)&v->y) == KILN_OK);
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &v->n);
	op.f[0] = 1.0;
	ck_assert(kiln_device_prepare(v->d, &op, &v->fill, NULL) == KILN_OK);
	op.type = KILN_OP_ADD;
	op.n_in = 2;
	op.in[0] = op.in[1] = op.out[0];
	ck_assert(kiln_device_prepare(v->d, &op, &v->add, NULL) == KILN_OK);
}

static void dev_close(struct dev *v)
{
	kiln_device_stream_sync(v->d, v->a);
	kiln_device_stream_sync(v->d, v->b);
	kiln_device_plan_free(v->d, v->fill);
	kiln_device_plan_free(v->d, v->add);
	kiln_device_free(v->d, v->x);
	kiln_device_free(v->d, v->y);
	kiln_device_event_destroy(v->d, v->ev1);
	kiln_device_event_destroy(v->d, v->ev2);
	kiln_device_stream_destroy(v->d, v->a);
	kiln_device_stream_destroy(v->d, v->b);
	kiln_device_close(v->d);
	kiln_config_free(v->cfg);
}

/* y += x on stream s */
static kiln_status add_xy(struct dev *v, void *s)
{
	struct kiln_op_args a = { .in = { v->y, v->x }, .out = { v->y } };
	return kiln_device_run(v->d, v->add, &a, s);
}

/* The capture fails with a message containing `want`, and so does its end. */
static void expect_refused(struct dev *v, kiln_status st, const char *want)
{
	void *g = (void *)1;
	ck_assert_msg(st != KILN_OK, "expected a refusal mentioning '%s'", want);
	ck_assert_msg(strstr(kiln_last_error(), want), "'%s' not in: %s", want, kiln_last_error());
	ck_assert(kiln_device_capture_end(v->d, v->a, &g) != KILN_OK);
	ck_assert(g == NULL);
}

static void rules(int async)
{
	struct dev v;
	void *g = NULL;
	dev_open(&v, async);
	struct kiln_op_args fx = { .out = { v.x } }, fy = { .out = { v.y } };
	ck_assert(kiln_device_run(v.d, v.fill, &fx, v.a) == KILN_OK);
	ck_assert(kiln_device_run(v.d, v.fill, &fy, v.a) == KILN_OK);
	ck_assert(kiln_device_stream_sync(v.d, v.a) == KILN_OK);

	/* a host sync of the capturing stream */
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	ck_assert(add_xy(&v, v.a) == KILN_OK);
	expect_refused(&v, kiln_device_stream_sync(v.d, v.a), "stream_sync");
	/* an allocation */
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	void *p;
	expect_refused(&v, kiln_device_alloc(v.d, 64, &p), "alloc");
	/* waiting on an event recorded before the capture */
	ck_assert(kiln_device_event_record(v.d, v.ev1, v.b) == KILN_OK);
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	expect_refused(&v, kiln_device_stream_wait(v.d, v.a, v.ev1), "outside the capture");
	/* a host wait on an event recorded in the capture */
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	ck_assert(kiln_device_event_record(v.d, v.ev2, v.a) == KILN_OK);
	expect_refused(&v, kiln_device_event_sync(v.d, v.ev2), "event_sync");
	ck_assert(kiln_device_event_record(v.d, v.ev2, v.a) == KILN_OK); /* a real one */
	/* a stream that joined and was not joined back */
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	ck_assert(kiln_device_event_record(v.d, v.ev1, v.a) == KILN_OK);
	ck_assert(kiln_device_stream_wait(v.d, v.b, v.ev1) == KILN_OK);
	ck_assert(add_xy(&v, v.b) == KILN_OK);
	ck_assert(kiln_device_capture_end(v.d, v.a, &g) != KILN_OK);
	ck_assert_msg(strstr(kiln_last_error(), "joined back"), "%s", kiln_last_error());
	ck_assert(g == NULL);
	/* nothing of the failed captures ran: y is still 1 */
	ck_assert(kiln_device_stream_sync(v.d, v.a) == KILN_OK);
	ck_assert(kiln_device_stream_sync(v.d, v.b) == KILN_OK);
	for (int64_t i = 0; i < v.n; i++)
		ck_assert_float_eq(v.y[i], 1.0f);

	/* fork and join: a: y += x; b waits, y += x; a waits for b, y += x;
	 * three adds a replay, in this order (each reads the last one's y) */
	ck_assert(kiln_device_capture_begin(v.d, v.a) == KILN_OK);
	ck_assert(add_xy(&v, v.a) == KILN_OK);
	ck_assert(kiln_device_event_record(v.d, v.ev1, v.a) == KILN_OK);
	ck_assert(kiln_device_stream_wait(v.d, v.b, v.ev1) == KILN_OK);
	ck_assert(add_xy(&v, v.b) == KILN_OK);
	ck_assert(kiln_device_event_record(v.d, v.ev2, v.b) == KILN_OK);
	ck_assert(kiln_device_stream_wait(v.d, v.a, v.ev2) == KILN_OK);
	ck_assert(add_xy(&v, v.a) == KILN_OK);
	ck_assert_msg(kiln_device_capture_end(v.d, v.a, &g) == KILN_OK, "%s", kiln_last_error());
	ck_assert(g != NULL);
	ck_assert(kiln_device_stream_sync(v.d, v.a) == KILN_OK);
	for (int64_t i = 0; i < v.n; i++)
		ck_assert_float_eq(v.y[i], 1.0f); /* captured, not run */
	/* after the capture, until a launch records it for real */
	ck_assert(kiln_device_stream_wait(v.d, v.a, v.ev2) != KILN_OK);
	for (int r = 1; r <= 4; r++) {
		ck_assert_msg(kiln_device_graph_launch(v.d, g, v.a) == KILN_OK, "%s",
			      kiln_last_error());
		ck_assert(kiln_device_stream_sync(v.d, v.a) == KILN_OK);
		for (int64_t i = 0; i < v.n; i += 97)
			ck_assert_float_eq(v.y[i], 1.0f + 3.0f * (float)r);
	}
	/* the launch recorded ev2 for real: waits are fine again */
	ck_assert(kiln_device_event_sync(v.d, v.ev2) == KILN_OK);
	/* the pointers are the captured ones, their contents the current:
	 * x = 2 now gives y += 6 per replay */
	{
		struct kiln_op_args a2 = { .in = { v.x, v.x }, .out = { v.x } };
		ck_assert(kiln_device_run(v.d, v.add, &a2, v.a) == KILN_OK);
		ck_assert(kiln_device_graph_launch(v.d, g, v.a) == KILN_OK);
		ck_assert(kiln_device_stream_sync(v.d, v.a) == KILN_OK);
		ck_assert_float_eq(v.y[0], 13.0f + 6.0f);
	}
	kiln_device_graph_free(v.d, g);
	dev_close(&v);
}

START_TEST(test_rules_sync) { rules(0); }
END_TEST
START_TEST(test_rules_async) { rules(1); }
END_TEST

/* graph = 0: the device declines (KILN_ENOTSUP), the trainer issues steps */
START_TEST(test_declined)
{
	struct kiln_config *cfg = test_config(reg, "[run]\ndevice = cpu\n");
	struct kiln_device *d;
	void *s;
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &d) == KILN_OK);
	ck_assert(kiln_device_stream_create(d, &s) == KILN_OK);
	ck_assert_int_eq(kiln_device_capture_begin(d, s), KILN_ENOTSUP);
	ck_assert(strstr(kiln_last_error(), "graph = 0"));
	kiln_device_stream_destroy(d, s);
	kiln_device_close(d);
	kiln_config_free(cfg);
}
END_TEST

/* ---- the trainer ------------------------------------------------------------ */

/* A small CNN with every per-step value in play: dropout (RNG counter),
 * batchnorm (running statistics), AdamW (step count), warmup + cosine
 * (lr), clip_norm (gate), fp16 dynamic loss scaling (scale, skips). */
static const char *cnn_ini =
	"[run]\ndevice = cpu\nseed = 5\nthreads = 1\nprecision = %s\nout_dir =\n"
	"[data]\nsource = idx\nlimit = 640\nmean = 0.286\nstd = 0.353\nworkers = %d\nprefetch = 2\n"
	"[data.eval]\nlimit = 640\n"
	"[layer.conv1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
	"[layer.bn1]\ntype = batchnorm\n[layer.r1]\ntype = relu\n"
	"[layer.pool1]\ntype = maxpool\nkernel = 2\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 32\n[layer.r2]\ntype = relu\n"
	"[layer.drop]\ntype = dropout\np = 0.3\n"
	"[layer.fc2]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = 2\nbatch = 32\nlr = 0.01\noptimizer = adamw\nweight_decay = 0.01\n"
	"schedule = cosine\nwarmup = 5\nclip_norm = 0.5\nlog_every = 7\neval_batch = 200\n"
	"accumulate = %d\n"
	"[plugin.cpu]\ngraph = %d\nasync = %d\n";

static void train(const char *prec, int workers, int acc, int graph, int async,
		  struct kiln_train_result *res)
{
	char ini[4096];
	snprintf(ini, sizeof ini, cnn_ini, prec, workers, acc, graph, async);
	struct kiln_config *cfg = test_config(reg, ini);
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, res) == 0, "%s", kiln_last_error());
	kiln_config_free(cfg);
}

static void same_bits(const char *prec)
{
	struct kiln_train_result plain = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result g_sync = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result g_async = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	train(prec, 2, 1, 0, 0, &plain);
	train(prec, 2, 1, 1, 0, &g_sync);
	train(prec, 2, 1, 1, 1, &g_async);
	const int64_t steps = 2 * (640 / 32);
	ck_assert_int_eq(plain.steps, steps);
	ck_assert_int_eq(plain.steps_replayed, 0);
	ck_assert_int_eq(plain.graphs_captured, 0);
	const struct kiln_train_result *g[2] = { &g_sync, &g_async };
	for (int i = 0; i < 2; i++) {
		const char *mode = i ? "async" : "sync";
		ck_assert_int_eq(g[i]->steps, steps);
		/* every step after the warm-up one is a launch of a graph;
		 * one graph per input slot of the loader's ring */
		ck_assert_int_eq(g[i]->steps_replayed, steps - 1);
		ck_assert_int_eq(g[i]->graphs_captured, 2);
		ck_assert_uint_eq(g[i]->steady.replays, (uint64_t)(steps - 1));
		/* bit-identical to issuing every step */
		ck_assert_msg(g[i]->train_loss == plain.train_loss, "%s %s: train loss %.9g vs %.9g",
			      prec, mode, g[i]->train_loss, plain.train_loss);
		ck_assert_msg(g[i]->test_loss == plain.test_loss, "%s %s: test loss %.9g vs %.9g",
			      prec, mode, g[i]->test_loss, plain.test_loss);
		ck_assert(g[i]->test_acc == plain.test_acc);
		ck_assert(g[i]->loss_scale == plain.loss_scale);
		ck_assert_int_eq(g[i]->steps_clipped, plain.steps_clipped);
		ck_assert_int_eq(g[i]->steps_skipped, plain.steps_skipped);
		/* the step's ops were issued once (the capture), not per step,
		 * and nothing synchronised or allocated between log points */
		ck_assert_msg(g[i]->steady.runs * 4 < plain.steady.runs, "%s: %llu runs vs %llu",
			      mode, (unsigned long long)g[i]->steady.runs,
			      (unsigned long long)plain.steady.runs);
		ck_assert_uint_eq(g[i]->steady.allocs, 0);
		ck_assert_uint_eq(g[i]->steady.host_syncs, 0);
	}
	/* the run learnt something (the comparison is not of two no-ops) */
	ck_assert_msg(plain.test_acc > 0.3, "test accuracy %.3f", plain.test_acc);
	ck_assert_int_gt(plain.steps_clipped, 0);
}

START_TEST(test_same_bits_fp32) { same_bits("fp32"); }
END_TEST
START_TEST(test_same_bits_fp16) { same_bits("fp16"); }
END_TEST

/* accumulate > 1: the step is not captured (each micro-batch loads between
 * micro-steps); the run says so and issues every step, same numbers. */
START_TEST(test_accumulate_issued)
{
	struct kiln_train_result plain = KILN_TRAIN_RESULT_INIT, g = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	train("fp32", 0, 2, 0, 0, &plain);
	train("fp32", 0, 2, 1, 0, &g);
	ck_assert_int_eq(g.steps_replayed, 0);
	ck_assert_int_eq(g.graphs_captured, 0);
	ck_assert(g.train_loss == plain.train_loss);
}
END_TEST

static Suite *make_graph_suite(void)
{
	Suite *s = suite_create("graph");
	check_add_case(s, "rules", 0, NULL, NULL, (const TTest *[]){
		test_rules_sync, test_rules_async, test_declined, NULL });
	check_add_case(s, "trainer", 300, NULL, NULL, (const TTest *[]){
		test_same_bits_fp32, test_same_bits_fp16, test_accumulate_issued, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_graph_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
