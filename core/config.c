/* core/config.c - strict INI config: parse (inih), overrides, validation
 * against the schema, typed getters, and the resolved dump.
 *
 * Line numbers.  inih's handler does not receive line numbers in Debian's
 * build, so we feed inih through ini_parse_stream() with our own reader,
 * which counts physical lines and also sees every [section] header (inih
 * does not report empty sections, and we must reject duplicates).
 */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <strings.h>

/* Longest accepted physical line. */
#define KILN_CONFIG_MAX_LINE (1 << 20)

struct entry {
	char *key, *value;
	char *where; /* "file:line" or "command line" */
};

struct section {
	char *name;
	char *where;
	struct entry *e;
	int n, cap;
};

struct kiln_config {
	char *file;
	struct section *s;
	int n, cap;
	const struct kiln_registry *reg; /* set by validate, for defaults */
};

char *kiln_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

static char *fmt_where(const char *file, int line)
{
	char buf[4200];
	snprintf(buf, sizeof buf, "%s:%d", file, line);
	return kiln_strdup(buf);
}

int kiln_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 64 || lb > 64)
		return 99;
	int d[65][65];
	for (size_t i = 0; i <= la; i++)
		d[i][0] = (int)i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			int c = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
			int v = d[i - 1][j - 1] + c;
			if (d[i - 1][j] + 1 < v)
				v = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < v)
				v = d[i][j - 1] + 1;
			/* adjacent transposition counts as one edit */
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	return d[la][lb];
}

/* ---- building --------------------------------------------------------- */

static struct section *find_section(const struct kiln_config *cfg, const char *name)
{
	for (int i = 0; i < cfg->n; i++)
		if (!strcmp(cfg->s[i].name, name))
			return &cfg->s[i];
	return NULL;
}

static struct entry *find_entry(const struct section *s, const char *key)
{
	if (!key)
		return NULL;
	for (int i = 0; s && i < s->n; i++)
		if (!strcmp(s->e[i].key, key))
			return &s->e[i];
	return NULL;
}

static struct section *add_section(struct kiln_config *cfg, const char *name, char *where)
{
	if (cfg->n == cfg->cap) {
		int cap = cfg->cap ? cfg->cap * 2 : 16;
		struct section *s = realloc(cfg->s, (size_t)cap * sizeof *s);
		if (!s)
			return NULL;
		cfg->s = s;
		cfg->cap = cap;
	}
	struct section *s = &cfg->s[cfg->n];
	memset(s, 0, sizeof *s);
	s->name = kiln_strdup(name);
	s->where = where;
	if (!s->name)
		return NULL;
	cfg->n++;
	return s;
}

/* Set key in s, replacing an existing value.  Takes ownership of where. */
static kiln_status set_entry(struct section *s, const char *key, const char *value,
			     char *where)
{
	struct entry *e = find_entry(s, key);
	if (e) {
		char *v = kiln_strdup(value);
		if (!v)
			return kiln_error(KILN_ENOMEM, "out of memory");
		free(e->value);
		free(e->where);
		e->value = v;
		e->where = where;
		return KILN_OK;
	}
	if (s->n == s->cap) {
		int cap = s->cap ? s->cap * 2 : 8;
		struct entry *ne = realloc(s->e, (size_t)cap * sizeof *ne);
		if (!ne)
			return kiln_error(KILN_ENOMEM, "out of memory");
		s->e = ne;
		s->cap = cap;
	}
	e = &s->e[s->n];
	e->key = kiln_strdup(key);
	e->value = kiln_strdup(value);
	e->where = where;
	if (!e->key || !e->value)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->n++;
	return KILN_OK;
}

void kiln_config_free(struct kiln_config *cfg)
{
	if (!cfg)
		return;
	for (int i = 0; i < cfg->n; i++) {
		struct section *s = &cfg->s[i];
		for (int j = 0; j < s->n; j++) {
			free(s->e[j].key);
			free(s->e[j].value);
			free(s->e[j].where);
		}
		free(s->e);
		free(s->name);
		free(s->where);
	}
	free(cfg->s);
	free(cfg->file);
	free(cfg);
}

kiln_status kiln_config_new(struct kiln_config **out)
{
	struct kiln_config *cfg = calloc(1, sizeof *cfg);
	if (!cfg)
		return kiln_error(KILN_ENOMEM, "out of memory");
	cfg->file = kiln_strdup("(none)");
	*out = cfg;
	return KILN_OK;
}

