#!/bin/sh
# tests/gpu/run.sh - the GPU check of the CUDA device, in two halves.
#
#   tests/gpu/run.sh --prepare      here (a machine with the CUDA toolkit, no
#                                   GPU needed): build kiln with the CUDA
#                                   device and gather what the GPU machine
#                                   needs into _build/gpu/bundle (git-ignored,
#                                   < 64 MiB): the kiln binary, libkiln, the
#                                   cuda and loaders plugins, the conformance
#                                   suites, the shared libraries they use that
#                                   a bare GPU machine may lack, the
#                                   Fashion-MNIST test split and the cpu
#                                   device's reference accuracies.
#   tests/gpu/run.sh --stage LIST   on the GPU machine, from the repository
#                                   root, with the bundle carried: the stages
#                                   of LIST (comma-separated, in that order):
#       1  correctness (budget 330 s): the machine, `kiln plugins`, every
#          device conformance suite on cuda against the reference loops
#          (4 suites at a time), the RNN against PyTorch's numbers, kiln-nccl
#          on a communicator of one rank, the fused attention forced both
#          ways, the MLP and the CNN (fp32, bf16, bf16 with conv_wgrad =
#          lowp: how many weight gradients took it) trained to the cpu
#          device's accuracy, the metric sums and clip counts past 2^24
#          (tests/gpu/counts.ini), finite gradients whose squares overflow
#          f32 stepped as PyTorch's (tests/grad_overflow.sh), the INT8 CNN
#          evaluated
#       2  performance (budget 260 s): the MLP step against PyTorch and as
#          a CUDA graph, ResNet-50 against PyTorch, the GEMM-heavy MLP
#          against torch.matmul
#       3  attention (budget 270 s): every attention case forced both ways,
#          GPT-2 124M bf16 both ways (losses, ms per step), PyTorch's
#          eager step (and torch.compile's with KILN_GPU_TORCH_COMPILE=1)
#       4  profiles (budget 150 s): kiln's profiler (every op timed) on
#          GPT-2 124M bf16, ResNet-50 bf16 and the GEMM-heavy MLP: the ops'
#          time summed over the layers, the tables in the logs
#   tests/gpu/run.sh                the same as --stage 1
#   tests/gpu/run.sh --attention    the same as --stage 3
#
# Each stage keeps to a budget (KILN_GPU_BUDGET seconds for the whole run,
# default the sum of its stages' budgets): a step starts only when what is
# left covers its minimum, its timeout is cut to what is left, and the rest
# is reported as SKIPPED, so the command ends before the device tool's
# limit and what ran comes back.  Results go to $OUT progressively:
# gpu_results.txt gets a line as each step ends (and is printed, so the
# tool's output tail has it too) and logs.tar.gz, the logs so far, is
# rewritten after each step; nothing else is written under $OUT (the
# device tool returns at most 8 files).  docs/gpu.md has the calls.
# Exit status: 0 when every check that ran passed, 77 when no usable GPU
# was found (the results say why; nothing is claimed), 1 when a check
# failed.  TARGET lines report the performance targets; RESULT is about
# correctness.
set -u

here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${KILN_GPU_BUNDLE:-$here/_build/gpu/bundle}

