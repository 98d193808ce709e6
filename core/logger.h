/* core/logger.h - where a run's numbers go.
 *
 * A logger is a table of ops and a context, as a device is.  metrics.jsonl
 * (log_jsonl.c) is always open; [log] selects the others: TensorBoard
 * event files (log_tensorboard.c) and CSV tables (log_csv.c).  Only rank
 * 0 opens any (the trainer does not call kiln_loggers_open elsewhere).
 *
 * At a log point the trainer fills one record (a train line, or an
 * evaluation's) and hands it to every open logger; metrics.jsonl also
 * takes the run's other events (checkpoint, resume, final, ...) as JSON
 * objects, and TensorBoard the histograms of weights and gradients.  A
 * logger whose write fails (a full disk) is closed and the failure kept:
 * kiln_loggers_status returns it, and the trainer ends the run with it
 * (a lost metrics line is an error, not a warning).
 */
#ifndef KILN_LOGGER_H
#define KILN_LOGGER_H

#include "internal.h"

#include <jansson.h>
#include <stdio.h>

/* What a field's number was where the trainer read it, which says how it
 * is printed (kiln_log_real_text): an integer (step, epoch, counts), a
 * double (the interval's means, times), or a float32 (lr, grad_norm,
 * loss_scale: device floats), printed as the shortest text that reads
 * back as that float32 ("0.05", not the double's 0.05000000074505806).
 * 0 and 1 are the values the integer flag this replaced had. */
enum kiln_log_kind {
	KILN_LOG_F64 = 0,
	KILN_LOG_INT = 1,
	KILN_LOG_F32 = 2,
};

/* One number of a record, named as in metrics.jsonl (a name once a
 * record); v holds it exactly (a float32's or an integer's value too).
 * text: its digits, "%lld" or kiln_log_real_text's, filled in by
 * kiln_loggers_record for every logger: the shortest-text search runs
 * once a field, not once in each logger (before session 38 a float32's
 * ran three times: metrics.jsonl's two, the CSV table's one). */
struct kiln_log_field {
	const char *name;
	double v;
	enum kiln_log_kind kind;
	char text[32];
};

#define KILN_LOG_FIELDS 16

/* One line of metrics.jsonl: {"event": event, "set": set, f[0], ...}.
 * step: the optimizer steps done (TensorBoard's step; also one of f). */
struct kiln_log_record {
	const char *event; /* "train" or "eval" */
	const char *set;   /* eval: "val" or "test"; NULL: none */
	int64_t step;
	int n;
	struct kiln_log_field f[KILN_LOG_FIELDS];
};

/* Append a field (silently dropped past KILN_LOG_FIELDS: a programming
 * error the tests would show as a missing column). */
static inline void kiln_log_add(struct kiln_log_record *r, const char *name, double v,
				enum kiln_log_kind kind)
{
	if (r->n < KILN_LOG_FIELDS)
		r->f[r->n++] = (struct kiln_log_field){ name, v, kind, "" };
}

/* The text a logger writes for a real v (C locale, whatever the
 * application's): the shortest "%.<p>g" that reads back as v, or, f32, as
 * (float)v; a non-finite v as "%g" prints it ("nan", "-inf": the JSON
 * logger writes null instead).  buf: n bytes, 32 are enough.  metrics.jsonl
 * and the CSV tables write the same digits, so a value compares equal
 * with PyTorch's logged one read back (before session 37 metrics.jsonl
 * kept 7 significant digits: a loss scale of 2^24 read 1.677722e7). */
void kiln_log_real_text(char *buf, size_t n, double v, int f32);

#define KILN_LOG_BUCKETS 30

/* A histogram of n values: TensorBoard's HistogramProto.  Bucket i counts
 * the values in (limit[i-1], limit[i]] (bucket 0 from min); the buckets
 * are equally wide between min and max (one bucket when they are equal).
 * Non-finite values are left out of every number. */
