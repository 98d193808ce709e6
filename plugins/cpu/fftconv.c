/* plugins/cpu/fftconv.c - f32 convolutions by FFT ([plugin.cpu] conv_algo).
 *
 * Stride 1, dilation 1, one group, symmetric padding (ph, pw).  Every
 * 2-d plane (an activation's channel of one sample, a filter's [KH, KW])
 * is transformed at n1 x n2 (cpu_fftconv_size) by FFTW's real-to-complex
 * transform, which keeps nf = n1 (n2/2 + 1) frequencies.  At each
 * frequency the convolution is a product of complex matrices:
 *
 *   CONV              Y[b][o]  = sum_c  X[b][c] conj(W[o][c])      (correlation)
 *   CONV_BWD_DATA     DX[b][c] = sum_o DY[b][o] W[o][c]            (convolution)
 *   CONV_BWD_WEIGHTS  DW[o][c] = sum_b  conj(DY[b][o]) X[b][c]
 *
 * and the inverse (complex-to-real) transform of each result plane,
 * scaled by 1 / (n1 n2), gives the output plane, circularly shifted by
 * the padding: y[i][j] = z[(i - ph) mod n1][(j - pw) mod n2], dx[h][w] =
 * z[h + ph][w + pw], dw[a][b] = z[(a - ph) mod n1][(b - pw) mod n2].  No
 * plane is padded in memory: with n1 >= H + ph (and >= OH, KH) the
 * indices a valid output reads wrap only onto zeros (the rows H..n1-1 of
 * the plane), so the padding of both sides shares those rows, and conv2
 * of the CNN (14 x 14, pad 2, 5 x 5) transforms at 16 x 16 instead of
 * 20 x 20 (144 frequencies, not 220).
 *
 * A complex product A B (A [M, K], B [K, N]) is one real GEMM with the
 * real and imaginary parts stacked, [Ar Ai] [M, 2K] times
 * [[Br, s Bi], [-s Bi, Br]] [2K, 2N] = [Re Im] [M, 2N], s = 1 for B and
 * s = -1 for conj(B): the transforms write their frequencies straight
 * into those matrices, 16 planes at a time, a line a frequency
 * (fc_forward_block; the inverse reads them alike, fc_inverse_block)
 * (plain [Re Im] rows for A, the block form for B;
 * the weight gradient's A is conj(DY) transposed, O rows of 2 N, with
 * X the block side: DW = conj(DY)^T X), one matrix of
 * each per frequency in the workspace.  Each GEMM runs on one thread
 * (OpenBLAS's cblas_sgemm where the build has it, else oneDNN's
 * dnnl_sgemm), the frequencies split over the team, as the planes of the
 * transforms are: every output element is computed by the same code in
 * the same order on any team, so the bytes never depend on its size.
 *
 * The bias is added and a fused ReLU applied while the inverse planes
 * are written; the bias gradient is the zero frequency of dy's planes
 * (their sums, as FFTW adds them), summed over the batch in order.
 * CONV_BWD_WEIGHTS with KILN_OPF_ACCUMULATE adds into dw and db.
 *
 * The data gradient's operands are the other passes' (kept or not, so
 * the bytes are the same either way): the weight gradient's A, conj(DY)^T
 * = [P | Q] (O rows of 2B: P = DYr^T, Q = -DYi^T), and the forward's B,
 * [[Wr^T, -Wi^T], [Wi^T, Wr^T]] (2C x 2O), in two GEMMs with both
 * transposed: [DXr DXi] = P^T (B's first O columns)^T - Q^T (B's last O
 * columns)^T (fc_gemm).
 *
 * Kept spectra (KILN_OPF_KEEP; fc_kept): the forward's x and w operands
 * are written into its last output, the weight gradient builds its block
 * operand from x's (fc_block_from_plain, one frequency at a time into the
 * thread's buffer, right before that frequency's GEMM) and writes its own A (dy's
 * spectrum) into its last output, followed by the address of the
 * forward's w operand (struct fc_wref); the data gradient multiplies
 * those instead of transforming dy and w: the same bits as without,
 * 14,336 of conv2's 43,008 plane transforms a step fewer, and no copy
 * stored.  The kept dy thus refers to the kept x: the data
 * gradient must run while that is alive and unchanged, as
 * core/layers/conv.c's conv_backward does (weight gradient, then data
 * gradient, of the same micro-batch, before its kept x is released).
 * KILN_CPU_FFT_NOKEEP (the tests' hook) refuses KILN_OPF_KEEP: the layer
 * then runs the three passes unkept (tests/fftconv_kept.sh compares).
 *
 * FFTW plans are made once at prepare with FFTW_ESTIMATE (no timing, so
 * the transforms, and the results, are the same on every run) under a
 * process-wide lock (plan creation is not thread-safe; two devices may
 * prepare at once), and executed with the new-array functions on
 * per-thread buffers in the workspace, 64-byte aligned like the arrays
 * they were planned with.
 *
 * This file holds the op: its sizes and the rules that choose it, the
 * plan (the operands' roles, the workspace, the kept spectra, the FFTW
 * plans) and the run (fc_run: the blocks of each side in order, the
 * GEMMs, the bias gradient).  fftconv_planes.c moves the planes in and
 * out of the per-frequency matrices: the NHWC tiles (fc_gather,
 * fc_scatter), FFTW's per-plane transforms and fft16.c's 16 planes at
 * once, behind fc_forward_block and fc_inverse_block.  fftconv_impl.h
 * holds what the two share (struct cpu_fftconv, the sides, the tile).
 */
