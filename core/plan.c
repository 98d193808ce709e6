/* core/plan.c - make a plan for one batch size and mode: infer every
 * layer's shapes, prepare its device ops and the input conversion, decide
 * which outputs need a gradient and how many recompute segments to use,
 * then allocate the arena (its layout: core/plan_memory.c); query and free
 * plans.
 */
#include "graph.h"

/* The plan's recomputation, and with pipeline stages each stage's share
 * (a stage recomputes only its own layers' outputs: plan_schedule). */
static void log_recompute(const struct kiln_plan *p, int S)
{
	const struct kiln_model *m = p->m;
	char per[160] = "";
	size_t k = 0;
	for (int s = 0; p->staged && s < m->n_stages && k + 16 < sizeof per; s++) {
		int c = 0;
		for (int i = 0; i < m->n_layers; i++)
			c += m->stage[i] == s && p->nodes[i].trig >= 0;
		k += (size_t)snprintf(per + k, sizeof per - k, "%s%d", s ? ", " : " (by stage: ", c);
	}
	if (k && k + 2 < sizeof per)
		strcat(per, ")");
	kiln_log(KILN_LOG_INFO, "core",
		 "recompute: %d segments, %d layers' outputs recomputed in the backward%s; activations %.2f MiB",
		 S, p->n_recomputed, per, (double)p->arena_bytes / 1048576.0);
}

/* Why layer i's `[layer.X] recompute = 1` recomputes nothing in training
 * plan p, into why[n]. */
static void recompute_why_not(const struct kiln_plan *p, int i, char *why, size_t n)
{
	const struct kiln_model *m = p->m;
	const struct plan_node *N = p->nodes;
	const int r = kiln_plan_root_y(N, m, i);
	int later = -1;
	for (int j = i + 1; p->staged && j < m->n_layers; j++)
		for (int k = 0; k < m->layers[j].n_in; k++)
			if (kiln_plan_root_y(N, m, m->layers[j].in[k]) == r && m->stage[j] != m->stage[i])
				later = m->stage[j];
	if (N[i].l.is_loss)
		snprintf(why, n, "a loss layer stores no output");
	else if (N[i].l.is_view && r < 0)
		snprintf(why, n, "its output is a view of the data input, which is kept");
	else if (N[i].l.is_view)
		snprintf(why, n, "its output is a view of layer '%s''s bytes: set recompute there",
			 m->layers[r].name);
	else if (later >= 0)
		snprintf(why, n, "its output is read on pipeline stage %d, which it is sent to, so it is kept (a stage recomputes what its own layers read)",
			 later);
	else
		snprintf(why, n, "no backward reads its output and its forward keeps nothing for its backward, so the output is freed after its last forward reader already");
}

/* `[layer.X] recompute = 1` that a training plan recomputes nothing of,
 * said once a model (before session 41 silently). */
static void say_recompute_unused(const struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	char why[256];
	if (!p->training || m->recompute_said)
		return;
	m->recompute_said = 1;
	for (int i = 0; i < m->n_layers; i++) {
		int own = 0;
		kiln_config_get_bool(m->cfg, m->layers[i].section, "recompute", &own);
		if (!own || p->nodes[i].trig >= 0)
			continue;
		recompute_why_not(p, i, why, sizeof why);
		kiln_log(KILN_LOG_WARN, "core", "%s: [%s] recompute = 1 recomputes nothing: %s",
			 kiln_config_where(m->cfg, m->layers[i].section, "recompute"),
			 m->layers[i].section, why);
	}
}

/* [train] recompute: "none" (0 segments), "auto" (-1: the planner
 * searches) or a segment count. */
