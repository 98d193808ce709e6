/* plugins/cpu/conv.c - KILN_OP_CONV, CONV_BWD_DATA and CONV_BWD_WEIGHTS
 * through oneDNN (2.x C API) convolution primitives.
 *
 *   CONV:             y[N,O,OH,OW] = conv(x[N,C,H,W], w[O,C/g,KH,KW]) (+ b[O])
 *   CONV_BWD_DATA:    dx[N,C,H,W]  from dy[N,O,OH,OW], w
 *   CONV_BWD_WEIGHTS: dw[O,C/g,KH,KW] (+ db[O]) from x, dy
 *
 *   OH = (H + 2*pad_h - dil_h*(KH - 1) - 1) / stride_h + 1  (floor; same for W)
 *
 * Activations are bound with their plain tag (nchw or nhwc), so no
 * activation is ever copied.  Weights are created with format `any`: oneDNN
 * picks the blocked layout its fastest kernel wants, and when that is not
 * plain OIHW (goihw for groups) a reorder primitive converts the caller's
 * weights into the workspace before the convolution (or, for the weight
 * gradient, the workspace into the caller's dw after it).  The scratchpad
 * is user-managed; workspace = [scratchpad | 64-aligned reordered weights].
 *
 * CONV_BWD_WEIGHTS with KILN_OPF_ACCUMULATE (ABI 2.9) adds into dw and db:
 * oneDNN 2.6's backward convolutions take no sum post-op, but a reorder
 * does, so the kernel writes its gradients into the workspace and a
 * reorder with sum (beta = 1) moves them into the caller's (for dw the
 * reorder from the kernel's layout there is anyway whenever it is not
 * OIHW; the bias's is the O floats).
 *
 * Kept copies (KILN_OPF_KEEP, ABI 2.9; f32, and bf16 since session 14: in
 * the kernel dtype, bf16 or f32 (p->kern_f32), whose choice tune.c makes
 * one for a copy's producer and consumer): the layer's three ops agree on
 * the blocked layouts of x and y, those of the forward primitive made
 * without post-ops (conv_pin), so that one op's reordered copy serves the
 * next: the CONV writes its blocked x into its last output (aux_bytes) for
 * the weight gradient, which reads it there instead of reordering x again
 * and writes its blocked dy into its own last output for the data
 * gradient, which reads that instead of reordering the same dy a second
 * time.  A layout that is the caller's is neither kept nor read.  Both
 * flags may be set on one CONV_BWD_WEIGHTS: the kept copies are of x and
 * dy, the sum is on dw.
 *
 * The bias gradient of a weight gradient whose kernel reads NHWC dy (an
 * NHWC model's, and the one-channel stem's, f32) is summed by kiln
 * (conv_run_db), not by oneDNN 2.6, whose NHWC kernel adds it up in a loop
 * of 4-wide SSE adds after its JIT part, up to 2.5x the op's time at 2
 * threads (docs/PERFORMANCE.md, "Issue 22, session 8").
 *
 * A residual in the epilogue (KILN_OPF_RESIDUAL, inference; f32 NHWC):
 * oneDNN's binary add post-op reads the last input r, in y's layout,
 * before the eltwise one of a fused activation, so a ResNet block's
 * conv, add and ReLU are one pass over y.  Elsewhere KILN_ENOTSUP (the
 * layer runs the CONV, an ADD and the ACT).
 *
 * oneDNN's dilation is PyTorch's minus one.  Right padding is given equal
 * to the left one: oneDNN rounds the output size down like PyTorch, so the
 * rows a floor drops are never read.
 */
#include "dnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPU_WS_ALIGN 64

static size_t align_up(size_t n) { return (n + CPU_WS_ALIGN - 1) & ~(size_t)(CPU_WS_ALIGN - 1); }

/* own_db (conv_run_db): rows of dy a partial bias sum covers */
#define CONV_DB_ROWS 256

static int64_t conv_db_chunks(int64_t rows) { return (rows + CONV_DB_ROWS - 1) / CONV_DB_ROWS; }

/* A 4-d activation [n,c,h,w] stored in the op's layout. */
static dnnl_data_type_t dnn_dt(int dtype)
{
	return dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32;
}

static dnnl_status_t act_md(dnnl_memory_desc_t *md, int64_t n, int64_t c, int64_t h, int64_t w,
			    int nhwc, dnnl_data_type_t dt)
{
	dnnl_dims_t d = { n, c, h, w };
	return dnnl_memory_desc_init_by_tag(md, 4, d, dt, nhwc ? dnnl_nhwc : dnnl_nchw);
}

/* Weights [O, C/g, KH, KW]: oneDNN's [g, O/g, C/g, KH, KW] for groups, the
 * same bytes as PyTorch's tensor. */
static dnnl_status_t wei_md(dnnl_memory_desc_t *md, int64_t O, int64_t Cg, int64_t KH, int64_t KW,
			    int64_t g, int any, dnnl_data_type_t dt)
{
	if (g > 1) {
		dnnl_dims_t d = { g, O / g, Cg, KH, KW };
		return dnnl_memory_desc_init_by_tag(md, 5, d, dt,
						    any ? dnnl_format_tag_any : dnnl_goihw);
	}
	dnnl_dims_t d = { O, Cg, KH, KW };
	return dnnl_memory_desc_init_by_tag(md, 4, d, dt, any ? dnnl_format_tag_any : dnnl_oihw);
}

