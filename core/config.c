/* core/config.c - strict INI config: parse (inih) and command-line
 * overrides into the in-memory form of config_impl.h.  Validation, getters
 * and the resolved dump are in config_check.c.
 *
 * Line numbers.  inih's handler does not receive line numbers in Debian's
 * build, so we feed inih through ini_parse_stream() with our own reader,
 * which counts physical lines and also sees every [section] header (inih
 * does not report empty sections, and we must reject duplicates).
 */
#include "config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <strings.h>

/* Longest accepted physical line. */
#define KILN_CONFIG_MAX_LINE (1 << 20)

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

struct section *kiln_cfg_find_section(const struct kiln_config *cfg, const char *name)
{
	for (int i = 0; i < cfg->n; i++)
		if (!strcmp(cfg->s[i].name, name))
			return &cfg->s[i];
	return NULL;
}

struct entry *kiln_cfg_find_entry(const struct section *s, const char *key)
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
	struct section *grown = kiln_grow(cfg->s, cfg->n, &cfg->cap, sizeof *grown, 16);
	if (!grown)
		return NULL;
	cfg->s = grown;
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
	struct entry *e = kiln_cfg_find_entry(s, key);
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
	struct entry *ne = kiln_grow(s->e, s->n, &s->cap, sizeof *ne, 8);
	if (!ne)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->e = ne;
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
	struct section *old = kiln_cfg_find_section(p->cfg, name);
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
#ifndef HAVE_INIH_RUNTIME_OPTIONS
	/* An inih without a growing line buffer would parse the rest of a long
	 * line as a line of its own: refuse instead of guessing. */
	if (!p->line_done && len + 1 == (size_t)num) {
		parse_fail(p, KILN_ECONFIG,
			   "line longer than %d characters (this inih build's limit)", num - 2);
		return NULL;
	}
#endif
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
	struct entry *e = kiln_cfg_find_entry(s, name);
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
	struct section *s = kiln_cfg_find_section(cfg, sec);
	if (!s && !(s = add_section(cfg, sec, kiln_strdup(where))))
		return kiln_error(KILN_ENOMEM, "out of memory");
	return set_entry(s, key, val, kiln_strdup(where));
}
