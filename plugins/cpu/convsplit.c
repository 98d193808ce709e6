/* plugins/cpu/convsplit.c - a convolution's weight gradient in fixed
 * blocks of the minibatch, so that its bytes do not depend on the team.
 *
 * dw (and db) is a sum over the minibatch.  oneDNN's backward-weights
 * kernel splits that sum by the thread count it was made for, so a plan
 * made for 2 threads and its version for 1 give other bytes, and under
 * kiln's rule (a result never depends on the team's history, dnnteam.c)
 * the op stayed on the opening team when a core was taken: every step met
 * the busy core at its barriers (docs/PERFORMANCE.md, "Steady with a busy
 * core ... session 9").
 *
 * Here the minibatch of N samples is cut into K blocks of B = N / K
 * (cpu_conv_wsplit: K from the shape alone); when K does not divide N
 * (a batch with no divisor 2..8), the first N % K blocks take B + 1
 * samples.  Each block is the same op for its samples, prepared as an
 * ordinary convolution plan (reorders in, the kernel, the reorder of dw
 * out; conv.c) for one thread, with the kernel the whole op was given
 * (p->kern_f32: tune.c's choice for a bf16 op, timed on the whole op in
 * blocks; p->conv_impl); it writes its dw and db into a partial of its
 * own in the workspace, and the partials are added in block order into
 * the caller's dw and db (or added to them with KILN_OPF_ACCUMULATE).
 * dw and db are f32 for bf16 activations too (oneDNN's bf16 kernel
 * accumulates and writes them in f32, conv.c), so a bf16 op's partials
 * and their sum are f32 as well.  A team of n threads runs the blocks n at a
 * time, each thread with a block plan of its own (its own memory objects,
 * stream and workspace slot); a team of one runs them in turn.  Which
 * thread runs a block never changes its bytes, so the result is the same
 * on any team and the plan needs no versions: it follows the adaptive team
 * down and up at once.
 *
 * A batch slice is contiguous in every activation layout the kernels use
 * (NCHW, NHWC, nChw16c: the sample is the outermost dimension), so a block
 * reads x and dy, and the kept copies (KILN_OPF_KEEP: x's blocked copy the
 * forward left, dy's blocked copy left for the data gradient), at an
 * offset, without copies.  That needs the block kernel's layouts to be the
 * whole op's, checked at prepare (else the op is prepared whole).
 */
#include "dnn.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define WSPLIT_ALIGN 64

struct cpu_wsplit {
	int k;                  /* blocks */
	int64_t b, rem;         /* samples of a block: b + 1 for the first rem, else b */
	int slots;              /* block plans: blocks run at once, at most */
	/* [slots]: the op for b samples, made for one thread; [slots + s]:
	 * for b + 1 (rem > 0 only) */
	struct cpu_plan **blk;
	size_t slot_ws;         /* a block plan's workspace (aligned) */
	size_t dw_at, db_at;    /* the partials' offsets in the workspace */
	size_t dw_step, db_step; /* bytes between two blocks' partials */
	int64_t n_dw, n_db;     /* elements of dw and db (0: no bias) */
	/* bytes of one sample of x, dy, the kept x (in2) and the kept dy (the
	 * last output), 0 for none */
	size_t x_step, dy_step, kin_step, kout_step;
};

/* block plans: one size, or two (unequal blocks) */
static int wsplit_plans(const struct cpu_wsplit *w) { return w->slots * (w->rem ? 2 : 1); }

static size_t wal(size_t n) { return (n + WSPLIT_ALIGN - 1) & ~(size_t)(WSPLIT_ALIGN - 1); }

void cpu_wsplit_free(struct cpu_wsplit *w)
{
	if (!w)
		return;
	for (int s = 0; w->blk && s < wsplit_plans(w); s++)
		if (w->blk[s]) {
			cpu_plan_release(w->blk[s]);
			free(w->blk[s]);
		}
	free(w->blk);
	free(w);
}

