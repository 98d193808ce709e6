#!/bin/sh
# tests/infer_wreorder.sh - the CPU device's kept convolution weights, for
# inference plans only (frozen weights, ABI 2.15: KILN_OPF_FROZEN;
# [plugin.cpu] keep_weights, plugins/cpu/conv.c and dnn.c; issue 23,
# docs/PERFORMANCE.md "Session 13: inference weights reordered once" and
# "Session 14: frozen weights").
#
# tests/data/tr_cnn.ini's conv (4x1x3x3 weights, which oneDNN's kernel
# wants blocked) under `kiln predict --eval-set` in blocks of 4 rows
# ([run] infer_block = 4: 48 samples, 12 plan runs), counted from
# ONEDNN_VERBOSE's exec lines:
#  1. keep_weights = 0 reorders the weights on every run (a reorder per
#     convolution); the default reorders them once in the whole call, and
#     its logits are the same bytes; on AVX-512 (oneDNN's brgemm matmul)
#     fc1's f32 GEMM keeps its weights too (session 46: before, each run's
#     matmul read them as [out, in], "wei_f32::blocked:ba", and copied them
#     into its blocked layout): one reorder of them in the call, and only
#     the first block's matmul reads them in the caller's layout (a GEMM
#     keeps its weights from the second run that reads them on:
#     plugins/cpu/wshare.c, cpu_wref_seen); keep_weights = 0: every
#     matmul does, none reorders; and a call of one run (--batch 48,
#     infer_block = 0) keeps no GEMM weights: one matmul on [out, in],
#     no reorder of them (before: one, and the copy held); and with the
#     Fashion-MNIST CNN example (one image, initial weights) on an
#     adaptive team flipping between 2 threads and 1 (KILN_CPU_TEAM_FLIP),
#     where dnnteam.c probes fc1's version for the small team on scratch
#     tensors, that probe too runs the matmul on [out, in] (before: 2
#     reorders, the probe's into a scratch copy of the weights' size);
#  2. training with evaluations every 2 steps logs the same losses with
#     and without kept weights;
#  3. training plans and the evaluation plans inside training keep no
#     weights (they change between runs: a kept copy would cost a compare
#     and a copy every run): fp32 and bf16 training with evaluations (6
#     runs each) does as many reorders with keep_weights = 1 as with 0;
#  4. tests/infer_reload: weights loaded through the C API into a model
#     that already has inference plans give the new logits on the next
#     run (the core tells the device: KILN_PROC_WEIGHTS_CHANGED), fp32
#     and bf16;
#  5. INT8 (issue 23): the model with a second conv of 4 input channels
#     (a QCONV; conv1's single channel stays f32) trained 1 and 5 steps,
#     each `kiln quantize`d: tests/infer_reload --quantized loads QB's
#     weights into QA's model and back, the logits byte-equal to fresh
#     loads; every QCONV and QLINEAR plan of the inference plans is frozen
#     (no compare of the f32 weights per run) and quantizes its weights
#     once per load (2 INT8 layers: 2 quantizations per phase, counted
#     from the debug log); keep_weights = 0: the same logits, weights
#     compared every run;
#     and a model's plans share the quantized weights (plugins/cpu/
#     qweights.c): tests/infer_reload --quantized --sizes calls 5, 6, 5,
#     6, 5, 6 rows at batch 16 (a plan per size, made again at each
#     change) with a fresh model's bytes and one quantization per INT8
#     layer in all (before: one per layer per call, 2 2 2 2 12 2 2), then
#     loads QB's weights and calls 7 rows (a new plan run first after the
#     load: QB's logits, quantized again) and 5 (shared: none);
#  6. Winograd (plugins/cpu/wino.c, session 25): a 16 -> 16 channel 3x3
#     conv added after conv1 (made 16 channels), which inference plans run
#     by F(4x4, 3x3) on AVX-512 and whose transformed weights they keep:
#     tests/infer_reload with two seeds' initial weights (B loaded into
#     A's model gives B's logits: the kept transform made again after
#     KILN_PROC_WEIGHTS_CHANGED), keep_weights = 1 and 0; on AVX-512 the
#     debug log has a Winograd plan, its weights kept under 1 only;
#  7. f32 kept weights shared across sizes (plugins/cpu/wshare.c, session
#     40): tests/infer_reload --sizes with 6's model (conv1 on oneDNN's
#     blocked weights, conv2 by Winograd on AVX-512; conv_impl = first, so
#     that no plan times candidates on scratch weights): calls of 5, 6,
#     5, 6, 5, 6 rows at batch 16 give a fresh model's bytes and reorder
#     conv1's weights (and transform conv2's) once in all, one kept entry
#     each (before: once per call, a copy per plan), then B loaded and 7
#     rows: made again, in the same entries;
#     and INT8's frozen plans make no entry at prepare (before: one per
#     plan, dropped on its first run for the shared one): one per layer
#     and model; on AVX-512 fc1's GEMM keeps its weights alike (session
#     46), but from the second run that reads the same weights (of any
#     size's plan): each fresh model's single call and the first call
#     after a load run the matmul on the weights as they are (0), the
#     next call reorders them (1), and the entry is made once per model
#     (phases 4 and 5: fresh B's second call, A's 6 rows).
name=infer_wreorder
. "$(dirname "$0")/lib.sh"
need_source idx
# oneDNN's kernel and its kept weights are what this tests: tr_cnn's conv
# (one input channel) would go to kiln's first-layer kernel on AVX-512
# (plugins/cpu/convthin.c, session 24), which reads the weights each run
# and keeps nothing
export KILN_CPU_CONVTHIN=0
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors plugin.cpu.tune_cache=$tmp/tune.bin"

