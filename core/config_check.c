/* core/config_check.c - the config against its schema: the schema rows
 * of a section's keys, each value checked against its type and range, and
 * the errors with file:line and "did you mean".  The typed getters and
 * [data.eval]'s inheritance are in core/config_get.c, the resolved dump
 * (`kiln config FILE`) in core/config_write.c. */
#include "config_impl.h"
#include "transform.h" /* kiln_xform_parse_size */
#include "../plugins/common/c_locale.h" /* common_strtod */

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <strings.h>

/* ---- schema ----------------------------------------------------------- */

static const struct kiln_key *find_key(const struct kiln_key *t, const char *name)
{
	for (; t && t->name; t++)
		if (!strcmp(t->name, name))
			return t;
	return NULL;
}

int is_prefixed(const char *s, const char *prefix)
{
	size_t n = strlen(prefix);
	return !strncmp(s, prefix, n) && s[n];
}

/* Base table of a section, or NULL for an unknown section. */
const struct kiln_key *base_schema(const char *section)
{
	const struct kiln_key *k = kiln_config_schema(section);
	if (k)
		return k;
	if (is_prefixed(section, "layer."))
		return kiln_layer_common_keys;
	if (is_prefixed(section, "plugin.")) {
		static const struct kiln_key none[] = { { NULL, 0, NULL, 0, 0, NULL, NULL } };
		return none;
	}
	return NULL;
}

const struct kiln_key *lookup_key(const struct kiln_config *cfg, const char *section,
				  const char *key)
{
	const struct kiln_key *k = find_key(base_schema(section), key);
	if (k)
		return k;
	const struct kiln_key *ext = NULL;
	if ((cfg->reg || !strcmp(section, "train")) &&
	    kiln_config_ext_schema(cfg, cfg->reg, section, &ext) == KILN_OK)
		return find_key(ext, key);
	return NULL;
}

int kiln_config_key_default(const struct kiln_config *cfg, const char *section, const char *key,
			    const char **def)
{
	/* an unknown section's lookup may set the thread's error text: the
	 * caller reports its own */
	const struct kiln_key *k = lookup_key(cfg, section, key);
	if (!k)
		return 0;
	*def = k->def;
	return 1;
}

/* PyTorch, Lightning and Hugging Face names of kiln's keys: a user's first
 * guess, too far from kiln's name for the edit distance ("batch_size" is
 * closer to "step_size" than to "batch").  An alias is suggested only
 * where its key is valid in the section. */
static const struct {
	const char *alias, *key;
} key_aliases[] = {
	{ "batch_size", "batch" },            { "learning_rate", "lr" },
	{ "num_workers", "workers" },         { "prefetch_factor", "prefetch" },
	{ "warmup_steps", "warmup" },         { "warmup_iters", "warmup" },
	{ "max_epochs", "epochs" },           { "num_epochs", "epochs" },
	{ "n_epochs", "epochs" },             { "max_iters", "max_steps" },
	{ "gradient_clip_val", "clip_norm" }, { "max_grad_norm", "clip_norm" },
	{ "grad_clip", "clip_norm" },         { "clip_grad_norm", "clip_norm" },
	{ "accumulate_grad_batches", "accumulate" },
	{ "gradient_accumulation_steps", "accumulate" },
	{ "val_check_interval", "eval_every" }, { "eval_steps", "eval_every" },
	{ "log_every_n_steps", "log_every" }, { "logging_steps", "log_every" },
	{ "save_steps", "checkpoint_every" }, { "save_total_limit", "keep_last" },
	{ "lr_scheduler", "schedule" },       { "scheduler", "schedule" },
	{ "eta_min", "lr_min" },              { "min_lr", "lr_min" },
	{ "patience", "early_stop_patience" }, { "output_dir", "out_dir" },
	{ "num_threads", "threads" },         { "random_seed", "seed" },
	{ "mixed_precision", "precision" },   { "out_features", "out" },
	{ "out_channels", "out" },            { "kernel_size", "kernel" },
	{ "num_heads", "heads" },             { "n_head", "heads" },
	{ "hidden_size", "hidden" },          { "block_size", "context" },
	{ "vocab_size", "vocab" },
};

