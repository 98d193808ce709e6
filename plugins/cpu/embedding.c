/* plugins/cpu/embedding.c - the embedding lookup (KILN_OP_EMBEDDING) and
 * its backward (KILN_OP_EMBEDDING_BWD), as C loops.
 *
 * Forward: row n of y is row idx[n] of the table (rows in parallel).
 * Backward: dtable[v] (=|+=) sum of dy[n] over the n with idx[n] = v.  Each
 * thread owns a contiguous range of table rows and scans every index,
 * adding the rows of its own range in increasing n: no two threads write
 * one row, and each row's sum is taken in the same order whatever the
 * thread count (no atomics, bit-identical results).
 * An index outside [0, V) is never read or written through: the forward
 * zeroes its row, the backward skips it, and the run reports KILN_EDATA
 * with the first such position.
 */
#include "cpu.h"

#include <string.h>

static kiln_status bad_index(struct cpu_err *e, const struct cpu_plan *p, const int32_t *idx,
			     int64_t n, int64_t V)
{
	return cpu_fail(e, KILN_EDATA, "cpu: %s: index %d at position %lld is outside [0, %lld)",
			cpu_op_name(p->op.type), (int)idx[n], (long long)n, (long long)V);
}

static kiln_status cpu_embedding(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	const int32_t *idx = a->in[0];
	const float *table = a->in[1];
	float *y = a->out[0];
	const int64_t N = p->rows, C = p->cols, V = p->sz[0];
	int64_t first_bad = N;
#pragma omp parallel for if (N * C >= CPU_PAR_MIN) schedule(static) reduction(min : first_bad)
	for (int64_t n = 0; n < N; n++) {
		const int32_t v = idx[n];
		if (v < 0 || v >= V) {
			memset(y + n * C, 0, (size_t)C * sizeof *y);
			if (n < first_bad)
				first_bad = n;
			continue;
		}
		memcpy(y + n * C, table + (int64_t)v * C, (size_t)C * sizeof *y);
	}
	return first_bad < N ? bad_index(e, p, idx, first_bad, V) : KILN_OK;
}

CPU_CLONES void cpu_add_row(float *restrict d, const float *restrict s, int64_t n)
{
#pragma omp simd
	for (int64_t c = 0; c < n; c++)
		d[c] += s[c];
}

static kiln_status cpu_embedding_bwd(const struct cpu_plan *p, const struct kiln_op_args *a,
				     struct cpu_err *e)
{
	const int32_t *idx = a->in[0];
	const float *dy = a->in[1];
	float *dt = a->out[0];
	const int64_t N = p->rows, C = p->cols, V = p->sz[0];
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	int64_t first_bad = N;
#pragma omp parallel if (N * C >= CPU_PAR_MIN || V * C >= CPU_PAR_MIN) reduction(min : first_bad)
	{
		const int64_t t = cpu_thread_num(), T = cpu_num_threads();
		const int64_t v0 = V * t / T, v1 = V * (t + 1) / T;
		if (!acc)
			memset(dt + v0 * C, 0, (size_t)((v1 - v0) * C) * sizeof *dt);
		for (int64_t n = 0; n < N; n++) {
			const int32_t v = idx[n];
			if (v >= v0 && v < v1)
				cpu_add_row(dt + (int64_t)v * C, dy + n * C, C);
			else if ((v < 0 || v >= V) && t == 0 && n < first_bad)
				first_bad = n;
		}
	}
	return first_bad < N ? bad_index(e, p, idx, first_bad, V) : KILN_OK;
}

kiln_status cpu_embedding_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_EMBEDDING_BWD;
	const struct kiln_tensor_desc *table = bwd ? &op->out[0] : &op->in[1];
	const struct kiln_tensor_desc *rows = bwd ? &op->in[1] : &op->out[0];
	if (table->dtype != KILN_F32 || rows->dtype != KILN_F32)
		return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tables and rows are supported");
	p->rows = cpu_numel(&op->in[0]);
	p->cols = table->dims[1];
	p->sz[0] = table->dims[0];
	p->n = cpu_numel(rows);
	p->n_in = 2;
	p->n_out = 1;
	p->kernel = bwd ? cpu_embedding_bwd : cpu_embedding;
	return KILN_OK;
}
