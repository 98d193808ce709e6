/* cli/kiln.c - the `kiln` command: dispatch to subcommands.  Only cli/
 * decides exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data. */
#include "build-config.h"
#include "cli.h"

#include "../plugins/common/spin_rule.h" /* common_omp_env_defaults */
#include "../plugins/common/utf8.h" /* common_utf8_len: cli_json_str */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h> /* isfinite */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h> /* getrlimit, setrlimit(RLIMIT_STACK, RLIMIT_NOFILE) */
#include <sys/stat.h>     /* stat: cli_named_file */
#include <time.h>         /* clock_gettime: cli_now_s */
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kiln <command> [args]\n"
		"\n"
		"commands:\n"
		"  train FILE [section.key=value ...]   train the model FILE describes\n"
		"  train FILE --resume [...]            continue from the newest checkpoint of the run\n"
		"  eval FILE [--checkpoint CKPT] [...]  evaluate a checkpoint's weights on [data.eval]\n"
		"  predict FILE INPUT... [...]          classify images with a trained model's weights\n"
		"  quantize FILE --calibrate N --out Q  INT8 post-training quantization (kiln eval --quantized Q)\n"
		"  config FILE [section.key=value ...]  print the resolved config (defaults filled in)\n"
		"  config --doc                         print the reference of every key (markdown)\n"
		"  plugins [--path DIRS]                list plugin files and plugins found\n"
		"  bench data FILE [--batches N]        measure the data loader alone\n"
		"  bench comm [--nproc N] [...]         allreduce of kiln's communicators vs raw libraries\n"
		"  memory FILE [section.key=value ...]  what training FILE will allocate, from its plans\n"
		"  pack FILE --out DIR [options]        write [data]'s samples as records shards (.krec)\n"
		"  export FILE --safetensors OUT        write the model's weights (PyTorch names, layouts)\n"
		"  export FILE --onnx OUT               write the model as an ONNX graph with its weights\n"
		"  launch -n N [...] -- COMMAND...      start N ranks of a data-parallel run (kiln launch --help)\n"
		"  summary FILE [--batch N] [...]       the model's layers, output shapes, parameters, FLOPs\n"
		"  report RUN_DIR [-o FILE]             an HTML page of a run: curves, config, summary, memory\n"
		"  generate FILE --prompt T --tokens N  sample text from the trained model (key/value cached)\n"
		"\n"
		"`kiln <command> --help` describes one command; `kiln --version` prints kiln's\n"
		"version.  Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error,\n"
		"4 a training run stopped because its run directory was removed (kiln train).\n");
}

double cli_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_fail(kiln_status st)
{
	const char *msg = kiln_last_error();
	fprintf(stderr, "kiln: error: %s\n", *msg ? msg : kiln_status_name(st));
	return kiln_status_exit_code(st);
}

int cli_store_token(void)
{
	unsigned char r[32];
	char hex[2 * sizeof r + 1];
	const char *t = getenv("KILN_STORE_TOKEN"), *f = getenv("KILN_STORE_TOKEN_FILE");
	if ((t && *t) || (f && *f))
		return 0;
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
		return errno ? errno : EIO;
	for (size_t i = 0; i < sizeof r; i++)
		snprintf(hex + 2 * i, 3, "%02x", r[i]);
	return setenv("KILN_STORE_TOKEN", hex, 1) ? errno : 0;
}

void cli_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		int n;
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else if (*p < 0x80)
			fputc(*p, f);
		else if ((n = common_utf8_len(p))) {
			fwrite(p, 1, (size_t)n, f);
			p += n - 1;
		} else /* a byte of no well-formed sequence: U+FFFD, the replacement character */
			fputs("\\ufffd", f);
	}
	fputc('"', f);
}

void cli_json_num(FILE *f, const char *fmt, double v)
{
	if (isfinite(v))
		fprintf(f, fmt, v);
	else /* JSON has no inf or NaN: printf's "inf" and "-nan" broke the line */
		fputs("null", f);
}

