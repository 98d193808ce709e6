/* core/run_config.c - [run], [train] and [data] read once into typed
 * structs (run_config.h, kiln.h's struct kiln_train_cfg).  Every value is
 * the config's or the schema's default; nothing here knows a default. */
#include "run_config.h"
#include "checkpoint.h"
#include "data.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c */

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The readers below chain these: the first error wins, later reads are
 * skipped. */
static void get_int(const struct kiln_config *cfg, const char *sec, const char *key,
		    int64_t *out, kiln_status *st)
{
	if (!*st)
		*st = kiln_config_get_int(cfg, sec, key, out);
}

static void get_float(const struct kiln_config *cfg, const char *sec, const char *key,
		      double *out, kiln_status *st)
{
	if (!*st)
		*st = kiln_config_get_float(cfg, sec, key, out);
}

static void get_bool(const struct kiln_config *cfg, const char *sec, const char *key, int *out,
		     kiln_status *st)
{
	if (!*st)
		*st = kiln_config_get_bool(cfg, sec, key, out);
}

static void get_str(const struct kiln_config *cfg, const char *sec, const char *key,
		    const char **out, kiln_status *st)
{
	if (!*st)
		*st = kiln_config_get_str(cfg, sec, key, out);
}

/* "1 byte", "512 bytes", "1.5 KiB", "2.0 MiB": n in a unit a reader
 * takes in at once. */
static void size_text(size_t n, char *buf, size_t len)
{
	if (n < 1024)
		snprintf(buf, len, "%zu byte%s", n, n == 1 ? "" : "s");
	else if (n < (size_t)1 << 20)
		common_snprintf_c(buf, len, "%.1f KiB", (double)n / 1024.0);
	else
		common_snprintf_c(buf, len, "%.1f MiB", (double)n / 1048576.0);
}

/* [run] memory_limit in bytes (kiln_parse_size), at least 1 MiB: less
 * plans no model and is a unit left out (1.5 is one byte). */
static void read_memory_limit(const struct kiln_config *cfg, struct kiln_run_cfg *out,
			      kiln_status *st)
{
	const char *v = out->memory_limit, *where;
	char sz[64];
	if (*st || !*v)
		return;
	where = kiln_config_where(cfg, "run", "memory_limit");
	if (kiln_parse_size(v, &out->memory_limit_bytes))
		*st = kiln_error(KILN_ECONFIG, "%s: [run] memory_limit = '%s': expected a decimal number of bytes, optionally with K, M, G or T (powers of 1024; KiB or MB read the same), such as 512M or 2G",
				 where, v);
	else if (out->memory_limit_bytes < KILN_MEMORY_LIMIT_MIN) {
		size_text(out->memory_limit_bytes, sz, sizeof sz);
		*st = kiln_error(KILN_ECONFIG, "%s: [run] memory_limit = '%s' is %s: too small to plan a model in (at least 1 MiB; a unit such as 512M or 2G)",
				 where, v, sz);
	}
}

kiln_status kiln_run_cfg_read(const struct kiln_config *cfg, struct kiln_run_cfg *out)
{
	kiln_status st = KILN_OK;
	memset(out, 0, sizeof *out);
	get_str(cfg, "run", "device", &out->device, &st);
	get_str(cfg, "run", "precision", &out->precision, &st);
	get_str(cfg, "run", "out_dir", &out->out_dir, &st);
	get_str(cfg, "run", "memory_limit", &out->memory_limit, &st);
	read_memory_limit(cfg, out, &st);
	get_int(cfg, "run", "seed", &out->seed, &st);
	get_int(cfg, "run", "threads", &out->threads, &st);
	get_bool(cfg, "run", "deterministic", &out->deterministic, &st);
	return st;
}

kiln_status kiln_data_cfg_read(const struct kiln_config *cfg, struct kiln_data_cfg *out)
{
	kiln_status st;
	memset(out, 0, sizeof *out);
	st = kiln_data_workers(cfg, &out->workers);
	get_int(cfg, "data", "prefetch", &out->prefetch, &st);
	get_bool(cfg, "data", "shuffle", &out->shuffle, &st);
	get_bool(cfg, "data", "resident", &out->resident, &st);
	return st;
}

