# Every plugin is a libtool module in plugins/, so the build tree has one
# plugin directory (plugins/.libs) that libkiln searches when uninstalled.
if BUILD_CPU
pkglib_LTLIBRARIES += plugins/kiln-cpu.la
plugins_kiln_cpu_la_SOURCES = plugins/cpu/cpu.c plugins/cpu/stream.c plugins/cpu/ops.c plugins/cpu/optim.c \
	plugins/cpu/gemm.c plugins/cpu/dnn.c plugins/cpu/conv.c plugins/cpu/pool.c \
	plugins/cpu/bn.c plugins/cpu/act.c plugins/cpu/layout.c plugins/cpu/cpu.h \
	plugins/cpu/dnn.h
# -fno-math-errno: sqrtf in a loop (Adam, LAMB) vectorises only when it
# need not set errno; no kernel reads errno, and results are unchanged
plugins_kiln_cpu_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(OPENMP_CFLAGS) -fno-math-errno
plugins_kiln_cpu_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_kiln_cpu_la_LIBADD = $(DNNL_LIBS) $(OPENMP_CFLAGS) -lm
endif

if BUILD_LOADERS
pkglib_LTLIBRARIES += plugins/kiln-loaders.la
plugins_kiln_loaders_la_SOURCES = plugins/loaders/loaders.c plugins/loaders/loaders.h \
	plugins/loaders/image.c plugins/loaders/image.h \
	plugins/loaders/common.c plugins/loaders/idx.c plugins/loaders/folder.c \
	plugins/loaders/tar.c plugins/loaders/lmdb.c plugins/loaders/synthetic.c \
	plugins/loaders/records.c plugins/loaders/records.h
plugins_kiln_loaders_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(ZLIB_CFLAGS) \
	$(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
plugins_kiln_loaders_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_kiln_loaders_la_LIBADD = $(ZLIB_LIBS) $(TURBOJPEG_LIBS) $(PNG_LIBS) $(LMDB_LIBS)
endif

if BUILD_AMP
pkglib_LTLIBRARIES += plugins/kiln-amp.la
plugins_kiln_amp_la_SOURCES = plugins/amp/amp.c
plugins_kiln_amp_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS)
plugins_kiln_amp_la_LDFLAGS = $(PLUGIN_LDFLAGS)
endif