void cli_csv_str(FILE *f, const char *s)
{
	if (!strpbrk(s, ",\"\n\r")) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

kiln_status cli_named_file(const char *what, const char *path)
{
	struct stat sb;
	if (path && !*path) /* ": cannot open" before session 39 */
		return kiln_error(KILN_EUSAGE, "%s%s\"\": an empty name: name a file", what, *what ? " " : "");
	if (path && !stat(path, &sb) && S_ISDIR(sb.st_mode)) /* exit 1 or 3, late, before session 50 */
		return kiln_error(KILN_EUSAGE, "%s%s%s: a directory, not a file%s", what,
				  *what ? " " : "", path,
				  strcmp(what, "checkpoint") ? "" :
				  " (name a checkpoint file, such as RUN_DIR/checkpoints/ckpt-<step>.kiln, or leave --checkpoint out for the newest usable one in [run] out_dir/checkpoints)");
	if (!path || !stat(path, &sb) || (errno != ENOENT && errno != ENOTDIR))
		return KILN_OK; /* there, or unreadable: the open says why (exit 1) */
	return kiln_error(KILN_EUSAGE, "%s%s%s: no such file", what, *what ? " " : "", path);
}

int cli_empty_out(const char *opt, const char *path)
{
	if (!path || *path)
		return 0;
	fprintf(stderr, "kiln: error: %s needs a file name\n", opt);
	return 1;
}

void cli_bad_arg(const char *a)
{
	if (a[0] == '-')
		fprintf(stderr, "kiln: error: unknown option '%s'\n", a);
	else
		fprintf(stderr, "kiln: error: unexpected argument '%s' (overrides look like train.lr=0.1)\n", a);
}

/* How `usage` names option a[0..n): 0 not at all, 1 with a value
 * ("--batch N", "--store raw|jpeg|png"), 2 as a flag ("[--fold]",
 * "--resume | --overwrite", "--doc" alone on its line). */
static int usage_option(const char *usage, const char *a, size_t n)
{
	for (const char *p = strstr(usage, "-"); p; p = strstr(p + 1, "-")) {
		if (strncmp(p, a, n) || (p > usage && !strchr("[ |", p[-1])) ||
		    isalnum((unsigned char)p[n]) || p[n] == '-' || p[n] == '_')
			continue;
		return p[n] == ' ' && p[n + 1] && !strchr("[|-\n", p[n + 1]) ? 1 : 2;
	}
	return 0;
}

/* The options `usage` names, "--batch, --path", into out ("" when none). */
static void usage_options(const char *usage, char *out, size_t n)
{
	size_t off = 0;
	out[0] = 0;
	for (const char *p = strstr(usage, "-"); p && off < n; p = strstr(p + 1, "-")) {
		size_t len = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
		if ((p > usage && !strchr("[ |", p[-1])) || len < 2)
			continue;
		char name[64];
		snprintf(name, sizeof name, "%.*s", (int)len, p);
		const char *seen = strstr(out, name);
		if (seen && (seen[len] == 0 || seen[len] == ','))
			continue;
		off += (size_t)snprintf(out + off, n - off, "%s%s", off ? ", " : "", name);
		p += len - 1;
	}
}

void cli_bad_arg_usage(int argc, char **argv, int i, const char *usage)
{
	const char *a = argv[i], *eq = strchr(a, '=');
	const char *cmd = strstr(usage, "kiln "), *end = cmd ? cmd + 5 + strcspn(cmd + 5, " \n") : NULL;
	const int cl = cmd ? (int)(end - cmd) : 0; /* "kiln summary" */
	const char *file = end && *end == ' ' ? end + 1 : ""; /* "FILE", "RUN_DIR" */
	const int fl = (int)strcspn(file, " \n[");
	char opts[400], standalone[96];
	if (a[0] != '-') {
		if (eq && !strstr(usage, "section.key=value"))
			fprintf(stderr, "kiln: error: unexpected argument '%s': %.*s takes no section.key=value overrides\n",
				a, cl, cmd);
		else
			cli_bad_arg(a);
		return;
	}
	const size_t n = eq ? (size_t)(eq - a) : strlen(a);
	const int kind = usage_option(usage, a, n);
	snprintf(standalone, sizeof standalone, "%.*s %.*s\n", cl, cmd, (int)n, a);
	if (kind == 2 && eq)
		fprintf(stderr, "kiln: error: %.*s takes no value ('%s')\n", (int)n, a, a);
	else if (kind && i == 1 && argc > 2 && cl && strstr(usage, standalone))
		fprintf(stderr, "kiln: error: %.*s %s takes no other argument ('%s')\n", cl, cmd, a,
			argv[2]);
	else if (kind && i == 1 && fl && fl < 20 && cl)
		fprintf(stderr, "kiln: error: option '%s' before %.*s: %.*s takes %.*s first (usage below)\n",
			a, fl, file, cl, cmd, fl, file);
	else if (kind)
		fprintf(stderr, "kiln: error: option '%s' is not taken here (usage below)\n", a);
	else {
		usage_options(usage, opts, sizeof opts);
		if (*opts)
			fprintf(stderr, "kiln: error: unknown option '%s' (%.*s takes %s)\n", a, cl, cmd, opts);
		else
			fprintf(stderr, "kiln: error: unknown option '%s' (%.*s takes no options)\n", a, cl, cmd);
	}
}

int cli_args_ok(int argc, char **argv, const char *usage)
{
	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-' || (i > 1 && !strchr(argv[i], '='))) {
			cli_bad_arg_usage(argc, argv, i, usage);
			fputs(usage, stderr);
			return 0;
		}
	if (argc < 2) {
		fputs(usage, stderr);
		return 0;
	}
	return 1;
}