/* The keys of the schedules of session 43 (linear, polynomial, onecycle's
 * options).  LinearLR refuses a start_factor of 0 (its rate would start
 * at 0 and, chained, stay there); the schema's range takes the end, so
 * it is refused here, with linear only. */
static void read_schedule_more(const struct kiln_config *cfg, struct kiln_train_cfg *o,
			       kiln_status *st)
{
	const char *anneal = NULL;
	get_float(cfg, "train", "start_factor", &o->start_factor, st);
	get_float(cfg, "train", "end_factor", &o->end_factor, st);
	get_int(cfg, "train", "total_iters", &o->total_iters, st);
	get_float(cfg, "train", "power", &o->power, st);
	get_bool(cfg, "train", "three_phase", &o->three_phase, st);
	get_str(cfg, "train", "anneal_strategy", &anneal, st);
	o->anneal_linear = anneal && !strcmp(anneal, "linear");
	if (!*st && o->schedule && !strcmp(o->schedule, "linear") && o->start_factor <= 0)
		*st = kiln_error(KILN_ECONFIG, "%s: [train] start_factor = %g with schedule = linear: the first rate is lr x start_factor, which must be above 0 and at most 1 (LinearLR's range)",
				 kiln_config_where(cfg, "train", "start_factor"), o->start_factor);
}

/* The keys of the learning-rate schedule and the gradient clip. */
static void read_schedule(const struct kiln_config *cfg, struct kiln_train_cfg *o, kiln_status *st)
{
	get_float(cfg, "train", "lr", &o->lr, st);
	get_str(cfg, "train", "schedule", &o->schedule, st);
	get_int(cfg, "train", "warmup", &o->warmup, st);
	get_int(cfg, "train", "step_size", &o->step_size, st);
	get_float(cfg, "train", "lr_min", &o->lr_min, st);
	get_float(cfg, "train", "gamma", &o->gamma, st);
	get_float(cfg, "train", "pct_start", &o->pct_start, st);
	get_float(cfg, "train", "div_factor", &o->div_factor, st);
	get_float(cfg, "train", "final_div_factor", &o->final_div_factor, st);
	get_str(cfg, "train", "milestones", &o->milestones, st);
	get_str(cfg, "train", "lr_scale", &o->lr_scale, st);
	get_int(cfg, "train", "base_batch", &o->base_batch, st);
	get_float(cfg, "train", "clip_norm", &o->clip_norm, st);
	get_float(cfg, "train", "clip_value", &o->clip_value, st);
	get_bool(cfg, "train", "skip_nonfinite", &o->skip_nonfinite, st);
	read_schedule_more(cfg, o, st);
	/* one-cycle's warm-up phase is a share of the run strictly inside it
	 * (the schema's range takes the ends; the device op would refuse
	 * them at plan time, naming no key) */
	if (!*st && o->schedule && !strcmp(o->schedule, "onecycle") &&
	    (o->pct_start <= 0 || o->pct_start >= 1))
		*st = kiln_error(KILN_ECONFIG, "%s: [train] pct_start = %g with schedule = onecycle: the share of the run that raises the lr must be strictly between 0 and 1",
				 kiln_config_where(cfg, "train", "pct_start"), o->pct_start);
}

/* schedule = plateau (its keys are the trainer's: core/train_plateau.c):
 * ReduceLROnPlateau refuses a factor of 1 or more (the rate would never
 * fall), and it reads the evaluations' loss, which eval = 0 runs none
 * of. */