/* The key tables a suggestion for section s draws from, NULL-terminated:
 * its own (base, ext) and, for [train], every built-in optimizer's, which
 * [train] accepts whatever the optimizer ("bata1" with sgd: 'beta1', not
 * 'batch', before session 34). */
static void suggest_tables(const char *s, const struct kiln_key *base, const struct kiln_key *ext,
			   const struct kiln_key *t[8])
{
	int n = 0;
	t[n++] = base;
	if (ext)
		t[n++] = ext;
	for (int i = 0; !strcmp(s, "train") && kiln_builtin_optims[i] && n < 7; i++)
		t[n++] = kiln_builtin_optims[i]->keys;
	t[n] = NULL;
}

static const char *valid_key(const char *name, const struct kiln_key *const *t)
{
	for (; *t; t++) {
		const struct kiln_key *k = find_key(*t, name);
		if (k)
			return k->name;
	}
	return NULL;
}

/* The suggestion for an unknown key among the keys of tables t: a known
 * alias; else a valid key one edit away (a typo); else the longest valid
 * key the word starts with, followed by '_' ("lr_rate", "batch_size");
 * else the closest key within half the word's length. */
static void suggest(const char *word, const struct kiln_key *const *t, char *out, size_t n)
{
	const char *best = NULL, *prefix = NULL;
	int bd = 1 << 30;
	out[0] = 0;
	for (size_t i = 0; i < KILN_ARRAY_LEN(key_aliases); i++)
		if (!strcasecmp(word, key_aliases[i].alias) &&
		    (best = valid_key(key_aliases[i].key, t))) {
			snprintf(out, n, "; did you mean '%s'?", best);
			return;
		}
	for (; *t; t++)
		for (const struct kiln_key *k = *t; k->name; k++) {
			int d = kiln_edit_distance(word, k->name);
			size_t kl = strlen(k->name);
			if (d < bd || (d == bd && kl < strlen(best))) {
				bd = d;
				best = k->name;
			}
			if (!strncmp(word, k->name, kl) && word[kl] == '_' &&
			    (!prefix || kl > strlen(prefix)))
				prefix = k->name;
		}
	int lim = (int)strlen(word) / 2;
	if (lim < 2)
		lim = 2;
	if (prefix && bd > 1)
		best = prefix;
	else if (best && bd > lim)
		best = NULL;
	if (best)
		snprintf(out, n, "; did you mean '%s'?", best);
}

/* "; 'seed' is a key of [run]" when fixed sections other than `section`
 * have the key (a key in the wrong section: [train] seed, data.lr), into
 * out; "" when none do.  [data.eval] and [data.val] are named only where
 * [data] is not. */
static void other_sections(const char *section, const char *key, char *out, size_t n)
{
	char secs[160] = "";
	size_t off = 0;
	const char *name;
	out[0] = 0;
	for (int i = 0; (name = kiln_schema_fixed_name(i, NULL)) && off < sizeof secs; i++) {
		const struct kiln_key *k = find_key(kiln_config_schema(name), key);
		if (!k && !strcmp(name, "train"))
			k = kiln_optim_any_key(key);
		if (!k || !strcmp(name, section) || (is_prefixed(name, "data.") && strstr(secs, "[data]")))
			continue;
		off += (size_t)snprintf(secs + off, sizeof secs - off, "%s[%s]", off ? " or " : "", name);
	}
	if (off) {
		snprintf(out, n, "; '%s' is a key of %s", key, secs);
		return;
	}
	/* else PyTorch's name of another section's key ([data] batch_size, as
	 * DataLoader takes it, is [train] batch; no word before session 50) */
	for (size_t a = 0; a < KILN_ARRAY_LEN(key_aliases); a++) {
		if (strcasecmp(key, key_aliases[a].alias) ||
		    find_key(kiln_config_schema(section), key_aliases[a].key))
			continue;
		for (int i = 0; (name = kiln_schema_fixed_name(i, NULL)); i++)
			if (strcmp(name, section) && !is_prefixed(name, "data.") &&
			    find_key(kiln_config_schema(name), key_aliases[a].key)) {
				/* (an evaluation loader's batch is [train] eval_batch) */
				const int ev = is_prefixed(section, "data.") &&
					       !strcmp(key_aliases[a].key, "batch");
				snprintf(out, n, "; '%s' is [%s] %s", key, name,
					 ev ? "eval_batch" : key_aliases[a].key);
				return;
			}
	}
	/* else of built-in layer types ([train] label_smoothing: the loss
	 * layer's, as PyTorch's CrossEntropyLoss takes it) */
	for (int i = 0; !is_prefixed(section, "layer.") && kiln_builtin_layers[i] &&
			off < sizeof secs; i++)
		if (find_key(kiln_builtin_layers[i]->keys, key))
			off += (size_t)snprintf(secs + off, sizeof secs - off, "%s%s", off ? " or " : "",
						kiln_builtin_layers[i]->name);
	if (off)
		snprintf(out, n, "; '%s' is a key of a [layer.NAME] of type %s", key, secs);
}

