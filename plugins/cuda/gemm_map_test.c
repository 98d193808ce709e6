/* plugins/cuda/gemm_map_test.c - host-only test of cuda_gemm_map (cuda.h),
 * the mapping gemm.c gives cuBLASLt: for every
 * transpose pair and a spread of shapes, evaluate the column-major problem
 * the mapping describes exactly as cuBLAS(Lt) defines it (D = alpha op(A)
 * op(B) + beta C + bias along D's rows, op(X) = X or X^T, X read at
 * X[r + c * ld]) and compare with kiln's row-major definition (plugin.h,
 * KILN_OP_GEMM).  Needs no GPU and no driver, only the headers:
 * tests/gpu/run.sh --prepare builds and runs it,
 *   cc -Iinclude -I. -I/usr/local/cuda/include plugins/cuda/gemm_map_test.c -lm
 * Exit 0 when every case agrees. */
#include "cuda.h" /* cuda_gemm_map: header-only, nothing to link */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static double rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (double)((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* element (r, c) of op(X), X column-major with leading dimension ld */
static double opx(const double *x, int trans, int64_t ld, int64_t r, int64_t c)
{
	return trans ? x[c + r * ld] : x[r + c * ld];
}

static int check(int ta, int tb, int64_t M, int64_t N, int64_t K, int bias, double alpha,
		 double beta)
{
	unsigned s = (unsigned)(M * 131 + N * 17 + K * 7 + ta * 3 + tb);
	double *in0 = malloc(sizeof(double) * (size_t)(M * K));
	double *in1 = malloc(sizeof(double) * (size_t)(K * N));
	double *out = malloc(sizeof(double) * (size_t)(M * N));
	double *ref = malloc(sizeof(double) * (size_t)(M * N));
	double *b = malloc(sizeof(double) * (size_t)N);
	int bad = 0;
	for (int64_t i = 0; i < M * K; i++)
		in0[i] = rnd(&s);
	for (int64_t i = 0; i < K * N; i++)
		in1[i] = rnd(&s);
	for (int64_t i = 0; i < M * N; i++)
		out[i] = ref[i] = rnd(&s);
	for (int64_t i = 0; i < N; i++)
		b[i] = rnd(&s);

	/* kiln, row-major: in0 [M,K] or [K,M] (ta), in1 [K,N] or [N,K] (tb) */
	for (int64_t m = 0; m < M; m++)
		for (int64_t n = 0; n < N; n++) {
			double t = 0;
			for (int64_t k = 0; k < K; k++)
				t += (ta ? in0[k * M + m] : in0[m * K + k]) *
				     (tb ? in1[n * K + k] : in1[k * N + n]);
			ref[m * N + n] = alpha * t + beta * ref[m * N + n] + (bias ? b[n] : 0);
		}

	/* Lt, column-major, from the mapping alone */
	struct cuda_gemm_map g;
	cuda_gemm_map(ta, tb, M, N, K, &g);
	const int64_t om = (int64_t)(g.a_trans ? g.a_cols : g.a_rows); /* rows of op(A) */
	const int64_t ok = (int64_t)(g.a_trans ? g.a_rows : g.a_cols);
	const int64_t okb = (int64_t)(g.b_trans ? g.b_cols : g.b_rows);
	const int64_t on = (int64_t)(g.b_trans ? g.b_rows : g.b_cols);
	if (om != (int64_t)g.c_rows || on != (int64_t)g.c_cols || ok != okb ||
	    g.lda < (int64_t)g.a_rows || g.ldb < (int64_t)g.b_rows || g.ldc < (int64_t)g.c_rows ||
	    (uint64_t)(g.a_rows * g.a_cols) != (uint64_t)(K * N) ||
	    (uint64_t)(g.b_rows * g.b_cols) != (uint64_t)(M * K)) {
		printf("ta=%d tb=%d M=%lld N=%lld K=%lld: inconsistent Lt shapes\n", ta, tb,
		       (long long)M, (long long)N, (long long)K);
		bad = 1;
		goto out;
	}
	for (int64_t i = 0; i < om; i++)
		for (int64_t j = 0; j < on; j++) {
			double t = 0;
			for (int64_t k = 0; k < ok; k++)
				t += opx(in1, g.a_trans, g.lda, i, k) * opx(in0, g.b_trans, g.ldb, k, j);
			double *d = &out[i + j * g.ldc];
			*d = alpha * t + beta * *d + (bias ? b[i] : 0); /* bias along D's rows */
		}
	for (int64_t i = 0; i < M * N && !bad; i++)
		if (fabs(out[i] - ref[i]) > 1e-9 * (1 + fabs(ref[i]))) {
			printf("ta=%d tb=%d M=%lld N=%lld K=%lld bias=%d: out[%lld] = %g, kiln wants %g\n",
			       ta, tb, (long long)M, (long long)N, (long long)K, bias, (long long)i,
			       out[i], ref[i]);
			bad = 1;
		}
out:
	free(in0), free(in1), free(out), free(ref), free(b);
	return bad;
}

int main(void)
{
	static const int64_t sz[] = { 1, 2, 3, 7, 16, 33 };
	int fails = 0, n = 0;
	for (int t = 0; t < 4; t++)
		for (int mi = 0; mi < 6; mi++)
			for (int ni = 0; ni < 6; ni++)
				for (int ki = 0; ki < 6; ki++)
					for (int v = 0; v < 2; v++, n++)
						fails += check(t & 1, t >> 1, sz[mi], sz[ni], sz[ki], v,
							       v ? 0.5 : 1.0, v ? 1.0 : 0.0);
	printf("gemm_map_test: %d of %d cases agree with kiln's row-major GEMM\n", n - fails, n);
	return fails != 0;
}
