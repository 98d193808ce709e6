/* core/internal.h - declarations shared inside libkiln only. */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#ifdef HAVE_CONFIG_H
#include "build-config.h"
#include <kiln/kiln.h>

#include <errno.h> /* ERANGE: kiln_strtod_lost */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KILN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* A host and port in messages: "host:port", an IPv6 address in brackets
 * ("[::1]:29500", as MASTER_ADDR or --master take it back):
 *   printf("store " KILN_AT_FMT, KILN_AT_ARG(host, port)); */
#define KILN_AT_FMT "%s%s%s:%d"
#define KILN_AT_ARG(host, port)                                          \
	(strchr((host), ':') ? "[" : ""), (host), (strchr((host), ':') ? "]" : ""), (int)(port)

/* A size in an out-of-memory message: "3380 bytes", "12.5 MiB" from a MiB,
 * "22.35 GiB" from a GiB, into out (n bytes; returned). */
static inline const char *kiln_bytes_str(char *out, size_t n, double bytes)
{
	if (bytes < 1048576)
		snprintf(out, n, "%.0f bytes", bytes);
	else if (bytes < 1073741824)
		snprintf(out, n, "%.1f MiB", bytes / 1048576);
	else
		snprintf(out, n, "%.2f GiB", bytes / 1073741824);
	return out;
}

/* The name cfg was loaded from (kiln_config_load's path, or
 * kiln_config_load_string's name); NULL for a NULL cfg. */
const char *kiln_config_file(const struct kiln_config *cfg);

/* Levenshtein distance, for "did you mean" suggestions. */
int kiln_edit_distance(const char *a, const char *b);

/* "; did you mean 'X'?" into out (n bytes; returned) when X, one of the
 * names of `list` (separated by ',', '|' or spaces), is within an edit
 * distance of max(2, strlen(word) / 2) of word, case ignored, the closest
 * (the first of a tie), and not word itself; or X, kiln's name of a
 * PyTorch name (`CrossEntropyLoss`: 'softmax_xent'; `nn.Conv2d`, a module
 * path: its last part); else "".  The one suggester of every choice
 * value: a layer type, a source, an optimizer, a device, an enum. */
const char *kiln_suggest_choice(const char *word, const char *list, char *out, size_t n);

/* The range of a double, for messages that refuse a number past it
 * (number_out_of_range, config_impl.h; [data] mean and std, the
 * transforms' lists): a magnitude over DBL_MAX, or one so small it would
 * read as 0 (1e-400; kiln_strtod_lost).  The subnormals, which strtod
 * flags ERANGE too, are numbers a double holds: read as strtod gives
 * them. */
#define KILN_DOUBLE_RANGE \
	"a double holds 0 and magnitudes from 4.9406564584124654e-324 to 1.7976931348623157e+308"
/* 1 when strtod's result x (errno e after it) lost the number written:
 * past DBL_MAX (inf) or under the least subnormal (0 from a non-zero
 * text; ERANGE is set only then for a zero).  Not for a subnormal. */
static inline int kiln_strtod_lost(double x, int e)
{
	return e == ERANGE && (x == 0 || x > 1.7976931348623157e308 || x < -1.7976931348623157e308);
}
/* The schema's default of [section] key as cfg's registry knows it (a
 * layer's keys by its type in cfg; a plugin section's by the plugin): 1
 * and *def (NULL: no default), or 0 for a key it does not know. */
int kiln_config_key_default(const struct kiln_config *cfg, const char *section, const char *key,
			    const char **def);
/* core/config_same.c.  The canonical text of v[0..n) (not NUL-terminated),
 * a value of [section] key whose schema row is k (k NULL: none), into out
 * (outn bytes): 1, or 0 where the value is its own text.  By k's type, read
 * with the schema's parsers: FLOAT the number parse_number reads, as the
 * shortest %g that reads back as it (C locale; 0.10 and 1e-1 are 0.1, -0
 * is 0); INT a whole number as %lld; BOOL 1 or 0 (true/yes/on, any case,
 * are 1); INTS the numbers as "a,b", a built-in layer's pair (get_pair:
 * "N" is (N, N)) "N" when both are N; [train] milestones the step counts
 * kiln_parse_milestones reads, as "a,b".  STR, LIST, ENUM, a choice word
 * ("auto") and a value its type's parser refuses: 0.  Two values mean the
 * same when their canonical texts (or, both 0, their bytes) are equal. */
