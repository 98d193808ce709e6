/* core/graph_infer.c - configure and infer every layer of a model for one
 * batch (kiln_model_infer): each layer's inputs' shapes, the activations
 * fused into the layer before, the mixed-layout stem (issue 22), and the
 * checks on the shapes each layer makes.  The model itself is built in
 * core/graph.c.
 */
#include "graph.h"

/* The data input as layers see it: [batch, sample...], 4-d inputs in the
 * model's layout. */
void kiln_model_data_desc(const struct kiln_model *m, int64_t batch, struct kiln_tensor_desc *d)
{
	*d = m->sample;
	memmove(&d->dims[1], &m->sample.dims[0], sizeof(int64_t) * (KILN_MAX_DIMS - 1));
	d->dims[0] = batch;
	d->ndim = m->sample.ndim + 1;
	d->layout = d->ndim == 4 ? m->layout : KILN_ROW;
	if (m->cdtype != KILN_F32 && m->sample.dtype != KILN_I32)
		d->dtype = m->cdtype; /* the plan converts the input (token ids stay i32) */
}

/* Is layer i's output read by exactly one layer, of type `type`? */
static int only_consumer_is(const struct kiln_model *m, int i, const char *type)
{
	int n = 0, match = 0;
	for (int j = i + 1; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++)
			if (m->layers[j].in[k] == i) {
				n++;
				match = !strcmp(m->layers[j].type->name, type);
			}
	return n == 1 && match;
}

/* The only reader of layer i's output, else -1 (graph.h). */
int kiln_model_only_consumer(const struct kiln_model *m, int i)
{
	int who = -1;
	for (int j = i + 1; j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++)
			if (m->layers[j].in[k] == i) {
				if (who >= 0)
					return -1;
				who = j;
			}
	return who;
}

/* 1 + the enum kiln_act of the activation layer that alone reads layer
 * i's output and may become the epilogue of layer i's ops
 * (kiln_layer.fuse_act), else 0.  fuse (kiln_model_infer's): ReLU fuses
 * from KILN_FUSE_RELU on (its backward needs only the fused output), GELU
 * with KILN_FUSE_ALL (plans without a backward: its derivative needs the
 * input, which the fused op does not keep). */
static int fusable_act(const struct kiln_model *m, int i, int fuse)
{
	return m->fuse ? kiln_model_act_after(m, i, fuse) : 0;
}

/* fusable_act whatever [run] fuse says (graph.h) */
int kiln_model_act_after(const struct kiln_model *m, int i, int fuse)
{
	const int j = kiln_model_only_consumer(m, i);
	if (!fuse || j < 0 || m->layers[j].n_in != 1)
		return 0;
	/* a view cannot cross a pipeline stage: the activation would be
	 * sent before its epilogue ran, its gradient applied on the wrong side */
	if (m->stage && m->stage[i] != m->stage[j])
		return 0;
	const char *type = m->layers[j].type->name;
	if (!strcmp(type, "relu"))
		return 1 + KILN_ACT_RELU;
	if (strcmp(type, "gelu") || fuse < KILN_FUSE_ALL)
		return 0;
	const char *approx = kiln_config_get(m->cfg, m->layers[j].section, "approximate");
	return 1 + (approx && !strcmp(approx, "tanh") ? KILN_ACT_GELU_TANH : KILN_ACT_GELU);
}

/* Token ids (i32 data) must meet a layer that turns them into floating
 * point activations (an embedding): one that passes the integers on would
 * compute on them as numbers.  Refused here, naming the layer, before any
 * device op is prepared. */
static kiln_status check_token_input(const struct kiln_model *m, int i, const struct kiln_layer *l)
{
	const struct model_layer *L = &m->layers[i];
	for (int k = 0; k < L->n_in; k++)
		if (L->in[k] < 0 && l->in[k].dtype == KILN_I32 && l->out.dtype == KILN_I32)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s) reads the data's token ids (i32): the first layer of a model on tokens must map ids to vectors (type = embedding)",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name);
	return KILN_OK;
}

/* A loss layer from a plugin built before ABI 2.23 in a plan whose step
 * is the mean over m->seed_n micro-batches ([train] accumulate, a
 * pipeline's micro-batches): its loss_scale is that mean's 1 / n share
 * (times fp16's scale), which such a plugin was told only fp16 sets, and
 * one that ignores it in f32 makes every gradient n times too large
 * without a word (before session 37 a pass scaled the summed gradients by
 * 1 / accumulate after the last micro-step; a pipeline has seeded 1 / n
 * since session 12).  Refused, naming the layer, the file and both ABIs.
 * fp16's scale alone (n = 1) is loss_scale's meaning since ABI 1.2, and a
 * built-in (kiln_builtin_layers, file NULL) reads it. */
