/* plugins/cpu/qconv.c - KILN_OP_QCONV and KILN_OP_QLINEAR (kiln/ops.h):
 * INT8 inference through oneDNN's (2.x C API) int8 convolution and inner
 * product: u8 or s8 input x s8 weights -> s32, then f32 with scales.
 *
 *   QCONV:   y[N,O,OH,OW] = act(sx * sw[o] * conv(xq, wq)[n,o,p,q] + b[o])
 *   QLINEAR: y[M,N]       = act(sx * sw[n] * (xq . wq^T)[m,n] + b[n])
 *
 * The weights are quantized per output channel (sw[o] = max|w[o]| / 63,
 * [-63, 63], round half to even) with the output scales sx * sw[o] on the
 * first run and kept in the plan (struct cpu_qcache) until the f32
 * weights change; each run copies them into the workspace, then the
 * oneDNN steps:
 * a reorder of x (f32, the caller's layout) into the kernel's u8/s8
 * layout with the constant scale 1 / sx (round half to even, saturated),
 * a reorder of the plain s8 weights into the kernel's blocked layout, and
 * the int8 primitive writing the exact s32 sums in the caller's layout;
 * then the epilogue here: y = acc * (sx * sw[o]) + b[o], and the fused
 * ReLU.  (oneDNN 2.6 adds the bias before its output scales, and its
 * runtime per-channel scales are not in every int8 kernel: the epilogue
 * keeps the contract's order and costs one pass over y.)
 *
 * Exactness on CPUs without VNNI (AVX2, AVX-512 before VNNI): the int8
 * kernels multiply u8 by s8 with vpmaddubsw, whose pairwise sums saturate
 * at int16; 7-bit weights keep 255 * 63 * 2 inside it.  Where the kernel's
 * weight layout says oneDNN halves the weights on the way in (its
 * scale_adjust 0.5, undone on the sums), the weights go in doubled, so the
 * halving is exact and so are the sums.
 *
 * Workspace: [scratchpad | xq | wq plain | wq kernel | output scales f32[O]
 * | acc s32 (y's shape)], each 64-byte aligned.
 */
#include "dnn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* What the prepare steps share. */
struct qbuild {
	int conv, has_bias, nhwc;
	int64_t O, per; /* output channels, weights per channel */
	char geom[200];
	dnnl_memory_desc_t x_user, x_any, w_user, w_any, y_any, s_md;
	const dnnl_memory_desc_t *x_kern, *w_kern;
	dnnl_primitive_desc_t pd, rx, rw;
	dnnl_primitive_attr_t attr, rx_attr;
};

/* Workspace offsets, kept in the plan's sz[]. */
enum { OFF_XQ, OFF_WP, OFF_WK, OFF_SC, OFF_YK }; /* sz[6]: the NCHW epilogue's OH*OW; sz[7]: 2 when oneDNN halves the weights, else 1 */

/* The descriptors and the primitive: a convolution (NCHW/NHWC activations,
 * OIHW or GOIHW weights) or an inner product (x [M,K], w [N,K]). */
