/* tests/check_transform.c - the [data] image transforms (core/transform.c)
 * against torchvision 0.14 on PIL images.
 *
 * tests/data/transform_refs.safetensors (written by gen_transform_refs.py)
 * holds small synthetic images and what torchvision.transforms.functional
 * (or PIL) makes of them: resizes up and down by non-integer factors,
 * resized crops, centre crops with and without padding, padding, flips,
 * gray <-> RGB, ToTensor + Normalize, an evaluation pipeline, and a JPEG
 * with PIL's decode of it.  Bounds: resized pixels within 1/255 (PIL's
 * fixed-point arithmetic is reproduced, so they are expected exact); crops,
 * flips and normalisation exact to float rounding; decoded JPEG pixels
 * within 2/255.  Each test prints the largest difference it saw.
 *
 * Also: RandomResizedCrop boxes over 1000 draws (inside the image, area
 * and ratio in range, torchvision's fallback), determinism in (seed,
 * epoch, index), and kiln_xform_from_config's defaults and errors.
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/transform.h"
#ifdef HAVE_IMAGE_CODEC
#include "plugins/loaders/image.h"
#endif

/* ---- the reference file (loaded once in main; forked tests inherit it),
 * read with the core's safetensors reader -------------------------------- */

static struct kiln_safetensors *ref;

struct ref_tensor {
	const void *data; /* little-endian, row-major */
	const char *dtype;
	int ndim;
	int64_t dims[4];
	int64_t numel;
};

static int ref_load(const char *path)
{
	if (kiln_safetensors_open(path, &ref)) {
		fprintf(stderr, "%s (regenerate: /usr/bin/python3 tests/data/gen_transform_refs.py %s)\n",
			kiln_last_error(), path);
		return -1;
	}
	return 0;
}

static void ref_unload(void)
{
	kiln_safetensors_close(ref);
}

static const char *meta(const char *c, const char *key)
{
	char k[256];
	snprintf(k, sizeof k, "%s%s%s", c, key ? "." : "", key ? key : "");
	const char *s = kiln_safetensors_meta(ref, k);
	ck_assert_msg(s != NULL, "reference has no metadata %s", k);
	return s;
}

static void ref_get(const char *name, struct ref_tensor *t)
{
	struct kiln_safetensors_tensor st;
	ck_assert_msg(kiln_safetensors_find(ref, name, &st) == KILN_OK, "reference has no tensor %s",
		      name);
	t->dtype = st.dtype_name;
	t->ndim = st.ndim;
	t->numel = st.numel;
	for (int i = 0; i < t->ndim && i < 4; i++)
		t->dims[i] = st.dims[i];
	t->data = st.data;
}

/* Input image `name` as a kiln_image (a malloc()ed copy; free data). */
static struct kiln_image ref_image(const char *name)
{
	char k[128];
	struct ref_tensor t;
	snprintf(k, sizeof k, "img/%s", name);
	ref_get(k, &t);
	ck_assert_str_eq(t.dtype, "U8");
	struct kiln_image img = { 0 };
	img.h = (int32_t)t.dims[0];
	img.w = (int32_t)t.dims[1];
	img.c = (int32_t)t.dims[2];
	img.cap = (size_t)t.numel;
	img.data = malloc(img.cap);
	memcpy(img.data, t.data, img.cap);
	return img;
}

/* Call fn(case name) for every case whose op is `op`. */
static int each_case(const char *op, void (*fn)(const char *c, void *u), void *u)
{
	const char *list = meta("cases", NULL);
	char *copy = strdup(list), *save = NULL;
	int n = 0;
	for (char *c = strtok_r(copy, ",", &save); c; c = strtok_r(NULL, ",", &save))
		if (!strcmp(meta(c, "op"), op)) {
			fn(c, u);
			n++;
		}
	free(copy);
	ck_assert_msg(n > 0, "no %s cases in the reference", op);
	return n;
}

static int args(const char *c, int *a, int max)
{
	int n = 0;
	const char *p = meta(c, "args");
	char *end;
	while (n < max) {
		long v = strtol(p, &end, 10);
		if (end == p)
			break;
		a[n++] = (int)v;
		p = end;
	}
	return n;
}

/* A u8 comparison: the largest |got - want| and how many differ. */
struct diff {
	int max, n_diff, cases;
	long n;
	char worst[128];
};

static void diff_u8(struct diff *d, const char *c, const uint8_t *got, const struct ref_tensor *t)
{
	ck_assert_str_eq(t->dtype, "U8");
	for (int64_t i = 0; i < t->numel; i++) {
		int e = abs((int)got[i] - (int)((const uint8_t *)t->data)[i]);
		if (e > d->max) {
			d->max = e;
			snprintf(d->worst, sizeof d->worst, "%s[%lld]", c, (long long)i);
		}
		d->n_diff += e != 0;
	}
	d->n += t->numel;
	d->cases++;
}

static void report(const char *what, const struct diff *d, int bound)
{
	printf("%-28s max |diff| = %d/255 over %d cases (%d of %ld values differ)%s%s\n", what,
	       d->max, d->cases, d->n_diff, d->n, d->max ? ", worst " : "", d->max ? d->worst : "");
	ck_assert_msg(d->max <= bound, "%s: max |diff| %d/255 > %d/255 at %s", what, d->max, bound,
		      d->worst);
}

/* An xform with u8 HWC output and no randomness. */
static struct kiln_xform plain(int oh, int ow, int oc, int crop)
{
	struct kiln_xform x = { 0 };
	x.out_h = oh;
	x.out_w = ow;
	x.out_c = oc;
	x.crop = crop;
	x.scale[0] = 0.08f;
	x.scale[1] = 1.0f;
	x.ratio[0] = 0.75f;
	x.ratio[1] = 4.0f / 3.0f;
	for (int c = 0; c < 3; c++) {
		x.mean[c] = 0.0f;
		x.std[c] = 1.0f;
	}
	x.nhwc = 1;
	x.out_dtype = KILN_U8;
	return x;
}