static void check_plateau(const struct kiln_config *cfg, const struct kiln_train_cfg *o,
			  kiln_status *st)
{
	double factor = 0;
	if (*st || !o->schedule || strcmp(o->schedule, "plateau"))
		return;
	get_float(cfg, "train", "plateau_factor", &factor, st);
	if (!*st && factor >= 1)
		*st = kiln_error(KILN_ECONFIG, "%s: [train] plateau_factor = %g: the rate is multiplied by it when the loss stops improving, so it must be below 1 (ReduceLROnPlateau's factor)",
				 kiln_config_where(cfg, "train", "plateau_factor"), factor);
	else if (!*st && !o->eval)
		*st = kiln_error(KILN_ECONFIG, "%s: [train] schedule = plateau reads the evaluations' loss, and [train] eval = 0 runs none: set eval = 1 (and eval_every for evaluations within an epoch)",
				 kiln_config_where(cfg, "train", "schedule"));
}

/* Evaluation, keep_best, early stopping and checkpoints. */
static void read_eval(const struct kiln_config *cfg, struct kiln_train_cfg *o, kiln_status *st)
{
	const char *best = NULL, *stop = NULL;
	get_bool(cfg, "train", "eval", &o->eval, st);
	get_int(cfg, "train", "eval_every", &o->eval_every, st);
	get_int(cfg, "train", "keep_best", &o->keep_best, st);
	get_str(cfg, "train", "best_metric", &best, st);
	get_int(cfg, "train", "early_stop_patience", &o->early_stop_patience, st);
	get_str(cfg, "train", "early_stop_metric", &stop, st);
	get_float(cfg, "train", "early_stop_min_delta", &o->early_stop_min_delta, st);
	get_int(cfg, "train", "checkpoint_every", &o->checkpoint_every, st);
	get_int(cfg, "train", "keep_last", &o->keep_last, st);
	get_bool(cfg, "train", "checkpoint_last", &o->checkpoint_last, st);
	get_bool(cfg, "train", "resume", &o->resume, st);
	get_bool(cfg, "train", "overwrite", &o->overwrite, st);
	o->best_on_loss = best && !strcmp(best, "loss");
	o->early_stop_on_loss = stop && !strcmp(stop, "loss");
}

kiln_status kiln_train_cfg_fill(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_train_cfg *out)
{
	if (!cfg || !out)
		return kiln_null_arg("kiln_train_cfg_read", !cfg ? "cfg" : "out");
	kiln_status st = KILN_OK;
	const char *batch = kiln_config_get(cfg, "train", "batch");
	memset(out, 0, sizeof *out);
	out->size = sizeof *out;
	out->batch_auto = batch && !strcmp(batch, "auto");
	if (!out->batch_auto)
		get_int(cfg, "train", "batch", &out->batch, &st);
	get_int(cfg, "train", "epochs", &out->epochs, &st);
	get_int(cfg, "train", "eval_batch", &out->eval_batch, &st);
	get_int(cfg, "train", "accumulate", &out->accumulate, &st);
	get_int(cfg, "train", "max_steps", &out->max_steps, &st);
	get_str(cfg, "train", "optimizer", &out->optimizer, &st);
	get_int(cfg, "train", "log_every", &out->log_every, &st);
	read_schedule(cfg, out, &st);
	read_eval(cfg, out, &st);
	check_plateau(cfg, out, &st);
	if (!st && out->batch_auto && reg)
		st = kiln_memory_auto_batch(cfg, reg, &out->batch);
	return st;
}

/* Into a struct of this library's size, copied into the caller's as far
 * as its size goes (kiln/kiln.h, "Structs the library fills"). */
kiln_status kiln_train_cfg_read(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_train_cfg *out)
{
	struct kiln_train_cfg full;
	kiln_status st = kiln_sized_check(out, "kiln_train_cfg_read", "kiln_train_cfg",
					  "KILN_TRAIN_CFG_INIT");
	if (st)
		return st;
	st = kiln_train_cfg_fill(cfg, reg, &full);
	kiln_sized_out(out, &full, sizeof full);
	return st;
}

kiln_status kiln_train_cfg_in(const struct kiln_config *cfg, const struct kiln_train_cfg *tc,
			      const char *fn, struct kiln_train_cfg *full)
{
	kiln_status st = kiln_sized_check(tc, fn, "kiln_train_cfg", "KILN_TRAIN_CFG_INIT");
	if (st)
		return st;
	/* an older header's struct: the members it has not, as
	 * kiln_train_cfg_read reads them (batch, which it has, resolved) */
	if (tc->size < sizeof *full && (st = kiln_train_cfg_fill(cfg, NULL, full)))
		return st;
	memcpy(full, tc, tc->size < sizeof *full ? tc->size : sizeof *full);
	full->size = sizeof *full;
	return KILN_OK;
}

