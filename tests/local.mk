# tests/local.mk - the test suite, by area.  Check suites (tests/check_*.c)
# share their main() (tests/check_main.h) and fixtures (tests/test_util.h);
# shell tests share their preamble (tests/lib.sh).  A suite or script that
# cannot run here (no plugin, no GPU, no mpirun) exits 77: SKIP.

# Shell tests find the build through these; automake's harness sets srcdir.
AM_TESTS_ENVIRONMENT = top_builddir='$(top_builddir)' abs_top_builddir='$(abs_top_builddir)' \
	abs_top_srcdir='$(abs_top_srcdir)' MAKE='$(MAKE)' CC='$(CC)' CXX='$(CXX)' \
	kiln_includedir='$(includedir)' kiln_pkgconfigdir='$(pkgconfigdir)'; \
	export top_builddir abs_top_builddir abs_top_srcdir MAKE CC CXX kiln_includedir kiln_pkgconfigdir;
# ccache (CC = "ccache gcc"; tests/plugin_lazy.sh and tests/oot.sh compile):
# the caller's cache, which ccache finds through XDG_CACHE_HOME unless
# CCACHE_DIR names it, so it is named before XDG_CACHE_HOME moves below (a
# second cache in tests/cache/ccache, in the tree, otherwise); none
# (CCACHE_DISABLE) where ccache does not say where.  tests/lib.sh, by hand.
AM_TESTS_ENVIRONMENT += if [ -z "$${CCACHE_DIR:-}" ] && command -v ccache >/dev/null 2>&1; then \
	CCACHE_DIR=$$(ccache -k cache_dir 2>/dev/null) || CCACHE_DIR=; \
	if [ -n "$$CCACHE_DIR" ]; then export CCACHE_DIR; \
	else unset CCACHE_DIR; CCACHE_DISABLE=1; export CCACHE_DISABLE; fi; fi;
# The caches kiln keeps (the inflated IDX data, the plugin probe) go under
# the build tree, not the user's ~/.cache (about 53 MB); make clean drops them.
AM_TESTS_ENVIRONMENT += XDG_CACHE_HOME='$(abs_top_builddir)/tests/cache'; export XDG_CACHE_HOME;
# Nor beside the sources: Python's bytecode of the helpers a reference
# script imports (tests/gpt_steps.sh's tests/data/gen_gpt_refs.py wrote
# tests/data/__pycache__, tests/ddp_torch.sh bench/__pycache__), so that a
# read-only or VPATH source tree stays untouched (tests/lib.sh, by hand).
AM_TESTS_ENVIRONMENT += PYTHONDONTWRITEBYTECODE=1; export PYTHONDONTWRITEBYTECODE;
# The CPU plugin's kernel timings count as quiet (plugins/cpu/tune.c's hook
# for the timing thread's run-queue wait): on a loaded test machine they
# would be provisional in that cache, and a later run of the same test
# (tests/infer_wreorder.sh counts oneDNN's exec lines; bf16 runs compared
# bit for bit) could re-time them.  tests/check_cpu_tune and
# tests/cpu_tune_cache.sh set the hooks themselves, and time for real.
AM_TESTS_ENVIRONMENT += KILN_CPU_TUNEWAIT=0; export KILN_CPU_TUNEWAIT;
clean-local:
	-rm -rf tests/cache
EXTRA_DIST += tests/check_main.h tests/test_util.h tests/proc_io.h tests/held_fail.h tests/conv_ref.h tests/test_scratch.h tests/source_fixture.h tests/smaps.h tests/lib.sh tests/st.py tests/tok_pads.py tests/resume_rig.h tests/ckpt_rig.h tests/cnn_rig.h \
	tests/plugins/test_plugin.h
CHECK_SUITE_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)

# ---- config: parsing, the schema, overrides, typos -----------------------
if HAVE_CHECK
check_PROGRAMS += tests/check_config
TESTS += tests/check_config
CLEANFILES += check_config.golden_out.got
tests_check_config_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_config_LDADD = libkiln.la $(CHECK_LIBS)
endif
EXTRA_DIST += tests/config/golden_in.ini tests/config/golden_out.ini tests/config/cli.ini \
	tests/config/typo_run.ini tests/config/typo_data.ini tests/config/typo_model.ini \
	tests/config/typo_train.ini

# ---- the application's locale: numbers in the C locale whatever it is ------
# (check_locale builds de_DE.UTF-8 with localedef into tests/cache/locale
# when the system has none; skips when it cannot)
if HAVE_CHECK
check_PROGRAMS += tests/check_locale
TESTS += tests/check_locale
tests_check_locale_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_locale_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)
tests_check_locale_LDADD = libkiln-internal.la $(CHECK_LIBS)
endif

# ---- plugins: the registry, the ABI checks, an out-of-tree plugin ---------
# Test plugins: built like real plugins (hidden visibility, only
# kiln_plugin_init exported) but never installed nor in the default search
# path; they land in tests/plugins/.libs (and tests/plugins/shadow/.libs, tests/plugins/exit/.libs).
TEST_PLUGIN_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS)
TEST_PLUGIN_LDFLAGS = $(PLUGIN_LDFLAGS) -rpath /nowhere
check_LTLIBRARIES += tests/plugins/kiln-tgood.la tests/plugins/kiln-tbadabi.la \
	tests/plugins/kiln-tnewer.la \
	tests/plugins/kiln-tnosym.la tests/plugins/kiln-tdlfail.la tests/plugins/kiln-tnull.la \
	tests/plugins/shadow/kiln-tgood.la tests/plugins/kiln-tcommfail.la \
	tests/plugins/exit/kiln-texit.la tests/plugins/kiln-tlayer.la \
	tests/plugins/kiln-tloss.la tests/plugins/kiln-tloss22.la tests/plugins/kiln-tloss25.la \
	tests/plugins/kiln-tlossfail.la \
	tests/plugins/nodecode/kiln-tnodecode.la
tests_plugins_kiln_tgood_la_SOURCES = tests/plugins/tgood.c
tests_plugins_kiln_tgood_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tgood_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tbadabi_la_SOURCES = tests/plugins/tbadabi.c
tests_plugins_kiln_tbadabi_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tbadabi_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tnewer_la_SOURCES = tests/plugins/tnewer.c
tests_plugins_kiln_tnewer_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tnewer_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tnosym_la_SOURCES = tests/plugins/tnosym.c
tests_plugins_kiln_tnosym_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
# (no export list: an empty one is a syntax error for ld; it exports a typo)
tests_plugins_kiln_tnosym_la_LDFLAGS = -module -avoid-version -shared -rpath /nowhere
tests_plugins_kiln_tdlfail_la_SOURCES = tests/plugins/tdlfail.c
tests_plugins_kiln_tdlfail_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
# (an undefined symbol on purpose: not -Wl,--no-undefined)
tests_plugins_kiln_tdlfail_la_LDFLAGS = $(PLUGIN_MODULE_LDFLAGS) -rpath /nowhere
tests_plugins_kiln_tcommfail_la_SOURCES = tests/plugins/tcommfail.c
tests_plugins_kiln_tcommfail_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tcommfail_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tnull_la_SOURCES = tests/plugins/tnull.c
tests_plugins_kiln_tnull_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tnull_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_shadow_kiln_tgood_la_SOURCES = tests/plugins/shadow.c
tests_plugins_shadow_kiln_tgood_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_shadow_kiln_tgood_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_exit_kiln_texit_la_SOURCES = tests/plugins/texit.c
tests_plugins_exit_kiln_texit_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_exit_kiln_texit_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tlayer_la_SOURCES = tests/plugins/tlayer.c
tests_plugins_kiln_tlayer_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tlayer_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
# one loss layer built for this ABI and for 2.22 (tests/loss_plugin_abi.sh)
tests_plugins_kiln_tloss_la_SOURCES = tests/plugins/tloss.c
tests_plugins_kiln_tloss_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tloss_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tloss22_la_SOURCES = tests/plugins/tloss.c
tests_plugins_kiln_tloss22_la_CPPFLAGS = $(AM_CPPFLAGS) -DTLOSS_ABI22
tests_plugins_kiln_tloss22_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tloss22_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tloss25_la_SOURCES = tests/plugins/tloss.c
tests_plugins_kiln_tloss25_la_CPPFLAGS = $(AM_CPPFLAGS) -DTLOSS_ABI25
tests_plugins_kiln_tloss25_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tloss25_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_kiln_tlossfail_la_SOURCES = tests/plugins/tloss.c
tests_plugins_kiln_tlossfail_la_CPPFLAGS = $(AM_CPPFLAGS) -DTLOSS_FAIL
tests_plugins_kiln_tlossfail_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_kiln_tlossfail_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
# the CPU device without ATTENTION_DECODE (tests/generate_device.sh), and
# under ABI 2.28 (there, and tests/optim_old_abi.sh)
tests_plugins_nodecode_kiln_tnodecode_la_SOURCES = tests/plugins/tnodecode.c
tests_plugins_nodecode_kiln_tnodecode_la_CPPFLAGS = $(AM_CPPFLAGS) \
	-DCPU_SO='"$(abs_top_builddir)/plugins/.libs/kiln-cpu.so"'
tests_plugins_nodecode_kiln_tnodecode_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_nodecode_kiln_tnodecode_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_nodecode_kiln_tnodecode_la_LIBADD = -ldl

TEST_PLUGIN_DIRS = -DTEST_PLUGIN_DIR='"$(abs_top_builddir)/tests/plugins/.libs"' \
	-DTEST_SHADOW_DIR='"$(abs_top_builddir)/tests/plugins/shadow/.libs"' \
	-DTEST_EXIT_DIR='"$(abs_top_builddir)/tests/plugins/exit/.libs"'

if HAVE_CHECK
check_PROGRAMS += tests/check_plugin
TESTS += tests/check_plugin
tests_check_plugin_CPPFLAGS = $(AM_CPPFLAGS) $(TEST_PLUGIN_DIRS)
tests_check_plugin_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_plugin_LDADD = libkiln.la $(CHECK_LIBS)
endif

