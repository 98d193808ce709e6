#!/bin/sh
# tests/sched_torch.sh - the schedules of session 43 through the trainer,
# step by step against PyTorch's schedulers: [train] schedule =
# exponential (ExponentialLR), linear (LinearLR: start_factor, end_factor,
# total_iters), polynomial (PolynomialLR: total_iters, power) behind a
# warmup, and onecycle with three_phase = 1 and anneal_strategy = linear.
# tests/data/tr_cnn.ini over 3 epochs of 48 samples in batches of 8 (18
# steps), lr 0.1; the reference rates are tests/data/sched_refs.txt's
# tr_* lines (tests/data/gen_sched_refs.py, torch's SequentialLR of a
# LinearLR warm-up and the scheduler, stepped once per optimizer step).
# 1. each step's lr in metrics.jsonl (log_every = 1: step k ran at the
#    rate PyTorch gives step k - 1) within 1e-6 relative of PyTorch's;
# 2. resumed mid-schedule (from the step-8 checkpoint, past the warmup),
#    the resumed steps 9..18 still PyTorch's, and the run ends with the
#    uninterrupted run's state, byte for byte (the rate is a function of
#    the checkpoint's optimizer-step counter alone);
# 3. bad values are config errors naming the file and line (exit 2), and
#    the new keys under another schedule are warned of as ignored.
# Before session 43 every run here was refused: `schedule = exponential`
# is not one of constant|cosine|step|multistep|onecycle, `start_factor`
# an unknown key.
name=sched_torch
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
refs="$data/sched_refs.txt"
need_source idx

base="data.path=$data train.max_steps=0 train.epochs=3 train.eval=0 train.log_every=1 train.checkpoint_every=2 train.keep_last=0"

# lrs DIR: "step lr" of each train event in DIR/metrics.jsonl, a line each
lrs() {
	sed -n 's/.*"event":"train".*"step":\([0-9]*\),.*"lr":\([0-9.e+-]*\).*/\1 \2/p' "$1/metrics.jsonl"
}
# against CASE FILE FROM: FILE's "step lr" lines are steps FROM..18, each
# within 1e-6 relative of CASE's PyTorch rate for it (sched_refs.txt)
against() {
	awk -v name="$1" -v from="$3" -v refs="$refs" '
		BEGIN { while ((getline l < refs) > 0) {
				split(l, f, " ")
				if (f[1] != name) continue
				sub(/^[^;]*; */, "", l)
				n = split(l, want, " ") }
			if (n != 18) { printf "%s: %d reference rates in %s, want 18\n", name, n, refs; exit 1 } }
		{ k++; if ($1 != from + k - 1) { printf "line %d: step %s, want %d\n", k, $1, from + k - 1; bad = 1 }
		  r = want[$1]; d = $2 - r; if (d < 0) d = -d
		  if (d > 1e-6 * (r < 0 ? -r : r) + 1e-12) {
			printf "step %d: lr %s, PyTorch %.9g\n", $1, $2, r; bad = 1 } }
		END { if (k != 19 - from) { printf "%d steps, want %d\n", k, 19 - from; bad = 1 }
		      exit bad }' "$2"
}

check_case() {
	_case=$1
	shift
	# shellcheck disable=SC2086
	kiln 0 train "$ini" $base "run.out_dir=$tmp/$_case" "$@"
	lrs "$tmp/$_case" >"$tmp/$_case.lr"
	against "$_case" "$tmp/$_case.lr" 1 ||
		fail "$_case ($*): kiln's rates are not PyTorch's: $(tr '\n' ' ' <"$tmp/$_case.lr")"
	echo "ok: $_case: 18 steps of PyTorch's rates: $(awk '{ printf "%s ", $2 }' "$tmp/$_case.lr")"
	# resumed from step 8
	rm -rf "$tmp/$_case.r"
	mkdir -p "$tmp/$_case.r/checkpoints"
	cp "$(ck "$_case" 8)" "$tmp/$_case.r/checkpoints/"
	# shellcheck disable=SC2086
	kiln 0 train "$ini" $base "run.out_dir=$tmp/$_case.r" --resume "$@"
	stdout_has '"resumed_step": 8'
	lrs "$tmp/$_case.r" >"$tmp/$_case.r.lr"
	against "$_case" "$tmp/$_case.r.lr" 9 ||
		fail "$_case resumed at step 8: not PyTorch's rates: $(tr '\n' ' ' <"$tmp/$_case.r.lr")"
	tags=$("$top_builddir/tests/ckpt_tool" sections "$(ck "$_case" 18)" | awk '$1 != "config" { print $1 }')
	[ -n "$tags" ] || fail "no sections in $(ck "$_case" 18)"
	# shellcheck disable=SC2086
	"$top_builddir/tests/ckpt_tool" same "$(ck "$_case" 18)" "$(ck "$_case.r" 18)" $tags ||
		fail "$_case resumed at step 8: ckpt-18.kiln differs from the uninterrupted run's"
	echo "ok: $_case resumed at step 8: steps 9-18 PyTorch's, ckpt-18 the same bytes"
}

