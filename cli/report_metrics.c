/* cli/report_metrics.c - `kiln report`: a run's metrics.jsonl read into
 * series (cli/report.h).  Fields the trainer of the day does not write are
 * simply absent: the report leaves their plots out. */
#include "build-config.h"
#include "report.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* close */

void report_metrics_free(struct report_metrics *m)
{
	for (int i = 0; i < m->n; i++) {
		free(m->s[i].name);
		free(m->s[i].x);
		free(m->s[i].y);
	}
	free(m->s);
	free(m->slot);
	free(m->line_step);
	memset(m, 0, sizeof *m);
}

/* FNV-1a of a series name. */
static unsigned name_hash(const char *name)
{
	unsigned h = 2166136261u;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 16777619u;
	return h;
}

/* The table slot holding `name`, or the empty one where it would go (a
 * metrics.jsonl of 100,000 distinct fields took 24 s in `kiln report`
 * looked up one by one: session 17). */
static int slot_of(const struct report_metrics *m, const char *name)
{
	const unsigned mask = (unsigned)m->n_slot - 1;
	unsigned i = name_hash(name) & mask;
	while (m->slot[i] && strcmp(m->s[m->slot[i] - 1].name, name))
		i = (i + 1) & mask;
	return (int)i;
}

const struct report_series *report_series_find(const struct report_metrics *m, const char *name)
{
	if (!m->n_slot)
		return NULL;
	const int i = m->slot[slot_of(m, name)];
	return i ? &m->s[i - 1] : NULL;
}

/* The table for cap series: -1 when out of memory (m unchanged). */
static int slots_grow(struct report_metrics *m, int cap)
{
	int n = 64;
	while (n <= 2 * cap)
		n *= 2;
	int *t = calloc((size_t)n, sizeof *t), *old = m->slot;
	if (!t)
		return -1;
	m->slot = t, m->n_slot = n;
	for (int k = 0; k < m->n; k++)
		m->slot[slot_of(m, m->s[k].name)] = k + 1;
	free(old);
	return 0;
}

/* The series `name`, made when new; NULL when out of memory. */
static struct report_series *series_get(struct report_metrics *m, const char *name)
{
	struct report_series *s = (struct report_series *)report_series_find(m, name);
	if (s)
		return s;
	if (m->n == m->cap) {
		int cap = m->cap ? 2 * m->cap : 16;
		void *p = realloc(m->s, (size_t)cap * sizeof *m->s);
		if (!p)
			return NULL;
		m->s = p, m->cap = cap;
	}
	if (m->n_slot <= 2 * (m->n + 1) && slots_grow(m, m->cap))
		return NULL;
	char *copy = strdup(name);
	if (!copy)
		return NULL;
	s = &m->s[m->n++];
	memset(s, 0, sizeof *s);
	s->name = copy;
	m->slot[slot_of(m, s->name)] = m->n;
	return s;
}

static int series_add(struct report_series *s, double x, double y)
{
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 8;
		double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
		if (!nx)
			return -1;
		s->x = nx;
		double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
		if (!ny)
			return -1;
		s->y = ny, s->cap = cap;
	}
	s->x[s->n] = x, s->y[s->n] = y, s->n++;
	return 0;
}

/* At a resume of step `step`: every series' points past it dropped (the
 * interrupted run's after its checkpoint; the resumed run logs them
 * again).  Points keep their order. */
static void resume_at(struct report_metrics *m, double step)
{
	m->resumes++;
	m->resume_step = step;
	/* a "final" line before it was a run continued since (--resume with
	 * more epochs): its result is the resumed run's final line, if any */
	m->have_final = 0;
	for (int i = 0; i < m->n; i++) {
		struct report_series *s = &m->s[i];
		int k = 0;
		for (int j = 0; j < s->n; j++)
			if (s->x[j] <= step)
				s->x[k] = s->x[j], s->y[k] = s->y[j], k++;
		s->n = k;
	}
	long k = 0;
	for (long j = 0; j < m->n_line; j++)
		if (m->line_step[j] <= step)
			m->line_step[k++] = m->line_step[j];
	m->abandoned += m->n_line - k;
	m->n_line = k;
}

/* A train or eval line of step `step` kept (for resume_at's count): -1
 * when out of memory. */
static int line_kept(struct report_metrics *m, double step)
{
	if (m->n_line == m->cap_line) {
		const long cap = m->cap_line ? 2 * m->cap_line : 64;
		double *p = realloc(m->line_step, (size_t)cap * sizeof *p);
		if (!p)
			return -1;
		m->line_step = p, m->cap_line = cap;
	}
	m->line_step[m->n_line++] = step;
	return 0;
}

