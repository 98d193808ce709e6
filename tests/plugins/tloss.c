/* tests/plugins/kiln-tloss.so and kiln-tloss22.so: a loss layer plugin,
 * softmax cross-entropy over [B, C] logits (the mean over the batch, as
 * the built-in softmax_xent without its keys), or token logits [B, T, V]
 * whose label 0 is a pad (softmax_xent's ignore_index = 0), for
 * tests/loss_plugin_abi.sh.
 * Built twice from this file:
 *  - kiln-tloss.so (layer type "tloss"), for this kiln's ABI: its backward
 *    multiplies the gradient by *loss_scale whenever l->loss_scaled is set
 *    (ABI 2.23: fp16's scale and the step's mean over micro-batches), and
 *    its evaluations add the rows counted, and it sets l->eval_counted,
 *    when l->eval_sums is set (2.27);
 *  - kiln-tloss22.so (TLOSS_ABI22, layer type "tloss22"), a plugin written
 *    for ABI 2.22's docs by an author who does not use fp16: it never reads
 *    loss_scale, and the core must refuse it where the seed is a mean;
 *  - kiln-tloss25.so (TLOSS_ABI25, layer type "tloss25"), a plugin written
 *    for ABI 2.25's docs and rebuilt unchanged against this kiln's headers
 *    (it reports this minor): it reads loss_scale but never sets
 *    l->eval_counted, and writes f32[3], which the trainer divides by
 *    samples;
 *  - kiln-tlossfail.so (TLOSS_FAIL, layer type "tlossfail", this ABI), for
 *    tests/pipe_close_held.sh: its backward (so the run's first) fails on
 *    the host after it queued a host function on its stage's stream that
 *    holds the stream 1 s and then logs "tlossfail: the held stage ran
 *    its queue" (a pipeline step that fails half enqueued, work still
 *    queued on a stage).
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include "test_plugin.h"

#include <stdlib.h>
#include <string.h>

#ifdef TLOSS_ABI22
#define TLOSS_NAME "tloss22"
#define TLOSS_MINOR 22
#define TLOSS_SCALED(l) 0 /* what a 2.22 f32-only plugin did: never */
#define TLOSS_COUNTED(l) 0 /* 2.27's eval_counted: unknown, f32[3] */
#elif defined TLOSS_ABI25
#define TLOSS_NAME "tloss25"
#define TLOSS_MINOR KILN_ABI_MINOR /* rebuilt against this kiln's headers */
#define TLOSS_SCALED(l) ((l)->loss_scaled)
#define TLOSS_COUNTED(l) 0 /* written for 2.25: never sets eval_counted */
#elif defined TLOSS_FAIL
#define TLOSS_NAME "tlossfail"
#define TLOSS_MINOR KILN_ABI_MINOR
#define TLOSS_SCALED(l) ((l)->loss_scaled)
#define TLOSS_COUNTED(l) ((l)->eval_sums)
#else
#define TLOSS_NAME "tloss"
#define TLOSS_MINOR KILN_ABI_MINOR
#define TLOSS_SCALED(l) ((l)->loss_scaled)
#define TLOSS_COUNTED(l) ((l)->eval_sums) /* ABI 2.27: it adds [3], the rows counted */
#endif

/* a row-major f32/i32 descriptor (a plugin calls no kiln_* function) */
static void tloss_desc(struct kiln_tensor_desc *d, int dtype, int ndim, int64_t d0, int64_t d1)
{
	memset(d, 0, sizeof *d);
	d->dtype = dtype;
	d->layout = KILN_ROW;
	d->ndim = ndim;
	d->dims[0] = d0;
	d->dims[1] = d1;
}

struct tloss {
	void *op;
	int64_t B, C;     /* rows ([B, C], or B x T token rows) and classes */
	int64_t samples;  /* the batch's samples */
	int tokens;       /* [B, T, V] logits: label 0 is a pad, ignored */
};

static kiln_status tloss_configure(const struct kiln_host *host, struct kiln_layer *l,
				   const struct kiln_config *cfg, const char *section)
{
	(void)host, (void)cfg, (void)section;
	l->is_loss = 1;
	return KILN_OK;
}

static kiln_status tloss_infer(const struct kiln_host *host, struct kiln_layer *l)
{
	if (!l->priv && !(l->priv = calloc(1, sizeof(struct tloss))))
		return host->error(KILN_ENOMEM, "tloss: out of memory");
	struct tloss *s = l->priv;
	const int nd = l->in[0].ndim;
	if ((nd != 2 && nd != 3) || l->in[0].dtype != KILN_F32)
		return host->error(KILN_EINVAL, "tloss: takes f32 [B, C] or [B, T, V] logits");
	s->tokens = nd == 3;
	s->samples = l->in[0].dims[0];
	s->B = s->tokens ? l->in[0].dims[0] * l->in[0].dims[1] : l->in[0].dims[0];
	s->C = l->in[0].dims[nd - 1];
	tloss_desc(&l->out, KILN_F32, 1, 2, 0);
	l->needs_input = 1;
	return KILN_OK;
}

