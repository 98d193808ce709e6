/* core/summary.c - `kiln summary`: per layer, the output shape, the
 * parameters (trainable, frozen, buffers) and the forward FLOPs, and the
 * totals, printed like torchinfo's table (see kiln.h, kiln_model_summary;
 * docs/report.md).  FLOPs come from the device ops the layers prepare: the
 * device notes each plan's kiln_op_flops while the plan is made, then the
 * forward is issued with the device counting instead of running. */
#include "graph.h"
#include "../plugins/common/c_locale.h" /* common_c_numbers_begin */

#include <stdio.h>
#include <stdlib.h>

static double numel(const struct kiln_tensor_desc *d)
{
	return (double)kiln_tensor_numel(d);
}

static double op_flops(const struct kiln_op *op);

/* An op's FLOPs, a fused activation's (KILN_OPF_ACT) one per output
 * element, as the activation's own op would count. */
double kiln_op_flops(const struct kiln_op *op)
{
	const double act = op->type != KILN_OP_BN_BWD && (op->flags & KILN_OPF_ACT) && op->n_out > 0
				   ? numel(&op->out[0])
				   : 0;
	return op_flops(op) + act;
}

static double op_flops(const struct kiln_op *op)
{
	const double y = op->n_out > 0 ? numel(&op->out[0]) : 0;
	switch (op->type) {
	case KILN_OP_GEMM: {
		const double batches = op->i[5] > 1 ? (double)op->i[5] : 1;
		const double mn = (double)op->i[2] * (double)op->i[3];
		return batches * (2 * mn * (double)op->i[4] + (op->n_in > 2 ? mn : 0));
	}
	case KILN_OP_CONV: {
		const struct kiln_tensor_desc *w = &op->in[1];
		const double per_out = w->ndim > 0 && w->dims[0] ? numel(w) / (double)w->dims[0] : 0;
		return 2 * y * per_out + (op->n_in > 2 ? y : 0);
	}
	case KILN_OP_POOL:
		return y * (double)op->i[1] * (double)op->i[2];
	case KILN_OP_ATTENTION:
	case KILN_OP_ATTENTION_BWD: {
		/* the score and value GEMMs of the (b, h) pairs: 2 T T D each,
		 * over the lower triangle only when causal (what is computed);
		 * the backward recomputes the scores and has four more */
		const struct kiln_tensor_desc *qkv = &op->in[op->type == KILN_OP_ATTENTION ? 0 : 1];
		const double T = (double)qkv->dims[qkv->ndim - 2];
		const double BC = numel(qkv) / T / 3; /* B * C, C = H * D */
		const double pairs = op->i[1] ? T * (T + 1) / 2 : T * T;
		return (op->type == KILN_OP_ATTENTION ? 4 : 10) * BC * pairs;
	}
	case KILN_OP_RNN: {
		/* the input and recurrent GEMMs of every step: 2 B T G H (I + H) */
		const struct kiln_tensor_desc *x = &op->in[0];
		const struct kiln_tensor_desc *yd = &op->out[0]; /* [B,T,H], or [B,H] (last) */
		const double G = op->i[0] ? 3 : 4, H = (double)yd->dims[yd->ndim - 1];
		return 2 * numel(x) / (double)x->dims[2] * G * H * ((double)x->dims[2] + H);
	}
	case KILN_OP_BN_TRAIN:
	case KILN_OP_BN_INFER:
	case KILN_OP_BN_APPLY:
	case KILN_OP_NORMALIZE_U8:
		return 2 * y;
	case KILN_OP_REORDER:
	case KILN_OP_CAST:
	case KILN_OP_CONCAT:
	case KILN_OP_SPLIT:
	case KILN_OP_FILL:
	case KILN_OP_COUNTER_ADD:
		return 0;
	default:
		return y;
	}
}

/* Each layer's parameters and buffers, in elements, and the totals. */
static void count_params(const struct kiln_model *m, struct kiln_summary *s)
{
	for (int k = 0; k < m->n_params; k++) {
		const struct model_param *pm = &m->params[k];
		struct kiln_summary_layer *L = &s->layers[pm->layer];
		if (pm->buffer)
			L->buffers += pm->numel, s->buffers += pm->numel;
		else if (pm->trainable)
			L->trainable += pm->numel, s->trainable += pm->numel;
		else
			L->frozen += pm->numel, s->frozen += pm->numel;
	}
	s->params = s->trainable + s->frozen;
	s->param_mib = (double)s->params * sizeof(float) / 1048576.0;
}

/* The forward hook of the counting pass: layer i's ops add to its count
 * (i = n_layers: the parameters' compute copy, counted nowhere). */
