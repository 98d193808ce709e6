/* tests/check_infer_passes.c - the inference graph passes (core/
 * infer_passes.c, docs/inference.md "Folding"): for every layer pair that
 * folds or fuses (conv+bn, conv+bn+relu, conv with bias+bn, grouped
 * conv+bn, linear+bn, linear+bn+relu, linear+relu, conv+relu, dropout,
 * a residual block's bn before an add), the folded model's logits equal
 * the unfolded evaluation's to float tolerance, on MLP, CNN and ResNet
 * shaped models (random weights and random batchnorm statistics, so no
 * fold is the identity), in both layouts.  Also: the folded config has
 * no batchnorm or dropout left, and the folded weights differ from the
 * unfolded ones.  With KILN_FOLD_RESIDUAL (kiln_infer_fold_config_ex) the
 * residual adds go into the convs that feed them (conv + add + ReLU as
 * one op, KILN_OPF_RESIDUAL): no add is left, and the logits still equal
 * the unfolded ones, in NHWC (the op's epilogue on the CPU) and NCHW
 * (where the CPU refuses it: the CONV, ADD and ACT of the fallback).
 * A layer that refuses the device's layout (a layernorm on a 4-d tensor,
 * nhwc) keeps the folded model in the layout it trained in.
 * And the C API's refusals of NULL arguments and of an image without its
 * pixels (KILN_EINVAL with a message, not a crash), and of bad INT8 files
 * and arguments (api_int8_files); an INT8 model's bytes read once
 * (api_int8_read_once). */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include "proc_io.h" /* proc_bytes_read */
#include "infer_passes.h"
#include "internal.h" /* kiln_safetensors_writer_crc */
#include <kiln/infer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct kiln_registry *reg;

#define B 4

/* [run]/[data]/[model] for a 1x12x12 sample, then the layers */
static const char head[] = "[run]\ndevice = cpu\nseed = 3\nfuse = 0\n[data]\nsource = synthetic\n"
			   "[model]\nlayout = %s\n";

/* MLP: linear+bn+relu, linear+bn, dropout, linear+relu */
static const char mlp[] =
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 24\n[layer.bn1]\ntype = batchnorm\n[layer.r1]\ntype = relu\n"
	"[layer.drop]\ntype = dropout\np = 0.3\n"
	"[layer.fc2]\ntype = linear\nout = 16\nbias = 0\n[layer.bn2]\ntype = batchnorm\neps = 0.01\n"
	"[layer.fc3]\ntype = linear\nout = 12\n[layer.r3]\ntype = relu\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

/* CNN: conv+bn+relu, conv (bias) + bn, grouped conv + bn + relu, conv+relu,
 * pooling, linear+bn+relu, dropout */
static const char cnn[] =
	"[layer.c1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.b1]\ntype = batchnorm\n"
	"[layer.r1]\ntype = relu\n"
	"[layer.c2]\ntype = conv\nout = 8\nkernel = 3\nbias = 1\n[layer.b2]\ntype = batchnorm\n"
	"[layer.c3]\ntype = conv\nout = 8\nkernel = 3\ngroups = 2\npadding = 1\n[layer.b3]\ntype = batchnorm\n"
	"[layer.r3]\ntype = relu\n"
	"[layer.c4]\ntype = conv\nout = 8\nkernel = 1\n[layer.r4]\ntype = relu\n"
	"[layer.pool]\ntype = maxpool\nkernel = 2\n[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 16\n[layer.fb]\ntype = batchnorm\n[layer.fr]\ntype = relu\n"
	"[layer.drop]\ntype = dropout\np = 0.4\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

/* ResNet: stem conv+bn+relu, a basic block with a strided conv + bn
 * shortcut, bn before the add, global pooling */
static const char resnet[] =
	"[layer.stem]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.stem_bn]\ntype = batchnorm\n"
	"[layer.stem_relu]\ntype = relu\n"
	"[layer.a1]\ntype = conv\nout = 16\nkernel = 3\nstride = 2\npadding = 1\n"
	"[layer.a1_bn]\ntype = batchnorm\n[layer.a1_relu]\ntype = relu\n"
	"[layer.a2]\ntype = conv\nout = 16\nkernel = 3\npadding = 1\n[layer.a2_bn]\ntype = batchnorm\n"
	"[layer.down]\ntype = conv\nout = 16\nkernel = 1\nstride = 2\ninput = stem_relu\n"
	"[layer.down_bn]\ntype = batchnorm\n"
	"[layer.add]\ntype = add\ninputs = a2_bn, down_bn\n[layer.out]\ntype = relu\n"
	"[layer.gap]\ntype = global_avgpool\n[layer.flat]\ntype = flatten\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	float *x, *metrics; /* device */
	int32_t *y;
};

static void rig_open(struct rig *r, struct kiln_config *cfg)
{
	const int64_t dims[3] = { 1, 12, 12 };
	struct kiln_tensor_desc sample;
	memset(r, 0, sizeof *r);
	r->cfg = cfg;
	kiln_tensor_desc_init(&sample, KILN_F32, 3, dims);
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &r->dev) == 0);
	ck_assert_msg(kiln_model_create(cfg, reg, r->dev, &sample, &r->m) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert(kiln_model_init_params(r->m, 7, r->stream) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(float) * B * 144, (void **)&r->x) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof(int32_t) * B, (void **)&r->y) == 0);
	ck_assert(kiln_device_alloc(r->dev, 64, (void **)&r->metrics) == 0);
}

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->x, r->y, r->metrics };
	test_rig_free_bufs(r->dev, r->stream, bufs, 3);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* A deterministic value in [-1, 1) from (i, salt). */
static float noise(uint32_t i, uint32_t salt)
{
	uint32_t h = (i + 1) * 2654435761u ^ salt * 40503u;
	h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
	return (float)(h % 20001) / 10000.0f - 1.0f;
}