/* The cases of `op`, each fn(case, &diff), reported as `what`: at most
 * `bound`/255 from the reference. */
static void compare(const char *op, void (*fn)(const char *c, void *u), const char *what, int bound)
{
	struct diff d = { 0 };
	each_case(op, fn, &d);
	report(what, &d, bound);
}

/* x applied to img (sample 0, no randomness) compared with case c's
 * reference t into d. */
static void apply_diff(struct diff *d, const char *c, const struct kiln_xform *x,
		       const struct kiln_image *img, const struct ref_tensor *t)
{
	struct kiln_xform_scratch s = { 0 };
	uint8_t *out = malloc(kiln_xform_out_bytes(x));
	ck_assert_int_eq(kiln_xform_apply(x, img, 1, 0, 0, out, &s), KILN_OK);
	diff_u8(d, c, out, t);
	free(out);
	kiln_xform_scratch_free(&s);
}

/* img's box (x0, y0, x1, y1) resized to oh x ow compared with case c's
 * reference t into d. */
static void resize_diff(struct diff *d, const char *c, const struct kiln_image *img,
			const int *box, int oh, int ow, const struct ref_tensor *t)
{
	struct kiln_xform_scratch s = { 0 };
	uint8_t *out = malloc((size_t)t->numel);
	ck_assert_int_eq(kiln_xform_resize_box(img, box, oh, ow, out, &s), KILN_OK);
	diff_u8(d, c, out, t);
	free(out);
	kiln_xform_scratch_free(&s);
}

