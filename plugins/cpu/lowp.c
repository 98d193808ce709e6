/* plugins/cpu/lowp.c - bf16 and f16 tensors for ops whose kernels compute
 * in f32: low-precision storage, f32 arithmetic.
 *
 * An op with bf16/f16 tensors that no kernel of the device takes natively
 * (oneDNN's bf16 GEMM and convolution are native; see cpu_prepare) is
 * prepared as the same op over f32 tensors (the "inner" plan), and each run
 *   1. widens every low-precision input into an f32 copy in the workspace
 *      (a GEMM's or convolution's weight read twice a step below AVX-512:
 *      the copy wcache.c keeps until the weight is written),
 *   2. widens the outputs the op also reads (KILN_OPF_ACCUMULATE, BIAS_ADD's
 *      in-place row, SPLIT's accumulated parts),
 *   3. runs the f32 kernel on the copies,
 *   4. rounds every low-precision output to nearest even, once.
 * So each element is computed exactly as the f32 op computes it and rounded
 * once at the end: the result is the f32 result rounded, which is what the
 * conformance tests (tests/check_device.c) assert.  f16 overflows to
 * infinity there, as on a GPU, so a loss scaler sees it.
 *
 * Workspace: [the inner plan's own | 64-aligned f32 copies, one per
 * low-precision tensor].  Pointers the op passes through unchanged (labels,
 * the dropout step, pooling's aux) are never copied.
 */
#include "cpu.h"
#include "fftconv.h" /* cpu_fftconv_free, cpu_fftconv_reads */

#include <stdlib.h>
#include <string.h>

static size_t lp_align(size_t n) { return (n + 63) & ~(size_t)63; }

int cpu_op_lowp(const struct kiln_op *op)
{
	for (int i = 0; i < op->n_in; i++)
		if (cpu_lowp(op->in[i].dtype))
			return 1;
	for (int i = 0; i < op->n_out; i++)
		if (cpu_lowp(op->out[i].dtype))
			return 1;
	return 0;
}

int cpu_op_has(const struct kiln_op *op, int dtype)
{
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].dtype == dtype)
			return 1;
	for (int i = 0; i < op->n_out; i++)
		if (op->out[i].dtype == dtype)
			return 1;
	return 0;
}

/* ---- conversion spans --------------------------------------------------- */

CPU_CLONES static void bf16_to_f32_span(float *restrict y, const uint16_t *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		const uint32_t u = (uint32_t)x[i] << 16;
		float f;
		__builtin_memcpy(&f, &u, sizeof f);
		y[i] = f;
	}
}

CPU_CLONES static void f32_to_bf16_span(uint16_t *restrict y, const float *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = cpu_bf16_round(x[i]);
}

/* f16 <-> f32: the x86-64-v3/v4 clones (AVX2/AVX-512 with F16C) convert
 * 8 or 16 elements per vcvtph2ps / vcvtps2ph (round to nearest even, as
 * the scalar conversion); the baseline clone is scalar. */
#if KILN_CLONES_OK /* cpu.h: ../common/clones.h */
#define CPU_F16_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_F16_CLONES
#endif

CPU_F16_CLONES static void f16_to_f32_span(float *restrict y, const _Float16 *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = (float)x[i];
}

CPU_F16_CLONES static void f32_to_f16_span(_Float16 *restrict y, const float *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = (_Float16)x[i]; /* round to nearest even; past 65504: inf */
}

static void to_f32_span(float *y, const void *x, int dtype, int64_t b, int64_t e)
{
	if (dtype == KILN_BF16)
		bf16_to_f32_span(y + b, (const uint16_t *)x + b, e - b);
	else if (dtype == KILN_F16)
		f16_to_f32_span(y + b, (const _Float16 *)x + b, e - b);
	else
		memcpy(y + b, (const float *)x + b, (size_t)(e - b) * sizeof(float));
}

void cpu_cvt_to_f32_span(float *y, const void *x, int dtype, int64_t n)
{
	to_f32_span(y, x, dtype, 0, n);
}

void cpu_cvt_span_from_f32(void *y, const float *x, int dtype, int64_t n)
{
	if (dtype == KILN_BF16)
		f32_to_bf16_span(y, x, n);
	else if (dtype == KILN_F16)
		f32_to_f16_span(y, x, n);
	else if (y != x)
		memmove(y, x, (size_t)n * sizeof(float));
}

