/* core/log_jsonl.c - out_dir/metrics.jsonl, the logger that is always
 * open: one JSON object per line, every record and every other event of
 * the run (docs/logging.md lists them).  A resumed run appends (after
 * dropping a partial last line, kiln_log_open_append).  Its file is open
 * for reading too, so that a run whose out_dir was removed can copy its
 * lines into the recreated one (jsonl_carry). */
#include "logger.h"
#include "../plugins/common/c_locale.h" /* common_strtod */

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

/* A real as JSON text: kiln_log_real_text's digits, written as jansson
 * writes a real (a ".0" when they have neither '.' nor an exponent, so that
 * a reader gets a real back; the exponent without '+' and leading zeros:
 * 1e-5, 1.5e20).  v finite. */
static void real_json(char *t, size_t n, double v)
{
	kiln_log_real_text(t, n - 2, v, 0);
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
		json_object_foreach(v, key, x) {
			json_t *k = json_string(key);
			bad = bad || !k || (i++ && fputc(',', f) < 0) ||
			      json_dumpf(k, f, JSON_ENCODE_ANY) || fputc(':', f) < 0 || dump(f, x);
			json_decref(k);
		}
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

/* A number as JSON: integers as integers, non-finite ones as null, a
 * float32 as the double its shortest text reads back as (that double's
 * shortest text is the same text, the 17 digits of a double being more
 * than a float32's 9: real_json prints "0.05" for an lr of 0.05f). */
static json_t *number(const struct kiln_log_field *f)
{
	char t[40];
	if (f->kind == KILN_LOG_INT)
		return json_integer((json_int_t)f->v);
	if (!isfinite(f->v))
		return json_null();
	if (f->kind != KILN_LOG_F32)
		return json_real(f->v);
	kiln_log_real_text(t, sizeof t, f->v, 1);
	return json_real(common_strtod(t, NULL));
}

static kiln_status jsonl_record(void *ctx, const struct kiln_log_record *r)
{
	json_t *obj = json_object();
	int bad = !obj || json_object_set_new(obj, "event", json_string(r->event)) ||
		  (r->set && json_object_set_new(obj, "set", json_string(r->set)));
	for (int i = 0; !bad && i < r->n; i++)
		bad = json_object_set_new(obj, r->f[i].name, number(&r->f[i]));
	kiln_status st = bad ? kiln_error(KILN_ENOMEM, "out of memory") : jsonl_event(ctx, obj);
	json_decref(obj);
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
