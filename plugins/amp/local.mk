# plugins/amp: the precision policies fp32, bf16 and fp16 (docs/precision.md).
if BUILD_AMP
pkglib_LTLIBRARIES += plugins/kiln-amp.la
plugins_kiln_amp_la_SOURCES = plugins/amp/amp.c
plugins_kiln_amp_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS)
plugins_kiln_amp_la_LDFLAGS = $(PLUGIN_LDFLAGS)
endif