static void list_keys(const struct kiln_key *a, const struct kiln_key *b, char *out, size_t n)
{
	size_t off = 0;
	out[0] = 0;
	for (int pass = 0; pass < 2; pass++)
		for (const struct kiln_key *k = pass ? b : a; k && k->name && off < n; k++)
			off += (size_t)snprintf(out + off, n - off, "%s%s", off ? ", " : "", k->name);
	if (!off)
		snprintf(out, n, "(none)");
}

/* Check value text against its key's type.  Returns 0 or sets an error
 * (without location) and returns KILN_ECONFIG. */
static kiln_status check_value(const struct kiln_key *k, const char *v);

/* 1 when v is a decimal number: [+-]digits[.digits][e[+-]digits] (a
 * fraction or exponent only when fraction is set), then spaces; no hex,
 * inf or nan, which strtod would take. */
static int decimal_syntax(const char *v, int fraction)
{
	int digits = 0;
	if (*v == '+' || *v == '-')
		v++;
	for (; isdigit((unsigned char)*v); v++)
		digits++;
	if (fraction && *v == '.')
		for (v++; isdigit((unsigned char)*v); v++)
			digits++;
	if (!digits)
		return 0;
	if (fraction && (*v == 'e' || *v == 'E')) {
		v++;
		if (*v == '+' || *v == '-')
			v++;
		if (!isdigit((unsigned char)*v))
			return 0;
		while (isdigit((unsigned char)*v))
			v++;
	}
	while (isspace((unsigned char)*v))
		v++;
	return !*v;
}

/* v, spaces around it allowed, as a whole number into *iout when iout is
 * set, else as a finite number into *fout.  0, or -1 (nothing written). */
int parse_number(const char *v, long long *iout, double *fout)
{
	char *end;
	long long i = 0;
	double x = 0;
	errno = 0;
	while (isspace((unsigned char)*v))
		v++;
	if (!decimal_syntax(v, !iout))
		return -1;
	if (iout)
		i = strtoll(v, &end, 10);
	else
		x = common_strtod(v, &end); /* '.', whatever the application's locale */
	while (isspace((unsigned char)*end))
		end++;
	/* (a subnormal, which strtod flags ERANGE, is a number a double holds) */
	if ((errno && (iout || kiln_strtod_lost(x, errno))) || *end || !isfinite(x))
		return -1;
	if (iout)
		*iout = i;
	else
		*fout = x;
	return 0;
}

static int bounded(const struct kiln_key *k)
{
	return k->min != 0 || k->max != 0;
}

/* 1 when v is written as a number that its type cannot hold, which
 * parse_number refuses: a whole number past int64 ("9223372036854775808"
 * was "not an integer" before session 34), a number past a double's
 * range ("1e-400", "1e400" were "not a number" before session 38; a
 * subnormal, "1e-310", is read as it is since then). */
int number_out_of_range(const char *v, int integer)
{
	while (isspace((unsigned char)*v))
		v++;
	if (!decimal_syntax(v, !integer))
		return 0;
	errno = 0;
	if (integer) {
		(void)strtoll(v, NULL, 10);
		return errno == ERANGE;
	}
	const double x = common_strtod(v, NULL);
	return kiln_strtod_lost(x, errno);
}

