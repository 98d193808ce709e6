#!/bin/sh
# tests/ckpt_frozen.sh - a checkpoint read by name into a model whose
# tensors it lays out in another order (core/checkpoint_layout.c):
#  1. fine-tuning with a layer frozen ([model] init_from, fc1 trainable =
#     0) from a checkpoint trained with every layer trainable, and the
#     other way: a kiln lays the trainable tensors out first, so the two
#     lay fc1.weight (70,400 floats, more than a 256 KiB piece) and the
#     others out in other orders.  Each run starts, and its initial
#     weights (`kiln export` of them) are the checkpoint's, tensor by
#     tensor, bit for bit.  Before session 39's review the first way was
#     refused as a corrupt file (exit 3: "its 'tensors' table lays
#     'bn.weight' out at 71504, where the trainable tensors have ended"),
#     and before session 39 both ways as "another model" (exit 2).
#  2. the batchnorm's running statistics in the other order in "buffers"
#     (ckpt_tool order ... buffers): eval and export read them by name,
#     export's bytes those of the file as written.
name=ckpt_frozen
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
tool="$top_builddir/tests/ckpt_tool"
need_python3
need_source synthetic

ini="$tmp/frozen.ini"
{
	ini run seed=3 threads=1
	ini_synthetic 256 8 10
	mlp10_layers 1100 bn:batchnorm
	ini train epochs=1 batch=32 optimizer=adamw lr=0.01 log_every=2 eval=0 checkpoint_every=1000
} >"$ini"
# st_same A B: the safetensors files A and B hold the same tensors (names,
# dtypes, shapes, bytes); their metadata (the config's hash) aside
st_same() {
	"$py" - "$1" "$2" <<'PY'
import st, sys
bad = st.differ(sys.argv[1], sys.argv[2])
print('%d tensors, %d differ %s' % (len(st.tensors(sys.argv[1])), len(bad), bad))
sys.exit(1 if bad or not st.tensors(sys.argv[1]) else 0)
PY
}

kiln 0 train "$ini" run.out_dir="$tmp/all" train.max_steps=3
kiln 0 train "$ini" run.out_dir="$tmp/fz" train.max_steps=3 layer.fc1.trainable=0
all="$tmp/all/checkpoints/ckpt-3.kiln" fz="$tmp/fz/checkpoints/ckpt-3.kiln"
kiln 0 export "$ini" --checkpoint "$all" --safetensors "$tmp/all.st" run.out_dir="$tmp/none"
kiln 0 export "$ini" --checkpoint "$fz" --safetensors "$tmp/fz.st" run.out_dir="$tmp/none" \
	layer.fc1.trainable=0

# ---- 1. init_from across another set of frozen layers ----------------------
kiln 0 train "$ini" run.out_dir="$tmp/ft" train.max_steps=2 "model.init_from=$all" \
	layer.fc1.trainable=0
stderr_has "checkpoint $all lays this model's tensors out in another order ('bn.weight' at element 71504 there, 0 here: written with other layers frozen"
stderr_has "loaded the weights of step 3"
kiln 0 export "$ini" --safetensors "$tmp/ft.st" run.out_dir="$tmp/ft_init" "model.init_from=$all" \
	layer.fc1.trainable=0
st_same "$tmp/all.st" "$tmp/ft.st" || fail "fc1 frozen: init_from of the all-trainable checkpoint loaded other weights"
kiln 0 train "$ini" run.out_dir="$tmp/ft2" train.max_steps=2 "model.init_from=$fz"
stderr_has "checkpoint $fz lays this model's tensors out in another order ('fc1.weight' at element 13232 there, 0 here"
kiln 0 export "$ini" --safetensors "$tmp/ft2.st" run.out_dir="$tmp/ft2_init" "model.init_from=$fz"
st_same "$tmp/fz.st" "$tmp/ft2.st" || fail "all trainable: init_from of the fc1-frozen checkpoint loaded other weights"
echo "ok: init_from reads a checkpoint of another set of frozen layers by name, both ways"

# ---- 2. the buffers in another order ----------------------------------------
"$tool" order "$all" "$tmp/buf.kiln" buffers bn.running_var bn.running_mean ||
	fail "cannot rewrite the checkpoint"
! "$tool" same "$all" "$tmp/buf.kiln" buffers 2>/dev/null || fail "the buffers did not move"
"$tool" same "$all" "$tmp/buf.kiln" params optim.exp_avg || fail "more than the buffers moved"
kiln 0 eval "$ini" --checkpoint "$tmp/buf.kiln" run.out_dir="$tmp/none"
stderr_has "('bn.running_mean' at element 1104 there, 0 here"
kiln 0 export "$ini" --checkpoint "$tmp/buf.kiln" --safetensors "$tmp/buf.st" run.out_dir="$tmp/none"
cmp "$tmp/all.st" "$tmp/buf.st" || fail "export of the buffers in another order differs"
echo "ok: the buffers in another order are read by name"