int kiln_config_value_canon(const struct kiln_config *cfg, const char *section,
			    const struct kiln_key *k, const char *v, size_t n, char *out, size_t outn);
/* core/config_same.c.  Is [section] key a pair, read as a built-in layer
 * reads it (get_pair, core/layers/util.h: "N" is (N, N), so `kernel = 5`
 * is `kernel = 5,5`)?  1 where section is a [layer.X] whose type,
 * type[0..type_n) (not NUL-terminated; NULL: unset), is one of kiln's own
 * layers and that layer's schema has key as an integer list (conv's and
 * the poolings' kernel, stride, padding, dilation); else 0: a layer
 * plugin reads its keys as it likes, so its lists are compared number by
 * number ("5" never "5,5"), and other sections have no pairs.  The one
 * rule for the canonical text (kiln_config_value_canon) and for the
 * older kilns' forms a checkpoint may hold (core/resume.c). */
int kiln_config_pair_key(const char *section, const char *type, size_t type_n, const char *key);
/* Whether a[0..an) and b[0..bn), two values of [section] key, mean the
 * same by the key's schema row in cfg (the layer type cfg gives [section],
 * the plugin cfg's registry has for it): equal bytes, or equal canonical
 * texts (kiln_config_value_canon).  0 for a NULL value; cfg NULL: bytes. */
int kiln_config_values_same(const struct kiln_config *cfg, const char *section, const char *key,
			    const char *a, size_t an, const char *b, size_t bn);
/* Is a file called base (e.g. "kiln-cuda.so") in the registry's plugin
 * path?  Loads nothing (kiln_registry_file_count loads every file). */
int kiln_registry_has_file(const struct kiln_registry *reg, const char *base);
/* The path of the file that plugin descriptor p came from, borrowed until
 * kiln_registry_close; NULL for a built-in (kiln_builtin_layers) or a
 * descriptor reg does not hold. */
const char *kiln_registry_plugin_file(const struct kiln_registry *reg, const struct kiln_plugin *p);

/* Extra keys for a section that the registry supplies: a layer type's keys
 * for [layer.X] (selected by `type`), a source's for [data]/[data.eval]
 * (selected by `source`), a plugin's for [plugin.X].  *ext is NULL when
 * there are none.  KILN_ECONFIG/KILN_ENOTFOUND when the selector names
 * nothing registered. */
kiln_status kiln_config_ext_schema(const struct kiln_config *cfg,
				   const struct kiln_registry *reg, const char *section,
				   const struct kiln_key **ext);

char *kiln_strdup(const char *s);

/* core/sized.c: a public struct the library fills that begins with
 * `size_t size` (kiln/kiln.h, "Structs the library fills").  Check:
 * KILN_EINVAL naming fn when out is NULL or its size cannot hold `size`
 * (not set: `init` names the macro that sets it); then nothing may be
 * written to it.  Out: full's first min(out's size, full_size) bytes
 * into out (checked before), out's size then the bytes written. */
kiln_status kiln_sized_check(const void *out, const char *fn, const char *type, const char *init);
void kiln_sized_out(void *out, const void *full, size_t full_size);
/* KILN_EINVAL with "fn: arg is NULL": a public function's required pointer
 * argument missing (the headers in include/kiln/ say which may be NULL). */
kiln_status kiln_null_arg(const char *fn, const char *arg);

/* fopen(path, mode) ("r", "w", "w+" or "a+") of a file kiln reads or writes
 * whole (the config, a run's logs, config.ini, profile.txt), never
 * blocking in open (a FIFO waits there for its other end otherwise, for
 * ever) and refusing what is not a regular file, but for a pipe to read
 * (`kiln train <(...)`) and a character device to write (/dev/null,
 * /dev/full).  Errors: "PATH: cannot VERB: ...". */
kiln_status kiln_fopen_regular(const char *path, const char *mode, const char *verb, FILE **out);
/* kiln_safetensors_open of the regular file open on fd (borrowed: the
 * reader reads a duplicate of it), named path in messages
 * (core/safetensors.c), with what was seen of it when it was opened
 * (`seen`; NULL: fstat() now), for every reader of a file opened once
 * and told apart by its first bytes: [model] init_from and a command's
 * weights file (kiln_weights_load_fd), an INT8 model (kiln_quant_open). */
struct kiln_file_seen;
kiln_status kiln_safetensors_open_fd(const char *path, int fd, const struct kiln_file_seen *seen,
				     struct kiln_safetensors **out);