static struct kiln_config *config(const char *text)
{
	struct kiln_config *cfg;
	ck_assert_msg(kiln_config_load_string(text, "t.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	return cfg;
}

/* ---- resize ---------------------------------------------------------- */

static void resize_case(const char *c, void *u)
{
	struct diff *d = u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	int a[6], box[4];
	ref_get(c, &t);
	if (!strcmp(meta(c, "op"), "resize")) {
		ck_assert_int_eq(args(c, a, 2), 2);
		box[0] = box[1] = 0;
		box[2] = img.w;
		box[3] = img.h;
	} else {
		ck_assert_int_eq(args(c, a, 6), 6);
		box[0] = a[1];
		box[1] = a[0];
		box[2] = a[3];
		box[3] = a[2];
		a[0] = a[4];
		a[1] = a[5];
	}
	ck_assert_int_eq(t.dims[0], a[0]);
	ck_assert_int_eq(t.dims[1], a[1]);
	resize_diff(d, c, &img, box, a[0], a[1], &t);
	free(img.data);
}

START_TEST(resize_vs_pil)
{
	compare("resize", resize_case, "resize", 1);
}
END_TEST

START_TEST(resized_crop_vs_pil)
{
	compare("resized_crop", resize_case, "resized_crop", 1);
}
END_TEST

/* Resize(int) through the config: the output size is the source's after
 * `resize`, and the pixels are torchvision's. */
static void resize_short_case(const char *c, void *u)
{
	struct diff *d = u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	int a[1];
	char text[128];
	ref_get(c, &t);
	ck_assert_int_eq(args(c, a, 1), 1);
	snprintf(text, sizeof text, "[data]\nresize = %d\n", a[0]);
	struct kiln_config *cfg = config(text);
	struct kiln_xform x;
	ck_assert_int_eq(kiln_xform_from_config(cfg, "data", 1, img.h, img.w, img.c, &x), KILN_OK);
	ck_assert_int_eq(x.out_h, t.dims[0]);
	ck_assert_int_eq(x.out_w, t.dims[1]);
	x.out_dtype = KILN_U8;
	x.nhwc = 1;
	apply_diff(d, c, &x, &img, &t);
	kiln_config_free(cfg);
	free(img.data);
}

START_TEST(resize_short_vs_torchvision)
{
	compare("resize_short", resize_short_case, "Resize(int)", 1);
}
END_TEST

/* RGB -> gray after a resize, through kiln_xform_apply (crop none). */
static void gray_case(const char *c, void *u)
{
	struct diff *d = u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	ref_get(c, &t);
	int rgb = !strcmp(meta(c, "op"), "rgb");
	struct kiln_xform x = plain((int)t.dims[0], (int)t.dims[1], rgb ? 3 : 1, KILN_CROP_NONE);
	ck_assert_int_eq(t.dims[2], x.out_c);
	apply_diff(d, c, &x, &img, &t);
	free(img.data);
}

START_TEST(channels_vs_pil)
{
	compare("gray", gray_case, "resize + convert('L')", 1);
	compare("rgb", gray_case, "convert('RGB')", 0);
}
END_TEST

/* ---- crops and flips: exact -------------------------------------------- */

static void center_case(const char *c, void *u)
{
	struct diff *d = u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	ref_get(c, &t);
	struct kiln_xform x = plain((int)t.dims[0], (int)t.dims[1], img.c, KILN_CROP_CENTER);
	apply_diff(d, c, &x, &img, &t);
	free(img.data);
}

START_TEST(center_crop_vs_torchvision)
{
	compare("center_crop", center_case, "center_crop", 0);
}
END_TEST

/* RandomCrop(padding=p): every output is a window of torchvision's padded
 * image, and the windows vary with the index. */
static void pad_case(const char *c, void *u)
{
	(void)u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	int p;
	ref_get(c, &t);
	ck_assert_int_eq(args(c, &p, 1), 1);
	const uint8_t *padded = t.data;
	int ph = (int)t.dims[0], pw = (int)t.dims[1], ch = img.c;
	ck_assert_int_eq(ph, img.h + 2 * p);
	int sizes[2][2] = { { img.h, img.w }, { img.h - 7, img.w - 3 } };
	for (int k = 0; k < 2; k++) {
		struct kiln_xform x = plain(sizes[k][0], sizes[k][1], ch, KILN_CROP_RANDOM);
		x.pad = p;
		struct kiln_xform_scratch s = { 0 };
		uint8_t *out = malloc(kiln_xform_out_bytes(&x));
		int seen[64][64] = { { 0 } }, distinct = 0;
		for (int64_t idx = 0; idx < 200; idx++) {
			ck_assert_int_eq(kiln_xform_apply(&x, &img, 7, 3, idx, out, &s), KILN_OK);
			int found = 0;
			for (int i = 0; i + x.out_h <= ph && !found; i++)
				for (int j = 0; j + x.out_w <= pw && !found; j++) {
					int same = 1;
					for (int y = 0; y < x.out_h && same; y++)
						same = !memcmp(out + (size_t)y * x.out_w * ch,
							       padded + ((size_t)(i + y) * pw + j) * ch,
							       (size_t)x.out_w * ch);
					if (same) {
						found = 1;
						distinct += !seen[i][j]++;
					}
				}
			ck_assert_msg(found, "%s: index %lld is no window of the padded image", c,
				      (long long)idx);
		}
		int positions = (ph - x.out_h + 1) * (pw - x.out_w + 1);
		printf("%-28s %d of %d windows seen in 200 draws (crop %dx%d)\n", c, distinct,
		       positions, x.out_h, x.out_w);
		ck_assert_int_ge(distinct, positions < 40 ? positions * 3 / 4 : 30);
		free(out);
		kiln_xform_scratch_free(&s);
	}
	free(img.data);
}

START_TEST(random_crop_vs_torchvision)
{
	each_case("pad", pad_case, NULL);
}
END_TEST

static void flip_case(const char *c, void *u)
{
	(void)u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	ref_get(c, &t);
	struct kiln_xform x = plain(img.h, img.w, img.c, KILN_CROP_NONE);
	x.flip = 1;
	struct kiln_xform_scratch s = { 0 };
	uint8_t *out = malloc(kiln_xform_out_bytes(&x));
	int flips = 0;
	for (int64_t idx = 0; idx < 100; idx++) {
		ck_assert_int_eq(kiln_xform_apply(&x, &img, 5, 0, idx, out, &s), KILN_OK);
		int f = !memcmp(out, t.data, (size_t)t.numel);
		ck_assert_msg(f || !memcmp(out, img.data, (size_t)t.numel),
			      "%s: index %lld is neither the image nor its flip", c, (long long)idx);
		flips += f;
	}
	printf("%-28s %d of 100 flipped\n", c, flips);
	ck_assert_int_ge(flips, 30);
	ck_assert_int_le(flips, 70);
	free(out);
	kiln_xform_scratch_free(&s);
	free(img.data);
}

START_TEST(flip_vs_torchvision)
{
	each_case("hflip", flip_case, NULL);
}
END_TEST

/* ---- ToTensor + Normalize, and a whole evaluation pipeline --------------- */

struct fdiff {
	double max, max_u8; /* |got - want|, and in 1/255 pixel units */
	int cases;
};

static void normalize_case(const char *c, void *u)
{
	struct fdiff *d = u;
	struct kiln_image img = ref_image(meta(c, "src"));
	struct ref_tensor t;
	int a[2] = { 0, 0 }, eval = !strcmp(meta(c, "op"), "eval");
	char text[512];
	ref_get(c, &t);
	ck_assert_str_eq(t.dtype, "F32");
	if (eval) {
		ck_assert_int_eq(args(c, a, 2), 2);
		/* the train pipeline's keys; train = 0 makes it Resize + CenterCrop */
		snprintf(text, sizeof text, "[data]\nresize = %d\nsize = %d\ncrop = resized\nflip = 1\nmean = %s\nstd = %s\n",
			 a[0], a[1], meta(c, "mean"), meta(c, "std"));
	} else {
		snprintf(text, sizeof text, "[data]\nmean = %s\nstd = %s\n", meta(c, "mean"),
			 meta(c, "std"));
	}
	struct kiln_config *cfg = config(text);
	struct kiln_xform x;
	ck_assert_int_eq(kiln_xform_from_config(cfg, "data", !eval, img.h, img.w, img.c, &x),
			 KILN_OK);
	ck_assert_int_eq(x.out_dtype, KILN_F32);
	ck_assert_int_eq(x.nhwc, 0);
	ck_assert_int_eq(x.out_c, t.dims[0]);
	ck_assert_int_eq(x.out_h, t.dims[1]);
	ck_assert_int_eq(x.out_w, t.dims[2]);
	struct kiln_xform_scratch s = { 0 };
	float *out = malloc(kiln_xform_out_bytes(&x));
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 1, 2, 3, out, &s), KILN_OK);
	const float *want = t.data;
	size_t plane = (size_t)x.out_h * x.out_w;
	for (int64_t i = 0; i < t.numel; i++) {
		double e = fabs((double)out[i] - want[i]);
		if (e > d->max)
			d->max = e;
		e *= 255.0 * x.std[i / plane];
		if (e > d->max_u8)
			d->max_u8 = e;
	}
	d->cases++;
	free(out);
	kiln_xform_scratch_free(&s);
	kiln_config_free(cfg);
	free(img.data);
}

START_TEST(normalize_vs_torchvision)
{
	struct fdiff d = { 0 };
	each_case("normalize", normalize_case, &d);
	printf("%-28s max |diff| = %.3g over %d cases\n", "ToTensor + Normalize", d.max, d.cases);
	ck_assert_msg(d.max <= 1e-6, "ToTensor + Normalize: max |diff| %g", d.max);
}
END_TEST

