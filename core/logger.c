/* core/logger.c - the run's open loggers: metrics.jsonl and those [log]
 * selects, each record handed to all of them; and the histogram of a
 * tensor they are given.  See logger.h. */
#include "logger.h"
#include "../plugins/common/c_locale.h" /* common_c_numbers_begin, _end */

#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <math.h>
#include <unistd.h>

/* Every logger kiln has: one row each. */
static const struct kiln_logger_ops *const logger_table[] = {
	&kiln_log_jsonl,
	&kiln_log_csv,
	&kiln_log_tensorboard,
};

#define N_LOGGERS KILN_ARRAY_LEN(logger_table)

struct kiln_loggers {
	const struct kiln_logger_ops *ops[N_LOGGERS];
	void *ctx[N_LOGGERS];
	int n;
	int64_t hist_every; /* [log] histograms */
	char *failed;       /* the first failed write's message: the run fails */
	int any_failed;     /* a write failed (failed may be NULL: no memory for it) */
};

/* Whether [log] selects logger ops (always-open ones: yes). */
static kiln_status selected(const struct kiln_config *cfg, const struct kiln_logger_ops *ops,
			    int *on)
{
	*on = 1;
	return ops->key ? kiln_config_get_bool(cfg, "log", ops->key, on) : KILN_OK;
}

kiln_status kiln_loggers_open(const struct kiln_config *cfg, const char *dir, int resumed,
			      int64_t step, struct kiln_loggers **out)
{
	struct kiln_loggers *L = calloc(1, sizeof *L);
	kiln_status st;
	*out = NULL;
	if (!L)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_config_get_int(cfg, "log", "histograms", &L->hist_every))) {
		free(L);
		return st;
	}
	for (size_t i = 0; i < N_LOGGERS; i++) {
		int on;
		if ((st = selected(cfg, logger_table[i], &on)))
			break;
		if (!on)
			continue;
		if ((st = logger_table[i]->open(dir, resumed, step, &L->ctx[L->n])))
			break;
		L->ops[L->n++] = logger_table[i];
	}
	if (st) {
		kiln_loggers_close(L);
		return st;
	}
	if (L->hist_every > 0 && !kiln_loggers_hist_due(L, 0))
		kiln_log(KILN_LOG_WARN, "log", "[log] histograms = %lld: no logger writes histograms (set tensorboard = 1)",
			 (long long)L->hist_every);
	*out = L;
	return KILN_OK;
}

