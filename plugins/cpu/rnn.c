/* plugins/cpu/rnn.c - KILN_OP_RNN and RNN_BWD (one direction of one layer of
 * nn.LSTM / nn.GRU) through oneDNN's RNN primitives.
 *
 * oneDNN runs the sequence left to right, time-major (tnc), from a zero
 * state.  The kernel around it does what oneDNN's layout or math does not:
 *   - the gates: PyTorch's LSTM order (i, f, g, o) is oneDNN's; its GRU
 *     (r, z, n) is oneDNN's linear-before-reset GRU (lbr_gru: u, r, o, with
 *     a fourth bias for the recurrent part of o), so the GRU's first two gate
 *     blocks swap and its biases map to oneDNN's four; oneDNN adds the two
 *     LSTM biases into one;
 *   - the weights: PyTorch's [G*H, I] is oneDNN's ldgoi (L = D = 1): the
 *     LSTM's are read where they are, the GRU's copied with two gates
 *     swapped, and reordered only when the primitive chose another layout;
 *   - the layout, the direction and the lengths: every row's first len
 *     steps are gathered in reading order (reversed for the reverse
 *     direction) into a zero-padded time-major sequence, run left to
 *     right, and scattered back to kiln's batch-first [B,T,C]; the padded
 *     steps run after the valid ones, so they never touch a valid output,
 *     their y is zeroed, and their dy is zero in the backward (so they add
 *     nothing to any gradient): pack_padded_sequence's result.  Time-major
 *     because oneDNN 2.6's reference RNN (rnn_utils.hpp, merge_gemm_layer
 *     and merge_gemm_iter) runs the input GEMM and, in the backward, the
 *     dx and both weight-gradient GEMMs as one GEMM over all T steps only
 *     when the sequence's T stride is B rows; for a batch-first (ntc)
 *     sequence it runs them one step (B rows) at a time (session 47).
 *
 * The initial state (h0, and c0 for the LSTM) is zero, given to oneDNN as
 * memory of zeros (src_iter, src_iter_c: the plan's own, zeroed once at
 * prepare, cpu_dnn.zero_state; their gradients written into the workspace
 * and dropped), not as no memory: oneDNN 2.6's LSTM backward (and its
 * current source) computes the weight_hh gradient of a sequence whose dst
 * is one contiguous block (every tnc sequence; in ntc, as it was given
 * before session 47, one row of one step) by one GEMM over the states that
 * assumes src_iter was given; without it, it took h1 for h0 and gave
 * weight_hh a gradient of dgates x h1, where PyTorch's is 0
 * (tests/check_rnn.c, lstm_l1_b1t1).
 *
 * The final hidden state (i[4], `last`): each row's last step run is at
 * len - 1 of the sequence in reading order, for either direction, so the
 * forward picks it from there (rnn_last) and the backward puts dy there,
 * zeros at every other step, before oneDNN's backward (rnn_last_dy).
 *
 * aux (the forward's out1, the backward's in4): oneDNN's workspace, the
 * sequence oneDNN produced (f32 [T,B,H] in its reading order) and the rows'
 * lengths (i32 [B]).
 */
#include "dnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RNN_AL(n) (((size_t)(n) + 63) & ~(size_t)63)

/* sz[] of an RNN plan: sizes, then byte offsets into the workspace and aux */
enum {
	R_B, R_T, R_I, R_H, R_G, R_GB, /* GB: oneDNN's bias gates (4 for lbr_gru) */
	/* workspace: PyTorch's weights in oneDNN's gate order (ldgoi; GRU), the
	 * primitive's layouts, the gathered input, dst (inference) or dx
	 * (backward), the gathered dy (inference: the lengths), the weight
	 * gradients both ways, the bias gradient, (unused: 0 bytes; the zero
	 * initial state is cpu_dnn.zero_state), the initial state's gradient
	 * (backward; dropped), oneDNN's scratchpad */
	R_O_WL, R_O_WI, R_O_WLP, R_O_WIP, R_O_SRC, R_O_DST, R_O_DDST, R_O_DWLP, R_O_DWIP,
	R_O_DB, R_O_DWL, R_O_DWI, R_O_H0, R_O_DH0, R_O_SCR,
	/* aux after oneDNN's workspace: dst, lengths, oneDNN's bias */
	R_A_DST, R_A_LEN, R_A_B, R_N
};
_Static_assert(R_N <= (int)(sizeof ((struct cpu_dnn *)0)->sz / sizeof(int64_t)),
	       "cpu_dnn.sz holds an RNN plan's sizes and offsets");

