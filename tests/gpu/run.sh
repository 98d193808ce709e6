#!/bin/sh
# tests/gpu/run.sh - the GPU check of the CUDA device, in two halves.
#
#   tests/gpu/run.sh --prepare   here (a machine with the CUDA toolkit, no GPU
#                                needed): build kiln with the CUDA device and
#                                gather what the GPU machine needs into
#                                _build/gpu/bundle (git-ignored, < 64 MiB):
#                                the kiln binary, libkiln, the cuda and loaders
#                                plugins, the conformance suite, the shared
#                                libraries they use that a bare GPU machine
#                                may lack, and the Fashion-MNIST test split.
#   tests/gpu/run.sh             on the GPU machine, from the repository root,
#                                with the bundle carried: run the device
#                                conformance suite on cuda, train the MLP
#                                (tests/gpu/mlp.ini), time its training step
#                                against the same MLP in PyTorch on the same
#                                GPU, and write $OUT/gpu_results.txt (plus
#                                the logs beside it).
#
# docs/gpu.md has the exact commands.  The run takes a few minutes on an
# H200; every step has a timeout and the timeouts add up to 7.5 minutes
# (conformance 180 s, training 120 s, kiln step 60 s, PyTorch step 90 s),
# so the run ends within the 8 minutes it is given whatever hangs.  Exit
# status: 0 when every check passed, 77 when no usable GPU was found (the
# results say why; nothing is claimed), 1 when a check failed.
set -u

here=$(cd "$(dirname "$0")/../.." && pwd)
bundle=$here/_build/gpu/bundle

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
	make -C "$build" -j2 tests/check_device
	# the GEMM parameter mapping of the CUDA device (cuda_gemm_map in
	# plugins/cuda/cuda.h) against a row-major reference: host-only, so
	# it is checked here, before any GPU time is spent
	mkdir -p "$here/_build/gpu"
	cc -O1 -I"$here/include" -I"$build" -I"${CUDA_HOME:-/usr/local/cuda}/include" \
		-o "$here/_build/gpu/gemm_map_test" "$here/plugins/cuda/gemm_map_test.c" -lm
	"$here/_build/gpu/gemm_map_test"
	if [ ! -f "$build/plugins/.libs/kiln-cuda.so" ]; then
		echo "run.sh --prepare: $build has no plugins/.libs/kiln-cuda.so: configure found no CUDA toolkit (see the configure summary; --with-cuda=PATH)" >&2
		exit 1
	fi
	rm -rf "$bundle"
	mkdir -p "$bundle/bin" "$bundle/lib/kiln" "$bundle/data/fashion-mnist" "$bundle/tests/data"
	# the real executables (the build tree's are libtool wrapper scripts)
	cp "$build/.libs/kiln" "$bundle/bin/kiln"
	cp "$build/tests/.libs/check_device" "$bundle/bin/check_device"
	# libkiln under its soname as a plain file: the device tool carries a
	# symbolic link only as a link
	cp -L "$build/.libs/libkiln.so.0" "$bundle/lib/libkiln.so.0"
	# kiln-cpu.so is left out: the GPU run does not use it, and oneDNN is
	# 40 MB of the 64 MiB the device tool carries
	cp "$build/plugins/.libs/kiln-cuda.so" "$build/plugins/.libs/kiln-loaders.so" "$bundle/lib/kiln/"
	# shared libraries outside the C runtime and CUDA, which a GPU machine
	# with no package manager may lack (inih, check, jansson, turbojpeg,
	# png, lmdb, ...); found with ldd, copied under their sonames
	for f in "$bundle/bin/kiln" "$bundle/bin/check_device" "$bundle/lib/kiln/"*.so; do
		LD_LIBRARY_PATH="$build/.libs" ldd "$f"
	done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
	while read -r soname path; do
		case $soname in
		libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
		libcublas*|libcudart*|libcuda.so*|libkiln.so*) ;;
		# cuDNN's engine libraries are ~250 MB, far over the 64 MiB carried:
		# the GPU half finds libcudnn.so.9 on that machine
		libcudnn*) ;;
		*) cp -L "$path" "$bundle/lib/$soname" ;;
		esac
	done
	src=${KILN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
	cp "$src/t10k-images-idx3-ubyte.gz" "$src/t10k-labels-idx1-ubyte.gz" "$bundle/data/fashion-mnist/"
	cp "$here/tests/data/loss_refs.txt" "$bundle/tests/data/"
	# the CPU device's accuracy on the same run, the reference the GPU's
	# must reach (the GPU machine has no kiln-cpu.so to compute it)
	echo "training tests/gpu/mlp.ini on the cpu device for the reference accuracy..."
	"$build/kiln" train "$here/tests/gpu/mlp.ini" run.device=cpu data.path="$src" \
		run.out_dir="$here/_build/gpu/cpu_ref" > "$here/_build/gpu/cpu_ref.log" 2>&1
	sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$here/_build/gpu/cpu_ref.log" | tail -1 > "$bundle/cpu_test_acc.txt"
	echo "cpu reference test accuracy: $(cat "$bundle/cpu_test_acc.txt")"
	[ -s "$bundle/cpu_test_acc.txt" ]
	echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1))"
	ls -R "$bundle"
	echo "now, for the device tool: command 'tests/gpu/run.sh', carry ['_build/gpu/bundle'] (docs/gpu.md)"
	exit 0
