/* cli/cmd_generate.c - `kiln generate CONFIG --prompt TEXT --tokens N`:
 * load CONFIG's model with its trained weights, encode the prompt with the
 * byte-level tokenizer (or GPT-2's BPE with --vocab and --merges), draw N
 * tokens with the key/value-cached decoder (core/generate.c) and print the
 * text, prompt included, to stdout as the tokens come (docs/generate.md);
 * --num-samples N: N texts decoded at once, each after a header line;
 * several prompts (--prompt repeated, --prompts FILE: session 45) one
 * after another on the one generator, each after a header line. */
#include "build-config.h"
#include "cli.h"
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cmd_generate_usage[] =
	"usage: kiln generate CONFIG [--prompt TEXT]... [--prompts FILE] --tokens N\n"
	"                     [--checkpoint CKPT]\n"
	"                     [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
	"                     [--num-samples N]\n"
	"                     [--vocab vocab.json --merges merges.txt] [section.key=value ...]\n";
const char cmd_generate_about[] =
	"Load the model CONFIG describes (a model on token sequences, [data] source =\n"
	"tokens; the sample shape and context come from the checkpoint, [data] not\n"
	"opened, else from [data]) with the weights of checkpoint CKPT (or of a weights file,\n"
	"safetensors or llm.c's, read as [model] init_from reads one), else of the\n"
	"newest usable checkpoint in [run] out_dir/checkpoints, else of\n"
	"[model] init_from (none of them: an error), feed the prompt's tokens (prefilled:\n"
	"up to 256 positions a run of the model) and draw N more, one at a time, with the\n"
	"attention layers' keys and values cached (the prefix is never recomputed).\n"
	"Prints the prompt and the new text to stdout.\n"
	"  --prompt TEXT    a prompt; given several times, each is generated from in\n"
	"                   turn by the one loaded model, each's text after a line\n"
	"                   '--- prompt J ---' (J from 1), the text a run of that prompt\n"
	"                   alone prints (the same seed for each)\n"
	"  --prompts FILE   the prompts FILE's lines hold, one a line (after those of\n"
	"                   --prompt; at least one of the two; a leading UTF-8 BOM is\n"
	"                   skipped); an empty line or a NUL byte is an error naming\n"
	"                   FILE:LINE\n"
	"  --temperature T  softmax(logits / T); 0 = greedy, the most likely token (default 1)\n"
	"  --top-k K        draw among the K most likely tokens only (default 0: all)\n"
	"  --top-p P        draw among the fewest most likely tokens (after --top-k) whose\n"
	"                   probabilities sum to P or more, 0 < P <= 1 (default 1: all)\n"
	"  --seed S         the draws' seed (default 1): the same seed, the same text\n"
	"  --num-samples N  N continuations of the prompt, decoded at once, each after a\n"
	"                   line '--- sample I ---' (I from 0) when N > 1; sample 0 is the\n"
	"                   text of N = 1 (default 1; docs/generate.md); the prompt is fed\n"
	"                   once; more than the device's memory holds: exit 2, naming the\n"
	"                   bytes they need and about how many fit\n"
	"  --vocab, --merges  GPT-2's vocab.json and merges.txt, as given to `kiln pack\n"
	"                   --format tokens`: byte-pair encoding; without: bytes (vocab 256)\n"
	"The prompt and the N new tokens must fit the context (the [data] context the\n"
	"model was trained on, as the checkpoint records it): there is no sliding window.\n"
	"Models with lstm or gru layers cannot be decoded yet.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

struct gen_opts {
	const char **prompts;   /* n_prompts of them: --prompt's, then --prompts' lines */
	size_t *lines;          /* each prompt's line in prompts_file, 0: a --prompt's */
	int n_prompts;
	const char *prompts_file, *ckpt, *vocab, *merges;
	char *file_text;        /* --prompts' file, its lines cut in place */
	long long tokens, samples;
	double top_p;
	struct kiln_sample_opts s;
};

/* A number option's value: 0 when it parses whole and lies in [lo, hi]
 * ((lo, hi] when open_lo). */
