/* plugins/cuda/qops.c - KILN_OP_QCONV and KILN_OP_QLINEAR (ABI 2.6,
 * kiln/ops.h; docs/inference.md "INT8") on the GPU:
 *
 *   QCONV:   y[N,O,OH,OW] = act(sx * sw[o] * conv(xq, wq)[n,o,p,q] + b[o])
 *   QLINEAR: y[M,N]       = act(sx * sw[n] * (xq . wq^T)[m,n] + b[n])
 *
 * Each run, on the caller's stream (int8_kernels.cu, gemm.c):
 *   1. the weights quantized per output channel (7-bit, round half to
 *      even, sw = max|w| / 63) with sc[o] = sx * sw[o] and the sums of
 *      each channel's quantized weights;
 *   2. the input's patches (im2col) quantized into s8 rows of kp bytes
 *      ([groups][N*OH*OW][kp]; QLINEAR is the 1x1 case, its rows x's);
 *      kp, the rows and each group's output channels are padded with
 *      zeros to multiples of 16, 4 and 4 (cuda_qgeom, qkern.h): sizes and
 *      16-byte aligned rows that cuBLASLt's int8 kernels take;
 *      a u8 input is stored as xq - 128 (cuBLASLt's int8 operands are
 *      signed) and the epilogue adds 128 * sum wq back: exact;
 *   3. one cuBLASLt int8 GEMM per group, s8 x s8 -> s32, exact
 *      (CUBLAS_COMPUTE_32I), acc [groups][rows][ogp];
 *   4. kiln's epilogue: y = acc * sc[o] + b[o] then the fused ReLU, in
 *      x's layout (NCHW or NHWC), f32 products and sums rounded as the
 *      CPU device's epilogue rounds them.
 * Each element of steps 1, 2 and 4 is a function of qkern.h, which
 * tests/check_cuda_host.c runs on the host against the CPU device.
 * The int32 sums are exact on both devices, so the CUDA op equals the CPU
 * op up to the epilogue's f32 rounding (the same expression: equal bits,
 * except where oneDNN's weights were halved and doubled back).
 *
 * Why not cuDNN's int8 convolution: it takes s8 inputs only (no u8), in
 * NHWC or NCHW_VECT_C with channels a multiple of 4, and writes its
 * scaled result without per-channel scales before the bias; the im2col +
 * int8 GEMM runs every shape and layout, and the same code serves
 * QLINEAR.  The weights are quantized on every run (O x K bytes, small
 * next to the GEMM) rather than cached: a plan never holds stale weights.
 *
 * Workspace (reported at prepare, owned by the caller): [cuBLASLt's |
 * xq | wq | sc f32[O] | wsum s32[O] | acc s32], each 256-byte aligned.
 */
#include "cuda.h"

#include <stdint.h>

#define Q_AL(n) (((size_t)(n) + 255) & ~(size_t)255)

enum { Q_LT, Q_XQ, Q_WQ, Q_SC, Q_WSUM, Q_ACC, Q_LTB }; /* p->off[]: offsets, Lt's bytes */

static cudaError_t q_launch(const struct cuda_plan *p, const struct kiln_op_args *a, cudaStream_t s)
{
	struct cuda_qgeom g;
	qkern_geom(&p->op, &g);
	char *ws = a->workspace;
	int8_t *xq = (int8_t *)(ws + p->off[Q_XQ]), *wq = (int8_t *)(ws + p->off[Q_WQ]);
	float *sc = (float *)(ws + p->off[Q_SC]);
	int32_t *wsum = (int32_t *)(ws + p->off[Q_WSUM]), *acc = (int32_t *)(ws + p->off[Q_ACC]);
	/* the padding rows of wq are zeros */
	cudaError_t e = g.ogp != g.o / g.groups
				? cudaMemsetAsync(wq, 0, (size_t)(g.groups * g.ogp * g.kp), s)
				: cudaSuccess;
	if (e == cudaSuccess)
		e = cuda_q_weights(a->in[1], &g, wq, sc, wsum, s);
	if (e == cudaSuccess)
		e = cuda_q_im2col(a->in[0], &g, xq, p->grid, s);
	for (int64_t grp = 0; grp < g.groups && e == cudaSuccess; grp++)
		e = cuda_gemm_i8_run(p, xq + grp * g.rowsp * g.kp, wq + grp * g.ogp * g.kp,
				     acc + grp * g.rowsp * g.ogp, ws + p->off[Q_LT],
				     (size_t)p->off[Q_LTB], s);
	if (e == cudaSuccess)
		e = cuda_q_epilogue(acc, sc, wsum, p->op.n_in == 3 ? a->in[2] : NULL, &g, a->out[0],
				    p->grid, s);
	return e;
}

kiln_status cuda_q_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	/* the core checked the shapes, the dtypes and f[0] > 0 (opcheck.c) */
	if (op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32)
		return cuda_bad(c, op, KILN_ENOTSUP,
				"an f32 input and output only: the u8 activations of chained INT8 (ABI 2.8) run on the CPU device (kiln eval --quantized does not chain on cuda)");
	if ((op->flags & KILN_OPF_ACT) && op->i[KILN_OPI_ACT] != KILN_ACT_RELU)
		return cuda_bad(c, op, KILN_ENOTSUP,
				"a fused ReLU only (the layer runs other activations apart)");
	struct cuda_qgeom g;
	qkern_geom(op, &g);
	const int64_t per = g.c / g.groups * g.kh * g.kw, rows = g.n * g.oh * g.ow;
	/* the u8 shift adds 128 * sum wq (at most 128 * 63 * per) in int32 */
	if (per <= 0 || rows <= 0 || g.o % g.groups || 255LL * 63 * per >= INT32_MAX)
		return cuda_bad(c, op, KILN_ENOTSUP,
				"an empty op, output channels not divisible by the groups, or more than 133,000 weights per output channel (the int32 sums)");
	size_t lt_ws = 0;
	kiln_status st = cuda_gemm_i8_prepare(c, p, g.rowsp, g.ogp, g.kp, g.ogp, &lt_ws);
	if (st)
		return st;
	const size_t sz[Q_ACC + 1] = {
		[Q_LT] = lt_ws,
		[Q_XQ] = (size_t)(g.groups * g.rowsp * g.kp),
		[Q_WQ] = (size_t)(g.groups * g.ogp * g.kp),
		[Q_SC] = sizeof(float) * (size_t)g.o,
		[Q_WSUM] = sizeof(int32_t) * (size_t)g.o,
		[Q_ACC] = sizeof(int32_t) * (size_t)(g.groups * g.rowsp * g.ogp),
	};
	size_t off = 0;
	for (int k = Q_LT; k <= Q_ACC; k++) {
		p->off[k] = (int64_t)off;
		off += Q_AL(sz[k]);
	}
	p->off[Q_LTB] = (int64_t)lt_ws;
	p->workspace = off;
	p->n_in = op->n_in;
	p->n_out = 1;
	p->launch = q_launch;
	c->host->log(KILN_LOG_DEBUG, "cuda",
		     "%s: %s %lld rows x %lld weights per channel (%lld groups), %s input, workspace %zu bytes",
		     cuda_op_name(op->type), g.nhwc ? "NHWC" : "NCHW", (long long)rows,
		     (long long)per, (long long)g.groups, g.u8 ? "u8" : "s8", off);
	return KILN_OK;
}
