/* core/resume.c - what resuming and reading weights need besides the file
 * format (checkpoint_*.c): the comparison of a checkpoint's config with the
 * run's, with the keys safe to change on resume and the keys that shape
 * the stored tensors, and a run's checkpoint directory (the newest usable
 * checkpoint, keep_last, the checkpoint eval and export read).  See
 * checkpoint.h.
 */
#include "checkpoint.h"
#include "config_diff.h"
#include "run_config.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

/* ---- config comparison -------------------------------------------------- */

static const struct {
	const char *section, *key;
} safe_keys[] = {
	{ "run", "out_dir" },        { "run", "threads" },
	{ "data", "workers" },       { "data", "prefetch" },
	{ "data.eval", "workers" },  { "data.eval", "prefetch" },
	/* [data.val] inherits these from [data] (session 33: a resume with
	 * data.workers changed was refused where the config has [data.val]) */
	{ "data.val", "workers" },   { "data.val", "prefetch" },
	{ "data.val", "cache" },     { "data.val", "transform_on" },
	{ "train", "epochs" },       { "train", "max_steps" },
	{ "train", "log_every" },    { "train", "checkpoint_every" },
	{ "train", "keep_last" },    { "train", "eval" },
	{ "train", "checkpoint_last" },
	{ "train", "resume" },       { "train", "overwrite" },
	/* another world size: the per-rank batch changes with it (resume
	 * checks that the global step still divides the offset) */
	{ "train", "batch" },        { "run", "comm" },
	/* the global batch's split into micro-batches: batch x accumulate x
	 * ranks, the state's layout the same (core/train_resume_batch.c;
	 * session 40: a 2-rank run could not resume on 1 rank with
	 * accumulate 2 where the batch of 2 would not fit) */
	{ "train", "accumulate" },
	{ "dist", "bucket_mb" },     { "dist", "timeout" },
	{ "dist", "overlap" },        { "dist", "zero" },
	{ "dist", "timing" },
	{ "log", "tensorboard" },    { "log", "csv" },
	{ "log", "histograms" },
	/* what the forward keeps or replays, and where the decoded samples
	 * wait: the same bits (session 29: a run out of memory resumes with
	 * recompute on) */
	{ "train", "recompute" },    { "layer.*", "recompute" },
	{ "data", "cache" },         { "data.eval", "cache" },
	/* how the step runs and where the samples are normalised: the same
	 * bits (session 30: resumed runs with each changed equal the
	 * uninterrupted run byte for byte, tests/resume_knobs.sh) */
	{ "plugin.cpu", "async" },   { "plugin.cpu", "graph" },
	{ "data", "transform_on" },  { "data.eval", "transform_on" },
	/* the pipeline's cut and schedule (docs/pipeline.md): the weights and
	 * the optimizer state are laid out the same; "layer.*": every layer */
	{ "pipeline", "micro_batches" }, { "pipeline", "schedule" },
	{ "layer.*", "stage" },      { "model", "stages" },
	{ "model", "stages_flops_per_byte" },
	/* how the stages' hand-offs go and when their forwards run: 1f1b's
	 * gradients bit for bit (docs/pipeline.md; session 38: a resume with
	 * one changed was refused) */
	{ "pipeline", "early_forwards" }, { "pipeline", "zero_copy" },
	{ "pipeline", "sendrecv" },
	/* when the stages' weight gradients run: the same bits (session 49,
	 * tests/pipeline_wgrad.sh) */
	{ "pipeline", "defer_wgrad" },
	/* stages on ranks: checkpoints hold every stage's state, gathered */
	{ "dist", "pipeline" },
	/* stages on devices of one process: the same state, the same layout
	 * (session 31: refused before, where docs/pipeline.md said a
	 * checkpoint does not depend on the placement) */
	{ "run", "devices" },
	/* profiling only waits for each op (docs/profiler.md: a profiled run
	 * trains the same weights bit for bit, tests/resume_knobs.sh), and
	 * infer_block is read by the inference API alone, never by training
	 * (session 33: `kiln train --resume --profile` was refused) */
	{ "run", "profile" },        { "run", "profile_steps" },
	{ "run", "infer_block" },
	/* where the threads of stages on CPU devices run, never what they
	 * compute: bind_stages pins them to CPUs (the default went auto ->
	 * none in 2bf4637), stage_spin_us is how long a waiting stage's
	 * stream watches before it sleeps (session 35: a resume with either
	 * changed was refused) */
	{ "run", "bind_stages" },    { "plugin.cpu", "stage_spin_us" },
};