#include "fftconv.h"
#include "fftconv_impl.h" /* the plan, its sides, the plane movers */
#include "fft16.h"
#include "dnn.h" /* dnnl_sgemm (oneDNN's headers) */
#include "v16.h" /* cpu_v16_ok */

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the transform sizes, each a product of 2, 3 and 5 FFTW runs fast
 * (18 x 18 took 2.4x 20 x 20's time here: left out) */
static const int fc_sizes[] = { 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128 };

int cpu_fftconv_size(int64_t n, int64_t pad, int64_t k, int64_t out)
{
	int64_t need = n + pad;
	if (out > need)
		need = out;
	if (k > need)
		need = k;
	for (size_t i = 0; i < sizeof fc_sizes / sizeof fc_sizes[0]; i++)
		if (fc_sizes[i] >= need)
			return fc_sizes[i];
	return 0;
}

/* 1 when this CPU runs fft16.c's block path (fftconv's f->v16): AVX-512F
 * (fft16.c) with BW and VL (the blocks' 16-bit loads and stores of bf16
 * planes), KILN_CPU_FFT_FFTW unset */
static int fc_v16_cpu(void)
{
	return FC_V16 && cpu_fft16_ok() && cpu_v16_ok() && !getenv("KILN_CPU_FFT_FFTW");
}

/* The bf16 tensors of op (bare: no kept copies) that fft16.c's blocks read
 * and write themselves (fc_row16, fc_put16_bf16): every tensor f32 or
 * bf16; the activations NCHW (no NHWC tile moves bf16); the weight
 * gradient's dw and db f32 (an accumulation stays f32).  The transform
 * size and the CPU are checked by the caller.  KILN_CPU_FFT_BF16_LOWP (the
 * tests' hook) refuses them: the op then runs as lowp.c's f32 op on
 * widened copies, the same bits. */
static int fc_bf16_tensors(const struct kiln_op *bare)
{
	if (getenv("KILN_CPU_FFT_BF16_LOWP"))
		return 0;
	for (int i = 0; i < bare->n_in; i++)
		if (bare->in[i].dtype != KILN_F32 && bare->in[i].dtype != KILN_BF16)
			return 0;
	for (int i = 0; i < bare->n_out; i++)
		if (bare->out[i].dtype != KILN_F32 && bare->out[i].dtype != KILN_BF16)
			return 0;
	const int t = bare->type;
	const struct kiln_tensor_desc *x = t == KILN_OP_CONV_BWD_DATA ? &bare->out[0] : &bare->in[0];
	if (cpu_nhwc(x))
		return 0;
	if (t == KILN_OP_CONV_BWD_WEIGHTS)
		for (int i = 0; i < bare->n_out; i++)
			if (bare->out[i].dtype != KILN_F32)
				return 0;
	return 1;
}

/* The transform size n1 x n2 of convolution op (cpu_fftconv_size of its
 * x, w, padding and output), in one place for ok, the bf16 rule and
 * prepare. */
static void fc_transform(const struct kiln_op *op, int *n1, int *n2)
{
	const int t = op->type;
	const struct kiln_tensor_desc *x = t == KILN_OP_CONV_BWD_DATA ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *w = t == KILN_OP_CONV_BWD_WEIGHTS ? &op->out[0] : &op->in[1];
	const int64_t H = x->dims[2], W = x->dims[3], KH = w->dims[2], KW = w->dims[3];
	const int64_t OH = H + 2 * op->i[2] - KH + 1, OW = W + 2 * op->i[3] - KW + 1;
	*n1 = cpu_fftconv_size(H, op->i[2], KH, OH);
	*n2 = cpu_fftconv_size(W, op->i[3], KW, OW);
}

int cpu_fftconv_ok(const struct kiln_op *op)
{
	if (!HAVE_FFTW)
		return 0;
	const int t = op->type;
	if (t != KILN_OP_CONV && t != KILN_OP_CONV_BWD_DATA && t != KILN_OP_CONV_BWD_WEIGHTS)
		return 0;
	/* the op without its kept copies (u8, last in and/or out) */
	const struct kiln_op bare = cpu_op_unkept(op);
	const int bf16 = !cpu_all_f32(&bare);
	if ((bf16 && !fc_bf16_tensors(&bare)) || (op->flags & KILN_OPF_RESIDUAL))
		return 0;
	if (op->i[0] != 1 || op->i[1] != 1 || op->i[4] != 1 || op->i[5] != 1 || op->i[6] > 1 ||
	    op->i[2] < 0 || op->i[3] < 0)
		return 0;
	if ((op->flags & KILN_OPF_ACT) && (t != KILN_OP_CONV || op->i[KILN_OPI_ACT] != KILN_ACT_RELU))
		return 0;
	if ((op->flags & KILN_OPF_ACCUMULATE) && t != KILN_OP_CONV_BWD_WEIGHTS)
		return 0;
	const struct kiln_tensor_desc *x = t == KILN_OP_CONV_BWD_DATA ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *w = t == KILN_OP_CONV_BWD_WEIGHTS ? &op->out[0] : &op->in[1];
	const struct kiln_tensor_desc *y = t == KILN_OP_CONV ? &op->out[0]
				       : t == KILN_OP_CONV_BWD_DATA ? &op->in[0] : &op->in[1];
	if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || x->layout != y->layout ||
	    w->dims[1] != x->dims[1] || w->dims[0] != y->dims[1] || x->dims[0] != y->dims[0])
		return 0;
	if (t == KILN_OP_CONV && bare.n_in != 2 && bare.n_in != 3)
		return 0;
	if (t == KILN_OP_CONV_BWD_WEIGHTS && bare.n_out != 1 && bare.n_out != 2)
		return 0;
	const int64_t H = x->dims[2], W = x->dims[3], KH = w->dims[2], KW = w->dims[3];
	const int64_t OH = H + 2 * op->i[2] - KH + 1, OW = W + 2 * op->i[3] - KW + 1;
	if (OH < 1 || OW < 1 || OH != y->dims[2] || OW != y->dims[3])
		return 0;
	int n1, n2;
	fc_transform(op, &n1, &n2);
	if (bf16) /* bf16 planes: fft16.c's blocks only */
		return n1 == 16 && n2 == 16 && fc_v16_cpu();
	return n1 && n2;
}

