/* plugins/loaders/seq2seq.c - the `seq2seq` data source: digit strings and
 * their reversal (or sorted order), for sequence-to-sequence models whose
 * data kiln makes itself (examples/seq2seq.ini, docs/rnn.md); or their
 * digit sum mod 10, one class per string, for sequence classifiers
 * (examples/seq_classify.ini).
 *
 * Sample i is a string of n digits, min_length <= n <= length, as token ids
 * i32 [length]: digit d is d + 1, the positions after the string are the pad
 * id 0.  Its label is i32 [length]: the target string (the digits reversed,
 * or sorted ascending) in the same ids, then 0 where the input is padded
 * (a loss with ignore_index = 0 leaves those out).  With task = sum the
 * label is one class, i32 (a scalar): the sum of the digits mod 10.
 *
 * The string is a pure function of (index, split): draws of a splitmix64
 * hash of the index, the attempt and the split's salt.  The splits are
 * disjoint by construction: a string belongs to the validation side when
 * a hash of its digits is 0 mod 10, so `train` rejects such draws and every
 * other split (test, val) keeps only them.  No files, no state: thread-safe.
 */
#include "loaders.h"

#include <inttypes.h> /* PRId64 */
#include <stdlib.h>   /* calloc, free */
#include <string.h>   /* strcmp */

#define S2S_MAX_LEN 4096

enum { S2S_REVERSE, S2S_SORT, S2S_SUM };
static const char *const s2s_tasks[] = { "reverse", "sort", "sum" };

struct s2s_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	int64_t len, min_len;
	int task;     /* S2S_REVERSE, S2S_SORT, S2S_SUM */
	int held_out; /* this split reads the validation strings */
	uint64_t salt;
};

