/* tests/check_plugin.c - the plugin registry against the test plugins of
 * tests/plugins/ (built, never installed): loading, the reasons a file does
 * not load (ABI, missing symbol, dlopen, failing init), probes, lookups,
 * plugin key tables in validation, and the search order.
 *
 * TEST_PLUGIN_DIR, TEST_SHADOW_DIR and TEST_EXIT_DIR are compiled in (tests/local.mk).
 */
#include <kiln/kiln.h>

#include <check.h>   /* Suite, ck_assert_* */
#include <dlfcn.h>   /* dlopen: is libgomp loaded? */
#include <signal.h>  /* sigaction, signal */
#include <sys/time.h> /* setitimer */
#include "check_main.h"
#include "test_util.h" /* test_tmpdir_make */
#include <stdio.h>   /* snprintf, open_memstream */
#include <stdlib.h>  /* unsetenv, setenv */
#include <stddef.h>  /* offsetof */
#include <string.h>  /* strstr, strcmp, memset */

#ifndef TEST_EXIT_DIR
#error "TEST_EXIT_DIR must name tests/plugins/exit/.libs of the build tree"
#endif
#ifndef TEST_PLUGIN_DIR
#error "TEST_PLUGIN_DIR must name tests/plugins/.libs of the build tree"
#endif

#define assert_has(hay, needle)                                                     \
	ck_assert_msg(strstr((hay), (needle)) != NULL, "expected \"%s\" in: %s", (needle), \
		      (hay))

static struct kiln_registry *reg;

static void open_test_registry(void)
{
	kiln_status st = kiln_registry_open(TEST_PLUGIN_DIR, &reg);
	ck_assert_msg(st == KILN_OK, "registry: %s", kiln_last_error());
}

static void close_registry(void)
{
	kiln_registry_close(reg);
	reg = NULL;
}

/* The file entry whose path is TEST_PLUGIN_DIR/base; fails if absent. */
static struct kiln_plugin_file file_of(const char *dir, const char *base)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, base);
	for (int i = 0; i < kiln_registry_file_count(reg); i++) {
		struct kiln_plugin_file f;
		kiln_registry_file_get(reg, i, &f);
		if (!strcmp(f.path, path))
			return f;
	}
	ck_abort_msg("%s is not in the registry's file list", path);
	struct kiln_plugin_file none = { 0 };
	return none;
}

/* The info of plugin `name` of `kind`; fails if absent. */
static struct kiln_plugin_info info_of(int kind, const char *name)
{
	for (int i = 0; i < kiln_registry_plugin_count(reg); i++) {
		struct kiln_plugin_info p = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &p);
		if (p.kind == kind && !strcmp(p.name, name))
			return p;
	}
	ck_abort_msg("no %s plugin '%s' listed", kiln_plugin_kind_name(kind), name);
	struct kiln_plugin_info none = { 0 };
	return none;
}

static struct kiln_config *config(const char *text)
{
	struct kiln_config *cfg;
	kiln_status st = kiln_config_load_string(text, "p.ini", &cfg);
	ck_assert_msg(st == KILN_OK, "load: %s", kiln_last_error());
	return cfg;
}

/* ---- loading ------------------------------------------------------------- */

START_TEST(search_path_first)
{
	ck_assert_int_ge(kiln_registry_dir_count(reg), 1);
	ck_assert_str_eq(kiln_registry_dir(reg, 0), TEST_PLUGIN_DIR);
	ck_assert_ptr_null(kiln_registry_dir(reg, kiln_registry_dir_count(reg)));
}
END_TEST

START_TEST(files_listed)
{
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tgood.so");
	ck_assert_ptr_null(f.error);
	ck_assert_int_eq(f.n_plugins, 3);
	static const char *const bad[] = { "kiln-tbadabi.so", "kiln-tnewer.so", "kiln-tnosym.so",
					   "kiln-tdlfail.so", "kiln-tnull.so" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		f = file_of(TEST_PLUGIN_DIR, bad[i]);
		ck_assert_msg(f.error != NULL, "%s loaded but should not", bad[i]);
		ck_assert_int_eq(f.n_plugins, 0);
	}
}
END_TEST