static kiln_status recompute_segments(const struct kiln_model *m, int *segs)
{
	const char *v = kiln_config_get(m->cfg, "train", "recompute");
	*segs = 0;
	if (!v || !*v || !strcmp(v, "none"))
		return KILN_OK;
	if (!strcmp(v, "auto")) {
		*segs = -1; /* searched by the planner */
		return KILN_OK;
	}
	char *end;
	long n = strtol(v, &end, 10);
	if (end == v || *end || n < 1 || n > KILN_MAX_LAYERS)
		return kiln_error(KILN_ECONFIG,
				  "%s: [train] recompute = '%s': expected none, auto or a segment count 1..%d",
				  kiln_config_where(m->cfg, "train", "recompute"), v, KILN_MAX_LAYERS);
	*segs = (int)n;
	return KILN_OK;
}

kiln_status kiln_model_plan(struct kiln_model *m, int64_t batch, int training,
			    struct kiln_plan **out)
{
	struct kiln_plan_opts o = { .training = training };
	return kiln_model_plan_ex(m, batch, &o, out);
}

/* The layer plan_layers is preparing, and which of its inputs no
 * backward of the plan asks the gradient of (kiln_layer_dx_unused). */
static _Thread_local const struct kiln_layer *planning;
static _Thread_local int planning_dx_unused;

int kiln_layer_dx_unused(const struct kiln_layer *l)
{
	return l && l == planning ? planning_dx_unused : 0;
}

/* ... and which of its inputs' gradients it may add into
 * (kiln_layer_dx_shared) */
static _Thread_local int planning_dx_shared;

int kiln_layer_dx_shared(const struct kiln_layer *l)
{
	return l && l == planning ? planning_dx_shared : -1;
}

/* The fold of a fused ReLU's backward into the max pooling after it
 * (kiln_layer_relu_fold), for the layer being planned. */
static _Thread_local int planning_relu_fold;

int kiln_layer_relu_fold(const struct kiln_layer *l)
{
	return l && l == planning ? planning_relu_fold : 0;
}

/* whether the plan being prepared trains (kiln_layer_training) */
static _Thread_local int planning_training;

int kiln_layer_training(const struct kiln_layer *l)
{
	return l && l == planning ? planning_training : 0;
}

/* Layer i's part in a ReLU fold: 1 when i is a built-in conv with its
 * ReLU fused (the relu layer a view) whose output the relu view alone
 * passes to a maxpool alone; 2 when i is that maxpool; else 0.  f32
 * or bf16 activations, one pipeline stage.  Then dx = pool_bwd(dy) * (y > 0)
 * equals pool_bwd(dy * (ypool > 0)): every element the pooling's backward
 * gives a gradient to holds its window's maximum, so its mask is the
 * pooled output's, and the mask runs on a quarter of the elements (2x2);
 * on a device that keeps it in the pooling's aux (POOL with KILN_OPF_ACT,
 * ABI 2.16: the CPU's 2x2 kernel) it runs in no pass of its own
 * (core/layers/pool.c). */
static int relu_fold(const struct kiln_plan *p, int i)
{
	const struct kiln_model *m = p->m;
	const struct plan_node *N = p->nodes;
	const char *type = m->layers[i].type->name;
	int conv = i;
	if (!strcmp(type, "maxpool")) {
		const int j = m->layers[i].n_in == 1 ? m->layers[i].in[0] : -1;
		if (j < 0 || !N[j].l.is_view || !N[j].l.act_fused || m->layers[j].n_in != 1 ||
		    kiln_model_only_consumer(m, j) != i)
			return 0;
		conv = m->layers[j].in[0];
		if (conv < 0)
			return 0;
	} else if (strcmp(type, "conv")) {
		return 0;
	}
	const struct kiln_layer *c = &N[conv].l;
	if (strcmp(m->layers[conv].type->name, "conv") || !c->act_fused ||
	    c->fuse_act != 1 + KILN_ACT_RELU || (c->out.dtype != KILN_F32 && c->out.dtype != KILN_BF16))
		return 0;
	const int j = kiln_model_only_consumer(m, conv);
	const int k = j < 0 ? -1 : kiln_model_only_consumer(m, j);
	if (k < 0 || strcmp(m->layers[k].type->name, "maxpool") || m->layers[k].n_in != 1 ||
	    (m->stage && m->stage[k] != m->stage[conv]))
		return 0;
	return i == conv ? 1 : i == k ? 2 : 0;
}

