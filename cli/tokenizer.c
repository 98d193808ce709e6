/* cli/tokenizer.c - byte-level and GPT-2 byte-pair tokenizers; see
 * tokenizer.h for the algorithm and its documented approximation. */
#include "tokenizer.h"

#include <errno.h>   /* errno */
#include <jansson.h> /* json_load_file: vocab.json */
#include <stdio.h>   /* FILE, getline */
#include <stdlib.h>  /* malloc, calloc, realloc, free */
#include <string.h>  /* memcpy, strcmp, strerror */

#define TOK_MAX_VOCAB 65536 /* ids are stored as u16 in token shards */

/* One vocabulary entry: its bytes. */
struct piece {
	char *s;   /* NULL for an unused id */
	size_t n;
};

/* The merge table: open addressing on the pair (a, b) of ids. */
struct merge {
	uint64_t key;  /* (uint64_t)a << 32 | b, plus 1 (0: empty slot) */
	int32_t rank;
	int32_t id;    /* the merged token */
};

struct tokenizer {
	int bpe;                 /* 0: byte level */
	int32_t vocab;           /* largest id + 1 */
	int32_t eot;             /* <|endoftext|>, or -1 */
	struct piece *pieces;    /* [vocab] */
	int32_t byte_id[256];    /* the token of each single byte */
	struct merge *merges;    /* [merge_cap], a power of two, at most half full */
	size_t merge_cap, n_merges;
};

/* ---- GPT-2's byte-to-unicode map ----------------------------------------
 * Bytes that are printable Latin-1 ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map
 * to the code point of the same value; the other 68 bytes, in order, to
 * U+0100, U+0101, ...  */
