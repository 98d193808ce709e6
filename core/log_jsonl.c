/* core/log_jsonl.c - out_dir/metrics.jsonl, the logger that is always
 * open: one JSON object per line, every record and every other event of
 * the run (docs/logging.md lists them).  A resumed run appends (after
 * dropping a partial last line, kiln_log_open_append).  Its file is open
 * for reading too, so that a run whose out_dir was removed can copy its
 * lines into the recreated one (jsonl_carry). */
#include "logger.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

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

/* Every byte of fd from offset 0 to its end onto to, in blocks of 64 KiB
 * (the run's own file: no bound beyond its size; the block on the heap:
 * configure.ac's KILN_FRAME_CFLAGS).  0 or an errno; *failed_to 1 when
 * the write failed, 0 when the read did (or the block's allocation). */
static int copy_fd(int fd, int to, int *failed_to)
{
	enum { BLOCK = 65536 };
	char *b = malloc(BLOCK);
	off_t at = 0;
	int err = b ? -1 : ENOMEM;
	*failed_to = 0;
	while (err < 0) {
		ssize_t n = pread(fd, b, BLOCK, at);
		*failed_to = 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? errno : 0;
			break;
		}
		*failed_to = 1;
		if (kiln_write_all(to, b, (size_t)n))
			err = errno ? errno : EIO;
		at += n;
	}
	free(b);
	return err;
}

/* The lines written so far, read back through the file still open (its
 * name gone with the removed out_dir), into dir/metrics.jsonl, created:
 * an error naming the file that failed.  One there already (another
 * process's, in a directory put in out_dir's place) is left alone. */
static kiln_status jsonl_carry(void *ctx, const char *dir)
{
	struct jsonl *j = ctx;
	char path[4200];
	int failed_to = 1, err = 0;
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	if (fflush(j->f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", j->path, strerror(errno));
	int to = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (to < 0)
		err = errno;
	else if ((err = copy_fd(fileno(j->f), to, &failed_to)) == 0 && fsync(to))
		err = errno;
	if (to >= 0 && close(to) && !err)
		err = errno;
	if (!err)
		return KILN_OK;
	if (failed_to)
		return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(err));
	return kiln_error(KILN_EIO, "%s (removed, still open): cannot read: %s", j->path,
			  strerror(err));
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
