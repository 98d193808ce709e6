/* core/precision.c - the model's precision policy ([run] precision, the
 * amp plugin) and its loss scaler in device memory.
 *
 * The policy plugin only decides (compute dtype, the scaling rule); this
 * file holds the scaler state, device f32[4] (scale, growth tracker,
 * hysteresis left, overflowing steps: KILN_OP_SCALER_UPDATE in plugin.h),
 * which checkpoints carry as the section "amp.scaler", and prepares the two
 * ops of a step: KILN_OP_UNSCALE (in the trainer's clip slot: unscale,
 * non-finite check, clipping, one pass, writing the gate flag the
 * optimizer reads) and KILN_OP_SCALER_UPDATE after the optimizer.  The loss
 * layer multiplies its gradient by the device scale (kiln_layer_run.
 * loss_scale), or, where a step is the mean over n micro-batches
 * ([train] accumulate, a pipeline's micro-batches), by the seed
 * scale / n that kiln_model_seed_open makes.  Nothing of a step reads
 * the scale on the host.
 */
#include "graph.h"

#include <stdio.h>

/* [run] precision's policy opened into m (m->prec_ops, prec_ctx) and its
 * compute dtype set; *p: the policy's plugin, NULL for fp32 without the
 * amp plugin (no policy at all). */
static kiln_status policy_open(struct kiln_model *m, const struct kiln_registry *reg,
			       const struct kiln_plugin **p, const char **name)
{
	const struct kiln_config *cfg = m->cfg;
	kiln_status st;
	*name = kiln_config_get(cfg, "run", "precision");
	if (!*name)
		*name = "fp32";
	if (kiln_registry_find(reg, KILN_PLUGIN_PRECISION, "amp", p)) {
		*p = NULL;
		if (!strcmp(*name, "fp32"))
			return KILN_OK; /* nothing to decide */
		return kiln_error(KILN_ECONFIG, "%s: [run] precision = %s needs the amp plugin (kiln-amp.so), which is not here (`kiln plugins`; configure --enable-amp)",
				  kiln_config_where(cfg, "run", "precision"), *name);
	}
	const struct kiln_precision_ops *ops = (*p)->ops;
	if ((st = ops->open(kiln_host_table(), cfg, *name, &m->prec_ctx)))
		return st;
	m->prec_ops = ops;
	const int dt = ops->compute_dtype(m->prec_ctx);
	if (dt != KILN_F32 && dt != KILN_BF16 && dt != KILN_F16)
		return kiln_error(KILN_ENOTSUP, "%s: [run] precision = %s (%s): compute dtype %s is not supported (f32, bf16, f16)",
				  kiln_config_where(cfg, "run", "precision"), *name,
				  ops->version >= 2 && ops->describe ? ops->describe(m->prec_ctx) : *name,
				  kiln_dtype_name(dt));
	if ((st = kiln_model_set_compute_dtype(m, dt)))
		return kiln_error_wrap(st, "%s: [run] precision = %s",
				       kiln_config_where(cfg, "run", "precision"), *name);
	return KILN_OK;
}

kiln_status kiln_model_compute_open(struct kiln_model *m, const struct kiln_registry *reg)
{
	const struct kiln_plugin *p;
	const char *name;
	kiln_status st = policy_open(m, reg, &p, &name);
	if (!st && p)
		kiln_log(KILN_LOG_INFO, "amp", "precision = %s: %s compute, no loss scaling (nothing is trained)",
			 name, kiln_dtype_name(m->cdtype));
	return st;
}

kiln_status kiln_model_precision_open(struct kiln_model *m, const struct kiln_registry *reg,
				      void *stream)
{
	const struct kiln_plugin *p;
	const char *name;
	kiln_status st = policy_open(m, reg, &p, &name);
	if (st || !p)
		return st;
	const struct kiln_precision_ops *ops = m->prec_ops;
	struct kiln_scaler_config *sc = &m->scaler;
	memset(sc, 0, sizeof *sc);
	if (ops->version >= 2 && ops->scaler) {
		if ((st = ops->scaler(m->prec_ctx, sc)))
			return st;
	} else {
		float init, growth, backoff;
		int interval;
		if ((st = ops->scaling(m->prec_ctx, &init, &growth, &backoff, &interval)))
			return st;
		sc->init_scale = init;
		sc->growth_factor = growth;
		sc->backoff_factor = backoff;
		sc->growth_interval = interval;
		sc->hysteresis = 1;
		sc->dynamic = growth != 1 || backoff != 1;
		sc->enabled = sc->dynamic || init != 1;
	}
	const char *what = ops->version >= 2 && ops->describe ? ops->describe(m->prec_ctx) : name;
	kiln_log(KILN_LOG_INFO, "amp", "precision = %s: %s", name, what);
	if (!sc->enabled)
		return KILN_OK;
	if (!(sc->init_scale > 0) || !(sc->init_scale < 3.4e38) ||
	    (sc->dynamic && (sc->growth_factor < 1 || !(sc->backoff_factor > 0) ||
			     sc->backoff_factor > 1 || sc->growth_interval < 1 || sc->hysteresis < 1 ||
			     sc->growth_interval > (1 << 24) || sc->hysteresis > (1 << 24))))
		return kiln_error(KILN_ECONFIG, "precision plugin '%s': bad scaling rule (scale %g, growth %g, backoff %g, interval %lld, hysteresis %lld)",
				  p->name, sc->init_scale, sc->growth_factor, sc->backoff_factor,
				  (long long)sc->growth_interval, (long long)sc->hysteresis);
	float *host = NULL;
	if ((st = kiln_device_alloc_named(m->dev, 64, (void **)&m->scaler_d,
					  "the loss scaler's state")) ||
	    (st = kiln_device_host_alloc_named(m->dev, 64, (void **)&host,
					       "the loss scaler's initial state, on the host")))
		return st;
	host[0] = (float)sc->init_scale;
	host[1] = 0;
	host[2] = (float)(sc->hysteresis > 0 ? sc->hysteresis : 1);
	host[3] = 0;
	st = kiln_device_copy_async(m->dev, m->scaler_d, host, 4 * sizeof(float), KILN_COPY_H2D,
				    stream);
	kiln_status st2 = kiln_device_stream_sync(m->dev, stream);
	kiln_device_host_free(m->dev, host);
	if (st || st2)
		return st ? st : st2;
	if (sc->dynamic)
		kiln_log(KILN_LOG_INFO, "amp", "dynamic loss scale: %g, x%g after %lld finite steps, x%g on overflow (after %lld), minimum %g",
			 sc->init_scale, sc->growth_factor, (long long)sc->growth_interval,
			 sc->backoff_factor, (long long)sc->hysteresis, sc->min_scale);
	else
		kiln_log(KILN_LOG_INFO, "amp", "static loss scale %g; overflowing steps are skipped",
			 sc->init_scale);
	return KILN_OK;
}