static int num_arg(const char *name, const char *v, double lo, double hi, int open_lo, double *out)
{
	char *end;
	*out = strtod(v, &end);
	if (end == v || *end || !((open_lo ? *out > lo : *out >= lo) && *out <= hi)) {
		fprintf(stderr, "kiln: error: %s '%s': expected a number in %c%g, %g]\n", name, v,
			open_lo ? '(' : '[', lo, hi);
		return -1;
	}
	return 0;
}

/* The options among argv[2..]; the overrides go to over[]. -1: usage error. */
static int gen_args(int argc, char **argv, struct gen_opts *o, char **over, int *n_over)
{
	long long top_k = 0, seed = 1;
	o->s.temperature = 1.0;
	o->top_p = 1.0;
	o->samples = 1;
	o->tokens = -1;
	for (int i = 2; i < argc; i++) {
		const char *temp = NULL, *top_p = NULL, *prompt = NULL;
		int r;
		if ((r = cli_opt_repeat(argc, argv, &i, "--prompt", &prompt)) ||
		    (r = cli_opt(argc, argv, &i, "--prompts", &o->prompts_file)) ||
		    (r = cli_opt(argc, argv, &i, "--checkpoint", &o->ckpt)) ||
		    (r = cli_opt(argc, argv, &i, "--vocab", &o->vocab)) ||
		    (r = cli_opt(argc, argv, &i, "--merges", &o->merges)) ||
		    (r = cli_opt_int(argc, argv, &i, "--tokens", 0, 1000000000, &o->tokens)) ||
		    (r = cli_opt(argc, argv, &i, "--temperature", &temp)) ||
		    (r = cli_opt_int(argc, argv, &i, "--top-k", 0, 1000000000, &top_k)) ||
		    (r = cli_opt(argc, argv, &i, "--top-p", &top_p)) ||
		    (r = cli_opt_int(argc, argv, &i, "--num-samples", 1, 1000000, &o->samples)) ||
		    (r = cli_opt_int(argc, argv, &i, "--seed", 0, 9007199254740992LL, &seed))) {
			if (r < 0 || (temp && num_arg("--temperature", temp, 0, 1e6, 0, &o->s.temperature)) ||
			    (top_p && num_arg("--top-p", top_p, 0, 1, 1, &o->top_p)))
				return -1;
			if (prompt) /* (o->prompts holds argc) */
				o->prompts[o->n_prompts++] = prompt;
		} else if (argv[i][0] == '-' || !strchr(argv[i], '=')) {
			cli_bad_arg_usage(argc, argv, i, cmd_generate_usage);
			return -1;
		} else {
			over[(*n_over)++] = argv[i];
		}
	}
	o->s.top_k = top_k;
	o->s.seed = (uint64_t)seed;
	if ((!o->n_prompts && !o->prompts_file) || o->tokens < 0) {
		fprintf(stderr, "kiln: error: --prompt TEXT (or --prompts FILE) and --tokens N are required\n");
		return -1;
	}
	if (!o->vocab != !o->merges) {
		fprintf(stderr, "kiln: error: --vocab and --merges go together (GPT-2's vocab.json and merges.txt)\n");
		return -1;
	}
	return 0;
}

/* What is printed: sample 0's prompt before its first new token (so a
 * failure before it prints nothing), then each of its tokens as it is
 * drawn; with several samples each after a line "--- sample I ---", the
 * others (drawn at the same time) once all are drawn (print_samples). */
struct printer {
	const struct tokenizer *tk;
	const char *prompt;
	long long samples;
	int started;
	long long drawn; /* new tokens printed */
};

/* Sample i's header line (several samples) and prompt. */
static void print_start(const struct printer *pr, long long i)
{
	if (pr->samples > 1)
		printf("--- sample %lld ---\n", i);
	fputs(pr->prompt, stdout);
}

static void print_prompt(struct printer *pr)
{
	if (!pr->started)
		print_start(pr, 0);
	pr->started = 1;
}