# ---- prepare (here) ---------------------------------------------------------
if [ "${1:-}" = "--prepare" ]; then
	set -e
	cd "$here"
	if [ -f config.status ]; then
		# configured in the source tree: a VPATH build would be refused, so
		# use this build (it must have the CUDA device)
		build=$here
	else
		build=$here/_build/gpu/build
		mkdir -p "$build"
		if [ ! -f "$build/config.status" ]; then
			[ -x configure ] || ./bootstrap
			(cd "$build" && "$here/configure" --with-cuda="${CUDA_HOME:-/usr/local/cuda}" \
				--with-cuda-arch="${KILN_CUDA_ARCH:-90}")
		fi
	fi
	make -C "$build" -j2
	# the device conformance suites, one per op family (tests/check_device_*.c)
	suites=
	for src in "$here"/tests/check_device_*.c; do
		name=${src##*/}
		suites="$suites tests/${name%.c}"
	done
	# and the recurrent layers against PyTorch (KILN_TEST_DEVICE=cuda below)
	suites="$suites tests/check_rnn"
	# and kiln-nccl on one GPU (built where configure found NCCL)
	[ -f "$build/plugins/.libs/kiln-nccl.so" ] && suites="$suites tests/check_nccl_one"
	make -C "$build" -j2 $suites
	# the GEMM parameter mapping of the CUDA device (cuda_gemm_map in
	# plugins/cuda/cuda.h) against a row-major reference: host-only, so
	# it is checked here, before any GPU time is spent
	mkdir -p "$here/_build/gpu"
	cc -O1 -I"$here/include" -I"$build" -I"${CUDA_HOME:-/usr/local/cuda}/include" \
		-o "$here/_build/gpu/gemm_map_test" "$here/plugins/cuda/gemm_map_test.c" -lm
	"$here/_build/gpu/gemm_map_test"
	# the fused attention's host-only logic (plugins/cuda/attn_map.c) and
	# its cuDNN descriptors, finalized by cuDNN without a GPU (sdpa.c)
	make -C "$build" -j2 tests/check_cuda_attn tests/check_cuda_sdpa
	"$build/tests/check_cuda_attn"
	"$build/tests/check_cuda_sdpa"
	if [ ! -f "$build/plugins/.libs/kiln-cuda.so" ]; then
		echo "run.sh --prepare: $build has no plugins/.libs/kiln-cuda.so: configure found no CUDA toolkit (see the configure summary; --with-cuda=PATH)" >&2
		exit 1
	fi
	rm -rf "$bundle"
	mkdir -p "$bundle/bin" "$bundle/lib/kiln" "$bundle/data/fashion-mnist" "$bundle/tests/data" \
		"$bundle/data/gpt2"
	# GPT-2 tokens in llm.c's shard format (256 int32 header: magic
	# 20240520, version 1, count; uint16 ids) for the GPT-2 124M step of
	# --attention: 5 steps of 8 x 1024 and one for the last target, a random
	# run of 61 ids repeated (61: no window starts in phase), so that a
	# token is predictable only by attending 61 positions back and the
	# losses of the two attention paths depend on what attention computes
	python3 -c 'import random, struct, sys
n = 5 * 8 * 1024 + 1
random.seed(0)
run = [random.randrange(50257) for _ in range(61)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[run[i % 61] for i in range(n)]))' \
		"$bundle/data/gpt2/train.bin"
	# the real executables (the build tree's are libtool wrapper scripts)
	cp "$build/.libs/kiln" "$bundle/bin/kiln"
	for suite in $suites; do
		cp "$build/$(dirname "$suite")/.libs/${suite##*/}" "$bundle/bin/"
	done
	# libkiln under its soname (libkiln.so.N, the one link of that form)
	# as a plain file: the device tool carries a symbolic link only as a link
	for so in "$build"/.libs/libkiln.so.[0-9]*; do
		case $so in *.so.*.*) continue ;; esac
		cp -L "$so" "$bundle/lib/${so##*/}"
	done
	# kiln-cpu.so is left out: the GPU run does not use it, and oneDNN is
	# 40 MB of the 64 MiB the device tool carries
	# kiln-amp.so: bf16 and f16 training ([run] precision) needs it
	cp "$build/plugins/.libs/kiln-cuda.so" "$build/plugins/.libs/kiln-loaders.so" \
		"$build/plugins/.libs/kiln-amp.so" "$bundle/lib/kiln/"
	# kiln-nccl.so: tests/check_nccl_one (libnccl.so.2 is found on the GPU machine)
	[ ! -f "$build/plugins/.libs/kiln-nccl.so" ] || cp "$build/plugins/.libs/kiln-nccl.so" "$bundle/lib/kiln/"
	# shared libraries outside the C runtime and CUDA, which a GPU machine
	# with no package manager may lack (inih, check, jansson, turbojpeg,
	# png, lmdb, ...); found with ldd, copied under their sonames
	for f in "$bundle/bin/"* "$bundle/lib/kiln/"*.so; do
		LD_LIBRARY_PATH="$build/.libs" ldd "$f"
	done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
	while read -r soname path; do
		case $soname in
		libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
		libcublas*|libcudart*|libcuda.so*|libkiln.so*) ;;
		# cuDNN's engine libraries are ~250 MB, libnccl.so.2 200 MB, far
		# over the 64 MiB carried: the GPU half finds them on that machine
		libcudnn*|libnccl*) ;;
		*) cp -L "$path" "$bundle/lib/$soname" ;;
		esac
	done
	src=${KILN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
	cp "$src/t10k-images-idx3-ubyte.gz" "$src/t10k-labels-idx1-ubyte.gz" "$bundle/data/fashion-mnist/"
	cp "$here/tests/data/loss_refs.txt" "$here/tests/data/transformer_refs.safetensors" \
		"$here/tests/data/attention_refs.safetensors" \
		"$here/tests/data/rnn_refs.safetensors" "$bundle/tests/data/"
	# the CPU device's accuracy on the same run, the reference the GPU's
	# must reach (the GPU machine has no kiln-cpu.so to compute it)
	# the references are retrained on every --prepare: an earlier run's
	# out_dirs would be refused (kiln never overwrites a run unasked)
	rm -rf "$here/_build/gpu/cpu_ref" "$here/_build/gpu/cpu_cnn_"*
	echo "training tests/gpu/mlp.ini on the cpu device for the reference accuracy..."
	"$build/kiln" train "$here/tests/gpu/mlp.ini" run.device=cpu data.path="$src" \
		run.out_dir="$here/_build/gpu/cpu_ref" > "$here/_build/gpu/cpu_ref.log" 2>&1
	sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$here/_build/gpu/cpu_ref.log" | tail -1 > "$bundle/cpu_test_acc.txt"
	echo "cpu reference test accuracy: $(cat "$bundle/cpu_test_acc.txt")"
	[ -s "$bundle/cpu_test_acc.txt" ]
	# the CNN's, fp32 and bf16 (tests/gpu/cnn.ini; about a minute each)
	for prec in fp32 bf16; do
		echo "training tests/gpu/cnn.ini ($prec) on the cpu device for the reference accuracy..."
		"$build/kiln" train "$here/tests/gpu/cnn.ini" run.device=cpu run.precision=$prec \
			data.path="$src" run.out_dir="$here/_build/gpu/cpu_cnn_$prec" \
			> "$here/_build/gpu/cpu_cnn_$prec.log" 2>&1
		sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$here/_build/gpu/cpu_cnn_$prec.log" | tail -1 \
			> "$bundle/cpu_cnn_${prec}_acc.txt"
		echo "cpu reference CNN $prec accuracy: $(cat "$bundle/cpu_cnn_${prec}_acc.txt")"
		[ -s "$bundle/cpu_cnn_${prec}_acc.txt" ]
	done
	# the fp32 CNN quantized to INT8 (calibrated on 4 batches of the test
	# split, the only one the bundle carries) and its cpu accuracy, which
	# the GPU's `kiln eval --quantized` must reach
	echo "quantizing the cpu CNN and evaluating it in INT8 on the cpu device..."
	ck=$(ls "$here/_build/gpu/cpu_cnn_fp32/checkpoints/ckpt-"*.kiln | sort -V | tail -1) # the newest step
	# (and the fp32 checkpoint itself: the GPU's fp32 evaluation beside
	# the INT8 one, 170 KB)
	cp "$ck" "$bundle/cnn_fp32.kiln"
	"$build/kiln" quantize "$here/tests/gpu/cnn.ini" run.device=cpu data.path="$src" \
		run.out_dir="$here/_build/gpu/cpu_cnn_int8" --checkpoint "$ck" --calibrate 4 \
		--method percentile --out "$bundle/cnn_int8.safetensors" > "$here/_build/gpu/cpu_cnn_int8.log" 2>&1
	"$build/kiln" eval "$here/tests/gpu/cnn.ini" run.device=cpu data.path="$src" \
		run.out_dir="$here/_build/gpu/cpu_cnn_int8" --quantized "$bundle/cnn_int8.safetensors" \
		>> "$here/_build/gpu/cpu_cnn_int8.log" 2>&1
	sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$here/_build/gpu/cpu_cnn_int8.log" | tail -1 \
		> "$bundle/cpu_cnn_int8_acc.txt"
	echo "cpu reference CNN INT8 accuracy: $(cat "$bundle/cpu_cnn_int8_acc.txt")"
	[ -s "$bundle/cpu_cnn_int8_acc.txt" ]
	echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1))"
	# the commit the bundle was built from (the GPU machine may get no .git)
	echo "$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' (with uncommitted changes)')" \
		> "$bundle/commit.txt"
	ls -R "$bundle"
	echo "now, for the device tool: command 'tests/gpu/run.sh --stage 1', carry ['_build/gpu/bundle'], timeout_s 330 (docs/gpu.md, the calls)"
	exit 0
fi

# ---- the GPU run --------------------------------------------------------------
cd "$here"
out=${OUT:-$here/_build/gpu/out}
res=$out/gpu_results.txt
reserve=10 # seconds each budget keeps back for the last lines and the logs' packing
say() { echo "$*" | tee -a "$res"; }
# what is left of the stage's budget (and of the whole run's), seconds
left() {
	now=$(date +%s)
	a=$((stage_budget - (now - stage_t0)))
	b=$((run_budget - (now - run_t0)))
	[ $a -lt $b ] && echo $a || echo $b
}
# fit WANT [MIN]: the timeout of a step that wants WANT seconds, cut to what
# is left (less the reserve); fails when less than MIN (default 10) is left
fit() {
	l=$(($(left) - reserve))
	[ $l -ge "${2:-10}" ] || return 1
	[ "$1" -le $l ] && echo "$1" || echo $l
}
skipped() {
	say "$1: SKIPPED (the budget: $(left) s of the stage's $stage_budget s left)"
}
fail() { say "$1: FAIL ($2)"; status=1; }

