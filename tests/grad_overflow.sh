#!/bin/sh
# tests/grad_overflow.sh - finite gradients whose squares overflow f32 are
# finite (session 39), against PyTorch (tests/data/grad_overflow_refs.safetensors,
# made by tests/data/gen_grad_overflow_refs.py).  A 2 -> 2 -> 3 linear
# model whose fc2.weight is about 5e19 has fc1 gradients up to 5e19: every
# element finite (GradScaler's found_inf 0), their true L2 norm 7.5e19
# below FLT_MAX, but each square above FLT_MAX.  Before session 39 the
# clip op summed the squares in f32, read the inf sum as non-finite
# gradients, skipped every step and stopped the run as diverged ("lower
# [train] lr"), where PyTorch trains:
#  1. no clipping (skip_nonfinite = 1): the step is taken, skipped 0,
#     the weights PyTorch's SGD step's, the logged grad_norm the true norm;
#  2. clip_norm = 1: PyTorch's clip_grad_norm_ takes the norm in f32 (inf)
#     and multiplies the gradients by 1 / (inf + 1e-6) = 0: the step is
#     taken with zero gradients (clipped 1, skipped 0), the weights
#     PyTorch's;
#  3. clip_value = 1 (lr 0.1): clip_grad_value_'s clamped step, PyTorch's;
#  4. the same model in bf16: the step is taken (skipped 0), the weights
#     PyTorch's within bf16's rounding;
#  5. the same model in fp16 overflows f16 in its first forward (its
#     weights above 65504): the error says the forward overflowed on the
#     initial weights, that the lr is not the cause, and to use bf16 or
#     fp32 (before: "training diverged ...; lower [train] lr");
#  6. fp32 gradients that do overflow (inf, NaN) at step 1: skipped, and
#     the error says the backward overflowed on the initial weights.
# KILN_TEST_DEVICE=cuda runs it on that device (tests/gpu/run.sh's stage 1,
# its bundle's plugins named by KILN_TEST_PLUGIN_PATH); default cpu.
name=grad_overflow
. "$(dirname "$0")/lib.sh"
if [ -n "${KILN_TEST_PLUGIN_PATH:-}" ]; then
	KILN_PLUGIN_PATH=$KILN_TEST_PLUGIN_PATH
	export KILN_PLUGIN_PATH
fi
need_source idx
refs="$srcdir/tests/data/grad_overflow_refs.safetensors"

# the data and the initial weights, from the reference file
python3 - "$refs" "$tmp" <<EOF || fail "python3 could not write the data"
import st, struct, sys
r = st.values(sys.argv[1])
d = sys.argv[2]
with open(d + "/img.idx", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, 2, 1, 2) + bytes(r["images"]))
with open(d + "/lab.idx", "wb") as f:
    f.write(struct.pack(">II", 0x801, 2) + bytes(r["labels"]))
shapes = {"fc1.weight": [2, 2], "fc1.bias": [2], "fc2.weight": [3, 2], "fc2.bias": [3]}
st.write(d + "/init.safetensors", {k: (s, r["init." + k]) for k, s in shapes.items()})
# for 6: fc1 of one unit, fc2.weight 3e38: the first sample's fc1
# gradients overflow f32 (inf and NaN, as PyTorch's), its loss finite
st.write(d + "/inf.safetensors", {"fc1.weight": ([1, 2], [1e-38, 2e-38]), "fc1.bias": ([1], [0]),
                                 "fc2.weight": ([3, 1], [3e38, -3e38, 3e38]), "fc2.bias": ([3], [0, 0, 0])})
EOF
cat > "$tmp/m.ini" <<EOF
[run]
device = ${KILN_TEST_DEVICE:-cpu}
threads = 1
deterministic = 1
[data]
source = idx
images = $tmp/img.idx
labels = $tmp/lab.idx
shuffle = 0
workers = 0
[model]
init_from = $tmp/init.safetensors
[layer.fc1]
type = linear
out = 2
[layer.fc2]
type = linear
out = 3
[layer.loss]
type = softmax_xent
[train]
optimizer = sgd
momentum = 0
lr = 4e-21
batch = 2
epochs = 1
max_steps = 1
log_every = 1
eval = 0
EOF

