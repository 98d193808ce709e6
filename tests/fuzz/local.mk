# tests/fuzz: the fuzz targets (docs/fuzzing.md).  Each fuzz_NAME.c is one
# LLVMFuzzerTestOneInput over a reader of untrusted bytes.
#
# `make check` links every target with driver.c (any compiler) and runs it
# over its committed corpus tests/fuzz/corpus/NAME (tests/fuzz_corpus.sh).
# `make fuzz` (clang with libFuzzer, found by configure) links every target
# with -fsanitize=fuzzer,address,undefined and fuzzes each for FUZZ_TIME
# seconds, new inputs going to fuzz-work/NAME.  The reader's own sources are
# compiled into the libFuzzer binary (instrumented, so coverage guides the
# search); they interpose on the copies in libkiln-internal.so, which the
# binary links: libkiln.so exports only the public headers' functions
# (core/libkiln.sym), and the readers call internal ones (kiln_strdup,
# kiln_read_at, kiln_crc32c, ...).  Before session 40's review it linked
# -lkiln, and after libkiln's exports were cut no target linked.

FUZZ_TARGETS = config checkpoint safetensors store
FUZZ_DRIVER = tests/fuzz/driver.c tests/fuzz/fuzz.h
check_PROGRAMS += tests/fuzz/fuzz_config tests/fuzz/fuzz_checkpoint \
	tests/fuzz/fuzz_safetensors tests/fuzz/fuzz_store
tests_fuzz_fuzz_config_SOURCES = tests/fuzz/fuzz_config.c $(FUZZ_DRIVER)
tests_fuzz_fuzz_config_LDADD = libkiln.la
tests_fuzz_fuzz_checkpoint_SOURCES = tests/fuzz/fuzz_checkpoint.c $(FUZZ_DRIVER)
tests_fuzz_fuzz_checkpoint_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_fuzz_fuzz_checkpoint_LDADD = libkiln-internal.la
tests_fuzz_fuzz_safetensors_SOURCES = tests/fuzz/fuzz_safetensors.c $(FUZZ_DRIVER)
tests_fuzz_fuzz_safetensors_LDADD = libkiln.la
# core/store_msg.c for store_mac (not a kiln_* function: exported by neither
# library)
tests_fuzz_fuzz_store_SOURCES = tests/fuzz/fuzz_store.c $(FUZZ_DRIVER) core/store_msg.c
tests_fuzz_fuzz_store_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core $(CRYPTO_CFLAGS)
tests_fuzz_fuzz_store_LDADD = libkiln.la $(CRYPTO_LIBS)

# the readers of kiln-loaders.so, compiled into the target
FUZZ_LOADERS_SRC = plugins/loaders/idx.c plugins/loaders/idx_cache.c plugins/loaders/common.c plugins/loaders/records.c \
	plugins/loaders/tar.c plugins/loaders/tokens.c
if BUILD_LOADERS
FUZZ_TARGETS += sources
check_PROGRAMS += tests/fuzz/fuzz_sources
tests_fuzz_fuzz_sources_SOURCES = tests/fuzz/fuzz_sources.c $(FUZZ_DRIVER) $(FUZZ_LOADERS_SRC)
tests_fuzz_fuzz_sources_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/plugins/loaders
tests_fuzz_fuzz_sources_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(ZLIB_CFLAGS)
tests_fuzz_fuzz_sources_LDADD = libkiln.la plugins/loaders/libimage_records.la $(ZLIB_LIBS)
endif

TESTS += tests/fuzz_corpus.sh
EXTRA_DIST += tests/fuzz_corpus.sh tests/fuzz/corpus tests/fuzz/make-corpus docs/fuzzing.md

# ---- make fuzz ------------------------------------------------------------
FUZZ_TIME = 60
FUZZ_CFLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined
FUZZ_CPPFLAGS = $(DEFS) -I$(top_builddir) -I$(top_srcdir)/include -I$(top_srcdir)/core \
	-I$(top_srcdir)/plugins/loaders $(INIH_CFLAGS) $(JANSSON_CFLAGS) $(ZLIB_CFLAGS) $(CRYPTO_CFLAGS)
FUZZ_LIBS = -L$(top_builddir)/.libs -lkiln-internal -Wl,-rpath,$(abs_top_builddir)/.libs \
	$(INIH_LIBS) $(JANSSON_LIBS) $(ZLIB_LIBS) $(CRYPTO_LIBS) -lm -lpthread
fuzz_config_SRC = core/config.c core/config_check.c core/config_get.c core/config_write.c
fuzz_checkpoint_SRC = core/checkpoint_read.c core/checkpoint_write.c core/checkpoint_load.c \
	core/checkpoint_layout.c
fuzz_safetensors_SRC = core/safetensors.c
# the client, the parser and MAC, the server: store_mac and the server's
# functions are not kiln_*, so neither library exports them
fuzz_store_SRC = core/store.c core/store_msg.c core/store_server.c
fuzz_sources_SRC = $(FUZZ_LOADERS_SRC) plugins/loaders/image.c
fuzz_sources_LIBS = $(TURBOJPEG_LIBS) $(PNG_LIBS)

# (the reader's sources are prerequisites too, by GNU make's second
# expansion: before session 33 an edit of, say, plugins/loaders/common.c
# alone did not rebuild fuzz_sources)
.SECONDEXPANSION:
fuzz-bin/fuzz_%: $(srcdir)/tests/fuzz/fuzz_%.c $(srcdir)/tests/fuzz/fuzz.h libkiln-internal.la \
		$$(addprefix $$(srcdir)/,$$(fuzz_$$*_SRC))
	@test -n "$(FUZZ_CC)" || { echo "make fuzz needs clang with libFuzzer (configure found none)"; exit 1; }
	@$(MKDIR_P) fuzz-bin
	$(AM_V_CCLD)$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_CPPFLAGS) -o $@ $< \
		$(addprefix $(srcdir)/,$(fuzz_$*_SRC)) $(FUZZ_LIBS) $(fuzz_$*_LIBS)

# Fuzz every target for FUZZ_TIME seconds (one process each, in turn).
fuzz: $(addprefix fuzz-bin/fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  $(MKDIR_P) fuzz-work/$$t && \
	  echo "fuzz_$$t: $(FUZZ_TIME) s" && \
	  fuzz-bin/fuzz_$$t -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
	    -artifact_prefix=fuzz-work/$$t- fuzz-work/$$t $(srcdir)/tests/fuzz/corpus/$$t \
	    > fuzz-work/$$t.log 2>&1 || { tail -40 fuzz-work/$$t.log; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^#[0-9]+[[:space:]]+DONE' fuzz-work/$$t.log; \
	done
.PHONY: fuzz
clean-local: clean-fuzz
clean-fuzz:
	rm -rf fuzz-bin fuzz-work
.PHONY: clean-fuzz
