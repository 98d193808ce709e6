/* core/profile.c - the profiler: spans recorded by the device wrapper,
 * the graph and the trainer, reduced to a table of self time per (layer,
 * op, pass) and written as a Chrome trace.  profile.h says what is timed
 * and how; docs/profiler.md says how to read the output. */
#include "profile.h"
#include "../plugins/common/c_locale.h" /* common_vsnprintf_c, common_snprintf_c */

#include <ctype.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h> /* stat: kiln_profile_check_out */
#include <time.h>

/* The durations of a row's calls (or of the steps), for the table's
 * median and min: every one up to PROF_SAMPLE_CAP, then a uniform
 * reservoir sample of PROF_SAMPLE_CAP (Vitter's algorithm R, with the
 * profile's own deterministic generator).  min is over every call. */
#define PROF_SAMPLE_CAP 1024
struct prof_sample {
	int64_t *ns;          /* n kept durations (cap allocated) */
	size_t n, cap;
	int64_t seen;         /* durations offered */
	int64_t min;
};

/* One table row: every span with the same (label, what, pass). */
struct prof_row {
	char *label;          /* "conv1", "optimizer", "data wait" (owned) */
	const char *what;     /* "conv_bwd_data", "copy_h2d", "loader" (static) */
	int pass;             /* enum kiln_phase or KILN_PROF_* */
	int64_t calls, ns;    /* over the counted steps (2..) */
	struct prof_sample sample; /* their durations */
};

/* One trace slice.  kind: a row's index (>= 0), or one of EV_*. */
enum { EV_STEP = -1, EV_PHASE = -2, EV_LAYER = -3 };
struct prof_event {
	int32_t kind;
	int32_t track;
	int32_t step;
	int32_t pass;         /* EV_PHASE: the phase; EV_LAYER: the pass */
	const char *name;     /* EV_LAYER: interned layer name */
	int64_t t0, t1;       /* ns since the profile was opened */
};

struct prof_stream {
	const void *stream;
	char name[48];
};

#define PROF_STREAMS 16

struct kiln_profile {
	pthread_mutex_t lock;
	int rank;                  /* > 0: the files' names say it */
	int64_t origin;            /* t = 0 of the trace */
	int64_t trace_steps;       /* [run] profile_steps */
	int recording;             /* inside a step */
	int64_t step;              /* current (or last) step, from 1 */
	int64_t step0;             /* the run's step before the first (kiln_profile_first_step) */
	int64_t step_t0;
	int64_t counted_ns, counted_steps; /* steps 2.. */
	struct prof_sample steps;  /* their durations */
	uint64_t rng;              /* the samples' reservoir draws */
	int phase;                 /* current phase, KILN_PROF_NONE outside */
	int64_t phase_t0;
	/* plan -> op type (linear: a model has tens to hundreds of plans,
	 * and a lookup is cheap next to the stream sync it follows) */
	struct { const void *plan; int type; } *plans;
	size_t n_plans, cap_plans;
	struct prof_row *rows;
	size_t n_rows, cap_rows;
	struct prof_event *ev;
	size_t n_ev, cap_ev;
	char **names;              /* interned layer names for EV_LAYER */
	size_t n_names, cap_names;
	struct prof_stream streams[PROF_STREAMS];
	int n_streams;
	int64_t dropped;           /* spans lost to a failed allocation */
	int n_stages;              /* pipeline stage tracks used (kiln_profile_stage) */
	char *notes[8];            /* kiln_profile_note's lines (copies, whole),
				    * after the table */
	int n_notes;
};

static _Thread_local struct {
	const char *name;
	int pass;
} cur_label;

static const char *const pass_names[KILN_PROF_PASSES] = {
	[KILN_PHASE_DATA] = "data",         [KILN_PHASE_FORWARD] = "forward",
	[KILN_PHASE_BACKWARD] = "backward", [KILN_PHASE_OPTIMIZER] = "optimizer",
	[KILN_PHASE_EVAL] = "eval",         [KILN_PROF_LOG] = "log",
	[KILN_PROF_NONE] = "-",            [KILN_PROF_RECOMPUTE] = "recompute",
};

static const char *pass_name(int pass)
{
	return pass >= 0 && pass < KILN_PROF_PASSES ? pass_names[pass] : "-";
}