/* ---- parsing ---------------------------------------------------------- */

struct parse {
	struct kiln_config *cfg;
	const char *name;   /* file name for messages */
	/* input: a FILE or a string */
	FILE *f;
	const char *str;
	size_t str_off;
	int line;           /* physical line being parsed (1-based) */
	int line_done;      /* the last chunk ended a line */
	size_t line_len;
	int cur;            /* index of the section the reader is in, -1 before any */
	kiln_status st;     /* first error */
};

static int parse_fail(struct parse *p, kiln_status st, const char *fmt, ...)
	KILN_PRINTF(3, 4);
static int parse_fail(struct parse *p, kiln_status st, const char *fmt, ...)
{
	if (p->st == KILN_OK) {
		char msg[900];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof msg, fmt, ap);
		va_end(ap);
		p->st = kiln_error(st, "%s:%d: %s", p->name, p->line, msg);
	}
	return 0;
}

static int valid_section_name(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-')
			return 0;
	return 1;
}

/* Look at the start of a physical line for a [section] header. */
static void see_header(struct parse *p, const char *chunk)
{
	if (p->line == 1 && !strncmp(chunk, "\xEF\xBB\xBF", 3))
		chunk += 3; /* UTF-8 byte order mark, which inih skips too */
	while (*chunk == ' ' || *chunk == '\t')
		chunk++;
	if (*chunk != '[')
		return;
	const char *end = strchr(chunk, ']');
	if (!end)
		return; /* inih reports the syntax error */
	char name[256];
	size_t n = (size_t)(end - chunk - 1);
	/* trim like inih does */
	const char *b = chunk + 1;
	while (n && isspace((unsigned char)*b))
		b++, n--;
	while (n && isspace((unsigned char)b[n - 1]))
		n--;
	if (n >= sizeof name) {
		parse_fail(p, KILN_ECONFIG, "section name too long");
		return;
	}
	memcpy(name, b, n);
	name[n] = 0;
	if (!valid_section_name(name)) {
		parse_fail(p, KILN_ECONFIG,
			   "bad section name '[%s]' (letters, digits, '_', '-' and '.' only)", name);
		return;
	}
	struct section *old = find_section(p->cfg, name);
	if (old) {
		parse_fail(p, KILN_ECONFIG,
			   "duplicate section [%s] (first at %s); merge the two", name, old->where);
		return;
	}
	if (!add_section(p->cfg, name, fmt_where(p->name, p->line)))
		parse_fail(p, KILN_ENOMEM, "out of memory");
	else
		p->cur = p->cfg->n - 1;
}

/* fgets-like reader for inih that counts lines and sees headers. */
static char *reader(char *buf, int num, void *user)
{
	struct parse *p = user;
	char *r;
	if (p->st != KILN_OK)
		return NULL; /* stop at the first error */
	if (p->f) {
		r = fgets(buf, num, p->f);
	} else {
		if (!p->str[p->str_off])
			return NULL;
		size_t i = 0;
		while (i + 1 < (size_t)num && p->str[p->str_off]) {
			char c = p->str[p->str_off++];
			buf[i++] = c;
			if (c == '\n')
				break;
		}
		buf[i] = 0;
		r = buf;
	}
	if (!r)
		return NULL;
	size_t len = strlen(buf);
	if (p->line_done) {
		p->line++;
		p->line_len = 0;
		see_header(p, buf);
		if (p->st != KILN_OK)
			return NULL;
	}
	p->line_len += len;
	p->line_done = len > 0 && buf[len - 1] == '\n';
	if (p->line_len >= KILN_CONFIG_MAX_LINE - 2) {
		parse_fail(p, KILN_ECONFIG, "line longer than %d characters", KILN_CONFIG_MAX_LINE - 3);
		return NULL;
	}
	return r;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	if (p->st != KILN_OK)
		return 0;
	/* The reader's section, not inih's `section`: inih neither trims the
	 * name inside the brackets nor keeps more than 50 characters of it. */
	(void)section;
	if (p->cur < 0)
		return parse_fail(p, KILN_ECONFIG, "key '%s' outside any section; put it under a [section]", name);
	struct section *s = &p->cfg->s[p->cur];
	if (!*name)
		return parse_fail(p, KILN_ECONFIG, "empty key name");
	struct entry *e = find_entry(s, name);
	if (e)
		return parse_fail(p, KILN_ECONFIG, "duplicate key '%s' in [%s] (first at %s)", name,
				  s->name, e->where);
	kiln_status st = set_entry(s, name, value ? value : "", fmt_where(p->name, p->line));
	if (st)
		return parse_fail(p, st, "out of memory");
	return 1;
}

