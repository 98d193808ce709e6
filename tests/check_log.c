/* tests/check_log.c - the loggers (core/logger.h) without a training run:
 * TensorBoard's record framing against bytes TensorBoard's own Python
 * writer produced, the event file read back through the protobuf-c code
 * of core/proto/event.proto, the histogram, CSV and metrics.jsonl text.
 * tests/log_tensorboard.sh reads a real run's files with TensorBoard. */
#include "core/logger.h"
#include "core/proto/event.pb-c.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <math.h>

/* The expected bytes below come from the tensorboard 2.21 Python package:
 * tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c and
 * tensorboard.summary.writer.record_writer.RecordWriter over
 * event_pb2.Event(wall_time=1.5, step=7, file_version="brain.Event:2"). */
static const char event_hex[] = "09000000000000f83f10071a0d627261696e2e4576656e743a32";
static const char framed_hex[] = "1a00000000000000129bd82d"
				 "09000000000000f83f10071a0d627261696e2e4576656e743a32"
				 "da446486";

static size_t unhex(const char *hex, uint8_t *out)
{
	size_t n = strlen(hex) / 2;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		sscanf(hex + 2 * i, "%2x", &v);
		out[i] = (uint8_t)v;
	}
	return n;
}

START_TEST(test_masked_crc)
{
	ck_assert_uint_eq(kiln_tfrecord_masked_crc("", 0), 0xa282ead8u);
	ck_assert_uint_eq(kiln_tfrecord_masked_crc("123456789", 9), 0xc78ab0e5u);
	ck_assert_uint_eq(kiln_tfrecord_masked_crc("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 32),
			  0x849a5dd9u);
}
END_TEST

START_TEST(test_tfrecord_frame)
{
	uint8_t ev[64], want[128], got[128];
	size_t n = unhex(event_hex, ev), nw = unhex(framed_hex, want);
	FILE *f = tmpfile();
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(kiln_tfrecord_write(f, ev, n), KILN_OK);
	ck_assert_int_eq(ftell(f), (long)nw);
	rewind(f);
	ck_assert_uint_eq(fread(got, 1, sizeof got, f), nw);
	ck_assert_mem_eq(got, want, nw);
	fclose(f);
}
END_TEST

static char dir[512];

static void dir_setup(void)
{
	ck_assert_ptr_nonnull(test_tmpdir_make(dir, sizeof dir, "log"));
}

static void dir_teardown(void)
{
	test_tmpdir_remove(dir);
}

static struct kiln_loggers *open_loggers(const char *ini, int resumed, int64_t step)
{
	struct kiln_config *cfg;
	struct kiln_loggers *L;
	ck_assert_int_eq(kiln_config_load_string(ini, "test.ini", &cfg), KILN_OK);
	ck_assert_msg(kiln_loggers_open(cfg, dir, resumed, step, &L) == KILN_OK, "%s",
		      kiln_last_error());
	kiln_config_free(cfg);
	return L;
}

static struct kiln_log_record train_rec(int64_t step, double loss, int with_norm)
{
	struct kiln_log_record r = { .event = "train", .step = step };
	kiln_log_add(&r, "epoch", 1, 1);
	kiln_log_add(&r, "step", (double)step, 1);
	kiln_log_add(&r, "loss", loss, 0);
	if (with_norm)
		kiln_log_add(&r, "grad_norm", 0.5, 0);
	return r;
}

/* The events files in dir, in name order, into names (at most 4). */
static int event_files(char names[][800])
{
	int n = 0;
	DIR *d = opendir(dir);
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (!strncmp(de->d_name, "events.out.tfevents.", 20) && n < 4)
			snprintf(names[n++], 800, "%s/%s", dir, de->d_name);
	closedir(d);
	if (n == 2 && strcmp(names[0], names[1]) > 0) {
		char t[800];
		memcpy(t, names[0], 800), memcpy(names[0], names[1], 800), memcpy(names[1], t, 800);
	}
	return n;
}

/* The events of a file, each record's framing checked. */
static int read_events(const char *path, Tensorboard__Event **ev, int max)
{
	size_t len, at = 0;
	uint8_t *b = (uint8_t *)test_read_file(path, &len);
	int n = 0;
	while (at < len && n < max) {
		uint64_t m = 0;
		uint32_t c1 = 0, c2 = 0;
		ck_assert_uint_ge(len - at, 16);
		for (int i = 7; i >= 0; i--)
			m = m << 8 | b[at + i];
		for (int i = 3; i >= 0; i--)
			c1 = c1 << 8 | b[at + 8 + i], c2 = c2 << 8 | b[at + 12 + m + i];
		ck_assert_uint_eq(c1, kiln_tfrecord_masked_crc(b + at, 8));
		ck_assert_uint_eq(c2, kiln_tfrecord_masked_crc(b + at + 12, m));
		ev[n] = tensorboard__event__unpack(NULL, m, b + at + 12);
		ck_assert_ptr_nonnull(ev[n]);
		n++;
		at += 16 + m;
	}
	ck_assert_uint_eq(at, len);
	free(b);
	return n;
}

START_TEST(test_tensorboard_file)
{
	struct kiln_loggers *L = open_loggers("[log]\ntensorboard = 1\nhistograms = 5\n", 0, 0);
	struct kiln_log_record r = train_rec(5, 0.25, 1);
	const float w[4] = { -1, 0, 1, 2 };
	ck_assert_int_eq(kiln_loggers_hist_due(L, 5), 1);
	ck_assert_int_eq(kiln_loggers_hist_due(L, 6), 0);
	kiln_loggers_record(L, &r);
	kiln_loggers_histogram(L, 5, "weights/fc.weight", w, 4);
	kiln_loggers_close(L);
	/* a resumed run from step 3: another file, which starts with START at 4 */
	L = open_loggers("[log]\ntensorboard = 1\n", 1, 3);
	ck_assert_int_eq(kiln_loggers_hist_due(L, 5), 0);
	kiln_loggers_close(L);

	char names[4][800];
	Tensorboard__Event *ev[8];
	ck_assert_int_eq(event_files(names), 2);
	ck_assert_int_eq(read_events(names[0], ev, 8), 3);
	ck_assert_int_eq(ev[0]->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
	ck_assert_str_eq(ev[0]->file_version, "brain.Event:2");
	ck_assert(ev[0]->wall_time > 1.6e9);
	/* every field but the step, tagged train/NAME */
	ck_assert_int_eq(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SUMMARY);
	ck_assert_int_eq(ev[1]->step, 5);
	Tensorboard__Summary *s = ev[1]->summary;
	ck_assert_uint_eq(s->n_value, 3);
	ck_assert_str_eq(s->value[0]->tag, "train/epoch");
	ck_assert_str_eq(s->value[1]->tag, "train/loss");
	ck_assert_str_eq(s->value[2]->tag, "train/grad_norm");
	ck_assert_int_eq(s->value[1]->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
	ck_assert_float_eq(s->value[1]->simple_value, 0.25f);
	ck_assert_float_eq(s->value[0]->simple_value, 1.0f);
	/* the histogram */
	s = ev[2]->summary;
	ck_assert_str_eq(s->value[0]->tag, "weights/fc.weight");
	Tensorboard__HistogramProto *h = s->value[0]->histo;
	ck_assert_double_eq(h->min, -1);
	ck_assert_double_eq(h->max, 2);
	ck_assert_double_eq(h->num, 4);
	ck_assert_double_eq(h->sum, 2);
	ck_assert_double_eq(h->sum_squares, 6);
	ck_assert_uint_eq(h->n_bucket, KILN_LOG_BUCKETS);
	ck_assert_double_eq(h->bucket_limit[KILN_LOG_BUCKETS - 1], 2);
	for (int i = 0; i < 3; i++)
		tensorboard__event__free_unpacked(ev[i], NULL);
	ck_assert_int_eq(read_events(names[1], ev, 8), 2);
	ck_assert_int_eq(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SESSION_LOG);
	ck_assert_int_eq(ev[1]->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
	ck_assert_int_eq(ev[1]->step, 4);
	for (int i = 0; i < 2; i++)
		tensorboard__event__free_unpacked(ev[i], NULL);
}
END_TEST

/* Bucket i holds (limit[i-1], limit[i]]; non-finite values count nowhere. */
START_TEST(test_histogram)
{
	float v[7] = { 0, 1, 2, 3, NAN, INFINITY, 0.1f };
	struct kiln_log_hist h;
	kiln_log_hist_of(&h, v, 7);
	ck_assert_double_eq(h.min, 0);
	ck_assert_double_eq(h.max, 3);
	ck_assert_double_eq(h.num, 5);
	ck_assert_double_eq_tol(h.sum, 6.1, 1e-6);
	ck_assert_int_eq(h.n, KILN_LOG_BUCKETS);
	double total = 0;
	for (int i = 0; i < h.n; i++)
		total += h.count[i];
	ck_assert_double_eq(total, 5);
	for (int k = 0; k < 7; k++) {
		if (!isfinite(v[k]))
			continue;
		int b = 0;
		while (v[k] > h.limit[b])
			b++;
		ck_assert_msg(h.count[b] >= 1, "value %g: bucket %d empty", v[k], b);
	}
	ck_assert_double_eq(h.count[0], 1); /* 0 */
	ck_assert_double_eq(h.count[1], 1); /* 0.1f, a little above the limit 0.1 */
	float same[3] = { 2, 2, 2 };
	kiln_log_hist_of(&h, same, 3);
	ck_assert_int_eq(h.n, 1);
	ck_assert_double_eq(h.count[0], 3);
	ck_assert_double_eq(h.limit[0], 2);
}
END_TEST

START_TEST(test_csv_tables)
{
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 0, 0);
	struct kiln_log_record r = train_rec(5, 0.25, 1);
	kiln_loggers_record(L, &r);
	r = train_rec(10, NAN, 1);
	kiln_loggers_record(L, &r);
	struct kiln_log_record e = { .event = "eval", .set = "val", .step = 10 };
	kiln_log_add(&e, "step", 10, 1);
	kiln_log_add(&e, "acc", 0.75, 0);
	kiln_loggers_record(L, &e);
	kiln_loggers_close(L);
	/* resumed: appended under the header; a missing field is an empty cell */
	L = open_loggers("[log]\ncsv = 1\n", 1, 10);
	r = train_rec(15, 0.125, 0);
	kiln_loggers_record(L, &r);
	kiln_loggers_close(L);

	char path[700];
	size_t n;
	snprintf(path, sizeof path, "%s/train.csv", dir);
	char *t = test_read_file(path, &n);
	ck_assert_str_eq(t, "epoch,step,loss,grad_norm\n1,5,0.25,0.5\n1,10,nan,0.5\n1,15,0.125,\n");
	free(t);
	snprintf(path, sizeof path, "%s/eval.csv", dir);
	t = test_read_file(path, &n);
	ck_assert_str_eq(t, "set,step,acc\nval,10,0.75\n");
	free(t);
}
END_TEST

/* metrics.jsonl, always open: integers as integers, NaN as null, the
 * other events as they are. */
START_TEST(test_jsonl)
{
	struct kiln_loggers *L = open_loggers("[log]\n", 0, 0);
	struct kiln_log_record r = train_rec(5, NAN, 0);
	kiln_loggers_record(L, &r);
	kiln_loggers_event(L, json_pack("{s:s, s:I}", "event", "checkpoint", "step", (json_int_t)5));
	kiln_loggers_event(L, NULL);
	kiln_loggers_close(L);
	char path[700];
	size_t n;
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	char *t = test_read_file(path, &n);
	ck_assert_str_eq(t, "{\"event\":\"train\",\"epoch\":1,\"step\":5,\"loss\":null}\n"
			    "{\"event\":\"checkpoint\",\"step\":5}\n");
	free(t);
	/* no event files, no tables without [log] asking */
	snprintf(path, sizeof path, "%s/train.csv", dir);
	ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

/* Warnings the loggers log, kept for the partial-line test. */
static char warned[TEST_WARNED_SIZE];

static void write_text(const char *name, const char *text)
{
	char path[700];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void expect_text(const char *name, const char *text)
{
	char path[700];
	size_t n;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	char *t = test_read_file(path, &n);
	ck_assert_str_eq(t, text);
	free(t);
}

/* A run that died mid-line (a full disk): the resumed run drops the
 * partial last line of metrics.jsonl and of the CSV tables (a table cut
 * inside its header gets a new one) and says so, its lines starting
 * lines of their own. */
START_TEST(test_resume_partial_line)
{
	write_text("metrics.jsonl", "{\"event\":\"train\",\"step\":5}\n{\"event\":\"train\",\"st");
	write_text("train.csv", "epoch,step,loss\n1,5,0.25\n1,10,0.");
	write_text("eval.csv", "set,st");
	warned[0] = 0;
	kiln_log_set_sink(test_keep_warning, warned);
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 1, 5);
	kiln_loggers_event(L, json_pack("{s:s, s:I}", "event", "resume", "step", (json_int_t)5));
	struct kiln_log_record r = train_rec(10, 0.125, 0);
	kiln_loggers_record(L, &r);
	struct kiln_log_record e = { .event = "eval", .set = "val", .step = 10 };
	kiln_log_add(&e, "step", 10, 1);
	kiln_loggers_record(L, &e);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	kiln_log_set_sink(NULL, NULL);

	expect_text("metrics.jsonl", "{\"event\":\"train\",\"step\":5}\n"
				     "{\"event\":\"resume\",\"step\":5}\n"
				     "{\"event\":\"train\",\"epoch\":1,\"step\":10,\"loss\":0.125}\n"
				     "{\"event\":\"eval\",\"set\":\"val\",\"step\":10}\n");
	expect_text("train.csv", "epoch,step,loss\n1,5,0.25\n1,10,0.125\n");
	expect_text("eval.csv", "set,step\nval,10\n");
	char want[4096];
	snprintf(want, sizeof want,
		 "%s/metrics.jsonl: dropped its partial last line (20 bytes): an earlier run stopped while writing it\n"
		 "%s/train.csv: dropped its partial last line (7 bytes): an earlier run stopped while writing it\n"
		 "%s/eval.csv: dropped its partial last line (6 bytes): an earlier run stopped while writing it\n",
		 dir, dir, dir);
	ck_assert_str_eq(warned, want);
}
END_TEST

/* The "log" messages of any level, kept for the widening test. */
static char said[TEST_WARNED_SIZE];

static void keep_said(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)level;
	size_t n = strlen(said);
	if (!strcmp(who, "log"))
		snprintf(said + n, sizeof said - n, "%s\n", msg);
}

/* Tables whose header lacks a field of the resumed run's records (an
 * older kiln's train.csv, before "clipped"; an eval.csv begun by a final
 * test, which has no "epoch"): written again with the new columns at the
 * end of the header, the earlier rows' cells for them empty, and the new
 * rows under it, every row as long as the header; said once.  Before
 * session 35 the rows kept the old columns and the new field was dropped
 * from every row for good. */
START_TEST(test_csv_widen)
{
	write_text("train.csv", "epoch,step,loss\n1,5,0.25\n1,10,0.125\n");
	write_text("eval.csv", "set,step,loss\ntest,10,0.5\n");
	said[0] = 0;
	kiln_log_set_sink(keep_said, NULL);
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 1, 10);
	struct kiln_log_record r = train_rec(15, 0.0625, 1);
	kiln_log_add(&r, "clipped", 3, 1);
	kiln_loggers_record(L, &r);
	r = train_rec(20, 0.03125, 1);
	kiln_log_add(&r, "clipped", 4, 1);
	kiln_loggers_record(L, &r);
	struct kiln_log_record e = { .event = "eval", .set = "val", .step = 20 };
	kiln_log_add(&e, "epoch", 2, 1);
	kiln_log_add(&e, "step", 20, 1);
	kiln_log_add(&e, "loss", 0.25, 0);
	kiln_loggers_record(L, &e);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	kiln_log_set_sink(NULL, NULL);

	expect_text("train.csv", "epoch,step,loss,grad_norm,clipped\n"
				 "1,5,0.25,,\n"
				 "1,10,0.125,,\n"
				 "1,15,0.0625,0.5,3\n"
				 "1,20,0.03125,0.5,4\n");
	expect_text("eval.csv", "set,step,loss,epoch\n"
				"test,10,0.5,\n"
				"val,20,0.25,2\n");
	char want[4096];
	snprintf(want, sizeof want,
		 "%s/train.csv: its header lacks the column(s) grad_norm, clipped (an older kiln, or other settings, began the table): written again with them, their cells empty in the earlier rows\n"
		 "%s/eval.csv: its header lacks the column(s) epoch (an older kiln, or other settings, began the table): written again with them, their cells empty in the earlier rows\n",
		 dir, dir);
	ck_assert_str_eq(said, want);
	/* the next resume appends under the widened header, saying nothing */
	said[0] = 0;
	kiln_log_set_sink(keep_said, NULL);
	L = open_loggers("[log]\ncsv = 1\n", 1, 20);
	r = train_rec(25, 0.5, 1);
	kiln_log_add(&r, "clipped", 5, 1);
	kiln_loggers_record(L, &r);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_str_eq(said, "");
	expect_text("train.csv", "epoch,step,loss,grad_norm,clipped\n"
				 "1,5,0.25,,\n"
				 "1,10,0.125,,\n"
				 "1,15,0.0625,0.5,3\n"
				 "1,20,0.03125,0.5,4\n"
				 "1,25,0.5,0.5,5\n");
}
END_TEST

/* A table another program widened (session 36): a header of 22 columns,
 * one of them empty (an index pandas wrote) and one longer than 63 bytes,
 * and a row shorter than it.  The resumed run's cells go under their own
 * names, the new column at the end, every earlier row padded to the
 * header.  The old reader kept 17 names of at most 63 bytes and skipped
 * the empty one: the loss went under the empty column, the widened header
 * lost five names. */
START_TEST(test_csv_foreign_header)
{
	char head[512] = ",epoch,step,loss", row[256] = "0,1,5,0.25", empty[64] = "";
	for (int k = 1; k <= 17; k++) {
		snprintf(head + strlen(head), sizeof head - strlen(head), ",x%d", k);
		snprintf(row + strlen(row), sizeof row - strlen(row), ",%d", k);
		strcat(empty, ",");
	}
	const char *longname = "a_column_name_longer_than_sixty_three_bytes_which_the_old_reader_cut";
	snprintf(head + strlen(head), sizeof head - strlen(head), ",%s", longname);
	char text[1024], want[2048];
	snprintf(text, sizeof text, "%s\n%s,7\n1,1,10\n", head, row);
	write_text("train.csv", text);
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 1, 10);
	struct kiln_log_record r = train_rec(15, 0.0625, 1);
	kiln_loggers_record(L, &r);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	snprintf(want, sizeof want, "%s,grad_norm\n%s,7,\n1,1,10,%s,,\n,1,15,0.0625%s,,0.5\n",
		 head, row, empty, empty);
	expect_text("train.csv", want);
}
END_TEST

/* A table widened after out_dir was removed (session 36, found by review):
 * the widen's rewrite cannot be made, so the table goes on under its
 * header, still open, with a warning, and the carry into the recreated
 * directory has every row.  Before, the widen closed the table first and
 * failed, the logger was dropped and the carry found nothing. */
START_TEST(test_csv_widen_after_removal)
{
	char gone[600], again[600], path[700];
	write_text("train.csv", "epoch,step,loss\n1,5,0.25\n");
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 1, 5);
	struct kiln_log_record r = train_rec(10, 0.125, 0);
	kiln_loggers_record(L, &r);
	snprintf(gone, sizeof gone, "%s.gone", dir);
	ck_assert_int_eq(rename(dir, gone), 0);
	said[0] = 0;
	kiln_log_set_sink(keep_said, NULL);
	r = train_rec(15, 0.0625, 1); /* grad_norm: a column the header lacks */
	kiln_loggers_record(L, &r);
	r = train_rec(20, 0.03125, 1); /* not tried again, not said again */
	kiln_loggers_record(L, &r);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_msg(strstr(said, "cannot write it again") &&
			      !strstr(strstr(said, "cannot write it again") + 1, "cannot write it again"),
		      "%s", said);
	ck_assert_int_eq(rename(gone, dir), 0); /* (the fixture removes dir) */
	snprintf(again, sizeof again, "%s/again", dir);
	ck_assert_int_eq(mkdir(again, 0777), 0);
	/* the table's file in dir now is the one renamed away and back: the
	 * carry reads the open file, whatever its name */
	ck_assert_msg(kiln_loggers_carry(L, again) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	expect_text("again/train.csv", "epoch,step,loss\n1,5,0.25\n1,10,0.125\n1,15,0.0625\n"
					"1,20,0.03125\n");
	snprintf(path, sizeof path, "%s/again/metrics.jsonl", dir);
	ck_assert_int_eq(access(path, F_OK), 0);
}
END_TEST

/* out_dir removed mid-run (session 34; the CSV tables session 36): metrics.jsonl's lines so far,
 * read back through the file still open after its name is gone, into the
 * recreated directory's metrics.jsonl, which the reopened loggers
 * continue; a second carry there (the file exists: another process's) is
 * refused naming it, the file left alone.  The old code opened a fresh
 * metrics.jsonl write-only and had no carry: the lines were lost. */
START_TEST(test_jsonl_carry)
{
	char sub[600], path[700];
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 0, 0);
	struct kiln_log_record r = train_rec(5, 0.5, 0);
	kiln_loggers_record(L, &r);
	kiln_loggers_event(L, json_pack("{s:s, s:I}", "event", "checkpoint", "step", (json_int_t)5));
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	ck_assert_int_eq(unlink(path), 0);
	snprintf(sub, sizeof sub, "%s/again", dir);
	ck_assert_int_eq(mkdir(sub, 0777), 0);
	ck_assert_msg(kiln_loggers_carry(L, sub) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_loggers_carry(L, sub), KILN_EIO);
	char want[1400];
	snprintf(want, sizeof want, "%s/metrics.jsonl: cannot write: File exists", sub);
	ck_assert_str_eq(kiln_last_error(), want);
	kiln_loggers_close(L);
	expect_text("again/metrics.jsonl", "{\"event\":\"train\",\"epoch\":1,\"step\":5,\"loss\":0.5}\n"
					   "{\"event\":\"checkpoint\",\"step\":5}\n");
	/* the CSV tables too (session 36; they had no carry): train.csv's
	 * rows, and no eval.csv, which had no record yet */
	expect_text("again/train.csv", "epoch,step,loss\n1,5,0.5\n");
	snprintf(path, sizeof path, "%s/eval.csv", sub);
	ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

/* kiln_log_real_text: the shortest text that reads back as the value, a
 * double's or a float32's, for values with short and long texts, and for
 * pseudo-random ones of every magnitude. */
START_TEST(test_real_text)
{
	static const struct {
		double v;
		int f32;
		const char *text;
	} c[] = {
		{ 0.1 + 0.2, 0, "0.30000000000000004" },
		{ 1.0 / 3, 0, "0.3333333333333333" },
		{ 16777216, 0, "16777216" },
		{ 1e-5, 0, "1e-05" },
		{ 0.05f, 1, "0.05" },              /* the double's 0.05000000074505806 */
		{ 1.0f / 3, 1, "0.33333334" },
		{ 16777216.0f, 1, "16777216" },    /* 2^24: 7 digits read 1.677722e+07 */
		{ 3.4028234663852886e38, 1, "3.4028235e+38" },
		{ -0.0, 0, "-0" },
		{ 90, 0, "90" },                   /* 9e+01 when the search began at 1 digit */
		{ 10.0f, 1, "10" },
		{ 2560.0f, 1, "2560" },
	};
	char t[40];
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		kiln_log_real_text(t, sizeof t, c[i].v, c[i].f32);
		ck_assert_str_eq(t, c[i].text);
	}
	/* a non-finite value as docs/logging.md names it: a NaN's sign
	 * dropped (x86's inf - inf has its sign bit set: "-nan" before
	 * session 39), an infinity's kept */
	const double nonfinite[] = { INFINITY, -INFINITY, NAN, -NAN, -(INFINITY - INFINITY) };
	const char *const words[] = { "inf", "-inf", "nan", "nan", "nan" };
	for (int i = 0; i < 5; i++)
		for (int f32 = 0; f32 < 2; f32++) {
			kiln_log_real_text(t, sizeof t, nonfinite[i], f32);
			ck_assert_str_eq(t, words[i]);
		}
	uint64_t x = 88172645463325252ull;
	for (int i = 0; i < 20000; i++) {
		double d;
		float f;
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(&d, &x, sizeof d);
		memcpy(&f, &x, sizeof f);
		if (isfinite(d)) {
			kiln_log_real_text(t, sizeof t, d, 0);
			ck_assert_msg(strtod(t, NULL) == d, "%a printed %s", d, t);
		}
		if (isfinite(f)) {
			kiln_log_real_text(t, sizeof t, f, 1);
			ck_assert_msg(strtof(t, NULL) == f, "%a printed %s", (double)f, t);
		}
	}
}
END_TEST