/* md with its minibatch dimension set to n (as if made for n samples). */
static dnnl_memory_desc_t with_batch(const dnnl_memory_desc_t *md, int64_t n)
{
	dnnl_memory_desc_t m = *md;
	m.dims[0] = n;
	m.padded_dims[0] = n;
	return m;
}

/* 1 when a block op (for one thread) reads x and dy in the whole op's
 * layouts (for the opening team): its kept copies are the whole op's
 * slices.  Restores the calling thread's OpenMP count. */
static int same_layouts(struct cpu_ctx *c, const struct cpu_plan *p, const struct kiln_op *bop)
{
	const int team = omp_get_max_threads();
	struct cpu_plan whole, blk;
	dnnl_memory_desc_t wx, wy, bx, by;
	memset(&whole, 0, sizeof whole);
	memset(&blk, 0, sizeof blk);
	whole.op = p->op;
	blk.op = *bop;
	const int64_t N = p->op.in[0].dims[0];
	omp_set_num_threads(c->threads);
	int ok = cpu_conv_act_layouts(c, &whole, &wx, &wy) == KILN_OK;
	omp_set_num_threads(1);
	ok = ok && cpu_conv_act_layouts(c, &blk, &bx, &by) == KILN_OK;
	omp_set_num_threads(team);
	if (!ok)
		return 0;
	bx = with_batch(&bx, N), by = with_batch(&by, N);
	return dnnl_memory_desc_equal(&wx, &bx) && dnnl_memory_desc_equal(&wy, &by);
}

/* The op of one block of nb samples: x and dy cut, the kept copy in
 * (u8, its first dimension) cut to nb samples' bytes, dw and db written,
 * not added. */
static int block_op(const struct kiln_op *op, int64_t nb, struct kiln_op *bop)
{
	const int keep = (op->flags & KILN_OPF_KEEP) != 0;
	const int64_t N = op->in[0].dims[0];
	*bop = *op;
	bop->flags &= ~(uint32_t)KILN_OPF_ACCUMULATE;
	bop->in[0].dims[0] = nb;
	bop->in[1].dims[0] = nb;
	if (!keep)
		return 1;
	/* the kept dy (the last output) is as large as the plan says (aux) */
	struct kiln_tensor_desc *kin = op->n_in > 2 ? &bop->in[2] : NULL;
	if (kin && (kin->ndim != 1 || kin->dims[0] % N))
		return 0;
	if (kin)
		kin->dims[0] = kin->dims[0] / N * nb;
	return 1;
}

/* The block plans, one per thread that may run a block at once (and per
 * block size), each prepared whole for one thread with the kernel chosen
 * for the whole op (p->kern_f32, p->conv_impl).  bop[0]: the op of b
 * samples, bop[1] of b + 1.  Restores the calling thread's count. */
static kiln_status block_plans(struct cpu_ctx *c, const struct cpu_plan *p, struct cpu_wsplit *w,
			       const struct kiln_op *bop)
{
	const int team = omp_get_max_threads();
	kiln_status st = KILN_OK;
	omp_set_num_threads(1);
	for (int s = 0; s < wsplit_plans(w) && !st; s++) {
		struct cpu_plan *q = calloc(1, sizeof *q);
		if (!q) {
			st = c->host->error(KILN_ENOMEM, "cpu: out of memory for a CONV_BWD_WEIGHTS plan");
			break;
		}
		w->blk[s] = q;
		q->op = bop[s >= w->slots];
		q->kern_f32 = p->kern_f32;
		q->conv_impl = p->conv_impl;
		st = cpu_conv_prepare_whole(c, q);
	}
	omp_set_num_threads(team);
	return st;
}

/* Block k on block plan s: x, dy and the kept copies at the block's
 * offset; dw and db into the block's partials; the plan's workspace slot. */