/* The PyTorch gate block that oneDNN's gate block g holds. */
static int rnn_src_gate(int gru, int g)
{
	return gru && g < 2 ? 1 - g : g;
}

/* The rows' lengths: first position of the pad id in ids (T when none). */
static void rnn_lengths(const struct cpu_plan *p, const struct kiln_op_args *a, int32_t *len)
{
	const int64_t B = p->op.in[0].dims[0], T = p->op.in[0].dims[1];
	const int32_t *ids = p->op.type == KILN_OP_RNN && p->op.n_in == 6 ? a->in[5] : NULL;
	for (int64_t b = 0; b < B; b++) {
		int64_t t = 0;
		while (ids && t < T && ids[b * T + t] != (int32_t)p->op.i[2])
			t++;
		len[b] = (int32_t)(ids ? t : T);
	}
}

/* Between kiln's batch-first [B,T,C] (user) and oneDNN's time-major
 * [T,B,C] (seq) in reading order, seq[t, b] <-> user[b, s] with s = t, or
 * len[b] - 1 - t for the reverse direction, for t < len[b].  to_seq: dst
 * is seq, 0 at and after len[b]; else dst is user, its steps at and after
 * len[b] 0 (acc: += and those steps left as they are).  oneDNN merges the
 * GEMMs of all time steps into one only for a time-major sequence. */
static void rnn_gather(float *dst, const float *src, int64_t B, int64_t T, int64_t C,
		       const int32_t *len, int reverse, int to_seq, int acc)
{
	const size_t row = (size_t)C * sizeof *dst;
#pragma omp parallel for collapse(2) if (B * T * C >= CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++)
		for (int64_t b = 0; b < B; b++) {
			const int64_t q = (t * B + b) * C;
			if (t >= len[b]) {
				if (to_seq || !acc)
					memset(dst + (to_seq ? q : (b * T + t) * C), 0, row);
				continue;
			}
			const int64_t u = (b * T + (reverse ? len[b] - 1 - t : t)) * C;
			float *d = dst + (to_seq ? q : u);
			const float *x = src + (to_seq ? u : q);
			if (!acc)
				memcpy(d, x, row);
			else
				for (int64_t c = 0; c < C; c++)
					d[c] += x[c];
		}
}

/* The final hidden state: y[b] = seq[len[b] - 1, b] of the sequence in
 * reading order ([T,B,H]), 0 for a row of length 0 (its zero h0). */
static void rnn_last(float *y, const float *seq, int64_t B, int64_t H, const int32_t *len)
{
	for (int64_t b = 0; b < B; b++)
		if (len[b] > 0)
			memcpy(y + b * H, seq + ((len[b] - 1) * B + b) * H, (size_t)H * sizeof *y);
		else
			memset(y + b * H, 0, (size_t)H * sizeof *y);
}

/* Its backward: dseq [T,B,H] in reading order, dy [B,H] at each row's
 * step len[b] - 1 and 0 at every other step. */
static void rnn_last_dy(float *dseq, const float *dy, int64_t B, int64_t T, int64_t H,
			const int32_t *len)
{
	memset(dseq, 0, (size_t)(B * T * H) * sizeof *dseq);
	for (int64_t b = 0; b < B; b++)
		if (len[b] > 0)
			memcpy(dseq + ((len[b] - 1) * B + b) * H, dy + b * H, (size_t)H * sizeof *dy);
}

