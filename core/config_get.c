/* core/config_get.c - the config's typed getters: a key's value (with
 * [data.eval] and [data.val]'s inheritance from [data], else the schema's
 * default), where it was set, and the values as numbers and booleans,
 * range-checked against the schema with file:line.  The values were
 * checked against the schema in core/config_check.c.
 */
#include "config_impl.h"


int no_inherit(const char *key)
{
	/* files and split: never the training files by inheritance; limit:
	 * evaluation takes the whole test set unless its own section says */
	static const char *const keys[] = { "images", "labels", "split", "files", "shards", "limit" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
		if (!strcmp(key, keys[i]))
			return 1;
	return 0;
}

const char *kiln_config_get(const struct kiln_config *cfg, const char *section,
			    const char *key)
{
	if (!cfg || !section || !key)
		return NULL; /* (documented) */
	struct entry *e = kiln_cfg_find_entry(kiln_cfg_find_section(cfg, section), key);
	if (e)
		return e->value;
	/* [data.eval] inherits what it does not set from [data], except the
	 * keys that choose files or the split: evaluation must never read the
	 * training files by inheritance. */
	if ((!strcmp(section, "data.eval") || !strcmp(section, "data.val")) && !no_inherit(key) &&
	    (e = kiln_cfg_find_entry(kiln_cfg_find_section(cfg, "data"), key)) != NULL)
		return e->value;
	const struct kiln_key *k = lookup_key(cfg, section, key);
	return k ? k->def : NULL;
}

const char *kiln_config_where(const struct kiln_config *cfg, const char *section,
			      const char *key)
{
	if (!cfg || !section)
		return NULL; /* (documented) */
	const struct section *s = kiln_cfg_find_section(cfg, section);
	struct entry *e = kiln_cfg_find_entry(s, key);
	if (!key)
		return s ? s->where : cfg->file; /* no such section: the file lacks it */
	if (!e && (!strcmp(section, "data.eval") || !strcmp(section, "data.val")) && !no_inherit(key))
		e = kiln_cfg_find_entry(kiln_cfg_find_section(cfg, "data"), key);
	return e ? e->where : "default";
}

const char *kiln_config_file(const struct kiln_config *cfg)
{
	return cfg ? cfg->file : NULL;
}

const char *kiln_config_section(const struct kiln_config *cfg, int i)
{
	return cfg && i >= 0 && i < cfg->n ? cfg->s[i].name : NULL;
}

static kiln_status bad(const struct kiln_config *cfg, const char *section, const char *key,
		       const char *v, const char *what)
{
	return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s' is not %s",
			  kiln_config_where(cfg, section, key), section, key, v, what);
}

/* The value of a numeric key, an integer into *iout when iout is set, else
 * a number into *fout: parsed, range-checked against its schema row, with
 * file:line on failure (nothing written then). */
static kiln_status get_number(const struct kiln_config *cfg, const char *section, const char *key,
			      int64_t *iout, double *fout)
{
	const char *v = kiln_config_get(cfg, section, key);
	double x;
	long long ix;
	if (!v)
		return KILN_ENOTFOUND;
	if (parse_number(v, iout ? &ix : NULL, &x) && number_out_of_range(v, iout != NULL))
		return kiln_error(KILN_ECONFIG, "%s: [%s] %s = %s is out of range (%s)",
				  kiln_config_where(cfg, section, key), section, key, v,
				  iout ? "a 64-bit integer" : KILN_DOUBLE_RANGE);
	if (parse_number(v, iout ? &ix : NULL, &x))
		return bad(cfg, section, key, v, iout ? "an integer" : "a number");
	if (iout)
		x = (double)ix;
	const struct kiln_key *k = lookup_key(cfg, section, key);
	if (k && check_number(k, v, x))
		return kiln_error_wrap(KILN_ECONFIG, "%s: [%s]", kiln_config_where(cfg, section, key),
				       section);
	if (iout)
		*iout = ix;
	else
		*fout = x;
	return KILN_OK;
}

kiln_status kiln_config_get_int(const struct kiln_config *cfg, const char *section,
				const char *key, int64_t *out)
{
	if (!cfg || !section || !key || !out)
		return kiln_null_arg("kiln_config_get_int", !cfg ? "cfg" : !section ? "section" : !key ? "key" : "out");
	return get_number(cfg, section, key, out, NULL);
}

kiln_status kiln_config_get_float(const struct kiln_config *cfg, const char *section,
				  const char *key, double *out)
{
	if (!cfg || !section || !key || !out)
		return kiln_null_arg("kiln_config_get_float", !cfg ? "cfg" : !section ? "section" : !key ? "key" : "out");
	return get_number(cfg, section, key, NULL, out);
}

kiln_status kiln_config_get_bool(const struct kiln_config *cfg, const char *section,
				 const char *key, int *out)
{
	if (!cfg || !section || !key || !out)
		return kiln_null_arg("kiln_config_get_bool", !cfg ? "cfg" : !section ? "section" : !key ? "key" : "out");
	const char *v = kiln_config_get(cfg, section, key);
	int b;
	if (!v)
		return KILN_ENOTFOUND;
	if (parse_bool(v, &b))
		return bad(cfg, section, key, v, "a boolean (0/1, true/false, yes/no, on/off)");
	*out = b;
	return KILN_OK;
}

kiln_status kiln_config_get_str(const struct kiln_config *cfg, const char *section,
				const char *key, const char **out)
{
	if (!cfg || !section || !key || !out)
		return kiln_null_arg("kiln_config_get_str", !cfg ? "cfg" : !section ? "section" : !key ? "key" : "out");
	const char *v = kiln_config_get(cfg, section, key);
	if (!v)
		return KILN_ENOTFOUND;
	*out = v;
	return KILN_OK;
}