# predict KEEP: the logits into $tmp/lKEEP.npy, oneDNN's exec lines counted
# into $reorders (of the conv's 4-d weights), $wreorders (of fc1's
# [5, 64] weights, read as [64, 5] transposed: "ba"), $convs, $gemms and
# $plain (the matmuls that read their weights as the caller has them,
# "ba") (run.out_dir in
# $tmp: a runs/latest where the suite runs holds a checkpoint predict
# would take before init_from)
# (more arguments: passed on, after infer_block = 4)
predict() {
	k=$1
	shift
	ONEDNN_VERBOSE=1 kiln 0 predict "$ini" --eval-set --logits "$tmp/l$k.npy" $common \
		run.infer_block=4 model.layout=nhwc "plugin.cpu.keep_weights=$k" "run.out_dir=$tmp/p$k" "$@"
	reorders=$(grep '^onednn_verbose,exec,cpu,reorder' "$out" | grep -vc ',src_f32::blocked:ba:')
	wreorders=$(grep '^onednn_verbose,exec,cpu,reorder' "$out" | grep -c ',src_f32::blocked:ba:')
	convs=$(grep -c '^onednn_verbose,exec,cpu,convolution' "$out")
	gemms=$(grep -c '^onednn_verbose,exec,cpu,matmul' "$out")
	plain=$(grep '^onednn_verbose,exec,cpu,matmul' "$out" | grep -c ' wei_f32::blocked:ba:')
	echo "keep_weights = $k $*: $convs convolutions, $reorders reorders; $gemms matmuls, $plain reading [out, in], $wreorders reorders of their weights"
}
brgemm=0 # oneDNN's matmul is its brgemm one (AVX-512): the frozen GEMM keeps its weights
grep -q avx512bw /proc/cpuinfo 2>/dev/null && grep -q avx512vl /proc/cpuinfo && brgemm=1

# ---- 1. reordered once, the same logits ---------------------------------------
predict 0
[ "$convs" -ge 12 ] || fail "keep_weights = 0: $convs convolutions (ONEDNN_VERBOSE honoured? 12 blocks expected)"
[ "$reorders" -eq "$convs" ] || fail "keep_weights = 0: $reorders weight reorders for $convs convolutions"
[ "$gemms" -ge 12 ] && [ "$plain" -eq "$gemms" ] && [ "$wreorders" -eq 0 ] ||
	fail "keep_weights = 0: $plain of $gemms matmuls read fc1's weights as [out, in], $wreorders reorders of them (12 or more matmuls, all, none expected)"
predict 1
[ "$convs" -ge 12 ] || fail "keep_weights = 1: $convs convolutions, 12 blocks expected"
[ "$reorders" -eq 1 ] || fail "keep_weights = 1: $reorders weight reorders in $convs convolutions, 1 expected"
[ "$gemms" -ge 12 ] || fail "keep_weights = 1: $gemms matmuls, 12 blocks expected"
if [ $brgemm = 1 ]; then
	[ "$wreorders" -eq 1 ] && [ "$plain" -eq 1 ] ||
		fail "keep_weights = 1: fc1's weights reordered $wreorders times, $plain of $gemms matmuls read them as [out, in] (1 and 1 expected: the first run as they are, then kept in the matmul's layout)"
