/* tests/check_cpu_fft16.c - plugins/cpu/fft16.c (compiled in): 16 x 16
 * real 2-d DFTs of 16 planes at once against FFTW's fftwf_plan_dft_r2c_2d
 * and _c2r_2d on each plane alone, the same definitions (sign, order of
 * the 144 frequencies, no normalisation), for planes of every height h
 * the forward reads (rows h.. zero); the inverse on spectra that are not
 * Hermitian in their columns k2 = 0 and 8, where FFTW's c2r reads only
 * what fft16.c does; the same bits on a second call.
 *
 * Tolerance: |got - FFTW| <= 2e-6 of the largest |value| of the result
 * (a float FFT of 256 points: errors of a few eps log2(256) of the norm;
 * measured on the Zen 4: 2.4e-6 absolute on spectra of magnitude 12, 2e-7
 * relative).  A wrong sign, twiddle or index is off by order 1.  Skips
 * (77) where the build or the CPU has no AVX-512F, or there is no FFTW.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_main.h"

#include "../plugins/cpu/fft16.h"

#if HAVE_FFTW
#include <fftw3.h>

#define TOL 2e-6

static float *lines(int n)
{
	float *p = aligned_alloc(64, (size_t)n * 16 * sizeof(float));
	ck_assert(p);
	return p;
}

static uint32_t rng = 12345;
static float uni(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

START_TEST(test_r2c)
{
	float *x = lines(FFT16_PLANE_LINES), *out = lines(FFT16_SPEC_LINES);
	float *again = lines(FFT16_SPEC_LINES), *re = fftwf_alloc_real(256);
	fftwf_complex *sp = fftwf_alloc_complex(144);
	fftwf_plan pl = fftwf_plan_dft_r2c_2d(16, 16, re, sp, FFTW_ESTIMATE);
	static const int hs[] = { 16, 15, 14, 9, 2, 1 };
	for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++) {
		const int h = hs[hi];
		for (int i = 0; i < 256 * 16; i++) /* rows h.. hold garbage: not read */
			x[i] = i / 256 < h ? uni() : 1e30f;
		cpu_fft16_r2c(x, h, out);
		cpu_fft16_r2c(x, h, again);
		ck_assert_msg(!memcmp(out, again, FFT16_SPEC_LINES * 16 * sizeof(float)),
			      "h %d: other bits on a second call", h);
		double worst = 0, big = 0;
		for (int p = 0; p < 16; p++) {
			for (int i = 0; i < 256; i++)
				re[i] = i / 16 < h ? x[i * 16 + p] : 0.0f;
			fftwf_execute(pl);
			for (int k = 0; k < 144; k++)
				for (int c = 0; c < 2; c++) {
					const double e = fabs(sp[k][c] - out[(2 * k + c) * 16 + p]);
					worst = e > worst ? e : worst;
					big = fabs(sp[k][c]) > big ? fabs(sp[k][c]) : big;
				}
		}
		ck_assert_msg(worst <= TOL * big, "r2c h %d: off FFTW's by %.3g (largest %.3g)", h, worst, big);
		printf("fft16: r2c h %2d: off FFTW's by %.3g of %.3g\n", h, worst / big, big);
	}
	fftwf_destroy_plan(pl);
	fftwf_free(re), fftwf_free(sp), free(x), free(out), free(again);
}
END_TEST

START_TEST(test_c2r)
{
	float *in = lines(FFT16_SPEC_LINES), *keep = lines(FFT16_SPEC_LINES);
	float *z = lines(FFT16_PLANE_LINES), *z2 = lines(FFT16_PLANE_LINES);
	float *re = fftwf_alloc_real(256);
	fftwf_complex *sp = fftwf_alloc_complex(144);
	fftwf_plan pl = fftwf_plan_dft_c2r_2d(16, 16, sp, re, FFTW_ESTIMATE);
	/* any spectrum: not Hermitian in the columns k2 = 0 and 8, imaginary
	 * parts at (0, 0), (8, 0), (0, 8), (8, 8) too */
	for (int i = 0; i < FFT16_SPEC_LINES * 16; i++)
		keep[i] = 8.0f * uni();
	memcpy(in, keep, FFT16_SPEC_LINES * 16 * sizeof(float));
	cpu_fft16_c2r(in, z);
	memcpy(in, keep, FFT16_SPEC_LINES * 16 * sizeof(float));
	cpu_fft16_c2r(in, z2);
	ck_assert_msg(!memcmp(z, z2, FFT16_PLANE_LINES * 16 * sizeof(float)), "c2r: other bits on a second call");
	double worst = 0, big = 0;
	for (int p = 0; p < 16; p++) {
		for (int k = 0; k < 144; k++)
			sp[k][0] = keep[2 * k * 16 + p], sp[k][1] = keep[(2 * k + 1) * 16 + p];
		fftwf_execute(pl); /* (c2r overwrites its input) */
		for (int i = 0; i < 256; i++) {
			const double e = fabs(re[i] - z[i * 16 + p]);
			worst = e > worst ? e : worst;
			big = fabs(re[i]) > big ? fabs(re[i]) : big;
		}
	}
	ck_assert_msg(worst <= TOL * big, "c2r: off FFTW's by %.3g (largest %.3g)", worst, big);
	printf("fft16: c2r: off FFTW's by %.3g of %.3g\n", worst / big, big);
	/* the round trip: 256 times the planes */
	float *x = lines(FFT16_PLANE_LINES);
	for (int i = 0; i < 256 * 16; i++)
		x[i] = uni();
	cpu_fft16_r2c(x, 16, in);
	cpu_fft16_c2r(in, z);
	worst = 0;
	for (int i = 0; i < 256 * 16; i++) {
		const double e = fabs(z[i] / 256.0 - x[i]);
		worst = e > worst ? e : worst;
	}
	ck_assert_msg(worst <= 1e-6, "round trip off by %.3g", worst);
	fftwf_destroy_plan(pl);
	fftwf_free(re), fftwf_free(sp), free(in), free(keep), free(z), free(z2), free(x);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("cpu_fft16");
	check_add_case(s, "transforms", 30, NULL, NULL, (const TTest *[]){ test_r2c, test_c2r, NULL });
	return s;
}

static int need_avx512(void)
{
	if (cpu_fft16_ok())
		return 0;
	printf("SKIP: fft16.c needs AVX-512F (this build or CPU has none)\n");
	return 77;
}

static const struct check_main check_suite = { .suite = make_suite, .setup = need_avx512 };
#else
static int no_fftw(void)
{
	printf("SKIP: this build has no FFTW to compare with\n");
	return 77;
}
static const struct check_main check_suite = { .setup = no_fftw };
#endif