static kiln_status out_of_range(const struct kiln_key *k, const char *v)
{
	if (bounded(k))
		return kiln_error(KILN_ECONFIG, "'%s' = %s is out of range [%.15g, %.15g]", k->name, v,
				  k->min, k->max);
	return kiln_error(KILN_ECONFIG, "'%s' = %s is out of range (a 64-bit integer)", k->name, v);
}

int parse_bool(const char *v, int *out)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };
	for (size_t i = 0; i < 4; i++) {
		if (!strcasecmp(v, yes[i])) {
			*out = 1;
			return 0;
		}
		if (!strcasecmp(v, no[i])) {
			*out = 0;
			return 0;
		}
	}
	return -1;
}

static int in_choices(const char *choices, const char *v)
{
	size_t n = strlen(v);
	for (const char *c = choices; c && *c;) {
		const char *bar = strchr(c, '|');
		size_t len = bar ? (size_t)(bar - c) : strlen(c);
		if (len == n && !strncmp(c, v, n))
			return 1;
		c = bar ? bar + 1 : c + len;
	}
	return 0;
}

kiln_status check_number(const struct kiln_key *k, const char *v, double x)
{
	if (bounded(k) && (x < k->min || x > k->max))
		return out_of_range(k, v);
	return KILN_OK;
}

/* KILN_KEY_INTS: integers separated by commas (parse_ints reads them),
 * each in the key's range, checked in order up to the number refused.
 * An empty number ("1,", ",1", "1,,2") is refused: "1," once passed as
 * "1" (strtok_r skips empty tokens) while the conv layer read it as
 * (1, 0). */
static kiln_status check_ints(const struct kiln_key *k, const char *v)
{
	size_t n = strlen(v);
	int max = 1; /* the numbers a value can hold: one more than its commas */
	for (const char *c = v; (c = strchr(c, ',')); c++)
		max++;
	long long *x = malloc(sizeof *x * (size_t)max);
	if (!x)
		return kiln_error(KILN_ENOMEM, "out of memory");
	struct ints_stop stop;
	int count = parse_ints(v, n, x, max, &stop);
	for (int j = 0; j < (count < 0 ? stop.i : count); j++)
		if (check_number(k, v, (double)x[j])) {
			free(x);
			return KILN_ECONFIG;
		}
	free(x);
	if (count >= 0)
		return KILN_OK;
	/* the refused number's text as far as its first 63 bytes */
	char tok[64];
	snprintf(tok, sizeof tok, "%.*s", (int)(stop.len < sizeof tok ? stop.len : sizeof tok - 1),
		 v + stop.at);
	if (!tok[strspn(tok, " \t")]) {
		if (!stop.i && stop.at + stop.len == n)
			return kiln_error(KILN_ECONFIG, "'%s' is empty; expected integers like 1,28,28",
					  k->name);
		return kiln_error(KILN_ECONFIG, "'%s' = '%s': number %d is empty (expected integers separated by commas)",
				  k->name, v, stop.i + 1);
	}
	return kiln_error(KILN_ECONFIG, "'%s' = '%s': '%s' is not an integer", k->name, v, tok);
}

int parse_ints(const char *v, size_t n, long long *out, int max, struct ints_stop *stop)
{
	char tok[64];
	int count = 0;
	for (size_t i = 0;; i++) {
		size_t len = 0;
		while (i + len < n && v[i + len] != ',')
			len++;
		if (stop)
			stop->i = count, stop->at = i, stop->len = len;
		if (len >= sizeof tok || count == max)
			return -1;
		snprintf(tok, sizeof tok, "%.*s", (int)len, v + i);
		/* an empty number ("1,", ",1", "1,,2", spaces alone) is refused */
		if (!tok[strspn(tok, " \t")] || parse_number(tok, &out[count], NULL))
			return -1;
		count++;
		i += len;
		if (i >= n)
			return count;
	}
}

/* A value that config.ini cannot hold: inih reads a ';' at the start of
 * a value, or after a space, as a comment's start (a file cannot say
 * such a value; an override or kiln_config_set can), so the run's
 * config.ini read it back cut (before session 36 `data.path=fm ;v2`
 * trained on "fm ;v2" and its config.ini said "fm"). */
