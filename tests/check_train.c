/* tests/check_train.c - the graph, layers, planner and trainer:
 * finite-difference gradients of linear/relu/softmax_xent, the first three
 * SGD steps against a PyTorch dump, a small MLP reaching 82% on Fashion-MNIST,
 * and a steady-state step that allocates nothing and never syncs. */
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <jansson.h>
#include <kiln/kiln.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h> /* usleep */

static struct kiln_registry *reg;

/* ---- a tiny harness around one model ----------------------------------- */

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	void *stream;
	float *x, *metrics, *lr;
	int32_t *y;
	int64_t B, in;
};

/* A model for samples of shape dims[0..nd) (no batch dimension). */
static void rig_open_shape(struct rig *r, const char *ini, int64_t B, int nd, const int64_t *dims)
{
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	r->B = B;
	r->in = 1;
	for (int i = 0; i < nd; i++)
		r->in *= dims[i];
	int64_t in = r->in;
	ck_assert_msg(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev) == 0, "%s", kiln_last_error());
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, nd, dims);
	ck_assert_msg(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert(kiln_model_init_params(r->m, 7, r->stream) == 0);
	ck_assert_msg(kiln_model_optim_prepare(r->m, r->stream) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_model_plan(r->m, B, 1, &r->train) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_model_plan(r->m, B, 0, &r->eval) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(r->dev, sizeof(float) * (size_t)(B * in), (void **)&r->x) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * (size_t)B, (void **)&r->y) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->metrics) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->lr) == 0);
}

static void rig_open(struct rig *r, const char *ini, int64_t B, int64_t in)
{
	rig_open_shape(r, ini, B, 1, &in);
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->x, r->y, r->metrics, r->lr };
	test_rig_free_bufs(r->dev, r->stream, bufs, 4);
	kiln_plan_free(r->train);
	kiln_plan_free(r->eval);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* Run one pass; return the metrics (loss sum, correct). */
static void pass(struct rig *r, struct kiln_plan *p, float out[2])
{
	float zero[2] = { 0, 0 };
	TEST_H2D(r, r->metrics, zero, sizeof zero);
	ck_assert_msg(kiln_plan_run(p, r->x, r->y, r->metrics, r->stream) == 0, "%s",
		      kiln_last_error());
	TEST_D2H(r, out, r->metrics, 2 * sizeof(float));
}

/* ---- finite differences ------------------------------------------------ */

static const char *fd_ini = "[layer.fc1]\ntype = linear\nout = 6\n"
			    "[layer.act]\ntype = relu\n"
			    "[layer.fc2]\ntype = linear\nout = 4\n"
			    "[layer.loss]\ntype = softmax_xent\n";

static void fd_check(const char *device_async)
{
	char ini[1024];
	snprintf(ini, sizeof ini, "%s[plugin.cpu]\nasync = %s\n", fd_ini, device_async);
	struct rig r;
	const int64_t B = 5, IN = 7;
	rig_open(&r, ini, B, IN);
	float x[5 * 7];
	int32_t y[5] = { 0, 3, 1, 2, 3 };
	for (int i = 0; i < B * IN; i++)
		x[i] = (float)sin(1.7 * i + 0.3) * 1.5f;
	TEST_H2D(&r, r.x, x, sizeof x);
	TEST_H2D(&r, r.y, y, sizeof y);

	/* analytic gradients of the mean loss */
	float m[2];
	pass(&r, r.train, m);
	int checked = 0;
	for (int pi = 0; pi < kiln_model_param_count(r.m); pi++) {
		struct kiln_param_info info;
		kiln_model_param_get(r.m, pi, &info);
		int64_t n = kiln_tensor_numel(&info.desc);
		float *w = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
		TEST_D2H(&r, w, info.param, sizeof(float) * (size_t)n);
		TEST_D2H(&r, g, info.grad, sizeof(float) * (size_t)n);
		for (int64_t e = 0; e < n; e++) {
			const float eps = 1e-3f;
			float lp[2], lm[2], orig = w[e], v;
			v = orig + eps;
			TEST_H2D(&r, info.param + e, &v, sizeof v);
			pass(&r, r.eval, lp);
			v = orig - eps;
			TEST_H2D(&r, info.param + e, &v, sizeof v);
			pass(&r, r.eval, lm);
			TEST_H2D(&r, info.param + e, &orig, sizeof orig);
			double fd = ((double)lp[0] - (double)lm[0]) / (2.0 * eps) / (double)B;
			ck_assert_msg(fabs(fd - g[e]) <= 1e-3 + 1e-2 * fabs(fd),
				      "%s[%lld]: analytic %g vs finite difference %g", info.name,
				      (long long)e, g[e], fd);
			checked++;
		}
		free(w);
		free(g);
	}
	ck_assert_int_eq(checked, 6 * 7 + 6 + 4 * 6 + 4);
	rig_close(&r);
}

/* Every CNN layer type in one small graph, checked against central
 * differences of the training-mode loss (batchnorm normalises with batch
 * statistics, dropout's mask is fixed while the step counter stays). */
static const char *fd_cnn_ini =
	"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\nbias = 1\n"
	"[layer.bn]\ntype = batchnorm\n"
	"[layer.a1]\ntype = leaky_relu\nnegative_slope = 0.1\n"
	"[layer.c2]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\ngroups = 2\nbias = 1\n"
	"[layer.a2]\ntype = tanh\n"
	"[layer.sum]\ntype = add\ninputs = a2, a1\n"
	"[layer.g]\ntype = gelu\ninput = a1\n"
	"[layer.cat]\ntype = concat\ninputs = sum, g\n"
	"[layer.mp]\ntype = maxpool\nkernel = 2\n"
	"[layer.c3]\ntype = conv\nout = 3\nkernel = 2\nstride = 1\ndilation = 1\n"
	"[layer.s]\ntype = sigmoid\n"
	"[layer.ap]\ntype = avgpool\nkernel = 2\nstride = 1\n"
	"[layer.drop]\ntype = dropout\np = 0.3\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 5\n"
	"[layer.loss]\ntype = softmax_xent\n";

/* A rig of fd_cnn_ini (or a variant) for a batch of 3 samples of 2x6x6,
 * with fixed inputs and labels already on the device. */
static void fd_cnn_open(struct rig *r, const char *ini)
{
	const int64_t B = 3, dims[3] = { 2, 6, 6 }, n = B * 2 * 6 * 6;
	rig_open_shape(r, ini, B, 3, dims);
	float x[3 * 2 * 6 * 6];
	int32_t y[3] = { 4, 0, 2 };
	for (int i = 0; i < n; i++)
		x[i] = (float)sin(0.77 * i + 0.1);
	TEST_H2D(r, r->x, x, sizeof x);
	TEST_H2D(r, r->y, y, sizeof y);
}

static void fd_cnn(const char *layout)
{
	char ini[4096];
	snprintf(ini, sizeof ini, "%s[model]\nlayout = %s\n", fd_cnn_ini, layout);
	struct rig r;
	const int64_t B = 3;
	fd_cnn_open(&r, ini);
	float m[2];
	pass(&r, r.train, m);
	int checked = 0, bad = 0;
	for (int pi = 0; pi < kiln_model_param_count(r.m); pi++) {
		struct kiln_param_info info;
		kiln_model_param_get(r.m, pi, &info);
		if (!info.grad)
			continue;
		int64_t ne = kiln_tensor_numel(&info.desc);
		float *g = malloc(sizeof(float) * (size_t)ne);
		TEST_D2H(&r, g, info.grad, sizeof(float) * (size_t)ne);
		/* every element of small tensors, a stride of the big ones */
		for (int64_t e = 0; e < ne; e += ne > 40 ? 7 : 1) {
			const float eps = 2e-3f;
			float w, v, lp[2], lm[2];
			TEST_D2H(&r, &w, info.param + e, sizeof w);
			v = w + eps;
			TEST_H2D(&r, info.param + e, &v, sizeof v);
			pass(&r, r.train, lp);
			v = w - eps;
			TEST_H2D(&r, info.param + e, &v, sizeof v);
			pass(&r, r.train, lm);
			TEST_H2D(&r, info.param + e, &w, sizeof w);
			double fd = ((double)lp[0] - (double)lm[0]) / (2.0 * eps) / (double)B;
			checked++;
			if (fabs(fd - g[e]) > 2e-3 + 3e-2 * fabs(fd)) {
				bad++;
				fprintf(stderr, "%s %s[%lld]: analytic %g vs finite difference %g\n", layout,
					info.name, (long long)e, g[e], fd);
			}
		}
		free(g);
	}
	/* a kink of relu-like or max pooling can sit within eps of a point:
	 * allow one stray element, no more */
	ck_assert_msg(bad <= 1, "%s: %d of %d gradient elements disagree (stderr lists them)", layout,
		      bad, checked);
	ck_assert_int_gt(checked, 60);
	rig_close(&r);
}

START_TEST(test_fd_cnn_nchw) { fd_cnn("nchw"); }
END_TEST

START_TEST(test_fd_cnn_nhwc) { fd_cnn("nhwc"); }
END_TEST

/* A convolution whose only consumer is a batchnorm gets no bias unless the
 * config asks for one; with a second consumer it keeps it. */
