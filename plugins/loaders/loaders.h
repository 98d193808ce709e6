/* plugins/loaders/loaders.h - what the files of kiln-loaders.so share.
 *
 * kiln-loaders.so carries every data source.  Each source is one file
 * (idx.c, folder.c, tar.c, lmdb.c, synthetic.c, ...) that defines one
 * descriptor; loaders.c lists them.  common.c holds the few helpers the
 * file-backed sources share (the split-directory rule, full preads).
 */
#ifndef KILN_LOADERS_H
#define KILN_LOADERS_H

#include <kiln/plugin.h>

#include <errno.h>     /* ENOENT, ENOTDIR: loaders_missing */
#include <stddef.h>    /* size_t */
#include <stdint.h>    /* uint64_t */
#include <sys/types.h> /* ssize_t */

/* The IDX (MNIST / Fashion-MNIST) source: idx.c. */
extern const struct kiln_plugin loaders_idx_plugin;
/* torchvision ImageFolder: one subdirectory per class: folder.c. */
extern const struct kiln_plugin loaders_folder_plugin;
/* WebDataset .tar shards, read by index: tar.c. */
extern const struct kiln_plugin loaders_tar_plugin;
/* An LMDB environment of label + encoded image values: lmdb.c. */
extern const struct kiln_plugin loaders_lmdb_plugin;
/* Generated images, for benchmarks and tests: synthetic.c. */
extern const struct kiln_plugin loaders_synthetic_plugin;

/* ---- common.c ---------------------------------------------------------- */

/* What every source's context starts with (so the shared helpers below,
 * which get the context, find it): the host, a name for messages (a path,
 * set by open), the sample count and the class count. */
struct loaders_source {
	const struct kiln_host *host;
	const char *who;
	int64_t n;
	int64_t classes;
	int64_t max_pixels; /* [data] max_image_pixels: what img_decode accepts */
};


/* A growable list of strings the list owns (file and directory names while
 * listing).  Zero-initialise; loaders_names_free frees the strings and v. */
struct loaders_names {
	char **v;                   /* [n] */
	size_t n, cap;
	/* set by loaders_find_shards when the names are a directory's
	 * listing of a split (so the split must be whole: loaders_set_check),
	 * 0 for a `shards` list or a single file (a subset may be chosen) */
	int scanned;
};

void loaders_names_free(struct loaders_names *l);
/* Append a copy of dir/name (one '/' between; name alone when dir is NULL
 * or empty or name is absolute).  Nonzero when out of memory. */
int loaders_names_add(struct loaders_names *l, const char *dir, const char *name);
/* Sort v[from, n) by strcmp (Python's order of str for UTF-8 names, and
 * zero-padded numbers in order). */
void loaders_names_sort(struct loaders_names *l, size_t from);
/* Sort v[from, n) in shard order: by name, but a run of digits in both
 * names by its number (train-99999 before train-100000). */
void loaders_shards_sort(struct loaders_names *l, size_t from);
/* The shards v[0, n) of one split found by listing a directory (full
 * paths, in shard order): when every name is kiln pack's "S-NNNNN" or
 * "S-NNNNNN" then `suffix` (one stem S, %05d or %06d numbers), the numbers
 * must have no gap between the least and the greatest; a missing one is
 * KILN_EDATA naming its file (a deleted shard was skipped silently:
 * session 33).  A run starting above 0 (1-based, or a subset of a split)
 * is whole.  Names of another form are not checked.  kiln's own formats
 * only: tar shards are written by other tools, numbered their way. */
kiln_status loaders_shards_contiguous(const struct kiln_host *host, char *const *v, size_t n,
				      const char *suffix);

/* What a shard written by kiln pack since session 34 records of its pack
 * (records: the set block; tokens: header ints 3..6; docs/formats.md):
 * its index among the pack's `count` shards of the split, and the pack's
 * id (a CRC32C of what was packed, the same in every shard of one pack).
 * count 0: not recorded (an older shard, or another tool's). */
struct loaders_set {
	uint32_t index, count, pack;
};

/* The shards paths[0, n) (in the order read) with their records (shard
 * i's at (const char *)sets + i * stride: the `set` member of the
 * source's own array of shards, read in place):
 * shards of one pack (same id and count) must not repeat an index (one
 * file listed twice, or copied under two names); when `whole` (a
 * directory's listing of the split) every shard must record the same pack
 * and the pack's every index 0 .. count-1 must be there: a missing one
 * (the last, which no gap shows, among them) is KILN_EDATA naming the
 * file kiln pack gave it.  Shards that record nothing are not checked
 * (loaders_shards_contiguous still is). */
