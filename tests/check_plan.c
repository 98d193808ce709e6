/* tests/check_plan.c - what the planner gives the built-in layers and
 * keeps in its memory plan, on the CPU device (core/plan.c,
 * core/plan_memory.c):
 *
 *  - scratch: a conv's and a max pooling's backward reserve the scratch
 *    they add their input's gradient from only where that input has a
 *    second consumer (kiln_layer_dx_shared): the same layer's workspace
 *    is larger by the input's bytes (the pooling: exactly) in a model
 *    where another layer reads its input; and there every parameter
 *    gradient of the model, added through that scratch, agrees with
 *    central differences of the evaluation loss;
 *  - evaluation plans: conv, max pooling, batchnorm and linear layers
 *    prepare their forward alone (one device op each: no kept copies,
 *    no ReLU mask, no backward, no add), and no workspace for a gradient
 *    (less than the input's bytes), in both layouts (NCHW, NHWC: the
 *    linear reads channels-last through one reorder); so do layernorm,
 *    an activation, dropout, add and relu;
 *  - kiln_plan_check refuses a plan that still references a storage a
 *    merge emptied (the merges re-point every reference: a training
 *    plan whose loss writes the logits' gradient over the logits has an
 *    emptied storage and passes).
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include "graph.h"
#include "layers/util.h" /* struct layer_plans: the ops a layer prepared */
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static struct kiln_registry *reg;

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s", kiln_last_error())

enum { B = 4, C = 4, H = 8, W = 8 };

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
};

/* The model of `ini` for samples [C, H, W], parameters drawn (seed 5). */
static void rig_open(struct rig *r, const char *ini)
{
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	OK(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev));
	OK(kiln_device_stream_create(r->dev, &r->stream));
	const int64_t dims[3] = { C, H, W };
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 3, dims);
	OK(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m));
	OK(kiln_model_init_params(r->m, 5, r->stream));
	OK(kiln_model_optim_prepare(r->m, r->stream));
}

