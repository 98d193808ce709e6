/* plugins/cpu/qconv.c - KILN_OP_QCONV and KILN_OP_QLINEAR (kiln/ops.h):
 * INT8 inference through oneDNN's (2.x C API) int8 convolution and inner
 * product: u8 or s8 input x s8 weights -> exact s32 sums -> f32 y.
 *
 *   QCONV:   y[N,O,OH,OW] = act(sx * sw[o] * conv(xq, wq)[n,o,p,q] + b[o])
 *   QLINEAR: y[M,N]       = act(sx * sw[n] * (xq . wq^T)[m,n] + b[n])
 *
 * What a plan keeps (struct cpu_qcache), made on the first run and again
 * only when the weights may have changed: with KILN_OPF_FROZEN (an
 * inference plan, ABI 2.15; [plugin.cpu] keep_weights) after the core's
 * KILN_PROC_WEIGHTS_CHANGED (the device's count of them, cpu_ctx.wgen,
 * moved on since the cache was made; nothing is compared per run),
 * without it when the f32 weights or bias differ from a copy of the ones
 * it was made from (one memcmp a run):
 *  - the weights quantized per output channel (sw[o] = max|w[o]| / 63,
 *    [-63, 63], round half to even), then reordered once by oneDNN into
 *    the kernel's blocked layout (with the s8-input compensation the
 *    reorder computes);
 *  - the output scales sc[o] = sx * sw[o] and the bias in the s32 domain,
 *    bq[o] = b[o] / sc[o] (f32): oneDNN 2.6 computes
 *    dst = act(scale * (acc + bias)), so sc[o] * (acc + bq[o]) is the
 *    contract's sx * sw[o] * acc + b[o] up to f32 rounding.
 * Each run is then two oneDNN steps, both made at prepare: a reorder of x
 * (f32, the caller's layout) into the kernel's u8/s8 layout with the
 * constant scale 1 / sx (round half to even, saturated), and the int8
 * primitive writing y in f32 in the caller's layout, its scales (runtime,
 * per channel), bias and fused ReLU applied in its epilogue.  (NCHW: no
 * int8 kernel writes it, so y comes in the kernel's layout and a third
 * step reorders it.)
 *
 * Chained INT8 (ABI 2.8): a u8 x is already quantized (a chained layer's
 * y): the primitive reads it where it lies, with no reorder (unless the
 * kernel wants another layout).  A u8 y is written by the primitive
 * itself, its scales divided by the output's scale so = f[1]:
 * sat_u8(round((acc + bq[o]) * sc[o] / so)), the ReLU post-op before the
 * conversion.
 *
 * Exactness on CPUs without VNNI (AVX2, AVX-512 before VNNI): the int8
 * kernels multiply u8 by s8 with vpmaddubsw, whose pairwise sums saturate
 * at int16; 7-bit weights keep 255 * 63 * 2 inside it.  Where the kernel's
 * weight layout says oneDNN halves the weights on the way in (its
 * scale_adjust 0.5, undone on the sums), the weights go in doubled, so the
 * halving is exact and so are the sums (and the scales are halved).
 *
 * Workspace: [scratchpad | xq | y in the kernel's layout (NCHW)], each
 * 64-byte aligned.
 */
#include "dnn.h"
#include "../common/c_locale.h" /* common_snprintf_c */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The operation a primitive is made from. */
union q_desc {
	dnnl_convolution_desc_t cd;
	dnnl_inner_product_desc_t id;
};

/* What the prepare steps share. */
struct qbuild {
	int conv, nhwc;
	int64_t O, per; /* output channels, weights per channel */
	char geom[200];
	dnnl_memory_desc_t x_user, x_any, w_user, w_any, y_user, y_any, o_md; /* o_md: f32 [O] */
	const dnnl_memory_desc_t *x_kern, *w_kern, *y_kern;
	dnnl_primitive_desc_t pd, rx, rw, ry;
	dnnl_primitive_attr_t attr, rx_attr;
	union q_desc desc;
};

/* Workspace offsets of xq and of y in the kernel's layout (where that is
 * not the caller's), kept in the plan's sz[]; sz[7]: 2 when oneDNN halves
 * the weights, else 1. */