int cpu_fftconv_rule(const struct kiln_op *op)
{
	if (!cpu_fftconv_ok(op))
		return 0;
	const int t = op->type;
	const struct kiln_tensor_desc *x = t == KILN_OP_CONV_BWD_DATA ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *w = t == KILN_OP_CONV_BWD_WEIGHTS ? &op->out[0] : &op->in[1];
	return w->dims[2] >= 5 && w->dims[3] >= 5 && x->dims[2] + 2 * op->i[2] <= 32 &&
	       x->dims[3] + 2 * op->i[3] <= 32 && x->dims[1] >= 16 && w->dims[0] >= 16;
}

int cpu_fftconv_bf16_fast(const struct kiln_op *op, int conv_algo)
{
	if (!fc_v16_cpu() || (conv_algo != CPU_GEMM_RULE && conv_algo != CPU_CONV_FFT && conv_algo != CPU_CONV_WINO))
		return 0;
	struct kiln_op w = *op; /* widened: its bf16 tensors as f32 */
	int bf16 = 0;
	for (int i = 0; i < w.n_in; i++)
		if (w.in[i].dtype == KILN_BF16)
			w.in[i].dtype = KILN_F32, bf16 = 1;
	for (int i = 0; i < w.n_out; i++)
		if (w.out[i].dtype == KILN_BF16)
			w.out[i].dtype = KILN_F32, bf16 = 1;
	if (!bf16 || !(conv_algo == CPU_CONV_FFT ? cpu_fftconv_ok(&w) : cpu_fftconv_rule(&w)))
		return 0;
	int n1, n2;
	fc_transform(&w, &n1, &n2);
	return n1 == 16 && n2 == 16;
}

int cpu_fftconv_reads(const struct kiln_op *op, int i)
{
	if (!(op->flags & KILN_OPF_KEEP))
		return 1;
	if (op->type == KILN_OP_CONV_BWD_WEIGHTS) /* x: the forward's kept spectrum */
		return i != 0;
	if (op->type == KILN_OP_CONV_BWD_DATA) /* dy and w: the weight gradient's kept copy */
		return i != 0 && i != 1;
	return 1;
}

#if HAVE_FFTW

static pthread_mutex_t fc_plan_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t fc_up(size_t bytes) { return (bytes + FC_ALIGN - 1) & ~(size_t)(FC_ALIGN - 1); }

/* floats, rounded up to whole 64-byte lines */
static size_t fc_floats(int64_t n) { return fc_up((size_t)n * sizeof(float)) / sizeof(float); }

/* The stride between two frequencies' matrices: whole lines, an odd
 * number of them.  A block of planes' transforms writes (or reads) one
 * line of every frequency's matrix; at a power-of-two stride (conv2's
 * are 32 and 64 KiB) those all fall in one cache set of L1 and L2 and
 * evict each other (measured when each plane wrote one element of each
 * line, before session 22's blocks: the transforms took 3-5x their time). */
static size_t fc_stride(int64_t n)
{
	const size_t f = fc_floats(n), line = FC_ALIGN / sizeof(float);
	return (f / line) % 2 ? f : f + line;
}

void cpu_fftconv_free(struct cpu_fftconv *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&fc_plan_lock);
	if (f->r2c)
		fftwf_destroy_plan(f->r2c);
	if (f->c2r)
		fftwf_destroy_plan(f->c2r);
	pthread_mutex_unlock(&fc_plan_lock);
	free(f);
}

/* An activation [N, C, H, W] as planes (b, c). */
static struct fc_planes fc_act(const struct kiln_tensor_desc *d)
{
	const int64_t N = d->dims[0], C = d->dims[1], H = d->dims[2], W = d->dims[3];
	struct fc_planes p = { N, C, H, W, 0, 0, 0, 0 };
	if (cpu_nhwc(d))
		p.s0 = H * W * C, p.s1 = 1, p.sh = W * C, p.sw = C;
	else
		p.s0 = C * H * W, p.s1 = H * W, p.sh = W, p.sw = 1;
	return p;
}

/* Weights [O, C, KH, KW] as planes (o, c). */
static struct fc_planes fc_wei(const struct kiln_tensor_desc *d)
{
	const int64_t O = d->dims[0], C = d->dims[1], KH = d->dims[2], KW = d->dims[3];
	struct fc_planes p = { O, C, KH, KW, C * KH * KW, KH * KW, KW, 1 };
	return p;
}