static kiln_status print_piece(const struct printer *pr, int32_t id)
{
	size_t n;
	const char *piece = tokenizer_piece(pr->tk, id, &n);
	if (!piece)
		return kiln_error(KILN_EDATA, "token %d is not in the tokenizer's vocabulary", id);
	fwrite(piece, 1, n, stdout);
	return KILN_OK;
}

static kiln_status print_token(void *user, int64_t sample, int32_t id)
{
	struct printer *pr = user;
	kiln_status st;
	if (sample) /* printed whole when all are drawn */
		return KILN_OK;
	print_prompt(pr);
	if ((st = print_piece(pr, id)))
		return st;
	pr->drawn++;
	/* the reader gone (`| head -c 100`): stop drawing (cmd_generate
	 * exits 1, check_stdout says why; before session 36 every token was
	 * drawn into the closed pipe) */
	if (cli_stdout_lost())
		return kiln_error(KILN_EIO, "standard output cannot be written: stopped after %lld new tokens", pr->drawn);
	return KILN_OK;
}

/* Samples 1.. of out[sample * n_new + k], after sample 0 and its newline. */
static kiln_status print_samples(const struct printer *pr, const int32_t *out, long long n_new)
{
	kiln_status st;
	for (long long i = 1; i < pr->samples; i++) {
		print_start(pr, i);
		for (long long k = 0; k < n_new; k++)
			if ((st = print_piece(pr, out[i * n_new + k])))
				return st;
		fputc('\n', stdout);
		if (cli_stdout_lost())
			return kiln_error(KILN_EIO, "standard output cannot be written: stopped at sample %lld of %lld", i, pr->samples);
	}
	return KILN_OK;
}

/* Draw only ids the tokenizer has: none past its largest (a padded V)
 * and none in a gap among its ids (a vocab.json without some; before
 * session 40 such an id was drawn, and printing it failed midway with
 * exit 3).  The generator draws below the loss's classes besides
 * (kiln_generator_classes). */
static kiln_status allow_tokenizer(struct kiln_generator *g, const struct tokenizer *tk)
{
	const int32_t n = tokenizer_vocab(tk);
	const int64_t classes = kiln_generator_classes(g);
	uint8_t *ok = malloc((size_t)n);
	size_t len;
	if (!ok)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int32_t i = 0; i < n; i++)
		ok[i] = tokenizer_piece(tk, i, &len) != NULL;
	kiln_status st = kiln_generator_allow(g, ok, n);
	free(ok);
	if (!st && classes < n)
		kiln_log(KILN_LOG_INFO, "generate", "drawing ids below %lld, the loss layer's classes (the tokenizer has %d): the model's other outputs were never trained",
			 (long long)classes, n);
	return st;
}

/* The byte-level tokenizer (no --vocab) on a model of more than 256
 * classes: most likely one trained on GPT-2's byte-pair tokens, whose
 * ids below 256 are its single bytes: the text would be drawn from 256
 * of its outputs and read as bytes, silently (before session 41). */
static void bytes_warn(const struct kiln_generator *g)
{
	const int64_t classes = kiln_generator_classes(g);
	if (classes > 256)
		kiln_log(KILN_LOG_WARN, "generate", "the model has %lld classes, the byte-level tokenizer 256 (no --vocab): a model trained on byte-pair tokens (`kiln pack --format tokens --vocab`) decodes as bytes here, not as its text; give the --vocab and --merges it was packed with (a byte-level model with a padded output: set [layer.loss] classes = 256 where it trains, or generate from its exported weights, `kiln export --safetensors W` then --checkpoint W, with classes = 256)",
			 (long long)classes);
}

/* Every prompt id below the classes the model was trained on: one past
 * them (a byte >= [layer.loss] classes) reads an embedding row training
 * never taught (before session 41 it was fed, silently).  The first
 * such token, by its position and text, is KILN_EUSAGE. */
