/* tests/check_tokens.c - token data: the `tokens` source of kiln-loaders.so
 * over llm.c-format shards, the loader engine over it (batches i32 [B, T]
 * of inputs and targets), the tokenizers of `kiln pack --format tokens`
 * (cli/tokenizer.c, compiled in) and the command itself.
 *
 * Shards are written here token by token; every test checks exact tokens.
 * Checked: windows and their shifted targets across shards (empty ones
 * too), the split rules (directory, glob, val fraction), the batches of one
 * epoch identical for 0, 1, 2 and 4 workers, the union over ranks of world
 * sizes 1 and 2 equal to one process's epoch, a resume mid-epoch; corrupt
 * shards (bad magic, version, truncated, count mismatch, token >= vocab)
 * refused at open with a message naming the file, and a fuzz case of 300
 * mutations.  The tokenizers: bytes round trip exactly; GPT-2 BPE against
 * tests/data/bpe/refs.json (tests/data/gen_bpe_refs.py's reference
 * implementation on its own small vocabulary), and decode(encode(t)) == t.
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "../cli/tokenizer.h"

#include <check.h>
#include <dirent.h>
#include <signal.h>
#include "check_main.h"
#include "source_fixture.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- fixtures ---------------------------------------------------------- */

static void setup(void)
{
	source_setup("tok");
	source_find("tokens");
}

/* A shard of tokens tok[0..n) with header (magic, version, count) and
 * `extra` bytes of 0x7f after the tokens. */
static void write_shard_ex(const char *name, const uint16_t *tok, size_t n, int32_t magic,
			   int32_t version, int32_t count, size_t extra)
{
	size_t bytes = 1024 + 2 * n + extra;
	uint8_t *b = calloc(1, bytes);
	const int32_t h[3] = { magic, version, count };
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 4; k++)
			b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
	for (size_t i = 0; i < n; i++) {
		b[1024 + 2 * i] = (uint8_t)tok[i];
		b[1024 + 2 * i + 1] = (uint8_t)(tok[i] >> 8);
	}
	memset(b + 1024 + 2 * n, 0x7f, extra);
	char p[1024];
	snprintf(p, sizeof p, "%s", tpath(name));
	char *slash = strrchr(p, '/');
	*slash = 0;
	mkdir(p, 0700);
	write_tmp(name, b, bytes);
	free(b);
}

static void write_shard(const char *name, const uint16_t *tok, size_t n)
{
	write_shard_ex(name, tok, n, 20240520, 1, (int32_t)n, 0);
}

/* tok[i] = (i * mul + add) % mod for i < n */
static uint16_t *seq(size_t n, unsigned mul, unsigned add, unsigned mod)
{
	uint16_t *t = malloc(n * sizeof *t + 2);
	for (size_t i = 0; i < n; i++)
		t[i] = (uint16_t)((i * mul + add) % mod);
	return t;
}

/* Open [section] with the overrides (up to NULL) for split. */
static kiln_status open_tokens(const char *section, const char *split, ...)
{
	va_list ap;
	va_start(ap, split);
	source_config("tokens", ap);
	va_end(ap);
	if (ctx)
		ops->close(ctx);
	ctx = NULL;
	return ops->open(kiln_host_table(), cfg, section, split, &ctx);
}

#define OPEN_OK(...) ck_assert_msg(open_tokens(__VA_ARGS__, NULL) == KILN_OK, "%s", kiln_last_error())

static char ovr[8][1100];
static int ovr_k;
/* "data.path=<tmp>/NAME" and friends, in rotating buffers. */
static const char *kv(const char *key, const char *name)
{
	char *b = ovr[ovr_k++ & 7];
	snprintf(b, sizeof ovr[0], "%s=%s", key, tpath(name));
	return b;
}

/* ---- reading ---------------------------------------------------------- */

/* Two shards of 10 and 7 tokens, an empty one between: context 3 gives
 * windows floor(9/3) + floor(6/3) = 5; each window's inputs and shifted
 * targets are the tokens. */
START_TEST(test_windows_exact)
{
	uint16_t *a = seq(10, 7, 1, 50), *b = seq(7, 3, 100, 1000);
	write_shard("s/a.bin", a, 10);
	write_shard("s/b.bin", NULL, 0);
	write_shard("s/c.bin", b, 7);
	OPEN_OK("data", "train", kv("data.path", "s"), "data.split=.", "data.context=3");
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 5);
	ck_assert_int_eq(info.sample.dtype, KILN_I32);
	ck_assert_int_eq(info.sample.ndim, 1);
	ck_assert_int_eq(info.sample.dims[0], 3);
	ck_assert_int_eq(info.label.dtype, KILN_I32);
	ck_assert_int_eq(info.label.dims[0], 3);
	ck_assert_int_eq(info.classes, 119); /* the largest token (118) + 1 */
	ck_assert_int_eq(info.flags & KILN_SOURCE_MAPPED, KILN_SOURCE_MAPPED);
	for (int64_t i = 0; i < 5; i++) {
		int32_t x[3], y[3];
		const uint16_t *src = i < 3 ? a + 3 * i : b + 3 * (i - 3);
		ck_assert_int_eq(ops->read(ctx, i, x, y), KILN_OK);
		for (int t = 0; t < 3; t++) {
			ck_assert_int_eq(x[t], src[t]);
			ck_assert_int_eq(y[t], src[t + 1]);
		}
	}
	int32_t x[3];
	ck_assert_int_eq(ops->read(ctx, 5, x, NULL), KILN_EINVAL);
	ck_assert_int_eq(ops->read(ctx, -1, x, NULL), KILN_EINVAL);
	free(a), free(b);
}
END_TEST

/* The directory rule: [data] reads train-*.bin, [data.eval] (split test)
 * the val-*.bin shards when there are no test ones; a glob in shards. */
START_TEST(test_splits_and_globs)
{
	uint16_t *t = seq(41, 1, 0, 256), *v = seq(9, 1, 200, 256);
	write_shard("d/train-000000.bin", t, 21);
	write_shard("d/train-000001.bin", t + 20, 21);
	write_shard("d/val-000000.bin", v, 9);
	struct kiln_source_info info;
	int32_t x[4], y[4];
	OPEN_OK("data", "train", kv("data.path", "d"), "data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 10);
	ck_assert_int_eq(ops->read(ctx, 5, x, y), KILN_OK); /* shard 1's window 0 */
	ck_assert_int_eq(x[0], 20);
	ck_assert_int_eq(y[3], 24);
	OPEN_OK("data.eval", "test", kv("data.path", "d"), "data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 2);
	ck_assert_int_eq(ops->read(ctx, 1, x, y), KILN_OK);
	ck_assert_int_eq(x[0], 204);
	ck_assert_int_eq(y[3], 208);
	OPEN_OK("data", "train", kv("data.path", "d"), "data.shards=train-*.bin, val-*.bin",
		"data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 12);
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "d"),
				     "data.shards=nothing-*.bin", "data.context=4", NULL),
			 KILN_ENOTFOUND); /* matching nothing: exit 2 (3 before session 37) */
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "nothing-*.bin: no file matches this shards pattern"));
	/* a path set but missing is named with where it was set, not the
	 * pattern matched in the working directory (before session 33:
	 * "train-*.bin: no file matches this shards pattern"), as
	 * KILN_ENOTFOUND, which kiln_source_open reports as a config error
	 * (exit 2; KILN_EIO, exit 3, before session 37) */
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "nodir"),
				     "data.shards=train-*.bin", "data.context=4", NULL),
			 KILN_ENOTFOUND);
	char want[1200];
	snprintf(want, sizeof want, "command line '%s': [data] path: %s: no such file (the tokens data)",
		 kv("data.path", "nodir"), tpath("nodir"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	/* context is required */
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "d"), NULL), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "context"));
	free(t), free(v);
}
END_TEST

