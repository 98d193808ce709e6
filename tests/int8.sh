#!/bin/sh
# tests/int8.sh - inference passes end to end (docs/inference.md): the
# Fashion-MNIST CNN trained briefly (6000 samples, 2 epochs), then
#  - kiln eval --fold: the folded model (dropout removed, ReLUs in the
#    epilogues) gives the unfolded evaluation's accuracy and loss;
#  - kiln quantize (percentile, minmax and entropy ranges, calibrated on 4 batches of
#    training data) and kiln eval --quantized: test accuracy within 0.5
#    points of fp32 on the first 2000 test images; the same for the MLP
#    (its fc1 reads the data through a flatten);
#  - u8 between the INT8 layers (chaining, the CPU's default: conv2 writes
#    u8 for fc1 through pool2 and flatten, fc1 for fc2) against the same
#    model with f32 between them (int8_out_scale=0): the same accuracy and
#    the loss within 1e-3; an int8_out_scale without a fused ReLU, or on a
#    layer that is not INT8, is refused naming the layer;
#  - the ResNet's residual adds writing u8 for the INT8 convs after them give
#    the loss of the adds in f32 to the last digit; training refuses it;
#  - no seeded initial draw where a checkpoint or quantized file supplies
#    every weight (debug log), and the evaluation equals training's;
#  - a quantized file with another model's config, and a file that is not a
#    quantized model, are refused with a message naming the problem; so
#    are the quantized file given as a checkpoint, an empty file name, and
#    [run] precision bf16/fp16 with an INT8 model.
name=int8
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cnn="$srcdir/examples/fashion_mnist_cnn.ini"
run="run.out_dir=$tmp/cnn data.path=$FM"
ev="data.eval.limit=2000"
# newest_ck picks by step number (ckpt-10 after ckpt-9; before session 30 a
# name-ordered `ls | tail -1` took ckpt-9)
mkdir -p "$tmp/order/checkpoints" && : > "$tmp/order/checkpoints/ckpt-9.kiln" &&
	: > "$tmp/order/checkpoints/ckpt-10.kiln"
[ "$(newest_ck order)" = "$tmp/order/checkpoints/ckpt-10.kiln" ] || fail "newest_ck: $(newest_ck order)"
kiln 0 train "$cnn" $run data.limit=6000 data.eval.limit=500 train.epochs=2
ck=$(newest_ck cnn)
tl=$(field test_loss "$out") ta=$(field test_acc "$out")

kiln 0 eval "$cnn" $run $ev --checkpoint "$ck"
acc=$(field test_acc "$out") loss=$(field test_loss "$out")
kiln 0 eval "$cnn" $run $ev --checkpoint "$ck" --fold
[ "$(field test_acc "$out")" = "$acc" ] || fail "folded acc $(field test_acc "$out"), unfolded $acc"
awk -v a="$(field test_loss "$out")" -v b="$loss" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }' ||
	fail "folded loss $(field test_loss "$out"), unfolded $loss"
echo "ok: folded = unfolded: acc $acc loss $loss"

for m in percentile minmax entropy; do
	kiln 0 quantize "$cnn" $run --checkpoint "$ck" --calibrate 4 --method $m \
		--out "$tmp/cnn.$m.safetensors" data.eval.split=train
	kiln 0 eval "$cnn" $run $ev --quantized "$tmp/cnn.$m.safetensors"
	q=$(field test_acc "$out")
	awk -v q="$q" -v f="$acc" 'BEGIN { d = q - f; exit !(d < 0.005 && d > -0.005) }' ||
		fail "int8 ($m) acc $q, fp32 $acc: more than 0.5 points apart"
	echo "ok: int8 ($m) acc $q, fp32 $acc"
done

# the MLP: fc1 reads the data through a flatten, a view the plan keeps no
# copy of ("plan keeps no 'y' for layer flat" before): calibrated on the
# normalised pixels themselves, (0 - 0.286) / 0.353 to (1 - 0.286) / 0.353
mlp="$srcdir/examples/fashion_mnist_mlp.ini"
mrun="run.out_dir=$tmp/mlp data.path=$FM"
kiln 0 train "$mlp" $mrun data.limit=6000 train.epochs=2 train.eval=0
kiln 0 eval "$mlp" $mrun $ev
macc=$(field test_acc "$out")
kiln 0 quantize "$mlp" $mrun --calibrate 1 --out "$tmp/mlp.int8" data.eval.split=train
stderr_has "fc1: input s8 in [-0.810198, 2.02266]"
kiln 0 eval "$mlp" $mrun $ev --quantized "$tmp/mlp.int8"
q=$(field test_acc "$out")
awk -v q="$q" -v f="$macc" 'BEGIN { d = q - f; exit !(d < 0.005 && d > -0.005) }' ||
	fail "MLP int8 acc $q, fp32 $macc: more than 0.5 points apart"
