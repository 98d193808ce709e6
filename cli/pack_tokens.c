/* cli/pack_tokens.c - `kiln pack --format tokens IN... --out DIR`: text
 * files into token shards in llm.c's format (docs/formats.md), which the
 * `tokens` source reads with `path = DIR`.
 *
 * Each input file is read whole (to its end: pipes too) and encoded
 * (cli/tokenizer.h: byte level, or GPT-2 BPE with --vocab and --merges,
 * when <|endoftext|> is in the vocabulary it precedes each file as
 * llm.c's data scripts put it before each document); with --val-fraction
 * f the last f of each file's tokens go to the held-out split.  The
 * tokens stream into DIR/<split>-000000.bin.tmp, -000001.bin.tmp, ... of
 * at most --shard-tokens tokens, each fsynced when full; only when every
 * input is encoded are they renamed into place (and, with --force, the
 * earlier pack's shards past them removed), all while
 * DIR/<split>.bin-partial exists (TOK_PARTIAL), so that a pack killed
 * while placing leaves splits the source refuses rather than reads short.
 * A pack that fails or is killed before leaves the earlier pack's shards
 * as they were, as the records packer does (before session 33 --force
 * removed them first, and a failed pack lost them).
 */
#include "cli.h"
#include "tokenizer.h"
#include "../plugins/loaders/tokens.h" /* TOK_SUFFIX, TOK_PARTIAL */
#include "../plugins/common/write_full.h" /* common_pwrite_full */

#include <errno.h>    /* errno */
#include <stdio.h>    /* FILE, fopen, fwrite, rename */
#include <stdlib.h>   /* malloc, free, strtod, strtoll */
#include <string.h>   /* strcmp, strncmp, strerror */
#include <sys/stat.h> /* mkdir, stat */
#include <fcntl.h>    /* open */
#include <unistd.h>   /* fsync, close */

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256

/* The usage line of tok_usage_error (cmd_pack.c's help describes it all). */
static const char tok_usage[] =
	"usage: kiln pack --format tokens FILE... --out DIR [--vocab vocab.json --merges merges.txt]\n"
	"                 [--val-fraction F] [--split NAME] [--val-split NAME]\n"
	"                 [--shard-tokens N] [--force]\n";

struct tok_opts {
	const char *out, *vocab, *merges, *split, *val_split;
	double val_fraction;
	long long shard_tokens;
	int force;
	char **in;     /* the input files, borrowed from argv */
	int n_in;
};

/* ---- a stream of shards ---------------------------------------------- */

struct shard_out {
	const struct tok_opts *o;
	const char *split;
	int k;            /* shards completed */
	FILE *f;          /* the open .tmp, or NULL */
	long long n;      /* tokens in it */
	char tmp[4096];
	long long total;
	uint64_t *sizes;  /* tokens in each completed shard, k of them (malloc()ed) */
	uint32_t pack;    /* CRC32C of the split's token ids (pack_id makes the id of it) */
};

static void shard_path(const struct shard_out *s, int k, int tmp, char *out, size_t n)
{
	snprintf(out, n, "%s/%s-%06d%s%s", s->o->out, s->split, k, TOK_SUFFIX, tmp ? ".tmp" : "");
}

/* The header of a shard of n tokens. */
static kiln_status shard_header(struct shard_out *s, long long n)
{
	unsigned char h[SHARD_HEADER_INTS * 4] = { 0 };
	const int32_t v[3] = { SHARD_MAGIC, SHARD_VERSION, (int32_t)n };
	for (int i = 0; i < 3; i++)
		for (int b = 0; b < 4; b++)
			h[4 * i + b] = (unsigned char)((uint32_t)v[i] >> (8 * b));
	if (fseek(s->f, 0, SEEK_SET) || fwrite(h, 1, sizeof h, s->f) != sizeof h)
		return kiln_error(KILN_EIO, "%s: cannot write: %s", s->tmp, strerror(errno));
	return KILN_OK;
}

/* Finish the open shard: its header, then fsynced; it keeps its .tmp name
 * until splits_place. */
