/* plugins/cpu/fft16.c - 16 x 16 real 2-d DFTs of 16 planes at once, one
 * plane a lane of AVX-512 vectors (the contract: fft16.h).
 *
 * The forward transform is FFTW's decomposition: 16-point transforms
 * along each row (q), keeping k2 = 0..8, then 16-point complex transforms
 * along each of those 9 columns (r).  The rows are real: two of them, a
 * and b, go through one complex transform of z = a + i b, whose result Z
 * gives A[k] = (Z[k] + conj Z[-k]) / 2 and B[k] = (Z[k] - conj Z[-k]) / 2i.
 * The inverse mirrors it: the columns' inverse transforms, then for two
 * rows at once the complex inverse of A + i B (A and B extended to all 16
 * k by Hermitian symmetry), whose real part is row a and imaginary part
 * row b.  Each 16-point transform is radix 4 x 4 (fft16v): 4-point
 * transforms over n1 of x[4 n1 + n2], twiddles w^(n2 k1), then 4-point
 * transforms over n2 into X[k1 + 4 k2].  Products and sums are separate
 * instructions (the plugin's -ffp-contract=off): the same bits on every
 * call.
 */
#include "fft16.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

#define F16 __attribute__((target("avx512f")))
#define F16I __attribute__((target("avx512f"), always_inline)) inline

int cpu_fft16_ok(void) { return __builtin_cpu_supports("avx512f"); }

typedef struct {
	__m512 r, i;
} cv;

F16I static cv cv_add(cv a, cv b) { return (cv){ _mm512_add_ps(a.r, b.r), _mm512_add_ps(a.i, b.i) }; }
F16I static cv cv_sub(cv a, cv b) { return (cv){ _mm512_sub_ps(a.r, b.r), _mm512_sub_ps(a.i, b.i) }; }

/* cos and sin of 2 pi m / 16, m = n2 k1 <= 9 */
static const float tw_c[10] = { 1.0f, 0.92387953251128674f, 0.70710678118654752f,
				0.38268343236508978f, 0.0f, 0.0f, -0.70710678118654752f, 0.0f, 0.0f,
				-0.92387953251128674f };
static const float tw_s[10] = { 0.0f, 0.38268343236508978f, 0.70710678118654752f,
				0.92387953251128674f, 1.0f, 0.0f, 0.70710678118654752f, 0.0f, 0.0f,
				-0.38268343236508978f };

/* y e^(-+ 2 pi i m / 16): the forward's (inv 0) or the inverse's */
F16I static cv cv_twiddle(cv y, int m, int inv)
{
	const __m512 c = _mm512_set1_ps(tw_c[m]), d = _mm512_set1_ps(inv ? tw_s[m] : -tw_s[m]);
	return (cv){ _mm512_sub_ps(_mm512_mul_ps(y.r, c), _mm512_mul_ps(y.i, d)),
		     _mm512_add_ps(_mm512_mul_ps(y.r, d), _mm512_mul_ps(y.i, c)) };
}

/* The 4-point transform of a0..a3 into a0..a3 (forward: w = -i) */
F16I static void dft4(cv *a0, cv *a1, cv *a2, cv *a3, int inv)
{
	const cv b0 = cv_add(*a0, *a2), b1 = cv_sub(*a0, *a2);
	const cv b2 = cv_add(*a1, *a3), b3 = cv_sub(*a1, *a3);
	/* b1 -+ i b3 and b1 +- i b3 */
	const cv m = { _mm512_add_ps(b1.r, b3.i), _mm512_sub_ps(b1.i, b3.r) };
	const cv p = { _mm512_sub_ps(b1.r, b3.i), _mm512_add_ps(b1.i, b3.r) };
	*a0 = cv_add(b0, b2);
	*a2 = cv_sub(b0, b2);
	*a1 = inv ? p : m;
	*a3 = inv ? m : p;
}

/* The 16-point transform of x in place (unnormalised; inv: sign +1). */
F16I static void fft16v(cv x[16], int inv)
{
	cv y[16]; /* y[4 n2 + k1] */
#pragma GCC unroll 4
	for (int n2 = 0; n2 < 4; n2++) {
		cv a0 = x[n2], a1 = x[4 + n2], a2 = x[8 + n2], a3 = x[12 + n2];
		dft4(&a0, &a1, &a2, &a3, inv);
		y[4 * n2] = a0;
		y[4 * n2 + 1] = n2 ? cv_twiddle(a1, n2, inv) : a1;
		y[4 * n2 + 2] = n2 ? cv_twiddle(a2, 2 * n2, inv) : a2;
		y[4 * n2 + 3] = n2 ? cv_twiddle(a3, 3 * n2, inv) : a3;
	}
#pragma GCC unroll 4
	for (int k1 = 0; k1 < 4; k1++) {
		cv a0 = y[k1], a1 = y[4 + k1], a2 = y[8 + k1], a3 = y[12 + k1];
		dft4(&a0, &a1, &a2, &a3, inv);
		x[k1] = a0, x[k1 + 4] = a1, x[k1 + 8] = a2, x[k1 + 12] = a3;
	}
}

