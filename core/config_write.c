/* core/config_write.c - the resolved config (`kiln config FILE`, a
 * checkpoint's config.ini): every section in order with each key's value
 * or default, and every key at its default (kiln_config_write_defaults,
 * what a checkpoint's config is compared against).
 */
#include "config_impl.h"

#include <stdio.h>


/* How a section is written: resolved (each key's value, else its
 * default), every key at its default (what a key the config does not
 * set reads as, the layer's type kept), or resolved with each value in its
 * canonical text (kiln_config_value_canon: what config_hash hashes). */
enum write_mode { WRITE_RESOLVED, WRITE_DEFAULTS, WRITE_CANON };

/* "key = value" of value v of row t in [name]: canon, its canonical text. */
static void write_value(FILE *f, const struct kiln_config *cfg, const char *name,
			const struct kiln_key *t, const char *v, int canon)
{
	char c[300];
	if (canon && kiln_config_value_canon(cfg, name, t, v, strlen(v), c, sizeof c))
		v = c;
	fprintf(f, "%s = %s\n", t->name, v);
}

static void write_keys(FILE *f, const struct kiln_config *cfg, const char *name,
		       const struct section *s, const struct section *parent,
		       const struct kiln_key *t, int canon)
{
	for (; t && t->name; t++) {
		struct entry *e = kiln_cfg_find_entry(s, t->name);
		if (!e && !no_inherit(t->name))
			e = kiln_cfg_find_entry(parent, t->name); /* [data.eval] inherits from [data] */
		if (e || t->def)
			write_value(f, cfg, name, t, e ? e->value : t->def, canon);
		else
			fprintf(f, "; %s = (unset)\n", t->name);
	}
}

/* Section `name` as `mode` says. */
static void write_section_as(FILE *f, const struct kiln_config *cfg, struct kiln_registry *reg,
			     const char *name, enum write_mode mode)
{
	const struct section *s = mode == WRITE_DEFAULTS ? NULL : kiln_cfg_find_section(cfg, name);
	const struct section *parent = strcmp(name, "data.eval") && strcmp(name, "data.val")
					       ? NULL
					       : kiln_cfg_find_section(cfg, "data");
	const struct kiln_key *ext = NULL;
	fprintf(f, "[%s]\n", name);
	write_keys(f, cfg, name, s, parent, base_schema(name), mode == WRITE_CANON);
	if ((reg || !strcmp(name, "train")) && kiln_config_ext_schema(cfg, reg, name, &ext) == KILN_OK)
		write_keys(f, cfg, name, s, parent, ext, mode == WRITE_CANON);
	fprintf(f, "\n");
}

static void write_section(FILE *f, const struct kiln_config *cfg, struct kiln_registry *reg,
			  const char *name)
{
	write_section_as(f, cfg, reg, name, WRITE_RESOLVED);
}

kiln_status kiln_config_write_defaults(const struct kiln_config *cfg, struct kiln_registry *reg,
				       FILE *f)
{
	for (int i = 0; i < cfg->n; i++)
		write_section_as(f, cfg, reg, cfg->s[i].name, WRITE_DEFAULTS);
	static const char *const fixed[] = { "run", "data", "data.eval", "model", "train", "dist", "log", "pipeline" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(fixed); i++)
		if (!kiln_cfg_find_section(cfg, fixed[i]))
			write_section_as(f, cfg, reg, fixed[i], WRITE_DEFAULTS);
	/* every loaded plugin's [plugin.NAME] the config leaves out: a
	 * checkpoint's config that set one of its keys holds all of them,
	 * which must read as their defaults here */
	for (int i = 0; reg && i < kiln_registry_loaded_count(reg); i++) {
		struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
		char name[160];
		kiln_registry_plugin_get(reg, i, &pi);
		if (!pi.keys || (pi.kind != KILN_PLUGIN_DEVICE && pi.kind != KILN_PLUGIN_COMM &&
				 pi.kind != KILN_PLUGIN_PRECISION && pi.kind != KILN_PLUGIN_OPTIM))
			continue;
		snprintf(name, sizeof name, "plugin.%s", pi.name);
		if (!kiln_cfg_find_section(cfg, name))
			write_section_as(f, cfg, reg, name, WRITE_DEFAULTS);
	}
	return ferror(f) ? kiln_error(KILN_EIO, "write error") : KILN_OK;
}

kiln_status kiln_config_write(const struct kiln_config *cfg, struct kiln_registry *reg,
			      FILE *f)
{
	if (!cfg || !f)
		return kiln_null_arg("kiln_config_write", !cfg ? "cfg" : "f");
	static const char *const order[] = { "run", "data", "data.eval", "model" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(order); i++) {
		write_section(f, cfg, reg, order[i]);
		/* [data.val] only when the config has one */
		if (!strcmp(order[i], "data.eval") && kiln_cfg_find_section(cfg, "data.val"))
			write_section(f, cfg, reg, "data.val");
	}
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "layer."))
			write_section(f, cfg, reg, cfg->s[i].name);
	write_section(f, cfg, reg, "train");
	write_section(f, cfg, reg, "dist");
	write_section(f, cfg, reg, "log");
	write_section(f, cfg, reg, "pipeline");
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "plugin."))
			write_section(f, cfg, reg, cfg->s[i].name);
	/* [run] precision = fp16, fp16_static: the loss scaler's keys are in
	 * effect, so [plugin.amp] is written (its defaults) though the config
	 * has none (before session 30 it was not: kiln config hid them).  A
	 * checkpoint without it resumes: the comparison reads an absent key
	 * as its default (kiln_config_write_defaults). */
	const char *prec = kiln_config_get(cfg, "run", "precision");
	const struct kiln_key *amp = NULL;
	if (prec && !strncmp(prec, "fp16", 4) && !kiln_cfg_find_section(cfg, "plugin.amp") && reg &&
	    kiln_config_ext_schema(cfg, reg, "plugin.amp", &amp) == KILN_OK)
		write_section(f, cfg, reg, "plugin.amp");
	return ferror(f) ? kiln_error(KILN_EIO, "write error") : KILN_OK;
}

kiln_status kiln_config_write_layers(const struct kiln_config *cfg, FILE *f, int defaults)
{
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "layer."))
			write_section_as(f, cfg, (struct kiln_registry *)cfg->reg, cfg->s[i].name,
					 defaults ? WRITE_DEFAULTS : WRITE_CANON);
	return ferror(f) ? kiln_error(KILN_EIO, "write error") : KILN_OK;
}