/* Every batchnorm's gamma, beta and running statistics random (the
 * variance in [0.2, 2.2)), so every fold scales and shifts. */
static void randomize_bn(struct rig *r)
{
	for (int i = 0; i < kiln_model_param_count(r->m); i++) {
		struct kiln_param_info pi;
		kiln_model_param_get(r->m, i, &pi);
		const char *s = strrchr(pi.name, '.') + 1;
		int64_t n = kiln_tensor_numel(&pi.desc);
		float *h = malloc(sizeof(float) * (size_t)n);
		TEST_D2H(r, h, pi.param, sizeof(float) * (size_t)n);
		for (int64_t e = 0; e < n; e++) {
			float v = noise((uint32_t)e, (uint32_t)i);
			if (!strcmp(s, "running_var"))
				h[e] = 1.2f + v;
			else if (pi.desc.ndim == 1) /* gamma, beta, running_mean, biases */
				h[e] = (!strcmp(s, "weight") ? 1.0f : 0.0f) + 0.5f * v;
		}
		TEST_H2D(r, pi.param, h, sizeof(float) * (size_t)n);
		free(h);
	}
}

/* The logits (layer "logits") of a forward of x[B][144]: host f32[B*10];
 * infer: through an inference plan (kiln_infer's: the activations fused
 * into their layers' epilogues, which a keep_all plan never does), else a
 * keep_all one. */
static void logits_of(struct rig *r, const float *x, float *out, int infer)
{
	struct kiln_plan *p;
	struct kiln_plan_opts o = { .keep_all = !infer, .logits = infer };
	int32_t y[B] = { 0 };
	void *yp;
	struct kiln_tensor_desc d;
	ck_assert_msg(kiln_model_plan_ex(r->m, B, &o, &p) == 0, "%s", kiln_last_error());
	TEST_H2D(r, r->x, x, sizeof(float) * B * 144);
	TEST_H2D(r, r->y, y, sizeof y);
	ck_assert_msg(kiln_plan_forward(p, r->x, r->y, r->metrics, r->stream) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_sync(r->dev, r->stream) == 0);
	ck_assert(infer ? kiln_plan_logits(p, &yp, &d) == 0 : kiln_plan_tensor(p, "logits", "y", &yp, &d) == 0);
	ck_assert_int_eq(kiln_tensor_numel(&d), B * 10);
	TEST_D2H(r, out, yp, sizeof(float) * B * 10);
	kiln_plan_free(p);
}

/* f32[n] of a parameter of r's model. */
static void param_host(struct rig *r, const char *name, float *h, int64_t n)
{
	struct kiln_param_info pi;
	ck_assert_msg(kiln_model_param_find(r->m, name, &pi) == 0, "%s", name);
	ck_assert_int_eq(kiln_tensor_numel(&pi.desc), n);
	TEST_D2H(r, h, pi.param, sizeof(float) * (size_t)n);
}

/* Sections of type `type` in cfg. */
static int count_type(struct kiln_config *cfg, const char *type)
{
	int n = 0;
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *t = kiln_config_get(cfg, kiln_config_section(cfg, i), "type");
		n += t && !strcmp(t, type);
	}
	return n;
}

/* Fold model `layers` (in `layout`) with kiln_infer_fold_config_ex's
 * flags, the folded config then run in layout `run_as` (NULL: the
 * device's, as folded) with the CPU's [plugin.cpu] conv_impl = impl
 * (NULL: unset); removed: the layers the pass must drop (all its
 * batchnorms and dropouts unless bn_left, and with KILN_FOLD_RESIDUAL
 * adds, of which adds_left must stay); wname: a folded weight of n
 * elements that must change (n = 0: none). */
static void check_fold_ex(const char *layers, const char *layout, int flags, const char *run_as,
			  const char *impl, int removed, int bn_left, int adds_left, const char *wname,
			  int64_t n)
{
	char ini[8192];
	struct rig a, f;
	struct kiln_config *fcfg;
	float x[B * 144], ref[B * 10], got[B * 10];
	int nf = -1;
	snprintf(ini, sizeof ini, head, layout);
	strncat(ini, layers, sizeof ini - strlen(ini) - 1);
	rig_open(&a, test_config(reg, ini));
	randomize_bn(&a);
	for (int i = 0; i < B * 144; i++)
		x[i] = noise((uint32_t)i, 99);
	logits_of(&a, x, ref, 0);

	ck_assert_msg(kiln_infer_fold_config_ex(a.m, reg, flags, &fcfg, &nf) == 0, "%s",
		      kiln_last_error());
	if ((flags & KILN_FOLD_RESIDUAL) || adds_left)
		ck_assert_int_eq(count_type(fcfg, "add"), adds_left);
	if (run_as) {
		char kv[64];
		snprintf(kv, sizeof kv, "model.layout=%s", run_as);
		ck_assert(kiln_config_override(fcfg, kv) == 0);
	}
	if (impl) { /* [plugin.cpu] conv_impl: another of oneDNN's kernels */
		char kv[64];
		snprintf(kv, sizeof kv, "plugin.cpu.conv_impl=%s", impl);
		ck_assert(kiln_config_override(fcfg, kv) == 0);
	}
	for (int i = 0; kiln_config_section(fcfg, i); i++) {
		const char *t = kiln_config_get(fcfg, kiln_config_section(fcfg, i), "type");
		ck_assert_msg(!t || (strcmp(t, "dropout") && (strcmp(t, "batchnorm") || bn_left)),
			      "%s left in the folded config", kiln_config_section(fcfg, i));
	}
	rig_open(&f, fcfg);
	ck_assert_msg(kiln_infer_fold_weights(a.m, a.stream, f.m, f.stream) == 0, "%s",
		      kiln_last_error());
	for (int infer = 0; infer < 2; infer++) { /* the keep_all plan, then the fused one */
		logits_of(&f, x, got, infer);
		double worst = 0;
		for (int i = 0; i < B * 10; i++) {
			double e = fabs(got[i] - ref[i]) / (1 + fabs(ref[i]));
			worst = e > worst ? e : worst;
		}
		ck_assert_msg(worst < 2e-5, "%s (%s%s, %s plan): folded logits differ by %g (relative)",
			      wname, layout, run_as ? ", run as the other" : "",
			      infer ? "inference" : "keep_all", worst);
	}
	ck_assert_int_eq(nf, removed); /* after the logits: a wrong fold says how wrong */

	if (!n)
		goto out;
	float *w0 = malloc(sizeof(float) * (size_t)n), *w1 = malloc(sizeof(float) * (size_t)n);
	param_host(&a, wname, w0, n);
	param_host(&f, wname, w1, n);
	ck_assert_msg(memcmp(w0, w1, sizeof(float) * (size_t)n), "%s was not folded", wname);
	free(w0);
	free(w1);
out:
	rig_close(&f);
	rig_close(&a);
}

