/* tests/check_api_state.c - what the embedding program owns is as it was
 * when each public call returns (include/kiln/infer.h):
 *  - the calling thread's OpenMP thread count (omp_get_max_threads):
 *    before session 35 kiln_model_load with [run] threads = 1 left a
 *    2-core program's at 1, and kiln_infer with threads = 0 changed it too
 *    (the CPU device set its own on the caller's thread and kept it;
 *    plugins/cpu/cpu.h, cpu_omp_enter).  Checked for threads = 1 and
 *    0, through kiln_model_load, kiln_infer, kiln_infer_free and kiln_train;
 *  - the caller's validated config, which kiln_infer_open only reads:
 *    before session 35 it wrote [plugin.cpu] conv_impl = auto into it,
 *    even when it failed.
 * Built with OpenMP ($(OPENMP_CFLAGS)), as a program with its own
 * parallel regions is. */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/infer.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

/* The program's own count: not one kiln picks on any machine this runs on
 * ([run] threads = 1, or 0: the CPUs it may use), so a change shows. */
#define APP_THREADS 7

/* A small CNN on 8x8 synthetic images, [run] threads = `threads`; its
 * out_dir nowhere (no checkpoint: the seeded initial weights). */
static void model_ini(char *ini, size_t n, int threads)
{
	snprintf(ini, n,
		 "[run]\ndevice = cpu\nseed = 3\nthreads = %d\n"
		 "out_dir = /nonexistent/kiln-check-api-state\n"
		 "[data]\nsource = synthetic\nimage_size = 8\nsamples = 64\n"
		 "[data.eval]\nsamples = 32\n"
		 "[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n[layer.r1]\ntype = relu\n"
		 "[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"
		 "[layer.loss]\ntype = softmax_xent\n"
		 "[train]\nepochs = 1\nbatch = 16\nlr = 0.05\nlog_every = 2\n",
		 threads);
}

/* The program's OpenMP count is APP_THREADS after `what`. */
static void count_kept(const char *what, int threads)
{
	ck_assert_msg(omp_get_max_threads() == APP_THREADS,
		      "[run] threads = %d: omp_get_max_threads() %d after %s, %d before", threads,
		      omp_get_max_threads(), what, APP_THREADS);
}

static void infer_keeps_count(int threads)
{
	char ini[2048], *err = NULL;
	struct kiln_infer *m = NULL;
	model_ini(ini, sizeof ini, threads);
	omp_set_num_threads(APP_THREADS);
	ck_assert_msg(kiln_model_load(ini, NULL, &(struct kiln_infer_opts){ .config_is_text = 1 }, &m,
				      &err) == 0, "%s", err);
	count_kept("kiln_model_load", threads);
	const size_t in = kiln_infer_input_bytes(m) / sizeof(float);
	float *x = calloc(in * 20, sizeof *x), out[20 * 10];
	for (size_t i = 0; i < in * 20; i++)
		x[i] = test_hash_val((uint32_t)i, 1);
	ck_assert_msg(kiln_infer(m, x, 20, out) == 0, "%s", kiln_last_error());
	count_kept("kiln_infer", threads);
	/* the program's own region still gets its team */
	int team = 0;
#pragma omp parallel
	{
#pragma omp single
		team = omp_get_num_threads();
	}
	ck_assert_int_eq(team, APP_THREADS);
	kiln_infer_free(m);
	count_kept("kiln_infer_free", threads);
	free(x);
}

START_TEST(infer_threads_1) { infer_keeps_count(1); }
END_TEST

START_TEST(infer_threads_0) { infer_keeps_count(0); }
END_TEST

static void train_keeps_count(int threads)
{
	char ini[2048];
	model_ini(ini, sizeof ini, threads);
	struct kiln_config *cfg = test_config(reg, ini);
	ck_assert_msg(kiln_config_override(cfg, "run.out_dir=") == 0, "%s", kiln_last_error());
	omp_set_num_threads(APP_THREADS);
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, &res) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(res.steps, 4);
	count_kept("kiln_train", threads);
	kiln_config_free(cfg);
}

START_TEST(train_threads_1) { train_keeps_count(1); }
END_TEST

START_TEST(train_threads_0) { train_keeps_count(0); }
END_TEST

/* cfg as kiln_config_write writes it (malloc'd) */
static char *config_text(const struct kiln_config *cfg)
{
	char *text = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&text, &n);
	ck_assert(f != NULL);
	ck_assert_msg(kiln_config_write(cfg, reg, f) == 0, "%s", kiln_last_error());
	fclose(f);
	return text;
}

/* the two texts equal; else the first difference, with what follows it */
static void same_text(const char *after, const char *before, const char *when)
{
	size_t i = 0;
	while (after[i] && after[i] == before[i])
		i++;
	ck_assert_msg(!after[i] && !before[i], "%s: the config's text changed at byte %zu: '%.80s' (was '%.80s')",
		      when, i, after + i, before + i);
}

/* kiln_infer_open reads the caller's validated config and writes nothing
 * there, whether it succeeds or fails; the model still chose its
 * convolutions by timing (conv_impl = auto in its own copy: logged). */
START_TEST(infer_open_keeps_config)
{
	char ini[2048];
	model_ini(ini, sizeof ini, 1);
	struct kiln_config *cfg = test_config(reg, ini);
	char *before = config_text(cfg);
	struct kiln_infer *m = NULL;
	ck_assert_msg(kiln_infer_open(cfg, reg, NULL, NULL, &m) == 0, "%s", kiln_last_error());
	char *after = config_text(cfg);
	same_text(after, before, "after kiln_infer_open");
	ck_assert_ptr_null(kiln_config_get(cfg, "plugin.cpu", "conv_impl"));
	ck_assert_str_eq(kiln_config_where(cfg, "plugin.cpu", "conv_impl"), "default");
	/* the model runs on its copy after the caller's is gone */
	kiln_config_free(cfg);
	const size_t in = kiln_infer_input_bytes(m) / sizeof(float);
	float *x = calloc(in, sizeof *x), out[10];
	ck_assert_msg(kiln_infer(m, x, 1, out) == 0, "%s", kiln_last_error());
	kiln_infer_free(m);
	free(x);
	free(after);
	/* a failing open: nothing written either */
	cfg = test_config(reg, ini);
	m = NULL;
	ck_assert_int_ne(kiln_infer_open(cfg, reg, "/nonexistent/kiln-check-api-state.kiln", NULL, &m), 0);
	ck_assert_ptr_null(m);
	after = config_text(cfg);
	same_text(after, before, "after a failed kiln_infer_open");
	ck_assert_ptr_null(kiln_config_get(cfg, "plugin.cpu", "conv_impl"));
	free(after);
	free(before);
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_api_state_suite(void)
{
	Suite *s = suite_create("api_state");
	check_add_case(s, "omp", 120, NULL, NULL, (const TTest *[]){
		infer_threads_1, infer_threads_0, train_threads_1, train_threads_0, NULL });
	check_add_case(s, "config", 60, NULL, NULL, (const TTest *[]){ infer_open_keeps_config, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_api_state_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