/* kiln_safetensors_get without `data` (NULL): what kiln's own loaders
 * ask, which read with kiln_safetensors_read and never map the file. */
void kiln_safetensors_describe(const struct kiln_safetensors *f, int i,
			       struct kiln_safetensors_tensor *out);
/* CRC32Cs of a file's contents in its metadata (core/safetensors.c,
 * docs/formats.md "INT8 model"; kiln quantize's files since session 40,
 * kiln export's and kiln_model_save_safetensors' since 41, both in key
 * KILN_ST_CRC_KEY):
 * w computes them when it writes the file, into metadata `key` (the
 * header's meaning, then each tensor's bytes). */
kiln_status kiln_safetensors_writer_crc(struct kiln_safetensors_writer *w, const char *key);
/* f checked against them in the pass that loads (since session 42; an
 * INT8 model since 43: before, a load read every byte twice, and a
 * pipeline stage's rank the whole file for its stage's tensors): f's
 * header against metadata `key` now
 * (KILN_EDATA naming it; *had 0 and KILN_OK where f has no `key`), then
 * each tensor against its own as kiln_safetensors_read reads it, piece
 * by piece (KILN_EDATA naming the file and the tensor: the caller's
 * buffer then holds bytes it must not use).  A tensor never read is
 * never checked; nor are the bytes of the mapping (`data`).  Call it
 * before any read, from the thread that opened f. */
kiln_status kiln_safetensors_crc_reads(struct kiln_safetensors *f, const char *key, int *had);
#define KILN_ST_CRC_KEY "kiln.crc32c"

/* 1 while a stop is requested (kiln_train_request_stop) and not yet taken
 * by the trainer: what a wait before training (the rendezvous) checks. */
int kiln_stop_pending(void);

/* The ABI minor the device's plugin was built against (core/device.c): what
 * the planner may ask of its ops. */
unsigned kiln_device_abi_minor(const struct kiln_device *dev);

/* The compute threads the device was opened with ([run] threads, or a
 * pipeline stage's share): 0 for one per CPU of the affinity mask.  The
 * loader engine reads it to know whether a CPU is left for its workers. */
int kiln_device_threads(const struct kiln_device *dev);

/* Whether the device was opened for one process of one instance (the
 * options' ranks and peers 1): then the CPU device's streams are sync by
 * default ([plugin.cpu] async = auto) and the training thread is one of
 * its compute threads; with several ranks or [run] devices' stages they
 * run beside it.  The loader's consumer-fill rule reads it. */
int kiln_device_alone(const struct kiln_device *dev);

/* Whether the device's streams run their work on threads of their own now
 * (KILN_PROC_STREAMS_ASYNC): 1 yes, 0 no (the issuing thread runs it), -1
 * the device does not say. */
int kiln_device_streams_async(struct kiln_device *dev);
/* The process's threads' run-queue wait so far, in ns (KILN_PROC_RUN_WAIT);
 * -1 where the device does not say. */
int64_t kiln_device_run_wait_ns(struct kiln_device *dev);
/* A side stream of `stream` (KILN_PROC_STREAM_SIDE, include/kiln/plugin.h);
 * KILN_ENOTSUP, said, where the device has none. */
kiln_status kiln_device_stream_side(struct kiln_device *dev, void *stream, void **side);

/* The resolved [layer.*] sections alone, as kiln_config_write writes them
 * (with the defaults of the registry cfg was validated with) but each
 * value in its canonical text (kiln_config_value_canon: `kernel = 5,5`
 * is written `kernel = 5`, `p = 0.10` `p = 0.1`): the model's
 * architecture, which core/weights.c hashes into exported files
 * (config_hash), one text for configs that differ in formatting alone.
 * how: KILN_LAYERS_CANON, that; KILN_LAYERS_SET, that without the
 * "; key = (unset)" lines, what an export records (kiln.layers since
 * session 42: before, GPT-2 small's held 8.4 KB of them, of 26.4);
 * KILN_LAYERS_DEFAULTS, every key of those sections at its default
 * instead (kiln_config_write_defaults's: what a key absent from an
 * older text meant). */
