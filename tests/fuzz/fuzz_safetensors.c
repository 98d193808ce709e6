/* tests/fuzz/fuzz_safetensors.c - the safetensors reader
 * (core/safetensors.c): open the input, list and find every tensor, read
 * the metadata. */
#include "fuzz.h"

/* every tensor's bytes are summed here, so reading them is not optimised away */
volatile unsigned fuzz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned sum = 0;
	struct kiln_safetensors *f = NULL;
	if (fuzz_report("open", kiln_safetensors_open(fuzz_file("t.safetensors", data, size), &f)))
		return 0;
	for (int i = 0; i < kiln_safetensors_count(f); i++) {
		struct kiln_safetensors_tensor t, u;
		kiln_safetensors_get(f, i, &t);
		kiln_safetensors_find(f, t.name, &u);
		const unsigned char *b = t.data;
		for (size_t k = 0; k < t.bytes; k++)
			sum += b[k];
	}
	kiln_safetensors_meta(f, "format");
	fuzz_sink = sum;
	kiln_safetensors_close(f);
	return 0;
}
