/* cli/cli.h - shared pieces of the `kiln` command. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <kiln/kiln.h>
#include <stdio.h>

/* Print "kiln: error: <last error>" and return the exit code for st. */
int cli_fail(kiln_status st);
/* Seconds of CLOCK_MONOTONIC: progress lines, timings, deadlines. */
double cli_now_s(void);
/* ulimit -n back to what kiln was started with (kiln.c raises the soft
 * limit to the hard one for the shards it keeps open): before running
 * another program.  Async-signal-safe (one setrlimit). */
void cli_open_files_limit_restore(void);

/* Load FILE, apply the overrides among argv[first..argc) (every argument
 * containing '=' that is not an option), open the registry with
 * [run] plugin_path, and validate.  Options (--x) are left to the caller. */
kiln_status cli_load(const char *file, int argc, char **argv, int first,
		     struct kiln_config **cfg, struct kiln_registry **reg);

/* cli_load, where only argv[first..typed) are the user's overrides, the
 * rest the command's own (cmd_train's --resume, --overwrite, a restart's
 * train.overwrite=0): only the user's are told when they set a key again. */
kiln_status cli_load_typed(const char *file, int argc, char **argv, int first, int typed,
			   struct kiln_config **cfg, struct kiln_registry **reg);

int cmd_train(int argc, char **argv);
int cmd_config(int argc, char **argv);
int cmd_plugins(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_comm(int argc, char **argv); /* argv[1] is "comm" */
void bench_comm_usage_print(void);
int cmd_memory(int argc, char **argv);
int cmd_pack(int argc, char **argv);
/* kiln pack --format tokens: text files into token shards (pack_tokens.c) */
int cmd_pack_tokens(int argc, char **argv);
/* An option of kiln pack that the other formats take: 1 after "kiln:
 * error: OPT goes only with --format tokens" (tokens = 0: a's option is
 * one of --format tokens') or "... only with --format records or folder"
 * (tokens = 1), 0 when a is no option of theirs (then "unknown option").
 * Before session 36 both said "unknown option". */
int pack_option_elsewhere(const char *a, int tokens);
/* kiln pack's steps that every format takes (pack_dir.c).  fsync DIR. */
kiln_status pack_sync_dir(const char *dir);
/* Create DIR/<split><partial> (".krec-partial", ".bin-partial"), then sync
 * DIR: while it exists, readers refuse the split (its shards are being
 * written or placed).  pack_unmark_partial syncs DIR (the shards' names),
 * removes it and syncs DIR again. */
kiln_status pack_mark_partial(const char *dir, const char *split, const char *partial);
kiln_status pack_unmark_partial(const char *dir, const char *split, const char *partial);
/* Remove DIR/<split>-*<suffix>.tmp, what a pack of the split killed while
 * writing left (SIGTERM, SIGKILL), saying how many on stderr; returns how
 * many. */
int pack_remove_stale_tmp(const char *dir, const char *split, const char *suffix);
/* The id a pack records in its split's shards (docs/formats.md): content,
 * the CRC32C of what was packed, continued over the n shards' sizes
 * (records or tokens in each, u64 little-endian, in shard order).  The
 * sizes are in it because the content alone does not tell where the
 * shards are cut: two packs of the same data into as many shards of
 * other sizes (--shard-size 200K and 195K) would have one id, and a
 * directory mixing their shards would read some samples twice, others
 * not at all, with no error.  Since session 34. */
uint32_t pack_id(uint32_t content, const uint64_t *sizes, int n);
/* Hold DIR's lock (flock on the directory, exclusive) until the process
 * ends: a second kiln pack into the same --out is refused (KILN_EUSAGE)
 * rather than removing the first one's *.tmp or mixing their shards.  A
 * file system that cannot lock: a warning, KILN_OK. */
kiln_status pack_lock_out(const char *dir);
int cmd_export(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_summary(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_predict(int argc, char **argv);

/* The help of the commands whose --help (or -h) the dispatcher answers
 * (kiln.c): `usage`, a blank line, then `about`. */
extern const char cmd_train_usage[], cmd_train_about[];
extern const char cmd_eval_usage[], cmd_eval_about[];
extern const char cmd_quantize_usage[], cmd_quantize_about[];
extern const char cmd_config_usage[], cmd_config_about[];
extern const char cmd_plugins_usage[], cmd_plugins_about[];
extern const char cmd_memory_usage[], cmd_memory_about[];
extern const char cmd_pack_usage[], cmd_pack_about[];
extern const char cmd_summary_usage[], cmd_summary_about[];
extern const char cmd_report_usage[], cmd_report_about[];
extern const char cmd_generate_usage[], cmd_generate_about[];
extern const char cmd_predict_usage[], cmd_predict_about[];

/* The rendezvous store's shared secret for ranks this process starts on
 * this machine (kiln launch, kiln bench comm): leaves KILN_STORE_TOKEN or
 * KILN_STORE_TOKEN_FILE when either is set, else puts a fresh random one
 * in KILN_STORE_TOKEN, which the ranks inherit.  0, or an errno. */
int cli_store_token(void);

/* Print s as a JSON string literal (quoted, escaped; each byte that is not
 * part of well-formed UTF-8, as a file name may have, as \ufffd). */
void cli_json_str(FILE *f, const char *s);
/* 1 when stdout can no longer be written (an earlier write failed, or a
 * flush now fails: `kiln predict | head` after head exited, EPIPE), its
 * errno kept for check_stdout's message; 0 after flushing it.  A command
 * printing row after row checks it after each batch and stops, returning
 * 1 without a message of its own (before session 36 predict and generate
 * ran the whole input into a closed pipe). */
int cli_stdout_lost(void);
/* Whether stderr takes a progress line redrawn in place ("\r\033[K"):
 * a terminal, but not TERM=dumb (Emacs' shell, some CI consoles), which
 * shows the escapes (before session 36 it got them). */
int cli_redraws(void);
/* Print v with the printf format fmt (one double), or null when it is
 * not finite: JSON has no inf or NaN (as metrics.jsonl and predict). */
void cli_json_num(FILE *f, const char *fmt, double v);
/* Print s as a CSV field (quoted when it holds a comma, quote or newline). */
void cli_csv_str(FILE *f, const char *s);

int cli_wants_help(int argc, char **argv);

/* The rule for a file the user names (docs: README.md, "Exit codes"): one
 * that does not exist is a usage error (exit 2), as a missing CONFIG, image
 * or run directory always was; one that exists but cannot be read fails
 * later (KILN_EIO, exit 1); one that is not what it should be is a data
 * error (exit 3).  KILN_EUSAGE "WHAT PATH: no such file" when path is set
 * and names nothing (ENOENT, ENOTDIR), else KILN_OK.  Before session 36 a
 * missing --checkpoint, --vocab or [model] init_from was exit 1 and a
 * missing text file of `pack --format tokens` exit 3.  "" (an empty name):
 * KILN_EUSAGE too (": cannot open" before session 39); so is a directory
 * ("WHAT PATH: a directory, not a file", for "checkpoint" with a hint;
 * before session 50 exit 1 or 3, after the model was built). */
kiln_status cli_named_file(const char *what, const char *path);
/* An output option given as "" (`--onnx=`): "kiln: error: OPT needs a
 * file name" and 1 (the caller exits 2 before any work); else 0. */
int cli_empty_out(const char *opt, const char *path);

/* argv[1] is a FILE and every later argument an override (has '='); else
 * print the error (cli_bad_arg) and `usage`, and return 0. */
int cli_args_ok(int argc, char **argv, const char *usage);

/* The commands' options: `--name VALUE` or `--name=VALUE`.
 * 1 when argv[*i] is option `name` with a value: *val is the value and *i
 * is advanced past it; 0 when argv[*i] is not `name`; -1, after
 * "kiln: error: NAME needs a value", when nothing follows it, or after
 * "kiln: error: NAME given twice" when an earlier argument was `name`.
 * `name` may list aliases, "--nproc|-n": each matches, the first is the
 * option's name (twice is any two of them: "--nproc given twice"); the
 * other messages name the one given.  Every command's parser, kiln
 * launch's and kiln pack's included (their own loops before session 33). */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* As cli_opt for an option that may be given several times, each its own
 * value (`kiln generate --prompt A --prompt B`): never "given twice". */
int cli_opt_repeat(int argc, char **argv, int *i, const char *name, const char **val);
/* A flag, an option without a value (`--force`): 1 when argv[i] is
 * `name` (aliases as cli_opt's), 0 when it is not, -1 after "kiln: error:
 * NAME takes no value ('ARG')" for `name=...`.  A flag given twice is
 * the flag. */
int cli_flag(char **argv, int i, const char *name);
/* Called when a parser matched option `name` at argv[i]: the index of
 * another argument of argv matched as `name` before, else 0 (and this one
 * is remembered; a value that spells an option is never matched, so never
 * counted).  cli_opt refuses a value option given twice with it ("kiln:
 * error: NAME given twice", -1): the second replaced the first. */
int cli_opt_seen(char **argv, int i, const char *name);
/* As cli_opt for an integer option: -1 also, after "kiln: error: NAME
 * 'VALUE': expected an integer in [lo, hi]", when the value is not a whole
 * decimal integer in [lo, hi]. */
int cli_opt_int(int argc, char **argv, int *i, const char *name, long long lo, long long hi,
		long long *out);
/* An argument no option or override matches: "kiln: error: unknown option
 * 'A'" for one that starts with '-', else "unexpected argument 'A'".  The
 * caller prints its usage after it. */
void cli_bad_arg(const char *a);
/* As cli_bad_arg for argv[i], in the words of the command's `usage`: an
 * override to a command that takes none says so; `--flag=V` for a flag of
 * the usage "takes no value"; an option of the usage before FILE says FILE
 * comes first; an unknown option lists the usage's options.  The caller
 * prints its usage after it. */
void cli_bad_arg_usage(int argc, char **argv, int i, const char *usage);

#endif