echo "ok: MLP int8 acc $q, fp32 $macc"

# the quantized file records its config: one whose keys no longer shape its
# tensors (a bias dropped, another activation) is refused naming the key and
# both values, by eval and predict (before session 29: rc 0, another loss);
# and no checkpoint beside it (eval read neither, silently)
kiln 2 eval "$mlp" $mrun $ev --quantized "$tmp/mlp.int8" layer.fc2.bias=0
stderr_has "mlp.int8: the quantized file holds another model: [layer.fc2] bias is '1' in its config but '0' here"
kiln 2 predict "$mlp" $mrun --eval-set data.eval.limit=8 --quantized "$tmp/mlp.int8" layer.relu1.type=gelu
stderr_has "mlp.int8: the quantized file holds another model: [layer.relu1] type is 'relu' in its config but 'gelu' here"
mck=$(newest_ck mlp)
kiln 2 eval "$mlp" $mrun $ev --quantized "$tmp/mlp.int8" --checkpoint "$mck"
stderr_has "mlp.int8: a quantized model carries its weights: no checkpoint or weights file with it (got $mck)"
# the INT8 file given as the checkpoint or weights says what it is and how
# to pass it (before session 39: "fc1.weight is I8 (parameters load from
# F32, ...)"), by every command that takes --checkpoint; an empty name is
# one (": cannot open"); [run] precision other than fp32 is refused before
# the device opens (the QCONV's prepare refused bf16; quantize after its
# convolutions were timed)
for c in eval predict export quantize; do
	case $c in
	predict) o=--eval-set ;;
	export) o="--safetensors $tmp/x.st" ;;
	quantize) o="--calibrate 1 --out $tmp/x.q" ;;
	*) o= ;;
	esac
	kiln 2 $c "$mlp" $mrun $ev --checkpoint "$tmp/mlp.int8" $o
	stderr_has "$tmp/mlp.int8 is an INT8 model of \`kiln quantize\` (metadata kiln.format = kiln-int8/1), not a checkpoint or weights file: pass it with --quantized"
done
kiln 2 eval "$mlp" $mrun $ev --quantized ""
stderr_has '--quantized "": an empty name: name a file'
kiln 2 predict "$mlp" $mrun --eval-set --checkpoint ""
stderr_has 'checkpoint "": an empty name: name a file'
for p in bf16 fp16; do
	kiln 2 eval "$mlp" $mrun $ev --quantized "$tmp/mlp.int8" run.precision=$p
	stderr_has "[run] precision = $p: an INT8 model computes in fp32: drop [run] precision"
done
kiln 2 quantize "$mlp" $mrun --calibrate 1 --out "$tmp/x.q" data.eval.split=train run.precision=bf16
stderr_has "[run] precision = bf16: kiln quantize calibrates on f32 activations, and an INT8 model computes in fp32: drop [run] precision"
! grep -q '^\[idx\]' "$err" || fail "quantize with bf16 read the data before refusing: $(cat "$err")"
echo "ok: the INT8 file as a checkpoint, an empty name, bf16 with INT8: refused saying why"
# a file without the config (an older kiln's): a warning, and a tensor the
# model does not take is an error naming it
/usr/bin/python3 - "$tmp/mlp.int8" "$tmp/mlp_old.int8" <<'EOF'
import st, sys
def edit(h, meta, data):
    for k in ("kiln.config", "kiln.weights_keys", "kiln.crc32c"):
        del meta[k]
st.rewrite(sys.argv[1], sys.argv[2], edit)
EOF
kiln 3 eval "$mlp" $mrun $ev --quantized "$tmp/mlp_old.int8" layer.fc2.bias=0
stderr_has "mlp_old.int8 records no config"
stderr_has "the quantized file has 'fc2.bias', a tensor this model does not take"
echo "ok: a quantized file with a changed config, or a checkpoint beside it, is refused"

