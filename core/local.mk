# libkiln's code is built once, into a convenience library (PIC objects),
# which makes two shared libraries:
#  - libkiln.la, installed: it exports exactly the functions the public
#    headers (include/kiln/*.h, all installed: include/local.mk) declare,
#    listed in core/libkiln.sym (tests/lib_symbols.sh compares the two and
#    `nm -D` of the built library).  Before session 40 it exported every
#    kiln_* function (-export-symbols-regex '^kiln_'): 490 internal ones
#    a program could link to, so the "added only" rule of -version-info
#    below was not true of what it exported.  The `kiln` CLI links it and
#    calls public functions alone; plugins do not link it (Makefile.am).
#  - libkiln-internal.la, never installed, in the same .libs directory (so
#    the build tree's plugins are found as for libkiln: core/registry.c,
#    running_from_build_tree): every kiln_* function, for the tests and
#    benchmarks that reach into the core (core/*.h).
noinst_LTLIBRARIES += core/libkiln_core.la
core_libkiln_core_la_SOURCES = core/internal.h core/status.c core/tensor.c core/config.c \
	core/config_impl.h core/config_check.c core/config_get.c core/config_write.c core/config_same.c core/schema.c core/registry_impl.h core/registry.c core/registry_probe.c core/device.c core/opcheck.c core/profile.h core/profile.c core/rng.c core/crc32c.c core/source.c core/loader.h core/loader.c core/transform.h core/transform.c core/transform_config.c core/data.h core/data.c core/data_identity.c core/bench_data.c core/memory.c core/summary.c core/graph.h core/graph.c core/graph_infer.c core/graph_params.c core/layer_check.c core/plan.c core/plan_memory.c core/plan_run.c core/precision.c core/checkpoint.h core/checkpoint_impl.h core/checkpoint_write.c core/checkpoint_read.c core/checkpoint_load.c core/checkpoint_layout.c core/train_interval.c core/config_diff.h core/config_diff.c core/resume.c core/run_config.h core/run_config.c core/train.h core/train_setup.h core/trainer.c core/train_setup.c core/train_model.c core/train_buffers.c core/train_gradsums.c core/train_step.c core/train_log.c core/train_eval.c core/train_ckpt.c core/train_resume_batch.c core/train_best.c core/train_dist.c core/train_result.c core/sized.c core/plateau.h core/plateau.c core/train_plateau.c \
	core/store.c core/dist_env.c core/dist.h core/dist_impl.h core/dist.c core/dist_explain.c core/dist_config.c core/dist_data.c core/dist_heartbeat.c core/run_clock.c core/dist_zero.c \
	core/safetensors.c core/weights.c core/trained.c \
	core/tie.c \
	core/pipeline.h core/pipe_stages.c core/pipe_schedule.c core/pipe_xfer.c core/pipe_window.c core/pipe_impl.h core/pipe_open.c core/pipe_run.c core/pipe_pairs.c core/pipe_memory.c core/pipe_wgrad.c core/pipe_rank.c core/dist_pipe.c core/dist_pipe_mem.c core/dist_pipe_eval.c core/dist_pipe_ckpt.c core/comm_p2p.c \
	core/generate.c \
	core/optim/optim.h core/optim/optim.c core/optim/fused.c core/optim/optims.c core/optim/sgd.c core/optim/adamw.c core/optim/lamb.c \
	core/layers/util.h core/layers/layers.c core/layers/linear.c core/layers/relu.c \
	core/layers/flatten.c core/layers/softmax_xent.c core/layers/conv.c \
	core/layers/batchnorm.c core/layers/bn_sync.h core/layers/bn_sync.c core/layers/pool.h core/layers/pool.c core/layers/maxpool.c \
	core/layers/avgpool.c core/layers/global_avgpool.c core/layers/act.h core/layers/act.c \
	core/layers/leaky_relu.c core/layers/gelu.c core/layers/sigmoid.c core/layers/tanh.c \
	core/layers/dropout.c core/layers/add.c core/layers/concat.c \
	core/layers/embedding.c core/layers/pos_embedding.c core/layers/layernorm.c core/layers/rnn.c \
	core/layers/attention.c