kiln_status loaders_set_check(const struct kiln_host *host, char *const *paths,
			      const struct loaders_set *sets, size_t stride, size_t n, int whole,
			      const char *suffix);

/* The hint that follows the error of a shard's open() that failed with
 * errno `err`, one of the split's nshards: for EMFILE, that every shard
 * stays open while the run reads it and the ulimit -n to raise (written
 * into buf, n bytes); "" for any other error. */
const char *loaders_open_hint(int err, size_t nshards, char *buf, size_t n);

/* Descriptors a run needs besides its shards' (checkpoints, logs, the
 * device, the communicator): fewer left once the shards are open, and
 * the run failed later, far from the cause ("[run] out_dir: cannot read
 * ...: Too many open files", session 38's review). */
#define LOADERS_FD_HEADROOM 64

/* 1 with the message (n bytes into buf) when the shards of a split of
 * nshards, the highest open descriptor now top_fd, leave fewer than
 * LOADERS_FD_HEADROOM of ulimit -n; 0 when there is room (or no limit). */
int loaders_fd_headroom(int top_fd, size_t nshards, char *buf, size_t n);

/* Read n bytes at offset `off` of fd with pread(), retrying short reads and
 * EINTR.  Returns the bytes read (less than n only at the end of the file),
 * or -1 with errno set.  Thread-safe: uses no file position. */
