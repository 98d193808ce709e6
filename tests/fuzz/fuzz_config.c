/* tests/fuzz/fuzz_config.c - the INI config reader (core/config.c): load
 * the input as a file, validate it against the core schema, read a few
 * typed keys and write the resolved config. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_config *cfg = NULL;
	if (fuzz_report("load", kiln_config_load(fuzz_file("t.ini", data, size), &cfg)))
		return 0;
	if (!fuzz_report("validate", kiln_config_validate(cfg, NULL))) {
		int64_t i;
		double x;
		int b;
		kiln_config_get_int(cfg, "train", "epochs", &i);
		kiln_config_get_float(cfg, "train", "lr", &x);
		kiln_config_get_bool(cfg, "run", "deterministic", &b);
		FILE *f = fopen("/dev/null", "w");
		if (f) {
			kiln_config_write(cfg, NULL, f);
			fclose(f);
		}
	}
	for (int s = 0; kiln_config_section(cfg, s); s++)
		kiln_config_where(cfg, kiln_config_section(cfg, s), "type");
	kiln_config_free(cfg);
	return 0;
}