START_TEST(good_plugins)
{
	char want[4096];
	snprintf(want, sizeof want, "%s/kiln-tgood.so", TEST_PLUGIN_DIR);
	struct kiln_plugin_info pi = info_of(KILN_PLUGIN_OPTIM, "tgood");
	ck_assert_str_eq(pi.file, want);
	ck_assert_int_eq(pi.available, 1);
	ck_assert_str_eq(pi.why, "");
	ck_assert_uint_eq(pi.abi_major, KILN_ABI_MAJOR);
	ck_assert_uint_eq(pi.abi_minor, KILN_ABI_MINOR);
	assert_has(pi.summary, "test optimizer");
	pi = info_of(KILN_PLUGIN_SOURCE, "tsrc");
	ck_assert_int_eq(pi.available, 1);

	const struct kiln_plugin *p = NULL;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_OPTIM, "tgood", &p), KILN_OK);
	ck_assert_str_eq(p->name, "tgood");
	ck_assert_int_eq(p->kind, KILN_PLUGIN_OPTIM);
	ck_assert_ptr_nonnull(p->keys);
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tsrc", &p), KILN_OK);
	ck_assert_str_eq(p->name, "tsrc");
	/* kinds are separate name spaces */
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tgood", &p), KILN_ENOTFOUND);
}
END_TEST

