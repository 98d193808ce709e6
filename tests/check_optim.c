/* tests/check_optim.c - the fused optimizers (KILN_OP_SGD, _ADAMW, _LAMB;
 * adam is _ADAMW with its L2 weight decay f[4]):
 * 5 steps of every [train] optimizer variant (20 of SGD's dampening and
 * of amsgrad) through the model API against
 * PyTorch (tests/data/optim_refs.safetensors, gen_optim_refs.py), amsgrad's
 * compute copy (a CAST after the op) under bf16, LAMB's
 * per-tensor norms over a large buffer against a double-precision loop and
 * across thread counts, the training-state accessor, config errors, and an
 * MLP trained with adamw and with lamb on Fashion-MNIST. */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h" /* kiln_model_state_buffers */

static struct kiln_registry *reg;

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s", kiln_last_error())

/* ---- the reference file ------------------------------------------------ */

/* read with the core's safetensors reader */
struct st_file {
	struct kiln_safetensors *f;
};

static void st_open(struct st_file *f, const char *name)
{
	char path[4096];
	const char *srcdir = getenv("srcdir");
	snprintf(path, sizeof path, "%s/tests/data/%s", srcdir ? srcdir : ".", name);
	ck_assert_msg(kiln_safetensors_open(path, &f->f) == KILN_OK, "%s", kiln_last_error());
}

static void st_close(struct st_file *f)
{
	kiln_safetensors_close(f->f);
}

/* f32 tensor `name` and its element count. */
static const float *st_get(struct st_file *f, const char *name, int64_t *numel)
{
	struct kiln_safetensors_tensor t;
	ck_assert_msg(kiln_safetensors_find(f->f, name, &t) == KILN_OK, "reference has no tensor %s",
		      name);
	ck_assert_int_eq(t.dtype, KILN_F32);
	*numel = t.numel;
	return t.data;
}

static const char *st_meta(struct st_file *f, const char *key)
{
	const char *v = kiln_safetensors_meta(f->f, key);
	ck_assert_msg(v != NULL, "reference has no metadata %s", key);
	return v;
}

/* max |a - ref| / max |ref| */
static double max_rel(const float *a, const float *ref, int64_t n)
{
	double scale = 0, err = 0;
	for (int64_t i = 0; i < n; i++) {
		if (fabs(ref[i]) > scale)
			scale = fabs(ref[i]);
		if (fabs((double)a[i] - ref[i]) > err)
			err = fabs((double)a[i] - ref[i]);
	}
	return scale > 0 ? err / scale : err;
}

/* ---- a model around the reference's three tensors ---------------------- */

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	float *lr;
};

static void rig_open(struct rig *r, const char *ini, int64_t in)
{
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	OK(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev));
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	OK(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m));
	OK(kiln_device_stream_create(r->dev, &r->stream));
	OK(kiln_model_init_params(r->m, 1, r->stream));
	OK(kiln_model_optim_prepare(r->m, r->stream));
	OK(kiln_device_alloc(r->dev, 64, (void **)&r->lr));
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->lr };
	test_rig_free_bufs(r->dev, r->stream, bufs, 1);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* ---- against PyTorch ---------------------------------------------------- */

#define N_CASES 13 /* gen_optim_refs.py's CASES */

/* Case _i / 2 of the reference, on the sync (even) or async (odd) device:
 * set the parameters, then per step write the gradients and the lr into
 * device memory and take one optimizer step; compare every parameter
 * after every step to 1e-5 relative. */
