#!/bin/sh
# tests/trained_export.sh - trained weights are never lost, and what kiln
# exports after training is what PyTorch trains.
#
# tests/data/tr_cnn.ini (conv, batchnorm, relu, pool, linear) starts from
# PyTorch's weights (tr_cnn_init.safetensors, num_batches_tracked 3) and
# trains 5 SGD steps with checkpoint_every unset:
#  1. `kiln train` leaves a checkpoint (checkpoint_last), also when it stops
#     early; with checkpoint_last = 0 a resumed run that trains on names
#     no checkpoint as its trained weights, neither on its own nor stopped
#     early (before session 32 it named the one it resumed from, of an
#     earlier step, in "trained weights:" and the JSON line's "checkpoint");
#  2. `kiln export` without --checkpoint writes the newest checkpoint's
#     weights, and every tensor matches PyTorch's after the same 5 steps
#     (tr_cnn_trained.safetensors, from tests/data/gen_trained_refs.py),
#     num_batches_tracked = 3 + 5 included;
#  3. `kiln export --checkpoint` neither reads [model] init_from (the file
#     may be gone) nor compares it or the layout: the same bytes;
#  4. fine-tuning: [model] init_from = the checkpoint, a new lr: the weights
#     alone (new optimizer, step 0); 2 steps match PyTorch's fine-tuning
#     (tr_cnn_finetuned.safetensors, num_batches_tracked 10);
#  5. `kiln eval` accepts another init_from and layout, refuses another
#     layer shape; with no checkpoint eval fails and export warns that it
#     writes the initial weights; a fresh run into an out_dir holding
#     checkpoints is refused (they would mix), and --overwrite replaces
#     them;
#  6. [model] init_from's num_batches_tracked as i32 is read, as f32 or
#     negative ignored with a warning naming the tensor.
# The comparison needs only python3's standard library.
name=trained
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
gen="$data/gen_trained_refs.py"

need_python3 "to read the safetensors files"
need_source idx
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors"

# 1. the first run leaves its trained weights
kiln 0 train "$ini" $common "run.out_dir=$tmp/run"
ck="$tmp/run/checkpoints/ckpt-5.kiln"
[ -f "$ck" ] || fail "kiln train with checkpoint_every = 0 left no $ck"
grep -q "trained weights: $ck" "$err" || fail "kiln train does not name its checkpoint"

# 1b. an early stop (at an eval_every point) leaves its last step's too
kiln 0 train "$ini" $common train.max_steps=0 train.epochs=5 train.eval_every=1 \
	train.early_stop_patience=1 train.early_stop_metric=loss train.early_stop_min_delta=100 \
	"run.out_dir=$tmp/early"
stderr_has "early stop at step 2"
[ -f "$tmp/early/checkpoints/ckpt-2.kiln" ] || fail "the early stop at step 2 left no checkpoint"

# 1c. checkpoint_last = 0: a resumed run's trained weights are in no
# checkpoint; the one it resumed from (step 3, step 1) is not named
kiln 0 train "$ini" $common train.max_steps=3 "run.out_dir=$tmp/cl0"
kiln 0 train "$ini" $common train.max_steps=0 train.checkpoint_last=0 --resume "run.out_dir=$tmp/cl0"
stdout_has '"steps": 6,'
! grep -q "trained weights" "$err" || fail "checkpoint_last = 0, resumed: $(grep "trained weights" "$err")"
! grep -q '"checkpoint"' "$out" || fail "checkpoint_last = 0, resumed: the result names a checkpoint of an earlier step"
es="train.epochs=5 train.eval_every=1 train.early_stop_patience=1 train.early_stop_metric=loss train.early_stop_min_delta=100"
kiln 0 train "$ini" $common $es train.max_steps=1 "run.out_dir=$tmp/cl0es"
kiln 0 train "$ini" $common $es train.max_steps=0 train.checkpoint_last=0 --resume "run.out_dir=$tmp/cl0es"
stderr_has "early stop at step 2"
! grep -q "trained weights" "$err" || fail "checkpoint_last = 0, resumed, early stop: $(grep "trained weights" "$err")"
! grep -q '"checkpoint"' "$out" || fail "checkpoint_last = 0, resumed, early stop: the result names a checkpoint of an earlier step"
# (a resume with no step left still names the checkpoint: it is the weights)
kiln 0 train "$ini" $common train.max_steps=3 --resume "run.out_dir=$tmp/cl0"
stdout_has "\"checkpoint\": \"$tmp/cl0/checkpoints/ckpt-3.kiln\""

# 2. export defaults to it, and matches PyTorch
kiln 0 export "$ini" --safetensors "$tmp/trained.safetensors" $common "run.out_dir=$tmp/run"
grep -q "exporting the weights of $ck (step 5)" "$err" || fail "export does not name the checkpoint"
"$py" "$gen" --check "$tmp/trained.safetensors" "$data/tr_cnn_trained.safetensors" ||
	fail "kiln's 5 trained steps differ from PyTorch's"

# 3. --checkpoint: init_from gone, another layout: the same weights
kiln 0 export "$ini" --safetensors "$tmp/again.safetensors" --checkpoint "$ck" \
	"data.path=$data" model.init_from=/nonexistent/w.safetensors model.layout=nhwc \
	"run.out_dir=$tmp/elsewhere"
cmp "$tmp/trained.safetensors" "$tmp/again.safetensors" ||
	fail "export --checkpoint with another init_from and layout wrote other bytes"