/* A numbered split with a shard missing (train-000002.bin of 5 deleted)
 * is a data error naming the missing file, in the directory form and the
 * subdirectory form (before session 33 the run read 4 shards silently);
 * a run starting above 0 (1-based numbering, a held-out subset, one shard)
 * is whole; names of another form, and a `shards` list, are read as they
 * are. */
START_TEST(test_shard_gap)
{
	uint16_t *t = seq(20, 1, 0, 256);
	char name[64], want[1200];
	for (int k = 0; k < 5; k++) {
		if (k == 2)
			continue;
		snprintf(name, sizeof name, "d/train-%06d.bin", k);
		write_shard(name, t, 20);
		snprintf(name, sizeof name, "d/test/test-%06d.bin", k);
		write_shard(name, t, 20);
	}
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "d"), "data.context=4", NULL),
			 KILN_EDATA);
	snprintf(want, sizeof want, "%s is missing: the split's 4 shards are numbered 000000 .. 000004 as kiln pack numbers them",
		 tpath("d/train-000002.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	ck_assert_int_eq(open_tokens("data.eval", "test", kv("data.path", "d"), "data.context=4", NULL),
			 KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), tpath("d/test/test-000002.bin")));
	/* the shards listed: read as given */
	OPEN_OK("data", "train", kv("data.path", "d"), "data.shards=train-*.bin", "data.context=4");
	/* restored: read */
	write_shard("d/train-000002.bin", t, 20);
	OPEN_OK("data", "train", kv("data.path", "d"), "data.context=4");
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 20); /* 5 shards of 4 windows */
	/* the first shard missing: 1 .. 4 is a whole run (1-based numbering,
	 * or a subset), not a gap */
	ck_assert_int_eq(unlink(tpath("d/train-000000.bin")), 0);
	OPEN_OK("data", "train", kv("data.path", "d"), "data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 16);
	/* a held-out subset far from 0, and one shard copied alone */
	write_shard("h/train-000900.bin", t, 20);
	write_shard("h/train-000901.bin", t, 20);
	OPEN_OK("data", "train", kv("data.path", "h"), "data.context=4");
	write_shard("o/train-00003.bin", t, 20);
	OPEN_OK("data", "train", kv("data.path", "o"), "data.context=4");
	/* ... but a gap inside it is refused */
	write_shard("h/train-000903.bin", t, 20);
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "h"), "data.context=4", NULL),
			 KILN_EDATA);
	snprintf(want, sizeof want, "%s is missing: the split's 3 shards are numbered 000900 .. 000903",
		 tpath("h/train-000902.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	/* names of another form (not 5 or 6 digits): not checked */
	write_shard("e/train-1.bin", t, 20);
	write_shard("e/train-3.bin", t, 20);
	OPEN_OK("data", "train", kv("data.path", "e"), "data.context=4");
	free(t);
}
END_TEST

/* val_fraction: train reads the first windows, val/test the last ones,
 * together all of them once. */
START_TEST(test_val_fraction)
{
	uint16_t *t = seq(101, 1, 0, 60000);
	write_shard("one.bin", t, 101); /* 20 windows of 5 */
	struct kiln_source_info info;
	int32_t x[5];
	OPEN_OK("data", "train", kv("data.path", "one.bin"), "data.context=5",
		"data.val_fraction=0.25");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 15);
	ck_assert_int_eq(ops->read(ctx, 14, x, NULL), KILN_OK);
	ck_assert_int_eq(x[0], 70);
	/* [data.val] with its own path (a single-file path is never inherited) */
	OPEN_OK("data.val", "val", kv("data.path", "one.bin"), kv("data.val.path", "one.bin"),
		"data.context=5", "data.val_fraction=0.25");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 5);
	ck_assert_int_eq(ops->read(ctx, 0, x, NULL), KILN_OK);
	ck_assert_int_eq(x[0], 75);
	/* [data.eval] inheriting the file and the fraction reads the held-out part */
	OPEN_OK("data.eval", "test", kv("data.path", "one.bin"), "data.context=5",
		"data.val_fraction=0.25");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 5);
	/* without a fraction, it would evaluate on the training data: refused */
	ck_assert_int_eq(open_tokens("data.eval", "test", kv("data.path", "one.bin"),
				     "data.context=5", NULL),
			 KILN_ECONFIG);
	free(t);
}
END_TEST

/* vocab bounds every token; the error names the file and the offset. */
START_TEST(test_vocab)
{
	uint16_t *t = seq(30, 1, 0, 256);
	t[17] = 300;
	write_shard("v.bin", t, 30);
	struct kiln_source_info info;
	OPEN_OK("data", "train", kv("data.path", "v.bin"), "data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.classes, 301);
	/* where the largest id is (ABI 2.21), for the core's messages: the
	 * shard of several and the first place of that id in it */
	char want[1200];
	snprintf(want, sizeof want, "%s: token offset 17 (byte 1058)", tpath("v.bin"));
	ck_assert_ptr_nonnull(info.classes_from);
	ck_assert_str_eq(info.classes_from, want);
	t[17] = 1;
	t[3] = 300; /* in the second shard only */
	write_shard("w/train-000000.bin", t + 4, 20);
	write_shard("w/train-000001.bin", t, 30);
	OPEN_OK("data", "train", kv("data.path", "w"), "data.context=4");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.classes, 301);
	snprintf(want, sizeof want, "%s: token offset 3 (byte 1030)", tpath("w/train-000001.bin"));
	ck_assert_str_eq(info.classes_from, want);
	t[3] = 3;
	t[17] = 300;
	ops->close(ctx);
	ctx = NULL;
	ASSERT_FAILS(open_tokens("data", "train", kv("data.path", "v.bin"), "data.context=4",
				 "data.vocab=256", NULL),
		     KILN_EDATA, tpath("v.bin"), "token offset 17");
	OPEN_OK("data", "train", kv("data.path", "v.bin"), "data.context=4", "data.vocab=512");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	/* a vocab bounds the tokens, the classes are still the largest + 1
	 * (before session 38 the key's count: a padded vocab, as llm.c's
	 * 50304, made the loss's classes = 50257 refused) */
	ck_assert_int_eq(info.classes, 301);
	snprintf(want, sizeof want, "%s: token offset 17 (byte 1058)", tpath("v.bin"));
	ck_assert_str_eq(info.classes_from, want);
	free(t);
}
END_TEST

/* ---- corrupt shards --------------------------------------------------- */