/* Every real metrics.jsonl and the CSV tables hold reads back as the number
 * logged: a double's 17 digits, a float32's (the lr, the loss scale, the
 * gradient norm) shortest text; the other events' reals too.  Before
 * session 37 metrics.jsonl kept 7 digits (a loss scale of 2^24 read
 * 1.677722e7, a loss lost its last digits) and the tables 9 (0.05f as
 * 0.0500000007). */
START_TEST(test_real_digits)
{
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 0, 0);
	struct kiln_log_record r = { .event = "train", .step = 5 };
	kiln_log_add(&r, "step", 5, KILN_LOG_INT);
	kiln_log_add(&r, "loss", 1.0 / 3, KILN_LOG_F64);
	kiln_log_add(&r, "loss_scale", 16777216.0f, KILN_LOG_F32);
	kiln_log_add(&r, "lr", 0.05f, KILN_LOG_F32);
	kiln_log_add(&r, "grad_norm", 1.0f / 3, KILN_LOG_F32);
	kiln_log_add(&r, "data_wait", 1e-5, KILN_LOG_F64);
	kiln_log_add(&r, "samples_per_s", 1.5e20, KILN_LOG_F64);
	kiln_loggers_record(L, &r);
	kiln_loggers_event(L, json_pack("{s:s, s:f, s:[f, f], s:o}", "event", "final", "train_loss",
					0.1 + 0.2, "x", 1.0, 0.25, "test_loss", json_null()));
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	expect_text("metrics.jsonl",
		    "{\"event\":\"train\",\"step\":5,\"loss\":0.3333333333333333,\"loss_scale\":16777216.0,"
		    "\"lr\":0.05,\"grad_norm\":0.33333334,\"data_wait\":1e-5,\"samples_per_s\":1.5e20}\n"
		    "{\"event\":\"final\",\"train_loss\":0.30000000000000004,\"x\":[1.0,0.25],\"test_loss\":null}\n");
	expect_text("train.csv", "step,loss,loss_scale,lr,grad_norm,data_wait,samples_per_s\n"
				 "5,0.3333333333333333,16777216,0.05,0.33333334,1e-05,1.5e+20\n");
}
END_TEST