# A device conformance suite (the worker xargs starts, 4 at a time: the
# environment comes exported from the main run): one line in the results
if [ "${1:-}" = "--suite" ]; then
	name=$2
	case $name in
	check_device_transformer) want=150 ;; # model_fd: central differences of a model
	# cuDNN's plans (runtime-compiled); lowp: lp_wgrad_lowp's 4 weight-gradient plans
	check_device_attention|check_device_conv|check_device_lowp) want=120 ;;
	*) want=60 ;;
	esac
	if ! to=$(fit $want 15); then
		echo skip > "$logs/$name.rc"
		skipped "conformance $name"
		exit 0
	fi
	s0=$(date +%s)
	KILN_TEST_DEVICE=cuda KILN_TEST_SRCDIR=$bundle timeout "$to" "$bundle/bin/$name" > "$logs/$name.log" 2>&1
	rc=$?
	echo $rc > "$logs/$name.rc"
	sum=$(grep -E '^[0-9]+%:' "$logs/$name.log" | tail -1)
	nsk=$(grep -c 'skipping' "$logs/$name.log")
	t="$(($(date +%s) - s0)) s"
	case $rc in
	0) say "conformance $name: PASS (${sum:-no summary}; $nsk op families skipped as not implemented) [$t]" ;;
	77) say "conformance $name: NOT RUN (exit 77: $(grep -m1 'not available' "$logs/$name.log"))" ;;
	124) say "conformance $name: FAIL (timed out after $to s; ${sum:-no summary}) [$t]" ;;
	*) say "conformance $name: FAIL (exit $rc; ${sum:-no summary}) [$t]"
	   grep -E ':[EF]:' "$logs/$name.log" | head -6 | sed 's/^/    /' | tee -a "$res" ;;
	esac
	exit 0
fi

stages=1
case "${1:-}" in
"") ;;
--attention) stages=3 ;;
--stage) stages=$(echo "${2:-}" | tr ',' ' ') ;;
*) echo "usage: tests/gpu/run.sh --prepare | --stage 1[,2[,3[,4]]] | --attention" >&2; exit 2 ;;
esac
stage_default() { # a stage's budget, seconds
	case $1 in 1) echo 330 ;; 2) echo 260 ;; 3) echo 270 ;; 4) echo 150 ;; *) echo 0 ;; esac
}
total=0
for s in $stages; do
	b=$(stage_default "$s")
	if [ "$b" = 0 ]; then
		echo "run.sh: no stage '$s' (1: correctness, 2: performance, 3: attention, 4: profiles)" >&2
		exit 2
	fi
	total=$((total + b))
done
[ $total -gt 540 ] && total=540
run_budget=${KILN_GPU_BUDGET:-$total}
run_t0=$(date +%s)
stage_t0=$run_t0
stage_budget=$run_budget

work=${KILN_GPU_WORK:-${TMPDIR:-/tmp}/kiln_gpu.$$}
logs=$work/logs # packed into $out/logs.tar.gz after each step
runs=$work/runs # run directories (checkpoints): not packed
mkdir -p "$out" "$logs" "$runs"
: > "$res"
rm -f "$out/logs.tar.gz"
# the logs so far, replacing the last pack whole (a rename), so a run
# stopped in the middle still returns them
pack() {
	tar -C "$work" -czf "$out/.logs.tar.gz.part" logs 2>/dev/null &&
		mv -f "$out/.logs.tar.gz.part" "$out/logs.tar.gz"
}
status=0
targets_met=0
targets_tried=0
# target "text" value want: a performance target of issue #11, reported
target() {
	targets_tried=$((targets_tried + 1))
	if awk -v v="$2" -v w="$3" 'BEGIN { exit !(v >= w) }'; then
		targets_met=$((targets_met + 1))
		say "TARGET MET: $1"
	else
		say "TARGET NOT MET: $1"
	fi
}
# a value of "key": number in a log's JSON lines (the last one)
json() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" "$2" | tail -1; }
# |a - b| <= d
near() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { x = a - b; exit !(x <= d && x >= -d) }'; }

if [ ! -x "$bundle/bin/kiln" ]; then
	say "FAIL: no bundle at $bundle: run tests/gpu/run.sh --prepare first and carry _build/gpu/bundle"
	exit 1
fi
# The bundle's libraries first, then the CUDA libraries wherever this machine
# keeps them (kiln-cuda.so's own runpath names the build machine's toolkit):
# the toolkit, then the pip wheels' nvidia/*/lib folders (PyTorch's).
pip_lib() { # the folder of library $1 in the Python packages, if any
	python3 -c 'import glob, os, site, sys
for d in site.getsitepackages():
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "**", sys.argv[1]), recursive=True)) + \
             sorted(glob.glob(os.path.join(d, "torch", "lib", sys.argv[1]))):
        print(os.path.dirname(p)); sys.exit(0)' "$1" 2>/dev/null
}
cuda_lib=
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
	"$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")/../lib64"; do
	[ -e "$d/libcublasLt.so.13" ] && { cuda_lib=$d; break; }
done
[ -n "$cuda_lib" ] || cuda_lib=$(pip_lib libcublasLt.so.13)
# The folder of library $1 (not carried: too large): the toolkit's, PyTorch's
# pip packages (nvidia-cudnn-cu*, nvidia-nccl-cu*, or torch/lib), then
# whatever ldconfig knows.
lib_dir() {
	for d in "$cuda_lib" "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
		"${CUDA_HOME:-/usr/local/cuda}/lib"; do
		[ -n "$d" ] && [ -e "$d/$1" ] && { echo "$d"; return; }
	done
	d=$(pip_lib "$1")
	[ -n "$d" ] || d=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { sub("/" n "$", "", $NF); print $NF; exit }')
	echo "$d"
}
# cuDNN 9 (kiln-cuda.so links libcudnn.so.9, which loads its engine
# libraries from the library path) and NCCL 2 (kiln-nccl.so links it)
cudnn_lib=$(lib_dir libcudnn.so.9)
nccl_lib=$(lib_dir libnccl.so.2)
LD_LIBRARY_PATH="$bundle/lib${cuda_lib:+:$cuda_lib}${cudnn_lib:+:$cudnn_lib}${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KILN_PLUGIN_PATH=$bundle/lib/kiln
export LD_LIBRARY_PATH KILN_PLUGIN_PATH bundle logs res run_t0 run_budget stage_t0 stage_budget reserve

# ---- the stages' steps ------------------------------------------------------

machine() {
	say "== kiln GPU check, stages $stages: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), bundle of commit $(cat "$bundle/commit.txt" 2>/dev/null || echo unknown), budget $run_budget s"
	say "-- machine"
	if command -v nvidia-smi > /dev/null 2>&1; then
		nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | tee -a "$res"
	else
		say "nvidia-smi: not available"
	fi
	if command -v nvcc > /dev/null 2>&1; then
		nvcc --version 2>&1 | tail -1 | tee -a "$res"
	else
		say "nvcc: not on PATH"
	fi
	say "CUDA libraries for kiln-cuda.so: ${cuda_lib:-not found (no libcublasLt.so.13 under \$CUDA_HOME/lib64, /usr/local/cuda/lib64 or the pip nvidia packages)}"
	if [ -n "$cudnn_lib" ]; then
		say "cuDNN for kiln-cuda.so: $cudnn_lib ($(cd "$cudnn_lib" && ls libcudnn.so.9* libcudnn_graph.so.9* 2>/dev/null | tr '\n' ' '))"
	else
		say "cuDNN for kiln-cuda.so: libcudnn.so.9 NOT FOUND (toolkit lib64, pip nvidia.cudnn, torch/lib, ldconfig): kiln-cuda.so cannot load, every cuda step below fails"
	fi
	say "NCCL for kiln-nccl.so: ${nccl_lib:-libnccl.so.2 NOT FOUND (toolkit lib64 or lib, pip nvidia.nccl, torch/lib, ldconfig): check_nccl_one will say it is not available}"
	ldd "$bundle/bin/kiln" "$bundle/lib/kiln/kiln-cuda.so" > "$logs/ldd.txt" 2>&1
	grep "not found" "$logs/ldd.txt" | sort -u | sed 's/^/ldd: /' | tee -a "$res"
	"$bundle/bin/kiln" plugins > "$logs/plugins.txt" 2>&1
	rc=$?
	cudaline=$(grep -E "^device +cuda " "$logs/plugins.txt")
	say "kiln plugins (exit $rc): ${cudaline:-no cuda device listed}"
	grep -E "NOT LOADED" "$logs/plugins.txt" | tee -a "$res"
	pack
	# the STATUS column: "available", or "unavailable: why"
	[ "$(echo "$cudaline" | awk '{ print $4 }')" = available ] && return 0
	tail -n 3 "$logs/plugins.txt" | tee -a "$res"
	say "RESULT: NOT RUN: no usable GPU (the cuda device is not available: above)"
	exit 77
}