START_TEST(eval_pipeline_vs_torchvision)
{
	struct fdiff d = { 0 };
	each_case("eval", normalize_case, &d);
	printf("%-28s max |diff| = %.3g (%.3g/255 in pixels) over %d cases\n",
	       "Resize+CenterCrop+Normalize", d.max, d.max_u8, d.cases);
	ck_assert_msg(d.max_u8 <= 1.0 + 1e-3, "eval pipeline: max |diff| %g/255", d.max_u8);
}
END_TEST

/* ---- JPEG: our decode (TurboJPEG) against PIL's ---------------------------- */

#ifdef HAVE_IMAGE_CODEC
static int decode_ref(const char *src, struct kiln_image *img)
{
	char k[128];
	struct ref_tensor t;
	snprintf(k, sizeof k, "jpeg/%s", src);
	ref_get(k, &t);
	memset(img, 0, sizeof *img);
	return img_decode(kiln_host_table(), t.data, (size_t)t.numel, k, IMG_MAX_PIXELS, img);
}

static void jpeg_case(const char *c, void *u)
{
	struct diff *d = u;
	struct kiln_image img;
	struct ref_tensor t;
	ref_get(c, &t);
	ck_assert_msg(decode_ref(meta(c, "src"), &img) == KILN_OK, "%s", kiln_last_error());
	if (!strcmp(meta(c, "op"), "jpeg_decode")) {
		ck_assert_int_eq(img.h, t.dims[0]);
		ck_assert_int_eq(img.w, t.dims[1]);
		ck_assert_int_eq(img.c, t.dims[2]);
		diff_u8(d, c, img.data, &t);
	} else {
		int a[2], box[4] = { 0, 0, img.w, img.h };
		ck_assert_int_eq(args(c, a, 2), 2);
		resize_diff(d, c, &img, box, a[0], a[1], &t);
	}
	free(img.data);
}

START_TEST(jpeg_vs_pil)
{
	compare("jpeg_decode", jpeg_case, "JPEG decode", 2);
	compare("jpeg_resize", jpeg_case, "JPEG decode + resize", 2);
}
END_TEST
#endif

/* ---- RandomResizedCrop boxes ---------------------------------------------- */

START_TEST(rrc_boxes)
{
	struct kiln_xform x = plain(224, 224, 3, KILN_CROP_RESIZED);
	const int sizes[][2] = { { 37, 53 }, { 375, 500 }, { 500, 375 }, { 28, 28 }, { 3, 2 } };
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		int h = sizes[k][0], w = sizes[k][1], fallback = 0;
		double area = (double)h * w, sum = 0;
		int64_t distinct = 0, prev[4] = { -1, -1, -1, -1 };
		for (int64_t i = 0; i < 1000; i++) {
			int b[4];
			kiln_xform_rrc_box(&x, h, w, 42, 1, i, b);
			ck_assert_msg(b[0] >= 0 && b[1] >= 0 && b[2] >= 1 && b[3] >= 1 &&
					      b[0] + b[2] <= w && b[1] + b[3] <= h,
				      "%dx%d: box {%d,%d,%d,%d} outside", h, w, b[0], b[1], b[2], b[3]);
			/* the rounded box came from w*, h* within 0.5 of it whose
			 * area and ratio were in range, or it is the fallback */
			double bw = b[2], bh = b[3];
			int ok = (bw - 0.5) * (bh - 0.5) <= x.scale[1] * area * (1 + 1e-6) &&
				 (bw + 0.5) * (bh + 0.5) >= x.scale[0] * area * (1 - 1e-6) &&
				 (bw - 0.5) / (bh + 0.5) <= x.ratio[1] * (1 + 1e-6) &&
				 (bw + 0.5) / (bh - 0.5) >= x.ratio[0] * (1 - 1e-6);
			int fb = b[0] == (w - b[2]) / 2 && b[1] == (h - b[3]) / 2 &&
				 (b[2] == w || b[3] == h);
			ck_assert_msg(ok || fb, "%dx%d: box {%d,%d,%d,%d} has area %.3f ratio %.3f", h, w,
				      b[0], b[1], b[2], b[3], bw * bh / area, bw / bh);
			fallback += !ok;
			sum += bw * bh / area;
			distinct += b[0] != prev[0] || b[1] != prev[1] || b[2] != prev[2] || b[3] != prev[3];
			for (int j = 0; j < 4; j++)
				prev[j] = b[j];
		}
		printf("RandomResizedCrop %4dx%-4d  mean area %.3f, %d fallbacks, %lld changes in 1000\n",
		       h, w, sum / 1000, fallback, (long long)distinct);
		if (h >= 28) {
			ck_assert_int_le(fallback, 5);
			ck_assert_int_ge(distinct, 900);
		}
	}
	/* Resize(int) sizes: int(n * long / short) */
	int nh, nw;
	kiln_xform_resize_shorter(375, 500, 256, &nh, &nw);
	ck_assert(nh == 256 && nw == 341);
	kiln_xform_resize_shorter(500, 375, 224, &nh, &nw);
	ck_assert(nh == 298 && nw == 224);
	kiln_xform_resize_shorter(28, 28, 32, &nh, &nw);
	ck_assert(nh == 32 && nw == 32);
	/* a long, thin image: past 65536 pixels a side refused, named; the
	 * longer side computed in int64 (int(60000 * 40000) was UB, a width of
	 * -2147483648 that sized a batch negative) */
	kiln_clear_error();
	nh = nw = 7;
	ck_assert_int_eq(kiln_xform_resize_shorter(1, 40000, 60000, &nh, &nw), KILN_EDATA);
	ck_assert(nh == 0 && nw == 0);
	ck_assert_str_eq(kiln_last_error(), "a 40000x1 image (width x height) with its shorter side resized to 60000 would be 2400000000x60000, outside the transforms' 1 to 65536 pixels a side (MAX_SIDE, core/transform.c): too long and thin for `resize = 60000`");
	ck_assert_int_eq(kiln_xform_resize_shorter(65536, 1, 65536, &nh, &nw), KILN_EDATA);
	ck_assert_str_eq(kiln_last_error(), "a 1x65536 image (width x height) with its shorter side resized to 65536 would be 65536x4294967296, outside the transforms' 1 to 65536 pixels a side (MAX_SIDE, core/transform.c): too long and thin for `resize = 65536`");
	/* the largest that fits: 65536 exactly */
	ck_assert_int_eq(kiln_xform_resize_shorter(2, 65536, 2, &nh, &nw), KILN_OK);
	ck_assert(nh == 2 && nw == 65536);
	ck_assert_int_eq(kiln_xform_resize_shorter(2, 65537, 2, &nh, &nw), KILN_EDATA);
	ck_assert_int_eq(kiln_xform_resize_shorter(0, 5, 2, &nh, &nw), KILN_EINVAL);
	/* a strip no try can fit: torchvision's fallback, the ratio-clamped centre */
	int b[4];
	kiln_xform_rrc_box(&x, 10, 1000, 42, 0, 0, b);
	ck_assert_int_eq(b[3], 10);
	ck_assert_int_eq(b[2], 13); /* round(10 * 4/3) */
	ck_assert_int_eq(b[0], (1000 - 13) / 2);
	ck_assert_int_eq(b[1], 0);
	kiln_xform_rrc_box(&x, 1000, 10, 42, 0, 0, b);
	ck_assert_int_eq(b[2], 10);
	ck_assert_int_eq(b[3], 13); /* round(10 / 0.75) */
	ck_assert_int_eq(b[1], (1000 - 13) / 2);
	/* a square image with ratio range excluding 1 */
	x.ratio[0] = 2.0f;
	x.ratio[1] = 3.0f;
	x.scale[0] = x.scale[1] = 1.0f;
	kiln_xform_rrc_box(&x, 40, 40, 42, 0, 0, b);
	ck_assert_int_eq(b[2], 40);
	ck_assert_int_eq(b[3], 20);
	ck_assert_int_eq(b[1], 10);
}
END_TEST