core_libkiln_core_la_CFLAGS = $(AM_CFLAGS) $(KILN_FRAME_CFLAGS)
core_libkiln_core_la_CPPFLAGS = $(AM_CPPFLAGS) $(INIH_CFLAGS) $(ZLIB_CFLAGS) $(JANSSON_CFLAGS) \
	-DKILN_PKGLIBDIR='"$(pkglibdir)"' \
	-DKILN_BUILD_LIBDIR='"$(abs_top_builddir)/.libs"' \
	-DKILN_BUILD_PLUGINDIR='"$(abs_top_builddir)/plugins/.libs"'
core_libkiln_core_la_LIBADD = $(INIH_LIBS) $(ZLIB_LIBS) $(JANSSON_LIBS) -lm
# (2:0:0 since session 35: struct kiln_train_cfg, kiln_memory and
# kiln_plugin_info begin with `size`, kiln_source_info() takes one, and
# kiln_train_cfg ends in `reserved0`; 1:0:0 in session 34, when struct
# kiln_train_result began with `size`.  A program built before either is
# not loaded against this library: docs/training.md, "From C").
# 3:0:1 since session 38: functions added (kiln_set_error_hook in session
# 36, kiln_train_progress_steps in 38), nothing removed or changed, so
# the soname stays libkiln.so.2 (current - age) and the file is
# libkiln.so.2.1.0: a program that calls them asks the loader for the
# newer file by its version, not for a symbol missing mid-run.  Libtool's
# rule: an interface added: current+1, revision 0, age+1; removed or
# changed: current+1, revision 0, age 0; the code alone: revision+1.
# 4:0:2 since session 39 (libkiln.so.2.2.0): kiln_safetensors_read,
# kiln_safetensors_index and kiln_train_failed_own added.
# 5:0:3 since session 40 (libkiln.so.2.3.0): kiln_generator_classes and
# kiln_generator_allow added.
# 6:0:4 since session 41 (libkiln.so.2.4.0): kiln_generator_top_p,
# kiln_generate_samples, kiln_sample_token_ex and kiln_sample_probs added
# (top-p sampling and several samples, docs/generate.md).
# 7:0:5 since session 42 (libkiln.so.2.5.0): kiln_model_params_written
# added (the end of writes through kiln_model_param_get's pointers).
# 8:0:6 since session 43 (libkiln.so.2.6.0): kiln_generator_plan_samples
# added (`kiln generate --num-samples` learns that they do not fit
# before it allocates their tokens).
# Session 40 hid the 490 internal kiln_* functions (core/libkiln.sym)
# with no interface change counted: none was declared in an installed
# header, so none was the interface these numbers describe (a program
# that called one used what was never promised).  Its code changes
# (kiln_safetensors_read refuses a file changed since open; the file is
# mapped at the first get or find, not at open) are revision+1 at least,
# or come under the same release's interface change (current+1,
# revision 0: 5:0:3, above).
lib_LTLIBRARIES += libkiln.la
libkiln_la_SOURCES =
libkiln_la_LIBADD = core/libkiln_core.la
libkiln_la_LDFLAGS = -version-info 8:0:6 -export-symbols $(srcdir)/core/libkiln.sym
EXTRA_libkiln_la_DEPENDENCIES = core/libkiln.sym
EXTRA_DIST += core/libkiln.sym
noinst_LTLIBRARIES += libkiln-internal.la
libkiln_internal_la_SOURCES =
libkiln_internal_la_LIBADD = core/libkiln_core.la
# (-rpath: a shared library, not a convenience one)
libkiln_internal_la_LDFLAGS = -rpath $(abs_builddir) -avoid-version -export-symbols-regex '^kiln_'

# The loggers (core/logger.h): metrics.jsonl, CSV, TensorBoard event files.
# TensorBoard's messages (core/proto/*.proto) are compiled by protoc-c into
# the build tree before anything includes them.
core_libkiln_core_la_SOURCES += core/logger.h core/logger.c core/log_jsonl.c core/log_csv.c \
	core/log_tensorboard.c