static kiln_status run_block(const struct cpu_plan *p, int s, int k, const struct kiln_op_args *a,
			     struct cpu_err *e)
{
	const struct cpu_wsplit *w = p->wsplit;
	const int big = k < w->rem; /* b + 1 samples */
	const struct cpu_plan *q = w->blk[big ? w->slots + s : s];
	/* the block's first sample */
	const size_t at = (size_t)(k * w->b + (big ? k : w->rem));
	char *ws = a->workspace;
	struct kiln_op_args b = *a;
	b.in[0] = (const char *)a->in[0] + at * w->x_step;
	b.in[1] = (const char *)a->in[1] + at * w->dy_step;
	if (w->kin_step)
		b.in[2] = (const char *)a->in[2] + at * w->kin_step;
	b.out[0] = ws + w->dw_at + (size_t)k * w->dw_step;
	if (w->n_db)
		b.out[1] = ws + w->db_at + (size_t)k * w->db_step;
	if (w->kout_step)
		b.out[p->op.n_out - 1] = (char *)a->out[p->op.n_out - 1] + at * w->kout_step;
	b.workspace = ws + (size_t)s * w->slot_ws;
	b.workspace_bytes = w->slot_ws;
	return q->kernel(q, &b, e);
}

/* out (=|+=) the sum of the k partials at part (step bytes apart), added
 * in block order; each element's sum is the same whatever the spans. */
static void add_partials(float *out, const char *part, size_t step, int k, int64_t n, int acc)
{
	float *p0 = (float *)part;
	CPU_SPANS(n, b, e, {
		for (int j = 1; j < k; j++)
			cpu_add_row(p0 + b, (const float *)(part + (size_t)j * step) + b, e - b);
		if (acc)
			cpu_add_row(out + b, p0 + b, e - b);
		else
			memcpy(out + b, p0 + b, (size_t)(e - b) * sizeof *out);
	});
}