/* Same (seed, epoch, index): same bytes, with any scratch; another epoch or
 * index: another box. */
START_TEST(determinism)
{
	struct kiln_image img = ref_image("big");
	struct kiln_xform x = plain(56, 48, 3, KILN_CROP_RESIZED);
	x.flip = 1;
	x.out_dtype = KILN_F32;
	x.nhwc = 0;
	x.mean[0] = 0.5f;
	x.std[1] = 0.25f;
	size_t n = kiln_xform_out_bytes(&x);
	ck_assert_uint_eq(n, (size_t)56 * 48 * 3 * 4);
	uint8_t *a = malloc(n), *b = malloc(n);
	struct kiln_xform_scratch s1 = { 0 }, s2 = { 0 };
	int same_epoch = 0, same_index = 0;
	for (int64_t i = 0; i < 20; i++) {
		ck_assert_int_eq(kiln_xform_apply(&x, &img, 9, 4, i, a, &s1), KILN_OK);
		/* s2 first serves another size, then the same sample */
		struct kiln_xform y = x;
		y.out_h = 200;
		y.out_w = 17;
		uint8_t *big = malloc(kiln_xform_out_bytes(&y));
		ck_assert_int_eq(kiln_xform_apply(&y, &img, 9, 4, i + 100, big, &s2), KILN_OK);
		free(big);
		ck_assert_int_eq(kiln_xform_apply(&x, &img, 9, 4, i, b, &s2), KILN_OK);
		ck_assert_msg(!memcmp(a, b, n), "index %lld: outputs differ", (long long)i);
		ck_assert_int_eq(kiln_xform_apply(&x, &img, 9, 5, i, b, &s2), KILN_OK);
		same_epoch += !memcmp(a, b, n);
		ck_assert_int_eq(kiln_xform_apply(&x, &img, 9, 4, i + 1, b, &s2), KILN_OK);
		same_index += !memcmp(a, b, n);
		int b0[4], b1[4];
		kiln_xform_rrc_box(&x, 150, 200, 9, 4, i, b0);
		kiln_xform_rrc_box(&x, 150, 200, 9, 5, i, b1);
		ck_assert_msg(memcmp(b0, b1, sizeof b0), "index %lld: epochs 4 and 5 give the same box",
			      (long long)i);
	}
	ck_assert_int_eq(same_epoch, 0);
	ck_assert_int_eq(same_index, 0);
	free(a);
	free(b);
	kiln_xform_scratch_free(&s1);
	kiln_xform_scratch_free(&s2);
	free(img.data);
}
END_TEST

