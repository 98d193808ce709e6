/* core/out_dir.c - whether [run] out_dir holds an earlier run, and
 * deleting that run's files (`kiln train --overwrite`).  A fresh run in a
 * used out_dir is refused otherwise (core/train_setup.c): its checkpoints
 * would join the old run's (and keep_last would delete the new ones, the
 * old run's steps being higher), metrics.jsonl would be truncated.  The
 * default out_dir, runs/latest, is the latest run by its name: a fresh run
 * there replaces the earlier one as --overwrite does (logged).  Also
 * trainer_write_file, the all-or-nothing write of out_dir's config.ini;
 * trainer_out_dir_lock, one run at a time in an out_dir; and
 * trainer_ckdir_check, the checkpoint directory tried at the start;
 * trainer_out_paths_check, the paths written at the end tried at the
 * start. */
#include "train.h"
#include "../plugins/common/cache_file.h" /* common_mkdirs */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h> /* PATH_MAX */
#include <stdio.h>
#include <stdlib.h> /* malloc */
#include <string.h> /* memcmp */
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The files a run writes into out_dir, and into its checkpoint
 * directories (docs/checkpoints.md, docs/logging.md, docs/profiler.md),
 * and the report `kiln report` writes beside them (docs/report.md). */
static const char *const run_files[] = {
	"metrics.jsonl", "train.csv", "eval.csv", "config.ini", "profile.txt", "trace.json",
	"events.out.tfevents.*", "report.html", NULL
};
static const char *const ckpt_files[] = { "ckpt-*.kiln", "ckpt-*.kiln.tmp", NULL };

static int matches(const char *name, const char *const *pats)
{
	for (int i = 0; pats[i]; i++)
		if (!fnmatch(pats[i], name, FNM_PERIOD))
			return 1;
	return 0;
}

/* Visit dir's entries that match pats: count them (del 0) or delete them
 * (del 1); with `in` (del 0), count only the regular files that are the
 * file `in` is (its device and inode: a deleted symlink would leave its
 * target).  A missing dir has none.  -1 (errno) when dir cannot be read or
 * an entry cannot be deleted; *first gets the first match's name. */
static int each_match(const char *dir, const char *const *pats, int del, const struct stat *in,
		      char *first, size_t fn)
{
	DIR *d = opendir(dir);
	char path[4400];
	int n = 0;
	if (!d)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
	for (struct dirent *e; (e = readdir(d));) {
		struct stat sb;
		if (!matches(e->d_name, pats))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		/* a run writes files: a directory (or socket...) of that name
		 * is not one, and its write fails later, naming it */
		if (lstat(path, &sb) || !(S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode)))
			continue;
		if (in && !(S_ISREG(sb.st_mode) && sb.st_dev == in->st_dev && sb.st_ino == in->st_ino))
			continue;
		if (!n++ && first)
			snprintf(first, fn, "%s", path);
		if (del && unlink(path) && errno != ENOENT) {
			int err = errno;
			closedir(d);
			snprintf(first, fn, "%s", path);
			errno = err;
			return -1;
		}
	}
	closedir(d);
	return n;
}

/* Count (del 0) or delete (del 1) the run files of out_dir, its
 * checkpoints and best checkpoints (with `in`: count those that are that
 * file, each_match); -1 on an error, naming the path in what. */
static int visit_run(const char *out_dir, const char *ckdir, int del, const struct stat *in,
		     char *what, size_t n)
{
	char best[4400];
	snprintf(best, sizeof best, "%s/best", ckdir);
	const char *dirs[3] = { out_dir, ckdir, best };
	int total = 0;
	what[0] = 0;
	for (int i = 0; i < 3; i++) {
		char first[4400] = "";
		int k = each_match(dirs[i], i ? ckpt_files : run_files, del, in, first,
				   sizeof first);
		if (k < 0) {
			snprintf(what, n, "%s: %s", first[0] ? first : dirs[i], strerror(errno));
			return -1;
		}
		if (k && !what[0])
			snprintf(what, n, "%s", first);
		total += k;
	}
	return total;
}