fi
cmp "$tmp/l0.npy" "$tmp/l1.npy" || fail "the logits differ with kept weights"
cp "$tmp/l1.npy" "$tmp/l1blocks.npy"
predict 1 --batch 48 run.infer_block=0
[ "$gemms" -eq 1 ] && [ "$plain" -eq 1 ] && [ "$wreorders" -eq 0 ] ||
	fail "keep_weights = 1, one run: $gemms matmuls, $plain reading fc1's weights as [out, in], $wreorders reorders of them (1, 1, 0 expected: a single run keeps no GEMM weights)"
cmp "$tmp/l1blocks.npy" "$tmp/l1.npy" || fail "the logits differ in one run"
# the same on an adaptive team flipping between 2 threads and 1: the
# Fashion-MNIST CNN example's fc1 (3136 -> 1024, big enough to be threaded)
# for one image, initial weights
if [ $brgemm = 1 ] && [ "$(nproc)" -ge 2 ]; then
	export KILN_CPU_TEAM_FLIP=1
	ONEDNN_VERBOSE=1 kiln 0 predict "$srcdir/examples/fashion_mnist_cnn.ini" "$data/png/gray2_trns.png" \
		--batch 1 data.eval.resize=28 run.threads=0 plugin.cpu.adaptive=1 "run.out_dir=$tmp/pflip"
	unset KILN_CPU_TEAM_FLIP
	gemms=$(grep -c '^onednn_verbose,exec,cpu,matmul' "$out")
	wreorders=$(grep '^onednn_verbose,exec,cpu,reorder' "$out" | grep -c ',src_f32::blocked:ba:')
	echo "one image, a flipping team: $gemms matmuls, $wreorders reorders of their weights"
	# fc1's probe runs 1 or 2 more matmuls when the team probes: 3 of 4
	# runs here (session 46); a loaded machine can leave it out (2
	# matmuls, seen once in a merge's check), so the count is not asked,
	# only that no run and no probe copies the weights
	[ "$gemms" -ge 2 ] && [ "$wreorders" -eq 0 ] ||
		fail "one image on a flipping team: $gemms matmuls, $wreorders reorders of their weights (2 or more, 3 or more with fc1's probe, and 0 expected: neither the run nor the probe copies them)"
fi

# ---- 2. training: weights that change between evaluations ---------------------
for k in 0 1; do
	kiln 0 train "$ini" $common "run.out_dir=$tmp/run$k" train.max_steps=6 train.eval_every=2 \
		"plugin.cpu.keep_weights=$k"
	grep -h '] step [0-9]*: test loss' "$out" "$err" >"$tmp/eval$k"
done
[ "$(wc -l <"$tmp/eval1")" -ge 3 ] || fail "$(wc -l <"$tmp/eval1") evaluations logged, 3 expected"
cmp "$tmp/eval0" "$tmp/eval1" || fail "the evaluations differ with kept weights: $(cat "$tmp/eval0" "$tmp/eval1")"
[ "$(sort -u "$tmp/eval1" | wc -l)" -eq "$(wc -l <"$tmp/eval1")" ] || fail "an evaluation repeated: $(cat "$tmp/eval1")"

# ---- 3. training and its evaluations keep no weights ----------------------------
precs=fp32
"$kiln" plugins 2>/dev/null | grep -qw amp && precs="fp32 bf16"
for prec in $precs; do
	for k in w 0 1; do # w: the tuning run (plugin.cpu.tune_cache), not counted
		ONEDNN_VERBOSE=1 kiln 0 train "$ini" $common "run.out_dir=$tmp/t$prec$k" train.max_steps=4 \
			train.eval_every=2 model.layout=nhwc "run.precision=$prec" "plugin.cpu.keep_weights=$(echo $k | tr w 0)"
		eval r$k=$(grep -c '^onednn_verbose,exec,cpu,reorder' "$out")
		eval c$k=$(grep -c '^onednn_verbose,exec,cpu,convolution' "$out")
	done
	echo "training, $prec: $r0 reorders in $c0 convolutions (keep_weights = 0), $r1 in $c1 (keep_weights = 1)"
	[ "$c0" -ge 16 ] && [ "$c1" -eq "$c0" ] || fail "training, $prec: $c0 and $c1 convolutions, 16 or more expected"
	[ "$r1" -eq "$r0" ] || fail "training, $prec: $r1 reorders with keep_weights = 1, $r0 without: a training or evaluation plan kept its weights"
done

