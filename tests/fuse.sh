#!/bin/sh
# tests/fuse.sh - [run] fuse (auto: on on the CPU): an activation that alone
# reads a linear, conv or batchnorm layer runs as that layer's epilogue.
# The fused and unfused runs give the same numbers (ReLU: identical
# metrics, bit for bit, for the MLP (also with accumulate = 2), the CNN in both layouts, a
# conv-batchnorm-ReLU net and bf16 compute; GELU, fused in evaluation only,
# within 1e-5 of the unfused loss); and the fusion really happens: the
# profile of a fused run has no op of the ReLU layers while the unfused one
# has, and `kiln memory` shows the fused ReLU as a view.  The NCHW CNN's
# conv1 writes NHWC into pool1 (ABI 2.17), in f32 only, and the debug log
# says so only where it runs.
name=fuse
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_fashion_mnist

mlp="$srcdir/examples/fashion_mnist_mlp.ini"
cnn="$srcdir/examples/fashion_mnist_cnn.ini"
short="data.limit=640 data.eval.limit=256 train.max_steps=5 train.batch=64 train.epochs=1"

# pair LABEL CONFIG ARGS...: train fused and unfused, metrics identical
pair() {
	label=$1 cfg=$2
	shift 2
	# shellcheck disable=SC2086
	kiln 0 train "$cfg" $short "run.out_dir=$tmp/$label.1" run.fuse=1 "$@"
	cp "$out" "$tmp/$label.1.out"
	# shellcheck disable=SC2086
	kiln 0 train "$cfg" $short "run.out_dir=$tmp/$label.0" run.fuse=0 "$@"
	cp "$out" "$tmp/$label.0.out"
	same_metrics unfused "$tmp/$label.0.out" fused "$tmp/$label.1.out"
	echo "ok: $label: fused and unfused runs agree (test_loss $(field test_loss "$tmp/$label.1.out"))"
}

pair mlp "$mlp"
# (the NCHW CNN's fused conv1 runs NHWC, its unfused one NCHW: by oneDNN
# the same bytes; by kiln's first-layer kernel, convthin.c, the two
# layouts' weight gradients sum in other orders, so the pair is oneDNN's;
# in NHWC both runs are convthin's NHWC kernel)
KILN_CPU_CONVTHIN=0 pair cnn "$cnn"
pair cnn_nhwc "$cnn" model.layout=nhwc
pair mlp_bf16 "$mlp" run.precision=bf16
# accumulation: the ReLU pass that writes the bias gradient (RELU_BWD's
# out1) must not run on the micro-steps that add
pair mlp_accum "$mlp" train.accumulate=2

# conv -> batchnorm -> relu (BN_TRAIN/BN_INFER/BN_BWD with the ReLU), and a
# linear -> batchnorm -> relu on [N, C]
{
	ini run seed=3
	ini_fmnist path="$FM"
	ini_layers conv1:conv:out=8:kernel=3:padding=1 bn1:batchnorm relu1:relu pool1:maxpool:kernel=2 \
		flat:flatten fc1:linear:out=32 bn2:batchnorm relu2:relu fc2:linear:out=10 loss:softmax_xent
	ini train lr=0.05 momentum=0.9
} > "$tmp/bn.ini"
pair bn "$tmp/bn.ini"
pair bn_nhwc "$tmp/bn.ini" model.layout=nhwc
pair bn_recompute "$tmp/bn.ini" train.recompute=2

# GELU: fused into the linear layer in evaluation only (oneDNN's erf GELU
# against kiln's own: equal to float rounding)
sed -e 's/type = relu/type = gelu/' "$mlp" >"$tmp/gelu.ini"
for f in 0 1; do
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/gelu.ini" $short "run.out_dir=$tmp/gelu.$f" run.fuse=$f
	cp "$out" "$tmp/gelu.$f.out"
done
[ "$(field train_loss "$tmp/gelu.0.out")" = "$(field train_loss "$tmp/gelu.1.out")" ] ||
	fail "gelu: training is not fused, yet train_loss differs"
a=$(field test_loss "$tmp/gelu.0.out")
b=$(field test_loss "$tmp/gelu.1.out")
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }' ||
	fail "gelu: fused test_loss $b, unfused $a"