/* HWC and CHW, f32 and u8, gray -> RGB: the same pixels. */
START_TEST(layouts)
{
	struct kiln_image img = ref_image("gray");
	struct kiln_xform x = plain(20, 24, 3, KILN_CROP_CENTER);
	struct kiln_xform_scratch s = { 0 };
	uint8_t *hwc = malloc(20 * 24 * 3), *chw = malloc(20 * 24 * 3);
	float *f = malloc(20 * 24 * 3 * 4), *g = malloc(20 * 24 * 3 * 4);
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, hwc, &s), KILN_OK);
	x.nhwc = 0;
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, chw, &s), KILN_OK);
	x.out_dtype = KILN_F32;
	x.mean[2] = 0.25f;
	x.std[2] = 2.0f;
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, f, &s), KILN_OK);
	x.nhwc = 1;
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, g, &s), KILN_OK);
	for (int y = 0; y < 20; y++)
		for (int i = 0; i < 24; i++) {
			/* top = round(4.5) = 4, left = round(3.5) = 4: Python rounds to even */
			uint8_t px = img.data[(size_t)(y + 4) * 31 + i + 4];
			for (int c = 0; c < 3; c++) {
				ck_assert_int_eq(hwc[(y * 24 + i) * 3 + c], px);
				ck_assert_int_eq(chw[c * 480 + y * 24 + i], px);
				float want = ((float)px / 255.0f - x.mean[c]) / x.std[c];
				ck_assert_float_eq(f[c * 480 + y * 24 + i], want);
				ck_assert_float_eq(g[(y * 24 + i) * 3 + c], want);
			}
		}
	free(hwc);
	free(chw);
	free(f);
	free(g);
	kiln_xform_scratch_free(&s);
	free(img.data);
}
END_TEST

/* Gray rows to f32 (the MLP's normalize, 16 pixels a step where the CPU
 * has AVX-512): every pixel value, rows of 1 to 40 pixels (the 16-lane
 * step's tails), read forward and flipped, bit-equal to the table's
 * (u/255 - mean) / std; and unflipped to u8, the pixels unchanged.  An
 * image kept whole and unflipped goes in one pass since session 49 (9 x w
 * pixels, its own tail), a flipped one row by row. */
START_TEST(gray_rows)
{
	static const float ms[][2] = { { 0.286f, 0.353f }, { 0.0f, 1.0f }, { 0.5f, 0.25f },
				       { 0.1307f, 0.3081f }, { -1.75f, 3.7f } };
	struct kiln_xform_scratch s = { 0 };
	uint8_t *px = malloc(9 * 40);
	float *out = malloc(9 * 40 * sizeof(float));
	for (int w = 1; w <= 40; w++) {
		struct kiln_image img = { px, (size_t)9 * 40, 9, w, 1, 0 };
		for (int k = 0; k < 9 * w; k++)
			px[k] = (uint8_t)(k * 37 + w); /* all 256 values from w = 29 */
		for (size_t m = 0; m < sizeof ms / sizeof ms[0]; m++)
			for (int t = 0; t < 9; t++) {
				const int flip = t > 0; /* the draw flips about half the indices t */
				struct kiln_xform x = plain(9, w, 1, KILN_CROP_NONE);
				x.out_dtype = KILN_F32;
				x.nhwc = 0;
				x.mean[0] = ms[m][0];
				x.std[0] = ms[m][1];
				x.flip = flip;
				ck_assert_int_eq(kiln_xform_apply(&x, &img, 3, 0, t, out, &s), KILN_OK);
				/* the whole image read forward, or (flip) mirrored */
				int fwd = 1, rev = flip, bad = -1;
				for (int k = 0; k < 9 * w; k++) {
					int y = k / w, i = k % w;
					float want[2];
					for (int f = 0; f < 2; f++) {
						uint8_t u = px[y * w + (f ? w - 1 - i : i)];
						want[f] = ((float)u / 255.0f - x.mean[0]) / x.std[0];
					}
					if (fwd && memcmp(&out[k], &want[0], 4))
						fwd = 0, bad = bad < 0 ? k : bad;
					if (rev && memcmp(&out[k], &want[1], 4))
						rev = 0, bad = bad < 0 ? k : bad;
				}
				ck_assert_msg(fwd || rev, "w %d, mean %g std %g, flip %d: pixel %d differs (%a)",
					      w, x.mean[0], x.std[0], flip, bad, out[bad]);
				if (flip)
					continue;
				/* u8 out (transform_on = device): the pixels as they are */
				x.out_dtype = KILN_U8;
				memset(out, 0xa5, (size_t)9 * w + 1);
				ck_assert_int_eq(kiln_xform_apply(&x, &img, 3, 0, t, out, &s), KILN_OK);
				ck_assert_msg(!memcmp(out, px, (size_t)9 * w) &&
						      ((uint8_t *)out)[9 * w] == 0xa5,
					      "w %d: u8 output differs", w);
			}
	}
	free(px);
	free(out);
	kiln_xform_scratch_free(&s);
}
END_TEST

START_TEST(bad_inputs)
{
	struct kiln_image img = ref_image("rgb");
	struct kiln_xform x = plain(64, 64, 3, KILN_CROP_RANDOM);
	struct kiln_xform_scratch s = { 0 };
	uint8_t *out = malloc(kiln_xform_out_bytes(&x));
	/* 37x53 padded by 4 is smaller than 64x64 */
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, out, &s), KILN_EDATA);
	/* the image alone: the caller names the sample (it was named twice) */
	ck_assert_msg(!strncmp(kiln_last_error(), "a 37x53 image (padded by ", 25) &&
			      strstr(kiln_last_error(), ") is smaller than the random crop 64x64"),
		      "%s", kiln_last_error());
	img.c = 2;
	x.crop = KILN_CROP_NONE;
	ck_assert_int_eq(kiln_xform_apply(&x, &img, 0, 0, 0, out, &s), KILN_EDATA);
	img.c = 3;
	int box[4] = { 10, 10, 50, 10 };
	ck_assert_int_eq(kiln_xform_resize_box(&img, box, 8, 8, out, &s), KILN_EINVAL);
	free(out);
	kiln_xform_scratch_free(&s);
	free(img.data);
}
END_TEST

/* ---- kiln_xform_from_config ------------------------------------------------- */