static void check_fold(const char *layers, const char *layout, int removed, int bn_left,
		       const char *wname, int64_t n)
{
	check_fold_ex(layers, layout, 0, NULL, NULL, removed, bn_left, 0, wname, n);
}

START_TEST(mlp_folds)
{
	/* bn1, drop, bn2 */
	check_fold(mlp, "nchw", 3, 0, "fc2.weight", 16 * 24);
}
END_TEST

START_TEST(cnn_folds)
{
	/* b1, b2, b3, fb, drop */
	check_fold(cnn, "nchw", 5, 0, "c3.weight", 8 * 4 * 9);
	check_fold(cnn, "nhwc", 5, 0, "c2.weight", 8 * 8 * 9);
}
END_TEST

START_TEST(resnet_folds)
{
	/* stem_bn, a1_bn, a2_bn, down_bn */
	check_fold(resnet, "nhwc", 4, 0, "down.weight", 16 * 8);
	check_fold(resnet, "nchw", 4, 0, "a2.weight", 16 * 16 * 9);
}
END_TEST

/* ResNet blocks with their residual adds in the convs: the block above
 * (the add's later input the shortcut's 1x1 conv, the residual the
 * block's second conv), and an identity block (no shortcut conv: the add
 * goes into the block's second conv, the residual the block's input),
 * then an add of a conv's input and its output without a ReLU after it
 * (the conv's input is its residual too). */
static const char resnet2[] =
	"[layer.stem]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.stem_bn]\ntype = batchnorm\n"
	"[layer.stem_relu]\ntype = relu\n"
	"[layer.b1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.b1_bn]\ntype = batchnorm\n"
	"[layer.b1_relu]\ntype = relu\n"
	"[layer.b2]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.b2_bn]\ntype = batchnorm\n"
	"[layer.add1]\ntype = add\ninputs = b2_bn, stem_relu\n[layer.out1]\ntype = relu\n"
	"[layer.c1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\nbias = 1\n"
	"[layer.add2]\ntype = add\ninputs = out1, c1\n"
	"[layer.gap]\ntype = global_avgpool\n[layer.flat]\ntype = flatten\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

START_TEST(resnet_residual_folds)
{
	/* 4 batchnorms and the add; oneDNN's first kernels, then its second
	 * and third (the residual and ReLU post-ops on each), then the timed
	 * choice */
	static const char *const impl[] = { NULL, "1", "2", "auto" };
	for (int k = 0; k < 4; k++) {
		check_fold_ex(resnet, "nhwc", KILN_FOLD_RESIDUAL, NULL, impl[k], 5, 0, 0, "down.weight", 16 * 8);
		check_fold_ex(resnet2, "nhwc", KILN_FOLD_RESIDUAL, NULL, impl[k], 5, 0, 0, "b2.weight", 8 * 8 * 9);
	}
	check_fold_ex(resnet, "nchw", KILN_FOLD_RESIDUAL, NULL, NULL, 5, 0, 0, "a2.weight", 16 * 16 * 9);
	/* the fallback: the CPU takes KILN_OPF_RESIDUAL on NHWC only */
	check_fold_ex(resnet, "nchw", KILN_FOLD_RESIDUAL, "nchw", NULL, 5, 0, 0, "a2.weight", 16 * 16 * 9);
	/* stem_bn, b1_bn, b2_bn and both adds (add2: into c1, without a ReLU) */
	check_fold_ex(resnet2, "nhwc", KILN_FOLD_RESIDUAL, "nchw", NULL, 5, 0, 0, "b2.weight", 8 * 8 * 9);
	/* without the flag the adds stay */
	check_fold_ex(resnet2, "nhwc", 0, NULL, NULL, 3, 0, 2, "b2.weight", 8 * 8 * 9);
}
END_TEST

/* A batchnorm whose conv also feeds another layer stays: folding it would
 * change what the other reader sees. */
START_TEST(shared_conv_keeps_bn)
{
	static const char shared[] =
		"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\nbias = 1\n"
		"[layer.b1]\ntype = batchnorm\n"
		"[layer.add]\ntype = add\ninputs = b1, c1\n[layer.flat]\ntype = flatten\n"
		"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";
	check_fold(shared, "nchw", 0, 1, NULL, 0);
}
END_TEST

/* A batchnorm after a layer whose weight another layer shares (tie) stays,
 * whichever side of the tie it follows: folded into the owner fc1, it
 * scaled the weight fc2 reads too (before session 34 the folded logits
 * differed from the unfolded by ~0.2 of the largest).  The conv the same. */
