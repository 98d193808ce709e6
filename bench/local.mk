# Benchmarks: built with `make`, never run by `make check` (timing is not a test).
noinst_PROGRAMS = bench/gemm_peak
bench_gemm_peak_SOURCES = bench/gemm_peak.c
bench_gemm_peak_LDADD = libkiln.la
EXTRA_DIST += bench/bf16_widen.sh bench/precision.sh bench/mlp.sh bench/pytorch_mlp.py bench/mlp_bench.ini bench/cnn.sh bench/pytorch_cnn.py bench/pytorch_cnn_ops.py \
	bench/cnn_bench.ini bench/fmnist.py bench/data.sh bench/data_bench.ini bench/pytorch_data.py \
	bench/make_image_folder.py bench/memory.sh bench/common.sh bench/pipe_ckpt_mem.sh bench/pipe_ckpt_fail.sh bench/pipe_ckpt_wide.ini \
	bench/ddp_ckpt_fail.sh bench/ckpt_fail_lib.sh
noinst_PROGRAMS += bench/xform
# kiln_infer's calls of other row counts (docs/PERFORMANCE.md, session 39)
noinst_PROGRAMS += bench/infer_sizes
bench_infer_sizes_SOURCES = bench/infer_sizes.c
bench_infer_sizes_LDADD = libkiln.la
# kiln_model_load_safetensors of a large file, its CRC32Cs checked as read
# (docs/PERFORMANCE.md, session 42)
noinst_PROGRAMS += bench/weights_load
bench_weights_load_SOURCES = bench/weights_load.c
bench_weights_load_LDADD = libkiln.la
# the same fixed work on each core, step by step: the floor under the
# pipeline's per-step spread (docs/PERFORMANCE.md, session 19)
noinst_PROGRAMS += bench/core_spread
bench_core_spread_SOURCES = bench/core_spread.c
# one cache line's round trip between two CPUs: how far apart the machine
# has put them now (docs/PERFORMANCE.md, session 48)
noinst_PROGRAMS += bench/c2c_latency
bench_c2c_latency_SOURCES = bench/c2c_latency.c
bench_c2c_latency_LDADD = -lpthread
bench_xform_SOURCES = bench/xform.c
bench_xform_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)
bench_xform_LDADD = libkiln-internal.la
# allreduce latency/busbw baselines of `kiln bench comm` (bench/comm.sh runs it)
if BUILD_MPI
noinst_PROGRAMS += bench/mpi_raw
bench_mpi_raw_SOURCES = bench/mpi_raw.c
bench_mpi_raw_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
bench_mpi_raw_LDADD = $(MPI_LIBS)
endif
if BUILD_GLOO
noinst_PROGRAMS += bench/gloo_raw
bench_gloo_raw_SOURCES = bench/gloo_raw.cc
bench_gloo_raw_CXXFLAGS = -std=c++17 -Wall -Wextra -pthread
bench_gloo_raw_LDADD = $(GLOO_LIBS) -lpthread
endif
EXTRA_DIST += bench/comm.sh bench/comm_load.sh bench/shm_contention.sh bench/torch_comm.py bench/overlap.sh bench/mpi_levels.sh
# fused attention forward + backward (bench/pytorch_attention.py: PyTorch's)
noinst_PROGRAMS += bench/attention
bench_attention_SOURCES = bench/attention.c
bench_attention_LDADD = libkiln.la -lm
EXTRA_DIST += bench/pytorch_attention.py bench/attention.sh
# kiln and PyTorch under contention (a busy core, taskset, a CPU quota)
EXTRA_DIST += bench/contention.sh bench/bench_time.h bench/bench_ops.h
EXTRA_DIST += bench/tune_contention.sh
EXTRA_DIST += bench/tune_measure.sh
# kiln beside PyTorch 2.x eager / torch.compile / Lightning and 1.13
EXTRA_DIST += bench/anchors.sh bench/anchors_table.py bench/torch_modes.py bench/pytorch_gpt.py \
	bench/pytorch_ddp.py
