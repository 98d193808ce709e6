/* core/config_same.c - a config value by what it means: one canonical
 * text per meaning, by the key's schema row (its type is the schema's, the
 * one place it lives) and read with the schema's own parsers
 * (config_check.c), so that `lr = 0.10` and `lr = 1e-1`, `shuffle = true`
 * and `shuffle = 1`, `padding = 2, 0` and `padding = 2,0` are one value.
 * What resuming (core/resume.c), the ranks' agreement
 * (core/dist_config.c) and an export's config_hash (core/weights.c,
 * through kiln_config_write_layers) share. */
#include "config_impl.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c, common_strtod */

#include <stdio.h>

int kiln_config_pair_key(const char *section, const char *type, size_t type_n, const char *key)
{
	if (strncmp(section, "layer.", 6) || !type)
		return 0;
	for (int i = 0; kiln_builtin_layers[i]; i++) {
		const char *name = kiln_builtin_layers[i]->name;
		if (strlen(name) != type_n || memcmp(name, type, type_n))
			continue;
		for (const struct kiln_key *t = kiln_builtin_layers[i]->keys; t && t->name; t++)
			if (!strcmp(t->name, key))
				return t->type == KILN_KEY_INTS;
	}
	return 0;
}

/* Whole numbers n[0..k) as "a,b,c" into out; pair: "N" for (N, N), the
 * form kiln writes and users mostly do.  0, or -1 when out is short. */
static int write_ints(const long long *n, int k, int pair, char *out, size_t outn)
{
	size_t off = 0;
	if (pair && k == 2 && n[0] == n[1])
		k = 1;
	out[0] = 0;
	for (int i = 0; i < k; i++) {
		int w = snprintf(out + off, outn - off, i ? ",%lld" : "%lld", n[i]);
		if (w < 0 || (size_t)w >= outn - off)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* x as the shortest %g text that reads back as x (C locale): 0.1 for
 * 0.10 and 1e-1; -0 is 0 (equal numbers, one text). */
static int write_float(double x, char *out, size_t outn)
{
	if (x == 0)
		x = 0;
	for (int prec = 15; prec <= 17; prec++) {
		if (common_snprintf_c(out, outn, "%.*g", prec, x) >= (int)outn)
			return -1;
		if (common_strtod(out, NULL) == x)
			break;
	}
	return 0;
}

int kiln_config_value_canon(const struct kiln_config *cfg, const char *section,
			    const struct kiln_key *k, const char *v, size_t n, char *out, size_t outn)
{
	char text[256];
	long long i, ints[64];
	int64_t steps[KILN_MAX_MILESTONES];
	double x;
	int b, count;
	if (!k || n >= sizeof text || !outn)
		return 0;
	snprintf(text, sizeof text, "%.*s", (int)n, v);
	/* [train] milestones is a list the schema cannot type: read by its
	 * reader's parser, as check_parsed checks it */
	if (!strcmp(section, "train") && !strcmp(k->name, "milestones")) {
		if (!*text || (count = kiln_parse_milestones(text, steps)) < 0)
			return 0;
		for (int j = 0; j < count; j++)
			ints[j] = steps[j];
		return !write_ints(ints, count, 0, out, outn);
	}
	switch (k->type) {
	case KILN_KEY_INT: /* a choice word ("auto") is its text */
		return !parse_number(text, &i, NULL) && !write_ints(&i, 1, 0, out, outn);
	case KILN_KEY_FLOAT:
		return !parse_number(text, NULL, &x) && !write_float(x, out, outn);
	case KILN_KEY_BOOL:
		if (parse_bool(text, &b)) /* a choice word */
			return 0;
		snprintf(out, outn, "%d", b);
		return 1;
	case KILN_KEY_INTS: {
		const char *type = strncmp(section, "layer.", 6) ? NULL : kiln_config_get(cfg, section, "type");
		int pair = kiln_config_pair_key(section, type, type ? strlen(type) : 0, k->name);
		count = parse_ints(v, n, ints, pair ? 2 : (int)KILN_ARRAY_LEN(ints), NULL);
		return count > 0 && !write_ints(ints, count, pair, out, outn);
	}
	default: /* text: STR, LIST, ENUM (an enum's words are exact) */
		return 0;
	}
}

int kiln_config_values_same(const struct kiln_config *cfg, const char *section, const char *key,
			    const char *a, size_t an, const char *b, size_t bn)
{
	if (!a || !b)
		return 0;
	if (an == bn && !memcmp(a, b, an))
		return 1;
	if (!cfg)
		return 0;
	/* the row of the current config: a layer's keys by its type, a
	 * plugin's (layer, device, source, optimizer) by the plugin */
	const struct kiln_key *k = lookup_key(cfg, section, key);
	char ca[300], cb[300];
	return kiln_config_value_canon(cfg, section, k, a, an, ca, sizeof ca) &&
	       kiln_config_value_canon(cfg, section, k, b, bn, cb, sizeof cb) && !strcmp(ca, cb);
}
