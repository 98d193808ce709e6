/* cli/pack_shards.c - kiln pack's records shards: each written as a
 * *.tmp file, cut at --shard-size, stamped with the split's count and the
 * pack's id when all are finished, then renamed into place between
 * creating and removing DIR/<split>.krec-partial; the shards an earlier
 * pack left (docs/formats.md).  Samples are read and encoded in
 * cli/cmd_pack.c.
 */
#include "build-config.h"
#include "pack.h"

#include <kiln/image.h> /* kiln_xform_resize_shorter */

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno */
#include <stdio.h>
#include <stdlib.h>   /* strtol, realloc, free */
#include <string.h>
#include <unistd.h>   /* unlink */


void shard_name(const struct pack_opts *o, int k, int tmp, char *out, size_t n)
{
	size_t l = strlen(o->out);
	snprintf(out, n, "%s%s%s-%05d%s%s", o->out, o->out[l - 1] == '/' ? "" : "/", o->split, k,
		 REC_SUFFIX, tmp ? ".tmp" : "");
}

static kiln_status too_many_shards(const struct pack_opts *o)
{
	return kiln_error(KILN_EUSAGE, "split '%s' needs more than %d shards of --shard-size %llu bytes, more than a reader can map at once (each shard is one mapping; Linux allows about 65530 a process, vm.max_map_count): pass a larger --shard-size",
			  o->split, REC_MAX_SHARDS, (unsigned long long)o->shard_size);
}

/* Refuse before packing when the samples' sizes are known (raw pixels of
 * one size) and cannot fit REC_MAX_SHARDS shards; other stores are
 * counted as the shards are written (shards_add). */
kiln_status shard_count_check(const struct pack_opts *o, const struct kiln_source_info *info)
{
	int h = info->image_h, w = info->image_w;
	if (o->store != REC_RAW || h <= 0 || w <= 0 || info->image_c <= 0)
		return KILN_OK;
	kiln_status st;
	if (o->resize && (st = kiln_xform_resize_shorter(h, w, o->resize, &h, &w)))
		return kiln_error_wrap(st, "--resize %d of [%s]'s images", o->resize, o->section);
	const uint64_t record = REC_RECORD_HEADER + (uint64_t)h * w * info->image_c;
	const uint64_t per = o->shard_size / record ? o->shard_size / record : 1;
	if ((uint64_t)info->len > per * REC_MAX_SHARDS)
		return too_many_shards(o);
	return KILN_OK;
}

kiln_status shards_finish(struct shards *sh)
{
	if (!sh->w)
		return KILN_OK;
	uint64_t b = rec_writer_bytes(sh->w);
	struct rec_writer *w = sh->w;
	sh->sizes[sh->n - 1] = rec_writer_count(w); /* where the shard ends: pack_id */
	sh->w = NULL;
	kiln_status st = rec_writer_finish(w); /* on failure the file is gone */
	if (!st)
		sh->bytes += b;
	return st;
}

kiln_status shards_add(struct shards *sh, const struct item *it, int encoding)
{
	kiln_status st;
	uint64_t need = REC_RECORD_HEADER + it->n + REC_ALIGN + REC_INDEX_ENTRY;
	if (sh->w && rec_writer_count(sh->w) && rec_writer_bytes(sh->w) + need > sh->o->shard_size &&
	    (st = shards_finish(sh)))
		return st;
	if (!sh->w) {
		char path[4200];
		if (sh->n == REC_MAX_SHARDS)
			return too_many_shards(sh->o);
		char **t = realloc(sh->tmp, (size_t)(sh->n + 1) * sizeof *t);
		if (!t)
			return kiln_error(KILN_ENOMEM, "out of memory");
		sh->tmp = t;
		uint64_t *z = realloc(sh->sizes, (size_t)(sh->n + 1) * sizeof *z);
		if (!z)
			return kiln_error(KILN_ENOMEM, "out of memory");
		sh->sizes = z;
		shard_name(sh->o, sh->n, 1, path, sizeof path);
		if (!(sh->tmp[sh->n] = strdup(path)))
			return kiln_error(KILN_ENOMEM, "out of memory");
		if ((st = rec_writer_open(kiln_host_table(), path, sh->classes, &sh->w))) {
			free(sh->tmp[sh->n]);
			return st;
		}
		sh->n++;
	}
	/* the pack's id (rec_shard_stamp, pack_id): a function of what was
	 * packed, so that the shards are the same for any --workers */
	const struct kiln_host *host = kiln_host_table();
	const int32_t meta[4] = { it->label, it->h, it->w, it->c };
	sh->pack = host->crc32c(host->crc32c(sh->pack, meta, sizeof meta), it->payload, it->n);
	return rec_writer_add(sh->w, it->label, it->h, it->w, it->c, encoding, it->payload, it->n);
}