START_TEST(test_conv_bias_rule)
{
	static const struct { const char *ini; int params; } cases[] = {
		{ "[layer.c]\ntype = conv\nout = 2\nkernel = 3\n[layer.bn]\ntype = batchnorm\n"
		  "[layer.f]\ntype = flatten\n[layer.loss]\ntype = softmax_xent\n", 5 },
		{ "[layer.c]\ntype = conv\nout = 2\nkernel = 3\nbias = 1\n[layer.bn]\ntype = batchnorm\n"
		  "[layer.f]\ntype = flatten\n[layer.loss]\ntype = softmax_xent\n", 6 },
		{ "[layer.c]\ntype = conv\nout = 2\nkernel = 3\n[layer.r]\ntype = relu\n"
		  "[layer.f]\ntype = flatten\n[layer.loss]\ntype = softmax_xent\n", 2 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct rig r;
		const int64_t dims[3] = { 1, 5, 5 };
		rig_open_shape(&r, cases[i].ini, 2, 3, dims);
		struct kiln_param_info p;
		ck_assert_int_eq(kiln_model_param_count(r.m), cases[i].params);
		ck_assert_int_eq(kiln_model_param_find(r.m, "c.bias", &p) == KILN_OK, cases[i].params != 5);
		rig_close(&r);
	}
}
END_TEST

START_TEST(test_fd_sync) { fd_check("0"); }
END_TEST

START_TEST(test_fd_async) { fd_check("1"); }
END_TEST

/* ---- PyTorch reference ------------------------------------------------- */

struct st_file {
	char *buf;
	size_t len, data;
	json_t *hdr;
};

static void st_open(struct st_file *f, const char *path)
{
	FILE *fp = fopen(path, "rb");
	ck_assert_msg(fp != NULL, "cannot open %s", path);
	fseek(fp, 0, SEEK_END);
	f->len = (size_t)ftell(fp);
	fseek(fp, 0, SEEK_SET);
	f->buf = malloc(f->len);
	ck_assert(fread(f->buf, 1, f->len, fp) == f->len);
	fclose(fp);
	uint64_t n;
	memcpy(&n, f->buf, 8);
	json_error_t err;
	f->hdr = json_loadb(f->buf + 8, (size_t)n, 0, &err);
	ck_assert_msg(f->hdr != NULL, "bad safetensors header: %s", err.text);
	f->data = 8 + (size_t)n;
}

/* Pointer to tensor `name` and its element count. */
static const void *st_get(struct st_file *f, const char *name, int64_t *numel)
{
	json_t *t = json_object_get(f->hdr, name);
	ck_assert_msg(t != NULL, "reference has no tensor %s", name);
	json_t *off = json_object_get(t, "data_offsets");
	size_t b = (size_t)json_integer_value(json_array_get(off, 0));
	size_t e = (size_t)json_integer_value(json_array_get(off, 1));
	*numel = (int64_t)((e - b) / 4);
	return f->buf + f->data + b;
}

static double max_rel(const float *a, const float *ref, int64_t n)
{
	double scale = 0, err = 0;
	for (int64_t i = 0; i < n; i++)
		if (fabs(ref[i]) > scale)
			scale = fabs(ref[i]);
	for (int64_t i = 0; i < n; i++)
		if (fabs((double)a[i] - ref[i]) > err)
			err = fabs((double)a[i] - ref[i]);
	return scale > 0 ? err / scale : err;
}

START_TEST(test_pytorch_mlp)
{
	static const char *names[] = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" };
	char path[4096];
	const char *srcdir = getenv("srcdir");
	snprintf(path, sizeof path, "%s/tests/data/mlp_ref.safetensors", srcdir ? srcdir : ".");
	struct st_file f;
	st_open(&f, path);
	struct rig r;
	rig_open(&r,
		 "[layer.fc1]\ntype = linear\nout = 32\n[layer.relu]\ntype = relu\n"
		 "[layer.fc2]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
		 "[train]\nmomentum = 0.9\nweight_decay = 0.0001\n[plugin.cpu]\nasync = 1\n",
		 8, 784);
	int64_t n;
	for (int i = 0; i < 4; i++) {
		char key[64];
		struct kiln_param_info info;
		snprintf(key, sizeof key, "init.%s", names[i]);
		const float *src = st_get(&f, key, &n);
		ck_assert(kiln_model_param_find(r.m, names[i], &info) == 0);
		ck_assert_int_eq(n, kiln_tensor_numel(&info.desc));
		TEST_H2D(&r, info.param, src, sizeof(float) * (size_t)n);
	}
	float lr = 0.1f;
	TEST_H2D(&r, r.lr, &lr, sizeof lr);
	for (int k = 0; k < 3; k++) {
		char key[64];
		snprintf(key, sizeof key, "x%d", k);
		const float *x = st_get(&f, key, &n);
		ck_assert_int_eq(n, 8 * 784);
		TEST_H2D(&r, r.x, x, sizeof(float) * (size_t)n);
		snprintf(key, sizeof key, "y%d", k);
		TEST_H2D(&r, r.y, st_get(&f, key, &n), 8 * sizeof(int32_t));
		float m[2];
		pass(&r, r.train, m);
		snprintf(key, sizeof key, "loss%d", k);
		float ref_loss = *(const float *)st_get(&f, key, &n);
		ck_assert_msg(fabs(m[0] / 8 - ref_loss) <= 1e-4 * fabs(ref_loss),
			      "step %d loss %g vs PyTorch %g", k, m[0] / 8, ref_loss);
		snprintf(key, sizeof key, "correct%d", k);
		ck_assert_float_eq(m[1], *(const float *)st_get(&f, key, &n));
		for (int i = 0; i < 4; i++) {
			struct kiln_param_info info;
			kiln_model_param_find(r.m, names[i], &info);
			snprintf(key, sizeof key, "grad%d.%s", k, names[i]);
			const float *ref = st_get(&f, key, &n);
			float *g = malloc(sizeof(float) * (size_t)n);
			TEST_D2H(&r, g, info.grad, sizeof(float) * (size_t)n);
			double e = max_rel(g, ref, n);
			ck_assert_msg(e <= 1e-4, "step %d grad %s: relative error %g", k, names[i], e);
			free(g);
		}
		ck_assert(kiln_model_optim_step(r.m, r.lr, r.stream) == 0);
	}
	for (int i = 0; i < 4; i++) {
		char key[64];
		struct kiln_param_info info;
		kiln_model_param_find(r.m, names[i], &info);
		snprintf(key, sizeof key, "final.%s", names[i]);
		const float *ref = st_get(&f, key, &n);
		float *w = malloc(sizeof(float) * (size_t)n);
		TEST_D2H(&r, w, info.param, sizeof(float) * (size_t)n);
		double e = max_rel(w, ref, n);
		ck_assert_msg(e <= 1e-4, "weights %s after 3 steps: relative error %g", names[i], e);
		free(w);
	}
	rig_close(&r);
	json_decref(f.hdr);
	free(f.buf);
}
END_TEST

/* ---- planner ------------------------------------------------------------ */

START_TEST(test_arena_packing)
{
	struct rig r;
	rig_open(&r,
		 "[layer.fc1]\ntype = linear\nout = 64\n[layer.r1]\ntype = relu\n"
		 "[layer.fc2]\ntype = linear\nout = 64\n[layer.r2]\ntype = relu\n"
		 "[layer.fc3]\ntype = linear\nout = 64\n[layer.r3]\ntype = relu\n"
		 "[layer.fc4]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n",
		 16, 32);
	/* eval keeps nothing past its consumer, and relu runs in place: two
	 * [16, 64] slots in turn, whatever the depth */
	ck_assert_uint_le(kiln_plan_arena_bytes(r.eval), 2 * 16 * 64 * 4);
	ck_assert_uint_lt(kiln_plan_arena_bytes(r.eval), kiln_plan_naive_bytes(r.eval));
	ck_assert_uint_le(kiln_plan_arena_bytes(r.train), kiln_plan_naive_bytes(r.train));
	ck_assert_uint_lt(kiln_plan_arena_bytes(r.train), kiln_plan_naive_bytes(r.train));
	rig_close(&r);
}
END_TEST

START_TEST(test_frozen_layer)
{
	struct rig r;
	rig_open(&r,
		 "[layer.fc1]\ntype = linear\nout = 6\ntrainable = 0\n[layer.r]\ntype = relu\n"
		 "[layer.fc2]\ntype = linear\nout = 3\n[layer.loss]\ntype = softmax_xent\n",
		 4, 5);
	struct kiln_param_info a, b;
	ck_assert(kiln_model_param_find(r.m, "fc1.weight", &a) == 0);
	ck_assert(kiln_model_param_find(r.m, "fc2.weight", &b) == 0);
	ck_assert_ptr_null(a.grad);
	ck_assert_ptr_nonnull(b.grad);
	/* trainable parameters come first in the flat buffer */
	ck_assert((char *)b.param < (char *)a.param);
	float before[30], after[30], m[2], lr = 0.5f;
	TEST_D2H(&r, before, a.param, sizeof before);
	TEST_H2D(&r, r.lr, &lr, sizeof lr);
	float x[20] = { 0 };
	int32_t y[4] = { 0, 1, 2, 0 };
	for (int i = 0; i < 20; i++)
		x[i] = (float)i / 10;
	TEST_H2D(&r, r.x, x, sizeof x);
	TEST_H2D(&r, r.y, y, sizeof y);
	pass(&r, r.train, m);
	ck_assert(kiln_model_optim_step(r.m, r.lr, r.stream) == 0);
	TEST_D2H(&r, after, a.param, sizeof after);
	ck_assert_mem_eq(before, after, sizeof before);
	rig_close(&r);
}
END_TEST

/* Building the model of `ini` for samples of `in` features fails with
 * KILN_ECONFIG, a message holding `want` and naming file:line. */
static void graph_error(const char *ini, int64_t in, const char *want)
{
	struct kiln_config *cfg = test_config(reg, ini);
	struct kiln_device *dev;
	struct kiln_model *m = NULL;
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0);
	ck_assert_int_eq(kiln_model_create(cfg, reg, dev, &sample, &m), KILN_ECONFIG);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(kiln_last_error(), want) != NULL, "want '%s': %s", want,
		      kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), "test.ini:") != NULL, "no file:line in: %s",
		      kiln_last_error());
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