/* PyTorch's weights and biases in oneDNN's gate order (ldgoi, ldgo): the
 * LSTM's weights are PyTorch's own (the same gate order, nothing to copy);
 * the GRU's are copied into the workspace with its first two gates
 * swapped.  in[3], in[4] of b: the weights oneDNN reads. */
static void rnn_weights_in(const struct cpu_plan *p, const float *wih, const float *whh,
			   const float *bih, const float *bhh, char *ws, float *bias,
			   struct kiln_op_args *b)
{
	const int64_t *v = p->dnn->sz;
	const int64_t H = v[R_H], I = v[R_I], gru = p->op.i[0];
	float *wl = (float *)(ws + v[R_O_WL]), *wi = (float *)(ws + v[R_O_WI]);
	b->in[3] = gru ? wl : wih;
	b->in[4] = gru ? wi : whh;
	for (int g = 0; g < v[R_G]; g++) {
		const int s = rnn_src_gate((int)gru, g);
		if (gru) {
			memcpy(wl + g * H * I, wih + s * H * I, (size_t)(H * I) * sizeof(float));
			memcpy(wi + g * H * H, whh + s * H * H, (size_t)(H * H) * sizeof(float));
		}
		for (int64_t h = 0; bias && h < H; h++)
			bias[g * H + h] = gru && g == 2 ? bih[s * H + h] : bih[s * H + h] + bhh[s * H + h];
	}
	if (gru && bias)
		memcpy(bias + 3 * H, bhh + 2 * H, (size_t)H * sizeof(float));
}

static void rnn_put(float *dst, const float *src, int64_t n, int acc)
{
	for (int64_t k = 0; k < n; k++)
		dst[k] = acc ? dst[k] + src[k] : src[k];
}

/* Whether the backward's weight gradients are reordered straight into
 * out[1], out[2]: the LSTM's gate order is PyTorch's, so unless they are
 * added to (op.i[3]) there is nothing to do to them after the reorder. */
static int rnn_dw_direct(const struct kiln_op *op)
{
	return !op->i[0] && !op->i[3];
}

/* oneDNN's weight and bias gradients (ldgoi, ldgo) back in PyTorch's order
 * (the weights' already there when rnn_dw_direct). */
static void rnn_grads_out(const struct cpu_plan *p, const char *ws, const struct kiln_op_args *a)
{
	const int64_t *v = p->dnn->sz;
	const int64_t H = v[R_H], I = v[R_I], gru = p->op.i[0], acc = p->op.i[3];
	const int direct = rnn_dw_direct(&p->op);
	const float *wl = (const float *)(ws + v[R_O_DWL]), *wi = (const float *)(ws + v[R_O_DWI]);
	const float *db = (const float *)(ws + v[R_O_DB]);
	float *dwih = a->out[1], *dwhh = a->out[2], *dbih = a->out[3], *dbhh = dbih + v[R_G] * H;
	for (int g = 0; g < v[R_G]; g++) {
		const int s = rnn_src_gate((int)gru, g);
		if (!direct) {
			rnn_put(dwih + s * H * I, wl + g * H * I, H * I, (int)acc);
			rnn_put(dwhh + s * H * H, wi + g * H * H, H * H, (int)acc);
		}
		rnn_put(dbih + s * H, db + g * H, H, 0);
		rnn_put(dbhh + s * H, db + (gru && g == 2 ? 3 : g) * H, H, 0);
	}
}