/* Whether a layer of the plan writes another layout than it reads
 * (core/graph_infer.c mixed_stem: a maxpool NHWC -> NCHW). */
static int has_mixed_stem(const struct kiln_plan *p)
{
	for (int i = 0; i < p->m->n_layers; i++)
		if (p->nodes[i].l.n_in == 1 && p->nodes[i].l.out.ndim == 4 &&
		    p->nodes[i].l.in[0].layout != p->nodes[i].l.out.layout)
			return 1;
	return 0;
}

/* Whether layer i of p's model is an NCHW conv of one input channel whose
 * ReLU a maxpool alone reads: the shape core/graph_infer.c mixed_stem runs
 * NHWC when fused (its weight gradient summed in another order), whatever
 * its dtype and whether p fused it.  None across stages (mixed_stem). */
static int stem_shape(const struct kiln_plan *p, int i)
{
	const struct kiln_model *m = p->m;
	const struct kiln_tensor_desc *x = &p->nodes[i].l.in[0];
	if (m->stage || strcmp(m->layers[i].type->name, "conv") || m->layers[i].n_in != 1 ||
	    x->ndim != 4 || x->dims[1] != 1 || x->layout != KILN_NCHW)
		return 0;
	const int j = kiln_model_only_consumer(m, i);
	const int k = j < 0 ? -1 : kiln_model_only_consumer(m, j);
	return k >= 0 && !strcmp(m->layers[j].type->name, "relu") && m->layers[j].n_in == 1 &&
	       !strcmp(m->layers[k].type->name, "maxpool") && m->layers[k].n_in == 1;
}

static int builtin_layer(const struct kiln_plugin *type)
{
	for (int i = 0; kiln_builtin_layers[i]; i++)
		if (kiln_builtin_layers[i] == type)
			return 1;
	return 0;
}

const char *kiln_plan_fuse_differs(const struct kiln_plan *p, int eval, char *buf, size_t n)
{
	const struct kiln_model *m = p->m;
	for (int i = 0; i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i];
		/* what [run] fuse = 1 offers layer i in a training plan and,
		 * where the run evaluates, in an evaluation plan */
		const int act = kiln_model_act_after(m, i, eval ? KILN_FUSE_ALL : KILN_FUSE_RELU);
		if (stem_shape(p, i)) {
			snprintf(buf, n, "in this model a conv of one input channel whose ReLU a maxpool reads runs NHWC when fused, its weight gradient summed in another order");
			return buf;
		}
		if (act && !builtin_layer(L->type)) {
			snprintf(buf, n, "layer '%s' is a plugin's (type %s), whose fused %s kiln has not checked against the unfused op",
				 L->name, L->type->name, act == 1 + KILN_ACT_RELU ? "ReLU" : "GELU");
			return buf;
		}
		/* oneDNN's GELU epilogue (its own erf and tanh) against kiln's
		 * ACT op after the rounded output: other bits in f32 and bf16
		 * alike (session 35: the logits of a conv -> gelu and of a
		 * linear -> gelu model differed; ReLU's were the same bytes) */
		if (act > 1 + KILN_ACT_RELU && (!strcmp(L->type->name, "linear") || !strcmp(L->type->name, "conv"))) {
			snprintf(buf, n, "layer '%s' (%s) fuses its GELU in the evaluations, which then round otherwise than unfused (keep_best, early stopping and the logged losses read them)",
				 L->name, L->type->name);
			return buf;
		}
	}
	return NULL;
}

/* The mixed stem a plan runs, at debug level: said once the device took
 * the plan, not while inferring (kiln_model_create infers in f32 whatever
 * the compute dtype, and a bf16 input is no mixed stem's; a plan the
 * device refuses is made again without it), so the log says what runs. */