START_TEST(tied_weight_keeps_bn)
{
	static const char owner[] =
		"[layer.flat]\ntype = flatten\n"
		"[layer.fc0]\ntype = linear\nout = 16\n"
		"[layer.fc1]\ntype = linear\nout = 16\n[layer.bn1]\ntype = batchnorm\n[layer.r1]\ntype = relu\n"
		"[layer.fc2]\ntype = linear\nout = 16\ntie = fc1\n[layer.r2]\ntype = relu\n"
		"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";
	static const char user[] =
		"[layer.flat]\ntype = flatten\n"
		"[layer.fc0]\ntype = linear\nout = 16\n"
		"[layer.fc1]\ntype = linear\nout = 16\n[layer.r1]\ntype = relu\n"
		"[layer.fc2]\ntype = linear\nout = 16\ntie = fc1\n[layer.bn2]\ntype = batchnorm\n"
		"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";
	static const char conv[] =
		"[layer.c0]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"
		"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n[layer.b1]\ntype = batchnorm\n"
		"[layer.r1]\ntype = relu\n[layer.c2]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\ntie = c1\n"
		"[layer.flat]\ntype = flatten\n"
		"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";
	check_fold(owner, "nchw", 0, 1, NULL, 0);
	check_fold(user, "nchw", 0, 1, NULL, 0);
	check_fold(conv, "nchw", 0, 1, NULL, 0);
	check_fold(conv, "nhwc", 0, 1, NULL, 0);
}
END_TEST

/* A layernorm on a 4-d tensor (conv -> bn -> layernorm -> flatten ->
 * linear) refuses nhwc, where it would normalise the channels rather than
 * the width: a model trained nchw folds to nchw (before session 31 the
 * folded config said `auto`, nhwc on the CPU, and the model could not be
 * built: "layer 'ln' (layernorm) needs ... nhwc"); one without it still
 * folds to the device's layout, and KILN_FOLD_INT8 asks for nhwc. */
static const char cnn_ln[] =
	"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n[layer.b1]\ntype = batchnorm\n"
	"[layer.ln]\ntype = layernorm\n[layer.flat]\ntype = flatten\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

/* [model] layout of the folded config of `layers` trained in `layout`. */
static void check_fold_layout(const char *layers, const char *layout, int flags, const char *want)
{
	char ini[8192];
	struct rig a;
	struct kiln_config *fcfg = NULL;
	snprintf(ini, sizeof ini, head, layout);
	strncat(ini, layers, sizeof ini - strlen(ini) - 1);
	rig_open(&a, test_config(reg, ini));
	ck_assert_msg(kiln_infer_fold_config_ex(a.m, reg, flags, &fcfg, NULL) == 0, "%s",
		      kiln_last_error());
	ck_assert_str_eq(kiln_config_get(fcfg, "model", "layout"), want);
	kiln_config_free(fcfg);
	rig_close(&a);
}

START_TEST(layernorm_keeps_nchw)
{
	check_fold(cnn_ln, "nchw", 1, 0, "c1.weight", 4 * 9);
	check_fold_layout(cnn_ln, "nchw", 0, "nchw");
	check_fold_layout(cnn_ln, "nchw", KILN_FOLD_INT8, "nchw");
	check_fold_layout(cnn, "nchw", 0, "auto");
	check_fold_layout(cnn, "nchw", KILN_FOLD_INT8, "nhwc");
}
END_TEST

/* Batch blocking for cache (kiln_infer_block_rows, [run] infer_block):
 * the rule on the example models' figures, then through the inference
 * API. */
/* Two activations in a row (session 29): the inference plan fuses the
 * first into the linear or conv before it, and the second must still run
 * (the first, a view, passed the fusion on to it: linear, GELU, ReLU
 * evaluated as linear, GELU, its ReLU dropped) */
static const char mlp_acts[] =
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 24\n[layer.g1]\ntype = gelu\n[layer.r1]\ntype = relu\n"
	"[layer.fc2]\ntype = linear\nout = 16\n[layer.r2]\ntype = relu\n[layer.g2]\ntype = gelu\n"
	"[layer.fc3]\ntype = linear\nout = 12\n[layer.g3]\ntype = gelu\n"
	"[layer.g4]\ntype = gelu\napproximate = tanh\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";
static const char cnn_acts[] =
	"[layer.c1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n[layer.r1]\ntype = relu\n"
	"[layer.g1]\ntype = gelu\n[layer.flat]\ntype = flatten\n"
	"[layer.logits]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n";

START_TEST(act_chains_fuse_once)
{
	check_fold(mlp_acts, "nchw", 0, 0, "two activations", 0);
	check_fold(cnn_acts, "nchw", 0, 0, "two activations", 0);
	check_fold(cnn_acts, "nhwc", 0, 0, "two activations", 0);
}
END_TEST

START_TEST(block_rows_rule)
{
	const size_t mib = 1 << 20;
	/* the ResNet example: 150528 activation bytes a row, 0.3 MB of
	 * weights; 1 thread (2 MiB), 2 threads (4 MiB) */
	ck_assert_int_eq(kiln_infer_block_rows(1000, 150528, 300000, 2 * mib), 8);
	ck_assert_int_eq(kiln_infer_block_rows(1000, 150528, 300000, 4 * mib), 16);
	/* the CNN: 13 MB of weights, more than a block's activations */
	ck_assert_int_eq(kiln_infer_block_rows(1000, 125000, 13000000, 2 * mib), 1000);
	/* the MLP: 2 MB of weights against 256 rows x 6 KB */
	ck_assert_int_eq(kiln_infer_block_rows(1000, 6272, 2200000, 2 * mib), 1000);
	/* a batch that fits already; a row larger than the budget */
	ck_assert_int_eq(kiln_infer_block_rows(8, 150528, 300000, 2 * mib), 8);
	ck_assert_int_eq(kiln_infer_block_rows(64, 3 * mib, 1000, 2 * mib), 1);
	/* never the whole batch as a "block": 20 rows fit in 32 */
	ck_assert_int_eq(kiln_infer_block_rows(20, 1000, 0, 10000), 8);
}
END_TEST

/* The CPU device's convolutions prepared while a model loads, counted
 * from its debug log ("CONV x [rows,..."): those of `conv_rows` rows
 * (conv_at) and of any other (conv_other); the block's log line
 * ("... activation bytes a row") kept in block_line. */
