/* cli/cmd_report.c - `kiln report RUN_DIR [-o FILE]`: one self-contained
 * HTML page of a run (docs/report.md): its curves as inline SVG (from
 * metrics.jsonl), the resolved config (config.ini), the model summary and
 * memory report of that config, and the top of the profile table when the
 * run was profiled.  No script, no external resource. */
#include "build-config.h"
#include "cli.h"
#include "report.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h> /* the run's TensorBoard files */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h> /* close */

const char cmd_report_usage[] = "usage: kiln report RUN_DIR [-o FILE]\n";
const char cmd_report_about[] =
	"Write an HTML report of the run in RUN_DIR (a [run] out_dir) to FILE (default\n"
	"RUN_DIR/report.html): training and evaluation loss and accuracy, learning rate,\n"
	"throughput, data wait, gradient norm and loss scale against the step (each plot\n"
	"only when metrics.jsonl has the field), the resolved config, the model summary\n"
	"(`kiln summary`) and memory report (`kiln memory`) of RUN_DIR/config.ini, and the\n"
	"top of RUN_DIR/profile.txt when the run was profiled.  One file, inline SVG, no\n"
	"script: it opens offline in any browser.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage error (no RUN_DIR/metrics.jsonl).\n";

/* The plots: y = the field of the train lines and of each evaluation set's
 * lines, against the step. */
static const struct chart {
	const char *id, *title, *field;
} charts[] = {
	{ "loss", "Loss", "loss" },
	{ "acc", "Accuracy (top-1)", "acc" },
	{ "lr", "Learning rate", "lr" },
	{ "throughput", "Throughput (training samples/s)", "samples_per_s" },
	{ "data_wait", "Data wait (fraction of the interval's wall time)", "data_wait" },
	{ "grad_norm", "Gradient norm", "grad_norm" },
	{ "loss_scale", "Loss scale", "loss_scale" },
	{ "time", "Time since the start (s)", "time" },
};
static const char *const sets[] = { "train", "val", "test" };
#define NSETS 3

/* The most of config.ini a report reads (the config loader's own limit,
 * KILN_CONFIG_MAX_BYTES), and of profile.txt (its head is all it shows). */
#define CONFIG_MAX ((size_t)16 << 20)
#define PROFILE_MAX ((size_t)1 << 20)

/* The file at path, NUL-terminated (free it), at most `max` bytes of it
 * (*cut set when there was more); NULL with why (n bytes) saying why: it
 * is missing ("" then), not a regular file, or unreadable.  A regular
 * file only, opened without blocking (common_open_file): before session
 * 36 a FIFO there blocked the report for ever and /dev/zero was read into
 * memory until it ran out. */
static char *slurp(const char *path, size_t max, int *cut, char *why, size_t n)
{
	const char *w = NULL;
	char kind[96];
	int fd = common_open_file(path, kind, sizeof kind, &w, NULL);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
	*why = 0;
	*cut = 0;
	if (!f) {
		const int e = errno;
		if (fd >= 0)
			close(fd), w = strerror(e);
		if (e != ENOENT)
			snprintf(why, n, "%s: %s", path, w);
		return NULL;
	}
	char *buf = malloc(max + 1);
	errno = 0;
	size_t got = buf ? fread(buf, 1, max + 1, f) : 0;
	if (!buf || ferror(f)) {
		snprintf(why, n, "%s: %s", path, buf ? strerror(errno ? errno : EIO) : "out of memory");
		free(buf);
		buf = NULL;
	} else {
		*cut = got > max;
		buf[got > max ? max : got] = 0;
	}
	fclose(f);
	return buf;
}

static void write_head(FILE *f, const char *dir)
{
	fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>kiln report: ", f);
	report_html_text(f, dir);
	fputs("</title>\n<style>\n"
	      "body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }\n"
	      "pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }\n"
	      "svg.plot { display: block; margin: 0.5em 0 1.5em; font-size: 11px; }\n"
	      "svg .grid { stroke: #e4e4e4; } svg .frame { fill: none; stroke: #888; }\n"
	      "svg .line { fill: none; stroke-width: 1.5; } svg .title { font-size: 13px; font-weight: bold; }\n"
	      ".note { color: #777; font-style: italic; } td { padding: 0 1em 0 0; }\n"
	      "</style></head>\n<body>\n<h1>kiln run report: ", f);
	report_html_text(f, dir);
	fputs("</h1>\n", f);
}

/* A row of the result table: v in fmt, or why there is none: "missing"
 * (the final line lacks it), or, written as null, `null_is` ("not finite":
 * kiln writes a diverged loss as null; before session 40 both said
 * "missing"). */
