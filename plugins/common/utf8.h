/* plugins/common/utf8.h - the length of a well-formed UTF-8 sequence.
 * One copy for the core (metrics.jsonl's paths, trainer_json_text) and
 * the CLI's JSON strings (cli_json_str): both write U+FFFD for a byte of
 * no well-formed sequence, and must agree on which bytes those are.
 * Header-only: static inline (the CLI sees only libkiln's kiln_* symbols).
 */
#ifndef KILN_COMMON_UTF8_H
#define KILN_COMMON_UTF8_H

/* The length of the UTF-8 sequence at p (1-4), 0 where it is not one
 * (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
 * p is NUL-terminated: a NUL inside a sequence ends it (0), and nothing
 * past that NUL is read. */
static inline int common_utf8_len(const unsigned char *p)
{
	const unsigned c = p[0];
	int n;
	/* the second byte's range, narrower after E0, ED, F0 and F4 */
	unsigned lo = 0x80, hi = 0xbf;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
	else
		return 0;
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (int i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return n;
}

#endif