static void log_mixed_stem(const struct kiln_plan *p)
{
	for (int i = 0; i < p->m->n_layers; i++) {
		const struct kiln_layer *l = &p->nodes[i].l;
		if (strcmp(p->m->layers[i].type->name, "conv") || l->n_in != 1 || l->out.ndim != 4 ||
		    l->out.layout != KILN_NHWC || l->in[0].layout == KILN_NHWC)
			continue;
		const int j = kiln_model_only_consumer(p->m, i);
		const int k = j < 0 ? -1 : kiln_model_only_consumer(p->m, j);
		kiln_log(KILN_LOG_DEBUG, "core", "layer '%s': output NHWC for '%s', which writes NCHW",
			 l->name, k < 0 ? "?" : p->m->layers[k].name);
	}
}

/* Whether layer i's backward is given input k's gradient (r->dx[k]), as
 * plan_memory.c's plan_gradients decides it: no gradient in an evaluation
 * plan, for the data without input_grad, for a layer's output that wants
 * none (wants_grad) or a loss's; a view has no backward of its own. */
static int grad_on(const struct kiln_plan *p, const int *wants_grad, int i, int k)
{
	const int src = p->m->layers[i].in[k];
	return p->training && !p->nodes[i].l.is_view &&
	       (src < 0 ? p->input_grad : wants_grad[src] && !p->nodes[src].l.is_loss);
}

/* Bit k set: layer i's backward is never given input k's gradient
 * (r->dx[k] NULL). */
static int dx_unused(const struct kiln_plan *p, const int *wants_grad, int i)
{
	int bits = 0;
	for (int k = 0; k < p->m->layers[i].n_in; k++)
		bits |= !grad_on(p, wants_grad, i, k) << k;
	return bits;
}

/* writers[r + 1]: how many backward inputs are given the gradient of
 * storage root r (-1 the data input; through views), counted once a plan */
static int *count_writers(const struct kiln_plan *p, const int *wants_grad)
{
	const struct kiln_model *m = p->m;
	int *writers = calloc((size_t)m->n_layers + 1, sizeof *writers);
	if (!writers)
		return NULL;
	for (int j = 0; j < m->n_layers; j++)
		for (int q = 0; q < m->layers[j].n_in; q++)
			if (grad_on(p, wants_grad, j, q))
				writers[kiln_plan_root_y(p->nodes, m, m->layers[j].in[q]) + 1]++;
	return writers;
}

/* Bit k set: input k's gradient has another writer (another input of a
 * backward whose source is the same storage, through views too), so
 * layer i's backward may add into it (r->dx_accum[k], plan_gradients: the
 * first writer writes, later ones add); clear, it always writes it. */
static int dx_shared(const struct kiln_plan *p, const int *wants_grad, const int *writers, int i)
{
	const struct kiln_model *m = p->m;
	int bits = 0;
	for (int k = 0; k < m->layers[i].n_in; k++)
		if (grad_on(p, wants_grad, i, k))
			bits |= (writers[kiln_plan_root_y(p->nodes, m, m->layers[i].in[k]) + 1] > 1) << k;
	return bits;
}

/* A decode plan of several positions a run (ABI 2.31): every layer that
 * keeps decoding state (saved memory) or is not built in must have set
 * kiln_layer.decode_runs in its plan (one built before 2.31, or rebuilt
 * unchanged, reads the first position alone): KILN_ENOTSUP naming the
 * first that did not (the prompt is then fed a position a step). */
static kiln_status decode_runs_agreed(const struct kiln_plan *p)
{
	const struct kiln_model *m = p->m;
	for (int i = 0; p->decode && p->data_desc.dims[1] > 1 && i < p->runs; i++)
		if (!p->nodes[i].l.decode_runs &&
		    (p->nodes[i].l.saved_bytes || !builtin_layer(m->layers[i].type)))
			return kiln_error(KILN_ENOTSUP, "layer '%s' (%s) does not take several positions a run (kiln_layer.decode_runs, ABI 2.31): the prompt is fed a position a step",
					  m->layers[i].name, m->layers[i].type->name);
	return KILN_OK;
}