int cli_opt_seen(char **argv, int i, const char *name)
{
	/* the options the parsers matched, by argv and index: rescanning argv
	 * took a value that spells an option (`--prompt --checkpoint`) for
	 * the option; a second parse of the same argv finds its own index */
	static struct {
		char **argv;
		int i;
		char name[48];
	} seen[64];
	static int n_seen;
	for (int k = 0; k < n_seen; k++)
		if (seen[k].argv == argv && seen[k].i != i && !strcmp(seen[k].name, name))
			return seen[k].i;
	if (n_seen < (int)(sizeof seen / sizeof *seen) && strlen(name) < sizeof seen[0].name) {
		seen[n_seen].argv = argv, seen[n_seen].i = i;
		snprintf(seen[n_seen].name, sizeof seen[0].name, "%s", name);
		n_seen++;
	}
	return 0;
}

/* The length of argv[i]'s option name when it is one of `names` (aliases
 * separated by '|': "--nproc|-n"), alone or before '=', else 0. */
static size_t opt_match(const char *arg, const char *names)
{
	for (const char *p = names; *p;) {
		const char *bar = strchr(p, '|');
		const size_t n = bar ? (size_t)(bar - p) : strlen(p);
		if (n && !strncmp(arg, p, n) && (!arg[n] || arg[n] == '='))
			return n;
		p += n + (bar != NULL);
	}
	return 0;
}

/* cli_opt, and cli_opt_repeat where `repeat`. */
static int opt_value(int argc, char **argv, int *i, const char *name, int repeat, const char **val)
{
	const size_t n = opt_match(argv[*i], name);
	const size_t first = strcspn(name, "|"); /* the name messages and cli_opt_seen use */
	char canon[48];
	if (!n)
		return 0;
	snprintf(canon, sizeof canon, "%.*s", (int)first, name);
	/* the last one silently won before session 31 (two --checkpoint) */
	if (!repeat && cli_opt_seen(argv, *i, canon)) {
		fprintf(stderr, "kiln: error: %s given twice: give it once\n", canon);
		return -1;
	}
	if (argv[*i][n] == '=') {
		*val = argv[*i] + n + 1;
		return 1;
	}
	if (*i + 1 >= argc) {
		fprintf(stderr, "kiln: error: %.*s needs a value\n", (int)n, argv[*i]);
		return -1;
	}
	*val = argv[++*i];
	return 1;
}

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
	return opt_value(argc, argv, i, name, 0, val);
}

