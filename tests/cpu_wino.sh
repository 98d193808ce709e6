#!/bin/sh
# tests/cpu_wino.sh - Winograd's F(4x4, 3x3) (plugins/cpu/wino.c) in whole
# runs of the ResNet example (NHWC, 3x3 layers of 16-64 channels), on a
# CPU with AVX-512F, BW and VL (elsewhere: skipped, as the kernel is):
#  1. `conv_algo = winograd` in training: the 3x3 stride-1 layers'
#     forwards and data gradients run by Winograd (the debug lines say so;
#     the weight gradients oneDNN's),
#     and the run agrees with `direct` within 1e-3 of the loss and, each
#     such conv weight's second update, within 5e-3 (measured: see the
#     comparisons);
#  2. the default (`rule`) trains without it and `kiln predict` (an
#     inference plan: frozen weights) runs the same layers by it, its
#     logits within 1e-4 of the largest of `kiln predict`'s with
#     KILN_CPU_WINO=0 on 500 images.
name=cpu_wino
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
grep -q avx512bw /proc/cpuinfo 2>/dev/null && grep -q avx512vl /proc/cpuinfo || {
	echo "SKIP: no AVX-512 BW and VL on this CPU: wino.c does not run here (tests/check_cpu_wino checks that)"
	exit 77
}

res="$srcdir/examples/fashion_mnist_resnet.ini"
short="data.limit=1280 data.eval.limit=500 train.max_steps=10 train.epochs=1 run.threads=2"

# ---- 1. training with conv_algo = winograd ---------------------------------------
# shellcheck disable=SC2086
KILN_LOG_LEVEL=debug kiln 0 train "$res" $short "run.out_dir=$tmp/wino" plugin.cpu.conv_algo=winograd
cp "$out" "$tmp/wino.out"
for op in CONV CONV_BWD_DATA; do
	for shape in "\[128,16,28,28\] -> \[128,16,28,28\]" "\[128,32,14,14\] -> \[128,32,14,14\]" \
		"\[128,64,7,7\] -> \[128,64,7,7\]"; do
		grep -q "$op [xdy]* $shape pad 1x1 NHWC.*(wino.c)" "$err" ||
			fail "winograd: $op $shape did not run by Winograd"
	done
done
! grep -q "CONV_BWD_WEIGHTS.*(wino.c)" "$err" || fail "winograd: a weight gradient ran by wino.c"
# shellcheck disable=SC2086
kiln 0 train "$res" $short "run.out_dir=$tmp/direct" plugin.cpu.conv_algo=direct
cp "$out" "$tmp/direct.out"
# float rounding only, after 10 steps of SGD with momentum (measured
# here: see the session's PERFORMANCE.md section); a wrong data gradient
# moves the loss by far more
losses_agree ResNet winograd "$tmp/wino.out" direct "$tmp/direct.out" 1e-3
# each 3x3 conv weight's second update (step 1 to 2, the same initial
# weights): float rounding only
for algo in winograd direct; do
	# shellcheck disable=SC2086
	kiln 0 train "$res" $short "run.out_dir=$tmp/u-$algo" plugin.cpu.conv_algo=$algo train.max_steps=2 \
		train.eval=0 train.checkpoint_every=1
done
"$top_builddir/tests/ckpt_tool" step "$(ck u-winograd 1)" "$(ck u-winograd 2)" "$(ck u-direct 1)" \
	"$(ck u-direct 2)" 5e-3 s1_conv1.weight s1_conv2.weight s2_conv2.weight s3_conv2.weight ||
	fail "winograd and direct: the 3x3 layers' second updates differ by more than float rounding"
echo "ok: winograd and direct: the 3x3 layers' second updates agree"

# ---- 2. the default: not in training, in kiln predict ---------------------------
# shellcheck disable=SC2086
KILN_LOG_LEVEL=debug kiln 0 train "$res" $short train.max_steps=2 "run.out_dir=$tmp/rule"
! grep -q "(wino.c)" "$err" || fail "rule: a training or evaluation plan ran by Winograd"
KILN_LOG_LEVEL=debug kiln 0 predict "$res" --eval-set --logits "$tmp/l1.npy" "run.out_dir=$tmp/wino" \
	data.eval.limit=500 run.threads=2
grep -q "CONV x .*(wino.c)" "$err" || fail "predict: no convolution ran by Winograd"
KILN_CPU_WINO=0 kiln 0 predict "$res" --eval-set --logits "$tmp/l0.npy" "run.out_dir=$tmp/wino" \
	data.eval.limit=500 run.threads=2
# the logits [500, 10] of the two (.npy, f32): max |difference| over max |logit|
d=$(/usr/bin/python3 - "$tmp/l0.npy" "$tmp/l1.npy" <<'PY'
import struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    return struct.unpack("<%df" % ((len(b) - 10 - n) // 4), b[10 + n:])
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 5000, (len(a), len(b))
print(max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a))
PY
) || fail "predict: the logits could not be compared"
echo "predict: logits with and without Winograd differ by $d of the largest"
# measured here: see the session's PERFORMANCE.md section (1e-7 to 1e-6
# on the ResNet's logits); a wrong transform gives order 1
awk -v d="$d" 'BEGIN { exit !(d < 1e-4) }' || fail "predict: the logits differ by $d of the largest with Winograd"
echo "PASS: $name ($checks checks)"