START_TEST(test_graph_errors)
{
	static const struct { const char *ini, *want; } cases[] = {
		{ "[layer.a]\ntype = linear\nout = 3\n", "no loss layer" },
		{ "[layer.a]\ntype = linear\nout = 3\ninput = b\n[layer.loss]\ntype = softmax_xent\n",
		  "no layer 'b'" },
		{ "[layer.a]\ntype = linear\n[layer.loss]\ntype = softmax_xent\n", "needs 'out'" },
		{ "[layer.a]\ntype = linear\nout = 3\n[layer.l1]\ntype = softmax_xent\n"
		  "[layer.l2]\ntype = softmax_xent\ninput = a\n", "second loss" },
		{ "[layer.a]\ntype = linear\nout = 3\n[layer.aux]\ntype = linear\nout = 2\n"
		  "[layer.b]\ntype = linear\nout = 4\ninput = a\n[layer.loss]\ntype = softmax_xent\n",
		  "layer 'aux' feeds nothing" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		graph_error(cases[i].ini, 4, cases[i].want);
}
END_TEST

/* ---- end to end --------------------------------------------------------- */

static const char *mlp_ini =
	"[run]\nseed = 3\nout_dir = %s\n"
	"[data]\nsource = idx\nlimit = 2000\nmean = 0.286\nstd = 0.353\n"
	"[data.eval]\nlimit = 2000\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 256\n[layer.r1]\ntype = relu\n"
	"[layer.fc2]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = %d\nbatch = 32\nlr = 0.02\nlog_every = %d\neval_batch = 300\n"
	"[plugin.cpu]\nasync = %d\n";

START_TEST(test_mlp_2000)
{
	char ini[2048], dir[1024];
	TEST_REQUIRE_FASHION();
	ck_assert(test_tmpdir_make(dir, sizeof dir, "train") != NULL);
	snprintf(ini, sizeof ini, mlp_ini, dir, 30, 20, 0);
	struct kiln_config *cfg = test_config(reg, ini);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	/* 2,000 held-out samples: the first 2,000 of the test split */
	ck_assert_int_eq(res.test_samples, 2000);
	ck_assert_msg(res.test_acc >= 0.82, "test accuracy %.4f < 0.82", res.test_acc);
	ck_assert_int_eq(res.steps, 30 * (2000 / 32));
	char path[4200];
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "no %s", path);
	char line[1024];
	int finals = 0;
	while (fgets(line, sizeof line, f))
		finals += strstr(line, "\"final\"") != NULL;
	fclose(f);
	ck_assert_int_eq(finals, 1);
	kiln_config_free(cfg);
}
END_TEST

START_TEST(test_steady_state_async)
{
	char ini[2048];
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 2, 10, 1);
	struct kiln_config *cfg = test_config(reg, ini);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(res.steps, 2 * 62);
	ck_assert_uint_gt(res.steady.runs, 100);
	ck_assert_uint_eq(res.steady.allocs, 0);
	ck_assert_uint_eq(res.steady.host_syncs, 0);
	ck_assert_uint_eq(res.steady.d2h_copies, 0);
	/* identical numbers in sync and async modes */
	struct kiln_config *cfg2;
	snprintf(ini, sizeof ini, mlp_ini, "", 2, 10, 0);
	cfg2 = test_config(reg, ini);
	struct kiln_train_result res2 = KILN_TRAIN_RESULT_INIT;
	ck_assert(kiln_train(cfg2, reg, NULL, NULL, &res2) == 0);
	ck_assert_double_eq(res.test_acc, res2.test_acc);
	ck_assert_double_eq(res.train_loss, res2.train_loss);
	kiln_config_free(cfg);
	kiln_config_free(cfg2);
}
END_TEST

/* Loader workers change nothing but speed: identical results for 0, 1 and
 * 3 workers, and still no host sync inside the steps. */
START_TEST(test_loader_workers)
{
	char ini[2048];
	struct kiln_train_result res[3] = { KILN_TRAIN_RESULT_INIT, KILN_TRAIN_RESULT_INIT,
					    KILN_TRAIN_RESULT_INIT };
	static const char *const w[3] = { "data.workers=0", "data.workers=1", "data.workers=3" };
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 2, 10, 1);
	for (int i = 0; i < 3; i++) {
		struct kiln_config *cfg;
		ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
		ck_assert(kiln_config_override(cfg, w[i]) == KILN_OK);
		ck_assert(kiln_config_override(cfg, "data.prefetch=1") == KILN_OK);
		ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
		ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res[i]) == 0, "%s: %s", w[i],
			      kiln_last_error());
		ck_assert_uint_eq(res[i].steady.host_syncs, 0);
		ck_assert_uint_eq(res[i].steady.allocs, 0);
		kiln_config_free(cfg);
	}
	for (int i = 1; i < 3; i++) {
		ck_assert_msg(res[i].train_loss == res[0].train_loss, "%s: train loss %.9g vs %.9g", w[i],
			      res[i].train_loss, res[0].train_loss);
		ck_assert(res[i].test_acc == res[0].test_acc);
		ck_assert(res[i].test_loss == res[0].test_loss);
	}
}
END_TEST


/* Gradient accumulation: batch 32 x accumulate 4 is batch 128 (no
 * batchnorm, no dropout), to float rounding: the same samples per
 * optimizer step, the same mean gradient, the same schedule. */
START_TEST(test_accumulate)
{
	char ini[2048];
	struct kiln_train_result res[2] = { KILN_TRAIN_RESULT_INIT, KILN_TRAIN_RESULT_INIT };
	static const char *const over[2][2] = { { "train.batch=128", "train.accumulate=1" },
						{ "train.batch=32", "train.accumulate=4" } };
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 2, 5, 0);
	for (int i = 0; i < 2; i++) {
		struct kiln_config *cfg;
		ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
		ck_assert(kiln_config_override(cfg, over[i][0]) == KILN_OK);
		ck_assert(kiln_config_override(cfg, over[i][1]) == KILN_OK);
		ck_assert(kiln_config_override(cfg, "train.weight_decay=0.001") == KILN_OK);
		ck_assert(kiln_config_override(cfg, "train.schedule=cosine") == KILN_OK);
		ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
		ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res[i]) == 0, "%s", kiln_last_error());
		kiln_config_free(cfg);
	}
	ck_assert_int_eq(res[0].steps, res[1].steps);
	ck_assert_int_eq(res[0].steps, 2 * (2000 / 128));
	ck_assert_msg(fabs(res[0].test_loss - res[1].test_loss) <= 1e-5 * res[0].test_loss,
		      "test loss %.9g (batch 128) vs %.9g (32 x 4)", res[0].test_loss,
		      res[1].test_loss);
	ck_assert_msg(fabs(res[0].train_loss - res[1].train_loss) <= 1e-5 * res[0].train_loss,
		      "train loss %.9g vs %.9g", res[0].train_loss, res[1].train_loss);
}
END_TEST


/* A step with non-finite gradients is skipped on the device and counted;
 * a log interval of nothing but skipped steps stops the run as diverged.
 * lr = 1e6 on inputs scaled by 1e10 overflows the logits within a few steps. */
START_TEST(test_skip_nonfinite)
{
	char ini[2048];
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.lr=1e6") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.momentum=0") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "data.std=1e-10") == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_train(cfg, reg, NULL, NULL, &res), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "diverged") && strstr(kiln_last_error(), "skipped"),
		      "%s", kiln_last_error());
	ck_assert_int_ge(res.steps_skipped, 4);
	kiln_config_free(cfg);
	/* without the check the run only notices the loss */
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.lr=1e6") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.skip_nonfinite=0") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "data.std=1e-10") == KILN_OK);
	ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
	ck_assert_int_eq(kiln_train(cfg, reg, NULL, NULL, &res), KILN_EDATA);
	ck_assert_int_eq(res.steps_skipped, 0);
	kiln_config_free(cfg);
}
END_TEST


/* struct kiln_train_result's size (kiln/kiln.h): a caller built against
 * an older, smaller header (here: a struct cut before steps_clipped, 0xA5
 * bytes after it) gets its members and no byte written past them; one of
 * a newer, larger header gets the library's size back and its extra
 * bytes untouched; a size not set (0) is refused, nothing written.
 * Before session 34 the library cleared and filled its own sizeof bytes
 * of whatever the caller passed. */