# The out-of-tree plugin test: tests/oot.sh installs kiln into a DESTDIR,
# builds tests/oot/oot.c against the installed headers only, runs
# tests/oot_test (which loads and reads its source "ootsrc") and
# tests/gradcheck on the example layer examples/plugins/swish.c.
check_PROGRAMS += tests/oot_test tests/gradcheck
tests_oot_test_SOURCES = tests/oot/oot_test.c
tests_oot_test_LDADD = libkiln.la
tests_gradcheck_LDADD = libkiln.la -lm
TESTS += tests/oot.sh
# no built plugin needs a kiln_* symbol (it does not link libkiln) and each
# exports kiln_plugin_init alone (session 36)
TESTS += tests/plugin_symbols.sh
EXTRA_DIST += tests/plugin_symbols.sh
# libkiln.so exports exactly the installed headers' functions
# (core/libkiln.sym); the headers as installed, for the test to read
TESTS += tests/lib_symbols.sh
EXTRA_DIST += tests/lib_symbols.sh
AM_TESTS_ENVIRONMENT += kiln_public_headers='$(kilninclude_HEADERS)'; export kiln_public_headers;
# a program against the install: every header from C++, kiln.pc's plugin
# ABI and static libraries (session 36)
TESTS += tests/install_link.sh
EXTRA_DIST += tests/install_link.sh tests/oot/headers.cc
# every file git tracks in `make dist` (session 36); tests/dist_explain_ab.sh
# is a tool of docs/PERFORMANCE.md's, not a test
TESTS += tests/dist_files.sh
EXTRA_DIST += tests/dist_files.sh tests/dist_explain_ab.sh
EXTRA_DIST += tests/oot.sh tests/oot/oot.c tests/oot/swish.ini examples/plugins/swish.c

# an optimizer against a PyTorch reference file; tests/oot.sh runs it on
# the example optimizer plugin examples/plugins/lion.c, built out of tree
check_PROGRAMS += tests/optim_ref
tests_optim_ref_SOURCES = tests/optim_ref.c
tests_optim_ref_LDADD = libkiln.la -lm
EXTRA_DIST += examples/plugins/lion.c tests/data/gen_lion_refs.py tests/data/lion_refs.safetensors