/* A float32 field's layout in each file, pinned: metrics.jsonl writes the
 * double its shortest text reads back as, laid out as a double prints
 * (%.15g's rule: 1e+07 is 10000000.0 there), the tables the float32's
 * text itself; a non-finite one is null and "nan"/"inf".  Since session
 * 38 both come from one text a field (kiln_loggers_record). */
START_TEST(test_f32_layouts)
{
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 0, 0);
	struct kiln_log_record r = { .event = "train", .step = 5 };
	kiln_log_add(&r, "a", 1e7f, KILN_LOG_F32);
	kiln_log_add(&r, "b", -1.5e10f, KILN_LOG_F32);
	kiln_log_add(&r, "c", 1e14f, KILN_LOG_F32);
	kiln_log_add(&r, "d", 1e15f, KILN_LOG_F32);
	kiln_log_add(&r, "e", 1e-5f, KILN_LOG_F32);
	kiln_log_add(&r, "f", 1.25e-30f, KILN_LOG_F32);
	kiln_log_add(&r, "g", 1e6f, KILN_LOG_F32);
	kiln_log_add(&r, "h", 123456.0f, KILN_LOG_F32);
	kiln_log_add(&r, "i", 0.0001f, KILN_LOG_F32);
	kiln_log_add(&r, "j", -0.0f, KILN_LOG_F32);
	kiln_log_add(&r, "k", INFINITY, KILN_LOG_F32);
	kiln_log_add(&r, "l", 3e38f, KILN_LOG_F32);
	kiln_log_add(&r, "m", 100, KILN_LOG_F64);
	kiln_log_add(&r, "n", -7, KILN_LOG_INT);
	kiln_log_add(&r, "o", 2.5e-8, KILN_LOG_F64);
	kiln_log_add(&r, "p", 1e39, KILN_LOG_F32); /* a finite double, an infinite float32 */
	kiln_loggers_record(L, &r);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	expect_text("metrics.jsonl",
		    "{\"event\":\"train\",\"a\":10000000.0,\"b\":-15000000000.0,\"c\":100000000000000.0,"
		    "\"d\":1e15,\"e\":1e-5,\"f\":1.25e-30,\"g\":1000000.0,\"h\":123456.0,\"i\":0.0001,"
		    "\"j\":-0.0,\"k\":null,\"l\":3e38,\"m\":100.0,\"n\":-7,\"o\":2.5e-8,\"p\":null}\n");
	expect_text("train.csv", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p\n"
				 "1e+07,-1.5e+10,1e+14,1e+15,1e-05,1.25e-30,1e+06,123456,0.0001,-0,inf,3e+38,100,-7,2.5e-08,inf\n");
}
END_TEST