int kiln_ckpt_safe_key(const char *section, const char *key)
{
	const int layer = !strncmp(section, "layer.", 6);
	for (size_t i = 0; i < KILN_ARRAY_LEN(safe_keys); i++)
		if (!strcmp(safe_keys[i].section, layer ? "layer.*" : section) &&
		    !strcmp(safe_keys[i].key, key))
			return 1;
	return 0;
}

/* Keys of [model] and [layer.*] that do not change the stored tensors:
 * how to compute, where the first values come from.  "layer.*" stands for
 * every layer. */
static const struct {
	const char *section, *key;
} weightless_keys[] = {
	{ "model", "layout" },       { "model", "init_from" },
	{ "model", "init_strict" },  { "layer.*", "inplace" },
	{ "layer.*", "recompute" },  { "model", "init_format" },
	{ "layer.*", "stage" },      { "model", "stages" },
	{ "model", "stages_flops_per_byte" },
	/* ([pipeline] keys need no entry: weights_key reads [model] and
	 * [layer.*] alone; they are in safe_keys) */
	{ "layer.*", "int8_scale" }, { "layer.*", "int8_unsigned" },
	{ "layer.*", "int8_out_scale" },
	/* dropout rates (the dropout layer's p, attention's dropout): read in
	 * training only, no tensor (session 34: `kiln generate` refused a
	 * checkpoint for another rate) */
	{ "layer.*", "p" },          { "layer.*", "dropout" },
};

/* Is [section] key one of weightless_keys? */
static int unshaping_key(const char *section, const char *key)
{
	const int layer = !strncmp(section, "layer.", 6);
	for (size_t i = 0; i < KILN_ARRAY_LEN(weightless_keys); i++)
		if (!strcmp(weightless_keys[i].section, layer ? "layer.*" : section) &&
		    !strcmp(weightless_keys[i].key, key))
			return 1;
	return 0;
}

static int weights_key(const char *section, const char *key)
{
	if (strncmp(section, "layer.", 6) && strcmp(section, "model"))
		return 0;
	return !unshaping_key(section, key);
}

/* Is "section key" a line of list? */
static int listed(const char *list, const char *sec, const char *key)
{
	size_t ns = strlen(sec), nk = strlen(key);
	for (const char *p = list; *p; p += strcspn(p, "\n"), p += *p != 0)
		if (!strncmp(p, sec, ns) && p[ns] == ' ' && !strncmp(p + ns + 1, key, nk) &&
		    (p[ns + 1 + nk] == '\n' || !p[ns + 1 + nk]))
			return 1;
	return 0;
}

/* The comparison's rules: the weights keys (NULL: a resume), the
 * current config's defaults text, parsed (what a key the checkpoint's text
 * lacks reads as), the current config's text, parsed (its layers'
 * types, whose schemas say which keys are pairs), and the checkpoint's
 * (where an unset key's default is another key's value). */
struct ckpt_rules {
	const struct kiln_config *cfg; /* the current config: each key's schema type */
	const char *wkeys;
	struct kiln_kv *d, *cur;
	int nd, ncur;
	struct kiln_kv *saved;
	int nsaved;
};

/* ---- values by meaning ------------------------------------------------- */

/* The forms of a checkpoint's value that kilns before session 34 wrote
 * and read, which this kiln's parsers refuse (kiln_config_values_same
 * reads every other value by its schema type): a built-in layer's pair
 * (get_pair read "2," as (2, 0)), [train] milestones (an empty entry
 * skipped). */
enum key_form { FORM_TEXT, FORM_PAIR, FORM_STEPS };

/* [sec] key's legacy form: a pair where the current config gives [sec] a
 * built-in layer type whose schema has key as an integer list
 * (kiln_config_pair_key, the rule kiln_config_values_same follows too). */
static enum key_form key_form(const struct ckpt_rules *r, const char *sec, const char *key)
{
	if (!strcmp(sec, "train") && !strcmp(key, "milestones"))
		return FORM_STEPS;
	const struct kiln_kv *type = kiln_kv_lookup(r->cur, r->ncur, sec, "type");
	if (type && kiln_config_pair_key(sec, type->val, (size_t)type->val_n, key))
		return FORM_PAIR;
	return FORM_TEXT;
}

