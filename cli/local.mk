bin_PROGRAMS += kiln
kiln_SOURCES = cli/kiln.c cli/cli.h cli/cmd_config.c cli/cmd_plugins.c cli/cmd_train.c cli/cmd_bench.c
kiln_LDADD = libkiln.la
