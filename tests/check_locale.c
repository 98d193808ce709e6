/* tests/check_locale.c - kiln under an application's locale (session 35).
 * A program that embeds libkiln may call setlocale(LC_ALL, "") (Qt and GTK
 * applications do); in de_DE strtod("0.1") stops at the '.' and printf
 * writes "0,5".  kiln parses and writes numbers in the C locale whatever
 * the application's (plugins/common/c_locale.h): a config with floats
 * loads, validates and trains, the files it writes hold '.', and the
 * numbers it writes into a config and reads back (quantize's scales) do.
 *
 * .setup switches the whole process to de_DE.UTF-8 before the suite runs
 * (Check's forked tests inherit it): the system's, else one localedef
 * builds under $XDG_CACHE_HOME/locale (tests/cache, make clean drops it)
 * and LOCPATH names.  Skipped (77) when neither works, with the reason.
 */
#include <kiln/kiln.h>
#include "core/quant.h" /* kiln_quant_config */

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <locale.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;
static char dir[1024];

/* 1 when this process now formats 0.5 as "0,5" (the point of the suite). */
static int comma_locale(void)
{
	char s[16];
	snprintf(s, sizeof s, "%g", 0.5);
	return !strcmp(s, "0,5");
}

static int locale_setup(void)
{
	const char *name = "de_DE.UTF-8", *cache = getenv("XDG_CACHE_HOME");
	char path[1200], cmd[4000];
	if (setlocale(LC_ALL, name) && comma_locale())
		return 0;
	snprintf(path, sizeof path, "%s/locale", cache && *cache ? cache : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	/* -c: written despite the warnings glibc's de_DE source gives (exit
	 * status 1); built beside and renamed, so that a suite running at the
	 * same time never reads half of it */
	snprintf(cmd, sizeof cmd,
		 "cd '%s' 2>/dev/null || mkdir -p '%s' && cd '%s' && { test -e %s/LC_NUMERIC || "
		 "{ localedef -c -i de_DE -f UTF-8 \"$PWD/%s.$$\"; test -e %s.$$/LC_NUMERIC && "
		 "mv -T %s.$$ %s; rm -rf %s.$$; }; } >/dev/null 2>&1",
		 path, path, path, name, name, name, name, name, name);
	if (system(cmd)) { /* (what it did: setlocale says below) */ }
	setenv("LOCPATH", path, 1);
	if (setlocale(LC_ALL, name) && comma_locale())
		return 0;
	printf("SKIP: no %s locale with a decimal comma, and localedef -c -i de_DE -f UTF-8 built "
	       "none into %s (localedef missing, or glibc's locale sources, "
	       "/usr/share/i18n/locales/de_DE?)\n", name, path);
	return 77;
}

static void dir_setup(void)
{
	ck_assert_ptr_nonnull(test_tmpdir_make(dir, sizeof dir, "locale"));
}

static void dir_teardown(void)
{
	test_tmpdir_remove(dir);
}

/* The whole of file `name` in dir, malloc()ed (the caller frees). */
static char *slurp(const char *name)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "no %s", path);
	char *s = calloc(1, 1 << 20);
	ck_assert_ptr_nonnull(s);
	size_t n = fread(s, 1, (1 << 20) - 1, f);
	s[n] = 0;
	fclose(f);
	return s;
}

/* A digit followed by ',' and a digit in s: a number in the locale's form
 * ("0,5"); NULL when there is none.  (JSON's commas follow a value.) */
static const char *decimal_comma(const char *s)
{
	for (; s[0] && s[1] && s[2]; s++)
		if (s[0] >= '0' && s[0] <= '9' && s[1] == ',' && s[2] >= '0' && s[2] <= '9')
			return s;
	return NULL;
}

/* 1 when prefix is in s, and every time followed by digits, '.', a digit */
static int point_after(const char *s, const char *prefix)
{
	int seen = 0;
	for (const char *p = s; (p = strstr(p, prefix)); seen = 1) {
		p += strlen(prefix);
		while (*p >= '0' && *p <= '9')
			p++;
		if (p[0] != '.' || p[1] < '0' || p[1] > '9')
			return 0;
	}
	return seen;
}

/* The rows of csv when each has as many cells as the header ("0,5" would
 * make two of one), else -1. */
static int csv_rows_even(const char *csv)
{
	int rows = 0, head = -1;
	for (const char *p = csv; *p; rows++) {
		int cells = 1;
		for (; *p && *p != '\n'; p++)
			cells += *p == ',';
		p += *p == '\n';
		if (head < 0)
			head = cells;
		else if (cells != head)
			return -1;
	}
	return rows - 1;
}

/* mean/std ([data]: the transform), lr and SGD's schema default momentum
 * = 0.9 (the optimizer's), dropout p (a layer's) */
static const char *train_ini =
	"[run]\ndevice = cpu\nseed = 3\nmemory_limit = 1.5G\nout_dir = %s\n"
	"[data]\nsource = synthetic\nsamples = 64\nimage_size = 6\nmean = 0.5\nstd = 0.25\n"
	"[data.eval]\nsamples = 32\n"
	"[layer.flat]\ntype = flatten\n[layer.drop]\ntype = dropout\np = 0.25\n"
	"[layer.fc]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = 1\nbatch = 16\nlr = 0.1\noptimizer = sgd\nlog_every = 1\n"
	"[log]\ncsv = 1\n";

