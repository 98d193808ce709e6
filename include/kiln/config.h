/* kiln/config.h - the strict INI configuration.
 *
 * A config is parsed from one INI file (inih) plus `section.key=value`
 * overrides.  Sections are unique: [run] [data] [data.eval] [model] [train]
 * [dist] [layer.NAME]... [plugin.NAME]....  Every key is checked against a
 * schema (struct kiln_key tables): the core's tables for the fixed sections,
 * the layer type's table for [layer.NAME] (selected by its `type` key), the
 * data source's table for [data]/[data.eval] (selected by `source`) and the
 * plugin's table for [plugin.NAME].  An unknown section or key, or a value of
 * the wrong type or out of range, is a KILN_ECONFIG error naming file:line
 * and, for names, the closest valid one.
 *
 * Numbers are read in the C locale ('.' the decimal point) whatever the
 * application's setlocale() (kiln.h, "Locale").
 *
 * Threads: a config is built on one thread; once validated it is read-only
 * and may be read from any thread.
 *
 * NULL arguments (kiln/kiln.h): KILN_EINVAL ("FUNCTION: ARG is NULL") for
 * a NULL pointer not marked "may be NULL"; kiln_config_get, _where and
 * _section return NULL for a NULL config, section or (get) key.
 */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include <stdint.h>
#include <stdio.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kiln_key_type {
	KILN_KEY_STR = 0,   /* any string */
	KILN_KEY_INT = 1,   /* integer in [min, max] */
	KILN_KEY_FLOAT = 2, /* finite real in [min, max] */
	KILN_KEY_BOOL = 3,  /* 0/1, true/false, yes/no, on/off */
	KILN_KEY_ENUM = 4,  /* one of `choices` ("a|b|c") */
	KILN_KEY_LIST = 5,  /* comma-separated strings */
	KILN_KEY_INTS = 6   /* comma-separated integers in [min, max] */
};

/* One schema row.  Tables end with a row whose name is NULL.  `def` is the
 * default as text (NULL: no default, the key is optional and absent means
 * "unset"; required keys say so in `doc` and are checked by their reader).
 * For KILN_KEY_INT/FLOAT/INTS, min/max bound the value (both 0: unbounded).
 * For KILN_KEY_ENUM, `choices` lists the allowed words separated by '|'; an
 * INT key may also set `choices` to allow words as well as numbers ("auto"). */
struct kiln_key {
	const char *name;
	int type; /* enum kiln_key_type */
	const char *def;
	double min, max;
	const char *choices;
	const char *doc;
};

struct kiln_config;
struct kiln_registry;

/* Parse `path`.  On success *out owns a new config (free with
 * kiln_config_free).  Errors: KILN_EIO (unreadable), KILN_ECONFIG (syntax,
 * duplicate section, key outside a section, duplicate key), with file:line. */
kiln_status kiln_config_load(const char *path, struct kiln_config **out);

/* Same from a string; `name` stands for the file name in messages (not
 * NULL: KILN_EINVAL). */
kiln_status kiln_config_load_string(const char *text, const char *name,
				    struct kiln_config **out);

/* An empty config (every key at its default). */
kiln_status kiln_config_new(struct kiln_config **out);

void kiln_config_free(struct kiln_config *cfg);

/* Apply one command-line override "section.key=value".  The section is
 * everything before the last '.' of the left side, so "layer.fc1.out=10"
 * sets key `out` of [layer.fc1].  Creates the section if needed. */
kiln_status kiln_config_override(struct kiln_config *cfg, const char *arg);

/* Check every section and key against the schema.  `reg` (may be NULL)
 * supplies layer, source and plugin tables; with NULL those sections are
 * accepted as long as their fixed keys are valid.  Must be called before
 * the typed getters are trusted. */
kiln_status kiln_config_validate(struct kiln_config *cfg, struct kiln_registry *reg);

/* After kiln_config_validate with `reg`: every [layer.NAME] has a type
 * `reg` knows, and that type's configure hook accepts its keys (a
 * required key such as linear's `out` set), as building the model would
 * check, without the data or any shape.  KILN_ECONFIG naming the
 * section's file:line (and a command-line override that unset a key). */
kiln_status kiln_config_check_layers(const struct kiln_config *cfg,
				     const struct kiln_registry *reg);

/* What a training run refuses that a model for evaluation accepts: a
 * [layer.X] int8_scale or int8_out_scale > 0 (an INT8 layer has no
 * backward).  KILN_ECONFIG naming the key's file:line.  kiln_config_check_layers
 * runs it too (`kiln config` checks a file as training would); a training
 * run checks it before it opens anything, so that nothing in out_dir is
 * deleted for a run refused later. */
kiln_status kiln_config_check_training(const struct kiln_config *cfg);

/* Every check `kiln train` makes of the file before it opens the data
 * (`kiln config`): the [run], [data] and [train] keys as the run reads
 * them ([run] memory_limit, devices; [data] workers, mean, std; ...), the
 * model's names (an empty model; a type, input, tie or [model] stages
 * naming no layer) and kiln_config_check_layers.  KILN_ECONFIG naming
 * file:line. */
kiln_status kiln_config_check_train(const struct kiln_config *cfg,
				    const struct kiln_registry *reg);

/* Raw value of a key as written, or its schema default, or NULL when unset
 * and without default (or cfg, section or key is NULL).  The string is
 * owned by the config. */
const char *kiln_config_get(const struct kiln_config *cfg, const char *section,
			    const char *key);

/* Typed getters: parse the value (or the default) of a key.  A key that is
 * unset and has no default leaves *out unchanged and returns KILN_ENOTFOUND
 * without setting an error message.  A bad value is KILN_ECONFIG naming
 * file:line.  The returned string of get_str is owned by the config. */
kiln_status kiln_config_get_int(const struct kiln_config *cfg, const char *section,
				const char *key, int64_t *out);
kiln_status kiln_config_get_float(const struct kiln_config *cfg, const char *section,
				  const char *key, double *out);
kiln_status kiln_config_get_bool(const struct kiln_config *cfg, const char *section,
				 const char *key, int *out);
kiln_status kiln_config_get_str(const struct kiln_config *cfg, const char *section,
				const char *key, const char **out);

/* Where a key was set ("file.ini:12" or "command line"), for messages.
 * Returns "default" when the key is unset.  key NULL: where the section
 * starts, or the config's file name when it has no such section.  NULL
 * for a NULL cfg or section.  Owned by the config. */
const char *kiln_config_where(const struct kiln_config *cfg, const char *section,
			      const char *key);

/* Sections in file order: returns the name of section `i`, NULL past the end. */
const char *kiln_config_section(const struct kiln_config *cfg, int i);

/* The resolved config: every section present plus every fixed section, with
 * every schema key and its value or default, as an INI text. */
kiln_status kiln_config_write(const struct kiln_config *cfg, struct kiln_registry *reg,
			      FILE *f);

/* The schema of a fixed section ("run", "data", ...), NULL if none. */
const struct kiln_key *kiln_config_schema(const char *section);

/* Name of fixed section i (and its one-line description in *doc when doc is
 * not NULL), NULL past the end: for generated documentation. */
const char *kiln_config_fixed_section(int i, const char **doc);

/* The keys every [layer.NAME] section has (type, input, ...). */
const struct kiln_key *kiln_config_layer_keys(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CONFIG_H */