/* complex k of a spectrum buffer: lines 2 k (real), 2 k + 1 */
F16I static cv ld_c(const float *s, int k)
{
	return (cv){ _mm512_load_ps(s + 32 * k), _mm512_load_ps(s + 32 * k + 16) };
}

F16I static void st_c(float *s, int k, cv v)
{
	_mm512_store_ps(s + 32 * k, v.r);
	_mm512_store_ps(s + 32 * k + 16, v.i);
}

/* The 9 columns' 16-point transforms along r (or k1), in place: complex
 * r 9 + k2 of s. */
F16 static void fft16_columns(float *s, int inv)
{
	for (int k2 = 0; k2 < 9; k2++) {
		cv c[16];
#pragma GCC unroll 16
		for (int r = 0; r < 16; r++)
			c[r] = ld_c(s, r * 9 + k2);
		fft16v(c, inv);
#pragma GCC unroll 16
		for (int r = 0; r < 16; r++)
			st_c(s, r * 9 + k2, c[r]);
	}
}

F16 void cpu_fft16_r2c(const float *x, int h, float *out)
{
	const __m512 half = _mm512_set1_ps(0.5f), zero = _mm512_setzero_ps();
	for (int a = 0; a < 16; a += 2) {
		if (a >= h) { /* both rows zero */
			for (int k = 0; k < 18; k++)
				st_c(out, a * 9 + k, (cv){ zero, zero });
			continue;
		}
		cv z[16];
#pragma GCC unroll 16
		for (int q = 0; q < 16; q++)
			z[q] = (cv){ _mm512_load_ps(x + (a * 16 + q) * 16),
				     a + 1 < h ? _mm512_load_ps(x + ((a + 1) * 16 + q) * 16) : zero };
		fft16v(z, 0);
		/* A[k] = (Z[k] + conj Z[m]) / 2, B[k] = (Z[k] - conj Z[m]) / 2i,
		 * m = -k mod 16; at k = 0 and 8 (m = k): Z's parts */
		st_c(out, a * 9, (cv){ z[0].r, zero });
		st_c(out, (a + 1) * 9, (cv){ z[0].i, zero });
		st_c(out, a * 9 + 8, (cv){ z[8].r, zero });
		st_c(out, (a + 1) * 9 + 8, (cv){ z[8].i, zero });
#pragma GCC unroll 8
		for (int k = 1; k < 8; k++) {
			const cv p = z[k], m = z[16 - k];
			st_c(out, a * 9 + k,
			     (cv){ _mm512_mul_ps(_mm512_add_ps(p.r, m.r), half),
				   _mm512_mul_ps(_mm512_sub_ps(p.i, m.i), half) });
			st_c(out, (a + 1) * 9 + k,
			     (cv){ _mm512_mul_ps(_mm512_add_ps(p.i, m.i), half),
				   _mm512_mul_ps(_mm512_sub_ps(m.r, p.r), half) });
		}
	}
	fft16_columns(out, 0);
}

F16 void cpu_fft16_c2r(float *in, float *z)
{
	fft16_columns(in, 1);
	for (int a = 0; a < 16; a += 2) {
		/* Z[k] = A[k] + i B[k] over all 16 k, A and B Hermitian: the
		 * imaginary parts of k = 0 and 8 not read */
		cv s[16];
		const cv a0 = ld_c(in, a * 9), b0 = ld_c(in, (a + 1) * 9);
		const cv a8 = ld_c(in, a * 9 + 8), b8 = ld_c(in, (a + 1) * 9 + 8);
		s[0] = (cv){ a0.r, b0.r };
		s[8] = (cv){ a8.r, b8.r };
#pragma GCC unroll 8
		for (int k = 1; k < 8; k++) {
			const cv A = ld_c(in, a * 9 + k), B = ld_c(in, (a + 1) * 9 + k);
			s[k] = (cv){ _mm512_sub_ps(A.r, B.i), _mm512_add_ps(A.i, B.r) };
			s[16 - k] = (cv){ _mm512_add_ps(A.r, B.i), _mm512_sub_ps(B.r, A.i) };
		}
		fft16v(s, 1);
#pragma GCC unroll 16
		for (int q = 0; q < 16; q++) {
			_mm512_store_ps(z + (a * 16 + q) * 16, s[q].r);
			_mm512_store_ps(z + ((a + 1) * 16 + q) * 16, s[q].i);
		}
	}
}

#else /* no AVX-512 code in this build */

int cpu_fft16_ok(void) { return 0; }
void cpu_fft16_r2c(const float *x, int h, float *out) { (void)x, (void)h, (void)out; }
void cpu_fft16_c2r(float *in, float *z) { (void)in, (void)z; }

#endif