static kiln_status shard_close(struct shard_out *s)
{
	if (!s->f)
		return KILN_OK;
	kiln_status st = shard_header(s, s->n);
	/* where the shard ends (pack_id); the room doubles at 1, 2, 4, ...
	 * shards (--shard-tokens 1 may make millions) */
	uint64_t *z = s->sizes;
	if (!(s->k & (s->k - 1)) && (z = realloc(z, (size_t)(s->k ? 2 * s->k : 1) * sizeof *z)))
		s->sizes = z;
	if (z)
		z[s->k] = (uint64_t)s->n;
	else if (!st)
		st = kiln_error(KILN_ENOMEM, "out of memory");
	if (!st && (fflush(s->f) || fsync(fileno(s->f))))
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", s->tmp, strerror(errno));
	if (fclose(s->f) && !st)
		st = kiln_error(KILN_EIO, "%s: cannot write: %s", s->tmp, strerror(errno));
	s->f = NULL;
	s->tmp[0] = 0; /* (closed: shard k's .tmp, which split_discard names) */
	s->k++;
	s->total += s->n;
	s->n = 0;
	return st;
}

/* Append ids[0..n) (each < 65536), starting new shards as they fill. */
static kiln_status shard_write(struct shard_out *s, const int32_t *ids, size_t n)
{
	kiln_status st;
	s->pack = kiln_host_table()->crc32c(s->pack, ids, n * sizeof *ids);
	for (size_t i = 0; i < n; i++) {
		if (!s->f) {
			shard_path(s, s->k, 1, s->tmp, sizeof s->tmp);
			if (!(s->f = fopen(s->tmp, "wb")))
				return kiln_error(KILN_EIO, "%s: cannot create: %s", s->tmp, strerror(errno));
			if ((st = shard_header(s, 0)))
				return st;
		}
		unsigned char b[2] = { (unsigned char)ids[i], (unsigned char)(ids[i] >> 8) };
		if (fwrite(b, 1, 2, s->f) != 2)
			return kiln_error(KILN_EIO, "%s: cannot write: %s", s->tmp, strerror(errno));
		if (++s->n == s->o->shard_tokens && (st = shard_close(s)))
			return st;
	}
	return KILN_OK;
}

/* ---- options ---------------------------------------------------------- */

/* After the error line (tok_usage_error's, or cli_opt's): the usage; 2. */
static int tok_usage_tail(void)
{
	fprintf(stderr, "%s(kiln pack --help describes every option)\n", tok_usage);
	return 2;
}

/* (the prefix was "kiln pack: error:" before session 33, unlike the
 * shared parser's and kiln pack's own) */
static int tok_usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "kiln: error: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return tok_usage_tail();
}

/* One option at argv[*i] (*i advanced past its value), by the parser every
 * command shares (cli/kiln.c; a loop of its own before session 33): 1
 * read, 0 not one of --format tokens', -1 after cli_opt's error. */
static int tok_option(int argc, char **argv, int *i, struct tok_opts *o, const char **format,
		      const char **fraction)
{
	int r;
	if ((r = cli_flag(argv, *i, "--force")) > 0)
		o->force = 1;
	if (r ||
	    (r = cli_opt(argc, argv, i, "--out", &o->out)) ||
	    (r = cli_opt(argc, argv, i, "--vocab", &o->vocab)) ||
	    (r = cli_opt(argc, argv, i, "--merges", &o->merges)) ||
	    (r = cli_opt(argc, argv, i, "--split", &o->split)) ||
	    (r = cli_opt(argc, argv, i, "--val-split", &o->val_split)) ||
	    (r = cli_opt(argc, argv, i, "--format", format)) ||
	    (r = cli_opt(argc, argv, i, "--val-fraction", fraction)) ||
	    (r = cli_opt_int(argc, argv, i, "--shard-tokens", 1, INT32_MAX, &o->shard_tokens)))
		return r;
	return 0;
}