# ---- data and loaders: idx, records, folder / tar / lmdb / synthetic
# sources, transforms against torchvision, the loader, `kiln pack` ---------
if HAVE_CHECK
check_PROGRAMS += tests/check_idx tests/check_data tests/check_transform
TESTS += tests/check_idx tests/check_data tests/check_transform
tests_check_idx_CFLAGS = $(CHECK_SUITE_CFLAGS) $(ZLIB_CFLAGS)
tests_check_idx_LDADD = libkiln.la $(CHECK_LIBS) $(ZLIB_LIBS)
tests_check_data_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core $(TEST_PLUGIN_DIRS)
tests_check_data_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_data_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
tests_check_transform_SOURCES = tests/check_transform.c
tests_check_transform_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)
tests_check_transform_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_transform_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
if BUILD_LOADERS
# the loaders' JPEG/PNG decoder, linked in to compare its pixels with PIL's
tests_check_transform_SOURCES += plugins/loaders/image.c plugins/loaders/image.h
tests_check_transform_CPPFLAGS += -DHAVE_IMAGE_CODEC
tests_check_transform_CFLAGS += $(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
tests_check_transform_LDADD += $(TURBOJPEG_LIBS) $(PNG_LIBS)
endif
endif
EXTRA_DIST += tests/data/gen_transform_refs.py tests/data/transform_refs.safetensors
# Token data: the tokens source over llm.c-format shards, the loader over
# it, the tokenizers (cli/tokenizer.c compiled in) against the reference of
# tests/data/gen_bpe_refs.py, and `kiln pack --format tokens`.
if HAVE_CHECK
if BUILD_LOADERS
check_PROGRAMS += tests/check_tokens
TESTS += tests/check_tokens
tests_check_tokens_SOURCES = tests/check_tokens.c cli/tokenizer.c cli/tokenizer.h
tests_check_tokens_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core \
	-DKILN_BIN='"$(abs_top_builddir)/kiln"'
tests_check_tokens_CFLAGS = $(CHECK_SUITE_CFLAGS) $(JANSSON_CFLAGS)
tests_check_tokens_LDADD = libkiln-internal.la $(CHECK_LIBS) $(JANSSON_LIBS)
endif
endif
EXTRA_DIST += tests/data_rig.h tests/data/gen_bpe_refs.py tests/data/bpe/vocab.json \
	tests/data/bpe/merges.txt tests/data/bpe/refs.json
# The records format and source: shards written with the format's writer
# and the image codecs (compiled in), `kiln pack` run on Fashion-MNIST.
if HAVE_CHECK
if BUILD_LOADERS
check_PROGRAMS += tests/check_records tests/check_sources
TESTS += tests/check_records tests/check_sources
tests_check_records_SOURCES = tests/check_records.c plugins/loaders/records_write.c \
	plugins/loaders/image.c
tests_check_records_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir) -DKILN_BIN='"$(abs_top_builddir)/kiln"'
tests_check_records_CFLAGS = $(CHECK_SUITE_CFLAGS) $(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
tests_check_records_LDADD = libkiln-internal.la $(CHECK_LIBS) $(TURBOJPEG_LIBS) $(PNG_LIBS)
tests_check_sources_SOURCES = tests/check_sources.c plugins/loaders/image.c
tests_check_sources_CFLAGS = $(CHECK_SUITE_CFLAGS) $(TURBOJPEG_CFLAGS) $(PNG_CFLAGS)
tests_check_sources_LDADD = libkiln.la $(CHECK_LIBS) $(TURBOJPEG_LIBS) $(PNG_LIBS) $(LMDB_LIBS)
# PNG and JPEG pixels against PIL's: tests/data/gen_png_refs.py and
# gen_jpeg_refs.py wrote the fixtures
check_PROGRAMS += tests/check_image
TESTS += tests/check_image
tests_check_image_SOURCES = tests/check_image.c plugins/loaders/image.c
tests_check_image_CFLAGS = $(CHECK_SUITE_CFLAGS) $(TURBOJPEG_CFLAGS) $(PNG_CFLAGS) $(ZLIB_CFLAGS)
tests_check_image_LDADD = libkiln.la $(CHECK_LIBS) $(TURBOJPEG_LIBS) $(PNG_LIBS) $(ZLIB_LIBS)
endif
endif
if BUILD_LOADERS
TESTS += tests/pack.sh
# --format folder: a class's directory made with its first image, the
# empty classes' at the end with a progress line (cli/pack_folder.c)
TESTS += tests/pack_folder_classes.sh
endif
EXTRA_DIST += tests/data/gen_png_refs.py tests/data/png/refs.txt \
	tests/data/png/gray_gamma10.png tests/data/png/gray_gamma055.png tests/data/png/rgb_gamma10.png \
	tests/data/png/rgb_srgb.png tests/data/png/gray_alpha.png tests/data/png/rgba.png \
	tests/data/png/palette_trns.png tests/data/png/gray2_trns.png tests/data/png/rgb_trns.png \
	tests/data/png/gray16_gamma10.png tests/data/png/rgba16.png tests/data/png/rgb_interlaced.png \
	tests/data/png/rgb16.png \
	tests/data/gen_jpeg_refs.py tests/data/jpeg/refs.txt tests/data/jpeg/clean.jpg \
	tests/data/jpeg/extra3.jpg tests/data/jpeg/extra_sos.jpg tests/data/jpeg/jfif201.jpg \
	tests/data/jpeg/cmyk.jpg tests/data/jpeg/ycck.jpg
EXTRA_DIST += tests/pack.sh tests/pack_folder_classes.sh
# kiln launch's and kiln pack's options by the parser every command shares
TESTS += tests/launch_pack_opts.sh
EXTRA_DIST += tests/launch_pack_opts.sh
# `kiln bench data`: the timed window holds the batches read in it
if BUILD_LOADERS
TESTS += tests/bench_data.sh
endif
EXTRA_DIST += tests/bench_data.sh
# kiln pack's in-place stamps under pwrites that fail with EINTR or write
# half (an LD_PRELOAD shim); the JSON lines' non-finite numbers as null
# (a stopped clock); kiln report past a 20 MB metrics.jsonl line
if BUILD_LOADERS
TESTS += tests/short_writes.sh tests/json_nonfinite.sh
endif
TESTS += tests/report_long_line.sh
EXTRA_DIST += tests/short_writes.sh tests/json_nonfinite.sh tests/report_long_line.sh
# the LD_PRELOAD shim of those tests and of oom_named.sh, alloc_fail.sh and
# idx_eintr.sh (failed allocations, cut pwrites and reads, a stopped clock;
# tests/lib.sh shim_build)
EXTRA_DIST += tests/shim_fault.c
# a failed allocation names its buffer and size: the sample orders of 3e9
# samples under ulimit -v, small buffers through an LD_PRELOAD shim
if BUILD_LOADERS
TESTS += tests/oom_named.sh tests/oom_named_dist.sh
endif
EXTRA_DIST += tests/oom_named.sh tests/oom_named_dist.sh
# a failed allocation (an LD_PRELOAD shim) is "out of memory", exit 1: the
# config's where strings, the layers' names
if BUILD_LOADERS
TESTS += tests/alloc_fail.sh
endif
EXTRA_DIST += tests/alloc_fail.sh
# a lookup that finds no plugin names the files that failed to load
TESTS += tests/plugin_junk.sh
EXTRA_DIST += tests/plugin_junk.sh
# the idx source reads through EINTR and short reads (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/idx_eintr.sh
endif
EXTRA_DIST += tests/idx_eintr.sh
# [model] init_from opened once: removed or replaced after that open, the
# file opened is read (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/init_from_once.sh
endif
EXTRA_DIST += tests/init_from_once.sh
# a weights file (safetensors, llm.c's, an INT8 model) cut short while kiln
# reads it: exit 3 naming the tensor, not SIGBUS (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/st_truncate.sh
endif
EXTRA_DIST += tests/st_truncate.sh
# a 4 GiB safetensors file (sparse) under `ulimit -v 2000000`: read, not
# mapped (before session 40: "cannot map", exit 1)
if BUILD_LOADERS
TESTS += tests/st_vmem.sh
endif
EXTRA_DIST += tests/st_vmem.sh
# --checkpoint F and --quantized Q opened once: replaced after that open,
# the file opened is read (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/checkpoint_once.sh
endif
EXTRA_DIST += tests/checkpoint_once.sh
# eval, export, predict and generate do not open the training set when the
# checkpoint records its sample shape (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/trained_no_data.sh
endif
EXTRA_DIST += tests/trained_no_data.sh
# the input shape with a safetensors file from [data]'s peek (a set cut past
# its header), with an INT8 file from its kiln.sample ([data] gone)
if BUILD_LOADERS
TESTS += tests/weights_no_data.sh
endif
EXTRA_DIST += tests/weights_no_data.sh
# an INT8 model's CRC32Cs (kiln.crc32c, session 40): a flipped bit in any
# tensor or the header refused naming the file; a file without them loads
if BUILD_LOADERS
TESTS += tests/int8_crc.sh
endif
EXTRA_DIST += tests/int8_crc.sh tests/st_mut.py
# an fp32 export's CRC32Cs (kiln.crc32c, session 41): a flipped bit in any
# tensor refused by predict, eval and init_from; a file without them loads
if BUILD_LOADERS
TESTS += tests/export_crc.sh
endif
EXTRA_DIST += tests/export_crc.sh
# a resume refused at setup leaves config.ini as it was
TESTS += tests/resume_config.sh
EXTRA_DIST += tests/resume_config.sh
# `kiln generate` on a GPT trained for a few steps (the tokens source)
if BUILD_LOADERS
TESTS += tests/generate.sh
endif
EXTRA_DIST += tests/generate.sh
# `kiln generate` on a device without ATTENTION_DECODE (a CPU stand-in)
if BUILD_LOADERS
TESTS += tests/generate_device.sh
endif
EXTRA_DIST += tests/generate_device.sh
# a device built for ABI 2.28 (the same stand-in) asked for no dampening,
# amsgrad or schedule of 2.29 / 2.30: refused, naming the key; the rest trains
if BUILD_LOADERS
TESTS += tests/optim_old_abi.sh
endif
EXTRA_DIST += tests/optim_old_abi.sh
# a data file that cannot be opened names its config key's file:line;
# `kiln summary` opens the training data alone
if BUILD_LOADERS
TESTS += tests/data_paths.sh
endif
EXTRA_DIST += tests/data_paths.sh
# on_error = skip's count: not the workers = auto probe's, continued by a resume
TESTS += tests/data_skip_count.sh
EXTRA_DIST += tests/data_skip_count.sh
# a tokens or records shard truncated under a run: exit 3 naming it (and
# skipped with on_error = skip), not SIGBUS
if BUILD_LOADERS
TESTS += tests/shard_truncate.sh
endif
EXTRA_DIST += tests/shard_truncate.sh
# lstm/gru config errors a plan meets: pad_id with one input, bf16 compute
# (and bf16's multiple-of-8 warning: the head's weight alone)
if BUILD_LOADERS
TESTS += tests/rnn_config.sh
endif
EXTRA_DIST += tests/rnn_config.sh
# a sequence classifier on lstm's final hidden state (last = 1): learns,
# kiln eval agrees, the summary's [B, H]
if BUILD_LOADERS
TESTS += tests/rnn_last.sh
endif
EXTRA_DIST += tests/rnn_last.sh
# [layer.X] recompute = 1 on lstm/gru feeding a concat: their saved state
# recomputed, the same bytes; where the key frees nothing, a warning
if BUILD_LOADERS
TESTS += tests/rnn_recompute.sh
endif
EXTRA_DIST += tests/rnn_recompute.sh

# ---- device: the conformance suites, one per op family around one fixture
# (tests/device_fixture.c), each op against reference loops; the same
# suites on the CUDA device (tests/device_cuda.sh: SKIP without a GPU) -----
if HAVE_CHECK
DEVICE_SUITES = tests/check_device_gemm tests/check_device_loss tests/check_device_optim \
	tests/check_device_elementwise tests/check_device_conv tests/check_device_norm \
	tests/check_device_stream tests/check_device_lowp \
	tests/check_device_transformer tests/check_device_attention tests/check_device_threads
check_LTLIBRARIES += tests/libdevice_fixture.la
tests_libdevice_fixture_la_SOURCES = tests/device_fixture.c tests/device_fixture.h
tests_libdevice_fixture_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)
tests_libdevice_fixture_la_CFLAGS = $(CHECK_SUITE_CFLAGS)
DEVICE_SUITE_CPPFLAGS = $(AM_CPPFLAGS) -DSRCDIR='"$(abs_top_srcdir)"'
DEVICE_SUITE_LDADD = tests/libdevice_fixture.la libkiln.la $(CHECK_LIBS) -lm
# (the suites that call the core's internal functions: libkiln-internal,
# core/local.mk; the others link what a program gets, libkiln)
DEVICE_SUITE_INTERNAL_LDADD = tests/libdevice_fixture.la libkiln-internal.la $(CHECK_LIBS) -lm
check_PROGRAMS += $(DEVICE_SUITES)
TESTS += $(DEVICE_SUITES)
tests_check_device_gemm_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_gemm_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_device_gemm_LDADD = $(DEVICE_SUITE_INTERNAL_LDADD)
tests_check_device_loss_CPPFLAGS = $(DEVICE_SUITE_CPPFLAGS)
tests_check_device_loss_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_loss_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_optim_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_optim_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_device_optim_LDADD = $(DEVICE_SUITE_INTERNAL_LDADD)
tests_check_device_elementwise_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_elementwise_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_conv_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_conv_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_norm_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_norm_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_stream_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_stream_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_lowp_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_lowp_LDADD = $(DEVICE_SUITE_LDADD)
# the transformer layers and ops against PyTorch and finite differences
tests_check_device_transformer_CPPFLAGS = $(DEVICE_SUITE_CPPFLAGS)
tests_check_device_transformer_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_transformer_LDADD = $(DEVICE_SUITE_LDADD)
tests_check_device_attention_CPPFLAGS = $(DEVICE_SUITE_CPPFLAGS)
tests_check_device_attention_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_attention_LDADD = $(DEVICE_SUITE_LDADD)
# kiln's own reductions: the same bytes for 1 to 4 threads
tests_check_device_threads_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_threads_LDADD = $(DEVICE_SUITE_LDADD)
if BUILD_CUDA
TESTS += tests/device_cuda.sh
endif
endif
EXTRA_DIST += tests/device_cuda.sh tests/data/gen_loss_refs.py tests/data/loss_refs.txt
EXTRA_DIST += tests/data/gen_transformer_refs.py tests/data/transformer_refs.safetensors
EXTRA_DIST += tests/data/gen_attention_refs.py tests/data/attention_refs.safetensors
# The CUDA device's pure pieces (plugins/cuda/kern.h) on the host: no GPU,
# no CUDA headers needed, so it runs on every machine; and its host-only
# convolution logic (plugins/cuda/dnn_map.c: strides, geometry, autotune
# keys and cache file): no CUDA needed either.
if HAVE_CHECK
check_PROGRAMS += tests/check_cuda_host tests/check_cuda_dnn
TESTS += tests/check_cuda_host tests/check_cuda_dnn
tests_check_cuda_host_SOURCES = tests/check_cuda_host.c plugins/cuda/kern.h plugins/cuda/qkern.h
tests_check_cuda_host_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cuda_host_LDADD = libkiln.la $(CHECK_LIBS) -lm
tests_check_cuda_dnn_SOURCES = tests/check_cuda_dnn.c plugins/cuda/dnn_map.c plugins/cuda/dnn_map.h
tests_check_cuda_dnn_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/plugins/cuda
tests_check_cuda_dnn_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cuda_dnn_LDADD = $(CHECK_LIBS)
# kiln-nccl's point-to-point calls (plugins/nccl/nccl.c compiled in) against
# a recording NCCL and CUDA defined by the test: no GPU, no libnccl.
if BUILD_NCCL
check_PROGRAMS += tests/check_nccl_group
TESTS += tests/check_nccl_group
tests_check_nccl_group_SOURCES = tests/check_nccl_group.c plugins/common/watchdog.c
tests_check_nccl_group_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_check_nccl_group_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_nccl_group_LDADD = libkiln-internal.la $(CHECK_LIBS) -lpthread
# kiln-nccl.so itself on one GPU, a communicator of one rank: every
# collective, the barrier, split (tests/gpu/run.sh's stage 1); exit 77
# (skip) without a GPU
check_PROGRAMS += tests/check_nccl_one
TESTS += tests/check_nccl_one
tests_check_nccl_one_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_nccl_one_LDADD = libkiln.la $(CHECK_LIBS)
endif
endif
# Its cuDNN descriptors, finalized by cuDNN on a machine without a GPU
# (cuda_dnn_conv_check): built when configure found cuDNN.
if HAVE_CHECK
if HAVE_CUDNN
check_PROGRAMS += tests/check_cuda_conv
TESTS += tests/check_cuda_conv
tests_check_cuda_conv_SOURCES = tests/check_cuda_conv.c $(CUDA_DEVICE_C)
tests_check_cuda_conv_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/plugins/cuda \
	-DKILN_CUDA_MIN_ARCH=$(CUDA_MIN_ARCH)
tests_check_cuda_conv_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cuda_conv_LDADD = $(CUDA_KERNEL_OBJS) libkiln.la \
	$(CHECK_LIBS) $(CUDA_LIBS) -lm
tests_check_cuda_conv_LDFLAGS = $(CUDA_LDFLAGS)
endif
endif
# The GPU check (tests/gpu/run.sh, docs/gpu.md): the conformance suites,
# training and timings on a GPU machine.
EXTRA_DIST += tests/gpu/run.sh tests/gpu/mlp.ini tests/gpu/torch_mlp.py tests/gpu/cnn.ini \
	tests/gpu/gemm_mlp.ini tests/gpu/torch_bench.py tests/gpu/counts.ini