static kiln_status prompt_in_classes(const struct token_ids *ids, const struct tokenizer *tk,
				     int64_t classes)
{
	for (size_t i = 0; i < ids->n; i++) {
		if (ids->v[i] < classes)
			continue;
		size_t n;
		const char *piece = tokenizer_piece(tk, ids->v[i], &n);
		int shown = piece && n < 40;
		for (size_t k = 0; shown && k < n; k++)
			shown = piece[k] >= 0x20 && piece[k] < 0x7f;
		return kiln_error(KILN_EUSAGE, "--prompt: token %zu%s%.*s%s is id %d, not below the model's %lld classes ([layer.loss] classes): no training taught it (the ids a model reads and draws are those below its classes); leave it out of the prompt",
				  i, shown ? " ('" : "", shown ? (int)n : 0, shown ? piece : "",
				  shown ? "')" : "", ids->v[i], (long long)classes);
	}
	return KILN_OK;
}

/* The checks of one prompt's token ids: it fits the context with the new
 * tokens (no sliding window) and is not empty (classes: then its ids are
 * below the model's classes, prompt_in_classes, too). */
static kiln_status prompt_check(const struct kiln_generator *g, const struct tokenizer *tk,
				const struct token_ids *ids, long long tokens, int classes)
{
	if (classes)
		return prompt_in_classes(ids, tk, kiln_generator_classes(g));
	const int64_t ctx = kiln_generator_context(g);
	if ((int64_t)ids->n > ctx)
		return kiln_error(KILN_EUSAGE, "the prompt is %zu tokens, longer than the model's context of %lld",
				  ids->n, (long long)ctx);
	if ((int64_t)ids->n + tokens > ctx)
		return kiln_error(KILN_EUSAGE, "--tokens %lld: the prompt's %zu tokens and %lld new ones exceed the model's context of %lld (at most --tokens %lld)",
				  tokens, ids->n, tokens, (long long)ctx, (long long)(ctx - (int64_t)ids->n));
	if (!ids->n)
		return kiln_error(KILN_EUSAGE, "--prompt is empty: generation starts from at least one token");
	return KILN_OK;
}

/* Prompt j's origin before the error st says: FILE:LINE for a line of
 * --prompts, "prompt J of N" (J from 1) for one of several --prompt's. */
static void prompt_where(kiln_status st, const struct gen_opts *o, int j)
{
	if (o->lines[j])
		kiln_error_wrap(st, "%s:%zu", o->prompts_file, o->lines[j]);
	else if (o->n_prompts > 1)
		kiln_error_wrap(st, "prompt %d of %d", j + 1, o->n_prompts);
}

/* The bytes of the tokenizer's longest token. */
static size_t longest_piece(const struct tokenizer *tk)
{
	size_t most = 1, n;
	for (int32_t i = 0; i < tokenizer_vocab(tk); i++)
		if (tokenizer_piece(tk, i, &n) && n > most)
			most = n;
	return most;
}

/* The ids of a prompt, refused before it is encoded when it has more bytes
 * than the context's tokens of the longest token's bytes (longest) hold:
 * a long line of --prompts is not byte-pair encoded to be refused after
 * (the byte-level tokenizer: a byte a token, prompt_check's message). */
static kiln_status prompt_encode(const struct kiln_generator *g, const struct tokenizer *tk,
				 const char *text, size_t longest, struct token_ids *ids)
{
	const size_t n = strlen(text);
	const long long ctx = (long long)kiln_generator_context(g);
	if ((unsigned long long)n > (unsigned long long)ctx * longest) {
		if (longest == 1)
			return kiln_error(KILN_EUSAGE, "the prompt is %zu tokens, longer than the model's context of %lld",
					  n, ctx);
		return kiln_error(KILN_EUSAGE, "the prompt is %zu bytes, more than the model's context of %lld tokens can hold (%zu bytes at most a token, the tokenizer's longest)",
				  n, ctx, longest);
	}
	return tokenizer_encode(tk, text, n, ids);
}

/* Prompt j's text (its tokens ids), its header line first when there are
 * several prompts: what a run of it alone prints after it. */