static pthread_once_t inih_once = PTHREAD_ONCE_INIT;
static void inih_setup(void)
{
#ifdef HAVE_INIH_RUNTIME_OPTIONS
	/* Debian's inih exposes its options as variables: allow long lines
	 * (heap buffer that grows), no multi-line values (an indented line is
	 * a key of its own, so a continuation is never silently glued). */
	ini_use_stack = 0;
	ini_allow_realloc = 1;
	ini_max_line = KILN_CONFIG_MAX_LINE;
	ini_allow_multiline = 0;
	/* Report the first bad line, not a later error of the handler. */
	ini_stop_on_first_error = 1;
#endif
}

static kiln_status parse(struct parse *p)
{
	pthread_once(&inih_once, inih_setup);
	p->line_done = 1;
	p->cur = -1;
	int rc = ini_parse_stream(reader, p, handler, p);
	if (p->st != KILN_OK)
		return p->st;
	if (rc > 0) {
		p->line = rc;
		parse_fail(p, KILN_ECONFIG,
			   "syntax error: expected '[section]', 'key = value' or a comment (';' or '#')");
		return p->st;
	}
	if (rc < 0)
		return kiln_error(rc == -2 ? KILN_ENOMEM : KILN_EIO, "%s: cannot parse (%d)", p->name, rc);
	if (p->f && ferror(p->f))
		return kiln_error(KILN_EIO, "%s: read error: %s", p->name, strerror(errno));
	return KILN_OK;
}

kiln_status kiln_config_load(const char *path, struct kiln_config **out)
{
	*out = NULL;
	FILE *f = fopen(path, "r");
	if (!f)
		return kiln_error(KILN_EIO, "%s: cannot open config: %s", path, strerror(errno));
	struct kiln_config *cfg = calloc(1, sizeof *cfg);
	if (!cfg) {
		fclose(f);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	cfg->file = kiln_strdup(path);
	struct parse p = { .cfg = cfg, .name = path, .f = f };
	kiln_status st = parse(&p);
	fclose(f);
	if (st) {
		kiln_config_free(cfg);
		return st;
	}
	*out = cfg;
	return KILN_OK;
}

kiln_status kiln_config_load_string(const char *text, const char *name,
				    struct kiln_config **out)
{
	*out = NULL;
	struct kiln_config *cfg = calloc(1, sizeof *cfg);
	if (!cfg)
		return kiln_error(KILN_ENOMEM, "out of memory");
	cfg->file = kiln_strdup(name);
	struct parse p = { .cfg = cfg, .name = name, .str = text };
	kiln_status st = parse(&p);
	if (st) {
		kiln_config_free(cfg);
		return st;
	}
	*out = cfg;
	return KILN_OK;
}

kiln_status kiln_config_override(struct kiln_config *cfg, const char *arg)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg)
		return kiln_error(KILN_EUSAGE,
				  "override '%s': expected section.key=value (e.g. train.lr=0.1)", arg);
	char lhs[512];
	size_t n = (size_t)(eq - arg);
	if (n >= sizeof lhs)
		return kiln_error(KILN_EUSAGE, "override '%s': name too long", arg);
	memcpy(lhs, arg, n);
	lhs[n] = 0;
	while (n && isspace((unsigned char)lhs[n - 1]))
		lhs[--n] = 0;
	char *dot = strrchr(lhs, '.');
	if (!dot || dot == lhs || !dot[1])
		return kiln_error(KILN_EUSAGE,
				  "override '%s': expected section.key=value (e.g. train.lr=0.1)", arg);
	*dot = 0;
	const char *sec = lhs, *key = dot + 1;
	if (!valid_section_name(sec))
		return kiln_error(KILN_EUSAGE, "override '%s': bad section name '%s'", arg, sec);
	const char *val = eq + 1;
	while (isspace((unsigned char)*val))
		val++;
	char where[600];
	snprintf(where, sizeof where, "command line '%s'", arg);
	struct section *s = find_section(cfg, sec);
	if (!s && !(s = add_section(cfg, sec, kiln_strdup(where))))
		return kiln_error(KILN_ENOMEM, "out of memory");
	return set_entry(s, key, val, kiln_strdup(where));
}

