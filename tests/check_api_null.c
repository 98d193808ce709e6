/* tests/check_api_null.c - NULL arguments to the public API outside the
 * inference calls (session 35): each required pointer left NULL is
 * KILN_EINVAL with "FUNCTION: ARG is NULL", never a crash (Check forks
 * each test: a crash fails it).  Before, kiln_config_load_string(text,
 * NULL, &c), kiln_config_override(c, NULL), kiln_config_get(c, NULL, k),
 * kiln_registry_open(p, NULL), kiln_parse_size(NULL, ..),
 * kiln_safetensors_open(NULL, ..) and kiln_train / kiln_evaluate /
 * kiln_memory_report with a NULL config crashed the caller (and before
 * session 42, kiln_generate, kiln_generator_step, kiln_generator_new and
 * kiln_sample_token dereferenced theirs).  The rules:
 * include/kiln/kiln.h, "NULL arguments".
 */
#include <kiln/kiln.h>
#include <kiln/dist.h>

#include <check.h>
#include "check_main.h"
#include <string.h>

/* st is KILN_EINVAL and the message names fn and arg. */
#define assert_null_arg(st, fn, arg)                                                      \
	do {                                                                              \
		kiln_clear_error();                                                       \
		kiln_status st_ = (st);                                                   \
		ck_assert_int_eq(st_, KILN_EINVAL);                                       \
		ck_assert_str_eq(kiln_last_error(), fn ": " arg " is NULL");              \
	} while (0)

static struct kiln_config *cfg_of(const char *text)
{
	struct kiln_config *c = NULL;
	ck_assert_int_eq(kiln_config_load_string(text, "t.ini", &c), KILN_OK);
	return c;
}