static kiln_status q_primitive(struct cpu_ctx *c, const struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const struct kiln_op *op = &p->op;
	const char *geom = b->geom;
	const dnnl_data_type_t xdt = op->i[8] ? dnnl_u8 : dnnl_s8;
	CPU_DNN_TRY(dnnl_primitive_attr_create(&b->attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->attr, dnnl_scratchpad_mode_user));
	dnnl_dims_t bd = { b->O };
	CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->s_md, 1, bd, dnnl_f32, dnnl_a));
	if (b->conv) {
		const struct kiln_tensor_desc *x = &op->in[0], *w = &op->in[1], *y = &op->out[0];
		const int64_t g = op->i[6] ? op->i[6] : 1;
		const dnnl_format_tag_t at = b->nhwc ? dnnl_nhwc : dnnl_nchw;
		dnnl_dims_t xd = { x->dims[0], x->dims[1], x->dims[2], x->dims[3] };
		dnnl_dims_t yd = { y->dims[0], y->dims[1], y->dims[2], y->dims[3] };
		dnnl_dims_t wd4 = { w->dims[0], w->dims[1], w->dims[2], w->dims[3] };
		dnnl_dims_t wd5 = { g, w->dims[0] / g, w->dims[1], w->dims[2], w->dims[3] };
		dnnl_dims_t s = { op->i[0], op->i[1] }, pad = { op->i[2], op->i[3] };
		dnnl_dims_t dil = { op->i[4] - 1, op->i[5] - 1 };
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_user, 4, xd, dnnl_f32, at));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_any, 4, xd, xdt, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->y_any, 4, yd, dnnl_s32, at));
		if (g > 1) {
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 5, wd5, dnnl_s8, dnnl_goihw));
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 5, wd5, dnnl_s8, dnnl_format_tag_any));
		} else {
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 4, wd4, dnnl_s8, dnnl_oihw));
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 4, wd4, dnnl_s8, dnnl_format_tag_any));
		}
		dnnl_convolution_desc_t cd;
		CPU_DNN_TRY(dnnl_dilated_convolution_forward_desc_init(
			&cd, dnnl_forward_inference, dnnl_convolution_direct, &b->x_any, &b->w_any, NULL,
			&b->y_any, s, dil, pad, pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&b->pd, &cd, b->attr, c->engine, NULL));
	} else {
		const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
		dnnl_dims_t xd = { M, K }, wd = { N, K }, yd = { M, N };
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_user, 2, xd, dnnl_f32, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_any, 2, xd, xdt, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 2, wd, dnnl_s8, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 2, wd, dnnl_s8, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->y_any, 2, yd, dnnl_s32, dnnl_ab));
		dnnl_inner_product_desc_t id;
		CPU_DNN_TRY(dnnl_inner_product_forward_desc_init(&id, dnnl_forward_inference, &b->x_any,
								&b->w_any, NULL, &b->y_any));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&b->pd, &id, b->attr, c->engine, NULL));
	}
	b->x_kern = dnnl_primitive_desc_query_md(b->pd, dnnl_query_src_md, 0);
	b->w_kern = dnnl_primitive_desc_query_md(b->pd, dnnl_query_weights_md, 0);
out:
	return st;
}

/* The reorders before the primitive: x with its scale 1 / sx always (it
 * converts); the weights when the kernel's layout is not plain. */
static kiln_status q_reorders(struct cpu_ctx *c, const struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	const float inv = (float)(1.0 / p->op.f[0]);
	CPU_DNN_TRY(dnnl_primitive_attr_create(&b->rx_attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->rx_attr, dnnl_scratchpad_mode_user));
	CPU_DNN_TRY(dnnl_primitive_attr_set_output_scales(b->rx_attr, 1, 0, &inv));
	CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->rx, &b->x_user, c->engine, b->x_kern,
						       c->engine, b->rx_attr));
	if (!dnnl_memory_desc_equal(b->w_kern, &b->w_user))
		CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->rw, &b->w_user, c->engine, b->w_kern,
							       c->engine, NULL));
out:
	return st;
}

/* Workspace offsets (p->sz) and size: the scratchpad first, shared by the
 * steps (they run in turn). */
static void q_workspace(struct cpu_plan *p, const struct qbuild *b)
{
	size_t scratch = cpu_dnn_scratch(b->pd), rs = cpu_dnn_scratch(b->rx);
	scratch = rs > scratch ? rs : scratch;
	size_t off = al64(scratch);
	p->sz[OFF_XQ] = (int64_t)off;
	off += al64(dnnl_memory_desc_get_size(b->x_kern));
	p->sz[OFF_WP] = (int64_t)off;
	off += al64((size_t)(b->O * b->per));
	p->sz[OFF_WK] = (int64_t)off;
	off += b->rw ? al64(dnnl_memory_desc_get_size(b->w_kern)) : 0;
	p->sz[OFF_SC] = (int64_t)off;
	off += al64(sizeof(float) * (size_t)b->O);
	p->sz[OFF_YK] = (int64_t)off;
	off += al64(dnnl_memory_desc_get_size(&b->y_any));
	p->workspace = off;
	p->rows = b->O, p->cols = b->per;
}

/* Memory objects and steps: reorder x, (reorder w), the primitive into
 * the s32 sums. */
static kiln_status q_steps(struct cpu_ctx *c, struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct cpu_dnn *d = p->dnn;
	int mx, mxq, mwp, mwk, myk, msp = -1;
	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->x_user, CPU_BIND_IN, 0, 0, &mx));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, b->x_kern, CPU_BIND_WS, 0, (size_t)p->sz[OFF_XQ], &mxq));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->w_user, CPU_BIND_WS, 0, (size_t)p->sz[OFF_WP], &mwp));
	mwk = mwp;
	if (b->rw)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, b->w_kern, CPU_BIND_WS, 0, (size_t)p->sz[OFF_WK], &mwk));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->y_any, CPU_BIND_WS, 0, (size_t)p->sz[OFF_YK], &myk));
	if (cpu_dnn_scratch(b->pd) || cpu_dnn_scratch(b->rx))
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(
					cpu_dnn_scratch(b->pd) >= cpu_dnn_scratch(b->rx) ? b->pd : b->rx,
					dnnl_query_scratchpad_md, 0), CPU_BIND_WS, 0, 0, &msp));