START_TEST(test_pytorch)
{
	struct st_file f;
	st_open(&f, "optim_refs.safetensors");
	char names[256], cases[512], ini[4096], key[256];
	snprintf(names, sizeof names, "%s", st_meta(&f, "params"));
	snprintf(cases, sizeof cases, "%s", st_meta(&f, "cases"));
	const char *cs[N_CASES + 1], *ps[8];
	int nc = 0, np = 0;
	char *save = NULL;
	for (char *t = strtok_r(cases, ",", &save); t && nc <= N_CASES; t = strtok_r(NULL, ",", &save))
		cs[nc++] = t;
	ck_assert_int_eq(nc, N_CASES);
	for (char *t = strtok_r(names, ",", &save); t && np < 8; t = strtok_r(NULL, ",", &save))
		ps[np++] = t;
	const char *c = cs[_i / 2];
	const int async = _i % 2;
	snprintf(key, sizeof key, "%s.steps", c);
	const int steps = atoi(st_meta(&f, key));
	snprintf(key, sizeof key, "%s.ini", c);
	snprintf(ini, sizeof ini, "%s%s[plugin.cpu]\nasync = %d\n", st_meta(&f, "model.ini"),
		 st_meta(&f, key), async);
	struct rig r;
	rig_open(&r, ini, atoi(st_meta(&f, "sample")));
	int64_t n;
	for (int p = 0; p < np; p++) {
		struct kiln_param_info info;
		snprintf(key, sizeof key, "init/%s", ps[p]);
		const float *v = st_get(&f, key, &n);
		OK(kiln_model_param_find(r.m, ps[p], &info));
		ck_assert_int_eq(n, kiln_tensor_numel(&info.desc));
		TEST_H2D(&r, info.param, v, sizeof(float) * (size_t)n);
	}
	snprintf(key, sizeof key, "%s.lr", c);
	const char *lrs = st_meta(&f, key);
	double worst = 0;
	for (int k = 0; k < steps; k++) {
		char *end;
		float lr = strtof(lrs, &end);
		ck_assert_msg(end != lrs, "%s: %d lrs for %d steps", c, k, steps);
		lrs = end;
		TEST_H2D(&r, r.lr, &lr, sizeof lr);
		for (int p = 0; p < np; p++) {
			struct kiln_param_info info;
			snprintf(key, sizeof key, "grad%d/%s", k, ps[p]);
			const float *g = st_get(&f, key, &n);
			OK(kiln_model_param_find(r.m, ps[p], &info));
			TEST_H2D(&r, info.grad, g, sizeof(float) * (size_t)n);
		}
		/* the same prepared step every time: lr and the step count
		 * are read from device memory */
		OK(kiln_model_optim_step(r.m, r.lr, r.stream));
		for (int p = 0; p < np; p++) {
			struct kiln_param_info info;
			float got[64];
			snprintf(key, sizeof key, "%s/step%d/%s", c, k, ps[p]);
			const float *ref = st_get(&f, key, &n);
			ck_assert_int_le(n, 64);
			OK(kiln_model_param_find(r.m, ps[p], &info));
			TEST_D2H(&r, got, info.param, sizeof(float) * (size_t)n);
			double e = max_rel(got, ref, n);
			ck_assert_msg(e <= 1e-5, "%s step %d %s: relative error %.3g", c, k, ps[p], e);
			if (e > worst)
				worst = e;
		}
	}
	/* the optimizer's step count advanced once per step */
	struct kiln_state_buf sb[8];
	int ns = kiln_model_state_buffers(r.m, sb, 8), found = 0;
	for (int i = 0; i < ns; i++)
		if (!strcmp(sb[i].name, "optim.step")) {
			int64_t t;
			TEST_D2H(&r, &t, sb[i].ptr, sizeof t);
			ck_assert_int_eq(t, steps);
			found = 1;
		}
	ck_assert(found);
	printf("check_optim: %-14s %-5s max relative error vs PyTorch %.2e\n", c,
	       async ? "async" : "sync", worst);
	rig_close(&r);
	st_close(&f);
}
END_TEST

/* ---- LAMB's norms over a large buffer ---------------------------------- */

struct lamb_run {
	float w[100003], m[100003], v[100003];
};

/* One LAMB step with the device op (threads = [run] threads) from fixed
 * params, grads and moments, into *out. */