static struct fc_side fc_side(struct fc_planes pl, int swap, int block, const struct kiln_tensor_desc *d)
{
	struct fc_side s = { pl, swap, block, swap ? pl.n1 : pl.n0, swap ? pl.n0 : pl.n1,
			     d->dtype == KILN_BF16 };
	return s;
}

/* The three operands of each op (see the top of the file). */
static void fc_roles(struct cpu_fftconv *f, const struct kiln_op *op)
{
	switch (op->type) {
	case KILN_OP_CONV: /* Y [B, O] = X [B, C] conj(W^T) [C, O] */
		f->a = fc_side(fc_act(&op->in[0]), 0, 0, &op->in[0]);
		f->b = fc_side(fc_wei(&op->in[1]), 1, -1, &op->in[1]);
		f->o = fc_side(fc_act(&op->out[0]), 0, 0, &op->out[0]);
		f->O = op->out[0].dims[1];
		f->bias_bf16 = op->n_in > 2 && op->in[2].dtype == KILN_BF16;
		break;
	case KILN_OP_CONV_BWD_DATA: /* DX [B, C] = DY [B, O] W [O, C] from the
				     * weight gradient's conj(DY)^T and the
				     * forward's conj(W^T), transposed (fc_gemm) */
		f->a = fc_side(fc_act(&op->in[0]), 1, 2, &op->in[0]);
		f->b = fc_side(fc_wei(&op->in[1]), 1, -1, &op->in[1]);
		f->o = fc_side(fc_act(&op->out[0]), 0, 0, &op->out[0]);
		f->O = op->in[0].dims[1];
		break;
	default: /* CONV_BWD_WEIGHTS: DW [O, C] = conj(DY)^T [O, B] X [B, C]
		  * (dy, the larger, on the plain side: 2 stores a frequency, not 4) */
		f->a = fc_side(fc_act(&op->in[1]), 1, 2, &op->in[1]);
		f->b = fc_side(fc_act(&op->in[0]), 0, 1, &op->in[0]);
		f->o = fc_side(fc_wei(&op->out[0]), 0, 0, &op->out[0]);
		f->a_in = 1, f->b_in = 0;
		f->O = op->in[1].dims[1];
		break;
	}
	f->M = f->a.rows, f->K = 2 * f->a.cols, f->N = 2 * f->b.cols;
	if (op->type == KILN_OP_CONV_BWD_DATA) /* two GEMMs of K = O (fc_gemm) */
		f->M = f->a.cols, f->K = f->a.rows, f->N = 2 * f->b.rows;
	if (op->type != KILN_OP_CONV_BWD_WEIGHTS)
		f->a_in = 0, f->b_in = 1;
}

/* A side's loop takes its planes by blocks (fc_forward_block,
 * fc_inverse_block): matrix row `row`, columns c0 .. c0 + n - 1, FC_L
 * columns a block (the row's last: what is left); blocks of one row in
 * turn, rows in turn.  A tiled swapped side (NHWC dy of the weight and
 * data gradients; rows its channels, columns its samples) takes them by
 * FC_T rows at a time, in those by column blocks, in those row by row:
 * the FC_T x FC_S planes of one tile's gather (fc_gather_block; with
 * fft16.c's blocks fc_gather_lanes).  A tiled side unswapped gathers its
 * block's planes, a sample's FC_T channels, at once. */
_Static_assert(FC_S == FC_L && FC_T == FC_L, "a block's planes are one tile's");

static int64_t fc_blocks(const struct fc_side *s)
{
	return s->rows * ((s->cols + FC_L - 1) / FC_L);
}

static void fc_block(const struct fc_side *s, int64_t k, int64_t *row, int64_t *c0, int64_t *n)
{
	const int64_t R = s->rows, nc = (s->cols + FC_L - 1) / FC_L;
	int64_t cb;
	if (s->swap && fc_tiled(s)) {
		/* the row block: FC_T rows (the last: cr), nc cr blocks */
		const int64_t full = R / FC_T, per = nc * FC_T;
		const int64_t rb = k < full * per ? k / per : full;
		const int64_t cr = rb < full ? FC_T : R - full * FC_T;
		const int64_t q = k - rb * per;
		cb = q / cr, *row = rb * FC_T + q % cr;
	} else {
		*row = k / nc, cb = k % nc;
	}
	*c0 = cb * FC_L;
	*n = s->cols - *c0 < FC_L ? s->cols - *c0 : FC_L;
}

/* Where block k + 1 of side s (of nk) starts in the first frequency's
 * matrix at m, for fft16.c's blocks to prefetch while block k runs (the
 * next a thread takes under schedule(static), but at its range's end);
 * NULL without fft16.c or after the last block.  A block's 288 (or 576)
 * lines, one in each frequency's matrix, are too many streams for the
 * hardware's prefetchers; asked for a block ahead, conv2's kept passes
 * took ~19.3 -> 15.3 CPU-ms NCHW, 19.3 -> 19.0 NHWC (6 interleaved
 * rounds; docs/PERFORMANCE.md, "Session 23"). */
static float *fc_next(const struct cpu_fftconv *f, const struct fc_side *s, const float *m,
		      int64_t k, int64_t nk)
{
	if (!f->v16 || k + 1 >= nk)
		return NULL;
	int64_t row, c0, n;
	fc_block(s, k + 1, &row, &c0, &n);
	return (float *)m + row * 2 * s->cols + c0;
}

