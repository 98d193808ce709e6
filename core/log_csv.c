/* core/log_csv.c - [log] csv = 1: the records as CSV tables in out_dir,
 * train.csv (one row per log point) and eval.csv (one row per
 * evaluation), each with a header line naming its columns as
 * metrics.jsonl names the fields.  The columns are those of the table's
 * first record; a resumed run appends to the tables under their header
 * (a partial last row dropped first, kiln_log_open_append).
 * A cell a record lacks is empty. */
#include "logger.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c */

#include <errno.h>

#define CSV_COLS (KILN_LOG_FIELDS + 1)

struct csv_table {
	const char *event; /* the records it holds */
	FILE *f;           /* opened at its first record */
	char path[4200];
	int ncol;          /* 0: no header yet */
	char col[CSV_COLS][64];
};

struct csv {
	int resumed;
	struct csv_table t[2];
};

static kiln_status csv_open(const char *dir, int resumed, int64_t step, void **ctx)
{
	struct csv *c = calloc(1, sizeof *c);
	(void)step;
	if (!c)
		return kiln_error(KILN_ENOMEM, "out of memory");
	c->resumed = resumed;
	c->t[0].event = "train";
	c->t[1].event = "eval";
	for (int i = 0; i < 2; i++)
		snprintf(c->t[i].path, sizeof c->t[i].path, "%s/%s.csv", dir, c->t[i].event);
	*ctx = c;
	return KILN_OK;
}

/* Another column, named name (cut to the column's size). */
static void add_col(struct csv_table *t, const char *name)
{
	if (t->ncol == CSV_COLS)
		return;
	size_t n = strlen(name) < sizeof t->col[0] - 1 ? strlen(name) : sizeof t->col[0] - 1;
	memcpy(t->col[t->ncol], name, n);
	t->col[t->ncol++][n] = 0;
}

/* The header of an existing table (a resumed run appends under it). */
static void read_header(struct csv_table *t)
{
	char line[CSV_COLS * 64];
	FILE *f = fopen(t->path, "r");
	if (!f)
		return;
	if (fgets(line, sizeof line, f))
		for (char *p = strtok(line, ",\r\n"); p; p = strtok(NULL, ",\r\n"))
			add_col(t, p);
	fclose(f);
}

static kiln_status table_open(struct csv *c, struct csv_table *t)
{
	kiln_status st;
	if (c->resumed) {
		if ((st = kiln_log_open_append(t->path, &t->f)))
			return st;
		read_header(t);
		return KILN_OK;
	}
	return kiln_fopen_regular(t->path, "w", "write", &t->f);
}

/* The columns of the table's first record: its set (evaluations), then
 * its fields. */
static void write_header(struct csv_table *t, const struct kiln_log_record *r)
{
	if (r->set)
		add_col(t, "set");
	for (int i = 0; i < r->n; i++)
		add_col(t, r->f[i].name);
	for (int k = 0; k < t->ncol; k++)
		fprintf(t->f, "%s%s", k ? "," : "", t->col[k]);
	fputc('\n', t->f);
}

/* Column name's cell of record r. */
static void write_cell(FILE *f, const struct kiln_log_record *r, const char *name)
{
	if (!strcmp(name, "set") && r->set) {
		fputs(r->set, f);
		return;
	}
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->f[i].name, name)) {
			char v[40]; /* '.' whatever the application's locale: its ',' would split the cell */
			if (r->f[i].integer)
				snprintf(v, sizeof v, "%lld", (long long)r->f[i].v);
			else
				common_snprintf_c(v, sizeof v, "%.9g", r->f[i].v);
			fputs(v, f);
			return;
		}
}

static kiln_status csv_record(void *ctx, const struct kiln_log_record *r)
{
	struct csv *c = ctx;
	struct csv_table *t = &c->t[strcmp(r->event, "train") != 0];
	kiln_status st;
	if (!t->f && (st = table_open(c, t)))
		return st;
	if (!t->ncol)
		write_header(t, r);
	for (int k = 0; k < t->ncol; k++) {
		if (k)
			fputc(',', t->f);
		write_cell(t->f, r, t->col[k]);
	}
	if (fputc('\n', t->f) < 0 || fflush(t->f) || ferror(t->f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", t->path, strerror(errno));
	return KILN_OK;
}

static kiln_status csv_close(void *ctx)
{
	struct csv *c = ctx;
	kiln_status st = KILN_OK;
	for (int i = 0; i < 2; i++)
		if (c->t[i].f && fclose(c->t[i].f) && !st)
			st = kiln_error(KILN_EIO, "%s: cannot write: %s", c->t[i].path,
					strerror(errno));
	free(c);
	return st;
}

const struct kiln_logger_ops kiln_log_csv = {
	.key = "csv",
	.open = csv_open,
	.record = csv_record,
	.event = NULL,
	.histogram = NULL,
	.carry = NULL,
	.close = csv_close,
};