# every device conformance suite on cuda, 4 at a time (KILN_GPU_JOBS)
conformance() {
	say "-- conformance suites (tests/check_device_*, KILN_TEST_DEVICE=cuda; each against the reference loops)"
	if ! fit 30 20 > /dev/null; then
		skipped "conformance"
		return
	fi
	rm -f "$logs"/check_device_*.rc
	(cd "$bundle/bin" && ls check_device_*) |
		xargs -P "${KILN_GPU_JOBS:-4}" -n 1 sh "$here/tests/gpu/run.sh" --suite
	n=0 pass=0 skip=0 nr=0
	for f in "$logs"/check_device_*.rc; do
		[ -e "$f" ] || continue
		n=$((n + 1))
		case $(cat "$f") in
		0) pass=$((pass + 1)) ;;
		77) nr=$((nr + 1)) ;;
		skip) skip=$((skip + 1)) ;;
		*) status=1 ;;
		esac
	done
	say "conformance: $pass of $n suites passed ($skip skipped for the budget, $nr not run)"
	pack
	if [ $n -gt 0 ] && [ $nr -eq $n ]; then
		say "RESULT: NOT RUN: no usable GPU (every suite exited 77; see above)"
		exit 77
	fi
}

# check_device_attention's cases with the path forced (KILN_CUDA_ATTN):
# cudnn = cuDNN's fused SDPA graph only (an op it refuses fails the case),
# kiln = attn.cu only; $1: the cases under kiln.  The first cuDNN plans of
# a process compile their kernels at run time: 60 s a case.
attention_cases() {
	for mode in cudnn kiln; do
		cases=attn_lowp_shapes
		[ $mode = kiln ] && cases=$1
		for case in $cases; do
			if ! to=$(fit 60 20); then
				skipped "attention $mode $case"
				continue
			fi
			KILN_CUDA_ATTN=$mode KILN_TEST_DEVICE=cuda KILN_TEST_SRCDIR=$bundle CK_RUN_CASE=$case \
				timeout "$to" "$bundle/bin/check_device_attention" > "$logs/attn_${mode}_$case.log" 2>&1
			rc=$?
			if [ $rc -eq 0 ] && grep -q "100%" "$logs/attn_${mode}_$case.log"; then
				say "attention $mode $case: PASS"
			else
				fail "attention $mode $case" "exit $rc; logs/attn_${mode}_$case.log"
				grep -E "^[0-9]+%|:[EF]:|skipping" "$logs/attn_${mode}_$case.log" | head -5 | tee -a "$res"
			fi
			pack
		done
	done
}

# the recurrent layers through cuDNN's RNN API (rnn.c): tests/check_rnn on
# cuda, its 20 PyTorch reference cases (LSTM and GRU, 1-2 layers, 1-2
# directions, masked or not, the whole sequence or the final hidden state
# h_n (`last = 1`, session 41: rnn_kernels.cu's rnn_last, never run on a
# GPU before): the loss within 1e-5 relative, every gradient within 1e-4
# of max(0.1, max |reference|)), then its layer case (central
# differences, h_n's among them, configuration errors)
rnn() {
	for case in torch layer; do
		if ! to=$(fit 20 10); then
			skipped "rnn $case"
			continue
		fi
		KILN_TEST_DEVICE=cuda CK_RUN_CASE=$case srcdir=$bundle timeout "$to" "$bundle/bin/check_rnn" \
			> "$logs/rnn_$case.log" 2>&1
		rc=$?
		if [ $rc -eq 0 ] && grep -q "100%" "$logs/rnn_$case.log"; then
			say "rnn $case: PASS ($(grep -E '^[0-9]+%' "$logs/rnn_$case.log"))"
		else
			fail "rnn $case" "exit $rc; logs/rnn_$case.log"
			grep -E "^[0-9]+%|:[EF]:" "$logs/rnn_$case.log" | head -9 | tee -a "$res"
		fi
		pack
	done
}

# kiln-nccl.so on this GPU (tests/check_nccl_one): a communicator of one
# rank opened as a launch opens it, allreduce, broadcast, allgather,
# reduce_scatter, barrier and split on device buffers, the numbers read
# back (with one rank there is no peer for send and recv)
nccl_one() {
	if [ ! -x "$bundle/bin/check_nccl_one" ]; then
		say "nccl one: NOT RUN (no check_nccl_one in the bundle: --prepare found no kiln-nccl.so)"
		return
	fi
	if ! to=$(fit 60 15); then
		skipped "nccl one"
		return
	fi
	timeout "$to" "$bundle/bin/check_nccl_one" > "$logs/nccl_one.log" 2>&1
	rc=$?
	if [ $rc -eq 0 ] && grep -q "100%" "$logs/nccl_one.log"; then
		say "nccl one: PASS ($(grep -m1 '^kiln-nccl:' "$logs/nccl_one.log"))"
	elif [ $rc -eq 77 ]; then
		say "nccl one: NOT RUN (exit 77: $(grep -m1 'skip' "$logs/nccl_one.log"))"
	else
		fail "nccl one" "exit $rc$([ $rc = 124 ] && echo ": timed out after $to s"); logs/nccl_one.log"
		grep -E "^[0-9]+%|:[EF]:" "$logs/nccl_one.log" | head -4 | tee -a "$res"
	fi
	pack
}

# wlowp_count LOG NAME: how many weight-gradient plans of a run with
# [plugin.cuda] conv_wgrad = lowp (at KILN_LOG_LEVEL=debug) took it, dw in
# x's dtype widened after, and how many fell back to widening x and dy
# (cudnn.c: no engine took the bf16-dw graph): a PASS of the run holds
# either way
wlowp_count() {
	[ -f "$1" ] || return 0
	took=$(grep -c "dw in x's dtype, widened after (conv_wgrad = lowp)" "$1")
	fell=$(grep -c "conv_wgrad = lowp: .*: as conv_wgrad = f32" "$1")
	say "$2: conv_wgrad = lowp taken by $took weight-gradient plans (dw in x's dtype, widened after), $fell fell back to widening x and dy"
	grep -h 'conv_wgrad = lowp' "$1" |
		sed 's/^.*cuda\] *//; s/^debug: //; s/^[^:]*: //; s/, workspace [0-9]* bytes//; s/ ([0-9][^)]*)//' |
		sort | uniq -c | sort -rn | head -n 4 | tee -a "$res"
}