static kiln_status rnn_forward(const struct cpu_plan *p, const struct kiln_op_args *a,
			       struct cpu_err *e)
{
	const int64_t *v = p->dnn->sz;
	const int64_t B = v[R_B], T = v[R_T];
	const int rev = (int)p->op.i[1];
	char *ws = a->workspace, *aux = p->op.n_out == 2 ? a->out[1] : NULL;
	int32_t *len = (int32_t *)(aux ? aux + v[R_A_LEN] : ws + v[R_O_DDST]);
	float *bias = aux ? (float *)(aux + v[R_A_B]) : (float *)(ws + v[R_O_DB]);
	float *src = (float *)(ws + v[R_O_SRC]);
	float *dst = (float *)(aux ? aux + v[R_A_DST] : ws + v[R_O_DST]);
	struct kiln_op_args b = { .in = { dst, aux, bias }, .workspace = ws,
				  .workspace_bytes = a->workspace_bytes };
	rnn_lengths(p, a, len);
	rnn_weights_in(p, a->in[1], a->in[2], a->in[3], a->in[4], ws, bias, &b);
	b.in[5] = src;
	rnn_gather(src, a->in[0], B, T, v[R_I], len, rev, 1, 0);
	kiln_status st = cpu_dnn_run(p, &b, e);
	if (!st && p->op.i[4])
		rnn_last(a->out[0], dst, B, v[R_H], len);
	else if (!st)
		rnn_gather(a->out[0], dst, B, T, v[R_H], len, rev, 0, 0);
	return st;
}

static kiln_status rnn_backward(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const int64_t *v = p->dnn->sz;
	const int64_t B = v[R_B], T = v[R_T];
	const int rev = (int)p->op.i[1];
	char *ws = a->workspace, *aux = (char *)a->in[4];
	const int32_t *len = (const int32_t *)(aux + v[R_A_LEN]);
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	float *src = (float *)(ws + v[R_O_SRC]), *ddst = (float *)(ws + v[R_O_DDST]);
	float *dsrc = (float *)(ws + v[R_O_DST]);
	struct kiln_op_args b = { .in = { aux + v[R_A_DST], aux, aux + v[R_A_B] }, .workspace = ws,
				  .workspace_bytes = a->workspace_bytes };
	rnn_weights_in(p, a->in[2], a->in[3], NULL, NULL, ws, NULL, &b);
	/* out[0] of b: dy as oneDNN reads it, out[1]: where it writes dx,
	 * out[2], out[3]: the weight gradients' (rnn_dw_direct) */
	b.in[5] = src;
	b.out[0] = ddst;
	b.out[1] = dsrc;
	b.out[2] = a->out[1];
	b.out[3] = a->out[2];
	rnn_gather(src, a->in[0], B, T, v[R_I], len, rev, 1, 0);
	if (p->op.i[4])
		rnn_last_dy(ddst, a->in[1], B, T, v[R_H], len);
	else
		rnn_gather(ddst, a->in[1], B, T, v[R_H], len, rev, 1, 0);
	/* oneDNN adds into its weight and bias gradients: start them at zero */
	memset(ws + v[R_O_DWLP], 0, (size_t)(v[R_O_DWL] - v[R_O_DWLP]));
	kiln_status st = cpu_dnn_run(p, &b, e);
	if (st)
		return st;
	rnn_gather(a->out[0], dsrc, B, T, v[R_I], len, rev, 0, acc);
	rnn_grads_out(p, ws, a);
	return KILN_OK;
}

/* The cell's forward (training or inference) or backward descriptor,
 * left to right from the initial state md[H0] (h0, and c0 for the LSTM:
 * zeros, rnn_zero_state; their gradients md[H0] too). */
