/* tests/check_quant.c - the INT8 calibration rules and the weight
 * quantization of core/quant.c against numbers computed by hand
 * (docs/inference.md, "INT8"). */
#include <check.h>
#include "check_main.h"
#include "quant.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(weights_per_channel)
{
	/* row 0: amax 1.26 -> scale 0.02 (7 bits: / 63); row 1: zero -> scale
	 * 1; row 2: amax 0.252 -> scale 0.004, -0.1 / 0.004 = -25 */
	const float w[9] = { 0.5f, -1.26f, 0.2f, 0, 0, 0, 0.252f, -0.1f, 0 };
	const int8_t want[9] = { 25, -63, 10, 0, 0, 0, 63, -25, 0 };
	int8_t q[9];
	float s[3];
	kiln_quant_weights(w, 3, 3, q, s);
	ck_assert_float_eq_tol(s[0], 0.02f, 1e-8f);
	ck_assert_float_eq(s[1], 1.0f);
	ck_assert_float_eq_tol(s[2], 0.004f, 1e-9f);
	for (int i = 0; i < 9; i++)
		ck_assert_int_eq(q[i], want[i]);
}
END_TEST

START_TEST(weights_round_half_even)
{
	/* amax 63 -> scale 1: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2 */
	const float w[4] = { 63, 2.5f, 3.5f, -2.5f };
	int8_t q[4];
	float s;
	kiln_quant_weights(w, 1, 4, q, &s);
	ck_assert_float_eq(s, 1.0f);
	ck_assert_int_eq(q[0], 63);
	ck_assert_int_eq(q[1], 2);
	ck_assert_int_eq(q[2], 4);
	ck_assert_int_eq(q[3], -2);
}
END_TEST

START_TEST(minmax)
{
	struct kiln_quant_observer o;
	int u;
	memset(&o, 0, sizeof o);
	kiln_quant_observe(&o, (const float[]){ -3, 1, 2 }, 3);
	kiln_quant_observe(&o, (const float[]){ 0.5f, 4 }, 2);
	ck_assert_int_eq(o.count, 5);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_MINMAX, 0) == 4.0);
	ck_assert_float_eq_tol(kiln_quant_act_scale(&o, 4.0, &u), 4.0f / 127, 1e-9f);
	ck_assert_int_eq(u, 0); /* -3 was seen: s8 */

	memset(&o, 0, sizeof o);
	kiln_quant_observe(&o, (const float[]){ 0, 1, 2 }, 3);
	kiln_quant_observe(&o, (const float[]){ 3 }, 1);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_MINMAX, 0) == 3.0);
	ck_assert_float_eq_tol(kiln_quant_act_scale(&o, 3.0, &u), 3.0f / 255, 1e-9f);
	ck_assert_int_eq(u, 1); /* never negative: u8 */
}
END_TEST

START_TEST(percentile)
{
	/* 2048 values k + 0.5: the histogram spans [0, 2048) (the power of two
	 * above 2047.5), one value per bin of width 1.  99 %: 2027.52 values,
	 * reached in bin 2027 (2028 values) -> its upper edge 2028; 50 %: bin
	 * 1023 -> 1024; 100 %: the last bin's edge 2048, capped at the
	 * largest value 2047.5. */
	static float x[2048];
	struct kiln_quant_observer o;
	memset(&o, 0, sizeof o);
	for (int k = 0; k < 2048; k++)
		x[k] = (k % 2 ? -1 : 1) * (k + 0.5f);
	kiln_quant_observe(&o, x, 2048);
	ck_assert(o.hmax == 2048.0);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_PERCENTILE, 99) == 2028.0);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_PERCENTILE, 50) == 1024.0);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_PERCENTILE, 100) == 2047.5);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_MINMAX, 0) == 2047.5);
}
END_TEST

START_TEST(percentile_grows)
{
	/* 1.5 first: range [0, 2); then 5: doubled twice to [0, 8), bins of
	 * 1/256 (1.5 lands in bin 384 after the merges).  50 % of 2 values is
	 * reached at 1.5's bin: upper edge 385/256. */
	struct kiln_quant_observer o;
	memset(&o, 0, sizeof o);
	kiln_quant_observe(&o, (const float[]){ 1.5f }, 1);
	ck_assert(o.hmax == 2.0);
	kiln_quant_observe(&o, (const float[]){ 5 }, 1);
	ck_assert(o.hmax == 8.0);
	ck_assert_int_eq(o.hist[384], 1);
	ck_assert_int_eq(o.hist[1280], 1);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_PERCENTILE, 50) == 385.0 / 256);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_PERCENTILE, 100) == 5.0);
}
END_TEST

