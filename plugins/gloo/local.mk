# plugins/gloo: the Gloo communicator (TCP), a C++ shim behind the C ABI
# (docs/distributed.md).
if BUILD_GLOO
pkglib_LTLIBRARIES += plugins/kiln-gloo.la
plugins_kiln_gloo_la_SOURCES = plugins/gloo/gloo.cc plugins/gloo/gloo_jobs.cc \
	plugins/gloo/gloo_mesh.cc plugins/gloo/gloo_comm.h plugins/gloo/deadline.cc \
	plugins/gloo/deadline.h plugins/gloo/shm.c plugins/gloo/shm.h \
	plugins/common/shmp2p.c plugins/common/shmp2p.h \
	$(PLUGIN_COMM_COMMON)
plugins_kiln_gloo_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS)
plugins_kiln_gloo_la_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-unused-parameter -pthread $(PLUGIN_CFLAGS)
# the C++ link: its exports by a version script of its own (exports.ver)
plugins_kiln_gloo_la_LDFLAGS = $(PLUGIN_LDFLAGS) -Wl,--version-script=$(srcdir)/plugins/gloo/exports.ver
EXTRA_plugins_kiln_gloo_la_DEPENDENCIES = plugins/gloo/exports.ver
plugins_kiln_gloo_la_LIBADD = $(GLOO_LIBS)
endif
EXTRA_DIST += plugins/gloo/exports.ver
