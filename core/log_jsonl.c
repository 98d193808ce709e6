/* core/log_jsonl.c - out_dir/metrics.jsonl, the logger that is always
 * open: one JSON object per line, every record and every other event of
 * the run (docs/logging.md lists them).  A resumed run appends (after
 * dropping a partial last line, kiln_log_open_append).  Its file is open
 * for reading too, so that a run whose out_dir was removed can copy its
 * lines into the recreated one (jsonl_carry). */
#include "logger.h"

#include <errno.h>
#include <math.h>

struct jsonl {
	FILE *f;
	char path[4200];
};

static kiln_status jsonl_open(const char *dir, int resumed, int64_t step, void **ctx)
{
	struct jsonl *j = calloc(1, sizeof *j);
	(void)step;
	if (!j)
		return kiln_error(KILN_ENOMEM, "out of memory");
	snprintf(j->path, sizeof j->path, "%s/metrics.jsonl", dir);
	kiln_status st = KILN_OK;
	if (resumed)
		st = kiln_log_open_append(j->path, &j->f);
	else
		st = kiln_fopen_regular(j->path, "w+", "write", &j->f);
	if (st) {
		free(j);
		return st;
	}
	*ctx = j;
	return KILN_OK;
}

/* A real's digits t (kiln_log_real_text's) as JSON text, in place, as
 * jansson writes a real (a ".0" when they have neither '.' nor an
 * exponent, so that a reader gets a real back; the exponent without '+'
 * and leading zeros: 1e-5, 1.5e20).  t has room for 2 more bytes. */
static void real_layout(char *t)
{
	char *e = strchr(t, 'e');
	if (!e && !strchr(t, '.'))
		strcat(t, ".0");
	if (e) {
		char *d = e + 1 + (e[1] == '-'), *z = e + 1;
		while (*z == '+' || *z == '-' || (*z == '0' && z[1]))
			z++;
		memmove(d, z, strlen(z) + 1);
	}
}

/* A real as JSON text: kiln_log_real_text's digits, real_layout's form.
 * v finite. */
static void real_json(char *t, size_t n, double v)
{
	kiln_log_real_text(t, n - 2, v, 0);
	real_layout(t);
}

/* s as a JSON string onto f, as jansson writes it.  Nonzero: a write
 * failed, or out of memory (or s is not UTF-8). */
static int dump_string(FILE *f, const char *s)
{
	json_t *k = json_string(s);
	const int bad = !k || json_dumpf(k, f, JSON_ENCODE_ANY);
	json_decref(k);
	return bad;
}

/* v as JSON text onto f, as json_dumpf(JSON_COMPACT) writes it but for
 * the reals: each the shortest text that reads back as the same double
 * (real_json).  json_dumpf prints every real with one precision: 7 digits
 * (before session 37) lost digits of a loss and printed a loss scale of
 * 2^24 as 1.677722e7; 17 prints 0.05 as 0.050000000000000003.  Nonzero:
 * a write failed, or out of memory. */
static int dump(FILE *f, json_t *v)
{
	const char *key;
	json_t *x;
	size_t i = 0;
	int bad = 0;
	char t[40];
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		bad = fputc('{', f) < 0;
		json_object_foreach(v, key, x)
			bad = bad || (i++ && fputc(',', f) < 0) || dump_string(f, key) ||
			      fputc(':', f) < 0 || dump(f, x);
		return bad || fputc('}', f) < 0;
	case JSON_ARRAY:
		bad = fputc('[', f) < 0;
		json_array_foreach(v, i, x)
			bad = bad || (i && fputc(',', f) < 0) || dump(f, x);
		return bad || fputc(']', f) < 0;
	case JSON_REAL:
		real_json(t, sizeof t, json_real_value(v));
		return fputs(t, f) < 0;
	default: /* strings, integers, true, false, null */
		return json_dumpf(v, f, JSON_COMPACT | JSON_ENCODE_ANY);
	}
}

