/* tests/st_export_test.c - the kiln side of tests/safetensors_torch.sh.
 *
 *   tests/st_export_test CONFIG OUTDIR LOGITS_LAYER [section.key=value ...]
 *
 * Builds CONFIG's model for 3x8x8 samples on the cpu device, trains it
 * STEPS SGD steps on fixed synthetic batches (so weights and batchnorm
 * running stats move away from their initial values), then writes
 *   OUTDIR/model.safetensors   kiln_model_save_safetensors
 *   OUTDIR/logits.safetensors  x [4, 3, 8, 8] and the eval-mode output of
 *                              LOGITS_LAYER for it, [4, classes]
 * for PyTorch to load and compare (tests/data/gen_safetensors_refs.py
 * --check).  Exit 0 on success, 1 with a message otherwise.
 */
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 3
#define B 8
#define EB 4
#define SAMPLE (3 * 8 * 8)

static int fail(const char *what)
{
	fprintf(stderr, "st_export_test: %s: %s\n", what, kiln_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: st_export_test CONFIG OUTDIR LOGITS_LAYER [section.key=value ...]\n");
		return 2;
	}
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	struct kiln_plan *train, *eval;
	void *stream;
	const int64_t dims[3] = { 3, 8, 8 };
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 3, dims);
	if (kiln_registry_open(NULL, &reg) || kiln_config_load(argv[1], &cfg))
		return fail(argv[1]);
	for (int i = 4; i < argc; i++)
		if (kiln_config_override(cfg, argv[i]))
			return fail(argv[i]);
	if (kiln_config_validate(cfg, reg) || kiln_device_open(reg, cfg, "cpu", 0, &dev) ||
	    kiln_model_create(cfg, reg, dev, &sample, &m) || kiln_device_stream_create(dev, &stream) ||
	    kiln_model_init_params(m, 11, stream) || kiln_model_init_from(m, stream) ||
	    kiln_model_optim_prepare(m, stream) || kiln_model_plan(m, B, 1, &train))
		return fail("model");
	struct kiln_plan_opts o = { .training = 0, .keep_all = 1 };
	if (kiln_model_plan_ex(m, EB, &o, &eval))
		return fail("eval plan");

	static float x[B * SAMPLE], xe[EB * SAMPLE];
	int32_t y[B] = { 0 };
	float lr = 0.05f, zero[2] = { 0, 0 };
	float *xd, *md, *lrd;
	int32_t *yd;
	if (kiln_device_alloc(dev, sizeof x, (void **)&xd) ||
	    kiln_device_alloc(dev, sizeof y, (void **)&yd) ||
	    kiln_device_alloc(dev, 64, (void **)&md) || kiln_device_alloc(dev, 64, (void **)&lrd) ||
	    kiln_device_copy_async(dev, lrd, &lr, sizeof lr, KILN_COPY_H2D, stream))
		return fail("alloc");
	for (int s = 0; s < STEPS; s++) {
		for (int i = 0; i < B * SAMPLE; i++)
			x[i] = (float)sin(0.37 * i + 0.9 * s);
		for (int i = 0; i < B; i++)
			y[i] = (3 * i + s) % 10;
		if (kiln_device_copy_async(dev, xd, x, sizeof x, KILN_COPY_H2D, stream) ||
		    kiln_device_copy_async(dev, yd, y, sizeof y, KILN_COPY_H2D, stream) ||
		    kiln_device_copy_async(dev, md, zero, sizeof zero, KILN_COPY_H2D, stream) ||
		    kiln_plan_run(train, xd, yd, md, stream) ||
		    kiln_model_optim_step(m, lrd, stream) || kiln_model_step_advance(m, stream) ||
		    kiln_device_stream_sync(dev, stream))
			return fail("training step");
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/model.safetensors", argv[2]);
	if (kiln_model_save_safetensors(m, path, stream))
		return fail("save");

	/* evaluation: the logits layer's output for a fixed x */
	for (int i = 0; i < EB * SAMPLE; i++)
		xe[i] = (float)cos(0.11 * i) * 1.5f;
	memset(y, 0, sizeof y);
	void *yp;
	struct kiln_tensor_desc yd_desc;
	if (kiln_device_copy_async(dev, xd, xe, sizeof xe, KILN_COPY_H2D, stream) ||
	    kiln_device_copy_async(dev, yd, y, sizeof y, KILN_COPY_H2D, stream) ||
	    kiln_plan_forward(eval, xd, yd, md, stream) || kiln_device_stream_sync(dev, stream) ||
	    kiln_plan_tensor(eval, argv[3], "y", &yp, &yd_desc))
		return fail("evaluation");
	if (yd_desc.ndim != 2 || yd_desc.dims[0] != EB) {
		fprintf(stderr, "st_export_test: layer %s's output is not [%d, classes]\n", argv[3], EB);
		return 1;
	}
	int64_t classes = yd_desc.dims[1];
	float *logits = malloc(sizeof(float) * (size_t)(EB * classes));
	if (!logits || kiln_device_copy_async(dev, logits, yp, sizeof(float) * (size_t)(EB * classes),
					      KILN_COPY_D2H, stream) ||
	    kiln_device_stream_sync(dev, stream))
		return fail("logits");
	struct kiln_safetensors_writer *w;
	const int64_t xdims[4] = { EB, 3, 8, 8 }, ldims[2] = { EB, classes };
	snprintf(path, sizeof path, "%s/logits.safetensors", argv[2]);
	if (kiln_safetensors_writer_new(&w) ||
	    kiln_safetensors_writer_add(w, "x", KILN_F32, 4, xdims, xe) ||
	    kiln_safetensors_writer_add(w, "logits", KILN_F32, 2, ldims, logits) ||
	    kiln_safetensors_writer_write(w, path))
		return fail("logits file");
	kiln_safetensors_writer_free(w);
	free(logits);
	kiln_device_free(dev, xd);
	kiln_device_free(dev, yd);
	kiln_device_free(dev, md);
	kiln_device_free(dev, lrd);
	kiln_plan_free(train);
	kiln_plan_free(eval);
	kiln_model_free(m);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return 0;
}
