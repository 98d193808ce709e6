#!/bin/sh
# The GPU check's harness (tests/gpu/run.sh, GPU half) on a machine without
# a GPU, with a fake bundle: shell scripts in place of kiln and the suites.
# What a device call needs from it, checked here before any device time:
#   budget    a run keeps to KILN_GPU_BUDGET: a hanging suite is cut to
#             what is left, the later steps are reported SKIPPED, and the
#             run ends within the budget
#   results   a failing suite's line names the failed check (its :F: line);
#             RESULT: FAIL, exit 1
#   $OUT      holds gpu_results.txt and logs.tar.gz and nothing else (the
#             device tool returns at most 8 files), the logs inside
#   progress  a run killed in the middle has left the lines and the logs
#             of the steps that ended
#   no GPU    `kiln plugins` saying cuda is unavailable: exit 77, RESULT:
#             NOT RUN, in seconds
#   stage 1   the counts past 2^24 (tests/gpu/counts.ini) read the
#             numbers they check; kiln-nccl's one-rank check runs and says
#             its NCCL; the bf16 CNN with conv_wgrad = lowp runs at debug
#             level and its line counts the weight gradients that took the
#             path and those that fell back; check_device_lowp gets 120 s,
#             not 60
: "${abs_top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
run=$abs_top_srcdir/tests/gpu/run.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln_gpu_stages.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# the fake bundle
b=$tmp/bundle
mkdir -p "$b/bin" "$b/lib/kiln" "$b/data/fashion-mnist"
: > "$b/lib/kiln/kiln-cuda.so"
echo 0.85 > "$b/cpu_test_acc.txt"
echo 0.84 > "$b/cpu_cnn_fp32_acc.txt"
echo 0.86 > "$b/cpu_cnn_bf16_acc.txt"
echo 0.79 > "$b/cpu_cnn_int8_acc.txt"
echo fake > "$b/commit.txt"
cat > "$b/bin/kiln" <<'EOF'
#!/bin/sh
case $1 in
plugins)
	echo "KIND       NAME           ABI   STATUS                       SUMMARY"
	echo "device     cuda           2.11  ${FAKE_CUDA:-available}                    NVIDIA GPU: fake"
	;;
train)
	sleep "${FAKE_TRAIN_S:-0}"
	# cudnn.c's debug lines of conv_wgrad = lowp: two plans took it, one fell back
	case "${KILN_LOG_LEVEL:-}:$*" in
	debug:*conv_wgrad=lowp*)
		echo "[cuda] debug: k1: dw in x's dtype, widened after (conv_wgrad = lowp), engine 3, workspace 64 bytes"
		echo "[cuda] debug: k2: dw in x's dtype, widened after (conv_wgrad = lowp), engine 3, workspace 64 bytes"
		echo "[cuda] debug: k3: conv_wgrad = lowp: no engine writes dw in the activations' dtype (4 engine configs, 0 refused by their notes, 4 not buildable, 0 over the workspace): as conv_wgrad = f32"
		;;
	esac
	echo "epoch 1/1 loss 0.5"
	case $* in
	*counts.ini*clip_norm*) echo '{"test_acc": 0.499511, "steps_clipped": 30}' ;;
	*counts.ini*) echo '{"test_acc": 1.000000, "test_samples": 17825792}' ;;
	*) echo '{"test_acc": 0.851, "train_samples_per_s": 1000}' ;;
	esac
	;;
generate)
	# the refusals of tests/gpu/run.sh's generate_device (no decoding
	# attention on cuda; auto's CPU device not in the bundle)
	case $* in
	*run.device=cuda*) echo "kiln: error: generation needs the CPU device: set run.device=cpu (the cuda device has no ATTENTION_DECODE)" >&2 ;;
	*) echo "kiln: error: generation needs the CPU device, which is not here (\`kiln plugins\`): device = auto chose cuda" >&2 ;;
	esac
	exit 2
	;;
*) echo '{"test_acc": 0.79}' ;;
esac
EOF
pass_suite='#!/bin/sh
echo "100%: Checks: 4, Failures: 0, Errors: 0"'
printf '%s\n' "$pass_suite" > "$b/bin/check_device_a"
printf '%s\n' "$pass_suite" > "$b/bin/check_device_attention"
printf '%s\n' "$pass_suite" > "$b/bin/check_rnn"
printf '%s\n' "$pass_suite" 'echo "kiln-nccl: NCCL 2.28.3, GPU 0, watchdog at 20 s"' > "$b/bin/check_nccl_one"
cat > "$b/bin/check_device_b" <<'EOF'
#!/bin/sh
echo "tests/check_device_b.c:12:F:gemm:test_gemm:0: y[3] = 2, want 1"
echo "75%: Checks: 4, Failures: 1, Errors: 0"
exit 1
EOF
cat > "$b/bin/check_device_c" <<'EOF'
#!/bin/sh
exec sleep "${FAKE_HANG_S:-0}"
EOF
chmod +x "$b/bin/"*
export KILN_GPU_BUNDLE="$b"