START_TEST(test_corrupt)
{
	/* shards written with a wrong header field each: magic, version,
	 * declared count, trailing bytes; and the message expected */
	static const struct {
		int32_t magic, version, count, extra;
		const char *why;
	} bad[] = {
		{ 20240521, 1, 40, 0, "bad magic" },
		{ 20240326, 1, 40, 0, "model file" },
		{ 0, 1, 40, 0, "byte-swapped" }, /* magic set below */
		{ 20240520, 2, 40, 0, "version 2" },
		{ 20240520, 1, 41, 0, "truncated" },
		{ 20240520, 1, 39, 0, "c.bin: token count mismatch: the header says 39 tokens (78 bytes), the file holds 2 bytes more than the header's tokens" },
		/* an odd size: before session 38 "truncated", of a whole file */
		{ 20240520, 1, 40, 3, "c.bin: token count mismatch: the header says 40 tokens (80 bytes), the file holds 3 bytes more than the header's tokens" },
		{ 20240520, 1, 41, 1, "c.bin: truncated: the header promises 41 tokens (82 bytes), the file holds 81 bytes after the header" },
		{ 20240520, 1, -5, 0, "negative" },
	};
	uint16_t *t = seq(40, 1, 0, 256);
	const char *p = "c.bin";
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		const int32_t magic = k == 2 ? (int32_t)__builtin_bswap32(20240520) : bad[k].magic;
		write_shard_ex(p, t, 40, magic, bad[k].version, bad[k].count, bad[k].extra);
		ASSERT_FAILS(open_tokens("data", "train", kv("data.path", p), "data.context=4", NULL),
			     KILN_EDATA, tpath(p), bad[k].why);
	}
	write_tmp(p, t, 80); /* shorter than the header (t holds 80 bytes) */
	ASSERT_FAILS(open_tokens("data", "train", kv("data.path", p), "data.context=4", NULL),
		     KILN_EDATA, tpath(p), "truncated header");
	write_shard(p, t, 4); /* no window of 5 tokens */
	ASSERT_FAILS(open_tokens("data", "train", kv("data.path", p), "data.context=4", NULL),
		     KILN_EDATA, tpath(p), "no window");
	ASSERT_FAILS(open_tokens("data", "train", kv("data.path", "missing.bin"), "data.context=4",
				 NULL),
		     KILN_ENOTFOUND, tpath("missing.bin"), "no such file");
	free(t);
}
END_TEST

/* Shards that leave fewer than 64 descriptors of ulimit -n are refused
 * when the split opens, naming the limit (before session 38's review 200
 * shards at ulimit -n 205 opened and the run failed later, at "[run]
 * out_dir: cannot read ...: Too many open files"); at the hard limit the
 * hint says where to raise that one, as the open's own EMFILE does. */
START_TEST(test_fd_headroom)
{
	uint16_t *t = seq(21, 1, 0, 256);
	write_shard("h/train-000000.bin", t, 21);
	write_shard("h/train-000001.bin", t, 21);
	write_shard("h/train-000002.bin", t, 21);
	struct rlimit keep, rl;
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &keep), 0);
	const int low = open("/dev/null", O_RDONLY); /* the lowest free descriptor */
	ck_assert_int_ge(low, 0);
	close(low);
	rl = keep;
	rl.rlim_cur = (rlim_t)low + 40;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	const kiln_status st = open_tokens("data", "train", kv("data.path", "h"), "data.context=4", NULL);
	char want[600];
	snprintf(want, sizeof want, "the split's 3 shard(s) stay open while the run reads them and leave %d of ulimit -n %d's descriptors (the highest open is %d), fewer than the 64 the run needs besides (checkpoints, logs, the device, the communicator): raise ulimit -n, now %d, hard limit ",
		 40 - 3, low + 40, low + 2, low + 40);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &keep), 0);
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	ck_assert(ctx == NULL);
	rl.rlim_cur = (rlim_t)low + 64 + 3;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	const kiln_status ok = open_tokens("data", "train", kv("data.path", "h"), "data.context=4", NULL);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &keep), 0);
	ck_assert_msg(ok == KILN_OK, "%s", kiln_last_error());
	/* soft = hard (in a child: a lowered hard limit stays lowered) */
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		struct rlimit h = { (rlim_t)low + 2, (rlim_t)low + 2 };
		if (ctx)
			ops->close(ctx);
		ctx = NULL;
		if (setrlimit(RLIMIT_NOFILE, &h) ||
		    open_tokens("data", "train", kv("data.path", "h"), "data.context=4", NULL) != KILN_EIO)
			_exit(1);
		char w[300];
		const char *e = kiln_last_error();
		snprintf(w, sizeof w, " (each of the split's 3 shard(s) stays open while the run reads it: ulimit -n %d is the hard limit: raise that (limits.conf nofile, systemd LimitNOFILE=, docker --ulimit nofile=))",
			 low + 2);
		if (!strstr(e, w)) {
			fprintf(stderr, "%s\n", e);
			_exit(2);
		}
		_exit(0);
	}
	int ws;
	ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
	ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child: %d", ws);
	free(t);
}
END_TEST

/* A shard truncated while the source has it open (llm.c's script or a
 * packer writing it again, in place): a window past the new end is
 * KILN_EDATA naming the shard, the window, the sample and the sizes; one
 * across it too (a short read); windows before it still read.  Before
 * session 38 the shards were mmap()ed and the read died of SIGBUS. */
START_TEST(test_truncated_while_open)
{
	uint16_t *t = seq(40000, 7, 3, 60000);
	write_shard("tr.bin", t, 40000); /* 81024 bytes: windows 0..9998 of 4 */
	OPEN_OK("data", "train", kv("data.path", "tr.bin"), "data.context=4");
	int32_t x[4], y[4];
	ck_assert_int_eq(ops->read(ctx, 9000, x, y), KILN_OK);
	ck_assert_int_eq(truncate(tpath("tr.bin"), 1024 + 2 * 1000), 0);
	char want[1400];
	ck_assert_int_eq(ops->read(ctx, 9000, x, y), KILN_EDATA);
	snprintf(want, sizeof want, "%s: window 9000 (sample 9000), tokens 36000..36004 (bytes 73024..73033): only 0 of 10 bytes are there: the shard had 81024 bytes when the run opened it, it has 3024 now (was it truncated or rewritten while the run read it?)",
		 tpath("tr.bin"));
	ck_assert_str_eq(kiln_last_error(), want);
	/* the targets alone: tokens 36001..36004 */
	ck_assert_int_eq(ops->read(ctx, 9000, NULL, y), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "tokens 36001..36004 (bytes 73026..73033): only 0 of 8 bytes"));
	/* window 249 (tokens 996..1000) lost its last token */
	ck_assert_int_eq(ops->read(ctx, 249, x, y), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "window 249 (sample 249), tokens 996..1000 (bytes 3016..3025): only 8 of 10 bytes are there"));
	ck_assert_int_eq(ops->read(ctx, 249, x, NULL), KILN_OK); /* its inputs are all there */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(x[i], t[996 + i]);
	ck_assert_int_eq(ops->read(ctx, 248, x, y), KILN_OK);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(x[i], t[992 + i]);
		ck_assert_int_eq(y[i], t[993 + i]);
	}
	free(t);
}
END_TEST

/* One pread() lands in the sample's (or the label's) own buffer and is
 * widened there: every combination of sample and label, context 1 (the
 * tightest fit: 2 tokens in 4 bytes) and a long one. */
START_TEST(test_read_in_place)
{
	uint16_t *t = seq(5000, 40503, 11, 65536);
	write_shard("ip.bin", t, 5000);
	static const int64_t ctxs[] = { 1, 2, 777 };
	for (size_t k = 0; k < sizeof ctxs / sizeof ctxs[0]; k++) {
		const int64_t T = ctxs[k];
		char c[32];
		snprintf(c, sizeof c, "data.context=%lld", (long long)T);
		OPEN_OK("data", "train", kv("data.path", "ip.bin"), c);
		int32_t *x = malloc((size_t)T * 4), *y = malloc((size_t)T * 4);
		for (int64_t w = 0; w < 4999 / T; w += 1 + 4999 / T / 7) {
			for (int m = 1; m < 4; m++) {
				memset(x, 0xee, (size_t)T * 4);
				memset(y, 0xee, (size_t)T * 4);
				ck_assert_int_eq(ops->read(ctx, w, m & 1 ? x : NULL, m & 2 ? y : NULL), KILN_OK);
				for (int64_t i = 0; i < T; i++) {
					if (m & 1)
						ck_assert_int_eq(x[i], t[w * T + i]);
					if (m & 2)
						ck_assert_int_eq(y[i], t[w * T + i + 1]);
				}
			}
		}
		ck_assert_int_eq(ops->read(ctx, 0, NULL, NULL), KILN_OK);
		free(x);
		free(y);
	}
	free(t);
}
END_TEST