static kiln_status check_loss_seed(const struct kiln_model *m, int i, const struct kiln_layer *l)
{
	const struct model_layer *L = &m->layers[i];
	if (!l->is_loss || !m->seed_d || !L->file || L->type->abi_minor >= 23)
		return KILN_OK;
	return kiln_error(KILN_ECONFIG, "%s: loss layer '%s' (type %s) comes from %s, built for plugin ABI %u.%u: this step is the mean over %lld micro-batches ([train] accumulate x a pipeline's micro-batches), whose 1/%lld share kiln passes to a loss layer as kiln_layer_run.loss_scale, which a layer built before ABI 2.23 may ignore (its gradients would be %lld times too large); make its backward multiply by *loss_scale whenever l->loss_scaled is set and rebuild it against this kiln's headers (ABI %d.%d, docs/plugins.md \"ABI 2.23\"), or train with accumulate = 1 and no pipeline",
			  kiln_config_where(m->cfg, L->section, "type"), L->name, L->type->name,
			  L->file, L->type->abi_major, L->type->abi_minor, (long long)m->seed_n,
			  (long long)m->seed_n, (long long)m->seed_n, KILN_ABI_MAJOR, KILN_ABI_MINOR);
}

/* Every tensor a layer's shapes make (its output, its parameters) within
 * KILN_TENSOR_MAX_BYTES: a config whose shapes multiply past it is refused
 * here, naming the layer, before any count can wrap further on. */
static kiln_status check_sizes(const struct kiln_model *m, int i, const struct kiln_layer *l)
{
	const struct model_layer *L = &m->layers[i];
	char d[200];
	for (int k = -1; k < l->n_params; k++) {
		const struct kiln_tensor_desc *t = k < 0 ? &l->out : &l->params[k].desc;
		if (kiln_tensor_size(t, NULL, NULL))
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s): its %s%s %s is larger than %llu bytes (its size overflows): make the layer smaller",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name, k < 0 ? "output" : "parameter ",
					  k < 0 ? "" : l->params[k].suffix,
					  kiln_tensor_desc_str(t, d, sizeof d),
					  (unsigned long long)KILN_TENSOR_MAX_BYTES);
	}
	return KILN_OK;
}

/* A layer's output layout when it is not its input's (kiln_layer_out_layout),
 * for the layer being inferred, and whether kiln_model_infer may choose one
 * (kiln_model_mixed_stem). */
static _Thread_local const struct kiln_layer *inferring;
static _Thread_local int inferring_layout = -1;
static _Thread_local int mixed_off;

int kiln_layer_out_layout(const struct kiln_layer *l)
{
	return l && l == inferring ? inferring_layout : -1;
}

void kiln_model_mixed_stem(int on) { mixed_off = !on; }

/* The maxpool k whose input, layer i's output, may be NHWC in an NCHW model
 * (issue 22): i a built-in conv of one f32 input channel in NCHW (the
 * same bytes in NHWC), its ReLU fusable, the relu alone read by a maxpool
 * alone, one device.  The conv then writes NHWC (oneDNN's blocked forward
 * without the reorder of y to NCHW; its weight gradient reads dy as it
 * is), the maxpool reads NHWC and writes NCHW (POOL of mixed layouts, ABI
 * 2.17), so the rest of the model is unchanged.  A device that refuses
 * the mixed POOL fails the plan, which kiln_model_plan_ex then makes again
 * without it.  -1: not such a conv. */
static int mixed_stem(const struct kiln_model *m, const struct plan_node *n, int i)
{
	const struct kiln_tensor_desc *x = &n->l.in[0];
	if (mixed_off || m->stage || strcmp(m->layers[i].type->name, "conv") || m->layers[i].n_in != 1 ||
	    n->l.fuse_act != 1 + KILN_ACT_RELU || x->ndim != 4 || x->layout != KILN_NCHW ||
	    x->dims[1] != 1 || x->dtype != KILN_F32)
		return -1;
	const int j = kiln_model_only_consumer(m, i);
	const int k = j < 0 ? -1 : kiln_model_only_consumer(m, j);
	if (k < 0 || strcmp(m->layers[k].type->name, "maxpool") || m->layers[k].n_in != 1)
		return -1;
	return k;
}