START_TEST(use_optim)
{
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_OPTIM, "tgood", &p), KILN_OK);
	const struct kiln_optim_ops *ops = p->ops;
	ck_assert_uint_ge(ops->version, 1);

	/* the key's default comes from the plugin's table */
	struct kiln_config *cfg = config("[train]\nlr = 0.1\n[plugin.tgood]\nmode = slow\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);
	ck_assert_str_eq(kiln_config_get(cfg, "plugin.tgood", "slots"), "2");
	void *ctx = NULL;
	struct kiln_optim_info info = { 0 };
	ck_assert_int_eq(ops->open(kiln_host_table(), cfg, &info, &ctx), KILN_OK);
	ck_assert_int_eq(info.state_slots, 2);
	ops->close(ctx);
	kiln_config_free(cfg);

	cfg = config("[plugin.tgood]\nslots = 5\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);
	ck_assert_int_eq(ops->open(kiln_host_table(), cfg, &info, &ctx), KILN_OK);
	ck_assert_int_eq(info.state_slots, 5);
	ops->close(ctx);
	kiln_config_free(cfg);
}
END_TEST

START_TEST(use_source)
{
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tsrc", &p), KILN_OK);
	const struct kiln_source_ops *ops = p->ops;
	struct kiln_config *cfg = config("[data]\nsource = tsrc\ncount = 5\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);

	/* [data.eval] inherits count and source; split "test" shifts values */
	static const struct {
		const char *section, *split;
		float base;
	} opens[] = { { "data", "train", 0.0f }, { "data.eval", "test", 1000.0f } };
	for (size_t k = 0; k < 2; k++) {
		void *ctx = NULL;
		ck_assert_int_eq(ops->open(kiln_host_table(), cfg, opens[k].section, opens[k].split,
					   &ctx),
				 KILN_OK);
		struct kiln_source_info info;
		ck_assert_int_eq(ops->info(ctx, &info), KILN_OK);
		ck_assert_int_eq(info.len, 5);
		ck_assert_int_eq(info.sample.dtype, KILN_F32);
		ck_assert_int_eq(kiln_tensor_numel(&info.sample), 3);
		ck_assert_int_eq(info.classes, 2);
		for (int64_t i = 0; i < info.len; i++) {
			float x[3];
			int32_t y = -1;
			ck_assert_int_eq(ops->read(ctx, i, x, &y), KILN_OK);
			for (int j = 0; j < 3; j++)
				ck_assert_float_eq(x[j], opens[k].base + (float)(i * 10 + j));
			ck_assert_int_eq(y, (int32_t)(i % 2));
		}
		float x[3];
		int32_t y;
		kiln_clear_error();
		ck_assert_int_eq(ops->read(ctx, 5, x, &y), KILN_EINVAL);
		assert_has(kiln_last_error(), "tsrc: sample 5 out of range");
		ops->close(ctx);
	}
	kiln_config_free(cfg);
}
END_TEST

/* struct kiln_plugin_info's size (kiln/kiln.h, "Structs the library
 * fills"): an older header's struct (cut before `keys`, 0xA5 bytes after)
 * gets its members and no byte past them; a newer one's the library's
 * size back; a size not set, or an index out of range, is refused with
 * nothing written.  Before session 35 the struct had no size and
 * kiln_registry_plugin_get filled it whole (keys and desc past the cut). */
START_TEST(plugin_info_size)
{
	const size_t lib = sizeof(struct kiln_plugin_info);
	const size_t cut = offsetof(struct kiln_plugin_info, keys);
	union {
		struct kiln_plugin_info p;
		unsigned char b[sizeof(struct kiln_plugin_info) + 64];
	} u;
	const struct kiln_plugin_info want = info_of(KILN_PLUGIN_OPTIM, "tgood");
	int i = 0;
	while (i < kiln_registry_plugin_count(reg)) {
		struct kiln_plugin_info p = KILN_PLUGIN_INFO_INIT;
		ck_assert_int_eq(kiln_registry_plugin_get(reg, i, &p), KILN_OK);
		if (p.desc == want.desc)
			break;
		i++;
	}
	memset(&u, 0xA5, sizeof u);
	u.p.size = cut;
	ck_assert_int_eq(kiln_registry_plugin_get(reg, i, &u.p), KILN_OK);
	for (size_t k = cut; k < sizeof u; k++)
		ck_assert_msg(u.b[k] == 0xA5, "byte %zu of a %zu-byte kiln_plugin_info written (0x%02x)",
			      k, cut, u.b[k]);
	ck_assert_uint_eq(u.p.size, cut);
	ck_assert_str_eq(u.p.name, "tgood");
	ck_assert_str_eq(u.p.file, want.file);
	ck_assert_int_eq(u.p.available, 1);
	memset(&u, 0xA5, sizeof u);
	u.p.size = sizeof u;
	ck_assert_int_eq(kiln_registry_plugin_get(reg, i, &u.p), KILN_OK);
	ck_assert_uint_eq(u.p.size, lib);
	ck_assert_ptr_eq(u.p.desc, want.desc);
	for (size_t k = lib; k < sizeof u; k++)
		ck_assert_msg(u.b[k] == 0xA5, "byte %zu past the library's kiln_plugin_info written", k);
	/* not set, out of range: refused, nothing written */
	memset(&u, 0xA5, sizeof u);
	u.p.size = 0;
	ck_assert_int_eq(kiln_registry_plugin_get(reg, i, &u.p), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(),
			 "kiln_registry_plugin_get: struct kiln_plugin_info's size is 0: set .size = sizeof(struct kiln_plugin_info) before the call (KILN_PLUGIN_INFO_INIT)");
	for (size_t k = sizeof u.p.size; k < sizeof u; k++)
		ck_assert_uint_eq(u.b[k], 0xA5);
	const int n = kiln_registry_plugin_count(reg);
	char msg[128];
	snprintf(msg, sizeof msg, "kiln_registry_plugin_get: index %d out of range [0, %d)", n, n);
	u.p.size = lib;
	ck_assert_int_eq(kiln_registry_plugin_get(reg, n, &u.p), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), msg);
	ck_assert_int_eq(kiln_registry_plugin_get(reg, -1, &u.p), KILN_EINVAL);
	ck_assert_uint_eq(u.p.size, lib);
	for (size_t k = sizeof u.p.size; k < sizeof u; k++)
		ck_assert_uint_eq(u.b[k], 0xA5);
}
END_TEST

/* ---- files that do not load ---------------------------------------------- */

START_TEST(bad_abi)
{
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tbadabi.so");
	char theirs[32], ours[32];
	snprintf(theirs, sizeof theirs, "ABI %d.0", KILN_ABI_MAJOR + 1);
	snprintf(ours, sizeof ours, "ABI %d.%d", KILN_ABI_MAJOR, KILN_ABI_MINOR);
	assert_has(f.error, theirs);
	assert_has(f.error, ours);
	assert_has(f.error, "tbadabi");
	/* not listed as a plugin; looking it up explains why */
	for (int i = 0; i < kiln_registry_plugin_count(reg); i++) {
		struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &pi);
		ck_assert_str_ne(pi.name, "tbadabi");
	}
	const struct kiln_plugin *p = NULL;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tbadabi", &p), KILN_EPLUGIN);
	assert_has(kiln_last_error(), "kiln-tbadabi.so");
	assert_has(kiln_last_error(), theirs);
	ck_assert_ptr_null(p);
}
END_TEST