START_TEST(test_config_floats_train)
{
	char ini[2048];
	struct kiln_config *cfg;
	double lr = 0, p = 0;
	snprintf(ini, sizeof ini, train_ini, dir);
	ck_assert_msg(kiln_config_load_string(ini, "locale.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_config_get_float(cfg, "train", "lr", &lr), KILN_OK);
	ck_assert_int_eq(kiln_config_get_float(cfg, "layer.drop", "p", &p), KILN_OK);
	ck_assert_double_eq(lr, 0.1);
	ck_assert_double_eq(p, 0.25);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	kiln_log_set_level(KILN_LOG_INFO);
	kiln_log_set_sink(check_log_sink, NULL);
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == KILN_OK, "%s", kiln_last_error());
	kiln_log_set_sink(NULL, NULL);
	ck_assert_int_eq(res.steps, 4);
	kiln_config_free(cfg);
	/* the messages: "train loss 2.4432", also where a piece of the line
	 * was formatted before kiln_log */
	const char *log = check_log_text();
	ck_assert_msg(point_after(log, "train loss "), "%s", log);    /* snprintf, then kiln_log */
	ck_assert_msg(point_after(log, "test loss "), "%s", log);     /* kiln_log's own */
	ck_assert_msg(point_after(log, "Params size (MiB): "), "%s", log); /* kiln_summary_print */
	/* the files kiln wrote: '.', never the locale's ',' */
	char *jsonl = slurp("metrics.jsonl"), *csv = slurp("train.csv");
	ck_assert_msg(strstr(jsonl, "\"lr\":0.1"), "%s", jsonl);
	ck_assert_msg(!decimal_comma(jsonl), "a decimal comma in metrics.jsonl at: %.40s", decimal_comma(jsonl));
	ck_assert_msg(strchr(csv, '.'), "%s", csv);
	ck_assert_msg(csv_rows_even(csv) >= 4, "rows of other widths than the header's:\n%s", csv);
	free(jsonl);
	free(csv);
}
END_TEST

/* A float in a config read through the typed getter, a size with a
 * fraction, a message's number (kiln's own formatting, also the plugins'
 * through the host's error()). */
START_TEST(test_parse_and_messages)
{
	struct kiln_config *cfg;
	double v = 0;
	size_t bytes = 0;
	ck_assert_int_eq(kiln_config_load_string("[train]\nlr = 2.5e-3\n", "t.ini", &cfg), KILN_OK);
	ck_assert_msg(kiln_config_get_float(cfg, "train", "lr", &v) == KILN_OK, "%s", kiln_last_error());
	ck_assert_double_eq(v, 2.5e-3);
	kiln_config_free(cfg);
	ck_assert_int_eq(kiln_parse_size("1.5k", &bytes), KILN_OK);
	ck_assert_uint_eq(bytes, 1536);
	kiln_error(KILN_EINVAL, "scale %g", 0.5);
	ck_assert_str_eq(kiln_last_error(), "scale 0.5");
}
END_TEST

/* kiln quantize's scales into the config as text ("%.9g") and back */
START_TEST(test_quant_scales)
{
	char path[1200], head[256];
	const float scale = 0.0123f;
	snprintf(head, sizeof head,
		 "{\"__metadata__\":{\"kiln.format\":\"kiln-int8/1\",\"fc.input\":\"s8\"},"
		 "\"fc.input_scale\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
	const uint64_t n = strlen(head);
	snprintf(path, sizeof path, "%s/q.safetensors", dir);
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert(fwrite(&n, 8, 1, f) == 1 && fwrite(head, 1, n, f) == n && fwrite(&scale, 4, 1, f) == 1);
	ck_assert_int_eq(fclose(f), 0);
	struct kiln_safetensors *st;
	struct kiln_config *cfg;
	double got = 0;
	ck_assert_msg(kiln_safetensors_open(path, &st) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(kiln_config_load_string("[run]\ndevice = cpu\n[data]\nsource = synthetic\n"
						 "[layer.fc]\ntype = linear\nout = 10\n"
						 "[layer.loss]\ntype = softmax_xent\n",
						 "q.ini", &cfg),
			 KILN_OK);
	ck_assert_msg(kiln_quant_config(cfg, st) == KILN_OK, "%s", kiln_last_error());
	ck_assert_str_eq(kiln_config_get(cfg, "layer.fc", "int8_scale"), "0.0122999996");
	ck_assert_msg(kiln_config_get_float(cfg, "layer.fc", "int8_scale", &got) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert_float_eq((float)got, scale);
	kiln_config_free(cfg);
	kiln_safetensors_close(st);
}
END_TEST

static Suite *make_locale_suite(void)
{
	Suite *s = suite_create("locale");
	check_add_case(s, "locale", 120, dir_setup, dir_teardown,
		       (const TTest *[]){ test_config_floats_train, test_parse_and_messages,
					  test_quant_scales, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_locale_suite, .reg = &reg, .need_cpu = 1,
					       .setup = locale_setup, .omp_passive = 1, .verbose = 1 };