int pack_option_elsewhere(const char *a, int tokens)
{
	/* the options of one format alone; --out, --split, --force and
	 * --format are both's */
	static const char *const tok_only[] = { "--vocab", "--merges", "--val-split",
						"--val-fraction", "--shard-tokens" };
	static const char *const rec_only[] = { "--section", "--shard-size", "--store",
						"--quality", "--resize", "--workers" };
	const char *const *list = tokens ? rec_only : tok_only;
	const size_t n = tokens ? sizeof rec_only / sizeof *rec_only : sizeof tok_only / sizeof *tok_only;
	const size_t len = strcspn(a, "=");
	for (size_t k = 0; k < n; k++)
		if (strlen(list[k]) == len && !strncmp(a, list[k], len)) {
			fprintf(stderr, "kiln: error: %s goes only with --format %s\n", list[k],
				tokens ? "records or folder (it packs a CONFIG's data)" : "tokens");
			return 1;
		}
	return 0;
}

static int tok_parse_args(int argc, char **argv, struct tok_opts *o)
{
	const char *format = NULL, *fraction = NULL;
	char *end;
	memset(o, 0, sizeof *o);
	o->split = "train";
	o->val_split = "val";
	o->shard_tokens = 100000000;
	if (!(o->in = calloc((size_t)argc, sizeof *o->in)))
		return 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int r;
		if (strncmp(a, "--", 2)) {
			o->in[o->n_in++] = argv[i];
			continue;
		}
		if ((r = tok_option(argc, argv, &i, o, &format, &fraction)) < 0)
			return tok_usage_tail();
		if (!r) {
			if (!pack_option_elsewhere(a, 1))
				cli_bad_arg(a);
			return tok_usage_tail();
		}
	}
	if (format && strcmp(format, "tokens"))
		return tok_usage_error("--format '%s': text files pack with --format tokens", format);
	if (fraction) {
		o->val_fraction = strtod(fraction, &end);
		if (end == fraction || *end || !(o->val_fraction >= 0 && o->val_fraction <= 0.99))
			return tok_usage_error("--val-fraction '%s': a fraction in 0..0.99", fraction);
	}
	if (!o->out)
		return tok_usage_error("%s", "--out DIR is required");
	if (!o->n_in)
		return tok_usage_error("%s", "no input file: name the text files to encode");
	if (!o->vocab != !o->merges)
		return tok_usage_error("%s", "byte-pair encoding needs both --vocab and --merges");
	if (!strcmp(o->split, o->val_split))
		return tok_usage_error("--split and --val-split are both '%s'", o->split);
	return 0;
}

/* ---- packing ---------------------------------------------------------- */

/* The whole input into a new buffer (*n bytes), read until end of file:
 * st_size is 0 for a pipe, /dev/stdin or <(zcat f.gz), which were read as
 * empty (session 31).  A FIFO blocks in fopen until it has a writer, as
 * `cat` does: that is how <(...) reaches us. */
static kiln_status read_text(const char *path, char **buf, size_t *n)
{
	struct stat sb;
	size_t cap = 0;
	*buf = NULL;
	*n = 0;
	FILE *f = fopen(path, "rb");
	if (!f) /* an input that cannot be read: a data error (exit 3) */
		return kiln_error(KILN_EDATA, "%s: cannot read: %s", path, strerror(errno));
	int err = fstat(fileno(f), &sb) ? errno : S_ISDIR(sb.st_mode) ? EISDIR : 0;
	/* a file's size and a byte: one read, which sees its end; a pipe's
	 * size is 0, so its buffer grows */
	size_t want = !err && S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 1 : 65536;
	while (!err) {
		if (*n == cap) {
			size_t nc = !cap ? want : cap + cap / 2;
			char *nb = nc > cap ? realloc(*buf, nc) : NULL;
			if (!nb) {
				err = ENOMEM;
				break;
			}
			*buf = nb;
			cap = nc;
		}
		size_t got = fread(*buf + *n, 1, cap - *n, f);
		*n += got;
		if (ferror(f))
			err = errno ? errno : EIO;
		else if (feof(f) || !got)
			break;
	}
	fclose(f);
	if (err) {
		free(*buf);
		*buf = NULL;
		*n = 0;
		return kiln_error(KILN_EDATA, "%s: cannot read: %s", path, strerror(err));
	}
	return KILN_OK;
}

