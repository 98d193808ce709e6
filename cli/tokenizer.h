/* cli/tokenizer.h - text to token ids and back, for `kiln pack --format
 * tokens` and `kiln generate`: a byte-level tokenizer (vocab 256, id =
 * byte) and GPT-2's byte-pair encoding from the release's vocab.json +
 * merges.txt.  A cli-internal API (the cli links cli/tokenizer.c; tests
 * compile it in).
 *
 * GPT-2 BPE, as the release's encoder.py does it:
 *   1. pre-tokenize the text with GPT-2's pattern
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      approximated without Unicode tables: \p{L} is an ASCII letter or any
 *      byte >= 0x80 (so every non-ASCII character counts as a letter),
 *      \p{N} an ASCII digit, \s one of " \t\n\v\f\r".  On ASCII text this is
 *      the exact pattern; tests/data/gen_bpe_refs.py implements the same
 *      approximation with Python's re as the reference.
 *   2. each piece's bytes start as one symbol each; repeatedly the adjacent
 *      pair with the lowest rank in merges.txt (its line order) is merged,
 *      every occurrence left to right, until no pair has a rank;
 *   3. each symbol is looked up in vocab.json, whose keys are the byte
 *      strings written through GPT-2's byte-to-unicode map (printable
 *      Latin-1 bytes as themselves, the others as U+0100 + n).
 * Decoding concatenates the ids' byte strings (the inverse map), so
 * decode(encode(text)) == text for any bytes.
 *
 * Threads: a tokenizer is read-only after open; encode and decode may run
 * on several threads at once.  Errors return a kiln_status with a message
 * naming the file (and line) at fault.
 */
#ifndef KILN_CLI_TOKENIZER_H
#define KILN_CLI_TOKENIZER_H

#include <kiln/status.h>

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

struct tokenizer;

/* A growable array of token ids.  Zero-initialise; free(ids->v). */
struct token_ids {
	int32_t *v;
	size_t n, cap;
};

/* Append one id.  KILN_ENOMEM only. */
kiln_status token_ids_push(struct token_ids *ids, int32_t id);

/* The byte-level tokenizer: vocab 256, token = byte. */
kiln_status tokenizer_open_bytes(struct tokenizer **out);

/* GPT-2 BPE from vocab.json (an object {"token": id}, ids < 65536) and
 * merges.txt ("#version" line, then "a b" per line, lower lines rank
 * later).  Every single byte must have a token and every merge's result
 * must be in the vocabulary.  KILN_EIO unreadable, KILN_EDATA malformed. */
kiln_status tokenizer_open_bpe(const char *vocab_json, const char *merges_txt,
			       struct tokenizer **out);

void tokenizer_close(struct tokenizer *tk);

/* The number of ids (the largest id + 1). */
int32_t tokenizer_vocab(const struct tokenizer *tk);

/* The id of the end-of-text token (<|endoftext|> in GPT-2's vocabulary),
 * -1 when there is none (byte level). */
int32_t tokenizer_eot(const struct tokenizer *tk);

/* Append the ids of text[0..n) to ids.  KILN_ENOMEM only. */
kiln_status tokenizer_encode(const struct tokenizer *tk, const char *text, size_t n,
			     struct token_ids *ids);

/* The bytes of token `id` (*len of them, not NUL-terminated, borrowed
 * from tk), or NULL for an id outside the vocabulary. */
const char *tokenizer_piece(const struct tokenizer *tk, int32_t id, size_t *len);

/* Decode ids[0..n) into a new NUL-terminated string *text (malloc()ed,
 * the caller frees; *len bytes before the NUL, the text may hold NULs).
 * KILN_EINVAL naming the position of an id outside the vocabulary. */
kiln_status tokenizer_decode(const struct tokenizer *tk, const int32_t *ids, size_t n,
			     char **text, size_t *len);

#endif /* KILN_CLI_TOKENIZER_H */