# --out never overwrites a checkpoint (the one read, or another: before
# session 29 either was replaced, and eval then found no checkpoint)
kiln 2 quantize "$mlp" $mrun --checkpoint "$mck" --calibrate 1 --out "$mck" data.eval.split=train
stderr_has "the output $mck is the file $mck, which this command reads: choose another file"
[ "$(head -c 8 "$mck")" = KILNCKPT ] || fail "quantize --out overwrote the checkpoint it read"
cp "$mck" "$tmp/other.kiln"
kiln 2 quantize "$mlp" $mrun --calibrate 1 --out "$tmp/other.kiln" data.eval.split=train
stderr_has "the output $tmp/other.kiln is a kiln checkpoint, which would be overwritten: choose another file"
# the JSON line's calibrate_batches is the count that ran (3 of 1000 rows
# here), not the 100000 asked for; --percentile with minmax is refused
kiln 0 quantize "$mlp" $mrun --calibrate 100000 --out "$tmp/mlp3.int8" data.eval.split=train \
	data.eval.limit=3000
stdout_has '"calibrate_batches": 3}'
stderr_has "calibrated on 3 batches, 3000 samples"
kiln 2 quantize "$mlp" $mrun --calibrate 1 --out "$tmp/x.int8" --percentile 99
stderr_has "--percentile is the percentile method's: --method minmax ignores it"
echo "ok: quantize --out refuses a checkpoint; the batches that ran are reported"

# chained (u8 between the INT8 layers) vs f32 between them
q="$tmp/cnn.percentile.safetensors"
export KILN_LOG_LEVEL=info
kiln 0 eval "$cnn" $run $ev --quantized "$q"
stderr_has "layer 'conv2' writes u8"
stderr_has "layer 'fc1' writes u8"
ca=$(field test_acc "$out") cl=$(field test_loss "$out")
kiln 0 eval "$cnn" $run $ev --quantized "$q" layer.conv2.int8_out_scale=0 \
	layer.fc1.int8_out_scale=0
stderr_has "0 INT8 or add layer(s) write u8"
fa=$(field test_acc "$out") fl=$(field test_loss "$out")
unset KILN_LOG_LEVEL
awk -v a="$ca" -v b="$fa" -v l="$cl" -v m="$fl" \
	'BEGIN { d = a - b; e = l - m; exit !(d <= 0.0005 && d >= -0.0005 && e < 1e-3 && e > -1e-3) }' ||
	fail "chained acc $ca loss $cl, f32 between the INT8 layers acc $fa loss $fl"
echo "ok: u8 chained acc $ca loss $cl, f32 between acc $fa loss $fl"
kiln 2 eval "$cnn" $run $ev --checkpoint "$ck" layer.fc2.int8_scale=0.05 layer.fc2.int8_out_scale=0.1
stderr_has "layer 'fc2': int8_out_scale wants the ReLU"
kiln 2 eval "$cnn" $run $ev --checkpoint "$ck" --fold layer.fc1.int8_out_scale=0.1
stderr_has "layer 'fc1': a u8 input or int8_out_scale needs int8_scale > 0"

# the ResNet's residual adds write u8 for the INT8 convs after them (the sum
# and its ReLU quantized in one pass: KILN_OP_ADD's u8 output): the same
# bytes as the f32 sum those convs quantize themselves, so the same loss
res="$srcdir/examples/fashion_mnist_resnet.ini"
rrun="run.out_dir=$tmp/res data.path=$FM"
kiln 0 train "$res" $rrun data.limit=1500 train.epochs=1 train.eval=0
kiln 0 quantize "$res" $rrun --calibrate 2 --out "$tmp/res.int8" data.eval.split=train
export KILN_LOG_LEVEL=info
kiln 0 eval "$res" $rrun data.eval.limit=1000 --quantized "$tmp/res.int8"
stderr_has "layer 's1_add' writes u8"
stderr_has "layer 's2_add' writes u8"
ra=$(field test_acc "$out") rl=$(field test_loss "$out")
kiln 0 eval "$res" $rrun data.eval.limit=1000 --quantized "$tmp/res.int8" \
	layer.s1_add.int8_out_scale=0 layer.s2_add.int8_out_scale=0
! grep -q "_add' writes u8" "$err" || fail "the adds write u8 with int8_out_scale=0"
unset KILN_LOG_LEVEL
[ "$(field test_loss "$out")" = "$rl" ] && [ "$(field test_acc "$out")" = "$ra" ] ||
	fail "adds in u8: loss $rl acc $ra; adds in f32: loss $(field test_loss "$out") acc $(field test_acc "$out")"