# ---- layers and graph: layers against PyTorch, the graph and planner -----
if HAVE_CHECK
check_PROGRAMS += tests/check_layers tests/check_graph
TESTS += tests/check_layers tests/check_graph
tests_check_layers_CFLAGS = $(CHECK_SUITE_CFLAGS) $(JANSSON_CFLAGS)
tests_check_layers_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_layers_LDADD = libkiln-internal.la $(CHECK_LIBS) $(JANSSON_LIBS) -lm
tests_check_graph_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_graph_LDADD = libkiln.la $(CHECK_LIBS) -lm
# counter-based draws past 32 bits: initial weights, dropout's step, the
# probe's order (no GPU, no plugins)
check_PROGRAMS += tests/check_rng
TESTS += tests/check_rng
tests_check_rng_SOURCES = tests/check_rng.c plugins/cpu/philox.h
tests_check_rng_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_rng_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_rng_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
EXTRA_DIST += tests/data/gen_layer_refs.py tests/data/layer_refs.safetensors
# the attention layer: input gradients by finite differences, its errors
if HAVE_CHECK
check_PROGRAMS += tests/check_attention
TESTS += tests/check_attention
tests_check_attention_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_attention_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# generation: the decode plan's logits against the full forward, sampling,
# top-p, several samples at once
if HAVE_CHECK
check_PROGRAMS += tests/check_generate
TESTS += tests/check_generate
tests_check_generate_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core -DSRCDIR='"$(abs_top_srcdir)"'
tests_check_generate_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_generate_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
# top-p against HuggingFace's TopPLogitsWarper (torch 1.13)
EXTRA_DIST += tests/data/gen_top_p_refs.py tests/data/top_p_refs.txt

# ---- training and checkpoints: the trainer, optimizers and schedules
# against PyTorch, mixed precision, the profiler, safetensors, checkpoints
# and kill/resume ------------------------------------------------------------
if HAVE_CHECK
check_PROGRAMS += tests/check_train tests/check_optim tests/check_sched tests/check_amp \
	tests/check_profile tests/check_safetensors tests/check_ckpt
TESTS += tests/check_train tests/check_optim tests/check_sched tests/check_amp \
	tests/check_profile tests/check_safetensors tests/check_ckpt
tests_check_train_CFLAGS = $(CHECK_SUITE_CFLAGS) $(JANSSON_CFLAGS)
tests_check_train_LDADD = libkiln.la $(CHECK_LIBS) $(JANSSON_LIBS) -lm
tests_check_optim_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_optim_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_optim_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
tests_check_sched_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core -DSRCDIR='"$(abs_top_srcdir)"'
tests_check_sched_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_sched_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
tests_check_amp_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_amp_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_amp_LDADD = libkiln-internal.la $(CHECK_LIBS)
tests_check_profile_CFLAGS = $(CHECK_SUITE_CFLAGS) $(JANSSON_CFLAGS)
tests_check_profile_LDADD = libkiln-internal.la $(CHECK_LIBS) $(JANSSON_LIBS) -lm
check_PROGRAMS += tests/check_api_null
TESTS += tests/check_api_null
tests_check_api_null_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_api_null_LDADD = libkiln.la $(CHECK_LIBS)
tests_check_safetensors_CPPFLAGS = $(AM_CPPFLAGS) -DKILN_BIN='"$(abs_top_builddir)/kiln"'
tests_check_safetensors_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_safetensors_LDADD = libkiln.la $(CHECK_LIBS) -lm
tests_check_ckpt_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core $(TEST_PLUGIN_DIRS)
tests_check_ckpt_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_ckpt_LDADD = libkiln-internal.la $(CHECK_LIBS)
# keep_best's list, early stopping and a cut evaluation across a resume
check_PROGRAMS += tests/check_resume_evals
TESTS += tests/check_resume_evals
tests_check_resume_evals_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_resume_evals_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_resume_evals_LDADD = libkiln-internal.la $(CHECK_LIBS)
# metric sums and clip counts exact past 2^24 (session 37)
check_PROGRAMS += tests/check_count_exact
TESTS += tests/check_count_exact
tests_check_count_exact_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_count_exact_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_count_exact_LDADD = libkiln-internal.la $(CHECK_LIBS)
# a run resumed from a keep_best checkpoint goes on as the uninterrupted one
check_PROGRAMS += tests/check_resume_best
TESTS += tests/check_resume_best
tests_check_resume_best_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_resume_best_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_resume_best_LDADD = libkiln-internal.la $(CHECK_LIBS)
endif
EXTRA_DIST += tests/data/mlp_ref.safetensors tests/data/gen_mlp_ref.py tests/data/README.md \
	tests/data/safetensors_io.py tests/data/gen_sched_refs.py tests/data/sched_refs.txt tests/data/gen_plateau_refs.py tests/data/plateau_refs.txt \
	tests/data/gen_optim_refs.py tests/data/optim_refs.safetensors
# PyTorch loads kiln's export (skipped without /usr/bin/python3 + torch);
# the checkpoint tool of the kill/resume and distributed scripts
check_PROGRAMS += tests/st_export_test tests/ckpt_tool
tests_st_export_test_LDADD = libkiln.la -lm
tests_ckpt_tool_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_ckpt_tool_LDADD = libkiln-internal.la
TESTS += tests/safetensors_torch.sh tests/profile.sh tests/memory.sh tests/resume_kill.sh
# inference holds the weights alone (docs/memory.md)
TESTS += tests/memory_infer.sh
EXTRA_DIST += tests/memory_infer.sh
# batch = auto and set batches under ulimit -v: no SIGSEGV, the batch
# chosen trains (docs/memory.md, "Under ulimit -v")
TESTS += tests/memory_rlimit.sh
EXTRA_DIST += tests/memory_rlimit.sh tests/rlimit_lib.sh tests/data/wide_conv.ini
# kiln memory counts the input slots of the batches that will run
# ([train] eval = 0: not eval_batch's)
TESTS += tests/memory_eval_off.sh
EXTRA_DIST += tests/memory_eval_off.sh
# the FFT convolution's oneDNN GEMMs and FFTW plans under ulimit -v: an
# error, never a signal (plugins/cpu/fftconv.c fc_plans)
TESTS += tests/memory_rlimit_fft.sh
EXTRA_DIST += tests/memory_rlimit_fft.sh tests/data/fft_convs.ini
# OpenBLAS left out where ulimit -v is below what it maps as it loads:
# a run and a line saying so, not a hang (plugins/cpu/openblas.c)
TESTS += tests/openblas_rlimit.sh
EXTRA_DIST += tests/openblas_rlimit.sh
# OpenBLAS's kernels on a CPU with AVX-512 or AVX2 are not Prescott's,
# where OpenBLAS does not know the CPU (plugins/cpu/openblas.c)
TESTS += tests/openblas_core.sh
EXTRA_DIST += tests/openblas_core.sh
# a program that loaded OpenBLAS before kiln keeps its core, its pthread
# pool and its GEMMs' numbers (plugins/cpu/openblas.c)
check_PROGRAMS += tests/openblas_host
tests_openblas_host_SOURCES = tests/openblas_host.c
tests_openblas_host_LDADD = libkiln.la -ldl -lm
TESTS += tests/openblas_host.sh
EXTRA_DIST += tests/openblas_host.sh
# batch = auto with a memory_limit above what ulimit -v leaves: the
# smaller bounds it
TESTS += tests/memory_limit_rlimit.sh
EXTRA_DIST += tests/memory_limit_rlimit.sh
EXTRA_DIST += tests/safetensors_torch.sh tests/data/gen_safetensors_refs.py tests/data/st_cnn.ini \
	tests/data/st_cnn_torch.safetensors tests/data/st_cnn_io.safetensors \
	tests/profile.sh tests/memory.sh tests/resume_kill.sh
# a SIGKILL at a chosen rename or unlink (strace) around the run's last
# checkpoint: an early stop's numbers, keep_last's prune, its event
TESTS += tests/resume_last_kill.sh
EXTRA_DIST += tests/resume_last_kill.sh
# a resume between two log points: the interval's sums go on (its first
# train row, the epoch's train_loss), on 1 process, 2 ranks, ZeRO-1 and
# pipeline stages, and on another world size
TESTS += tests/resume_interval.sh
EXTRA_DIST += tests/resume_interval.sh
# [train] accumulate changed on resume (session 40)
TESTS += tests/resume_accumulate.sh
EXTRA_DIST += tests/resume_accumulate.sh
# trained weights kept, exported, fine-tuned: against PyTorch's (issue 24)
TESTS += tests/trained_export.sh tests/rough_edges.sh tests/resume_knobs.sh tests/config_amp.sh
EXTRA_DIST += tests/trained_export.sh tests/rough_edges.sh tests/resume_knobs.sh tests/config_amp.sh \
	tests/data/tr_cnn_fp16_s29.kiln tests/data/gen_trained_refs.py tests/data/tr_cnn.ini \
	tests/data/tr_cnn_images.idx tests/data/tr_cnn_labels.idx tests/data/tr_cnn_init.safetensors \
	tests/data/tr_cnn_trained.safetensors tests/data/tr_cnn_finetuned.safetensors
# non-finite weights: not trained on, checkpointed or evaluated (session 30)
TESTS += tests/nonfinite_weights.sh
EXTRA_DIST += tests/nonfinite_weights.sh
# a NaN loss in metrics.jsonl, the CSV tables, keep_best and early stopping
# (session 39)
TESTS += tests/nonfinite_logs.sh
EXTRA_DIST += tests/nonfinite_logs.sh
# the gradients' check where the backward makes them: the one pass's bits
# (session 44)
TESTS += tests/grad_sums.sh
EXTRA_DIST += tests/grad_sums.sh
# thread-affine optimizer updates: the same bits as the old split (session 50)
TESTS += tests/affine.sh
EXTRA_DIST += tests/affine.sh
# finite gradients whose squares overflow f32: stepped as PyTorch's (session 39)
TESTS += tests/grad_overflow.sh
EXTRA_DIST += tests/grad_overflow.sh tests/data/gen_grad_overflow_refs.py \
	tests/data/grad_overflow_refs.safetensors
