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
 * oneDNN's dilation is PyTorch's minus one.  Right padding is given equal
 * to the left one: oneDNN rounds the output size down like PyTorch, so the
 * rows a floor drops are never read.
 */
#include "dnn.h"

#include <stdio.h>
#include <string.h>

#define CPU_WS_ALIGN 64

static size_t align_up(size_t n) { return (n + CPU_WS_ALIGN - 1) & ~(size_t)(CPU_WS_ALIGN - 1); }

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

kiln_status cpu_conv_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int type = op->type;
	kiln_status st = KILN_OK;
	char geom[200];
	geom[0] = 0;

	/* Which tensor is which. */
	const struct kiln_tensor_desc *x, *w, *y;
	int has_bias;
	if (type == KILN_OP_CONV) {
		x = &op->in[0], w = &op->in[1], y = &op->out[0];
		has_bias = op->n_in == 3;
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		if (op->flags & KILN_OPF_ACCUMULATE)
			/* oneDNN 2.6 has no sum post-op on backward data. */
			return cpu_bad(c, op, KILN_ENOTSUP,
				       "cannot accumulate into dx (write to scratch and add)");
		x = &op->out[0], w = &op->in[1], y = &op->in[0];
		has_bias = 0;
	} else {
		x = &op->in[0], w = &op->out[0], y = &op->in[1];
		has_bias = op->n_out == 2;
	}
	/* f32, or bf16 activations and weights with f32 accumulation (oneDNN's
	 * bf16 kernels): the bias is f32, and the weight gradient (and bias
	 * gradient) is f32 so that the flat gradients stay f32 */
	const int lowp = x->dtype == KILN_BF16;
	const int wdt = type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : x->dtype;
	if (cpu_op_has(op, KILN_F16) || y->dtype != x->dtype || w->dtype != wdt ||
	    (has_bias && (type == KILN_OP_CONV ? op->in[2].dtype : op->out[1].dtype) != KILN_F32) ||
	    (!lowp && !cpu_all_f32(op)))
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 tensors, or bf16 activations and weights with an f32 bias (weight and bias gradients f32)");
	const dnnl_data_type_t adt = dnn_dt(x->dtype), wdd = dnn_dt(wdt);
	/* p->kern_f32 (tune.c: [plugin.cpu] bf16_conv = f32, or auto found the
	 * f32 kernel faster): the kernel's tensors are f32 and the reorders
	 * between the caller's layout and the kernel's convert */
	const int kf32 = lowp && p->kern_f32;
	const dnnl_data_type_t kdt = kf32 ? dnnl_f32 : adt;
	const int nhwc = cpu_nhwc(x);
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t O = w->dims[0], Cg = w->dims[1], KH = w->dims[2], KW = w->dims[3];
	const int64_t sh = op->i[0], sw = op->i[1], ph = op->i[2], pw = op->i[3];
	const int64_t dh = op->i[4], dw = op->i[5], g = op->i[6] ? op->i[6] : 1;
	snprintf(geom, sizeof geom,
		 "x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] stride %lldx%lld pad %lldx%lld dilation %lldx%lld groups %lld %s",
		 (long long)N, (long long)C, (long long)H, (long long)W, (long long)O, (long long)Cg,
		 (long long)KH, (long long)KW, (long long)sh, (long long)sw, (long long)ph,
		 (long long)pw, (long long)dh, (long long)dw, (long long)g, nhwc ? "NHWC" : "NCHW");
	const int64_t OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
	const int64_t OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
	if ((st = cpu_dnn_new(c, p)))
		return st;
	struct cpu_dnn *d = p->dnn;

	/* The three tensors the convolution touches besides the bias: x (src
	 * or diff_src), y (dst or diff_dst), w (weights or diff_weights). */
	struct tens {
		dnnl_memory_desc_t user, any;   /* the caller's layout; format `any` */
		const dnnl_memory_desc_t *kern; /* the layout the kernel chose */
		int in;                         /* read by the convolution (else written) */
		int bind, idx;                  /* where the caller's bytes are */
		dnnl_query_t q;
		int arg;                        /* DNNL_ARG_* of the convolution */
		dnnl_primitive_desc_t rpd;      /* reorder, when kern != user */
		size_t off;                     /* workspace offset of the kernel copy */
		int m_user, m_kern;
	} t[3];
	memset(t, 0, sizeof t);
	enum { TX, TY, TW };
	dnnl_memory_desc_t b_md;
	dnnl_primitive_desc_t fwd = NULL, pd = NULL;
	dnnl_primitive_attr_t attr = NULL;
	struct {
		dnnl_convolution_desc_t conv;
	} desc;
	const dnnl_dims_t strides = { sh, sw }, dil = { dh - 1, dw - 1 }, pad = { ph, pw };
	/* NCHW: oneDNN's fast kernels want blocked activations (nChw16c), so
	 * the activations are `any` too and reordered like the weights (what
	 * PyTorch's ideep does); the gemm-based kernel for plain NCHW is several
	 * times slower, worst for the weight gradient.  NHWC has direct kernels. */
	const int act_any = !nhwc;
	CPU_DNN_TRY(act_md(&t[TX].user, N, C, H, W, nhwc, adt));
	CPU_DNN_TRY(act_md(&t[TY].user, N, O, OH, OW, nhwc, adt));
	CPU_DNN_TRY(wei_md(&t[TW].user, O, Cg, KH, KW, g, 0, wdd));
	CPU_DNN_TRY(wei_md(&t[TW].any, O, Cg, KH, KW, g, 1, kf32 ? dnnl_f32 : wdd));
	{
		dnnl_dims_t xd = { N, C, H, W }, yd = { N, O, OH, OW }, bd = { O };
		if (act_any) {
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&t[TX].any, 4, xd, kdt, dnnl_format_tag_any));
			CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&t[TY].any, 4, yd, kdt, dnnl_format_tag_any));
		} else if (kdt != adt) {
			CPU_DNN_TRY(act_md(&t[TX].any, N, C, H, W, nhwc, kdt));
			CPU_DNN_TRY(act_md(&t[TY].any, N, O, OH, OW, nhwc, kdt));
		} else {
			t[TX].any = t[TX].user, t[TY].any = t[TY].user;
		}
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a));
	}
	CPU_DNN_TRY(dnnl_primitive_attr_create(&attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));

	/* The forward primitive descriptor: the op itself, or the hint the
	 * backward ones need.  Training: the backward follows. */
	dnnl_memory_desc_t hint_w = t[TW].any;
	if (wdd != kdt)
		CPU_DNN_TRY(wei_md(&hint_w, O, Cg, KH, KW, g, 1, kdt));
	CPU_DNN_TRY(dnnl_dilated_convolution_forward_desc_init(
		&desc.conv, dnnl_forward_training, dnnl_convolution_direct, &t[TX].any, &hint_w,
		has_bias ? &b_md : NULL, &t[TY].any, strides, dil, pad, pad));
	CPU_DNN_TRY(dnnl_primitive_desc_create(&fwd, &desc.conv, attr, c->engine, NULL));
	if (type == KILN_OP_CONV) {
		pd = fwd;
		fwd = NULL;
		t[TX].in = 1, t[TX].bind = CPU_BIND_IN, t[TX].idx = 0, t[TX].q = dnnl_query_src_md, t[TX].arg = DNNL_ARG_SRC;
		t[TW].in = 1, t[TW].bind = CPU_BIND_IN, t[TW].idx = 1, t[TW].q = dnnl_query_weights_md, t[TW].arg = DNNL_ARG_WEIGHTS;
		t[TY].in = 0, t[TY].bind = CPU_BIND_OUT, t[TY].idx = 0, t[TY].q = dnnl_query_dst_md, t[TY].arg = DNNL_ARG_DST;
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		CPU_DNN_TRY(dnnl_dilated_convolution_backward_data_desc_init(
			&desc.conv, dnnl_convolution_direct, &t[TX].any, &t[TW].any, &t[TY].any, strides,
			dil, pad, pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&pd, &desc.conv, attr, c->engine, fwd));
		t[TX].in = 0, t[TX].bind = CPU_BIND_OUT, t[TX].idx = 0, t[TX].q = dnnl_query_diff_src_md, t[TX].arg = DNNL_ARG_DIFF_SRC;
		t[TW].in = 1, t[TW].bind = CPU_BIND_IN, t[TW].idx = 1, t[TW].q = dnnl_query_weights_md, t[TW].arg = DNNL_ARG_WEIGHTS;
		t[TY].in = 1, t[TY].bind = CPU_BIND_IN, t[TY].idx = 0, t[TY].q = dnnl_query_diff_dst_md, t[TY].arg = DNNL_ARG_DIFF_DST;
	} else {
		CPU_DNN_TRY(dnnl_dilated_convolution_backward_weights_desc_init(
			&desc.conv, dnnl_convolution_direct, &t[TX].any, &t[TW].any,
			has_bias ? &b_md : NULL, &t[TY].any, strides, dil, pad, pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&pd, &desc.conv, attr, c->engine, fwd));
		t[TX].in = 1, t[TX].bind = CPU_BIND_IN, t[TX].idx = 0, t[TX].q = dnnl_query_src_md, t[TX].arg = DNNL_ARG_SRC;
		t[TW].in = 0, t[TW].bind = CPU_BIND_OUT, t[TW].idx = 0, t[TW].q = dnnl_query_diff_weights_md, t[TW].arg = DNNL_ARG_DIFF_WEIGHTS;
		t[TY].in = 1, t[TY].bind = CPU_BIND_IN, t[TY].idx = 1, t[TY].q = dnnl_query_diff_dst_md, t[TY].arg = DNNL_ARG_DIFF_DST;
	}

	/* The layouts the kernel chose; a reorder for each that is not the
	 * caller's.  Workspace: [scratchpad (shared by every step, they run in
	 * turn) | kernel copies of the reordered tensors], 64-byte aligned. */
	size_t scratch = cpu_dnn_scratch(pd);
	int n_reorder = 0;
	for (int k = 0; k < 3; k++) {
		t[k].kern = dnnl_primitive_desc_query_md(pd, t[k].q, 0);
		t[k].m_user = t[k].m_kern = -1;
		if (dnnl_memory_desc_equal(t[k].kern, &t[k].user))
			continue;
		n_reorder++;
		if (t[k].in)
			CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&t[k].rpd, &t[k].user, c->engine,
								       t[k].kern, c->engine, attr));
		else
			CPU_DNN_TRY(dnnl_reorder_primitive_desc_create(&t[k].rpd, t[k].kern, c->engine,
								       &t[k].user, c->engine, attr));
		const size_t rs = cpu_dnn_scratch(t[k].rpd);
		if (rs > scratch)
			scratch = rs;
	}
	size_t off = align_up(scratch);
	for (int k = 0; k < 3; k++)
		if (t[k].rpd) {
			t[k].off = off;
			off += align_up(dnnl_memory_desc_get_size(t[k].kern));
		}
	p->workspace = off;

	/* Memory objects: the caller's tensors, the kernel copies, the bias,
	 * one scratchpad object per primitive that has one (all at offset 0). */
	int m_b = -1, m_sp = -1;
	for (int k = 0; k < 3; k++) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &t[k].user, t[k].bind, t[k].idx, 0, &t[k].m_user));
		t[k].m_kern = t[k].m_user;
		if (t[k].rpd)
			CPU_DNN_TRY(cpu_dnn_mem(c, d, t[k].kern, CPU_BIND_WS, 0, t[k].off, &t[k].m_kern));
	}
	if (has_bias)
		CPU_DNN_TRY(cpu_dnn_mem(c, d, &b_md, type == KILN_OP_CONV ? CPU_BIND_IN : CPU_BIND_OUT,
					type == KILN_OP_CONV ? 2 : 1, 0, &m_b));
	if (cpu_dnn_scratch(pd))
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
					CPU_BIND_WS, 0, 0, &m_sp));

	/* Steps: reorders in, the convolution, reorders out. */
	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n = 0;
#define ARG(a_, m_) (arg[n] = (a_), mem[n] = (m_), n++)
	for (int pass = 0; pass < 3; pass++) {
		if (pass == 1) {
			n = 0;
			for (int k = 0; k < 3; k++)
				ARG(t[k].arg, t[k].m_kern);
			if (has_bias)
				ARG(type == KILN_OP_CONV ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, m_b);
			if (m_sp >= 0)
				ARG(DNNL_ARG_SCRATCHPAD, m_sp);
			CPU_DNN_TRY(cpu_dnn_step(d, pd, n, arg, mem));
			continue;
		}
		for (int k = 0; k < 3; k++) {
			if (!t[k].rpd || t[k].in != (pass == 0))
				continue;
			n = 0;
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
#undef ARG

	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = cpu_dnn_run;
	{
		const char *impl = "?";
		dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
		c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s + %d reorders, workspace %zu bytes",
			     cpu_op_name(type), geom, impl, n_reorder, p->workspace);
	}
out: /* oneDNN's destroy functions take NULL */
	for (int k = 0; k < 3; k++)
		dnnl_primitive_desc_destroy(t[k].rpd);
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_desc_destroy(fwd);
	dnnl_primitive_attr_destroy(attr);
	return st;
}