static kiln_status check_comment(const struct kiln_key *k, const char *v)
{
	const char *c = *v == ';' ? v : strstr(v, " ;");
	if (!c)
		return KILN_OK;
	while (c > v && c[-1] == ' ')
		c--; /* what inih keeps: the value before the comment, trimmed */
	return kiln_error(KILN_ECONFIG, "'%s' = '%s': a ';' at the start of a value or after a space starts a comment in an INI file, so config.ini would read it back as '%.*s': write the value without it",
			  k->name, v, (int)(c - v), v);
}

static kiln_status check_value(const struct kiln_key *k, const char *v)
{
	long long i;
	double x;
	int b;
	switch (k->type) {
	case KILN_KEY_STR:
	case KILN_KEY_LIST:
		/* a value is one line of config.ini, which is written from it */
		for (const char *c = v; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				return kiln_error(KILN_ECONFIG, "'%s': its value holds a control character (byte 0x%02x at offset %d); a value is one line of text",
						  k->name, (unsigned char)*c, (int)(c - v));
		return check_comment(k, v);
	case KILN_KEY_INT:
		if (k->choices && in_choices(k->choices, v))
			return KILN_OK;
		if (parse_number(v, &i, NULL) && number_out_of_range(v, 1))
			return out_of_range(k, v);
		if (parse_number(v, &i, NULL))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not an integer%s%s", k->name, v,
					  k->choices ? " or one of " : "", k->choices ? k->choices : "");
		return check_number(k, v, (double)i);
	case KILN_KEY_FLOAT:
		if (parse_number(v, NULL, &x) && number_out_of_range(v, 0))
			return kiln_error(KILN_ECONFIG, "'%s' = %s is out of range (%s)", k->name, v,
					  KILN_DOUBLE_RANGE);
		if (parse_number(v, NULL, &x))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not a number", k->name, v);
		return check_number(k, v, x);
	case KILN_KEY_BOOL:
		if (k->choices && in_choices(k->choices, v))
			return KILN_OK;
		if (parse_bool(v, &b))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not a boolean (0/1, true/false, yes/no, on/off)%s%s",
					  k->name, v, k->choices ? " or one of " : "", k->choices ? k->choices : "");
		return KILN_OK;
	case KILN_KEY_ENUM:
		if (!in_choices(k->choices, v)) {
			char sug[100];
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not one of %s%s", k->name, v,
					  k->choices, kiln_suggest_choice(v, k->choices, sug, sizeof sug));
		}
		return KILN_OK;
	case KILN_KEY_INTS:
		return check_ints(k, v);
	}
	return kiln_error(KILN_EINTERNAL, "key '%s' has unknown type %d", k->name, k->type);
}

/* `section.key=` on the command line unsets the key, so its default
 * applies (docs/config.md), unless the key is text with a default: then
 * the empty string is its value (`run.out_dir=`: no out_dir).  Removes
 * entry j of s and returns 1 when it is such an override. */
static int unset_override(struct section *s, int j, const struct kiln_key *k)
{
	struct entry *e = &s->e[j];
	if (*e->value || strncmp(e->where, "command line", 12) ||
	    ((k->type == KILN_KEY_STR || k->type == KILN_KEY_LIST) && k->def))
		return 0;
	/* remembered for kiln_config_unset_note (best effort: no memory, no
	 * note) */
	struct entry *u = realloc(s->unset, sizeof *u * (size_t)(s->n_unset + 1));
	if (u) {
		s->unset = u;
		u[s->n_unset].key = e->key, u[s->n_unset].where = e->where;
		u[s->n_unset].value = NULL;
		e->key = kiln_strdup(e->key), e->where = kiln_strdup(e->where);
		if (e->key && e->where)
			s->n_unset++;
		else
			free(u[s->n_unset].key), free(u[s->n_unset].where);
	}
	kiln_cfg_remove_entry(s, j);
	return 1;
}

const char *kiln_config_unset_note(const struct kiln_config *cfg, const char *section,
				   char *buf, size_t n)
{
	const struct section *s = kiln_cfg_find_section(cfg, section);
	size_t off = 0;
	buf[0] = 0;
	for (int i = 0; s && i < s->n_unset && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, "%s'%s' unset by %s", off ? "; " : " (",
					s->unset[i].key, s->unset[i].where);
	if (off && off < n)
		snprintf(buf + off, n - off, ")");
	return buf;
}