# 4. fine-tuning from the checkpoint's weights with a new lr
kiln 0 train "$ini" "data.path=$data" "model.init_from=$ck" train.lr=0.05 train.max_steps=2 \
	"run.out_dir=$tmp/ft"
grep -q "weights only" "$err" || fail "init_from a checkpoint does not say it loads the weights only"
grep -q '"steps": 2,' "$out" || fail "the fine-tuning run does not start at step 0"
kiln 0 export "$ini" --safetensors "$tmp/ft.safetensors" "data.path=$data" "run.out_dir=$tmp/ft"
"$py" "$gen" --check "$tmp/ft.safetensors" "$data/tr_cnn_finetuned.safetensors" ||
	fail "kiln's fine-tuning differs from PyTorch's"

# 5. eval: what does not shape the stored tensors may change
kiln 0 eval "$ini" "data.path=$data" model.init_from=/nonexistent/w.safetensors \
	model.layout=nhwc "run.out_dir=$tmp/run"
grep -q "\"checkpoint\": \"$ck\", \"step\": 5," "$out" || fail "eval did not take the newest checkpoint"
kiln 2 eval "$ini" "data.path=$data" layer.fc1.out=6 "run.out_dir=$tmp/run"
grep -q "holds another model: \[layer.fc1\] out is '5' in its config but '6' here" "$err" ||
	fail "eval of another layer shape: wrong message"
# no checkpoint in out_dir (there or not): a config error naming it, exit 2
# as generate's "no trained weights" (exit 1 before session 37)
mkdir -p "$tmp/none"
kiln 2 eval "$ini" "data.path=$data" "run.out_dir=$tmp/none"
stderr_has "kiln: error: command line 'run.out_dir=$tmp/none': [run] out_dir: $tmp/none/checkpoints: no checkpoint to evaluate"
kiln 2 eval "$ini" "data.path=$data" "run.out_dir=$tmp/nodir"
stderr_has "kiln: error: command line 'run.out_dir=$tmp/nodir': [run] out_dir: $tmp/nodir/checkpoints: no checkpoint to evaluate"
kiln 0 export "$ini" --safetensors "$tmp/init.safetensors" $common "run.out_dir=$tmp/none"
# (the weights of [model] init_from: a note saying so, not a warning;
# before session 41 "warning: ... exporting the initial weights ([run]
# seed, then [model] init_from), not trained ones")
stderr_has "[core] no checkpoint in $tmp/none/checkpoints: exporting the weights of [model] init_from $data/tr_cnn_init.safetensors (a run's trained weights: --checkpoint CKPT, or train first)"
! grep -q "warning" "$err" || fail "export of [model] init_from warned: $(grep warning "$err")"
# a fresh run into an out_dir with checkpoints is refused (they would mix)
kiln 2 train "$ini" $common train.max_steps=1 "run.out_dir=$tmp/run"
stderr_has "out_dir '$tmp/run' holds an earlier run"
[ -f "$tmp/run/checkpoints/ckpt-5.kiln" ] || fail "the refused run deleted ckpt-5"
kiln 0 train "$ini" $common train.max_steps=1 "run.out_dir=$tmp/run" --overwrite
[ "$(ls "$tmp/run/checkpoints")" = "ckpt-1.kiln" ] || fail "--overwrite left $(ls "$tmp/run/checkpoints")"

# 6. PyTorch's batch counter in another dtype: an i32 scalar is read; an
# f32 one or a negative count is ignored with a warning naming it (both
# were ignored without a word, an i32 one too)
tracked() { # file dtype value: tr_cnn_init.safetensors with bn1's counter so
	"$py" - "$data/tr_cnn_init.safetensors" "$@" <<'PY'
import st, struct, sys
src, dst, dtype, value = sys.argv[1:]
f = st.load(src)
out = {}
for k, v in sorted(f.header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    t = (v["dtype"], v["shape"], f.data(k))
    if k.endswith(".num_batches_tracked"):
        fmt = {"I64": "<q", "I32": "<i", "F32": "<f"}[dtype]
        t = (dtype, [], struct.pack(fmt, float(value) if dtype == "F32" else int(value)))
    out[k] = t
st.write(dst, out, meta=f.meta or None)
PY
}
counted() { # export: the exported file's num_batches_tracked
	"$py" -c 'import st, sys
print([v for k, v in st.values(sys.argv[1]).items() if k.endswith(".num_batches_tracked")][0][0])' "$1"
}
for c in "I32 7 7" "F32 7 0" "I64 -4 0"; do
	set -- $c
	tracked "$tmp/nbt.safetensors" $1 $2
	kiln 0 export "$ini" --safetensors "$tmp/nbt_out.safetensors" "data.path=$data" \
		"model.init_from=$tmp/nbt.safetensors" "run.out_dir=$tmp/nbt$1"
	got=$(counted "$tmp/nbt_out.safetensors")
	[ "$got" = "$3" ] || fail "num_batches_tracked $1 $2 in init_from: exported $got, want $3"
	if [ "$3" = 0 ]; then
		grep -q "\[weights\] warning: $tmp/nbt.safetensors: tensor bn1.num_batches_tracked (.*) ignored" "$err" ||
			fail "num_batches_tracked $1 $2 ignored without a word"
	fi
done
echo "PASS: $checks kiln runs; trained and fine-tuned exports match PyTorch's"