/* The three tensors the convolution touches besides the bias: x (src or
 * diff_src), y (dst or diff_dst), w (weights or diff_weights). */
struct conv_tens {
	dnnl_memory_desc_t user, any;   /* the caller's layout; format `any` */
	const dnnl_memory_desc_t *kern; /* the layout the kernel chose */
	int in;                         /* read by the convolution (else written) */
	int bind, idx;                  /* where the caller's bytes are */
	dnnl_query_t q;
	int arg;                        /* DNNL_ARG_* of the convolution */
	dnnl_primitive_desc_t rpd;      /* reorder, when kern != user (and not kept in) */
	int reord;                      /* kern != user: the kernel has its own copy */
	int kbind, kidx;                /* where that copy is: CPU_BIND_WS (at off) or a kept */
	size_t off;                     /* workspace offset of the kernel copy */
	int m_user, m_kern;
};
enum { TX, TY, TW };

/* What cpu_conv_prepare's steps share: the op's roles and geometry, the
 * descriptors, and the primitive descriptors (freed by cpu_conv_prepare). */
struct conv_build {
	const struct kiln_tensor_desc *x, *w, *y;
	int has_bias, nhwc, kf32;
	int acc;                       /* BWD_WEIGHTS adds into dw, db */
	int own_db;                    /* BWD_WEIGHTS: db by conv_run_db, not oneDNN */
	int keep; /* KILN_OPF_KEEP: the kept copies (conv_layouts) */
	int res;  /* KILN_OPF_RESIDUAL: in[n_in - 1] added before the activation */
	int wkept; /* CONV: the reordered weights kept in the plan (conv_layouts) */
	dnnl_data_type_t adt, wdd, kdt;
	int64_t N, C, H, W, O, Cg, KH, KW, OH, OW, g;
	dnnl_dims_t strides, dil, pad;
	char geom[200];
	struct conv_tens t[3];
	dnnl_memory_desc_t b_md;
	dnnl_primitive_desc_t fwd, pd;
	dnnl_primitive_attr_t attr;
	dnnl_primitive_attr_t rattr; /* the reorders': attr without its post-ops */
	dnnl_primitive_attr_t sattr; /* with acc: the reorders out, with a sum */
	dnnl_primitive_desc_t rpd_b; /* with acc and a bias: db's reorder out */
	size_t b_off;                /* ... from this workspace offset */
};

/* Which tensor is which, and the dtypes: f32, or bf16 activations and
 * weights with f32 accumulation (oneDNN's bf16 kernels); the bias is f32,
 * and the weight gradient (and bias gradient) is f32 so that the flat
 * gradients stay f32. */
static kiln_status conv_roles(struct cpu_ctx *c, const struct cpu_plan *p, struct conv_build *b)
{
	const struct kiln_op *op = &p->op;
	const int type = op->type;
	b->keep = (op->flags & KILN_OPF_KEEP) != 0;
	b->res = (op->flags & KILN_OPF_RESIDUAL) != 0;
	if (type == KILN_OP_CONV) {
		b->x = &op->in[0], b->w = &op->in[1], b->y = &op->out[0];
		b->has_bias = op->n_in - b->res == 3;
		/* the binary post-op reads r as y is stored: plain NHWC f32, which
		 * the kernel writes as it is (a blocked NCHW y would not match) */
		if (b->res && (b->x->dtype != KILN_F32 || !cpu_nhwc(b->x) || b->keep))
			return cpu_bad(c, op, KILN_ENOTSUP, "a residual epilogue on f32 NHWC only");
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		if (op->flags & KILN_OPF_ACCUMULATE)
			/* oneDNN 2.6 has no sum post-op on backward data. */
			return cpu_bad(c, op, KILN_ENOTSUP,
				       "cannot accumulate into dx (write to scratch and add)");
		b->x = &op->out[0], b->w = &op->in[1], b->y = &op->in[0];
		b->has_bias = 0;
	} else {
		b->x = &op->in[0], b->w = &op->out[0], b->y = &op->in[1];
		b->has_bias = op->n_out - b->keep == 2;
		b->acc = (op->flags & KILN_OPF_ACCUMULATE) != 0;
	}
	const int lowp = b->x->dtype == KILN_BF16;
	/* the op without its kept copies (u8, last in and/or out) */
	const struct kiln_op bare = cpu_op_unkept(op);
	const int wdt = type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : b->x->dtype;
	if (cpu_op_has(op, KILN_F16) || b->y->dtype != b->x->dtype || b->w->dtype != wdt ||
	    (b->has_bias && (type == KILN_OP_CONV ? op->in[2].dtype : op->out[1].dtype) != KILN_F32) ||
	    (!lowp && !cpu_all_f32(&bare)))
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 tensors, or bf16 activations and weights with an f32 bias (weight and bias gradients f32)");
	b->adt = dnn_dt(b->x->dtype), b->wdd = dnn_dt(wdt);
	/* p->kern_f32 (tune.c: [plugin.cpu] bf16_conv = f32, or auto found the
	 * f32 kernel faster): the kernel's tensors are f32 and the reorders
	 * between the caller's layout and the kernel's convert */
	b->kf32 = lowp && p->kern_f32;
	b->kdt = b->kf32 ? dnnl_f32 : b->adt;
	return KILN_OK;
}