# train NAME CONFIG WANT REF TOL [KEY=VALUE...]: `kiln train` on cuda
# (Fashion-MNIST's test split, the only one carried: it is also the
# evaluation set, so the accuracy shows that training works), its test
# accuracy within TOL of the cpu device's on the same run (file REF in the
# bundle, measured by --prepare); $train_env: VAR=VALUE words for its
# environment
train() {
	name=$1 cfg=$2 want=$3 ref=$4 tol=$5
	shift 5
	if ! to=$(fit "$want" 20); then
		skipped "$name"
		return
	fi
	timeout "$to" env ${train_env:-} "$bundle/bin/kiln" train "$cfg" data.path="$bundle/data/fashion-mnist" \
		run.out_dir="$runs/$name" "$@" > "$logs/$name.log" 2>&1
	rc=$?
	grep -E "^epoch [0-9]+/" "$logs/$name.log" | tail -3 | tee -a "$res"
	acc=$(json test_acc "$logs/$name.log")
	r=$(cat "$bundle/$ref" 2>/dev/null)
	if [ $rc -ne 0 ] || [ -z "$acc" ]; then
		fail "$name" "exit $rc$([ $rc = 124 ] && echo ": timed out after $to s"); logs/$name.log"
		tail -n 3 "$logs/$name.log" | tee -a "$res"
	elif [ -z "$r" ]; then
		fail "$name" "no $ref in the bundle: rerun --prepare"
	elif near "$acc" "$r" "$tol"; then
		say "$name: PASS (test accuracy $acc; the cpu device's $r, within $tol)"
	else
		fail "$name" "test accuracy $acc; the cpu device's $r: more than $tol apart"
	fi
	pack
}

# `kiln eval --quantized` of the CNN --prepare trained and quantized on the
# cpu: the int32 sums are exact on both devices and the epilogue rounds
# alike, so only the f32 layers between differ in their last bits: the
# accuracy within 0.003 (30 of the 10,000 images) of the cpu's
int8_eval() {
	if ! to=$(fit 30 15); then
		skipped "int8 eval"
		return
	fi
	timeout "$to" "$bundle/bin/kiln" eval tests/gpu/cnn.ini data.path="$bundle/data/fashion-mnist" \
		run.out_dir="$runs/int8" --quantized "$bundle/cnn_int8.safetensors" > "$logs/eval_int8.log" 2>&1
	rc=$?
	acc=$(json test_acc "$logs/eval_int8.log")
	ref=$(cat "$bundle/cpu_cnn_int8_acc.txt" 2>/dev/null)
	if [ $rc -ne 0 ] || [ -z "$acc" ]; then
		fail "int8 eval" "exit $rc; logs/eval_int8.log"
		tail -n 3 "$logs/eval_int8.log" | tee -a "$res"
	elif [ -z "$ref" ]; then
		fail "int8 eval" "no cpu_cnn_int8_acc.txt in the bundle: rerun --prepare"
	elif near "$acc" "$ref" 0.003; then
		say "int8 eval: PASS (test accuracy $acc; the cpu device's INT8 $ref, within 0.003)"
	else
		fail "int8 eval" "test accuracy $acc; the cpu device's INT8 $ref: more than 0.003 apart"
	fi
	# the fp32 model's evaluation beside it (issue 23's CUDA INT8 speed; the
	# 10,000 images of this small CNN: a first figure, not the target's)
	if [ -f "$bundle/cnn_fp32.kiln" ] && to=$(fit 20 10); then
		timeout "$to" "$bundle/bin/kiln" eval tests/gpu/cnn.ini data.path="$bundle/data/fashion-mnist" \
			run.out_dir="$runs/fp32_eval" --checkpoint "$bundle/cnn_fp32.kiln" > "$logs/eval_fp32.log" 2>&1
		say "eval speed (CNN, 10,000 images): INT8 $(json eval_samples_per_s "$logs/eval_int8.log") samples/s, fp32 $(json eval_samples_per_s "$logs/eval_fp32.log") samples/s"
	fi
	pack
}

# Counts past 2^24 on cuda (tests/gpu/counts.ini; session 37): the device's
# f32 metric sums read in parts, so an evaluation of 2^24 + 2^20 samples,
# every prediction right, has accuracy exactly 1 (one sum: 1.000057); and
# the clip op's counts, zeroed on the device at each read (a FILL of its
# state's last two floats) and added on the host: 30 steps clipped of 30
counts_exact() {
	if ! to=$(fit 40 15); then
		skipped "counts past 2^24"
		return
	fi
	timeout "$to" "$bundle/bin/kiln" train tests/gpu/counts.ini run.out_dir="$runs/counts" \
		> "$logs/counts.log" 2>&1
	rc=$?
	acc=$(json test_acc "$logs/counts.log") n=$(json test_samples "$logs/counts.log")
	if [ $rc -ne 0 ] || [ "$acc" != 1.000000 ] || [ "$n" != 17825792 ]; then
		fail "counts past 2^24" "exit $rc, test accuracy '$acc' of '$n' samples, want 1.000000 of 17825792; logs/counts.log"
		tail -n 3 "$logs/counts.log" | tee -a "$res"
		pack
		return
	fi
	to=$(fit 20 10) || { skipped "counts clipped"; return; }
	timeout "$to" "$bundle/bin/kiln" train tests/gpu/counts.ini run.out_dir="$runs/counts_clip" \
		data.eval.samples=1023 data.classes=2 layer.fc.out=2 data.samples=4 train.batch=4 \
		train.epochs=30 train.log_every=1 train.clip_norm=1e-9 > "$logs/counts_clip.log" 2>&1
	rc=$?
	c=$(json steps_clipped "$logs/counts_clip.log")
	if [ $rc -ne 0 ] || [ "$c" != 30 ]; then
		fail "counts past 2^24" "exit $rc, '$c' steps clipped of 30; logs/counts_clip.log"
	else
		say "counts past 2^24: PASS (accuracy $acc of $n samples; $c of 30 steps clipped)"
	fi
	pack
}

# kiln generate on a GPU machine (session 40, not run on a GPU yet): the
# decoding attention (KILN_OP_ATTENTION_DECODE) has no CUDA kernel, so
# [run] device = cuda is refused before anything is read (no weights,
# no data here: the refusal comes first), naming run.device=cpu; `auto`
# (which picks cuda) would generate on the CPU device, which this bundle
# leaves out (kiln-cpu.so), so it is refused too, saying so.
generate_device() {
	if ! to=$(fit 30 10); then
		skipped "generate on a GPU machine"
		return
	fi
	gl=$logs/generate.log
	: > "$gl"
	for dv in cuda auto; do
		timeout "$to" "$bundle/bin/kiln" generate examples/gpt_char.ini run.device=$dv \
			run.out_dir="$runs/generate_none" data.path="$runs/generate_none" --prompt "Q: " \
			--tokens 5 > "$runs/generate_$dv.txt" 2> "$runs/generate_$dv.err"
		rc=$?
		cat "$runs/generate_$dv.err" >> "$gl"
		case $dv in
		cuda) want="generation needs the CPU device: set run.device=cpu (the cuda device has no ATTENTION_DECODE" ;;
		auto) want="generation needs the CPU device, which is not here (\`kiln plugins\`): device = auto chose cuda" ;;
		esac
		if [ $rc -ne 2 ] || ! grep -qF "$want" "$runs/generate_$dv.err"; then
			fail "generate on a GPU machine" "device = $dv: exit $rc, want 2 and '$want'; logs/generate.log"
			pack
			return
		fi
	done
	say "generate on a GPU machine: PASS (device = cuda refused naming run.device=cpu; auto refused for want of kiln-cpu.so)"
	pack
}

