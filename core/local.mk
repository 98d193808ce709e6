lib_LTLIBRARIES += libkiln.la
libkiln_la_SOURCES = core/internal.h core/status.c core/tensor.c core/config.c \
	core/config_impl.h core/config_check.c core/schema.c core/registry.c core/device.c core/opcheck.c core/profile.h core/profile.c core/rng.c core/crc32c.c core/source.c core/loader.h core/loader.c core/transform.h core/transform.c core/transform_config.c core/data.h core/data.c core/bench_data.c core/memory.c core/summary.c core/graph.h core/graph.c core/plan.c core/plan_memory.c core/plan_run.c core/precision.c core/checkpoint.h core/checkpoint.c core/resume.c core/run_config.h core/run_config.c core/train.h core/trainer.c core/train_setup.c core/train_step.c core/train_log.c core/train_eval.c core/train_ckpt.c core/train_dist.c \
	core/store.c core/dist_env.c core/dist.h core/dist_impl.h core/dist.c core/dist_zero.c \
	core/safetensors.c core/weights.c \
	core/optim/optim.h core/optim/optim.c core/optim/fused.c core/optim/optims.c core/optim/sgd.c core/optim/adamw.c core/optim/lamb.c \
	core/layers/util.h core/layers/layers.c core/layers/linear.c core/layers/relu.c \
	core/layers/flatten.c core/layers/softmax_xent.c core/layers/conv.c \
	core/layers/batchnorm.c core/layers/bn_sync.h core/layers/bn_sync.c core/layers/pool.h core/layers/pool.c core/layers/maxpool.c \
	core/layers/avgpool.c core/layers/global_avgpool.c core/layers/act.h core/layers/act.c \
	core/layers/leaky_relu.c core/layers/gelu.c core/layers/sigmoid.c core/layers/tanh.c \
	core/layers/dropout.c core/layers/add.c core/layers/concat.c
libkiln_la_CPPFLAGS = $(AM_CPPFLAGS) $(INIH_CFLAGS) $(ZLIB_CFLAGS) $(JANSSON_CFLAGS) \
	-DKILN_PKGLIBDIR='"$(pkglibdir)"' \
	-DKILN_BUILD_LIBDIR='"$(abs_top_builddir)/.libs"' \
	-DKILN_BUILD_PLUGINDIR='"$(abs_top_builddir)/plugins/.libs"'
libkiln_la_LIBADD = $(INIH_LIBS) $(ZLIB_LIBS) $(JANSSON_LIBS) -lm
libkiln_la_LDFLAGS = -version-info 0:0:0 -export-symbols-regex '^kiln_'