static void lamb_device(int threads, const int64_t *off, int T, const float *w0, const float *g,
			const float *d, const float *m0, const float *v0, float lr, int64_t t,
			struct lamb_run *out)
{
	const int64_t n = off[T], one = 1, t1 = T + 1;
	char ini[256];
	snprintf(ini, sizeof ini, "[run]\nthreads = %d\n%s", threads,
		 "[layer.a]\ntype = linear\nout = 2\n[layer.loss]\ntype = softmax_xent\n");
	struct kiln_config *cfg = test_config(reg, ini);
	struct kiln_device *dev;
	void *s, *plan, *ws = NULL, *dw, *dm, *dv, *dg, *dd, *dlr, *dt, *doff;
	size_t wsb = 0, b = (size_t)n * 4;
	OK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	OK(kiln_device_stream_create(dev, &s));
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_LAMB;
	op.n_in = 5;
	op.n_out = 3;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, &one);
	kiln_tensor_desc_init(&op.in[2], KILN_I64, 1, &one);
	kiln_tensor_desc_init(&op.in[3], KILN_I64, 1, &t1);
	op.in[4] = op.out[0] = op.out[1] = op.out[2] = op.in[0];
	op.i[0] = n;
	op.f[0] = 0.9, op.f[1] = 0.999, op.f[2] = 1e-8, op.f[3] = 0.01;
	OK(kiln_device_prepare(dev, &op, &plan, &wsb));
	ck_assert_uint_gt(wsb, 0);
	OK(kiln_device_alloc(dev, wsb, &ws));
	OK(kiln_device_alloc(dev, b, &dw));
	OK(kiln_device_alloc(dev, b, &dm));
	OK(kiln_device_alloc(dev, b, &dv));
	OK(kiln_device_alloc(dev, b, &dg));
	OK(kiln_device_alloc(dev, b, &dd));
	OK(kiln_device_alloc(dev, 64, &dlr));
	OK(kiln_device_alloc(dev, 64, &dt));
	OK(kiln_device_alloc(dev, (size_t)t1 * 8, &doff));
	struct { void *dst; const void *src; size_t bytes; } up[] = {
		{ dw, w0, b }, { dm, m0, b }, { dv, v0, b }, { dg, g, b }, { dd, d, b },
		{ dlr, &lr, 4 }, { dt, &t, 8 }, { doff, off, (size_t)t1 * 8 },
	};
	for (size_t i = 0; i < sizeof up / sizeof *up; i++)
		OK(kiln_device_copy_async(dev, up[i].dst, up[i].src, up[i].bytes, KILN_COPY_H2D, s));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dg, a.in[1] = dlr, a.in[2] = dt, a.in[3] = doff, a.in[4] = dd;
	a.out[0] = dw, a.out[1] = dm, a.out[2] = dv;
	/* without its workspace the run is refused */
	ck_assert_int_eq(kiln_device_run(dev, plan, &a, s), KILN_EINVAL);
	a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(dev, plan, &a, s));
	OK(kiln_device_copy_async(dev, out->w, dw, b, KILN_COPY_D2H, s));
	OK(kiln_device_copy_async(dev, out->m, dm, b, KILN_COPY_D2H, s));
	OK(kiln_device_copy_async(dev, out->v, dv, b, KILN_COPY_D2H, s));
	OK(kiln_device_stream_sync(dev, s));
	void *bufs[] = { ws, dw, dm, dv, dg, dd, dlr, dt, doff };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(dev, bufs[i]);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, s);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

/* 100003 elements in tensors of 5, 39995, 1, 0 and 60002 elements (cut
 * across the kernel's 16384-element pieces), weight decay off for the
 * one-element tensor and for the 5-element one, which starts at zero
 * (||p|| = 0: ratio 1).  Results agree with a double-precision loop and
 * are bit-identical for 1 and 3 threads. */