/* The report's name of an op: the core's (kiln_op_name), lower case
 * ("conv_bwd_data"); stable pointers (rows compare them). */
static char lower_names[KILN_OP_TYPE_COUNT][32];
static pthread_once_t lower_once = PTHREAD_ONCE_INIT;

static void lower_init(void)
{
	for (int t = 0; t < KILN_OP_TYPE_COUNT; t++) {
		const char *s = kiln_op_name(t);
		size_t i = 0;
		for (; s[i] && i + 1 < sizeof lower_names[t]; i++)
			lower_names[t][i] = (char)tolower((unsigned char)s[i]);
		lower_names[t][i] = 0;
	}
}

static const char *op_name(int type)
{
	if (type <= 0 || type >= KILN_OP_TYPE_COUNT)
		return "op?"; /* prepared before the profiler was attached */
	pthread_once(&lower_once, lower_init);
	return lower_names[type];
}

/* Grow *arr (of *cap elements of `size` bytes) to hold n + 1. */
static int grow(void *arr, size_t *cap, size_t n, size_t size)
{
	void **a = arr;
	if (n < *cap)
		return 0;
	size_t nc = *cap ? 2 * *cap : 64;
	void *na = realloc(*a, nc * size);
	if (!na)
		return -1;
	*a = na;
	*cap = nc;
	return 0;
}