/* [train] milestones as kiln_parse_milestones read it (n: its result). */
static kiln_status check_milestones(const char *v, int n)
{
	static const char *const why[] = {
		[-KILN_MILESTONES_FORM] = "holds something other than whole numbers >= 0",
		[-KILN_MILESTONES_EMPTY] = "has a comma with no number before or after it",
		[-KILN_MILESTONES_RANGE] = "holds a number out of range (at most 9223372036854775807)",
		[-KILN_MILESTONES_ORDER] = "is not in order (each step count at least the one before)",
		[-KILN_MILESTONES_MANY] = "has too many step counts",
	};
	if (n >= 0)
		return KILN_OK;
	return kiln_error(KILN_ECONFIG, "'milestones' = '%s' %s; expected up to %d step counts in order, e.g. `3000, 6000`",
			  v, -n < (int)KILN_ARRAY_LEN(why) && why[-n] ? why[-n] : "is not a list of step counts",
			  KILN_MAX_MILESTONES);
}

/* Values of a form the schema's types cannot say, checked by the parser
 * their reader uses, so `kiln config` refuses what training would
 * (it said OK to size = 8x8 and milestones = 6000, 3000 before session 31). */
static kiln_status check_parsed(const char *section, const struct entry *e)
{
	int32_t h, w;
	int64_t m[KILN_MAX_MILESTONES];
	if (!*e->value)
		return KILN_OK;
	if (!strncmp(section, "data", 4) && !strcmp(e->key, "size") &&
	    kiln_xform_parse_size(e->value, &h, &w))
		return kiln_error(KILN_ECONFIG, "'size' = '%s' is not H W or N (pixels, 1 to 65536)",
				  e->value);
	if (!strcmp(section, "train") && !strcmp(e->key, "milestones"))
		return check_milestones(e->value, kiln_parse_milestones(e->value, m));
	return KILN_OK;
}

/* [run] device names a device plugin (or `auto`), checked here as [data]
 * source is, so a typo is exit 2 at its line (and `kiln config` says so)
 * rather than exit 1 from the device's open with no location.  A plugin
 * that exists but cannot run here (a GPU plugin without a GPU) is left to
 * the open, which says why: `kiln config` of it on a login node is fine. */
static kiln_status check_run_device(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	static const char *const kiln_devices[] = { "cpu", "cuda" }; /* kiln's own */
	const char *name = kiln_config_get(cfg, "run", "device");
	const struct kiln_plugin *p;
	if (!name || !strcmp(name, "auto"))
		return KILN_OK;
	const char *where = kiln_config_where(cfg, "run", "device");
	/* kiln's own device: no typo, so its file is not loaded here (loading
	 * kiln-cuda.so runs its probe, the CUDA runtime's start on a GPU node,
	 * which kiln config and kiln pack, opening no device, do not need:
	 * they did before session 32).  Not built here: a command that opens
	 * no device (kiln pack, kiln config of a GPU config on a CPU login
	 * node) goes on; opening it fails with this reason. */
	for (size_t i = 0; i < KILN_ARRAY_LEN(kiln_devices); i++)
		if (!strcmp(name, kiln_devices[i])) {
			char file[32];
			snprintf(file, sizeof file, "kiln-%s.so", name);
			if (kiln_registry_has_file(reg, file))
				return KILN_OK;
			kiln_log(KILN_LOG_WARN, "config", "%s: [run] device = %s: this kiln has no %s device plugin (kiln-%s.so is not in the plugin path: not built%s, or not installed; `kiln plugins` lists the devices there are)",
				 where, name, name, name,
				 !strcmp(name, "cuda") ? ": configure found no CUDA toolkit, or --without-cuda" : "");
			return KILN_OK;
		}
	if (kiln_registry_find(reg, KILN_PLUGIN_DEVICE, name, &p) != KILN_ENOTFOUND)
		return KILN_OK;
	/* a typo: the nearest device plugin's name, or auto */
	struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
	char names[512] = "auto";
	size_t off = strlen(names);
	for (int i = 0; i < kiln_registry_loaded_count(reg); i++) {
		kiln_registry_plugin_get(reg, i, &pi);
		if (pi.kind == KILN_PLUGIN_DEVICE && off < sizeof names)
			off += (size_t)snprintf(names + off, sizeof names - off, ", %s", pi.name);
	}
	char hint[160];
	kiln_suggest_choice(name, names, hint, sizeof hint);
	return kiln_error(KILN_ECONFIG, "%s: [run] device = '%s': no device plugin of that name%s (devices: %s)",
			  where, name, hint, names);
}