enum { KILN_LAYERS_CANON = 0, KILN_LAYERS_DEFAULTS = 1, KILN_LAYERS_SET = 2 };
kiln_status kiln_config_write_layers(const struct kiln_config *cfg, FILE *f, int how);
/* The [layer.*] sections of a resolved config text (a checkpoint's
 * config, an export's kiln.layers) in its order, each with the keys its
 * layer type has with no default and it lacks written back unset ("; key
 * = (unset)") in their schema places (the type's keys as cfg's registry,
 * else the built-in layers, have them): the text kiln_config_write
 * writes, whether or not the unset keys were left out (KILN_LAYERS_SET),
 * which the weights comparison reads (core/weights.c).  malloc'd; NULL
 * with KILN_ENOMEM set. */
char *kiln_config_layers_of(const struct kiln_config *cfg, const char *text);
/* A copy of cfg into *out (new; kiln_config_free): every section and key
 * with its value and where, the unset notes, the registry it was validated
 * with.  For a change one caller needs that the owner of cfg, read-only
 * once validated, must not see (core/infer.c's conv_impl = auto). */
kiln_status kiln_config_dup(const struct kiln_config *cfg, struct kiln_config **out);
/* Every section of cfg (and the fixed ones it lacks) with every key at its
 * schema default, in kiln_config_write's format: what a key absent from an
 * older resolved config (one written before the key existed) meant. */
kiln_status kiln_config_write_defaults(const struct kiln_config *cfg, struct kiln_registry *reg,
				       FILE *f);

#endif

extern const struct kiln_key kiln_layer_common_keys[];
int kiln_schema_fixed_count(void);
const char *kiln_schema_fixed_name(int i, const char **doc);
/* " ('out' unset by command line 'layer.fc1.out=')" for the keys of
 * [section] a command-line override unset, "" when none, into buf (n
 * bytes; returned): the note a message about a missing key appends. */
const char *kiln_config_unset_note(const struct kiln_config *cfg, const char *section,
				   char *buf, size_t n);

/* NULL-terminated table of the built-in layer types (core/layers/). */
extern const struct kiln_plugin *const kiln_builtin_layers[];
/* NULL-terminated table of the built-in optimizers (core/optim/optims.c). */
extern const struct kiln_plugin *const kiln_builtin_optims[];
const struct kiln_key *kiln_optim_any_key(const char *key);
/* The optimizer [train] optimizer names, built-in or plugin, or
 * KILN_ECONFIG naming file:line and the choices (core/optim/optim.c). */
kiln_status kiln_optim_find(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    const struct kiln_plugin **p);

/* ---- counter-based RNG (core/rng.c) ---- */
enum { KILN_RNG_INIT = 1, KILN_RNG_SHUFFLE = 2, KILN_RNG_DROPOUT = 3, KILN_RNG_AUGMENT = 4,
       KILN_RNG_SKIP = 5, KILN_RNG_SAMPLE = 6 /* generation's draws (core/generate.c) */ };
uint32_t kiln_rng_u32(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b);
float kiln_rng_uniform(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b);
/* out[k] = kiln_rng_uniform(seed, stream, a, b0 + k), k < n, vectorized */
void kiln_rng_uniform_run(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b0, int64_t n,
			  float *out);
/* the same; vector 0: the portable code even where AVX-512 is (tests);
 * 1: the best the CPU has; 2: AVX2 even where AVX-512 is (portable without) */
void kiln_rng_uniform_run_isa(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b0,
			      int64_t n, float *out, int vector);
void kiln_rng_uniform4(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b, float u[4]);
uint64_t kiln_rng_below(uint64_t seed, uint32_t stream, uint64_t a, uint64_t n);
void kiln_rng_permutation(uint64_t seed, uint64_t epoch, int64_t *perm, int64_t n);
/* out[t] = perm[n - 1 - t], t < min(k, n), of kiln_rng_permutation's perm,
 * in O(k) time and memory; out is the caller's (k entries; none written
 * for k or n <= 0); -1: out of memory (core/rng.c) */
int kiln_rng_permutation_tail(uint64_t seed, uint64_t epoch, int64_t n, int64_t k, int64_t *out);

/* ---- an open source (core/source.c; kiln.h's kiln_source_*) ---- */
struct kiln_source {
	const struct kiln_source_ops *ops;
	void *ctx;
	const char *name;    /* the plugin's (static) */
	char section[32];
	struct kiln_source_info info; /* len after [data] limit */
};

/* ---- the monotonic clock every timing in the core reads (core/status.c) ---- */
int64_t kiln_now_ns(void);
/* The process's resident memory now and its peak (VmRSS and VmHWM of
 * /proc/self/status), in bytes, 0 where unknown; with reset, first restart
 * the peak at the current size where the kernel allows (clear_refs). */