kiln_status kiln_train_cfg_batch(const struct kiln_config *cfg, const struct kiln_train_cfg *tc,
				 const char *who, int64_t *batch)
{
	if (!tc->batch)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch = auto is chosen before %s (kiln_train_cfg_read with a registry; `kiln train` and `kiln memory` do it)",
				  kiln_config_where(cfg, "train", "batch"), who);
	*batch = tc->batch;
	return KILN_OK;
}

char *kiln_run_config_text(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   const struct kiln_train_cfg *tc)
{
	char *text = kiln_ckpt_config_text(cfg, reg);
	if (!text || !tc->batch_auto)
		return text;
	/* the [train] section's "batch = auto" line becomes the number */
	char *sec = strstr(text, "\n[train]\n"), *line = sec ? strstr(sec, "\nbatch = auto\n") : NULL;
	char *next = sec ? strstr(sec + 1, "\n[") : NULL;
	if (!line || (next && line > next)) {
		free(text);
		kiln_error(KILN_EINTERNAL, "the resolved config has no [train] batch = auto line");
		return NULL;
	}
	size_t head = (size_t)(line - text), n = strlen(text) + 32;
	char *out = malloc(n);
	if (!out) {
		free(text);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	snprintf(out, n, "%.*s\nbatch = %lld%s", (int)head, text, (long long)tc->batch,
		 line + strlen("\nbatch = auto"));
	free(text);
	return out;
}

/* [train] keys that a schedule reads, and the schedules that read them
 * (up to 3). */
static const struct {
	const char *key, *by[3];
} schedule_keys[] = {
	{ "step_size", { "step" } },
	{ "gamma", { "step", "multistep", "exponential" } },
	{ "milestones", { "multistep" } },
	{ "lr_min", { "cosine" } },
	{ "pct_start", { "onecycle" } },
	{ "div_factor", { "onecycle" } },
	{ "final_div_factor", { "onecycle" } },
	{ "three_phase", { "onecycle" } },
	{ "anneal_strategy", { "onecycle" } },
	{ "start_factor", { "linear" } },
	{ "end_factor", { "linear" } },
	{ "total_iters", { "linear", "polynomial" } },
	{ "power", { "polynomial" } },
	{ "plateau_factor", { "plateau" } },
	{ "plateau_patience", { "plateau" } },
	{ "plateau_threshold", { "plateau" } },
	{ "plateau_threshold_mode", { "plateau" } },
	{ "plateau_cooldown", { "plateau" } },
	{ "plateau_min_lr", { "plateau" } },
};

/* Does built-in optimizer o read key? */
static int optim_reads(const struct kiln_plugin *o, const char *key)
{
	for (const struct kiln_key *k = o->keys; k && k->name; k++)
		if (!strcmp(k->name, key))
			return 1;
	return 0;
}

/* A built-in optimizer's key set (file or command line) while
 * `optimizer` is another built-in one that does not read it (momentum
 * with adamw, eps with sgd): [train] accepts every built-in optimizer's
 * keys (core/optim/optims.c), so it is said, not refused.  An optimizer
 * plugin's own keys are not known here: nothing said for it. */
static void optim_keys_warn(const struct kiln_config *cfg, const char *name)
{
	const struct kiln_plugin *mine = NULL;
	for (int i = 0; kiln_builtin_optims[i]; i++)
		if (!strcmp(kiln_builtin_optims[i]->name, name))
			mine = kiln_builtin_optims[i];
	for (int i = 0; mine && kiln_builtin_optims[i]; i++)
		for (const struct kiln_key *k = kiln_builtin_optims[i]->keys; k && k->name; k++) {
			const char *where = kiln_config_where(cfg, "train", k->name);
			int first = 0; /* (said once, at its first reader) */
			while (!optim_reads(kiln_builtin_optims[first], k->name))
				first++;
			if (first != i || optim_reads(mine, k->name) || !strcmp(where, "default"))
				continue;
			char by[96] = "";
			size_t off = 0;
			for (int j = i; kiln_builtin_optims[j] && off < sizeof by; j++)
				if (optim_reads(kiln_builtin_optims[j], k->name))
					off += (size_t)snprintf(by + off, sizeof by - off, "%s%s",
								off ? " or " : "", kiln_builtin_optims[j]->name);
			kiln_log(KILN_LOG_WARN, "train", "%s: [train] %s is read by optimizer = %s, not by optimizer = %s: ignored",
				 where, k->name, by, name);
		}
}

void kiln_train_cfg_warn_unread(const struct kiln_config *cfg, const struct kiln_train_cfg *tc)
{
	const char *sched = tc->schedule ? tc->schedule : "constant";
	for (size_t i = 0; i < KILN_ARRAY_LEN(schedule_keys); i++) {
		const char *where = kiln_config_where(cfg, "train", schedule_keys[i].key);
		const char *const *by = schedule_keys[i].by;
		int n = 0, reads = 0;
		for (; n < 3 && by[n]; n++)
			reads |= !strcmp(sched, by[n]);
		if (!strcmp(where, "default") || reads)
			continue;
		/* "step", "step or multistep", "step, multistep or exponential" */
		char list[96] = "";
		for (int k = 0, off = 0; k < n; k++)
			off += snprintf(list + off, sizeof list - (size_t)off, "%s%s",
					!k ? "" : k == n - 1 ? " or " : ", ", by[k]);
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] %s is read by schedule = %s, not by schedule = %s: ignored",
			 where, schedule_keys[i].key, list, sched);
	}
	optim_keys_warn(cfg, tc->optimizer ? tc->optimizer : "sgd");
	const char *where = kiln_config_where(cfg, "train", "base_batch");
	if (strcmp(where, "default") && (!tc->lr_scale || !strcmp(tc->lr_scale, "none")))
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] base_batch is read by lr_scale = linear or sqrt, not by lr_scale = none: lr = %g is used as written",
			 where, tc->lr);
	where = kiln_config_where(cfg, "train", "warmup");
	if (tc->warmup > 0 && !strcmp(sched, "onecycle"))
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] warmup = %lld with schedule = onecycle: the warm-up to lr runs first, then the cycle starts again from lr / div_factor (onecycle rises on its own over pct_start; OneCycleLR has no warm-up): set warmup = 0",
			 where, (long long)tc->warmup);
	where = kiln_config_where(cfg, "train", "eval_every");
	if (!tc->eval && tc->eval_every > 0 && strcmp(where, "default"))
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] eval_every needs eval = 1 ([train] eval = 0 runs no evaluation): ignored",
			 where);
}

int kiln_parse_milestones(const char *v, int64_t out[KILN_MAX_MILESTONES])
{
	int n = 0, comma = 0;
	int64_t prev = 0;
	for (; v; comma = *v == ',', v += comma) {
		v += strspn(v, " \t");
		if (!*v || *v == ',') {
			/* a comma with no number after it, or before it (",,,"
			 * was zero milestones before session 34) */
			if (*v || comma)
				return KILN_MILESTONES_EMPTY;
			break;
		}
		if (*v < '0' || *v > '9')
			return KILN_MILESTONES_FORM;
		char *end;
		errno = 0;
		long long m = strtoll(v, &end, 10);
		if (errno) /* strtoll clamps: 99999999999999999999 read as LLONG_MAX */
			return KILN_MILESTONES_RANGE;
		if (m < prev)
			return KILN_MILESTONES_ORDER;
		if (n == KILN_MAX_MILESTONES)
			return KILN_MILESTONES_MANY;
		out[n++] = prev = m;
		v = end + strspn(end, " \t");
		if (*v && *v != ',' && (*v < '0' || *v > '9'))
			return KILN_MILESTONES_FORM;
	}
	return n;
}