enum { OFF_XQ, OFF_YK };

/* The primitive's attributes: a user scratchpad, the output scales sc[O]
 * per channel (oneDNN 2.6's int8 convolutions take them only as
 * constants: the primitive is made again when they change), the fused
 * ReLU. */
static dnnl_status_t q_attr(const struct kiln_op *op, int64_t O, const float *sc, dnnl_primitive_attr_t *attr)
{
	dnnl_post_ops_t po = NULL;
	dnnl_status_t s = dnnl_primitive_attr_create(attr);
	if (s == dnnl_success)
		s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
	if (s == dnnl_success)
		s = dnnl_primitive_attr_set_output_scales(*attr, O, 1 << 1, sc);
	if (s == dnnl_success && (op->flags & KILN_OPF_ACT)) {
		s = dnnl_post_ops_create(&po);
		if (s == dnnl_success)
			s = cpu_dnn_post_act(po, op);
		if (s == dnnl_success)
			s = dnnl_primitive_attr_set_post_ops(*attr, po);
	}
	dnnl_post_ops_destroy(po);
	return s;
}

/* The primitive descriptor of an int8 convolution or inner product.  A
 * convolution takes oneDNN's first jit_* implementation over its first
 * choice when that is a brgconv (AVX-512 VNNI / AMX): on the ResNet
 * example's 16-64 channel convolutions brgconv spent as much time in its
 * C++ driver (per-row brgemm batches) as in its kernels, and jit_int8 cut
 * the INT8 evaluation's CPU time by a third with the same int32 sums
 * (docs/PERFORMANCE.md, session 9).  KILN_CPU_QCONV_BRG=1 keeps oneDNN's
 * first choice. */
static dnnl_status_t q_pd_create(dnnl_primitive_desc_t *pd, const void *desc, int conv,
				 dnnl_primitive_attr_t attr, dnnl_engine_t e)
{
	const char *keep = getenv("KILN_CPU_QCONV_BRG");
	dnnl_primitive_desc_iterator_t it = NULL;
	*pd = NULL;
	if (!conv || (keep && !strcmp(keep, "1")))
		return dnnl_primitive_desc_create(pd, desc, attr, e, NULL);
	dnnl_status_t s = dnnl_primitive_desc_iterator_create(&it, desc, attr, e, NULL);
	for (int k = 0; s == dnnl_success; k++) {
		dnnl_primitive_desc_t c = dnnl_primitive_desc_iterator_fetch(it);
		const char *impl = "";
		dnnl_primitive_desc_query(c, dnnl_query_impl_info_str, 0, &impl);
		if (k == 0 && strncmp(impl, "brgconv", 7)) { /* not a brgconv: oneDNN's pick */
			*pd = c;
			break;
		}
		if (!strncmp(impl, "jit", 3)) {
			dnnl_primitive_desc_destroy(*pd);
			*pd = c;
			break;
		}
		if (k == 0)
			*pd = c; /* the brgconv, unless a jit_* follows */
		else
			dnnl_primitive_desc_destroy(c);
		s = dnnl_primitive_desc_iterator_next(it);
	}
	dnnl_primitive_desc_iterator_destroy(it);
	if (*pd)
		return dnnl_success;
	return s == dnnl_iterator_ends ? dnnl_unimplemented : s;
}

/* The descriptors and the primitive: a convolution (NCHW/NHWC activations,
 * OIHW or GOIHW weights) or an inner product (x [M,K], w [N,K]). */