/* [B, C] logits (or [B, T, V]: B x T rows), i32 labels of the rows (and
 * f32[1] loss_scale) -> the logits'
 * gradient (mean over the batch) and f32[3] metrics (f32[4], the rows
 * counted too, in an evaluation: ABI 2.27) */
static kiln_status tloss_plan(const struct kiln_host *host, struct kiln_layer *l,
			      struct kiln_device *dev, size_t *workspace)
{
	struct tloss *s = l->priv;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT;
	op.n_in = TLOSS_SCALED(l) ? 3 : 2;
	op.n_out = 2;
	tloss_desc(&op.in[0], KILN_F32, 2, s->B, s->C);
	tloss_desc(&op.in[1], KILN_I32, 1, s->B, 0);
	if (TLOSS_SCALED(l))
		tloss_desc(&op.in[2], KILN_F32, 1, 1, 0);
	op.out[0] = op.in[0];
	if (TLOSS_COUNTED(l))
		l->eval_counted = 1; /* ABI 2.27: f32[4], [3] the rows counted */
	tloss_desc(&op.out[1], KILN_F32, 1, TLOSS_COUNTED(l) ? 4 : 3, 0);
	op.i[0] = s->B;
	op.i[1] = KILN_LOSS_XENT;
	op.f[0] = 1.0 / (double)s->B;
	/* token logits: label 0 (the pad) ignored, as softmax_xent's
	 * ignore_index = 0; training's metrics B times the token means,
	 * an evaluation's that counts plain sums */
	op.i[2] = s->tokens;
	op.i[3] = 0;
	op.i[4] = s->tokens && !TLOSS_COUNTED(l) ? s->samples : 0;
	*workspace = (size_t)(s->B * s->C) * sizeof(float) + 64;
	return host->device_prepare(dev, &op, &s->op, NULL);
}

static kiln_status tloss_run(const struct kiln_host *host, struct kiln_layer *l,
			     const struct kiln_layer_run *r, void *grad)
{
	struct tloss *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->labels, TLOSS_SCALED(l) ? r->loss_scale : NULL },
				  .out = { grad, r->metrics } };
	return host->device_run(r->dev, s->op, &a, r->stream);
}

static kiln_status tloss_forward(const struct kiln_host *host, struct kiln_layer *l,
				 const struct kiln_layer_run *r)
{
	return r->training ? KILN_OK : tloss_run(host, l, r, r->workspace);
}

#ifdef TLOSS_FAIL
#include <unistd.h> /* usleep */

/* the stage's stream held 1 s, then told in the log */
static kiln_status tlossfail_hold(void *arg)
{
	const struct kiln_host *host = arg;
	usleep(1000 * 1000);
	host->log(KILN_LOG_INFO, "tlossfail", "the held stage ran its queue");
	return KILN_OK;
}
#endif

static kiln_status tloss_backward(const struct kiln_host *host, struct kiln_layer *l,
				  const struct kiln_layer_run *r)
{
#ifdef TLOSS_FAIL
	kiln_status st = host->device_host_fn(r->dev, r->stream, tlossfail_hold, (void *)host);
	return st ? st : host->error(KILN_EIO, "tlossfail: the step's backward fails (test)");
#else
	return tloss_run(host, l, r, r->dx[0] ? r->dx[0] : r->workspace);
#endif
}

static void tloss_destroy(const struct kiln_host *host, struct kiln_layer *l,
			  struct kiln_device *dev)
{
	struct tloss *s = l->priv;
	if (s && dev)
		host->device_plan_free(dev, s->op);
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops tloss_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = tloss_configure,
	.infer = tloss_infer,
	.plan = tloss_plan,
	.forward = tloss_forward,
	.backward = tloss_backward,
	.destroy = tloss_destroy,
};

TEST_PLUGIN(tloss, KILN_ABI_MAJOR, TLOSS_MINOR, KILN_PLUGIN_LAYER, TLOSS_NAME,
	    "softmax cross-entropy (loss plugin ABI test)", &tloss_ops, NULL, NULL);
static const struct kiln_plugin *const tloss_list[] = { &tloss, NULL };
TEST_PLUGIN_INIT(((void)host, tloss_list))