#define ARG(a_, m_) (arg[n] = (a_), mem[n] = (m_), n++)
	n = 0;
	ARG(DNNL_ARG_FROM, mx), ARG(DNNL_ARG_TO, mxq);
	if (cpu_dnn_scratch(b->rx))
		ARG(DNNL_ARG_SCRATCHPAD, msp);
	CPU_DNN_TRY(cpu_dnn_step(d, b->rx, n, arg, mem));
	if (b->rw) {
		n = 0;
		ARG(DNNL_ARG_FROM, mwp), ARG(DNNL_ARG_TO, mwk);
		CPU_DNN_TRY(cpu_dnn_step(d, b->rw, n, arg, mem));
	}
	n = 0;
	ARG(DNNL_ARG_SRC, mxq), ARG(DNNL_ARG_WEIGHTS, mwk), ARG(DNNL_ARG_DST, myk);
	if (cpu_dnn_scratch(b->pd))
		ARG(DNNL_ARG_SCRATCHPAD, msp);
	CPU_DNN_TRY(cpu_dnn_step(d, b->pd, n, arg, mem));
#undef ARG
out:
	return st;
}

/* The weights quantized per output channel, once: wq plain [O][per]
 * (doubled where oneDNN halves them) and the output scales sx * sw[o],
 * kept in the plan with a copy of the f32 weights they came from. */
struct cpu_qcache {
	pthread_mutex_t lock;
	int valid;
	float *w;   /* the f32 weights quantized last [O][per] */
	int8_t *wq; /* [O][per] */
	float *sc;  /* [O] */
};

void cpu_qcache_free(struct cpu_qcache *q)
{
	if (!q)
		return;
	pthread_mutex_destroy(&q->lock);
	free(q->w);
	free(q->wq);
	free(q->sc);
	free(q);
}

static struct cpu_qcache *q_cache_new(int64_t O, int64_t per)
{
	struct cpu_qcache *q = calloc(1, sizeof *q);
	if (!q)
		return NULL;
	pthread_mutex_init(&q->lock, NULL);
	q->w = malloc(sizeof(float) * (size_t)(O * per));
	q->wq = malloc((size_t)(O * per));
	q->sc = malloc(sizeof(float) * (size_t)O);
	if (!q->w || !q->wq || !q->sc) {
		cpu_qcache_free(q);
		return NULL;
	}
	return q;
}

/* Quantize w into the cache (sw[o] = max|w[o]| / 63, [-63, 63], round
 * half to even). */
static void q_quantize(const struct cpu_plan *p, const float *w, struct cpu_qcache *q)
{
	const int64_t O = p->rows, per = p->cols;
	const float sx = (float)p->op.f[0];
	const int adj = (int)p->sz[7]; /* 2: oneDNN halves the weights (see above) */
#pragma omp parallel for schedule(static)
	for (int64_t o = 0; o < O; o++) {
		const float *row = w + o * per;
		float amax = 0;
		for (int64_t k = 0; k < per; k++)
			amax = fmaxf(amax, fabsf(row[k]));
		const float sw = amax > 0 ? amax / 63.0f : 1.0f;
		for (int64_t k = 0; k < per; k++)
			q->wq[o * per + k] = (int8_t)(adj * fmaxf(-63.0f, fminf(63.0f, nearbyintf(row[k] / sw))));
		q->sc[o] = sx * sw / (float)adj;
	}
	memcpy(q->w, w, sizeof(float) * (size_t)(O * per));
	q->valid = 1;
}

/* The quantized weights and scales into the workspace: from the cache,
 * quantized again only when the f32 weights differ from the ones it was
 * made from (inference weights do not change: one memcmp a run). */
static void q_weights(const struct cpu_plan *p, const float *w, void *ws)
{
	struct cpu_qcache *q = p->qcache;
	const size_t per = (size_t)p->cols, O = (size_t)p->rows;
	pthread_mutex_lock(&q->lock);
	if (!q->valid || memcmp(q->w, w, sizeof(float) * O * per))
		q_quantize(p, w, q);
	memcpy((char *)ws + p->sz[OFF_WP], q->wq, O * per);
	memcpy((char *)ws + p->sz[OFF_SC], q->sc, sizeof(float) * O);
	pthread_mutex_unlock(&q->lock);
}