int cli_opt_repeat(int argc, char **argv, int *i, const char *name, const char **val)
{
	return opt_value(argc, argv, i, name, 1, val);
}

int cli_flag(char **argv, int i, const char *name)
{
	const size_t n = opt_match(argv[i], name);
	if (n && argv[i][n] == '=') {
		fprintf(stderr, "kiln: error: %.*s takes no value ('%s')\n", (int)n, argv[i], argv[i]);
		return -1;
	}
	return n ? 1 : 0;
}

int cli_opt_int(int argc, char **argv, int *i, const char *name, long long lo, long long hi,
		long long *out)
{
	const char *v;
	char *end;
	const int at = *i; /* the option's own argument */
	int r = cli_opt(argc, argv, i, name, &v);
	if (r <= 0)
		return r;
	errno = 0;
	long long n = strtoll(v, &end, 10);
	if (end == v || *end || errno || n < lo || n > hi) {
		/* the name as given (-n or --nproc) */
		fprintf(stderr, "kiln: error: %.*s '%s': expected an integer in [%lld, %lld]\n",
			(int)opt_match(argv[at], name), argv[at], v, lo, hi);
		return -1;
	}
	*out = n;
	return 1;
}

int cli_wants_help(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return 1;
	return 0;
}

/* [run] plugin_path, when it may be trusted: given on the command line
 * (run.plugin_path=DIR), or in a config file with
 * KILN_ALLOW_CONFIG_PLUGIN_PATH=1 in the environment.  A config file's
 * alone is ignored with a warning: a config someone sends you must not
 * run their code (docs/plugins.md). */
static const char *trusted_plugin_path(const struct kiln_config *cfg)
{
	const char *path = kiln_config_get(cfg, "run", "plugin_path");
	const char *where = kiln_config_where(cfg, "run", "plugin_path");
	const char *allow = getenv("KILN_ALLOW_CONFIG_PLUGIN_PATH");
	if (!path || !*path || (where && !strncmp(where, "command line", 12)) ||
	    (allow && !strcmp(allow, "1")))
		return path;
	kiln_log(KILN_LOG_WARN, "core", "%s: [run] plugin_path = %s ignored: plugins load from a config file's directory only with KILN_ALLOW_CONFIG_PLUGIN_PATH=1 (or give run.plugin_path=%s on the command line, or set KILN_PLUGIN_PATH)",
		 where ? where : "config", path, path);
	return NULL;
}

/* The length of override a's "section.key" (before '=', trailing blanks
 * dropped). */
static size_t override_key_len(const char *a)
{
	size_t n = (size_t)(strchr(a, '=') - a);
	while (n && isspace((unsigned char)a[n - 1]))
		n--;
	return n;
}

/* A warning when override argv[i] sets a key an earlier one set (before
 * session 50 the last one was taken without a word, where the same key
 * twice in a file is an error): the later one is taken, as before.  The
 * same text twice changes nothing: no word.  (cmd_train's own overrides,
 * past cli_load_typed's `typed`, are not checked.) */
static void override_repeated(int argc, char **argv, int first, int i)
{
	const size_t n = override_key_len(argv[i]);
	for (int j = first; j < i && j < argc; j++)
		if (argv[j][0] != '-' && strchr(argv[j], '=') && override_key_len(argv[j]) == n &&
		    !strncmp(argv[j], argv[i], n) && strcmp(argv[j], argv[i])) {
			kiln_log(KILN_LOG_WARN, "config", "command line '%s' sets %.*s again, after '%s': '%s' is taken",
				 argv[i], (int)n, argv[i], argv[j], argv[i]);
			return;
		}
}

kiln_status cli_load(const char *file, int argc, char **argv, int first,
		     struct kiln_config **cfg, struct kiln_registry **reg)
{
	return cli_load_typed(file, argc, argv, first, argc, cfg, reg);
}