START_TEST(test_lamb_large)
{
	enum { T = 5 };
	static const int64_t off[T + 1] = { 0, 5, 40000, 40001, 40001, 100003 };
	const int64_t n = off[T];
	const float lr = 0.02f;
	const int64_t t = 2;
	const size_t b = (size_t)n * 4;
	float *w0 = malloc(b), *g = malloc(b), *d = malloc(b), *m0 = malloc(b), *v0 = malloc(b);
	for (int64_t i = 0; i < n; i++) {
		w0[i] = i < 5 ? 0.0f : (float)sin(0.37 * (double)i) * 0.8f;
		g[i] = (float)cos(1.3 * (double)i + 0.2) * 0.05f;
		d[i] = i < 5 || i == 40000 ? 0.0f : 1.0f;
		/* moments as if a step had been taken */
		m0[i] = 0.1f * (float)sin(0.11 * (double)i) * 0.05f;
		v0[i] = 0.001f * (float)(1.0 + cos(0.05 * (double)i)) * 0.002f;
	}
	struct lamb_run *r1 = malloc(sizeof *r1), *r3 = malloc(sizeof *r3);
	lamb_device(1, off, T, w0, g, d, m0, v0, lr, t, r1);
	lamb_device(3, off, T, w0, g, d, m0, v0, lr, t, r3);
	ck_assert_msg(!memcmp(r1, r3, sizeof *r1), "LAMB differs between 1 and 3 threads");
	/* the reference, in double */
	const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
	const double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);
	double worst = 0;
	for (int k = 0; k < T; k++) {
		const int64_t lo = off[k], e = off[k + 1];
		double pp = 0, uu = 0, scale = 0, err = 0;
		double *u = malloc(sizeof(double) * (size_t)(e - lo + 1));
		for (int64_t i = lo; i < e; i++) {
			double gi = g[i];
			double mi = b1 * m0[i] + (1 - b1) * gi;
			double vi = b2 * v0[i] + (1 - b2) * gi * gi;
			u[i - lo] = (mi / c1) / (sqrt(vi / c2) + eps) + wd * d[i] * w0[i];
			pp += (double)w0[i] * w0[i];
			uu += u[i - lo] * u[i - lo];
		}
		double ratio = pp > 0 && uu > 0 ? sqrt(pp) / sqrt(uu) : 1.0;
		for (int64_t i = lo; i < e; i++) {
			double want = w0[i] - lr * ratio * u[i - lo];
			if (fabs(want) > scale)
				scale = fabs(want);
			if (fabs(want - r1->w[i]) > err)
				err = fabs(want - r1->w[i]);
		}
		double rel = e == lo ? 0 : err / scale;
		ck_assert_msg(rel <= 1e-5, "tensor %d [%lld, %lld): relative error %g", k, (long long)lo,
			      (long long)e, rel);
		if (rel > worst)
			worst = rel;
		free(u);
	}
	printf("check_optim: LAMB 100003 elements, 5 tensors: max relative error vs double %.2e\n",
	       worst);
	free(w0), free(g), free(d), free(m0), free(v0), free(r1), free(r3);
}
END_TEST

/* ---- the training-state accessor and config errors ------------------- */