static kiln_status generate_one(struct kiln_generator *g, const struct tokenizer *tk,
				const struct gen_opts *o, int j, const struct token_ids *ids, int32_t *out)
{
	struct printer pr = { tk, o->prompts[j], o->samples, 0, 0 };
	if (o->n_prompts > 1) {
		printf("--- prompt %d ---\n", j + 1);
		if (cli_stdout_lost())
			return kiln_error(KILN_EIO, "standard output cannot be written: stopped at prompt %d of %d", j + 1,
					  o->n_prompts);
	}
	kiln_status st = kiln_generate_samples(g, ids->v, (int64_t)ids->n, o->tokens, o->samples, &o->s,
					       out, print_token, &pr);
	if (!st)
		print_prompt(&pr);
	if (pr.started)
		fputc('\n', stdout);
	if (!st)
		st = print_samples(&pr, out, o->tokens);
	return st;
}

static kiln_status generate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    struct gen_opts *o)
{
	struct tokenizer *tk = NULL;
	struct kiln_generator *g = NULL;
	struct token_ids *ids = calloc((size_t)o->n_prompts, sizeof *ids);
	int32_t *out = NULL;
	kiln_status st = !ids ? kiln_error(KILN_ENOMEM, "out of memory")
		       : o->vocab ? tokenizer_open_bpe(o->vocab, o->merges, &tk)
				  : tokenizer_open_bytes(&tk);
	if (st || (st = kiln_generator_open(cfg, reg, o->ckpt, &g)))
		goto out;
	const int64_t V = kiln_generator_vocab(g);
	if (tokenizer_vocab(tk) > V) {
		st = kiln_error(KILN_ECONFIG, "the tokenizer has %d ids, more than the model's %lld outputs",
				tokenizer_vocab(tk), (long long)V);
		goto out;
	}
	const size_t longest = longest_piece(tk);
	for (int j = 0; j < o->n_prompts; j++)
		if ((st = prompt_encode(g, tk, o->prompts[j], longest, &ids[j]))) {
			prompt_where(st, o, j);
			goto out;
		}
	/* every prompt checked before any is generated from: the lengths,
	 * the tokenizer's warning, the classes (in that order, as with one) */
	for (int c = 0; c < 2; c++) {
		if (c && !o->vocab)
			bytes_warn(g);
		for (int j = 0; j < o->n_prompts; j++)
			if ((st = prompt_check(g, tk, &ids[j], o->tokens, c))) {
				prompt_where(st, o, j);
				goto out;
			}
	}
	if ((st = allow_tokenizer(g, tk)) || (st = kiln_generator_top_p(g, o->top_p)))
		goto out;
	/* the plan of that many rows first: one that does not fit is exit 2
	 * naming them, before their tokens are allocated (before session 43
	 * the tokens came first: a count whose tokens did not fit was "out
	 * of memory", exit 1) */
	if ((st = kiln_generator_plan_samples(g, o->samples))) {
		if (st == KILN_EUSAGE)
			kiln_error_wrap(st, "--num-samples %lld", o->samples);
		goto out;
	}
	if (!(out = malloc(sizeof *out * (size_t)(o->tokens * o->samples + 1)))) {
		st = kiln_error(KILN_ENOMEM, "out of memory: %lld samples of %lld tokens",
				o->samples, o->tokens);
		goto out;
	}
	for (int j = 0; !st && j < o->n_prompts; j++)
		st = generate_one(g, tk, o, j, &ids[j], out);
out:
	kiln_generator_close(g);
	tokenizer_close(tk);
	for (int j = 0; ids && j < o->n_prompts; j++)
		free(ids[j].v);
	free(ids);
	free(out);
	return st;
}

/* --prompts FILE's lines after o->prompts' (a final line without its
 * newline counts; "\r\n" ends a line as "\n" does; a UTF-8 BOM before
 * the first is skipped), each's line number in o->lines: an empty line or
 * one holding a NUL byte (which would cut it short unseen) is KILN_EUSAGE
 * naming FILE:LINE, an unreadable file KILN_EIO. */
