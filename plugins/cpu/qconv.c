/* plugins/cpu/qconv.c - KILN_OP_QCONV and KILN_OP_QLINEAR (kiln/ops.h):
 * INT8 inference through oneDNN's (2.x C API) int8 convolution and inner
 * product: u8 or s8 input x s8 weights -> exact s32 sums -> f32 y.
 *
 *   QCONV:   y[N,O,OH,OW] = act(sx * sw[o] * conv(xq, wq)[n,o,p,q] + b[o])
 *   QLINEAR: y[M,N]       = act(sx * sw[n] * (xq . wq^T)[m,n] + b[n])
 *
 * What a plan reads (struct cpu_qweights, qweights.c), made on the first
 * run and again only when the weights may have changed: with
 * KILN_OPF_FROZEN (an inference plan, ABI 2.15; [plugin.cpu]
 * keep_weights) after the core said these weights changed
 * (KILN_PROC_WEIGHTS_WRITTEN of their model's memory, or
 * KILN_PROC_WEIGHTS_CHANGED: wshare.c, "Notices"; nothing is compared
 * per run), and then shared by every frozen plan of the context
 * that reads the same weights (a model's plans for other row counts take
 * them as they are); without it when the f32 weights or bias differ from a
 * copy of the ones they were made from (one memcmp a run):
 *  - the weights quantized per output channel (sw[o] = max|w[o]| / 63,
 *    [-63, 63], round half to even), then reordered once by oneDNN into
 *    the kernel's blocked layout (with the s8-input compensation the
 *    reorder computes);
 *  - the output scales sc[o] = sx * sw[o] and the bias in the s32 domain,
 *    bq[o] = b[o] / sc[o] (f32): oneDNN 2.6 computes
 *    dst = act(scale * (acc + bias)), so sc[o] * (acc + bq[o]) is the
 *    contract's sx * sw[o] * acc + b[o] up to f32 rounding.
 * The plan's own primitive takes the scales as constants: it is made
 * again when the values it reads were made anew (struct cpu_qcache.ver).
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
#include "qweights.h"
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
	dnnl_primitive_desc_t pd, rx, ry;
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
 * layout where the kernel's differs (every run).  (The weights': the
 * cache's, qweights.c.) */
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

/* What the plan keeps (see the top of the file). */
struct cpu_qcache {
	pthread_mutex_t lock;      /* one run of the plan at a time */
	struct cpu_qkey k;         /* what its quantized weights depend on */
	struct cpu_wref r;         /* the weights quantized: its own, or (frozen)
				    * shared (qweights.c, wshare.c) */
	unsigned at;               /* r.taken when the memory objects were pointed into r.e */
	uint64_t ver;              /* its ver whose scales the primitive has (0: prepare's ones) */
	int mwk, mb;               /* the memory objects of the weights and the bias */
	/* what the primitive is made again from, with the scales s->sc */
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
	cpu_wref_drop(&q->r);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

/* The plan's cache: its key, and (not frozen) weights of its own; a
 * frozen plan takes the shared ones on its first run (none made here:
 * before session 40 each frozen plan made an entry here that its first
 * run dropped for the shared one). */
static kiln_status q_cache_new(struct cpu_ctx *c, struct cpu_plan *p, const struct qbuild *b)
{
	const struct kiln_op *op = &p->op;
	int lib;
	struct cpu_qcache *q = p->qcache = calloc(1, sizeof *q);
	if (!q)
		return c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory for the quantized weights",
				      cpu_op_name(op->type), b->geom);
	pthread_mutex_init(&q->lock, NULL);
	q->k = (struct cpu_qkey){
		.O = b->O, .per = b->per, .sx = (float)op->f[0],
		.so = op->out[0].dtype == KILN_U8 ? (float)op->f[1] : 1.0f,
		.adj = (int)p->sz[7], .has_bias = op->n_in == 3,
		.w_user = b->w_user, .w_kern = *b->w_kern,
		.engine = c->engine, .host = c->host,
	};
	const int frozen = (op->flags & KILN_OPF_FROZEN) && c->keep_weights;
	const kiln_status st = cpu_wref_init(&q->r, c, &cpu_qw_kind, &q->k, frozen, &lib);
	if (st)
		return st == KILN_ENOMEM
			       ? c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory for the quantized weights",
						cpu_op_name(op->type), b->geom)
			       : c->host->error(KILN_EDEVICE, "cpu: %s %s: the weights' reorder: %s",
						cpu_op_name(op->type), b->geom, cpu_dnnl_str((dnnl_status_t)lib));
	q->desc = b->desc;
	q->engine = c->engine;
	q->scratch = (size_t)p->sz[OFF_XQ];
	q->x_kern = *b->x_kern, q->w_kern = *b->w_kern, q->y_kern = *b->y_kern;
	return KILN_OK;
}

