/* tests/optim_ref.c - an optimizer, built-in or plugin, against a PyTorch
 * reference file in the layout of tests/data/optim_refs.safetensors
 * (gen_optim_refs.py, gen_lion_refs.py): for every case of the file, the
 * model of its metadata `model.ini` with the case's [train] section, the
 * parameters set to the tensors init/NAME, and per step the gradients
 * grad<k>/NAME and the step's lr written to device memory before one
 * optimizer step; every parameter after every step must be within 1e-5
 * relative of <case>/step<k>/NAME.  tests/oot.sh runs it on examples/plugins/lion.c.
 *
 * Usage: optim_ref PLUGIN_DIR REF.safetensors
 * Exit 0 when every case matches, 1 otherwise (the first failure named). */
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                      \
	do {                                                                          \
		if ((x) != KILN_OK) {                                                 \
			fprintf(stderr, "optim_ref: %s: %s\n", #x, kiln_last_error()); \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static struct kiln_safetensors *ref;

static const char *meta(const char *fmt, const char *arg)
{
	char key[256];
	snprintf(key, sizeof key, fmt, arg);
	const char *v = kiln_safetensors_meta(ref, key);
	if (!v) {
		fprintf(stderr, "optim_ref: the reference has no metadata %s\n", key);
		exit(1);
	}
	return v;
}

static const float *tensor(const char *name, int64_t *numel)
{
	struct kiln_safetensors_tensor t;
	CHECK(kiln_safetensors_find(ref, name, &t));
	*numel = t.numel;
	return t.data;
}

struct run {
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	float *lr;
};

/* copy n floats to or from a parameter's value or gradient */
static void param_io(struct run *r, const char *name, int grad, float *host, int64_t n, int d2h)
{
	struct kiln_param_info info;
	CHECK(kiln_model_param_find(r->m, name, &info));
	void *dev = grad ? info.grad : info.param;
	if (kiln_tensor_numel(&info.desc) != n) {
		fprintf(stderr, "optim_ref: %s has %lld elements, the reference %lld\n", name,
			(long long)kiln_tensor_numel(&info.desc), (long long)n);
		exit(1);
	}
	CHECK(kiln_device_copy_async(r->dev, d2h ? (void *)host : dev, d2h ? dev : host,
				     (size_t)n * sizeof(float), d2h ? KILN_COPY_D2H : KILN_COPY_H2D,
				     r->stream));
	CHECK(kiln_device_stream_sync(r->dev, r->stream));
}

/* One case: the worst relative error over its steps and parameters. */
static double run_case(struct kiln_registry *reg, const char *dir, const char *c)
{
	char ini[8192], names[256], *save = NULL;
	struct kiln_config *cfg;
	struct kiln_tensor_desc sample;
	struct run r = { 0 };
	int64_t in = atoi(meta("sample", NULL)), n;
	double worst = 0;
	snprintf(ini, sizeof ini, "[run]\nplugin_path = %s\n%s%s", dir, meta("model.ini", NULL),
		 meta("%s.ini", c));
	CHECK(kiln_config_load_string(ini, c, &cfg));
	CHECK(kiln_config_validate(cfg, reg));
	CHECK(kiln_device_open(reg, cfg, "cpu", 0, &r.dev));
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	CHECK(kiln_model_create(cfg, reg, r.dev, &sample, &r.m));
	CHECK(kiln_device_stream_create(r.dev, &r.stream));
	CHECK(kiln_model_init_params(r.m, 1, r.stream));
	CHECK(kiln_model_optim_prepare(r.m, r.stream));
	CHECK(kiln_device_alloc(r.dev, 64, (void **)&r.lr));
	snprintf(names, sizeof names, "%s", meta("params", NULL));
	for (char *p = strtok_r(names, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
		char key[300];
		snprintf(key, sizeof key, "init/%s", p);
		const float *v = tensor(key, &n);
		param_io(&r, p, 0, (float *)v, n, 0);
	}
	const char *lrs = meta("%s.lr", c);
	for (int k = 0; k < atoi(meta("steps", NULL)); k++) {
		char *end, key[300];
		float lr = strtof(lrs, &end), got[64];
		lrs = end;
		CHECK(kiln_device_copy_async(r.dev, r.lr, &lr, sizeof lr, KILN_COPY_H2D, r.stream));
		snprintf(names, sizeof names, "%s", meta("params", NULL));
		for (char *p = strtok_r(names, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
			snprintf(key, sizeof key, "grad%d/%s", k, p);
			const float *g = tensor(key, &n);
			param_io(&r, p, 1, (float *)g, n, 0);
		}
		CHECK(kiln_model_optim_step(r.m, r.lr, r.stream));
		snprintf(names, sizeof names, "%s", meta("params", NULL));
		for (char *p = strtok_r(names, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
			snprintf(key, sizeof key, "%s/step%d/%s", c, k, p);
			const float *want = tensor(key, &n);
			double scale = 0, err = 0;
			if (n > 64)
				exit(1);
			param_io(&r, p, 0, got, n, 1);
			for (int64_t i = 0; i < n; i++) {
				scale = fmax(scale, fabs(want[i]));
				err = fmax(err, fabs((double)got[i] - want[i]));
			}
			worst = fmax(worst, scale > 0 ? err / scale : err);
		}
	}
	kiln_device_free(r.dev, r.lr);
	kiln_model_free(r.m);
	kiln_device_stream_destroy(r.dev, r.stream);
	kiln_device_close(r.dev);
	kiln_config_free(cfg);
	return worst;
}

int main(int argc, char **argv)
{
	struct kiln_registry *reg;
	char cases[512], *save = NULL;
	int bad = 0;
	if (argc != 3) {
		fprintf(stderr, "usage: optim_ref PLUGIN_DIR REF.safetensors\n");
		return 2;
	}
	CHECK(kiln_registry_open(argv[1], &reg));
	CHECK(kiln_safetensors_open(argv[2], &ref));
	snprintf(cases, sizeof cases, "%s", meta("cases", NULL));
	for (char *c = strtok_r(cases, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
		double e = run_case(reg, argv[1], c);
		printf("%s %s: every step against PyTorch, max relative error %.2e\n",
		       e <= 1e-5 ? "ok:" : "FAIL:", c, e);
		bad |= !(e <= 1e-5);
	}
	kiln_safetensors_close(ref);
	kiln_registry_close(reg);
	return bad;
}