ssize_t loaders_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* Read the n bytes at offset `off` of fd (a file's whole content, or a
 * member of a shard) into a buffer of its own and decode them as a JPEG or
 * PNG image into img (img_decode, at most src->max_pixels).  `what` names
 * the bytes in every message ("photos/cat/1.jpg", "a.tar: member k.jpg
 * (offset 512)").  KILN_ENOMEM; KILN_EIO when the read fails; KILN_EDATA
 * when fewer than n bytes are left (the file shrank since it was listed)
 * or they do not decode.  fd is neither moved nor closed: thread-safe. */
kiln_status loaders_read_image(const struct loaders_source *src, int fd, uint64_t off, size_t n,
			       const char *what, struct kiln_image *img);

/* The split-directory rule of the file-backed sources (folder, tar, lmdb).
 * `path` is the value of [section] path (NULL when unset: KILN_ECONFIG);
 * `split` the split the run asks for ("train", "test") or the section's
 * own `split` key, `split_is_key` nonzero in the second case.
 *
 *   - if <path>/<split> exists, it is the root (so [data] path = /x reads
 *     /x/train and [data.eval], which inherits path, reads /x/test);
 *   - else a `split` set by key is an error (KILN_ENOTFOUND: the
 *     directory the user named does not exist; KILN_EIO before session 37);
 *   - else a split other than the section's own (train for [data], test
 *     for [data.eval], val for [data.val]) is an error too (KILN_EUSAGE,
 *     exit 2, when it is not there; KILN_EIO before session 37):
 *     `kiln pack --split vla` asked for it by name, and reading <path>
 *     would pack the split folders as classes;
 *   - else, for [data.eval] or [data.val] whose path is inherited from
 *     [data], an error (KILN_ECONFIG): it would silently read the
 *     training data;
 *   - else the root is <path> itself.
 *
 * A missing <path>, or a missing <path>/<split> of a split key, is
 * KILN_ENOTFOUND (loaders_no_such_file).  out receives the root (n bytes);
 * *is_dir whether it is a directory.  `who` names the source in messages. */
kiln_status loaders_split_root(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *who, const char *path,
			       const char *split, int split_is_key, char *out, size_t n,
			       int *is_dir);

/* Whether [section] path (set: path non-NULL and non-empty) is a
 * directory, for the sources whose `shards` are relative to it: *is_dir 0
 * when unset or a file.  Set but missing is KILN_ENOTFOUND naming it and
 * where it was set (loaders_no_such_file) (a shards pattern would else be matched in the working
 * directory and the error name only the pattern). */
kiln_status loaders_path_is_dir(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, const char *who, const char *path, int *is_dir);

/* The key a sharded source's files came from, for a message about one of
 * them: "[section] shards, set at FILE:LINE" when `shards` named them,
 * else "[section] path, set at FILE:LINE" (or "..., the default"), into
 * out (n bytes). */
void loaders_shards_key(const struct kiln_host *host, const struct kiln_config *cfg,
			const char *section, char *out, size_t n);

/* A file the config names that is not there: KILN_ENOTFOUND, which the
 * core reports as a config error (KILN_ECONFIG, exit 2), as a missing
 * --checkpoint or [model] init_from is (README.md, "Exit codes"), and
 * which `kiln predict` of images takes for a model shipped without its
 * data; before session 37 a data file's was KILN_EIO (exit 3).  Told at the first open or stat of the file
 * from its errno (ENOENT: no such file; ENOTDIR: a directory on the way
 * is a file), not by a look before it, which a file removed in between
 * would get wrong.  Any other failure to open stays the data's (KILN_EIO). */
static inline int loaders_missing(int err)
{
	return err == ENOENT || err == ENOTDIR;
}

/* Where a file's name came from, the start of loaders_no_such_file's
 * message: "FILE:LINE: [section] key" (or "command line 'K=V': [section]
 * key"), "FILE:LINE: [data] key (inherited by [section])" for a key
 * [data.eval] or [data.val] takes from [data], or "[section] key (the
 * default)", into out (n bytes). */
/* The same in the words of a parenthesis ("[data.eval] path, %s"): "set
 * at FILE:LINE", "inherited from [data] key, set at FILE:LINE" or "the
 * default", into out (n bytes); returns out. */
const char *loaders_where_said(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *key, char *out, size_t n);
void loaders_key_at(const struct kiln_host *host, const struct kiln_config *cfg,
		    const char *section, const char *key, char *out, size_t n);

/* KILN_ENOTFOUND: "AT: PATH: no such file (WHAT)", AT from loaders_key_at;
 * `what` says what the file was to be (may be NULL); a relative PATH adds
 * "; a relative name is read from the working directory, CWD". */
kiln_status loaders_no_such_file(const struct kiln_host *host, const char *at, const char *path,
				 const char *what);

/* loaders_key_at of the key a sharded source's files came from (`shards`
 * when set, else `path`), for loaders_no_such_file. */
void loaders_shards_at(const struct kiln_host *host, const struct kiln_config *cfg,
		       const char *section, char *out, size_t n);

/* Join dir and name with one '/' into out (n bytes); nonzero when it does
 * not fit. */
int loaders_join(char *out, size_t n, const char *dir, const char *name);

/* KILN_EINVAL for `what` ("sample index" or "position") v outside
 * [0, last] of a source of n samples; `who` names it (a path). */
kiln_status loaders_out_of_range(const struct kiln_host *host, const char *who,
				 const char *what, int64_t v, int64_t n, int64_t last);

/* [section] classes of the sources whose labels may decide it: 0 when
 * unset (the largest label + 1), else the class count, at most INT32_MAX
 * (KILN_ECONFIG naming file:line). */
kiln_status loaders_classes_key(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, int64_t *classes);

/* [section] max_image_pixels into src->max_pixels (IMG_MAX_PIXELS when
 * the config was not validated, so the key has no value). */
kiln_status loaders_max_pixels_key(const struct kiln_host *host, const struct kiln_config *cfg,
				   const char *section, struct loaders_source *src);

/* KILN_EINVAL, naming the source, for a sample index outside [0, n). */
kiln_status loaders_check_index(const struct loaders_source *src, int64_t index);

/* The info of a source (ctx: a context that starts with a struct
 * loaders_source) of n images whose sizes vary (sample and image sizes
 * left 0) with i32 scalar labels in [0, classes). */
kiln_status loaders_varying_info(void *ctx, struct kiln_source_info *info);
/* The info of a source of n token sequences (src's n and classes): sample
 * and label both i32 [T] (the next-token or target ids), rows. */
void loaders_sequence_info(const struct loaders_source *src, int64_t T, struct kiln_source_info *info);
/* ... and, after it, what a source of fixed-size images sets: samples
 * `dtype` [d0, d1, d2], images h x w x ch. */
void loaders_fixed_info(struct kiln_source_info *info, int dtype, int64_t d0, int64_t d1,
			int64_t d2, int32_t h, int32_t w, int32_t ch);

/* The shard files of a sharded source (records, tokens), from its keys:
 *   - `shards` (a list, comma-separated): these files in this order,
 *     relative to `path` when that is a directory; a name with a glob
 *     character (*, ?, [) expands to the files it matches, sorted, and must
 *     match one.  Never inherited by [data.eval] (config).
 *   - else `path` a file: that shard ([data.eval] inheriting it is an
 *     error: it would evaluate on the training file);
 *   - else `path` a directory: every *<suffix> of path/<split>/ when that
 *     is a directory, else path/<split>-*<suffix>, in name order.
 * `who` names the source in messages.  out receives the names (the caller
 * frees them with loaders_names_free, also on failure).  KILN_ECONFIG for
 * keys, KILN_EIO when nothing is found. */
kiln_status loaders_find_shards(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, const char *who, const char *split,
				const char *suffix, struct loaders_names *out);

/* Shard "<dir>/<split>-<n><suffix>" with no "<dir>/<split><partial>" beside
 * it (REC_PARTIAL, TOK_PARTIAL): a kiln pack that did not finish writing or
 * placing its shards leaves that file, and its split may be incomplete or
 * mix two packs.  KILN_EDATA naming both files when it is there. */
kiln_status loaders_not_partial(const struct kiln_host *host, const char *shard,
				const char *partial);

/* "<root>.folder-partial" beside an image folder's split directory
 * <root> (DIR/<split>): `kiln pack --format folder` creates it before it
 * removes an earlier pack's images or writes the first one, and removes it
 * after the last one is written.  A pack that failed or was killed leaves
 * it, and its tree may hold only some of the samples, whose class folders
 * (labels) then shift. */
#define FOLDER_PARTIAL ".folder-partial"

/* The image folder root (a trailing "/" or "/." ignored) with no
 * "<root><partial>" beside it: KILN_EDATA naming both when it is there. */
kiln_status loaders_root_not_partial(const struct kiln_host *host, const char *root,
				     const char *partial);

/* A source's ops table (every member written, NULL where it has none)
 * and its descriptor
 * loaders_<var>_plugin, the row loaders.c lists. */
#define LOADERS_SOURCE(var, nm, sum, keysv, open_fn, close_fn, info_fn, read_fn, read_image_fn) \
	LOADERS_SOURCE_PF(var, nm, sum, keysv, open_fn, close_fn, info_fn, read_fn, read_image_fn, NULL, NULL)

/* LOADERS_SOURCE with the version 3 prefetch hint and the version 4 list
 * of the files read (either NULL: none) */
#define LOADERS_SOURCE_PF(var, nm, sum, keysv, open_fn, close_fn, info_fn, read_fn, read_image_fn, \
			  prefetch_fn, files_fn)                                                     \
	LOADERS_SOURCE_PEEK(var, nm, sum, keysv, open_fn, close_fn, info_fn, read_fn,             \
			    read_image_fn, prefetch_fn, files_fn, NULL)