/* A layer's infer failure: "layer 'x' (type): " before its message,
 * unless the message names the layer already (at its start, or after the
 * place it is configured: "FILE:LINE: layer 'x' (type) needs ..."). */
static kiln_status infer_failed(kiln_status st, const char *name, const char *type)
{
	/* (a longer name cuts head short: a prefix of the whole, so a
	 * message naming the layer is still found and left alone; one that
	 * does not is wrapped with the cut name) */
	char head[512];
	snprintf(head, sizeof head, "layer '%s' (%s)", name, type);
	if (strstr(kiln_last_error(), head))
		return st;
	return kiln_error_wrap(st, "%s", head);
}

/* configure + infer every layer for `batch` rows into nodes[]. */
kiln_status kiln_model_infer(struct kiln_model *m, const struct kiln_tensor_desc *data,
			     int64_t decode, int fuse, struct plan_node *nodes)
{
	const struct kiln_host *h = kiln_host_table();
	kiln_status st;
	char d[200];
	if (kiln_tensor_size(data, NULL, NULL))
		return kiln_error(KILN_ECONFIG, "the data batch %s is larger than %llu bytes (its size overflows): make the batch smaller",
				  kiln_tensor_desc_str(data, d, sizeof d),
				  (unsigned long long)KILN_TENSOR_MAX_BYTES);
	int stem_pool = -1; /* the maxpool writing NCHW from NHWC (mixed_stem) */
	for (int i = 0; i < m->n_layers; i++) {
		struct model_layer *L = &m->layers[i];
		struct plan_node *n = &nodes[i];
		const struct kiln_layer_ops *ops = L->type->ops;
		n->ops = ops;
		n->l.name = L->name;
		n->l.type = L->type->name;
		n->l.trainable = L->trainable;
		n->l.n_in = L->n_in;
		n->l.index = i;
		n->l.seed = m->seed;
		n->l.before_norm = only_consumer_is(m, i, "batchnorm");
		/* read by loss layers only: the scaler's scale or the
		 * pipeline's mean (kiln_layer_run.loss_scale, plan_run.c) */
		n->l.loss_scaled = m->scaler_d != NULL || m->seed_d != NULL;
		n->l.sync_ranks = m->group_ranks;       /* read by batchnorm only */
		n->l.compute_dtype = m->cdtype;         /* read by linear only */
		n->l.decode_len = decode;
		/* an activation fused into the layer before it (a view: its
		 * act_fused set by that layer, below) applies nothing itself,
		 * so it passes no fusion on: the activation after it runs */
		n->l.fuse_act = n->l.act_fused ? 0 : fusable_act(m, i, fuse);
		if (L->n_in < ops->min_inputs || L->n_in > ops->max_inputs)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' (%s) takes %d..%d inputs, got %d",
					  kiln_config_where(m->cfg, L->section, "type"), L->name,
					  L->type->name, ops->min_inputs, ops->max_inputs, L->n_in);
		for (int k = 0; k < L->n_in; k++) {
			int j = L->in[k];
			if (j >= 0 && nodes[j].l.is_loss)
				return kiln_error(KILN_ECONFIG, "%s: layer '%s' reads the loss layer '%s'",
						  kiln_config_where(m->cfg, L->section, "type"), L->name,
						  nodes[j].l.name);
			if (j < 0) {
				n->l.in[k] = *data;
			} else {
				n->l.in[k] = nodes[j].l.out;
			}
		}
		char note[300];
		if (ops->configure &&
		    (st = ops->configure(h, &n->l, m->cfg, L->section)))
			return kiln_error_wrap(st, "layer '%s'%s", L->name,
					       kiln_config_unset_note(m->cfg, L->section, note, sizeof note));
		int k = -1;
		inferring = &n->l;
		inferring_layout = i == stem_pool ? KILN_NCHW
				   : stem_pool < 0 && (k = mixed_stem(m, n, i)) >= 0 ? KILN_NHWC
										       : -1;
		st = ops->infer(h, &n->l);
		inferring = NULL;
		if (st)
			return infer_failed(st, L->name, L->type->name);
		if (k >= 0 && n->l.out.layout == KILN_NHWC)
			stem_pool = k; /* (logged by the plan the device takes: plan.c) */
		if (n->l.fuse_act && n->l.act_fused) /* the activation is now a view */
			nodes[kiln_model_only_consumer(m, i)].l.act_fused = 1;
		if ((st = check_sizes(m, i, &n->l)) || (st = check_token_input(m, i, &n->l)) ||
		    (st = check_loss_seed(m, i, &n->l)))
			return st;
	}
	return KILN_OK;
}