# ---- 4. new weights into a model with inference plans (C API) -------------------
awk -v d="$data" '{ print } $0 == "[data]" { print "path = " d } $0 == "[run]" { print "infer_block = 0" }' "$ini" >"$tmp/r.ini"
printf '[model]\nlayout = nhwc\n' >>"$tmp/r.ini"
for prec in $precs; do
	sed "s/^threads = 1/threads = 1\nprecision = $prec/" "$tmp/r.ini" >"$tmp/r$prec.ini"
	"$top_builddir/tests/infer_reload" "$tmp/r$prec.ini" "$data/tr_cnn_init.safetensors" \
		"$data/tr_cnn_trained.safetensors" || fail "tests/infer_reload, $prec"
done
# ---- 5. INT8: QCONV and QLINEAR keep their quantized weights ------------------
awk '$0 == "[layer.pool1]" { print "[layer.conv2]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n\n[layer.relu2]\ntype = relu\n" } { print }' \
	"$tmp/r.ini" >"$tmp/q.ini"
for s in 1 5; do
	kiln 0 train "$tmp/q.ini" "run.out_dir=$tmp/q$s" train.max_steps=$s
	kiln 0 quantize "$tmp/q.ini" "run.out_dir=$tmp/q$s" --calibrate 2 --out "$tmp/q$s.safetensors" \
		data.eval.split=train
done
# the quantizations (or the lines holding TEXT) in each phase of
# tests/infer_reload's debug log FILE
per_phase() {
	awk -v t="${2:-weights quantized}" '/^infer_reload: logits:/ { if (p) printf "%d ", n; p = 1; n = 0 }
		index($0, t) { n++ } END { printf "%d", n }' "$1"
}
for k in 1 0; do
	printf '[plugin.cpu]\nkeep_weights = %s\n' $k >"$tmp/qk$k.ini"
	cat "$tmp/q.ini" "$tmp/qk$k.ini" >"$tmp/qr$k.ini"
	KILN_LOG_LEVEL=debug "$top_builddir/tests/infer_reload" --quantized "$tmp/qr$k.ini" "$tmp/q1.safetensors" \
		"$tmp/q5.safetensors" 2>"$tmp/qerr$k" || fail "tests/infer_reload --quantized, keep_weights = $k: $(tail -3 "$tmp/qerr$k")"
	plans=$(grep -c '\] debug: Q\(CONV\|LINEAR\) .*, weights ' "$tmp/qerr$k")
	want=$(echo "frozen;compared every run" | cut -d';' -f$((2 - k)))
	kept=$(grep -c "\] debug: Q\(CONV\|LINEAR\) .*, weights $want\$" "$tmp/qerr$k")
	echo "INT8, keep_weights = $k: $kept of $plans QCONV/QLINEAR plans with weights $want"
	[ "$plans" -ge 4 ] && [ "$kept" -eq "$plans" ] ||
		fail "INT8, keep_weights = $k: $kept of $plans QCONV/QLINEAR plans with weights $want (4 expected: 2 models of 2 INT8 layers)"
	# quantizations per phase (A, B, B loaded into A, A back): one per INT8 layer
	counts=$(per_phase "$tmp/qerr$k")
	echo "INT8, keep_weights = $k: quantizations per phase: $counts"
	[ "$counts" = "2 2 2 2" ] || fail "INT8, keep_weights = $k: quantizations per phase $counts, 2 2 2 2 expected"
done
KILN_LOG_LEVEL=debug "$top_builddir/tests/infer_reload" --quantized --sizes "$tmp/qr1.ini" "$tmp/q1.safetensors" \
	"$tmp/q5.safetensors" 2>"$tmp/qserr" || fail "tests/infer_reload --quantized --sizes: $(grep -v debug: "$tmp/qserr" | tail -3)"
# phases: fresh QA 5 rows, 6 rows; fresh QA with QB 7 rows, then 5;
# QA 5 6 5 6 5 6; QB loaded, 7 rows; then 5
counts=$(per_phase "$tmp/qserr")
echo "INT8, calls of other sizes: quantizations per phase: $counts"
[ "$counts" = "2 2 2 0 2 2 0" ] ||
	fail "INT8, calls of other sizes: quantizations per phase $counts, 2 2 2 0 2 2 0 expected (one per INT8 layer and load, whatever the plans)"
# the entries the INT8 layers' weights are kept in: one per layer and model
entries=$(per_phase "$tmp/qserr" 'kept weights: a new entry of INT8 weights (frozen: shared')
echo "INT8, calls of other sizes: kept entries made per phase: $entries"
[ "$entries" = "2 2 2 0 2 0 0" ] ||
	fail "INT8, calls of other sizes: kept entries made per phase $entries, 2 2 2 0 2 0 0 expected (one per INT8 layer and model, none at a plan's prepare)"
