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

static kiln_status jsonl_event(void *ctx, json_t *obj)
{
	struct jsonl *j = ctx;
	if (json_dumpf(obj, j->f, JSON_COMPACT | JSON_REAL_PRECISION(7)) || fputc('\n', j->f) < 0 ||
	    fflush(j->f) || ferror(j->f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", j->path, strerror(errno));
	return KILN_OK;
}

/* A number as JSON: integers as integers, non-finite ones as null. */
static json_t *number(const struct kiln_log_field *f)
{
	if (f->integer)
		return json_integer((json_int_t)f->v);
	return isfinite(f->v) ? json_real(f->v) : json_null();
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