kiln_status kiln_model_precision_prepare(struct kiln_model *m, double clip_norm,
					 double clip_value, void **unscale)
{
	struct kiln_op op;
	int64_t n = (int64_t)m->n_trainable, four = 4;
	kiln_status st;
	*unscale = NULL;
	if (!m->scaler_d || !n)
		return KILN_OK;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_UNSCALE;
	op.n_in = 2;
	op.n_out = 2;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, &four);
	op.out[0] = op.in[0];
	op.out[1] = op.in[1];
	op.i[0] = n;
	op.f[0] = clip_norm;
	op.f[1] = clip_value;
	if ((st = kiln_device_prepare(m->dev, &op, unscale, NULL)))
		return kiln_error_wrap(st, "loss scaling: the unscale op");
	if (!m->scaler.dynamic)
		return KILN_OK;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SCALER_UPDATE;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &four);
	op.out[0] = op.in[0];
	op.f[0] = m->scaler.growth_factor;
	op.f[1] = m->scaler.backoff_factor;
	op.f[2] = m->scaler.min_scale;
	op.f[3] = m->scaler.max_scale;
	op.i[0] = m->scaler.growth_interval;
	op.i[1] = m->scaler.hysteresis;
	if ((st = kiln_device_prepare(m->dev, &op, &m->scaler_plan, NULL)))
		return kiln_error_wrap(st, "loss scaling: the scale update op");
	return KILN_OK;
}

kiln_status kiln_model_precision_update(struct kiln_model *m, const float *gate, void *stream)
{
	if (!m->scaler_plan)
		return KILN_OK;
	struct kiln_op_args a = { .in = { gate }, .out = { m->scaler_d } };
	return kiln_device_run(m->dev, m->scaler_plan, &a, stream);
}

kiln_status kiln_model_seed_open(struct kiln_model *m, int64_t n, void *stream, float **seed,
				 void **plan)
{
	struct kiln_op op;
	int64_t one = 1;
	kiln_status st;
	*seed = NULL;
	*plan = NULL;
	if (n <= 1)
		return KILN_OK;
	if ((st = kiln_device_alloc_named(m->dev, 64, (void **)seed,
					  "the loss gradient's seed (the mean over micro-batches)")))
		return st;
	if (!m->scaler_d) { /* 1 / n, once: PyTorch's grad_output of loss / n */
		const float mean = (float)(1.0 / (double)n);
		if ((st = kiln_device_copy_async(m->dev, *seed, &mean, sizeof mean, KILN_COPY_H2D,
						 stream)))
			return st;
		return kiln_device_stream_sync(m->dev, stream);
	}
	/* the scale moves on the device: seed = scaler_d[0] / n, by an op
	 * (s * (float)(1 / n): s / n itself for the powers of two dynamic
	 * scaling keeps) */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SCALE;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &one);
	op.out[0] = op.in[0];
	op.f[0] = 1.0 / (double)n;
	if ((st = kiln_device_prepare(m->dev, &op, plan, NULL)) ||
	    (st = kiln_model_seed_update(m, *seed, *plan, stream)))
		return kiln_error_wrap(st, "loss scaling: the loss gradient's seed (scale / %lld)",
				       (long long)n);
	return kiln_device_stream_sync(m->dev, stream);
}

kiln_status kiln_model_seed_update(const struct kiln_model *m, float *seed, void *plan,
				   void *stream)
{
	if (!plan)
		return KILN_OK;
	struct kiln_op_args a = { .in = { m->scaler_d }, .out = { seed } };
	return kiln_device_run(m->dev, plan, &a, stream);
}

void kiln_model_precision_close(struct kiln_model *m)
{
	if (!m)
		return;
	kiln_device_plan_free(m->dev, m->scaler_plan);
	kiln_device_free(m->dev, m->scaler_d);
	if (m->prec_ops)
		m->prec_ops->close(m->prec_ctx);
	m->scaler_plan = m->scaler_d = NULL;
	m->prec_ops = NULL;
	m->prec_ctx = NULL;
}