static int printable(int b)
{
	return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* unicode_to_byte[cp] for cp < 0x144 (-1: no byte). */
static void inverse_map(int16_t *inv, size_t n)
{
	int next = 0;
	for (size_t i = 0; i < n; i++)
		inv[i] = -1;
	for (int b = 0; b < 256; b++)
		inv[printable(b) ? b : 256 + next++] = (int16_t)b;
}

/* A vocab.json / merges.txt string (UTF-8 of mapped code points) back to
 * raw bytes in out (at most strlen(s) bytes).  Returns the count, or -1
 * for a code point outside the map or bad UTF-8. */
static long unmap(const int16_t *inv, const char *s, size_t len, char *out)
{
	const unsigned char *p = (const unsigned char *)s, *e = p + len;
	long n = 0;
	while (p < e) {
		uint32_t cp;
		if (p[0] < 0x80) {
			cp = *p++;
		} else if ((p[0] & 0xE0) == 0xC0 && e - p >= 2 && (p[1] & 0xC0) == 0x80) {
			cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
			p += 2;
		} else {
			return -1; /* every mapped code point is below U+0800 */
		}
		if (cp >= 0x144 || inv[cp] < 0)
			return -1;
		out[n++] = (char)inv[cp];
	}
	return n;
}

/* ---- the merge table -------------------------------------------------- */

static uint64_t merge_key(int32_t a, int32_t b)
{
	return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

static struct merge *merge_slot(const struct tokenizer *tk, uint64_t key)
{
	uint64_t h = key * 0x9E3779B97F4A7C15ull;
	size_t mask = tk->merge_cap - 1;
	for (size_t i = (size_t)(h >> 20) & mask;; i = (i + 1) & mask)
		if (tk->merges[i].key == key || tk->merges[i].key == 0)
			return &tk->merges[i];
}

/* ---- loading ---------------------------------------------------------- */

void tokenizer_close(struct tokenizer *tk)
{
	if (!tk)
		return;
	for (int32_t i = 0; tk->pieces && i < tk->vocab; i++)
		free(tk->pieces[i].s);
	free(tk->pieces);
	free(tk->merges);
	free(tk);
}

kiln_status tokenizer_open_bytes(struct tokenizer **out)
{
	struct tokenizer *tk = calloc(1, sizeof *tk);
	*out = NULL;
	if (!tk || !(tk->pieces = calloc(256, sizeof *tk->pieces))) {
		free(tk);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	tk->vocab = 256;
	tk->eot = -1;
	for (int b = 0; b < 256; b++) {
		tk->byte_id[b] = b;
		tk->pieces[b].n = 1;
		if (!(tk->pieces[b].s = malloc(1))) {
			tokenizer_close(tk);
			return kiln_error(KILN_ENOMEM, "out of memory");
		}
		tk->pieces[b].s[0] = (char)b;
	}
	*out = tk;
	return KILN_OK;
}

/* vocab.json into tk->pieces, byte_id and eot. */
static kiln_status load_vocab(struct tokenizer *tk, const int16_t *inv, const char *path)
{
	json_error_t err;
	json_t *root = json_load_file(path, 0, &err);
	if (!root && err.line < 1) /* jansson could not open or read it */
		return kiln_error(KILN_EIO, "%s: cannot read the vocabulary: %s", path, err.text);
	if (!root)
		return kiln_error(KILN_EDATA, "%s:%d: the vocabulary is not valid JSON: %s", path,
				  err.line, err.text);
	kiln_status st = KILN_OK;
	const char *key;
	json_t *v;
	if (!json_is_object(root)) {
		st = kiln_error(KILN_EDATA, "%s: the vocabulary is not a JSON object {\"token\": id}", path);
		goto out;
	}
	json_object_foreach(root, key, v) {
		json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
		if (id < 0 || id >= TOK_MAX_VOCAB) {
			st = kiln_error(KILN_EDATA, "%s: token \"%s\": id must be an integer in 0..%d", path, key,
					TOK_MAX_VOCAB - 1);
			goto out;
		}
		if (id >= tk->vocab)
			tk->vocab = (int32_t)id + 1;
	}
	if (!(tk->pieces = calloc((size_t)tk->vocab + 1, sizeof *tk->pieces))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	json_object_foreach(root, key, v) {
		int32_t id = (int32_t)json_integer_value(v);
		size_t kl = strlen(key);
		struct piece *p = &tk->pieces[id];
		if (p->s) {
			st = kiln_error(KILN_EDATA, "%s: id %d is given to two tokens", path, id);
			goto out;
		}
		if (!(p->s = malloc(kl + 1))) {
			st = kiln_error(KILN_ENOMEM, "out of memory");
			goto out;
		}
		long n = unmap(inv, key, kl, p->s);
		if (n < 0) {
			st = kiln_error(KILN_EDATA, "%s: token \"%s\" (id %d) has a character outside GPT-2's byte-to-unicode map",
					path, key, id);
			goto out;
		}
		p->n = (size_t)n;
		if (n == 1)
			tk->byte_id[(unsigned char)p->s[0]] = id;
		if (!strcmp(key, "<|endoftext|>"))
			tk->eot = id;
	}
	for (int b = 0; b < 256; b++)
		if (tk->byte_id[b] < 0) {
			st = kiln_error(KILN_EDATA, "%s: byte 0x%02x has no token: a byte-level BPE vocabulary holds all 256",
					path, b);
			goto out;
		}
out:
	json_decref(root);
	return st;
}

/* A string hash table from piece bytes to id, for loading the merges. */
struct piece_index {
	int32_t *slot; /* id + 1, 0 empty */
	size_t cap;
};

static uint64_t bytes_hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
	return h;
}

static kiln_status index_build(const struct tokenizer *tk, struct piece_index *ix)
{
	ix->cap = 1;
	while (ix->cap < 2 * (size_t)tk->vocab)
		ix->cap <<= 1;
	if (!(ix->slot = calloc(ix->cap, sizeof *ix->slot)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int32_t id = 0; id < tk->vocab; id++) {
		const struct piece *p = &tk->pieces[id];
		if (!p->s)
			continue;
		size_t i = (size_t)bytes_hash(p->s, p->n) & (ix->cap - 1);
		while (ix->slot[i])
			i = (i + 1) & (ix->cap - 1);
		ix->slot[i] = id + 1;
	}
	return KILN_OK;
}

static int32_t index_find(const struct tokenizer *tk, const struct piece_index *ix,
			  const char *s, size_t n)
{
	for (size_t i = (size_t)bytes_hash(s, n) & (ix->cap - 1); ix->slot[i];
	     i = (i + 1) & (ix->cap - 1)) {
		const struct piece *p = &tk->pieces[ix->slot[i] - 1];
		if (p->n == n && !memcmp(p->s, s, n))
			return ix->slot[i] - 1;
	}
	return -1;
}

/* One merges.txt line "a b" (line number `ln`) into the merge table with
 * rank `rank`. */
static kiln_status add_merge(struct tokenizer *tk, const struct piece_index *ix,
			     const int16_t *inv, const char *path, long ln, char *line,
			     int32_t rank)
{
	size_t len = strlen(line);
	while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = 0;
	char *sp = strchr(line, ' ');
	if (!sp || strchr(sp + 1, ' ') || sp == line || !sp[1])
		return kiln_error(KILN_EDATA, "%s:%ld: a merge is two tokens separated by one space, got \"%s\"",
				  path, ln, line);
	char a[1024], b[1024], ab[2048];
	long na = (size_t)(sp - line) < sizeof a ? unmap(inv, line, (size_t)(sp - line), a) : -1;
	long nb = strlen(sp + 1) < sizeof b ? unmap(inv, sp + 1, strlen(sp + 1), b) : -1;
	if (na < 0 || nb < 0)
		return kiln_error(KILN_EDATA, "%s:%ld: a character outside GPT-2's byte-to-unicode map (or a token too long)",
				  path, ln);
	int32_t ia = index_find(tk, ix, a, (size_t)na), ib = index_find(tk, ix, b, (size_t)nb);
	memcpy(ab, a, (size_t)na);
	memcpy(ab + na, b, (size_t)nb);
	int32_t iab = index_find(tk, ix, ab, (size_t)(na + nb));
	if (ia < 0 || ib < 0 || iab < 0)
		return kiln_error(KILN_EDATA, "%s:%ld: merge \"%s\": %s is not in the vocabulary", path, ln,
				  line, ia < 0 ? "its first token" : ib < 0 ? "its second token" : "the merged token");
	struct merge *m = merge_slot(tk, merge_key(ia, ib));
	if (m->key)
		return KILN_OK; /* a repeated merge keeps its first (lower) rank */
	if (2 * (tk->n_merges + 1) > tk->merge_cap)
		return kiln_error(KILN_EDATA, "%s:%ld: more merges than the vocabulary has tokens (%d)",
				  path, ln, tk->vocab);
	tk->n_merges++;
	m->key = merge_key(ia, ib);
	m->rank = rank;
	m->id = iab;
	return KILN_OK;
}

/* A special token ("<|endoftext|>", "<|im_start|>"): no merge makes it. */
static int is_special(const struct piece *p)
{
	return p->n >= 4 && !memcmp(p->s, "<|", 2) && !memcmp(p->s + p->n - 2, "|>", 2);
}

/* A token named like a special or reserved one: "<s>", "</s>", "<pad>",
 * "<mask>", "<unused0>", "[PAD]", "[unused1]" (RoBERTa's and BERT-style
 * vocabularies; no merge makes them either). */
static int looks_special(const struct piece *p)
{
	return p->n >= 3 && ((p->s[0] == '<' && p->s[p->n - 1] == '>') ||
			     (p->s[0] == '[' && p->s[p->n - 1] == ']'));
}

/* p's bytes into shown (n bytes): printable ASCII as is, the rest escaped. */
static void piece_shown(const struct piece *p, char *shown, size_t n)
{
	size_t k = 0;
	shown[0] = 0;
	for (size_t i = 0; i < p->n && k + 5 < n; i++) {
		unsigned char c = (unsigned char)p->s[i];
		k += (size_t)snprintf(shown + k, n - k, c >= 0x20 && c < 0x7f && c != '"' &&
						 c != '\\' ? "%c" : "\\x%02x", c);
	}
}

/* Every token of a byte-level BPE vocabulary but the 256 bytes and the
 * special tokens is made by a merge (GPT-2: 50,000 merges = 50,257 - 256 -
 * 1), and a BPE trainer numbers a token made by merge r as 256 + r or so.
 * A truncated or empty merges.txt was accepted, and the text then
 * tokenized differently with exit 0 (session 33): refuse one whose unmade
 * tokens are the tail of ids above every made one, as a cut-short file
 * leaves them, naming the first and the count.  Unmade tokens among the
 * made ones (a vocabulary padded with unused or added tokens) are a
 * warning: they can be read only whole. */
static kiln_status check_merges_cover(const struct tokenizer *tk, const char *merges_path)
{
	unsigned char *made = calloc((size_t)tk->vocab, 1);
	if (!made)
		return kiln_error(KILN_ENOMEM, "out of memory");
	int32_t last_made = -1;
	for (size_t i = 0; i < tk->merge_cap; i++)
		if (tk->merges[i].key) {
			made[tk->merges[i].id] = 1;
			if (tk->merges[i].id > last_made)
				last_made = tk->merges[i].id;
		}
	int32_t first = -1, n = 0;
	for (int32_t id = 0; id < tk->vocab; id++) {
		const struct piece *p = &tk->pieces[id];
		if (!p->s || p->n < 2 || made[id] || id == tk->eot || is_special(p) ||
		    looks_special(p))
			continue;
		if (first < 0)
			first = id;
		n++;
	}
	free(made);
	if (first < 0)
		return KILN_OK;
	char shown[200];
	piece_shown(&tk->pieces[first], shown, sizeof shown);
	if (first > last_made)
		return kiln_error(KILN_EDATA, "%s: %d token(s) of the vocabulary are made by no merge, the first \"%s\" (id %d), and they are the ids above every merge's: every token but the 256 bytes and the special ones comes from a merge, so the merges file is truncated or not this vocabulary's",
				  merges_path, n, shown, first);
	kiln_log(KILN_LOG_WARN, "tokenizer", "%s: %d token(s) of the vocabulary are made by no merge, the first \"%s\" (id %d): they are read only as whole tokens, never made from text (added or unused tokens; if not, the merges file is not this vocabulary's)",
		 merges_path, n, shown, first);
	return KILN_OK;
}

/* merges.txt into the merge table. */
static kiln_status load_merges(struct tokenizer *tk, const int16_t *inv, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return kiln_error(KILN_EIO, "%s: cannot open the merges: %s", path, strerror(errno));
	struct piece_index ix = { 0 };
	kiln_status st = index_build(tk, &ix);
	char *line = NULL;
	size_t cap = 0;
	long ln = 0;
	int32_t rank = 0;
	/* a merge makes a token, so there are fewer merges than tokens:
	 * the table holds the vocabulary's size at most half full */
	tk->merge_cap = 1;
	while (tk->merge_cap < 2 * (size_t)tk->vocab + 2)
		tk->merge_cap <<= 1;
	if (!st && !(tk->merges = calloc(tk->merge_cap, sizeof *tk->merges)))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	while (!st && getline(&line, &cap, f) > 0) {
		ln++;
		if ((ln == 1 && !strncmp(line, "#version", 8)) || line[0] == '\n' || line[0] == '\r')
			continue;
		if (rank >= TOK_MAX_VOCAB)
			st = kiln_error(KILN_EDATA, "%s:%ld: more merges than a %d-token vocabulary can hold",
					path, ln, TOK_MAX_VOCAB);
		else
			st = add_merge(tk, &ix, inv, path, ln, line, rank++);
	}
	if (!st && ferror(f))
		st = kiln_error(KILN_EIO, "%s: read error: %s", path, strerror(errno));
	if (!st)
		st = check_merges_cover(tk, path);
	free(line);
	free(ix.slot);
	fclose(f);
	return st;
}

kiln_status tokenizer_open_bpe(const char *vocab_json, const char *merges_txt,
			       struct tokenizer **out)
{
	int16_t inv[0x144];
	kiln_status st;
	*out = NULL;
	struct tokenizer *tk = calloc(1, sizeof *tk);
	if (!tk)
		return kiln_error(KILN_ENOMEM, "out of memory");
	tk->bpe = 1;
	tk->eot = -1;
	for (int b = 0; b < 256; b++)
		tk->byte_id[b] = -1;
	inverse_map(inv, 0x144);
	if ((st = load_vocab(tk, inv, vocab_json)) || (st = load_merges(tk, inv, merges_txt))) {
		tokenizer_close(tk);
		return st;
	}
	*out = tk;
	return KILN_OK;
}

int32_t tokenizer_vocab(const struct tokenizer *tk)
{
	return tk->vocab;
}

int32_t tokenizer_eot(const struct tokenizer *tk)
{
	return tk->eot;
}

/* ---- encoding --------------------------------------------------------- */

static int is_space(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static int is_letter(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

static int is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

/* The class of a byte for the pattern: 0 space, 1 letter, 2 digit, 3 other. */
static int cls(unsigned char c)
{
	return is_space(c) ? 0 : is_letter(c) ? 1 : is_digit(c) ? 2 : 3;
}

/* The length of the piece GPT-2's pattern matches at s[0..n) (n > 0). */
static size_t piece_len(const unsigned char *s, size_t n)
{
	static const char *const contractions[] = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" };
	if (s[0] == '\'')
		for (size_t k = 0; k < sizeof contractions / sizeof *contractions; k++) {
			size_t cl = strlen(contractions[k]);
			if (cl <= n && !memcmp(s, contractions[k], cl))
				return cl;
		}
	/* ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space,
	 * then a run of one class */
	size_t i = s[0] == ' ' && n > 1 && !is_space(s[1]) ? 1 : 0;
	int c = cls(s[i]);
	if (c != 0) {
		size_t j = i + 1;
		while (j < n && cls(s[j]) == c)
			j++;
		return j;
	}
	/* `\s+(?!\S)`: a run of spaces, less its last one when a non-space
	 * follows; else `\s+` (a single space before a non-space) */
	size_t j = 1;
	while (j < n && is_space(s[j]))
		j++;
	return j < n && j > 1 ? j - 1 : j;
}

kiln_status token_ids_push(struct token_ids *ids, int32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? ids->cap * 2 : 4096;
		int32_t *v = realloc(ids->v, cap * sizeof *v);
		if (!v)
			return kiln_error(KILN_ENOMEM, "out of memory");
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return KILN_OK;
}

/* BPE of one piece: its bytes' ids at ids->v[from..], merged in place. */
static void bpe_piece(const struct tokenizer *tk, struct token_ids *ids, size_t from)
{
	int32_t *w = ids->v + from;
	size_t n = ids->n - from;
	while (n > 1) {
		int32_t best = -1, best_id = -1, a = 0, b = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			const struct merge *m = merge_slot(tk, merge_key(w[i], w[i + 1]));
			if (m->key && (best < 0 || m->rank < best)) {
				best = m->rank;
				best_id = m->id;
				a = w[i];
				b = w[i + 1];
			}
		}
		if (best < 0)
			break;
		size_t k = 0; /* merge every (a, b) left to right */
		for (size_t i = 0; i < n; i++) {
			if (i + 1 < n && w[i] == a && w[i + 1] == b) {
				w[k++] = best_id;
				i++;
			} else {
				w[k++] = w[i];
			}
		}
		n = k;
	}
	ids->n = from + n;
}

kiln_status tokenizer_encode(const struct tokenizer *tk, const char *text, size_t n,
			     struct token_ids *ids)
{
	const unsigned char *s = (const unsigned char *)text;
	kiln_status st;
	if (!tk->bpe) {
		for (size_t i = 0; i < n; i++)
			if ((st = token_ids_push(ids, s[i])))
				return st;
		return KILN_OK;
	}
	for (size_t i = 0; i < n;) {
		size_t len = piece_len(s + i, n - i), from = ids->n;
		for (size_t k = 0; k < len; k++)
			if ((st = token_ids_push(ids, tk->byte_id[s[i + k]])))
				return st;
		bpe_piece(tk, ids, from);
		i += len;
	}
	return KILN_OK;
}

/* ---- decoding --------------------------------------------------------- */

const char *tokenizer_piece(const struct tokenizer *tk, int32_t id, size_t *len)
{
	if (id < 0 || id >= tk->vocab || !tk->pieces[id].s)
		return NULL;
	*len = tk->pieces[id].n;
	return tk->pieces[id].s;
}

kiln_status tokenizer_decode(const struct tokenizer *tk, const int32_t *ids, size_t n,
			     char **text, size_t *len)
{
	size_t total = 0, pl;
	*text = NULL;
	*len = 0;
	for (size_t i = 0; i < n; i++) {
		if (!tokenizer_piece(tk, ids[i], &pl))
			return kiln_error(KILN_EINVAL, "token %d at position %zu is not in the vocabulary (0..%d)",
					  ids[i], i, tk->vocab - 1);
		total += pl;
	}
	char *out = malloc(total + 1);
	if (!out)
		return kiln_error(KILN_ENOMEM, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const char *p = tokenizer_piece(tk, ids[i], &pl);
		memcpy(out + k, p, pl);
		k += pl;
	}
	out[k] = 0;
	*text = out;
	*len = k;
	return KILN_OK;
}