static dnnl_status_t rnn_desc(dnnl_rnn_desc_t *d, int gru, dnnl_prop_kind_t prop,
			      const dnnl_memory_desc_t *md)
{
	enum { SRC, WL, WI, B, DST, DSRC, DWL, DWI, DB, DDST, H0 };
	const dnnl_rnn_direction_t dir = dnnl_unidirectional_left2right;
	const dnnl_memory_desc_t *h0 = &md[H0];
	if (prop != dnnl_backward)
		return gru ? dnnl_lbr_gru_forward_desc_init(d, prop, dir, &md[SRC], h0, &md[WL],
							    &md[WI], &md[B], &md[DST], NULL, 0)
			   : dnnl_lstm_forward_desc_init(d, prop, dir, &md[SRC], h0, h0,
							 &md[WL], &md[WI], &md[B], &md[DST],
							 NULL, NULL, 0);
	return gru ? dnnl_lbr_gru_backward_desc_init(
			     d, prop, dir, &md[SRC], h0, &md[WL], &md[WI], &md[B], &md[DST], NULL,
			     &md[DSRC], h0, &md[DWL], &md[DWI], &md[DB], &md[DDST], NULL, 0)
		   : dnnl_lstm_backward_desc_init(d, prop, dir, &md[SRC], h0, h0, &md[WL],
						  &md[WI], &md[B], &md[DST], NULL, NULL, &md[DSRC],
						  h0, h0, &md[DWL], &md[DWI], &md[DB], &md[DDST],
						  NULL, NULL, 0);
}

/* A reorder step between two memory objects of d. */
static dnnl_status_t rnn_reorder(struct cpu_ctx *c, struct cpu_dnn *d, int from, int to)
{
	dnnl_primitive_desc_t pd = NULL;
	const dnnl_memory_desc_t *a, *b;
	dnnl_memory_get_memory_desc(d->mem[from], &a);
	dnnl_memory_get_memory_desc(d->mem[to], &b);
	dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, a, c->engine, b, c->engine, NULL);
	if (s == dnnl_success) {
		const int arg[2] = { DNNL_ARG_FROM, DNNL_ARG_TO }, mem[2] = { from, to };
		s = cpu_dnn_step(d, pd, 2, arg, mem);
	}
	dnnl_primitive_desc_destroy(pd);
	return s;
}

/* Lay out the workspace (v[R_O_*]) and the aux (v[R_A_*]) of pd. */
static size_t rnn_offsets(int64_t *v, const_dnnl_primitive_desc_t pd, int bwd)
{
	const size_t f = sizeof(float);
	const int64_t B = v[R_B], T = v[R_T], I = v[R_I], H = v[R_H], G = v[R_G];
	size_t off = 0, sz[R_O_SCR + 1] = { 0 };
	sz[R_O_WL] = (size_t)(G * H * I) * f;
	sz[R_O_WI] = (size_t)(G * H * H) * f;
	sz[R_O_WLP] = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0));
	sz[R_O_WIP] = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1));
	sz[R_O_SRC] = (size_t)(B * T * I) * f;
	sz[R_O_DST] = (size_t)(B * T * (bwd ? I : H)) * f;
	sz[R_O_DB] = (size_t)(v[R_GB] * H) * f; /* inference: oneDNN's bias */
	sz[R_O_DDST] = (size_t)B * sizeof(int32_t); /* inference: the lengths */
	if (bwd) {
		sz[R_O_DDST] = (size_t)(B * T * H) * f;
		sz[R_O_DWLP] = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0));
		sz[R_O_DWIP] = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 1));
		sz[R_O_DWL] = sz[R_O_WL];
		sz[R_O_DWI] = sz[R_O_WI];
	}
	/* the gradients of h0 and c0 (the LSTM's; backward): written by
	 * oneDNN, dropped.  h0 and c0 are the plan's (rnn_steps), not here:
	 * zeroed once, not on every call (2 * B * H floats a call before) */
	sz[R_O_H0] = 0;
	sz[R_O_DH0] = bwd ? (size_t)((G == 4 ? 2 : 1) * B * H) * f : 0;
	sz[R_O_SCR] = cpu_dnn_scratch(pd);
	for (int k = R_O_WL; k <= R_O_SCR; k++) {
		v[k] = (int64_t)off;
		off += RNN_AL(sz[k]);
	}
	const dnnl_memory_desc_t *w = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
	v[R_A_DST] = (int64_t)RNN_AL(w ? dnnl_memory_desc_get_size(w) : 0);
	v[R_A_LEN] = v[R_A_DST] + (int64_t)RNN_AL((size_t)(B * T * H) * f);
	v[R_A_B] = v[R_A_LEN] + (int64_t)RNN_AL((size_t)B * sizeof(int32_t));
	return off;
}

