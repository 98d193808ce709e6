/* core/log_csv.c - [log] csv = 1: the records as CSV tables in out_dir,
 * train.csv (one row per log point) and eval.csv (one row per
 * evaluation), each with a header line naming its columns as
 * metrics.jsonl names the fields.  The columns are those of the table's
 * first record; a resumed run appends to the tables under their header
 * (a partial last row dropped first, kiln_log_open_append), having read
 * them when the loggers opened and refused one it cannot append to as it
 * is (read_table: an empty first line, a row longer than the header).
 * A cell a record lacks is empty.  A record with a field the header
 * lacks (a table an older kiln began, before `clipped`, or a run with
 * other settings) widens the table: the file written again, whole
 * or not at all, with the new columns at the end of its header and an
 * empty cell for them in every earlier row (before session 35 the field
 * was dropped from every row for good, silently).  The tables are open for
 * reading too, so that a run whose out_dir was removed carries them into
 * the recreated one (csv_carry; session 36). */
#include "logger.h"

#include <errno.h>
#include <sys/types.h> /* ssize_t: getline */
#include <unistd.h>  /* dup */

struct csv_table {
	const char *event; /* the records it holds */
	FILE *f;           /* opened at its first record */
	char path[4200];
	int ncol, cap;     /* ncol 0: no header yet */
	int widen_failed;  /* a rewrite failed: not tried again (table_widen) */
	char **col;        /* the header's names, as many as it has, empty
			    * ones too (another program's table: its cells
			    * stay under their columns) */
};

struct csv {
	int resumed;
	struct csv_table t[2];
};