START_TEST(test_state_buffers)
{
	static const struct {
		const char *train;
		const char *names;
	} cases[] = {
		{ "optimizer = sgd\nmomentum = 0\n", "params,buffers,step,optim.step" },
		{ "optimizer = sgd\n", "params,buffers,optim.momentum,step,optim.step" },
		{ "optimizer = adamw\n", "params,buffers,optim.exp_avg,optim.exp_avg_sq,step,optim.step" },
		{ "optimizer = adam\nweight_decay = 0.01\n",
		  "params,buffers,optim.exp_avg,optim.exp_avg_sq,step,optim.step" },
		{ "optimizer = lamb\nno_decay = *.bias, bn*\n",
		  "params,buffers,optim.exp_avg,optim.exp_avg_sq,step,optim.step" },
		/* session 43: amsgrad's third slot under PyTorch's name; a
		 * dampening keeps the one momentum buffer */
		{ "optimizer = adamw\namsgrad = 1\n",
		  "params,buffers,optim.exp_avg,optim.exp_avg_sq,optim.max_exp_avg_sq,step,optim.step" },
		{ "optimizer = adam\namsgrad = 1\nweight_decay = 0.01\n",
		  "params,buffers,optim.exp_avg,optim.exp_avg_sq,optim.max_exp_avg_sq,step,optim.step" },
		{ "optimizer = sgd\ndampening = 0.5\n", "params,buffers,optim.momentum,step,optim.step" },
		/* lamb never reads amsgrad (warned ignored): two slots */
		{ "optimizer = lamb\namsgrad = 1\n",
		  "params,buffers,optim.exp_avg,optim.exp_avg_sq,step,optim.step" },
	};
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		char ini[1024], got[512] = "";
		snprintf(ini, sizeof ini,
			 "[layer.fc]\ntype = linear\nout = 4\n[layer.bn]\ntype = batchnorm\n"
			 "[layer.loss]\ntype = softmax_xent\n[train]\n%s",
			 cases[c].train);
		struct rig r;
		rig_open(&r, ini, 3);
		struct kiln_state_buf sb[8];
		ck_assert_int_eq(kiln_model_state_buffers(r.m, NULL, 0),
				 kiln_model_state_buffers(r.m, sb, 8));
		int n = kiln_model_state_buffers(r.m, sb, 8);
		size_t tr = 0;
		for (int i = 0; i < kiln_model_param_count(r.m); i++) {
			struct kiln_param_info p;
			kiln_model_param_get(r.m, i, &p);
			tr += p.trainable ? 16 : 0; /* each of the 4 tensors pads to 16 floats */
		}
		for (int i = 0; i < n; i++) {
			snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? "," : "",
				 sb[i].name);
			ck_assert_ptr_nonnull(sb[i].ptr);
			if (!strncmp(sb[i].name, "optim.", 6) && strcmp(sb[i].name, "optim.step"))
				ck_assert_uint_eq(sb[i].bytes, tr * sizeof(float));
			if (!strcmp(sb[i].name, "step") || !strcmp(sb[i].name, "optim.step"))
				ck_assert_uint_eq(sb[i].bytes, 8);
		}
		ck_assert_str_eq(got, cases[c].names);
		/* the optimizer state starts at zero */
		for (int i = 0; i < n; i++)
			if (!strncmp(sb[i].name, "optim.", 6)) {
				char *h = malloc(sb[i].bytes), *z = calloc(1, sb[i].bytes);
				TEST_D2H(&r, h, sb[i].ptr, sb[i].bytes);
				ck_assert_msg(!memcmp(h, z, sb[i].bytes), "%s is not zero", sb[i].name);
				free(h), free(z);
			}
		rig_close(&r);
	}
}
END_TEST

START_TEST(test_config_errors)
{
	static const struct { const char *train, *want; } cases[] = {
		{ "optimizer = adamw\nbeta1 = 1\n", "beta1" },
		{ "optimizer = lamb\nbeta2 = 1.0\n", "beta2" },
		{ "optimizer = adamw\nweight_decay_mode = l2\n", "applies to sgd only" },
		{ "optimizer = adam\nweight_decay_mode = decoupled\n", "is `optimizer = adamw`" },
		{ "optimizer = sgd\nnesterov = 1\ndampening = 0.1\n",
		  "Nesterov momentum needs dampening 0" },
	};
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		char ini[512];
		snprintf(ini, sizeof ini, "[layer.fc]\ntype = linear\nout = 4\n"
			 "[layer.loss]\ntype = softmax_xent\n[train]\n%s", cases[c].train);
		struct kiln_config *cfg = test_config(reg, ini);
		struct kiln_device *dev;
		struct kiln_model *m;
		int64_t in = 3;
		struct kiln_tensor_desc sample;
		kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
		OK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
		ck_assert_int_eq(kiln_model_create(cfg, reg, dev, &sample, &m), KILN_ECONFIG);
		ck_assert_msg(strstr(kiln_last_error(), cases[c].want) &&
				      strstr(kiln_last_error(), "test.ini:"),
			      "case %zu: %s", c, kiln_last_error());
		kiln_device_close(dev);
		kiln_config_free(cfg);
	}
	/* an unknown optimizer is a config error naming the choices, adam
	 * and adamw both (one name inside the other) */
	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string("[layer.fc]\ntype = linear\nout = 4\n[train]\noptimizer = adamax\n",
					  "test.ini", &cfg) == KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "sgd, adam, adamw, lamb"), "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* ---- amsgrad's compute copy ---------------------------------------------- */