/* Mutate src (n bytes) into dst: truncate, flip bytes, or rewrite one of
 * the first header words.  Returns the new size. */
static size_t mutate(uint8_t *dst, const uint8_t *src, size_t n)
{
	memcpy(dst, src, n);
	switch (next() % 4) {
	case 0:
		return next() % n;
	case 1:
		for (int k = 1 + (int)(next() % 4); k > 0; k--)
			dst[next() % n] ^= (uint8_t)(1 + next() % 255);
		return n;
	case 2: {
		uint32_t w = next() ^ (next() << 21);
		memcpy(dst + 4 * (next() % 3), &w, 4);
		return n;
	}
	default:
		dst[next() % n] ^= 0x80;
		return n - next() % (n / 2 + 1);
	}
}

START_TEST(test_fuzz)
{
	uint16_t *t = seq(300, 13, 5, 256);
	write_shard("f.bin", t, 300);
	size_t n;
	uint8_t *orig = read_whole("f.bin", &n), *mut = malloc(n);
	int opened = 0, refused = 0;
	for (int it = 0; it < 300; it++) {
		size_t m = mutate(mut, orig, n);
		remove(tpath("m.bin"));
		write_tmp("m.bin", mut, m);
		kiln_status st = open_tokens("data", "train", kv("data.path", "m.bin"),
					     "data.context=7", it % 2 ? "data.vocab=256" : "data.vocab=0",
					     NULL);
		if (st == KILN_OK) {
			struct kiln_source_info info;
			ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
			ck_assert_int_ge(info.len, 1);
			for (int64_t i = 0; i < info.len; i++) {
				int32_t x[7], y[7];
				ck_assert_int_eq(ops->read(ctx, i, x, y), KILN_OK);
				for (int k = 0; k < 7; k++)
					ck_assert(x[k] < info.classes && y[k] < info.classes);
			}
			opened++;
		} else {
			ck_assert_msg(st == KILN_EDATA || st == KILN_EIO, "iteration %d: %s: %s", it,
				      kiln_status_name(st), kiln_last_error());
			ck_assert_ptr_null(ctx);
			ck_assert_ptr_nonnull(strstr(kiln_last_error(), tmp));
			refused++;
		}
	}
	fprintf(stderr, "check_tokens: fuzz: %d mutations opened, %d refused\n", opened, refused);
	ck_assert_int_gt(refused, 100);
	ck_assert_int_gt(opened, 10);
	free(orig), free(mut), free(t);
}
END_TEST

/* ---- the loader: workers, world sizes, resume ------------------------- */

#include "data_rig.h" /* struct rig, over source_fixture's reg */

/* The data set over tmp/l.bin (4001 tokens, T = 8: 500 windows). */
static void rig_open_tokens(struct rig *r)
{
	char ini[2048];
	uint16_t *t = seq(4001, 7919, 3, 65521);
	write_shard("l.bin", t, 4001);
	free(t);
	snprintf(ini, sizeof ini, "[run]\nseed = 11\n[data]\nsource = tokens\npath = %s\ncontext = 8\n",
		 tpath("l.bin"));
	ck_assert_msg(rig_open(r, ini) == 0, "%s", kiln_last_error());
}

/* Batches of B of order[0..n) with `workers` (0: inline) into x (n x T
 * i32) and y (n x T). */
static void read_order(struct rig *r, int workers, int64_t ep, const int64_t *order, int64_t n,
		       int64_t B, int32_t *x, int32_t *y)
{
	const int64_t T = 8;
	struct kiln_loader *L = NULL;
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	if (workers) {
		ck_assert(kiln_loader_open(r->dev, &r->d, B, workers, 2, &L) == 0);
		ck_assert(kiln_loader_start(L, ep, order, n, B, 0) == 0);
	}
	for (int64_t b = 0; b < n / B; b++) {
		int32_t *xb = x + b * B * T, *yb = y + b * B * T;
		if (!L) {
			ck_assert_msg(kiln_dataset_read_rows(&r->d, ep, order + b * B, B, xb, yb,
							     &scr) == 0, "%s", kiln_last_error());
			continue;
		}
		const void *bx;
		const int32_t *by;
		int64_t rows;
		int slot;
		ck_assert_msg(kiln_loader_next(L, &bx, &by, &rows, &slot) == 0, "%s",
			      kiln_last_error());
		ck_assert_int_eq(rows, B);
		memcpy(xb, bx, (size_t)(B * T) * 4);
		memcpy(yb, by, (size_t)(B * T) * 4);
		ck_assert(kiln_loader_release(L, slot, r->copy) == 0);
	}
	kiln_loader_close(L);
	kiln_data_scratch_free(&scr);
}

/* One epoch's batches [B, T] are identical for 0, 1, 2, 4 workers; every
 * row is its window (targets shifted by one); ranks of world 2 together
 * read exactly world 1's windows, each at its global position; a resume at
 * a global offset continues with the same windows for world 1 and 2. */
START_TEST(test_loader_workers_world_resume)
{
	struct rig r;
	rig_open_tokens(&r);
	const int64_t n = r.d.len, T = 8, B = 10, ep = 2;
	ck_assert_int_eq(n, 500);
	ck_assert_int_eq(r.d.sample_bytes, T * 4);
	ck_assert_int_eq(r.d.label_bytes, T * 4);
	int64_t *perm = malloc(sizeof(int64_t) * (size_t)n), *mine = malloc(sizeof(int64_t) * (size_t)n);
	size_t bytes = (size_t)(n * T) * 4;
	int32_t *x0 = malloc(bytes), *y0 = malloc(bytes), *x = malloc(bytes), *y = malloc(bytes);
	kiln_rng_permutation(r.d.seed, (uint64_t)ep, perm, n);
	read_order(&r, 0, ep, perm, n, B, x0, y0);
	for (int64_t i = 0; i < n; i++) /* window perm[i]: tokens from perm[i] * T */
		for (int64_t t = 0; t < T; t++) {
			int64_t w = perm[i] * T + t;
			ck_assert_int_eq(x0[i * T + t], (int32_t)((w * 7919 + 3) % 65521));
			ck_assert_int_eq(y0[i * T + t], (int32_t)(((w + 1) * 7919 + 3) % 65521));
		}
	static const int workers[] = { 1, 2, 4 };
	for (int k = 0; k < 3; k++) {
		memset(x, 0xab, bytes);
		read_order(&r, workers[k], ep, perm, n, B, x, y);
		ck_assert_msg(!memcmp(x, x0, bytes) && !memcmp(y, y0, bytes),
			      "%d workers: batches differ", workers[k]);
	}
	/* world 2 (and a resume at g as world 1 and 2): rank r's row k is
	 * global position g + r + k * world */
	static const int64_t starts[] = { 0, 120 };
	for (int s = 0; s < 2; s++)
		for (int world = 1; world <= 2; world++) {
			int64_t covered = 0;
			for (int rank = 0; rank < world; rank++) {
				int64_t len = kiln_shard(perm, n, starts[s], rank, world, 1, mine);
				read_order(&r, 2, ep, mine, len / B * B, B, x, y);
				for (int64_t k = 0; k < len / B * B; k++) {
					int64_t pos = starts[s] + rank + k * world;
					ck_assert_msg(!memcmp(x + k * T, x0 + pos * T, (size_t)T * 4) &&
						      !memcmp(y + k * T, y0 + pos * T, (size_t)T * 4),
						      "world %d rank %d row %lld (global %lld) differs", world,
						      rank, (long long)k, (long long)pos);
				}
				covered += len / B * B;
			}
			ck_assert_int_eq(covered, n - starts[s]);
		}
	free(perm), free(mine), free(x0), free(y0), free(x), free(y);
	rig_close(&r);
}
END_TEST