/* A prefill plan of its state alone (state_only: kiln_model_plan_prefill,
 * logits 0): p->runs, the layers up to the last that keeps state (saved
 * memory), the only ones kiln_plan_decode_state runs; the workspace the
 * largest of theirs (the lm_head's of T rows is not needed).  Otherwise
 * every layer runs. */
static void plan_state_cut(struct kiln_plan *p, int state_only)
{
	const struct plan_node *N = p->nodes;
	p->runs = p->m->n_layers;
	if (!state_only || !p->decode || p->staged)
		return;
	p->runs = 0;
	p->ws_bytes = 0;
	for (int i = 0; i < p->m->n_layers; i++)
		if (N[i].l.saved_bytes)
			p->runs = i + 1;
	for (int i = 0; i < p->runs; i++)
		if (N[i].ws > p->ws_bytes)
			p->ws_bytes = N[i].ws;
}

/* Prepare every layer's device ops (sets saved_bytes); one shared
 * workspace.  A built-in layer skips the ops of input gradients no
 * backward asks for (kiln_layer_dx_unused). */
static kiln_status plan_layers(struct kiln_plan *p, const int *wants_grad)
{
	struct kiln_model *m = p->m;
	struct plan_node *N = p->nodes;
	kiln_status st = KILN_OK;
	int *writers = count_writers(p, wants_grad);
	if (!writers)
		return kiln_error(KILN_ENOMEM, "planner: %d layers' gradient writers", m->n_layers);
	for (int i = 0; i < m->n_layers && !st; i++) {
		size_t ws = 0;
		N[i].l.saved_bytes = 0;
		N[i].l.decode_runs = 0;
		if (N[i].ops->plan) {
			N[i].planned = 1;
			planning = &N[i].l;
			planning_dx_unused = dx_unused(p, wants_grad, i);
			planning_dx_shared = dx_shared(p, wants_grad, writers, i);
			planning_relu_fold = relu_fold(p, i);
			planning_training = p->training;
			st = N[i].ops->plan(kiln_host_table(), &N[i].l, kiln_plan_dev(p, i), &ws);
			planning = NULL;
			if (st) {
				char d[96];
				st = kiln_error_wrap(st, "layer '%s' (%s), input %s", m->layers[i].name,
						     m->layers[i].type->name,
						     kiln_tensor_desc_str(&N[i].l.in[0], d, sizeof d));
				break;
			}
		}
		N[i].ws = ws;
		if (ws > p->ws_bytes)
			p->ws_bytes = ws;
	}
	free(writers);
	return st;
}

/* NHWC with several input channels: the data arrives as NCHW and is
 * reordered into the arena before the first layer; low-precision
 * compute: converted into the arena (both at once when both). */
static kiln_status plan_input(struct kiln_plan *p)
{
	struct kiln_model *m = p->m;
	struct kiln_tensor_desc raw = p->data_desc;
	raw.dtype = m->sample.dtype;
	const int reorder = p->data_desc.layout == KILN_NHWC && p->data_desc.dims[1] > 1;
	if (!reorder && raw.dtype == p->data_desc.dtype)
		return KILN_OK;
	struct kiln_op op;
	kiln_status st;
	memset(&op, 0, sizeof op);
	op.type = reorder ? KILN_OP_REORDER : KILN_OP_CAST;
	op.n_in = op.n_out = 1;
	op.in[0] = raw;
	op.out[0] = p->data_desc;
	if (reorder)
		op.in[0].layout = KILN_NCHW;
	size_t rws = 0;
	if ((st = kiln_device_prepare(kiln_plan_dev(p, -1), &op, reorder ? &p->in_reorder : &p->in_cast, &rws)))
		return st;
	if (rws > p->ws_bytes)
		p->ws_bytes = rws;
	p->data_store = p->n_store;
	return kiln_plan_new_store(p, kiln_tensor_bytes(&p->data_desc), 0, 0);
}

/* A decode plan (opts.decode = Tmax positions): the data input is
 * `positions` tokens per row, [batch, positions] i32 (1: a step; more: a
 * prompt's prefill, kiln_model_plan_prefill), of a model on token
 * sequences; the loss layer's input is the output (the logits).  Several
 * positions need the layers' consent (decode_runs_agreed). */