START_TEST(config_nulls)
{
	struct kiln_config *c = cfg_of("[train]\nbatch = 8\n");
	int64_t i = 0;
	double d;
	int b;
	const char *s;
	assert_null_arg(kiln_config_load_string("[run]\n", NULL, &c), "kiln_config_load_string",
			"name");
	assert_null_arg(kiln_config_load_string(NULL, "t.ini", &c), "kiln_config_load_string",
			"text");
	assert_null_arg(kiln_config_load_string("[run]\n", "t.ini", NULL), "kiln_config_load_string",
			"out");
	assert_null_arg(kiln_config_load(NULL, &c), "kiln_config_load", "path");
	assert_null_arg(kiln_config_load("t.ini", NULL), "kiln_config_load", "out");
	assert_null_arg(kiln_config_new(NULL), "kiln_config_new", "out");
	assert_null_arg(kiln_config_override(c, NULL), "kiln_config_override", "arg");
	assert_null_arg(kiln_config_override(NULL, "train.lr=1"), "kiln_config_override", "cfg");
	assert_null_arg(kiln_config_validate(NULL, NULL), "kiln_config_validate", "cfg");
	assert_null_arg(kiln_config_get_int(c, "train", "batch", NULL), "kiln_config_get_int", "out");
	assert_null_arg(kiln_config_get_int(c, NULL, "batch", &i), "kiln_config_get_int", "section");
	assert_null_arg(kiln_config_get_float(NULL, "train", "lr", &d), "kiln_config_get_float", "cfg");
	assert_null_arg(kiln_config_get_bool(c, "train", NULL, &b), "kiln_config_get_bool", "key");
	assert_null_arg(kiln_config_get_str(c, "train", "batch", NULL), "kiln_config_get_str", "out");
	assert_null_arg(kiln_config_write(NULL, NULL, stdout), "kiln_config_write", "cfg");
	assert_null_arg(kiln_config_write(c, NULL, NULL), "kiln_config_write", "f");
	assert_null_arg(kiln_config_check_training(NULL), "kiln_config_check_training", "cfg");
	assert_null_arg(kiln_config_check_layers(c, NULL), "kiln_config_check_layers", "reg");
	assert_null_arg(kiln_config_check_train(NULL, NULL), "kiln_config_check_train", "cfg");
	/* (a sized struct's own message, kiln/kiln.h "Structs the library fills") */
	ck_assert_int_eq(kiln_train_cfg_read(c, NULL, NULL), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_train_cfg_read: no struct kiln_train_cfg given (NULL)");
	/* the getters that return a string: NULL */
	ck_assert_ptr_null(kiln_config_get(c, NULL, "batch"));
	ck_assert_ptr_null(kiln_config_get(c, "train", NULL));
	ck_assert_ptr_null(kiln_config_get(NULL, "train", "batch"));
	ck_assert_ptr_null(kiln_config_where(NULL, "train", "batch"));
	ck_assert_ptr_null(kiln_config_where(c, NULL, NULL));
	ck_assert_ptr_null(kiln_config_section(NULL, 0));
	/* the config is untouched: batch still 8 */
	ck_assert_int_eq(kiln_config_get_int(c, "train", "batch", &i), KILN_OK);
	ck_assert_int_eq(i, 8);
	(void)s;
	kiln_config_free(c);
	kiln_config_free(NULL);
}
END_TEST

START_TEST(registry_nulls)
{
	const struct kiln_plugin *p;
	struct kiln_plugin_file f = { .path = "x" };
	struct kiln_plugin_info pi = { .size = sizeof pi, .name = "x" };
	assert_null_arg(kiln_registry_open("/nonexistent", NULL), "kiln_registry_open", "out");
	assert_null_arg(kiln_registry_find(NULL, KILN_PLUGIN_DEVICE, "cpu", &p), "kiln_registry_find",
			"reg");
	struct kiln_registry *r;
	ck_assert_int_eq(kiln_registry_open("/nonexistent", &r), KILN_OK);
	assert_null_arg(kiln_registry_find(r, KILN_PLUGIN_DEVICE, NULL, &p), "kiln_registry_find",
			"name");
	assert_null_arg(kiln_registry_find(r, KILN_PLUGIN_DEVICE, "cpu", NULL), "kiln_registry_find",
			"out");
	/* counts of NULL are 0; a *_get out of range zeroes its struct */
	ck_assert_int_eq(kiln_registry_file_count(NULL), 0);
	ck_assert_int_eq(kiln_registry_plugin_count(NULL), 0);
	ck_assert_int_eq(kiln_registry_loaded_count(NULL), 0);
	ck_assert_int_eq(kiln_registry_dir_count(NULL), 0);
	ck_assert_ptr_null(kiln_registry_dir(NULL, 0));
	kiln_registry_file_get(r, 1000, &f);
	ck_assert_ptr_null(f.path);
	/* (kiln_registry_plugin_get returns a status: its struct has a size,
	 * kiln/kiln.h "Structs the library fills"; nothing written on error) */
	assert_null_arg(kiln_registry_plugin_get(NULL, 0, &pi), "kiln_registry_plugin_get", "reg");
	ck_assert_str_eq(pi.name, "x");
	ck_assert_int_eq(kiln_registry_plugin_get(r, 0, NULL), KILN_EINVAL);
	kiln_registry_close(r);
	kiln_registry_close(NULL);
}
END_TEST

START_TEST(runner_nulls)
{
	struct kiln_config *c = cfg_of("[train]\nbatch = 8\n");
	struct kiln_registry *r;
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	struct kiln_memory mem = KILN_MEMORY_INIT;
	struct kiln_summary sum;
	struct kiln_quantize_opts q = { 0 };
	struct kiln_train_cfg tc = { 0 };
	struct kiln_data_bench db;
	struct kiln_model *m;
	struct kiln_source *src;
	struct kiln_device *dev;
	struct kiln_generator *g;
	struct kiln_tensor_desc sample = { 0 };
	ck_assert_int_eq(kiln_registry_open("/nonexistent", &r), KILN_OK);
	assert_null_arg(kiln_train(NULL, r, NULL, NULL, &res), "kiln_train", "cfg");
	assert_null_arg(kiln_train(c, NULL, NULL, NULL, &res), "kiln_train", "reg");
	assert_null_arg(kiln_train_run(c, r, NULL, NULL, NULL, &res), "kiln_train_run", "tc");
	assert_null_arg(kiln_train_run(NULL, r, &tc, NULL, NULL, &res), "kiln_train_run", "cfg");
	assert_null_arg(kiln_evaluate(NULL, r, NULL, &res), "kiln_evaluate", "cfg");
	assert_null_arg(kiln_evaluate_ex(c, NULL, NULL, NULL, &res), "kiln_evaluate_ex", "reg");
	assert_null_arg(kiln_quantize(NULL, r, NULL, &q), "kiln_quantize", "cfg");
	assert_null_arg(kiln_quantize(c, r, NULL, NULL), "kiln_quantize", "opts");
	assert_null_arg(kiln_memory_report(NULL, r, NULL, &mem), "kiln_memory_report", "cfg");
	ck_assert_int_eq(kiln_memory_report(c, r, NULL, NULL), KILN_EINVAL);
	ck_assert_str_eq(kiln_last_error(), "kiln_memory_report: no struct kiln_memory given (NULL)");
	assert_null_arg(kiln_summary_report(NULL, r, 1, NULL, &sum), "kiln_summary_report", "cfg");
	assert_null_arg(kiln_bench_data(c, NULL, 1, &db), "kiln_bench_data", "reg");
	assert_null_arg(kiln_model_create(NULL, r, NULL, &sample, &m), "kiln_model_create", "cfg");
	assert_null_arg(kiln_model_create(c, r, NULL, &sample, &m), "kiln_model_create", "dev");
	assert_null_arg(kiln_model_summary(NULL, 1, &sum), "kiln_model_summary", "m");
	assert_null_arg(kiln_source_open(c, r, NULL, "train", &src), "kiln_source_open", "section");
	assert_null_arg(kiln_device_open(r, NULL, "cpu", 0, NULL), "kiln_device_open", "out");
	assert_null_arg(kiln_device_open(NULL, NULL, "cpu", 0, &dev), "kiln_device_open", "reg");
	assert_null_arg(kiln_generator_open(NULL, r, NULL, &g), "kiln_generator_open", "cfg");
	assert_null_arg(kiln_export_safetensors(c, r, NULL, NULL), "kiln_export_safetensors_as",
			"path");
	assert_null_arg(kiln_export_onnx(NULL, r, NULL, "x.onnx"), "kiln_export_onnx", "cfg");
	assert_null_arg(kiln_export_onnx_quantized(c, r, NULL, "x.onnx"),
			"kiln_export_onnx_quantized", "quantized");
	kiln_summary_free(NULL);
	kiln_model_free(NULL);
	kiln_source_close(NULL);
	kiln_device_close(NULL);
	kiln_generator_close(NULL);
	ck_assert_ptr_null(kiln_device_name(NULL));
	ck_assert_ptr_null(kiln_source_name(NULL));
	ck_assert_int_eq(kiln_model_param_count(NULL), 0);
	ck_assert_int_eq(kiln_generator_vocab(NULL), 0);
	ck_assert_int_eq(kiln_generator_classes(NULL), 0);
	assert_null_arg(kiln_generator_allow(NULL, NULL, 0), "kiln_generator_allow", "g");
	/* session 41's: top-p and several samples */
	{
		const struct kiln_sample_opts so = { .temperature = 1 };
		const float lg[2] = { 0, 1 };
		const int32_t tok = 1;
		int32_t id, outs[2];
		double probs[2];
		assert_null_arg(kiln_generator_top_p(NULL, 0.5), "kiln_generator_top_p", "g");
		/* session 43's */
		assert_null_arg(kiln_generator_plan_samples(NULL, 2), "kiln_generator_plan_samples", "g");
		assert_null_arg(kiln_generate_samples(NULL, &tok, 1, 1, 2, &so, outs, NULL, NULL),
				"kiln_generate_samples", "g");
		assert_null_arg(kiln_sample_token_ex(NULL, 2, &so, 1, 0, 0, &id), "kiln_sample_token_ex",
				"logits");
		assert_null_arg(kiln_sample_token_ex(lg, 2, NULL, 1, 0, 0, &id), "kiln_sample_token_ex", "o");
		assert_null_arg(kiln_sample_token_ex(lg, 2, &so, 1, 0, 0, NULL), "kiln_sample_token_ex",
				"token");
		assert_null_arg(kiln_sample_probs(lg, 2, &so, 1, NULL), "kiln_sample_probs", "probs");
		assert_null_arg(kiln_sample_probs(lg, 2, NULL, 1, probs), "kiln_sample_probs", "o");
	}
	/* session 42's (before, kiln_generate, kiln_generator_step,
	 * kiln_generator_new and kiln_sample_token dereferenced them): a
	 * pointer to `fake` stands for a generator, model and stream, never
	 * read, since the NULL checks come first */
	{
		const struct kiln_sample_opts so = { .temperature = 0 };
		const float lg[2] = { 0, 1 };
		const float *lgp;
		const int32_t tok[2] = { 1, 0 };
		int32_t id, outs[2];
		long fake = 0;
		struct kiln_generator *fg = (struct kiln_generator *)&fake, *none = NULL;
		struct kiln_model *fm = (struct kiln_model *)&fake;
		assert_null_arg(kiln_generator_new(NULL, &fake, 9, &none), "kiln_generator_new", "m");
		assert_null_arg(kiln_generator_new(fm, NULL, 9, &none), "kiln_generator_new", "stream");
		assert_null_arg(kiln_generator_new(fm, &fake, 9, NULL), "kiln_generator_new", "out");
		ck_assert_ptr_null(none);
		assert_null_arg(kiln_generate(NULL, tok, 2, 1, &so, outs, NULL, NULL), "kiln_generate", "g");
		assert_null_arg(kiln_generate(fg, NULL, 2, 1, &so, outs, NULL, NULL), "kiln_generate", "prompt");
		assert_null_arg(kiln_generate(fg, tok, 2, 1, NULL, outs, NULL, NULL), "kiln_generate", "o");
		assert_null_arg(kiln_generate(fg, tok, 2, 1, &so, NULL, NULL, NULL), "kiln_generate", "out");
		assert_null_arg(kiln_generate_samples(fg, NULL, 2, 1, 2, &so, outs, NULL, NULL),
				"kiln_generate_samples", "prompt");
		assert_null_arg(kiln_generate_samples(fg, tok, 2, 1, 2, NULL, outs, NULL, NULL),
				"kiln_generate_samples", "o");
		assert_null_arg(kiln_generate_samples(fg, tok, 2, 1, 2, &so, NULL, NULL, NULL),
				"kiln_generate_samples", "out");
		assert_null_arg(kiln_generator_step(NULL, 0, 1, &lgp), "kiln_generator_step", "g");
		assert_null_arg(kiln_generator_step(fg, 0, 1, NULL), "kiln_generator_step", "logits");
		assert_null_arg(kiln_sample_token(NULL, 2, &so, 0, &id), "kiln_sample_token", "logits");
		assert_null_arg(kiln_sample_token(lg, 2, NULL, 0, &id), "kiln_sample_token", "o");
		assert_null_arg(kiln_sample_token(lg, 2, &so, 0, NULL), "kiln_sample_token", "token");
		ck_assert_int_eq(kiln_generator_context(NULL), 0);
	}
	kiln_registry_close(r);
	kiln_config_free(c);
}
END_TEST

START_TEST(files_nulls)
{
	size_t n = 7;
	struct kiln_safetensors *f;
	struct kiln_safetensors_writer *w;
	struct kiln_safetensors_tensor t = { .name = "x" };
	const int64_t dims[1] = { 2 };
	assert_null_arg(kiln_parse_size(NULL, &n), "kiln_parse_size", "s");
	assert_null_arg(kiln_parse_size("1G", NULL), "kiln_parse_size", "out");
	ck_assert_uint_eq(n, 7);
	assert_null_arg(kiln_safetensors_open(NULL, &f), "kiln_safetensors_open", "path");
	assert_null_arg(kiln_safetensors_open("x.safetensors", NULL), "kiln_safetensors_open", "out");
	assert_null_arg(kiln_safetensors_find(NULL, "w", &t), "kiln_safetensors_find", "f");
	ck_assert_int_eq(kiln_safetensors_count(NULL), 0);
	ck_assert_ptr_null(kiln_safetensors_path(NULL));
	ck_assert_ptr_null(kiln_safetensors_meta(NULL, "k"));
	kiln_safetensors_get(NULL, 0, &t);
	ck_assert_ptr_null(t.name);
	kiln_safetensors_close(NULL);
	assert_null_arg(kiln_safetensors_writer_new(NULL), "kiln_safetensors_writer_new", "out");
	ck_assert_int_eq(kiln_safetensors_writer_new(&w), KILN_OK);
	assert_null_arg(kiln_safetensors_writer_add(w, NULL, KILN_F32, 1, dims, dims),
			"kiln_safetensors_writer_add", "name");
	assert_null_arg(kiln_safetensors_writer_add(w, "a", KILN_F32, 1, NULL, dims),
			"kiln_safetensors_writer_add", "dims");
	assert_null_arg(kiln_safetensors_writer_add(w, "a", KILN_F32, 1, dims, NULL),
			"kiln_safetensors_writer_add", "data");
	assert_null_arg(kiln_safetensors_writer_meta(w, "k", NULL), "kiln_safetensors_writer_meta",
			"value");
	assert_null_arg(kiln_safetensors_writer_write(w, NULL), "kiln_safetensors_writer_write", "path");
	assert_null_arg(kiln_safetensors_writer_write(NULL, "x"), "kiln_safetensors_writer_write", "w");
	kiln_safetensors_writer_free(w);
	kiln_safetensors_writer_free(NULL);
}
END_TEST

START_TEST(dist_nulls)
{
	struct kiln_store *s;
	void *v;
	int which;
	assert_null_arg(kiln_dist_env_read(NULL), "kiln_dist_env_read", "e");
	assert_null_arg(kiln_store_open(NULL, 0, 1, 0, 1, 100, &s), "kiln_store_open", "host");
	assert_null_arg(kiln_store_open("127.0.0.1", 0, 1, 0, 1, 100, NULL), "kiln_store_open", "out");
	assert_null_arg(kiln_store_set(NULL, "k", "v", 1), "kiln_store_set", "s");
	assert_null_arg(kiln_store_get(NULL, "k", 1, &v, NULL), "kiln_store_get", "s");
	assert_null_arg(kiln_store_check(NULL, "k", &v, NULL), "kiln_store_check", "s");
	assert_null_arg(kiln_store_add(NULL, "k", 1, NULL), "kiln_store_add", "s");
	assert_null_arg(kiln_store_wait(NULL, NULL, 0, 1), "kiln_store_wait", "s");
	assert_null_arg(kiln_store_poll(NULL, NULL, 0, 1, &which, &v), "kiln_store_poll", "s");
	assert_null_arg(kiln_store_rendezvous(NULL, 0, 1, 1), "kiln_store_rendezvous", "s");
	ck_assert_int_eq(kiln_store_port(NULL), 0);
	kiln_store_close(NULL);
}
END_TEST

Suite *make_api_null_suite(void);
Suite *make_api_null_suite(void)
{
	Suite *s = suite_create("api_null");
	check_add_case(s, "null", 30, NULL, NULL, (const TTest *[]){
		config_nulls, registry_nulls, runner_nulls, files_nulls, dist_nulls, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_api_null_suite };