void kiln_rss(size_t *now, size_t *peak, int reset);
/* The process's address space now (VmSize of /proc/self/status, 0 where
 * unknown) and what RLIMIT_AS lets it grow to (its soft limit; SIZE_MAX
 * without one), in bytes; either may be NULL. */
void kiln_vm(size_t *now, size_t *limit);
static inline double kiln_now_s(void) { return 1e-9 * (double)kiln_now_ns(); }

/* ---- the run clock (core/run_clock.c): CLOCK_MONOTONIC less the time the
 * whole process stood still (stopped, suspended), for the deadlines of a
 * distributed run's waits, which a job suspended whole must not expire.
 * kiln_run_clock_start starts its ticker (counted: every start has its
 * stop); without one the clock is CLOCK_MONOTONIC.  Thread-safe; the
 * readers take no lock. ---- */
int64_t kiln_run_ns(void);
/* CLOCK_MONOTONIC, the run clock and the stalled time of one instant (any
 * pointer may be NULL): *run + *stalled == *mono exactly. */
void kiln_run_clock_read(int64_t *mono, int64_t *run, int64_t *stalled);
int64_t kiln_run_stalled_ns(void); /* the stalled time so far */
/* When the last stall the ticker saw ended (CLOCK_MONOTONIC ns; 0: none)
 * and in *len_ns how long the process stood still then. */
int64_t kiln_run_last_stall(int64_t *len_ns);
kiln_status kiln_run_clock_start(void);
void kiln_run_clock_stop(void);

/* ---- whole transfers on a file descriptor (core/status.c) ---- */
enum { KILN_IO_WRITE, KILN_IO_SEND, KILN_IO_PWRITE };
/* Move all n bytes from buf to fd by write(), send() (MSG_NOSIGNAL: no
 * SIGPIPE) or pwrite() at off, retrying EINTR and short transfers: 0, or
 * -1 with errno (0 for a pwrite that wrote nothing).  Reads go through
 * kiln_pread_all and kiln_read_at (one loop: common_pread_full). */
int kiln_io_all(int fd, int how, const void *buf, size_t n, uint64_t off);
/* Room for element n of the array arr (*cap elements of size bytes
 * allocated): arr itself while n < *cap, else arr reallocated to twice
 * *cap elements (first when *cap is 0) with *cap updated, or NULL when
 * out of memory (arr and *cap unchanged). */
void *kiln_grow(void *arr, int n, int *cap, size_t size, int first);
static inline int kiln_write_all(int fd, const void *buf, size_t n)
{
	return kiln_io_all(fd, KILN_IO_WRITE, buf, n, 0);
}
static inline int kiln_send_all(int fd, const void *buf, size_t n)
{
	return kiln_io_all(fd, KILN_IO_SEND, buf, n, 0);
}
static inline int kiln_pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
	return kiln_io_all(fd, KILN_IO_PWRITE, buf, n, off);
}
/* All n bytes of fd at off into buf (common_pread_full: EINTR and short
 * reads retried): 0, or -1 with errno (0 when the file ends first). */
int kiln_pread_all(int fd, void *buf, size_t n, uint64_t off);

/* A regular file kiln reads piece by piece while it stays open
 * (safetensors, llm.c's model file): what fstat() said of it when kiln
 * opened it, so that a file rewritten in place under kiln (to its old
 * size or more: a short read tells a smaller one) is refused, not read
 * half old, half new (before session 40 it was loaded). */
struct kiln_file_seen {
	uint64_t size;
	int64_t mtime_ns; /* st_mtim */
};
/* fstat() of fd into *seen: KILN_OK, or KILN_EIO naming path. */
kiln_status kiln_file_seen_fd(int fd, const char *path, struct kiln_file_seen *seen);
/* The n bytes at off of the file open on fd (named path in messages;
 * *seen when it was opened) into buf, EINTR and short reads retried, then
 * the file's fstat() compared with *seen: KILN_OK; KILN_EDATA when the
 * file ends first, naming `what` ("tensor 'fc1.weight'"), its bytes, how
 * many were there and the file's size then and now, or when its size or
 * modification time is no longer *seen's (rewritten in place while kiln
 * read it); KILN_EIO naming the error of a failed read or fstat. */
