/* core/config.c - strict INI config: parse (inih) and command-line
 * overrides into the in-memory form of config_impl.h.  Validation is in
 * config_check.c, the getters in config_get.c and the resolved dump in
 * config_write.c.
 *
 * Line numbers.  inih's handler does not receive line numbers in Debian's
 * build, so we read the whole input (a capped size) and feed inih through
 * ini_parse_stream() with our own reader, which sees every physical line
 * whole before inih does: it counts lines, refuses NUL bytes and
 * over-long lines, and sees every [section] header (inih does not report
 * empty sections, and we must reject duplicates).  Sections and keys are
 * found through a hash index, so a file of many sections stays linear.
 */
#include "config_impl.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <strings.h>
#include <sys/stat.h>

/* Longest accepted physical line, and largest accepted file. */
#define KILN_CONFIG_MAX_LINE (1 << 20)
#define KILN_CONFIG_MAX_BYTES (16 << 20)

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
	/* the table's last three rows (row i in d[i % 3]; a transposition
	 * reads row i - 2): 780 bytes where the whole 65 x 65 took 17 KiB of
	 * the caller's stack (the frame cap, docs/design-notes.md) */
	int d[3][65];
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int *const c = d[i % 3];
		const int *const p = d[(i - 1) % 3], *const pp = d[(i + 1) % 3];
		c[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int x = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
			int v = p[j - 1] + x;
			if (p[j] + 1 < v)
				v = p[j] + 1;
			if (c[j - 1] + 1 < v)
				v = c[j - 1] + 1;
			/* adjacent transposition counts as one edit */
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    pp[j - 2] + 1 < v)
				v = pp[j - 2] + 1;
			c[j] = v;
		}
	}
	return d[la % 3][lb];
}

/* PyTorch's (and Lightning's) names of what kiln names otherwise, for a
 * user who writes `type = CrossEntropyLoss` or `schedule = CosineAnnealingLR`:
 * kiln's name is suggested when the list of choices holds it. */
static const struct {
	const char *torch, *kiln;
} torch_names[] = {
	{ "Conv2d", "conv" },
	{ "BatchNorm2d", "batchnorm" },
	{ "BatchNorm1d", "batchnorm" },
	{ "SyncBatchNorm", "batchnorm" },
	{ "MaxPool2d", "maxpool" },
	{ "AvgPool2d", "avgpool" },
	{ "AdaptiveAvgPool2d", "global_avgpool" },
	{ "LeakyReLU", "leaky_relu" },
	{ "CrossEntropyLoss", "softmax_xent" },
	{ "MSELoss", "mse" },
	{ "BCEWithLogitsLoss", "bce_logits" },
	{ "MultiheadAttention", "attention" },
	{ "CosineAnnealingLR", "cosine" },
	{ "StepLR", "step" },
	{ "MultiStepLR", "multistep" },
	{ "OneCycleLR", "onecycle" },
	{ "ExponentialLR", "exponential" },
	{ "LinearLR", "linear" },
	{ "PolynomialLR", "polynomial" },
	{ "ReduceLROnPlateau", "plateau" },
	{ "bfloat16", "bf16" },
	{ "bf16-mixed", "bf16" },
	{ "float16", "fp16" },
	{ "half", "fp16" },
	{ "16-mixed", "fp16" },
	{ "float32", "fp32" },
	{ "float", "fp32" },
	{ "32-true", "fp32" },
	{ "ImageFolder", "folder" },
};

/* Whether `name` is one of list's names. */
static int list_has(const char *list, const char *name)
{
	const size_t nl = strlen(name);
	for (const char *p = list; p && *p;) {
		p += strspn(p, ",| ");
		size_t l = strcspn(p, ",| ");
		if (!l)
			break;
		if (l == nl && !memcmp(p, name, l))
			return 1;
		p += l;
	}
	return 0;
}

