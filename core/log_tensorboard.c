/* core/log_tensorboard.c - [log] tensorboard = 1: TensorBoard event files.
 *
 * A file out_dir/events.out.tfevents.<time>.<host> per run (a resumed run
 * starts another: TensorBoard reads a directory's files in name order),
 * a sequence of TFRecords each holding one serialised tensorboard.Event
 * (core/proto/event.proto, packed by the protobuf-c code protoc-c
 * generates from it):
 *   - the first: file_version "brain.Event:2";
 *   - a resumed run's second: SessionLog START at its first new step, so
 *     TensorBoard drops what an earlier file logged from that step on;
 *   - per record (a log point or an evaluation): one Summary with a
 *     simple_value per field, tagged "<train|val|test>/<field>";
 *   - per histogram: one Summary with a HistogramProto.
 * Each record is flushed: TensorBoard shows a run while it trains.
 */
#include "logger.h"
#include "core/proto/event.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

/* ---- TFRecord framing ---------------------------------------------------- */

/* TensorFlow's crc32c::Mask: a CRC stored beside the data it covers is
 * rotated and offset, so a CRC of a CRC does not look valid. */
uint32_t kiln_tfrecord_masked_crc(const void *data, size_t n)
{
	uint32_t crc = kiln_crc32c(0, data, n);
	return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

kiln_status kiln_tfrecord_write(FILE *f, const void *data, size_t n)
{
	uint8_t head[12], tail[4];
	put_le(head, n, 8);
	put_le(head + 8, kiln_tfrecord_masked_crc(head, 8), 4);
	put_le(tail, kiln_tfrecord_masked_crc(data, n), 4);
	if (fwrite(head, 1, 12, f) != 12 || fwrite(data, 1, n, f) != n || fwrite(tail, 1, 4, f) != 4 ||
	    fflush(f))
		return kiln_error(KILN_EIO, "cannot write an event: %s", strerror(errno));
	return KILN_OK;
}

/* ---- the event file -------------------------------------------------------- */

struct tb {
	FILE *f;
	char path[4200];
};

static double wall_time(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ev (its what set by the caller) stamped, packed and written. */
static kiln_status tb_write(struct tb *tb, Tensorboard__Event *ev, int64_t step)
{
	ev->wall_time = wall_time();
	ev->step = step;
	size_t n = tensorboard__event__get_packed_size(ev);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		return kiln_error(KILN_ENOMEM, "out of memory");
	tensorboard__event__pack(ev, buf);
	kiln_status st = kiln_tfrecord_write(tb->f, buf, n);
	free(buf);
	return st ? kiln_error_wrap(st, "%s", tb->path) : KILN_OK;
}

/* A new file: events.out.tfevents.<seconds>.<host>; taken names (a run
 * resumed within the second) move to the next second, which keeps the
 * files in the order they were written. */
static kiln_status tb_create(struct tb *tb, const char *dir)
{
	char host[256] = "localhost";
	gethostname(host, sizeof host - 1);
	long long now = (long long)time(NULL);
	for (int k = 0; k < 1000; k++) {
		snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s", dir, now + k,
			 host);
		int fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 && errno == EEXIST)
			continue;
		if (fd >= 0 && (tb->f = fdopen(fd, "wb")))
			return KILN_OK;
		if (fd >= 0)
			close(fd);
		break;
	}
	return kiln_error(KILN_EIO, "%s: cannot create: %s", tb->path, strerror(errno));
}

static kiln_status tb_close(void *ctx);

static kiln_status tb_open(const char *dir, int resumed, int64_t step, void **ctx)
{
	struct tb *tb = calloc(1, sizeof *tb);
	Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
	Tensorboard__SessionLog start = TENSORBOARD__SESSION_LOG__INIT;
	kiln_status st;
	if (!tb)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = tb_create(tb, dir))) {
		free(tb);
		return st;
	}
	ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
	ev.file_version = "brain.Event:2";
	st = tb_write(tb, &ev, 0);
	if (!st && resumed) {
		start.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
		ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
		ev.session_log = &start;
		st = tb_write(tb, &ev, step + 1);
	}
	if (st) {
		(void)tb_close(tb);
		return st;
	}
	*ctx = tb;
	return KILN_OK;
}

/* One Summary of n values into an event at step. */
static kiln_status tb_summary(struct tb *tb, int64_t step, Tensorboard__Summary__Value *v,
			      size_t n)
{
	Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
	Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
	Tensorboard__Summary__Value *vp[KILN_LOG_FIELDS];
	for (size_t i = 0; i < n; i++)
		vp[i] = &v[i];
	sum.n_value = n;
	sum.value = vp;
	ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
	ev.summary = &sum;
	return tb_write(tb, &ev, step);
}

/* Every field but the step, as "<set or event>/<name>". */
static kiln_status tb_record(void *ctx, const struct kiln_log_record *r)
{
	Tensorboard__Summary__Value v[KILN_LOG_FIELDS];
	char tags[KILN_LOG_FIELDS][96];
	const char *group = r->set ? r->set : r->event;
	size_t n = 0;
	for (int i = 0; i < r->n; i++) {
		if (!strcmp(r->f[i].name, "step"))
			continue;
		tensorboard__summary__value__init(&v[n]);
		snprintf(tags[n], sizeof tags[n], "%s/%s", group, r->f[i].name);
		v[n].tag = tags[n];
		v[n].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
		v[n].simple_value = (float)r->f[i].v;
		n++;
	}
	return tb_summary(ctx, r->step, v, n);
}

static kiln_status tb_histogram(void *ctx, int64_t step, const char *tag,
				const struct kiln_log_hist *h)
{
	Tensorboard__HistogramProto hp = TENSORBOARD__HISTOGRAM_PROTO__INIT;
	Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
	hp.min = h->min, hp.max = h->max, hp.num = h->num;
	hp.sum = h->sum, hp.sum_squares = h->sum_squares;
	hp.n_bucket_limit = hp.n_bucket = (size_t)h->n;
	hp.bucket_limit = (double *)h->limit; /* packing only reads them */
	hp.bucket = (double *)h->count;
	v.tag = (char *)tag;
	v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_HISTO;
	v.histo = &hp;
	return tb_summary(ctx, step, &v, 1);
}

static kiln_status tb_close(void *ctx)
{
	struct tb *tb = ctx;
	kiln_status st = KILN_OK;
	if (tb->f && fclose(tb->f))
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", tb->path, strerror(errno));
	free(tb);
	return st;
}

const struct kiln_logger_ops kiln_log_tensorboard = {
	.key = "tensorboard",
	.open = tb_open,
	.record = tb_record,
	.event = NULL,
	.histogram = tb_histogram,
	.carry = NULL,
	.close = tb_close,
};