kiln_status kiln_read_at(int fd, const char *path, const struct kiln_file_seen *seen,
			 const char *what, void *buf, size_t n, uint64_t off);

/* ---- an output file written whole or not at all (core/out_file.c) ---- */
/* kiln_file_write and kiln_file_fill are public (kiln/kiln.h): the CLI's
 * `predict --logits OUT.npy` writes through it too. */

/* fsync directory `dir` (a rename or creation in it made durable):
 * KILN_OK, also where the file system cannot fsync a directory (EINVAL);
 * else KILN_EIO naming it (core/out_file.c; checkpoints and the atomic
 * writer share it). */
kiln_status kiln_fsync_dir(const char *dir);
/* A run file (config.ini, profile.txt, trace.json) about to go through
 * kiln_file_write, which writes a FIFO or device straight to: KILN_EIO
 * naming path unless it is a regular file, none, or a character device
 * (/dev/null), as kiln_fopen_regular decides (never blocking on a FIFO
 * with no reader: that wait was for ever).  A regular file is not opened. */
kiln_status kiln_run_file_check(const char *path);
/* kiln_source_open, and *missing (may be NULL) 1 when it failed because a
 * file the config names is not there (the plugin's KILN_ENOTFOUND,
 * returned as KILN_ECONFIG: exit 2), else 0: `kiln predict` of images
 * goes on without [data.eval]'s files (core/infer.c, image_xform). */
struct kiln_source;
kiln_status kiln_source_open_named(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *section, const char *split, struct kiln_source **out,
				   int *missing);
/* What [section]'s source says of its images without opening the set
 * (source ops version 5, peek): *plugin the source, *info as its info()
 * would fill it after an open but for len, classes and classes_from (0),
 * *peeked 1.  *peeked 0 with KILN_OK: the source cannot tell (no peek, or
 * KILN_ENOTSUP from it), or an output is watched that exists already
 * (kiln_output_watch: only an open compares it with every file of the
 * set): open the set instead.  Errors as kiln_source_open_named's, *missing
 * alike. */
struct kiln_plugin;
struct kiln_source_info;
kiln_status kiln_source_peek(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *section, const char *split, const struct kiln_plugin **plugin,
			     struct kiln_source_info *info, int *missing, int *peeked);
/* The watched output's (kiln_output_watch) device and inode into *o: 1,
 * or 0 when nothing is watched or it does not exist yet (then no file can
 * be it, and kiln_source_open walks no source's files). */
struct stat;
int kiln_output_watched_stat(struct stat *o);
/* kiln_output_read_check against *o, kiln_output_watched_stat's, taken
 * once for all of a source's files: one stat of `path`. */
kiln_status kiln_output_same_check(const struct stat *o, const char *path, const char *reader);

/* core/device.c: kiln_device_open with [run] threads replaced by
 * `threads` (>= 0; -1 keeps the config's) and the options' peers set:
 * one of `peers` instances that run at once in this process ([run]
 * devices, one per pipeline stage: core/pipe_devices.c).  With threads
 * >= 0 and peers > 1 the instance is a pipeline stage's (the options'
 * stage = 1); with -1 the run's own device, opened beside its stages
 * (core/train_setup.c). */
kiln_status kiln_device_open_peer(const struct kiln_registry *reg, const struct kiln_config *cfg,
				  const char *name, int ordinal, int threads, int peers,
				  struct kiln_device **out);

/* core/device.c: kiln_device_alloc and kiln_device_host_alloc whose
 * failure names the buffer: `what` ("the trainer's learning rate") before
 * the device's own message, as every allocation kiln makes is named
 * (docs/memory.md; before session 42 the small device scalars said "cpu:
 * alloc of 64 bytes failed" alone). */
kiln_status kiln_device_alloc_named(struct kiln_device *dev, size_t bytes, void **ptr,
				    const char *what);
kiln_status kiln_device_host_alloc_named(struct kiln_device *dev, size_t bytes, void **ptr,
					 const char *what);

/* core/device.c: 1 when dev implements op `type` (enum kiln_op_type; the
 * device table's has_op, every op where it has none), 0 when it does not
 * yet (kiln_device_prepare is then KILN_ENOTSUP naming the op), and 0,
 * without asking has_op, for an op newer than the plugin's abi_minor
 * (kiln_op_abi_minor: a type the device never knew; kiln_device_prepare
 * refuses it with the ABI refusal of its own, where it has one). */
