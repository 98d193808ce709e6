/* core/trained.c - a trained model as `kiln export`, `kiln eval`, `kiln
 * predict`, `kiln generate` and `kiln quantize` take it (graph.h): the
 * weights a command names (--checkpoint F, the C API's `weights`) opened
 * once, then the device, the model built for the sample shape training
 * read, and those weights in it; and `kiln export --safetensors`.
 *
 * F is a kiln checkpoint, verified whole and checked against the config's
 * model before anything is built, or a weights file (safetensors, llm.c's
 * model file) read as [model] init_from reads one: told apart by their
 * first bytes on the descriptor that then reads them.  Before session 39
 * F was opened two to four times (its magic; the checkpoint or weights
 * reader; `kiln eval --fold` and `kiln quantize` both again to fold), so
 * a file replaced between two opens was told to be one kind and read as
 * another file, and a checkpoint was verified whole twice.  Before
 * session 40 kiln_given_load looked at the first bytes again: a weights
 * file rewritten in place into a checkpoint between the two was loaded
 * as one, its config never checked against the model; now the kind told
 * at open is the kind read, and a file changed since open (size, mtime)
 * is refused by its reads (kiln_read_at).
 */
#include "checkpoint.h"
#include "weights.h"
#include "graph.h"
#include "data.h"
#include "quant.h"
#include "run_config.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <stdio.h>
#include <sys/stat.h> /* struct stat: the watched output */
#include <unistd.h>   /* close */

/* ---- the weights a command names ------------------------------------------- */

kiln_status kiln_given_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    const char *path, struct kiln_given *g)
{
	char kind[64];
	const char *why;
	struct kiln_weights_file w;
	memset(g, 0, sizeof *g);
	g->file.fd = -1;
	g->path = path;
	if (!path)
		return kiln_ckpt_open_weights(cfg, reg, NULL, &g->ck, g->dir, sizeof g->dir);
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL);
	if (fd < 0)
		return kiln_error(KILN_EIO, "checkpoint %s: cannot open: %s", path, why);
	kiln_status st = kiln_weights_open_fd(fd, path, &w);
	if (!st && w.kind != KILN_WEIGHTS_IS_CHECKPOINT) {
		g->file = w; /* a weights file: read by kiln_given_load as told now */
		return KILN_OK;
	}
	if (!st)
		st = kiln_ckpt_open_weights_fd(cfg, reg, path, fd, &g->ck);
	close(fd); /* (the checkpoint reads a duplicate) */
	return st;
}

void kiln_given_close(struct kiln_given *g)
{
	kiln_ckpt_close(g->ck);
	if (g->file.fd >= 0)
		close(g->file.fd);
	g->ck = NULL;
	g->file.fd = -1;
}

kiln_status kiln_given_load(struct kiln_model *m, const struct kiln_given *g, void *stream)
{
	int told;
	kiln_status st = kiln_weights_load_fd(m, &g->file, 1, &told, stream);
	/* a file known to be a weights file (a safetensors header that
	 * parsed, llm.c's magic): that format's error alone (before session
	 * 41 a tensor that did not fit was "not a kiln checkpoint, and as a
	 * weights file ...: tensor ...", though the file's kind was known) */
	if (!st || told)
		return st;
	/* the reader's message names the file first: once is enough */
	const char *e = kiln_last_error();
	const size_t n = strlen(g->path);
	const char *why = !strncmp(e, g->path, n) && !strncmp(e + n, ": ", 2) ? e + n + 2 : e;
	return kiln_error(st, "%s: not a kiln checkpoint, and as a weights file (safetensors, llm.c's model file): %s",
			  g->path, why);
}

/* ---- a trained model ---------------------------------------------------------- */

static kiln_status trained_precheck(void *ck, const struct kiln_model *m)
{
	return kiln_ckpt_check_sample(ck, m);
}

void kiln_trained_sample_warn(const char *section, const struct kiln_tensor_desc *data,
			      const struct kiln_tensor_desc *trained, int data_used)
{
	char a[200], b[200];
	if (!strcmp(kiln_tensor_desc_str(data, a, sizeof a), kiln_tensor_desc_str(trained, b, sizeof b)))
		return;
	if (data_used)
		kiln_log(KILN_LOG_WARN, "core", "[%s] gives samples of %s, the checkpoint's model was trained on %s: [%s]'s are used",
			 section, a, b, section);
	else
		kiln_log(KILN_LOG_WARN, "core", "[%s] gives samples of %s, the checkpoint's model was trained on %s: the checkpoint's are used, [%s]'s are not",
			 section, a, b, section);
}

