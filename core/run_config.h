/* core/run_config.h - the fixed config sections the core reads, each read
 * once into a typed struct.
 *
 * The values come from kiln_config_get_*, which fills in the schema's
 * defaults: core/schema.c is the only place a default lives, and no code
 * here or at a reader repeats one.  [train] is public (struct
 * kiln_train_cfg in kiln.h: `kiln train` needs its batch and epochs);
 * [run] and [data] are the core's.  Strings are borrowed from the config.
 */
#ifndef KILN_RUN_CONFIG_H
#define KILN_RUN_CONFIG_H

#include "internal.h"

/* [run] memory_limit's least value: 1 MiB */
#define KILN_MEMORY_LIMIT_MIN ((size_t)1 << 20)

/* [run], the keys the core itself reads (plugins and the profiler read
 * their own). */
struct kiln_run_cfg {
	const char *device;       /* a device plugin's name, or `auto` */
	const char *precision;
	const char *out_dir;      /* "" = none */
	const char *memory_limit; /* "" = what the device reports free */
	size_t memory_limit_bytes; /* memory_limit in bytes; 0 for "" */
	int64_t seed;
	int64_t threads;          /* 0 = one per CPU of the affinity mask */
	int deterministic;
};

/* [data], the loader's keys (the source and its transforms are read by
 * kiln_dataset_open). */
struct kiln_data_cfg {
	int workers;              /* loader threads; -1: `auto` (probed) */
	int64_t prefetch;
	int shuffle;
	int resident;
};

/* KILN_ECONFIG naming file:line for a bad value; else KILN_OK. */
kiln_status kiln_run_cfg_read(const struct kiln_config *cfg, struct kiln_run_cfg *out);
kiln_status kiln_data_cfg_read(const struct kiln_config *cfg, struct kiln_data_cfg *out);

/* kiln_train_cfg_read into this library's whole struct (out->size its
 * sizeof): the core's own readers, whose struct is the library's. */
kiln_status kiln_train_cfg_fill(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_train_cfg *out);
/* A caller's tc (kiln_train_run; fn names it in messages) as this
 * library's whole struct in *full: KILN_EINVAL when its size is not set;
 * the members past a smaller size (an older header's) read from cfg as
 * kiln_train_cfg_read reads them, a larger one's extra bytes ignored. */
kiln_status kiln_train_cfg_in(const struct kiln_config *cfg, const struct kiln_train_cfg *tc,
			      const char *fn, struct kiln_train_cfg *full);

/* tc's batch, or KILN_ECONFIG naming file:line when it is an unresolved
 * `auto` (`who` says what needs it, for the message). */
kiln_status kiln_train_cfg_batch(const struct kiln_config *cfg, const struct kiln_train_cfg *tc,
				 const char *who, int64_t *batch);

/* Log a warning for each [train] key the config sets that tc's other keys
 * leave unread: a schedule's keys under another schedule (milestones with
 * schedule = cosine), eval_every with eval = 0.  One line each, naming
 * the key's file:line and what it needs, as log.histograms without
 * tensorboard and keep_best with eval = 0 warn. */
void kiln_train_cfg_warn_unread(const struct kiln_config *cfg, const struct kiln_train_cfg *tc);

/* The resolved config text of a run (kiln_ckpt_config_text), with
 * `batch = auto` replaced by the batch tc resolved it to: what out_dir/
 * config.ini and every checkpoint record.  malloc'd; NULL with the error
 * set on failure. */
char *kiln_run_config_text(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   const struct kiln_train_cfg *tc);

/* core/memory.c: `batch = auto` resolved (kiln_train_cfg_read). */
kiln_status kiln_memory_auto_batch(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   int64_t *batch);

#endif /* KILN_RUN_CONFIG_H */