static kiln_status prompts_read(struct gen_opts *o)
{
	const char *path = o->prompts_file;
	FILE *f = fopen(path, "rb");
	size_t len = 0, cap = 0, lines = 0;
	char *text = NULL;
	if (!f)
		return kiln_error(KILN_EIO, "--prompts %s: %s", path, strerror(errno));
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *t = realloc(text, cap = 2 * cap + 4096 + 1);
			if (!t) {
				free(text);
				fclose(f);
				return kiln_error(KILN_ENOMEM, "--prompts %s: out of memory", path);
			}
			text = t;
		}
		const size_t n = fread(text + len, 1, 4096, f);
		len += n;
		if (n < 4096)
			break;
	}
	const int bad = ferror(f);
	fclose(f);
	if (bad) {
		free(text);
		return kiln_error(KILN_EIO, "--prompts %s: cannot be read", path);
	}
	text[len] = 0;
	o->file_text = text;
	const size_t bom = len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3) ? 3 : 0;
	for (size_t i = bom; i < len; i++)
		lines += text[i] == '\n';
	lines += len > bom && text[len - 1] != '\n';
	const size_t n_all = (size_t)o->n_prompts + lines + 1;
	const char **all = realloc(o->prompts, sizeof *all * n_all);
	if (all)
		o->prompts = all;
	size_t *at = all ? realloc(o->lines, sizeof *at * n_all) : NULL;
	if (!at)
		return kiln_error(KILN_ENOMEM, "--prompts %s: out of memory", path);
	o->lines = at;
	for (size_t i = bom, line = 1; i < len; line++) {
		char *nl = memchr(text + i, '\n', len - i), *end = nl ? nl : text + len;
		if (end > text + i && end[-1] == '\r')
			end--;
		if (end == text + i)
			return kiln_error(KILN_EUSAGE, "%s:%zu: an empty line: each line is a prompt of at least one token",
					  path, line);
		const char *nul = memchr(text + i, 0, (size_t)(end - (text + i)));
		if (nul)
			return kiln_error(KILN_EUSAGE, "%s:%zu: a NUL byte (byte %zu of the line): a prompt is text",
					  path, line, (size_t)(nul - (text + i)) + 1);
		*end = 0;
		o->lines[o->n_prompts] = line;
		o->prompts[o->n_prompts++] = text + i;
		i = nl ? (size_t)(nl - text) + 1 : len;
	}
	if (!lines)
		return kiln_error(KILN_EUSAGE, "--prompts %s: the file is empty: no prompt", path);
	return KILN_OK;
}

int cmd_generate(int argc, char **argv)
{
	if (argc < 2 || argv[1][0] == '-') {
		if (argc >= 2)
			cli_bad_arg_usage(argc, argv, 1, cmd_generate_usage);
		fputs(cmd_generate_usage, stderr);
		return 2;
	}
	struct gen_opts o = { 0 };
	char **over = calloc((size_t)argc, sizeof *over); /* the overrides alone */
	int n_over = 0;
	o.prompts = calloc((size_t)argc, sizeof *o.prompts);
	o.lines = calloc((size_t)argc, sizeof *o.lines);
	if (!over || !o.prompts || !o.lines) {
		free(over);
		free(o.prompts);
		free(o.lines);
		return 1;
	}
	if (gen_args(argc, argv, &o, over, &n_over)) {
		fputs(cmd_generate_usage, stderr);
		free(over);
		free(o.prompts);
		free(o.lines);
		return 2;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	/* option values (the prompt) may contain '=': pass only the overrides */
	kiln_status st = cli_named_file("checkpoint", o.ckpt);
	if (!st)
		st = cli_named_file("--prompts", o.prompts_file);
	if (!st && o.prompts_file)
		st = prompts_read(&o);
	if (!st)
		st = cli_named_file("--vocab", o.vocab);
	if (!st)
		st = cli_named_file("--merges", o.merges);
	if (!st)
		st = cli_load(argv[1], n_over, over, 0, &cfg, &reg);
	if (!st)
		st = generate(cfg, reg, &o);
	int rc = 0;
	if (st && cli_stdout_lost())
		kiln_log(KILN_LOG_DEBUG, "generate", "%s", kiln_last_error()), rc = 1;
	else if (st)
		rc = cli_fail(st);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	free(over);
	free(o.prompts);
	free(o.lines);
	free(o.file_text);
	return rc;
}