START_TEST(test_result_size)
{
	char ini[2048];
	const size_t lib = sizeof(struct kiln_train_result);
	const size_t cut = offsetof(struct kiln_train_result, steps_clipped);
	union {
		struct kiln_train_result r;
		unsigned char b[sizeof(struct kiln_train_result) + 64];
	} u;
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	struct kiln_config *cfg = test_config(reg, ini);
	ck_assert_msg(kiln_config_override(cfg, "data.limit=320") == 0, "%s", kiln_last_error());
	/* an older header's struct */
	memset(&u, 0xA5, sizeof u);
	u.r.size = cut;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &u.r) == 0, "%s", kiln_last_error());
	for (size_t i = cut; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu of a %zu-byte result written (0x%02x)", i, cut,
			      u.b[i]);
	ck_assert_uint_eq(u.r.size, cut);
	ck_assert_int_eq(u.r.steps, 10);
	ck_assert_int_eq(u.r.steps_skipped, 0);
	/* a newer header's: the library's size back, the rest untouched */
	memset(&u, 0xA5, sizeof u);
	u.r.size = sizeof u;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &u.r) == 0, "%s", kiln_last_error());
	ck_assert_uint_eq(u.r.size, lib);
	ck_assert_int_eq(u.r.steps, 10);
	ck_assert_int_eq(u.r.out_dir_lost, 0);
	for (size_t i = lib; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu past the library's result written", i);
	/* not set: refused, nothing written (kiln_train_run's and
	 * kiln_evaluate's check is the same) */
	memset(&u, 0xA5, sizeof u);
	u.r.size = 0;
#define UNSET ": struct kiln_train_result's size is 0: set .size = sizeof(struct kiln_train_result) before the call (KILN_TRAIN_RESULT_INIT)"
	ck_assert_int_eq(kiln_train(cfg, reg, NULL, NULL, &u.r), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_train" UNSET);
	for (size_t i = sizeof u.r.size; i < sizeof u; i++)
		ck_assert_uint_eq(u.b[i], 0xA5);
	ck_assert_int_eq(kiln_evaluate(cfg, reg, "/nonexistent.kiln", &u.r), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_evaluate" UNSET);
#undef UNSET
	ck_assert_int_eq(kiln_train(cfg, reg, NULL, NULL, NULL), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_train: no struct kiln_train_result given (NULL)");
	kiln_config_free(cfg);
}
END_TEST


/* Every sized struct (kiln/kiln.h, "Structs the library fills") ends
 * where its last member ends: no tail padding, so a member added grows
 * its sizeof and `size` tells the layouts apart (the header's
 * KILN_ENDS_UNPADDED fails the build otherwise; checked here at run time
 * too).  Before session 35 kiln_train_cfg ended at 276 with sizeof 280:
 * a next `int` member would have fitted in the padding, sizeof unchanged. */
#ifndef LAST_TRAIN_CFG /* (-DLAST_TRAIN_CFG=overwrite: the old header's) */
#define LAST_TRAIN_CFG anneal_linear
#endif
#define ENDS(T, last) { #T, sizeof(struct T), offsetof(struct T, last) + sizeof(((struct T *)0)->last) }
START_TEST(test_struct_ends)
{
	static const struct {
		const char *name;
		size_t size, end;
	} s[] = {
		ENDS(kiln_train_result, samples_per_s), ENDS(kiln_train_cfg, LAST_TRAIN_CFG),
		ENDS(kiln_memory, cache),              ENDS(kiln_plugin_info, desc),
		ENDS(kiln_source_info, classes_from),
	};
	for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
		ck_assert_msg(s[i].size == s[i].end, "struct %s: sizeof %zu, its last member ends at %zu",
			      s[i].name, s[i].size, s[i].end);
}
END_TEST

/* The other structs the library fills in a caller's memory (kiln/kiln.h,
 * "Structs the library fills"), as test_result_size does the result's:
 * struct kiln_train_cfg and kiln_memory cut short (an older header's,
 * 0xA5 bytes after the cut) get no byte written past the cut; a larger
 * one (a newer header's) gets the library's size back, its extra bytes
 * untouched; a size not set is refused naming the struct, nothing
 * written.  kiln_train_run takes the cut kiln_train_cfg back and reads
 * the members past it from the config: the run equals one of the whole
 * struct.  Before session 35 neither struct had a size: both were
 * cleared and filled whole (kiln_train_cfg_read wrote byte `cut` first),
 * and kiln_train_run read the caller's bytes past its struct. */
START_TEST(test_struct_sizes)
{
	char ini[2048];
	union {
		struct kiln_train_cfg c;
		unsigned char b[sizeof(struct kiln_train_cfg) + 64];
	} t;
	union {
		struct kiln_memory m;
		unsigned char b[sizeof(struct kiln_memory) + 64];
	} u;
	const size_t tlib = sizeof(struct kiln_train_cfg), mlib = sizeof(struct kiln_memory);
	const size_t tcut = offsetof(struct kiln_train_cfg, optimizer);
	const size_t mcut = offsetof(struct kiln_memory, host);
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	struct kiln_config *cfg = test_config(reg, ini);
	ck_assert_msg(kiln_config_override(cfg, "data.limit=320") == 0, "%s", kiln_last_error());

	/* kiln_train_cfg_read: an older header's struct, then a newer one's */
	memset(&t, 0xA5, sizeof t);
	t.c.size = tcut;
	ck_assert_msg(kiln_train_cfg_read(cfg, reg, &t.c) == 0, "%s", kiln_last_error());
	for (size_t i = tcut; i < sizeof t; i++)
		ck_assert_msg(t.b[i] == 0xA5, "byte %zu of a %zu-byte kiln_train_cfg written (0x%02x)",
			      i, tcut, t.b[i]);
	ck_assert_uint_eq(t.c.size, tcut);
	ck_assert_int_eq(t.c.epochs, 1);
	ck_assert_int_eq(t.c.batch, 32);
	ck_assert_int_eq(t.c.max_steps, 0);
	/* kiln_train_run: the rest (optimizer, lr, ...) from the config,
	 * not the 0xA5 bytes past the caller's struct */
	struct kiln_train_cfg whole = KILN_TRAIN_CFG_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	ck_assert_msg(kiln_train_cfg_read(cfg, reg, &whole) == 0, "%s", kiln_last_error());
	ck_assert_uint_eq(whole.size, tlib);
	ck_assert_msg(kiln_train_run(cfg, reg, &whole, NULL, NULL, &r1) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_train_run(cfg, reg, &t.c, NULL, NULL, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r1.steps, 10);
	ck_assert_int_eq(r2.steps, 10);
	ck_assert_int_eq(r2.test_samples, r1.test_samples);
	ck_assert_msg(r2.train_loss == r1.train_loss && r2.test_loss == r1.test_loss,
		      "train loss %.9g, test loss %.9g; the whole struct's %.9g, %.9g", r2.train_loss,
		      r2.test_loss, r1.train_loss, r1.test_loss);
	memset(&t, 0xA5, sizeof t);
	t.c.size = sizeof t;
	ck_assert_msg(kiln_train_cfg_read(cfg, reg, &t.c) == 0, "%s", kiln_last_error());
	ck_assert_uint_eq(t.c.size, tlib);
	ck_assert_int_eq(t.c.overwrite, whole.overwrite);
	for (size_t i = tlib; i < sizeof t; i++)
		ck_assert_msg(t.b[i] == 0xA5, "byte %zu past the library's kiln_train_cfg written", i);

	/* kiln_memory_report: the same two */
	struct kiln_memory full = KILN_MEMORY_INIT;
	ck_assert_msg(kiln_memory_report(cfg, reg, NULL, &full) == 0, "%s", kiln_last_error());
	ck_assert_uint_eq(full.size, mlib);
	memset(&u, 0xA5, sizeof u);
	u.m.size = mcut;
	ck_assert_msg(kiln_memory_report(cfg, reg, NULL, &u.m) == 0, "%s", kiln_last_error());
	for (size_t i = mcut; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu of a %zu-byte kiln_memory written (0x%02x)", i,
			      mcut, u.b[i]);
	ck_assert_uint_eq(u.m.size, mcut);
	ck_assert_int_eq(u.m.batch, 32);
	ck_assert_uint_eq(u.m.total, full.total);
	memset(&u, 0xA5, sizeof u);
	u.m.size = sizeof u;
	ck_assert_msg(kiln_memory_report(cfg, reg, NULL, &u.m) == 0, "%s", kiln_last_error());
	ck_assert_uint_eq(u.m.size, mlib);
	ck_assert_int_eq(u.m.recomputed, full.recomputed);
	for (size_t i = mlib; i < sizeof u; i++)
		ck_assert_msg(u.b[i] == 0xA5, "byte %zu past the library's kiln_memory written", i);

	/* not set: refused, nothing written */
#define UNSET(s, init) ": struct " s "'s size is 0: set .size = sizeof(struct " s ") before the call (" init ")"
	memset(&t, 0xA5, sizeof t);
	t.c.size = 0;
	ck_assert_int_eq(kiln_train_cfg_read(cfg, reg, &t.c), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(),
			 "kiln_train_cfg_read" UNSET("kiln_train_cfg", "KILN_TRAIN_CFG_INIT"));
	for (size_t i = sizeof t.c.size; i < sizeof t; i++)
		ck_assert_uint_eq(t.b[i], 0xA5);
	ck_assert_int_eq(kiln_train_run(cfg, reg, &t.c, NULL, NULL, &r1), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(),
			 "kiln_train_run" UNSET("kiln_train_cfg", "KILN_TRAIN_CFG_INIT"));
	memset(&u, 0xA5, sizeof u);
	u.m.size = 0;
	ck_assert_int_eq(kiln_memory_report(cfg, reg, NULL, &u.m), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_memory_report" UNSET("kiln_memory", "KILN_MEMORY_INIT"));
	for (size_t i = sizeof u.m.size; i < sizeof u; i++)
		ck_assert_uint_eq(u.b[i], 0xA5);
#undef UNSET
	ck_assert_int_eq(kiln_memory_report(cfg, reg, NULL, NULL), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_memory_report: no struct kiln_memory given (NULL)");
	kiln_config_free(cfg);
}
END_TEST

/* A small MLP on 80 synthetic 8x8 images: 5 steps an epoch of 16, 3 epochs,
 * a log point every 2 steps (no data files needed). */
static const char *syn_ini =
	"[run]\nseed = 3\nthreads = 1\nout_dir =\n"
	"[data]\nsource = synthetic\nimage_size = 8\nsamples = 80\n[data.eval]\nsamples = 32\n"
	"[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = 3\nbatch = 16\nlr = 0.05\nlog_every = 2\n";

/* A run that fails before it starts (a [train] value kiln_train_cfg_read
 * refuses, set after validation) leaves the result of a run that ran
 * nothing: no evaluation (-1), no resume (-1), as a later failure (a data
 * set that does not open) leaves it.  Before session 35 the first was all
 * zeros: a test loss of 0, "resumed at step 0". */
START_TEST(test_result_early_failure)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	ck_assert_msg(kiln_config_override(cfg, "train.lr=-5") == 0, "%s", kiln_last_error());
	for (int late = 0; late < 2; late++) {
		if (late) { /* the data: opened after [train] was read */
			ck_assert(kiln_config_override(cfg, "train.lr=0.05") == 0);
			ck_assert(kiln_config_override(cfg, "data.source=idx") == 0);
			ck_assert(kiln_config_override(cfg, "data.images=/nonexistent/kiln.idx") == 0);
		}
		struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
		ck_assert_int_ne(kiln_train(cfg, reg, NULL, NULL, &res), 0);
		ck_assert_uint_eq(res.size, sizeof res);
		ck_assert_msg(res.test_loss == -1 && res.test_acc == -1, "late %d: test loss %g acc %g",
			      late, res.test_loss, res.test_acc);
		ck_assert_msg(res.val_loss == -1 && res.val_acc == -1, "late %d: val loss %g acc %g",
			      late, res.val_loss, res.val_acc);
		ck_assert_int_eq(res.resumed_step, -1);
		ck_assert_int_eq(res.steps, 0);
		ck_assert_int_eq(res.epochs, 0);
		ck_assert_str_eq(res.checkpoint, "");
	}
	/* kiln_evaluate failing before its pass (no such checkpoint): the
	 * same (before session 36 its val_loss and val_acc were 0) */
	ck_assert(kiln_config_override(cfg, "data.source=synthetic") == 0);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	ck_assert_int_ne(kiln_evaluate(cfg, reg, "/nonexistent/ckpt-1.kiln", &res), 0);
	ck_assert_msg(strstr(kiln_last_error(), "/nonexistent/ckpt-1.kiln"), "%s", kiln_last_error());
	ck_assert_msg(res.test_loss == -1 && res.test_acc == -1, "eval: test loss %g acc %g",
		      res.test_loss, res.test_acc);
	ck_assert_msg(res.val_loss == -1 && res.val_acc == -1, "eval: val loss %g acc %g",
		      res.val_loss, res.val_acc);
	ck_assert_int_eq(res.resumed_step, -1);
	kiln_config_free(cfg);
}
END_TEST

/* ---- the program's error hook (kiln_set_error_hook) --------------------- */

struct told {
	int n;            /* calls */
	kiln_status st;   /* the last call's */
	char msg[512];    /* the last call's message */
};

static void note_error(void *user, kiln_status st, const char *msg)
{
	struct told *t = user;
	t->n++;
	t->st = st;
	snprintf(t->msg, sizeof t->msg, "%s", msg);
}

/* `call`'s status st (non-zero), told to the hook once, with the message
 * kiln_last_error() gives after the call, as this process's own failure
 * (kiln_train_failed_own: one process, no peer to follow from). */
#define TOLD_ONCE(what, call)                                                            \
	do {                                                                             \
		struct told t_ = { 0 };                                                  \
		kiln_set_error_hook(note_error, &t_);                                    \
		const kiln_status st_ = (call);                                          \
		kiln_set_error_hook(NULL, NULL);                                         \
		ck_assert_msg(st_ != 0, "%s: succeeded", what);                          \
		ck_assert_msg(t_.n == 1, "%s: hook called %d times, not once (%s)", what, \
			      t_.n, kiln_last_error());                                  \
		ck_assert_int_eq(t_.st, st_);                                            \
		ck_assert_str_eq(t_.msg, kiln_last_error());                             \
		ck_assert_int_eq(kiln_train_failed_own(), 1);                            \
	} while (0)

/* Every failing call of kiln_train, kiln_train_run, kiln_evaluate,
 * kiln_evaluate_ex and kiln_quantize tells the hook once, also a failure
 * before the run opens (a NULL argument, a struct's size not set, a
 * config the run refuses), which before session 37 told it nothing; and
 * a failure in the run (a data file missing), told by the teardown, once. */
START_TEST(test_error_hook_early)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT, unsized = { 0 };
	struct kiln_train_cfg tc = KILN_TRAIN_CFG_INIT, tc_unsized = { 0 };
	ck_assert_msg(kiln_train_cfg_read(cfg, reg, &tc) == 0, "%s", kiln_last_error());
	TOLD_ONCE("kiln_train, reg NULL", kiln_train(cfg, NULL, NULL, NULL, &res));
	ck_assert_str_eq(kiln_last_error(), "kiln_train: reg is NULL");
	TOLD_ONCE("kiln_train, res unsized", kiln_train(cfg, reg, NULL, NULL, &unsized));
	TOLD_ONCE("kiln_train_run, tc NULL", kiln_train_run(cfg, reg, NULL, NULL, NULL, &res));
	TOLD_ONCE("kiln_train_run, tc unsized",
		  kiln_train_run(cfg, reg, &tc_unsized, NULL, NULL, &res));
	TOLD_ONCE("kiln_evaluate, cfg NULL", kiln_evaluate(NULL, reg, NULL, &res));
	TOLD_ONCE("kiln_evaluate, res unsized", kiln_evaluate(cfg, reg, NULL, &unsized));
	TOLD_ONCE("kiln_evaluate_ex, res unsized",
		  kiln_evaluate_ex(cfg, reg, NULL, &(struct kiln_eval_opts){ 0 }, &unsized));
	TOLD_ONCE("kiln_quantize, opts NULL", kiln_quantize(cfg, reg, NULL, NULL));
	TOLD_ONCE("kiln_quantize, method", kiln_quantize(cfg, reg, NULL,
		  &(struct kiln_quantize_opts){ .method = "mean", .batches = 1, .percentile = 99, .out = "q" }));
	ck_assert_msg(strstr(kiln_last_error(), "(got mean)"), "%s", kiln_last_error());
	/* a [train] value kiln_train_cfg_read refuses, set after validation */
	ck_assert(kiln_config_override(cfg, "train.lr=-5") == 0);
	TOLD_ONCE("kiln_train, lr -5", kiln_train(cfg, reg, NULL, NULL, &res));
	/* in the run: told by its teardown (trainer_close), still once */
	ck_assert(kiln_config_override(cfg, "train.lr=0.05") == 0);
	ck_assert(kiln_config_override(cfg, "data.source=idx") == 0);
	ck_assert(kiln_config_override(cfg, "data.images=/nonexistent/kiln.idx") == 0);
	TOLD_ONCE("kiln_train, no data", kiln_train(cfg, reg, NULL, NULL, &res));
	ck_assert_msg(strstr(kiln_last_error(), "/nonexistent/kiln.idx"), "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* Two hooks, each with its own user: a call must get a matching pair. */
static int user_a, user_b;
static atomic_int hook_calls, hook_mixed;

static void hook_a(void *user, kiln_status st, const char *msg)
{
	(void)st, (void)msg;
	atomic_fetch_add(&hook_calls, 1);
	if (user != &user_a)
		atomic_fetch_add(&hook_mixed, 1);
}

static void hook_b(void *user, kiln_status st, const char *msg)
{
	(void)st, (void)msg;
	atomic_fetch_add(&hook_calls, 1);
	if (user != &user_b)
		atomic_fetch_add(&hook_mixed, 1);
}

static atomic_int failing_done;

/* Calls with config arg that fail at once (reg NULL), until told to stop. */
static void *fail_often(void *arg)
{
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	while (!atomic_load(&failing_done))
		kiln_train(arg, NULL, NULL, NULL, &res);
	return NULL;
}

/* kiln_set_error_hook while other threads' calls fail: each call gets the
 * fn and user of one kiln_set_error_hook (before session 37 fn and user
 * were two plain globals: a call could read the new fn with the old
 * user). */
START_TEST(test_error_hook_pairs)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, fail_often, cfg), 0);
	/* until the failing threads have made 20000 calls (or 10 s passed) */
	const time_t t0 = time(NULL);
	for (int i = 0; atomic_load(&hook_calls) < 20000 && time(NULL) - t0 < 10; i++) {
		if (i & 1)
			kiln_set_error_hook(hook_b, &user_b);
		else
			kiln_set_error_hook(hook_a, &user_a);
	}
	kiln_set_error_hook(NULL, NULL);
	atomic_store(&failing_done, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	kiln_config_free(cfg);
	ck_assert_msg(atomic_load(&hook_calls) > 0, "the hook was never called");
	ck_assert_msg(atomic_load(&hook_mixed) == 0, "%d of %d calls got another hook's user",
		      atomic_load(&hook_mixed), atomic_load(&hook_calls));
}
END_TEST

/* A hook that takes its time, on another thread's failing run. */
static atomic_int slow_in, slow_out;

static void slow_hook(void *user, kiln_status st, const char *msg)
{
	(void)user, (void)st, (void)msg;
	atomic_store(&slow_in, 1);
	usleep(300 * 1000);
	atomic_store(&slow_out, 1);
}

static void *fail_once(void *arg)
{
	struct kiln_config *cfg = arg;
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	kiln_train(cfg, reg, NULL, NULL, &res);
	return NULL;
}

/* A hook that sets the hook itself (its own thread's call: not waited for). */
static void reset_hook(void *user, kiln_status st, const char *msg)
{
	(void)st, (void)msg;
	kiln_set_error_hook(NULL, NULL);
	++*(int *)user;
}

/* kiln_set_error_hook returns only once no other thread is in the hook it
 * replaced, so the program may free that hook's user then (before session
 * 37 it returned at once, the hook still running on the old user); a
 * hook may set the hook itself without waiting for itself. */
START_TEST(test_error_hook_waits)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	pthread_t th;
	/* a failure in the run (told by trainer_close before session 37 too) */
	ck_assert(kiln_config_override(cfg, "data.source=idx") == 0);
	ck_assert(kiln_config_override(cfg, "data.images=/nonexistent/kiln.idx") == 0);
	kiln_set_error_hook(slow_hook, NULL);
	ck_assert_int_eq(pthread_create(&th, NULL, fail_once, cfg), 0);
	for (int i = 0; i < 1000 && !atomic_load(&slow_in); i++)
		usleep(10 * 1000);
	ck_assert_msg(atomic_load(&slow_in), "the hook was not called within 10 s");
	kiln_set_error_hook(NULL, NULL);
	ck_assert_msg(atomic_load(&slow_out), "kiln_set_error_hook returned while the hook it replaced still ran");
	pthread_join(th, NULL);
	int n = 0;
	kiln_set_error_hook(reset_hook, &n);
	ck_assert_int_ne(kiln_train(cfg, reg, NULL, NULL, &(struct kiln_train_result)KILN_TRAIN_RESULT_INIT), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_int_ne(kiln_train(cfg, reg, NULL, NULL, &(struct kiln_train_result)KILN_TRAIN_RESULT_INIT), 0);
	ck_assert_int_eq(n, 1); /* reset by itself */
	kiln_config_free(cfg);
}
END_TEST

/* Two hooks on two threads, each setting the hook while the other is in
 * its hook: neither waits for the other (with session 37's first waiting
 * kiln_set_error_hook they waited for each other for ever). */
static atomic_int cross_in;

static void cross_hook(void *user, kiln_status st, const char *msg)
{
	(void)st;
	(void)msg;
	atomic_fetch_add(&cross_in, 1);
	for (int i = 0; i < 500 && atomic_load(&cross_in) < 2; i++)
		usleep(10 * 1000);
	kiln_set_error_hook(cross_hook, user);
}

START_TEST(test_error_hook_cross)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	pthread_t th[2];
	ck_assert(kiln_config_override(cfg, "data.source=idx") == 0);
	ck_assert(kiln_config_override(cfg, "data.images=/nonexistent/kiln.idx") == 0);
	kiln_set_error_hook(cross_hook, NULL);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, fail_once, cfg), 0);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 30;
	for (int i = 0; i < 2; i++)
		ck_assert_msg(pthread_timedjoin_np(th[i], NULL, &until) == 0,
			      "two hooks setting the hook on two threads waited for each other for 30 s");
	ck_assert_int_eq(atomic_load(&cross_in), 2);
	kiln_set_error_hook(NULL, NULL);
	kiln_config_free(cfg);
}
END_TEST

/* fork() while another thread is in the hook: the child's
 * kiln_set_error_hook returns (it waited for ever for a thread the child
 * does not have, session 37's review). */
static atomic_int fork_in;

static void fork_hook(void *user, kiln_status st, const char *msg)
{
	(void)user, (void)st, (void)msg;
	atomic_store(&fork_in, 1);
	sleep(2);
}

static void *fail_null(void *arg)
{
	(void)arg;
	kiln_train(NULL, NULL, NULL, NULL, NULL);
	return NULL;
}

START_TEST(test_error_hook_fork)
{
	pthread_t th;
	kiln_set_error_hook(fork_hook, NULL);
	ck_assert_int_eq(pthread_create(&th, NULL, fail_null, NULL), 0);
	for (int i = 0; i < 1000 && !atomic_load(&fork_in); i++)
		usleep(10 * 1000);
	ck_assert_msg(atomic_load(&fork_in), "the hook was not called within 10 s");
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		alarm(10);
		kiln_set_error_hook(NULL, NULL);
		_exit(0);
	}
	int ws = 0;
	ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
	ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
		      "the child's kiln_set_error_hook did not return (%s %d)",
		      WIFSIGNALED(ws) ? "signal" : "exit", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
	kiln_set_error_hook(NULL, NULL);
	pthread_join(th, NULL);
}
END_TEST