/* One train or eval line: its numeric fields under "PREFIX.FIELD" (the
 * name in a buffer grown to the longest: -1 when out of memory). */
static int add_line(struct report_metrics *m, const char *prefix, json_t *o)
{
	json_t *step = json_object_get(o, "step");
	if (!json_is_number(step))
		return 0;
	if (line_kept(m, json_number_value(step)))
		return -1;
	const char *key;
	json_t *v;
	char *name = NULL;
	size_t cap = 0;
	int rc = 0, replaced = 0;
	json_object_foreach(o, key, v) {
		if (!json_is_number(v) || !strcmp(key, "step") || !strcmp(key, "epoch"))
			continue;
		const size_t need = strlen(prefix) + strlen(key) + 2;
		if (need > cap) {
			char *p = realloc(name, need);
			if (!p) {
				rc = -1;
				break;
			}
			name = p, cap = need;
		}
		snprintf(name, cap, "%s.%s", prefix, key);
		struct report_series *s = series_get(m, name);
		const double x = json_number_value(step);
		if (s && m->resumes && x == m->resume_step && s->n && s->x[s->n - 1] == x) {
			s->y[s->n - 1] = json_number_value(v); /* logged again: the later */
			replaced = 1;
		} else if (!s || series_add(s, x, json_number_value(v))) {
			rc = -1;
			break;
		}
	}
	m->abandoned += replaced;
	free(name);
	return rc;
}

/* o's number key: NAN when it has none (missing, or null: .null set). */
static struct report_number num(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return (struct report_number){ json_is_number(v) ? json_number_value(v) : NAN,
				       json_is_null(v) };
}

static void read_final(struct report_metrics *m, json_t *o)
{
	m->have_final = 1;
	m->final_epochs = num(o, "epochs");
	m->final_steps = num(o, "steps");
	m->final_train_loss = num(o, "train_loss");
	m->final_test_loss = num(o, "test_loss");
	m->final_test_acc = num(o, "test_acc");
	m->final_wall_s = num(o, "wall_s");
	m->final_samples_per_s = num(o, "train_samples_per_s");
	m->final_run_samples_per_s = num(o, "samples_per_s");
}

/* The next line of f into buf (n bytes): 1, or 0 at the end of the file.
 * A line that does not fit (n - 1 bytes and more) is read to its end and
 * dropped, *too_long set: memory stays n bytes whatever the file. */
static int next_line(FILE *f, char *buf, size_t n, int *too_long)
{
	*too_long = 0;
	if (!fgets(buf, (int)n, f))
		return 0;
	for (;;) {
		const size_t l = strlen(buf);
		if (l < n - 1 || buf[l - 1] == '\n')
			return 1;
		const int c = getc(f); /* full: the line ends here, or goes on */
		if (c == EOF)
			return 1;
		ungetc(c, f);
		*too_long = 1;
		if (!fgets(buf, (int)n, f))
			return 1;
	}
}

int report_metrics_read(const char *path, struct report_metrics *m)
{
	memset(m, 0, sizeof *m);
	const char *why = NULL;
	int fd = common_open_file(path, m->why, sizeof m->why, &why, NULL);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
	if (!f) {
		const int e = errno;
		if (fd >= 0)
			close(fd), why = strerror(e);
		if (why != m->why)
			snprintf(m->why, sizeof m->why, "%s", why);
		errno = e;
		return -1;
	}
	char *line = malloc(REPORT_LINE_MAX + 1);
	int rc = line ? 0 : -1, too_long;
	while (!rc && next_line(f, line, REPORT_LINE_MAX + 1, &too_long)) {
		m->lines++;
		if (too_long) {
			m->bad_lines++, m->long_lines++;
			continue;
		}
		json_t *o = json_loads(line, 0, NULL);
		const char *ev = json_string_value(json_object_get(o, "event"));
		if (!json_is_object(o) || !ev)
			m->bad_lines++;
		else if (!strcmp(ev, "train"))
			rc = add_line(m, "train", o);
		else if (!strcmp(ev, "eval") && json_is_string(json_object_get(o, "set")))
			rc = add_line(m, json_string_value(json_object_get(o, "set")), o);
		else if (!strcmp(ev, "final"))
			read_final(m, o);
		else if (!strcmp(ev, "resume") && json_is_number(json_object_get(o, "step")))
			resume_at(m, json_number_value(json_object_get(o, "step")));
		json_decref(o);
	}
	free(line);
	fclose(f);
	if (rc) {
		snprintf(m->why, sizeof m->why, "%s", strerror(ENOMEM));
		errno = ENOMEM;
	}
	return rc;
}
