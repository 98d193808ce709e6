/* core/config_write.c - the resolved config (`kiln config FILE`, a
 * checkpoint's config.ini): every section in order with each key's value
 * or default, and every key at its default (kiln_config_write_defaults,
 * what a checkpoint's config is compared against).
 */
#include "config_impl.h"
#include "config_diff.h" /* kiln_kv_parse: a text's lines */

#include <stdio.h>


/* How a section is written: resolved (each key's value, else its
 * default), every key at its default (what a key the config does not
 * set reads as, the layer's type kept), resolved with each value in its
 * canonical text (kiln_config_value_canon: what config_hash hashes), or
 * that without the keys left unset (what kiln.layers records since
 * session 42). */
enum write_mode { WRITE_RESOLVED, WRITE_DEFAULTS, WRITE_CANON, WRITE_CANON_SET };

/* "key = value" of value v of row t in [name]: canon, its canonical text. */
static void write_value(FILE *f, const struct kiln_config *cfg, const char *name,
			const struct kiln_key *t, const char *v, int canon)
{
	char c[300];
	if (canon && kiln_config_value_canon(cfg, name, t, v, strlen(v), c, sizeof c))
		v = c;
	fprintf(f, "%s = %s\n", t->name, v);
}

/* The keys of table t in [name]: canon, each value in its canonical
 * text; unset, a "; key = (unset)" line for each key neither set nor
 * with a default (else none). */
static void write_keys(FILE *f, const struct kiln_config *cfg, const char *name,
		       const struct section *s, const struct section *parent,
		       const struct kiln_key *t, int canon, int unset)
{
	for (; t && t->name; t++) {
		struct entry *e = kiln_cfg_find_entry(s, t->name);
		if (!e && !no_inherit(t->name))
			e = kiln_cfg_find_entry(parent, t->name); /* [data.eval] inherits from [data] */
		if (e || t->def)
			write_value(f, cfg, name, t, e ? e->value : t->def, canon);
		else if (unset)
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
	const int canon = mode == WRITE_CANON || mode == WRITE_CANON_SET,
		  unset = mode != WRITE_CANON_SET;
	fprintf(f, "[%s]\n", name);
	write_keys(f, cfg, name, s, parent, base_schema(name), canon, unset);
	if ((reg || !strcmp(name, "train")) && kiln_config_ext_schema(cfg, reg, name, &ext) == KILN_OK)
		write_keys(f, cfg, name, s, parent, ext, canon, unset);
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

kiln_status kiln_config_write_layers(const struct kiln_config *cfg, FILE *f, int how)
{
	const enum write_mode mode = how == KILN_LAYERS_DEFAULTS ? WRITE_DEFAULTS
				     : how == KILN_LAYERS_SET    ? WRITE_CANON_SET
								 : WRITE_CANON;
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "layer."))
			write_section_as(f, cfg, (struct kiln_registry *)cfg->reg, cfg->s[i].name,
					 mode);
	return ferror(f) ? kiln_error(KILN_EIO, "write error") : KILN_OK;
}

/* ---- a text's [layer.*] sections, its unset keys written back ------------- */

/* The keys of a layer of `type` (n bytes; NULL: none) in schema order,
 * NULL-terminated into t (room for cap): the layers' common keys, then
 * its type's (the registry cfg was validated with, else the built-in
 * layers'; none for a type neither knows). */
static void layer_schema(const struct kiln_config *cfg, const char *type, int n,
			 const struct kiln_key **t, int cap)
{
	const struct kiln_key *tabs[2] = { kiln_config_layer_keys(), NULL };
	const struct kiln_plugin *p = NULL;
	char name[128];
	int k = 0;
	snprintf(name, sizeof name, "%.*s", type ? n : 0, type ? type : "");
	if (type && cfg->reg && kiln_registry_find(cfg->reg, KILN_PLUGIN_LAYER, name, &p) == KILN_OK)
		tabs[1] = p->keys;
	for (int i = 0; type && !tabs[1] && kiln_builtin_layers[i]; i++)
		if (!strcmp(kiln_builtin_layers[i]->name, name))
			tabs[1] = kiln_builtin_layers[i]->keys;
	for (int i = 0; i < 2; i++)
		for (const struct kiln_key *r = tabs[i]; r && r->name && k < cap - 1; r++)
			t[k++] = r;
	t[k] = NULL;
}

static int kv_key_is(const struct kiln_kv *e, const char *key)
{
	return (size_t)e->key_n == strlen(key) && !memcmp(e->key, key, (size_t)e->key_n);
}

/* "; key = (unset)" for each key of schema t[from, to) with no default
 * that section v[0..n) lacks. */
static void unset_between(FILE *f, const struct kiln_key *const *t, int from, int to,
			  const struct kiln_kv *v, int n)
{
	for (int q = from; q < to; q++) {
		int has = 0;
		for (int j = 0; j < n && !has; j++)
			has = kv_key_is(&v[j], t[q]->name);
		if (!has && !t[q]->def)
			fprintf(f, "; %s = (unset)\n", t[q]->name);
	}
}

/* Section v[0..n) (one section's entries) with its unset keys written
 * back in their schema places: its own lines in their order. */
static void section_unset_back(FILE *f, const struct kiln_config *cfg, const struct kiln_kv *v,
			       int n)
{
	const struct kiln_key *t[256];
	const struct kiln_kv *type = NULL;
	int nt = 0, at = 0;
	for (int j = 0; j < n && !type; j++)
		type = kv_key_is(&v[j], "type") && v[j].val ? &v[j] : NULL;
	layer_schema(cfg, type ? type->val : NULL, type ? type->val_n : 0, t, 256);
	while (t[nt])
		nt++;
	fprintf(f, "[%.*s]\n", v[0].sec_n, v[0].sec);
	for (int j = 0; j < n; j++) {
		int q = at;
		while (q < nt && !kv_key_is(&v[j], t[q]->name))
			q++;
		if (q < nt) { /* a schema key: the unset ones before it first */
			unset_between(f, t, at, q, v, n);
			at = q + 1;
		}
		if (v[j].val)
			fprintf(f, "%.*s = %.*s\n", v[j].key_n, v[j].key, v[j].val_n, v[j].val);
		else
			fprintf(f, "; %.*s = (unset)\n", v[j].key_n, v[j].key);
	}
	unset_between(f, t, at, nt, v, n);
	fprintf(f, "\n");
}

char *kiln_config_layers_of(const struct kiln_config *cfg, const char *text)
{
	struct kiln_kv *v = NULL;
	int n = 0;
	char *out = NULL;
	size_t len = 0;
	FILE *f = NULL;
	if (kiln_kv_parse(text, &v, &n) || !(f = open_memstream(&out, &len))) {
		free(v);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	for (int i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && v[j].sec == v[i].sec; j++)
			;
		if (v[i].sec_n > 6 && !strncmp(v[i].sec, "layer.", 6))
			section_unset_back(f, cfg, v + i, j - i);
	}
	free(v);
	if (fclose(f)) {
		free(out);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	return out;
}