struct calls {
	int n, epoch_lines, with_status, without_status;
	int64_t last_step;
	int in_order; /* each step call's step is the one before + 1 (from 1 in an epoch) */
	char lines[3][300];
	int steps_ok; /* kiln_train_progress_steps: the global step, last 15 */
};

static void count_call(void *user, int epoch, int64_t step, int64_t spe, const char *status)
{
	struct calls *c = user;
	c->n++;
	ck_assert_int_eq(spe, 5);
	int64_t done = -1, last = -1;
	c->steps_ok &= kiln_train_progress_steps(&done, &last) == KILN_OK && last == 15 &&
		       done == (epoch - 1) * 5 + (step < 0 ? 5 : step);
	if (step == -1) {
		ck_assert_ptr_nonnull(status);
		if (c->epoch_lines < 3)
			snprintf(c->lines[c->epoch_lines], sizeof c->lines[0], "%d %s", epoch, status);
		c->epoch_lines++;
		c->in_order &= c->last_step == spe;
		c->last_step = 0;
		return;
	}
	c->in_order &= step == c->last_step + 1;
	c->last_step = step;
	if (status)
		c->with_status++;
	else
		c->without_status++;
}

/* The progress callback's calls, as kiln_progress_fn documents them: after
 * every step (status at the log points: global steps 2, 4, 5 (an epoch's
 * last), 6, 8, 10, 12, 14, 15; NULL at the other 6), and once at each
 * epoch's end with step -1 and the epoch's line, which then does not go
 * to the log (it does without a callback).  In each,
 * kiln_train_progress_steps gives the run's global step and its last, 15;
 * outside them KILN_EINVAL. */