# Finite gradients whose squares overflow f32 on cuda (tests/grad_overflow.sh;
# session 39): k_partial_sum takes such a square in double, so the step is
# taken as PyTorch's (the weights within 1e-7 of its SGD step, clip_norm's
# zero gradients, clip_value's clamp, bf16), and the errors of an fp16
# forward and an fp32 backward overflowing on the initial weights
grad_overflow() {
	if ! to=$(fit 60 20); then
		skipped "grad overflow"
		return
	fi
	mkdir -p "$runs/grad_overflow"
	KILN_TEST_DEVICE=cuda KILN_TEST_PLUGIN_PATH=$KILN_PLUGIN_PATH top_builddir=$bundle/bin \
		abs_top_builddir=$runs/grad_overflow TMPDIR=$runs/grad_overflow \
		timeout "$to" sh tests/grad_overflow.sh > "$logs/grad_overflow.log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		say "grad overflow: PASS ($(grep -c '^ok: kiln' "$logs/grad_overflow.log") kiln runs; the weights as PyTorch's)"
	elif [ $rc -eq 77 ]; then
		say "grad overflow: NOT RUN (exit 77: $(grep -m1 'SKIP' "$logs/grad_overflow.log"))"
	else
		fail "grad overflow" "exit $rc$([ $rc = 124 ] && echo ": timed out after $to s"); logs/grad_overflow.log"
		grep -E '^FAIL|PyTorch' "$logs/grad_overflow.log" | head -6 | sed 's/^/    /' | tee -a "$res"
	fi
	pack
}

stage1() {
	conformance
	say "-- end to end on cuda: training to the cpu device's accuracy"
	train train_mlp tests/gpu/mlp.ini 45 cpu_test_acc.txt 0.02
	train cnn_fp32 tests/gpu/cnn.ini 45 cpu_cnn_fp32_acc.txt 0.02 run.precision=fp32
	say "-- counts past 2^24 on cuda: an evaluation's sums read in parts, the clip op's counts on the host"
	counts_exact
	say "-- finite gradients whose squares overflow f32 on cuda, against PyTorch's step (tests/grad_overflow.sh)"
	grad_overflow
	say "-- fused attention on cuda: cuDNN's SDPA graph (KILN_CUDA_ATTN=cudnn) and kiln's kernels (=kiln), bf16/f16, odd T, head dims 64 and 128"
	attention_cases attn_lowp_shapes
	say "-- lstm/gru on cuda (tests/check_rnn: PyTorch references, the sequence and h_n, loss 1e-5 rel, gradients 1e-4 x max(0.1, |ref|))"
	rnn
	say "-- kiln-nccl on one GPU (tests/check_nccl_one: a communicator of one rank, every collective, barrier, split)"
	nccl_one
	train cnn_bf16 tests/gpu/cnn.ini 45 cpu_cnn_bf16_acc.txt 0.02 run.precision=bf16
	# the weight gradients in bf16, widened after (PyTorch AMP's; session 26,
	# not run before): the same accuracy bound, which widening passes too,
	# so the debug log says how many weight gradients took the path
	train_env=KILN_LOG_LEVEL=debug
	train cnn_bf16_wlowp tests/gpu/cnn.ini 45 cpu_cnn_bf16_acc.txt 0.02 run.precision=bf16 \
		plugin.cuda.conv_wgrad=lowp
	train_env=
	wlowp_count "$logs/cnn_bf16_wlowp.log" cnn_bf16_wlowp
	say "-- quantized CNN: kiln eval --quantized on cuda vs the cpu device's INT8 accuracy"
	int8_eval
	say "-- kiln generate with device = cuda (refused) and auto (the CPU device)"
	generate_device
}

# kiln_sps NAME WANT KEY=VALUE...: a timed `kiln train` (train_samples_per_s
# from epoch 2 on) into $sps; empty when it failed
kiln_sps() {
	name=$1 want=$2 cfg=$3
	shift 3
	sps=
	if ! to=$(fit "$want" 20); then
		skipped "$name"
		return
	fi
	timeout "$to" "$bundle/bin/kiln" train "$cfg" run.out_dir="$runs/$name" "$@" > "$logs/$name.log" 2>&1
	rc=$?
	# epoch 2's rate: the steady steps (epoch 1 has the set-up and the
	# captures, the last epoch the final checkpoint: 0.9 s of the GEMM
	# MLP's 3 s run); the whole run's where there is no epoch 2
	sps=$(sed -n 's/^epoch 2\/[0-9]*: .*(\([0-9.]*\) s, \([0-9.]*\) samples\/s).*/\2/p' "$logs/$name.log" | tail -n 1)
	[ -n "$sps" ] || sps=$(json train_samples_per_s "$logs/$name.log")
	if [ $rc -ne 0 ] || [ -z "$sps" ]; then
		fail "$name" "exit $rc$([ $rc = 124 ] && echo ": timed out after $to s"); logs/$name.log"
		tail -n 3 "$logs/$name.log" | tee -a "$res"
		sps=
	fi
	pack
}

# torch_json NAME WANT KEY ARGS...: a PyTorch comparison's JSON line into
# logs/NAME.json, its KEY into $tv (empty when it failed or PyTorch is not
# there)
torch_json() {
	name=$1 want=$2 key=$3
	shift 3
	tv=
	if ! python3 -c "import torch" 2>/dev/null; then
		say "$name: not run (python3 -c 'import torch' failed)"
		return
	fi
	if ! to=$(fit "$want" 15); then
		skipped "$name"
		return
	fi
	timeout "$to" python3 "$@" > "$logs/$name.json" 2> "$logs/$name.err"
	rc=$?
	tv=$(json "$key" "$logs/$name.json")
	if [ $rc -ne 0 ] || [ -z "$tv" ]; then
		fail "$name" "exit $rc; $(tail -n 2 "$logs/$name.err" | tr '\n' ' ')"
		tv=
	fi
	pack
}

stage2() {
	say "-- training step, batch 128, data resident on the GPU (fp32, no TF32): kiln, kiln as a CUDA graph, PyTorch"
	mlp="data.path=$bundle/data/fashion-mnist data.resident=1 train.eval=0 train.epochs=100 train.max_steps=3000 train.log_every=1000"
	# issuing every op ([plugin.cuda] graph defaults to 1: off here), then
	# the step captured once and replayed
	# shellcheck disable=SC2086 # $mlp: the overrides, one word each
	kiln_sps step_kiln 30 tests/gpu/mlp.ini $mlp plugin.cuda.graph=0
	kiln_ms=
	if [ -n "$sps" ]; then
		kiln_ms=$(awk -v s="$sps" 'BEGIN { printf "%.4f", 128 / s * 1000 }')
		say "kiln:       $kiln_ms ms/step ($sps samples/s, from epoch 2 on)"
	fi
	# shellcheck disable=SC2086
	kiln_sps step_graph 30 tests/gpu/mlp.ini $mlp plugin.cuda.graph=1
	grep -E "captured|issues them one by one" "$logs/step_graph.log" 2>/dev/null | head -2 | tee -a "$res"
	if [ -n "$sps" ]; then
		graph_ms=$(awk -v s="$sps" 'BEGIN { printf "%.4f", 128 / s * 1000 }')
		say "kiln graph: $graph_ms ms/step ($sps samples/s)"
		[ -n "$kiln_ms" ] && target "CUDA graphs speed the MLP step up $(awk -v a="$kiln_ms" -v b="$graph_ms" 'BEGIN { printf "%.2f", a / b }')x (want >= 2)" \
			"$(awk -v a="$kiln_ms" -v b="$graph_ms" 'BEGIN { printf "%.4f", a / b }')" 2
	fi
	torch_json step_torch 30 ms_per_step tests/gpu/torch_mlp.py --data "$bundle/data/fashion-mnist" --steps 3000
	if [ -n "$tv" ]; then
		say "pytorch:    $tv ms/step ($(cat "$logs/step_torch.json"))"
		[ -n "$kiln_ms" ] &&
			say "ratio:      kiln / pytorch = $(awk -v k="$kiln_ms" -v t="$tv" 'BEGIN { printf "%.2f", k / t }') (below 1: kiln faster)"
	fi

	say "-- ResNet-50 224x224 batch 256 bf16 channels-last (examples/resnet50_synthetic.ini) vs PyTorch eager AMP"
	kiln_sps r50_kiln 90 examples/resnet50_synthetic.ini data.resident=1 data.samples=5120 train.epochs=3
	r50=$sps
	[ -n "$r50" ] && say "resnet50 kiln:    $r50 images/s (epoch 2, 20 steps)"
	# [plugin.cuda] conv_wgrad = lowp: dw in bf16, widened after (session 26)
	kiln_sps r50_wlowp 90 examples/resnet50_synthetic.ini data.resident=1 data.samples=5120 \
		train.epochs=3 plugin.cuda.conv_wgrad=lowp
	[ -n "$sps" ] && say "resnet50 kiln, conv_wgrad = lowp: $sps images/s$([ -n "$r50" ] &&
		awk -v a="$sps" -v b="$r50" 'BEGIN { printf " (%.2fx the default)", a / b }')"
	torch_json r50_torch 45 images_per_s tests/gpu/torch_bench.py resnet50
	if [ -n "$tv" ]; then
		say "resnet50 pytorch: $tv images/s ($(cat "$logs/r50_torch.json"))"
		[ -n "$r50" ] && target "ResNet-50 kiln / PyTorch = $(awk -v k="$r50" -v t="$tv" 'BEGIN { printf "%.2f", k / t }') (want >= 1.0)" \
			"$(awk -v k="$r50" -v t="$tv" 'BEGIN { printf "%.4f", k / t }')" 1.0
	fi

	say "-- GEMM-heavy MLP step (tests/gpu/gemm_mlp.ini, bf16, batch 4096) vs torch.matmul bf16 8192^3"
	kiln_sps gemm_kiln 30 tests/gpu/gemm_mlp.ini data.resident=1 data.samples=204800 train.epochs=3 train.max_steps=150
	gemm_tf=
	if [ -n "$sps" ]; then
		# FLOPs per sample of a training step: 3 GEMMs (forward, dx, dw) of 2*in*out each
		gemm_tf=$(awk -v s="$sps" 'BEGIN { printf "%.1f", s * 6 * (4096*8192 + 8192*8192 + 8192*4096 + 4096*1000) / 1e12 }')
		say "gemm mlp kiln: $sps samples/s = $gemm_tf TFLOP/s over the whole step"
	fi
	torch_json matmul_torch 20 tflops tests/gpu/torch_bench.py matmul
	if [ -n "$tv" ]; then
		say "torch.matmul bf16 8192^3: $tv TFLOP/s"
		[ -n "$gemm_tf" ] && target "GEMM MLP step at $(awk -v a="$gemm_tf" -v b="$tv" 'BEGIN { printf "%.0f", 100 * a / b }')% of torch.matmul's rate (want >= 60%)" \
			"$(awk -v a="$gemm_tf" -v b="$tv" 'BEGIN { printf "%.4f", a / b }')" 0.6
	fi
}