/* o = a b at frequency k, on the calling thread */
static void fc_gemm(const struct cpu_fftconv *f, const float *a, const float *b, float *o)
{
	const int64_t M = f->M, N = f->N, K = f->K;
	if (f->type == KILN_OP_CONV_BWD_DATA) {
		/* a = [P | Q] [O, 2B] (P = DYr^T, Q = -DYi^T), b = [[Wr^T, -Wi^T],
		 * [Wi^T, Wr^T]] [2C, 2O]: [DXr DXi] = DYr [Wr Wi] + DYi [-Wi Wr]
		 * = P^T (b's first O columns)^T - Q^T (b's last O columns)^T */
		const int64_t lda = 2 * M, ldb = 2 * K;
#if HAVE_OPENBLAS
		if (f->openblas) {
			cpu_openblas_sgemm(1, 1, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b, (int)ldb,
					   0.0f, o, (int)N);
			cpu_openblas_sgemm(1, 1, (int)M, (int)N, (int)K, -1.0f, a + M, (int)lda, b + K,
					   (int)ldb, 1.0f, o, (int)N);
			return;
		}
#endif
		dnnl_sgemm('T', 'T', M, N, K, 1.0f, a, lda, b, ldb, 0.0f, o, N);
		dnnl_sgemm('T', 'T', M, N, K, -1.0f, a + M, lda, b + K, ldb, 1.0f, o, N);
		return;
	}
#if HAVE_OPENBLAS
	if (f->openblas) {
		cpu_openblas_sgemm(0, 0, (int)M, (int)N, (int)K, 1.0f, a, (int)K, b, (int)N, 0.0f, o,
				   (int)N);
		return;
	}
#endif
	dnnl_sgemm('N', 'N', M, N, K, 1.0f, a, K, b, N, 0.0f, o, N);
}

/* The weight gradient's B at one frequency, the block form
 * [[Xr, Xi], [-Xi, Xr]] (2 B rows of 2 C), from the forward's kept plain
 * [Xr Xi] (B rows of 2 C).  Built by the thread that multiplies it, just
 * before its GEMM, into a buffer of its own (64 KiB for conv2, in its L2):
 * built for all frequencies first (the whole 9.4 MB B written to the
 * workspace, then read again by the GEMMs) it took 2.8% of the CNN's
 * CPU samples at 2 threads, most of them waiting on memory, and conv2's
 * weight gradient 7% more time (docs/PERFORMANCE.md, "Session 22: the
 * CNN's idle core"). */
static void fc_block_from_plain(const struct cpu_fftconv *f, const float *restrict x,
				float *restrict b)
{
	const int64_t B = f->b.rows, C = f->b.cols, ld = 2 * C;
	for (int64_t r = 0; r < B; r++) {
		const float *restrict xr = x + r * ld;
		float *restrict top = b + r * ld, *restrict bot = b + (B + r) * ld;
		memcpy(top, xr, (size_t)ld * sizeof *top);
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			bot[c] = -xr[C + c];
			bot[C + c] = xr[c];
		}
	}
}

/* db (=|+=) the zero frequency of dy's planes (their sums: row o of A's
 * first matrix), b in order */
static void fc_bias_grad(const struct cpu_fftconv *f, const float *ma, float *db)
{
	const int64_t O = f->a.rows, B = f->a.cols, ld = 2 * B;
	for (int64_t o = 0; o < O; o++) {
		float s = 0.0f;
		for (int64_t b = 0; b < B; b++)
			s += ma[o * ld + b];
		db[o] = f->acc ? db[o] + s : s;
	}
}

/* What the weight gradient's kept dy ends with (FC_WREF bytes): where
 * the forward kept w's operand, which the data gradient reads.  The
 * magic and the sizes tell a copy the weight gradient wrote from one it
 * did not (a refusal, never a wrong read). */
#define FC_WREF FC_ALIGN
#define FC_WREF_MAGIC 0x6b696c6e66667477ull /* "kilnfftw" */
struct fc_wref {
	uint64_t magic;
	const float *w;   /* nf matrices of fw floats */
	uint64_t nf, fw;
};
_Static_assert(sizeof(struct fc_wref) <= FC_WREF, "the kept dy's tail holds an fc_wref");

/* The data gradient's B, the forward's w operand, from the kept dy's
 * fc_wref; NULL when the copy does not carry one of this plan's sizes. */
static const float *fc_kept_w(const struct cpu_fftconv *f, const void *kin)
{
	struct fc_wref r;
	memcpy(&r, (const char *)kin + (size_t)f->nf * f->fa * sizeof(float), sizeof r);
	if (r.magic != FC_WREF_MAGIC || r.nf != (uint64_t)f->nf || r.fw != (uint64_t)f->fb)
		return NULL;
	return r.w;
}