/* A label (target) outside [0, classes) names the target. */
START_TEST(test_dataset_checks_targets)
{
	struct rig r;
	rig_open_tokens(&r);
	r.d.classes = 1000; /* as if the vocabulary were smaller than the data */
	struct kiln_data_scratch scr;
	memset(&scr, 0, sizeof scr);
	int32_t x[8], y[8];
	int64_t idx = 3;
	ck_assert_int_eq(kiln_dataset_read_rows(&r.d, 0, &idx, 1, x, y, &scr), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "target"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "sample 3"));
	kiln_data_scratch_free(&scr);
	rig_close(&r);
}
END_TEST

/* The graph takes i32 [B, T] token ids as they come (no widening, no cast
 * to the compute dtype), and refuses, naming the layer, a first layer that
 * would pass them on as numbers instead of mapping them to vectors. */
START_TEST(test_graph_token_input)
{
	struct rig r;
	struct kiln_model *m = NULL;
	struct kiln_tensor_desc in;
	rig_open_tokens(&r);
	kiln_dataset_input_desc(&r.d, &in);
	ck_assert_int_eq(kiln_dataset_widened(&r.d), 0);
	ck_assert_int_eq(in.dtype, KILN_I32);
	ck_assert_int_eq(in.ndim, 1);
	ck_assert_int_eq(in.dims[0], 8);
	struct kiln_config *cfg2 = test_config(reg, "[data]\nsource = tokens\ncontext = 8\n"
					       "[layer.fc]\ntype = linear\nout = 16\n"
					       "[layer.loss]\ntype = softmax_xent\n");
	ck_assert_int_eq(kiln_model_create(cfg2, reg, r.dev, &in, &m), KILN_ECONFIG);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "layer 'fc'"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "embedding"));
	kiln_config_free(cfg2);
	rig_close(&r);
}
END_TEST

/* ---- tokenizers ------------------------------------------------------- */

START_TEST(test_bytes_round_trip)
{
	struct tokenizer *tk;
	ck_assert_int_eq(tokenizer_open_bytes(&tk), KILN_OK);
	ck_assert_int_eq(tokenizer_vocab(tk), 256);
	ck_assert_int_eq(tokenizer_eot(tk), -1);
	char text[512];
	for (int i = 0; i < 512; i++)
		text[i] = (char)(i * 37 + 5);
	struct token_ids ids = { 0 };
	ck_assert_int_eq(tokenizer_encode(tk, text, sizeof text, &ids), KILN_OK);
	ck_assert_uint_eq(ids.n, sizeof text);
	for (size_t i = 0; i < ids.n; i++)
		ck_assert_int_eq(ids.v[i], (unsigned char)text[i]);
	char *back;
	size_t len;
	ck_assert_int_eq(tokenizer_decode(tk, ids.v, ids.n, &back, &len), KILN_OK);
	ck_assert_uint_eq(len, sizeof text);
	ck_assert(!memcmp(back, text, len));
	free(back);
	ids.v[3] = 256;
	ck_assert_int_eq(tokenizer_decode(tk, ids.v, ids.n, &back, &len), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "position 3"));
	free(ids.v);
	tokenizer_close(tk);
}
END_TEST

static struct tokenizer *open_ref_bpe(void)
{
	char v[1024], m[1024];
	struct tokenizer *tk;
	test_data_path(v, sizeof v, "bpe/vocab.json");
	test_data_path(m, sizeof m, "bpe/merges.txt");
	ck_assert_msg(tokenizer_open_bpe(v, m, &tk) == KILN_OK, "%s", kiln_last_error());
	return tk;
}

/* Every reference text encodes to the reference ids and decodes back. */
START_TEST(test_bpe_refs)
{
	char p[1024];
	json_error_t err;
	struct tokenizer *tk = open_ref_bpe();
	json_t *refs = json_load_file(test_data_path(p, sizeof p, "bpe/refs.json"), 0, &err);
	ck_assert_msg(refs != NULL, "%s: %s", p, err.text);
	ck_assert_int_eq(tokenizer_vocab(tk), 377);
	ck_assert_int_eq(tokenizer_eot(tk), 376);
	size_t i;
	json_t *ref;
	json_array_foreach(refs, i, ref) {
		const char *text = json_string_value(json_object_get(ref, "text"));
		size_t tl = json_string_length(json_object_get(ref, "text"));
		json_t *want = json_object_get(ref, "ids");
		struct token_ids ids = { 0 };
		ck_assert_int_eq(tokenizer_encode(tk, text, tl, &ids), KILN_OK);
		ck_assert_msg(ids.n == json_array_size(want), "text %zu: %zu ids, want %zu", i, ids.n,
			      json_array_size(want));
		for (size_t k = 0; k < ids.n; k++)
			ck_assert_msg(ids.v[k] == json_integer_value(json_array_get(want, k)),
				      "text %zu id %zu: %d, want %lld", i, k, ids.v[k],
				      (long long)json_integer_value(json_array_get(want, k)));
		char *back;
		size_t len;
		ck_assert_int_eq(tokenizer_decode(tk, ids.v, ids.n, &back, &len), KILN_OK);
		ck_assert_uint_eq(len, tl);
		ck_assert(!memcmp(back, text, len));
		free(back);
		free(ids.v);
	}
	ck_assert_uint_ge(json_array_size(refs), 10);
	json_decref(refs);
	tokenizer_close(tk);
}
END_TEST

/* Bad vocabularies and merges name the file (and line). */
START_TEST(test_bpe_errors)
{
	char v[1024], m[1024];
	struct tokenizer *tk = NULL;
	test_data_path(v, sizeof v, "bpe/vocab.json");
	test_data_path(m, sizeof m, "bpe/merges.txt");
	write_tmp("m.txt", "#version: 0.2\nh e\nq zz\n", 23);
	ck_assert_int_eq(tokenizer_open_bpe(v, tpath("m.txt"), &tk), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "m.txt:3"));
	write_tmp("m.txt", "#version: 0.2\nhe\n", 18);
	ck_assert_int_eq(tokenizer_open_bpe(v, tpath("m.txt"), &tk), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "m.txt:2"));
	write_tmp("v.json", "{\"a\": 0}", 8);
	ck_assert_int_eq(tokenizer_open_bpe(tpath("v.json"), m, &tk), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "no token"));
	write_tmp("v.json", "[1, 2", 5);
	ck_assert_int_eq(tokenizer_open_bpe(tpath("v.json"), m, &tk), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "v.json"));
	ck_assert_int_eq(tokenizer_open_bpe(tpath("none.json"), m, &tk), KILN_EIO);
	ck_assert_ptr_null(tk);
}
END_TEST

/* A merges file that makes fewer tokens than the vocabulary holds (cut
 * short, or empty) is refused naming it and the first token no merge
 * makes (before session 33 it was accepted and tokenized differently). */