static void result_row_why(FILE *f, const char *name, const char *fmt, struct report_number v,
			   const char *null_is)
{
	fprintf(f, "<tr><td>%s</td><td>", name);
	if (isnan(v.v))
		fprintf(f, "<span class=\"note\">%s</span>", v.null ? null_is : "missing");
	else
		fprintf(f, fmt, v.v);
	fputs("</td></tr>\n", f);
}

static void result_row(FILE *f, const char *name, const char *fmt, struct report_number v)
{
	result_row_why(f, name, fmt, v, "not finite");
}

/* The training samples/s: the run's (every data-parallel rank's) and one
 * rank's where they differ (before session 39 the rank's alone, which a
 * 2-rank run halved beside its train lines' samples_per_s), else the one
 * number (one process; a final line from before the run's rate). */
static void write_rates(FILE *f, const struct report_metrics *m)
{
	const struct report_number run = m->final_run_samples_per_s, rank = m->final_samples_per_s;
	if (isnan(run.v) || run.v == rank.v) {
		result_row(f, "training samples/s", "%.1f", rank);
		return;
	}
	result_row(f, "training samples/s (all data-parallel ranks)", "%.1f", run);
	result_row(f, "training samples/s (one data-parallel rank)", "%.1f", rank);
}

/* The "final" line's numbers, when the run finished. */
static void write_result(FILE *f, const struct report_metrics *m)
{
	fputs("<section id=\"result\"><h2>Result</h2>\n", f);
	if (!m->have_final) {
		fputs("<p class=\"note\">No \"final\" line in metrics.jsonl: the run stopped or is still running.</p>\n", f);
	} else {
		/* both test numbers null: no evaluation (a measured accuracy
		 * is finite); the loss alone: it diverged */
		const char *test_null = m->final_test_loss.null && m->final_test_acc.null
						? "none (no evaluation)"
						: "not finite";
		fputs("<table>\n", f);
		result_row(f, "epochs", "%g", m->final_epochs);
		result_row(f, "steps", "%g", m->final_steps);
		result_row(f, "train loss (the last epoch's)", "%.4f", m->final_train_loss);
		result_row_why(f, "test loss", "%.4f", m->final_test_loss, test_null);
		result_row_why(f, "test accuracy", "%.4f", m->final_test_acc, test_null);
		write_rates(f, m);
		result_row(f, "wall time", "%.1f s", m->final_wall_s);
		fputs("</table>\n", f);
	}
	fprintf(f, "<p>metrics.jsonl: %ld lines%s", m->lines,
		m->bad_lines > m->long_lines ? " (some not JSON objects: skipped)" : "");
	if (m->long_lines)
		fprintf(f, " (%ld longer than %d MiB: skipped)", m->long_lines, REPORT_LINE_MAX >> 20);
	if (m->resumes)
		fprintf(f, "; %ld resume(s): %ld train and eval line(s) of an interrupted run, logged after the checkpoint it was resumed from, left out of the curves (the resumed run logged those steps again)",
			m->resumes, m->abandoned);
	fputs("</p>\n</section>\n", f);
}

/* Every chart whose field some line has; a note for the others. */
static void write_curves(FILE *f, const struct report_metrics *m)
{
	fputs("<section id=\"curves\"><h2>Curves</h2>\n", f);
	for (size_t c = 0; c < sizeof charts / sizeof *charts; c++) {
		const struct report_series *s[NSETS];
		int any = 0;
		for (int k = 0; k < NSETS; k++) {
			char name[64];
			snprintf(name, sizeof name, "%s.%s", sets[k], charts[c].field);
			s[k] = report_series_find(m, name);
			any |= s[k] != NULL;
		}
		if (any)
			report_svg_chart(f, charts[c].id, charts[c].title, s, sets, NSETS);
		else
			fprintf(f, "<p class=\"note\" id=\"missing-%s\">%s: no plot, metrics.jsonl has no \"%s\" field.</p>\n",
				charts[c].id, charts[c].title, charts[c].field);
	}
	fputs("</section>\n", f);
}

/* A section holding text in <pre>, or a note when text is NULL. */
static void write_pre(FILE *f, const char *id, const char *title, const char *text,
		      const char *missing)
{
	fprintf(f, "<section id=\"%s\"><h2>%s</h2>\n", id, title);
	if (text) {
		fputs("<pre>", f);
		report_html_text(f, text);
		fputs("</pre>\n", f);
	} else {
		fputs("<p class=\"note\">", f);
		report_html_text(f, missing);
		fputs("</p>\n", f);
	}
	fputs("</section>\n", f);
}

/* The report's parts, for kiln_file_write. */
struct report_src {
	const char *dir, *out;
	const struct report_metrics *m;
	char refused[4600]; /* the output is a file of the run's data: why */
};