START_TEST(test_progress_calls)
{
	struct kiln_config *cfg = test_config(reg, syn_ini);
	struct calls c = { .in_order = 1, .steps_ok = 1 };
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	int64_t done = 7;
	/* outside a callback: nothing to say (session 38) */
	ck_assert_int_eq(kiln_train_progress_steps(&done, NULL), KILN_EINVAL);
	ck_assert_int_eq(done, 7);
	const int level = kiln_log_get_level();
	kiln_log_set_level(KILN_LOG_INFO);
	kiln_log_set_sink(check_log_sink, NULL);
	check_log_clear();
	ck_assert_msg(kiln_train(cfg, reg, count_call, &c, &res) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(res.steps, 15);
	ck_assert_int_eq(res.epochs, 3);
	ck_assert_int_eq(c.epoch_lines, 3);
	ck_assert_int_eq(c.with_status, 9);
	ck_assert_int_eq(c.without_status, 6);
	ck_assert_int_eq(c.n, 18);
	ck_assert(c.in_order);
	ck_assert(c.steps_ok);
	ck_assert_int_eq(kiln_train_progress_steps(&done, NULL), KILN_EINVAL);
	for (int e = 0; e < 3; e++) {
		char want[32];
		snprintf(want, sizeof want, "%d epoch %d/3: train loss ", e + 1, e + 1);
		ck_assert_msg(!strncmp(c.lines[e], want, strlen(want)), "'%s'", c.lines[e]);
	}
	ck_assert_int_eq(check_log_count("epoch 1/3: train loss", NULL), 0);
	/* without a callback the lines go to the log */
	check_log_clear();
	res = (struct kiln_train_result)KILN_TRAIN_RESULT_INIT;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	for (int e = 1; e <= 3; e++) {
		char want[32];
		snprintf(want, sizeof want, "epoch %d/3: train loss ", e);
		ck_assert_msg(check_log_count(want, NULL) == 1, "'%s' not logged once:\n%s", want,
			      check_log_text());
	}
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	kiln_config_free(cfg);
}
END_TEST


/* eval_every evaluates every N steps; early stopping ends the run after
 * `patience` evaluations without an improvement larger than min_delta
 * (1.0: accuracy can never improve that much, so it stops at the third
 * evaluation, step 30); top-5 is reported and at least top-1. */
START_TEST(test_eval_every_early_stop)
{
	char ini[2048];
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 5, 5, 0);
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.eval_every=10") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.early_stop_patience=2") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.early_stop_min_delta=1") == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(res.early_stopped, 1);
	ck_assert_int_eq(res.steps, 30);
	ck_assert(res.test_acc > 0.3 && res.test_acc5 >= res.test_acc && res.test_acc5 <= 1.0);
	kiln_config_free(cfg);
}
END_TEST


/* [data.val]: the evaluations during training run on it (300 samples of
 * the test files here), early stopping watches it, and [data.eval] (500) is
 * evaluated once at the end. */
START_TEST(test_data_val)
{
	char ini[2048];
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 2, 5, 0);
	strcat(ini, "[data.val]\nimages = t10k-images-idx3-ubyte.gz\nlabels = t10k-labels-idx1-ubyte.gz\n"
		    "limit = 300\n");
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "data.eval.limit=500") == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(res.val_samples, 300);
	ck_assert_int_eq(res.test_samples, 500);
	ck_assert(res.val_acc > 0.5 && res.test_acc > 0.5);
	ck_assert(res.val_acc5 >= res.val_acc);
	kiln_config_free(cfg);
	/* without [data.val] the evaluations are [data.eval]'s, as before */
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "data.eval.limit=500") == KILN_OK);
	ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
	ck_assert(kiln_train(cfg, reg, NULL, NULL, &res) == 0);
	ck_assert_int_eq(res.val_samples, 0);
	ck_assert(res.val_acc == -1);
	ck_assert_int_eq(res.test_samples, 500);
	kiln_config_free(cfg);
}
END_TEST


/* kiln_memory_report: the parts add up to the total, the parameters are
 * the model's, packing never costs more than no packing, and accumulation
 * and AdamW show up where they should. */
START_TEST(test_memory_report)
{
	char ini[2048];
	struct kiln_memory a = KILN_MEMORY_INIT, b = KILN_MEMORY_INIT;
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
	ck_assert_msg(kiln_memory_report(cfg, reg, NULL, &a) == 0, "%s", kiln_last_error());
	kiln_config_free(cfg);
	/* 784*256 + 256 + 256*10 + 10 floats, each tensor padded to 64 bytes */
	ck_assert_uint_ge(a.params, (size_t)(784 * 256 + 256 + 2560 + 10) * 4);
	ck_assert_uint_le(a.params, (size_t)(784 * 256 + 256 + 2560 + 10) * 4 + 4 * 64);
	ck_assert_uint_eq(a.grads, a.params);
	ck_assert_uint_eq(a.optim_state, a.params); /* SGD momentum, every parameter trains */
	ck_assert_uint_eq(a.total, a.params + a.grads + a.optim_state + a.buffers + a.activations +
					   a.workspace + a.eval + a.inputs + a.other);
	ck_assert_uint_le(a.activations, a.activations_unpacked);
	ck_assert_uint_le(a.peak_live, a.activations);
	ck_assert_int_eq(a.batch, 32);
	ck_assert(a.peak_layer >= 0 && a.peak_layer < 6);
	/* AdamW: two state slots; accumulate: no second gradient buffer (the
	 * built-in layers add in their ops, ABI 2.9; before: twice a.grads) */
	ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.optimizer=adamw") == KILN_OK);
	ck_assert(kiln_config_override(cfg, "train.accumulate=2") == KILN_OK);
	ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
	ck_assert(kiln_memory_report(cfg, reg, NULL, &b) == 0);
	kiln_config_free(cfg);
	ck_assert_uint_eq(b.optim_state, 2 * a.optim_state);
	ck_assert_uint_eq(b.grads, a.grads);
	ck_assert_uint_eq(b.activations, a.activations);
}
END_TEST


/* In-place: the planner gives relu the input's memory (the eval arena and
 * the unpacked total shrink), and training is bit-identical to a run that
 * forbids it. */
START_TEST(test_inplace)
{
	char ini[2048];
	struct kiln_memory mem[3] = { KILN_MEMORY_INIT, KILN_MEMORY_INIT, KILN_MEMORY_INIT };
	struct kiln_train_result res[3] = { KILN_TRAIN_RESULT_INIT, KILN_TRAIN_RESULT_INIT,
					    KILN_TRAIN_RESULT_INIT };
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	/* 0: in place (unfused), 1: inplace = 0 (unfused), 2: the default
	 * ([run] fuse = auto: fused on the CPU, the ReLU a view) */
	static const char *const set[3][2] = { { "run.fuse=0", NULL },
					       { "run.fuse=0", "layer.r1.inplace=0" },
					       { NULL, NULL } };
	for (int v = 0; v < 3; v++) {
		struct kiln_config *cfg;
		ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
		for (int k = 0; k < 2; k++)
			if (set[v][k])
				ck_assert(kiln_config_override(cfg, set[v][k]) == KILN_OK);
		ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
		ck_assert(kiln_memory_report(cfg, reg, NULL, &mem[v]) == 0);
		ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res[v]) == 0, "%s",
			      kiln_last_error());
		kiln_config_free(cfg);
	}
	ck_assert_uint_lt(mem[0].activations_unpacked, mem[1].activations_unpacked);
	ck_assert_uint_lt(mem[0].eval, mem[1].eval);
	ck_assert_uint_le(mem[2].activations_unpacked, mem[0].activations_unpacked);
	for (int v = 1; v < 3; v++)
		ck_assert(res[v].train_loss == res[0].train_loss && res[v].test_loss == res[0].test_loss);
}
END_TEST


/* Gradient checkpointing changes memory, never numbers: every parameter
 * gradient, the batchnorm running statistics (a replayed forward must not
 * update them twice), the loss and the correct count are the same bit for
 * bit with and without recomputation, on a graph of every layer type
 * (dropout's mask included), in both layouts, for several segment counts
 * and per-layer recompute. */