TESTS += tests/cache_home.sh
EXTRA_DIST += tests/cache_home.sh
TESTS += tests/progress_tty.sh
EXTRA_DIST += tests/progress_tty.sh
# the schedule's length after a resume that changed the global batch
# (session 38)
TESTS += tests/resume_batch_schedule.sh
EXTRA_DIST += tests/resume_batch_schedule.sh
# [train] schedule = exponential, linear, polynomial and onecycle's
# three_phase and anneal_strategy through the trainer against PyTorch's
# schedulers, resumed mid-schedule (session 43)
TESTS += tests/sched_torch.sh
EXTRA_DIST += tests/sched_torch.sh
# [train] schedule = plateau through the trainer; its state across resumes
# and a SIGKILL (session 43)
TESTS += tests/sched_plateau.sh
EXTRA_DIST += tests/sched_plateau.sh

# ---- CLI and docs: the commands, the examples, the documents' claims -----
TESTS += tests/cli.sh tests/docs.sh
if BUILD_LOADERS
TESTS += tests/examples.sh
endif
EXTRA_DIST += tests/cli.sh tests/docs.sh tests/examples.sh

# ---- distributed: the rendezvous store, the communicators, multi-process
# training -------------------------------------------------------------------
if HAVE_CHECK
check_PROGRAMS += tests/check_store
TESTS += tests/check_store
tests_check_store_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_store_LDADD = libkiln-internal.la $(CHECK_LIBS)
# the heartbeat and the watchdog against a wall-clock step (the program
# defines clock_gettime to step CLOCK_REALTIME)
check_PROGRAMS += tests/check_clockstep
TESTS += tests/check_clockstep
tests_check_clockstep_SOURCES = tests/check_clockstep.c plugins/common/watchdog.c
tests_check_clockstep_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_clockstep_LDADD = libkiln-internal.la $(CHECK_LIBS) -lpthread
# what the heartbeat tells a rank whose collective timed out (session 32)
check_PROGRAMS += tests/check_heartbeat
TESTS += tests/check_heartbeat
tests_check_heartbeat_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_heartbeat_LDADD = libkiln-internal.la $(CHECK_LIBS) -lpthread
# what a rank leaving unfinished tells its peers: the FAILED mark, not for
# a peer's lateness, within 5 s on a store that stopped (session 35)
check_PROGRAMS += tests/check_dist_close
TESTS += tests/check_dist_close
tests_check_dist_close_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_dist_close_LDADD = libkiln-internal.la $(CHECK_LIBS) -lpthread
# the Gloo communicator's hot path allocates nothing (counts every malloc
# of the process: the executable defines the allocator's entry points)
check_PROGRAMS += tests/check_comm
TESTS += tests/check_comm
tests_check_comm_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_comm_LDADD = libkiln-internal.la $(CHECK_LIBS) -lpthread
tests_check_comm_LDFLAGS = -rdynamic
# the shared-memory channel itself (plugins/common/shmp2p.c, compiled in):
# pieces, wraps, both ways at once, sleepers woken, a size mismatch
check_PROGRAMS += tests/check_shmp2p
TESTS += tests/check_shmp2p
tests_check_shmp2p_SOURCES = tests/check_shmp2p.c plugins/common/shmp2p.c \
	plugins/common/shmp2p.h plugins/common/watchdog.c plugins/common/watchdog.h \
	plugins/common/shmcoll.c plugins/common/shmcoll.h plugins/common/half.h
tests_check_shmp2p_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_shmp2p_LDADD = libkiln.la $(CHECK_LIBS) -lpthread
endif
# multi-process: kiln launch, gloo, equivalence, resume on other world
# sizes, a dead rank, a rendezvous timeout (needs kiln-gloo.so: skips
# without it)
TESTS += tests/dist.sh tests/dist_blame.sh tests/dist_suspend.sh tests/dist_config.sh tests/dist_config_oom.sh tests/gloo_shm_leak.sh
EXTRA_DIST += tests/dist.sh tests/dist_blame.sh tests/dist_suspend.sh tests/dist_config.sh tests/dist_config_oom.sh tests/dist_common.sh tests/gloo_shm_leak.sh
# a survivor of a peer's failure does not take it for its own (session 40)
TESTS += tests/dist_blame_own.sh
EXTRA_DIST += tests/dist_blame_own.sh
# bad training data under 2 ranks: the failing rank named, the skips summed
TESTS += tests/dist_data.sh
EXTRA_DIST += tests/dist_data.sh
# ranks started by hand that differ: heartbeats, one's own failure, data sizes
TESTS += tests/dist_rank_differ.sh
EXTRA_DIST += tests/dist_rank_differ.sh
# the ranks' data identities agree though one rank's reads are cut short
# (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/data_id_short_reads.sh
endif
EXTRA_DIST += tests/data_id_short_reads.sh
# [plugin.cpu] async = auto: off for one process, on for each rank
TESTS += tests/cpu_async.sh
EXTRA_DIST += tests/cpu_async.sh
# a fixed CPU team whose threads keep waiting for a CPU says so once
TESTS += tests/cpu_team_hint.sh
EXTRA_DIST += tests/cpu_team_hint.sh
# 2-rank DDP against PyTorch 2.x's DDP, loss for loss (skips without
# $KILN_VENV's torch 2)
TESTS += tests/ddp_torch.sh
EXTRA_DIST += tests/ddp_torch.sh
TESTS += tests/dist_zero.sh
EXTRA_DIST += tests/dist_zero.sh
# amsgrad's and SGD's dampening's state: resumed bit for bit, under ZeRO-1,
# an adam checkpoint of before amsgrad (session 43; optim_resume.sh: one
# process on tests/data, where gloo or Fashion-MNIST is missing)
TESTS += tests/optim_state.sh tests/optim_resume.sh
EXTRA_DIST += tests/optim_state.sh tests/optim_resume.sh tests/data/tr_cnn_adam_s42.kiln
# the optimizer state below FLT_MIN stored as zero on the AVX2 clone of the
# cpu kernels too (check_device_optim's subnormal_state under valgrind's CPU)
if HAVE_CHECK
TESTS += tests/optim_subnormal_avx2.sh
endif
EXTRA_DIST += tests/optim_subnormal_avx2.sh
TESTS += tests/dist_syncbn.sh
EXTRA_DIST += tests/dist_syncbn.sh
TESTS += tests/dist_accum.sh
EXTRA_DIST += tests/dist_accum.sh
# the same equivalence under mpirun with the mpi plugin (skips without it)
TESTS += tests/dist_mpi.sh
EXTRA_DIST += tests/dist_mpi.sh
# the MPI communicator's collectives element by element, under mpirun with
# 2-4 ranks, kiln's shared-memory collectives on and off (skips without
# the mpi plugin or mpirun)
check_PROGRAMS += tests/mpi_coll
tests_mpi_coll_SOURCES = tests/mpi_coll.c
tests_mpi_coll_LDADD = libkiln.la -lm
tests_mpi_coll_LDFLAGS = -rdynamic
TESTS += tests/mpi_coll.sh
EXTRA_DIST += tests/mpi_coll.sh
# ZeRO-1 with that plugin optimizer equals DDP (needs kiln-gloo.so)
TESTS += tests/dist_zero_lion.sh
EXTRA_DIST += tests/dist_zero_lion.sh
TESTS += tests/dist_zero_mem.sh
EXTRA_DIST += tests/dist_zero_mem.sh
# weight tying ([layer.X] tie = Y): resume, export, DDP and ZeRO-1 with a
# tied weight (the PyTorch reference is check_train's `tie` case)
TESTS += tests/tie.sh
EXTRA_DIST += tests/tie.sh tests/data/gen_tie_refs.py tests/data/tie_refs.safetensors
# a checkpoint of the older layout of a tie naming a later layer, read by
# name: resume, eval, predict, export, init_from, ZeRO-1 and stages
TESTS += tests/tie_old_ckpt.sh
EXTRA_DIST += tests/tie_old_ckpt.sh
# a checkpoint of another set of frozen layers, or its buffers in another
# order, read by name: init_from both ways, eval, export
TESTS += tests/ckpt_frozen.sh
EXTRA_DIST += tests/ckpt_frozen.sh

# ---- loggers: TensorBoard framing and event files, CSV, metrics.jsonl ----
# check_log reads the event files back through its own copy of the
# protobuf-c code generated from core/proto (libkiln exports only kiln_*).
if HAVE_CHECK
check_PROGRAMS += tests/check_log
TESTS += tests/check_log
tests_check_log_SOURCES = tests/check_log.c
nodist_tests_check_log_SOURCES = $(KILN_PROTO_C) $(KILN_PROTO_H)
tests_check_log_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir) $(JANSSON_CFLAGS) $(PROTOBUF_C_CFLAGS)
tests_check_log_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_log_LDADD = libkiln-internal.la $(CHECK_LIBS) $(JANSSON_LIBS) $(PROTOBUF_C_LIBS) -lm
endif
# a small MLP's run (and a resumed copy) with every logger: CSV and
# TensorBoard's reader (skipped without the tensorboard package) against
# metrics.jsonl; a 2-rank run writes one set of files
TESTS += tests/log_csv.sh tests/log_tensorboard.sh tests/log_dist.sh
EXTRA_DIST += tests/log_csv.sh tests/log_tensorboard.sh tests/log_dist.sh tests/log_common.sh \
	tests/log_check.py
