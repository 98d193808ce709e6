/* core/config_diff.h - two resolved config texts (kiln_config_write output)
 * compared key by key: what resuming (core/resume.c: a checkpoint's config
 * against the run's) and the ranks' agreement (core/dist_config.c: every
 * rank's config against rank 0's) share.  Pure functions of their texts;
 * no state, any thread. */
#ifndef KILN_CORE_CONFIG_DIFF_H
#define KILN_CORE_CONFIG_DIFF_H
#include <kiln/status.h>
#include <stddef.h>

/* One "key = value" (or "; key = (unset)") line of a resolved config text:
 * pointers into the text, which must outlive it. */
struct kiln_kv {
	const char *sec, *key, *val; /* val NULL: unset */
	int sec_n, key_n, val_n;
};

/* Parse a resolved config text into *out (malloc'd, the caller frees), *n
 * entries in the text's order.  The text may come from a file (a
 * checkpoint): malformed lines are skipped, nothing about its shape is
 * taken for granted.  A value is trimmed of spaces and tabs on both sides
 * (as kiln reads it).  KILN_ENOMEM only. */
kiln_status kiln_kv_parse(const char *text, struct kiln_kv **out, int *n);

/* The entry of [sec] key in v[0..n), or NULL. */
const struct kiln_kv *kiln_kv_lookup(const struct kiln_kv *v, int n, const char *sec,
				     const char *key);

/* The comparison's rules, with the caller's u: which keys are compared
 * (1), and what a key one text lacks reads as: 1 and its default in
 * *val, *len bytes (*val NULL: unset by default), or 0 where the key has
 * no known default. */
typedef int (*kiln_kv_wanted_fn)(const char *section, const char *key, void *u);
typedef int (*kiln_kv_default_fn)(const char *section, const char *key, void *u,
				  const char **val, size_t *len);
/* Whether two values of [section] key whose bytes differ (a[0..an),
 * b[0..bn), not NUL-terminated; a NULL where that text has the key unset,
 * or lacks it and its default is unset, the other's set) mean the same
 * (1): "2, 0" and "2,0" of a pair key, 0.1 and 0.10, a pooling's unset
 * stride and its kernel's value (core/resume.c).  a is the first text's
 * (kiln_config_diff's a), b the second's. */
typedef int (*kiln_kv_same_fn)(const char *section, const char *key, const char *a, size_t an,
			       const char *b, size_t bn, void *u);

/* The first difference: section and key, and each side's value as a
 * message shows it: 'v', "unset", or where that text lacks the key
 * "absent" (show_defaults 0) or its default as `def` gives it (1). */
struct kiln_config_delta {
	char section[128], key[128];
	char a[300], b[300];
};

/* Compare texts a and b among the keys `wanted` accepts (NULL: all), a's
 * keys in a's order, then the keys only b has.  Two values are equal when
 * their bytes are, or by `same` (NULL: bytes alone).  A key one text lacks is
 * equal when the other's value is its default by `def` (NULL: no rule),
 * or, where that default is unset, when `same` says so with the lacking
 * side's value NULL (as it says of an unset key).
 * *differs = 1 and *d filled at the first key that differs, else 0.
 * KILN_ENOMEM only. */
kiln_status kiln_config_diff(const char *a, const char *b, kiln_kv_wanted_fn wanted,
			     kiln_kv_default_fn def, kiln_kv_same_fn same, void *u, int show_defaults,
			     int *differs, struct kiln_config_delta *d);
#endif