fi

# ---- the GPU run --------------------------------------------------------------
cd "$here"
out=${OUT:-$here/_build/gpu/out}
mkdir -p "$out"
res=$out/gpu_results.txt
: > "$res"
say() { echo "$*" | tee -a "$res"; }
status=0

if [ ! -x "$bundle/bin/kiln" ]; then
	say "FAIL: no bundle at $bundle: run tests/gpu/run.sh --prepare first and carry _build/gpu/bundle"
	exit 1
fi
# The bundle's libraries first, then the CUDA libraries wherever this machine
# keeps them (kiln-cuda.so's own runpath names the build machine's toolkit).
cuda_lib=
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/bin/nvcc)")/../lib64"; do
	[ -e "$d/libcublasLt.so.13" ] && { cuda_lib=$d; break; }
done
# cuDNN 9 (kiln-cuda.so links libcudnn.so.9, which loads its engine
# libraries from the library path): the toolkit, PyTorch's pip packages
# (nvidia-cudnn-cu*, or torch/lib), then whatever ldconfig knows.
cudnn_lib=
for d in "$cuda_lib" "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
	$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null) \
	$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null) \
	$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 / { sub("/libcudnn.so.9$", "", $NF); print $NF; exit }'); do
	[ -n "$d" ] && [ -e "$d/libcudnn.so.9" ] && { cudnn_lib=$d; break; }
done
LD_LIBRARY_PATH="$bundle/lib${cuda_lib:+:$cuda_lib}${cudnn_lib:+:$cudnn_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KILN_PLUGIN_PATH=$bundle/lib/kiln
export LD_LIBRARY_PATH KILN_PLUGIN_PATH

say "== kiln GPU check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "-- machine"
if command -v nvidia-smi > /dev/null 2>&1; then
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$res"
else
	say "nvidia-smi: not available"
fi
if command -v nvcc > /dev/null 2>&1; then
	nvcc --version 2>&1 | tail -1 | tee -a "$res"
else
	say "nvcc: not on PATH"
fi
say "CUDA libraries for kiln-cuda.so: ${cuda_lib:-not found (no libcublasLt.so.13 under \$CUDA_HOME/lib64 or /usr/local/cuda/lib64)}"
if [ -n "$cudnn_lib" ]; then
	say "cuDNN for kiln-cuda.so: $cudnn_lib ($(cd "$cudnn_lib" && ls libcudnn.so.9* libcudnn_graph.so.9* 2>/dev/null | tr '\n' ' '))"
else
	say "cuDNN for kiln-cuda.so: libcudnn.so.9 NOT FOUND (toolkit lib64, pip nvidia.cudnn, torch/lib, ldconfig): kiln-cuda.so cannot load, every cuda step below fails"
fi
ldd "$bundle/lib/kiln/kiln-cuda.so" > "$out/ldd_kiln_cuda.txt" 2>&1
grep "not found" "$out/ldd_kiln_cuda.txt" | sed 's/^/ldd kiln-cuda.so: /' | tee -a "$res"

say "-- kiln plugins"
"$bundle/bin/kiln" plugins > "$out/plugins.txt" 2>&1
grep -E "^device|NOT LOADED" "$out/plugins.txt" | tee -a "$res"

# 1. the device conformance suite on cuda
say "-- conformance suite (tests/check_device, KILN_TEST_DEVICE=cuda)"
KILN_TEST_DEVICE=cuda KILN_TEST_SRCDIR=$bundle timeout 180 "$bundle/bin/check_device" \
	> "$out/check_device_cuda.log" 2>&1