# eval_every's evaluation after a last step off its points: logged (eval
# line, eval.csv; [data.val]'s), once across resumes, kept by nothing
TESTS += tests/eval_every_last.sh
EXTRA_DIST += tests/eval_every_last.sh
# an evaluation's loss and accuracy: one mean over the set's tokens not
# ignored, the same at eval_batch 7, 64 and 1000 and equal to Python's
TESTS += tests/eval_token_mean.sh
EXTRA_DIST += tests/eval_token_mean.sh
# a Latin-1 out_dir's checkpoint, best and out_dir_lost records (U+FFFD
# for its byte)
TESTS += tests/jsonl_paths.sh
EXTRA_DIST += tests/jsonl_paths.sh
# the train lines', epoch's and final samples/s leave slow checkpoint
# writes out (KILN_TEST_CKPT_DELAY_MS); wall_s and checkpoint_s keep them
TESTS += tests/log_rates.sh
EXTRA_DIST += tests/log_rates.sh

# ---- kiln summary (torchinfo's numbers from PyTorch twins of the examples)
# and kiln report (rendered by headless Chromium; skips without it) ---------
TESTS += tests/summary.sh tests/report.sh
EXTRA_DIST += tests/summary.sh tests/report.sh tests/data/gen_summary_refs.py tests/data/summary_refs.txt
# kiln report's metrics.jsonl reader and charts (cli/report_metrics.c,
# cli/report_svg.c compiled in): hostile ranges in bounded time,
# series names of any length, counts and points
if HAVE_CHECK
check_PROGRAMS += tests/check_report
TESTS += tests/check_report
tests_check_report_SOURCES = tests/check_report.c cli/report_metrics.c cli/report_svg.c cli/report.h
tests_check_report_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_check_report_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_report_LDADD = libkiln.la $(CHECK_LIBS) $(JANSSON_LIBS)
endif

# a 2-layer GPT-2's first 5 AdamW steps (losses, step-1 gradients, final
# weights) against PyTorch's (tests/data/gen_gpt_refs.py); the training
# features (accumulation, recompute, resume, clipping, schedule, bf16,
# memory, profiler) on it
TESTS += tests/gpt_steps.sh tests/gpt.sh
# pipeline stages and micro-batches (issue 21, docs/pipeline.md)
if HAVE_CHECK
check_PROGRAMS += tests/check_pipeline
TESTS += tests/check_pipeline
tests_check_pipeline_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_pipeline_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_pipeline_LDADD = libkiln-internal.la $(CHECK_LIBS)
# the planner: scratch for shared gradients, evaluation plans' ops,
# references to emptied storages (core/plan.c, core/plan_memory.c)
check_PROGRAMS += tests/check_plan
TESTS += tests/check_plan
tests_check_plan_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_plan_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_plan_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
TESTS += tests/pipeline.sh
EXTRA_DIST += tests/pipeline.sh
# pipeline stages on devices of their own sharing one CPU (taskset -c 0): the
# stage threads' waits give the core up, the run ends byte for byte; the waits'
# tally; bench/pipeline.sh's models in one short round
TESTS += tests/pipeline_one_cpu.sh
EXTRA_DIST += tests/pipeline_one_cpu.sh
# [pipeline] defer_wgrad: the linear layers' weight gradients deferred to the
# stage's side stream; parameters byte for byte those of the backward whole
TESTS += tests/pipeline_wgrad.sh
EXTRA_DIST += tests/pipeline_wgrad.sh
# a loss layer plugin built before ABI 2.23 where the loss seed is a mean
TESTS += tests/loss_plugin_abi.sh
EXTRA_DIST += tests/loss_plugin_abi.sh
TESTS += tests/pipe_close_held.sh
EXTRA_DIST += tests/pipe_close_held.sh
EXTRA_DIST += tests/gpt_steps.sh tests/gpt.sh tests/data/gen_gpt_refs.py tests/data/gpt_tiny.ini \
	tests/data/gpt_tokens.bin tests/data/gpt_init.safetensors tests/data/gpt_refs.safetensors
# bf16 keeps a token model's residual stream f32, as autocast does: the
# embedding's gradient at rows of a large offset against PyTorch's
# (tests/data/gen_bf16_offset_refs.py)
TESTS += tests/bf16_offset.sh
EXTRA_DIST += tests/bf16_offset.sh tests/data/gen_bf16_offset_refs.py tests/data/bf16_offset.ini \
	tests/data/bf16_offset_tokens.bin tests/data/bf16_offset_init_0.safetensors \
	tests/data/bf16_offset_init_50.safetensors tests/data/bf16_offset_refs.safetensors

# Hostile input and a reused run directory (issue 25: findings 1, 2, 6, 7).
TESTS += tests/hostile.sh
EXTRA_DIST += tests/hostile.sh
# Output files and standard streams in a hostile environment (session 30).
TESTS += tests/hostile_io.sh
EXTRA_DIST += tests/hostile_io.sh
# A fresh run keeps the [model] init_from it would delete with the run it
# replaces; a checkpoint named for another step than it holds is no
# checkpoint of that step (session 39).
TESTS += tests/out_dir_init_from.sh tests/ckpt_misnamed.sh
EXTRA_DIST += tests/out_dir_init_from.sh tests/ckpt_misnamed.sh
# the run directory removed mid-run, a failed tokens pack, best/'s stale
# temporaries, blocked paths, config.ini and the profiler's files (session 33)
TESTS += tests/run_files.sh
EXTRA_DIST += tests/run_files.sh
# Multi-process tests start ranks themselves (torchrun-style variables,
# mpirun): the store's shared secret they all present (core/store.h).
AM_TESTS_ENVIRONMENT += KILN_STORE_TOKEN=kiln-tests-0123456789abcdef; export KILN_STORE_TOKEN;

# One graceful stop per rank under kiln launch; the store under hostile
# clients (tests/store_client.py speaks its wire format); plugins loaded
# lazily, a config's plugin_path only with an opt-in; kiln train's stop
# signals taken by a thread of their own, never by a computing thread.
# Who is rank r at the rendezvous: a refused second rank 1 writes none of
# its keys; a rank started again while the others wait joins them.
TESTS += tests/store_claims.sh
EXTRA_DIST += tests/store_claims.sh
# a rank's host going down at the rendezvous: network namespaces (root)
TESTS += tests/store_netns.sh
EXTRA_DIST += tests/store_netns.sh
# a stop reaching a wrapped rank command's trainer (its process group);
# a live rank's link blipping at the rendezvous (netns, root)
TESTS += tests/launch_group.sh tests/store_blip.sh
EXTRA_DIST += tests/launch_group.sh tests/store_blip.sh
# a link cut while Gloo connects its TCP mesh (netns, root)
TESTS += tests/gloo_mesh_cut.sh
EXTRA_DIST += tests/gloo_mesh_cut.sh
TESTS += tests/launch_signal.sh tests/store_abuse.sh tests/plugin_lazy.sh tests/stop_signal.sh tests/stop_setup.sh tests/loader_start.sh \
	tests/loader_consumer.sh
EXTRA_DIST += tests/launch_signal.sh tests/store_abuse.sh tests/store_client.py tests/stop_signal.sh tests/stop_setup.sh tests/loader_start.sh \
	tests/plugin_lazy.sh tests/loader_consumer.sh
# GPT-2's weight files: Hugging Face's layouts in and out, llm.c's model
# A stop during an evaluation ends it within a batch, with the stop's
# checkpoint (one that resumes).  A failure during the evaluations after
# the last step leaves the run's last checkpoint.
TESTS += tests/stop_eval.sh tests/final_eval_fail.sh
EXTRA_DIST += tests/stop_eval.sh tests/final_eval_fail.sh
# tests/lib.sh's wait_line: its time out kills the job's whole tree
TESTS += tests/lib_wait_line.sh
EXTRA_DIST += tests/lib_wait_line.sh
# --checkpoint F.safetensors in eval, export, predict; another sample shape
# than the checkpoint's warned of.
TESTS += tests/weights_checkpoint.sh
EXTRA_DIST += tests/weights_checkpoint.sh
# GPT-2's weight files: Hugging Face's layouts in and out, llm.c's model
# file in (tests/data/gen_gpt2_io_refs.py)
TESTS += tests/gpt2_io.sh
EXTRA_DIST += tests/gpt2_io.sh tests/data/gen_gpt2_io_refs.py tests/data/gpt2_hf.safetensors \
	tests/data/gpt2_hf_bare.safetensors tests/data/gpt2_llmc.bin tests/data/gpt2_io_refs.safetensors
# [run] fuse: fused and unfused runs give the same numbers (MLP, CNN in
# both layouts, conv/linear-batchnorm-ReLU, bf16, recompute; GELU in
# evaluation), and the profile and `kiln memory` show the fusion happen
TESTS += tests/fuse.sh
# bf16 NCHW convs keep their blocked copies in the kernel dtype; a
# consumer of another kernel dtype reads the tensor as it is
TESTS += tests/conv_kept_bf16.sh
EXTRA_DIST += tests/conv_kept_bf16.sh
EXTRA_DIST += tests/fuse.sh
# [plugin.cpu] tune_cache: timed kernel choices kept between runs
TESTS += tests/cpu_tune_cache.sh
EXTRA_DIST += tests/cpu_tune_cache.sh
# [plugin.cpu] keep_widened: AVX2's widened bf16 weights kept between
# runs, bit for bit the numbers of widening on every op
TESTS += tests/cpu_widen_cache.sh
EXTRA_DIST += tests/cpu_widen_cache.sh
# ---- the widened-weight cache (plugins/cpu/wcache.c compiled in): a copy
# kept until a write, never refilled while a run reads it (threads); a
# large one on huge pages (plugins/cpu/hugepage.c compiled in too)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_wcache
TESTS += tests/check_cpu_wcache
tests_check_cpu_wcache_SOURCES = tests/check_cpu_wcache.c plugins/cpu/wcache.c plugins/cpu/hugepage.c
tests_check_cpu_wcache_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_wcache_LDADD = libkiln.la $(CHECK_LIBS) -lpthread -lm
endif
# ---- the kept outcomes of the CPU device's probes of oneDNN versions for
# a smaller team (plugins/cpu/team_verdicts.c compiled in): capped, the
# oldest forgotten, a probe that could not run not kept
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_team_verdicts
TESTS += tests/check_cpu_team_verdicts
tests_check_cpu_team_verdicts_SOURCES = tests/check_cpu_team_verdicts.c plugins/cpu/team_verdicts.c
tests_check_cpu_team_verdicts_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_team_verdicts_LDADD = libkiln.la $(CHECK_LIBS) -lpthread
endif
# ---- the CPU device's team size: cgroup quota parsers, the adaptive
# controller's decisions on synthetic intervals (plugins/cpu/threads.c
# compiled in; no clock, no /proc)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_threads
TESTS += tests/check_cpu_threads
tests_check_cpu_threads_SOURCES = tests/check_cpu_threads.c plugins/cpu/threads.c \
	plugins/cpu/threads.h