/* An existing shard of `split` in DIR: without --force an error. */
static kiln_status check_existing(const struct tok_opts *o, const char *split)
{
	char p[4096];
	struct stat sb;
	snprintf(p, sizeof p, "%s/%s-%06d%s", o->out, split, 0, TOK_SUFFIX);
	if (!o->force && stat(p, &sb) == 0)
		return kiln_error(KILN_EUSAGE, "%s exists: pass --force to replace the shards, or choose another --out",
				  p);
	return KILN_OK;
}

/* Every shard of s's split complete: record in each header (ints 3..6,
 * zero in llm.c's format) 1, its index, the split's shard count and the
 * pack's id, so that the source can tell a split missing its last shard
 * (docs/formats.md); fsynced. */
static kiln_status split_stamp(const struct shard_out *s)
{
	char tmp[4096];
	const uint32_t id = pack_id(s->pack, s->sizes, s->k);
	for (int k = 0; k < s->k; k++) {
		const uint32_t v[4] = { 1, (uint32_t)k, (uint32_t)s->k, id };
		unsigned char b[16];
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 4; j++)
				b[4 * i + j] = (unsigned char)(v[i] >> (8 * j));
		shard_path(s, k, 1, tmp, sizeof tmp);
		int fd = open(tmp, O_WRONLY | O_CLOEXEC);
		/* whole (a short write or EINTR retried; one pwrite compared
		 * with 16 failed the pack on either) */
		int bad = fd < 0 || common_pwrite_full(fd, b, sizeof b, 12) || fsync(fd);
		int err = errno;
		if (fd >= 0 && close(fd) && !bad)
			bad = 1, err = errno;
		if (bad)
			return kiln_error(KILN_EIO, "%s: cannot write: %s", tmp, strerror(err));
	}
	return KILN_OK;
}

/* Every shard of s's split complete: rename its .tmp files into place,
 * then (--force) remove the earlier pack's shards past them. */
static kiln_status split_rename(const struct shard_out *s)
{
	char tmp[4096], final[4096];
	for (int k = 0; k < s->k; k++) {
		shard_path(s, k, 1, tmp, sizeof tmp);
		shard_path(s, k, 0, final, sizeof final);
		if (rename(tmp, final))
			return kiln_error(KILN_EIO, "%s: cannot rename to %s: %s", tmp, final,
					  strerror(errno));
	}
	for (int k = s->k; s->o->force; k++) {
		shard_path(s, k, 0, final, sizeof final);
		if (remove(final))
			break;
	}
	return KILN_OK;
}

/* After a failure before the renames (splits_place): remove the .tmp shards this run
 * wrote of s's split (the open one and the complete ones); the earlier
 * pack's shards stay as they were. */
static void split_discard(struct shard_out *s)
{
	char p[4096];
	if (s->f)
		fclose(s->f);
	s->f = NULL;
	if (s->tmp[0])
		remove(s->tmp);
	for (int k = 0; k < s->k; k++) {
		shard_path(s, k, 1, p, sizeof p);
		remove(p);
	}
}

/* Both splits complete: each marked partial (DIR/<split>.bin-partial)
 * before either is renamed into place (split_rename), the marks removed
 * when both are (the unmarking syncs the directory first), so that a pack
 * killed here leaves splits the source refuses.  A mark that cannot be
 * made: nothing renamed, the .tmp shards removed, the other mark taken
 * back.  A failed rename keeps the marks: the split may be a mix. */
static kiln_status splits_place(struct shard_out *tr, struct shard_out *va)
{
	const struct tok_opts *o = tr->o;
	kiln_status st = pack_mark_partial(o->out, tr->split, TOK_PARTIAL);
	if (!st && (st = pack_mark_partial(o->out, va->split, TOK_PARTIAL)))
		(void)pack_unmark_partial(o->out, tr->split, TOK_PARTIAL);
	if (st) {
		split_discard(tr);
		split_discard(va);
		return st;
	}
	if ((st = split_rename(tr)) || (st = split_rename(va)))
		return st;
	st = pack_unmark_partial(o->out, tr->split, TOK_PARTIAL);
	return st ? st : pack_unmark_partial(o->out, va->split, TOK_PARTIAL);
}