static kiln_status decode_input(struct kiln_plan *p, int64_t tmax, int64_t positions)
{
	struct kiln_model *m = p->m;
	if (m->sample.dtype != KILN_I32 || m->sample.ndim != 1)
		return kiln_error(KILN_ECONFIG, "a decode plan (generation) needs a model on token sequences (samples i32[T]), not %s samples",
				  kiln_dtype_name(m->sample.dtype));
	if (positions < 1 || positions > tmax)
		return kiln_error(KILN_EINTERNAL, "a decode plan of %lld positions a run, of %lld in all",
				  (long long)positions, (long long)tmax);
	p->decode = tmax;
	p->data_desc.dims[1] = positions;
	return KILN_OK;
}

/* A plan whose output is the logits (decode and inference plans): the
 * loss layer's input, kept after the run; the loss layer does not run. */
static kiln_status logits_output(struct kiln_plan *p, const char *what)
{
	const struct kiln_model *m = p->m;
	if (m->loss_layer < 0 || m->layers[m->loss_layer].in[0] < 0)
		return kiln_error(KILN_ECONFIG, "%s needs a loss layer whose input is the logits", what);
	p->logits_layer = m->layers[m->loss_layer].in[0];
	return KILN_OK;
}

/* What [run] fuse may join in a plan: nothing where every layer's own
 * output is to be read (keep_all), ReLU where there is a backward, else
 * GELU too. */
static int fuse_mode(const struct kiln_plan_opts *o)
{
	return o->keep_all ? KILN_FUSE_NONE : o->training ? KILN_FUSE_RELU : KILN_FUSE_ALL;
}

/* kiln_model_plan_ex, a decode plan's runs `positions` tokens a row
 * (1 but for kiln_model_plan_prefill; state_only: its plan of the
 * caches' state alone, plan_state_cut). */