/* Sizes, strides and the geometry string of the messages. */
static void conv_geometry(const struct kiln_op *op, struct conv_build *b)
{
	const struct kiln_tensor_desc *x = b->x, *w = b->w;
	b->nhwc = cpu_nhwc(x);
	b->N = x->dims[0], b->C = x->dims[1], b->H = x->dims[2], b->W = x->dims[3];
	b->O = w->dims[0], b->Cg = w->dims[1], b->KH = w->dims[2], b->KW = w->dims[3];
	const int64_t sh = op->i[0], sw = op->i[1], ph = op->i[2], pw = op->i[3];
	const int64_t dh = op->i[4], dw = op->i[5];
	b->g = op->i[6] ? op->i[6] : 1;
	snprintf(b->geom, sizeof b->geom,
		 "x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] stride %lldx%lld pad %lldx%lld dilation %lldx%lld groups %lld %s",
		 (long long)b->N, (long long)b->C, (long long)b->H, (long long)b->W, (long long)b->O,
		 (long long)b->Cg, (long long)b->KH, (long long)b->KW, (long long)sh, (long long)sw,
		 (long long)ph, (long long)pw, (long long)dh, (long long)dw, (long long)b->g,
		 b->nhwc ? "NHWC" : "NCHW");
	b->OH = (b->H + 2 * ph - dh * (b->KH - 1) - 1) / sh + 1;
	b->OW = (b->W + 2 * pw - dw * (b->KW - 1) - 1) / sw + 1;
	b->strides[0] = sh, b->strides[1] = sw;
	b->dil[0] = dh - 1, b->dil[1] = dw - 1; /* oneDNN's dilation is PyTorch's minus one */
	b->pad[0] = ph, b->pad[1] = pw;
}

/* The memory descriptors (the caller's layouts and the `any` ones the
 * kernel chooses from) and the attributes (user scratchpad; a fused
 * activation as an eltwise post-op). */
static kiln_status conv_descs(struct cpu_ctx *c, const struct cpu_plan *p, struct conv_build *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct conv_tens *t = b->t;
	/* NCHW: oneDNN's fast kernels want blocked activations (nChw16c), so
	 * the activations are `any` too and reordered like the weights (what
	 * PyTorch's ideep does); the gemm-based kernel for plain NCHW is several
	 * times slower, worst for the weight gradient.  NHWC has direct kernels. */
	const int act_any = !b->nhwc;
	/* The weight gradient of one input channel (a first layer): NCHW's x is
	 * NHWC's bytes, and the NHWC kernel takes it as it is, where the
	 * blocked one pads the channel to 8 (8x the work; the forward reads
	 * plain x already) */
	const int flat1 = p->op.type == KILN_OP_CONV_BWD_WEIGHTS && !b->nhwc && b->C == 1 &&
			  b->g == 1;
	b->own_db = b->has_bias && p->op.type == KILN_OP_CONV_BWD_WEIGHTS && (b->nhwc || flat1) &&
		    b->adt == dnnl_f32 && b->kdt == dnnl_f32;
	CPU_DNN_TRY(act_md(&t[TX].user, b->N, b->C, b->H, b->W, b->nhwc || flat1, b->adt));
	CPU_DNN_TRY(act_md(&t[TY].user, b->N, b->O, b->OH, b->OW, b->nhwc, b->adt));
	CPU_DNN_TRY(wei_md(&t[TW].user, b->O, b->Cg, b->KH, b->KW, b->g, 0, b->wdd));
	CPU_DNN_TRY(wei_md(&t[TW].any, b->O, b->Cg, b->KH, b->KW, b->g, 1, b->kf32 ? dnnl_f32 : b->wdd));
	dnnl_dims_t xd = { b->N, b->C, b->H, b->W }, yd = { b->N, b->O, b->OH, b->OW }, bd = { b->O };
	if (flat1) {
		CPU_DNN_TRY(act_md(&t[TX].any, b->N, b->C, b->H, b->W, 1, b->kdt));
		CPU_DNN_TRY(act_md(&t[TY].any, b->N, b->O, b->OH, b->OW, 1, b->kdt));
	} else if (act_any) {
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&t[TX].any, 4, xd, b->kdt, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&t[TY].any, 4, yd, b->kdt, dnnl_format_tag_any));
	} else if (b->kdt != b->adt) {
		CPU_DNN_TRY(act_md(&t[TX].any, b->N, b->C, b->H, b->W, b->nhwc, b->kdt));
		CPU_DNN_TRY(act_md(&t[TY].any, b->N, b->O, b->OH, b->OW, b->nhwc, b->kdt));
	} else {
		t[TX].any = t[TX].user, t[TY].any = t[TY].user;
	}
	CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b->b_md, 1, bd, dnnl_f32, dnnl_a));
	CPU_DNN_TRY(dnnl_primitive_attr_create(&b->attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->attr, dnnl_scratchpad_mode_user));
	/* a reorder takes no eltwise post-op (oneDNN: unimplemented), so the
	 * fused activation must not reach the reorders around the kernel */
	CPU_DNN_TRY(dnnl_primitive_attr_create(&b->rattr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->rattr, dnnl_scratchpad_mode_user));
	if (b->acc) { /* dst = src + dst: the reorders out of the kernel's copies */
		dnnl_post_ops_t po = NULL;
		CPU_DNN_TRY(dnnl_primitive_attr_create(&b->sattr));
		CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(b->sattr, dnnl_scratchpad_mode_user));
		CPU_DNN_TRY(dnnl_post_ops_create(&po));
		dnnl_status_t s1 = dnnl_post_ops_append_sum(po, 1.0f);
		dnnl_status_t s2 = s1 == dnnl_success ? dnnl_primitive_attr_set_post_ops(b->sattr, po) : s1;
		dnnl_post_ops_destroy(po);
		CPU_DNN_TRY(s2);
	}
	if ((p->op.flags & KILN_OPF_ACT) || b->res) { /* CONV only (opcheck) */
		/* the residual (binary add of r, y's layout), then the fused activation */
		dnnl_post_ops_t po = NULL;
		CPU_DNN_TRY(dnnl_post_ops_create(&po));
		dnnl_status_t s1 = b->res ? dnnl_post_ops_append_binary(po, dnnl_binary_add, &t[TY].user)
					  : dnnl_success;
		if (s1 == dnnl_success && (p->op.flags & KILN_OPF_ACT))
			s1 = cpu_dnn_post_act(po, &p->op);
		dnnl_status_t s2 = s1 == dnnl_success ? dnnl_primitive_attr_set_post_ops(b->attr, po) : s1;
		dnnl_post_ops_destroy(po);
		CPU_DNN_TRY(s2);
	}
