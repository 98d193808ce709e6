/* core/layers/rnn.c - recurrent layers: `lstm` and `gru`, one direction of
 * one layer of nn.LSTM / nn.GRU (batch_first, zero initial state).
 *
 * x: [B, T, I]; y: [B, T, H], every step's hidden state (PyTorch's
 * `output`), or with `last = 1` y: [B, H], each row's final hidden state
 * (PyTorch's h_n of this direction: the step at the row's length - 1, or
 * t = 0 for the reverse direction; KILN_OP_RNN's i[4]).  Parameters, PyTorch's names and gate order (LSTM
 * i, f, g, o; GRU r, z, n), all U(-1/sqrt(H), 1/sqrt(H)) as PyTorch draws
 * them: weight_ih_l{k} [G*H, I], weight_hh_l{k} [G*H, H], bias_ih_l{k},
 * bias_hh_l{k} [G*H], with the suffix `_reverse` for the direction that
 * reads the sequence backwards (k = the `index` key).
 *
 * A layer has at most KILN_LAYER_MAX_PARAMS (4) parameters (ABI), so
 * PyTorch's num_layers and bidirectional are built from these: a second
 * direction is a second layer with `reverse = 1` and a concat on the last
 * dimension, a second layer stacks on that (docs/rnn.md).
 *
 * Variable lengths: an optional second input, the token ids i32 [B, T] the
 * sequence came from, and `pad_id`: a row's length is the position of its
 * first pad id, and the row is run as pack_padded_sequence runs it (y = 0
 * at padded steps; the reverse direction starts at the row's last token).
 * KILN_OP_RNN / RNN_BWD do the work; the backward's bias gradient comes out
 * as one [2, G*H] block, copied into bias_ih and bias_hh.
 */
#include "util.h"

#include <stdio.h>
#include <string.h> /* strcmp */

struct rnn {
	struct layer_plans plans;
	int gru, reverse, ids, last;
	int64_t H, index, pad_id, G;
	char names[4][40];
	/* from the config, for infer's messages: where the section's type
	 * and pad_id are set (pad_at "" when pad_id is not), and the input
	 * key's value ("" when unset: the layer before) */
	char at[160], pad_at[160], input[160];
	size_t aux, x_bytes, w_bytes, db_bytes; /* scratch pieces, 64-aligned */
	void *fwd, *infer; /* the forward in training (saves the aux) and in evaluation */
	void *bwd[2][2]; /* [dw accumulate][dx accumulate] */
	void *copy[2];   /* bias gradient into its parameter: [dw accumulate] */
};

