/* tests/fuzz/fuzz_checkpoint.c - the checkpoint reader (core/checkpoint_read.c, _load.c):
 * open and verify the input, then read every section of at most 1 MiB,
 * the text sections (parsing the config one), the trainer and epoch
 * sections.
 *
 * The first byte is a mode, the rest the file: with the mode odd, every
 * CRC of the file (header, section headers, payloads) is recomputed
 * first, so the search also reaches what lies behind the checksums
 * (docs/checkpoints.md has the layout).
 */
#include "fuzz.h"
#include "checkpoint.h"
#include "internal.h"

/* Recompute the CRCs of the checkpoint in f[0..n), as far as its section
 * lengths stay inside it. */
static void fix_crcs(uint8_t *f, size_t n)
{
	if (n < KILN_CKPT_HEADER_BYTES)
		return;
	fuzz_put32(f + 60, kiln_crc32c(0, f, 60));
	for (size_t off = KILN_CKPT_HEADER_BYTES; n - off >= KILN_CKPT_SECTION_BYTES;) {
		uint8_t *h = f + off;
		uint64_t len = fuzz_get_le(h + 32, 8);
		off += KILN_CKPT_SECTION_BYTES;
		if (len > n - off)
			break;
		fuzz_put32(h + 40, kiln_crc32c(0, f + off, (size_t)len));
		fuzz_put32(h + 44, kiln_crc32c(0, h, 44));
		off += (size_t)len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_ckpt *ck = NULL;
	if (!size)
		return 0;
	uint8_t *file = malloc(size);
	if (!file)
		return 0;
	memcpy(file, data + 1, size - 1);
	if (data[0] & 1)
		fix_crcs(file, size - 1);
	kiln_status st = fuzz_report("open", kiln_ckpt_open(fuzz_file("ckpt", file, size - 1), &ck));
	free(file);
	if (st)
		return 0;
	kiln_ckpt_step(ck);
	for (int i = 0; i < kiln_ckpt_section_count(ck); i++) {
		const char *tag;
		uint64_t bytes;
		uint32_t crc;
		kiln_ckpt_section_get(ck, i, &tag, &bytes, &crc);
		void *buf = bytes <= (1u << 20) ? malloc(bytes ? bytes : 1) : NULL;
		if (buf)
			kiln_ckpt_read(ck, tag, buf, bytes);
		free(buf);
	}
	static const char *const texts[] = { "config", "versions", "weights_keys" };
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
		char *text = NULL;
		struct kiln_config *cfg = NULL;
		if (kiln_ckpt_read_text(ck, texts[i], &text))
			continue;
		if (!i && !kiln_config_load_string(text, "checkpoint config", &cfg))
			kiln_config_free(cfg);
		free(text);
	}
	struct kiln_ckpt_trainer tr;
	fuzz_report("trainer", kiln_ckpt_trainer_get(ck, &tr));
	struct kiln_ckpt_epoch ep;
	fuzz_report("epoch", kiln_ckpt_epoch_get(ck, &ep));
	kiln_ckpt_close(ck);
	return 0;
}
