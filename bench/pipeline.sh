#!/bin/sh
# Pipeline bubble and activation memory (docs/pipeline.md).
#
# MODEL=mirror (the default since session 44; the issue-21 figure): stages
# equal by construction, as the schedule's (P-1)/(M+P-1) assumes.  16
# inputs (4 x 4 one-channel synthetic images) that stage 0 widens to 1024
# (linear + ReLU) before two blocks of linear 1024 -> 1024 + ReLU; stage 1
# two such blocks and the head narrowing 1024 to 16, and the loss: flat,
# in, r0, b1, r1, b2, r2 | b3, r3, b4, r4, head, loss.  Each stage runs
# the same four 1024 x 1024 GEMMs' forwards and gradients (b1, b2 compute
# their input's gradient as b3, b4 do, since `in` is trained), and one
# 16-wide linear each (stage 0's without its input's gradient, stage 1's
# with it and a 16-class loss): under 1% of a stage's work, against 2.5-4%
# for the blocks model's layernorm (session 43).  The same model as
# bench/pipeline_pair.sh's MODEL=mirror (stages on ranks), here in one
# process; its loader makes 16 floats a sample, not 1024.
#
# MODEL=blocks (the default before session 44): stages of identical
# shapes but not of identical work.  32x32 one-channel synthetic images
# (1024 inputs), batch 256, two blocks of linear 1024 -> 1024 + ReLU per
# stage: flat, ln (a layernorm of the input, whose parameters make stage
# 0's first linear compute its input's gradient as every other one does),
# b1, r1, b2, r2 | b3, r3, b4, r4, head (1024 -> 16), loss.  The stages
# differ by the layernorm against the 16-wide head and the loss: stage 0's
# passes measured 2.5-4% longer (session 43), which at M = 16 is +0.014
# of a 0.059 bubble; kept to compare with sessions 16-43.
#
# MODEL=mlp (the model of sessions 9-11): an MLP 1587 -> 1024 -> 1024 -> 1024 -> 1024 -> 16 (ReLUs
# between; synthetic 23x23 RGB images), batch 256, cut into 2 stages
# (flat..r2 | fc3..loss) of equal FLOPs: stage 0's first layer needs no
# input gradient, so its 1587-wide fc1 (1.55 + 1.55 GEMM units of
# 1024x1024) and fc2 (1 + 2) match stage 1's fc3 and fc4 (1 + 2 each;
# the 16-wide head adds ~1%).  Not of equal time: at 16-64 rows a
# micro-batch the passes read the weights more than they compute, and
# stage 0 takes 1.04-1.12x stage 1's CPU time; IMAGE=21 (below) makes
# the two equal.
#
# Each stage runs on a CPU device instance of its own with one
# thread ([run] devices = cpu:0, cpu:1, threads = 2).  A micro-batch's
# work dominates its overheads: at M = 16 a micro-batch is 16 rows, a
# 16x1024x1024 GEMM (~34 MFLOP) per layer and pass, milliseconds on one
# core against tens of microseconds of issue and event overhead.
#
# For M = 4, 8, 16 micro-batches (1f1b), the columns (each a bubble unless
# said otherwise; smooth, ends and handoff0 add up what the measured
# bubble is made of, from the schedule's up):
#   bubble   measured by the pipeline itself: each stage's stream stamps
#            the start and end of its forwards and backwards, and the log
#            gives 1 - sum(busy) / (P * span) over the steps after the
#            first (core/pipe_timing.c)
#   theory   the schedule's (P-1)/(M+P-1)
#   handoff0 the bubble had every hand-off been instant: the schedule
#            replayed with each pass's measured wall time (what remains
#            above theory: the passes' unequal times, not the waits)
#   smooth   the schedule replayed with each pass at its stage's mean
#            (wall) for its kind and instant hand-offs: the schedule's
#            bubble plus the stages' imbalance (the log's "pipeline smooth
#            replay" line, core/pipe_timing.c); cpu_sm the same in CPU time
#   ends     smooth, but the step's end passes (its first forward, the
#            fill; its last backward, the drain) as measured: ends - smooth
#            is what the end passes' extra work costs; e1_ms, eN_ms those
#            passes' excess over their stage's other passes of their kind
#            (the "pipeline end passes" line)
#   cpu0     the same with each pass's CPU time (the stage's stream thread):
#            other processes' load stretches neither
#   cpu0_b, cpu0_i  cpu0 split as busiest + imb: the imbalance in CPU time
#   rel      |bubble - theory| / theory: the issue's target is <= 10%
#   ratio    bubble / theory
#   busy0, busy1  each stage's busy ms a step (the sum of its passes, wall;
#            the log's "pipeline busy" line): equal stages are what theory
#            assumes; s0/s1 their ratio
#   busiest  the bubble split (core/pipe_timing.c, docs/pipeline.md): the
#            busiest stage's idle share of the span, 1 - max(busy) / span,
#            what the schedule's theory predicts (it assumes equal stages)
#   rel_b    |busiest - theory| / theory
#   imb      the rest of the bubble: (max(busy) - mean(busy)) / span, the
#            other stage waiting for the busiest (bubble = busiest + imb)
#   ho_us    a hand-off's latency: the mean wall time from a pass's end to
#            the start of the other stage's pass that waited for it (the
#            log's "pipeline gaps", core/pipe_timing.c); ho_med its median
#            (1 us bins), which another process's time slices move less
#   gcpu     the stage threads' CPU ms a step between their passes (the
#            crossing tensors' copies, the waits' spins, event records)
#   pipe_sps, serial_sps  samples/s of the 2-stage run and of the same
#            model on one stage and one thread (M micro-batches): with
#            stages that overlap, pipe/serial approaches 2 (1 - bubble) x
#   gpipe_MiB, 1f1b_MiB   the activation arenas (the pipeline's log)
#   w_n      the stage threads' waits for the other stage's event, a step
#            (the CPU device's "stage waits" lines, both stages; a build
#            before session 44 prints -); w_slept the share of them that
#            did not see the event on a prompt turn of their spin (a late
#            turn, asleep at stage_spin_us, asleep at once as the spin
#            backs off); w_seen_us, w_wake_us how long after the event's
#            record the prompt spinners, the others went on (means)
#   wg_wait, wg_end  [pipeline] defer_wgrad (session 49): the deferred
#            weight gradients' ms a step (both stages) run while a stage
#            waited for the other's event, and where it waited for them
#            (the bound of P - 1 - s pending, and the step's end) (the CPU
#            device's "side stream work" lines; - where none ran).  They are
#            outside the passes: with them the bubble column counts that
#            work as idle, and the drain after a stage's last pass is
#            outside the span; compare pipe_sps
#   fast     the vCPUs' placement (bench/common.sh's place_before /
#            place_after): bench/c2c_latency --rounds 1 before and after
#            each 2-stage and each serial run (the probe after one run is
#            the one before the next), a run "fast" when both read under
#            C2C_FAST_NS (200 ns: the two vCPUs on one L3); fast is how many
#            of the 2-stage runs were; bubble_f, pipe_f, serial_f the
#            medians of bubble, pipe_sps and serial_sps over fast runs only
#            (- when none; docs/PERFORMANCE.md, "Session 49: the anchors'
#            placement probe").  NO_PROBE=1: no probe, nor these columns
# Medians of RUNS interleaved runs.  Needs 2 idle cores to mean anything.
# Usage: bench/pipeline.sh [--short] [RUNS]   (from the top of the build tree)
#   KILN=/work/main/kiln KILN_PLUGIN_PATH=/work/main/plugins/.libs: another build
#   (an A/B; a build without the end-passes and smooth-replay lines prints - there)
#   --short: one run of 4 steps per point (a smoke test of the script)
# Environment:
#   MODEL      mirror (default), blocks or mlp
#   MS         the micro-batch counts (default "4 8 16")
#   IMAGE=21   (MODEL=mlp) 21x21 images (1323 inputs) instead of 23x23: the two stages
#              equal in measured CPU time (stage 0 / stage 1 0.97-1.03
#              against 1.06-1.12 at 23; docs/PERFORMANCE.md, issue 21,
#              session 10), where the default's cut balances FLOPs
#   NO_PROBE=1 no placement probe (above)
#   C2C        the probe (./bench/c2c_latency)
#   PIPE_ARGS  more KEY=VALUE for the 2-stage runs (e.g.
#              plugin.cpu.stage_spin_us=100, the hand-offs' old wait); the
#              runs pin pipeline.defer_wgrad=0 (auto's load-driven switch
#              off) unless PIPE_ARGS sets it
set -eu
STEPS=12
if [ "${1:-}" = "--short" ]; then
	shift
	STEPS=4
	RUNS=${1:-1}