/* A pair as every kiln's get_pair read it: "N" is (N, N); before session
 * 34 an empty number read as 0 ("2," was (2, 0), ",1" (0, 1)), which
 * this kiln refuses in a config but must read so in a checkpoint's.  -1
 * where no kiln read it as a pair. */
static int read_pair(const char *v, long long out[2])
{
	char *end;
	if (!*v) /* refused by every kiln */
		return -1;
	errno = 0;
	out[0] = out[1] = strtoll(v, &end, 10);
	end += strspn(end, " \t");
	if (*end == ',')
		out[1] = strtoll(end + 1, &end, 10);
	end += strspn(end, " \t");
	return *end || errno ? -1 : 0;
}

/* [train] milestones as kilns before session 34 read them: integers
 * separated by commas, an empty entry skipped ("25, 30," was 25 and 30),
 * at most n: their count, or -1. */
static int read_steps(const char *v, long long *out, int n)
{
	int k = 0;
	for (;;) {
		v += strspn(v, " \t,");
		if (!*v)
			return k;
		char *end;
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (end == v || errno || k == n)
			return -1;
		out[k++] = x;
		v = end + strspn(end, " \t");
		if (*v && *v != ',')
			return -1;
	}
}

/* The built-in layer keys whose default, unset, is another key's value
 * in the same section (read so by the layer: core/layers/pool.c, PyTorch's
 * stride = kernel).  Others whose default is computed (attention's scale
 * from the shapes, a layer's input or stage from the file's order, conv's
 * bias from its consumer) are not another key's value and compare as set
 * or unset. */
static const struct {
	const char *type, *key, *from;
} derived[] = {
	{ "maxpool", "stride", "kernel" },
	{ "avgpool", "stride", "kernel" },
};

/* An unset [sec] key's value where it is another key's of v (derived[],
 * by the current config's layer type), else NULL. */
static const struct kiln_kv *derived_value(const struct ckpt_rules *r, const struct kiln_kv *v,
					   int n, const char *sec, const char *key)
{
	const struct kiln_kv *type = kiln_kv_lookup(r->cur, r->ncur, sec, "type");
	for (size_t i = 0; type && type->val && i < KILN_ARRAY_LEN(derived); i++) {
		const struct kiln_kv *e;
		if (strncmp(sec, "layer.", 6) || strcmp(key, derived[i].key) ||
		    strlen(derived[i].type) != (size_t)type->val_n ||
		    memcmp(derived[i].type, type->val, (size_t)type->val_n))
			continue;
		e = kiln_kv_lookup(v, n, sec, derived[i].from);
		return e && e->val ? e : NULL;
	}
	return NULL;
}

/* kiln_kv_same_fn: the two values of [sec] key by meaning: by the key's
 * schema type in the current config (kiln_config_values_same: 0.1 is
 * 0.10, true is 1, "2, 0" is "2,0", a built-in layer's pair "5" is "5,5",
 * a layer plugin's keys by its schema), else in a form an older kiln
 * wrote (key_form); an unset one (a NULL: a the checkpoint's, b the
 * current one's) as the key its default is (derived[]: a pooling's
 * stride = 2 with kernel = 2 equals an unset stride; before session 35 it
 * was refused as "stride is unset in the checkpoint but '2' here"). */
static int ckpt_same(const char *sec, const char *key, const char *a, size_t an, const char *b,
		     size_t bn, void *u)
{
	const struct ckpt_rules *r = u;
	if (!a || !b) {
		const struct kiln_kv *e = !a ? derived_value(r, r->saved, r->nsaved, sec, key)
					     : derived_value(r, r->cur, r->ncur, sec, key);
		if (!e)
			return 0;
		if (!a)
			a = e->val, an = (size_t)e->val_n;
		else
			b = e->val, bn = (size_t)e->val_n;
	}
	if (kiln_config_values_same(r->cfg, sec, key, a, an, b, bn))
		return 1;
	enum key_form form = key_form(u, sec, key);
	char x[256], y[256];
	if (form == FORM_TEXT || an >= sizeof x || bn >= sizeof y)
		return 0;
	snprintf(x, sizeof x, "%.*s", (int)an, a);
	snprintf(y, sizeof y, "%.*s", (int)bn, b);
	if (form == FORM_PAIR) {
		long long p[2], q[2];
		return !read_pair(x, p) && !read_pair(y, q) && p[0] == q[0] && p[1] == q[1];
	}
	long long p[64], q[64];
	int np = read_steps(x, p, 64), nq = read_steps(y, q, 64);
	return np >= 0 && np == nq && !memcmp(p, q, sizeof *p * (size_t)np);
}