# multi-node: the hierarchical allreduce against the flat one on network
# namespaces (root; docs/PERFORMANCE.md)
EXTRA_DIST += bench/hier_netns.sh
# GPT-2 training steps: kiln vs PyTorch 2.x vs llm.c (bench/gpt.sh, issue 20)
EXTRA_DIST += bench/gpt.sh bench/pytorch_gpt2.py bench/gpt_inputs.py
# kiln's fp32 evaluation vs ONNX Runtime on the exported model (tests/onnx_tool, tests/onnx_ort.py)
EXTRA_DIST += bench/onnx.sh
EXTRA_DIST += bench/int8.sh bench/int8_profile.sh bench/int8_frozen.sh
EXTRA_DIST += bench/pipeline.sh
# what runs in each rank, thread by thread, from /proc (issue 21, session 19)
EXTRA_DIST += bench/rank_threads.py
EXTRA_DIST += bench/predict.sh bench/pytorch_predict.py
EXTRA_DIST += bench/pipeline_gpt.sh
# oneDNN's convolutions of the ResNet example per activation layout and
# post-op (issue 23: kiln's inference vs ONNX Runtime; docs/PERFORMANCE.md)
if BUILD_CPU
noinst_PROGRAMS += bench/conv_layouts
bench_conv_layouts_SOURCES = bench/conv_layouts.c
bench_conv_layouts_LDADD = $(DNNL_LIBS)
# the reorders around the CNN's first convolution against the convolution
# and a memcpy (issue 22; docs/PERFORMANCE.md, "Session 15: the CNN's reorders")
noinst_PROGRAMS += bench/stem_reorder
bench_stem_reorder_SOURCES = bench/stem_reorder.c
bench_stem_reorder_LDADD = $(DNNL_LIBS)
# the bf16 CNN's conv2 and fc1 under oneDNN's bf16 choices, and the bf16
# matmul peak (issue 22; docs/PERFORMANCE.md, "Session 14: the bf16 peak")
noinst_PROGRAMS += bench/bf16_ops
bench_bf16_ops_SOURCES = bench/bf16_ops.c
bench_bf16_ops_LDADD = $(DNNL_LIBS)
# the MLP benches' f32 GEMM shapes under oneDNN's sgemm and matmul and the
# BLAS libraries named by --lib (dlopen'd; issue 22, "Session 16: small
# GEMMs on AVX2" in docs/PERFORMANCE.md)
noinst_PROGRAMS += bench/gemm_shapes
bench_gemm_shapes_SOURCES = bench/gemm_shapes.c
bench_gemm_shapes_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS)
bench_gemm_shapes_LDADD = $(DNNL_LIBS) $(OPENMP_CFLAGS) -ldl
# the MLP's weight gradients and update split by oneDNN or by rows, in
# blocks by turns, classified by an in-process ping-pong (session 50)
noinst_PROGRAMS += bench/affine_split
bench_affine_split_SOURCES = bench/affine_split.c
bench_affine_split_CFLAGS = $(AM_CFLAGS) $(OPENMP_CFLAGS)
bench_affine_split_LDADD = $(DNNL_LIBS) $(OPENMP_CFLAGS)
endif
EXTRA_DIST += bench/lstm.sh bench/pytorch_lstm.py
# the fixed cost of a run, start-up caches off and on (bench/startup.sh)
EXTRA_DIST += bench/startup.sh
# set-up phases and the run outside its fit, two builds A/B (bench/setup_ab.sh)
EXTRA_DIST += bench/setup_ab.sh
EXTRA_DIST += bench/pipeline_ranks.sh
# a CNN step's oneDNN reorders and convolutions, CPU seconds a step, against another cpu plugin
EXTRA_DIST += bench/conv_steps.sh
EXTRA_DIST += bench/mlp_step.sh
EXTRA_DIST += bench/mlp_fill_ab.sh
EXTRA_DIST += bench/cnn_bf16_ab.sh
EXTRA_DIST += bench/affine_ab.sh
EXTRA_DIST += bench/pipeline_wgrad.sh
# kiln's whole CNN run split into start, set-up, steps, warm-up and checkpoint
EXTRA_DIST += bench/whole_run.sh
# the MLP profile per op at 1 and 2 threads, fuse 0 and 1 (where the second thread gains)
EXTRA_DIST += bench/mlp_ops.sh bench/profile_table.py
# the blocks model on 1 thread at batch 128, 256, 512 against another build
# (the f32 GEMMs: oneDNN or OpenBLAS; session 16)
EXTRA_DIST += bench/gemm_blocks.sh
# the one-way latency of kiln-gloo's shared-memory send and recv channels
# (plugins/common/shmp2p.h; docs/PERFORMANCE.md, issue 21 session 9)
if BUILD_GLOO
noinst_PROGRAMS += bench/p2p_channel
bench_p2p_channel_SOURCES = bench/p2p_channel.c plugins/common/shmp2p.c plugins/common/shmp2p.h \
	plugins/common/watchdog.c plugins/common/watchdog.h \
	plugins/common/shmcoll.c plugins/common/shmcoll.h plugins/common/half.h
