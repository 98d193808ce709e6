# plugins/cpu: the CPU device on oneDNN (docs/plugins.md).  Every plugin is
# a libtool module in plugins/, so the build tree has one plugin directory
# (plugins/.libs) that libkiln searches when uninstalled.
if BUILD_CPU
pkglib_LTLIBRARIES += plugins/kiln-cpu.la
plugins_kiln_cpu_la_SOURCES = plugins/cpu/cpu.c plugins/cpu/cpu.h plugins/cpu/stream.c \
	plugins/cpu/graph.c plugins/cpu/ops.c plugins/cpu/optim.c plugins/cpu/lowp.c plugins/cpu/wcache.c plugins/cpu/hugepage.c \
	plugins/cpu/async_auto.c plugins/cpu/tune.c plugins/cpu/tune_time.c plugins/cpu/tune_cache.c plugins/cpu/gemm.c plugins/cpu/openblas.c plugins/cpu/dnn.c plugins/cpu/dnn.h \
	plugins/cpu/conv.c plugins/cpu/pool.c plugins/cpu/bn.c plugins/cpu/act.c \
	plugins/cpu/layout.c plugins/cpu/embedding.c plugins/cpu/layernorm.c plugins/cpu/rnn.c \
	plugins/cpu/dnnteam.c plugins/cpu/team_verdicts.c plugins/cpu/split.c plugins/cpu/threads.c plugins/cpu/threads.h plugins/cpu/teamstart.c plugins/cpu/teamstart.h plugins/cpu/pin.c plugins/cpu/pin.h plugins/cpu/philox.h plugins/cpu/vexp.h plugins/cpu/ops_rows.h $(PLUGIN_COMMON_H)
# -fno-math-errno: sqrtf in a loop (Adam, LAMB) vectorises only when it
# need not set errno; no kernel reads errno, and results are unchanged
plugins_kiln_cpu_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(OPENMP_CFLAGS) $(OPENBLAS_CFLAGS) $(FFTW_CFLAGS) -fno-math-errno
plugins_kiln_cpu_la_LDFLAGS = $(PLUGIN_LDFLAGS)
# OpenBLAS is not linked: plugins/cpu/openblas.c loads it when a device
# opens (its run path, OPENBLAS_RPATH, names configure's OpenMP build)
plugins_kiln_cpu_la_LIBADD = plugins/cpu/libattn.la $(DNNL_LIBS) $(OPENBLAS_RPATH) $(FFTW_LIBS) $(OPENMP_CFLAGS) -lm -ldl
# The fused attention alone may contract a*b+c into an FMA (configure.ac
# turns contraction off everywhere else): its register-tiled products are
# compute-bound, and the avx512f clone without FMA took 1.22-1.36x the CPU
# time of a forward + backward on a Zen 4 (docs/PERFORMANCE.md, session 21).
# Within a CPU the bits are still fixed (one code path per element, any
# team: check_device_attention); across ISAs they differ as its softmax
# and dot-product lanes already did.
noinst_LTLIBRARIES += plugins/cpu/libattn.la
plugins_cpu_libattn_la_SOURCES = plugins/cpu/attn.c
plugins_cpu_libattn_la_CFLAGS = $(plugins_kiln_cpu_la_CFLAGS) -ffp-contract=fast
endif

# INT8 inference ops (issue 23)
if BUILD_CPU
plugins_kiln_cpu_la_SOURCES += plugins/cpu/qconv.c plugins/cpu/qweights.c plugins/cpu/qweights.h
# the weights frozen plans keep, shared by the plans that read them (session 40)
plugins_kiln_cpu_la_SOURCES += plugins/cpu/wshare.c plugins/cpu/wshare.h
# convolution weight gradients in blocks of the minibatch (issue 22, session 10)
plugins_kiln_cpu_la_SOURCES += plugins/cpu/convsplit.c
# f32 convolutions by FFT (issue 22, session 17; [plugin.cpu] conv_algo)
plugins_kiln_cpu_la_SOURCES += plugins/cpu/fftconv.c plugins/cpu/fftconv.h
# its planes moved in and out of the per-frequency matrices
plugins_kiln_cpu_la_SOURCES += plugins/cpu/fftconv_planes.c plugins/cpu/fftconv_impl.h
# its 16 x 16 transforms, 16 planes at once (AVX-512; session 23)
plugins_kiln_cpu_la_SOURCES += plugins/cpu/fft16.c plugins/cpu/fft16.h
# a first layer's convolution, few input channels (AVX-512; session 24)
plugins_kiln_cpu_la_SOURCES += plugins/cpu/convthin.c plugins/cpu/convthin.h plugins/cpu/v16.h \
	plugins/cpu/convthin_impl.h plugins/cpu/convthin_f32.c plugins/cpu/convthin_bf16.c \
	plugins/cpu/wino.c plugins/cpu/wino.h
endif