START_TEST(test_bpe_merges_truncated)
{
	char v[1024], m[1024];
	struct tokenizer *tk = NULL;
	test_data_path(v, sizeof v, "bpe/vocab.json");
	test_data_path(m, sizeof m, "bpe/merges.txt");
	/* the version line and the first 60 of the 120 merges: id 316 ("42",
	 * made by a later merge) the first token left unmade */
	FILE *f = fopen(m, "r");
	ck_assert_ptr_nonnull(f);
	char all[8192];
	size_t len = fread(all, 1, sizeof all - 1, f);
	fclose(f);
	all[len] = 0;
	char *end = all;
	for (int i = 0; i < 61; i++) {
		end = strchr(end, '\n');
		ck_assert_ptr_nonnull(end);
		end++;
	}
	len = (size_t)(end - all);
	write_tmp("cut.txt", all, len);
	ck_assert_int_eq(tokenizer_open_bpe(v, tpath("cut.txt"), &tk), KILN_EDATA);
	ck_assert_ptr_null(tk);
	char want[1400];
	snprintf(want, sizeof want, "%s: 60 token(s) of the vocabulary are made by no merge, the first \"42\" (id 316)",
		 tpath("cut.txt"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	/* empty: all 120 */
	write_tmp("empty.txt", "", 0);
	ck_assert_int_eq(tokenizer_open_bpe(v, tpath("empty.txt"), &tk), KILN_EDATA);
	snprintf(want, sizeof want, "%s: 120 token(s) of the vocabulary are made by no merge, the first \"he\" (id 256)",
		 tpath("empty.txt"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	/* the whole file: accepted */
	ck_assert_int_eq(tokenizer_open_bpe(v, m, &tk), KILN_OK);
	tokenizer_close(tk);
}
END_TEST

static char warned[2048];
static void keep_warning(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)who;
	if (level == KILN_LOG_WARN)
		snprintf(warned, sizeof warned, "%s", msg);
}

/* Tokens no merge makes that are not a cut-short tail: RoBERTa-style
 * specials ("<s>", "<pad>", "</s>", "<unk>", "<mask>") after the merges'
 * tokens are accepted quietly, a token left unmade among the made ones
 * with a warning; the merges cut short are still refused with them. */
START_TEST(test_bpe_merges_specials)
{
	char v[1024], m[1024];
	struct tokenizer *tk = NULL;
	test_data_path(v, sizeof v, "bpe/vocab.json");
	test_data_path(m, sizeof m, "bpe/merges.txt");
	char all[16384];
	FILE *f = fopen(v, "r");
	ck_assert_ptr_nonnull(f);
	size_t len = fread(all, 1, sizeof all - 200, f);
	fclose(f);
	while (len && all[len - 1] != '}')
		len--;
	ck_assert_uint_gt(len, 0);
	len += (size_t)sprintf(all + len - 1, ", \"<s>\": 377, \"<pad>\": 378, \"</s>\": 379, \"<unk>\": 380, \"[unused0]\": 381, \"<mask>\": 382}") - 1;
	write_tmp("roberta.json", all, len);
	const int level = kiln_log_get_level(); /* (the fixture's: errors only) */
	kiln_log_set_level(KILN_LOG_WARN);
	kiln_log_set_sink(keep_warning, NULL);
	warned[0] = 0;
	ck_assert_msg(tokenizer_open_bpe(tpath("roberta.json"), m, &tk) == KILN_OK, "%s",
		      kiln_last_error());
	tokenizer_close(tk);
	ck_assert_str_eq(warned, "");
	/* the first merge ("h e" makes id 256) left out: a warning naming it */
	f = fopen(m, "r");
	ck_assert_ptr_nonnull(f);
	len = fread(all, 1, sizeof all - 1, f);
	fclose(f);
	all[len] = 0;
	char *l1 = strchr(all, '\n') + 1, *l2 = strchr(l1, '\n') + 1;
	memmove(l1, l2, len + 1 - (size_t)(l2 - all));
	len -= (size_t)(l2 - l1);
	write_tmp("m-1.txt", all, len);
	ck_assert_msg(tokenizer_open_bpe(tpath("roberta.json"), tpath("m-1.txt"), &tk) == KILN_OK,
		      "%s", kiln_last_error());
	tokenizer_close(tk);
	char want[1400];
	snprintf(want, sizeof want, "%s: 1 token(s) of the vocabulary are made by no merge, the first \"he\" (id 256): they are read only as whole tokens",
		 tpath("m-1.txt"));
	ck_assert_msg(strstr(warned, want), "%s", warned);
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	/* cut short after 60 merges: still refused, the specials aside */
	f = fopen(m, "r");
	ck_assert_ptr_nonnull(f);
	len = fread(all, 1, sizeof all - 1, f);
	fclose(f);
	all[len] = 0;
	char *end = all;
	for (int i = 0; i < 61; i++) /* the version line and 60 merges */
		end = strchr(end, '\n') + 1;
	write_tmp("cut60.txt", all, (size_t)(end - all));
	ck_assert_int_eq(tokenizer_open_bpe(tpath("roberta.json"), tpath("cut60.txt"), &tk), KILN_EDATA);
	ck_assert_ptr_null(tk);
	snprintf(want, sizeof want, "%s: 60 token(s) of the vocabulary are made by no merge, the first \"42\" (id 316), and they are the ids above every merge's",
		 tpath("cut60.txt"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
}
END_TEST

/* ---- kiln pack --format tokens ---------------------------------------- */

/* Pack two text files byte-level with a val fraction and read them back
 * through the source: every token is the text's byte, in order. */
START_TEST(test_pack_bytes)
{
	char a[300], b[200], cmd[4096];
	for (size_t i = 0; i < sizeof a; i++)
		a[i] = (char)('a' + i % 26);
	for (size_t i = 0; i < sizeof b; i++)
		b[i] = (char)('0' + i % 10);
	write_tmp("a.txt", a, sizeof a);
	write_tmp("b.txt", b, sizeof b);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s %s --out %s --val-fraction 0.1 --shard-tokens 250 >/dev/null",
		 KILN_BIN, tpath("a.txt"), tpath("b.txt"), tpath("out"));
	ck_assert_int_eq(system(cmd), 0);
	/* train: a[0..270) b[0..180) = 450 tokens in shards of 250, 200; val:
	 * a[270..300) b[180..200) = 50 */
	size_t n;
	uint8_t *s0 = read_whole("out/train-000000.bin", &n);
	ck_assert_uint_eq(n, 1024 + 500);
	ck_assert_int_eq(s0[0] | s0[1] << 8 | s0[2] << 16 | s0[3] << 24, 20240520);
	ck_assert_int_eq(s0[4], 1);
	ck_assert_int_eq(s0[8] | s0[9] << 8, 250);
	free(s0);
	OPEN_OK("data", "train", kv("data.path", "out"), "data.context=1");
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 249 + 199);
	int32_t x, y;
	ck_assert_int_eq(ops->read(ctx, 0, &x, &y), KILN_OK);
	ck_assert_int_eq(x, 'a');
	ck_assert_int_eq(y, 'b');
	ck_assert_int_eq(ops->read(ctx, 249, &x, &y), KILN_OK); /* shard 1: a[250..270) b... */
	ck_assert_int_eq(x, a[250]);
	ck_assert_int_eq(ops->read(ctx, 249 + 20, &x, &y), KILN_OK);
	ck_assert_int_eq(x, '0');
	OPEN_OK("data.eval", "test", kv("data.path", "out"), "data.context=1");
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 49);
	ck_assert_int_eq(ops->read(ctx, 0, &x, &y), KILN_OK);
	ck_assert_int_eq(x, a[270]);
	/* a second pack refuses to overwrite without --force (usage: exit 2);
	 * a missing input is refused before any work (exit 2, session 36: it
	 * was a data error, 3), and so is a directory (exit 2, session 50: it
	 * was 3); one that fails as it is read is a data error (exit 3): a
	 * symbolic link to itself */
	int rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s 2>/dev/null", KILN_BIN,
		 tpath("none.txt"), tpath("out2"));
	rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
	ck_assert_int_eq(mkdir(tpath("dir.txt"), 0777), 0);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s 2>/dev/null", KILN_BIN,
		 tpath("dir.txt"), tpath("out3"));
	rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
	ck_assert_int_eq(symlink("loop.txt", tpath("loop.txt")), 0);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s 2>/dev/null", KILN_BIN,
		 tpath("loop.txt"), tpath("out4"));
	rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 3);
}
END_TEST