static const struct kiln_key rnn_keys[] = {
	{ "hidden", KILN_KEY_INT, NULL, 1, 1e9, NULL, "Hidden size H (required): y is [B, T, H]." },
	{ "reverse", KILN_KEY_BOOL, "0", 0, 0, NULL,
	  "Read the sequence backwards (the second direction of a bidirectional layer): parameter names end in `_reverse`." },
	{ "index", KILN_KEY_INT, "0", 0, 1e6, NULL,
	  "k of the parameter names `weight_ih_l{k}`...: which layer of a PyTorch stack this is." },
	{ "pad_id", KILN_KEY_INT, "0", -2147483648.0, 2147483647.0, NULL,
	  "With a second input (token ids i32 [B, T]): a row ends at its first `pad_id`; later steps are not run and give 0. Set on a layer of one input: a config error (exit 2) naming it (before session 38 it was ignored, nothing masked)." },
	{ "last", KILN_KEY_BOOL, "0", 0, 0, NULL,
	  "Output each row's final hidden state [B, H] (PyTorch's h_n of this direction: the step at the row's length - 1, t = 0 with `reverse = 1`) instead of every step's [B, T, H]; the gradient flows into that step only (docs/rnn.md, \"The final hidden state\")." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status rnn_configure(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *sec, int gru)
{
	struct rnn *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->gru = gru;
	s->G = gru ? 3 : 4;
	if (h->config_get_int(cfg, sec, "hidden", &s->H))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'hidden'",
				h->config_where(cfg, sec, NULL), sec);
	kiln_status st = h->config_get_bool(cfg, sec, "reverse", &s->reverse);
	if (!st || st == KILN_ENOTFOUND)
		st = h->config_get_int(cfg, sec, "index", &s->index);
	if (!st || st == KILN_ENOTFOUND)
		st = h->config_get_int(cfg, sec, "pad_id", &s->pad_id);
	if (!st || st == KILN_ENOTFOUND)
		st = h->config_get_bool(cfg, sec, "last", &s->last);
	snprintf(s->at, sizeof s->at, "%s", h->config_where(cfg, sec, "type"));
	const char *pad_at = h->config_where(cfg, sec, "pad_id");
	snprintf(s->pad_at, sizeof s->pad_at, "%s", strcmp(pad_at, "default") ? pad_at : "");
	const char *in = h->config_get(cfg, sec, "input");
	if (!in)
		in = h->config_get(cfg, sec, "inputs");
	snprintf(s->input, sizeof s->input, "%s", in ? in : "");
	return st && st != KILN_ENOTFOUND ? st : KILN_OK;
}

static kiln_status lstm_configure(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_config *cfg, const char *sec)
{
	return rnn_configure(h, l, cfg, sec, 0);
}

static kiln_status gru_configure(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *sec)
{
	return rnn_configure(h, l, cfg, sec, 1);
}

static kiln_status rnn_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct rnn *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0], *ids = &l->in[1];
	char d[96];
	if (x->ndim != 3 || x->dtype != KILN_F32)
		return h->error(KILN_ECONFIG, "%s: layer '%s' (%s) needs f32 [batch, time, channels], got %s%s",
				s->at, l->name, l->type, kiln_tensor_desc_str(x, d, sizeof d),
				x->ndim == 3 && (x->dtype == KILN_BF16 || x->dtype == KILN_F16)
					? " (lstm and gru compute in f32 only: [run] precision = fp32)" : "");
	s->ids = l->n_in == 2;
	/* pad_id without the ids would be read and never used: the
	 * sequences would run to T unmasked, silently */
	if (!s->ids && s->pad_at[0])
		return h->error(KILN_ECONFIG, "%s: layer '%s' (%s): pad_id needs the token ids as a second input (inputs = %s, data); with one input nothing is masked",
				s->pad_at, l->name, l->type,
				s->input[0] ? s->input : "<the layer before it>");
	/* (the sample's shape: the batch of the plan being built is not
	 * the run's; kiln_model_infer builds at batch 1 first) */
	if (s->ids && (ids->dtype != KILN_I32 || kiln_tensor_numel(ids) != x->dims[0] * x->dims[1])) {
		struct kiln_tensor_desc one = *ids;
		const int strip = one.ndim > 1 && one.dims[0] == x->dims[0];
		if (strip) {
			one.ndim--;
			memmove(one.dims, one.dims + 1, (size_t)one.ndim * sizeof one.dims[0]);
		}
		return h->error(KILN_ECONFIG, "%s: layer '%s' (%s): its second input must be the token ids of the sequence, i32[%lld] a sample (i32 [time]), got %s%s",
				s->at, l->name, l->type, (long long)x->dims[1],
				kiln_tensor_desc_str(&one, d, sizeof d), strip ? " a sample" : "");
	}
	if (l->decode_len > 0)
		return h->error(KILN_ENOTSUP, "layer '%s' (%s): no step-by-step decoding yet",
				l->name, l->type);
	if (s->last)
		f32_desc(&l->out, x->dims[0], s->H, 0);
	else
		f32_desc(&l->out, x->dims[0], x->dims[1], s->H);
	const int64_t GH = s->G * s->H, I = x->dims[2];
	static const char *const base[] = { "weight_ih", "weight_hh", "bias_ih", "bias_hh" };
	l->n_params = 4;
	for (int k = 0; k < 4; k++) {
		snprintf(s->names[k], sizeof s->names[k], "%s_l%lld%s", base[k], (long long)s->index,
			 s->reverse ? "_reverse" : "");
		l->params[k] = (struct kiln_param_spec){ s->names[k], { 0 }, KILN_INIT_BIAS_UNIFORM,
							 s->H, 0 };
		f32_desc(&l->params[k].desc, GH, k == 0 ? I : k == 1 ? s->H : 0, 0);
	}
	l->needs_input = 1;
	return KILN_OK;
}