/* Is [sec] key compared: for a resume (wkeys NULL) unless it is safe to
 * change, for the weights when it shapes them (listed by the checkpoint,
 * or by this kiln's rule). */
static int ckpt_wanted(const char *sec, const char *key, void *u)
{
	const char *wkeys = ((const struct ckpt_rules *)u)->wkeys;
	/* what this kiln knows shapes no tensor is not compared even where an
	 * older checkpoint listed it (dropout rates, session 34) */
	if (wkeys)
		return weights_key(sec, key) ||
		       (listed(wkeys, sec, key) && !unshaping_key(sec, key));
	/* [run] fuse: resolved by the device, and bit-exact or not by the
	 * model; the trainer compares it (core/train_ckpt.c resume_fuse) */
	if (!strcmp(sec, "run") && !strcmp(key, "fuse"))
		return 0;
	return !kiln_ckpt_safe_key(sec, key);
}

static int ckpt_default(const char *sec, const char *key, void *u, const char **val,
			size_t *len)
{
	const struct ckpt_rules *r = u;
	const struct kiln_kv *e = kiln_kv_lookup(r->d, r->nd, sec, key);
	if (!e)
		return 0;
	*val = e->val;
	*len = (size_t)e->val_n;
	return 1;
}

char *kiln_ckpt_weights_keys(const char *config_text)
{
	struct kiln_kv *v = NULL;
	int n = 0;
	char *text = NULL, sec[128], key[128];
	size_t len = 0;
	FILE *f;
	if (kiln_kv_parse(config_text, &v, &n) || !(f = open_memstream(&text, &len))) {
		free(v);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		snprintf(sec, sizeof sec, "%.*s", v[i].sec_n, v[i].sec);
		snprintf(key, sizeof key, "%.*s", v[i].key_n, v[i].key);
		if (weights_key(sec, key))
			fprintf(f, "%s %s\n", sec, key);
	}
	free(v);
	if (fclose(f)) {
		free(text);
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	return text;
}

kiln_status kiln_ckpt_config_delta(const char *saved, const char *current, const char *wkeys,
				   const char *defaults, const struct kiln_config *cfg,
				   int *differs, struct kiln_config_delta *d)
{
	struct ckpt_rules r = { cfg, wkeys, NULL, NULL, 0, 0, NULL, 0 };
	kiln_status st;
	if (!(defaults && (st = kiln_kv_parse(defaults, &r.d, &r.nd))) &&
	    !(st = kiln_kv_parse(current, &r.cur, &r.ncur)) &&
	    !(st = kiln_kv_parse(saved, &r.saved, &r.nsaved)))
		st = kiln_config_diff(saved, current, ckpt_wanted, ckpt_default, ckpt_same, &r, 0,
				      differs, d);
	free(r.d);
	free(r.cur);
	free(r.saved);
	return st;
}

kiln_status kiln_ckpt_config_check(const char *path, const char *saved, const char *current,
				   const char *wkeys, const char *defaults,
				   const struct kiln_config *cfg)
{
	struct kiln_config_delta d;
	int differs;
	kiln_status st = kiln_ckpt_config_delta(saved, current, wkeys, defaults, cfg, &differs, &d);
	if (st || !differs)
		return st;
	if (wkeys)
		return kiln_error(KILN_ECONFIG,
				  "%s holds another model: [%s] %s is %s in its config but %s here (the model's keys must be equal, all but the few docs/checkpoints.md lists under \"Weights keys\")",
				  path, d.section, d.key, d.a, d.b);
	/* (sized for the list with room; never written past: a list that
	 * outgrew 600 bytes wrote over the stack, session 29) */
	char safe[1536];
	size_t k = 0;
	for (size_t j = 0; j < KILN_ARRAY_LEN(safe_keys) && k < sizeof safe; j++) {
		int w = snprintf(safe + k, sizeof safe - k, "%s[%s] %s", j ? ", " : "",
				 safe_keys[j].section, safe_keys[j].key);
		k += w > 0 ? (size_t)w : 0;
	}
	return kiln_error(KILN_ECONFIG,
			  "cannot resume from %s with a changed config: [%s] %s is %s in the checkpoint but %s here. Restore it, or start a new run in another [run] out_dir; only these keys may change on resume: %s (docs/checkpoints.md)",
			  path, d.section, d.key, d.a, d.b, safe);
}

/* ---- the checkpoint directory -------------------------------------------- */

/* "ckpt-<digits>.kiln" (tmp = 0) or "ckpt-<digits>.kiln.tmp" (tmp = 1):
 * the step, or -1.  The digits are the step as kiln writes it (%lld), so
 * a leading zero (ckpt-0032.kiln) is no name of kiln's: -2, ignored (its
 * callers open and delete the file by the step's name). */
int64_t kiln_ckpt_name_step(const char *name, int *tmp)
{
	if (strncmp(name, "ckpt-", 5))
		return -1;
	const char *p = name + 5;
	if (p[0] == '0' && p[1] >= '0' && p[1] <= '9')
		return -2;
	int64_t step = 0;
	int digits = 0;
	for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++)
		step = step * 10 + (*p - '0');
	if (!digits)
		return -1;
	if (!strcmp(p, ".kiln"))
		*tmp = 0;
	else if (!strcmp(p, ".kiln.tmp"))
		*tmp = 1;
	else
		return -1;
	return step;
}