/* kiln pack records in each token shard's header (ints 3..6, zero in
 * llm.c's) 1, its index, the split's shard count and the pack's id: a
 * split missing its last shard (no gap shows it: before session 34 it was
 * read short) is refused naming the file; a subset in `shards` is read,
 * one shard listed twice is not; a corrupt record is refused. */
START_TEST(test_pack_last_shard)
{
	char a[600], cmd[4096], want[1400];
	for (size_t i = 0; i < sizeof a; i++)
		a[i] = (char)('a' + i % 26);
	write_tmp("a.txt", a, sizeof a);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s --shard-tokens 250 >/dev/null",
		 KILN_BIN, tpath("a.txt"), tpath("out"));
	ck_assert_int_eq(system(cmd), 0);
	size_t n;
	uint8_t *h = read_whole("out/train-000001.bin", &n);
	int32_t v[7];
	for (int i = 0; i < 7; i++)
		v[i] = (int32_t)(h[4 * i] | h[4 * i + 1] << 8 | h[4 * i + 2] << 16 |
				 (uint32_t)h[4 * i + 3] << 24);
	ck_assert_int_eq(v[2], 250);
	ck_assert_int_eq(v[3], 1);
	ck_assert_int_eq(v[4], 1); /* shard 1 */
	ck_assert_int_eq(v[5], 3); /* of 3: 250, 250, 100 tokens */
	OPEN_OK("data", "train", kv("data.path", "out"), "data.context=4");
	ck_assert_int_eq(rename(tpath("out/train-000002.bin"), tpath("keep")), 0);
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "out"), "data.context=4", NULL),
			 KILN_EDATA);
	snprintf(want, sizeof want, "%s is missing: the split's shards record a pack of 3 shard(s)",
		 tpath("out/train-000002.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	OPEN_OK("data", "train", kv("data.path", "out"), "data.shards=train-000001.bin", "data.context=4");
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "out"),
				     "data.shards=train-000000.bin,train-000001.bin,train-000000.bin",
				     "data.context=4", NULL),
			 KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "are the same shard 0 of a pack of 3"), "%s",
		      kiln_last_error());
	ck_assert_int_eq(rename(tpath("keep"), tpath("out/train-000002.bin")), 0);
	h[16] = 3; /* index 3 of 3 */
	write_tmp("out/train-000001.bin", h, n);
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "out"), "data.context=4", NULL),
			 KILN_EDATA);
	snprintf(want, sizeof want, "%s: header ints 3..5 (1, 3, 3)", tpath("out/train-000001.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	free(h);
}
END_TEST

/* The pack's id covers where the shards are cut (cli pack_id): the same
 * text into as many shards of another size (--shard-tokens 250: 250, 250,
 * 100 tokens; 220: 220, 220, 160) is another pack, so a directory of the
 * first two shards of one and the last of the other is refused, naming
 * two files.  Before, the id was the tokens' CRC alone, one for both, and
 * the mix read 660 tokens (440..499 twice), exit 0.  The same text cut the
 * same way packs to the same bytes. */
START_TEST(test_pack_mix_cuts)
{
	char a[600], cmd[4096], want[1400];
	for (size_t i = 0; i < sizeof a; i++)
		a[i] = (char)('a' + i % 26);
	write_tmp("a.txt", a, sizeof a);
	static const struct { const char *out, *tokens; } p[3] = {
		{ "p250", "250" }, { "p220", "220" }, { "q250", "250" } };
	for (int k = 0; k < 3; k++) {
		snprintf(cmd, sizeof cmd,
			 "%s pack --format tokens %s --out %s --shard-tokens %s >/dev/null",
			 KILN_BIN, tpath("a.txt"), tpath(p[k].out), p[k].tokens);
		ck_assert_int_eq(system(cmd), 0);
	}
	size_t n250, n220, nq;
	uint8_t *h250 = read_whole("p250/train-000002.bin", &n250);
	uint8_t *h220 = read_whole("p220/train-000002.bin", &n220);
	uint8_t *hq = read_whole("q250/train-000002.bin", &nq);
	ck_assert_int_eq(h250[20], 3); /* both of 3 shards */
	ck_assert_int_eq(h220[20], 3);
	ck_assert_msg(memcmp(h250 + 24, h220 + 24, 4), "one pack id for two cuts of the text");
	ck_assert_int_eq(nq, n250);
	ck_assert_int_eq(memcmp(hq, h250, nq), 0);

	mkdir(tpath("mix"), 0700);
	ck_assert_int_eq(rename(tpath("p250/train-000000.bin"), tpath("mix/train-000000.bin")), 0);
	ck_assert_int_eq(rename(tpath("p250/train-000001.bin"), tpath("mix/train-000001.bin")), 0);
	ck_assert_int_eq(rename(tpath("p220/train-000002.bin"), tpath("mix/train-000002.bin")), 0);
	ck_assert_int_eq(open_tokens("data", "train", kv("data.path", "mix"), "data.context=4", NULL),
			 KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "are of two different packs"), "%s",
		      kiln_last_error());
	snprintf(want, sizeof want, "%s (shard 2 of 3, pack ", tpath("mix/train-000002.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	snprintf(want, sizeof want, "%s (shard 0 of 3, pack ", tpath("mix/train-000000.bin"));
	char want1[1400];
	snprintf(want1, sizeof want1, "%s (shard 1 of 3, pack ", tpath("mix/train-000001.bin"));
	ck_assert_msg(strstr(kiln_last_error(), want) || strstr(kiln_last_error(), want1), "%s",
		      kiln_last_error());
	free(h250);
	free(h220);
	free(hq);
}
END_TEST

/* A pack killed midway (SIGKILL while it waits to open its second input, a
 * FIFO, with the first file's full shard complete as .tmp and the next one
 * open) leaves only its .tmp shards: no marker and no shard in place, so
 * no split to read short (since session 33 the shards are renamed into
 * place only when every input is encoded; before, the first was in place
 * and DIR/train.bin-partial marked the split).  A rerun (without --force:
 * nothing of the killed pack is a shard) removes the stale *.bin.tmp of
 * its splits (another split's stay), saying so, and ends with no marker. */
START_TEST(test_pack_killed)
{
	char a[300], cmd[4096];
	for (size_t i = 0; i < sizeof a; i++)
		a[i] = (char)('a' + i % 26);
	write_tmp("a.txt", a, sizeof a);
	ck_assert_int_eq(mkfifo(tpath("fifo"), 0600), 0);
	mkdir(tpath("out"), 0700);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		execl(KILN_BIN, KILN_BIN, "pack", "--format", "tokens", tpath("a.txt"),
		      tpath("fifo"), "--out", tpath("out"), "--shard-tokens", "250", (char *)NULL);
		_exit(127);
	}
	struct stat sb;
	for (int i = 0; i < 1000 && stat(tpath("out/train-000001.bin.tmp"), &sb); i++)
		usleep(10000);
	ck_assert_int_eq(stat(tpath("out/train-000001.bin.tmp"), &sb), 0);
	usleep(100000); /* it blocks opening the FIFO: the second shard is open */
	kill(pid, SIGKILL);
	int ws;
	ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
	ck_assert(WIFSIGNALED(ws));
	ck_assert_int_ne(stat(tpath("out/train.bin-partial"), &sb), 0);
	ck_assert_int_ne(stat(tpath("out/train-000000.bin"), &sb), 0);
	ck_assert_int_eq(stat(tpath("out/train-000000.bin.tmp"), &sb), 0);
	ck_assert_int_eq(stat(tpath("out/train-000001.bin.tmp"), &sb), 0);

	write_tmp("out/train-000007.bin.tmp", "x", 1);
	write_tmp("out/test-000000.bin.tmp", "x", 1);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s --shard-tokens 250 >/dev/null 2>%s",
		 KILN_BIN, tpath("a.txt"), tpath("out"), tpath("err"));
	ck_assert_int_eq(system(cmd), 0);
	size_t n;
	char *err = (char *)read_whole("err", &n), want[1200];
	err[n] = 0;
	/* train-000000 and 000001.bin.tmp of the killed pack, and 000007 */
	snprintf(want, sizeof want, "kiln pack: removed 3 stale %s/train-*.bin.tmp file(s) of an interrupted pack",
		 tpath("out"));
	ck_assert_msg(strstr(err, want), "stderr: %s", err);
	free(err);
	ck_assert_int_ne(stat(tpath("out/train-000007.bin.tmp"), &sb), 0);
	ck_assert_int_eq(stat(tpath("out/test-000000.bin.tmp"), &sb), 0);
	ck_assert_int_ne(stat(tpath("out/train.bin-partial"), &sb), 0);
	ck_assert_int_ne(stat(tpath("out/val.bin-partial"), &sb), 0);
	OPEN_OK("data", "train", kv("data.path", "out"), "data.context=1");
	struct kiln_source_info info;
	ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
	ck_assert_int_eq(info.len, 249 + 49);
}
END_TEST

/* A pack that fails (an unreadable second input: a symbolic link to
 * itself; a missing one is refused before any work since session 36, a
 * directory since session 50) removes what it wrote, the shards of its
 * first input included, and its markers. */
START_TEST(test_pack_failed_leaves_nothing)
{
	char a[300], cmd[4096];
	memset(a, 'q', sizeof a);
	write_tmp("a.txt", a, sizeof a);
	ck_assert_int_eq(symlink("loop.txt", tpath("loop.txt")), 0);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s %s --out %s --shard-tokens 100 2>/dev/null",
		 KILN_BIN, tpath("a.txt"), tpath("loop.txt"), tpath("out"));
	int rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 3);
	DIR *d = opendir(tpath("out"));
	ck_assert_ptr_nonnull(d);
	struct dirent *e;
	while ((e = readdir(d)))
		ck_assert_msg(e->d_name[0] == '.', "a failed pack left %s", e->d_name);
	closedir(d);
}
END_TEST