/* Memory objects and steps: reorder x, the primitive (its weights, bias
 * and scales the cache's), reorder y where the kernel's layout differs. */
static kiln_status q_steps(struct cpu_ctx *c, struct cpu_plan *p, struct qbuild *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct cpu_dnn *d = p->dnn;
	struct cpu_qcache *q = p->qcache;
	int mx, mxq, my, myk, msp = -1;
	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n;
	const size_t rxs = b->rx ? cpu_dnn_scratch(b->rx) : 0;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->x_user, CPU_BIND_IN, 0, 0, &mx));
	mxq = mx; /* a u8 x in the kernel's layout: read where it lies */
	if (b->rx)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, b->x_kern, CPU_BIND_WS, 0, (size_t)p->sz[OFF_XQ], &mxq));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, b->w_kern, CPU_BIND_FIXED, 0, 0, &q->mwk));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->o_md, CPU_BIND_FIXED, 0, 0, &q->mb));
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
	ARG(DNNL_ARG_SRC, mxq), ARG(DNNL_ARG_WEIGHTS, q->mwk), ARG(DNNL_ARG_BIAS, q->mb);
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

/* The primitive made again with the scales sc, in the plan's step: the
 * same layouts and no more scratchpad than prepare's (oneDNN picks by the
 * shapes and the attributes' kinds, not the scales' values). */
static dnnl_status_t q_remake(const struct cpu_plan *p, struct cpu_qcache *q, const float *sc)
{
	struct cpu_dnn *d = p->dnn;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_primitive_t prim = NULL;
	dnnl_status_t s = q_attr(&p->op, p->rows, sc, &attr);
	if (s == dnnl_success)
		s = q_pd_create(&pd, &q->desc, p->op.type == KILN_OP_QCONV, attr, q->engine);
	if (s == dnnl_success &&
	    (!dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), &q->x_kern) ||
	     !dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), &q->w_kern) ||
	     !dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), &q->y_kern) ||
	     cpu_dnn_scratch(pd) > q->scratch))
		s = dnnl_runtime_error;
	if (s == dnnl_success)
		s = cpu_dnn_primitive(&prim, pd);
	if (s == dnnl_success) {
		pthread_mutex_lock(&d->lock);
		dnnl_primitive_destroy(d->step[q->step].prim);
		d->step[q->step].prim = prim;
		pthread_mutex_unlock(&d->lock);
	}
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_attr_destroy(attr);
	return s;
}

/* The memory objects of the weights and bias pointed into the entry q
 * holds now (another than the last run's: the first run, or a frozen
 * plan's weights moved), whose scales the primitive then takes anew. */
static kiln_status q_point(const struct cpu_plan *p, struct cpu_qcache *q, struct cpu_err *e)
{
	struct cpu_dnn *d = p->dnn;
	const struct cpu_qweights *s = (const struct cpu_qweights *)q->r.e;
	if (dnnl_memory_set_data_handle(d->mem[q->mwk], s->wk) != dnnl_success ||
	    dnnl_memory_set_data_handle(d->mem[q->mb], s->bq) != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s: %s:%d: the quantized weights' memory objects",
				cpu_op_name(p->op.type), __FILE__, __LINE__);
	q->at = q->r.taken;
	q->ver = 0;
	return KILN_OK;
}

/* The weights quantized (made, or kept: qweights.c), the primitive's
 * scales theirs, then the steps. */
static kiln_status q_run(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
	struct cpu_qcache *q = p->qcache;
	const float *w = a->in[1], *b = p->op.n_in == 3 ? a->in[2] : NULL;
	kiln_status st;
	pthread_mutex_lock(&q->lock);
	if ((st = cpu_qw_acquire(&q->r, w, b, p->dnn, cpu_op_name(p->op.type), e))) {
		pthread_mutex_unlock(&q->lock);
		return st;
	}
	const struct cpu_qweights *s = (const struct cpu_qweights *)q->r.e;
	if (q->at != q->r.taken)
		st = q_point(p, q, e);
	if (!st && q->ver != s->base.ver) {
		const dnnl_status_t ds = q_remake(p, q, s->sc);
		if (ds != dnnl_success)
			st = cpu_fail(e, KILN_EDEVICE, "cpu: %s: %s:%d: the primitive with the weights' scales: %s",
				      cpu_op_name(p->op.type), __FILE__, __LINE__, cpu_dnnl_str(ds));
		else
			q->ver = s->base.ver;
	}
	if (!st)
		st = cpu_dnn_run(p, a, e);
	cpu_wref_release(&q->r);
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
		     p->qcache->r.frozen ? "frozen" : "compared every run");
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(b.pd);
	dnnl_primitive_desc_destroy(b.rx);
	dnnl_primitive_desc_destroy(b.ry);
	dnnl_primitive_attr_destroy(b.attr);
	dnnl_primitive_attr_destroy(b.rx_attr);
	return st;
}