static kiln_status plan_make(struct kiln_model *m, int64_t batch, const struct kiln_plan_opts *opts,
			     int64_t positions, int state_only, struct kiln_plan **out)
{
	kiln_status st;
	int n = m->n_layers;
	const int training = opts->training;
	*out = NULL;
	struct kiln_plan *p = calloc(1, sizeof *p);
	if (!p)
		return kiln_error(KILN_ENOMEM, "out of memory");
	p->m = m;
	p->batch = batch;
	p->training = training;
	p->input_grad = training && opts->input_grad;
	p->keep_all = opts->keep_all;
	p->data_gstore = -2;
	p->data_store = -1;
	p->staged = m->stage && m->plan_staged;
	p->wkeep = p->staged && training && m->plan_wkeep;
	p->seed_d = m->seed_d;
	p->nodes = calloc((size_t)n, sizeof *p->nodes);
	int *wants_grad = calloc((size_t)n, sizeof(int));
	if (!p->nodes || !wants_grad) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto fail;
	}
	kiln_model_data_desc(m, batch, &p->data_desc);
	if (opts->decode < 0 || (training && opts->decode)) {
		st = kiln_error(KILN_EINVAL, "kiln_plan_opts.decode = %lld: a count of positions, for plans that do not train",
				(long long)opts->decode);
		goto fail;
	}
	if (training && m->weights_only) {
		st = kiln_error(KILN_EINTERNAL, "a training plan of a model made for inference (kiln_model_create_infer: no gradients)");
		goto fail;
	}
	if (training && opts->logits) {
		st = kiln_error(KILN_EINVAL, "kiln_plan_opts.logits: an inference plan does not train");
		goto fail;
	}
	if (opts->decode > 0 && ((st = decode_input(p, opts->decode, positions)) ||
				 (st = logits_output(p, "a decode plan (generation)"))))
		goto fail;
	p->logits = opts->logits;
	if (opts->logits && (st = logits_output(p, "an inference plan")))
		goto fail;
	if (opts->frozen && !opts->logits) {
		st = kiln_error(KILN_EINVAL, "kiln_plan_opts.frozen: for inference plans (.logits) only");
		goto fail;
	}
	if ((st = kiln_model_infer(m, &p->data_desc, p->decode, fuse_mode(opts), p->nodes)))
		goto fail;
	struct plan_node *N = p->nodes;
	/* frozen weights (ABI 2.15): only where the device can be told of new
	 * ones (kiln_plan_frozen_sync) */
	p->frozen = opts->frozen && !p->staged &&
		    kiln_device_takes_frozen(m->dev);
	p->wgen = m->wgen - 1; /* its first run asks (kiln_plan_frozen_sync) */
	for (int i = 0; i < n; i++) {
		N[i].l.frozen = p->frozen;
		/* the trainer's evaluations: sums and the rows counted */
		N[i].l.eval_sums = !training && !p->logits && !p->decode && m->eval_counted;
		N[i].l.eval_counted = 0; /* the loss layer's plan sets it */
	}
	for (int i = 0; i < n; i++)
		if (N[i].l.n_params != m->layers[i].n_params) {
			st = kiln_error(KILN_EINTERNAL, "layer '%s' changed its parameters with the batch size",
					m->layers[i].name);
			goto fail;
		}

	/* which outputs need a gradient: those upstream of trainable params,
	 * and everything when the data's gradient is asked for (before the
	 * layers are prepared: what no backward needs is not prepared) */
	for (int i = 0; i < n; i++) {
		int w = (m->layers[i].trainable && m->layers[i].n_params > 0) || p->input_grad;
		for (int k = 0; k < m->layers[i].n_in; k++)
			if (m->layers[i].in[k] >= 0 && wants_grad[m->layers[i].in[k]])
				w = 1;
		wants_grad[i] = w;
	}
	if (!(st = plan_layers(p, wants_grad)))
		plan_state_cut(p, state_only);
	if (st || (st = decode_runs_agreed(p)) || (st = plan_input(p))) {
		if (st == KILN_ENOTSUP && has_mixed_stem(p)) { /* today's layouts, then */
			free(wants_grad);
			kiln_plan_free(p);
			kiln_log(KILN_LOG_DEBUG, "core", "the device refused a max pooling from NHWC to NCHW: planned again in the model's layout");
			kiln_model_mixed_stem(0);
			st = plan_make(m, batch, opts, positions, state_only, out);
			kiln_model_mixed_stem(1);
			return st;
		}
		goto fail;
	}

	/* gradient checkpointing: `auto` tries every segment count and keeps
	 * the smallest arena (the fewest segments among equals) */
	int S = 0, base = p->n_store;
	if (training && (st = recompute_segments(m, &S)))
		goto fail;
	if (S < 0) {
		size_t best = (size_t)-1;
		int best_s = 0;
		for (int t = 0; t <= n; t += t ? 1 : 2) {
			if ((st = kiln_plan_memory(p, t, wants_grad, base)))
				goto fail;
			if (p->arena_bytes < best)
				best = p->arena_bytes, best_s = t;
		}
		S = best_s;
	}
	if ((st = kiln_plan_memory(p, S, wants_grad, base)))
		goto fail;
	if (p->n_recomputed)
		log_recompute(p, S);
	say_recompute_unused(p);
	if (S > n) /* segments of a layer or less: none holds an output and a reader */
		kiln_log(KILN_LOG_INFO, "core",
			 "%s: [train] recompute = %d is more segments than the model's %d layers can use (an output is recomputed only when the layers that read it share its segment): %d layers' outputs recomputed; recompute = auto picks the count that needs the least memory",
			 kiln_config_where(m->cfg, "train", "recompute"), S, n, p->n_recomputed);
	/* what did not fit, named (it was "cpu: alloc of 5885057024 bytes
	 * failed" alone) */
	if (!opts->dry && (st = kiln_device_alloc(m->dev, p->arena_bytes, &p->arena))) {
		kiln_error_wrap(st, "the %s plan's activations at batch %lld (%.2f GiB; `kiln memory` gives the run's whole need)",
				training ? "training" : opts->decode ? "decode" : "evaluation", (long long)batch,
				(double)p->arena_bytes / (1 << 30));
		goto fail;
	}
	if (!opts->dry && (st = kiln_device_alloc(m->dev, kiln_align_up(p->ws_bytes), &p->ws))) {
		kiln_error_wrap(st, "the %s plan's workspace at batch %lld (%.2f GiB; `kiln memory` gives the run's whole need)",
				training ? "training" : opts->decode ? "decode" : "evaluation", (long long)batch,
				(double)p->ws_bytes / (1 << 30));
		goto fail;
	}
	free(wants_grad);
	log_mixed_stem(p);
	*out = p;
	return KILN_OK;