out:
	return st;
}

/* Where a tensor's bytes are and which argument of the convolution it is. */
static void conv_bind(struct conv_tens *t, int in, int bind, int idx, dnnl_query_t q, int arg)
{
	t->in = in, t->bind = bind, t->idx = idx, t->q = q, t->arg = arg;
}

/* Kept copies: x and y in the layouts of the forward primitive made
 * without post-ops (the reorders' attributes), which each of the layer's
 * three ops computes alike, so the copy one writes is the one the next
 * reads. */
static kiln_status conv_pin(struct cpu_ctx *c, const struct cpu_plan *p, struct conv_build *b,
			    const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *bias)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct conv_tens *t = b->t;
	dnnl_convolution_desc_t desc;
	dnnl_primitive_desc_t pin = NULL;
	CPU_DNN_TRY(dnnl_dilated_convolution_forward_desc_init(
		&desc, dnnl_forward_training, dnnl_convolution_direct, &t[TX].any, w, bias, &t[TY].any,
		b->strides, b->dil, b->pad, b->pad));
	CPU_DNN_TRY(dnnl_primitive_desc_create(&pin, &desc, b->rattr, c->engine, NULL));
	t[TX].any = *dnnl_primitive_desc_query_md(pin, dnnl_query_src_md, 0);
	t[TY].any = *dnnl_primitive_desc_query_md(pin, dnnl_query_dst_md, 0);
out:
	dnnl_primitive_desc_destroy(pin);
	return st;
}

/* An implementation oneDNN would not be asked for by choice: its
 * reference loops, and the im2col + GEMM one. */
static int conv_impl_skipped(const char *name)
{
	return !strncmp(name, "ref", 3) || strstr(name, "gemm") != NULL;
}

/* b->fwd: oneDNN's p->conv_impl-th distinct implementation of desc (0:
 * its first; tune.c times them); KILN_ENOTSUP, with no message, when it
 * offers fewer. */
static kiln_status conv_pick(struct cpu_ctx *c, const struct cpu_plan *p, struct conv_build *b,
			     const dnnl_convolution_desc_t *desc)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	dnnl_primitive_desc_iterator_t it = NULL;
	char seen[CPU_CONV_IMPLS][64];
	int n = 0;
	CPU_DNN_TRY(dnnl_primitive_desc_iterator_create(&it, desc, b->attr, c->engine, NULL));
	do {
		dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
		if (!pd)
			break;
		const char *name = cpu_dnn_impl(pd);
		int dup = conv_impl_skipped(name);
		for (int k = 0; k < n && !dup; k++)
			dup = !strcmp(seen[k], name);
		if (!dup && n == p->conv_impl) {
			b->fwd = pd;
			break;
		}
		if (!dup && n < CPU_CONV_IMPLS)
			snprintf(seen[n++], sizeof seen[0], "%s", name);
		dnnl_primitive_desc_destroy(pd);
	} while (n < CPU_CONV_IMPLS && dnnl_primitive_desc_iterator_next(it) == dnnl_success);
	if (!b->fwd)
		st = KILN_ENOTSUP;
out:
	dnnl_primitive_desc_iterator_destroy(it);
	return st;
}

/* The convolution's primitive descriptor: the forward one is the op
 * itself, or the hint the backward ones need. */