/* Is dir [run] out_dir's default (runs/latest): the latest run, which a
 * new one replaces without being asked? */
static int default_out_dir(const char *dir)
{
	for (const struct kiln_key *k = kiln_config_schema("run"); k && k->name; k++)
		if (!strcmp(k->name, "out_dir"))
			return k->def && !strcmp(k->def, dir);
	return 0;
}

/* [model] init_from (the file a fresh run reads its weights from, read
 * already) against the earlier run's files that the run is about to
 * delete: KILN_EUSAGE naming it when it is one of them (before session 39
 * `init_from = runs/latest/checkpoints/ckpt-20.kiln` in runs/latest, the
 * default out_dir, was loaded, then deleted with the run it belonged to:
 * the fine-tuned model's ckpt-20.kiln replaced the weights it started
 * from, exit 0).  The data and the caches are not checked: a run's files
 * are no data (a data file that were one would fail as data), and a cache
 * is made again; the config is, by trainer_config_kept. */
static kiln_status init_from_kept(const char *out_dir, const char *ckdir, int overwrite, int n,
				  const struct kiln_config *cfg)
{
	const char *init = cfg ? kiln_config_get(cfg, "model", "init_from") : NULL;
	struct stat in;
	char what[4400];
	if (!init || !*init || stat(init, &in) || !S_ISREG(in.st_mode))
		return KILN_OK;
	int k = visit_run(out_dir, ckdir, 0, &in, what, sizeof what);
	if (k <= 0) /* (an unreadable directory: the count failed already) */
		return KILN_OK;
	const int same = !strcmp(init, what);
	return kiln_error(KILN_EUSAGE, "%s: [model] init_from = %s%s%s%s is one of the earlier run's %d file(s) in '%s' that %s deletes before it writes its own: the weights this run starts from would be lost. Copy it out of the run directory and set init_from to the copy, pass --resume to continue that run instead, or choose another out_dir; nothing was changed",
			  kiln_config_where(cfg, "model", "init_from"), init, same ? "" : " (the file ",
			  same ? "" : what, same ? "" : ")", n, out_dir,
			  overwrite ? "--overwrite" : "a fresh run in the default out_dir (the latest run)");
}

/* Does out_dir hold a run that failed before it logged or saved anything
 * (a start on a full disk, a data error before step 1): an empty or no
 * metrics.jsonl and no checkpoint (checkpoints/, best/)?  A fresh run
 * replaces it as it replaces the default out_dir's (before session 40
 * its empty metrics.jsonl refused the same command run again as "an
 * earlier run"). */
static int logged_nothing(const char *out_dir, const char *ckdir)
{
	char path[4400], best[4400], first[8];
	struct stat sb;
	snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
	snprintf(best, sizeof best, "%s/best", ckdir);
	if (!lstat(path, &sb) && !(S_ISREG(sb.st_mode) && sb.st_size == 0))
		return 0;
	return !each_match(ckdir, ckpt_files, 0, NULL, first, sizeof first) &&
	       !each_match(best, ckpt_files, 0, NULL, first, sizeof first);
}

/* Whether each line of `have` (n bytes) is one of `text`'s, in order:
 * `text` with lines left out, none added or changed. */
static int lines_within(const char *have, size_t n, const char *text)
{
	const char *end = have + n;
	while (have < end) {
		const char *nl = memchr(have, '\n', (size_t)(end - have));
		const size_t l = nl ? (size_t)(nl - have) : (size_t)(end - have);
		for (;;) {
			const size_t tl = strcspn(text, "\n");
			if (!*text)
				return 0;
			const int same = tl == l && !memcmp(text, have, l);
			text += tl + (text[tl] == '\n');
			if (same)
				break;
		}
		have += l + 1;
	}
	return 1;
}

/* Whether file `path`'s lines are `text`'s, some perhaps left out
 * (lines_within). */