/* The status of from_config on [data] `body`, and its message in msg. */
static kiln_status xcfg(const char *body, int train, int h, int w, int c, struct kiln_xform *x)
{
	char text[1024];
	snprintf(text, sizeof text, "[data]\n%s", body);
	struct kiln_config *cfg = config(text);
	kiln_status st = kiln_xform_from_config(cfg, "data", train, h, w, c, x);
	kiln_config_free(cfg);
	return st;
}

static void expect_error(const char *body, int h, int w, int c, const char *msg)
{
	struct kiln_xform x;
	ck_assert_int_eq(xcfg(body, 1, h, w, c, &x), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), msg) != NULL, "[data] %s: got '%s', want '%s'", body,
		      kiln_last_error(), msg);
}

START_TEST(config_defaults)
{
	struct kiln_xform x;
	ck_assert_int_eq(xcfg("", 1, 28, 28, 1, &x), KILN_OK);
	ck_assert_int_eq(x.out_h, 28);
	ck_assert_int_eq(x.out_w, 28);
	ck_assert_int_eq(x.out_c, 1);
	ck_assert_int_eq(x.crop, KILN_CROP_NONE);
	ck_assert_int_eq(x.resize, 0);
	ck_assert_int_eq(x.flip, 0);
	ck_assert_int_eq(x.out_dtype, KILN_F32);
	ck_assert_int_eq(x.nhwc, 0);
	ck_assert_float_eq(x.mean[0], 0.0f);
	ck_assert_float_eq(x.std[0], 1.0f);
	ck_assert_float_eq_tol(x.scale[0], 0.08f, 1e-7);
	ck_assert_float_eq_tol(x.ratio[1], 4.0f / 3.0f, 1e-6);
	ck_assert_uint_eq(kiln_xform_out_bytes(&x), 28 * 28 * 4);

	ck_assert_int_eq(xcfg("size = 224\ncrop = resized\nflip = yes\nchannels = 3\nmean = 0.485 0.456 0.406\nstd = 0.229, 0.224, 0.225\ntransform_on = device\n",
			      1, 0, 0, 0, &x), KILN_OK);
	ck_assert_int_eq(x.out_h, 224);
	ck_assert_int_eq(x.out_w, 224);
	ck_assert_int_eq(x.out_c, 3);
	ck_assert_int_eq(x.crop, KILN_CROP_RESIZED);
	ck_assert_int_eq(x.flip, 1);
	ck_assert_int_eq(x.out_dtype, KILN_U8);
	ck_assert_float_eq_tol(x.mean[2], 0.406f, 1e-7);
	ck_assert_float_eq_tol(x.std[1], 0.224f, 1e-7);
	ck_assert_uint_eq(kiln_xform_out_bytes(&x), 224 * 224 * 3);
	/* evaluation: centre crop, no flip */
	ck_assert_int_eq(xcfg("size = 32 48\ncrop = random\npad = 4\nflip = 1\n", 0, 40, 50, 3, &x),
			 KILN_OK);
	ck_assert_int_eq(x.out_h, 32);
	ck_assert_int_eq(x.out_w, 48);
	ck_assert_int_eq(x.crop, KILN_CROP_CENTER);
	ck_assert_int_eq(x.flip, 0);
	ck_assert_int_eq(x.pad, 4);
	/* one mean for three channels; gray output of an RGB source */
	ck_assert_int_eq(xcfg("mean = 0.5\nstd = 0.25\n", 1, 10, 12, 3, &x), KILN_OK);
	ck_assert_float_eq(x.mean[2], 0.5f);
	ck_assert_float_eq(x.std[2], 0.25f);
	ck_assert_int_eq(xcfg("channels = 1\nscale = 0.5 0.5\nratio = 1 2\n", 1, 10, 12, 3, &x),
			 KILN_OK);
	ck_assert_int_eq(x.out_c, 1);
	ck_assert_float_eq(x.scale[0], 0.5f);
	ck_assert_float_eq(x.ratio[1], 2.0f);
	/* resize without size: the resized source size */
	ck_assert_int_eq(xcfg("resize = 256\n", 1, 375, 500, 3, &x), KILN_OK);
	ck_assert_int_eq(x.out_h, 256);
	ck_assert_int_eq(x.out_w, 341); /* int(256 * 500 / 375) */

	/* [model] layout = nhwc gives HWC samples; [data.eval] inherits [data] */
	struct kiln_config *cfg = config("[data]\ncrop = resized\nsize = 8\nflip = 1\n[data.eval]\nresize = 10\n[model]\nlayout = nhwc\n");
	ck_assert_int_eq(kiln_xform_from_config(cfg, "data.eval", 0, 0, 0, 1, &x), KILN_OK);
	ck_assert_int_eq(x.nhwc, 1);
	ck_assert_int_eq(x.crop, KILN_CROP_CENTER);
	ck_assert_int_eq(x.resize, 10);
	ck_assert_int_eq(x.out_h, 8);
	ck_assert_int_eq(x.flip, 0);
	kiln_config_free(cfg);
}
END_TEST