bench_p2p_channel_LDADD = libkiln.la -lpthread
endif
# ONNX Runtime's per-node profile of bench/onnx.sh's exported model and batch
EXTRA_DIST += bench/ort_profile.py
# the bf16 CNN's SGD step with its bf16 copy, alone (docs/PERFORMANCE.md, session 15)
noinst_PROGRAMS += bench/optim_step
bench_optim_step_SOURCES = bench/optim_step.c
bench_optim_step_LDADD = libkiln.la
# the CNN's conv2, its three passes by oneDNN and by FFT ([plugin.cpu]
# conv_algo; docs/PERFORMANCE.md, "Session 17: FFT convolution")
if BUILD_CPU
noinst_PROGRAMS += bench/fftconv_ops
bench_fftconv_ops_SOURCES = bench/fftconv_ops.c
bench_fftconv_ops_LDADD = libkiln.la
# a first layer's convolution: kiln's direct kernel against oneDNN (session 24)
noinst_PROGRAMS += bench/convthin_ops
bench_convthin_ops_SOURCES = bench/convthin_ops.c
bench_convthin_ops_LDADD = libkiln.la
noinst_PROGRAMS += bench/wino_ops
bench_wino_ops_SOURCES = bench/wino_ops.c
bench_wino_ops_LDADD = libkiln.la
# an NHWC model's pool2 before its flatten: NHWC + reorder against NHWC -> NCHW
# (docs/PERFORMANCE.md, "Session 18: the NHWC CNN")
noinst_PROGRAMS += bench/pool_ops
bench_pool_ops_SOURCES = bench/pool_ops.c
bench_pool_ops_LDADD = libkiln.la
# the CNN's dropout alone: forward, backward, NHWC and NCHW activations
# (docs/PERFORMANCE.md, "Session 19: the NHWC CNN's CPU kernels")
noinst_PROGRAMS += bench/drop_ops
bench_drop_ops_SOURCES = bench/drop_ops.c
bench_drop_ops_LDADD = libkiln.la

# the fused loss alone: the MLP's 128 x 10 logits (docs/PERFORMANCE.md,
# "Session 21: the CPU plugin's loops")
noinst_PROGRAMS += bench/xent_ops
bench_xent_ops_SOURCES = bench/xent_ops.c
bench_xent_ops_LDADD = libkiln.la
# GRAD_CLIP alone, at the MLP's size and past 8M elements (the same section)
noinst_PROGRAMS += bench/clip_ops
bench_clip_ops_SOURCES = bench/clip_ops.c
bench_clip_ops_LDADD = libkiln.la
endif
# bench/stage_bytes.sh: [model] stages_flops_per_byte (session 20)
EXTRA_DIST += bench/stage_bytes.sh bench/stage_cut_ab.sh
EXTRA_DIST += bench/ab_session.sh
# (left out of `make dist` until session 36: tests/dist_files.sh)
EXTRA_DIST += bench/fuse.sh bench/pipeline_pair.sh
# a prompt's planning, prefill and decode in kiln_generate (docs/generate.md,
# session 44)
noinst_PROGRAMS += bench/generate_prefill
bench_generate_prefill_SOURCES = bench/generate_prefill.c
bench_generate_prefill_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/core
bench_generate_prefill_LDADD = libkiln-internal.la
# session 46: two builds A/B with the huge pages each run held (plugins/cpu/hugepage.c)
EXTRA_DIST += bench/hugepage_ab.sh
# session 47: two builds' frozen convolutions, whose kept weights moved onto huge pages
EXTRA_DIST += bench/kept_weights_ab.sh
# session 48: two builds on bench/lstm.sh's LSTM models, interleaved (plugins/cpu/rnn.c)
EXTRA_DIST += bench/lstm_ab.sh