# ---- 6. Winograd's kept weight transform ----------------------------------------
awk '$0 == "[layer.pool1]" { print "[layer.conv2]\ntype = conv\nout = 16\nkernel = 3\npadding = 1\n\n[layer.relu2]\ntype = relu\n" }
	{ print } $0 == "[layer.conv1]" { print "out = 16" }' "$tmp/r.ini" | grep -v '^out = 4$' >"$tmp/w.ini"
for s in 1 2; do
	kiln 0 export "$tmp/w.ini" --safetensors "$tmp/w$s.safetensors" "run.out_dir=$tmp/w$s" run.seed=$s
done
for k in 1 0; do
	printf '[plugin.cpu]\nkeep_weights = %s\n' $k >"$tmp/wk$k.ini"
	cat "$tmp/w.ini" "$tmp/wk$k.ini" >"$tmp/wr$k.ini"
	KILN_LOG_LEVEL=debug "$top_builddir/tests/infer_reload" "$tmp/wr$k.ini" "$tmp/w1.safetensors" \
		"$tmp/w2.safetensors" 2>"$tmp/werr$k" || fail "tests/infer_reload, Winograd, keep_weights = $k: $(tail -3 "$tmp/werr$k")"
	wplans=$(grep -c '(wino.c)' "$tmp/werr$k")
	wkept=$(grep -c '(wino.c).*transformed weights kept (frozen)' "$tmp/werr$k")
	echo "Winograd, keep_weights = $k: $wplans plans, $wkept with their weights kept"
	if grep -q avx512bw /proc/cpuinfo 2>/dev/null && grep -q avx512vl /proc/cpuinfo; then
		[ "$wplans" -ge 1 ] || fail "Winograd, keep_weights = $k: no Winograd plan on an AVX-512 CPU"
		[ "$wkept" -eq $((k * wplans)) ] || fail "Winograd, keep_weights = $k: $wkept of $wplans plans keep their weights"
	fi
done
# ---- 7. f32 kept weights shared across sizes -------------------------------------
printf 'conv_impl = first\n' | cat "$tmp/wr1.ini" - >"$tmp/ws.ini"
KILN_LOG_LEVEL=debug "$top_builddir/tests/infer_reload" --sizes "$tmp/ws.ini" "$tmp/w1.safetensors" \
	"$tmp/w2.safetensors" 2>"$tmp/wserr" || fail "tests/infer_reload --sizes (f32): $(grep -v debug: "$tmp/wserr" | tail -3)"
reord=$(per_phase "$tmp/wserr" 'CONV: weights reordered into the kernel')
greord=$(per_phase "$tmp/wserr" 'GEMM: weights reordered into the kernel')
wino=$(per_phase "$tmp/wserr" 'Winograd-transformed weights made')
entries=$(per_phase "$tmp/wserr" 'kept weights: a new entry of')
echo "f32, calls of other sizes: per phase: $reord conv reorders, $greord GEMM reorders, $wino Winograd transforms, $entries kept entries"
[ "$reord" = "1 1 1 0 1 1 0" ] ||
	fail "f32, calls of other sizes: conv1's weights reordered $reord per phase, 1 1 1 0 1 1 0 expected (once per model and load, whatever the plans)"
if grep -q avx512bw /proc/cpuinfo 2>/dev/null && grep -q avx512vl /proc/cpuinfo; then
	[ "$wino" = "1 1 1 0 1 1 0" ] ||
		fail "f32, calls of other sizes: conv2's weights transformed $wino per phase, 1 1 1 0 1 1 0 expected"
	[ "$greord" = "0 0 0 1 1 0 1" ] ||
		fail "f32, calls of other sizes: fc1's weights reordered $greord per phase, 0 0 0 1 1 0 1 expected (on the second call that reads them, once per model and load, whatever the plans)"
	[ "$entries" = "2 2 2 1 3 0 0" ] ||
		fail "f32, calls of other sizes: kept entries made per phase $entries, 2 2 2 1 3 0 0 expected (one per kept weight and model: conv1, conv2, and fc1 once read twice)"
else
	[ "$entries" = "1 1 1 0 1 0 0" ] ||
		fail "f32, calls of other sizes: kept entries made per phase $entries, 1 1 1 0 1 0 0 expected (one per kept weight and model)"
fi
echo "PASS ($checks kiln runs)"