static const struct kiln_key s2s_keys[] = {
	{ "samples", KILN_KEY_INT, "20000", 1, 1e12, NULL, "Number of strings in the split." },
	{ "length", KILN_KEY_INT, "8", 1, S2S_MAX_LEN, NULL,
	  "T: the longest string, and the sample and label length (tokens)." },
	{ "min_length", KILN_KEY_INT, "0", 0, S2S_MAX_LEN, NULL,
	  "The shortest string (0: `length`, every string full); shorter strings are padded with id 0." },
	{ "task", KILN_KEY_ENUM, "reverse", 0, 0, "reverse|sort|sum",
	  "The label: the digits reversed, or sorted ascending (i32 [length]); or `sum`: one class, the sum of the digits mod 10 (i32, 10 classes: a sequence classifier's label)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* splitmix64's finaliser */
static uint64_t s2s_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void s2s_close(void *vctx)
{
	free(vctx);
}

/* The split a string belongs to: 1 = held out (validation). */
static int s2s_held_out(const int32_t *x, int64_t n)
{
	uint64_t h = 0x5eed;
	for (int64_t t = 0; t < n; t++)
		h = s2s_mix(h ^ (uint64_t)x[t]);
	return h % 10 == 0;
}

/* Whether split `held_out` has a string of min_len..len digits at all:
 * short strings are few (length 1: ten, none held out), and a split with
 * none would draw forever.  Counted where they are few (up to 4 digits:
 * 11,110 strings); longer ones have both splits by far. */
static int s2s_split_has(int64_t min_len, int64_t len, int held_out)
{
	int32_t x[4];
	if (len > 4)
		return 1;
	for (int64_t n = min_len; n <= len; n++) {
		int64_t count = 1;
		for (int64_t t = 0; t < n; t++)
			count *= 10;
		for (int64_t k = 0; k < count; k++) {
			int64_t v = k;
			for (int64_t t = 0; t < n; t++, v /= 10)
				x[t] = (int32_t)(1 + v % 10);
			if (s2s_held_out(x, n) == held_out)
				return 1;
		}
	}
	return 0;
}

static kiln_status s2s_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	int64_t n = 20000, len = 8, min_len = 0;
	kiln_status st;
	*out = NULL;
	if (((st = host->config_get_int(cfg, section, "samples", &n)) && st != KILN_ENOTFOUND) ||
	    ((st = host->config_get_int(cfg, section, "length", &len)) && st != KILN_ENOTFOUND) ||
	    ((st = host->config_get_int(cfg, section, "min_length", &min_len)) &&
	     st != KILN_ENOTFOUND))
		return st;
	const char *task = host->config_get(cfg, section, "task");
	if (len < 1 || len > S2S_MAX_LEN || min_len < 0 || min_len > len)
		return host->error(KILN_ECONFIG, "%s: [%s] length = %" PRId64 ", min_length = %" PRId64 ": need 1 <= length <= %d and min_length <= length",
				   host->config_where(cfg, section, "length"), section, len, min_len,
				   S2S_MAX_LEN);
	int kind = S2S_REVERSE;
	while (task && kind <= S2S_SUM && strcmp(task, s2s_tasks[kind]))
		kind++;
	if (kind > S2S_SUM)
		return host->error(KILN_ECONFIG, "%s: [%s] task = '%s': reverse, sort or sum",
				   host->config_where(cfg, section, "task"), section, task);
	struct s2s_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	c->src.who = "seq2seq";
	c->src.n = n;
	c->src.classes = kind == S2S_SUM ? 10 : 11; /* the sums; or pad + ten digits */
	c->len = len;
	c->min_len = min_len ? min_len : len;
	c->task = kind;
	c->held_out = split && strcmp(split, "train");
	if (!s2s_split_has(c->min_len, len, c->held_out)) {
		free(c);
		return host->error(KILN_ECONFIG, "%s: [%s] length = %" PRId64 "%s: no string of %" PRId64 "..%" PRId64 " digits falls in the %s split (a tenth of the strings, by their hash, are held out for evaluation): use length >= 2",
				   host->config_where(cfg, section, "length"), section, len,
				   min_len ? " with its min_length" : "", min_len ? min_len : len, len,
				   split && strcmp(split, "train") ? "held-out" : "training");
	}
	for (const char *p = split ? split : "train"; *p; p++)
		c->salt = s2s_mix(c->salt ^ (uint8_t)*p);
	host->log(KILN_LOG_INFO, "seq2seq", "[%s] %" PRId64 " %s strings of %" PRId64 "..%" PRId64 " digits (%s split)",
		  section, n, s2s_tasks[c->task], c->min_len, len,
		  c->held_out ? "held-out" : "training");
	*out = c;
	return KILN_OK;
}

static kiln_status s2s_info(void *vctx, struct kiln_source_info *info)
{
	const struct s2s_ctx *c = vctx;
	loaders_sequence_info(&c->src, c->len, info);
	if (c->task == S2S_SUM)
		info->label.ndim = 0; /* one class */
	return KILN_OK;
}

/* Draw attempt a of sample `index`: its length and digits into x (ids). */
static int64_t s2s_draw(const struct s2s_ctx *c, int64_t index, uint64_t a, int32_t *x)
{
	uint64_t h = s2s_mix(s2s_mix((uint64_t)index ^ c->salt) + a);
	const int64_t n = c->min_len + (int64_t)(h % (uint64_t)(c->len - c->min_len + 1));
	for (int64_t t = 0; t < c->len; t++) {
		h = s2s_mix(h);
		x[t] = t < n ? (int32_t)(1 + h % 10) : 0;
	}
	return n;
}

static kiln_status s2s_read(void *vctx, int64_t index, void *sample, void *label)
{
	const struct s2s_ctx *c = vctx;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	int32_t *x = sample, *y = label;
	int64_t n = 0;
	for (uint64_t a = 0;; a++) { /* expected 10 draws for held-out strings */
		n = s2s_draw(c, index, a, x);
		if (s2s_held_out(x, n) == c->held_out)
			break;
	}
	int counts[11] = { 0 }, sum = 0;
	for (int64_t t = 0; t < n; t++) {
		counts[x[t]]++;
		sum += x[t] - 1; /* digit d is id d + 1 */
	}
	if (c->task == S2S_SUM) {
		y[0] = sum % 10;
		return KILN_OK;
	}
	for (int64_t t = 0, d = 1; t < c->len; t++) {
		if (t >= n) {
			y[t] = 0;
		} else if (c->task == S2S_REVERSE) {
			y[t] = x[n - 1 - t];
		} else {
			while (!counts[d])
				d++;
			counts[d]--;
			y[t] = (int32_t)d;
		}
	}
	return KILN_OK;
}

LOADERS_SOURCE(seq2seq, "seq2seq",
	       "Generated digit strings and their reversal, sorted order or digit sum (token ids, pad 0)",
	       s2s_keys, s2s_open, s2s_close, s2s_info, s2s_read, NULL);