/* ---- schema ----------------------------------------------------------- */

static const struct kiln_key *find_key(const struct kiln_key *t, const char *name)
{
	for (; t && t->name; t++)
		if (!strcmp(t->name, name))
			return t;
	return NULL;
}

static int is_prefixed(const char *s, const char *prefix)
{
	size_t n = strlen(prefix);
	return !strncmp(s, prefix, n) && s[n];
}

/* Base table of a section, or NULL for an unknown section. */
static const struct kiln_key *base_schema(const char *section)
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

static const struct kiln_key *lookup_key(const struct kiln_config *cfg, const char *section,
					 const char *key)
{
	const struct kiln_key *k = find_key(base_schema(section), key);
	if (k)
		return k;
	const struct kiln_key *ext = NULL;
	if (cfg->reg && kiln_config_ext_schema(cfg, cfg->reg, section, &ext) == KILN_OK)
		return find_key(ext, key);
	return NULL;
}

static void suggest(const char *word, const struct kiln_key *a, const struct kiln_key *b,
		    char *out, size_t n)
{
	const char *best = NULL;
	int bd = 1 << 30;
	for (int pass = 0; pass < 2; pass++)
		for (const struct kiln_key *k = pass ? b : a; k && k->name; k++) {
			int d = kiln_edit_distance(word, k->name);
			if (d < bd || (d == bd && strlen(k->name) < strlen(best))) {
				bd = d;
				best = k->name;
			}
		}
	int lim = (int)strlen(word) / 2;
	if (lim < 2)
		lim = 2;
	if (!best || bd > lim) {
		/* "lr_rate": a valid key followed by '_' */
		best = NULL;
		for (int pass = 0; pass < 2; pass++)
			for (const struct kiln_key *k = pass ? b : a; k && k->name; k++) {
				size_t kl = strlen(k->name);
				if (!strncmp(word, k->name, kl) && word[kl] == '_' &&
				    (!best || kl > strlen(best)))
					best = k->name;
			}
	}
	if (best)
		snprintf(out, n, "; did you mean '%s'?", best);
	else
		out[0] = 0;
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

static int parse_int(const char *v, long long *out)
{
	char *end;
	errno = 0;
	while (isspace((unsigned char)*v))
		v++;
	if (!*v)
		return -1;
	long long x = strtoll(v, &end, 10);
	while (isspace((unsigned char)*end))
		end++;
	if (errno || *end)
		return -1;
	*out = x;
	return 0;
}

static int parse_float(const char *v, double *out)
{
	char *end;
	errno = 0;
	while (isspace((unsigned char)*v))
		v++;
	if (!*v)
		return -1;
	double x = strtod(v, &end);
	while (isspace((unsigned char)*end))
		end++;
	if (errno || *end || !isfinite(x))
		return -1;
	*out = x;
	return 0;
}

static int parse_bool(const char *v, int *out)
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

static int bounded(const struct kiln_key *k)
{
	return k->min != 0 || k->max != 0;
}

static kiln_status check_number(const struct kiln_key *k, const char *v, double x)
{
	if (bounded(k) && (x < k->min || x > k->max))
		return kiln_error(KILN_ECONFIG, "'%s' = %s is out of range [%.15g, %.15g]", k->name, v,
				  k->min, k->max);
	return KILN_OK;
}

static kiln_status check_value(const struct kiln_key *k, const char *v)
{
	long long i;
	double x;
	int b;
	switch (k->type) {
	case KILN_KEY_STR:
	case KILN_KEY_LIST:
		return KILN_OK;
	case KILN_KEY_INT:
		if (k->choices && in_choices(k->choices, v))
			return KILN_OK;
		if (parse_int(v, &i))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not an integer%s%s", k->name, v,
					  k->choices ? " or one of " : "", k->choices ? k->choices : "");
		return check_number(k, v, (double)i);
	case KILN_KEY_FLOAT:
		if (parse_float(v, &x))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not a number", k->name, v);
		return check_number(k, v, x);
	case KILN_KEY_BOOL:
		if (parse_bool(v, &b))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not a boolean (0/1, true/false, yes/no, on/off)",
					  k->name, v);
		return KILN_OK;
	case KILN_KEY_ENUM:
		if (!in_choices(k->choices, v))
			return kiln_error(KILN_ECONFIG, "'%s' = '%s' is not one of %s", k->name, v,
					  k->choices);
		return KILN_OK;
	case KILN_KEY_INTS: {
		char buf[4096];
		snprintf(buf, sizeof buf, "%s", v);
		char *save = NULL;
		int count = 0;
		for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			if (parse_int(t, &i))
				return kiln_error(KILN_ECONFIG, "'%s' = '%s': '%s' is not an integer",
						  k->name, v, t);
			if (check_number(k, v, (double)i))
				return KILN_ECONFIG;
			count++;
		}
		if (!count)
			return kiln_error(KILN_ECONFIG, "'%s' is empty; expected integers like 1,28,28",
					  k->name);
		return KILN_OK;
	}
	}
	return kiln_error(KILN_EINTERNAL, "key '%s' has unknown type %d", k->name, k->type);
}