static kiln_status q_primitive(struct cpu_ctx *c, const struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const struct kiln_op *op = &p->op;
	const char *geom = b->geom;
	const dnnl_data_type_t xdt = op->i[8] ? dnnl_u8 : dnnl_s8;
	/* the caller's x and y: f32, or u8 (chained INT8) */
	const dnnl_data_type_t xu = op->in[0].dtype == KILN_U8 ? dnnl_u8 : dnnl_f32;
	const dnnl_data_type_t yu = op->out[0].dtype == KILN_U8 ? dnnl_u8 : dnnl_f32;
	float *ones = malloc(sizeof(float) * (size_t)b->O); /* the scales until the weights come */
	if (!ones)
		return c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory", cpu_op_name(op->type), geom);
	for (int64_t o = 0; o < b->O; o++)
		ones[o] = 1.0f;
	CPU_DNN_TRY(q_attr(op, b->O, ones, &b->attr));
	dnnl_dims_t od = { b->O };
	CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->o_md, 1, od, dnnl_f32, dnnl_a));
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
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_user, 4, xd, xu, at));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_any, 4, xd, xdt, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->y_user, 4, yd, yu, at));
		/* y in the kernel's layout (NHWC: no int8 kernel writes NCHW) */
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->y_any, 4, yd, yu, dnnl_format_tag_any));
		if (g > 1) {
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 5, wd5, dnnl_s8, dnnl_goihw));
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 5, wd5, dnnl_s8, dnnl_format_tag_any));
		} else {
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 4, wd4, dnnl_s8, dnnl_oihw));
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 4, wd4, dnnl_s8, dnnl_format_tag_any));
		}
		CPU_DNN_TRY(dnnl_dilated_convolution_forward_desc_init(
			&b->desc.cd, dnnl_forward_inference, dnnl_convolution_direct, &b->x_any, &b->w_any,
			&b->o_md, &b->y_any, s, dil, pad, pad));
	} else {
		const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
		dnnl_dims_t xd = { M, K }, wd = { N, K }, yd = { M, N };
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_user, 2, xd, xu, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->x_any, 2, xd, xdt, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_user, 2, wd, dnnl_s8, dnnl_ab));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->w_any, 2, wd, dnnl_s8, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->y_user, 2, yd, yu, dnnl_ab));
		CPU_DNN_TRY(dnnl_inner_product_forward_desc_init(&b->desc.id, dnnl_forward_inference,
								&b->x_any, &b->w_any, &b->o_md, &b->y_user));
	}
	CPU_DNN_TRY(q_pd_create(&b->pd, &b->desc, b->conv, b->attr, c->engine));
	b->x_kern = dnnl_primitive_desc_query_md(b->pd, dnnl_query_src_md, 0);
	b->w_kern = dnnl_primitive_desc_query_md(b->pd, dnnl_query_weights_md, 0);
	b->y_kern = dnnl_primitive_desc_query_md(b->pd, dnnl_query_dst_md, 0);
out:
	free(ones);
	return st;
}

/* The reorders: x with its scale 1 / sx (every run; it converts; a u8 x
 * only where the kernel's layout differs, scale 1); y into the caller's
 * layout where the kernel's differs (every run); the weights when the
 * kernel's layout is not plain (when they change). */
static kiln_status q_reorders(struct cpu_ctx *c, const struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	const int u8_in = p->op.in[0].dtype == KILN_U8;
	const float inv = u8_in ? 1.0f : (float)(1.0 / p->op.f[0]);
	CPU_DNN_TRY(dnnl_primitive_attr_create(&b->rx_attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->rx_attr, dnnl_scratchpad_mode_user));
	CPU_DNN_TRY(dnnl_primitive_attr_set_output_scales(b->rx_attr, 1, 0, &inv));
	if (!u8_in || !dnnl_memory_desc_equal(b->x_kern, &b->x_user))
		CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->rx, &b->x_user, c->engine, b->x_kern,
							       c->engine, b->rx_attr));
	if (!dnnl_memory_desc_equal(b->w_kern, &b->w_user))
		CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->rw, &b->w_user, c->engine, b->w_kern,
							       c->engine, NULL));
	if (!dnnl_memory_desc_equal(b->y_kern, &b->y_user))
		CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->ry, b->y_kern, c->engine, &b->y_user,
							       c->engine, NULL));
out:
	return st;
}

/* Workspace offsets (p->sz) and size: the scratchpad first, shared by the
 * steps (they run in turn), then xq, then y in the kernel's layout. */
static void q_workspace(struct cpu_plan *p, const struct qbuild *b)
{
	size_t scratch = cpu_dnn_scratch(b->pd), rs = b->rx ? cpu_dnn_scratch(b->rx) : 0;
	scratch = rs > scratch ? rs : scratch;
	size_t off = al64(scratch);
	p->sz[OFF_XQ] = (int64_t)off;
	off += b->rx ? al64(dnnl_memory_desc_get_size(b->x_kern)) : 0;
	p->sz[OFF_YK] = (int64_t)off;
	off += b->ry ? al64(dnnl_memory_desc_get_size(b->y_kern)) : 0;
	p->workspace = off;
	p->rows = b->O, p->cols = b->per;
}