/* The model summary and the memory report of the run's config, built as
 * `kiln summary` and `kiln memory` build them; on failure, why.  A data
 * source refusing to open because one of its files is the report's
 * output (kiln_output_watch) is kept in src->refused: the report is not
 * written (before session 36 `-o` onto the training images replaced
 * them). */
static void write_model(FILE *f, const char *config, struct report_src *src)
{
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	char *sum = NULL, *mem = NULL, why[5000] = "";
	size_t n;
	kiln_status st = cli_load(config, 0, NULL, 0, &cfg, &reg);
	FILE *m = st ? NULL : open_memstream(&sum, &n);
	if (m) {
		struct kiln_summary s;
		if (!(st = kiln_summary_report(cfg, reg, 1, m, &s)))
			kiln_summary_free(&s);
		fclose(m);
	}
	m = st ? NULL : open_memstream(&mem, &n);
	if (m) {
		struct kiln_memory r = KILN_MEMORY_INIT;
		st = kiln_memory_report(cfg, reg, m, &r);
		fclose(m);
	}
	/* (on the heap, as the paths below: the frame cap, docs/design-notes.md) */
	const size_t on = strlen(src->out) + 32;
	char *own = malloc(on);
	if (own)
		snprintf(own, on, "the output %s is the file ", src->out);
	if (st == KILN_EUSAGE && (!own || strstr(kiln_last_error(), own)))
		snprintf(src->refused, sizeof src->refused, "%s", kiln_last_error());
	free(own);
	if (st)
		snprintf(why, sizeof why, "Not available: %s: %s", config, kiln_last_error());
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	write_pre(f, "summary", "Model summary (kiln summary)", st ? NULL : sum, why);
	write_pre(f, "memory", "Memory (kiln memory)", st ? NULL : mem, why);
	free(sum);
	free(mem);
}

/* The profile table's head and its first rows (the most expensive).  Not
 * inlined, nor write_config: each one's messages (9 KiB) in fill_report's
 * frame took it past the frame cap (docs/design-notes.md). */
static __attribute__((noinline)) void write_profile(FILE *f, const char *path)
{
	enum { ROWS = 24 };
	static const char more[] = "...\n(the whole table: profile.txt; the trace: trace.json)\n";
	char why[4400], *top = NULL;
	int cut;
	char *text = slurp(path, PROFILE_MAX, &cut, why, sizeof why);
	if (text) {
		const char *p = text;
		for (int line = 0; *p && line < ROWS + 4; line++) {
			const char *nl = strchr(p, '\n');
			p = nl ? nl + 1 : p + strlen(p);
		}
		const size_t keep = (size_t)(p - text);
		if ((top = malloc(keep + sizeof more))) {
			memcpy(top, text, keep);
			strcpy(top + keep, *p || cut ? more : "");
		}
	} else if (*why) {
		char note[4500];
		snprintf(note, sizeof note, "Not available: %s", why);
		write_pre(f, "profile", "Profile (top rows of profile.txt)", NULL, note);
		return;
	}
	write_pre(f, "profile", "Profile (top rows of profile.txt)", top,
		  "Not profiled (kiln train --profile writes profile.txt).");
	free(text);
	free(top);
}

/* The config.ini section, and the model summary and memory report of
 * that config when it could be read. */
static __attribute__((noinline)) void write_config(FILE *f, const char *path,
						   struct report_src *r)
{
	char why[4400], note[4500];
	int cut;
	char *config = slurp(path, CONFIG_MAX, &cut, why, sizeof why);
	if (config && cut) {
		snprintf(why, sizeof why, "%s: larger than %zu MiB, the most a config may be", path,
			 CONFIG_MAX >> 20);
		free(config);
		config = NULL;
	}
	snprintf(note, sizeof note, *why ? "Not available: %s" : "No config.ini in the run directory.", why);
	write_pre(f, "config", "Config (config.ini, resolved)", config, note);
	if (config)
		write_model(f, path, r);
	else if (*why)
		write_pre(f, "summary", "Model summary", NULL, note);
	else
		write_pre(f, "summary", "Model summary", NULL, "No config.ini: no summary or memory report.");
	free(config);
}

/* The errno of a write into f that failed, taken before a later call
 * (opening a run file that is not there) sets another: 0 while none has. */
static int write_failed(FILE *f)
{
	return ferror(f) ? errno ? errno : EIO : 0;
}