/* Another column, named the n bytes at name. */
static kiln_status add_col(struct csv_table *t, const char *name, size_t n)
{
	char **nc = kiln_grow(t->col, t->ncol, &t->cap, sizeof *nc, 32);
	if (!nc)
		return kiln_error(KILN_ENOMEM, "out of memory");
	t->col = nc;
	if (!(nc[t->ncol] = malloc(n + 1)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	memcpy(nc[t->ncol], name, n);
	nc[t->ncol++][n] = 0;
	return KILN_OK;
}

static void free_cols(struct csv_table *t)
{
	for (int k = 0; k < t->ncol; k++)
		free(t->col[k]);
	free(t->col);
	t->col = NULL;
	t->ncol = t->cap = 0;
}

/* The length of the cell at p: up to the first comma outside double
 * quotes, or the line's end (RFC 4180, as pandas and Python's csv module
 * write: "a,b" is one cell, "" a quote within it); *open: a quote left
 * open at the line's end (the cell goes on on the next line). */
static size_t cell_len(const char *p, int *open)
{
	int q = 0;
	size_t n = 0;
	for (; p[n] && (q || p[n] != ','); n++)
		q ^= p[n] == '"';
	*open = q;
	return n;
}

/* The cells of a line (an empty line has one); *open: as cell_len's. */
static int count_cells(const char *line, int *open)
{
	int cells = 1;
	for (const char *p = line + cell_len(line, open); *p; p += 1 + cell_len(p + 1, open))
		cells++;
	return cells;
}

/* The header's names (t->col), each cell of its first line as it is, an
 * empty one too (another program's table: its cells stay under their
 * columns), quotes kept: the widened header writes them back. */
static kiln_status split_header(struct csv_table *t, const char *line)
{
	kiln_status st = KILN_OK;
	int open;
	for (const char *p = line; !st; p++) {
		const size_t n = cell_len(p, &open);
		st = add_col(t, p, n);
		if (!p[n])
			break;
		p += n;
	}
	return st;
}

/* The refusal of a table a resumed run cannot append to as it is, at its
 * line ln: why, and what to do (fix: "" or a fix before the one that
 * always works). */
static kiln_status bad_table(const struct csv_table *t, long long ln, const char *why,
			     const char *fix)
{
	return kiln_error(KILN_EDATA, "%s:%lld: %s; %smove the table aside to begin a new one",
			  t->path, ln, why, fix);
}

/* An existing table a resumed run appends to, read when the loggers open
 * (before a step is taken): its header, and its rows checked, so that the
 * run can append under it and widen it.  Refused (the file left as it is),
 * naming its line: a first line that is empty (the header would come
 * after the rows), a row with more cells than the header has names (the
 * columns a widening adds at the end would take its extra cells), a
 * quoted cell going on to the next line (kiln's tables hold a row a line).
 * Before session 37 the first two went on, and the table was wrong for
 * good.  A partial last line (no '\n') is not read: kiln_log_open_append
 * drops it.  No file: no header yet. */
static kiln_status read_table(struct csv_table *t)
{
	char *line = NULL, why[200];
	size_t cap = 0;
	ssize_t len;
	long long ln = 0;
	kiln_status st = KILN_OK;
	FILE *f = fopen(t->path, "r");
	if (!f) /* (none yet; one that cannot be opened: table_open says why) */
		return KILN_OK;
	while (!st && (len = getline(&line, &cap, f)) > 0 && line[len - 1] == '\n') {
		int open, cells;
		ln++;
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		if (ln == 1 && !len)
			st = bad_table(t, ln, "the first line is empty, where the table's header belongs", "");
		else if (ln == 1)
			st = split_header(t, line);
		if (st)
			break;
		cells = count_cells(line, &open);
		if (open)
			st = bad_table(t, ln, "a quoted cell goes on past the line's end: kiln's tables hold a row a line", "");
		else if (cells > t->ncol) {
			snprintf(why, sizeof why, "%d cells under a header of %d columns: the columns a resumed run adds at the end would take the extra ones",
				 cells, t->ncol);
			st = bad_table(t, ln, why, "remove them, or ");
		}
	}
	if (!st && ferror(f))
		st = kiln_error(KILN_EIO, "%s: cannot read: %s", t->path, strerror(errno));
	free(line);
	fclose(f);
	if (st)
		free_cols(t);
	return st;
}

/* A table's file, opened at its first record: a resumed run's appended to
 * under the header read_table read (none: a new one, written by
 * write_header). */
static kiln_status table_open(struct csv *c, struct csv_table *t)
{
	if (c->resumed)
		return kiln_log_open_append(t->path, &t->f);
	/* readable too: a carry reads it back (csv_carry) */
	return kiln_fopen_regular(t->path, "w+", "write", &t->f);
}

static kiln_status csv_open(const char *dir, int resumed, int64_t step, void **ctx)
{
	struct csv *c = calloc(1, sizeof *c);
	(void)step;
	if (!c)
		return kiln_error(KILN_ENOMEM, "out of memory");
	c->resumed = resumed;
	c->t[0].event = "train";
	c->t[1].event = "eval";
	kiln_status st = KILN_OK;
	for (int i = 0; i < 2 && !st; i++) {
		snprintf(c->t[i].path, sizeof c->t[i].path, "%s/%s.csv", dir, c->t[i].event);
		/* a table is opened at its first record (table_open), after
		 * config.ini and the first steps: what would refuse it (a
		 * directory or FIFO in its place) is refused here, at setup,
		 * as metrics.jsonl is (before session 38 a fresh run failed at
		 * its first log point, and a resume's read of a FIFO here
		 * waited for a writer for ever) */
		st = kiln_run_file_check(c->t[i].path);
		if (!st && resumed)
			st = read_table(&c->t[i]);
	}
	if (st) {
		free_cols(&c->t[0]);
		free(c);
		return st;
	}
	*ctx = c;
	return KILN_OK;
}

/* The columns of the table's first record: its set (evaluations), then
 * its fields. */
static kiln_status write_header(struct csv_table *t, const struct kiln_log_record *r)
{
	kiln_status st = KILN_OK;
	if (r->set)
		st = add_col(t, "set", 3);
	for (int i = 0; i < r->n && !st; i++)
		st = add_col(t, r->f[i].name, strlen(r->f[i].name));
	for (int k = 0; k < t->ncol && !st; k++)
		fprintf(t->f, "%s%s", k ? "," : "", t->col[k]);
	if (!st)
		fputc('\n', t->f);
	return st;
}

static int has_col(const struct csv_table *t, const char *name)
{
	for (int k = 0; k < t->ncol; k++)
		if (!strcmp(t->col[k], name))
			return 1;
	return 0;
}

/* A widened table's file as kiln_file_write takes it (kiln_file_fill):
 * its header of t's columns, then its rows (the old header skipped) each
 * with empty cells up to t's columns (a row shorter than the old header,
 * another program's, padded too, so the new columns' cells stay under
 * them); 0 or an errno. */
struct widen {
	const struct csv_table *t;
	int n0; /* the columns the rows have */
};

static int widen_fill(FILE *out, void *ctx)
{
	const struct widen *w = ctx;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int err = 0;
	/* read through the table's own open file, from its start: its name
	 * may be gone (out_dir removed, the carry still to come) */
	const int fd = dup(fileno(w->t->f));
	FILE *in = fd < 0 ? NULL : fdopen(fd, "r");
	if (!in || fseeko(in, 0, SEEK_SET)) {
		err = errno ? errno : EIO;
		if (in)
			fclose(in);
		else if (fd >= 0)
			close(fd);
		return err;
	}
	for (int k = 0; k < w->t->ncol; k++)
		fprintf(out, "%s%s", k ? "," : "", w->t->col[k]);
	fputc('\n', out);
	for (int row = 0; (len = getline(&line, &cap, in)) > 0; row++) {
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		if (!row)
			continue;
		int open; /* (none: read_table refused such a table) */
		const int cells = len ? count_cells(line, &open) : w->t->ncol; /* a blank line stays blank */
		fputs(line, out);
		for (int k = cells; k < w->t->ncol; k++)
			fputc(',', out);
		fputc('\n', out);
	}
	if (ferror(in))
		err = errno ? errno : EIO;
	else if (ferror(out))
		err = errno ? errno : EIO;
	free(line);
	fclose(in);
	return err;
}

/* Record r's fields that the table's header lacks added to it (as many as
 * fit), the file written again with them (widen_fill) and opened again
 * for appending, said. */
static kiln_status table_widen(struct csv_table *t, const struct kiln_log_record *r)
{
	const int n0 = t->ncol;
	char names[1024] = "";
	kiln_status st = KILN_OK;
	if (r->set && !has_col(t, "set"))
		st = add_col(t, "set", 3);
	for (int i = 0; i < r->n && !st; i++)
		if (!has_col(t, r->f[i].name))
			st = add_col(t, r->f[i].name, strlen(r->f[i].name));
	if (st || t->ncol == n0)
		return st;
	if (t->widen_failed) { /* said once; each record would read the table again */
		while (t->ncol > n0)
			free(t->col[--t->ncol]);
		return KILN_OK;
	}
	for (int k = n0; k < t->ncol; k++)
		snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
			 k > n0 ? ", " : "", t->col[k]);
	const struct widen w = { t, n0 };
	int err = fflush(t->f) ? errno : 0;
	if (!err)
		err = kiln_file_write(t->path, widen_fill, (void *)&w);
	if (err) {
		/* the table as it was, still open, its rows going on under its
		 * header (this record's new fields left out of it): a full disk,
		 * or out_dir removed, whose carry (csv_carry) still has the rows
		 * through t->f.  Before session 36 the file was closed first and
		 * the logger dropped: a removed out_dir's tables were lost. */
		(void)fseeko(t->f, 0, SEEK_END); /* (the read moved the shared offset) */
		while (t->ncol > n0)
			free(t->col[--t->ncol]);
		t->widen_failed = 1;
		kiln_log(KILN_LOG_WARN, "log", "%s: cannot write it again with the column(s) %s its header lacks: %s; its rows go on without them",
			 t->path, names, strerror(err));
		return KILN_OK;
	}
	fclose(t->f); /* (the file read, replaced: its errors no longer matter) */
	st = kiln_log_open_append(t->path, &t->f);
	if (!st)
		kiln_log(KILN_LOG_INFO, "log", "%s: its header lacks the column(s) %s (an older kiln, or other settings, began the table): written again with them, their cells empty in the earlier rows",
			 t->path, names);
	return st;
}

/* Column name's cell of record r. */
static void write_cell(FILE *f, const struct kiln_log_record *r, const char *name)
{
	if (!strcmp(name, "set") && r->set) {
		fputs(r->set, f);
		return;
	}
	/* the field's text (kiln_loggers_record): metrics.jsonl's digits,
	 * '.' whatever the application's locale, whose ',' would split the
	 * cell (before session 37 "%.9g": a loss's last digits lost, 0.05f
	 * as 0.0500000007) */
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->f[i].name, name)) {
			fputs(r->f[i].text, f);
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
	if ((st = t->ncol ? table_widen(t, r) : write_header(t, r)))
		return st;
	for (int k = 0; k < t->ncol; k++) {
		if (k)
			fputc(',', t->f);
		write_cell(t->f, r, t->col[k]);
	}
	if (fputc('\n', t->f) < 0 || fflush(t->f) || ferror(t->f))
		return kiln_error(KILN_EIO, "%s: cannot write: %s", t->path, strerror(errno));
	return KILN_OK;
}

/* The tables written so far, read back through the files still open
 * (their names gone with the removed out_dir), into dir; a table not
 * begun yet has nothing to carry. */
static kiln_status csv_carry(void *ctx, const char *dir)
{
	struct csv *c = ctx;
	for (int i = 0; i < 2; i++) {
		const char *name = strrchr(c->t[i].path, '/') + 1;
		kiln_status st = c->t[i].f ? kiln_log_carry_file(c->t[i].f, c->t[i].path, dir, name)
					   : KILN_OK;
		if (st)
			return st;
	}
	return KILN_OK;
}

static kiln_status csv_close(void *ctx)
{
	struct csv *c = ctx;
	kiln_status st = KILN_OK;
	for (int i = 0; i < 2; i++) {
		if (c->t[i].f && fclose(c->t[i].f) && !st)
			st = kiln_error(KILN_EIO, "%s: cannot write: %s", c->t[i].path,
					strerror(errno));
		free_cols(&c->t[i]);
	}
	free(c);
	return st;
}

const struct kiln_logger_ops kiln_log_csv = {
	.key = "csv",
	.open = csv_open,
	.record = csv_record,
	.event = NULL,
	.histogram = NULL,
	.carry = csv_carry,
	.close = csv_close,
};
