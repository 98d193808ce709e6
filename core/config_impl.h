/* core/config_impl.h - the config's in-memory form, shared by the parser
 * (config.c), the schema checks (config_check.c), the getters
 * (config_get.c) and the resolved dump (config_write.c). */
#ifndef KILN_CONFIG_IMPL_H
#define KILN_CONFIG_IMPL_H

#include "internal.h"

struct entry {
	char *key, *value;
	char *where; /* "file:line" or "command line" */
};

/* An open-addressing index over an array's names (config.c): slot[h]
 * holds an item's index + 1, 0 when empty; cap is a power of two. */
struct name_index {
	int *slot;
	int cap;
};

struct section {
	char *name;
	char *where;
	struct entry *e;
	int n, cap;
	struct name_index idx; /* over e[].key */
	/* keys a command-line override unset ("layer.fc1.out="): key and
	 * where ("command line '...'"), so that a message about the missing
	 * key can name the override rather than the file alone */
	struct entry *unset;
	int n_unset;
};

struct kiln_config {
	char *file;
	struct section *s;
	int n, cap;
	struct name_index idx; /* over s[].name */
	const struct kiln_registry *reg; /* set by validate, for defaults */
};

struct section *kiln_cfg_find_section(const struct kiln_config *cfg, const char *name);
/* NULL when s or key is NULL or the key is not set in s. */
struct entry *kiln_cfg_find_entry(const struct section *s, const char *key);
/* Remove entry j of s (its strings freed). */
void kiln_cfg_remove_entry(struct section *s, int j);

/* config_check.c, for the getters and the dump.  Whether s is prefix
 * followed by at least one character ("layer." + a name). */
int is_prefixed(const char *s, const char *prefix);
/* The fixed table of a section (the layers' common keys for [layer.X],
 * none for [plugin.X]), NULL for an unknown section. */
const struct kiln_key *base_schema(const char *section);
/* The schema row of section's key: its fixed table's, else the one the
 * registry's plugin (or [train]'s optimizer) adds; NULL when none. */
const struct kiln_key *lookup_key(const struct kiln_config *cfg, const char *section,
				  const char *key);
/* v, spaces around it allowed, as a whole number into *iout when iout is
 * set, else as a finite number into *fout.  0, or -1 (nothing written). */
int parse_number(const char *v, long long *iout, double *fout);
/* 1 when parse_number refused v for its size alone: a whole number past
 * int64 (integer set), a number past a double's range (1e400; 1e-400,
 * which would read as 0; not the subnormals, which are read as they are):
 * the message says "out of range", not "not a number". */
int number_out_of_range(const char *v, int integer);
/* (KILN_DOUBLE_RANGE, internal.h, words the range in those messages) */
/* Where parse_ints stopped: the index of the number it refused (max where
 * v holds more than max) and that number's text, v[at..at + len) (spaces
 * alone for an empty one). */
struct ints_stop {
	int i;
	size_t at, len;
};
/* v[0..n) (not NUL-terminated) as KILN_KEY_INTS: at most max whole
 * numbers separated by commas (spaces around each), none empty, each as
 * parse_number reads it (63 bytes at most), into out: their count, or -1
 * with out[0..stop->i) the numbers before the one refused and, where stop
 * is set, *stop saying which (check_ints words its messages from it). */
int parse_ints(const char *v, size_t n, long long *out, int max, struct ints_stop *stop);
/* 1/true/yes/on or 0/false/no/off (any case) into *out: 0, else -1. */
int parse_bool(const char *v, int *out);
/* x (written v) within k's range, else KILN_ECONFIG without a location. */
kiln_status check_number(const struct kiln_key *k, const char *v, double x);
/* config_get.c, for the dump.  1 for the [data] keys [data.eval] and
 * [data.val] do not inherit (the files, the split, the limit). */
int no_inherit(const char *key);

#endif