static kiln_status pack_tokens(const struct tok_opts *o, struct tokenizer *tk)
{
	struct shard_out tr = { .o = o, .split = o->split }, va = { .o = o, .split = o->val_split };
	struct token_ids ids = { 0 };
	kiln_status st = KILN_OK;
	if (mkdir(o->out, 0777) && errno != EEXIST)
		return kiln_error(KILN_EIO, "--out %s: cannot create: %s", o->out, strerror(errno));
	if ((st = pack_lock_out(o->out)) || (st = check_existing(o, o->split)) || (st = check_existing(o, o->val_split)))
		return st;
	/* the *.bin.tmp a killed pack left (the lock: no live pack's) */
	pack_remove_stale_tmp(o->out, o->split, TOK_SUFFIX);
	pack_remove_stale_tmp(o->out, o->val_split, TOK_SUFFIX);
	size_t bytes = 0;
	for (int i = 0; i < o->n_in && !st; i++) {
		char *text;
		size_t n;
		ids.n = 0;
		if ((st = read_text(o->in[i], &text, &n)))
			break;
		if (!n)
			kiln_log(KILN_LOG_WARN, "pack", "%s: empty: no text to encode", o->in[i]);
		bytes += n;
		if (tokenizer_eot(tk) >= 0)
			st = token_ids_push(&ids, tokenizer_eot(tk));
		if (!st)
			st = tokenizer_encode(tk, text, n, &ids);
		free(text);
		size_t held = (size_t)(o->val_fraction * (double)ids.n + 0.5);
		if (!st)
			st = shard_write(&tr, ids.v, ids.n - held);
		if (!st)
			st = shard_write(&va, ids.v + ids.n - held, held);
	}
	/* nothing read: exit 0 with "0 tokens" hid a mistake (an empty
	 * file, a pipe read as empty before session 31) */
	if (!st && !bytes)
		st = kiln_error(KILN_EDATA, "no text to encode: the %d input file(s) (%s%s) are empty",
				o->n_in, o->in[0], o->n_in > 1 ? ", ..." : "");
	if (!st)
		st = shard_close(&tr);
	if (!st)
		st = shard_close(&va);
	if (!st && !(st = split_stamp(&tr)))
		st = split_stamp(&va);
	if (st) {
		split_discard(&tr);
		split_discard(&va);
	}
	free(ids.v);
	free(tr.sizes);
	free(va.sizes);
	if (!st)
		st = splits_place(&tr, &va);
	if (!st)
		printf("packed %d file(s): %lld tokens in %d %s shard(s), %lld in %d %s shard(s), vocab %d\n",
		       o->n_in, tr.total, tr.k, o->split, va.total, va.k, o->val_split,
		       tokenizer_vocab(tk));
	return st;
}

/* Every file named is there (cli_named_file: exit 2 before any is read).
 * --format tokens takes no overrides: a missing "data.limit=5" was read
 * as a text file (exit 3, "cannot read") before session 36; it says so. */
static kiln_status tok_inputs_named(const struct tok_opts *o)
{
	kiln_status st = cli_named_file("--vocab", o->vocab);
	if (!st)
		st = cli_named_file("--merges", o->merges);
	for (int i = 0; !st && i < o->n_in; i++)
		if ((st = cli_named_file("", o->in[i])) && strchr(o->in[i], '='))
			st = kiln_error(st, "%s: no such file (--format tokens takes no section.key=value overrides: its arguments are the text files to encode)",
					o->in[i]);
	return st;
}

int cmd_pack_tokens(int argc, char **argv)
{
	struct tok_opts o;
	struct tokenizer *tk = NULL;
	int rc = tok_parse_args(argc, argv, &o);
	if (rc) {
		free(o.in);
		return rc;
	}
	kiln_status st = tok_inputs_named(&o);
	if (!st)
		st = o.vocab ? tokenizer_open_bpe(o.vocab, o.merges, &tk)
			     : tokenizer_open_bytes(&tk);
	if (st == KILN_EIO)
		st = KILN_EDATA; /* an unreadable vocabulary: a data error, exit 3 */
	if (!st)
		st = pack_tokens(&o, tk);
	tokenizer_close(tk);
	free(o.in);
	return st ? cli_fail(st) : 0;
}