echo "ok: gelu: evaluation fused, test_loss $b against $a"

# the fused run's profile has no op of relu1/relu2 (the fc layers' GEMMs
# end in the ReLU); the unfused run's has them
for f in 0 1; do
	# shellcheck disable=SC2086
	kiln 0 train "$mlp" --profile $short "run.out_dir=$tmp/p.$f" run.fuse=$f run.profile_steps=0
done
grep -q '^fc1 ' "$tmp/p.1/profile.txt" || fail "fused profile has no fc1 row"
! grep -q '^relu[12] ' "$tmp/p.1/profile.txt" || fail "fused profile still runs the ReLU layers"
grep -q '^relu1 ' "$tmp/p.0/profile.txt" || fail "unfused profile has no relu1 row"
echo "ok: the fused run's profile has no ReLU op, the unfused one has"

# conv -> relu -> maxpool: the fused ReLU's mask is not taken on the conv's
# output (plan.c relu_fold) but by the pooling: the CPU's 2x2 kernel (f32
# in both layouts, bf16 in NCHW) keeps it in its forward's aux, no
# relu_bwd at all (ABI 2.16, POOL with KILN_OPF_ACT).  The numbers are pair
# cnn's above, both layouts.
for lay in nchw nhwc bf16; do
	case $lay in
	bf16) set -- model.layout=nchw run.precision=bf16 ;;
	*) set -- model.layout=$lay ;;
	esac
	# shellcheck disable=SC2086
	kiln 0 train "$cnn" --profile $short "run.out_dir=$tmp/pc.$lay" run.fuse=1 run.profile_steps=0 "$@"
	grep -q '^pool1  *pool_bwd ' "$tmp/pc.$lay/profile.txt" || fail "$lay: no pool1 backward in the profile"
	! grep -q '^pool[12]  *relu_bwd ' "$tmp/pc.$lay/profile.txt" ||
		fail "$lay: a pooling masks apart (relu_bwd), not in its aux"
	! grep -q '^conv[12]  *relu_bwd ' "$tmp/pc.$lay/profile.txt" ||
		fail "$lay: a conv still masks its whole output"
done
echo "ok: the CNN's ReLU masks run in the poolings' aux"

# the fold in the aux only where it is exact: overlapping, padded windows
# (pool1, oneDNN's kernel, refuses it: the mask then runs on the pooled
# output, a relu_bwd) and 2x2 windows that drop a row and a column (pool2,
# 13 x 13: folded); fused and unfused agree, both layouts
{
	ini run seed=5
	ini_fmnist path="$FM"
	ini_layers conv1:conv:out=8:kernel=4 relu1:relu pool1:maxpool:kernel=3:stride=2:padding=1 \
		conv2:conv:out=8:kernel=3:padding=1 relu2:relu pool2:maxpool:kernel=2 \
		flat:flatten fc1:linear:out=10 loss:softmax_xent
	ini train lr=0.05 momentum=0.9
} > "$tmp/odd.ini"
pair odd "$tmp/odd.ini"
pair odd_nhwc "$tmp/odd.ini" model.layout=nhwc
pair odd_nchw "$tmp/odd.ini" model.layout=nchw
# the weights and momenta, every byte (the parameter gradients were the same)
for label in cnn cnn_nhwc odd odd_nhwc odd_nchw; do
	"$top_builddir/tests/ckpt_tool" same "$tmp/$label.0/checkpoints/ckpt-5.kiln" \
		"$tmp/$label.1/checkpoints/ckpt-5.kiln" params optim.momentum ||
		fail "$label: the fused run's weights differ from the unfused run's"
done
echo "ok: the fused and unfused CNNs' weights and momenta are the same bytes"
for lay in nchw nhwc; do
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/odd.ini" --profile $short "run.out_dir=$tmp/po.$lay" run.fuse=1 run.profile_steps=0 \
		model.layout=$lay
	grep -q '^pool1  *relu_bwd ' "$tmp/po.$lay/profile.txt" || fail "odd $lay: pool1 does not mask (no relu_bwd)"
	! grep -q '^pool2  *relu_bwd ' "$tmp/po.$lay/profile.txt" || fail "odd $lay: pool2 masks apart"
	! grep -q '^conv[12]  *relu_bwd ' "$tmp/po.$lay/profile.txt" || fail "odd $lay: a conv masks"
