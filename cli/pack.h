/* cli/pack.h - kiln pack's parts shared by its files for the records and
 * folder formats (not installed; built with KILN_WITH_PACK): cli/cmd_pack.c
 * parses the options and reads and encodes the samples in worker threads,
 * cli/pack_shards.c writes them into records shards, cli/pack_folder.c
 * into an ImageFolder tree (the overview: cmd_pack.c's head comment). */
#ifndef KILN_CLI_PACK_H
#define KILN_CLI_PACK_H

#include "cli.h"
#include "records.h" /* plugins/loaders: the shard writer rec_writer_* */

#include <stddef.h>
#include <stdint.h>

/* What `kiln pack` was asked for (cmd_pack.c's parse_args). */

struct pack_opts {
	const char *config, *out, *section, *split;
	uint64_t shard_size;
	int store;    /* enum rec_encoding */
	int folder;   /* --format folder: DIR/<split>/<class>/<index>.png|jpg */
	int quality;
	int quality_given; /* --quality on the command line */
	int resize;   /* 0: keep sizes */
	int workers;
	int force;
	int nover;
	char **over;  /* the overrides, borrowed from argv */
};

/* One sample, read and encoded (cmd_pack.c's workers). */
struct item {
	int32_t label, h, w, c;
	uint8_t *payload; /* malloc()ed: raw pixels or the encoded image */
	size_t n;
};

/* The shards of the split being written (pack_shards.c). */
struct shards {
	const struct pack_opts *o;
	struct rec_writer *w;   /* the shard being written */
	int n;                  /* shards started */
	char **tmp;             /* their *.tmp names, n of them (malloc()ed) */
	int64_t classes;
	uint64_t bytes;         /* of finished shards */
	uint64_t *sizes;        /* records in each finished shard, n of them (malloc()ed) */
	uint32_t pack;          /* CRC32C of every record packed (pack_id makes the id of it) */
};

/* pack_shards.c.  The path of shard k (tmp: its *.tmp name) into out. */
void shard_name(const struct pack_opts *o, int k, int tmp, char *out, size_t n);
/* Refuse a pack that cannot fit REC_MAX_SHARDS shards, where the samples'
 * sizes say so before packing. */
kiln_status shard_count_check(const struct pack_opts *o, const struct kiln_source_info *info);
/* Add one sample to the shard being written, starting the next past
 * --shard-size; finish the shard being written. */
kiln_status shards_add(struct shards *sh, const struct item *it, int encoding);
kiln_status shards_finish(struct shards *sh);
/* Every shard finished: stamp each with its index, the count and the id. */
kiln_status shards_stamp(const struct shards *sh);
/* After a failure: remove every *.tmp. */
void shards_discard(struct shards *sh);
/* How many DIR/<split>-*<suffix> exist, one named into first; or, with
 * remove_from >= 0, remove those but shards [0, remove_from). */
int existing_shards(const struct pack_opts *o, const char *suffix, char *first, size_t n,
		    int remove_from);
/* Rename every *.tmp into place (--force: the older surplus shards
 * removed, named into old) between DIR/<split>.krec-partial's creation and
 * removal. */
kiln_status shards_place(const struct pack_opts *o, const struct shards *sh, char *old,
			 size_t old_size);

/* pack_folder.c.  Write sample `index` as DIR/<split>/<class>/<index>.ext
 * (seen: classes flags; the label's 0: its directory made first; set). */
kiln_status folder_add(const struct pack_opts *o, int64_t classes, int64_t index,
		       const struct item *it, uint8_t *seen);
/* Before the first image: DIR/<split> empty (or --force: the earlier
 * pack's images removed), DIR/<split>.folder-partial created, DIR/<split>
 * made; after the last: the directories of the classes no sample had
 * (seen[k] == 0) made (tty: with a progress line on stderr) and warned
 * of, the tree synced and the marker removed. */
kiln_status pack_folder_prepare(const struct pack_opts *o);
kiln_status pack_folder_done(const struct pack_opts *o, int64_t classes, const uint8_t *seen,
			     int tty);

#endif