static int cmp_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

int kiln_ckpt_misnamed(const char *path, int64_t named, int level, const char *whom)
{
	const int64_t held = kiln_ckpt_header_step(path);
	if (held < 0 || held == named)
		return 0;
	kiln_log(level, "ckpt", "%s: ignored by %s: it holds step %lld, not step %lld as its name says (a copied or renamed checkpoint?), so it is not taken for step %lld, nor deleted; rename it ckpt-%lld.kiln to use it",
		 path, whom, (long long)held, (long long)named, (long long)named, (long long)held);
	return 1;
}

/* Steps of dir's checkpoints, newest first (malloc'd), or of its temp files.
 * A name with a leading zero is logged at level and skipped, and so is a
 * checkpoint whose header holds another step than its name (before
 * session 39 `cp ckpt-58.kiln ckpt-100.kiln` made every --resume restart
 * at step 58, kiln eval and export read step 58's weights beside a
 * ckpt-80.kiln, and keep_last never deleted it, all without a word):
 * counted in *misnamed (may be NULL). */
static kiln_status list_steps(const char *dir, int want_tmp, int level, int64_t **steps,
			      int *n, int *misnamed)
{
	DIR *d = opendir(dir);
	char path[4400];
	int cap = 0, k = 0;
	int64_t *v = NULL;
	*steps = NULL;
	*n = 0;
	if (!d) {
		if (errno == ENOENT)
			return KILN_OK;
		return kiln_error(KILN_EIO, "%s: cannot list: %s", dir, strerror(errno));
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		int tmp;
		int64_t s = kiln_ckpt_name_step(e->d_name, &tmp);
		if (s == -2)
			kiln_log(level, "ckpt", "%s/%s: ignored: not a checkpoint name kiln writes (its step has a leading zero; kiln's are ckpt-<step>.kiln)",
				 dir, e->d_name);
		if (s < 0 || tmp != want_tmp)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (!tmp && kiln_ckpt_misnamed(path, s, level, "--resume, kiln eval, kiln export and keep_last")) {
			if (misnamed)
				++*misnamed;
			continue;
		}
		if (k == cap) {
			cap = cap ? 2 * cap : 16;
			int64_t *nv = realloc(v, sizeof *v * (size_t)cap);
			if (!nv) {
				free(v);
				closedir(d);
				return kiln_error(KILN_ENOMEM, "out of memory");
			}
			v = nv;
		}
		v[k++] = s;
	}
	closedir(d);
	if (k)
		qsort(v, (size_t)k, sizeof *v, cmp_desc);
	*steps = v;
	*n = k;
	return KILN_OK;
}

kiln_status kiln_ckpt_newest(const char *dir, struct kiln_ckpt **out)
{
	int64_t *steps;
	int n;
	char path[4200], first[KILN_ERROR_MAX] = "";
	int misnamed = 0;
	kiln_status st = list_steps(dir, 0, KILN_LOG_WARN, &steps, &n, &misnamed);
	*out = NULL;
	if (st)
		return st;
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/ckpt-%lld.kiln", dir, (long long)steps[i]);
		if (kiln_ckpt_open(path, out) == KILN_OK) {
			free(steps);
			return KILN_OK;
		}
		if (!i)
			snprintf(first, sizeof first, "%s", kiln_last_error());
		/* the message names the file */
		kiln_log(KILN_LOG_WARN, "ckpt", "%s; %s", kiln_last_error(),
			 i + 1 < n ? "trying the previous checkpoint" : "no older checkpoint left");
	}
	free(steps);
	if (n)
		return kiln_error(KILN_EDATA, "%s: none of the %d checkpoint(s) is usable (the newest: %s)",
				  dir, n, first);
	/* (not a fresh start: the run's state is there, misnamed) */
	if (misnamed)
		return kiln_error(KILN_EDATA, "%s: its %d checkpoint(s) hold other steps than their names say (each named above): rename each ckpt-<the step it holds>.kiln to use it",
				  dir, misnamed);
	return KILN_OK;
}

