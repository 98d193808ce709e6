/* tests/oot/oot_test.c - `oot_test DIR`: load the out-of-tree plugin that
 * tests/oot.sh built into DIR, and read every sample of its source "ootsrc"
 * through the registry, a validated config and the host table.
 * Exit 0 when every value is right, 1 otherwise (with the reason). */
#include <kiln/kiln.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what)
{
	fprintf(stderr, "oot_test: %s: %s\n", what, kiln_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: oot_test PLUGIN_DIR\n");
		return 2;
	}
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	const struct kiln_plugin *p;
	if (kiln_registry_open(argv[1], &reg))
		return fail("registry");
	if (kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "ootsrc", &p))
		return fail("find ootsrc");
	/* the plugin's key table takes part in validation */
	if (kiln_config_new(&cfg) || kiln_config_override(cfg, "data.source=ootsrc") ||
	    kiln_config_override(cfg, "data.scale=2"))
		return fail("config");
	if (kiln_config_validate(cfg, reg))
		return fail("validate");

	const struct kiln_source_ops *ops = p->ops;
	void *ctx;
	struct kiln_source_info info;
	if (ops->open(kiln_host_table(), cfg, "data", "train", &ctx))
		return fail("open");
	if (ops->info(ctx, &info))
		return fail("info");
	if (info.len != 10 || kiln_tensor_numel(&info.sample) != 4) {
		fprintf(stderr, "oot_test: info: len %lld, %lld values per sample; expected 10, 4\n",
			(long long)info.len, (long long)kiln_tensor_numel(&info.sample));
		return 1;
	}
	for (int64_t i = 0; i < info.len; i++) {
		float x[4];
		int32_t y;
		if (ops->read(ctx, i, x, &y))
			return fail("read");
		for (int j = 0; j < 4; j++)
			if (fabsf(x[j] - (float)((i + j / 4.0) * 2.0)) > 1e-6f || y != i % 3) {
				fprintf(stderr, "oot_test: sample %lld: x[%d] = %g, label %d\n",
					(long long)i, j, x[j], y);
				return 1;
			}
	}
	ops->close(ctx);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	printf("oot_test: read 10 samples of ootsrc from %s\n", argv[1]);
	return 0;
}