/* A table a resumed run cannot append to as it is: a row with more cells
 * than the header has columns (the columns a widening adds at the end
 * would take its extra cells), a first line that is empty (the run wrote
 * a header after the rows); refused when the loggers open, naming the
 * file and line, the file left as it was (then removed here).  Before session 37 both went
 * on: the extra cells stood under grad_norm and clipped, the header came
 * after the rows.  A quoted comma is within a cell (pandas writes one). */
static void expect_refused(const char *name, const char *text, const char *msg)
{
	struct kiln_config *cfg;
	struct kiln_loggers *L = NULL;
	char want[1400];
	write_text(name, text);
	ck_assert_int_eq(kiln_config_load_string("[log]\ncsv = 1\n", "test.ini", &cfg), KILN_OK);
	kiln_status st = kiln_loggers_open(cfg, dir, 1, 10, &L);
	kiln_config_free(cfg);
	if (!st) {
		struct kiln_log_record r = train_rec(15, 0.0625, 1);
		kiln_log_add(&r, "clipped", 3, KILN_LOG_INT);
		kiln_loggers_record(L, &r);
		st = kiln_loggers_status(L);
		kiln_loggers_close(L);
	}
	ck_assert_int_eq(st, KILN_EDATA);
	snprintf(want, sizeof want, "%s/%s", dir, msg);
	ck_assert_str_eq(kiln_last_error(), want);
	ck_assert_ptr_null(L);
	expect_text(name, text);
	snprintf(want, sizeof want, "%s/%s", dir, name);
	ck_assert_int_eq(unlink(want), 0);
}