static int file_within(const char *path, const char *text)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat sb;
	char *buf = NULL;
	int within = 0;
	if (fd >= 0 && !fstat(fd, &sb) && S_ISREG(sb.st_mode) && sb.st_size <= (off_t)strlen(text) &&
	    (buf = malloc((size_t)sb.st_size + 1)) &&
	    read(fd, buf, (size_t)sb.st_size + 1) == (ssize_t)sb.st_size)
		within = lines_within(buf, (size_t)sb.st_size, text);
	free(buf);
	if (fd >= 0)
		close(fd);
	return within;
}

/* Whether config file `file` is a resolved config, as kiln writes one (a
 * run's config.ini: every key, "; key = (unset)" the one comment, a blank
 * line after each section, no header): each of its lines one of its own
 * resolved text's, in order.  Lines may be missing (a key added to the
 * schema since an older run wrote it: its config.ini resumes, as before
 * session 50), none may be added (a comment, a blank line of the user's,
 * a key written otherwise).  Writing the run's resolved config over it
 * loses nothing the user wrote. */
static int resolved_form(const char *file, const struct kiln_registry *reg)
{
	struct kiln_config *c = NULL;
	char *text = NULL;
	int same = 0;
	kiln_status st = kiln_config_load(file, &c);
	if (!st && !(st = kiln_config_validate(c, (struct kiln_registry *)reg)) &&
	    (text = kiln_ckpt_config_text(c, reg)))
		same = file_within(file, text);
	free(text);
	kiln_config_free(c);
	kiln_clear_error(); /* (a failure only means "not that form") */
	return same;
}

kiln_status trainer_config_kept(const char *out_dir, const char *ckdir,
				const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	const char *file = kiln_config_file(cfg);
	struct stat in;
	char what[4400];
	if (!file || stat(file, &in) || !S_ISREG(in.st_mode) ||
	    visit_run(out_dir, ckdir, 0, &in, what, sizeof what) <= 0 || resolved_form(file, reg))
		return KILN_OK;
	return kiln_error(KILN_EUSAGE, "%s: the config is [run] out_dir's %s, a file the run writes (its resolved config, after deleting an earlier run's): it would be replaced. Keep the config outside the run's files (rename it, or move it out of '%s'), or choose another out_dir; nothing was changed",
			  file, what, out_dir);
}

kiln_status trainer_out_dir_check(const char *out_dir, const char *ckdir, int overwrite,
				  const struct kiln_config *cfg)
{
	char what[4400];
	int n = visit_run(out_dir, ckdir, 0, NULL, what, sizeof what);
	if (n < 0)
		return kiln_error(KILN_EIO, "[run] out_dir: cannot read %s", what);
	if (!n)
		return KILN_OK;
	if (!overwrite && !default_out_dir(out_dir) && !logged_nothing(out_dir, ckdir))
		return kiln_error(KILN_EUSAGE, "[run] out_dir '%s' holds an earlier run (%d file(s), e.g. %s): pass --resume to continue it, --overwrite (train.overwrite=1) to delete its files and start afresh, or choose another out_dir; nothing was changed",
				  out_dir, n, what);
	return init_from_kept(out_dir, ckdir, overwrite, n, cfg);
}

kiln_status trainer_out_dir_clear(const char *out_dir, const char *ckdir, int overwrite)
{
	char what[4400];
	int n = visit_run(out_dir, ckdir, 1, NULL, what, sizeof what);
	if (n < 0)
		return kiln_error(KILN_EIO, "--overwrite: cannot delete %s", what);
	if (!n)
		return KILN_OK;
	kiln_log(KILN_LOG_WARN, "train", "%s: deleted the earlier run's %d file(s) in %s (metrics, logs, config.ini, checkpoints)",
		 overwrite ? "--overwrite" :
		 default_out_dir(out_dir) ? "[run] out_dir is the default, the latest run" :
		 "the earlier run logged nothing and saved no checkpoint (a failed start)", n,
		 out_dir);
	return KILN_OK;
}