static kiln_status conv_primitive(struct cpu_ctx *c, const struct cpu_plan *p, struct conv_build *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	const int type = p->op.type;
	struct conv_tens *t = b->t;
	dnnl_convolution_desc_t desc;
	const dnnl_memory_desc_t *bias = b->has_bias ? &b->b_md : NULL;
	dnnl_memory_desc_t hint_w = t[TW].any;
	if (b->wdd != b->kdt)
		CPU_DNN_TRY(wei_md(&hint_w, b->O, b->Cg, b->KH, b->KW, b->g, 1, b->kdt));
	if (b->keep && (st = conv_pin(c, p, b, &hint_w, bias)))
		goto out;
	CPU_DNN_TRY(dnnl_dilated_convolution_forward_desc_init(
		&desc, dnnl_forward_training, dnnl_convolution_direct, &t[TX].any, &hint_w, bias,
		&t[TY].any, b->strides, b->dil, b->pad, b->pad));
	if (type == KILN_OP_CONV && p->conv_impl > 0) {
		if ((st = conv_pick(c, p, b, &desc)))
			goto out;
	} else {
		CPU_DNN_TRY(dnnl_primitive_desc_create(&b->fwd, &desc, b->attr, c->engine, NULL));
	}
	if (type == KILN_OP_CONV) {
		b->pd = b->fwd;
		b->fwd = NULL;
		conv_bind(&t[TX], 1, CPU_BIND_IN, 0, dnnl_query_src_md, DNNL_ARG_SRC);
		conv_bind(&t[TW], 1, CPU_BIND_IN, 1, dnnl_query_weights_md, DNNL_ARG_WEIGHTS);
		conv_bind(&t[TY], 0, CPU_BIND_OUT, 0, dnnl_query_dst_md, DNNL_ARG_DST);
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		CPU_DNN_TRY(dnnl_dilated_convolution_backward_data_desc_init(
			&desc, dnnl_convolution_direct, &t[TX].any, &t[TW].any, &t[TY].any, b->strides,
			b->dil, b->pad, b->pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&b->pd, &desc, b->attr, c->engine, b->fwd));
		conv_bind(&t[TX], 0, CPU_BIND_OUT, 0, dnnl_query_diff_src_md, DNNL_ARG_DIFF_SRC);
		conv_bind(&t[TW], 1, CPU_BIND_IN, 1, dnnl_query_weights_md, DNNL_ARG_WEIGHTS);
		conv_bind(&t[TY], 1, CPU_BIND_IN, 0, dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST);
	} else {
		CPU_DNN_TRY(dnnl_dilated_convolution_backward_weights_desc_init(
			&desc, dnnl_convolution_direct, &t[TX].any, &t[TW].any, b->own_db ? NULL : bias,
			&t[TY].any,
			b->strides, b->dil, b->pad, b->pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&b->pd, &desc, b->attr, c->engine, b->fwd));
		conv_bind(&t[TX], 1, CPU_BIND_IN, 0, dnnl_query_src_md, DNNL_ARG_SRC);
		conv_bind(&t[TW], 0, CPU_BIND_OUT, 0, dnnl_query_diff_weights_md, DNNL_ARG_DIFF_WEIGHTS);
		conv_bind(&t[TY], 1, CPU_BIND_IN, 1, dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST);
	}
out:
	return st;
}

/* The layout in which the op that wrote consumer p's kept copy (in2) read
 * tensor k: the CONV's x for a weight gradient, the weight gradient's dy for
 * a data gradient, that op remade from p's tensors and geometry.  The three
 * ops pin x and y alike (conv_pin), but not always: a weight gradient of one
 * input channel reads x and dy as NHWC (flat1, conv_descs) where the data
 * gradient reads dy blocked (nChw16c), and at 32 or 48 outputs the two have
 * the same bytes, so a size check passed the NHWC copy read as blocked.
 * The weight gradient is remade without its bias, which p does not know
 * (oneDNN picks the activations' layouts alike with and without). */
static kiln_status conv_kept_md(struct cpu_ctx *c, const struct cpu_plan *p, int k,
				dnnl_memory_desc_t *md)
{
	const struct kiln_op *op = &p->op;
	struct cpu_plan w;
	memset(&w, 0, sizeof w);
	w.kern_f32 = p->kern_f32; /* tune.c: a copy's producer and consumer agree on it */
	struct kiln_op *q = &w.op;
	*q = *op; /* the geometry */
	q->flags = KILN_OPF_KEEP;
	if (op->type == KILN_OP_CONV_BWD_WEIGHTS) { /* CONV: x, w (, b) -> y, the kept x */
		const int bias = op->n_out == 3;
		q->type = KILN_OP_CONV;
		q->n_in = bias ? 3 : 2, q->n_out = 2;
		q->in[1] = op->out[0];
		q->in[1].dtype = op->in[0].dtype; /* the compute dtype's weights */
		if (bias)
			q->in[2] = op->out[1];
		q->out[0] = op->in[1], q->out[1] = op->in[2];
	} else { /* CONV_BWD_WEIGHTS: x, dy, the kept x -> dw (f32), the kept dy */
		q->type = KILN_OP_CONV_BWD_WEIGHTS;
		q->n_in = 3, q->n_out = 2;
		q->in[0] = op->out[0], q->in[1] = op->in[0];
		q->out[0] = op->in[1];
		q->out[0].dtype = KILN_F32;
		q->out[1] = op->in[2];
	}
	dnnl_memory_desc_t x, y;
	const kiln_status st = cpu_conv_act_layouts(c, &w, &x, &y);
	*md = k == TX ? x : y;
	return st;
}