else
	RUNS=${1:-3}
fi
KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
[ "${NO_PROBE:-0}" != 1 ] || PLACE_PROBE=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; bench_cache_rm' EXIT
. "$(dirname "$0")/../tests/config_lib.sh"
MODEL=${MODEL:-mirror}
{
	ini run seed=1 threads=1 out_dir="$tmp/run"
	case $MODEL in
	mirror)
		ini_synthetic 8192 4 16 image_channels=1 workers=1
		ini_layers flat:flatten in:linear:out=1024 r0:relu b1:linear:out=1024 r1:relu \
			b2:linear:out=1024 r2:relu b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu \
			head:linear:out=16 loss:softmax_xent
		split="model.stages=flat,r2|b3,loss"
		what="mirror 16 -> 1024, 2 x (linear 1024 + relu) | 2 x (linear 1024 + relu), linear 16"
		;;
	blocks)
		ini_synthetic 8192 32 16 image_channels=1 workers=1
		ini_layers flat:flatten ln:layernorm b1:linear:out=1024 r1:relu b2:linear:out=1024 r2:relu \
			b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
		split="model.stages=flat,r2|b3,loss"
		what="blocks 1024 (layernorm) 2 x (linear 1024 + relu) | 2 x (linear 1024 + relu), linear 16"
		;;
	mlp)
		ini_synthetic 8192 "${IMAGE:-23}" 16 image_channels=3 workers=1
		ini_layers flat:flatten fc1:linear:out=1024 r1:relu fc2:linear:out=1024 r2:relu \
			fc3:linear:out=1024 r3:relu fc4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
		split="model.stages=flat,r2|fc3,loss"
		what="MLP $((${IMAGE:-23} * ${IMAGE:-23} * 3))-1024-1024-1024-1024-16"
		;;
	*)
		echo "bench/pipeline.sh: MODEL=$MODEL: mirror, blocks or mlp" >&2
		exit 2
		;;
	esac
	ini train epochs=1 max_steps="$STEPS" batch=256 lr=0.01 log_every=1000 eval=0 \
		checkpoint_last=0 overwrite=1
} > "$tmp/p.ini"
# run OUT ARGS...: one training run, its stdout and log in OUT.out/OUT.err
run() {
	o=$1
	shift
	"$KILN" train "$tmp/p.ini" "$@" >"$o.out" 2>"$o.err" || { cat "$o.err" >&2; exit 1; }
}
sps() { sed -n 's/.*"train_samples_per_s": *\([0-9.]*\).*/\1/p' "$1.out" | tail -1; }
bubble() { sed -n 's/.*; bubble \([0-9.-]*\) (schedule \([0-9.]*\);.*/\1/p' "$1.err" | tail -1; }
cpu0() { sed -n 's/.*pipeline CPU ms\/step:.* bubble \([0-9.-]*\) with a core each.*/\1/p' "$1.err" | tail -1; }
ideal() { sed -n 's/.*; bubble [0-9.-]* (schedule [0-9.]*; \([0-9.-]*\) with these passes.*/\1/p' "$1.err" | tail -1; }
# bsplit NAME K: the K-th figure of the split line (1 the busiest stage's idle, 2 the
# imbalance; 3, 4 the same replayed with CPU times)
bsplit() { sed -n "s/.*pipeline bubble split: busiest stage [0-9]* idle \([0-9.-]*\) (schedule [0-9.]*, for equal stages) + imbalance \([0-9.-]*\) = [0-9.-]*; with the passes' CPU times and instant hand-offs \([0-9.-]*\) + \([0-9.-]*\)$/\\$2/p" "$1.err" | tail -1; }
# gaps NAME K: 1 the hand-off latency (us), 2 the stage threads' CPU between passes (ms a
# step), 3 the hand-offs' median latency (us)
gaps() { sed -n "s/.*pipeline gaps: a pass that waited for the other stage's started \([0-9.]*\) us after it ended (median \([0-9]*\),.*the stage threads' CPU between passes \([0-9.]*\) ms a step$/\\1 \\3 \\2/p" "$1.err" | tail -1 | cut -d' ' -f"$2"; }
# ends NAME K: the "smooth replay" line's 1 smooth, 2 ends, 3 smooth in CPU time; the "end
# passes" line's 4 and 5, the first forward's and last backward's excess over their
# stage's others (ms)
ends() {
	case $2 in
	[123])
		sed -n "s/.*pipeline smooth replay: bubble \([0-9.-]*\) (schedule [0-9.]* + the stages' imbalance), \([0-9.-]*\) with the end passes as measured, .*; \([0-9.-]*\) in CPU time$/\1 \2 \3/p" "$1.err" |
			tail -1 | cut -d' ' -f"$2"
		;;
	*)
		sed -n "s/.*pipeline end passes: the step's first forward (stage [0-9]*) \([0-9.]*\) ms against \([0-9.]*\) for its stage's others, its last backward (stage [0-9]*) \([0-9.]*\) ms against \([0-9.]*\)$/\1 \2 \3 \4/p" "$1.err" |
			tail -1 | awk -v k="$2" '{ print k == 4 ? $1 - $2 : $3 - $4 }'
		;;
	esac
}
# busy NAME K: stage K's busy ms a step (the "pipeline busy" line)
busy() { sed -n "s/.*pipeline busy ms\/step: stage 0 \([0-9.]*\), stage 1 \([0-9.]*\), span.*/\\$(($2 + 1))/p" "$1.err" | tail -1; }
# waits NAME K: the stage waits (the "stage waits" lines of the stages'
# contexts, of 1 thread each; the run's own device has 2): 1 their count a
# step, 2 the share that slept, 3 a spinner's mean latency (us), 4 a sleeper's
waits() {
	sed -n "s/.*stage waits (threads 1) for another context's event: \([0-9]*\); seen spinning \([0-9]*\) (a mean \([0-9.]*\) us after.*a late turn \([0-9]*\) (went on \([0-9.]*\) us after.*slept at stage_spin_us \([0-9]*\) (woke \([0-9.]*\) us after.*backing off \([0-9]*\) (woke \([0-9.]*\) us after.*/\1 \2 \3 \4 \5 \6 \7 \8 \9/p" "$1.err" |
		awk -v k="$2" -v steps="$STEPS" '
		{ n += $1; s += $2; sa += $2 * $3; l += $4 + $6 + $8; la += $4 * $5 + $6 * $7 + $8 * $9 }
		END { if (!n) exit
			v = k == 1 ? n / steps : k == 2 ? (n ? l / n : 0) : k == 3 ? (s ? sa / s : 0) : (l ? la / l : 0)
			print v }'
}
# side NAME K: the deferred weight gradients' ms a step, 1 in waits, 2 at the end
side() {
	sed -n "s/.*side stream work (deferred, threads 1): [0-9]* groups run while waiting for another event (\([0-9.]*\) ms), [0-9]* at a wait for the side's own (\([0-9.]*\) ms)$/\1 \2/p" "$1.err" |
		awk -v k="$2" -v steps="$STEPS" '{ t += $k; n++ } END { if (n) print t / steps }'
}
mib() { sed -n 's/.*activation sets (\([0-9.]*\) MiB).*/\1/p' "$1.err" | tail -1; }
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "load average: $(cat /proc/loadavg)"
echo "$what, batch 256, 2 stages on cpu:0, cpu:1 (1 thread each), 1f1b ${PIPE_ARGS:-}; $RUNS run(s) of $STEPS steps"
printf '%4s %7s %7s %5s %5s %7s %7s %5s %7s %5s %6s %6s %6s %6s %6s %6s %8s %6s %6s %6s %7s %6s %6s %5s %7s %9s %9s %9s %9s %7s %8s %8s %7s %6s' M bubble theory rel ratio \
	busy0 busy1 s0/s1 busiest rel_b imb smooth ends e1_ms eN_ms cpu_sm handoff0 cpu0 cpu0_b cpu0_i ho_us ho_med gcpu \
	w_n w_slept w_seen_us w_wake_us pipe_sps serial_sps speedup gpipe_MiB 1f1b_MiB wg_wait wg_end
