/* core/memory.c - `kiln memory`: what a training run will allocate, from
 * the static plans alone, before any training (see kiln.h,
 * kiln_memory_report).  The same model, plans and buffers the trainer
 * builds; nothing is run. */
#include "data.h"
#include "graph.h"

#include <stdio.h>

static double mib(size_t b)
{
	return (double)b / 1048576.0;
}

/* Bytes live at schedule position pos (forward of layer j at j, backward
 * of layer j at 2n-1-j), without packing. */
static size_t live_at(const struct kiln_plan *p, int pos)
{
	size_t t = 0;
	for (int i = 0; i < p->n_store; i++)
		if (p->store[i].start <= pos && pos <= p->store[i].end)
			t += p->store[i].bytes;
	return t;
}

static size_t store_bytes(const struct kiln_plan *p, int s)
{
	return s >= 0 && s < p->n_store ? p->store[s].bytes : 0;
}

kiln_status kiln_memory_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
			       FILE *f, struct kiln_memory *out)
{
	struct kiln_device *dev = NULL;
	struct kiln_model *m = NULL;
	struct kiln_plan *ptrain = NULL, *peval = NULL, *prem = NULL;
	struct kiln_dataset ds, es;
	int do_eval = 1;
	int64_t B = 128, EB = 0, acc = 1;
	kiln_status st;

	memset(out, 0, sizeof *out);
	memset(&ds, 0, sizeof ds);
	memset(&es, 0, sizeof es);
	kiln_config_get_bool(cfg, "train", "eval", &do_eval);
	kiln_config_get_int(cfg, "train", "batch", &B);
	kiln_config_get_int(cfg, "train", "eval_batch", &EB);
	kiln_config_get_int(cfg, "train", "accumulate", &acc);
	if (!EB)
		EB = B;
	if ((st = kiln_device_open(reg, cfg, kiln_config_get(cfg, "run", "device"), 0, &dev)) ||
	    (st = kiln_dataset_open(cfg, reg, "data", "train", 1, &ds)))
		goto out;
	struct kiln_tensor_desc input = ds.sample;
	input.dtype = KILN_F32;
	/* evaluation: the trainer's plan of eval_batch (at most the data) and
	 * the remainder's */
	if (do_eval && (st = kiln_dataset_open(cfg, reg, "data.eval", "test", 0, &es)))
		goto out;
	if (do_eval && EB > es.len)
		EB = es.len;
	if ((st = kiln_model_create(cfg, reg, dev, &input, &m)) ||
	    (st = kiln_model_plan(m, B, 1, &ptrain)) ||
	    (do_eval && (st = kiln_model_plan(m, EB, 0, &peval))) ||
	    (do_eval && es.len % EB && (st = kiln_model_plan(m, es.len % EB, 0, &prem))))
		goto out;

	/* the model's buffers */
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	for (int i = 0; i < nb; i++) {
		if (!strcmp(sb[i].name, "params"))
			out->params = sb[i].bytes;
		else if (!strcmp(sb[i].name, "buffers"))
			out->buffers = sb[i].bytes;
		else if (!strncmp(sb[i].name, "optim.", 6) && strcmp(sb[i].name, "optim.step"))
			out->optim_state += sb[i].bytes;
	}
	out->grads = m->n_elems * sizeof(float) * (acc > 1 ? 2 : 1);
	out->batch = B;
	out->activations = ptrain->arena_bytes;
	out->activations_unpacked = kiln_plan_naive_bytes(ptrain);
	out->workspace = ptrain->ws_bytes;
	out->eval = peval ? peval->arena_bytes + peval->ws_bytes : 0;
	if (prem)
		out->eval += prem->arena_bytes + prem->ws_bytes;
	/* the optimizer's extras (no_decay multiplier, LAMB's offsets and
	 * workspace) and the small device scalars (step counters, lr, metrics,
	 * the clip state: 64 bytes each) */
	out->other = (m->wd_mult_d ? m->n_trainable * sizeof(float) : 0) +
		     (m->offsets_d ? (size_t)(m->n_tensors + 1) * sizeof(int64_t) : 0) +
		     m->optim_ws_bytes + 6 * 64;
	/* the trainer's two device input slots (samples and labels), and the
	 * f32 input the device widens u8/bf16 samples into */
	int64_t rows = EB > B ? EB : B;
	out->inputs = 2 * (size_t)rows * (ds.sample_bytes + 4);
	if (ds.sample.dtype != KILN_F32)
		out->inputs += (size_t)rows * kiln_tensor_bytes(&input);
	out->total = out->params + out->grads + out->optim_state + out->buffers + out->activations +
		     out->workspace + out->eval + out->inputs + out->other;

	/* where the activations peak */
	const int n = m->n_layers;
	for (int pos = 0; pos < 2 * n; pos++) {
		size_t live = live_at(ptrain, pos);
		if (live > out->peak_live) {
			out->peak_live = live;
			out->peak_layer = pos < n ? pos : 2 * n - 1 - pos;
			out->peak_backward = pos >= n;
		}
	}

	if (f) {
		fprintf(f, "memory of a training run, batch %lld%s (device %s), before any step:\n",
			(long long)B, acc > 1 ? " per micro-step" : "",
			kiln_config_get(cfg, "run", "device"));
		fprintf(f, "  %-22s %10.2f MiB  %zu floats\n", "parameters", mib(out->params),
			out->params / 4);
		fprintf(f, "  %-22s %10.2f MiB%s\n", "gradients", mib(out->grads),
			acc > 1 ? "  (and the accumulation buffer)" : "");
		fprintf(f, "  %-22s %10.2f MiB  [train] optimizer = %s\n", "optimizer state",
			mib(out->optim_state), kiln_config_get(cfg, "train", "optimizer"));
		fprintf(f, "  %-22s %10.2f MiB\n", "buffers (batchnorm)", mib(out->buffers));
		fprintf(f, "  %-22s %10.2f MiB  packed by lifetime (%.2f MiB without packing)\n",
			"activations", mib(out->activations), mib(out->activations_unpacked));
		fprintf(f, "  %-22s %10.2f MiB\n", "workspace", mib(out->workspace));
		fprintf(f, "  %-22s %10.2f MiB  batch %lld, no backward\n", "evaluation plan",
			mib(out->eval), (long long)EB);
		fprintf(f, "  %-22s %10.2f MiB  2 slots of samples and labels\n", "input buffers",
			mib(out->inputs));
		fprintf(f, "  %-22s %10.2f MiB  optimizer extras, counters, lr, metrics\n", "other",
			mib(out->other));
		fprintf(f, "  %-22s %10.2f MiB\n", "total", mib(out->total));
		fprintf(f, "  activations peak at the %s of layer '%s': %.2f MiB live\n",
			out->peak_backward ? "backward" : "forward", m->layers[out->peak_layer].name,
			mib(out->peak_live));
		fprintf(f, "\n  %-16s %-14s %12s %12s %12s\n", "layer", "type", "output MiB",
			"saved MiB", "grad MiB");
		for (int i = 0; i < n; i++) {
			const struct plan_node *nd = &ptrain->nodes[i];
			size_t y = nd->l.is_view ? 0 : store_bytes(ptrain, nd->ystore);
			fprintf(f, "  %-16s %-14s %12.3f %12.3f %12.3f%s\n", m->layers[i].name,
				m->layers[i].type->name, mib(y), mib(store_bytes(ptrain, nd->sstore)),
				mib(store_bytes(ptrain, nd->gstore)), nd->l.is_view ? "  (view)" : "");
		}
	}
out:
	kiln_plan_free(ptrain);
	kiln_plan_free(peval);
	kiln_plan_free(prem);
	kiln_dataset_close(&es);
	kiln_model_free(m);
	kiln_dataset_close(&ds);
	kiln_device_close(dev);
	return st;
}