/* What the plan keeps of the weights (see the top of the file). */
struct cpu_qcache {
	pthread_mutex_t lock;
	int valid;
	/* frozen (KILN_OPF_FROZEN and [plugin.cpu] keep_weights): valid while
	 * *gen, the device's count of KILN_PROC_WEIGHTS_CHANGED calls (read
	 * atomically), is still made, its value when the cache was made; w
	 * and b are then NULL (nothing to compare) */
	int frozen;
	uint64_t made;
	const uint64_t *gen;
	const struct kiln_host *host; /* a debug line per quantization */
	float *w;   /* else: the f32 weights quantized last [O][per] */
	float *b;   /* and their bias [O] (plans with a bias) */
	int8_t *wq; /* plain [O][per] (doubled where oneDNN halves them) */
	void *wk;   /* the kernel's layout; wq itself when that is plain */
	float *sc;  /* output scales [O] */
	float *bq;  /* the bias over the scales [O] (0 without a bias) */
	dnnl_primitive_t rw;   /* wq -> wk, or NULL */
	dnnl_memory_t mwp, mwk; /* its operands */
	/* what the primitive is made again from, with the scales sc */
	union q_desc desc;
	dnnl_engine_t engine;
	int step;            /* its index in the plan's steps */
	size_t scratch;      /* the scratchpad bytes the workspace holds */
	dnnl_memory_desc_t x_kern, w_kern, y_kern; /* the layouts the steps use */
};

void cpu_qcache_free(struct cpu_qcache *q)
{
	if (!q)
		return;
	dnnl_primitive_destroy(q->rw);
	dnnl_memory_destroy(q->mwp);
	dnnl_memory_destroy(q->mwk);
	pthread_mutex_destroy(&q->lock);
	if (q->wk != q->wq)
		free(q->wk);
	free(q->w), free(q->b), free(q->wq), free(q->sc), free(q->bq);
	free(q);
}

/* The cache's buffers and its weight reorder (b->rw made into a
 * primitive over them). */
static kiln_status q_cache_new(struct cpu_ctx *c, struct cpu_plan *p, const struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	const size_t n = (size_t)(b->O * b->per), O = (size_t)b->O;
	struct cpu_qcache *q = p->qcache = calloc(1, sizeof *q);
	if (!q)
		goto oom;
	pthread_mutex_init(&q->lock, NULL);
	q->frozen = (p->op.flags & KILN_OPF_FROZEN) && c->keep_weights;
	q->gen = &c->wgen;
	q->host = c->host;
	q->w = q->frozen ? NULL : malloc(sizeof(float) * n);
	q->b = !q->frozen && p->op.n_in == 3 ? malloc(sizeof(float) * O) : NULL;
	q->wq = aligned_alloc(64, al64(n));
	q->wk = b->rw ? aligned_alloc(64, al64(dnnl_memory_desc_get_size(b->w_kern))) : q->wq;
	q->sc = malloc(sizeof(float) * O);
	q->bq = calloc(O, sizeof(float));
	if ((!q->frozen && (!q->w || (p->op.n_in == 3 && !q->b))) || !q->wq || !q->wk || !q->sc || !q->bq)
		goto oom;
	q->desc = b->desc;
	q->engine = c->engine;
	q->scratch = (size_t)p->sz[OFF_XQ];
	q->x_kern = *b->x_kern, q->w_kern = *b->w_kern, q->y_kern = *b->y_kern;
	if (b->rw) {
		CPU_DNN_TRY(dnnl_primitive_create(&q->rw, b->rw));
		CPU_DNN_TRY(dnnl_memory_create(&q->mwp, &b->w_user, c->engine, q->wq));
		CPU_DNN_TRY(dnnl_memory_create(&q->mwk, b->w_kern, c->engine, q->wk));
	}
out:
	return st;
oom:
	return c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory for the quantized weights",
			      cpu_op_name(p->op.type), geom);
}