static kiln_status rnn_plan(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev, size_t *ws)
{
	struct rnn *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	op_init(&op, KILN_OP_RNN, s->ids ? 6 : 5, 2);
	op.in[0] = l->in[0];
	for (int k = 0; k < 4; k++)
		op.in[1 + k] = l->params[k].desc;
	op.in[5] = l->in[1];
	op.out[0] = l->out;
	f32_desc(&op.out[1], 1, 0, 0); /* the device says the bytes (aux_bytes) */
	op.out[1].dtype = KILN_U8;
	op.i[0] = s->gru, op.i[1] = s->reverse, op.i[2] = s->pad_id, op.i[4] = s->last;
	if ((st = prep(h, l, dev, &op, &s->fwd, &w)))
		return st;
	s->aux = ALIGN64(h->device_aux_bytes(dev, s->fwd));
	l->saved_bytes = s->aux;
	op.n_out = 1; /* evaluation: the device's inference form, nothing saved */
	if ((st = prep(h, l, dev, &op, &s->infer, &w)))
		return st;
	s->x_bytes = ALIGN64(kiln_tensor_bytes(&l->in[0]));
	s->w_bytes = ALIGN64(kiln_tensor_bytes(&l->params[0].desc)) +
		     ALIGN64(kiln_tensor_bytes(&l->params[1].desc));
	s->db_bytes = ALIGN64((size_t)(2 * s->G * s->H) * sizeof(float));
	if (!kiln_layer_training(l)) { /* an evaluation plan: no backward */
		*ws = s->x_bytes + s->w_bytes + s->db_bytes + w;
		return KILN_OK;
	}
	op_init(&op, KILN_OP_RNN_BWD, 5, 4);
	op.in[0] = l->in[0];
	op.in[1] = l->out;
	op.in[2] = l->params[0].desc, op.in[3] = l->params[1].desc;
	f32_desc(&op.in[4], 1, 0, 0);
	op.in[4].dtype = KILN_U8;
	op.out[0] = l->in[0];
	op.out[1] = l->params[0].desc, op.out[2] = l->params[1].desc;
	f32_desc(&op.out[3], 2, s->G * s->H, 0);
	op.i[0] = s->gru, op.i[1] = s->reverse, op.i[4] = s->last;
	for (int dw = 0; dw < 2; dw++) {
		op.i[3] = dw;
		if ((st = prep_pair(h, l, dev, &op, s->bwd[dw], &w)))
			return st;
	}
	op_init(&op, KILN_OP_SCALE, 1, 1);
	f32_desc(&op.in[0], s->G * s->H, 0, 0);
	op.out[0] = op.in[0];
	op.f[0] = 1.0;
	if ((st = prep_pair(h, l, dev, &op, s->copy, &w)))
		return st;
	/* scratch: the dx, dw, db nobody wants */
	*ws = s->x_bytes + s->w_bytes + s->db_bytes + w;
	return KILN_OK;
}

/* The ops' own workspace follows the scratch. */
static void rnn_ws(struct kiln_op_args *a, const struct rnn *s, const struct kiln_layer_run *r)
{
	const size_t off = s->x_bytes + s->w_bytes + s->db_bytes;
	a->workspace = (char *)r->workspace + off;
	a->workspace_bytes = r->workspace_bytes - off;
}

static kiln_status rnn_forward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct rnn *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->w[0], r->w[1], r->w[2], r->w[3], r->x[1] },
				  .out = { r->y, r->saved } };
	rnn_ws(&a, s, r);
	return h->device_run(r->dev, r->saved ? s->fwd : s->infer, &a, r->stream);
}

static kiln_status rnn_backward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct rnn *s = l->priv;
	if (!r->dx[0] && !r->dw[0])
		return KILN_OK;
	char *scratch = r->workspace;
	char *dw = scratch + s->x_bytes, *db = dw + s->w_bytes;
	const int dw_acc = r->dw[0] && r->dw_accum, dx_acc = r->dx[0] && r->dx_accum[0];
	struct kiln_op_args a = {
		.in = { r->x[0], r->dy, r->w[0], r->w[1], r->saved },
		.out = { r->dx[0] ? r->dx[0] : scratch, r->dw[0] ? r->dw[0] : dw,
			 r->dw[0] ? r->dw[1] : dw + ALIGN64(kiln_tensor_bytes(&l->params[0].desc)),
			 db },
	};
	rnn_ws(&a, s, r);
	kiln_status st = h->device_run(r->dev, s->bwd[dw_acc][dx_acc], &a, r->stream);
	for (int k = 0; k < 2 && !st && r->dw[0]; k++) {
		struct kiln_op_args c = { .in = { db + (size_t)k * s->G * s->H * sizeof(float) },
					  .out = { r->dw[2 + k] } };
		st = h->device_run(r->dev, s->copy[dw_acc], &c, r->stream);
	}
	return st;
}

LAYER(lstm, "lstm",
      "one direction of one layer of nn.LSTM (batch_first; PyTorch's names and gates)",
      rnn_keys, 1, 2, lstm_configure, rnn_infer, rnn_plan, rnn_forward, rnn_backward,
      layer_destroy);
LAYER(gru, "gru", "one direction of one layer of nn.GRU (batch_first; PyTorch's names and gates)",
      rnn_keys, 1, 2, gru_configure, rnn_infer, rnn_plan, rnn_forward, rnn_backward,
      layer_destroy);
