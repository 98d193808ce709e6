bin_PROGRAMS += kiln
kiln_SOURCES = cli/kiln.c cli/cli.h cli/cmd_config.c cli/cmd_plugins.c cli/cmd_train.c cli/cmd_eval.c \
	cli/cmd_bench.c cli/cmd_bench_comm.c cli/cmd_pack.c cli/cmd_export.c cli/cmd_memory.c cli/cmd_launch.c cli/launch.h cli/launch_wait.c \
	cli/pack_dir.c cli/pack_tokens.c cli/tokenizer.c cli/tokenizer.h \
	cli/cmd_summary.c cli/cmd_report.c cli/cmd_generate.c cli/report.h cli/report_metrics.c cli/report_svg.c
kiln_CPPFLAGS = $(AM_CPPFLAGS) $(PACK_CPPFLAGS) $(JANSSON_CFLAGS)
kiln_CFLAGS = $(AM_CFLAGS) $(KILN_FRAME_CFLAGS)
# `kiln report` reads metrics.jsonl with jansson
kiln_LDADD = libkiln.la $(JANSSON_LIBS) -lm
# `kiln pack` writes records shards with the loaders' image codec and
# records writer (plugins/loaders/local.mk: libimage_records.la).
if BUILD_LOADERS
PACK_CPPFLAGS = -DKILN_WITH_PACK -I$(top_srcdir)/plugins/loaders
kiln_LDADD += plugins/loaders/libimage_records.la
kiln_SOURCES += cli/pack.h cli/pack_shards.c cli/pack_folder.c
endif
# `kiln predict` (issue 23): the inference API on image files
kiln_SOURCES += cli/cmd_predict.c cli/predict.h cli/predict_inputs.c
# kiln quantize (issue 23, INT8)
kiln_SOURCES += cli/cmd_quantize.c