# check CASE RUN TOL: the weights RUN's checkpoint exports equal the
# reference's CASE.<param> within TOL (absolute, plus TOL of the value),
# and differ from the initial weights where the reference's do.  1e-7 in
# f32: PyTorch's p + (-lr) g is one fused multiply-add, kiln's device
# rounds lr g first (fc1.bias: 0.125 - 0.1 differs in its last bit).
check() {
	kiln 0 export "$tmp/m.ini" --safetensors "$tmp/$2.safetensors" "run.out_dir=$tmp/$2"
	python3 - "$refs" "$tmp/$2.safetensors" "$1" "$3" <<EOF || fail "$2: the weights are not PyTorch's ($1)"
import st, sys
r, got, case, tol = st.values(sys.argv[1]), st.values(sys.argv[2]), sys.argv[3], float(sys.argv[4])
bad = 0
for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
    for i, (g, w, w0) in enumerate(zip(got[k], r[case + "." + k], r["init." + k])):
        if not abs(g - w) <= tol * (1 + abs(w)) or ((w != w0) and g == w0):
            print("%s %s[%d] = %.9g, PyTorch %.9g (initially %.9g)" % (case, k, i, g, w, w0))
            bad += 1
moved = sum(w != w0 for k in got for w, w0 in zip(r[case + "." + k], r["init." + k]))
print("%s: %d weights as PyTorch's within %g (%d moved by the step)" % (case, sum(map(len, got.values())) - bad, tol, moved))
sys.exit(bad > 0)
EOF
}

# metric KEY: the last train event's KEY in $tmp/$run/metrics.jsonl
metric() { grep '"event":"train"' "$tmp/$run/metrics.jsonl" | tail -1 | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }

# 1: no clipping: the step is taken as PyTorch's
run=plain
kiln 0 train "$tmp/m.ini" run.out_dir="$tmp/$run"
[ "$(metric skipped)" = 0 ] || fail "$run: skipped $(metric skipped), the gradients are finite"
python3 - "$refs" "$(metric grad_norm)" <<EOF || fail "$run: grad_norm $(metric grad_norm) is not the true norm"
import st, sys
want, got = st.values(sys.argv[1])["true_norm"][0], float(sys.argv[2])
print("grad_norm %g, the true norm %g" % (got, want))
sys.exit(not abs(got - want) <= 1e-6 * want)
EOF
check plain $run 1e-7

# 2: clip_norm = 1: zero gradients, the step taken, as clip_grad_norm_
run=norm
kiln 0 train "$tmp/m.ini" run.out_dir="$tmp/$run" train.clip_norm=1
[ "$(metric skipped)" = 0 ] && [ "$(metric clipped)" = 1 ] ||
	fail "$run: skipped $(metric skipped) clipped $(metric clipped), want 0 and 1"
check norm $run 1e-7

# 3: clip_value = 1, lr 0.1: clip_grad_value_'s step
run=value
kiln 0 train "$tmp/m.ini" run.out_dir="$tmp/$run" train.clip_value=1 train.lr=0.1
[ "$(metric skipped)" = 0 ] || fail "$run: skipped $(metric skipped)"
check value $run 1e-7

# 4: bf16 compute: the same step, within bf16's rounding of the weights
# fc1's gradient is made of (fc2.weight's relative 2^-9)
run=bf16
kiln 0 train "$tmp/m.ini" run.out_dir="$tmp/$run" run.precision=bf16
[ "$(metric skipped)" = 0 ] || fail "$run: skipped $(metric skipped)"
check plain $run 0.01

# 5: fp16: the first forward overflows f16
run=fp16
kiln 3 train "$tmp/m.ini" run.out_dir="$tmp/$run" run.precision=fp16
stderr_has "at step 1 (epoch 1): the forward pass overflowed on the initial weights, which no optimizer step has changed"
stderr_has "[train] lr is not the cause: f16 holds values up to 65504 ([run] precision = fp16): use bf16 or fp32"
! grep -q "lower \[train\] lr" "$err" || fail "$run: told to lower lr, though no step was taken"

# 6: fp32, gradients that overflow on the initial weights (the loss
# finite): the step is skipped, and the error says the backward pass
# overflowed there and that the lr is not the cause (before: "training
# diverged; lower [train] lr")
run=inf
kiln 3 train "$tmp/m.ini" run.out_dir="$tmp/$run" "model.init_from=$tmp/inf.safetensors" \
	layer.fc1.out=1 train.batch=1
stderr_has "steps 1..1 (epoch 1): every step had non-finite gradients and was skipped, the loss finite"
stderr_has "the parameters have not changed since step 0: the backward pass overflowed on the initial weights; [train] lr is not the cause: look at the data, its normalisation ([data] mean, std) and the initial weights"

echo "PASS: $checks kiln runs"