/* Every shard finished: record in each its index, the split's shard
 * count and the pack's id, which a reader needs to tell a split missing
 * its last shard (docs/formats.md, the set block). */
kiln_status shards_stamp(const struct shards *sh)
{
	kiln_status st = KILN_OK;
	const uint32_t id = pack_id(sh->pack, sh->sizes, sh->n);
	for (int k = 0; k < sh->n && !st; k++)
		st = rec_shard_stamp(kiln_host_table(), sh->tmp[k], (uint32_t)k, (uint32_t)sh->n, id);
	return st;
}

/* Remove every *.tmp (after a failure; those already renamed are gone). */
void shards_discard(struct shards *sh)
{
	rec_writer_abort(sh->w);
	sh->w = NULL;
	for (int k = 0; k < sh->n; k++)
		unlink(sh->tmp[k]);
}

/* The names of DIR/<split>-*<suffix> that exist now (for --force and the
 * refusal to mix with an earlier pack).  Returns how many; *first gets one.
 * remove_from >= 0: remove them instead, all but kiln's names of shards
 * [0, remove_from), and return how many went. */
int existing_shards(const struct pack_opts *o, const char *suffix, char *first, size_t n,
		    int remove_from)
{
	DIR *d = opendir(o->out);
	if (!d)
		return 0;
	struct dirent *de;
	size_t sl = strlen(o->split), xl = strlen(suffix);
	int count = 0;
	while ((de = readdir(d))) {
		const char *name = de->d_name;
		size_t l = strlen(name);
		if (strncmp(name, o->split, sl) || name[sl] != '-' || l < sl + 1 + xl ||
		    strcmp(name + l - xl, suffix))
			continue;
		if (remove_from >= 0) {
			/* after a --force pack: remove the earlier pack's surplus shards */
			char *end, mine[300];
			long k = strtol(name + sl + 1, &end, 10);
			snprintf(mine, sizeof mine, "%s-%05ld%s", o->split, k, REC_SUFFIX);
			if (end == name + sl + 1 || k < 0 || k >= remove_from || strcmp(name, mine)) {
				char p[4200];
				snprintf(p, sizeof p, "%s/%s", o->out, name);
				count += !unlink(p);
			}
			continue;
		}
		if (!count)
			snprintf(first, n, "%s", name);
		count++;
	}
	closedir(d);
	return count;
}

/* Every shard is complete: move them into place (with --force, remove the
 * split's older shards past the new ones, named into old), then sync the
 * directory.  All of it between creating DIR/<split>.krec-partial and
 * removing it (REC_PARTIAL), so that a pack killed here leaves a split the
 * reader refuses rather than one that mixes two packs silently. */
kiln_status shards_place(const struct pack_opts *o, const struct shards *sh, char *old,
			 size_t old_size)
{
	kiln_status st = pack_mark_partial(o->out, o->split, REC_PARTIAL);
	for (int k = 0; k < sh->n && !st; k++) {
		char final[4200];
		shard_name(o, k, 0, final, sizeof final);
		if (rename(sh->tmp[k], final))
			st = kiln_error(KILN_EIO, "%s: cannot rename to %s: %s", sh->tmp[k], final,
					strerror(errno));
	}
	if (st) /* the marker stays: the split may be a mix */
		return st;
	if (o->force)
		existing_shards(o, REC_SUFFIX, old, old_size, sh->n);
	return pack_unmark_partial(o->out, o->split, REC_PARTIAL);
}