/* A plugin of this major built for a newer minor is refused too: a newer
 * minor grows structs the core allocates and the plugin fills (2.21's
 * kiln_source_info.classes_from), and this core's copy is smaller.
 * Before session 35 only the major was compared, and kiln-tnewer.so
 * loaded: its info() then wrote past this core's kiln_source_info. */
START_TEST(newer_minor)
{
	char path[4096], want[1024];
	snprintf(path, sizeof path, "%s/kiln-tnewer.so", TEST_PLUGIN_DIR);
	snprintf(want, sizeof want,
		 "plugin 'tnewer' was built for ABI %d.%d, newer than this kiln's ABI %d.%d; rebuild it against this kiln's headers or use a kiln of ABI %d.%d or later",
		 KILN_ABI_MAJOR, KILN_ABI_MINOR + 1, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_ABI_MAJOR,
		 KILN_ABI_MINOR + 1);
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tnewer.so");
	ck_assert_ptr_nonnull(f.error);
	ck_assert_str_eq(f.error, want);
	ck_assert_int_eq(f.n_plugins, 0);
	const struct kiln_plugin *p = NULL;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tnewer", &p), KILN_EPLUGIN);
	ck_assert_ptr_null(p);
	char msg[6000];
	snprintf(msg, sizeof msg, "source plugin 'tnewer': %s: %s", path, want);
	ck_assert_str_eq(kiln_last_error(), msg);
	/* the same minor and older ones still load (tgood: this minor) */
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tsrc", &p), KILN_OK);
}
END_TEST

START_TEST(missing_symbol)
{
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tnosym.so");
	assert_has(f.error, "kiln_plugin_init");
	assert_has(f.error, "not a kiln plugin");
}
END_TEST

START_TEST(dlopen_failure)
{
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tdlfail.so");
	assert_has(f.error, "undefined symbol");
	assert_has(f.error, "kiln_test_symbol_nobody_defines");
	/* what the undefined symbol means; not ldd, which shows no missing
	 * library for it */
	assert_has(f.error, "(the plugin needs a symbol no loaded library provides: "
			    "built against another kiln?)");
	ck_assert_ptr_null(strstr(f.error, "ldd"));
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_DEVICE, "tdlfail", &p), KILN_EPLUGIN);
	assert_has(kiln_last_error(), "undefined symbol");
}
END_TEST

START_TEST(init_returns_null)
{
	struct kiln_plugin_file f = file_of(TEST_PLUGIN_DIR, "kiln-tnull.so");
	assert_has(f.error, "kiln_plugin_init");
	assert_has(f.error, "tnull: refusing to initialise (test)");
}
END_TEST

/* ---- probes and lookups --------------------------------------------------- */

START_TEST(probe_failure)
{
	struct kiln_plugin_info pi = info_of(KILN_PLUGIN_SOURCE, "tprobe");
	ck_assert_int_eq(pi.available, 0);
	ck_assert_str_eq(pi.why, "no test accelerator on this machine (tprobe)");
	const struct kiln_plugin *p = NULL;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "tprobe", &p), KILN_EPLUGIN);
	assert_has(kiln_last_error(), "tprobe");
	assert_has(kiln_last_error(), "no test accelerator on this machine (tprobe)");
	assert_has(kiln_last_error(), "kiln-tgood.so");
	ck_assert_ptr_null(p);
	/* a config naming it fails validation with the reason */
	struct kiln_config *cfg = config("[data]\nsource = tprobe\n");
	ck_assert_int_ne(kiln_config_validate(cfg, reg), KILN_OK);
	assert_has(kiln_last_error(), "p.ini:2");
	assert_has(kiln_last_error(), "no test accelerator on this machine (tprobe)");
	kiln_config_free(cfg);
}
END_TEST