# 1. budget, results, $OUT: suite c hangs, a 40 s budget (the first
# steps may take seconds on a loaded machine)
OUT=$tmp/out1
export OUT
t0=$(date +%s)
FAKE_HANG_S=300 KILN_GPU_BUDGET=40 KILN_GPU_WORK=$tmp/w1 sh "$run" --stage 1 > "$tmp/run1.txt" 2>&1
rc=$?
dt=$(($(date +%s) - t0))
r=$OUT/gpu_results.txt
[ $rc -eq 1 ] || bad "run 1: exit $rc, want 1"
[ $dt -le 44 ] || bad "run 1 took $dt s: over its 40 s budget"
grep -q "^conformance check_device_a: PASS" "$r" || bad "run 1: no PASS line for suite a"
grep -q "^conformance check_device_b: FAIL (exit 1" "$r" || bad "run 1: no FAIL line for suite b"
grep -q "check_device_b.c:12:F:gemm" "$r" || bad "run 1: suite b's failed check not in the results"
grep -q "^conformance check_device_c: FAIL (timed out after" "$r" || bad "run 1: suite c not cut by the budget"
grep -q "^train_mlp: SKIPPED (the budget" "$r" || bad "run 1: training not skipped when the budget was spent"
grep -q "^RESULT: FAIL" "$r" || bad "run 1: no RESULT: FAIL"
files=$(cd "$OUT" && ls -A | tr '\n' ' ')
[ "$files" = "gpu_results.txt logs.tar.gz " ] || bad "run 1: \$OUT holds '$files', want gpu_results.txt logs.tar.gz"
tar -tzf "$OUT/logs.tar.gz" 2>/dev/null | grep -q "^logs/check_device_b.log$" || bad "run 1: logs.tar.gz lacks logs/check_device_b.log"
[ -e "$tmp/w1" ] && bad "run 1: its work folder was left behind"

# 2. a passing run with every stage-1 step (the budget ample)
OUT=$tmp/out2
rm "$b/bin/check_device_b" "$b/bin/check_device_c"
KILN_GPU_WORK=$tmp/w2 sh "$run" --stage 1 > "$tmp/run2.txt" 2>&1
rc=$?
r=$OUT/gpu_results.txt
[ $rc -eq 0 ] || bad "run 2: exit $rc, want 0"
for l in "conformance: 2 of 2 suites passed" "train_mlp: PASS (test accuracy 0.851; the cpu device's 0.85" \
	"cnn_fp32: PASS" "counts past 2^24: PASS (accuracy 1.000000 of 17825792 samples; 30 of 30 steps clipped)" \
	"cnn_bf16: PASS" "attention cudnn attn_lowp_shapes: PASS" \
	"attention kiln attn_lowp_shapes: PASS" "rnn torch: PASS" "rnn layer: PASS" "int8 eval: PASS" \
	"nccl one: PASS (kiln-nccl: NCCL 2.28.3, GPU 0, watchdog at 20 s)" "cnn_bf16_wlowp: PASS" \
	"cnn_bf16_wlowp: conv_wgrad = lowp taken by 2 weight-gradient plans (dw in x's dtype, widened after), 1 fell back to widening x and dy"; do
	grep -qF "$l" "$r" || bad "run 2: no line '$l'"
done
grep -q "SKIPPED" "$r" && bad "run 2: a step skipped with the whole budget"

# 3. progress: killed while training, the lines and logs so far are there
OUT=$tmp/out3
FAKE_TRAIN_S=6 KILN_GPU_WORK=$tmp/w3 timeout 3 sh "$run" --stage 1 > "$tmp/run3.txt" 2>&1
r=$OUT/gpu_results.txt
grep -q "^conformance: 2 of 2 suites passed" "$r" || bad "run 3: the conformance line is not there after the kill"
tar -tzf "$OUT/logs.tar.gz" 2>/dev/null | grep -q "^logs/check_device_a.log$" || bad "run 3: the logs so far are not in \$OUT after the kill"

# 4. no usable GPU: 77 at once
OUT=$tmp/out4
t0=$(date +%s)
FAKE_CUDA="unavailable: no CUDA driver, none available" KILN_GPU_WORK=$tmp/w4 sh "$run" --stage 1,2 > "$tmp/run4.txt" 2>&1
rc=$?
[ $rc -eq 77 ] || bad "run 4: exit $rc, want 77"
grep -q "^RESULT: NOT RUN" "$OUT/gpu_results.txt" || bad "run 4: no RESULT: NOT RUN"
[ $(($(date +%s) - t0)) -le 10 ] || bad "run 4: took more than 10 s to say there is no GPU"

# 5. a bad stage
sh "$run" --stage 5 > /dev/null 2>&1
[ $? -eq 2 ] || bad "--stage 5 was not refused"

# 6. check_device_lowp's limit: 120 s (its cuDNN weight-gradient plans), as
# a suite that exits 124 (timeout's status) shows in its line
OUT=$tmp/out6
printf '#!/bin/sh\nexit 124\n' > "$b/bin/check_device_lowp"
chmod +x "$b/bin/check_device_lowp"
KILN_GPU_WORK=$tmp/w6 sh "$run" --stage 1 > "$tmp/run6.txt" 2>&1
grep -q "^conformance check_device_lowp: FAIL (timed out after 120 s" "$OUT/gpu_results.txt" ||
	bad "run 6: check_device_lowp's limit is not 120 s"

if [ $fails -ne 0 ]; then
	for f in "$tmp"/run*.txt; do echo "== $f"; cat "$f"; done
	exit 1
fi
echo "gpu_stages: budget, results, \$OUT, progress, no GPU, stage 1's steps: ok"
exit 0