static void recompute_run(const char *layout, const char *extra, float **grads, float **bufs,
			  size_t *ng, size_t *nb, float m[2], int *recomputed, size_t *arena)
{
	char ini[4096];
	/* extra: "[train]..." appended, or "L1 L2 ...": those layers get
	 * `recompute = 1` (and c1 `inplace = 0` for "-c1") */
	snprintf(ini, sizeof ini, "%s", extra[0] == '[' || !extra[0] ? fd_cnn_ini : "");
	for (const char *t = extra[0] == '[' ? "" : extra; *t;) {
		char name[32], sec[48];
		int len = 0;
		sscanf(t, "%31s%n", name, &len);
		t += len;
		while (*t == ' ')
			t++;
		if (!ini[0])
			snprintf(ini, sizeof ini, "%s", fd_cnn_ini);
		snprintf(sec, sizeof sec, "[layer.%s]\n", name[0] == '-' ? name + 1 : name);
		char *at = strstr(ini, sec);
		ck_assert(at);
		at += strlen(sec);
		const char *add = name[0] == '-' ? "inplace = 0\n" : "recompute = 1\n";
		memmove(at + strlen(add), at, strlen(at) + 1);
		memcpy(at, add, strlen(add));
	}
	snprintf(ini + strlen(ini), sizeof ini - strlen(ini), "[model]\nlayout = %s\n%s", layout,
		 extra[0] == '[' ? extra : "");
	struct rig r;
	fd_cnn_open(&r, ini);
	pass(&r, r.train, m);
	*recomputed = kiln_plan_recomputed(r.train);
	*arena = kiln_plan_arena_bytes(r.train);
	*ng = kiln_model_param_elems(r.m);
	*grads = malloc(sizeof(float) * *ng);
	struct kiln_param_info info;
	kiln_model_param_get(r.m, 0, &info);
	TEST_D2H(&r, *grads, info.grad, sizeof(float) * *ng);
	/* the batchnorm running statistics: the parameters that are not trained */
	*nb = 0;
	*bufs = malloc(sizeof(float) * 4096);
	for (int i = 0; i < kiln_model_param_count(r.m); i++) {
		kiln_model_param_get(r.m, i, &info);
		if (info.grad)
			continue;
		int64_t ne = kiln_tensor_numel(&info.desc);
		ck_assert(*nb + (size_t)ne <= 4096);
		TEST_D2H(&r, *bufs + *nb, info.param, sizeof(float) * (size_t)ne);
		*nb += (size_t)ne;
	}
	*nb *= sizeof(float);
	rig_close(&r);
}

static void recompute_same(const char *layout)
{
	static const char *const variants[] = {
		"[train]\nrecompute = 2\n", "[train]\nrecompute = 3\n", "[train]\nrecompute = 5\n",
		"[train]\nrecompute = auto\n",
		"bn a1 drop cat",
		"c1 bn a1 c2 a2 sum g cat mp c3 s ap drop -c1",
	};
	float *g0, *b0, m0[2];
	size_t ng0, nb0, a0;
	int rec0;
	recompute_run(layout, "", &g0, &b0, &ng0, &nb0, m0, &rec0, &a0);
	ck_assert_int_eq(rec0, 0);
	ck_assert_uint_gt(nb0, 0);
	for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
		float *g, *b, m[2];
		size_t ng, nb, a;
		int rec;
		recompute_run(layout, variants[v], &g, &b, &ng, &nb, m, &rec, &a);
		ck_assert_msg(rec > 0, "%s %s: nothing recomputed", layout, variants[v]);
		ck_assert(ng == ng0 && nb == nb0);
		ck_assert_msg(!memcmp(g, g0, sizeof(float) * ng), "%s %s: gradients differ", layout,
			      variants[v]);
		ck_assert_msg(!memcmp(b, b0, nb), "%s %s: running statistics differ", layout,
			      variants[v]);
		ck_assert_msg(!memcmp(m, m0, sizeof m), "%s %s: loss or count differ", layout,
			      variants[v]);
		free(g);
		free(b);
	}
	free(g0);
	free(b0);
}

START_TEST(test_recompute_nchw) { recompute_same("nchw"); }
END_TEST
START_TEST(test_recompute_nhwc) { recompute_same("nhwc"); }
END_TEST

/* The deep ResNet example: recompute = auto cuts the activation arena by
 * at least 3x (the memory issue's target); a bad value names file:line. */
START_TEST(test_recompute_deep)
{
	char path[4096];
	const char *srcdir = getenv("srcdir");
	TEST_REQUIRE_FASHION();
	snprintf(path, sizeof path, "%s/examples/fashion_mnist_resnet_deep.ini",
		 srcdir ? srcdir : ".");
	struct kiln_memory mem[2] = { KILN_MEMORY_INIT, KILN_MEMORY_INIT };
	for (int i = 0; i < 2; i++) {
		struct kiln_config *cfg;
		ck_assert_msg(kiln_config_load(path, &cfg) == KILN_OK, "%s", kiln_last_error());
		ck_assert(kiln_config_override(cfg, i ? "train.recompute=auto" : "train.recompute=none") ==
			  KILN_OK);
		ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
		ck_assert_msg(kiln_memory_report(cfg, reg, NULL, &mem[i]) == 0, "%s", kiln_last_error());
		kiln_config_free(cfg);
	}
	printf("deep resnet activations: %zu without recompute, %zu with (%.2fx), %d layers recomputed\n",
	       mem[0].activations, mem[1].activations,
	       (double)mem[0].activations / (double)mem[1].activations, mem[1].recomputed);
	ck_assert_int_eq(mem[0].recomputed, 0);
	ck_assert_int_gt(mem[1].recomputed, 0);
	ck_assert_uint_ge(mem[0].activations, 3 * mem[1].activations);

	/* a word recompute does not take: refused by the config's validation,
	 * naming the file and the value (since session 31; the plan refused
	 * it before, as a training run reached it) */
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string("[layer.fc]\ntype = linear\nout = 3\n"
					  "[layer.loss]\ntype = softmax_xent\n"
					  "[train]\nrecompute = lots\n",
					  "test.ini", &cfg) == KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "test.ini:") && strstr(kiln_last_error(), "lots"),
		      "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* The prediction against what the device was asked for during a real run
 * (kiln_device_mem's peak, counted at the device wrapper): within 5%
 * (in practice a few bytes) for two batch sizes. */
START_TEST(test_memory_accounting)
{
	char ini[2048];
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini, mlp_ini, "", 1, 5, 0);
	static const char *const batches[] = { "train.batch=16", "train.batch=100" };
	for (int i = 0; i < 2; i++) {
		struct kiln_config *cfg;
		struct kiln_memory mem = KILN_MEMORY_INIT;
		struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
		ck_assert(kiln_config_load_string(ini, "test.ini", &cfg) == KILN_OK);
		ck_assert(kiln_config_override(cfg, batches[i]) == KILN_OK);
		ck_assert(kiln_config_override(cfg, "train.max_steps=2") == KILN_OK);
		ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
		ck_assert(kiln_memory_report(cfg, reg, NULL, &mem) == 0);
		ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
		double rel = fabs((double)res.device_peak_bytes - (double)mem.total) / (double)mem.total;
		printf("memory %s: predicted %zu, device peak %zu (%.2e)\n", batches[i], mem.total,
		       res.device_peak_bytes, rel);
		ck_assert_msg(rel < 0.05, "%s: predicted %zu bytes, the device peaked at %zu", batches[i],
			      mem.total, res.device_peak_bytes);
		kiln_config_free(cfg);
	}
}
END_TEST

/* A small CNN through the whole trainer in both layouts: training, then
 * evaluation with a remainder batch (inference plans of every layer type,
 * pooling without its training state). */
START_TEST(test_cnn_e2e)
{
	char ini[2048];
	struct kiln_train_result res[2] = { KILN_TRAIN_RESULT_INIT, KILN_TRAIN_RESULT_INIT };
	TEST_REQUIRE_FASHION();
	for (int l = 0; l < 2; l++) {
		snprintf(ini, sizeof ini,
			 "[run]\nseed = 2\nout_dir =\n"
			 "[data]\nsource = idx\nlimit = 640\nmean = 0.286\nstd = 0.353\n"
			 "[data.eval]\nlimit = 300\n[model]\nlayout = %s\n"
			 "[layer.c1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n"
			 "[layer.bn]\ntype = batchnorm\n[layer.r]\ntype = relu\n"
			 "[layer.p]\ntype = maxpool\nkernel = 2\n"
			 "[layer.c2]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n"
			 "[layer.a]\ntype = avgpool\nkernel = 2\n"
			 "[layer.d]\ntype = dropout\np = 0.2\n"
			 "[layer.f]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
			 "[layer.loss]\ntype = softmax_xent\n"
			 "[train]\nepochs = 3\nbatch = 32\nlr = 0.05\nlog_every = 10\neval_batch = 128\n",
			 l ? "nhwc" : "nchw");
		struct kiln_config *cfg = test_config(reg, ini);
		ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res[l]) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(res[l].test_samples, 300);
		ck_assert_msg(res[l].test_acc > 0.5, "test accuracy %.3f", res[l].test_acc);
		kiln_config_free(cfg);
	}
	/* the same numbers in both layouts, up to float rounding */
	ck_assert_double_eq_tol(res[0].train_loss, res[1].train_loss, 1e-3);
	ck_assert_double_eq_tol(res[0].test_acc, res[1].test_acc, 0.01);
}
END_TEST

/* ---- weight tying ([layer.X] tie = Y) ------------------------------------ */

/* 12 -> a (7) -> relu -> c (12) -> relu -> b (7, its weight a's) -> loss:
 * tests/data/gen_tie_refs.py's model; TIE_B ties b to a (the tensor is
 * a.weight, b's backward writes beside it), TIE_A a to b (the tensor is
 * b.weight, a's backward adds b's in). */
#define TIE_LAYERS(ta, tb)                                                              \
	"[layer.a]\ntype = linear\nout = 7\n" ta "[layer.r1]\ntype = relu\n"            \
	"[layer.c]\ntype = linear\nout = 12\n[layer.r2]\ntype = relu\n"                 \
	"[layer.b]\ntype = linear\nout = 7\n" tb "[layer.loss]\ntype = softmax_xent\n"
static const char *const tie_ini[2] = { TIE_LAYERS("", "tie = a\n"), TIE_LAYERS("tie = b\n", "") };
static const char *const tie_params[] = { "a.weight", "a.bias", "c.weight", "c.bias", "b.bias" };

/* A reference tensor of tests/data/tie_refs.safetensors, and its elements. */
static const float *tie_ref(const struct kiln_safetensors *f, const char *name, int64_t *n)
{
	struct kiln_safetensors_tensor t;
	ck_assert_msg(kiln_safetensors_find(f, name, &t) == 0, "%s", kiln_last_error());
	*n = t.numel;
	return t.data;
}