START_TEST(not_found)
{
	const struct kiln_plugin *p = NULL;
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "nosuchsource", &p),
			 KILN_ENOTFOUND);
	assert_has(kiln_last_error(), "'nosuchsource'");
	assert_has(kiln_last_error(), "available: ");
	assert_has(kiln_last_error(), "tsrc");
	assert_has(kiln_last_error(), "tprobe");
	ck_assert_ptr_null(p);
	ck_assert_int_eq(kiln_registry_find(reg, KILN_PLUGIN_COMM, "nosuchcomm", &p),
			 KILN_ENOTFOUND);
	assert_has(kiln_last_error(), "nosuchcomm");
}
END_TEST

/* ---- plugin keys in validation ------------------------------------------- */

START_TEST(validate_plugin_keys)
{
	struct kiln_config *cfg = config("[plugin.tgood]\nslots = 3\nmode = fast\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);
	kiln_config_free(cfg);

	cfg = config("[plugin.tgood]\nslots = 3\nslost = 4\n");
	ck_assert_int_eq(kiln_config_validate(cfg, NULL), KILN_OK); /* not known yet */
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:3: unknown key 'slost' in [plugin.tgood]");
	assert_has(kiln_last_error(), "did you mean 'slots'?");
	assert_has(kiln_last_error(), "valid keys: slots, mode");
	kiln_config_free(cfg);

	cfg = config("[plugin.tgood]\nslots = 9\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:2:");
	assert_has(kiln_last_error(), "'slots' = 9 is out of range [1, 8]");
	kiln_config_free(cfg);

	cfg = config("[plugin.tgood]\n\nmode = medium\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:3:");
	assert_has(kiln_last_error(), "'mode' = 'medium' is not one of fast|slow");
	kiln_config_free(cfg);

	/* a source's keys extend [data] and [data.eval] */
	cfg = config("[data]\nsource = tsrc\ncuont = 3\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:3: unknown key 'cuont' in [data]");
	assert_has(kiln_last_error(), "did you mean 'count'?");
	kiln_config_free(cfg);

	cfg = config("[data]\nsource = tsrc\n[data.eval]\ncount = abc\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:4:");
	assert_has(kiln_last_error(), "'count' = 'abc' is not an integer");
	kiln_config_free(cfg);

	/* a base key misspelt in a plugin-extended section is suggested too */
	cfg = config("[data]\nsource = tsrc\nlimt = 3\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "did you mean 'limit'?");
	kiln_config_free(cfg);

	/* a source that does not exist */
	cfg = config("[data]\nsource = nosuchsource\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "p.ini:2");
	assert_has(kiln_last_error(), "nosuchsource");
	kiln_config_free(cfg);

	/* [plugin.X] for a source is not a plugin section */
	cfg = config("[plugin.tsrc]\ncount = 3\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	assert_has(kiln_last_error(), "'tsrc'");
	kiln_config_free(cfg);
}
END_TEST

/* The resolved dump lists a plugin's keys with their defaults. */
START_TEST(write_plugin_keys)
{
	struct kiln_config *cfg = config("[data]\nsource = tsrc\n[plugin.tgood]\nmode = slow\n");
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_OK);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	ck_assert_int_eq(kiln_config_write(cfg, reg, f), KILN_OK);
	fclose(f);
	assert_has(buf, "[data]\nsource = tsrc\nlimit = 0\nworkers = 1\nprefetch = 2\nshuffle = 1\n");
	assert_has(buf, "transform_on = host\ncount = 4\n");
	assert_has(buf, "[plugin.tgood]\nslots = 2\nmode = slow\n");
	free(buf);
	kiln_config_free(cfg);
}
END_TEST

/* ---- search order ---------------------------------------------------------- */

START_TEST(earlier_directory_wins)
{
	struct kiln_registry *r;
	ck_assert_int_eq(kiln_registry_open(TEST_SHADOW_DIR ":" TEST_PLUGIN_DIR, &r), KILN_OK);
	ck_assert_str_eq(kiln_registry_dir(r, 0), TEST_SHADOW_DIR);
	ck_assert_str_eq(kiln_registry_dir(r, 1), TEST_PLUGIN_DIR);
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_OPTIM, "tgood", &p), KILN_OK);
	assert_has(p->summary, "shadow");
	/* the later kiln-tgood.so was not loaded at all: no tsrc */
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_SOURCE, "tsrc", &p), KILN_ENOTFOUND);
	int n_tgood = 0;
	for (int i = 0; i < kiln_registry_file_count(r); i++) {
		struct kiln_plugin_file f;
		kiln_registry_file_get(r, i, &f);
		const char *base = strrchr(f.path, '/');
		if (!strcmp(base ? base + 1 : f.path, "kiln-tgood.so")) {
			n_tgood++;
			ck_assert_str_eq(f.path, TEST_SHADOW_DIR "/kiln-tgood.so");
		}
	}
	ck_assert_int_eq(n_tgood, 1);
	kiln_registry_close(r);
}
END_TEST