kiln_status kiln_config_validate(struct kiln_config *cfg, struct kiln_registry *reg)
{
	char sug[200], list[2000];
	cfg->reg = reg;
	for (int i = 0; i < cfg->n; i++) {
		struct section *s = &cfg->s[i];
		const struct kiln_key *base = base_schema(s->name);
		if (!base) {
			const char *best = NULL;
			int bd = 1 << 30;
			for (int j = 0; j < kiln_schema_fixed_count(); j++) {
				const char *f = kiln_schema_fixed_name(j, NULL);
				int d = kiln_edit_distance(s->name, f);
				if (d < bd)
					bd = d, best = f;
			}
			const char *hint = "";
			char h[300] = "";
			if (!strncmp(s->name, "layer", 5) || !strncmp(s->name, "plugin", 6))
				hint = "; layer and plugin sections are named [layer.NAME] and [plugin.NAME]";
			else if (best && bd <= 3)
				snprintf(h, sizeof h, "; did you mean [%s]?", best), hint = h;
			return kiln_error(KILN_ECONFIG,
					  "%s: unknown section [%s]%s (sections: run, data, data.eval, model, layer.NAME, train, dist, plugin.NAME)",
					  s->where, s->name, hint);
		}
		const struct kiln_key *ext = NULL;
		if (reg) {
			kiln_status st = kiln_config_ext_schema(cfg, reg, s->name, &ext);
			if (st)
				return st;
		}
		for (int j = 0; j < s->n; j++) {
			struct entry *e = &s->e[j];
			const struct kiln_key *k = find_key(base, e->key);
			if (!k)
				k = find_key(ext, e->key);
			if (!k) {
				if (!reg && (is_prefixed(s->name, "layer.") ||
					     is_prefixed(s->name, "plugin.") ||
					     !strcmp(s->name, "data") || !strcmp(s->name, "data.eval")))
					continue; /* checked once the registry is known */
				suggest(e->key, base, ext, sug, sizeof sug);
				list_keys(base, ext, list, sizeof list);
				return kiln_error(KILN_ECONFIG, "%s: unknown key '%s' in [%s]%s (valid keys: %s)",
						  e->where, e->key, s->name, sug, list);
			}
			if (check_value(k, e->value))
				return kiln_error_wrap(KILN_ECONFIG, "%s: in [%s]", e->where, s->name);
		}
	}
	return KILN_OK;
}

/* ---- getters ---------------------------------------------------------- */

static int no_inherit(const char *key)
{
	static const char *const keys[] = { "images", "labels", "split", "files", "shards" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
		if (!strcmp(key, keys[i]))
			return 1;
	return 0;
}

const char *kiln_config_get(const struct kiln_config *cfg, const char *section,
			    const char *key)
{
	struct entry *e = find_entry(find_section(cfg, section), key);
	if (e)
		return e->value;
	/* [data.eval] inherits what it does not set from [data], except the
	 * keys that choose files or the split: evaluation must never read the
	 * training files by inheritance. */
	if (!strcmp(section, "data.eval") && !no_inherit(key) &&
	    (e = find_entry(find_section(cfg, "data"), key)) != NULL)
		return e->value;
	const struct kiln_key *k = lookup_key(cfg, section, key);
	return k ? k->def : NULL;
}

const char *kiln_config_where(const struct kiln_config *cfg, const char *section,
			      const char *key)
{
	const struct section *s = find_section(cfg, section);
	struct entry *e = find_entry(s, key);
	if (!key)
		return s ? s->where : "command line";
	if (!e && !strcmp(section, "data.eval") && !no_inherit(key))
		e = find_entry(find_section(cfg, "data"), key);
	return e ? e->where : "default";
}

const char *kiln_config_section(const struct kiln_config *cfg, int i)
{
	return i >= 0 && i < cfg->n ? cfg->s[i].name : NULL;
}

static kiln_status bad(const struct kiln_config *cfg, const char *section, const char *key,
		       const char *v, const char *what)
{
	return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s' is not %s",
			  kiln_config_where(cfg, section, key), section, key, v, what);
}