static int64_t conv_rows;
static int conv_at, conv_other;
static char block_line[256];
static void conv_sink(void *user, int level, const char *who, const char *msg)
{
	long long r;
	(void)user, (void)level;
	if (!strcmp(who, "cpu") && sscanf(msg, "CONV x [%lld,", &r) == 1)
		r == conv_rows ? conv_at++ : conv_other++;
	if (!strcmp(who, "infer") && strstr(msg, "activation bytes a row"))
		snprintf(block_line, sizeof block_line, "%s", msg);
}

/* The ResNet block above through kiln_model_load with [run] infer_block
 * = v: the rows of a run, and its logits of n rows into out. */
static int64_t block_logits(const char *v, int64_t batch, int64_t n, float **x, float *out)
{
	char ini[8192], *err = NULL;
	struct kiln_infer *m;
	struct kiln_infer_opts o = { .batch = batch, .config_is_text = 1 };
	/* (out_dir nowhere: no weights given, kiln_model_load would take a
	 * checkpoint from runs/latest where the suite runs, if one is there) */
	snprintf(ini, sizeof ini, "[run]\ndevice = cpu\nseed = 3\nthreads = 1\ninfer_block = %s\n"
		 "out_dir = /nonexistent/kiln-check-infer-passes\n"
		 "[data]\nsource = synthetic\n[model]\nlayout = nhwc\n", v);
	strncat(ini, resnet, sizeof ini - strlen(ini) - 1);
	const int level = kiln_log_get_level();
	conv_rows = batch;
	conv_at = conv_other = 0;
	block_line[0] = 0;
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(conv_sink, NULL);
	ck_assert_msg(kiln_model_load(ini, NULL, &o, &m, &err) == 0, "%s", err);
	const size_t in = kiln_infer_input_bytes(m) / sizeof(float);
	ck_assert_int_eq(kiln_infer_output_elems(m), 10);
	if (!*x) {
		*x = malloc(sizeof(float) * in * (size_t)n);
		for (size_t i = 0; i < in * (size_t)n; i++)
			(*x)[i] = noise((uint32_t)i, 5);
	}
	ck_assert_msg(kiln_infer(m, *x, n, out) == 0, "%s", kiln_last_error());
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	const int64_t rows = kiln_infer_run_rows(m);
	kiln_infer_free(m);
	return rows;
}

START_TEST(block_rows_infer)
{
	enum { N = 300 };
	float *x = NULL, *ref = malloc(sizeof(float) * N * 10), *got = malloc(sizeof(float) * N * 10);
	ck_assert_int_eq(block_logits("0", N, N, &x, ref), N);
	/* the whole batch's convolutions, when it runs whole (the stem, the
	 * block's two and its shortcut: the count shows the log is read) */
	ck_assert_msg(conv_at >= 3 && conv_other == 0, "whole: %d convolutions of %d rows, %d of others",
		      conv_at, N, conv_other);
	ck_assert_msg(!block_line[0], "whole: '%s'", block_line);
	/* blocks of 7 rows (42 of them, then a run of 6): no convolution of
	 * the whole batch is prepared (issue 23), only the block's */
	ck_assert_int_eq(block_logits("7", N, N, &x, got), 7);
	ck_assert_msg(conv_at == 0 && conv_other >= 3, "blocks of 7: %d convolutions of %d rows, %d of others",
		      conv_at, N, conv_other);
	ck_assert_msg(strstr(block_line, "batch of 300 rows in blocks of 7 ([run] infer_block = 7: "),
		      "'%s'", block_line);
	for (int i = 0; i < N * 10; i++)
		ck_assert_msg(fabsf(got[i] - ref[i]) <= 2e-5f * (1 + fabsf(ref[i])),
			      "logit %d: %g in blocks of 7, %g whole", i, got[i], ref[i]);
	/* auto on 1 thread: 300 rows of this model's activations exceed
	 * twice any core's L2, its weights are small: a power of two */
	const int64_t r = block_logits("auto", N, N, &x, got);
	ck_assert_msg(r < N && (r & (r - 1)) == 0, "auto: blocks of %lld rows", (long long)r);
	ck_assert_msg(conv_at == 0 && conv_other >= 3, "auto: %d convolutions of %d rows, %d of others",
		      conv_at, N, conv_other);
	for (int i = 0; i < N * 10; i++)
		ck_assert_msg(fabsf(got[i] - ref[i]) <= 2e-5f * (1 + fabsf(ref[i])),
			      "logit %d: %g in blocks of %lld, %g whole", i, got[i], (long long)r, ref[i]);
	/* more rows than the batch: whole runs */
	ck_assert_int_eq(block_logits("500", N, 4, &x, got), N);
	char *err = NULL;
	struct kiln_infer *m = NULL;
	ck_assert(kiln_model_load("[run]\ninfer_block = some\n"
				  "out_dir = /nonexistent/kiln-check-infer-passes\n"
				  "[data]\nsource = synthetic\n"
				  "[layer.fc]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n",
				  NULL, &(struct kiln_infer_opts){ .config_is_text = 1 }, &m, &err) != 0);
	ck_assert_msg(err && strstr(err, "infer_block"), "%s", err ? err : "(no message)");
	free(err);
	free(x);
	free(ref);
	free(got);
}
END_TEST

/* status st with a message holding `msg` (the C API's refusals) */
static void refused(kiln_status st, kiln_status want, const char *msg)
{
	ck_assert_msg(st == want, "status %d, want %d (%s)", (int)st, (int)want, kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), msg), "'%s' lacks '%s'", kiln_last_error(), msg);
}

/* The C API (include/kiln/infer.h) refuses NULL arguments and an image
 * whose pixels are not there with KILN_EINVAL and a message (each of
 * these crashed or blamed the transform before), no_fold with a quantized
 * model with KILN_EUSAGE, and the model still works after. */
