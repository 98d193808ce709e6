/* plugins/cpu/pool.c - KILN_OP_POOL and POOL_BWD through oneDNN pooling.
 *
 *   POOL:     y[N,C,OH,OW] = pool(x[N,C,H,W]);  aux = oneDNN's workspace
 *   POOL_BWD: dx[N,C,H,W] from dy[N,C,OH,OW] (and aux for max)
 *
 *   OH = (H + 2*pad_h - KH) / stride_h + 1  (floor, PyTorch's ceil_mode=False)
 *
 * Semantics are PyTorch's: max ignores padding (pads with -inf); average
 * divides by KH*KW when counting padding (count_include_pad; with floor
 * output sizes a window never leaves the padded input, so that is PyTorch's
 * divisor too), else by the number of window elements inside the input.
 *
 * Max pooling's backward needs to know where each maximum was: oneDNN keeps
 * that in its workspace, which is the op's aux (aux_bytes = its size).  A
 * max POOL prepared with one output (n_out = 1: no aux) runs as inference
 * and has aux_bytes 0; with n_out = 2 it runs as training.  Average pooling
 * has no aux: aux_bytes 0 and out1 / in1 are not read (may be NULL).  The
 * backward recreates the training forward descriptor as its hint, so its
 * workspace layout is the forward plan's.
 */
#include "dnn.h"

#include <stdio.h>

kiln_status cpu_pool_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_POOL_BWD;
	kiln_status st = KILN_OK;
	char geom[200];
	geom[0] = 0;

	/* x: forward input (dx for the backward); y: forward output (dy). */
	const struct kiln_tensor_desc *x = bwd ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *y = bwd ? &op->in[0] : &op->out[0];
	/* f32, or bf16 (oneDNN's bf16 pooling: averages summed in f32) */
	if ((x->dtype != KILN_F32 && x->dtype != KILN_BF16) || y->dtype != x->dtype)
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 or bf16 activations, one dtype");
	const dnnl_data_type_t dt = x->dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32;
	const int nhwc = cpu_nhwc(x), kind = (int)op->i[0];
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t KH = op->i[1], KW = op->i[2], sh = op->i[3], sw = op->i[4];
	const int64_t ph = op->i[5], pw = op->i[6];
	snprintf(geom, sizeof geom,
		 "%s x [%lld,%lld,%lld,%lld] kernel %lldx%lld stride %lldx%lld pad %lldx%lld %s",
		 kind == KILN_POOL_MAX ? "max" : op->i[7] ? "avg (count pad)" : "avg",
		 (long long)N, (long long)C, (long long)H, (long long)W, (long long)KH,
		 (long long)KW, (long long)sh, (long long)sw, (long long)ph, (long long)pw,
		 nhwc ? "NHWC" : "NCHW");
	const int64_t OH = y->dims[2], OW = y->dims[3];
	const int max = kind == KILN_POOL_MAX;
	const int training = max && (bwd || op->n_out == 2);
	if ((st = cpu_dnn_new(c, p)))
		return st;
	struct cpu_dnn *d = p->dnn;

	dnnl_memory_desc_t x_md, y_md;
	dnnl_primitive_desc_t fwd = NULL, pd = NULL;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_pooling_desc_t desc;
	const dnnl_alg_kind_t alg = max       ? dnnl_pooling_max
				    : op->i[7] ? dnnl_pooling_avg_include_padding
					       : dnnl_pooling_avg_exclude_padding;
	const dnnl_dims_t strides = { sh, sw }, kernel = { KH, KW }, pad = { ph, pw };
	{
		dnnl_dims_t xd = { N, C, H, W }, yd = { N, C, OH, OW };
		const dnnl_format_tag_t tag = nhwc ? dnnl_nhwc : dnnl_nchw;
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dt, tag));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dt, tag));
	}
	CPU_DNN_TRY(dnnl_primitive_attr_create(&attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
	CPU_DNN_TRY(dnnl_pooling_forward_desc_init(
		&desc, training || bwd ? dnnl_forward_training : dnnl_forward_inference, alg, &x_md,
		&y_md, strides, kernel, pad, pad));
	CPU_DNN_TRY(dnnl_primitive_desc_create(&fwd, &desc, attr, c->engine, NULL));
	const dnnl_memory_desc_t *ws_md =
		training ? dnnl_primitive_desc_query_md(fwd, dnnl_query_workspace_md, 0) : NULL;
	p->aux = ws_md ? dnnl_memory_desc_get_size(ws_md) : 0;
	if (bwd) {
		CPU_DNN_TRY(dnnl_pooling_backward_desc_init(&desc, alg, &x_md, &y_md, strides, kernel,
							    pad, pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, fwd));
	} else {
		pd = fwd;
		fwd = NULL;
	}
	p->workspace = cpu_dnn_scratch(pd);

	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n = 0, m;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &x_md, bwd ? CPU_BIND_OUT : CPU_BIND_IN, 0, 0, &m));
	arg[n] = bwd ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC, mem[n++] = m;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &y_md, bwd ? CPU_BIND_IN : CPU_BIND_OUT, 0, 0, &m));
	arg[n] = bwd ? DNNL_ARG_DIFF_DST : DNNL_ARG_DST, mem[n++] = m;
	if (p->aux) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, ws_md, bwd ? CPU_BIND_IN : CPU_BIND_OUT, 1, 0, &m));
		arg[n] = DNNL_ARG_WORKSPACE, mem[n++] = m;
	}
	if (p->workspace) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
					CPU_BIND_WS, 0, 0, &m));
		arg[n] = DNNL_ARG_SCRATCHPAD, mem[n++] = m;
	}
	CPU_DNN_TRY(cpu_dnn_step(d, pd, n, arg, mem));
	/* Arguments run() requires: aux only when there is one. */
	p->n_in = bwd && p->aux ? 2 : 1;
	p->n_out = !bwd && p->aux ? 2 : 1;
	p->kernel = cpu_dnn_run;
	{
		const char *impl = "?";
		dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
		c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s, aux %zu bytes, workspace %zu bytes",
			     cpu_op_name(op->type), geom, impl, p->aux, p->workspace);
	}
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_desc_destroy(fwd);
	dnnl_primitive_attr_destroy(attr);
	return st;
}
