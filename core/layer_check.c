/* core/layer_check.c - the layers' own keys checked without building the
 * model: each [layer.NAME]'s type found and its configure hook run (the
 * hook that says "needs 'out'"), so that `kiln config`, which opens no
 * data and infers no shape, refuses what `kiln train` would refuse at
 * its first step of model building (before session 33 it printed the
 * resolved config and exited 0). */
#include "pipeline.h"   /* kiln_pipe_devices_count, kiln_model_check_names */
#include "run_config.h" /* kiln_run_cfg_read, kiln_data_cfg_read */
#include "../plugins/common/c_locale.h" /* common_strtod */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include <string.h>

/* Keys of a layer that make it an evaluation-only (INT8) layer: it has no
 * backward, so a training run refuses it.  Before session 34 the layer
 * said so at the first forward, after --overwrite (or the default
 * out_dir) had deleted the earlier run. */
static const char *const eval_only_keys[] = { "int8_scale", "int8_out_scale", NULL };

kiln_status kiln_config_check_training(const struct kiln_config *cfg)
{
	if (!cfg)
		return kiln_null_arg("kiln_config_check_training", "cfg");
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		if (strncmp(sec, "layer.", 6))
			continue;
		for (int k = 0; eval_only_keys[k]; k++) {
			const char *key = eval_only_keys[k];
			double v = 0;
			/* (a value that is no number: the layer's configure says so) */
			if (!kiln_config_get(cfg, sec, key) || kiln_config_get_float(cfg, sec, key, &v) ||
			    !(v > 0))
				continue;
			return kiln_error(KILN_ECONFIG, "%s: [%s] %s = %s: INT8 layers are for evaluation only (`kiln eval --quantized`); a training run trains f32 weights: remove the key",
					  kiln_config_where(cfg, sec, key), sec, key,
					  kiln_config_get(cfg, sec, key));
		}
	}
	return KILN_OK;
}

kiln_status kiln_config_check_layers(const struct kiln_config *cfg,
				     const struct kiln_registry *reg)
{
	if (!cfg || !reg)
		return kiln_null_arg("kiln_config_check_layers", !cfg ? "cfg" : "reg");
	const struct kiln_host *h = kiln_host_table();
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		if (strncmp(sec, "layer.", 6))
			continue;
		const char *type = kiln_config_get(cfg, sec, "type");
		const struct kiln_plugin *p;
		char note[300];
		if (!type)
			return kiln_error(KILN_ECONFIG, "%s: [%s] needs 'type'%s",
					  kiln_config_where(cfg, sec, NULL), sec,
					  kiln_config_unset_note(cfg, sec, note, sizeof note));
		if (kiln_registry_find(reg, KILN_PLUGIN_LAYER, type, &p))
			return kiln_error_wrap(KILN_ECONFIG, "%s: [%s]",
					       kiln_config_where(cfg, sec, "type"), sec);
		const struct kiln_layer_ops *ops = p->ops;
		if (!ops->configure)
			continue;
		/* a layer as the model would hand it over before its inputs are
		 * known (configure reads keys only) */
		struct kiln_layer l;
		memset(&l, 0, sizeof l);
		l.name = sec + 6;
		l.type = type;
		l.index = i;
		l.trainable = 1;
		kiln_status st = ops->configure(h, &l, cfg, sec);
		if (ops->destroy)
			ops->destroy(h, &l, NULL);
		if (st)
			return kiln_error_wrap(st, "layer '%s'%s", l.name,
					       kiln_config_unset_note(cfg, sec, note, sizeof note));
	}
	/* `kiln config` checks the file as training would */
	return kiln_config_check_training(cfg);
}

/* [data*] mean and std: numbers (one, or one per channel), as the sources
 * read them when they open (idx_open, kiln_xform_from_config). */
static kiln_status check_data_numbers(const struct kiln_config *cfg)
{
	static const char *const keys[] = { "mean", "std", NULL };
	for (int i = 0; kiln_config_section(cfg, i); i++) {
		const char *sec = kiln_config_section(cfg, i);
		if (strcmp(sec, "data") && strncmp(sec, "data.", 5))
			continue;
		for (int k = 0; keys[k]; k++) {
			const char *v = kiln_config_get(cfg, sec, keys[k]), *p = v;
			while (p && *p) {
				char *end;
				while (*p == ' ' || *p == '\t' || *p == ',')
					p++;
				if (!*p)
					break;
				errno = 0;
				double d = common_strtod(p, &end);
				if (end > p && kiln_strtod_lost(d, errno) && (!*end || strchr(" \t,", *end)))
					return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s': %.*s is out of range (%s)",
							  kiln_config_where(cfg, sec, keys[k]), sec,
							  keys[k], v, (int)(end - p), p, KILN_DOUBLE_RANGE);
				if (end == p || !isfinite(d) || (*end && *end != ' ' && *end != '\t' && *end != ','))
					return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s' is not a number",
							  kiln_config_where(cfg, sec, keys[k]), sec,
							  keys[k], v);
				p = end;
			}
		}
	}
	return KILN_OK;
}

kiln_status kiln_config_check_train(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	if (!cfg)
		return kiln_null_arg("kiln_config_check_train", "cfg");
	struct kiln_run_cfg run;
	struct kiln_data_cfg data;
	struct kiln_train_cfg tc;
	int devices = 0;
	/* in the order `kiln train` reads them (cmd_train, read_config,
	 * open_device, the sources' open, model_create) */
	kiln_status st;
	if ((st = kiln_train_cfg_fill(cfg, NULL, &tc)) || (st = kiln_run_cfg_read(cfg, &run)) ||
	    (st = kiln_data_cfg_read(cfg, &data)) || (st = kiln_pipe_devices_count(cfg, &devices)) ||
	    (st = check_data_numbers(cfg)) || (st = kiln_model_check_names(cfg, reg)))
		return st;
	return kiln_config_check_layers(cfg, reg);
}