int kiln_device_has_op(const struct kiln_device *dev, int type);

/* core/train_gradsums.c: why the gradients' block sums cannot be taken
 * in m's backward (the trainer does not open them, `kiln memory` does not
 * count their buffer), NULL where they can: shared, gradients averaged
 * or cut after the backward (DDP, ZeRO-1: ranks > 1 or a communicator;
 * pipe: the model's stages); acc, [train] accumulate; and m's loss
 * scaler, backward hook, the gradient hook (kiln_set_grad_hook) and
 * whether m's device has KILN_OP_GRAD_SUMSQ. */
const char *kiln_grad_sums_why_not(const struct kiln_model *m, int shared, int pipe, int64_t acc);

/* core/device.c: the plan of out0 = in0 + in1 over n f32 (in place:
 * out0 may be in0), for gradient sums. */
kiln_status kiln_device_prepare_add(struct kiln_device *dev, int64_t n, void **plan);

/* core/device.c: fill op as GRAD_CLIP over a flat f32 gradient of n
 * elements with its f32[4] gate state; the caller sets f[0] (max norm) and
 * f[1] (max value), zero (off) here. */
void kiln_op_grad_clip(struct kiln_op *op, int64_t n);

/* core/device.c: fill op as GRAD_SUMSQ over the same gradient: the f32
 * sums of squares of its blocks [k0, k1) of 1024 (kiln/ops.h) into
 * f32[ceil(n / 1024)], GRAD_CLIP's in1. */
void kiln_op_grad_sumsq(struct kiln_op *op, int64_t n, int64_t k0, int64_t k1);

/* ---- op names (core/device.c), also host->op_name ---- */
const char *kiln_op_name(int type);
/* core/opcheck.c: the minor of ABI 2 that added op `type` (0 for 2.0's
 * ops), UINT_MAX for a type kiln/ops.h does not have */
unsigned kiln_op_abi_minor(int type);
/* core/opcheck.c: the device-independent checks of an op (counts, shapes,
 * parameters; plugin.h's contract), run by kiln_device_prepare before the
 * device's prepare.  `who` (the device's name) starts the message.
 * KILN_EINVAL / KILN_ENOTSUP with the error set; any thread. */
kiln_status kiln_op_check(const struct kiln_op *op, const char *who);

/* ---- FLOP counting for kiln_model_summary (core/device.c) ----
 * on = 1: from now on note every plan kiln_device_prepare makes with its
 * op's FLOPs (kiln_op_flops), forgetting earlier notes; 0: stop noting
 * (the notes stay). */
void kiln_device_flops_record(struct kiln_device *dev, int on);
/* KILN_PROC_WORKLOAD (ABI 2.14) of dev, where it has one: what one training
 * step holds, for the defaults its config left to `auto`. */
kiln_status kiln_device_workload(struct kiln_device *dev, const struct kiln_workload *w);
/* The device takes KILN_OPF_FROZEN (it exports KILN_PROC_WEIGHTS_CHANGED,
 * ABI 2.15); tell it that frozen ops' weights were written. */
int kiln_device_takes_frozen(struct kiln_device *dev);
void kiln_device_weights_changed(struct kiln_device *dev);
/* The same for the weights in the n ranges [ptr[i], ptr[i] + bytes[i])
 * alone (NULL or empty ones skipped): KILN_PROC_WEIGHTS_WRITTEN of each,
 * or KILN_PROC_WEIGHTS_CHANGED once where the device has not that. */
void kiln_device_weights_written(struct kiln_device *dev, const void *const *ptr,
				 const size_t *bytes, int n);
/* acc not NULL: runs and copies on dev do nothing but add a noted plan's
 * FLOPs to *acc (a plan not noted adds 0); NULL: back to running, the
 * notes forgotten.  One thread, nothing else running on dev. */
void kiln_device_flops_count(struct kiln_device *dev, double *acc);
/* on = 1: from now on kiln_device_prepare checks each op (the ABI and
 * kiln_op_check, as always) and prepares nothing: the plan is NULL and
 * the workspace 0, the device's own prepare (its primitives, the CPU
 * tuner's timings) is not called; for a dry plan (kiln_plan_opts.dry)
 * whose memory layout alone is wanted (core/infer.c's infer_block,
 * core/summary.c).  While FLOPs are recorded (kiln_device_flops_record)
 * the plan is a token instead, noted with the op's FLOPs: a counting run
 * (kiln_device_flops_count) adds them, kiln_device_plan_free ignores it,
 * any other run of it fails.  No layout-only plan holds the device's
 * aux_bytes (an LSTM's reserve): not for training plans' saved memory.
 * 0: back to preparing.  One thread, nothing else preparing on dev. */