START_TEST(api_refuses_bad_arguments)
{
	static const char ini[] = "[run]\ndevice = cpu\nseed = 3\nthreads = 1\n"
				  "out_dir = /nonexistent/kiln-check-infer-passes\n"
				  "[data]\nsource = synthetic\nimage_size = 8\n"
				  "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
				  "[layer.loss]\ntype = softmax_xent\n";
	const struct kiln_infer_opts o = { .config_is_text = 1 };
	struct kiln_infer *m = NULL;
	char *err = NULL;
	int64_t dims[KILN_MAX_DIMS];
	refused(kiln_model_load(ini, NULL, &o, NULL, &err), KILN_EINVAL, "kiln_model_load: out is NULL");
	ck_assert_msg(err && strstr(err, "out is NULL"), "*err: %s", err ? err : "(none)");
	free(err);
	/* an INT8 model is the folded model: no_fold with one is refused
	 * before the file is read (it ran folded silently before session 31) */
	const struct kiln_infer_opts qo = { .config_is_text = 1, .no_fold = 1,
					    .quantized = "/nonexistent/q.safetensors" };
	refused(kiln_model_load(ini, NULL, &qo, &m, &err), KILN_EUSAGE,
		"/nonexistent/q.safetensors: kiln_infer_opts.no_fold with a quantized model: an INT8 model is the folded model");
	ck_assert_ptr_null(m);
	free(err);
	ck_assert_msg(kiln_model_load(ini, NULL, &o, &m, &err) == 0, "%s", err);
	ck_assert_int_eq(kiln_infer_input_bytes(m), 8 * 8 * sizeof(float));
	float *x = malloc(kiln_infer_input_bytes(m)), out[10];
	uint8_t px[8 * 8];
	memset(px, 100, sizeof px);
	struct kiln_image img = { px, sizeof px, 8, 8, 1, 0 };
	ck_assert_msg(kiln_infer_image(m, &img, "a.png", x) == 0, "%s", kiln_last_error());
	refused(kiln_infer_image(m, &img, "a.png", NULL), KILN_EINVAL, "kiln_infer_image: x is NULL");
	refused(kiln_infer_image(m, NULL, "a.png", x), KILN_EINVAL, "kiln_infer_image: img is NULL");
	refused(kiln_infer_image(NULL, &img, "a.png", x), KILN_EINVAL, "kiln_infer_image: the model is NULL");
	img.data = NULL;
	refused(kiln_infer_image(m, &img, "a.png", x), KILN_EINVAL, "a.png: kiln_image.data is NULL");
	refused(kiln_infer_image(m, &img, NULL, x), KILN_EINVAL, "image: kiln_image.data is NULL");
	img.data = px;
	img.cap = 10;
	refused(kiln_infer_image(m, &img, "a.png", x), KILN_EINVAL,
		"a.png: kiln_image.cap is 10 bytes, less than its 8x8x1 pixels (64 bytes)");
	img.cap = sizeof px;
	img.h = 0;
	refused(kiln_infer_image(m, &img, "a.png", x), KILN_EINVAL, "a.png: a 8x0 image (width x height) has no pixels");
	img.h = 8;
	img.c = 4;
	refused(kiln_infer_image(m, &img, "a.png", x), KILN_EDATA, "a.png: 4 channels: images have 1 (gray) or 3 (RGB)");
	img.c = 1;
	ck_assert_int_eq(kiln_infer_input_bytes(NULL), 0);
	ck_assert_int_eq(kiln_infer_output_elems(NULL), 0);
	ck_assert_int_eq(kiln_infer_input_shape(NULL, dims, NULL), 0);
	ck_assert_int_eq(kiln_infer_output_shape(NULL, dims), 0);
	refused(kiln_infer_prepare(NULL), KILN_EINVAL, "kiln_infer_prepare: the model is NULL");
	refused(kiln_infer_eval_set(m, NULL, NULL), KILN_EINVAL, "kiln_infer_eval_set: fn is NULL");
	refused(kiln_infer(NULL, x, 1, out), KILN_EINVAL, "kiln_infer: no model");
	/* the model is as it was */
	ck_assert_msg(kiln_infer_image(m, &img, "a.png", x) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_infer(m, x, 1, out) == 0, "%s", kiln_last_error());
	ck_assert(isfinite(out[0]));
	kiln_infer_free(m);
	free(x);
}
END_TEST

/* An INT8 model in `kiln quantize`'s format (docs/formats.md, "INT8
 * model") for api_ini's model (fc: 64 -> 10) at `path`: weights wq = 5
 * but wq[0][0] = w00, scales 0.01, input scale sx, bias 0.1. */
static const char api_ini[] = "[run]\ndevice = cpu\nseed = 3\nthreads = 1\n"
			      "out_dir = /nonexistent/kiln-check-infer-passes\n"
			      "[data]\nsource = synthetic\nimage_size = 8\n"
			      "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
			      "[layer.loss]\ntype = softmax_xent\n";

/* An INT8 model of a linear layer `fc` of O x I at `path`: weights wq
 * (O x I), their scales sw (O), bias b (O), an s8 input of scale sx; with
 * kiln quantize's CRC32Cs (kiln.crc32c) where crc. */
static void write_int8_fc(const char *path, int64_t O, int64_t I, const int8_t *wq,
			  const float *sw, const float *b, float sx, int crc)
{
	const int64_t wd[2] = { O, I }, one = 1;
	struct kiln_safetensors_writer *w;
	ck_assert_int_eq(kiln_safetensors_writer_new(&w), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(w, "fc.weight", KILN_I8, 2, wd, wq), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(w, "fc.weight_scale", KILN_F32, 1, &O, sw), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(w, "fc.bias", KILN_F32, 1, &O, b), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(w, "fc.input_scale", KILN_F32, 1, &one, &sx), 0);
	ck_assert_int_eq(kiln_safetensors_writer_meta(w, "kiln.format", "kiln-int8/1"), 0);
	ck_assert_int_eq(kiln_safetensors_writer_meta(w, "fc.input", "s8"), 0);
	if (crc)
		ck_assert_int_eq(kiln_safetensors_writer_crc(w, KILN_ST_CRC_KEY), 0);
	ck_assert_int_eq(kiln_safetensors_writer_write(w, path), 0);
	kiln_safetensors_writer_free(w);
}