kiln_status cli_load_typed(const char *file, int argc, char **argv, int first, int typed,
			   struct kiln_config **cfg, struct kiln_registry **reg)
{
	kiln_status st;
	*cfg = NULL;
	*reg = NULL;
	if ((st = kiln_config_load(file, cfg)))
		return st == KILN_EIO ? KILN_ECONFIG : st;
	for (int i = first; i < argc; i++) {
		if (argv[i][0] == '-' || !strchr(argv[i], '='))
			continue;
		if ((st = kiln_config_override(*cfg, argv[i])))
			return st;
		if (i < typed)
			override_repeated(argc, argv, first, i);
	}
	/* Check the fixed sections before loading plugins, so a typo in
	 * [run] plugin_path is reported as such. */
	if ((st = kiln_config_validate(*cfg, NULL)))
		return st;
	if ((st = kiln_registry_open(trusted_plugin_path(*cfg), reg)))
		return st;
	return kiln_config_validate(*cfg, *reg);
}

/* The subcommands: `kiln NAME ...` runs run(argc - 1, argv + 1), or, with
 * --help or -h among its arguments and help text here, prints usage, a
 * blank line and about. */
static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *usage, *about; /* NULL: run answers --help itself */
} commands[] = {
	{ "train", cmd_train, cmd_train_usage, cmd_train_about },
	{ "eval", cmd_eval, cmd_eval_usage, cmd_eval_about },
	{ "predict", cmd_predict, cmd_predict_usage, cmd_predict_about },
	{ "quantize", cmd_quantize, cmd_quantize_usage, cmd_quantize_about },
	{ "config", cmd_config, cmd_config_usage, cmd_config_about },
	{ "plugins", cmd_plugins, cmd_plugins_usage, cmd_plugins_about },
	{ "bench", cmd_bench, NULL, NULL },
	{ "memory", cmd_memory, cmd_memory_usage, cmd_memory_about },
	{ "pack", cmd_pack, cmd_pack_usage, cmd_pack_about },
	{ "export", cmd_export, NULL, NULL },
	{ "launch", cmd_launch, NULL, NULL },
	{ "summary", cmd_summary, cmd_summary_usage, cmd_summary_about },
	{ "report", cmd_report, cmd_report_usage, cmd_report_about },
	{ "generate", cmd_generate, cmd_generate_usage, cmd_generate_about },
};

static int run_command(const struct command *c, int argc, char **argv)
{
	if (c->usage && cli_wants_help(argc, argv)) {
		printf("%s\n%s", c->usage, c->about);
		return 0;
	}
	return c->run(argc, argv);
}

/* KILN_LOG_LEVEL = error | warn | info | debug: how much of the log reaches
 * stderr (default info).  -1 for another value (named in the message). */
static int log_level_from_env(void)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	const char *v = getenv("KILN_LOG_LEVEL");
	if (!v || !*v)
		return 0;
	for (int i = 0; i < 4; i++)
		if (!strcmp(v, names[i])) {
			kiln_log_set_level(KILN_LOG_ERROR + i);
			return 0;
		}
	fprintf(stderr, "kiln: error: KILN_LOG_LEVEL = '%s' is not one of error, warn, info, debug\n", v);
	return -1;
}

/* Fds 0-2 that the caller closed (`kiln train 2>&-`) reopened on
 * /dev/null, before anything opens a file: else the first files kiln opens
 * (its lock, metrics.jsonl) would take those numbers and receive the log
 * text and the output meant for stderr and stdout. */
static void reopen_closed_std_fds(void)
{
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
			int got = open("/dev/null", O_RDWR); /* the lowest free: fd */
			if (got > 2)
				close(got);
		}
}

/* The errno of the first failed flush of stdout cli_stdout_lost saw (0:
 * none): check_stdout's own flush may find the buffer already gone. */
static int stdout_err;

int cli_stdout_lost(void)
{
	const int failed = ferror(stdout); /* an earlier write: its errno is gone */
	errno = 0;
	if (!fflush(stdout)) {
		if (!failed)
			return 0;
	} else if (!stdout_err) { /* (a failed write's unwritten bytes stay: tried again) */
		stdout_err = errno ? errno : EIO;
	}
	return 1;
}

int cli_redraws(void)
{
	const char *term = getenv("TERM");
	return isatty(2) && !(term && !strcmp(term, "dumb"));
}