/* [data]'s sample, as training reads it (u8 samples become f32): its
 * source's peek (kiln_dataset_peek: a header, the config; an output that
 * exists already is not peeked at), else the set opened (a source without
 * a peek, and the watched output's guard).  Before session 39 always
 * opened: the whole training set listed, inflated or mapped and verified
 * for `kiln predict --checkpoint W.safetensors one.png`, and a set bad
 * past its header refused (now `kiln train` and `kiln eval` find that). */
static kiln_status data_sample(const struct kiln_config *cfg, const struct kiln_registry *reg,
			       struct kiln_tensor_desc *out)
{
	struct kiln_dataset ds;
	int peeked = 0;
	kiln_status st = kiln_dataset_peek(cfg, reg, "data", "train", 1, &ds, &peeked);
	if (!st && !peeked) {
		kiln_dataset_close(&ds);
		st = kiln_dataset_open(cfg, reg, "data", "train", 1, &ds);
	}
	if (!st)
		kiln_dataset_input_desc(&ds, out);
	kiln_dataset_close(&ds);
	return st;
}

/* The sample shape, as training saw it (u8 samples become f32), into
 * *out: the checkpoint's record, or the INT8 model qf's (session 39),
 * else [data]'s (an older kiln's checkpoint or INT8 file, a weights file,
 * none).  With a record [data] is not opened
 * (before session 38 it was, to warn of a shape that differs: the whole
 * training set listed for `kiln predict`, however large or slow), but for
 * an output that exists already (kiln_output_watch): whether it is one of
 * [data]'s files is known only to [data]'s source, which refuses it as it
 * opens (KILN_EUSAGE); another failure to open it is no reason to stop. */
static kiln_status trained_sample(const struct kiln_config *cfg, const struct kiln_registry *reg,
				  struct kiln_ckpt *ck, const struct kiln_safetensors *qf,
				  struct kiln_tensor_desc *out)
{
	struct kiln_tensor_desc data;
	struct stat o;
	kiln_status st = ck ? kiln_ckpt_sample(ck, out) : qf ? kiln_quant_sample(qf, out) : KILN_ENOTFOUND;
	if (st == KILN_ENOTFOUND) {
		st = data_sample(cfg, reg, out);
		if (st && !ck && qf) /* (why an INT8 file needs [data]) */
			st = kiln_error_wrap(st, "%s records no input sample (an INT8 file of a kiln before session 39: quantize again to run it without [data]), so [data]'s is read",
					     kiln_safetensors_path(qf));
		return st;
	}
	if (st)
		return st; /* a corrupt record is no reason to guess from [data] */
	if (kiln_output_watched_stat(&o) && data_sample(cfg, reg, &data) == KILN_EUSAGE)
		return KILN_EUSAGE;
	return KILN_OK;
}

/* [model] init_from as the trained weights (need_trained): what it does
 * not give ([model] init_strict = 0) is about to be drawn from [run] seed,
 * untrained. */
static void init_from_gaps(const struct kiln_model *m, const char *verb, const char *init)
{
	int drawn = 0, first = -1;
	for (int i = 0; i < m->n_params; i++)
		if (!m->params[i].given && !drawn++)
			first = i;
	if (drawn)
		kiln_log(KILN_LOG_WARN, "core", "[model] init_from %s gives %d of the model's %d parameters and buffers: %s the initial values ([run] seed), not trained ones, of the other %d ('%s' the first)",
			 init, m->n_params - drawn, m->n_params, verb, drawn, m->params[first].name);
}