static kiln_status fc_run(const struct cpu_plan *p, const struct kiln_op_args *args,
			  struct cpu_err *e)
{
	const struct cpu_fftconv *f = p->fft;
	/* the inputs read are those cpu_fftconv_reads names: run() refuses a
	 * NULL one, but lowp.c passes NULL for the others (lp_unread), so a
	 * NULL read here is an error, never a fault */
	for (int i = 0; i < p->op.n_in; i++)
		if (!args->in[i] && cpu_fftconv_reads(&p->op, i))
			return cpu_fail(e, KILN_EINVAL, "cpu: %s:%d: FFT %s: input %d is NULL, and it is read",
					__FILE__, __LINE__, cpu_op_name(p->op.type), i);
	char *ws = (char *)(((uintptr_t)args->workspace + FC_ALIGN - 1) & ~(uintptr_t)(FC_ALIGN - 1));
	float *ma = (float *)ws, *mb = (float *)(ws + f->off_b), *mo = (float *)(ws + f->off_o);
	const float *src_a = args->in[f->a_in];
	const float *src_b = args->in[f->b_in];
	float *dst = args->out[0];
	const float *bias = f->type == KILN_OP_CONV && f->bias ? args->in[2] : NULL;
	/* kept spectra: the forward writes x's A and w's B straight into its
	 * last output; the weight gradient builds its B from x's and writes
	 * dy's plain copy, then w's address, into its last output; the data
	 * gradient's A and B are those */
	float *kout = f->keep && f->type != KILN_OP_CONV_BWD_DATA ? args->out[p->op.n_out - 1] : NULL;
	const float *kin = f->keep && f->type != KILN_OP_CONV ? args->in[2] : NULL;
	/* (the workspace holds no matrix a kept run takes from its copies) */
	if (f->keep && ((f->type != KILN_OP_CONV_BWD_DATA && !kout) || (f->type != KILN_OP_CONV && !kin)))
		return cpu_fail(e, KILN_EINVAL, "cpu: %s:%d: FFT convolution with kept spectra: a kept copy's buffer is NULL",
				__FILE__, __LINE__);
	if (f->type == KILN_OP_CONV && kout)
		ma = kout, mb = kout + (size_t)f->nf * f->fa;
	if (f->type == KILN_OP_CONV_BWD_DATA && kin) {
		ma = (float *)kin;
		if (!(mb = (float *)fc_kept_w(f, kin)))
			return cpu_fail(e, KILN_EINVAL, "cpu: %s:%d: FFT data gradient: the kept dy holds no w spectrum of this plan's",
					__FILE__, __LINE__);
	}
	if (f->type == KILN_OP_CONV_BWD_WEIGHTS && kout) {
		const struct fc_wref r = { FC_WREF_MAGIC, kin + (size_t)f->nf * f->fx, (uint64_t)f->nf,
					   (uint64_t)f->fw };
		memcpy((char *)kout + (size_t)f->nf * f->fa * sizeof(float), &r, sizeof r);
		ma = kout;
	}
	int bad = 0;
#pragma omp parallel
	{
		const int t = omp_get_thread_num();
		if (t >= f->threads) {
			bad = 1; /* (never: the team is at most the opening one) */
		} else {
			char *tb = ws + f->off_t + (size_t)t * f->per_thread;
			float *re = (float *)tb;
			fftwf_complex *sp = (fftwf_complex *)(tb + f->off_sp);
			struct fc_tile g = { f->off_tile ? (float *)(tb + f->off_tile) : NULL, 0, 0, 0, 1 };
			const int64_t na = fc_blocks(&f->a), nb = fc_blocks(&f->b), no = fc_blocks(&f->o);
			int64_t row, c0, n;
			if (!(f->type == KILN_OP_CONV_BWD_DATA && kin)) {
#pragma omp for schedule(static)
				for (int64_t k = 0; k < na; k++) {
					fc_block(&f->a, k, &row, &c0, &n);
					fc_forward_block(f, &f->a, src_a, row, c0, n, ma, f->fa, re, sp, &g,
							 fc_next(f, &f->a, ma, k, na));
				}
				g.n = 0;
			}
			/* (the kept weight gradient's B: at its GEMM, below) */
			if (!kin) {
#pragma omp for schedule(static)
				for (int64_t k = 0; k < nb; k++) {
					fc_block(&f->b, k, &row, &c0, &n);
					fc_forward_block(f, &f->b, src_b, row, c0, n, mb, f->fb, re, sp, &g,
							 fc_next(f, &f->b, mb, k, nb));
				}
				g.n = 0;
			}
			/* one thread per GEMM: OpenBLAS and oneDNN read this */
			omp_set_num_threads(1);
			float *blk = f->off_blk ? (float *)(tb + f->off_blk) : NULL;
#pragma omp for schedule(static)
			for (int k = 0; k < f->nf; k++) {
				const float *b = mb + (size_t)k * f->fb;
				if (blk) /* the kept weight gradient */
					fc_block_from_plain(f, kin + (size_t)k * f->fx, blk), b = blk;
				fc_gemm(f, ma + (size_t)k * f->fa, b, mo + (size_t)k * f->fo);
			}
#pragma omp for schedule(static)
			for (int64_t k = 0; k < no; k++) {
				fc_block(&f->o, k, &row, &c0, &n);
				fc_inverse_block(f, mo, row, c0, n, dst, bias, re, sp, &g,
						 fc_next(f, &f->o, mo, k, no));
			}
			if (g.n) /* this thread's last planes */
				fc_scatter(&g, &f->o.pl, dst);
		}
	}
	if (bad)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s:%d: FFT convolution: a team larger than %d threads",
				__FILE__, __LINE__, f->threads);
	if (f->type == KILN_OP_CONV_BWD_WEIGHTS && f->bias)
		fc_bias_grad(f, ma, args->out[1]);
	return KILN_OK;
}

/* The FFTW plans for n1 x n2 (FFTW_ESTIMATE: no timing), under the lock;
 * and where the GEMMs are oneDNN's, dnnl_sgemm's kernels made now.  Both
 * only with the address space kept free under RLIMIT_AS (cpu_as_short):
 * FFTW's planner aborts when an allocation fails (SIGABRT in
 * fftwf_plan_dft_r2c), and dnnl_sgemm made its kernels at its first call,
 * in the first step, writing them through NULL where the limit refused
 * their mapping (SIGSEGV in fc_gemm, one run in three under ulimit -v
 * 246 MB with the pthread OpenBLAS: session 41). */