kiln_status trainer_out_dir_lock(const char *out_dir, int *fd)
{
	char path[4400];
	*fd = -1;
	if (common_mkdirs(out_dir, 0777, 1))
		return kiln_error(KILN_EIO, "[run] out_dir '%s': cannot create: %s", out_dir,
				  strerror(errno));
	snprintf(path, sizeof path, "%s/.kiln.lock", out_dir);
	int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (f < 0)
		return kiln_error(KILN_EIO, "[run] out_dir '%s': cannot create %s: %s", out_dir, path,
				  strerror(errno));
	if (!flock(f, LOCK_EX | LOCK_NB)) {
		*fd = f;
		return KILN_OK;
	}
	int err = errno;
	close(f);
	if (err == EWOULDBLOCK)
		return kiln_error(KILN_EIO, "[run] out_dir '%s' is in use: another kiln holds it (its lock %s); wait for that run to end, or choose another out_dir",
				  out_dir, path);
	kiln_log(KILN_LOG_WARN, "train", "%s: cannot lock (%s): nothing keeps another kiln out of this out_dir",
		 path, strerror(err));
	return KILN_OK;
}

kiln_status trainer_ckdir_check(const char *ckdir)
{
	struct stat sb;
	if (common_mkdirs(ckdir, 0777, 1) || stat(ckdir, &sb))
		return kiln_error(KILN_EIO, "%s: cannot create the checkpoint directory: %s", ckdir,
				  strerror(errno));
	if (!S_ISDIR(sb.st_mode))
		return kiln_error(KILN_EIO, "%s: cannot create the checkpoint directory: a file of that name is in the way",
				  ckdir);
	if (access(ckdir, W_OK | X_OK))
		return kiln_error(KILN_EIO, "%s: cannot write checkpoints into it: %s", ckdir,
				  strerror(errno));
	/* the longest name a checkpoint is written under, its step's largest */
	size_t longest = strlen(ckdir) + strlen("/ckpt-9223372036854775807.kiln.tmp");
	if (longest >= PATH_MAX)
		return kiln_error(KILN_EIO, "%s: cannot write checkpoints into it: %s (a checkpoint's path would be up to %zu characters, PATH_MAX is %d)",
				  ckdir, strerror(ENAMETOOLONG), longest, PATH_MAX);
	return KILN_OK;
}

/* What out_dir's lock file (without the lock held, out_dir itself) is
 * now: 0, or -1 when it is gone. */
static int out_dir_id(const struct trainer *t, struct stat *sb)
{
	char path[4400];
	snprintf(path, sizeof path, "%s/.kiln.lock", t->run.out_dir);
	return stat(t->out_lock >= 0 ? path : t->run.out_dir, sb);
}

void trainer_out_dir_note(struct trainer *t)
{
	struct stat sb;
	t->out_watch = 0;
	if ((t->out_lock >= 0 ? fstat(t->out_lock, &sb) : out_dir_id(t, &sb)))
		return;
	t->out_dev = sb.st_dev;
	t->out_ino = sb.st_ino;
	t->out_watch = 1;
}

/* The loggers reopened in the recreated out_dir, metrics.jsonl with the
 * lines written so far (before session 34 they were lost: the run held
 * the removed file open, and the new one started at the loss), copied
 * from the removed file still open; a copy that fails is logged, its
 * message in lost (empty when none), and the run goes on. */
static kiln_status loggers_reopen(struct trainer *t, char *lost, size_t n)
{
	lost[0] = 0;
	if (kiln_loggers_carry(t->log, t->run.out_dir)) {
		snprintf(lost, n, "%s", kiln_last_error());
		kiln_log(KILN_LOG_ERROR, "train", "%s: the lines written before the loss are not all in the recreated metrics.jsonl", lost);
	}
	/* (the old loggers' files are gone with the directory: their close
	 * has nothing to lose) */
	(void)kiln_loggers_close(t->log);
	t->log = NULL;
	return kiln_loggers_open(t->cfg, t->run.out_dir, 1, t->step, &t->log);
}

/* out_dir as it was at the start, recreated: the lock, config.ini and the
 * loggers (loggers_reopen; lost: as there). */