/* A pack whose val split cannot be begun (its marker's path a directory)
 * fails (exit 1) naming it, and takes back the train split's marker it
 * had made (before session 30: train.bin-partial stayed, and the source
 * refused the split until the next pack). */
START_TEST(test_pack_val_begin_fails)
{
	char a[300], cmd[4096];
	memset(a, 'q', sizeof a);
	write_tmp("a.txt", a, sizeof a);
	ck_assert_int_eq(mkdir(tpath("out"), 0700), 0);
	ck_assert_int_eq(mkdir(tpath("out/val.bin-partial"), 0700), 0);
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --out %s --shard-tokens 100 >/dev/null 2>%s",
		 KILN_BIN, tpath("a.txt"), tpath("out"), tpath("err"));
	int rc = system(cmd);
	ck_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
	size_t n;
	char *err = (char *)read_whole("err", &n), want[1200];
	err[n] = 0;
	snprintf(want, sizeof want, "%s/val.bin-partial: cannot create", tpath("out"));
	ck_assert_msg(strstr(err, want), "stderr: %s", err);
	free(err);
	struct stat sb;
	ck_assert_int_ne(stat(tpath("out/train.bin-partial"), &sb), 0);
	ck_assert_int_ne(stat(tpath("out/train-000000.bin"), &sb), 0);
}
END_TEST

/* With the reference BPE: <|endoftext|> then the file's ids. */
START_TEST(test_pack_bpe)
{
	char v[1024], m[1024], p[1024], cmd[8192];
	json_error_t err;
	test_data_path(v, sizeof v, "bpe/vocab.json");
	test_data_path(m, sizeof m, "bpe/merges.txt");
	json_t *refs = json_load_file(test_data_path(p, sizeof p, "bpe/refs.json"), 0, &err);
	ck_assert_ptr_nonnull(refs);
	json_t *ref = json_array_get(refs, 0);
	const char *text = json_string_value(json_object_get(ref, "text"));
	json_t *want = json_object_get(ref, "ids");
	write_tmp("t.txt", text, strlen(text));
	snprintf(cmd, sizeof cmd, "%s pack --format tokens %s --vocab %s --merges %s --out %s >/dev/null",
		 KILN_BIN, tpath("t.txt"), v, m, tpath("o"));
	ck_assert_int_eq(system(cmd), 0);
	size_t n;
	uint8_t *s = read_whole("o/train-000000.bin", &n);
	ck_assert_uint_eq(n, 1024 + 2 * (json_array_size(want) + 1));
	ck_assert_int_eq(s[1024] | s[1025] << 8, 376);
	for (size_t k = 0; k < json_array_size(want); k++)
		ck_assert_int_eq(s[1026 + 2 * k] | s[1027 + 2 * k] << 8,
				 json_integer_value(json_array_get(want, k)));
	free(s);
	json_decref(refs);
}
END_TEST

static Suite *make_tokens_suite(void)
{
	Suite *s = suite_create("tokens");
	check_add_case(s, "source", 0, setup, teardown, (const TTest *[]){
		test_windows_exact, test_splits_and_globs, test_val_fraction, test_vocab, test_shard_gap,
		NULL });
	check_add_case(s, "corrupt", 0, setup, teardown, (const TTest *[]){
		test_corrupt, test_truncated_while_open, test_read_in_place, test_fd_headroom, NULL });
	check_add_case(s, "fuzz", 120, setup, teardown, (const TTest *[]){ test_fuzz, NULL });
	check_add_case(s, "loader", 60, setup, teardown, (const TTest *[]){
		test_loader_workers_world_resume, test_dataset_checks_targets, test_graph_token_input,
		NULL });
	check_add_case(s, "tokenizer", 0, setup, teardown, (const TTest *[]){
		test_bytes_round_trip, test_bpe_refs, test_bpe_errors, test_bpe_merges_truncated, test_bpe_merges_specials,
		NULL });
	check_add_case(s, "pack", 60, setup, teardown, (const TTest *[]){
		test_pack_bytes, test_pack_bpe, test_pack_killed, test_pack_failed_leaves_nothing,
		test_pack_val_begin_fails, test_pack_last_shard, test_pack_mix_cuts, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_tokens_suite, .omp_passive = 1 };