/* api_ini's (above) */
static void write_int8(const char *path, int8_t w00, float sx)
{
	int8_t wq[10 * 64];
	float sw[10], b[10];
	memset(wq, 5, sizeof wq);
	wq[0] = w00;
	for (int o = 0; o < 10; o++)
		sw[o] = 0.01f, b[o] = 0.1f;
	write_int8_fc(path, 10, 64, wq, sw, b, sx, 0);
}

/* The C API with INT8 files (session 39): one that runs, and beside it,
 * each refused with a message saying what is wrong (the old message in
 * parentheses): a weight outside the format's [-63, 63] (loaded as it
 * was), an input scale past int8_scale's range ("needs int8_scale > 0"),
 * the INT8 file given as the weights ("conv2.weight is I8 ..."), an empty
 * path (": cannot open"), [run] precision = bf16 (the QCONV's prepare:
 * "wants an f32 or u8 input"). */
START_TEST(api_int8_files)
{
	const char *t = getenv("TMPDIR");
	char good[512], big_w[520], big_s[520], bf16[1024];
	snprintf(good, sizeof good, "%s/kiln-check-int8-%d.st", t && *t ? t : "/tmp", (int)getpid());
	snprintf(big_w, sizeof big_w, "%s.w", good);
	snprintf(big_s, sizeof big_s, "%s.s", good);
	write_int8(good, -63, 0.02f);
	write_int8(big_w, 100, 0.02f);
	write_int8(big_s, -63, 1e30f);
	struct kiln_infer_opts o = { .config_is_text = 1, .quantized = good };
	struct kiln_infer *m = NULL;
	char *err = NULL;
	ck_assert_msg(kiln_model_load(api_ini, NULL, &o, &m, &err) == 0, "%s", err);
	float *x = calloc(1, kiln_infer_input_bytes(m)), out[10];
	ck_assert_msg(kiln_infer(m, x, 1, out) == 0, "%s", kiln_last_error());
	ck_assert_float_eq_tol(out[0], 0.1f, 1e-6f); /* x = 0: the bias */
	kiln_infer_free(m);
	free(x);
	o.quantized = big_w;
	refused(kiln_model_load(api_ini, NULL, &o, &m, &err), KILN_EDATA,
		"'fc.weight'[0][0]: 100 is outside [-63, 63]");
	free(err);
	o.quantized = big_s;
	refused(kiln_model_load(api_ini, NULL, &o, &m, &err), KILN_EDATA,
		"fc.input_scale: 1.00000002e+30 is out of range");
	free(err);
	o.quantized = "";
	refused(kiln_model_load(api_ini, NULL, &o, &m, &err), KILN_EUSAGE,
		"kiln_infer_opts.quantized is empty");
	free(err);
	o.quantized = NULL;
	refused(kiln_model_load(api_ini, "", &o, &m, &err), KILN_EUSAGE, "the weights path is empty");
	free(err);
	refused(kiln_model_load(api_ini, good, &o, &m, &err), KILN_EUSAGE,
		"is an INT8 model of `kiln quantize` (metadata kiln.format = kiln-int8/1), not a checkpoint or weights file: pass it with --quantized");
	ck_assert_ptr_nonnull(strstr(err, "kiln_infer_opts.quantized"));
	free(err);
	snprintf(bf16, sizeof bf16, "[run]\nprecision = bf16\n%s", api_ini + strlen("[run]\n"));
	o.quantized = good;
	refused(kiln_model_load(bf16, NULL, &o, &m, &err), KILN_ECONFIG,
		"[run] precision = bf16: an INT8 model computes in fp32: drop [run] precision");
	free(err);
	ck_assert_ptr_null(m);
	unlink(good), unlink(big_w), unlink(big_s);
}
END_TEST

/* An INT8 model of 256 x 4096 I8 weights (1 MiB) with its CRC32Cs
 * (kiln.crc32c, as kiln quantize writes them) at `path`: weights
 * (i % 127) - 63, scales 0.01, input scale 0.02, bias 0.1 at row o + o /
 * 1000; its data's bytes into *data. */
static const char big_ini[] = "[run]\ndevice = cpu\nseed = 3\nthreads = 1\n"
			      "out_dir = /nonexistent/kiln-check-infer-passes\n"
			      "[data]\nsource = synthetic\nimage_size = 64\n"
			      "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 256\n"
			      "[layer.loss]\ntype = softmax_xent\n";

static void write_int8_crc(const char *path, long long *data)
{
	enum { O = 256, I = 4096 };
	int8_t *wq = malloc((size_t)O * I);
	float sw[O], b[O];
	ck_assert_ptr_nonnull(wq);
	for (int i = 0; i < O * I; i++)
		wq[i] = (int8_t)(i % 127 - 63);
	for (int o = 0; o < O; o++)
		sw[o] = 0.01f, b[o] = 0.1f + (float)o / 1000;
	write_int8_fc(path, O, I, wq, sw, b, 0.02f, 1);
	free(wq);
	*data = (long long)O * I + 2 * O * 4 + 4; /* the weights, their scales, the bias, the input scale */
}

/* An INT8 model's bytes are read once (since session 43): its CRC32Cs
 * checked as each tensor is read, the header's at the open.  Before, the
 * open read the whole file to check it, and the load read it again (the
 * data twice).  The bytes a kiln_model_load reads (a second one: the
 * first loads the plugins) are the file's and little more; the logits
 * of a zero input are the bias. */