done
echo "ok: a 3x3/2 padded max pooling masks its output, the 2x2 one in its aux"

# conv1 (one input channel, its ReLU fused, read by pool1 alone) in an NCHW
# model writes NHWC, and pool1 pools it into NCHW (ABI 2.17: POOL NHWC ->
# NCHW): conv1's ops reorder the weights only (not y, not dy); the weights
# and momenta are the unfused NCHW run's bytes (pair cnn, above).  The odd
# net's 3x3/2 padded pool1 is refused by the CPU (kiln's 2x2 kernel only):
# its plan is made again in NCHW (also the same bytes, pair odd_nchw).
KILN_LOG_LEVEL=debug KILN_CPU_CONVTHIN=0 kiln 0 train "$cnn" $short "run.out_dir=$tmp/mx" run.fuse=1
grep -q "layer 'conv1': output NHWC for 'pool1', which writes NCHW" "$err" ||
	fail "conv1 of the NCHW CNN does not write NHWC"
grep -q 'POOL max 2x2/2 f32 x \[64,32,28,28\] NHWC, y NCHW: kiln' "$err" ||
	fail "pool1 does not pool NHWC into NCHW"
grep -q 'CONV x \[64,1,28,28\] .* NHWC: .* + 1 reorders' "$err" ||
	fail "conv1's forward is not an NHWC conv reordering its weights only"
! grep -q 'CONV x \[64,1,28,28\] .* NCHW' "$err" || fail "conv1 still runs in NCHW"
# the same by kiln's first-layer kernel where this CPU has AVX-512 (F, BW, VL)
if grep -q avx512bw /proc/cpuinfo 2>/dev/null && grep -q avx512vl /proc/cpuinfo; then
	KILN_LOG_LEVEL=debug kiln 0 train "$cnn" $short "run.out_dir=$tmp/mx.thin" run.fuse=1
	grep -q 'CONV x \[64,1,28,28\] .* NHWC: kiln.s direct kernel for few input channels' "$err" ||
		fail "conv1's forward is not convthin.c's NHWC kernel"
	! grep -q 'CONV x \[64,1,28,28\] .* NCHW' "$err" || fail "convthin: conv1 still runs in NCHW"
fi
KILN_LOG_LEVEL=debug kiln 0 train "$tmp/odd.ini" $short "run.out_dir=$tmp/mx.odd" run.fuse=1 model.layout=nchw
grep -q "planned again in the model's layout" "$err" || fail "odd: the refused NHWC -> NCHW pooling was not planned again"
! grep -q 'NHWC, y NCHW' "$err" || fail "odd: a pooling NHWC -> NCHW ran"
! grep -q "output NHWC for" "$err" || fail "odd: the log says a conv writes NHWC, its plan was made again in NCHW"
# bf16 compute: conv1 reads bf16, no mixed stem's input: it runs NCHW, and
# the log says nothing else (it said "output NHWC" from kiln_model_create's
# f32 inference)
# shellcheck disable=SC2086
KILN_LOG_LEVEL=debug kiln 0 train "$cnn" $short "run.out_dir=$tmp/mx.bf16" run.fuse=1 run.precision=bf16
grep -q 'CONV x \[64,1,28,28\] .* NCHW: ' "$err" || fail "bf16: conv1 does not run NCHW"
! grep -q 'CONV x \[64,1,28,28\] .* NHWC: ' "$err" || fail "bf16: conv1 runs NHWC"
! grep -q "output NHWC for" "$err" || fail "bf16: the log says conv1 writes NHWC, it runs NCHW"
echo "ok: conv1 NHWC into pool1 NCHW in the NCHW CNN; refused for a 3x3 pooling; NCHW in bf16, and so logged"

kiln 0 memory "$mlp" run.fuse=1
grep -q '^ *relu1 .*(view)' "$out" || fail "kiln memory: relu1 is not a view when fused"
kiln 0 memory "$mlp" run.fuse=0
! grep -q '^ *relu1 .*(view)' "$out" || fail "kiln memory: relu1 a view with fuse = 0"
echo "ok: fuse.sh: $checks kiln runs"
