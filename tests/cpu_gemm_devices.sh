#!/bin/sh
# tests/cpu_gemm_devices.sh - OpenBLAS's GEMM called from two device
# instances at once ([run] devices = cpu:0, cpu:1; plugins/cpu/gemm.c).
# Each stage's device runs its f32 GEMMs on its own thread, so with
# [plugin.cpu] gemm_impl = openblas the two stages call cblas_sgemm
# concurrently (OpenBLAS's OpenMP build, one thread a call).  A shared
# buffer or a race in the library would change the numbers from run to
# run, so:
#   - two such runs end with the same parameters and momenta, bit for bit;
#   - they agree with the same pipeline on oneDNN's sgemm within 1e-4
#     (another summation order: measured 5e-7 on the blocks model).
# Skipped where the plugin has no usable OpenBLAS (the device line does
# not name it).
name=cpu_gemm_devices
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"

{
	ini run seed=3 threads=2
	ini_synthetic 2048 16 10 image_channels=1 workers=1
	ini_layers flat:flatten ln:layernorm b1:linear:out=256 r1:relu b2:linear:out=256 r2:relu \
		b3:linear:out=256 r3:relu b4:linear:out=256 r4:relu head:linear:out=10 loss:softmax_xent
	ini train epochs=1 max_steps=6 batch=256 lr=0.05 log_every=1 eval=0 checkpoint_last=1 overwrite=1
} > "$tmp/p.ini"

# run LABEL IMPL: the 2-stage pipeline on two device instances, 4
# micro-batches of 64 rows, every eligible f32 GEMM on IMPL
run() {
	kiln 0 train "$tmp/p.ini" "run.out_dir=$tmp/$1" "run.devices=cpu:0, cpu:1" \
		"model.stages=flat,r2|b3,loss" pipeline.micro_batches=4 \
		"plugin.cpu.gemm_impl=$2" plugin.cpu.tune_cache=none
}

run dnn onednn
grep -q "OpenBLAS" "$err" || { echo "SKIP: the cpu plugin has no usable OpenBLAS here"; exit 77; }
stderr_has "stage 1 on cpu:1, 1 of 2 threads"
run ob1 openblas
run ob2 openblas
"$top_builddir/tests/ckpt_tool" same "$(ck ob1 6)" "$(ck ob2 6)" params optim.momentum ||
	fail "two OpenBLAS runs on two devices differ: a race between the stages' GEMMs?"
echo "ok: two OpenBLAS runs on two device instances end bit for bit equal"
near "$(ck ob1 6)" "$(ck dnn 6)" 1e-4 params
echo "ok: OpenBLAS and oneDNN pipelines agree within 1e-4"