/* y[i] = act(acc[i] * sc[o] + b[o]), o the channel of element i: the
 * innermost dimension for rows and NHWC (inner = 1), else every
 * inner = OH*OW elements in turn (NCHW).  Loops over (row, channel)
 * blocks, so no division per element. */
static void q_epilogue(const struct cpu_plan *p, const struct kiln_op_args *a)
{
	const int64_t O = p->rows, inner = p->sz[6], blocks = p->n / inner;
	const int32_t *acc = (const int32_t *)((const char *)a->workspace + p->sz[OFF_YK]);
	const float *sc = (const float *)((const char *)a->workspace + p->sz[OFF_SC]);
	const float *b = p->op.n_in == 3 ? a->in[2] : NULL;
	const int relu = (p->op.flags & KILN_OPF_ACT) != 0;
	float *y = a->out[0];
	if (inner == 1) {
#pragma omp parallel for schedule(static)
		for (int64_t r = 0; r < blocks / O; r++)
			for (int64_t o = 0; o < O; o++) {
				const int64_t i = r * O + o;
				float v = (float)acc[i] * sc[o] + (b ? b[o] : 0.0f);
				y[i] = relu && v < 0 ? 0.0f : v;
			}
		return;
	}
#pragma omp parallel for schedule(static)
	for (int64_t k = 0; k < blocks; k++) {
		const int64_t o = k % O;
		const float s = sc[o], bo = b ? b[o] : 0.0f;
		for (int64_t i = k * inner; i < (k + 1) * inner; i++) {
			float v = (float)acc[i] * s + bo;
			y[i] = relu && v < 0 ? 0.0f : v;
		}
	}
}

static kiln_status q_run(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
	q_weights(p, a->in[1], a->workspace);
	kiln_status st = cpu_dnn_run(p, a, e);
	if (!st)
		q_epilogue(p, a);
	return st;
}

kiln_status cpu_qconv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	struct qbuild b;
	kiln_status st;
	const struct kiln_op *op = &p->op;
	memset(&b, 0, sizeof b);
	b.conv = op->type == KILN_OP_QCONV;
	b.has_bias = op->n_in == 3;
	if (!cpu_all_f32(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 tensors (the op quantizes them)");
	if ((op->flags & KILN_OPF_ACT) && op->i[KILN_OPI_ACT] != KILN_ACT_RELU)
		return cpu_bad(c, op, KILN_ENOTSUP, "a fused ReLU only (the layer runs other activations apart)");
	if (b.conv) {
		b.nhwc = cpu_nhwc(&op->in[0]);
		b.O = op->in[1].dims[0];
		b.per = op->in[1].dims[1] * op->in[1].dims[2] * op->in[1].dims[3];
	} else {
		b.O = op->i[3];
		b.per = op->i[4];
	}
	snprintf(b.geom, sizeof b.geom, "%s O %lld x %lld per channel, input %s scale %g",
		 b.conv ? (b.nhwc ? "NHWC" : "NCHW") : "rows", (long long)b.O, (long long)b.per,
		 op->i[8] ? "u8" : "s8", op->f[0]);
	if ((st = cpu_dnn_new(c, p)) || (st = q_primitive(c, p, &b)) || (st = q_reorders(c, p, &b)))
		goto out;
	q_workspace(p, &b);
	p->sz[7] = (b.w_kern->extra.flags & dnnl_memory_extra_flag_scale_adjust) &&
			   b.w_kern->extra.scale_adjust == 0.5f ? 2 : 1;
	p->n = cpu_numel(&op->out[0]);
	p->sz[6] = b.conv && !b.nhwc ? op->out[0].dims[2] * op->out[0].dims[3] : 1;
	if ((st = q_steps(c, p, &b)))
		goto out;
	if (!(p->qcache = q_cache_new(b.O, b.per))) {
		st = c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory for the quantized weights",
				    cpu_op_name(op->type), b.geom);
		goto out;
	}
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = q_run;
	const char *impl = "?";
	dnnl_primitive_desc_query(b.pd, dnnl_query_impl_info_str, 0, &impl);
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s%s, workspace %zu bytes", cpu_op_name(op->type),
		     b.geom, impl, p->sz[7] == 2 ? " (weights halved)" : "", p->workspace);
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(b.pd);
	dnnl_primitive_desc_destroy(b.rx);
	dnnl_primitive_desc_destroy(b.rw);
	dnnl_primitive_attr_destroy(b.attr);
	dnnl_primitive_attr_destroy(b.rx_attr);
	return st;
}
