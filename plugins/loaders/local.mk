# plugins/loaders: the data sources idx, records, folder, tar, lmdb,
# synthetic and tokens, all in kiln-loaders.so (docs/data.md).
if BUILD_LOADERS
# The image codec (JPEG through TurboJPEG, PNG through libpng) and the
# records shard writer: one noinst library that kiln-loaders.so and
# `kiln pack` (cli/local.mk) both link, compiled once.
noinst_LTLIBRARIES += plugins/loaders/libimage_records.la
plugins_loaders_libimage_records_la_SOURCES = plugins/loaders/image.c plugins/loaders/image.h \
	plugins/loaders/records_write.c plugins/loaders/records.h
plugins_loaders_libimage_records_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) \
	$(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
plugins_loaders_libimage_records_la_LIBADD = $(TURBOJPEG_LIBS) $(PNG_LIBS) -lm

pkglib_LTLIBRARIES += plugins/kiln-loaders.la
plugins_kiln_loaders_la_SOURCES = plugins/loaders/loaders.c plugins/loaders/loaders.h \
	plugins/loaders/common.c plugins/loaders/idx.c \
	plugins/loaders/idx_cache.c plugins/loaders/idx_cache.h plugins/loaders/folder.c \
	plugins/loaders/tar.c plugins/loaders/lmdb.c plugins/loaders/synthetic.c \
	plugins/loaders/records.c plugins/loaders/records.h plugins/loaders/tokens.c \
	plugins/loaders/tokens.h \
	plugins/loaders/seq2seq.c
plugins_kiln_loaders_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(ZLIB_CFLAGS)
plugins_kiln_loaders_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_kiln_loaders_la_LIBADD = plugins/loaders/libimage_records.la $(ZLIB_LIBS) $(LMDB_LIBS)
endif
