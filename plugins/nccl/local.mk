# plugins/nccl: the NCCL communicator, built with the CUDA toolkit; it loads
# without a GPU and its probe says so (docs/distributed.md).
if BUILD_NCCL
pkglib_LTLIBRARIES += plugins/kiln-nccl.la
plugins_kiln_nccl_la_SOURCES = plugins/nccl/nccl.c plugins/common/watchdog.c plugins/common/watchdog.h \
	plugins/common/comm_init.h plugins/common/rank_name.h
plugins_kiln_nccl_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
plugins_kiln_nccl_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS)
plugins_kiln_nccl_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_kiln_nccl_la_LIBADD = $(NCCL_LIBS) $(CUDA_LIBS)
endif