kiln_status kiln_trained_open_given(const struct kiln_config *cfg,
				    const struct kiln_registry *reg, const struct kiln_given *g,
				    const char *verb, int need_trained, struct kiln_trained *t)
{
	struct kiln_run_cfg run;
	/* need_trained < 0: the model's shape alone, no weights looked for */
	struct kiln_ckpt *ck = need_trained >= 0 ? g->ck : NULL;
	/* a weights file, read as [model] init_from reads one, in its place */
	const char *weights = need_trained >= 0 && g->file.fd >= 0 ? g->path : NULL;
	const char *dir = g->dir;
	kiln_status st;
	memset(t, 0, sizeof *t);
	if ((st = kiln_run_cfg_read(cfg, &run)))
		return st;
	const char *init = kiln_config_get(cfg, "model", "init_from");
	const int has_init = init && *init;
	if (need_trained < 0)
		;
	else if (ck)
		kiln_log(KILN_LOG_INFO, "core", "%s the weights of %s (step %lld)", verb,
			 kiln_ckpt_path(ck), (long long)kiln_ckpt_step(ck));
	else if (weights)
		kiln_log(KILN_LOG_INFO, "core", "%s the weights of %s", verb, weights);
	else if (need_trained && !has_init)
		return kiln_error(KILN_ECONFIG, "%s%s: no trained weights (give --checkpoint CKPT or [model] init_from, or train first)",
				  *dir ? "no checkpoint in " : "[run] out_dir is empty", dir);
	/* init_from's weights are what the user gave: a note, not a warning
	 * (before session 41 `kiln export` and `kiln predict` warned of
	 * "the initial weights ([run] seed, then [model] init_from), not
	 * trained ones", which read as an error) */
	else if (has_init)
		kiln_log(KILN_LOG_INFO, "core", "%s%s: %s the weights of [model] init_from %s%s",
			 *dir ? "no checkpoint in " : "[run] out_dir is empty", dir, verb, init,
			 need_trained ? "" : " (a run's trained weights: --checkpoint CKPT, or train first)");
	else
		kiln_log(KILN_LOG_WARN, "core", "%s%s: %s the initial weights ([run] seed), not trained ones (give --checkpoint CKPT, or train first)",
			 *dir ? "no checkpoint in " : "[run] out_dir is empty", dir, verb);
	if ((st = kiln_device_open(reg, cfg, g->device ? g->device : run.device, 0, &t->dev)))
		goto out;
	if ((st = trained_sample(cfg, reg, ck, g->qf, &t->sample)))
		goto out;
	/* a checkpoint's parameter table is checked against the model its
	 * sample gives before that model is allocated */
	const struct kiln_model_precheck pre = { trained_precheck, ck };
	if ((st = kiln_model_create_infer(cfg, reg, t->dev, &t->sample, ck ? &pre : NULL, &t->m)) ||
	    (st = kiln_device_stream_create(t->dev, &t->stream)) ||
	    /* a checkpoint replaces every weight: init_from is not read; what
	     * init_from gives is not drawn */
	    (!ck && need_trained >= 0 &&
	     (st = weights ? kiln_given_load(t->m, g, t->stream) : kiln_model_init_from(t->m, t->stream))))
		goto out;
	if (!ck && !weights && need_trained > 0)
		init_from_gaps(t->m, verb, init);
	if (/* nothing drawn where a checkpoint follows or the shape alone is
	     * wanted */
	    (st = ck || need_trained < 0 ? kiln_model_init_loaded(t->m, t->stream)
					 : kiln_model_init_params(t->m, (uint64_t)run.seed, t->stream)) ||
	    (ck && (st = kiln_ckpt_load_model(ck, t->m, t->stream, KILN_CKPT_LOAD_WEIGHTS))))
		goto out;
out:
	if (st)
		kiln_trained_close(t);
	return st;
}

kiln_status kiln_trained_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *checkpoint, const char *verb, int need_trained,
			      struct kiln_trained *t)
{
	struct kiln_given g = { .file.fd = -1 };
	kiln_status st;
	memset(t, 0, sizeof *t);
	/* a checkpoint is verified whole before the model is even built */
	if (need_trained >= 0 && (st = kiln_given_open(cfg, reg, checkpoint, &g))) {
		kiln_given_close(&g);
		return st;
	}
	st = kiln_trained_open_given(cfg, reg, &g, verb, need_trained, t);
	kiln_given_close(&g);
	return st;
}

void kiln_trained_close(struct kiln_trained *t)
{
	if (t->stream)
		kiln_device_stream_sync(t->dev, t->stream);
	kiln_model_free(t->m);
	if (t->stream)
		kiln_device_stream_destroy(t->dev, t->stream);
	kiln_device_close(t->dev);
	memset(t, 0, sizeof *t);
}

kiln_status kiln_export_safetensors(const struct kiln_config *cfg,
				    const struct kiln_registry *reg, const char *checkpoint,
				    const char *path)
{
	return kiln_export_safetensors_as(cfg, reg, checkpoint, path, KILN_WEIGHTS_PYTORCH);
}

kiln_status kiln_export_safetensors_as(const struct kiln_config *cfg,
				       const struct kiln_registry *reg, const char *checkpoint,
				       const char *path, int format)
{
	if (!cfg || !reg || !path)
		return kiln_null_arg("kiln_export_safetensors_as", !cfg ? "cfg" : !reg ? "reg" : "path");
	struct kiln_trained t;
	const char *in[2] = { checkpoint, kiln_config_get(cfg, "model", "init_from") };
	kiln_status st = kiln_output_check(path, in, 2);
	if (st || (st = kiln_trained_open(cfg, reg, checkpoint, "exporting", 0, &t)))
		return st;
	if (!(st = kiln_model_save_safetensors_as(t.m, path, format, t.stream)))
		kiln_log(KILN_LOG_DEBUG, "core", "wrote %d parameters and buffers to %s",
			 kiln_model_param_count(t.m), path);
	kiln_trained_close(&t);
	return st;
}