/* The memory objects and steps of the plan: the weight reorders, the cell,
 * and in the backward the weight gradients' reorders back (into the op's
 * outputs when rnn_dw_direct, else into the workspace for rnn_grads_out). */
static kiln_status rnn_steps(struct cpu_ctx *c, struct cpu_plan *p, const_dnnl_primitive_desc_t pd,
			     const dnnl_memory_desc_t *user_wl, const dnnl_memory_desc_t *user_wi,
			     int bwd, int training, const char *geom)
{
	kiln_status st = KILN_OK;
	struct cpu_dnn *d = p->dnn;
	const int64_t *v = d->sz;
	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n = 0, m, wl, wi, dwl = 0, dwi = 0;
#define RNN_MEM(q, idx, kind, bind, off, a)                                                     \
	do {                                                                                    \
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(pd, q, idx), kind, bind, \
					(size_t)(off), &m));                                    \
		arg[n] = (a), mem[n++] = m;                                                     \
	} while (0)
	/* the weights in ldgoi (the kernel's in[3], in[4]), reordered when the
	 * primitive wants another layout */
	CPU_DNN_TRY(cpu_dnn_mem(c, d, user_wl, CPU_BIND_IN, 3, 0, &wl));
	CPU_DNN_TRY(cpu_dnn_mem(c, d, user_wi, CPU_BIND_IN, 4, 0, &wi));
	if (dnnl_memory_desc_equal(user_wl, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0))) {
		arg[n] = DNNL_ARG_WEIGHTS_LAYER, mem[n++] = wl;
	} else {
		RNN_MEM(dnnl_query_weights_md, 0, CPU_BIND_WS, 0, v[R_O_WLP], DNNL_ARG_WEIGHTS_LAYER);
		CPU_DNN_TRY(rnn_reorder(c, d, wl, m));
	}
	if (dnnl_memory_desc_equal(user_wi, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1))) {
		arg[n] = DNNL_ARG_WEIGHTS_ITER, mem[n++] = wi;
	} else {
		RNN_MEM(dnnl_query_weights_md, 1, CPU_BIND_WS, 0, v[R_O_WIP], DNNL_ARG_WEIGHTS_ITER);
		CPU_DNN_TRY(rnn_reorder(c, d, wi, m));
	}
	RNN_MEM(dnnl_query_src_md, 0, CPU_BIND_IN, 5, 0, DNNL_ARG_SRC_LAYER);
	RNN_MEM(dnnl_query_weights_md, 2, CPU_BIND_IN, 2, 0, DNNL_ARG_BIAS);
	RNN_MEM(dnnl_query_dst_md, 0, CPU_BIND_IN, 0, 0, DNNL_ARG_DST_LAYER);
	/* the zero initial state: h0 (and c0), [B, H] each, the plan's own
	 * bytes zeroed here once (oneDNN only reads them) */
	const size_t hb = (size_t)(v[R_B] * v[R_H]) * sizeof(float);
	const int lstm = !p->op.i[0];
	if (!(d->zero_state = cpu_huge_alloc(64, RNN_AL((lstm ? 2 : 1) * hb))))
		return c->host->error(KILN_ENOMEM, "cpu: %s %s: out of memory (the initial state)",
				      cpu_op_name(p->op.type), geom);
	memset(d->zero_state, 0, RNN_AL((lstm ? 2 : 1) * hb));
	RNN_MEM(dnnl_query_src_md, 1, CPU_BIND_FIXED, 0, 0, DNNL_ARG_SRC_ITER);
	CPU_DNN_TRY(dnnl_memory_set_data_handle(d->mem[m], d->zero_state));
	if (lstm) {
		RNN_MEM(dnnl_query_src_md, 2, CPU_BIND_FIXED, 0, 0, DNNL_ARG_SRC_ITER_C);
		CPU_DNN_TRY(dnnl_memory_set_data_handle(d->mem[m], (char *)d->zero_state + hb));
	}
	if (training)
		RNN_MEM(dnnl_query_workspace_md, 0, CPU_BIND_IN, 1, 0, DNNL_ARG_WORKSPACE);
	if (bwd) {
		RNN_MEM(dnnl_query_diff_dst_md, 0, CPU_BIND_OUT, 0, 0, DNNL_ARG_DIFF_DST_LAYER);
		RNN_MEM(dnnl_query_diff_src_md, 0, CPU_BIND_OUT, 1, 0, DNNL_ARG_DIFF_SRC_LAYER);
		RNN_MEM(dnnl_query_diff_src_md, 1, CPU_BIND_WS, 0, v[R_O_DH0], DNNL_ARG_DIFF_SRC_ITER);
		if (lstm)
			RNN_MEM(dnnl_query_diff_src_md, 2, CPU_BIND_WS, 0, (size_t)v[R_O_DH0] + hb,
				DNNL_ARG_DIFF_SRC_ITER_C);
		RNN_MEM(dnnl_query_diff_weights_md, 0, CPU_BIND_WS, 0, v[R_O_DWLP],
			DNNL_ARG_DIFF_WEIGHTS_LAYER);
		dwl = m;
		RNN_MEM(dnnl_query_diff_weights_md, 1, CPU_BIND_WS, 0, v[R_O_DWIP],
			DNNL_ARG_DIFF_WEIGHTS_ITER);
		dwi = m;
		RNN_MEM(dnnl_query_diff_weights_md, 2, CPU_BIND_WS, 0, v[R_O_DB], DNNL_ARG_DIFF_BIAS);
	}
	if (cpu_dnn_scratch(pd))
		RNN_MEM(dnnl_query_scratchpad_md, 0, CPU_BIND_WS, 0, v[R_O_SCR], DNNL_ARG_SCRATCHPAD);
