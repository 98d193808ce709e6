/* bench/xform.c - samples/s of kiln_xform_apply on one thread: a 28x28
 * gray image (MNIST-like) and a 500x375 RGB image (ImageNet-like) to
 * 224x224, for the usual training and evaluation pipelines.
 *
 * Time is the thread's CPU time, so other work on the machine counts less.
 *
 * Usage: bench/xform [seconds per case, default 1] [substring of the case names]
 */
#include "core/transform.h"

#include <stdio.h>
#include "bench_time.h"

static const char *only; /* run only the cases whose name contains this */

static void run(const char *name, int h, int w, int c, struct kiln_xform x, double secs)
{
	if (only && !strstr(name, only))
		return;
	struct kiln_image img = { 0 };
	img.h = h;
	img.w = w;
	img.c = c;
	img.cap = (size_t)h * w * c;
	img.data = malloc(img.cap);
	for (size_t i = 0; i < img.cap; i++)
		img.data[i] = (uint8_t)((i * 2654435761u) >> 13);
	struct kiln_xform_scratch s = { 0 };
	void *out = malloc(kiln_xform_out_bytes(&x));
	int64_t n = 0;
	double t0 = thread_cpu_now(), t; /* other processes share the cores */
	do {
		for (int k = 0; k < 16; k++, n++)
			if (kiln_xform_apply(&x, &img, 1, 0, n, out, &s)) {
				fprintf(stderr, "%s: %s\n", name, kiln_last_error());
				exit(1);
			}
	} while ((t = thread_cpu_now() - t0) < secs);
	printf("%-44s %10.0f samples/s  (%.1f us/sample)\n", name, n / t, 1e6 * t / n);
	free(out);
	free(img.data);
	kiln_xform_scratch_free(&s);
}

static struct kiln_xform xf(int oh, int ow, int oc, int crop, int flip, int resize)
{
	struct kiln_xform x = { 0 };
	x.out_h = oh;
	x.out_w = ow;
	x.out_c = oc;
	x.crop = crop;
	x.flip = flip;
	x.resize = resize;
	x.scale[0] = 0.08f;
	x.scale[1] = 1.0f;
	x.ratio[0] = 0.75f;
	x.ratio[1] = 4.0f / 3.0f;
	const float mean[3] = { 0.485f, 0.456f, 0.406f }, sd[3] = { 0.229f, 0.224f, 0.225f };
	for (int i = 0; i < 3; i++) {
		x.mean[i] = mean[i];
		x.std[i] = sd[i];
	}
	x.out_dtype = KILN_F32;
	return x;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 1.0;
	only = argc > 2 ? argv[2] : NULL;
	run("28x28 gray: normalize only", 28, 28, 1, xf(28, 28, 1, KILN_CROP_NONE, 0, 0), secs);
	struct kiln_xform pad = xf(28, 28, 1, KILN_CROP_RANDOM, 1, 0);
	pad.pad = 4;
	run("28x28 gray: RandomCrop(pad 4) + flip + norm", 28, 28, 1, pad, secs);
	run("28x28 gray: RandomResizedCrop + flip + norm", 28, 28, 1,
	    xf(28, 28, 1, KILN_CROP_RESIZED, 1, 0), secs);
	run("500x375 RGB: RandomResizedCrop 224 + flip + norm", 375, 500, 3,
	    xf(224, 224, 3, KILN_CROP_RESIZED, 1, 0), secs);
	struct kiln_xform u8 = xf(224, 224, 3, KILN_CROP_RESIZED, 1, 0);
	u8.out_dtype = KILN_U8;
	run("500x375 RGB: RandomResizedCrop 224 + flip, u8", 375, 500, 3, u8, secs);
	run("500x375 RGB: Resize 256 + CenterCrop 224 + norm", 375, 500, 3,
	    xf(224, 224, 3, KILN_CROP_CENTER, 0, 256), secs);
	return 0;
}