const char *kiln_suggest_choice(const char *word, const char *list, char *out, size_t n)
{
	char best[65] = "";
	int bd = 1 << 30;
	out[0] = 0;
	/* a module path's last part: nn.Linear, torch.bfloat16 */
	const char *dot = strrchr(word, '.');
	const char *w = dot && dot[1] ? dot + 1 : word;
	for (size_t i = 0; i < KILN_ARRAY_LEN(torch_names); i++)
		if (!strcasecmp(w, torch_names[i].torch) && list_has(list, torch_names[i].kiln)) {
			snprintf(out, n, "; did you mean '%s'?", torch_names[i].kiln);
			return out;
		}
	for (const char *p = list; p && *p;) {
		p += strspn(p, ",| ");
		size_t l = strcspn(p, ",| ");
		if (!l)
			break;
		char name[65];
		if (l < sizeof name) {
			memcpy(name, p, l);
			name[l] = 0;
			/* (the distance ignores case: 'Linear' is 0 from 'linear',
			 * which before session 50 was taken for the word itself and
			 * suggested nothing) */
			int d = strcmp(word, name) ? kiln_edit_distance(w, name) : 1 << 30;
			if (d < bd)
				bd = d, memcpy(best, name, l + 1);
		}
		p += l;
	}
	int lim = (int)strlen(w) / 2;
	if (lim < 2)
		lim = 2;
	if (*best && bd <= lim)
		snprintf(out, n, "; did you mean '%s'?", best);
	return out;
}

/* ---- lookup: a hash index per name array ---------------------------- */

typedef const char *(*name_at_fn)(const void *items, int i);

static const char *section_name_at(const void *items, int i)
{
	return ((const struct section *)items)[i].name;
}

static const char *entry_key_at(const void *items, int i)
{
	return ((const struct entry *)items)[i].key;
}

static size_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return (size_t)h;
}

static int index_find(const struct name_index *x, const void *items, name_at_fn at,
		      const char *name)
{
	if (!x->cap)
		return -1;
	size_t mask = (size_t)x->cap - 1;
	for (size_t h = name_hash(name) & mask;; h = (h + 1) & mask) {
		int v = x->slot[h];
		if (!v)
			return -1;
		if (!strcmp(at(items, v - 1), name))
			return v - 1;
	}
}

static void index_put(struct name_index *x, const void *items, name_at_fn at, int i)
{
	size_t mask = (size_t)x->cap - 1, h = name_hash(at(items, i)) & mask;
	while (x->slot[h])
		h = (h + 1) & mask;
	x->slot[h] = i + 1;
}

/* Index items 0..n-1 (item n-1 just added), keeping the table at most half
 * full.  -1 when out of memory. */
static int index_add(struct name_index *x, const void *items, name_at_fn at, int n)
{
	if (2 * (size_t)n <= (size_t)x->cap) {
		index_put(x, items, at, n - 1);
		return 0;
	}
	int cap = x->cap ? 2 * x->cap : 16;
	int *slot = calloc((size_t)cap, sizeof *slot);
	if (!slot)
		return -1;
	free(x->slot);
	x->slot = slot;
	x->cap = cap;
	for (int i = 0; i < n; i++)
		index_put(x, items, at, i);
	return 0;
}

struct section *kiln_cfg_find_section(const struct kiln_config *cfg, const char *name)
{
	int i = index_find(&cfg->idx, cfg->s, section_name_at, name);
	return i < 0 ? NULL : &cfg->s[i];
}

struct entry *kiln_cfg_find_entry(const struct section *s, const char *key)
{
	if (!s || !key)
		return NULL;
	int i = index_find(&s->idx, s->e, entry_key_at, key);
	return i < 0 ? NULL : &s->e[i];
}

void kiln_cfg_remove_entry(struct section *s, int j)
{
	struct entry *e = &s->e[j];
	free(e->key);
	free(e->value);
	free(e->where);
	memmove(e, e + 1, sizeof *e * (size_t)(s->n - j - 1));
	s->n--;
	memset(s->idx.slot, 0, sizeof *s->idx.slot * (size_t)s->idx.cap);
	for (int i = 0; i < s->n; i++)
		index_put(&s->idx, s->e, entry_key_at, i);
}

/* ---- building --------------------------------------------------------- */

/* Append section name; takes ownership of where.  NULL when out of memory,
 * a NULL where included (the caller's unchecked strdup: every section and
 * entry has a where, which messages and config_check.c dereference). */