tests_check_cpu_threads_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_threads_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# ---- a pipeline stage device's CPUs ([run] bind_stages): the rule
# (plugins/cpu/pin.c compiled in) and each stage worker's mask read back
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_pin
TESTS += tests/check_cpu_pin
tests_check_cpu_pin_SOURCES = tests/check_cpu_pin.c plugins/cpu/pin.c plugins/cpu/pin.h \
	plugins/cpu/threads.c plugins/cpu/threads.h
tests_check_cpu_pin_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_pin_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
# multi-node across network namespaces (root; skips otherwise): 2 and 4
# hosts equal one process, a delayed link, a cut link, a frozen rank, a
# killed host (docs/distributed.md "Several machines")
TESTS += tests/dist_netns.sh
EXTRA_DIST += tests/dist_netns.sh tests/netns_wire.py tests/netns_lib.sh tests/netns_rsh.sh tests/store_ns_lib.sh
# kiln launch --max-restarts: a killed rank, the job restarted from the
# newest checkpoint, bit-identical to the uninterrupted run
TESTS += tests/launch_restart.sh
EXTRA_DIST += tests/launch_restart.sh

# ---- inference: kiln predict and the C API (issue 23) ---------------------
check_PROGRAMS += tests/infer_threads
tests_infer_threads_SOURCES = tests/infer_threads.c
tests_infer_threads_LDADD = libkiln.la -lpthread
check_PROGRAMS += tests/infer_reload
tests_infer_reload_SOURCES = tests/infer_reload.c
tests_infer_reload_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_infer_reload_LDADD = libkiln-internal.la
if BUILD_LOADERS
TESTS += tests/predict.sh tests/embed.sh tests/png16.sh
endif
EXTRA_DIST += tests/predict.sh tests/embed.sh tests/png16.sh
# predict of image files reads of [data.eval] only its images' size (the
# sources' peek, plugin ABI 2.24); --format csv's RFC 4180 quoting
if BUILD_LOADERS
TESTS += tests/predict_peek.sh
endif
EXTRA_DIST += tests/predict_peek.sh
# no output written over an input or a checkpoint, an export written whole
# or not at all (session 31): export, predict --logits, quantize --out
if BUILD_LOADERS
TESTS += tests/output_guard.sh tests/output_guard_cost.sh
endif
EXTRA_DIST += tests/output_guard.sh tests/output_guard_cost.sh
# the CPU's kept convolution weights: reordered once per inference call,
# the same logits, training's evaluations unchanged ([plugin.cpu] keep_weights)
if BUILD_LOADERS
TESTS += tests/infer_wreorder.sh
endif
EXTRA_DIST += tests/infer_wreorder.sh
# DDP and ZeRO-1 on a GPT (tied lm_head, layernorm, attention, AdamW with
# no_decay): 2 ranks equal one process (needs kiln-gloo.so)
TESTS += tests/dist_gpt.sh
EXTRA_DIST += tests/dist_gpt.sh
# recurrent layers (lstm, gru) against PyTorch references (issue 21)
check_PROGRAMS += tests/check_rnn
TESTS += tests/check_rnn
tests_check_rnn_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_rnn_LDADD = libkiln.la $(CHECK_LIBS) -lm
EXTRA_DIST += tests/data/gen_rnn_refs.py tests/data/rnn_refs.safetensors
# ONNX export (issue 23): tests/onnx_tool reads an exported model back with
# protobuf-c and writes kiln's logits of a test batch; onnx_export.sh
# checks graphs and weights, onnx_ort.sh ONNX Runtime's logits against
# kiln's (skipped without onnxruntime in $KILN_VENV); bench/onnx.sh times both
if HAVE_ONNX
check_PROGRAMS += tests/onnx_tool
tests_onnx_tool_SOURCES = tests/onnx_tool.c
nodist_tests_onnx_tool_SOURCES = core/proto/onnx.pb-c.c
tests_onnx_tool_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir) -I$(top_builddir) $(PROTOBUF_C_CFLAGS)
tests_onnx_tool_LDADD = libkiln-internal.la $(PROTOBUF_C_LIBS)
TESTS += tests/onnx_export.sh tests/onnx_ort.sh
endif
EXTRA_DIST += tests/onnx_export.sh tests/onnx_ort.sh tests/onnx_ort.py
EXTRA_DIST += tests/data/onnx_residual_conv.ini tests/data/onnx_concat_last.ini tests/data/onnx_concat_seq.ini
# kiln's own check of an export (core/onnx_check.c) on graphs built by
# hand: a Concat on the wrong axis, a Gemm without transB, a value used
# before it is defined, an initializer's bytes, ... each named (session 32)
if HAVE_ONNX
if HAVE_CHECK
check_PROGRAMS += tests/check_onnx
TESTS += tests/check_onnx
tests_check_onnx_SOURCES = tests/check_onnx.c
nodist_tests_check_onnx_SOURCES = core/proto/onnx.pb-c.c
tests_check_onnx_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_onnx_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir) -I$(top_srcdir)/core -I$(top_builddir) $(PROTOBUF_C_CFLAGS)
tests_check_onnx_LDADD = libkiln-internal.la $(CHECK_LIBS) $(PROTOBUF_C_LIBS)
endif
endif
# ---- inference graph passes: folded logits against the unfolded ---------
if HAVE_CHECK
check_PROGRAMS += tests/check_infer_passes
TESTS += tests/check_infer_passes
tests_check_infer_passes_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_infer_passes_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_infer_passes_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
# ---- the embedding program's state across the public calls: its OpenMP
# thread count (the suite is built with OpenMP, as such a program is) and
# the config kiln_infer_open reads ----------------------------------------
if HAVE_CHECK
check_PROGRAMS += tests/check_api_state
TESTS += tests/check_api_state
tests_check_api_state_CFLAGS = $(CHECK_SUITE_CFLAGS) $(OPENMP_CFLAGS)
tests_check_api_state_LDADD = libkiln.la $(CHECK_LIBS) $(OPENMP_CFLAGS) -lm
endif

# ---- INT8: the calibration rules by hand, the INT8 ops against reference
# loops (device conformance), the quantized CNN's accuracy ------------------
if HAVE_CHECK
check_PROGRAMS += tests/check_quant tests/check_device_int8
TESTS += tests/check_quant tests/check_device_int8
tests_check_quant_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_quant_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core -DSRCDIR='"$(abs_top_srcdir)"'
tests_check_quant_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
tests_check_device_int8_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_device_int8_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
tests_check_device_int8_LDADD = $(DEVICE_SUITE_INTERNAL_LDADD)
endif
EXTRA_DIST += tests/data/gen_quant_refs.py tests/data/quant_refs.txt tests/data/quant_hist_resnet.txt

TESTS += tests/int8.sh
EXTRA_DIST += tests/int8.sh
EXTRA_DIST += tests/onnx_export.sh tests/onnx_ort.sh tests/onnx_ort.py
# [dist] pipeline: stages on ranks (gloo, mpi), P x D, resume on 1, a killed stage
TESTS += tests/pipeline_dist.sh
EXTRA_DIST += tests/pipeline_dist.sh
# [pipeline] sendrecv with a skip across the cut (gloo TCP, mpi messages):
# no pair that deadlocks the step (core/pipe_pairs.c)
TESTS += tests/pipeline_pairs.sh
EXTRA_DIST += tests/pipeline_pairs.sh
# [model] init_from of llm.c's file on 2 stages on 2 ranks: each rank its
# stage alone, the file opened once a rank (an LD_PRELOAD shim)
if BUILD_LOADERS
TESTS += tests/pipeline_llmc.sh
endif
EXTRA_DIST += tests/pipeline_llmc.sh
# dropout's masks by the global batch: ranks, accumulate, pipelines, attention
TESTS += tests/dropout_global.sh
EXTRA_DIST += tests/dropout_global.sh
# keep_best streamed per stage; rank 0's failed write ends every rank
TESTS += tests/pipeline_ckpt.sh
EXTRA_DIST += tests/pipeline_ckpt.sh
# rank 0's failed write of the gathered state (DDP, ZeRO-1) ends every rank
TESTS += tests/ddp_ckpt_fail.sh
EXTRA_DIST += tests/ddp_ckpt_fail.sh
TESTS += tests/ckpt_fault.sh
EXTRA_DIST += tests/ckpt_fault.sh
TESTS += tests/agreed_fault.sh
EXTRA_DIST += tests/agreed_fault.sh
TESTS += tests/eval_fault.sh
EXTRA_DIST += tests/eval_fault.sh
TESTS += tests/dist_eval_shard.sh
EXTRA_DIST += tests/dist_eval_shard.sh
# schedule = plateau on 2 ranks (DDP, ZeRO-1, 2 stages): one process's rates and weights
TESTS += tests/dist_plateau.sh
EXTRA_DIST += tests/dist_plateau.sh
TESTS += tests/dist_early_stop.sh
EXTRA_DIST += tests/dist_early_stop.sh
# the split examples follow their unsplit originals (issue 21, docs/pipeline.md)
TESTS += tests/pipeline_examples.sh
EXTRA_DIST += tests/pipeline_examples.sh
# tests/pipeline_dist.sh's and tests/optim_guards.sh's kiln train with a NaN
# gradient forced (on one rank; at one step or each of a range)
check_PROGRAMS += tests/train_nan
tests_train_nan_LDADD = libkiln.la -lm