static kiln_status jsonl_event(void *ctx, json_t *obj)
{
	struct jsonl *j = ctx;
	if (dump(j->f, obj) || fputc('\n', j->f) < 0 || fflush(j->f) || ferror(j->f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", j->path, strerror(errno));
	return KILN_OK;
}

/* A float32's text (at most 9 digits, %.<p>g with p from 6 to 9) as the
 * double it reads back as prints (kiln_log_real_text: the same digits, a
 * double's 15 keeping them), into t: laid out by %.15g's rule, which
 * writes out an exponent from p to 14 ("1e+07": 10000000).  metrics.jsonl
 * has held that double's text since session 37 (a float32 as the double
 * its shortest text reads back as: "0.05" for an lr of 0.05f); the CSV
 * tables the float32's text. */
static void f32_as_double(char *t, const char *s)
{
	const char *e = strchr(s, 'e');
	const int x = e ? atoi(e + 1) : -1;
	if (x < 0 || x >= 15) {
		strcpy(t, s);
		return;
	}
	int nd = 0;
	if (*s == '-')
		*t++ = *s++;
	for (; s < e; s++)
		if (*s != '.')
			*t++ = *s, nd++;
	for (; nd <= x; nd++)
		*t++ = '0';
	*t = 0;
}

/* Field f's value as JSON onto out: integers as integers, non-finite
 * numbers as null, reals as real_layout writes their text.  Nonzero: a
 * write failed. */
static int field_json(FILE *out, const struct kiln_log_field *f)
{
	char t[40];
	if (f->kind == KILN_LOG_INT)
		return fputs(f->text, out) < 0;
	if (!isfinite(f->v))
		return fputs("null", out) < 0;
	if (f->kind == KILN_LOG_F32)
		f32_as_double(t, f->text);
	else
		strcpy(t, f->text);
	real_layout(t);
	return fputs(t, out) < 0;
}

/* {"event": event, "set": set, name: value, ...}, made whole before a
 * byte of it is written (a string jansson refuses, out of memory: no
 * part line); each value from its field's text (kiln_loggers_record). */
static kiln_status jsonl_record(void *ctx, const struct kiln_log_record *r)
{
	struct jsonl *j = ctx;
	char *line = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&line, &len);
	int bad = !m || fputc('{', m) < 0 || dump_string(m, "event") || fputc(':', m) < 0 ||
		  dump_string(m, r->event) ||
		  (r->set && (fputs(",", m) < 0 || dump_string(m, "set") || fputc(':', m) < 0 ||
			      dump_string(m, r->set)));
	for (int i = 0; !bad && i < r->n; i++)
		bad = fputc(',', m) < 0 || dump_string(m, r->f[i].name) || fputc(':', m) < 0 ||
		      field_json(m, &r->f[i]);
	bad = (m && fclose(m)) || bad;
	kiln_status st = KILN_OK;
	if (bad)
		st = kiln_error(KILN_ENOMEM, "out of memory");
	else if (fputs(line, j->f) < 0 || fputs("}\n", j->f) < 0 || fflush(j->f) || ferror(j->f))
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", j->path, strerror(errno));
	free(line);
	return st;
}

/* The lines written so far, read back through the file still open (its
 * name gone with the removed out_dir), into dir/metrics.jsonl, created. */
static kiln_status jsonl_carry(void *ctx, const char *dir)
{
	struct jsonl *j = ctx;
	return kiln_log_carry_file(j->f, j->path, dir, "metrics.jsonl");
}

static kiln_status jsonl_close(void *ctx)
{
	struct jsonl *j = ctx;
	kiln_status st = KILN_OK;
	if (fclose(j->f))
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", j->path, strerror(errno));
	free(j);
	return st;
}

const struct kiln_logger_ops kiln_log_jsonl = {
	.key = NULL,
	.open = jsonl_open,
	.record = jsonl_record,
	.event = jsonl_event,
	.histogram = NULL,
	.carry = jsonl_carry,
	.close = jsonl_close,
};