static struct section *add_section(struct kiln_config *cfg, const char *name, char *where)
{
	if (!where)
		return NULL;
	struct section *grown = kiln_grow(cfg->s, cfg->n, &cfg->cap, sizeof *grown, 16);
	if (!grown) {
		free(where);
		return NULL;
	}
	cfg->s = grown;
	struct section *s = &cfg->s[cfg->n];
	memset(s, 0, sizeof *s);
	s->name = kiln_strdup(name);
	s->where = where;
	if (s->name && !index_add(&cfg->idx, cfg->s, section_name_at, cfg->n + 1)) {
		cfg->n++;
		return s;
	}
	free(s->name);
	free(where);
	return NULL;
}

/* Set key in s, replacing an existing value.  Takes ownership of where;
 * a NULL where (the caller's strdup failed) is out of memory, as for
 * add_section. */
static kiln_status set_entry(struct section *s, const char *key, const char *value,
			     char *where)
{
	if (!where)
		return kiln_error(KILN_ENOMEM, "out of memory");
	struct entry *e = kiln_cfg_find_entry(s, key);
	if (e) {
		char *v = kiln_strdup(value);
		if (!v) {
			free(where);
			return kiln_error(KILN_ENOMEM, "out of memory");
		}
		free(e->value);
		free(e->where);
		e->value = v;
		e->where = where;
		return KILN_OK;
	}
	struct entry *ne = kiln_grow(s->e, s->n, &s->cap, sizeof *ne, 8);
	if (!ne) {
		free(where);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	s->e = ne;
	e = &s->e[s->n];
	e->key = kiln_strdup(key);
	e->value = kiln_strdup(value);
	e->where = where;
	if (!e->key || !e->value) {
		free(e->key);
		free(e->value);
		free(e->where);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	s->n++;
	if (index_add(&s->idx, s->e, entry_key_at, s->n))
		return kiln_error(KILN_ENOMEM, "out of memory");
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
		for (int j = 0; j < s->n_unset; j++) {
			free(s->unset[j].key);
			free(s->unset[j].where);
		}
		free(s->unset);
		free(s->idx.slot);
		free(s->name);
		free(s->where);
	}
	free(cfg->idx.slot);
	free(cfg->s);
	free(cfg->file);
	free(cfg);
}

kiln_status kiln_config_new(struct kiln_config **out)
{
	if (!out)
		return kiln_null_arg("kiln_config_new", "out");
	struct kiln_config *cfg = calloc(1, sizeof *cfg);
	if (!cfg)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (!(cfg->file = kiln_strdup("(none)"))) {
		free(cfg);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	*out = cfg;
	return KILN_OK;
}

/* s's unset notes copied into d (empty). */
static kiln_status dup_unset(struct section *d, const struct section *s)
{
	if (!s->n_unset)
		return KILN_OK;
	if (!(d->unset = calloc((size_t)s->n_unset, sizeof *d->unset)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (; d->n_unset < s->n_unset; d->n_unset++) {
		struct entry *u = &d->unset[d->n_unset];
		const struct entry *f = &s->unset[d->n_unset];
		u->key = kiln_strdup(f->key);
		u->where = f->where ? kiln_strdup(f->where) : NULL;
		if (!u->key || (f->where && !u->where)) {
			free(u->key);
			free(u->where);
			return kiln_error(KILN_ENOMEM, "out of memory");
		}
	}
	return KILN_OK;
}

kiln_status kiln_config_dup(const struct kiln_config *cfg, struct kiln_config **out)
{
	struct kiln_config *d = NULL;
	kiln_status st = kiln_config_new(&d);
	*out = NULL;
	if (st)
		return st;
	free(d->file);
	d->reg = cfg->reg;
	if (!(d->file = kiln_strdup(cfg->file)))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; !st && i < cfg->n; i++) {
		const struct section *s = &cfg->s[i];
		struct section *ds = add_section(d, s->name, kiln_strdup(s->where));
		if (!ds) {
			st = kiln_error(KILN_ENOMEM, "out of memory");
			break;
		}
		for (int j = 0; !st && j < s->n; j++)
			st = set_entry(ds, s->e[j].key, s->e[j].value, kiln_strdup(s->e[j].where));
		if (!st)
			st = dup_unset(ds, s);
	}
	if (st) {
		kiln_config_free(d);
		return st;
	}
	*out = d;
	return KILN_OK;
}

/* ---- parsing ---------------------------------------------------------- */

struct parse {
	struct kiln_config *cfg;
	const char *name;   /* file name for messages */
	const char *text;   /* the whole input, len bytes (may hold NULs) */
	size_t len, pos;
	size_t line_left;   /* bytes of the current line not yet handed to inih */
	int line;           /* physical line being parsed (1-based) */
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

/* The [section] header on the physical line s (n bytes, no NUL), if any:
 * the name trimmed as inih trims it, nothing but a comment after ']'. */
static void see_header(struct parse *p, const char *s, size_t n)
{
	const char *end = s + n;
	if (p->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3))
		s += 3; /* UTF-8 byte order mark, which inih skips too */
	while (s < end && isspace((unsigned char)*s))
		s++;
	if (s == end || *s != '[')
		return;
	const char *close = memchr(s, ']', (size_t)(end - s));
	if (!close)
		return; /* inih reports the syntax error */
	const char *b = s + 1, *e = close;
	while (b < e && isspace((unsigned char)*b))
		b++;
	while (e > b && isspace((unsigned char)e[-1]))
		e--;
	char name[256];
	if ((size_t)(e - b) >= sizeof name) {
		parse_fail(p, KILN_ECONFIG, "section name longer than %zu characters",
			   sizeof name - 1);
		return;
	}
	memcpy(name, b, (size_t)(e - b));
	name[e - b] = 0;
	if (!valid_section_name(name)) {
		parse_fail(p, KILN_ECONFIG,
			   "bad section name '[%s]' (letters, digits, '_', '-' and '.' only)", name);
		return;
	}
	const char *t = close + 1;
	while (t < end && isspace((unsigned char)*t))
		t++;
	if (t < end && *t != ';' && *t != '#') {
		parse_fail(p, KILN_ECONFIG,
			   "text after the header '[%s]'; only a comment (';' or '#') may follow it",
			   name);
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

/* Start the next physical line: count it, refuse NULs and over-long lines,
 * see its header.  0 at the end of the input or on an error. */
static int next_line(struct parse *p)
{
	if (p->pos >= p->len)
		return 0;
	const char *s = p->text + p->pos;
	const char *nl = memchr(s, '\n', p->len - p->pos);
	size_t n = nl ? (size_t)(nl - s) + 1 : p->len - p->pos;
	p->line++;
	if (memchr(s, 0, n))
		return parse_fail(p, KILN_ECONFIG, "NUL byte in the line (not a text file?)");
	if (n > KILN_CONFIG_MAX_LINE - 2)
		return parse_fail(p, KILN_ECONFIG, "line longer than %d characters",
				  KILN_CONFIG_MAX_LINE - 3);
	see_header(p, s, n);
	p->line_left = n;
	return p->st == KILN_OK;
}

/* fgets-like reader for inih over the whole input, which sees every
 * physical line whole before inih gets it in pieces of up to num - 1. */
static char *reader(char *buf, int num, void *user)
{
	struct parse *p = user;
	if (p->st != KILN_OK || num < 2)
		return NULL; /* stop at the first error */
	if (!p->line_left && !next_line(p))
		return NULL;
	size_t k = p->line_left < (size_t)num - 1 ? p->line_left : (size_t)num - 1;
	memcpy(buf, p->text + p->pos, k);
	buf[k] = 0;
	p->pos += k;
	p->line_left -= k;
#ifndef HAVE_INIH_RUNTIME_OPTIONS
	/* An inih without a growing line buffer would parse the rest of a long
	 * line as a line of its own: refuse instead of guessing. */
	if (p->line_left) {
		parse_fail(p, KILN_ECONFIG,
			   "line longer than %d characters (this inih build's limit)", num - 2);
		return NULL;
	}
#endif
	return buf;
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

/* Parse p->text into a new config named name. */
static kiln_status parse(struct parse *p, const char *name, struct kiln_config **out)
{
	*out = NULL;
	pthread_once(&inih_once, inih_setup);
	struct kiln_config *cfg = calloc(1, sizeof *cfg);
	if (!cfg || !(cfg->file = kiln_strdup(name))) {
		free(cfg);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	p->cfg = cfg;
	p->name = name;
	p->cur = -1;
	int rc = ini_parse_stream(reader, p, handler, p);
	if (p->st == KILN_OK && rc > 0) {
		p->line = rc;
		parse_fail(p, KILN_ECONFIG,
			   "syntax error: expected '[section]', 'key = value' or a comment (';' or '#')");
	} else if (p->st == KILN_OK && rc < 0) {
		p->st = rc == -2 ? kiln_error(KILN_ENOMEM, "%s: out of memory parsing it", name)
				 : kiln_error(KILN_EIO, "%s: cannot parse (%d)", name, rc);
	}
	if (p->st != KILN_OK) {
		kiln_config_free(cfg);
		return p->st;
	}
	*out = cfg;
	return KILN_OK;
}

/* The whole of f into *text (*len bytes), refusing more than
 * KILN_CONFIG_MAX_BYTES; stops early after a NUL, which the parser reports
 * with its line. */
static kiln_status read_all(FILE *f, const char *path, char **text, size_t *len)
{
	size_t n = 0, cap = 0;
	char *buf = NULL;
	for (;;) {
		if (cap - n < 65536) {
			cap = cap ? 2 * cap : 65536;
			char *grown = realloc(buf, cap);
			if (!grown) {
				free(buf);
				return kiln_error(KILN_ENOMEM, "%s: out of memory", path);
			}
			buf = grown;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		int nul = memchr(buf + n, 0, got) != NULL;
		n += got;
		if (n > KILN_CONFIG_MAX_BYTES) {
			free(buf);
			return kiln_error(KILN_ECONFIG, "%s: config larger than %d MiB", path,
					  KILN_CONFIG_MAX_BYTES >> 20);
		}
		if (nul || got == 0)
			break;
	}
	if (ferror(f)) {
		free(buf);
		return kiln_error(KILN_EIO, "%s: read error: %s", path, strerror(errno));
	}
	*text = buf;
	*len = n;
	return KILN_OK;
}

kiln_status kiln_config_load(const char *path, struct kiln_config **out)
{
	if (!path || !out)
		return kiln_null_arg("kiln_config_load", !path ? "path" : "out");
	*out = NULL;
	FILE *f;
	kiln_status st = kiln_fopen_regular(path, "r", "open config", &f);
	if (st)
		return st;
	struct stat sb;
	const int pipe = !fstat(fileno(f), &sb) && S_ISFIFO(sb.st_mode);
	struct parse p = { 0 };
	char *text = NULL;
	st = read_all(f, path, &text, &p.len);
	fclose(f);
	if (!st && pipe && !p.len) {
		free(text);
		return kiln_error(KILN_EIO, "%s: cannot open config: it is a FIFO with nothing to read (no writer)",
				  path);
	}
	if (st)
		return st;
	p.text = text;
	st = parse(&p, path, out);
	free(text);
	return st;
}

kiln_status kiln_config_load_string(const char *text, const char *name,
				    struct kiln_config **out)
{
	if (!text || !name || !out)
		return kiln_null_arg("kiln_config_load_string", !text ? "text" : !name ? "name" : "out");
	struct parse p = { .text = text, .len = strlen(text) };
	return parse(&p, name, out);
}

kiln_status kiln_config_override(struct kiln_config *cfg, const char *arg)
{
	if (!cfg || !arg)
		return kiln_null_arg("kiln_config_override", !cfg ? "cfg" : "arg");
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
	/* trimmed on the right too, as a file's values are (before session
	 * 34 "train.schedule=cosine " was no schedule, and "data.workers=4 "
	 * passed `kiln config` and failed `kiln train`) */
	size_t vn = strlen(val);
	while (vn && isspace((unsigned char)val[vn - 1]))
		vn--;
	char *v = strndup(val, vn);
	if (!v)
		return kiln_error(KILN_ENOMEM, "out of memory");
	char where[600];
	snprintf(where, sizeof where, "command line '%s'", arg);
	struct section *s = kiln_cfg_find_section(cfg, sec);
	kiln_status st = !s && !(s = add_section(cfg, sec, kiln_strdup(where)))
				 ? kiln_error(KILN_ENOMEM, "out of memory")
				 : set_entry(s, key, v, kiln_strdup(where));
	free(v);
	return st;
}