/* Where tensor k's kernel copy is with kept copies: the CONV writes x's
 * into its last output, the weight gradient reads it from in2 and writes
 * dy's into its last output, the data gradient reads that from in2.  A
 * kept input must be in the kernel's layout (conv_kept_md; else
 * KILN_ENOTSUP: the caller prepares the op without it, reading the tensor
 * as it is) and have the copy's bytes. */
static kiln_status conv_kept(struct cpu_ctx *c, struct cpu_plan *p, struct conv_build *b, int k)
{
	const struct kiln_op *op = &p->op;
	const int type = op->type;
	const size_t bytes = dnnl_memory_desc_get_size(b->t[k].kern);
	const int out = (type == KILN_OP_CONV && k == TX) ||
			(type == KILN_OP_CONV_BWD_WEIGHTS && k == TY);
	const int in = (type == KILN_OP_CONV_BWD_WEIGHTS && k == TX) ||
		       (type == KILN_OP_CONV_BWD_DATA && k == TY);
	if (out) {
		b->t[k].kbind = CPU_BIND_OUT, b->t[k].kidx = op->n_out - 1;
		p->aux = bytes;
	} else if (in) {
		dnnl_memory_desc_t made;
		if (conv_kept_md(c, p, k, &made) || !dnnl_memory_desc_equal(&made, b->t[k].kern))
			return cpu_bad(c, op, KILN_ENOTSUP,
				       "the kept copy in2 is not in the kernel's layout (read the tensor as it is)");
		if ((size_t)cpu_numel(&op->in[2]) != bytes) {
			char why[96];
			snprintf(why, sizeof why, "the kept copy in2 has %lld bytes, the kernel's %zu",
				 (long long)cpu_numel(&op->in[2]), bytes);
			return cpu_bad(c, op, KILN_EINVAL, why);
		}
		b->t[k].kbind = CPU_BIND_IN, b->t[k].kidx = 2;
	}
	return KILN_OK;
}

/* The layouts the kernel chose; a reorder for each that is not the
 * caller's.  Workspace: [scratchpad (shared by every step, they run in
 * turn) | kernel copies of the reordered tensors], 64-byte aligned.  The
 * reorders take their own attributes (a user scratchpad): the
 * convolution's post-ops (the fused activation) are not theirs, and a
 * reorder refuses them, which sent every fused conv back to a separate
 * activation pass. */
static kiln_status conv_layouts(struct cpu_ctx *c, struct cpu_plan *p, struct conv_build *b,
				int *n_reorder)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	struct conv_tens *t = b->t;
	size_t scratch = cpu_dnn_scratch(b->pd);
	*n_reorder = 0;
	p->aux = 0;
	for (int k = 0; k < 3; k++) {
		t[k].kern = dnnl_primitive_desc_query_md(b->pd, t[k].q, 0);
		t[k].m_user = t[k].m_kern = -1;
		const int sum = k == TW && b->acc; /* always through a reorder that adds */
		t[k].kbind = CPU_BIND_WS, t[k].kidx = 0;
		if (!sum && dnnl_memory_desc_equal(t[k].kern, &t[k].user))
			continue;
		t[k].reord = 1;
		if (b->keep && (st = conv_kept(c, p, b, k)))
			goto out;
		if (t[k].kbind == CPU_BIND_IN)
			continue; /* the previous op's copy, read as it is */
		(*n_reorder)++;
		/* a forward's frozen weights (KILN_OPF_FROZEN: an inference
		 * plan): reordered into the plan's own copy, kept from run to
		 * run until the core says they changed (cpu_dnn_exec) */
		if (k == TW && p->op.type == KILN_OP_CONV && (p->op.flags & KILN_OPF_FROZEN) &&
		    !b->keep && c->keep_weights) {
			t[k].kbind = CPU_BIND_FIXED;
			b->wkept = 1;
		}
		if (t[k].in)
			CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&t[k].rpd, &t[k].user, c->engine,
								       t[k].kern, c->engine, b->rattr));
		else
			CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&t[k].rpd, t[k].kern, c->engine,
								       &t[k].user, c->engine,
								       sum ? b->sattr : b->rattr));
		const size_t rs = cpu_dnn_scratch(t[k].rpd);
		if (rs > scratch)
			scratch = rs;
	}
	if (b->acc && b->has_bias && !b->own_db) {
		CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&b->rpd_b, &b->b_md, c->engine, &b->b_md,
							       c->engine, b->sattr));
		const size_t rs = cpu_dnn_scratch(b->rpd_b);
		if (rs > scratch)
			scratch = rs;
	}
	size_t off = align_up(scratch);
	if (b->rpd_b) {
		b->b_off = off;
		off += align_up(dnnl_memory_desc_get_size(&b->b_md));
	}
	for (int k = 0; k < 3; k++)
		if (t[k].reord && t[k].kbind == CPU_BIND_WS) {
			t[k].off = off;
			off += align_up(dnnl_memory_desc_get_size(t[k].kern));
		}
	if (b->own_db) { /* conv_run_db's partial sums */
		p->rows = b->N * b->OH * b->OW, p->cols = b->O;
		p->sz[2] = (int64_t)off;
		off += align_up((size_t)conv_db_chunks(p->rows) * (size_t)b->O * sizeof(float));
	}
	p->workspace = off;
