/* core/tie.c - weight tying: [layer.X] tie = Y makes X's `weight` Y's
 * tensor (GPT's lm_head reading the token embedding, as PyTorch's shared
 * nn.Parameter).  The tensor is one model_param, named and initialised as
 * Y's, laid out once in the flat buffers: the optimizer, its state, the
 * weight-decay groups, checkpoints, exports and the parameter counts all
 * see it once.  X's slot points at it (pidx), so its forward reads it and
 * ZeRO-1's allgathers wait for it like any other parameter of X.
 *
 * Gradients.  A layer writes its weight gradient (it never adds), so the
 * users of one tensor cannot all write into its one gradient.  The user
 * whose backward runs last, the lowest-indexed (backward goes in reverse
 * layer order), writes in place; each other user writes into its own
 * slice of tie_grads_d, which is added into the gradient right after that
 * last backward (kiln_model_tie_grads), before the backward hook that may
 * start the bucket's allreduce.  The tensor's grad_layer is that last
 * user, so the gradient buckets wait for it.
 *
 * Layout.  The tensor is laid out at that same first user's place among
 * the parameters (kiln_model_tie_owner), Y's or an earlier X's: a pipeline
 * stage's parameters are a contiguous slice, and the tensor is on its
 * first user's stage, which writes its gradient in place (docs/pipeline.md).
 */
#include "graph.h"

#include <stdio.h>

static const char tied_suffix[] = "weight";

kiln_status kiln_model_read_ties(struct kiln_model *m)
{
	const struct kiln_config *cfg = m->cfg;
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *L = &m->layers[i];
		L->tie = L->tie_slot = -1;
		L->tie_grad = -1;
		const char *y = kiln_config_get(cfg, L->section, "tie");
		if (!y)
			continue;
		L->tie = kiln_model_find_layer(m, m->n_layers, y);
		if (L->tie < 0)
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: there is no layer '%s'",
					  kiln_config_where(cfg, L->section, "tie"), L->section, y, y);
		if (L->tie == i)
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: a layer cannot be tied to itself",
					  kiln_config_where(cfg, L->section, "tie"), L->section, y);
	}
	for (int i = 0; i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i], *Y;
		if (L->tie < 0 || (Y = &m->layers[L->tie])->tie < 0)
			continue;
		return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: '%s' is itself tied to '%s'; tie to '%s' directly",
				  kiln_config_where(cfg, L->section, "tie"), L->section, Y->name,
				  Y->name, m->layers[Y->tie].name, m->layers[Y->tie].name);
	}
	return KILN_OK;
}

/* The slot of the tied parameter among layer i's inferred ones, or -1. */
static int tied_slot(const struct plan_node *n)
{
	for (int k = 0; k < n->l.n_params; k++)
		if (!strcmp(n->l.params[k].suffix, tied_suffix))
			return k;
	return -1;
}

kiln_status kiln_model_tie_slots(struct kiln_model *m, const struct plan_node *nodes)
{
	const struct kiln_config *cfg = m->cfg;
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *X = &m->layers[i];
		if (X->tie < 0)
			continue;
		struct model_layer *Y = &m->layers[X->tie];
		const char *where = kiln_config_where(cfg, X->section, "tie");
		int kx = tied_slot(&nodes[i]), ky = tied_slot(&nodes[X->tie]);
		const struct model_layer *none = kx < 0 ? X : ky < 0 ? Y : NULL;
		if (none)
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: layer '%s' (%s) has no '%s' parameter to share",
					  where, X->section, Y->name, none->name, none->type->name,
					  tied_suffix);
		const struct kiln_param_spec *a = &nodes[i].l.params[kx];
		const struct kiln_param_spec *b = &nodes[X->tie].l.params[ky];
		int same = a->desc.ndim == b->desc.ndim && a->desc.dtype == b->desc.dtype;
		for (int d = 0; same && d < a->desc.ndim; d++)
			same = a->desc.dims[d] == b->desc.dims[d];
		if (!same) {
			char sa[96], sb[96];
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: %s.%s is %s but %s.%s is %s; tied weights must have the same shape",
					  where, X->section, Y->name, X->name, tied_suffix,
					  kiln_tensor_desc_str(&a->desc, sa, sizeof sa), Y->name,
					  tied_suffix, kiln_tensor_desc_str(&b->desc, sb, sizeof sb));
		}
		if (a->is_buffer || b->is_buffer)
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: '%s' is a buffer, not a parameter",
					  where, X->section, Y->name, tied_suffix);
		if (X->trainable != Y->trainable)
			return kiln_error(KILN_ECONFIG, "%s: [%s] tie = %s: both layers must be trainable, or both frozen (trainable = %d and %d)",
					  where, X->section, Y->name, X->trainable, Y->trainable);
		X->tie_slot = kx;
		Y->tie_slot = ky;
	}
	return KILN_OK;
}