# GPT-2 124M (examples/gpt2_small.ini) bf16 on the repeated tokens, batch
# 8 x 1024, 3 epochs of 5 steps (timed from epoch 2), recompute = none and
# no warm-up (lr 6e-4 from step 1, so the 15 steps move the weights), once
# with the default path (cuDNN's fused attention) and once with kiln's
# kernels: the plans each took (KILN_LOG_LEVEL=debug: "SDPA ... cuDNN
# engine N" or a refusal), ms per step, and every step's losses within
# 0.05 of each other (bf16; the loss falls from ~10.9 as the model learns
# to copy from 61 positions back, which only a right attention allows)
attention_gpt2() {
	say "-- GPT-2 124M bf16 training step, batch 8 x 1024: KILN_CUDA_ATTN=auto (cuDNN) vs kiln (attn.cu)"
	for mode in auto kiln; do
		eval "gpt2_loss_$mode= gpt2_ms_$mode="
		if ! to=$(fit 60 25); then
			skipped "gpt2 $mode"
			continue
		fi
		KILN_CUDA_ATTN=$mode KILN_LOG_LEVEL=debug timeout "$to" "$bundle/bin/kiln" train \
			examples/gpt2_small.ini run.device=cuda run.precision=bf16 \
			data.path="$bundle/data/gpt2" data.shards=train.bin train.batch=8 \
			train.accumulate=1 train.epochs=3 train.max_steps=15 train.eval=0 \
			train.log_every=1 train.checkpoint_last=0 train.recompute=none train.warmup=0 \
			run.out_dir="$runs/gpt2_$mode" \
			> "$logs/gpt2_$mode.log" 2>&1
		rc=$?
		grep -E "SDPA |fused attention refused" "$logs/gpt2_$mode.log" | sort -u | head -4 | tee -a "$res"
		# epoch 2's rate: the steady steps (epoch 1 has the set-up and the
		# captures, epoch 3 the final checkpoint's 1.5 GB)
		sps=$(sed -n 's/^epoch 2\/[0-9]*: .*(\([0-9.]*\) s, \([0-9.]*\) samples\/s).*/\2/p' "$logs/gpt2_$mode.log" | tail -n 1)
		l1=$(sed -n 's/^epoch [0-9]* step [0-9]*\/[0-9]* loss \([0-9.]*\).*/\1/p' "$logs/gpt2_$mode.log" | tr '\n' ' ')
		eval "gpt2_loss_$mode=\$l1"
		if [ $rc -ne 0 ] || [ -z "$sps" ]; then
			fail "gpt2 $mode" "exit $rc; logs/gpt2_$mode.log"
			tail -n 3 "$logs/gpt2_$mode.log" | tee -a "$res"
		else
			eval "gpt2_ms_$mode=$(awk -v s="$sps" 'BEGIN { printf "%.2f", 8 / s * 1000 }')"
			say "gpt2 $mode: $(eval echo \$gpt2_ms_$mode) ms/step ($sps sequences/s), losses $l1"
		fi
		pack
	done
	if [ -n "$gpt2_loss_auto" ] && [ -n "$gpt2_loss_kiln" ]; then
		if awk -v a="$gpt2_loss_auto" -v b="$gpt2_loss_kiln" 'BEGIN {
			n = split(a, x, " "); m = split(b, y, " ")
			if (n != 15 || m != 15) exit 1
			for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 0.05 || d < -0.05) exit 1 }
		}'; then
			say "gpt2 losses: PASS (15 steps within 0.05; cuDNN path: $gpt2_loss_auto; kiln's: $gpt2_loss_kiln)"
		else
			fail "gpt2 losses" "cuDNN path: $gpt2_loss_auto; kiln's: $gpt2_loss_kiln: not 15 steps each within 0.05"
		fi
	fi
	[ -n "$gpt2_ms_auto" ] && [ -n "$gpt2_ms_kiln" ] &&
		say "gpt2 step: kiln's kernels / cuDNN = $(awk -v k="$gpt2_ms_kiln" -v c="$gpt2_ms_auto" 'BEGIN { printf "%.2f", k / c }') (above 1: cuDNN faster)"
	# the same step in PyTorch on the same GPU (tests/gpu/torch_bench.py
	# gpt2: AMP bf16, SDPA, fused AdamW, batch 8 x 1024): eager, and
	# torch.compile (its compile time apart) with KILN_GPU_TORCH_COMPILE=1
	modes=none
	[ "${KILN_GPU_TORCH_COMPILE:-0}" = 1 ] && modes="none default"
	for c in $modes; do
		want=90
		[ $c = default ] && want=180
		torch_json "gpt2_torch_$c" $want ms_per_step tests/gpu/torch_bench.py gpt2 --batch 8 \
			--warmup 3 --steps 10 --compile $c
		[ -n "$tv" ] || continue
		say "pytorch gpt2 compile=$c: $tv ms/step (first step, with any compile: $(json first_step_s "$logs/gpt2_torch_$c.json") s)"
		[ -n "$gpt2_ms_auto" ] &&
			say "TARGET gpt2 124M bf16 step, pytorch (compile=$c) / kiln = $(awk -v t="$tv" -v k="$gpt2_ms_auto" 'BEGIN { printf "%.2f", t / k }')x (above 1: kiln faster)"
	done
}

