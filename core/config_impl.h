/* core/config_impl.h - the config's in-memory form, shared by the parser
 * (config.c) and the schema checks and getters (config_check.c). */
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

#endif