int kiln_model_tie_owner(const struct kiln_model *m, int i)
{
	const int y = m->layers[i].tie >= 0 ? m->layers[i].tie : i;
	if (y < i)
		return -1;
	for (int j = 0; j < i; j++)
		if (m->layers[j].tie == y)
			return -1;
	return y;
}

void kiln_model_tie_link(struct kiln_model *m)
{
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *X = &m->layers[i];
		if (X->tie < 0)
			continue;
		const struct model_layer *Y = &m->layers[X->tie];
		X->pidx[X->tie_slot] = Y->pidx[Y->tie_slot];
		struct model_param *p = &m->params[X->pidx[X->tie_slot]];
		if (i < p->grad_layer)
			p->grad_layer = i;
	}
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *L = &m->layers[i];
		if (L->tie_slot < 0)
			continue;
		const struct model_param *p = &m->params[L->pidx[L->tie_slot]];
		if (!p->trainable || p->grad_layer == i)
			continue;
		L->tie_grad = (int64_t)m->n_tie_elems;
		m->n_tie_elems += kiln_align_up((size_t)p->numel * 4) / 4;
	}
}

kiln_status kiln_model_tie_prepare(struct kiln_model *m)
{
	kiln_status st;
	if (!m->n_tie_elems)
		return KILN_OK;
	if ((st = kiln_device_alloc_named(m->dev, m->n_tie_elems * sizeof(float),
					  (void **)&m->tie_grads_d, "the tied weights' gradients")))
		return st;
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *L = &m->layers[i];
		if (L->tie_grad < 0)
			continue;
		/* gradient += this user's gradient, in place */
		if ((st = kiln_device_prepare_add(m->dev, m->params[L->pidx[L->tie_slot]].numel,
						  &L->tie_add)))
			return kiln_error_wrap(st, "layer '%s': adding its gradient of the tied '%s'",
					       L->name, m->params[L->pidx[L->tie_slot]].name);
	}
	return KILN_OK;
}

void kiln_model_tie_free(struct kiln_model *m)
{
	for (int i = 0; i < m->n_layers; i++) {
		kiln_device_plan_free(m->dev, m->layers[i].tie_add);
		m->layers[i].tie_add = NULL;
	}
	kiln_device_free(m->dev, m->tie_grads_d);
	m->tie_grads_d = NULL;
}

float *kiln_model_grad_dst(const struct kiln_model *m, float *grads, int i, int k)
{
	const struct model_layer *L = &m->layers[i];
	const struct model_param *p = &m->params[L->pidx[k]];
	if (!p->trainable)
		return NULL;
	if (k == L->tie_slot && L->tie_grad >= 0)
		return m->tie_grads_d + L->tie_grad;
	return grads + p->off;
}

kiln_status kiln_model_tie_grads(struct kiln_model *m, int i, void *stream)
{
	float *grads = m->grad_out_d ? m->grad_out_d : m->grads_d;
	if (!m->n_tie_elems || m->layers[i].tie_slot < 0)
		return KILN_OK;
	for (int j = 0; j < m->n_layers; j++) {
		const struct model_layer *L = &m->layers[j];
		if (L->tie_grad < 0 || m->params[L->pidx[L->tie_slot]].grad_layer != i)
			continue;
		float *g = grads + m->params[L->pidx[L->tie_slot]].off;
		struct kiln_op_args a = { .in = { g, m->tie_grads_d + L->tie_grad }, .out = { g } };
		kiln_status st = kiln_device_run(m->dev, L->tie_add, &a, stream);
		if (st)
			return kiln_error_wrap(st, "adding layer '%s''s gradient of the tied '%s'",
					       L->name, m->params[L->pidx[L->tie_slot]].name);
	}
	return KILN_OK;
}

int kiln_model_tie_alias(const struct kiln_model *m, const char *name)
{
	for (int i = 0; i < m->n_layers; i++) {
		const struct model_layer *X = &m->layers[i];
		size_t n = strlen(X->name);
		if (X->tie >= 0 && !strncmp(name, X->name, n) && name[n] == '.' &&
		    !strcmp(name + n + 1, tied_suffix))
			return X->pidx[X->tie_slot];
	}
	return -1;
}