echo "ok: ResNet adds in u8 = in f32: loss $rl acc $ra"
# the int8 convolutions take oneDNN's jit_int8 over its first choice
# brgconv (AVX-512 VNNI; plugins/cpu/qconv.c q_pd_create): the same sums,
# so the same loss; KILN_CPU_QCONV_BRG=1 keeps brgconv
if grep -q avx512_vnni /proc/cpuinfo 2>/dev/null; then
	export KILN_LOG_LEVEL=debug
	kiln 0 eval "$res" $rrun data.eval.limit=1000 --quantized "$tmp/res.int8"
	! grep -q "QCONV.*brgconv" "$err" || fail "an int8 convolution ran brgconv: $(grep -m1 "QCONV.*brgconv" "$err")"
	stderr_has "jit_int8_1x1:avx512_core_vnni"
	jl=$(field test_loss "$out")
	export KILN_CPU_QCONV_BRG=1
	kiln 0 eval "$res" $rrun data.eval.limit=1000 --quantized "$tmp/res.int8"
	unset KILN_CPU_QCONV_BRG KILN_LOG_LEVEL
	stderr_has "brgconv_1x1:avx512_core_vnni"
	[ "$jl" = "$rl" ] && [ "$(field test_loss "$out")" = "$rl" ] ||
		fail "jit_int8 loss $jl, brgconv $(field test_loss "$out"), before $rl"
	echo "ok: ResNet int8 convolutions in jit_int8, loss $jl = brgconv's"
fi
kiln 2 eval "$res" $rrun data.eval.limit=100 layer.s1_add.int8_out_scale=0.1
stderr_has "layer 's2_conv1': a u8 input or int8_out_scale needs int8_scale > 0"
# a training run refuses an INT8 key before it opens anything (session 34:
# it was refused at the first forward, after out_dir's earlier run was deleted)
kiln 2 train "$res" $rrun data.limit=500 train.epochs=1 layer.s1_add.int8_out_scale=0.1
stderr_has "command line 'layer.s1_add.int8_out_scale=0.1': [layer.s1_add] int8_out_scale = 0.1: INT8 layers are for evaluation only"

# no seeded draw where a file supplies every weight (kiln_model_init_loaded):
# eval, eval --fold, eval --quantized, quantize and predict log "none drawn"
# and no draw; the evaluation equals training's last one on the same images;
# predict with no trained weights still draws them, with its warning
export KILN_LOG_LEVEL=debug
no_draw() {
	stderr_has "initial weights: none drawn"
	! grep -q "tensors drawn (\[run\] seed" "$err" || fail "$last: drew initial weights a file replaces"
}
kiln 0 eval "$cnn" $run data.eval.limit=500 --checkpoint "$ck"
no_draw
[ "$(field test_loss "$out")" = "$tl" ] && [ "$(field test_acc "$out")" = "$ta" ] ||
	fail "eval: loss $(field test_loss "$out") acc $(field test_acc "$out"), training's last: $tl $ta"
kiln 0 eval "$cnn" $run data.eval.limit=500 --checkpoint "$ck" --fold
no_draw
kiln 0 eval "$cnn" $run $ev --quantized "$q"
no_draw
[ "$(field test_acc "$out")" = "$ca" ] || fail "quantized acc $(field test_acc "$out"), before $ca"
kiln 0 quantize "$cnn" $run --checkpoint "$ck" --calibrate 1 --out "$tmp/q1.safetensors" data.eval.split=train
no_draw
kiln 0 predict "$cnn" $run --checkpoint "$ck" --eval-set --top-k 1 data.eval.limit=8
no_draw
kiln 0 predict "$cnn" data.path=$FM run.out_dir= --eval-set --top-k 1 data.eval.limit=8
stderr_has "the initial weights ([run] seed)"
stderr_has "initial weights: 8 of 8 tensors drawn"
unset KILN_LOG_LEVEL
echo "ok: no initial draw under a checkpoint or a quantized file; eval = training's loss $tl"

# the wrong model: the MLP's config with the CNN's file
kiln 2 eval "$srcdir/examples/fashion_mnist_mlp.ini" $run $ev --quantized "$tmp/cnn.minmax.safetensors"
stderr_has "cnn.minmax.safetensors: the quantized file holds another model"
# not a quantized model: a plain weights export
kiln 0 export "$cnn" $run --checkpoint "$ck" --safetensors "$tmp/plain.safetensors"
kiln 3 eval "$cnn" $run $ev --quantized "$tmp/plain.safetensors"
stderr_has "not a quantized kiln model"
echo "ok: int8.sh: $checks kiln runs"
