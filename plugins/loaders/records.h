/* plugins/loaders/records.h - kiln's packed `records` format: the layout
 * constants shared by the reader (records.c, the `records` source) and the
 * writer (records_write.c, used by `kiln pack` and the tests).
 *
 * docs/formats.md (## records) is the specification; every offset below is
 * listed there.  All integers are little-endian and fixed-width.
 *
 *   shard file = header (64 bytes) | set block (16 bytes, minor >= 1) |
 *                records (each 8-byte aligned) | index
 *
 *   header:  0 magic "KILNREC\0"      8 u32 version (1)   12 u32 header size (64)
 *           16 u64 record count      24 u64 index offset  32 u64 file size
 *           40 u32 flags (0)         44 u32 classes       48 u32 image_h
 *           52 u32 image_w           56 u8  image_c       57 u8 minor version
 *           58 u8[2] reserved (0)    60 u32 CRC32C of bytes 0..59
 *   set block (minor >= 1, since session 34; version-1.0 readers skip it
 *           as bytes before the first record):
 *           64 u32 shard index   68 u32 shard count (0: not recorded)
 *           72 u32 pack id       76 u32 CRC32C of bytes 64..75
 *   record:  0 i32 label   4 u32 h   8 u32 w   12 u8 c   13 u8 encoding
 *           14 u16 reserved (0)      16 u32 payload length
 *           20 u32 CRC32C of bytes 0..19 then of the payload
 *           24 payload, then zero padding to a multiple of 8
 *   index:   count x { u64 record offset, u32 record length (24 + payload),
 *           u32 reserved (0) }, then u32 CRC32C of those count x 16 bytes;
 *           the file ends there.
 */
#ifndef KILN_LOADERS_RECORDS_H
#define KILN_LOADERS_RECORDS_H

#include <kiln/plugin.h>

#include <stddef.h>
#include <stdint.h>

#define REC_MAGIC "KILNREC" /* 8 bytes with its NUL */
#define REC_VERSION 1u
#define REC_HEADER_BYTES 64u
#define REC_HEADER_CRC_AT 60u   /* the header CRC covers bytes [0, 60) */
/* Header byte 57 (reserved, zero, in version 1.0): the minor version.
 * 1: the set block follows the header, so that a reader can tell a split
 * missing its last shard (nothing else records how many there were).
 * Readers of 1.0 ignore the byte and the block (bytes before the first
 * record, which then starts at REC_SET_END or later). */
#define REC_MINOR_AT 57u
#define REC_MINOR 1u
#define REC_SET_AT 64u          /* u32 index, u32 count, u32 pack id, u32 CRC32C */
#define REC_SET_CRC_AT 76u      /* the set CRC covers bytes [64, 76) */
#define REC_SET_END 80u
#define REC_RECORD_HEADER 24u
#define REC_RECORD_CRC_AT 20u   /* a record's CRC covers its bytes [0, 20) + payload */
#define REC_INDEX_ENTRY 16u
#define REC_ALIGN 8u            /* records start at multiples of 8 */
#define REC_SUFFIX ".krec"
/* The most classes a header may declare: labels are i32 and [data]
 * classes is at most INT32_MAX (a header of 4294967295 classes, its CRCs
 * valid, once asked the user to "set out = 4294967295") */
#define REC_MAX_CLASSES 2147483647u
/* "<dir>/<split>.krec-partial": kiln pack places a split's shards (renames
 * them into place, removes an earlier pack's) only while this file exists,
 * and removes it last; a reader refuses shards beside one (a pack killed
 * then may have left shards of two packs). */
#define REC_PARTIAL ".krec-partial"
/* The most shards kiln pack writes for a split: a reader maps every shard
 * at once, and Linux allows about 65530 mappings a process
 * (vm.max_map_count), the libraries' and threads' among them. */
#define REC_MAX_SHARDS 50000

/* How a record's payload stores its pixels. */
enum rec_encoding {
	REC_RAW = 0,  /* u8 [h, w, c], row-major HWC */
	REC_JPEG = 1, /* a baseline JPEG (TurboJPEG) */
	REC_PNG = 2,  /* a PNG (libpng) */
	REC_ENCODINGS
};

/* "raw", "jpeg", "png", or "?" */
static inline const char *rec_encoding_name(int encoding)
{
	return encoding == REC_RAW ? "raw" : encoding == REC_JPEG ? "jpeg" :
	       encoding == REC_PNG ? "png" : "?";
}

static inline uint32_t rec_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rec_get64(const uint8_t *p)
{
	return (uint64_t)rec_get32(p) | (uint64_t)rec_get32(p + 4) << 32;
}

static inline void rec_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline void rec_put64(uint8_t *p, uint64_t v)
{
	rec_put32(p, (uint32_t)v);
	rec_put32(p + 4, (uint32_t)(v >> 32));
}

/* ---- writing a shard (records_write.c) ----------------------------------
 *
 * rec_writer_open creates (truncates) `path` and writes records to it as
 * they are added; rec_writer_finish appends the index, writes the header
 * and fsyncs the file.  Renaming a finished file into place (`kiln pack`
 * writes *.tmp files and renames them) is the caller's business.  One
 * writer is used by one thread.  Errors name the file: KILN_EIO,
 * KILN_EINVAL for a record the format cannot hold. */
struct rec_writer;

/* `classes`: the data set's number of classes (the header stores the
 * larger of it and max label + 1).  *out is freed by rec_writer_finish or
 * rec_writer_abort. */
kiln_status rec_writer_open(const struct kiln_host *host, const char *path, int64_t classes,
			    struct rec_writer **out);

/* Append one record: label >= 0, h, w > 0, c = 1 or 3, `encoding` one of
 * enum rec_encoding, payload[0..n) (copied; for REC_RAW n = h*w*c). */
kiln_status rec_writer_add(struct rec_writer *w, int32_t label, int32_t h, int32_t wd,
			   int32_t c, int encoding, const void *payload, size_t n);

/* Bytes the file will have if finished now (header, records, index). */
uint64_t rec_writer_bytes(const struct rec_writer *w);
uint64_t rec_writer_count(const struct rec_writer *w);

/* Write index and header, fsync and close; frees w in every case. */
kiln_status rec_writer_finish(struct rec_writer *w);

/* Close and remove the file; frees w.  NULL is a no-op. */
void rec_writer_abort(struct rec_writer *w);

/* Record in the finished shard `path` (minor 1: every writer leaves room)
 * that it is shard `index` of the `count` of its split, packed as `pack`
 * (an id the same in all of them), and fsync it.  kiln pack calls it on
 * each .tmp once the split's last shard is written (the count is known
 * only then).  KILN_EIO naming the file. */
kiln_status rec_shard_stamp(const struct kiln_host *host, const char *path, uint32_t index,
			    uint32_t count, uint32_t pack);

#endif /* KILN_LOADERS_RECORDS_H */