out:
	return st;
}

/* A forward's frozen weights kept in the kernel's layout (cpu_dnn_exec
 * reorders into the copy on the first run and again only after
 * KILN_PROC_WEIGHTS_CHANGED; one copy per weight tensor and layout,
 * shared by the plans that read it: dnn.c, wshare.c).  Training and
 * evaluation plans have no such copy. */
static void conv_wkept(struct cpu_ctx *c, struct cpu_plan *p, struct conv_build *b)
{
	const struct conv_tens *w = &b->t[TW];
	cpu_dnn_w_keep(c, p->dnn, &w->user, w->kern, w->m_user, w->m_kern);
}

/* Memory objects (the caller's tensors, the kernel copies, the bias, one
 * scratchpad object per primitive that has one, all at offset 0) and the
 * steps: reorders in, the convolution, reorders out. */
static kiln_status conv_steps(struct cpu_ctx *c, struct cpu_plan *p, struct conv_build *b)
{
	kiln_status st = KILN_OK;
	const char *geom = b->geom;
	const int type = p->op.type;
	struct cpu_dnn *d = p->dnn;
	struct conv_tens *t = b->t;
	int m_b = -1, m_bu = -1, m_sp = -1, m_r = -1;
	for (int k = 0; k < 3; k++) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &t[k].user, t[k].bind, t[k].idx, 0, &t[k].m_user));
		t[k].m_kern = t[k].m_user;
		if (t[k].reord)
			CPU_DNN_TRY(cpu_dnn_mem(c, d, t[k].kern, t[k].kbind, t[k].kidx, t[k].off, &t[k].m_kern));
	}
	if (b->wkept)
		conv_wkept(c, p, b);
	if (b->has_bias && !b->own_db)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->b_md, type == KILN_OP_CONV ? CPU_BIND_IN : CPU_BIND_OUT,
					type == KILN_OP_CONV ? 2 : 1, 0, &m_b));
	if (b->rpd_b) { /* db into the workspace, then added into the caller's */
		m_bu = m_b;
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &b->b_md, CPU_BIND_WS, 0, b->b_off, &m_b));
	}
	if (cpu_dnn_scratch(b->pd))
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(b->pd, dnnl_query_scratchpad_md, 0),
					CPU_BIND_WS, 0, 0, &m_sp));
	if (b->res) /* the residual: the last input, y's layout */
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &t[TY].user, CPU_BIND_IN, p->op.n_in - 1, 0, &m_r));

	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n = 0;
#define ARG(a_, m_) (arg[n] = (a_), mem[n] = (m_), n++)
	for (int pass = 0; pass < 3; pass++) {
		if (pass == 1) {
			n = 0;
			for (int k = 0; k < 3; k++)
				ARG(t[k].arg, t[k].m_kern);
			if (b->has_bias && !b->own_db)
				ARG(type == KILN_OP_CONV ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, m_b);
			if (m_sp >= 0)
				ARG(DNNL_ARG_SCRATCHPAD, m_sp);
			if (m_r >= 0)
				ARG(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, m_r);
			CPU_DNN_TRY(cpu_dnn_step(d, b->pd, n, arg, mem));
			continue;
		}
		for (int k = 0; k < 3; k++) {
			if (!t[k].rpd || t[k].in != (pass == 0))
				continue;
			n = 0;
			if (k == TW && b->wkept)
				d->w_step = d->n_step; /* cpu_dnn_exec skips it while w holds */
			ARG(DNNL_ARG_FROM, t[k].in ? t[k].m_user : t[k].m_kern);
			ARG(DNNL_ARG_TO, t[k].in ? t[k].m_kern : t[k].m_user);
			if (cpu_dnn_scratch(t[k].rpd)) {
				int m;
				CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(t[k].rpd, dnnl_query_scratchpad_md, 0),
							CPU_BIND_WS, 0, 0, &m));
				ARG(DNNL_ARG_SCRATCHPAD, m);
			}
			CPU_DNN_TRY(cpu_dnn_step(d, t[k].rpd, n, arg, mem));
		}
	}
	if (b->rpd_b) {
		n = 0;
		ARG(DNNL_ARG_FROM, m_b);
		ARG(DNNL_ARG_TO, m_bu);
		if (cpu_dnn_scratch(b->rpd_b)) {
			int m;
			CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(b->rpd_b, dnnl_query_scratchpad_md, 0),
						CPU_BIND_WS, 0, 0, &m));
			ARG(DNNL_ARG_SCRATCHPAD, m);
		}
		CPU_DNN_TRY(cpu_dnn_step(d, b->rpd_b, n, arg, mem));
	}
#undef ARG
	p->sz[1] = t[TY].m_kern; /* conv_run_db's dy */
out:
	return st;
}

/* ---- the bias gradient of an NHWC weight gradient (own_db) -------------
 * db[o] (=|+=) the sum over the R = N*OH*OW rows of dy [R, O], dy being the
 * tensor the kernel read (the caller's NHWC dy, or the stem's NHWC copy in
 * the workspace).  Fixed chunks of CONV_DB_ROWS rows, each summed in row
 * order into a partial row of the workspace (p->sz[2]), the partials added
 * in chunk order: the bytes do not depend on the team. */