void kiln_log_real_text(char *buf, size_t n, double v, int f32)
{
	const locale_t old = common_c_numbers_begin(); /* '.', for printing and reading back */
	/* a non-finite value as nan, inf or -inf, as docs/logging.md says
	 * (before session 39 %g's text: "-nan" for a NaN whose sign bit is
	 * set, as x86's inf - inf is; a NaN's sign means nothing) */
	if (!isfinite(v))
		snprintf(buf, n, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
	/* the least precision that round-trips: at most 9 digits for a
	 * float32, 17 for a double (%g drops trailing zeros: "0.05"), from
	 * FLT_DIG / DBL_DIG, below which nothing round-trips but numbers with
	 * few digits, which %g prints the same from there (starting at 1 cost
	 * ~17 snprintf + strtod a double: 4x a metrics line's CPU, and
	 * printed 90 as 9e+01; session 37's review) */
	for (int p = f32 ? FLT_DIG : DBL_DIG; isfinite(v) && p <= 17; p++) {
		snprintf(buf, n, "%.*g", p, f32 ? (double)(float)v : v);
		if (f32 ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v)
			break;
	}
	common_c_numbers_end(old);
}

/* The offset just past the last '\n' of f (0: none), reading back from
 * end in blocks. */
static kiln_status last_line_end(FILE *f, const char *path, off_t end, off_t *keep)
{
	char b[4096];
	for (off_t at = end; at > 0;) {
		size_t n = at < (off_t)sizeof b ? (size_t)at : sizeof b;
		at -= (off_t)n;
		if (fseeko(f, at, SEEK_SET) || fread(b, 1, n, f) != n)
			return kiln_error(KILN_EIO, "%s: cannot read: %s", path, strerror(errno));
		for (size_t i = n; i > 0; i--)
			if (b[i - 1] == '\n') {
				*keep = at + (off_t)i;
				return KILN_OK;
			}
	}
	*keep = 0;
	return KILN_OK;
}

kiln_status kiln_log_open_append(const char *path, FILE **out)
{
	FILE *f;
	off_t end, keep;
	kiln_status st = kiln_fopen_regular(path, "a+", "write", &f);
	*out = NULL;
	if (st)
		return st;
	if (fseeko(f, 0, SEEK_END) || (end = ftello(f)) < 0)
		st = kiln_error(KILN_EIO, "%s: cannot read: %s", path, strerror(errno));
	else if (!(st = last_line_end(f, path, end, &keep)) && keep < end) {
		if (ftruncate(fileno(f), keep))
			st = kiln_error(KILN_EIO, "%s: cannot truncate: %s", path,
					strerror(errno));
		else
			kiln_log(KILN_LOG_WARN, "log",
				 "%s: dropped its partial last line (%lld bytes): an earlier run stopped while writing it",
				 path, (long long)(end - keep));
	}
	if (!st && fseeko(f, 0, SEEK_END))
		st = kiln_error(KILN_EIO, "%s: cannot read: %s", path, strerror(errno));
	if (st) {
		fclose(f);
		return st;
	}
	*out = f;
	return KILN_OK;
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

kiln_status kiln_log_carry_file(FILE *f, const char *path, const char *dir, const char *name)
{
	char to_path[4200];
	int failed_to = 1, err = 0;
	snprintf(to_path, sizeof to_path, "%s/%s", dir, name);
	if (fflush(f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
	int to = open(to_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (to < 0)
		err = errno;
	else if ((err = copy_fd(fileno(f), to, &failed_to)) == 0 && fsync(to))
		err = errno;
	if (to >= 0 && close(to) && !err)
		err = errno;
	if (!err)
		return KILN_OK;
	if (failed_to)
		return kiln_error(KILN_EIO, "%s: cannot write: %s", to_path, strerror(err));
	return kiln_error(KILN_EIO, "%s (removed, still open): cannot read: %s", path,
			  strerror(err));
}

kiln_status kiln_loggers_carry(struct kiln_loggers *L, const char *dir)
{
	kiln_status first = KILN_OK;
	char *msg = NULL;
	for (int i = 0; L && i < L->n; i++) {
		kiln_status st = L->ops[i]->carry ? L->ops[i]->carry(L->ctx[i], dir) : KILN_OK;
		if (st && !first) {
			first = st;
			msg = kiln_strdup(kiln_last_error());
		}
	}
	if (first)
		first = kiln_error(first, "%s", msg ? msg : "out of memory");
	free(msg);
	return first;
}

/* A logger whose write failed: closed, its message kept for
 * kiln_loggers_status (the run ends with it). */
static void drop(struct kiln_loggers *L, int i)
{
	if (!L->any_failed)
		L->failed = kiln_strdup(kiln_last_error());
	L->any_failed = 1;
	(void)L->ops[i]->close(L->ctx[i]);
	for (int k = i + 1; k < L->n; k++)
		L->ops[k - 1] = L->ops[k], L->ctx[k - 1] = L->ctx[k];
	L->n--;
}

void kiln_loggers_record(struct kiln_loggers *L, const struct kiln_log_record *r)
{
	if (!L || !L->n)
		return;
	struct kiln_log_record c = *r; /* with its fields' texts, for every logger */
	for (int i = 0; i < c.n; i++) {
		struct kiln_log_field *f = &c.f[i];
		/* a float32 field is the float32 its value rounds to: a double
		 * past FLT_MAX is infinite there, null in metrics.jsonl (was
		 * "inf.0", not JSON, for a moment in session 38) */
		if (f->kind == KILN_LOG_F32)
			f->v = (double)(float)f->v;
		if (f->kind == KILN_LOG_INT)
			snprintf(f->text, sizeof f->text, "%lld", (long long)f->v);
		else
			kiln_log_real_text(f->text, sizeof f->text, f->v, f->kind == KILN_LOG_F32);
	}
	for (int i = 0; i < L->n; i++)
		if (L->ops[i]->record && L->ops[i]->record(L->ctx[i], &c))
			drop(L, i--);
}

void kiln_loggers_event(struct kiln_loggers *L, json_t *obj)
{
	for (int i = 0; L && obj && i < L->n; i++)
		if (L->ops[i]->event && L->ops[i]->event(L->ctx[i], obj))
			drop(L, i--);
	json_decref(obj);
}

int kiln_loggers_hist_due(const struct kiln_loggers *L, int64_t step)
{
	int any = 0;
	for (int i = 0; L && i < L->n; i++)
		any |= L->ops[i]->histogram != NULL;
	return any && L->hist_every > 0 && step % L->hist_every == 0;
}

void kiln_loggers_histogram(struct kiln_loggers *L, int64_t step, const char *tag,
			    const float *v, size_t n)
{
	struct kiln_log_hist h;
	kiln_log_hist_of(&h, v, n);
	for (int i = 0; L && i < L->n; i++)
		if (L->ops[i]->histogram && L->ops[i]->histogram(L->ctx[i], step, tag, &h))
			drop(L, i--);
}

kiln_status kiln_loggers_status(const struct kiln_loggers *L)
{
	if (!L || !L->any_failed)
		return KILN_OK;
	/* (no copy of the message: still a failed run, not a silent one) */
	return kiln_error(KILN_EIO, "%s",
			  L->failed ? L->failed : "a logger's write failed (out of memory for its message)");
}

kiln_status kiln_loggers_close(struct kiln_loggers *L)
{
	for (int i = 0; L && i < L->n; i++)
		if (L->ops[i]->close(L->ctx[i]) && !L->any_failed) {
			L->failed = kiln_strdup(kiln_last_error());
			L->any_failed = 1;
		}
	kiln_status st = kiln_loggers_status(L);
	if (L)
		free(L->failed);
	free(L);
	return st;
}

/* min, max and the moments over the finite values; then the counts. */
void kiln_log_hist_of(struct kiln_log_hist *h, const float *v, size_t n)
{
	memset(h, 0, sizeof *h);
	h->min = INFINITY, h->max = -INFINITY;
	for (size_t i = 0; i < n; i++) {
		double x = v[i];
		if (!isfinite(x))
			continue;
		h->min = x < h->min ? x : h->min;
		h->max = x > h->max ? x : h->max;
		h->num += 1, h->sum += x, h->sum_squares += x * x;
	}
	if (!h->num) {
		h->min = h->max = 0;
		return;
	}
	const double w = (h->max - h->min) / KILN_LOG_BUCKETS;
	h->n = w > 0 ? KILN_LOG_BUCKETS : 1;
	for (int b = 0; b < h->n; b++)
		h->limit[b] = b + 1 == h->n ? h->max : h->min + w * (b + 1);
	for (size_t i = 0; i < n; i++) {
		double x = v[i];
		if (!isfinite(x))
			continue;
		int b = w > 0 ? (int)((x - h->min) / w) : 0;
		b = b < 0 ? 0 : b >= h->n ? h->n - 1 : b;
		/* (limit[b-1], limit[b]]: a value on a lower limit belongs below */
		if (b > 0 && x <= h->limit[b - 1])
			b--;
		h->count[b] += 1;
	}
}
