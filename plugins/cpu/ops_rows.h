/* plugins/cpu/ops_rows.h - the bias and ReLU loops for one storage type of
 * the activations, included by ops.c once for f32 and once for bf16 (bf16
 * storage, f32 arithmetic, one rounding): one body, two sets of kernels.
 * ops.c defines before each inclusion:
 *   ROWS_T      the stored element (float, uint16_t)
 *   ROWS_FN(n)  n with the type's suffix (n##_f32, n##_bf16)
 *   ROWS_LD(v)  a stored value as f32, exactly
 *   ROWS_ST(f)  an f32 result rounded to ROWS_T (f32: f itself)
 *   ROWS_LD8(p) the eight stored values at p as a cpu_f32x8, exactly
 *   ROWS_PASS(y, g) g where the stored y is above 0, else 0 (NaN y: 0)
 * which it undefines at its end.  For f32, ROWS_LD and ROWS_ST are the value
 * itself, so the f32 loops are the ones written out for f32 before
 * session 21, bit for bit (and vectorised as they were). */

CPU_CLONES static void ROWS_FN(bias_add_rows)(ROWS_T *y, const float *b, int64_t r0, int64_t r1,
					      int64_t N)
{
	for (int64_t r = r0; r < r1; r++) {
		ROWS_T *yr = y + r * N;
#pragma omp simd
		for (int64_t j = 0; j < N; j++)
			yr[j] = ROWS_ST(ROWS_LD(yr[j]) + b[j]);
	}
}

/* y (R, N) += b (N), b f32 */
static kiln_status ROWS_FN(cpu_bias_add)(const struct cpu_plan *p, const struct kiln_op_args *a,
					 struct cpu_err *e)
{
	const float *b = a->in[0];
	ROWS_T *y = a->out[0];
	const int64_t R = p->rows, N = p->cols;
	(void)e;
#pragma omp parallel if (R * N >= CPU_PAR_MIN)
	{
		const int64_t t = cpu_thread_num(), T = cpu_num_threads();
		ROWS_FN(bias_add_rows)(y, b, R * t / T, R * (t + 1) / T, N);
	}
	return KILN_OK;
}

/* s[0..w) = sum over rows r in order of dy[r*N + j0 + j], in f32: the order
 * of the sum never changes with the thread count, nor with the path taken
 * (each lane adds its column's rows in order, as the scalar loop). */
CPU_CLONES static void ROWS_FN(col_sums)(float *restrict s, const ROWS_T *restrict dy, int64_t R,
					 int64_t N, int64_t j0, int64_t w)
{
	if (w == BIAS_COLS) {
		cpu_f32x8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
		for (int64_t r = 0; r < R; r++) {
			const ROWS_T *row = dy + r * N + j0;
			a0 += ROWS_LD8(row);
			a1 += ROWS_LD8(row + 8);
			a2 += ROWS_LD8(row + 16);
			a3 += ROWS_LD8(row + 24);
		}
		memcpy(s, &a0, sizeof a0);
		memcpy(s + 8, &a1, sizeof a1);
		memcpy(s + 16, &a2, sizeof a2);
		memcpy(s + 24, &a3, sizeof a3);
		return;
	}
	for (int64_t j = 0; j < w; j++)
		s[j] = 0.0f;
	for (int64_t r = 0; r < R; r++) {
		const ROWS_T *row = dy + r * N + j0;
#pragma omp simd
		for (int64_t j = 0; j < w; j++)
			s[j] += ROWS_LD(row[j]);
	}
}

/* db (N) f32 (=|+=) sum over r of dy (R, N).  Parallel over blocks of
 * columns: each block walks the rows in order, so the sum order never
 * changes. */
static kiln_status ROWS_FN(cpu_bias_grad)(const struct cpu_plan *p, const struct kiln_op_args *a,
					  struct cpu_err *e)
{
	const ROWS_T *dy = a->in[0];
	float *db = a->out[0];
	const int64_t R = p->rows, N = p->cols, B = BIAS_COLS;
	const int acc = p->op.flags & KILN_OPF_ACCUMULATE;
	(void)e;
#pragma omp parallel for if (R * N >= CPU_PAR_MIN) schedule(static)
	for (int64_t j0 = 0; j0 < N; j0 += B) {
		float s[BIAS_COLS];
		const int64_t w = N - j0 < B ? N - j0 : B;
		ROWS_FN(col_sums)(s, dy, R, N, j0, w);
		for (int64_t j = 0; j < w; j++)
			db[j0 + j] = acc ? db[j0 + j] + s[j] : s[j];
	}
	return KILN_OK;
}

CPU_CLONES static void ROWS_FN(relu_span)(ROWS_T *y, const ROWS_T *x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = ROWS_LD(x[i]) < 0.0f ? 0 : x[i];
}

/* y (n) = max(x, 0); x == y allowed.  NaN passes through (as in PyTorch), so
 * an overflow is still visible to a loss scaler downstream. */
static kiln_status ROWS_FN(cpu_relu)(const struct cpu_plan *p, const struct kiln_op_args *a,
				     struct cpu_err *e)
{
	const ROWS_T *x = a->in[0];
	ROWS_T *y = a->out[0];
	(void)e;
	CPU_SPANS(p->n, b, en, ROWS_FN(relu_span)(y + b, x + b, en - b));
	return KILN_OK;
}

/* m = y > 0 ? dy : 0 (a select, not a product: an inf dy where y == 0
 * gives 0, not NaN; a NaN y gives 0); dx = m, or dx + m rounded once.
 * ROWS_PASS selects on the stored bits (bf16: a mask of 16-bit integers,
 * so that the loop vectorises; a compare as f32 or a ?: on the bits did
 * not, session 21). */
CPU_CLONES static void ROWS_FN(relu_bwd_span)(ROWS_T *restrict dx, const ROWS_T *restrict y,
					      const ROWS_T *restrict dy, int64_t n, int acc)
{
	if (acc) {
#pragma omp simd
		for (int64_t i = 0; i < n; i++) {
			const ROWS_T m = ROWS_PASS(y[i], dy[i]);
			dx[i] = ROWS_ST(ROWS_LD(dx[i]) + ROWS_LD(m));
		}
	} else {
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			dx[i] = ROWS_PASS(y[i], dy[i]);
	}
}

/* dx (n) (=|+=) y > 0 ? dy : 0, with y (n) the forward output */
static kiln_status ROWS_FN(cpu_relu_bwd)(const struct cpu_plan *p, const struct kiln_op_args *a,
					 struct cpu_err *e)
{
	const ROWS_T *y = a->in[0], *dy = a->in[1];
	ROWS_T *dx = a->out[0];
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	(void)e;
	CPU_SPANS(p->n, b, en, ROWS_FN(relu_bwd_span)(dx + b, y + b, dy + b, en - b, acc));
	return KILN_OK;
}

#undef ROWS_T
#undef ROWS_FN
#undef ROWS_LD
#undef ROWS_ST
#undef ROWS_LD8
#undef ROWS_PASS