START_TEST(entropy_clips_outliers)
{
	/* 20000 values falling off over [0, 100) (x = 100 t^2) and one at
	 * 1000: min-max keeps the outlier, which leaves the bulk 1/10 of the
	 * levels; the entropy rule cuts near the bulk's top instead (a cut
	 * below it would clip much of it, a cut above the outlier would merge
	 * the bulk's shape into a few levels). */
	struct kiln_quant_observer o;
	static float x[20001];
	memset(&o, 0, sizeof o);
	for (int i = 0; i < 20000; i++)
		x[i] = 100.0f * ((float)i / 20000) * ((float)i / 20000);
	x[20000] = 1000;
	kiln_quant_observe(&o, x, 20001);
	const double e = kiln_quant_amax(&o, KILN_QUANT_ENTROPY, 0);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_MINMAX, 0) == 1000.0);
	ck_assert_msg(e >= 50 && e < 250, "entropy amax %g", e);
}
END_TEST

/* The entropy rule against tests/data/gen_quant_refs.py, TensorRT's rule
 * (pytorch-quantization) in numpy, on its histograms: seeded synthetic
 * ones (ReLU-like with half zeros, outliers, signed, spiky) and three
 * inputs of the ResNet example.  Each line: NAME HMAX MIN MAX COUNT CUT
 * AMAX BIN:COUNT...; kiln must pick the same cut. */
START_TEST(entropy_reference)
{
	const char *src = getenv("srcdir");
	char path[4096], name[64];
	snprintf(path, sizeof path, "%s/tests/data/quant_refs.txt", src && *src ? src : SRCDIR);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	static struct kiln_quant_observer o;
	int cases = 0, c;
	while ((c = fgetc(f)) != EOF) {
		if (c == '#') {
			while ((c = fgetc(f)) != EOF && c != '\n')
				;
			continue;
		}
		ungetc(c, f);
		long long count, b, n;
		int cut;
		double amax;
		memset(&o, 0, sizeof o);
		ck_assert_int_eq(fscanf(f, "%63s %lf %lf %lf %lld %d %lf", name, &o.hmax, &o.min, &o.max,
					&count, &cut, &amax), 7);
		o.count = count;
		while ((c = fgetc(f)) == ' ') {
			ck_assert_int_eq(fscanf(f, "%lld:%lld", &b, &n), 2);
			ck_assert(b >= 0 && b < KILN_QUANT_BINS);
			o.hist[b] = n;
		}
		const double got = kiln_quant_amax(&o, KILN_QUANT_ENTROPY, 0);
		ck_assert_msg(fabs(got - amax) <= 1e-12 * amax, "%s: amax %.9g (cut %.2f), reference %.9g (cut %d)",
			      name, got, got / (o.hmax / KILN_QUANT_BINS), amax, cut);
		cases++;
	}
	fclose(f);
	ck_assert_int_eq(cases, 10);
}
END_TEST

/* All the mass in bins 900-1150, far from 0 (a sigmoid's output in
 * [0.44, 0.56]): TensorRT's rule cuts just above bin 900, where P is one
 * bin and KL is 0, an amax below every value (before session 34 every
 * sample then got the same logits).  kiln takes min-max's amax instead. */
START_TEST(entropy_degenerate_falls_back)
{
	static struct kiln_quant_observer o;
	const double w = 1.0 / KILN_QUANT_BINS;
	int fell_back = 0;
	memset(&o, 0, sizeof o);
	o.hmax = 1.0;
	o.min = 900.5 * w, o.max = 1150.5 * w;
	for (int b = 900; b <= 1150; b++)
		o.hist[b] = 40 + b % 7, o.count += o.hist[b];
	const double e = kiln_quant_amax_ex(&o, KILN_QUANT_ENTROPY, 0, &fell_back);
	ck_assert_msg(e >= o.max, "entropy amax %.9g below the largest value %.9g", e, o.max);
	ck_assert_int_eq(fell_back, 1);
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_ENTROPY, 0) == e);
	/* signed values there too: the least |x| is 0, one bin is still one level */
	o.min = -o.max;
	ck_assert(kiln_quant_amax(&o, KILN_QUANT_ENTROPY, 0) >= o.max);
}
END_TEST

START_TEST(method_names)
{
	ck_assert_int_eq(kiln_quant_method_parse("minmax"), KILN_QUANT_MINMAX);
	ck_assert_int_eq(kiln_quant_method_parse("percentile"), KILN_QUANT_PERCENTILE);
	ck_assert_int_eq(kiln_quant_method_parse("entropy"), KILN_QUANT_ENTROPY);
	ck_assert_int_eq(kiln_quant_method_parse("kl"), -1);
	ck_assert_int_eq(kiln_quant_method_parse(NULL), -1);
}
END_TEST

static Suite *make_quant_suite(void)
{
	Suite *s = suite_create("quant");
	TCase *tc = tcase_create("rules");
	tcase_add_test(tc, weights_per_channel);
	tcase_add_test(tc, weights_round_half_even);
	tcase_add_test(tc, minmax);
	tcase_add_test(tc, percentile);
	tcase_add_test(tc, percentile_grows);
	tcase_add_test(tc, entropy_clips_outliers);
	tcase_add_test(tc, entropy_reference);
	tcase_add_test(tc, entropy_degenerate_falls_back);
	tcase_add_test(tc, method_names);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_quant_suite };