CPU_CLONES static void conv_db_chunk(float *restrict s, const float *restrict dy, int64_t rows,
				     int64_t O)
{
	for (int64_t j = 0; j < O; j++)
		s[j] = 0.0f;
	for (int64_t r = 0; r < rows; r++) {
		const float *row = dy + r * O;
#pragma omp simd
		for (int64_t j = 0; j < O; j++)
			s[j] += row[j];
	}
}

/* The weight gradient (oneDNN, without its bias), then db. */
static kiln_status conv_run_db(const struct cpu_plan *p, const struct kiln_op_args *a,
			       struct cpu_err *e)
{
	const struct cpu_plan *q = cpu_variant(p); /* the version for oneDNN's team now */
	kiln_status st = cpu_dnn_exec(q, a, e);
	if (st)
		return st;
	const float *dy = cpu_dnn_handle(q->dnn, (int)q->sz[1], a);
	float *part = (float *)((char *)a->workspace + q->sz[2]), *db = a->out[1];
	const int64_t R = p->rows, O = p->cols, nc = conv_db_chunks(R);
#pragma omp parallel for if (R * O >= CPU_PAR_MIN) schedule(static)
	for (int64_t k = 0; k < nc; k++) {
		const int64_t r0 = k * CONV_DB_ROWS;
		conv_db_chunk(part + k * O, dy + r0 * O, R - r0 < CONV_DB_ROWS ? R - r0 : CONV_DB_ROWS, O);
	}
	for (int64_t k = 1; k < nc; k++)
		cpu_add_row(part, part + k * O, O);
	if (p->op.flags & KILN_OPF_ACCUMULATE)
		cpu_add_row(db, part, O);
	else
		memcpy(db, part, (size_t)O * sizeof *db);
	return KILN_OK;
}

kiln_status cpu_conv_act_layouts(struct cpu_ctx *c, const struct cpu_plan *p,
				 dnnl_memory_desc_t *x, dnnl_memory_desc_t *y)
{
	struct conv_build b;
	kiln_status st;
	memset(&b, 0, sizeof b);
	if ((st = conv_roles(c, p, &b)))
		return st;
	conv_geometry(&p->op, &b);
	if (!(st = conv_descs(c, p, &b)) && !(st = conv_primitive(c, p, &b))) {
		*x = *dnnl_primitive_desc_query_md(b.pd, b.t[TX].q, 0);
		*y = *dnnl_primitive_desc_query_md(b.pd, b.t[TY].q, 0);
	}
	dnnl_primitive_desc_destroy(b.pd);
	dnnl_primitive_desc_destroy(b.fwd);
	dnnl_primitive_attr_destroy(b.attr);
	dnnl_primitive_attr_destroy(b.rattr);
	dnnl_primitive_attr_destroy(b.sattr);
	return st;
}

kiln_status cpu_conv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	/* a weight gradient in blocks of the minibatch (convsplit.c; a bf16
	 * one with the kernel p->kern_f32 names), unless it cannot keep the
	 * layouts its kept copies are in */
	const int k = cpu_conv_wsplit(&p->op, c->threads);
	if (k > 0) {
		const kiln_status st = cpu_conv_wsplit_prepare(c, p, k);
		if (st != KILN_ENOTSUP)
			return st;
		cpu_plan_release(p);
	}
	return cpu_conv_prepare_whole(c, p);
}

kiln_status cpu_conv_prepare_whole(struct cpu_ctx *c, struct cpu_plan *p)
{
	struct conv_build b;
	kiln_status st;
	int n_reorder = 0;
	memset(&b, 0, sizeof b);
	if ((st = conv_roles(c, p, &b)))
		return st;
	conv_geometry(&p->op, &b);
	if ((st = cpu_dnn_new(c, p)) || (st = conv_descs(c, p, &b)) ||
	    (st = conv_primitive(c, p, &b)) || (st = conv_layouts(c, p, &b, &n_reorder)) ||
	    (st = conv_steps(c, p, &b)))
		goto out;
	p->n_in = p->op.n_in;
	p->n_out = p->op.n_out;
	p->kernel = b.own_db ? conv_run_db : cpu_dnn_run;
	const char *impl = cpu_dnn_impl(b.pd);
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s + %d reorders, workspace %zu bytes, kept %zu",
		     cpu_op_name(p->op.type), b.geom, impl, n_reorder, p->workspace, p->aux);
	if (b.own_db)
		c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: the bias gradient by kiln's sum",
			     cpu_op_name(p->op.type), b.geom);
out: /* oneDNN's destroy functions take NULL */
	for (int k = 0; k < 3; k++)
		dnnl_primitive_desc_destroy(b.t[k].rpd);
	dnnl_primitive_desc_destroy(b.pd);
	dnnl_primitive_desc_destroy(b.fwd);
	dnnl_primitive_desc_destroy(b.rpd_b);
	dnnl_primitive_attr_destroy(b.attr);
	dnnl_primitive_attr_destroy(b.rattr);
	dnnl_primitive_attr_destroy(b.sattr);
	return st;
}