rc=$?
tail -n 40 "$out/check_device_cuda.log" | grep -E "^[0-9]+%|skipping|not available|available:|Failures|Errors" | tee -a "$res"
case $rc in
0) say "conformance: PASS" ;;
77) say "conformance: SKIPPED (exit 77: the cuda device is not available here; see above). Nothing below ran on a GPU."
    say "RESULT: NOT RUN: no usable GPU"
    exit 77 ;;
124) say "conformance: FAIL (timed out after 180 s)"; status=1 ;;
*) say "conformance: FAIL (exit $rc; $out/check_device_cuda.log)"; status=1 ;;
esac

# 2. train the MLP on the GPU (Fashion-MNIST test split)
say "-- training tests/gpu/mlp.ini on cuda (5 epochs over the 10,000-image test split)"
timeout 120 "$bundle/bin/kiln" train tests/gpu/mlp.ini data.path="$bundle/data/fashion-mnist" \
	run.out_dir="$out/run_mlp" > "$out/train_mlp.log" 2>&1
rc=$?
grep -E "^epoch [0-9]+/|final test accuracy" "$out/train_mlp.log" | tee -a "$res"
if [ $rc -ne 0 ]; then
	say "training: FAIL (exit $rc); last lines:"
	tail -n 5 "$out/train_mlp.log" | tee -a "$res"
	status=1
else
	acc=$(sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$out/train_mlp.log" | tail -1)
	# the CPU device's accuracy on the same run (measured by --prepare);
	# the GPU's sums run in another order, so allow 0.02 either way
	ref=$(cat "$bundle/cpu_test_acc.txt" 2>/dev/null)
	if [ -z "$ref" ]; then
		say "training: FAIL (no cpu_test_acc.txt in the bundle: rerun tests/gpu/run.sh --prepare)"
		status=1
	elif awk -v a="${acc:-0}" -v r="$ref" 'BEGIN { d = a - r; exit !(d <= 0.02 && d >= -0.02) }'; then
		say "training: PASS (test accuracy $acc; the cpu device's $ref, within 0.02)"
	else
		say "training: FAIL (test accuracy ${acc:-?}; the cpu device's $ref: more than 0.02 apart)"
		status=1
	fi
fi

# 3. the training step, kiln vs PyTorch, one fixed batch resident on the GPU
say "-- training step, batch 128, data resident on the GPU (fp32, no TF32)"
timeout 60 "$bundle/bin/kiln" train tests/gpu/mlp.ini data.path="$bundle/data/fashion-mnist" \
	run.out_dir="$out/run_step" data.resident=1 train.eval=0 train.epochs=100 \
	train.max_steps=3000 train.log_every=1000 > "$out/step_kiln.log" 2>&1
rc=$?
kiln_sps=$(sed -n 's/.*"train_samples_per_s": \([0-9.]*\).*/\1/p' "$out/step_kiln.log" | tail -1)
if [ $rc -ne 0 ] || [ -z "$kiln_sps" ]; then
	say "kiln step: FAIL (exit $rc; $out/step_kiln.log)"
	status=1
else
	kiln_ms=$(awk -v s="$kiln_sps" 'BEGIN { printf "%.4f", 128 / s * 1000 }')
	say "kiln:    $kiln_ms ms/step ($kiln_sps samples/s; kiln times from epoch 2 on, the first epoch's warm-up excluded)"
fi
if python3 -c "import torch" 2>/dev/null; then
	timeout 90 python3 tests/gpu/torch_mlp.py --data "$bundle/data/fashion-mnist" --steps 3000 \
		> "$out/step_torch.json" 2> "$out/step_torch.err"
	rc=$?
	torch_ms=$(sed -n 's/.*"ms_per_step": \([0-9.]*\).*/\1/p' "$out/step_torch.json")
	if [ $rc -ne 0 ] || [ -z "$torch_ms" ]; then
		say "pytorch step: FAIL (exit $rc; $out/step_torch.err)"
		status=1
	else
		say "pytorch: $torch_ms ms/step ($(cat "$out/step_torch.json"))"
		[ -n "${kiln_ms:-}" ] &&
			say "ratio:   kiln / pytorch = $(awk -v k="$kiln_ms" -v t="$torch_ms" 'BEGIN { printf "%.2f", k / t }') (below 1: kiln faster)"
	fi
else
	say "pytorch: not importable here (python3 -c 'import torch' failed): no comparison"
fi

if [ $status -eq 0 ]; then
	say "RESULT: PASS"
else
	say "RESULT: FAIL"
fi
exit $status