START_TEST(api_int8_read_once)
{
	const char *t = getenv("TMPDIR");
	char path[512];
	long long data;
	snprintf(path, sizeof path, "%s/kiln-check-int8-once-%d.st", t && *t ? t : "/tmp", (int)getpid());
	write_int8_crc(path, &data);
	struct stat sb;
	ck_assert_int_eq(stat(path, &sb), 0);
	struct kiln_infer_opts o = { .config_is_text = 1, .quantized = path };
	struct kiln_infer *m = NULL;
	char *err = NULL;
	ck_assert_msg(kiln_model_load(big_ini, NULL, &o, &m, &err) == 0, "%s", err);
	kiln_infer_free(m);
	const long long r0 = proc_bytes_read();
	ck_assert_msg(r0 >= 0, "no rchar in /proc/self/io");
	ck_assert_msg(kiln_model_load(big_ini, NULL, &o, &m, &err) == 0, "%s", err);
	const long long got = proc_bytes_read() - r0;
	fprintf(stderr, "api_int8_read_once: a %lld-byte INT8 model (%lld of data) loaded with %lld bytes read\n",
		(long long)sb.st_size, data, got);
	ck_assert_msg(got >= data && got < (long long)sb.st_size + data / 2,
		      "%lld bytes read to load a %lld-byte INT8 model (%lld of data)", got,
		      (long long)sb.st_size, data);
	float *x = calloc(1, kiln_infer_input_bytes(m)), out[256];
	ck_assert_int_eq(kiln_infer_output_elems(m), 256);
	ck_assert_msg(kiln_infer(m, x, 1, out) == 0, "%s", kiln_last_error());
	for (int k = 0; k < 256; k++) /* x = 0: the bias */
		ck_assert_float_eq_tol(out[k], 0.1f + (float)k / 1000, 1e-6f);
	kiln_infer_free(m);
	free(x);
	unlink(path);
}
END_TEST

/* A token model's (i32 ids) kiln_infer_image: KILN_ENOTSUP saying it reads
 * tokens, whatever its [data.eval]: a readable shard or a path that is
 * not there (before session 33 the missing path's error, "the image
 * transforms of [data.eval]: ... cannot open the token shard"). */
static void token_image_refused(const char *path, const char *eval_path)
{
	char ini[1024];
	snprintf(ini, sizeof ini,
		 "[run]\ndevice = cpu\nseed = 3\nthreads = 1\n"
		 "out_dir = /nonexistent/kiln-check-infer-passes\n"
		 "[data]\nsource = tokens\npath = %s\ncontext = 8\n"
		 "[data.eval]\npath = %s\n"
		 "[layer.wte]\ntype = embedding\nvocab = 64\ndim = 16\n"
		 "[layer.head]\ntype = linear\nout = 64\n[layer.loss]\ntype = softmax_xent\n",
		 path, eval_path);
	const struct kiln_infer_opts o = { .config_is_text = 1 };
	struct kiln_infer *m = NULL;
	char *err = NULL;
	ck_assert_msg(kiln_model_load(ini, NULL, &o, &m, &err) == 0, "%s: %s", path, err);
	int64_t dims[KILN_MAX_DIMS];
	int dtype = -1;
	ck_assert_int_eq(kiln_infer_input_shape(m, dims, &dtype), 1);
	ck_assert_int_eq(dtype, KILN_I32);
	float x[64];
	uint8_t px[8 * 8];
	memset(px, 100, sizeof px);
	const struct kiln_image img = { px, sizeof px, 8, 8, 1, 0 };
	refused(kiln_infer_image(m, &img, "a.png", x), KILN_ENOTSUP,
		"a.png: this model reads tokens (i32 [8] token ids), not images");
	kiln_infer_free(m);
}

START_TEST(api_token_model_no_image)
{
	const char *t = getenv("TMPDIR");
	char path[512];
	snprintf(path, sizeof path, "%s/kiln-check-infer-tok-%d.bin", t && *t ? t : "/tmp",
		 (int)getpid());
	/* a shard in llm.c's format: magic, version, count in a 1024-byte
	 * header, then uint16 tokens */
	uint8_t b[1024 + 2 * 100] = { 0 };
	const int32_t h[3] = { 20240520, 1, 100 };
	memcpy(b, h, sizeof h); /* (little-endian, as the format) */
	for (int i = 0; i < 100; i++)
		b[1024 + 2 * i] = (uint8_t)(i * 7 % 64);
	FILE *f = fopen(path, "wb");
	ck_assert(f && fwrite(b, 1, sizeof b, f) == sizeof b);
	fclose(f);
	token_image_refused(path, path);
	token_image_refused(path, "/nonexistent/kiln-check-infer-passes/val.bin");
	unlink(path);
}
END_TEST

static Suite *make_infer_passes_suite(void)
{
	Suite *s = suite_create("infer_passes");
	TCase *tc = tcase_create("fold");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, mlp_folds);
	tcase_add_test(tc, cnn_folds);
	tcase_add_test(tc, resnet_folds);
	tcase_add_test(tc, resnet_residual_folds);
	tcase_add_test(tc, act_chains_fuse_once);
	tcase_add_test(tc, layernorm_keeps_nchw);
	suite_add_tcase(s, tc);
	TCase *keep = tcase_create("keep");
	tcase_add_test(keep, shared_conv_keeps_bn);
	tcase_add_test(keep, tied_weight_keeps_bn);
	suite_add_tcase(s, keep);
	TCase *block = tcase_create("block");
	tcase_set_timeout(block, 60);
	tcase_add_test(block, block_rows_rule);
	tcase_add_test(block, block_rows_infer);
	suite_add_tcase(s, block);
	TCase *api = tcase_create("api");
	tcase_add_test(api, api_refuses_bad_arguments);
	tcase_add_test(api, api_token_model_no_image);
	tcase_add_test(api, api_int8_files);
	tcase_add_test(api, api_int8_read_once);
	suite_add_tcase(s, api);
	return s;
}

static const struct check_main check_suite = { .suite = make_infer_passes_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