void cpu_cvt_to_f32(float *y, const void *x, int dtype, int64_t n)
{
	CPU_SPANS(n, b, e, to_f32_span(y, x, dtype, b, e));
}

void cpu_cvt_from_f32(void *y, const float *x, int dtype, int64_t n)
{
	const size_t es = dtype == KILN_F32 ? 4 : 2;
	CPU_SPANS(n, b, e, cpu_cvt_span_from_f32((char *)y + (size_t)b * es, x + b, dtype, e - b));
}

/* ---- the wrapper -------------------------------------------------------- */

/* One widening of a run: y (n) f32 = x (n) in dtype. */
struct lp_cvt {
	float *y;
	const void *x;
	int dtype;
	int64_t n;
};

/* 1 when the inner plan never reads input i, which is then neither
 * widened nor passed: NULL, never stale data.  The contract is
 * fftconv.c's cpu_fftconv_reads (its weight and data gradients with kept
 * spectra read x's spectrum, or dy's and w's, from the kept copy, never
 * x, or dy and w), and its kernel (fc_run) returns KILN_EINVAL for a NULL
 * input it would read, so a drift between the two is an error, not a
 * fault.  Every other inner plan reads all its inputs. */
static int lp_unread(const struct cpu_plan *p, int i)
{
	return p->inner->fft && !cpu_fftconv_reads(&p->inner->op, i);
}

static kiln_status cpu_lowp_run(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const struct cpu_plan *q = p->inner;
	const struct kiln_op *op = &p->op;
	struct kiln_op_args b = *a;
	char *ws = a->workspace;
	b.workspace = q->workspace ? ws : NULL;
	b.workspace_bytes = q->workspace;
	/* every widening in one parallel region (one team wake-up, not one
	 * per tensor: a GEMM on the f32 kernel widens two or three) */
	struct lp_cvt cv[KILN_OP_MAX_IN + KILN_OP_MAX_OUT];
	unsigned ticket[KILN_OP_MAX_IN] = { 0 }; /* kept copies widened now */
	const float *held[KILN_OP_MAX_IN] = { 0 }; /* kept copies read (cpu_wc_done) */
	int n_cv = 0;
	int64_t total = 0;
	for (int i = 0; i < op->n_in; i++) {
		if (p->lp_off[i] < 0 || !a->in[i])
			continue;
		if (lp_unread(p, i)) {
			b.in[i] = NULL;
			continue;
		}
		const float *k = cpu_wc_get(p->wc, a->in[i], op->in[i].dtype, cpu_numel(&op->in[i]),
					    &ticket[i]);
		/* a weight's kept copy: widened by an earlier run (wcache.c), or
		 * (a ticket) now, below, with the other inputs */
		float *t = k ? (float *)k : (float *)(ws + p->lp_off[i]);
		held[i] = k;
		if (k && !ticket[i]) {
			b.in[i] = k;
			continue;
		}
		cv[n_cv++] = (struct lp_cvt){ t, a->in[i], op->in[i].dtype, cpu_numel(&op->in[i]) };
		b.in[i] = t;
	}
	for (int i = 0; i < op->n_out; i++) {
		const int64_t off = p->lp_off[KILN_OP_MAX_IN + i];
		if (off < 0 || !a->out[i])
			continue;
		float *t = (float *)(ws + off);
		if (p->lp_pre >> i & 1)
			cv[n_cv++] = (struct lp_cvt){ t, a->out[i], op->out[i].dtype,
						     cpu_numel(&op->out[i]) };
		b.out[i] = t;
	}
	for (int k = 0; k < n_cv; k++)
		total += cv[k].n;
#pragma omp parallel if (total >= CPU_PAR_MIN)
	{
		const int64_t t_ = cpu_thread_num(), T_ = cpu_num_threads();
		for (int k = 0; k < n_cv; k++) { /* the spans of CPU_SPANS */
			const int64_t n = cv[k].n, lo = (n * t_ / T_) & ~(int64_t)15;
			const int64_t hi = t_ + 1 == T_ ? n : (n * (t_ + 1) / T_) & ~(int64_t)15;
			if (hi > lo)
				to_f32_span(cv[k].y, cv[k].x, cv[k].dtype, lo, hi);
		}
	}
	for (int i = 0; i < op->n_in; i++)
		if (ticket[i])
			cpu_wc_filled(p->wc, b.in[i], ticket[i]);
	/* the inner plan's weights are conversions (in the workspace, or
	 * wcache.c's copies): what it keeps of them is its own, made again
	 * when the core says in1 changed (wshare.c) */
	cpu_wshare_private_begin(op->n_in > 1 ? a->in[1] : NULL);
	kiln_status st = q->kernel(q, &b, e);
	cpu_wshare_private_end();
	for (int i = 0; i < op->n_in; i++)
		cpu_wc_done(p->wc, held[i]);
	if (st)
		return st;
	for (int i = 0; i < op->n_out; i++) {
		const int64_t off = p->lp_off[KILN_OP_MAX_IN + i];
		if (off >= 0 && a->out[i])
			cpu_cvt_from_f32(a->out[i], (const float *)(ws + off), op->out[i].dtype,
					 cpu_numel(&op->out[i]));
	}
	return KILN_OK;
}