static kiln_status fc_plans(struct cpu_ctx *c, struct cpu_fftconv *f, const char *what)
{
	char why[256];
	if (cpu_as_short("FFTW's planner, which aborts when an allocation fails", why, sizeof why))
		return c->host->error(KILN_ENOMEM, "cpu: %s: %s", what, why);
	if (!f->openblas) {
		const dnnl_status_t s = cpu_dnn_warm_sgemm();
		if (s != dnnl_success)
			return c->host->error(KILN_ENOMEM, "cpu: %s: %s:%d: cpu_dnn_warm_sgemm: %s", what,
					      __FILE__, __LINE__, cpu_dnnl_str(s));
	}
	float *re = fftwf_malloc((size_t)f->n1 * f->n2 * sizeof *re);
	fftwf_complex *sp = fftwf_malloc((size_t)f->nf * sizeof *sp);
	if (re && sp) {
		pthread_mutex_lock(&fc_plan_lock);
		f->r2c = fftwf_plan_dft_r2c_2d(f->n1, f->n2, re, sp, FFTW_ESTIMATE);
		f->c2r = fftwf_plan_dft_c2r_2d(f->n1, f->n2, sp, re, FFTW_ESTIMATE);
		pthread_mutex_unlock(&fc_plan_lock);
	}
	fftwf_free(re);
	fftwf_free(sp);
	if (!f->r2c || !f->c2r)
		return c->host->error(KILN_EDEVICE, "cpu: %s:%d: %s: FFTW made no %dx%d plan",
				      __FILE__, __LINE__, what, f->n1, f->n2);
	return KILN_OK;
}

/* Sizes and the workspace: [A | B | products | per-thread buffers], the
 * matrices a kept run takes from its copies left out (fc_run): the
 * forward writes A and B into its kept output, the weight gradient its
 * A, the data gradient reads both (conv2 of the CNN at batch 128: the
 * forward's 18.9 MB became 9.4, the weight gradient's 21.3 11.8, the data
 * gradient's 18.9 4.7; docs/PERFORMANCE.md, "Session 19: the NHWC CNN's
 * CPU kernels"; since session 22 the kept weight gradient holds its B one
 * frequency a thread, not all of them: 12.2 MB became 2.9, NHWC, 2 threads). */
static void fc_layout(struct cpu_ctx *c, struct cpu_fftconv *f)
{
	f->fa = fc_stride(f->a.rows * 2 * f->a.cols);
	f->fb = fc_stride(2 * f->b.rows * 2 * f->b.cols);
	f->fo = fc_stride(f->o.rows * 2 * f->o.cols);
	const int own_a = !f->keep, own_b = !f->keep;
	f->off_b = own_a ? (size_t)f->nf * f->fa * sizeof(float) : 0;
	f->off_o = f->off_b + (own_b ? (size_t)f->nf * f->fb * sizeof(float) : 0);
	f->off_t = f->off_o + (size_t)f->nf * f->fo * sizeof(float);
	/* re (n1 n2 floats; fft16.c's planes: FFT16_PLANE_LINES lines), then
	 * FC_L spectra (a block's, fc_forward_block), each on its own lines
	 * as FFTW's plans were made (fc_plans; fft16.c's: FFT16_SPEC_LINES
	 * lines, as many) */
	f->sps = fc_up((size_t)f->nf * 2 * sizeof(float)) / (2 * sizeof(float));
	f->off_sp = fc_up((f->v16 ? (size_t)FFT16_PLANE_LINES * FC_L : (size_t)f->n1 * f->n2) *
			  sizeof(float));
	f->per_thread = f->off_sp + (size_t)FC_L * f->sps * 2 * sizeof(float);
	/* the NHWC tile: FC_T planes of the largest tiled side's (FC_S FC_T
	 * of a swapped side's) */
	int64_t hw = 0;
	const struct fc_side *sides[3] = { &f->a, &f->b, &f->o };
	for (int k = 0; k < 3; k++) {
		/* (fft16.c's swapped side: a channel's h x 16 lines of FC_S
		 * lanes, fc_gather_lanes) */
		const int64_t w = sides[k]->swap && f->v16 ? 16 : sides[k]->pl.w;
		const int64_t n = sides[k]->pl.h * w * (sides[k]->swap ? FC_S : 1);
		if (fc_tiled(sides[k]) && n > hw)
			hw = n;
	}
	f->off_tile = hw ? f->per_thread : 0;
	f->per_thread += hw ? fc_up((size_t)FC_T * (size_t)hw * sizeof(float)) : 0;
	/* the kept weight gradient's B, a frequency at a time (fc_block_from_plain) */
	const int blk = f->keep && f->type == KILN_OP_CONV_BWD_WEIGHTS;
	f->off_blk = blk ? f->per_thread : 0;
	f->per_thread += blk ? f->fb * sizeof(float) : 0;
	f->threads = c->threads > 0 ? c->threads : 1;
}

/* Kept spectra (KILN_OPF_KEEP; tune.c asks only where the layer's three
 * ops all run here): the bytes each writes (p->aux) and the size each
 * reads, checked (KILN_EINVAL, as conv.c's). */