static kiln_status wsplit_run(const struct cpu_plan *p, const struct kiln_op_args *a,
			      struct cpu_err *e)
{
	const struct cpu_wsplit *w = p->wsplit;
	/* the team kiln's loops run with now (cpu_exec set it) */
	const int team = omp_get_max_threads();
	const int n = team < w->slots ? team : w->slots;
	kiln_status st = KILN_OK;
	if (n > 1) {
		int next = 0;
#pragma omp parallel num_threads(cpu_team_whole(n)) /* members from n on idle */
		{
			const int s = omp_get_thread_num();
			struct cpu_err mine;
			omp_set_num_threads(1); /* this thread's blocks: one thread each */
			for (int k; s < n && (k = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < w->k;)
				if (run_block(p, s, k, a, &mine) != KILN_OK) {
#pragma omp critical(cpu_wsplit_err)
					if (st == KILN_OK) {
						st = mine.st;
						*e = mine;
					}
				}
		}
	} else {
		if (team != 1)
			omp_set_num_threads(1);
		for (int k = 0; k < w->k && st == KILN_OK; k++)
			st = run_block(p, 0, k, a, e);
		if (team != 1)
			omp_set_num_threads(team);
	}
	if (st != KILN_OK)
		return st;
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const char *ws = a->workspace;
	add_partials(a->out[0], ws + w->dw_at, w->dw_step, w->k, w->n_dw, acc);
	if (w->n_db)
		add_partials(a->out[1], ws + w->db_at, w->db_step, w->k, w->n_db, acc);
	return KILN_OK;
}

/* Where everything is: the slots' workspaces, then the k partials of dw,
 * then of db; the bytes of one sample of each tensor.  0 when the block
 * plans' kept copies are not a whole number of samples' bytes each. */
static int wsplit_layout(struct cpu_plan *p, struct cpu_wsplit *w)
{
	const struct kiln_op *op = &p->op;
	const struct cpu_plan *q = w->blk[0], *big = w->rem ? w->blk[w->slots] : NULL;
	const int keep = (op->flags & KILN_OPF_KEEP) != 0;
	const size_t ex = common_dtype_size(op->in[0].dtype);
	const size_t b = (size_t)w->b;
	if (keep && (q->aux % b || (big && big->aux != q->aux / b * (b + 1))))
		return 0;
	w->slot_ws = wal(q->workspace);
	if (big && wal(big->workspace) > w->slot_ws)
		w->slot_ws = wal(big->workspace);
	w->n_dw = cpu_numel(&op->out[0]);
	w->n_db = op->n_out - keep == 2 ? cpu_numel(&op->out[1]) : 0;
	w->dw_step = wal((size_t)w->n_dw * sizeof(float));
	w->db_step = wal((size_t)w->n_db * sizeof(float));
	w->dw_at = (size_t)w->slots * w->slot_ws;
	w->db_at = w->dw_at + (size_t)w->k * w->dw_step;
	w->x_step = (size_t)cpu_numel(&q->op.in[0]) / b * ex;
	w->dy_step = (size_t)cpu_numel(&q->op.in[1]) / b * ex;
	w->kin_step = keep && op->n_in > 2 ? (size_t)cpu_numel(&q->op.in[2]) / b : 0;
	w->kout_step = keep ? q->aux / b : 0;
	p->workspace = w->db_at + (size_t)w->k * w->db_step;
	p->aux = (size_t)op->in[0].dims[0] * w->kout_step;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = wsplit_run;
	return 1;
}

/* The ops of the blocks (b samples, then b + 1) when each can be run in
 * blocks: its kept copies' layouts are the whole op's. */
static int block_ops(struct cpu_ctx *c, const struct cpu_plan *p, int64_t b, int64_t rem,
		     struct kiln_op bop[2])
{
	const struct kiln_op *op = &p->op;
	const int keep = (op->flags & KILN_OPF_KEEP) != 0;
	for (int i = 0; i < (rem ? 2 : 1); i++)
		if (!block_op(op, b + i, &bop[i]) || (keep && !same_layouts(c, p, &bop[i])))
			return 0;
	return 1;
}

kiln_status cpu_conv_wsplit_prepare(struct cpu_ctx *c, struct cpu_plan *p, int k)
{
	const struct kiln_op *op = &p->op;
	const int64_t N = op->in[0].dims[0], b = N / k, rem = N % k;
	struct kiln_op bop[2];
	char s0[96];
	if (b < 1 || !block_ops(c, p, b, rem, bop)) {
		c->host->log(KILN_LOG_DEBUG, "cpu", "CONV_BWD_WEIGHTS %s: not in blocks (the kept copies' layouts differ)",
			     cpu_desc_str(&op->in[0], s0, sizeof s0));
		return KILN_ENOTSUP;
	}
	struct cpu_wsplit *w = calloc(1, sizeof *w);
	if (!w)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a CONV_BWD_WEIGHTS plan");
	p->wsplit = w; /* freed by cpu_plan_release */
	w->k = k;
	w->b = b, w->rem = rem;
	w->slots = c->threads < k ? c->threads : k;
	if (!(w->blk = calloc((size_t)wsplit_plans(w), sizeof *w->blk)))
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a CONV_BWD_WEIGHTS plan");
	kiln_status st = block_plans(c, p, w, bop);
	if (st)
		return st;
	if (!wsplit_layout(p, w)) {
		c->host->log(KILN_LOG_DEBUG, "cpu", "CONV_BWD_WEIGHTS %s: not in blocks (the kept copies are not whole samples)",
			     cpu_desc_str(&op->in[0], s0, sizeof s0));
		return KILN_ENOTSUP;
	}
	c->host->log(KILN_LOG_DEBUG, "cpu", "CONV_BWD_WEIGHTS %s: %d blocks of %lld samples (the first %lld of one more), %s kernel, one thread each (%d at once), workspace %zu bytes",
		     cpu_desc_str(&op->in[0], s0, sizeof s0), k, (long long)b, (long long)rem,
		     op->in[0].dtype == KILN_BF16 ? (p->kern_f32 ? "f32" : "bf16") : "f32", w->slots,
		     p->workspace);
	return KILN_OK;
}