struct kiln_log_hist {
	double min, max, num, sum, sum_squares;
	int n;
	double limit[KILN_LOG_BUCKETS], count[KILN_LOG_BUCKETS];
};

void kiln_log_hist_of(struct kiln_log_hist *h, const float *v, size_t n);

/* A logger's table.  open: the context for a run writing into dir (which
 * exists); resumed: the run continues one whose optimizer step was
 * `step`.  record, event, histogram: optional (NULL: ignored).  carry
 * (optional; NULL: what the logger wrote is lost with its directory): the
 * run's out_dir was removed mid-run and recreated as dir; write what the
 * logger wrote so far into dir's file of the same name, created, so that
 * the logger reopened there (resumed) continues it. */
struct kiln_logger_ops {
	const char *key; /* its [log] key; NULL: always open */
	kiln_status (*open)(const char *dir, int resumed, int64_t step, void **ctx);
	kiln_status (*record)(void *ctx, const struct kiln_log_record *r);
	kiln_status (*event)(void *ctx, json_t *obj); /* borrows obj */
	kiln_status (*histogram)(void *ctx, int64_t step, const char *tag,
				 const struct kiln_log_hist *h);
	kiln_status (*carry)(void *ctx, const char *dir);
	kiln_status (*close)(void *ctx);
};

/* path opened to append a resumed run's lines (created if missing).  A
 * partial last line, left by a run that died while writing it (a full
 * disk, a kill), is cut off first with a warning naming path and the
 * bytes dropped, so the new lines start a line of their own. */
kiln_status kiln_log_open_append(const char *path, FILE **out);

/* A carry (kiln_logger_ops): what f holds (opened for reading too; its
 * file was path, whose name went with the removed out_dir), from its
 * start, into dir/name, created (one there already, another process's, is
 * left alone: an error) and synced.  An error names the file that failed. */
kiln_status kiln_log_carry_file(FILE *f, const char *path, const char *dir, const char *name);

extern const struct kiln_logger_ops kiln_log_jsonl, kiln_log_csv, kiln_log_tensorboard;

struct kiln_loggers;

/* metrics.jsonl and the loggers [log] selects, writing into dir.  *out
 * is freed by kiln_loggers_close (NULL is fine everywhere below). */
kiln_status kiln_loggers_open(const struct kiln_config *cfg, const char *dir, int resumed,
			      int64_t step, struct kiln_loggers **out);
void kiln_loggers_record(struct kiln_loggers *L, const struct kiln_log_record *r);
/* obj: consumed (decref'd), NULL ignored */
void kiln_loggers_event(struct kiln_loggers *L, json_t *obj);
/* [log] histograms: 1 when step is one of the steps to histogram */
int kiln_loggers_hist_due(const struct kiln_loggers *L, int64_t step);
void kiln_loggers_histogram(struct kiln_loggers *L, int64_t step, const char *tag,
			    const float *v, size_t n);
/* KILN_EIO with the message of the first failed write, KILN_OK if none. */
kiln_status kiln_loggers_status(const struct kiln_loggers *L);
/* out_dir removed mid-run, recreated as dir: each logger's carry (those
 * without one lose their lines); every one is tried, the first error
 * returned (its message naming the file).  L stays open: close it, then
 * open dir's loggers resumed. */
kiln_status kiln_loggers_carry(struct kiln_loggers *L, const char *dir);
/* Close every logger and free L: KILN_EIO when a write or close failed. */
kiln_status kiln_loggers_close(struct kiln_loggers *L);

/* ---- TensorBoard's record framing (TFRecord), for log_tensorboard.c and
 * its test.  CRC32C masked as TensorFlow's crc32c::Mask does. */
uint32_t kiln_tfrecord_masked_crc(const void *data, size_t n);
/* One record into f: u64 length, masked CRC of the length's 8 bytes,
 * data, masked CRC of the data (little-endian). */
kiln_status kiln_tfrecord_write(FILE *f, const void *data, size_t n);

#endif /* KILN_LOGGER_H */