kiln_status kiln_config_get_int(const struct kiln_config *cfg, const char *section,
				const char *key, int64_t *out)
{
	const char *v = kiln_config_get(cfg, section, key);
	long long x;
	if (!v)
		return KILN_ENOTFOUND;
	if (parse_int(v, &x))
		return bad(cfg, section, key, v, "an integer");
	const struct kiln_key *k = lookup_key(cfg, section, key);
	if (k && check_number(k, v, (double)x))
		return kiln_error_wrap(KILN_ECONFIG, "%s: [%s]", kiln_config_where(cfg, section, key),
				       section);
	*out = x;
	return KILN_OK;
}

kiln_status kiln_config_get_float(const struct kiln_config *cfg, const char *section,
				  const char *key, double *out)
{
	const char *v = kiln_config_get(cfg, section, key);
	double x;
	if (!v)
		return KILN_ENOTFOUND;
	if (parse_float(v, &x))
		return bad(cfg, section, key, v, "a number");
	const struct kiln_key *k = lookup_key(cfg, section, key);
	if (k && check_number(k, v, x))
		return kiln_error_wrap(KILN_ECONFIG, "%s: [%s]", kiln_config_where(cfg, section, key),
				       section);
	*out = x;
	return KILN_OK;
}

kiln_status kiln_config_get_bool(const struct kiln_config *cfg, const char *section,
				 const char *key, int *out)
{
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
	const char *v = kiln_config_get(cfg, section, key);
	if (!v)
		return KILN_ENOTFOUND;
	*out = v;
	return KILN_OK;
}

/* ---- resolved dump ---------------------------------------------------- */

static void write_keys(FILE *f, const struct section *s, const struct section *parent,
		       const struct kiln_key *t, int *any)
{
	for (; t && t->name; t++) {
		struct entry *e = find_entry(s, t->name);
		if (!e && !no_inherit(t->name))
			e = find_entry(parent, t->name); /* [data.eval] inherits from [data] */
		if (e)
			fprintf(f, "%s = %s\n", t->name, e->value);
		else if (t->def)
			fprintf(f, "%s = %s\n", t->name, t->def);
		else
			fprintf(f, "; %s = (unset)\n", t->name);
		*any = 1;
	}
}

static void write_section(FILE *f, const struct kiln_config *cfg, struct kiln_registry *reg,
			  const char *name)
{
	const struct section *s = find_section(cfg, name);
	const struct section *parent = strcmp(name, "data.eval") ? NULL : find_section(cfg, "data");
	const struct kiln_key *ext = NULL;
	int any = 0;
	fprintf(f, "[%s]\n", name);
	write_keys(f, s, parent, base_schema(name), &any);
	if (reg && kiln_config_ext_schema(cfg, reg, name, &ext) == KILN_OK)
		write_keys(f, s, parent, ext, &any);
	fprintf(f, "\n");
}

kiln_status kiln_config_write(const struct kiln_config *cfg, struct kiln_registry *reg,
			      FILE *f)
{
	static const char *const order[] = { "run", "data", "data.eval", "model" };
	for (size_t i = 0; i < KILN_ARRAY_LEN(order); i++)
		write_section(f, cfg, reg, order[i]);
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "layer."))
			write_section(f, cfg, reg, cfg->s[i].name);
	write_section(f, cfg, reg, "train");
	write_section(f, cfg, reg, "dist");
	for (int i = 0; i < cfg->n; i++)
		if (is_prefixed(cfg->s[i].name, "plugin."))
			write_section(f, cfg, reg, cfg->s[i].name);
	return ferror(f) ? kiln_error(KILN_EIO, "write error") : KILN_OK;
}