START_TEST(config_errors)
{
	struct kiln_xform x;
	expect_error("crop = foo\n", 28, 28, 1,
		     "t.ini:2: [data] crop = 'foo': expected none, center, random or resized");
	expect_error("\n\nsize = 0\n", 28, 28, 1, "t.ini:4: [data] size = '0': expected H W or N");
	/* mean and std whose normalised bytes are not finite in f32 (a mean
	 * of 1e300 was inf there, a std of 1e-50 was 0: every sample -inf or
	 * NaN, silently); the largest that fits is taken */
	expect_error("mean = 1e300\n", 28, 28, 1,
		     "[data] mean = 1e300, std = 1: channel 0's (u8/255 - 1e+300) / 1 is not finite in f32");
	expect_error("std = 1e-50\n", 28, 28, 1, "channel 0's (u8/255 - 0) / 1e-50 is not finite in f32");
	expect_error("mean = 0 0 1e30\nstd = 1e-12\n", 28, 28, 3,
		     "channel 2's (u8/255 - 1e+30) / 1e-12 is not finite in f32");
	ck_assert_int_eq(xcfg("mean = 1e20\nstd = 1e-12\n", 1, 28, 28, 1, &x), KILN_OK);
	expect_error("size = a b\n", 28, 28, 1, "[data] size = 'a b': expected H W or N");
	expect_error("size = 1 2 3\n", 28, 28, 1, "[data] size = '1 2 3'");
	expect_error("size = 28.5\n", 28, 28, 1, "[data] size = '28.5'");
	expect_error("", 0, 0, 3, "t.ini:1: [data] size is not set and the source's images vary in size");
	expect_error("channels = 2\n", 28, 28, 1, "[data] channels = '2': expected 0 (as the source), 1 or 3");
	expect_error("size = 8\n", 28, 28, 0, "channels = 0 (as the source), but the source does not say how many its images have");
	expect_error("mean = 0.1 0.2\n", 28, 28, 3, "[data] mean = '0.1 0.2': expected one number or three (R G B)");
	expect_error("mean = 0.1 0.2 0.3\n", 28, 28, 1, "[data] mean = '0.1 0.2 0.3': expected one number");
	expect_error("std = 0\n", 28, 28, 1, "[data] std = '0': expected one number > 0");
	/* past a double's range: out of range, not a bad list (session 38) */
	expect_error("mean = 0.5 1e999 0.5\n", 28, 28, 3, "[data] mean = '0.5 1e999 0.5': a number out of range (a double holds 0 and magnitudes");
	expect_error("scale = 1e-400 1\n", 28, 28, 1, "[data] scale = '1e-400 1': a number out of range (a double holds");
	expect_error("std = 1 -1 1\n", 28, 28, 3, "[data] std = '1 -1 1'");
	expect_error("mean = nan\n", 28, 28, 1, "[data] mean = 'nan'");
	expect_error("scale = 0.5 0.2\n", 28, 28, 1, "[data] scale = '0.5 0.2': expected two numbers lo hi with 0 < lo <= hi <= 1");
	expect_error("scale = 0.5 2\n", 28, 28, 1, "[data] scale = '0.5 2'");
	expect_error("ratio = 0 1\n", 28, 28, 1, "[data] ratio = '0 1': expected two numbers lo hi with 0 < lo <= hi");
	expect_error("ratio = 1\n", 28, 28, 1, "[data] ratio = '1'");
	expect_error("transform_on = gpu\n", 28, 28, 1, "[data] transform_on = 'gpu': expected host or device");
	expect_error("resize = -1\n", 28, 28, 1, "resize");
	expect_error("pad = x\n", 28, 28, 1, "pad");
	expect_error("flip = maybe\n", 28, 28, 1, "flip");
}
END_TEST

/* The schema accepts every transform key in [data] and [data.eval]. */
START_TEST(config_schema)
{
	struct kiln_config *cfg = config(
		"[data]\nresize = 256\nsize = 224\ncrop = resized\npad = 0\nscale = 0.08 1\n"
		"ratio = 0.75 1.3333333333\nchannels = 3\nflip = 1\nmean = 0.485 0.456 0.406\n"
		"std = 0.229 0.224 0.225\ntransform_on = device\n"
		"[data.eval]\ncrop = center\nsize = 224 224\n");
	ck_assert_msg(kiln_config_validate(cfg, NULL) == KILN_OK, "%s", kiln_last_error());
	kiln_config_free(cfg);
	cfg = config("[data]\ncrop = sideways\n");
	ck_assert_int_eq(kiln_config_validate(cfg, NULL), KILN_ECONFIG);
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_transform_suite(int portable)
{
	Suite *s = suite_create(portable ? "transform (portable loops)" : "transform");
	TCase *tc = tcase_create("pil");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, resize_vs_pil);
	tcase_add_test(tc, resized_crop_vs_pil);
	tcase_add_test(tc, resize_short_vs_torchvision);
	tcase_add_test(tc, channels_vs_pil);
	tcase_add_test(tc, center_crop_vs_torchvision);
	tcase_add_test(tc, random_crop_vs_torchvision);
	tcase_add_test(tc, flip_vs_torchvision);
	tcase_add_test(tc, normalize_vs_torchvision);
	tcase_add_test(tc, eval_pipeline_vs_torchvision);
#ifdef HAVE_IMAGE_CODEC
	tcase_add_test(tc, jpeg_vs_pil);
#endif
	suite_add_tcase(s, tc);
	if (portable)
		return s;
	check_add_case(s, "random", 0, NULL, NULL, (const TTest *[]){
		rrc_boxes, determinism, layouts, bad_inputs, gray_rows, NULL });
	check_add_case(s, "config", 0, NULL, NULL, (const TTest *[]){
		config_defaults, config_errors, config_schema, NULL });
	return s;
}

/* the references, loaded once here: forked tests inherit them */
static int transform_setup(void)
{
	char path[4096];
	return ref_load(test_data_path(path, sizeof path, "transform_refs.safetensors")) ? 1 : 0;
}

/* The suite, then again without the SIMD loops (each test forks, so the
 * transform code first looks at the variable in the child). */
static int transform_run(void)
{
	int failed = check_run(make_transform_suite(0));
	SRunner *sr = srunner_create(NULL);
	int forks = srunner_fork_status(sr) != CK_NOFORK;
	srunner_free(sr);
	if (forks) {
		setenv("KILN_XFORM_SIMD", "0", 1);
		failed += check_run(make_transform_suite(1));
	}
	return failed;
}

static const struct check_main check_suite = { .run = transform_run, .setup = transform_setup,
					       .teardown = ref_unload };