struct flops_pass {
	struct kiln_model *m;
	struct kiln_summary *s;
	double other;
};

static kiln_status count_layer(void *user, int layer, void *stream)
{
	struct flops_pass *fp = user;
	(void)stream;
	kiln_device_flops_count(fp->m->dev, layer < fp->m->n_layers ? &fp->s->layers[layer].flops
								      : &fp->other);
	return KILN_OK;
}

/* Issue p's forward with the device counting: every layer's FLOPs, nothing
 * run.  The model's hooks and compute-copy state are left as they were. */
static kiln_status count_flops(struct kiln_plan *p, struct kiln_summary *s)
{
	struct kiln_model *m = p->m;
	/* stages on devices of their own ([run] devices) would run their
	 * kernels: only m->dev counts */
	if ((p->training && m->group_ranks > 1) || (p->staged && m->stage_dev)) {
		s->no_flops = 1;
		return KILN_OK;
	}
	struct flops_pass fp = { m, s, 0 };
	kiln_status (*hook)(void *, int, void *) = m->fwd_hook;
	void *user = m->fwd_user;
	const int stale = m->pcopy_stale;
	void *stream;
	kiln_status st = kiln_device_stream_create(m->dev, &stream);
	if (st)
		return st;
	m->fwd_hook = count_layer, m->fwd_user = &fp;
	kiln_device_flops_count(m->dev, &fp.other);
	st = kiln_plan_forward(p, NULL, NULL, NULL, stream);
	kiln_device_flops_count(m->dev, NULL);
	m->fwd_hook = hook, m->fwd_user = user;
	m->pcopy_stale = stale;
	kiln_device_stream_destroy(m->dev, stream);
	for (int i = 0; i < s->n_layers; i++)
		s->flops += s->layers[i].flops;
	return st ? kiln_error_wrap(st, "counting the forward's FLOPs") : KILN_OK;
}

static char *dup_str(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	return d ? memcpy(d, s, n) : NULL;
}

kiln_status kiln_plan_summary(struct kiln_plan *p, struct kiln_summary *out)
{
	struct kiln_model *m = p->m;
	memset(out, 0, sizeof *out);
	out->batch = p->batch;
	out->training = p->training;
	out->layers = calloc((size_t)m->n_layers, sizeof *out->layers);
	if (!out->layers) {
		kiln_device_flops_count(m->dev, NULL);
		return kiln_error(KILN_ENOMEM, "summary: out of memory");
	}
	out->n_layers = m->n_layers;
	for (int i = 0; i < m->n_layers; i++) {
		struct kiln_summary_layer *L = &out->layers[i];
		L->name = dup_str(m->layers[i].name);
		L->type = dup_str(m->layers[i].type->name);
		if (!L->name || !L->type) {
			kiln_device_flops_count(m->dev, NULL);
			kiln_summary_free(out);
			return kiln_error(KILN_ENOMEM, "summary: out of memory");
		}
		L->out = p->nodes[i].l.out;
		L->is_view = p->nodes[i].l.is_view;
		L->is_loss = p->nodes[i].l.is_loss;
	}
	count_params(m, out);
	kiln_status st = count_flops(p, out);
	kiln_device_flops_count(m->dev, NULL);
	if (st)
		kiln_summary_free(out);
	return st;
}

kiln_status kiln_model_summary(struct kiln_model *m, int64_t batch, struct kiln_summary *out)
{
	if (!m || !out)
		return kiln_null_arg("kiln_model_summary", !m ? "m" : "out");
	struct kiln_plan_opts o = { .dry = 1 };
	struct kiln_plan *p = NULL;
	memset(out, 0, sizeof *out);
	/* shapes and FLOPs alone: the device prepares nothing (no kernels
	 * generated, no convolution timed), its plans are tokens noted with
	 * their ops' FLOPs */
	kiln_device_layout_only(m->dev, 1);
	kiln_device_flops_record(m->dev, 1);
	/* one row per layer as PyTorch has them: no activation fused away */
	const int fuse = m->fuse;
	m->fuse = 0;
	kiln_status st = kiln_model_plan_ex(m, batch, &o, &p);
	m->fuse = fuse;
	kiln_device_flops_record(m->dev, 0);
	if (!st)
		st = kiln_plan_summary(p, out);
	kiln_device_flops_count(m->dev, NULL);
	kiln_plan_free(p);
	kiln_device_layout_only(m->dev, 0);
	return st;
}