/* Memory objects and steps: reorder x, the primitive (its weights, bias
 * and scales the cache's), reorder y where the kernel's layout differs. */
static kiln_status q_steps(struct cpu_ctx *c, struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct cpu_dnn *d = p->dnn;
	struct cpu_qcache *q = p->qcache;
	int mx, mxq, mwk, mb, my, myk, msp = -1;
	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n;
	const size_t rxs = b->rx ? cpu_dnn_scratch(b->rx) : 0;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->x_user, CPU_BIND_IN, 0, 0, &mx));
	mxq = mx; /* a u8 x in the kernel's layout: read where it lies */
	if (b->rx)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, b->x_kern, CPU_BIND_WS, 0, (size_t)p->sz[OFF_XQ], &mxq));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, b->w_kern, CPU_BIND_FIXED, 0, 0, &mwk));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->o_md, CPU_BIND_FIXED, 0, 0, &mb));
	CPU_DNN_TRY(dnnl_memory_set_data_handle(d->mem[mwk], q->wk));
	CPU_DNN_TRY(dnnl_memory_set_data_handle(d->mem[mb], q->bq));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->y_user, CPU_BIND_OUT, 0, 0, &my));
	myk = my;
	if (b->ry)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, b->y_kern, CPU_BIND_WS, 0, (size_t)p->sz[OFF_YK], &myk));
	if (cpu_dnn_scratch(b->pd) || rxs)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(
					cpu_dnn_scratch(b->pd) >= rxs ? b->pd : b->rx,
					dnnl_query_scratchpad_md, 0), CPU_BIND_WS, 0, 0, &msp));
#define ARG(a_, m_) (arg[n] = (a_), mem[n] = (m_), n++)
	n = 0;
	ARG(DNNL_ARG_FROM, mx), ARG(DNNL_ARG_TO, mxq);
	if (rxs)
		ARG(DNNL_ARG_SCRATCHPAD, msp);
	if (b->rx)
		CPU_DNN_TRY(cpu_dnn_step(d, b->rx, n, arg, mem));
	n = 0;
	ARG(DNNL_ARG_SRC, mxq), ARG(DNNL_ARG_WEIGHTS, mwk), ARG(DNNL_ARG_BIAS, mb);
	ARG(DNNL_ARG_DST, myk);
	if (cpu_dnn_scratch(b->pd))
		ARG(DNNL_ARG_SCRATCHPAD, msp);
	q->step = d->n_step;
	CPU_DNN_TRY(cpu_dnn_step(d, b->pd, n, arg, mem));
	if (b->ry) {
		n = 0;
		ARG(DNNL_ARG_FROM, myk), ARG(DNNL_ARG_TO, my);
		CPU_DNN_TRY(cpu_dnn_step(d, b->ry, n, arg, mem));
	}
#undef ARG
out:
	return st;
}

/* One row of weights into q: its scale sw = max|w| / 63 (1 for a zero
 * row, returned), the values w / sw in [-63, 63], round half to even,
 * times adj.  Inline compares (libm's fmaxf/fminf are calls: this ran
 * 40% of INT8's first batch on the CNN's fc1, docs/PERFORMANCE.md). */
CPU_CLONES static float q_row(const float *restrict row, int64_t per, float adj, int8_t *restrict q)
{
	float m[16] = { 0 }, amax = 0;
	int64_t k = 0;
	for (; k + 16 <= per; k += 16)
#pragma omp simd
		for (int j = 0; j < 16; j++) {
			const float a = fabsf(row[k + j]);
			m[j] = a > m[j] ? a : m[j];
		}
	for (; k < per; k++) {
		const float a = fabsf(row[k]);
		amax = a > amax ? a : amax;
	}
	for (int j = 0; j < 16; j++)
		amax = m[j] > amax ? m[j] : amax;
	const float sw = amax > 0 ? amax / 63.0f : 1.0f;
#pragma omp simd
	for (k = 0; k < per; k++) {
		float v = nearbyintf(row[k] / sw);
		v = v < 63.0f ? v : 63.0f; /* NaN: 63, as fminf */
		v = v > -63.0f ? v : -63.0f;
		q[k] = (int8_t)(adj * v);
	}
	return sw;
}