void kiln_device_layout_only(struct kiln_device *dev, int on);

/* ---- the phases of a training step (the trainer, the profiler's trace
 * slices and pass attribution; core/profile.h) ---- */
enum kiln_phase {
	KILN_PHASE_DATA = 0,      /* waiting for and assembling a batch */
	KILN_PHASE_FORWARD = 1,
	KILN_PHASE_BACKWARD = 2,
	KILN_PHASE_OPTIMIZER = 3,
	KILN_PHASE_EVAL = 4
};

/* ---- CRC32C (core/crc32c.c), also host->crc32c ---- */
uint32_t kiln_crc32c(uint32_t crc, const void *buf, size_t n);

/* ---- for the built-in layers' plan() (core/plan.c) ---- */
struct kiln_layer;
/* While the core prepares layer l of a plan: bit k set when no backward
 * of that plan is given input k's gradient (r->dx[k] always NULL), so l
 * need not prepare the ops that compute it; 0 for any other call.  Not
 * in the plugin ABI: plugin layers prepare every op, as before. */
int kiln_layer_dx_unused(const struct kiln_layer *l);
/* While the core prepares layer l of a plan: bit k set when input k's
 * gradient has another writer, so l's backward may be asked to add into
 * it (r->dx_accum[k]); clear, it is only ever written, and l needs no
 * scratch to add from.  -1 (every bit) for any other call.  Not in the
 * plugin ABI. */
int kiln_layer_dx_shared(const struct kiln_layer *l);
/* While the core prepares layer l of a plan: 1 when l is a conv whose
 * fused ReLU's backward the maxpool after it applies (l prepares no mask
 * of its own), 2 when l is that maxpool (it masks its dy by its output
 * before its backward), 0 otherwise (plan.c relu_fold).  Not in the
 * plugin ABI. */
int kiln_layer_relu_fold(const struct kiln_layer *l);
/* While the core prepares layer l of a plan: 1 when that plan trains (its
 * passes: the training forward, the backward), 0 for an evaluation or
 * inference plan (the forward only, r->training 0) and for any other
 * call.  A built-in layer prepares only the ops its plan runs (conv: no
 * evaluation forward in a training plan, no kept copies nor backward in
 * an evaluation one; poolings, batchnorm, linear: the forward alone in an
 * evaluation plan, tests/check_plan).  Not in the plugin ABI. */
int kiln_layer_training(const struct kiln_layer *l);
/* While the core infers layer l (core/graph_infer.c kiln_model_infer): the
 * layout its output is to have where that is not its input's, else -1:
 * KILN_NHWC for a conv of one input channel in an NCHW model whose ReLU
 * feeds a maxpool, KILN_NCHW for that maxpool (issue 22).  A layer that
 * cannot do it ignores it.  Not in the plugin ABI. */
int kiln_layer_out_layout(const struct kiln_layer *l);
/* on = 0: kiln_model_infer chooses no such layout (this thread), for the
 * plan made again where the device refused it (core/plan.c). */
void kiln_model_mixed_stem(int on);

/* [train] milestones, "3000, 6000": up to KILN_MAX_MILESTONES
 * non-decreasing step counts separated by commas or blanks, into out; the
 * count, or a negative KILN_MILESTONES_* when v is not such a list.  A
 * repeated milestone counts twice (gamma applied twice at that step), as
 * PyTorch's MultiStepLR does: the schedule counts milestones m <= u.  The
 * reader (core/train_buffers.c) and the config check (core/config_check.c)
 * share it. */
#define KILN_MAX_MILESTONES 12
enum {
	KILN_MILESTONES_FORM = -1,  /* not a whole number >= 0 */
	KILN_MILESTONES_EMPTY = -2, /* a comma with no number before or after it */
	KILN_MILESTONES_RANGE = -3, /* a number too large for int64 */
	KILN_MILESTONES_ORDER = -4, /* smaller than the one before */
	KILN_MILESTONES_MANY = -5   /* more than KILN_MAX_MILESTONES */
};
int kiln_parse_milestones(const char *v, int64_t out[KILN_MAX_MILESTONES]);

#endif /* KILN_INTERNAL_H */