void kiln_summary_free(struct kiln_summary *s)
{
	if (!s)
		return;
	for (int i = 0; s->layers && i < s->n_layers; i++) {
		free((char *)s->layers[i].name);
		free((char *)s->layers[i].type);
	}
	free(s->layers);
	memset(s, 0, sizeof *s);
}

/* n with thousands separators ("1,234,567") into buf. */
static const char *commas(double v, char *buf, size_t n)
{
	char raw[32];
	snprintf(raw, sizeof raw, "%.0f", v);
	size_t len = strlen(raw), o = 0;
	for (size_t i = 0; i < len && o + 2 < n; i++) {
		if (i && (len - i) % 3 == 0)
			buf[o++] = ',';
		buf[o++] = raw[i];
	}
	buf[o] = 0;
	return buf;
}

/* "[1, 16, 28, 28]" */
static const char *shape_str(const struct kiln_tensor_desc *d, char *buf, size_t n)
{
	size_t o = (size_t)snprintf(buf, n, "[");
	for (int k = 0; k < d->ndim && o < n; k++)
		o += (size_t)snprintf(buf + o, n - o, "%s%lld", k ? ", " : "", (long long)d->dims[k]);
	if (o < n)
		snprintf(buf + o, n - o, "]");
	return buf;
}

#define RULE "=========================================================================================================="

void kiln_summary_print(const struct kiln_summary *s, FILE *f)
{
	char a[32], b[32], c[32], d[32], sh[96], nm[160];
	/* the C locale's '.' and no grouping, whatever the application's */
	const locale_t old = common_c_numbers_begin();
	fprintf(f, "%s\n%-34s %-20s %12s %12s %10s %14s\n%s\n", RULE, "Layer (type)", "Output Shape",
		"Param #", "Trainable", "Frozen", "FLOPs", RULE);
	for (int i = 0; i < s->n_layers; i++) {
		const struct kiln_summary_layer *L = &s->layers[i];
		snprintf(nm, sizeof nm, "%s (%s)", L->name, L->type);
		fprintf(f, "%-34s %-20s %12s %12s %10s %14s\n", nm,
			L->is_loss ? "--" : shape_str(&L->out, sh, sizeof sh),
			commas((double)(L->trainable + L->frozen), a, sizeof a),
			commas((double)L->trainable, b, sizeof b), commas((double)L->frozen, c, sizeof c),
			s->no_flops ? "--" : commas(L->flops, d, sizeof d));
	}
	fprintf(f, "%s\n", RULE);
	fprintf(f, "Total params: %s\n", commas((double)s->params, a, sizeof a));
	fprintf(f, "Trainable params: %s\n", commas((double)s->trainable, a, sizeof a));
	fprintf(f, "Non-trainable params: %s\n", commas((double)s->frozen, a, sizeof a));
	fprintf(f, "Buffers (not parameters: batchnorm running statistics): %s\n",
		commas((double)s->buffers, a, sizeof a));
	if (s->no_flops)
		fprintf(f, "Forward FLOPs: not counted (batchnorm synchronised across ranks)\n");
	else
		fprintf(f, "Forward FLOPs (batch %lld, %s; a multiply-add is 2): %s (%.2f MFLOP)\n",
			(long long)s->batch, s->training ? "training" : "evaluation",
			commas(s->flops, a, sizeof a), s->flops / 1e6);
	fprintf(f, "Params size (MiB): %.2f\n%s\n", s->param_mib, RULE);
	common_c_numbers_end(old);
}

kiln_status kiln_summary_log(const struct kiln_summary *s)
{
	char *buf = NULL;
	size_t n = 0;
	if (kiln_log_get_level() < KILN_LOG_INFO)
		return KILN_OK;
	FILE *f = open_memstream(&buf, &n);
	if (f) {
		kiln_summary_print(s, f);
		fclose(f);
	}
	for (char *line = buf, *end; line && *line; line = end + 1) {
		if (!(end = strchr(line, '\n')))
			end = line + strlen(line) - 1;
		else
			*end = 0;
		kiln_log(KILN_LOG_INFO, "summary", "%s", line);
	}
	free(buf);
	return f ? KILN_OK : kiln_error(KILN_ENOMEM, "summary: out of memory");
}

kiln_status kiln_plan_summary_log(struct kiln_plan *p)
{
	struct kiln_summary s;
	if (kiln_log_get_level() < KILN_LOG_INFO) {
		kiln_device_flops_count(p->m->dev, NULL); /* forget the notes */
		return KILN_OK;
	}
	kiln_status st = kiln_plan_summary(p, &s);
	if (st)
		return st;
	st = kiln_summary_log(&s);
	kiln_summary_free(&s);
	return st;
}