START_TEST(test_csv_bad_tables)
{
	expect_refused("train.csv", "epoch,step,loss\n1,5,0.25,9,9\n",
		       "train.csv:2: 5 cells under a header of 3 columns: the columns a resumed run adds at the end would take the extra ones; remove them, or move the table aside to begin a new one");
	expect_refused("train.csv", "\n1,5,0.25\n",
		       "train.csv:1: the first line is empty, where the table's header belongs; move the table aside to begin a new one");
	expect_refused("eval.csv", "set,step,note\nval,5,\"a\nb\"\n",
		       "eval.csv:2: a quoted cell goes on past the line's end: kiln's tables hold a row a line; move the table aside to begin a new one");
	/* quoted commas, in the header and in a row; a blank line stays blank */
	write_text("train.csv", "epoch,step,loss,\"note, free\"\n1,5,0.25,\"a,b\"\n\n1,10,0.125\n");
	struct kiln_loggers *L = open_loggers("[log]\ncsv = 1\n", 1, 10);
	struct kiln_log_record r = train_rec(15, 0.0625, 1);
	kiln_loggers_record(L, &r);
	ck_assert_int_eq(kiln_loggers_close(L), KILN_OK);
	expect_text("train.csv", "epoch,step,loss,\"note, free\",grad_norm\n"
				 "1,5,0.25,\"a,b\",\n"
				 "\n"
				 "1,10,0.125,,\n"
				 "1,15,0.0625,,0.5\n");
}
END_TEST

static Suite *make_log_suite(void)
{
	Suite *s = suite_create("log");
	check_add_case(s, "framing", 0, NULL, NULL,
		       (const TTest *[]){ test_masked_crc, test_tfrecord_frame, test_histogram,
						    test_real_text, NULL });
	check_add_case(s, "files", 0, dir_setup, dir_teardown,
		       (const TTest *[]){ test_tensorboard_file, test_csv_tables, test_jsonl,
						    test_resume_partial_line, test_csv_widen,
						    test_csv_foreign_header, test_csv_widen_after_removal,
						    test_jsonl_carry, test_real_digits, test_f32_layouts, test_csv_bad_tables,
						    NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_log_suite };
