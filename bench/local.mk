# Benchmarks: built with `make`, never run by `make check` (timing is not a test).
noinst_PROGRAMS = bench/gemm_peak
bench_gemm_peak_SOURCES = bench/gemm_peak.c
bench_gemm_peak_LDADD = libkiln.la
EXTRA_DIST += bench/precision.sh bench/mlp.sh bench/pytorch_mlp.py bench/mlp_bench.ini bench/cnn.sh bench/pytorch_cnn.py \
	bench/cnn_bench.ini bench/fmnist.py bench/data.sh bench/data_bench.ini bench/pytorch_data.py \
	bench/make_image_folder.py
noinst_PROGRAMS += bench/xform
bench_xform_SOURCES = bench/xform.c
bench_xform_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)
bench_xform_LDADD = libkiln.la