/* The command's exit code rc, or 1 when its standard output could not all
 * be written (a full disk, /dev/full): a cut-off output is a failure, named
 * here once for every command.  A reader that went away (`kiln predict |
 * head`: EPIPE, SIGPIPE being ignored) ends it quietly with 1. */
static int check_stdout(int rc)
{
	int bad = ferror(stdout), err = 0;
	errno = 0;
	if (fflush(stdout))
		bad = 1, err = errno;
	if (!bad)
		return rc;
	if (!err)
		err = stdout_err;
	if (err != EPIPE)
		fprintf(stderr, "kiln: error: writing standard output: %s\n",
			err ? strerror(err) : "an earlier write failed");
	return rc ? rc : 1;
}

/* The edit distance of a and b (insert, delete, replace, or swap two
 * neighbours: `trian` is 1 from `train`); 99 past 31 characters. */
static int cmd_distance(const char *a, const char *b)
{
	const size_t la = strlen(a), lb = strlen(b);
	int d[32][32];
	if (la > 31 || lb > 31)
		return 99;
	for (size_t i = 0; i <= la; i++)
		for (size_t j = 0; j <= lb; j++) {
			if (!i || !j) {
				d[i][j] = (int)(i + j);
				continue;
			}
			int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			v = d[i - 1][j] + 1 < v ? d[i - 1][j] + 1 : v;
			v = d[i][j - 1] + 1 < v ? d[i][j - 1] + 1 : v;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	return d[la][lb];
}

/* "unknown command 'trian'; did you mean 'train'?": the nearest command
 * within 2 edits (1 for a word of 4 letters or fewer), else no hint. */
static void unknown_command(const char *cmd)
{
	const char *best = NULL;
	int bd = strlen(cmd) <= 4 ? 2 : 3;
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
		const int d = cmd_distance(cmd, commands[i].name);
		if (d < bd)
			bd = d, best = commands[i].name;
	}
	fprintf(stderr, "kiln: error: unknown command '%s'", cmd);
	if (best)
		fprintf(stderr, "; did you mean '%s'?", best);
	fputs("\n\n", stderr);
}

static int dispatch(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(cmd, "--version")) {
		printf("kiln %s (plugin ABI %d.%d)\n", kiln_version(), KILN_ABI_MAJOR, KILN_ABI_MINOR);
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
		if (!strcmp(cmd, commands[i].name))
			return run_command(&commands[i], argc - 1, argv + 1);
	unknown_command(cmd);
	usage(stderr);
	return 2;
}

/* The least stack (ulimit -s) kiln runs with, and what it raises a lower
 * soft limit to.  With 64 KiB the main thread overflowed opening the CPU
 * device (SIGSEGV, nothing printed), and glibc gives every thread (the
 * loader's, the OpenMP team's) a stack of the soft limit, read as the
 * process starts: hence a re-exec, not a raise in place.  1 MiB is 8
 * times what the training path needed once its 64 KiB buffer moved to
 * the heap (plugins/cpu/tune_cache.c); 8 MiB is Linux's usual default. */
#define KILN_STACK_MIN (1024 * 1024)
#define KILN_STACK_RAISE (8 * 1024 * 1024)

/* A soft stack limit below KILN_STACK_MIN: raised (up to the hard limit)
 * and kiln run again with it (KILN_STACK_REEXEC marks the second run);
 * a hard limit below it is refused.  0 to go on, else an exit code. */
