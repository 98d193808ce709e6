/* tests/gradcheck.c - finite-difference check of every parameter gradient
 * of a model, for layer plugins built out of tree.
 *
 *   gradcheck PLUGIN_DIR FILE.ini FEATURES
 *
 * builds the model of FILE.ini (plugins from PLUGIN_DIR first) for samples
 * of FEATURES floats, batch 5, and compares the analytic gradient of the
 * mean loss with central differences of the evaluation loss.  Exit 0 when
 * every element agrees within 1e-3 + 1e-2 relative, 1 otherwise. */
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                          \
	do {                                                                              \
		kiln_status st_ = (x);                                                    \
		if (st_) {                                                                \
			fprintf(stderr, "gradcheck: %s: %s\n", #x, kiln_last_error());    \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

static struct kiln_device *dev;
static void *stream;

static void copy(void *dst, const void *src, size_t n, int kind)
{
	CHECK(kiln_device_copy_async(dev, dst, src, n, kind, stream));
	CHECK(kiln_device_stream_sync(dev, stream));
}

static float loss(struct kiln_plan *p, float *x, int32_t *y, float *m)
{
	float z[2] = { 0, 0 };
	copy(m, z, sizeof z, KILN_COPY_H2D);
	CHECK(kiln_plan_run(p, x, y, m, stream));
	copy(z, m, sizeof z, KILN_COPY_D2H);
	return z[0];
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: gradcheck PLUGIN_DIR FILE.ini FEATURES\n");
		return 2;
	}
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	const int64_t B = 5, F = atoll(argv[3]);
	CHECK(kiln_registry_open(argv[1], &reg));
	CHECK(kiln_config_load(argv[2], &cfg));
	CHECK(kiln_config_validate(cfg, reg));
	CHECK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	CHECK(kiln_device_stream_create(dev, &stream));
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &F);
	CHECK(kiln_model_create(cfg, reg, dev, &sample, &m));
	CHECK(kiln_model_init_params(m, 11, stream));
	CHECK(kiln_model_optim_prepare(m, stream));
	CHECK(kiln_model_plan(m, B, 1, &train));
	CHECK(kiln_model_plan(m, B, 0, &eval));
	float *x, *met, *hx = malloc(sizeof(float) * (size_t)(B * F));
	int32_t *y, hy[5] = { 0, 1, 2, 3, 1 };
	CHECK(kiln_device_alloc(dev, sizeof(float) * (size_t)(B * F), (void **)&x));
	CHECK(kiln_device_alloc(dev, sizeof hy, (void **)&y));
	CHECK(kiln_device_alloc(dev, 64, (void **)&met));
	for (int64_t i = 0; i < B * F; i++)
		hx[i] = (float)sin(0.9 * (double)i + 0.2) * 2.0f;
	copy(x, hx, sizeof(float) * (size_t)(B * F), KILN_COPY_H2D);
	copy(y, hy, sizeof hy, KILN_COPY_H2D);
	loss(train, x, y, met);
	int bad = 0, checked = 0;
	for (int pi = 0; pi < kiln_model_param_count(m); pi++) {
		struct kiln_param_info info;
		kiln_model_param_get(m, pi, &info);
		if (!info.grad)
			continue;
		int64_t n = kiln_tensor_numel(&info.desc);
		float *g = malloc(sizeof(float) * (size_t)n);
		copy(g, info.grad, sizeof(float) * (size_t)n, KILN_COPY_D2H);
		for (int64_t e = 0; e < n; e++) {
			float w, v;
			const float eps = 1e-3f;
			copy(&w, info.param + e, sizeof w, KILN_COPY_D2H);
			v = w + eps;
			copy(info.param + e, &v, sizeof v, KILN_COPY_H2D);
			double lp = loss(eval, x, y, met);
			v = w - eps;
			copy(info.param + e, &v, sizeof v, KILN_COPY_H2D);
			double lm = loss(eval, x, y, met);
			copy(info.param + e, &w, sizeof w, KILN_COPY_H2D);
			double fd = (lp - lm) / (2.0 * eps) / (double)B;
			checked++;
			if (fabs(fd - g[e]) > 1e-3 + 1e-2 * fabs(fd)) {
				fprintf(stderr, "gradcheck: %s[%lld]: analytic %g, finite difference %g\n",
					info.name, (long long)e, g[e], fd);
				bad++;
			}
		}
		free(g);
	}
	printf("gradcheck: %d of %d gradient elements agree\n", checked - bad, checked);
	return bad || !checked;
}