/* The error for a section no schema has: the closest fixed section, and
 * the list of sections from the schema's table (before session 33 a list
 * written here, which lacked [data.val], [log] and [pipeline]). */
static kiln_status unknown_section(const struct section *s)
{
	const char *best = NULL;
	int bd = 1 << 30;
	char list[400];
	size_t off = 0;
	for (int j = 0; j < kiln_schema_fixed_count(); j++) {
		const char *f = kiln_schema_fixed_name(j, NULL);
		int d = kiln_edit_distance(s->name, f);
		if (d < bd)
			bd = d, best = f;
		/* the layers follow [model] */
		if (off < sizeof list)
			off += (size_t)snprintf(list + off, sizeof list - off, "%s%s%s", off ? ", " : "", f,
						!strcmp(f, "model") ? ", layer.NAME" : "");
	}
	if (off < sizeof list)
		snprintf(list + off, sizeof list - off, ", plugin.NAME");
	const char *hint = "";
	char h[300] = "";
	if (!strncmp(s->name, "layer", 5) || !strncmp(s->name, "plugin", 6))
		hint = "; layer and plugin sections are named [layer.NAME] and [plugin.NAME]";
	else if (best && bd <= 3)
		snprintf(h, sizeof h, "; did you mean [%s]?", best), hint = h;
	return kiln_error(KILN_ECONFIG, "%s: unknown section [%s]%s (sections: %s)", s->where, s->name,
			  hint, list);
}

kiln_status kiln_config_validate(struct kiln_config *cfg, struct kiln_registry *reg)
{
	if (!cfg)
		return kiln_null_arg("kiln_config_validate", "cfg");
	char sug[200], list[2000];
	cfg->reg = reg;
	for (int i = 0; i < cfg->n; i++) {
		struct section *s = &cfg->s[i];
		const struct kiln_key *base = base_schema(s->name);
		if (!base)
			return unknown_section(s);
		const struct kiln_key *ext = NULL;
		if (reg || !strcmp(s->name, "train")) { /* [train]: the optimizer's keys */
			kiln_status st = kiln_config_ext_schema(cfg, reg, s->name, &ext);
			if (st)
				return st;
		}
		for (int j = 0; j < s->n; j++) {
			struct entry *e = &s->e[j];
			const struct kiln_key *k = find_key(base, e->key);
			if (!k)
				k = find_key(ext, e->key);
			if (!k && !strcmp(s->name, "train"))
				k = kiln_optim_any_key(e->key); /* another built-in optimizer's */
			if (!k) {
				if (!reg && (is_prefixed(s->name, "layer.") ||
					     is_prefixed(s->name, "plugin.") ||
					     !strcmp(s->name, "data") || !strcmp(s->name, "data.eval") ||
					     !strcmp(s->name, "data.val")))
					continue; /* checked once the registry is known */
				const struct kiln_key *t[8];
				char other[200];
				suggest_tables(s->name, base, ext, t);
				suggest(e->key, t, sug, sizeof sug);
				other_sections(s->name, e->key, other, sizeof other);
				list_keys(base, ext, list, sizeof list);
				return kiln_error(KILN_ECONFIG, "%s: unknown key '%s' in [%s]%s%s (valid keys: %s)",
						  e->where, e->key, s->name, sug, other, list);
			}
			if (unset_override(s, j, k)) {
				j--;
				continue;
			}
			if (check_value(k, e->value) || check_parsed(s->name, e))
				return kiln_error_wrap(KILN_ECONFIG, "%s: in [%s]", e->where, s->name);
		}
	}
	return reg ? check_run_device(cfg, reg) : KILN_OK;
}