static kiln_status fc_kept(struct cpu_ctx *c, struct cpu_plan *p, struct cpu_fftconv *f,
			   const struct kiln_tensor_desc *x)
{
	const struct kiln_op *op = &p->op;
	const int64_t B = x->dims[0], C = x->dims[1];
	const int64_t O = op->type == KILN_OP_CONV_BWD_WEIGHTS ? op->out[0].dims[0] : op->in[1].dims[0];
	f->fx = fc_stride(B * 2 * C);
	f->fw = fc_stride(2 * C * 2 * O);
	if (!f->keep)
		return KILN_OK;
	size_t want = 0; /* bytes of in2 */
	if (op->type == KILN_OP_CONV) { /* x's A, plain B x 2C; w's B, 2C x 2O (fb = fw) */
		p->aux = (size_t)f->nf * (f->fa + f->fb) * sizeof(float);
	} else if (op->type == KILN_OP_CONV_BWD_WEIGHTS) {
		want = (size_t)f->nf * (f->fx + f->fw) * sizeof(float);
		p->aux = (size_t)f->nf * f->fa * sizeof(float) + FC_WREF; /* its A, conj(DY)^T */
	} else { /* that A (O x 2B, as the weight gradient's), and w's address */
		want = (size_t)f->nf * f->fa * sizeof(float) + FC_WREF;
	}
	if (want && (size_t)cpu_numel(&op->in[2]) != want) {
		char why[96];
		snprintf(why, sizeof why, "the kept copy in2 has %lld bytes, the FFT's %zu",
			 (long long)cpu_numel(&op->in[2]), want);
		return cpu_bad(c, op, KILN_EINVAL, why);
	}
	return KILN_OK;
}

kiln_status cpu_fftconv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (!cpu_fftconv_ok(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "the FFT convolution: f32, stride 1, dilation 1, one group");
	if ((op->flags & KILN_OPF_KEEP) && getenv("KILN_CPU_FFT_NOKEEP")) /* the tests' hook */
		return cpu_bad(c, op, KILN_ENOTSUP, "the FFT convolution keeps no spectra (KILN_CPU_FFT_NOKEEP)");
	struct cpu_fftconv *f = calloc(1, sizeof *f);
	if (!f)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for an FFT convolution plan");
	const int t = op->type;
	const struct kiln_tensor_desc *x = t == KILN_OP_CONV_BWD_DATA ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *w = t == KILN_OP_CONV_BWD_WEIGHTS ? &op->out[0] : &op->in[1];
	const int64_t ph = op->i[2], pw = op->i[3], H = x->dims[2], W = x->dims[3];
	const int64_t KH = w->dims[2], KW = w->dims[3];
	f->type = t;
	f->relu = (op->flags & KILN_OPF_ACT) != 0;
	f->acc = (op->flags & KILN_OPF_ACCUMULATE) != 0;
	f->keep = (op->flags & KILN_OPF_KEEP) != 0;
	f->bias = t == KILN_OP_CONV		 ? op->n_in == 3
		  : t == KILN_OP_CONV_BWD_WEIGHTS ? op->n_out - f->keep == 2
						  : 0;
	fc_transform(op, &f->n1, &f->n2);
	f->nh = f->n2 / 2 + 1;
	f->nf = f->n1 * f->nh;
	f->sh1 = t == KILN_OP_CONV_BWD_DATA ? ph : -ph;
	f->sh2 = t == KILN_OP_CONV_BWD_DATA ? pw : -pw;
	f->openblas = HAVE_OPENBLAS && !cpu_openblas_ready(c, c->threads);
	/* KILN_CPU_FFT_FFTW: FFTW's per-plane transforms at 16 x 16 too (the
	 * tests' and benchmarks' A/B hook) */
	f->v16 = f->n1 == 16 && f->n2 == 16 && fc_v16_cpu();
	fc_roles(f, op);
	fc_layout(c, f);
	char what[160];
	snprintf(what, sizeof what, "%s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] pad %lldx%lld %s",
		 cpu_op_name(t), (long long)x->dims[0], (long long)x->dims[1], (long long)H,
		 (long long)W, (long long)w->dims[0], (long long)w->dims[1], (long long)KH,
		 (long long)KW, (long long)ph, (long long)pw, cpu_nhwc(x) ? "NHWC" : "NCHW");
	kiln_status st = fc_kept(c, p, f, x);
	if (!st)
		st = fc_plans(c, f, what);
	if (st) {
		cpu_fftconv_free(f);
		return st;
	}
	p->fft = f;
	p->kernel = fc_run;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->workspace = f->off_t + (size_t)f->threads * f->per_thread + FC_ALIGN;
	c->host->log(KILN_LOG_DEBUG, "cpu",
		     "%s: FFT %dx%d%s, %d frequencies of GEMM %lldx%lldx%lld (%s), workspace %zu bytes, kept %zu",
		     what, f->n1, f->n2,
		     !f->v16 ? "" : f->a.bf16 || f->b.bf16 || f->o.bf16 ? " (fft16.c, bf16 read and written)" : " (fft16.c)",
		     f->nf, (long long)f->M, (long long)f->N, (long long)f->K,
		     f->openblas ? "OpenBLAS" : "oneDNN", p->workspace, p->aux);
	return KILN_OK;
}

#else /* !HAVE_FFTW */

void cpu_fftconv_free(struct cpu_fftconv *f) { (void)f; }

kiln_status cpu_fftconv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	return cpu_bad(c, &p->op, KILN_ENOTSUP,
		       "this build has no FFT convolution (configure --with-fftw; apt-get install libfftw3-dev)");
}

#endif