KILN_PROTO_C = core/proto/event.pb-c.c core/proto/summary.pb-c.c
KILN_PROTO_H = core/proto/event.pb-c.h core/proto/summary.pb-c.h
nodist_core_libkiln_core_la_SOURCES = $(KILN_PROTO_C) $(KILN_PROTO_H)
BUILT_SOURCES = $(KILN_PROTO_C) $(KILN_PROTO_H)
CLEANFILES += $(KILN_PROTO_C) $(KILN_PROTO_H)
EXTRA_DIST += core/proto/event.proto core/proto/summary.proto
core_libkiln_core_la_CPPFLAGS += $(PROTOBUF_C_CFLAGS)
core_libkiln_core_la_LIBADD += $(PROTOBUF_C_LIBS)
# one protoc-c run writes both files of a .proto; the .h follows the .c
core/proto/%.pb-c.c: $(srcdir)/core/proto/%.proto
	$(AM_V_GEN)$(MKDIR_P) core/proto && \
	$(PROTOC_C) --proto_path=$(srcdir)/core/proto --c_out=core/proto $<
core/proto/%.pb-c.h: core/proto/%.pb-c.c
	@test -f $@ || { rm -f $<; $(MAKE) $(AM_MAKEFLAGS) $<; }
core/proto/event.pb-c.c: $(srcdir)/core/proto/summary.proto

# A fresh run's out_dir: refused when used, --overwrite (issue 25).
core_libkiln_core_la_SOURCES += core/out_dir.c
# An output that is no input, written whole or not at all (session 31).
core_libkiln_core_la_SOURCES += core/out_file.c
# The rendezvous store's server, wire format and token challenge
# (core/store.h); HMAC and random nonces from OpenSSL's libcrypto.
core_libkiln_core_la_SOURCES += core/store.h core/store_server.c core/store_msg.c
core_libkiln_core_la_CPPFLAGS += $(CRYPTO_CFLAGS)
core_libkiln_core_la_LIBADD += $(CRYPTO_LIBS)
# GPT-2 and llm.c weight files (issue 20)
core_libkiln_core_la_SOURCES += core/weights.h core/weights_gpt2.c
# the inference API, include/kiln/infer.h (issue 23)
core_libkiln_core_la_SOURCES += core/infer.c
# ONNX export (`kiln export --onnx`, issue 23): core/onnx_export.c writes
# the evaluation graph as an ONNX model through protobuf-c; the messages'
# code is generated by protoc-c from libonnx-dev's onnx.proto (configure's
# ONNX_PROTO) when configure found it, else the export says it is missing.
core_libkiln_core_la_SOURCES += core/onnx_export.h core/onnx_export.c core/onnx_layers.c
# kiln's own check of what export wrote: read back, ONNX's shape rules for
# the operators emitted, each layer's shape equal to kiln's (session 32)
core_libkiln_core_la_SOURCES += core/onnx_check.h core/onnx_check.c core/onnx_check_ops.c
if HAVE_ONNX
KILN_ONNX_C = core/proto/onnx.pb-c.c
KILN_ONNX_H = core/proto/onnx.pb-c.h
nodist_core_libkiln_core_la_SOURCES += $(KILN_ONNX_C) $(KILN_ONNX_H)
BUILT_SOURCES += $(KILN_ONNX_C) $(KILN_ONNX_H)
CLEANFILES += $(KILN_ONNX_C) $(KILN_ONNX_H)
core/proto/onnx.pb-c.c: $(ONNX_PROTO)
	$(AM_V_GEN)$(MKDIR_P) core/proto && \
	$(PROTOC_C) --proto_path=$(dir $(ONNX_PROTO)) --c_out=core/proto $(ONNX_PROTO)
endif

# inference graph passes (issue 23: folding)
core_libkiln_core_la_SOURCES += core/infer_passes.h core/infer_passes.c
core_libkiln_core_la_SOURCES += core/quant.h core/quant.c
core_libkiln_core_la_SOURCES += core/quantize.c

# [run] devices: a device instance per pipeline stage (core/pipeline.h).
core_libkiln_core_la_SOURCES += core/pipe_devices.c
core_libkiln_core_la_SOURCES += core/pipe_timing.c

# the plugin probe's answers kept between runs (core/registry_probe.c)
core_libkiln_core_la_SOURCES += core/probe_cache.c core/probe_cache.h