void kiln_ckpt_prune(const char *dir, int64_t keep, int64_t written)
{
	char path[4200];
	for (int tmp = 1; tmp >= 0; tmp--) {
		int64_t *steps;
		int n, above = 0;
		if (list_steps(dir, tmp, KILN_LOG_DEBUG, &steps, &n, NULL)) {
			kiln_log(KILN_LOG_WARN, "ckpt", "%s", kiln_last_error());
			return;
		}
		/* (newest first) those a resume skipped: left, not counted */
		while (!tmp && above < n && steps[above] > written)
			kiln_log(KILN_LOG_DEBUG, "ckpt", "left %s/ckpt-%lld.kiln (above step %lld: a resume skipped it)",
				 dir, (long long)steps[above++], (long long)written);
		int from = tmp ? 0 : keep > 0 && keep < n - above ? above + (int)keep : n;
		for (int i = from; i < n; i++) {
			snprintf(path, sizeof path, "%s/ckpt-%lld.kiln%s", dir, (long long)steps[i],
				 tmp ? ".tmp" : "");
			if (unlink(path) && errno != ENOENT)
				kiln_log(KILN_LOG_WARN, "ckpt", "cannot delete %s: %s", path, strerror(errno));
			else
				kiln_log(KILN_LOG_DEBUG, "ckpt", "deleted %s", path);
		}
		free(steps);
	}
}

/* ---- the weights eval and export read -------------------------------------- */

/* ck's weights keys against cfg's resolved config. */
static kiln_status weights_check(const struct kiln_config *cfg, const struct kiln_registry *reg,
				 struct kiln_ckpt *ck)
{
	char *saved = NULL, *wkeys = NULL, *current = NULL, *defaults = NULL, what[4200];
	uint64_t bytes;
	kiln_status st = kiln_ckpt_read_text(ck, "config", &saved);
	/* a checkpoint of an older kiln lists none: this kiln's rule alone */
	if (!st && kiln_ckpt_find(ck, "weights_keys", &bytes) == KILN_OK)
		st = kiln_ckpt_read_text(ck, "weights_keys", &wkeys);
	if (!st && (!(current = kiln_ckpt_config_text(cfg, reg)) ||
		    !(defaults = kiln_ckpt_config_defaults(cfg, reg))))
		st = KILN_EIO;
	if (!st)
	snprintf(what, sizeof what, "checkpoint %s", kiln_ckpt_path(ck));
	if (!st)
		st = kiln_ckpt_config_check(what, saved, current, wkeys ? wkeys : "", defaults, cfg);
	free(saved);
	free(wkeys);
	free(current);
	free(defaults);
	return st;
}

kiln_status kiln_ckpt_open_weights(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *path, struct kiln_ckpt **out, char *dir,
				   size_t dir_len)
{
	struct kiln_run_cfg run;
	kiln_status st;
	*out = NULL;
	if (dir_len)
		dir[0] = 0;
	if (path) {
		st = kiln_ckpt_open(path, out);
	} else if (!(st = kiln_run_cfg_read(cfg, &run))) {
		if (!*run.out_dir)
			return KILN_OK; /* no run directory: dir stays "" */
		snprintf(dir, dir_len, "%s/checkpoints", run.out_dir);
		st = kiln_ckpt_newest(dir, out);
	}
	if (!st && *out)
		st = weights_check(cfg, reg, *out);
	if (st) {
		kiln_ckpt_close(*out);
		*out = NULL;
	}
	return st;
}

kiln_status kiln_ckpt_open_weights_fd(const struct kiln_config *cfg,
				      const struct kiln_registry *reg, const char *path, int fd,
				      struct kiln_ckpt **out)
{
	kiln_status st = kiln_ckpt_open_fd(path, fd, out);
	if (!st && (st = weights_check(cfg, reg, *out))) {
		kiln_ckpt_close(*out);
		*out = NULL;
	}
	return st;
}