START_TEST(later_directory_loses)
{
	struct kiln_registry *r;
	ck_assert_int_eq(kiln_registry_open(TEST_PLUGIN_DIR ":" TEST_SHADOW_DIR, &r), KILN_OK);
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_OPTIM, "tgood", &p), KILN_OK);
	assert_has(p->summary, "test optimizer");
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_SOURCE, "tsrc", &p), KILN_OK);
	kiln_registry_close(r);
}
END_TEST

/* $KILN_PLUGIN_PATH comes after the explicit path, and empty entries or
 * directories that do not exist are harmless. */
START_TEST(env_path)
{
	setenv("KILN_PLUGIN_PATH", TEST_PLUGIN_DIR "::/nonexistent/kiln", 1);
	struct kiln_registry *r;
	ck_assert_int_eq(kiln_registry_open(TEST_SHADOW_DIR, &r), KILN_OK);
	ck_assert_str_eq(kiln_registry_dir(r, 0), TEST_SHADOW_DIR);
	ck_assert_str_eq(kiln_registry_dir(r, 1), TEST_PLUGIN_DIR);
	ck_assert_str_eq(kiln_registry_dir(r, 2), "/nonexistent/kiln");
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_OPTIM, "tgood", &p), KILN_OK);
	assert_has(p->summary, "shadow");
	ck_assert_int_eq(kiln_registry_find(r, KILN_PLUGIN_SOURCE, "tbadabi", &p), KILN_EPLUGIN);
	kiln_registry_close(r);
	unsetenv("KILN_PLUGIN_PATH");
}
END_TEST

/* A directory of the path with no kiln-*.so (only other files) adds no
 * plugin and is no error: before session 34 its empty list went to qsort
 * as NULL (UBSan: null pointer passed as argument 1). */
START_TEST(dir_without_plugins)
{
	char dir[512], path[600], both[1200];
	ck_assert_ptr_nonnull(test_tmpdir_make(dir, sizeof dir, "plug"));
	static const char *const files[] = { "notes.txt", "kiln-x.txt", "kiln-.so", "libkiln-y.so" };
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		FILE *f = fopen(path, "w");
		ck_assert_ptr_nonnull(f);
		fclose(f);
	}
	struct kiln_registry *r, *alone;
	snprintf(both, sizeof both, "%s:%s", dir, TEST_PLUGIN_DIR);
	ck_assert_msg(kiln_registry_open(both, &r) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_registry_open(TEST_PLUGIN_DIR, &alone), KILN_OK);
	ck_assert_int_eq(kiln_registry_file_count(r), kiln_registry_file_count(alone));
	kiln_registry_close(alone);
	kiln_registry_close(r);
	test_tmpdir_remove(dir);
}
END_TEST

START_TEST(host_table)
{
	const struct kiln_host *h = kiln_host_table();
	ck_assert_ptr_nonnull(h);
	ck_assert_uint_eq(h->version, KILN_HOST_VERSION);
	ck_assert_ptr_nonnull(h->log);
	ck_assert_ptr_nonnull(h->error);
	ck_assert_ptr_nonnull(h->config_get);
	ck_assert_ptr_nonnull(h->config_get_int);
	ck_assert_ptr_nonnull(h->config_get_float);
	ck_assert_ptr_nonnull(h->config_get_bool);
	ck_assert_ptr_nonnull(h->config_where);
	ck_assert_int_eq(h->error(KILN_EDATA, "x %d", 3), KILN_EDATA);
	ck_assert_str_eq(kiln_last_error(), "x 3");
	ck_assert_str_eq(kiln_plugin_kind_name(KILN_PLUGIN_SOURCE), "source");
	ck_assert_str_eq(kiln_plugin_kind_name(KILN_PLUGIN_OPTIM), "optim");
	ck_assert_str_eq(kiln_plugin_kind_name(99), "unknown");
}
END_TEST