/* Quantize w (and b) into the cache: sw[o] = max|w[o]| / 63, [-63, 63],
 * round half to even; the scales and the bias over them (a u8 y: the
 * scales over its scale so too, the bias still in the sums' domain). */
static void q_quantize(const struct cpu_plan *p, const float *w, const float *b, struct cpu_qcache *q)
{
	const int64_t O = p->rows, per = p->cols;
	const float sx = (float)p->op.f[0];
	const float so = p->op.out[0].dtype == KILN_U8 ? (float)p->op.f[1] : 1.0f;
	const int adj = (int)p->sz[7]; /* 2: oneDNN halves the weights (see above) */
#pragma omp parallel for schedule(static)
	for (int64_t o = 0; o < O; o++) {
		const float sw = q_row(w + o * per, per, (float)adj, q->wq + o * per);
		const float sc = sx * sw / (float)adj;
		q->bq[o] = b ? b[o] / sc : 0.0f;
		q->sc[o] = sc / so;
	}
	if (q->frozen) /* nothing to compare with */
		return;
	memcpy(q->w, w, sizeof(float) * (size_t)(O * per));
	if (b)
		memcpy(q->b, b, sizeof(float) * (size_t)O);
}

/* The primitive made again with the cache's scales, in the plan's step:
 * the same layouts and no more scratchpad than prepare's (oneDNN picks by
 * the shapes and the attributes' kinds, not the scales' values). */
static dnnl_status_t q_remake(const struct cpu_plan *p, struct cpu_qcache *q)
{
	struct cpu_dnn *d = p->dnn;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_primitive_t prim = NULL;
	dnnl_status_t s = q_attr(&p->op, p->rows, q->sc, &attr);
	if (s == dnnl_success)
		s = q_pd_create(&pd, &q->desc, p->op.type == KILN_OP_QCONV, attr, q->engine);
	if (s == dnnl_success &&
	    (!dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), &q->x_kern) ||
	     !dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), &q->w_kern) ||
	     !dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), &q->y_kern) ||
	     cpu_dnn_scratch(pd) > q->scratch))
		s = dnnl_runtime_error;
	if (s == dnnl_success)
		s = dnnl_primitive_create(&prim, pd);
	if (s == dnnl_success) {
		dnnl_primitive_destroy(d->step[q->step].prim);
		d->step[q->step].prim = prim;
	}
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_attr_destroy(attr);
	return s;
}

/* 1 when the n floats at a and b are the same bytes: one memcmp per
 * 64K-float chunk, the chunks shared by the team (the CNN's fc1 compares
 * 12.8 MB a batch: 1.3% of its INT8 evaluation on 2 threads, on one). */
static int q_same(const float *a, const float *b, size_t n)
{
	const int64_t chunk = 65536, nc = (int64_t)((n + (size_t)chunk - 1) / (size_t)chunk);
	int differ = 0;
#pragma omp parallel for schedule(static) reduction(|| : differ) if (nc > 1)
	for (int64_t k = 0; k < nc; k++) {
		const size_t o = (size_t)(k * chunk), m = n - o < (size_t)chunk ? n - o : (size_t)chunk;
		differ = differ || memcmp(a + o, b + o, sizeof(float) * m) != 0;
	}
	return !differ;
}

/* 1 when the cache holds w and b: frozen, made since the device last
 * heard of new weights (no look at w: the flag says its values stay);
 * else made from these values (compared).  gen: the count now. */
static int q_current(const struct cpu_plan *p, const float *w, const float *b, uint64_t gen)
{
	const struct cpu_qcache *q = p->qcache;
	const size_t O = (size_t)p->rows, n = O * (size_t)p->cols;
	if (!q->valid)
		return 0;
	if (q->frozen)
		return q->made == gen;
	return q_same(q->w, w, n) && (!b || !memcmp(q->b, b, sizeof(float) * O));
}

/* The cache made from w and b unless it holds them already (q_current):
 * quantized, then reordered into the kernel's layout on the plan's
 * stream.  Under q->lock. */