[ "$PLACE_PROBE" != 1 ] || printf '  %5s %8s %8s %8s' fast bubble_f pipe_f serial_f
echo
for M in ${MS:-4 8 16}; do
	: > "$tmp/b"; : > "$tmp/p"; : > "$tmp/s"; : > "$tmp/i"; : > "$tmp/c"
	for k in 1 2 3 4; do : > "$tmp/x$k"; done
	for k in 1 2 3 4 5; do : > "$tmp/e$k"; done
	: > "$tmp/h1"; : > "$tmp/h2"; : > "$tmp/h3"; : > "$tmp/u0"; : > "$tmp/u1"
	for k in 1 2 3 4; do : > "$tmp/w$k"; done
	: > "$tmp/bf"; : > "$tmp/pf"; : > "$tmp/sf"; nfast=0
	place_fresh
	: > "$tmp/g1"; : > "$tmp/g2"
	for r in $(seq "$RUNS"); do
		place_before
		# defer_wgrad pinned off (auto could turn it on at step 9 under
		# load: A/B runs against main would compare two modes); PIPE_ARGS
		# comes after, so its pipeline.defer_wgrad wins
		# shellcheck disable=SC2086 # PIPE_ARGS: words
		run "$tmp/pipe" pipeline.micro_batches=$M "$split" "run.devices=cpu:0, cpu:1" run.threads=2 \
			pipeline.defer_wgrad=0 ${PIPE_ARGS:-}
		place_after
		if [ "$PLACE" = fast ]; then
			nfast=$((nfast + 1))
			bubble "$tmp/pipe" >> "$tmp/bf"
			sps "$tmp/pipe" >> "$tmp/pf"
		fi
		bubble "$tmp/pipe" >> "$tmp/b"
		ideal "$tmp/pipe" >> "$tmp/i"
		cpu0 "$tmp/pipe" >> "$tmp/c"
		for k in 1 2 3 4; do bsplit "$tmp/pipe" $k >> "$tmp/x$k"; done
		for k in 1 2 3; do gaps "$tmp/pipe" $k >> "$tmp/h$k"; done
		for k in 1 2 3 4 5; do ends "$tmp/pipe" $k >> "$tmp/e$k"; done
		for k in 0 1; do busy "$tmp/pipe" $k >> "$tmp/u$k"; done
		for k in 1 2 3 4; do waits "$tmp/pipe" $k >> "$tmp/w$k"; done
		for k in 1 2; do side "$tmp/pipe" $k >> "$tmp/g$k"; done
		sps "$tmp/pipe" >> "$tmp/p"
		place_before
		run "$tmp/serial" pipeline.micro_batches=$M
		place_after
		[ "$PLACE" != fast ] || sps "$tmp/serial" >> "$tmp/sf"
		sps "$tmp/serial" >> "$tmp/s"
	done
	b=$(median < "$tmp/b"); p=$(median < "$tmp/p"); s=$(median < "$tmp/s")
	i=$(median < "$tmp/i"); c=$(median < "$tmp/c")
	x1=$(median < "$tmp/x1"); x2=$(median < "$tmp/x2"); x3=$(median < "$tmp/x3"); x4=$(median < "$tmp/x4")
	h1=$(median < "$tmp/h1"); h2=$(median < "$tmp/h2"); h3=$(median < "$tmp/h3")
	e1=$(median < "$tmp/e1"); e2=$(median < "$tmp/e2"); e3=$(median < "$tmp/e3")
	e4=$(median < "$tmp/e4"); e5=$(median < "$tmp/e5")
	u0=$(median < "$tmp/u0"); u1=$(median < "$tmp/u1")
	g1=$(median < "$tmp/g1"); g2=$(median < "$tmp/g2")
	w1=$(median < "$tmp/w1"); w2=$(median < "$tmp/w2"); w3=$(median < "$tmp/w3"); w4=$(median < "$tmp/w4")
	run "$tmp/g" train.max_steps=1 pipeline.micro_batches=$M "$split" pipeline.schedule=gpipe
	run "$tmp/f" train.max_steps=1 pipeline.micro_batches=$M "$split" pipeline.schedule=1f1b
	awk -v M=$M -v b="$b" -v i="$i" -v c="$c" -v p="$p" -v s="$s" -v g="$(mib "$tmp/g")" -v f="$(mib "$tmp/f")" \
		-v x1="$x1" -v x2="$x2" -v x3="$x3" -v x4="$x4" -v h1="$h1" -v h2="$h2" -v h3="$h3" \
		-v e1="$e1" -v e2="$e2" -v e3="$e3" -v e4="$e4" -v e5="$e5" -v u0="$u0" -v u1="$u1" \
		-v w1="$w1" -v w2="$w2" -v w3="$w3" -v w4="$w4" -v g1="$g1" -v g2="$g2" -v probe="$PLACE_PROBE" \
		-v fast="$nfast/$RUNS" -v bf="$(median < "$tmp/bf")" -v pf="$(median < "$tmp/pf")" -v sf="$(median < "$tmp/sf")" '
		function f3(v) { return v == "" ? "-" : sprintf("%.3f", v) }
		function fv(fmt, v) { return v == "" ? "-" : sprintf(fmt, v) }
		BEGIN {
		t = 1 / (M + 1); d = b - t; if (d < 0) d = -d; e = x1 - t; if (e < 0) e = -e
		printf "%4d %7.3f %7.3f %4.0f%% %5.2f %7.3f %7.3f %5.3f %7.3f %4.0f%% %6.3f %6s %6s %6s %6s %6s %8.3f %6.3f %6.3f %6.3f %7.1f %6.0f %6.3f %5s %7s %9s %9s %9.0f %9.0f %7.2f %8.2f %8.2f %7s %6s",
			M, b, t, 100 * d / t, b / t, u0, u1, (u1 > 0 ? u0 / u1 : 0), x1, 100 * e / t, x2, f3(e1), f3(e2), f3(e4), f3(e5), f3(e3), i, c, x3, x4, h1, h3, h2,
			fv("%.1f", w1), fv("%.3f", w2), fv("%.1f", w3), fv("%.1f", w4), p, s, p / s, g, f, fv("%.2f", g1), fv("%.2f", g2)
		if (probe == 1)
			printf "  %5s %8s %8s %8s", fast, f3(bf), fv("%.0f", pf), fv("%.0f", sf)
		printf "\n" }'
done