#undef RNN_MEM
	CPU_DNN_TRY(cpu_dnn_step(d, pd, n, arg, mem));
	if (bwd) {
		const int direct = rnn_dw_direct(&p->op);
		CPU_DNN_TRY(cpu_dnn_mem(c, d, user_wl, direct ? CPU_BIND_OUT : CPU_BIND_WS,
					direct ? 2 : 0, direct ? 0 : (size_t)v[R_O_DWL], &m));
		CPU_DNN_TRY(rnn_reorder(c, d, dwl, m));
		CPU_DNN_TRY(cpu_dnn_mem(c, d, user_wi, direct ? CPU_BIND_OUT : CPU_BIND_WS,
					direct ? 3 : 0, direct ? 0 : (size_t)v[R_O_DWI], &m));
		CPU_DNN_TRY(rnn_reorder(c, d, dwi, m));
	}
out:
	return st;
}

kiln_status cpu_rnn_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_RNN_BWD, gru = (int)op->i[0];
	const int training = bwd || op->n_out == 2;
	kiln_status st = KILN_OK;
	char geom[160];
	const struct kiln_tensor_desc *x = &op->in[0], *y = bwd ? &op->in[1] : &op->out[0];
	for (int k = 0; k < op->n_in; k++)
		if (op->in[k].dtype != KILN_F32 && !(k == 5 && op->in[k].dtype == KILN_I32) &&
		    !(bwd && k == 4))
			return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	if ((st = cpu_dnn_new(c, p)))
		return st;
	int64_t *v = p->dnn->sz;
	v[R_B] = x->dims[0], v[R_T] = x->dims[1], v[R_I] = x->dims[2];
	v[R_H] = y->dims[y->ndim - 1]; /* y [B,T,H], or [B,H] (i[4], last) */
	v[R_G] = gru ? 3 : 4, v[R_GB] = 4;
	snprintf(geom, sizeof geom, "%s%s x [%lld,%lld,%lld] hidden %lld%s", gru ? "GRU" : "LSTM",
		 op->i[1] ? " reverse" : "", (long long)v[R_B], (long long)v[R_T],
		 (long long)v[R_I], (long long)v[R_H], op->i[4] ? " last" : "");
	enum { SRC, WL, WI, B, DST, DSRC, DWL, DWI, DB, DDST, H0, N_MD };
	/* oneDNN's descriptors on the heap: over 16 KiB of an application
	 * thread's stack (the frame cap, docs/design-notes.md); a plan's
	 * preparation, not a step */
	struct {
		dnnl_memory_desc_t md[N_MD], user_wl, user_wi;
		dnnl_rnn_desc_t desc;
	} *dd = malloc(sizeof *dd);
	if (!dd)
		return cpu_bad(c, op, KILN_ENOMEM, "out of memory");
	dnnl_memory_desc_t *const md = dd->md, *const user_wl = &dd->user_wl,
			   *const user_wi = &dd->user_wi;
	dnnl_rnn_desc_t *const desc = &dd->desc;
	dnnl_primitive_desc_t fwd = NULL, pd = NULL;
	dnnl_primitive_attr_t attr = NULL;
	{
		const dnnl_dims_t src = { v[R_T], v[R_B], v[R_I] }, dst = { v[R_T], v[R_B], v[R_H] };
		const dnnl_dims_t wl = { 1, 1, v[R_I], v[R_G], v[R_H] };
		const dnnl_dims_t wi = { 1, 1, v[R_H], v[R_G], v[R_H] };
		const dnnl_dims_t b = { 1, 1, v[R_GB], v[R_H] };
		const dnnl_dims_t h0 = { 1, 1, v[R_B], v[R_H] };
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[SRC], 3, src, dnnl_f32, dnnl_tnc));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[DST], 3, dst, dnnl_f32, dnnl_tnc));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[WL], 5, wl, dnnl_f32, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[WI], 5, wi, dnnl_f32, dnnl_format_tag_any));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[B], 4, b, dnnl_f32, dnnl_ldgo));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&md[H0], 4, h0, dnnl_f32, dnnl_ldnc));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(user_wl, 5, wl, dnnl_f32, dnnl_ldgoi));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(user_wi, 5, wi, dnnl_f32, dnnl_ldgoi));
		md[DSRC] = md[SRC], md[DDST] = md[DST], md[DWL] = md[WL], md[DWI] = md[WI];
		md[DB] = md[B];
	}
	CPU_DNN_TRY(dnnl_primitive_attr_create(&attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
	CPU_DNN_TRY(rnn_desc(desc, gru, training ? dnnl_forward_training : dnnl_forward_inference, md));
	CPU_DNN_TRY(dnnl_primitive_desc_create(&fwd, desc, attr, c->engine, NULL));
	if (bwd) {
		CPU_DNN_TRY(rnn_desc(desc, gru, dnnl_backward, md));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&pd, desc, attr, c->engine, fwd));
	} else {
		pd = fwd;
		fwd = NULL;
	}
	p->workspace = rnn_offsets(v, pd, bwd);
	p->aux = training ? (size_t)v[R_A_B] + RNN_AL((size_t)(v[R_GB] * v[R_H]) * sizeof(float)) : 0;
	if ((st = rnn_steps(c, p, pd, user_wl, user_wi, bwd, training, geom)))
		goto out;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = bwd ? rnn_backward : rnn_forward;
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s, aux %zu bytes, workspace %zu bytes",
		     cpu_op_name(op->type), geom, cpu_dnn_impl(pd), p->aux, p->workspace);
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_desc_destroy(fwd);
	dnnl_primitive_attr_destroy(attr);
	free(dd);
	return st;
}