static kiln_status out_dir_recreate(struct trainer *t, char *lost, size_t n)
{
	char path[4400];
	kiln_status st;
	if (t->out_lock >= 0)
		close(t->out_lock);
	t->out_lock = -1;
	if ((st = trainer_out_dir_lock(t->run.out_dir, &t->out_lock)))
		return st;
	trainer_out_dir_note(t);
	snprintf(path, sizeof path, "%s/config.ini", t->run.out_dir);
	if ((st = trainer_write_file(path, t->config_text, strlen(t->config_text))))
		return st;
	return loggers_reopen(t, lost, n);
}

kiln_status trainer_out_dir_watch(struct trainer *t)
{
	struct stat sb;
	char lost[1024];
	if (t->rank || !t->out_watch || t->res->out_dir_lost)
		return KILN_OK;
	const int gone = out_dir_id(t, &sb) != 0;
	if (!gone && sb.st_dev == t->out_dev && sb.st_ino == t->out_ino)
		return KILN_OK;
	const char *od = t->run.out_dir;
	kiln_log(KILN_LOG_ERROR, "train", "the run directory %s was removed, renamed or replaced while this run wrote into it (its lock %s/.kiln.lock is %s): recreating it (the lock, config.ini, metrics.jsonl with the lines written so far) to write a checkpoint of this step there, then stopping (exit 4); the checkpoints and other logs written before are gone with it",
		 od, od, gone ? "gone" : "another file");
	t->res->out_dir_lost = 1;
	kiln_status st = out_dir_recreate(t, lost, sizeof lost);
	if (st)
		return kiln_error_wrap(st, "the run directory %s was removed mid-run and cannot be recreated", od);
	snprintf(t->out_lost, sizeof t->out_lost, "the run directory %.600s was removed or replaced mid-run (recreated)", od);
	kiln_train_request_stop_cause(t->out_lost);
	/* (lost names the recreated metrics.jsonl: its path's bytes as
	 * out_dir's, U+FFFD for those that are not UTF-8; packed with "s"
	 * before session 40, the record was left out in a Latin-1 out_dir) */
	if (lost[0])
		trainer_jsonl(t, "{s:s, s:I, s:o, s:o}", "event", "out_dir_lost", "step",
			      (json_int_t)t->step, "out_dir", trainer_json_text(od), "lines_lost",
			      trainer_json_text(lost));
	else
		trainer_jsonl(t, "{s:s, s:I, s:o}", "event", "out_dir_lost", "step",
			      (json_int_t)t->step, "out_dir", trainer_json_text(od));
	return KILN_OK;
}

kiln_status trainer_out_paths_check(const char *ckdir, int best, const struct kiln_profile *prof,
				    const char *out_dir)
{
	char path[4400];
	struct stat sb;
	snprintf(path, sizeof path, "%s/best", ckdir);
	if (best && !lstat(path, &sb) && !S_ISDIR(sb.st_mode) &&
	    (stat(path, &sb) || !S_ISDIR(sb.st_mode)))
		return kiln_error(KILN_EIO, "%s: [train] keep_best cannot create its checkpoint directory there: a file of that name is in the way; move it, or choose another out_dir",
				  path);
	return kiln_profile_check_out(prof, out_dir);
}

/* kiln_file_write's fill: the text of a struct text_out. */
struct text_out {
	const char *text;
	size_t n;
};

static int fill_text(FILE *fp, void *ctx)
{
	const struct text_out *t = ctx;
	return fwrite(t->text, 1, t->n, fp) == t->n ? 0 : errno ? errno : EIO;
}

kiln_status trainer_write_file(const char *path, const char *text, size_t n)
{
	/* kiln_file_write: the temporary fsynced before its rename, and the
	 * directory after (before session 33 config.ini.tmp was renamed
	 * unsynced: a power cut could leave an empty config.ini), a killed
	 * run's temporary removed by the next */
	struct text_out t = { text, n };
	kiln_status st = kiln_run_file_check(path);
	if (st)
		return st;
	int err = kiln_file_write(path, fill_text, &t);
	if (!err)
		return KILN_OK;
	return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(err));
}