static int stack_limit_check(char **argv)
{
	const int again = getenv("KILN_STACK_REEXEC") != NULL;
	unsetenv("KILN_STACK_REEXEC"); /* kiln launch's ranks check their own */
	struct rlimit r;
	if (getrlimit(RLIMIT_STACK, &r) || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= KILN_STACK_MIN)
		return 0;
	const rlim_t want = r.rlim_max == RLIM_INFINITY || r.rlim_max > KILN_STACK_RAISE ? KILN_STACK_RAISE
											    : r.rlim_max;
	if (want < KILN_STACK_MIN || again) {
		char hard[32] = "unlimited";
		if (r.rlim_max != RLIM_INFINITY)
			snprintf(hard, sizeof hard, "%llu KiB", (unsigned long long)r.rlim_max / 1024);
		fprintf(stderr,
			"kiln: error: the stack limit is %llu KiB (ulimit -s; hard limit %s): kiln needs "
			"at least %d KiB: raise it (ulimit -s %d)\n",
			(unsigned long long)r.rlim_cur / 1024, hard, KILN_STACK_MIN / 1024, KILN_STACK_RAISE / 1024);
		return 1;
	}
	r.rlim_cur = want;
	if (setrlimit(RLIMIT_STACK, &r) || setenv("KILN_STACK_REEXEC", "1", 1)) {
		fprintf(stderr, "kiln: error: cannot raise the stack limit (ulimit -s) to %llu KiB: %s\n",
			(unsigned long long)want / 1024, strerror(errno));
		return 1;
	}
	execv("/proc/self/exe", argv);
	fprintf(stderr, "kiln: error: cannot run kiln again with the stack limit (ulimit -s) raised to %llu KiB: "
		"/proc/self/exe: %s; raise it yourself (ulimit -s %d)\n",
		(unsigned long long)want / 1024, strerror(errno), KILN_STACK_RAISE / 1024);
	return 1;
}

/* The soft limit of open files (ulimit -n) raised to the hard one: the
 * tokens source keeps every shard open while it reads it (one pread() a
 * window; mapping them let a file truncated in place kill the run with
 * SIGBUS), and a set of a few thousand shards passes the soft limit's
 * usual 1024 (records shards are mapped: their descriptors close at
 * open).  kiln uses poll(), never select(), so
 * descriptors past FD_SETSIZE are safe; systemd asks programs that need
 * many files to raise the soft limit themselves.  Best effort: a limit
 * left low is named by the shard whose open() fails (EMFILE). */
static struct rlimit nofile_before; /* the limit as kiln was started with it */
static int nofile_raised;

static void open_files_limit_raise(void)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur == r.rlim_max)
		return;
	nofile_before = r;
	r.rlim_cur = r.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &r))
		kiln_log(KILN_LOG_DEBUG, "cli", "cannot raise ulimit -n to its hard limit: %s",
			 strerror(errno));
	else
		nofile_raised = 1;
}

/* The other half of systemd's advice: the programs kiln starts get the
 * limit kiln was started with (a program that loops over every possible
 * descriptor, or uses select(), suffers from a soft limit of a container's
 * hard 2^20 or more; a reviewer's find, session 38).  A kiln it starts
 * raises its own again.  One system call: safe in a forked child. */
void cli_open_files_limit_restore(void)
{
	if (nofile_raised)
		setrlimit(RLIMIT_NOFILE, &nofile_before);
}

int main(int argc, char **argv)
{
	/* first: nothing has run yet on the stack it may replace */
	const int stack_rc = stack_limit_check(argv);
	if (stack_rc)
		return stack_rc;
	reopen_closed_std_fds();
	open_files_limit_raise();
	/* OpenMP waiters: spin briefly, then sleep, unless the user chose
	 * (common/spin_rule.h).  Must happen before any plugin loads the
	 * OpenMP runtime. */
	common_omp_env_defaults();
	/* A write to a closed socket or pipe is an error to report, not a
	 * signal that kills the run: Gloo's TCP pairs write with writev()
	 * (a thawed rank whose peer exited died of SIGPIPE instead of naming
	 * it), and a `kiln train | head` would lose the run with its reader.
	 * Python ignores SIGPIPE the same way, so PyTorch's Gloo does too. */
	signal(SIGPIPE, SIG_IGN);
	/* Likewise a write past `ulimit -f`: EFBIG, which the writers report
	 * naming the file (and remove their .tmp), not a silent death. */
	signal(SIGXFSZ, SIG_IGN);
	if (log_level_from_env())
		return 2;
	kiln_log(KILN_LOG_DEBUG, "cli", "OpenMP: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s",
		 getenv("OMP_WAIT_POLICY"), getenv("GOMP_SPINCOUNT"));
	return check_stdout(dispatch(argc, argv));
}