# 1 and 2
check_case tr_exponential train.schedule=exponential train.warmup=3 train.gamma=0.8
check_case tr_linear train.schedule=linear train.warmup=2 train.start_factor=0.25 \
	train.end_factor=0.5 train.total_iters=8
check_case tr_polynomial train.schedule=polynomial train.warmup=2 train.total_iters=10 train.power=2
check_case tr_onecycle train.schedule=onecycle train.pct_start=0.25 train.three_phase=1 \
	train.anneal_strategy=linear

# 3: bad values in a file: exit 2 at their line
bad() { # KEY VALUE SCHEDULE MESSAGE
	{ cat "$ini"; printf 'schedule = %s\n%s = %s\n' "$3" "$1" "$2"; } >"$tmp/bad.ini"
	_line=$(grep -n "^$1 = " "$tmp/bad.ini" | cut -d: -f1)
	kiln 2 train "$tmp/bad.ini" data.path="$data" run.out_dir=
	grep -qF "$tmp/bad.ini:$_line:" "$err" || fail "$1 = $2: the error names no $tmp/bad.ini:$_line: $(cat "$err")"
	stderr_has "$4"
}
bad start_factor 0 linear "[train] start_factor = 0 with schedule = linear: the first rate is lr x start_factor, which must be above 0 and at most 1"
bad start_factor 1.5 linear "'start_factor' = 1.5 is out of range"
bad end_factor -0.5 linear "'end_factor' = -0.5 is out of range"
bad total_iters 0 linear "'total_iters' = 0 is out of range"
bad total_iters 0 polynomial "'total_iters' = 0 is out of range"
bad power -1 polynomial "'power' = -1 is out of range"
bad gamma 1.5 exponential "'gamma' = 1.5 is out of range"
bad anneal_strategy cosine onecycle "'anneal_strategy' = 'cosine' is not one of cos|linear"
bad three_phase 2 onecycle "'three_phase' = '2' is not a boolean"
echo "ok: bad values refused at their line"
# the keys under a schedule that does not read them: warned, ignored
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.total_iters=3 \
	train.three_phase=1 train.power=2 train.start_factor=0.5 train.gamma=0.5
stderr_has "command line 'train.total_iters=3': [train] total_iters is read by schedule = linear or polynomial, not by schedule = constant: ignored"
stderr_has "command line 'train.three_phase=1': [train] three_phase is read by schedule = onecycle, not by schedule = constant: ignored"
stderr_has "command line 'train.power=2': [train] power is read by schedule = polynomial, not by schedule = constant: ignored"
stderr_has "command line 'train.start_factor=0.5': [train] start_factor is read by schedule = linear, not by schedule = constant: ignored"
stderr_has "command line 'train.gamma=0.5': [train] gamma is read by schedule = step, multistep or exponential, not by schedule = constant: ignored"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.schedule=polynomial \
	train.total_iters=3 train.power=2
! grep -q "is read by schedule" "$err" || fail "a warning for keys the run reads: $(cat "$err")"
# schedule = exponential with gamma unset: step's and multistep's default
# 0.1 (ExponentialLR has none), warned of; a gamma written, even 0.1, not
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.schedule=exponential
stderr_has "schedule = exponential with [train] gamma at its default 0.1: the rate x 0.1 every step (lr 1e-11 after 10 steps)"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.schedule=exponential \
	train.gamma=0.1
! grep -q "gamma at its default" "$err" || fail "gamma = 0.1 written, still warned: $(cat "$err")"
echo "ok: schedule = exponential warns of gamma left at its default"
echo "$checks checks passed"