static void rig_close(struct rig *r)
{
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

static struct kiln_plan *plan(struct rig *r, int training)
{
	struct kiln_plan *p;
	OK(kiln_model_plan(r->m, B, training, &p));
	return p;
}

static int layer(const struct kiln_plan *p, const char *name)
{
	const int i = kiln_model_find_layer(p->m, p->m->n_layers, name);
	ck_assert_msg(i >= 0, "no layer %s", name);
	return i;
}

static size_t in_bytes(const struct kiln_plan *p, int i)
{
	return kiln_tensor_bytes(&p->nodes[i].l.in[0]);
}

/* ---- scratch only for a shared input's gradient ------------------------- */

/* c1 (a conv) and p (a max pooling) with one consumer of their input ... */
static const char *alone_ini =
	"[layer.c0]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
	"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
	"[layer.p]\ntype = maxpool\nkernel = 2\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n";
/* ... and the same layers where another reads their input too (c2 c0's,
 * q s1's): their backward may add into that gradient */
static const char *shared_ini =
	"[layer.c0]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
	"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
	"[layer.c2]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\ninputs = c0\n"
	"[layer.s1]\ntype = add\ninputs = c1, c2\n"
	"[layer.p]\ntype = maxpool\nkernel = 2\n"
	"[layer.q]\ntype = avgpool\nkernel = 2\ninputs = s1\n"
	"[layer.s2]\ntype = add\ninputs = p, q\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n";

/* the mean loss of plan p on x, y */
static double mean_loss(struct rig *r, struct kiln_plan *p, void *x, void *y, float *met)
{
	float z[2] = { 0, 0 };
	TEST_H2D(r, met, z, sizeof z);
	OK(kiln_plan_run(p, x, y, met, r->stream));
	TEST_D2H(r, z, met, sizeof z);
	return z[0] / B;
}

/* Every parameter gradient of r's model (one training pass on a fixed
 * batch) against central differences of the evaluation loss. */
static void gradients_agree(struct rig *r)
{
	struct kiln_plan *train = plan(r, 1), *eval = plan(r, 0);
	float hx[B * C * H * W], *met;
	int32_t hy[B] = { 0, 3, 7, 9 };
	void *x, *y;
	for (int i = 0; i < B * C * H * W; i++)
		hx[i] = test_hash_val((uint32_t)i, 3);
	OK(kiln_device_alloc(r->dev, sizeof hx, &x));
	OK(kiln_device_alloc(r->dev, sizeof hy, &y));
	OK(kiln_device_alloc(r->dev, 64, (void **)&met));
	TEST_H2D(r, x, hx, sizeof hx);
	TEST_H2D(r, y, hy, sizeof hy);
	mean_loss(r, train, x, y, met);
	int checked = 0;
	for (int pi = 0; pi < kiln_model_param_count(r->m); pi++) {
		struct kiln_param_info info;
		kiln_model_param_get(r->m, pi, &info);
		if (!info.grad)
			continue;
		const int64_t n = kiln_tensor_numel(&info.desc);
		float g[1024];
		ck_assert(n <= 1024);
		TEST_D2H(r, g, info.grad, sizeof(float) * (size_t)n);
		for (int64_t e = 0; e < n; e++) {
			const float eps = 1e-3f;
			float w, v;
			TEST_D2H(r, &w, (float *)info.param + e, sizeof w);
			v = w + eps;
			TEST_H2D(r, (float *)info.param + e, &v, sizeof v);
			const double lp = mean_loss(r, eval, x, y, met);
			v = w - eps;
			TEST_H2D(r, (float *)info.param + e, &v, sizeof v);
			const double lm = mean_loss(r, eval, x, y, met);
			TEST_H2D(r, (float *)info.param + e, &w, sizeof w);
			const double fd = (lp - lm) / (2.0 * eps);
			ck_assert_msg(fabs(fd - g[e]) <= 2e-3 + 2e-2 * fabs(fd),
				      "%s[%lld]: analytic %g, finite difference %g", info.name,
				      (long long)e, g[e], fd);
			checked++;
		}
	}
	ck_assert_int_gt(checked, 500);
	void *bufs[] = { x, y, met };
	test_rig_free_bufs(r->dev, r->stream, bufs, 3);
	kiln_plan_free(train);
	kiln_plan_free(eval);
}

START_TEST(test_scratch_shared)
{
	struct rig a, s;
	rig_open(&a, alone_ini);
	rig_open(&s, shared_ini);
	struct kiln_plan *pa = plan(&a, 1), *ps = plan(&s, 1);
	/* the max pooling: its workspace is the scratch and the ops' own */
	const int ia = layer(pa, "p"), is = layer(ps, "p");
	ck_assert_uint_eq(in_bytes(pa, ia), in_bytes(ps, is));
	ck_assert_msg(ps->nodes[is].ws == pa->nodes[ia].ws + ALIGN64(in_bytes(ps, is)),
		      "maxpool: workspace %zu with its input shared, %zu alone (want + %zu, the scratch)",
		      ps->nodes[is].ws, pa->nodes[ia].ws, ALIGN64(in_bytes(ps, is)));
	/* the conv: alone, the scratch holds at most the weight gradient
	 * (where the device cannot add into it: its bytes and the bias's) */
	const int ca = layer(pa, "c1"), cs = layer(ps, "c1");
	const size_t x = in_bytes(ps, cs), dw = ALIGN64(4 * 4 * 9 * 4) + 4 * 4;
	ck_assert_msg(ps->nodes[cs].ws <= pa->nodes[ca].ws + ALIGN64(x) &&
			      ps->nodes[cs].ws + ALIGN64(dw) >= pa->nodes[ca].ws + ALIGN64(x),
		      "conv: workspace %zu with its input shared, %zu alone (want + %zu, less at most %zu)",
		      ps->nodes[cs].ws, pa->nodes[ca].ws, ALIGN64(x), ALIGN64(dw));
	kiln_plan_free(pa);
	kiln_plan_free(ps);
	/* the adds through that scratch, and the writes without it */
	gradients_agree(&s);
	gradients_agree(&a);
	rig_close(&a);
	rig_close(&s);
}
END_TEST

/* ---- evaluation plans prepare the forward alone -------------------------- */

static const char *eval_ini =
	"[layer.c0]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n"
	"[layer.r0]\ntype = relu\n"
	"[layer.p]\ntype = maxpool\nkernel = 2\n"
	"[layer.bn]\ntype = batchnorm\n"
	"[layer.fc]\ntype = linear\nout = 32\n"
	"[layer.r1]\ntype = relu\n"
	"[layer.fc2]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n";

/* the elementwise and normalising layers of a transformer's MLP block */
static const char *eval_mlp_ini =
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 32\n"
	"[layer.ln]\ntype = layernorm\n"
	"[layer.g]\ntype = gelu\n"
	"[layer.drop]\ntype = dropout\np = 0.25\n"
	"[layer.res]\ntype = add\ninputs = drop, fc\n"
	"[layer.r]\ntype = relu\n"
	"[layer.fc2]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n";

static int ops_of(const struct kiln_plan *p, int i)
{
	return ((const struct layer_plans *)p->nodes[i].l.priv)->n;
}

START_TEST(test_eval_forward_only)
{
	char ini[1024];
	snprintf(ini, sizeof ini, "%s%s", eval_ini, _i ? "[model]\nlayout = nhwc\n" : "");
	struct rig r;
	rig_open(&r, ini);
	struct kiln_plan *e = plan(&r, 0), *t = plan(&r, 1);
	static const char *const names[] = { "c0", "p", "bn", "fc", "fc2" };
	for (int k = 0; k < 5; k++) {
		const int i = layer(e, names[k]), j = layer(t, names[k]);
		const struct plan_node *n = &e->nodes[i];
		/* the forward; its fused activation as an op of its own where
		 * the device takes none in the forward; the linear's reorder
		 * of a channels-last input */
		const int most = 1 + n->l.act_fused + (!strcmp(names[k], "fc") && _i);
		ck_assert_msg(ops_of(e, i) <= most,
			      "%s, %s: the evaluation plan prepared %d ops (the forward: at most %d; the training plan %d)",
			      names[k], _i ? "nhwc" : "nchw", ops_of(e, i), most, ops_of(t, j));
		ck_assert_msg(ops_of(t, j) > ops_of(e, i),
			      "%s: the training plan prepared no more ops than the evaluation plan", names[k]);
		ck_assert_msg(n->ws <= t->nodes[j].ws,
			      "%s, %s: the evaluation plan's workspace is %zu bytes, the training plan's %zu",
			      names[k], _i ? "nhwc" : "nchw", n->ws, t->nodes[j].ws);
		/* no buffer for a gradient (x's bytes) in the pooling's and the
		 * batchnorm's, whose forwards take next to none on the CPU (the
		 * conv's and the GEMMs' take more than their inputs) */
		ck_assert_msg((k != 1 && k != 2) || n->ws < in_bytes(e, i),
			      "%s, %s: the evaluation plan's workspace is %zu bytes, the input %zu",
			      names[k], _i ? "nhwc" : "nchw", n->ws, in_bytes(e, i));
	}
	kiln_plan_free(e);
	kiln_plan_free(t);
	rig_close(&r);
	/* layernorm, an activation, dropout, add and a ReLU of their own: the
	 * forward alone (the activation's op where the device fuses none;
	 * a view prepares nothing); layernorm's scratch its statistics */
	rig_open(&r, eval_mlp_ini);
	e = plan(&r, 0), t = plan(&r, 1);
	static const char *const mlp[] = { "ln", "g", "drop", "res", "r" };
	for (int k = 0; k < 5 && !_i; k++) {
		const int i = layer(e, mlp[k]), j = layer(t, mlp[k]);
		const struct plan_node *n = &e->nodes[i];
		const int most = n->l.is_view ? 0 : 1 + n->l.act_fused;
		ck_assert_msg(ops_of(e, i) <= most,
			      "%s: the evaluation plan prepared %d ops (the forward: at most %d; the training plan %d)",
			      mlp[k], ops_of(e, i), most, ops_of(t, j));
		ck_assert_msg(n->l.is_view || ops_of(t, j) > ops_of(e, i),
			      "%s: the training plan prepared no more ops than the evaluation plan", mlp[k]);
		ck_assert_msg(n->ws <= t->nodes[j].ws,
			      "%s: the evaluation plan's workspace is %zu bytes, the training plan's %zu",
			      mlp[k], n->ws, t->nodes[j].ws);
	}
	kiln_plan_free(e);
	kiln_plan_free(t);
	rig_close(&r);
}
END_TEST

/* ---- no reference to an emptied storage ---------------------------------- */

START_TEST(test_emptied_storage)
{
	struct rig r;
	rig_open(&r, "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
		     "[layer.loss]\ntype = softmax_xent\n");
	struct kiln_plan *p = plan(&r, 1);
	/* the loss writes the logits' gradient over the logits: fc's
	 * gradient storage merged into its output's, emptied */
	const int fc = layer(p, "fc");
	ck_assert_int_eq(p->nodes[fc].gstore, p->nodes[fc].ystore);
	int gone = -1;
	for (int i = 0; i < p->n_store && gone < 0; i++)
		if (!p->store[i].bytes)
			gone = i;
	ck_assert_msg(gone >= 0, "no storage was merged away");
	OK(kiln_plan_check(p));
	/* a reference left on it (as the merges left every one but the
	 * layers' gradients before session 21): refused, named */
	const int keep = p->nodes[fc].sstore;
	p->nodes[fc].sstore = gone;
	ck_assert_int_eq(kiln_plan_check(p), KILN_EINTERNAL);
	char want[128];
	snprintf(want, sizeof want, "saved state of layer 'fc' is storage %d, emptied by a merge", gone);
	ck_assert_msg(strstr(kiln_last_error(), want), "message: %s", kiln_last_error());
	p->nodes[fc].sstore = keep;
	const int dg = p->data_gstore;
	p->data_gstore = gone;
	ck_assert_int_eq(kiln_plan_check(p), KILN_EINTERNAL);
	ck_assert_msg(strstr(kiln_last_error(), "the data input's gradient is storage"), "message: %s",
		      kiln_last_error());
	p->data_gstore = dg;
	OK(kiln_plan_check(p));
	kiln_plan_free(p);
	rig_close(&r);
}
END_TEST

static Suite *make_plan_suite(void)
{
	Suite *s = suite_create("plan");
	check_add_case(s, "scratch", 120, NULL, NULL, (const TTest *[]){ test_scratch_shared, NULL });
	TCase *tc = tcase_create("eval");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_eval_forward_only, 0, 2);
	suite_add_tcase(s, tc);
	check_add_case(s, "check", 60, NULL, NULL, (const TTest *[]){ test_emptied_storage, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_plan_suite, .reg = &reg,
					       .need_cpu = 1 };