static kiln_status q_refresh(const struct cpu_plan *p, const float *w, const float *b, struct cpu_err *e)
{
	struct cpu_qcache *q = p->qcache;
	struct cpu_dnn *d = p->dnn;
	/* read before the weights: a change after it makes the next run's */
	const uint64_t gen = __atomic_load_n(q->gen, __ATOMIC_ACQUIRE);
	if (q_current(p, w, b, gen))
		return KILN_OK;
	q->valid = 0;
	q_quantize(p, w, b, q);
	dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, q->mwp }, { DNNL_ARG_TO, q->mwk } };
	pthread_mutex_lock(&d->lock);
	dnnl_status_t s = q->rw ? dnnl_primitive_execute(q->rw, d->stream, 2, args) : dnnl_success;
	if (s == dnnl_success)
		s = dnnl_stream_wait(d->stream);
	if (s == dnnl_success)
		s = q_remake(p, q);
	pthread_mutex_unlock(&d->lock);
	if (s != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s: %s:%d: the weights' reorder or primitive: %s",
				cpu_op_name(p->op.type), __FILE__, __LINE__, cpu_dnnl_str(s));
	q->made = gen;
	q->valid = 1;
	q->host->log(KILN_LOG_DEBUG, "cpu", "%s O %lld x %lld: weights quantized (%s)", cpu_op_name(p->op.type),
		     (long long)p->rows, (long long)p->cols,
		     q->frozen ? "frozen: kept until the weights change" : "compared every run");
	return KILN_OK;
}

static kiln_status q_run(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
	struct cpu_qcache *q = p->qcache;
	pthread_mutex_lock(&q->lock);
	kiln_status st = q_refresh(p, a->in[1], p->op.n_in == 3 ? a->in[2] : NULL, e);
	if (!st)
		st = cpu_dnn_run(p, a, e);
	pthread_mutex_unlock(&q->lock);
	return st;
}

kiln_status cpu_qconv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	struct qbuild b;
	kiln_status st;
	const struct kiln_op *op = &p->op;
	memset(&b, 0, sizeof b);
	b.conv = op->type == KILN_OP_QCONV;
	for (int k = 1; k < op->n_in; k++)
		if (op->in[k].dtype != KILN_F32)
			return cpu_bad(c, op, KILN_ENOTSUP, "f32 weights and bias (the op quantizes them)");
	if ((op->in[0].dtype != KILN_F32 && op->in[0].dtype != KILN_U8) ||
	    (op->out[0].dtype != KILN_F32 && op->out[0].dtype != KILN_U8))
		return cpu_bad(c, op, KILN_ENOTSUP, "an f32 or u8 input and output");
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
	common_snprintf_c(b.geom, sizeof b.geom, "%s O %lld x %lld per channel, input %s%s scale %g, output %s",
		 b.conv ? (b.nhwc ? "NHWC" : "NCHW") : "rows", (long long)b.O, (long long)b.per,
		 op->in[0].dtype == KILN_U8 ? "chained " : "", op->i[8] ? "u8" : "s8", op->f[0],
		 op->out[0].dtype == KILN_U8 ? "u8" : "f32");
	if ((st = cpu_dnn_new(c, p)) || (st = q_primitive(c, p, &b)) || (st = q_reorders(c, p, &b)))
		goto out;
	q_workspace(p, &b);
	p->sz[7] = (b.w_kern->extra.flags & dnnl_memory_extra_flag_scale_adjust) &&
			   b.w_kern->extra.scale_adjust == 0.5f ? 2 : 1;
	p->n = cpu_numel(&op->out[0]);
	if ((st = q_cache_new(c, p, &b)) || (st = q_steps(c, p, &b)))
		goto out;
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = q_run;
	const char *impl = cpu_dnn_impl(b.pd);
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s%s, workspace %zu bytes, weights %s", cpu_op_name(op->type),
		     b.geom, impl, p->sz[7] == 2 ? " (weights halved)" : "", p->workspace,
		     p->qcache->frozen ? "frozen" : "compared every run");
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(b.pd);
	dnnl_primitive_desc_destroy(b.rx);
	dnnl_primitive_desc_destroy(b.rw);
	dnnl_primitive_desc_destroy(b.ry);
	dnnl_primitive_attr_destroy(b.attr);
	dnnl_primitive_attr_destroy(b.rx_attr);
	return st;
}
