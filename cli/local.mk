bin_PROGRAMS += kiln
kiln_SOURCES = cli/kiln.c cli/cli.h cli/cmd_config.c cli/cmd_plugins.c cli/cmd_train.c cli/cmd_eval.c \
	cli/cmd_bench.c cli/cmd_bench_comm.c cli/cmd_pack.c cli/cmd_export.c cli/cmd_memory.c cli/cmd_launch.c
kiln_CPPFLAGS = $(AM_CPPFLAGS) $(PACK_CPPFLAGS)
kiln_LDADD = libkiln.la
# `kiln pack` writes records shards with the loaders' writer and image
# codecs (libturbojpeg, libpng), compiled into the command as well.
if BUILD_LOADERS
PACK_CPPFLAGS = -DKILN_WITH_PACK -I$(top_srcdir) $(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
kiln_SOURCES += plugins/loaders/image.c plugins/loaders/image.h \
	plugins/loaders/records_write.c plugins/loaders/records.h
kiln_LDADD += $(TURBOJPEG_LIBS) $(PNG_LIBS) -lm
endif