/* tie_params[i]'s tensor (read) against the reference `key`. */
static double tie_rel(struct rig *r, const struct kiln_safetensors *f, const char *key, int i,
		      int grad)
{
	struct kiln_param_info info;
	int64_t n;
	const float *ref = tie_ref(f, key, &n);
	ck_assert_msg(kiln_model_param_find(r->m, tie_params[i], &info) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(n, kiln_tensor_numel(&info.desc));
	float *got = malloc(sizeof(float) * (size_t)n);
	TEST_D2H(r, got, grad ? info.grad : info.param, sizeof(float) * (size_t)n);
	double e = max_rel(got, ref, n);
	free(got);
	return e;
}

/* 4 steps of SGD (momentum, weight decay) and of AdamW (no_decay biases)
 * from PyTorch's initial weights, each tie direction: every loss, gradient
 * (the tied one summed over its two uses) and final weight to 1e-5; the
 * tensor is one parameter, named as its owner, and both names find it. */
START_TEST(test_tie_pytorch)
{
	static const char *const optim[2][2] = {
		{ "sgd", "[train]\nmomentum = 0.9\nweight_decay = 0.01\n" },
		{ "adamw", "[train]\noptimizer = adamw\nweight_decay = 0.1\nno_decay = *.bias\n" } };
	static const float lrs[2] = { 0.1f, 0.01f };
	char path[4096], ini[2048], key[96];
	struct kiln_safetensors *f;
	ck_assert_msg(kiln_safetensors_open(test_data_path(path, sizeof path, "tie_refs.safetensors"),
					    &f) == 0, "%s", kiln_last_error());
	for (int c = 0; c < 4; c++) {
		const int o = c / 2, dir = c % 2;
		struct rig r;
		int64_t n;
		snprintf(ini, sizeof ini, "%s%s[plugin.cpu]\nasync = 1\n", tie_ini[dir], optim[o][1]);
		rig_open(&r, ini, 8, 12);
		ck_assert_int_eq(kiln_model_param_count(r.m), 5);
		struct kiln_param_info pa, pb;
		ck_assert(kiln_model_param_find(r.m, "a.weight", &pa) == 0);
		ck_assert(kiln_model_param_find(r.m, "b.weight", &pb) == 0);
		ck_assert(pa.param == pb.param && pa.grad == pb.grad);
		ck_assert_str_eq(pa.name, dir ? "b.weight" : "a.weight");
		for (int i = 0; i < 5; i++) {
			struct kiln_param_info info;
			snprintf(key, sizeof key, "init.%s", tie_params[i]);
			const float *src = tie_ref(f, key, &n);
			ck_assert(kiln_model_param_find(r.m, tie_params[i], &info) == 0);
			TEST_H2D(&r, info.param, src, sizeof(float) * (size_t)n);
		}
		TEST_H2D(&r, r.lr, &lrs[o], sizeof(float));
		for (int k = 0; k < 4; k++) {
			float m[2];
			snprintf(key, sizeof key, "x%d", k);
			TEST_H2D(&r, r.x, tie_ref(f, key, &n), sizeof(float) * 8 * 12);
			snprintf(key, sizeof key, "y%d", k);
			TEST_H2D(&r, r.y, tie_ref(f, key, &n), sizeof(int32_t) * 8);
			pass(&r, r.train, m);
			snprintf(key, sizeof key, "%s.loss%d", optim[o][0], k);
			float ref = *tie_ref(f, key, &n);
			ck_assert_msg(fabs(m[0] / 8 - ref) <= 1e-5 * fabs(ref),
				      "%s, tie direction %d, step %d: loss %.9g, PyTorch %.9g",
				      optim[o][0], dir, k, m[0] / 8, ref);
			for (int i = 0; i < 5; i++) {
				snprintf(key, sizeof key, "%s.grad%d.%s", optim[o][0], k, tie_params[i]);
				double e = tie_rel(&r, f, key, i, 1);
				ck_assert_msg(e <= 1e-5, "%s, direction %d: %s: relative error %g",
					      optim[o][0], dir, key, e);
			}
			ck_assert(kiln_model_optim_step(r.m, r.lr, r.stream) == 0);
		}
		for (int i = 0; i < 5; i++) {
			snprintf(key, sizeof key, "%s.final.%s", optim[o][0], tie_params[i]);
			double e = tie_rel(&r, f, key, i, 0);
			ck_assert_msg(e <= 1e-5, "%s, direction %d: %s: relative error %g", optim[o][0],
				      dir, key, e);
		}
		rig_close(&r);
	}
	kiln_safetensors_close(f);
}
END_TEST

/* A tie that cannot be: a clean KILN_ECONFIG naming file:line, both
 * layers and, for a shape mismatch, both shapes. */
START_TEST(test_tie_errors)
{
	static const struct { const char *ini, *want; } cases[] = {
		{ TIE_LAYERS("", "tie = zz\n"), "tie = zz: there is no layer 'zz'" },
		{ TIE_LAYERS("", "tie = b\n"), "cannot be tied to itself" },
		{ TIE_LAYERS("", "tie = c\n"),
		  "b.weight is f32[7, 12] but c.weight is f32[12, 7]; tied weights must have the same shape" },
		{ TIE_LAYERS("", "tie = r1\n"), "layer 'r1' (relu) has no 'weight' parameter" },
		{ TIE_LAYERS("tie = b\n", "tie = a\n"), "'b' is itself tied to 'a'; tie to 'a' directly" },
		{ TIE_LAYERS("trainable = 0\n", "tie = a\n"), "both layers must be trainable, or both frozen" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		graph_error(cases[i].ini, 12, cases[i].want);
}
END_TEST

/* The tied tensor starts as its owner's weight would untied, and the
 * other tensors as theirs (initialised once, by the owner's key).
 * Safetensors: the export writes the tied tensor once, under its owner's
 * name (5 tensors, no b.weight); a file with only the tied layer's name
 * loads it from there; a file with both names loads when they are equal
 * and is refused, naming both, when they differ. */
START_TEST(test_tie_safetensors)
{
	char dir[64], path[200], other[200];
	struct rig r, r2;
	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	struct kiln_param_info w;
	rig_open(&r2, TIE_LAYERS("", ""), 4, 12);
	rig_open(&r, tie_ini[0], 4, 12);
	for (int i = 0; i < 5; i++) {
		struct kiln_param_info pt, pu;
		float vt[84], vu[84];
		ck_assert(kiln_model_param_find(r.m, tie_params[i], &pt) == 0);
		ck_assert(kiln_model_param_find(r2.m, tie_params[i], &pu) == 0);
		size_t bytes = sizeof(float) * (size_t)kiln_tensor_numel(&pt.desc);
		TEST_D2H(&r, vt, pt.param, bytes);
		TEST_D2H(&r2, vu, pu.param, bytes);
		ck_assert_msg(!memcmp(vt, vu, bytes), "%s starts other than untied", tie_params[i]);
	}
	rig_close(&r2);
	rig_open(&r2, tie_ini[0], 4, 12);
	ck_assert(test_tmpdir_make(dir, sizeof dir, "tie") != NULL);
	snprintf(path, sizeof path, "%s/m.safetensors", dir);
	snprintf(other, sizeof other, "%s/o.safetensors", dir);
	ck_assert_msg(kiln_model_save_safetensors(r.m, path, r.stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_safetensors_open(path, &f) == 0);
	ck_assert_int_eq(kiln_safetensors_count(f), 5);
	ck_assert_int_eq(kiln_safetensors_find(f, "b.weight", &t), KILN_ENOTFOUND);
	ck_assert(kiln_safetensors_find(f, "a.weight", &t) == 0);
	float wa[84], wb[84], got[84];
	memcpy(wa, t.data, sizeof wa);
	for (int i = 0; i < 84; i++)
		wb[i] = wa[i] + 1.0f;
	/* the same tensors, with a.weight renamed b.weight, then with both names */
	const int64_t dims[2] = { 7, 12 };
	for (int v = 0; v < 3; v++) {
		struct kiln_safetensors_writer *wr;
		ck_assert(kiln_safetensors_writer_new(&wr) == 0);
		for (int j = 0; j < kiln_safetensors_count(f); j++) {
			kiln_safetensors_get(f, j, &t);
			int tied = !strcmp(t.name, "a.weight");
			if (!tied || v)
				ck_assert(kiln_safetensors_writer_add(wr, t.name, KILN_F32, t.ndim, t.dims,
								      t.data) == 0);
		}
		ck_assert(kiln_safetensors_writer_add(wr, "b.weight", KILN_F32, 2, dims,
						      v == 2 ? wb : wa) == 0);
		ck_assert(kiln_safetensors_writer_write(wr, other) == 0);
		kiln_safetensors_writer_free(wr);
		kiln_status st = kiln_model_load_safetensors(r2.m, other, 1, r2.stream);
		if (v == 2) {
			ck_assert_int_eq(st, KILN_ECONFIG);
			ck_assert_msg(strstr(kiln_last_error(), "b.weight differs from a.weight"), "%s",
				      kiln_last_error());
			continue;
		}
		ck_assert_msg(st == 0, "variant %d: %s", v, kiln_last_error());
		ck_assert(kiln_model_param_find(r2.m, "b.weight", &w) == 0);
		TEST_D2H(&r2, got, w.param, sizeof got);
		ck_assert_mem_eq(got, wa, sizeof got);
		/* the model's other tensor changed for the next variant to load */
		TEST_H2D(&r2, w.param, wb, sizeof wb);
	}
	kiln_safetensors_close(f);
	remove(path);
	remove(other);
	rmdir(dir);
	rig_close(&r2);
	rig_close(&r);
}
END_TEST

static Suite *make_train_suite(void)
{
	Suite *s = suite_create("train");
	check_add_case(s, "layers", 120, NULL, NULL, (const TTest *[]){
		test_fd_sync, test_fd_async, test_fd_cnn_nchw, test_fd_cnn_nhwc,
		test_conv_bias_rule, test_pytorch_mlp, test_arena_packing, test_frozen_layer,
		test_graph_errors, NULL });
	check_add_case(s, "tie", 120, NULL, NULL, (const TTest *[]){
		test_tie_pytorch, test_tie_errors, test_tie_safetensors, NULL });
	check_add_case(s, "e2e", 300, NULL, NULL, (const TTest *[]){
		test_mlp_2000, test_steady_state_async, test_cnn_e2e, test_loader_workers,
		test_accumulate, test_skip_nonfinite, test_result_size, test_struct_sizes,
		test_struct_ends, test_eval_every_early_stop, test_data_val, test_memory_report, test_inplace,
		test_recompute_nchw, test_recompute_nhwc, test_recompute_deep, test_memory_accounting,
		NULL });
	check_add_case(s, "api", 120, NULL, NULL, (const TTest *[]){
		test_result_early_failure, test_progress_calls, test_error_hook_early,
		test_error_hook_pairs, test_error_hook_waits, test_error_hook_cross, test_error_hook_fork, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_train_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