static int fill_report(FILE *f, void *ctx)
{
	struct report_src *r = ctx;
	char path[4096];
	int err;
	write_head(f, r->dir);
	write_result(f, r->m);
	write_curves(f, r->m);
	if ((err = write_failed(f)))
		return err;
	snprintf(path, sizeof path, "%s/config.ini", r->dir);
	write_config(f, path, r);
	if (*r->refused)
		return ECANCELED;
	if ((err = write_failed(f)))
		return err;
	snprintf(path, sizeof path, "%s/profile.txt", r->dir);
	write_profile(f, path);
	if ((err = write_failed(f)))
		return err;
	errno = 0;
	fputs("</body></html>\n", f);
	if ((err = write_failed(f)) || (fflush(f) && (err = errno ? errno : EIO)))
		return err;
	return 0;
}

/* The report written whole or not at all (kiln_file_write: before session
 * 32 it was opened in place, so a failed write, a full disk or a file size
 * limit, removed the earlier report). */
static int write_report(const char *dir, const char *out, const struct report_metrics *m)
{
	struct report_src r = { .dir = dir, .out = out, .m = m };
	kiln_output_watch(out); /* a data source the summary opens: not the output */
	int err = kiln_file_write(out, fill_report, &r);
	kiln_output_watch(NULL);
	if (err == ECANCELED && *r.refused) {
		fprintf(stderr, "kiln: error: %s\n", r.refused);
		return 2;
	}
	if (err) {
		fprintf(stderr, "kiln: error: %s: cannot write the report: %s\n", out, strerror(err));
		return 1;
	}
	return 0;
}

/* Whether the report may be written to out: not over a file it reads
 * (metrics.jsonl, config.ini, profile.txt), nor over another file the run
 * wrote into dir (kiln_output_check's refusal of a checkpoint included):
 * before session 36 `kiln report RUN -o RUN/checkpoints/ckpt-N.kiln`
 * replaced the checkpoint with HTML and exited 0.  0, or 2 with the error
 * printed. */
static int report_output_check(const char *dir, const char *out)
{
	static const char *const read[] = { "metrics.jsonl", "config.ini", "profile.txt" };
	static const char *const written[] = { "train.csv", "eval.csv", "trace.json", "events.out.tfevents.*" };
	/* the three paths on the heap: 12 KiB on cmd_report's stack (the
	 * frame cap, docs/design-notes.md) */
	char (*in)[4096] = malloc(3 * sizeof *in);
	struct stat o, sb;
	if (!in) {
		fprintf(stderr, "kiln: error: out of memory\n");
		return 1;
	}
	for (int i = 0; i < 3; i++)
		snprintf(in[i], sizeof in[i], "%s/%s", dir, read[i]);
	kiln_status st = kiln_output_check(out, (const char *[]){ in[0], in[1], in[2] }, 3);
	free(in);
	if (st)
		return cli_fail(st);
	if (stat(out, &o))
		return 0; /* nothing there yet: nothing to lose */
	DIR *d = opendir(dir);
	int rc = 0;
	for (struct dirent *e; !rc && d && (e = readdir(d));)
		for (size_t i = 0; !rc && i < sizeof written / sizeof *written; i++)
			if (!fnmatch(written[i], e->d_name, FNM_PERIOD) &&
			    !fstatat(dirfd(d), e->d_name, &sb, 0) && sb.st_dev == o.st_dev && sb.st_ino == o.st_ino) {
				fprintf(stderr, "kiln: error: the output %s is the file %s/%s, which the run in %s wrote: choose another file\n",
					out, dir, e->d_name, dir);
				rc = 2;
			}
	if (d)
		closedir(d);
	return rc;
}

int cmd_report(int argc, char **argv)
{
	const char *dir = NULL, *out = NULL;
	char path[4096], def[4096];
	for (int i = 1; i < argc; i++) {
		const int r = cli_opt(argc, argv, &i, "-o", &out);
		if (r < 0)
			return 2;
		if (r)
			continue;
		if (argv[i][0] != '-' && !dir)
			dir = argv[i];
		else {
			cli_bad_arg_usage(argc, argv, i, cmd_report_usage);
			fputs(cmd_report_usage, stderr);
			return 2;
		}
	}
	if (!dir) {
		fputs(cmd_report_usage, stderr);
		return 2;
	}
	struct report_metrics m;
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	if (report_metrics_read(path, &m)) {
		const int e = errno;
		fprintf(stderr, "kiln: error: %s: %s (is %s a run's out_dir?)\n", path, m.why, dir);
		return e == ENOMEM ? 1 : 2;
	}
	if (!out) {
		snprintf(def, sizeof def, "%s/report.html", dir);
		out = def;
	}
	int rc = report_output_check(dir, out);
	if (!rc)
		rc = write_report(dir, out, &m);
	report_metrics_free(&m);
	if (!rc)
		printf("report: %s\n", out);
	return rc;
}