/* splitmix64: the reservoir's draws, the same in every run */
static uint64_t next_draw(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* Offer one duration to s (caller holds the lock).  Out of memory, the
 * sample is a reservoir of the durations it holds already. */
static void sample_add(struct prof_sample *s, uint64_t *rng, int64_t ns)
{
	if (!s->seen++ || ns < s->min)
		s->min = ns;
	if (s->n < PROF_SAMPLE_CAP && !grow(&s->ns, &s->cap, s->n, sizeof *s->ns)) {
		s->ns[s->n++] = ns;
		return;
	}
	if (!s->n)
		return;
	const uint64_t j = next_draw(rng) % (uint64_t)s->seen;
	if (j < s->n)
		s->ns[j] = ns;
}

static int by_ns(const void *a, const void *b)
{
	const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* The median of s's kept durations, ns (the mean of the middle two for
 * an even count); sorts them.  0 when empty. */
static double sample_median(struct prof_sample *s)
{
	if (!s->n)
		return 0;
	qsort(s->ns, s->n, sizeof *s->ns, by_ns);
	const size_t h = s->n / 2;
	return s->n % 2 ? (double)s->ns[h] : 0.5 * ((double)s->ns[h - 1] + (double)s->ns[h]);
}

kiln_status kiln_profile_open(const struct kiln_config *cfg, struct kiln_profile **out)
{
	int on = 0;
	int64_t steps = 20;
	*out = NULL;
	kiln_config_get_bool(cfg, "run", "profile", &on);
	kiln_config_get_int(cfg, "run", "profile_steps", &steps);
	if (!on)
		return KILN_OK;
	struct kiln_profile *p = calloc(1, sizeof *p);
	if (!p)
		return kiln_error(KILN_ENOMEM, "out of memory");
	pthread_mutex_init(&p->lock, NULL);
	p->origin = kiln_now_ns();
	p->trace_steps = steps;
	p->phase = KILN_PROF_NONE;
	p->rng = 0x9e3779b97f4a7c15u;
	*out = p;
	return KILN_OK;
}

void kiln_profile_free(struct kiln_profile *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_rows; i++) {
		free(p->rows[i].label);
		free(p->rows[i].sample.ns);
	}
	free(p->steps.ns);
	for (size_t i = 0; i < p->n_names; i++)
		free(p->names[i]);
	for (int i = 0; i < p->n_notes; i++)
		free(p->notes[i]);
	free(p->rows);
	free(p->names);
	free(p->ev);
	free(p->plans);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

void kiln_profile_label(const char *name, int pass)
{
	cur_label.name = name;
	cur_label.pass = pass;
}

int kiln_profile_recording(const struct kiln_profile *p)
{
	return __atomic_load_n(&p->recording, __ATOMIC_RELAXED);
}

/* ---- plans ------------------------------------------------------------- */

void kiln_profile_plan(struct kiln_profile *p, const void *plan, int op_type)
{
	pthread_mutex_lock(&p->lock);
	if (!grow(&p->plans, &p->cap_plans, p->n_plans, sizeof *p->plans)) {
		p->plans[p->n_plans].plan = plan;
		p->plans[p->n_plans].type = op_type;
		p->n_plans++;
	}
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_plan_forget(struct kiln_profile *p, const void *plan)
{
	pthread_mutex_lock(&p->lock);
	/* newest first: a freed plan's address may have been reused */
	for (size_t i = p->n_plans; i-- > 0;)
		if (p->plans[i].plan == plan) {
			p->plans[i] = p->plans[--p->n_plans];
			break;
		}
	pthread_mutex_unlock(&p->lock);
}

/* caller holds the lock */
static int plan_type(const struct kiln_profile *p, const void *plan)
{
	for (size_t i = p->n_plans; i-- > 0;)
		if (p->plans[i].plan == plan)
			return p->plans[i].type;
	return 0;
}

/* ---- recording (caller holds the lock) --------------------------------- */

static void add_event(struct kiln_profile *p, int kind, int track, int pass, const char *name,
		      int64_t t0, int64_t t1)
{
	if (p->step > p->trace_steps)
		return;
	if (grow(&p->ev, &p->cap_ev, p->n_ev, sizeof *p->ev)) {
		p->dropped++;
		return;
	}
	struct prof_event *e = &p->ev[p->n_ev++];
	e->kind = kind;
	e->track = track;
	e->step = (int32_t)p->step;
	e->pass = pass;
	e->name = name;
	e->t0 = t0 - p->origin;
	e->t1 = t1 - p->origin;
}

static int find_row(struct kiln_profile *p, const char *label, const char *what, int pass)
{
	for (size_t i = 0; i < p->n_rows; i++) {
		struct prof_row *r = &p->rows[i];
		if (r->pass == pass && r->what == what && !strcmp(r->label, label))
			return (int)i;
	}
	char *l = kiln_strdup(label);
	if (!l || grow(&p->rows, &p->cap_rows, p->n_rows, sizeof *p->rows)) {
		free(l);
		return -1;
	}
	struct prof_row *r = &p->rows[p->n_rows];
	memset(r, 0, sizeof *r);
	r->label = l;
	r->what = what;
	r->pass = pass;
	return (int)p->n_rows++;
}

static void record(struct kiln_profile *p, const char *label, const char *what, int pass,
		   int track, int64_t t0, int64_t t1)
{
	if (!p->recording)
		return;
	int r = find_row(p, label, what, pass);
	if (r < 0) {
		p->dropped++;
		return;
	}
	if (p->step >= 2) {
		p->rows[r].calls++;
		p->rows[r].ns += t1 - t0;
		sample_add(&p->rows[r].sample, &p->rng, t1 - t0);
	}
	add_event(p, r, track, pass, NULL, t0, t1);
}

/* caller holds the lock */
static int stream_track(struct kiln_profile *p, const void *stream)
{
	for (int i = 0; i < p->n_streams; i++)
		if (p->streams[i].stream == stream)
			return KILN_PROF_TRACK_STREAM + i;
	if (p->n_streams == PROF_STREAMS)
		return KILN_PROF_TRACK_STREAM + PROF_STREAMS; /* "other streams" */
	struct prof_stream *s = &p->streams[p->n_streams];
	s->stream = stream;
	snprintf(s->name, sizeof s->name, "stream %d", p->n_streams + 1);
	return KILN_PROF_TRACK_STREAM + p->n_streams++;
}

void kiln_profile_stream_name(struct kiln_profile *p, const void *stream, const char *name)
{
	pthread_mutex_lock(&p->lock);
	int t = stream_track(p, stream) - KILN_PROF_TRACK_STREAM;
	if (t < PROF_STREAMS)
		snprintf(p->streams[t].name, sizeof p->streams[t].name, "%s", name);
	pthread_mutex_unlock(&p->lock);
}

/* the current label, or the current phase for unlabelled work */
static void current(struct kiln_profile *p, const char *dflt, const char **label, int *pass)
{
	*label = cur_label.name ? cur_label.name : dflt;
	*pass = cur_label.name ? cur_label.pass : p->phase;
}

void kiln_profile_op(struct kiln_profile *p, const void *plan, const void *stream, int64_t t0,
		     int64_t t1)
{
	const char *label;
	int pass;
	pthread_mutex_lock(&p->lock);
	current(p, "(unlabelled)", &label, &pass);
	record(p, label, op_name(plan_type(p, plan)), pass, stream_track(p, stream), t0, t1);
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_copy(struct kiln_profile *p, int kind, const void *stream, int64_t t0,
		       int64_t t1)
{
	static const char *const kinds[] = { "copy_h2d", "copy_d2h", "copy_d2d" };
	const char *label;
	int pass;
	pthread_mutex_lock(&p->lock);
	current(p, "copy", &label, &pass);
	record(p, label, kind >= 0 && kind <= 2 ? kinds[kind] : "copy", pass,
	       stream_track(p, stream), t0, t1);
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_span(struct kiln_profile *p, const char *label, const char *what, int pass,
		       int track, int64_t t0, int64_t t1)
{
	pthread_mutex_lock(&p->lock);
	record(p, label, what, pass, track, t0, t1);
	pthread_mutex_unlock(&p->lock);
}

/* A named slice on `track` (the trace only; caller holds the lock). */
static void named_event(struct kiln_profile *p, int track, const char *layer, int pass,
			int64_t t0, int64_t t1)
{
	/* a stage's slices arrive from its stream, maybe after the step */
	const int on = p->recording || track >= KILN_PROF_TRACK_STAGE;
	if (on && p->step >= 1 && p->step <= p->trace_steps) {
		const char *name = NULL;
		for (size_t i = 0; i < p->n_names && !name; i++)
			if (!strcmp(p->names[i], layer))
				name = p->names[i];
		if (!name && !grow(&p->names, &p->cap_names, p->n_names, sizeof *p->names) &&
		    (p->names[p->n_names] = kiln_strdup(layer)))
			name = p->names[p->n_names++];
		if (name)
			add_event(p, EV_LAYER, track, pass, name, t0, t1);
		else
			p->dropped++;
	}
}

void kiln_profile_layer(struct kiln_profile *p, const char *layer, int pass, int64_t t0,
			int64_t t1)
{
	pthread_mutex_lock(&p->lock);
	named_event(p, KILN_PROF_TRACK_LAYER, layer, pass, t0, t1);
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_stage(struct kiln_profile *p, int stage, const char *what, int pass,
			int64_t t0, int64_t t1)
{
	if (stage < 0 || stage >= KILN_PROF_MAX_STAGES)
		return;
	pthread_mutex_lock(&p->lock);
	if (stage >= p->n_stages)
		p->n_stages = stage + 1;
	named_event(p, KILN_PROF_TRACK_STAGE + stage, what, pass, t0, t1);
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_note(struct kiln_profile *p, const char *line)
{
	pthread_mutex_lock(&p->lock);
	/* a copy of the whole line (the pipeline's gaps line outgrew a
	 * fixed 256), or none when out of memory (it was logged) */
	if (p->n_notes < (int)KILN_ARRAY_LEN(p->notes) && (p->notes[p->n_notes] = kiln_strdup(line)))
		p->n_notes++;
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_first_step(struct kiln_profile *p, int64_t step0)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->step0 = step0;
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_step(struct kiln_profile *p, int begin)
{
	int64_t t = kiln_now_ns();
	pthread_mutex_lock(&p->lock);
	if (begin) {
		p->step++;
		p->step_t0 = t;
		__atomic_store_n(&p->recording, 1, __ATOMIC_RELAXED);
	} else if (p->recording) {
		if (p->step >= 2) {
			p->counted_ns += t - p->step_t0;
			p->counted_steps++;
			sample_add(&p->steps, &p->rng, t - p->step_t0);
		}
		add_event(p, EV_STEP, KILN_PROF_TRACK_STEP, KILN_PROF_NONE, NULL, p->step_t0, t);
		__atomic_store_n(&p->recording, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&p->lock);
}

void kiln_profile_phase(struct kiln_profile *p, int phase, int begin)
{
	int64_t t = kiln_now_ns();
	pthread_mutex_lock(&p->lock);
	if (begin) {
		p->phase = phase;
		p->phase_t0 = t;
	} else {
		if (p->recording && p->phase == phase)
			add_event(p, EV_PHASE, KILN_PROF_TRACK_PHASE, phase, NULL, p->phase_t0, t);
		p->phase = KILN_PROF_NONE;
	}
	pthread_mutex_unlock(&p->lock);
}

/* ---- the table --------------------------------------------------------- */

static int by_time_desc(const void *a, const void *b)
{
	const struct prof_row *x = *(const struct prof_row *const *)a;
	const struct prof_row *y = *(const struct prof_row *const *)b;
	if (x->ns != y->ns)
		return x->ns < y->ns ? 1 : -1;
	return strcmp(x->label, y->label);
}

/* One line of the table, whole however long (a layer's name has no
 * bound): logged, and written to f when there is one.  A line longer
 * than the stack buffer is formatted again into one of its size; out of
 * memory, the cut line is written. */
static void out_line(FILE *f, const char *fmt, ...) KILN_PRINTF(2, 3);
static void out_line(FILE *f, const char *fmt, ...)
{
	char small[512], *buf = small;
	va_list ap, again;
	va_start(ap, fmt);
	va_copy(again, ap);
	const int n = common_vsnprintf_c(small, sizeof small, fmt, ap); /* a file's table: '.' */
	va_end(ap);
	if (n >= (int)sizeof small && (buf = malloc((size_t)n + 1)))
		common_vsnprintf_c(buf, (size_t)n + 1, fmt, again);
	else
		buf = small;
	va_end(again);
	if (f)
		fprintf(f, "%s\n", buf);
	else
		kiln_log(KILN_LOG_INFO, "profile", "%s", buf);
	if (buf != small)
		free(buf);
}

static void write_table(struct kiln_profile *p, FILE *f)
{
	struct prof_row **rows = malloc(sizeof *rows * (p->n_rows ? p->n_rows : 1));
	size_t n = 0;
	int wl = 5, ww = 2;
	int64_t sum = 0, by_pass[KILN_PROF_PASSES] = { 0 };
	double total = (double)p->counted_ns;
	if (!rows)
		return;
	for (size_t i = 0; i < p->n_rows; i++)
		if (p->rows[i].calls) {
			struct prof_row *r = rows[n++] = &p->rows[i];
			int l = (int)strlen(r->label), w = (int)strlen(r->what);
			wl = l > wl ? l : wl;
			ww = w > ww ? w : ww;
			sum += r->ns;
			if (r->pass >= 0 && r->pass < KILN_PROF_PASSES)
				by_pass[r->pass] += r->ns;
		}
	qsort(rows, n, sizeof *rows, by_time_desc);
	if (!p->counted_steps) {
		out_line(f, "no step after the first (warm-up) ran: nothing to count");
		free(rows);
		return;
	}
	out_line(f, "%lld step(s) after the first (warm-up): %.3f ms, %.3f ms per step",
		 (long long)p->counted_steps, total / 1e6, total / 1e6 / (double)p->counted_steps);
	out_line(f, "self time per (layer, op, pass); the device was serialised (every op synchronised), so overlap is lost");
	/* median and min after the older columns, which parsers read by position */
	out_line(f, "%-*s  %-*s  %-9s %7s %11s %10s %7s %10s %10s", wl, "layer", ww, "op", "pass",
		 "calls", "total ms", "mean us", "% step", "median us", "min us");
	char rule[256];
	int rl = wl + ww + 75 < (int)sizeof rule ? wl + ww + 75 : (int)sizeof rule - 1;
	memset(rule, '-', (size_t)rl);
	rule[rl] = 0;
	out_line(f, "%s", rule);
	for (size_t i = 0; i < n; i++) {
		struct prof_row *r = rows[i];
		out_line(f, "%-*s  %-*s  %-9s %7lld %11.3f %10.1f %7.2f %10.1f %10.1f", wl, r->label,
			 ww, r->what, pass_name(r->pass), (long long)r->calls, (double)r->ns / 1e6,
			 (double)r->ns / 1e3 / (double)r->calls, 100.0 * (double)r->ns / total,
			 sample_median(&r->sample) / 1e3, (double)r->sample.min / 1e3);
	}
	/* step time no span covers: enqueueing, the loop, progress output,
	 * the profiler itself */
	int64_t rest = p->counted_ns - sum;
	out_line(f, "%-*s  %-*s  %-9s %7s %11.3f %10s %7.2f %10s %10s", wl, "(host)", ww,
		 "untracked", "-", "-", (double)rest / 1e6, "-", 100.0 * (double)rest / total, "-",
		 "-");
	out_line(f, "%s", rule);
	out_line(f, "%-*s  %-*s  %-9s %7lld %11.3f %10.1f %7.2f %10.1f %10.1f", wl, "total", ww, "",
		 "", (long long)p->counted_steps, total / 1e6,
		 total / 1e3 / (double)p->counted_steps, 100.0, sample_median(&p->steps) / 1e3,
		 (double)p->steps.min / 1e3);
	char line[512];
	int k = snprintf(line, sizeof line, "by pass:");
	for (int pass = 0; pass < KILN_PROF_PASSES; pass++)
		if (by_pass[pass] && k < (int)sizeof line)
			k += common_snprintf_c(line + k, sizeof line - (size_t)k, " %s %.1f%%,", pass_name(pass),
				      100.0 * (double)by_pass[pass] / total);
	if (k < (int)sizeof line)
		common_snprintf_c(line + k, sizeof line - (size_t)k, " untracked %.1f%%",
			 100.0 * (double)rest / total);
	out_line(f, "%s", line);
	if (p->dropped)
		out_line(f, "(%lld span(s) lost: out of memory)", (long long)p->dropped);
	for (int i = 0; i < p->n_notes; i++) { /* whole, as kiln_profile_note kept them */
		kiln_log(KILN_LOG_INFO, "profile", "%s", p->notes[i]);
		if (f)
			fprintf(f, "%s\n", p->notes[i]);
	}
	free(rows);
}

/* ---- the trace --------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* ns as microseconds with three exact decimals */
static void json_us(FILE *f, int64_t ns)
{
	fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

static void track_meta(FILE *f, int tid, const char *name)
{
	fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":",
		tid);
	json_str(f, name);
	fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
		   "\"args\":{\"sort_index\":%d}}", tid, tid);
}

static void write_trace(const struct kiln_profile *p, FILE *f)
{
	fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"kiln %s\","
		   "\"note\":\"profile mode: the device is serialised (every op synchronised); "
		   "slices are self times\"},\n\"traceEvents\":[\n", kiln_version());
	fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
		   "\"args\":{\"name\":\"kiln train\"}}");
	track_meta(f, KILN_PROF_TRACK_STEP, "steps");
	track_meta(f, KILN_PROF_TRACK_PHASE, "phases (host)");
	track_meta(f, KILN_PROF_TRACK_LAYER, "layers (host)");
	track_meta(f, KILN_PROF_TRACK_WAIT, "data wait (host)");
	for (int s = 0; s < p->n_stages; s++) {
		char name[32];
		snprintf(name, sizeof name, "pipeline stage %d", s);
		track_meta(f, KILN_PROF_TRACK_STAGE + s, name);
	}
	for (int i = 0; i < p->n_streams; i++)
		track_meta(f, KILN_PROF_TRACK_STREAM + i, p->streams[i].name);
	if (p->n_streams == PROF_STREAMS)
		track_meta(f, KILN_PROF_TRACK_STREAM + PROF_STREAMS, "other streams");
	for (size_t i = 0; i < p->n_ev; i++) {
		const struct prof_event *e = &p->ev[i];
		char name[320];
		const char *cat = "op";
		fputs(",\n{\"name\":", f);
		switch (e->kind) {
		case EV_STEP:
			snprintf(name, sizeof name, "step %lld", (long long)(p->step0 + e->step));
			cat = "step";
			break;
		case EV_PHASE:
			snprintf(name, sizeof name, "%s", pass_name(e->pass));
			cat = "phase";
			break;
		case EV_LAYER:
			snprintf(name, sizeof name, "%s", e->name);
			cat = pass_name(e->pass);
			break;
		default: {
			const struct prof_row *r = &p->rows[e->kind];
			snprintf(name, sizeof name, "%s %s", r->label, r->what);
			cat = pass_name(r->pass);
		}
		}
		json_str(f, name);
		fputs(",\"cat\":", f);
		json_str(f, cat);
		fputs(",\"ph\":\"X\",\"ts\":", f);
		json_us(f, e->t0);
		fputs(",\"dur\":", f);
		json_us(f, e->t1 - e->t0);
		fprintf(f, ",\"pid\":1,\"tid\":%d,\"args\":{\"step\":%lld", e->track,
			(long long)(p->step0 + e->step));
		if (e->kind == EV_LAYER) {
			fputs(",\"layer\":", f);
			json_str(f, e->name);
		} else if (e->kind >= 0) {
			const struct prof_row *r = &p->rows[e->kind];
			fputs(",\"layer\":", f);
			json_str(f, r->label);
			fputs(",\"op\":", f);
			json_str(f, r->what);
		}
		fputs("}}", f);
	}
	fputs("\n]}\n", f);
}

void kiln_profile_set_rank(struct kiln_profile *p, int rank)
{
	if (p)
		p->rank = rank;
}

/* kiln_file_write's fills: profile.txt's table, trace.json's events (a
 * failed write is the stream's error, which write_stream returns). */
static int fill_table(FILE *fp, void *ctx)
{
	write_table(ctx, fp);
	return ferror(fp) ? (errno ? errno : EIO) : 0;
}

static int fill_trace(FILE *fp, void *ctx)
{
	write_trace(ctx, fp);
	return ferror(fp) ? (errno ? errno : EIO) : 0;
}

/* out_dir/NAME<rank>.EXT into path. */
static void report_path(const struct kiln_profile *p, const char *out_dir, const char *name,
			const char *ext, char *path, size_t n)
{
	char rank[32] = "";
	if (p->rank > 0)
		snprintf(rank, sizeof rank, ".rank%d", p->rank);
	snprintf(path, n, "%s/%s%s.%s", out_dir, name, rank, ext);
}

kiln_status kiln_profile_check_out(const struct kiln_profile *p, const char *out_dir)
{
	char path[4200];
	struct stat sb;
	if (!p || !out_dir || !*out_dir)
		return KILN_OK;
	for (int i = 0; i < 2; i++) {
		if (i && p->trace_steps <= 0)
			break;
		report_path(p, out_dir, i ? "trace" : "profile", i ? "json" : "txt", path,
			    sizeof path);
		if (!stat(path, &sb) && S_ISDIR(sb.st_mode))
			return kiln_error(KILN_EIO, "%s: the profiler cannot write it at the end of the run: a directory of that name is in the way",
					  path);
	}
	return KILN_OK;
}

/* The tests' fault: KILN_TEST_PROFILE_FAIL=R fails rank R's write of its
 * profile at the end of the run, after the last collective
 * (tests/dist.sh: a rank's late failure; a directory in the way of the
 * file was that fault until session 33, when kiln_profile_check_out began
 * refusing it before the first step). */
static int late_fault(const struct kiln_profile *p)
{
	const char *v = getenv("KILN_TEST_PROFILE_FAIL");
	return v && *v && atoi(v) == p->rank;
}

kiln_status kiln_profile_report(struct kiln_profile *p, const char *out_dir)
{
	char path[4200];
	kiln_status st = KILN_OK;
	int err;
	pthread_mutex_lock(&p->lock);
	write_table(p, NULL); /* the log */
	/* each file whole or not at all (kiln_file_write): before session 33
	 * a failed write of trace.json left a partial file */
	if (out_dir && *out_dir) {
		report_path(p, out_dir, "profile", "txt", path, sizeof path);
		if ((st = kiln_run_file_check(path)))
			;
		else if (late_fault(p))
			st = kiln_error(KILN_EIO, "%s: cannot write the profile: the tests' fault (KILN_TEST_PROFILE_FAIL=%d)",
					path, p->rank);
		else if ((err = kiln_file_write(path, fill_table, p)))
			st = kiln_error(KILN_EIO, "%s: cannot write the profile: %s", path, strerror(err));
	}
	if (!st && out_dir && *out_dir && p->trace_steps > 0) {
		report_path(p, out_dir, "trace", "json", path, sizeof path);
		if ((st = kiln_run_file_check(path)))
			;
		else if ((err = kiln_file_write(path, fill_trace, p)))
			st = kiln_error(KILN_EIO, "%s: cannot write the trace: %s", path, strerror(err));
		else if (p->step)
			kiln_log(KILN_LOG_INFO, "profile",
				 "trace of steps %lld..%lld in %s (open in ui.perfetto.dev or chrome://tracing)",
				 (long long)p->step0 + 1,
				 (long long)(p->step0 + (p->step < p->trace_steps ? p->step : p->trace_steps)),
				 path);
	}
	pthread_mutex_unlock(&p->lock);
	return st;
}