/* ... and the version 5 peek (NULL: none, the core opens the set) */
#define LOADERS_SOURCE_PEEK(var, nm, sum, keysv, open_fn, close_fn, info_fn, read_fn,            \
			    read_image_fn, prefetch_fn, files_fn, peek_fn)                         \
	static const struct kiln_source_ops var##_ops = {                                        \
		.version = KILN_SOURCE_OPS_VERSION, .open = open_fn, .close = close_fn,         \
		.info = info_fn, .read = read_fn, .read_image = read_image_fn,                   \
		.prefetch = prefetch_fn, .files = files_fn, .peek = peek_fn,                     \
	};                                                                                       \
	const struct kiln_plugin loaders_##var##_plugin = {                                      \
		.abi_major = KILN_ABI_MAJOR, .abi_minor = KILN_ABI_MINOR,                        \
		.kind = KILN_PLUGIN_SOURCE, .name = nm, .summary = sum, .ops = &var##_ops,       \
		.keys = keysv, .probe = NULL,                                                    \
	}

/* kiln's packed record shards (.krec): records.c, format in records.h. */
extern const struct kiln_plugin loaders_records_plugin;

/* llm.c-format token shards, windows of context+1 tokens: tokens.c. */
extern const struct kiln_plugin loaders_tokens_plugin;

/* Generated digit strings and their reversal or sorting: seq2seq.c. */
extern const struct kiln_plugin loaders_seq2seq_plugin;

#endif /* KILN_LOADERS_H */