void cpu_plan_release(struct cpu_plan *p)
{
	if (!p)
		return;
	cpu_gemm_free(p->gemm);
	cpu_dnn_free(p->dnn);
	cpu_variants_free(p->variants);
	cpu_wsplit_free(p->wsplit);
	p->wsplit = NULL;
	cpu_qcache_free(p->qcache);
	p->qcache = NULL;
	cpu_fftconv_free(p->fft);
	p->fft = NULL;
	cpu_wino_free(p->wino);
	p->wino = NULL;
	p->gemm = NULL;
	p->dnn = NULL;
	p->variants = NULL;
	if (p->inner) {
		cpu_plan_release(p->inner);
		free(p->inner);
		p->inner = NULL;
	}
}

kiln_status cpu_lowp_prepare(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *))
{
	const struct kiln_op *op = &p->op;
	struct cpu_plan *q = calloc(1, sizeof *q);
	kiln_status st;
	if (!q)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan",
				      cpu_op_name(op->type));
	q->op = *op;
	for (int i = 0; i < op->n_in; i++)
		if (cpu_lowp(q->op.in[i].dtype))
			q->op.in[i].dtype = KILN_F32;
	for (int i = 0; i < op->n_out; i++)
		if (cpu_lowp(q->op.out[i].dtype))
			q->op.out[i].dtype = KILN_F32;
	/* a convolution's f32 op takes the f32 convolutions' algorithm
	 * ([plugin.cpu] conv_algo, conv_impl: the FFT for the CNN's conv2
	 * under rule); the GEMMs and the rest their family's kernel */
	st = family == cpu_conv_prepare ? cpu_tune_conv_algo(c, q) : family(c, q);
	if (st) {
		cpu_plan_release(q);
		free(q);
		return st;
	}
	size_t off = lp_align(q->workspace);
	for (int i = 0; i < KILN_OP_MAX_IN + KILN_OP_MAX_OUT; i++)
		p->lp_off[i] = -1;
	for (int k = 0; k < 2; k++) {
		const int n = k ? op->n_out : op->n_in;
		for (int i = 0; i < n; i++) {
			const struct kiln_tensor_desc *d = k ? &op->out[i] : &op->in[i];
			if (!cpu_lowp(d->dtype))
				continue;
			p->lp_off[k * KILN_OP_MAX_IN + i] = (int64_t)off;
			off += lp_align((size_t)cpu_numel(d) * sizeof(float));
		}
	}
	/* outputs the op reads before writing */
	p->lp_pre = 0;
	if ((op->flags & KILN_OPF_ACCUMULATE) || op->type == KILN_OP_BIAS_ADD)
		p->lp_pre |= 1;
	if (op->type == KILN_OP_SPLIT)
		p->lp_pre |= (int)op->i[1];
	p->inner = q;
	if (op->type == KILN_OP_GEMM || op->type == KILN_OP_CONV || op->type == KILN_OP_CONV_BWD_DATA)
		p->wc = c->wc;
	p->workspace = off;
	p->aux = q->aux;
	p->n_in = q->n_in;
	p->n_out = q->n_out;
	p->kernel = cpu_lowp_run;
	return KILN_OK;
}