fail:
	free(wants_grad);
	kiln_plan_free(p);
	return st;
}

kiln_status kiln_model_plan_ex(struct kiln_model *m, int64_t batch,
			       const struct kiln_plan_opts *opts, struct kiln_plan **out)
{
	return plan_make(m, batch, opts, 1, 0, out);
}

kiln_status kiln_model_plan_prefill(struct kiln_model *m, int64_t decode, int64_t positions,
				    int logits, struct kiln_plan **out)
{
	const struct kiln_plan_opts o = { .decode = decode };
	*out = NULL;
	if (decode < 1)
		return kiln_error(KILN_EINVAL, "kiln_model_plan_prefill: decode = %lld positions", (long long)decode);
	return plan_make(m, 1, &o, positions, !logits, out);
}

kiln_status kiln_plan_tensor(const struct kiln_plan *p, const char *layer, const char *which,
			     void **ptr, struct kiln_tensor_desc *desc)
{
	int store = -2;
	if (!layer) {
		if (strcmp(which, "dx"))
			return kiln_error(KILN_ENOTFOUND, "the data input has only 'dx'");
		store = p->data_gstore;
		*desc = p->data_desc;
	} else {
		int i = kiln_model_find_layer(p->m, p->m->n_layers, layer);
		if (i < 0)
			return kiln_error(KILN_ENOTFOUND, "no layer '%s'", layer);
		store = !strcmp(which, "y") ? p->nodes[i].ystore : !strcmp(which, "dy") ? p->nodes[i].gstore : -2;
		*desc = p->nodes[i].l.out;
	}
	if (store < 0)
		return kiln_error(KILN_ENOTFOUND, "plan keeps no '%s' for %s%s", which,
				  layer ? "layer " : "the data input", layer ? layer : "");
	*ptr = kiln_plan_store_ptr(p, store, NULL);
	return KILN_OK;
}

void kiln_plan_free(struct kiln_plan *p)
{
	if (!p)
		return;
	for (int i = 0; p->nodes && i < p->m->n_layers; i++)
		kiln_plan_node_free(&p->nodes[i], kiln_plan_dev(p, i));
	kiln_device_free(p->m->dev, p->arena);
	kiln_device_free(p->m->dev, p->ws);
	if (p->in_reorder)
		kiln_device_plan_free(kiln_plan_dev(p, -1), p->in_reorder);
	if (p->in_cast)
		kiln_device_plan_free(kiln_plan_dev(p, -1), p->in_cast);
	free(p->nodes);
	free(p->store);
	free(p->sched);
	free(p->xfer);
	free(p);
}

size_t kiln_plan_arena_bytes(const struct kiln_plan *p) { return p->arena_bytes; }
int kiln_plan_recomputed(const struct kiln_plan *p) { return p->n_recomputed; }

int kiln_plan_eval_counts(const struct kiln_plan *p)
{
	const struct kiln_layer *l = &p->nodes[p->m->loss_layer].l;
	return l->eval_sums && l->eval_counted;
}

size_t kiln_plan_naive_bytes(const struct kiln_plan *p)
{
	size_t t = 0;
	for (int i = 0; i < p->n_store; i++)
		t += kiln_align_up(p->store[i].bytes);
	return t;
}
