/* core/checkpoint_impl.h - what the checkpoint files' writer, reader and
 * loader share (core/checkpoint_write.c, checkpoint_read.c,
 * checkpoint_load.c, checkpoint_layout.c; checkpoint.h is their
 * interface, docs/checkpoints.md the byte layout):
 *
 *   offset 0   header                     64 bytes
 *   offset 64  section 0: header 48 bytes, then its payload
 *              section 1 ...              (no padding between them)
 *   the file ends after the last payload: its size is the header's
 *
 * Every byte is under a CRC32C: the header's bytes 0..59 (CRC at 60), each
 * section header's bytes 0..43 (CRC at 44), each payload (CRC in its
 * section header).  So any flipped byte and any truncation is refused.
 *
 * The "tensors" section says where each tensor is in "params", "buffers"
 * and the optimizer slots; a reader reads them by name when the order
 * differs from the model's (checkpoint_layout.c).
 *
 * The functions here are libkiln's own: not exported (the library exports
 * kiln_* alone).
 */
#ifndef KILN_CHECKPOINT_IMPL_H
#define KILN_CHECKPOINT_IMPL_H
#include "checkpoint.h"

#include <errno.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints store device buffers as little-endian bytes: port kiln_ckpt_save first"
#endif

/* The file's first 8 bytes, "KILNCKPT" (checkpoint_read.c). */
extern const char ckpt_magic[8];

/* ---- little-endian fields ------------------------------------------------ */

static inline void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* A section as the reader found it: its tag, payload offset and size, and
 * the payload's CRC32C (checked when the file was opened). */
struct rsec {
	char tag[KILN_CKPT_TAG_BYTES];
	uint64_t off, bytes;
	uint32_t crc;
};

/* An open checkpoint: its descriptor and its verified section table. */
struct kiln_ckpt {
	char *path;
	int fd;
	uint64_t size;
	int64_t step;
	int n;
	struct rsec *s;
};

/* The error for a failed read of `what` in path: truncated (errno 0) is
 * KILN_EDATA, an I/O error KILN_EIO; both name the file and the part. */
kiln_status ckpt_read_error(const char *path, const char *what);

/* The section called tag, or NULL (checkpoint_read.c). */
const struct rsec *ckpt_section(const struct kiln_ckpt *ck, const char *tag);

/* The "tensors" section's text: one line per parameter, "name region
 * offset numel dtype dims"; NULL when out of memory (checkpoint_write.c). */
char *ckpt_tensors_text(const struct kiln_model *m);

/* ---- the "tensors" table against a model (checkpoint_layout.c) ----------- */

/* How ck lays out m's tensors: *at = NULL when its table is m's; else, when
 * it holds the same tensors (names, regions, sizes, dtypes, shapes) at
 * other offsets (a kiln before 2026-12-06's layout of a tie naming a later
 * layer; the same model with other layers frozen), *at (malloc'd, the
 * caller frees) each m->params[i]'s offset in the checkpoint, checked to
 * lay them out as a kiln does (in each region each extent after the
 * other from 0: every read within its section); else *differ = 1 and
 * the first differing line of each table into theirs_line/mine_line (n
 * bytes each).  KILN_EDATA naming the file when the table is malformed. */
kiln_status ckpt_layout(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **at,
			char *theirs_line, char *mine_line, size_t n, int *differ);
/* ckpt_layout, with the tables differing beyond their offsets refused:
 * "holds another model" (KILN_ECONFIG) naming the first difference. */
kiln_status ckpt_same_model(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **at);
/* Logs that ck's tensors are read by name from another layout (at,
 * ckpt_layout's), naming the older tie layout when at is that, else the
 * first tensor at another place. */
void ckpt_layout_note(const struct kiln_ckpt *ck, const struct kiln_model *m, const size_t *at);
/* Before ck's optimizer slots are read into m (at: ckpt_layout's, NULL
 * for m's own): the checkpoint's trainable tensors are m's.  A kiln lays
 * them out first and its slots hold them alone, so a tensor of m is
 * trainable in ck when it lies below the end of ck's first slot ('tensors'
 * has no trainable flag).  KILN_ECONFIG naming the first tensor trainable
 * in one and frozen in the other; KILN_OK when m has no slots or ck not
 * the first (its absence is refused where it is read). */
kiln_status ckpt_same_trainable(const struct kiln_ckpt *ck, const struct kiln_model *m,
				const size_t *at);

/* What a state section holds, for the move between layouts: no tensors
 * (the counters), the parameters, the buffers, an optimizer slot (the
 * trainable parameters'). */
enum { CKPT_MAP_NONE, CKPT_MAP_PARAMS, CKPT_MAP_BUFFERS, CKPT_MAP_SLOT };
int ckpt_layout_kind(const struct kiln_model *m, const char *tag);
/* Elements [lo, hi) of a section of that kind (not NONE) in m's layout
 * into out, from where ck's layout (at, ckpt_layout) holds each tensor's
 * extent: from `stored`, the section as stored, or when NULL read from fd
 * whose section payload starts at byte at_byte.  -1 when a read fails
 * (errno: 0 truncated). */
int ckpt_gather(const struct kiln_model *m, const size_t *at, int kind, size_t lo, size_t hi,
		const float *stored, int fd, uint64_t at_byte, float *out);

/* A device section's and a source's bytes go through one host buffer of
 * this size, piece by piece. */
#define PIECE KILN_CKPT_PIECE_BYTES

#endif /* KILN_CHECKPOINT_IMPL_H */