/* kiln_registry_open gives a program that embeds kiln the CLI's OpenMP
 * waiting (common/spin_rule.h) where the program set none, before a plugin
 * brings libgomp in; it keeps the program's own values, and changes
 * nothing once libgomp is loaded (it has read the environment then). */
START_TEST(omp_env_defaults)
{
	struct kiln_registry *r;
	void *g = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
	ck_assert_msg(g == NULL, "libgomp is already in the test process");
	unsetenv("OMP_WAIT_POLICY");
	unsetenv("GOMP_SPINCOUNT");
	ck_assert_int_eq(kiln_registry_open(TEST_PLUGIN_DIR, &r), KILN_OK);
	kiln_registry_close(r);
	ck_assert_ptr_nonnull(getenv("OMP_WAIT_POLICY"));
	ck_assert_str_eq(getenv("OMP_WAIT_POLICY"), "PASSIVE");
	ck_assert_ptr_nonnull(getenv("GOMP_SPINCOUNT"));
	ck_assert_msg(!strcmp(getenv("GOMP_SPINCOUNT"), "100000") ||
			      !strcmp(getenv("GOMP_SPINCOUNT"), "0"),
		      "GOMP_SPINCOUNT = %s", getenv("GOMP_SPINCOUNT"));
	setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
	setenv("GOMP_SPINCOUNT", "7", 1);
	ck_assert_int_eq(kiln_registry_open(TEST_PLUGIN_DIR, &r), KILN_OK);
	kiln_registry_close(r);
	ck_assert_str_eq(getenv("OMP_WAIT_POLICY"), "ACTIVE");
	ck_assert_str_eq(getenv("GOMP_SPINCOUNT"), "7");
	/* libgomp in the process first: nothing is set */
	g = dlopen("libgomp.so.1", RTLD_NOW);
	ck_assert_msg(g != NULL, "dlopen libgomp: %s", dlerror());
	unsetenv("OMP_WAIT_POLICY");
	unsetenv("GOMP_SPINCOUNT");
	ck_assert_int_eq(kiln_registry_open(TEST_PLUGIN_DIR, &r), KILN_OK);
	kiln_registry_close(r);
	ck_assert_ptr_null(getenv("OMP_WAIT_POLICY"));
	ck_assert_ptr_null(getenv("GOMP_SPINCOUNT"));
	dlclose(g);
}
END_TEST

/* ---- an application's signals ------------------------------------------------ */

static volatile sig_atomic_t ticks;
static void on_tick(int sig)
{
	(void)sig;
	ticks++;
}

/* A 200 us SIGALRM whose handler is installed without SA_RESTART, as an
 * application's timer may be: every blocking call kiln makes is cut short
 * by it (EINTR) now and then. */
static void start_ticks(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_tick; /* no SA_RESTART */
	ck_assert_int_eq(sigaction(SIGALRM, &sa, NULL), 0);
	struct itimerval it = { { 0, 200 }, { 0, 200 } };
	ck_assert_int_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
}

static void stop_ticks(void)
{
	struct itimerval off = { { 0, 0 }, { 0, 0 } };
	setitimer(ITIMER_REAL, &off, NULL);
	signal(SIGALRM, SIG_DFL);
}

/* Find source `name` (provided by a file not named after it, so found by
 * the probe children) in a fresh registry of dir (NULL: the build's
 * plugins), n times; every file the probe saw must have loaded. */