stage3() {
	say "-- fused attention on cuda, every case: cuDNN's SDPA graph (cudnn: the bf16/f16 shapes) and kiln's kernels (kiln: f32 loops, dropout, the lowp contract too)"
	attention_cases "attn_lowp_shapes attn_loops attn_dropout attn_lowp"
	attention_gpt2
}

# Stage 4: kiln's profiler (docs/profiler.md) on the three models of
# stages 2 and 3 whose step is slow against PyTorch: each op synchronised
# and timed (no CUDA graph), the table of self time per (layer, op, pass)
# into logs/prof_NAME.txt.  What to optimise, read off the GPU itself.
prof_one() {
	name=$1 want=$2 cfg=$3
	shift 3
	if ! to=$(fit "$want" 20); then
		skipped "prof $name"
		return
	fi
	timeout "$to" env ${prof_env:-} "$bundle/bin/kiln" train "$cfg" run.out_dir="$runs/prof_$name" \
		run.profile=1 run.profile_steps=0 "$@" > "$logs/prof_$name.log" 2>&1
	rc=$?
	if [ -f "$runs/prof_$name/profile.txt" ]; then
		cp "$runs/prof_$name/profile.txt" "$logs/prof_$name.txt"
		say "prof $name: logs/prof_$name.txt: $(head -n 1 "$logs/prof_$name.txt"); the ops over every layer (ms, % of the steps):"
		awk 'NR == 1 { tot = $(NF - 5) } NR > 4 && NF >= 9 && $(NF - 5) ~ /^[0-9]+$/ && $1 != "total" {
			k = $(NF - 7) " " $(NF - 6); ms[k] += $(NF - 4); n[k] += $(NF - 5) }
			END { for (k in ms) printf "  %-32s %10.3f %6.1f%% %7d calls\n", k, ms[k], 100 * ms[k] / tot, n[k] }' \
			"$logs/prof_$name.txt" | sort -k3 -g -r | head -n 16 | tee -a "$res"
	else
		fail "prof $name" "exit $rc, no profile.txt; logs/prof_$name.log"
		tail -n 3 "$logs/prof_$name.log" | tee -a "$res"
	fi
	pack
}

stage4() {
	say "-- kiln's profiler on cuda: GPT-2 124M bf16, ResNet-50 bf16, the GEMM-heavy MLP"
	prof_one gpt2 60 examples/gpt2_small.ini run.device=cuda run.precision=bf16 \
		data.path="$bundle/data/gpt2" data.shards=train.bin train.batch=8 \
		train.accumulate=1 train.epochs=1 train.max_steps=5 train.eval=0 \
		train.checkpoint_last=0 train.recompute=none train.warmup=0
	# at debug level: each convolution's engine, and why the mixed bf16
	# weight-gradient graph found none (cudnn.c)
	prof_env=KILN_LOG_LEVEL=debug
	prof_one r50 50 examples/resnet50_synthetic.ini data.resident=1 data.samples=2560 \
		train.epochs=1 train.max_steps=8 train.checkpoint_last=0
	prof_env=
	grep -h 'the mixed graph\|f32 conv on widened' "$logs/prof_r50.log" | sed 's/^.*cuda\] *//' |
		sort | uniq -c | sort -rn | head -n 6 | tee -a "$res"
	# the weight gradients in bf16, widened after (conv_wgrad = lowp, session 26)
	prof_env=KILN_LOG_LEVEL=debug
	prof_one r50_wlowp 50 examples/resnet50_synthetic.ini data.resident=1 data.samples=2560 \
		train.epochs=1 train.max_steps=8 train.checkpoint_last=0 plugin.cuda.conv_wgrad=lowp
	prof_env=
	wlowp_count "$logs/prof_r50_wlowp.log" "prof r50_wlowp"
	# cuDNN's engines timed ([run] autotune, off by default): the weight
	# gradients' share above against this one
	prof_one r50_tuned 50 examples/resnet50_synthetic.ini data.resident=1 data.samples=2560 \
		train.epochs=1 train.max_steps=8 train.checkpoint_last=0 run.autotune=1 \
		plugin.cuda.autotune_cache=none
	prof_one gemm 30 tests/gpu/gemm_mlp.ini data.resident=1 data.samples=204800 \
		train.epochs=1 train.max_steps=20 train.checkpoint_last=0
	# [run] fuse = 1 (auto is off on a GPU): the ReLUs in cuBLASLt's epilogue
	prof_one gemm_fused 30 tests/gpu/gemm_mlp.ini data.resident=1 data.samples=204800 \
		train.epochs=1 train.max_steps=20 train.checkpoint_last=0 run.fuse=1
}

# ---- the run ------------------------------------------------------------------

machine
for s in $stages; do
	stage_t0=$(date +%s)
	stage_budget=$(stage_default "$s")
	export stage_t0 stage_budget
	say "== stage $s (budget $stage_budget s; $(left) s left of the run's $run_budget s)"
	stage$s
	say "== stage $s done in $(($(date +%s) - stage_t0)) s"
	pack
done
[ $targets_tried -gt 0 ] && say "TARGETS: $targets_met of $targets_tried measured targets met"
if [ $status -eq 0 ]; then say "RESULT: PASS"; else say "RESULT: FAIL"; fi
say "run took $(($(date +%s) - run_t0)) s"
pack
rm -rf "$work"
exit $status