/* f32 -> bf16, nearest even (finite values) */
static uint16_t bf16_of(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* f32 -> f16, nearest even (finite values below 65520) */
static uint16_t f16_of(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	const float a = fabsf(x);
	if (a < 6.103515625e-05f) /* subnormal: whole units of 2^-24 */
		return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
	memcpy(&u, &a, 4);
	u = (u + 0xfffu + ((u >> 13) & 1)) >> 13; /* the carry may raise the exponent */
	return (uint16_t)(sign | (uint16_t)(u - (112u << 10)));
}

/* Adam (_i & 1 = 0) and AdamW (1) with amsgrad under bf16 (_i & 2 = 0)
 * and f16 compute: the op's outputs (params, m, v, vmax) leave no room
 * for the compute copy, which a CAST after it writes
 * (core/optim/fused.c).  After every step the copy is the params rounded
 * to the compute type (without the CAST it would keep the values it was
 * first cast from).  The steps are gated by a finite flag, as a trainer
 * with skip_nonfinite gates them: step 2 has an infinite gradient and a
 * flag of 0, and leaves the params, the four state tensors and the copy
 * as they were. */
START_TEST(test_amsgrad_copy)
{
	const int f16 = (_i & 2) != 0;
	char ini[1024];
	snprintf(ini, sizeof ini,
		 "[layer.fc1]\ntype = linear\nout = 8\n[layer.r]\ntype = relu\n"
		 "[layer.fc2]\ntype = linear\nout = 3\n[layer.loss]\ntype = softmax_xent\n"
		 "[train]\noptimizer = %s\namsgrad = 1\nweight_decay = 0.01\nlr = 0.01\n",
		 _i & 1 ? "adamw" : "adam");
	struct rig r;
	memset(&r, 0, sizeof r);
	r.cfg = test_config(reg, ini);
	OK(kiln_device_open(reg, r.cfg, "cpu", 0, &r.dev));
	struct kiln_tensor_desc sample;
	int64_t in = 6;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	OK(kiln_model_create(r.cfg, reg, r.dev, &sample, &r.m));
	OK(kiln_model_set_compute_dtype(r.m, f16 ? KILN_F16 : KILN_BF16));
	OK(kiln_device_stream_create(r.dev, &r.stream));
	OK(kiln_model_init_params(r.m, 1, r.stream));
	float *gate;
	OK(kiln_device_alloc(r.dev, 64, (void **)&gate));
	r.m->step_ok_d = gate; /* (before the plans, which read it) */
	OK(kiln_model_optim_prepare(r.m, r.stream));
	OK(kiln_device_alloc(r.dev, 64, (void **)&r.lr));
	const float lr = 0.01f;
	TEST_H2D(&r, r.lr, &lr, sizeof lr);
	const size_t n = r.m->n_trainable, sb = 4 * n * 4;
	float *w = malloc(n * 4), *g = malloc(n * 4), *w0 = malloc(n * 4);
	float *st = malloc(sb), *st0 = malloc(sb);
	uint16_t *c = malloc(n * 2), *c0 = malloc(n * 2);
	ck_assert_ptr_nonnull(r.m->params_c);
	ck_assert_int_eq(r.m->state_slots, 3);
	for (int step = 0; step < 5; step++) {
		const float ok = step != 2;
		for (size_t i = 0; i < n; i++)
			g[i] = 0.1f * (float)sin(0.7 * (double)(i + 13 * step));
		if (!ok)
			g[n / 2] = INFINITY;
		TEST_H2D(&r, r.m->grads_d, g, n * 4);
		TEST_H2D(&r, gate, &ok, sizeof ok);
		OK(kiln_model_optim_step(r.m, r.lr, r.stream));
		TEST_D2H(&r, w, r.m->params_d, n * 4);
		TEST_D2H(&r, c, r.m->params_c, n * 2);
		TEST_D2H(&r, st, r.m->state_d, 3 * n * 4);
		for (size_t i = 0; i < n; i++) {
			const uint16_t want = f16 ? f16_of(w[i]) : bf16_of(w[i]);
			ck_assert_msg(c[i] == want, "%s, step %d: copy[%zu] = 0x%04x, params %.9g round to 0x%04x",
				      f16 ? "f16" : "bf16", step, i, c[i], w[i], want);
		}
		if (!ok) {
			ck_assert_msg(!memcmp(w, w0, n * 4), "the gated-off step moved the params");
			ck_assert_msg(!memcmp(st, st0, 3 * n * 4), "the gated-off step moved the state");
			ck_assert_msg(!memcmp(c, c0, n * 2), "the gated-off step moved the copy");
		} else {
			ck_assert_msg(memcmp(w, w0, n * 4), "step %d left the params", step);
		}
		memcpy(w0, w, n * 4), memcpy(st0, st, 3 * n * 4), memcpy(c0, c, n * 2);
	}
	free(w), free(g), free(w0), free(st), free(st0), free(c), free(c0);
	kiln_device_free(r.dev, gate);
	rig_close(&r);
}
END_TEST

/* ---- end to end ---------------------------------------------------------- */

/* The MLP of check_train's test_mlp_2000 with adamw (_i = 0) and lamb
 * (_i = 1), biases excluded from weight decay: the training loss falls
 * below 0.45 in 5 epochs of 2,000 samples and the held-out accuracy
 * reaches 80%. */
START_TEST(test_mlp_adaptive)
{
	static const char *const opt[2] = { "adamw\nlr = 0.002", "lamb\nlr = 0.005" };
	char ini[2048];
	TEST_REQUIRE_FASHION();
	snprintf(ini, sizeof ini,
		 "[run]\nseed = 3\nout_dir =\n"
		 "[data]\nsource = idx\nlimit = 2000\nmean = 0.286\nstd = 0.353\n"
		 "[data.eval]\nlimit = 2000\n"
		 "[layer.flat]\ntype = flatten\n"
		 "[layer.fc1]\ntype = linear\nout = 256\n[layer.r1]\ntype = relu\n"
		 "[layer.fc2]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
		 "[train]\nepochs = 5\nbatch = 32\nlog_every = 20\neval_batch = 500\n"
		 "weight_decay = 0.01\nno_decay = *.bias\noptimizer = %s\n"
		 "[plugin.cpu]\nasync = 1\n",
		 opt[_i]);
	struct kiln_config *cfg = test_config(reg, ini);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	OK(kiln_train(cfg, reg, NULL, NULL, &res));
	printf("check_optim: MLP with %s: train loss %.4f, test accuracy %.4f\n",
	       _i ? "lamb" : "adamw", res.train_loss, res.test_acc);
	ck_assert_msg(res.train_loss < 0.45, "train loss %.4f", res.train_loss);
	ck_assert_msg(res.test_acc >= 0.80, "test accuracy %.4f < 0.80", res.test_acc);
	/* the optimizer still never syncs with the host inside a step */
	ck_assert_uint_eq(res.steady.host_syncs, 0);
	ck_assert_uint_eq(res.steady.allocs, 0);
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_optim_suite(void)
{
	Suite *s = suite_create("optim");
	TCase *tc = tcase_create("ops");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_pytorch, 0, 2 * N_CASES);
	tcase_add_test(tc, test_lamb_large);
	tcase_add_test(tc, test_state_buffers);
	tcase_add_test(tc, test_config_errors);
	tcase_add_loop_test(tc, test_amsgrad_copy, 0, 4);
	suite_add_tcase(s, tc);
	tc = tcase_create("e2e");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_mlp_adaptive, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_optim_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