static void find_by_probe(const char *dir, const char *name, int n)
{
	setenv("KILN_PROBE_CACHE", "none", 1); /* probe every time */
	for (int k = 0; k < n; k++) {
		struct kiln_registry *r;
		const struct kiln_plugin *p = NULL;
		ck_assert_int_eq(kiln_registry_open(dir, &r), KILN_OK);
		kiln_status st = kiln_registry_find(r, KILN_PLUGIN_SOURCE, name, &p);
		ck_assert_msg(st == KILN_OK, "try %d: %s", k, kiln_last_error());
		for (int i = 0; i < kiln_registry_file_count(r); i++) {
			struct kiln_plugin_file f;
			kiln_registry_file_get(r, i, &f);
			ck_assert_msg(!f.error || !strstr(f.error, "test process"), "try %d: %s: %s",
				      k, f.path, f.error);
		}
		kiln_registry_close(r);
	}
	unsetenv("KILN_PROBE_CACHE");
}

/* The probe's pipe read was cut short by the timer: fgets ended the report
 * there, so a healthy file was blamed ("loading it ended a test process
 * (wait status 0)") or the files after it went unprobed ("no source plugin
 * named 'idx'"). */
START_TEST(probe_under_timer)
{
	start_ticks();
	find_by_probe(TEST_PLUGIN_DIR, "tsrc", 20);
	find_by_probe(NULL, "idx", 20);
	stop_ticks();
	ck_assert_int_gt(ticks, 0);
}
END_TEST

/* The error of the file kiln-texit.so (whose init calls _exit(3)) after a
 * probe of TEST_EXIT_DIR. */
static char *texit_error(void)
{
	struct kiln_registry *r;
	const struct kiln_plugin *p;
	setenv("KILN_PROBE_CACHE", "none", 1);
	ck_assert_int_eq(kiln_registry_open(TEST_EXIT_DIR, &r), KILN_OK);
	ck_assert_int_ne(kiln_registry_find(r, KILN_PLUGIN_SOURCE, "nosuchsource", &p), KILN_OK);
	char *err = NULL;
	for (int i = 0; i < kiln_registry_file_count(r); i++) {
		struct kiln_plugin_file f;
		kiln_registry_file_get(r, i, &f);
		if (strstr(f.path, "/kiln-texit.so") && f.error)
			err = strdup(f.error);
	}
	kiln_registry_close(r);
	unsetenv("KILN_PROBE_CACHE");
	ck_assert_ptr_nonnull(err);
	return err;
}

/* A plugin that ends the probe child is blamed with its exit status. */
START_TEST(probe_exit_status)
{
	char *err = texit_error();
	ck_assert_str_eq(err, "loading it made a test process exit with status 3 before it finished (code in the plugin or a library it loads called exit)");
	free(err);
}
END_TEST

/* An application that ignores SIGCHLD has its children reaped by the
 * kernel: the probe's waitpid fails with ECHILD, and the wait status it
 * reported was never set.  Lookups still work, and a file that ended its
 * probe child is blamed without a made-up status. */
START_TEST(probe_sigchld_ignored)
{
	signal(SIGCHLD, SIG_IGN);
	find_by_probe(TEST_PLUGIN_DIR, "tsrc", 5);
	find_by_probe(NULL, "idx", 5);
	char *err = texit_error();
	ck_assert_str_eq(err, "loading it ended a test process (how is unknown: its exit status went elsewhere, as when the application ignores SIGCHLD or reaps every child)");
	free(err);
	signal(SIGCHLD, SIG_DFL);
}
END_TEST

/* ---- suite ----------------------------------------------------------------- */

Suite *make_plugin_suite(void);
Suite *make_plugin_suite(void)
{
	Suite *s = suite_create("plugin");
	/* 30 s: listing loads every file, each first in a probe process */
	check_add_case(s, "load", 30, open_test_registry, close_registry, (const TTest *[]){
		search_path_first, files_listed, good_plugins, use_optim, use_source, plugin_info_size,
		bad_abi, newer_minor, missing_symbol, dlopen_failure, init_returns_null,
		probe_failure, not_found, validate_plugin_keys, write_plugin_keys, NULL });

	check_add_case(s, "order", 30, NULL, NULL, (const TTest *[]){
		earlier_directory_wins, later_directory_loses, env_path, dir_without_plugins, host_table,
		omp_env_defaults,
		NULL });

	check_add_case(s, "signals", 60, NULL, NULL, (const TTest *[]){
		probe_under_timer, probe_exit_status, probe_sigchld_ignored, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_plugin_suite, .verbose = 1,
					       .own_plugin_path = 1 };