# the optimizer's edges against PyTorch's: onecycle's empty rise, the loss
# scale's floor, growth_interval's range (session 32)
TESTS += tests/optim_guards.sh
EXTRA_DIST += tests/optim_guards.sh

# the INI writers shared by the shell tests and bench/pipeline.sh
EXTRA_DIST += tests/config_lib.sh
# shared input gradients of add / pos_embedding (core/plan_memory.c plan_grad_alias)
TESTS += tests/grad_alias.sh
EXTRA_DIST += tests/grad_alias.sh
# [plugin.cpu] async = auto on a data-parallel rank: the step's workload
# (KILN_PROC_WORKLOAD) decides (plugins/cpu/cpu.c, stream.c)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_async
TESTS += tests/check_cpu_async
tests_check_cpu_async_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_async_LDADD = libkiln-internal.la $(CHECK_LIBS) -lm
endif
# the CPU device's buffers of 2 MiB and more on transparent huge pages:
# advised (VmFlags hg), and allocated where the advice is refused
# (plugins/cpu/hugepage.c, session 46)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_hugepage
TESTS += tests/check_cpu_hugepage
tests_check_cpu_hugepage_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_hugepage_LDADD = libkiln.la $(CHECK_LIBS)
endif
# the CPU plugin's large-buffer allocator on its own (plugins/cpu/hugepage.c
# compiled in): a child forked while another thread allocates does not
# hang in its own allocation (the lock taken around fork); heap pointers
# freed as the heap's (session 47)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_huge_alloc
TESTS += tests/check_cpu_huge_alloc
tests_check_cpu_huge_alloc_SOURCES = tests/check_cpu_huge_alloc.c plugins/cpu/hugepage.c
tests_check_cpu_huge_alloc_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_huge_alloc_LDADD = libkiln.la $(CHECK_LIBS) -lpthread
endif
# the CPU plugin's kernel choices timed under contention: provisional in
# the tune cache, re-timed quiet, never over a confident one (plugins/cpu/tune.c)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_tune
TESTS += tests/check_cpu_tune
tests_check_cpu_tune_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_tune_LDADD = libkiln.la $(CHECK_LIBS) -lm
# the OpenBLAS f32 GEMM against oneDNN's and a reference ([plugin.cpu]
# gemm_impl; 77 without OpenBLAS)
check_PROGRAMS += tests/check_cpu_gemm_impl
TESTS += tests/check_cpu_gemm_impl
tests_check_cpu_gemm_impl_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_gemm_impl_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the CPU device's split GEMMs: the product, its bytes on any team, a late
# helper that does not hold the caller (plugins/cpu/gemm.c, split.c)
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_split
TESTS += tests/check_cpu_split
tests_check_cpu_split_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_split_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the CUDA device's cuDNN attention, its host-only logic (plugins/cuda/
# attn_map.c: [B,H,T,D] views of kiln's layouts, the cuDNN-or-kiln
# decision, KILN_CUDA_ATTN, the plan key, the workspace): no CUDA needed
if HAVE_CHECK
check_PROGRAMS += tests/check_cuda_attn
TESTS += tests/check_cuda_attn
tests_check_cuda_attn_SOURCES = tests/check_cuda_attn.c tests/attn_op.h plugins/cuda/attn_map.c \
	plugins/cuda/attn_map.h
tests_check_cuda_attn_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/plugins/cuda
tests_check_cuda_attn_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cuda_attn_LDADD = libkiln.la $(CHECK_LIBS)
endif
# its cuDNN descriptors (plugins/cuda/sdpa.c: the SDPA graphs' operations,
# finalized by cuDNN on a machine without a GPU) and KILN_CUDA_ATTN's paths
if HAVE_CHECK
if HAVE_CUDNN
check_PROGRAMS += tests/check_cuda_sdpa
TESTS += tests/check_cuda_sdpa
tests_check_cuda_sdpa_SOURCES = tests/check_cuda_sdpa.c tests/attn_op.h $(CUDA_DEVICE_C)
tests_check_cuda_sdpa_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/plugins/cuda \
	-DKILN_CUDA_MIN_ARCH=$(CUDA_MIN_ARCH)
tests_check_cuda_sdpa_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cuda_sdpa_LDADD = $(CUDA_KERNEL_OBJS) libkiln.la \
	$(CHECK_LIBS) $(CUDA_LIBS) -lm
tests_check_cuda_sdpa_LDFLAGS = $(CUDA_LDFLAGS)
endif
endif
# The GPU check's harness (tests/gpu/run.sh's stages, budget, $OUT and
# progressive results) with a fake bundle: no GPU needed
TESTS += tests/gpu_stages.sh
EXTRA_DIST += tests/gpu_stages.sh
# A suite on $KILN_TEST_DEVICE loads a GPU device's plugin (and its CUDA
# probe) only in a child, never in the process Check forks tests from
TESTS += tests/device_probe_fork.sh
EXTRA_DIST += tests/device_probe_fork.sh
# the CPU device's convolution weight gradient in blocks of the minibatch
# (plugins/cpu/convsplit.c): dw and db right, the same bytes on any team
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_convsplit
TESTS += tests/check_cpu_convsplit
tests_check_cpu_convsplit_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_convsplit_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the CPU device's convolutions by FFT (plugins/cpu/fftconv.c): the three
# passes right against a double loop and oneDNN, the same bytes on any team
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_fftconv
TESTS += tests/check_cpu_fftconv
tests_check_cpu_fftconv_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_fftconv_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the CPU device's direct convolution for few input channels
# (plugins/cpu/convthin.c): CONV and CONV_BWD_WEIGHTS, f32 and bf16, right
# against a double loop and oneDNN, the same bytes on any team, the ops it
# takes and those it leaves to oneDNN
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_convthin
TESTS += tests/check_cpu_convthin
tests_check_cpu_convthin_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_convthin_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the CPU device's 3x3 convolution by Winograd's F(4x4, 3x3)
# (plugins/cpu/wino.c): right against a double loop with bias, ReLU and a
# residual, the same bytes on any team, the ops it takes and those it
# leaves to oneDNN, a NaN reaching the outputs that cover it
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_wino
TESTS += tests/check_cpu_wino
tests_check_cpu_wino_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_wino_LDADD = libkiln.la $(CHECK_LIBS) -lm
endif
# the kept weights of inference plans shared between the plans that read
# them (plugins/cpu/wshare.c): two models on one device, several sizes,
# one freed (its entries with its weights), the bits of nothing kept;
# weights written through kiln_model_param_get's pointers after a run
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_wshare
TESTS += tests/check_cpu_wshare
tests_check_cpu_wshare_CFLAGS = $(CHECK_SUITE_CFLAGS)
tests_check_cpu_wshare_LDADD = libkiln.la $(CHECK_LIBS)
endif
# its 16 x 16 transforms of 16 planes at once (plugins/cpu/fft16.c compiled
# in) against FFTW's, plane by plane
if HAVE_CHECK
check_PROGRAMS += tests/check_cpu_fft16
TESTS += tests/check_cpu_fft16
tests_check_cpu_fft16_SOURCES = tests/check_cpu_fft16.c plugins/cpu/fft16.c plugins/cpu/fft16.h
tests_check_cpu_fft16_CFLAGS = $(CHECK_SUITE_CFLAGS) $(FFTW_CFLAGS)
tests_check_cpu_fft16_LDADD = libkiln.la $(CHECK_LIBS) $(FFTW_LIBS) -lm
endif
# the CNN with conv_algo = fft: conv2 by FFT, the same bytes on any team,
# the loss of conv_algo = direct within rounding
TESTS += tests/cpu_fftconv.sh
EXTRA_DIST += tests/cpu_fftconv.sh
TESTS += tests/cpu_wino.sh
EXTRA_DIST += tests/cpu_wino.sh
TESTS += tests/fftconv_kept.sh
EXTRA_DIST += tests/fftconv_kept.sh
# the bf16 CNN below AVX-512: its convolutions' f32 ops (lowp.c) by FFT
# with kept spectra, the same bytes twice, the conv updates of direct within bf16
# rounding
TESTS += tests/cpu_fftconv_bf16.sh
EXTRA_DIST += tests/cpu_fftconv_bf16.sh
TESTS += tests/cpu_gemm_devices.sh
EXTRA_DIST += tests/cpu_gemm_devices.sh
# bench/common.sh: a plugin probe cache a build (A/B benches alternate builds)
TESTS += tests/bench_common.sh
EXTRA_DIST += tests/bench_common.sh
# bench/anchors.sh and anchors_table.py: the placement probe (bench/common.sh,
# bench/c2c_latency), each run fast / slow / mixed, the fast-run medians
TESTS += tests/anchors_table.sh
EXTRA_DIST += tests/anchors_table.sh
# kiln launch asleep between events (no polling), its failure, grace and signal rules
TESTS += tests/launch_wait.sh tests/launch_orphan.sh tests/launch_result.sh
EXTRA_DIST += tests/launch_wait.sh tests/launch_orphan.sh tests/launch_result.sh
TESTS += tests/launch_nodes.sh
EXTRA_DIST += tests/launch_nodes.sh
# the CPU device under a limit on threads (a pids cgroup, or ulimit -u):
# a kiln error naming the limit, never libgomp's exit(1) (teamstart.h)
TESTS += tests/thread_limit.sh
EXTRA_DIST += tests/thread_limit.sh
# a region of fewer workers than the team leaves libgomp's pool whole (no
# thread made again mid-run, where a limit could end the process)
TESTS += tests/omp_pool_whole.sh
EXTRA_DIST += tests/omp_pool_whole.sh
# a small stack limit (ulimit -s): raised and run again, or refused by name
TESTS += tests/stack_limit.sh
EXTRA_DIST += tests/stack_limit.sh
# a run's error printed before its teardown, which a stop signal may cut
# short (kiln_set_error_hook, session 36)
TESTS += tests/teardown_signal.sh
EXTRA_DIST += tests/teardown_signal.sh
