# tests/dist_common.sh - what the tests/dist*.sh scripts share; sourced
# (not run) after setting
#   name   the temporary directory's prefix (kiln-NAME.XXXXXX, tests/lib.sh)
#   needs  the comm plugin the script needs (gloo, mpi)
#   fmnist 0 when the script trains no Fashion-MNIST model (optional)
# It skips (exit 77) without Fashion-MNIST (unless fmnist = 0) or that
# plugin (or, for mpi, without mpirun), and gives:
#   $kiln, $tool (tests/ckpt_tool), $tmp (removed on exit unless KEEP is set)
#   fail, bad MESSAGE          record a failure (the script ends with exit $fail)
#   free_port K                a TCP port free a moment ago
#   mlp_ini FILE SEED TIMEOUT [COMM]
#                              the MLP every dist test trains (50896 floats)
#   run NAME NPROC BATCH [overrides...]
#                              train $ini: with `kiln launch -n NPROC`, or one
#                              plain process for NPROC 0; output in
#                              $tmp/NAME.log, out_dir $tmp/NAME
#   ck NAME STEP               the path of NAME's checkpoint at STEP (tests/lib.sh)
#   states_close A B WHAT SECTIONS...
#                              checkpoints A and B's SECTIONS equal to 1e-5
#                              (relative, ckpt_tool close), else bad naming WHAT
#   rank1_oom N BYTES FROM INI [overrides...]
#                              INI trained on 2 ranks, rank 1's Nth
#                              allocation of BYTES from FROM on its main
#                              thread failing (tests/shim_fault.c, after
#                              shim_build): output in $tmp/l.log, out_dir
#                              $tmp/r.RANK, $tmp/hit made when it was
#                              reached; the launch's status
#   rates NAME D               NAME's training samples/s: each rank's final
#                              metrics have samples_per_s = D (the
#                              data-parallel ranks) x train_samples_per_s,
#                              and the ranks' last epoch lines show those
#                              samples_per_s (a run of at most 2 epochs)
#   ckpt_fail_run NAME FROM WHO0 WHO1 CMD...
#                              rank 0's write of ckpt-4.kiln failing (ENOSPC)
#                              in a copy of FROM resumed by CMD: timed, its
#                              errors and files checked
#   ckpt_fault_run NAME FROM WHO0 WHO1 LINK WHY CMD...
#                              the same with the temporary file a link to
#                              LINK ("-": none) and the cause WHY (a fault of
#                              KILN_TEST_CKPT_FAIL in the environment)
#   stamped NAME PATTERN CMD...
#                              CMD's output to $tmp/NAME.log, the times of
#                              its lines matching PATTERN and of its exit
#                              to $tmp/NAME.stamps; CMD's status
#   stamp_ms NAME PATTERN      milliseconds from the first stamped line
#                              matching PATTERN to CMD's exit (-1: missing)
#   ended_soon NAME RC PATTERN WHEN WHAT
#                              NAME's exit RC non-zero, within 30 s of its
#                              first stamped line matching PATTERN
#   agreed_run NAME INI FAULT@R WHEN WHAT WHY OVERRIDES...
#                              INI on 2 ranks failing at KILN_TEST_CKPT_FAIL's
#                              FAULT@R: every rank ended soon after the line
#                              WHEN, agreed (below)
#   paired NAME "STAGE PAIRED SENT"...
#                              in $tmp/NAME.log, STAGE's rank logged PAIRED
#                              of its SENT crossing tensors sent paired with
#                              a recv ([pipeline] sendrecv), once
#   hand_ranks NAME N TIMEOUT INI OVERRIDES...
#                              N ranks of INI started by hand (no launcher)
#                              on $port, in the background, each under
#                              `timeout TIMEOUT`: rank R's out_dir $tmp/NAMER,
#                              output $tmp/NAMER.log, pid $pidR
#   await_line FILE PATTERN TENTHS
#                              until FILE has a line matching PATTERN (grep),
#                              at most TENTHS tenths of a second; never fails
#                              (what the caller checks next does)
#   rank_kill PID              SIGKILL to the processes below PID, then PID
#                              (a hand rank's `timeout` and its trainer)
#   below PID                  every process below PID, one a line
#   await_train NAME PID       until NAME's metrics.jsonl has a train event,
#                              at most 60 s; past that, PID and every
#                              process below it are killed and bad says
#                              training did not start (status 1)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
kiln="$abs_top_builddir/kiln"
tool="$abs_top_builddir/tests/ckpt_tool"
[ "${fmnist:-1}" = 0 ] || [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
	{ echo "SKIP: no Fashion-MNIST"; exit 77; }
[ -f "$abs_top_builddir/plugins/.libs/kiln-$needs.so" ] || { echo "SKIP: the $needs plugin is not built"; exit 77; }
[ "$needs" != mpi ] || command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
fail=0
bad() { echo "FAIL: $*"; fail=1; }

free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		echo $(( 20000 + ($$ + $1) % 20000 ))
}

mlp_ini() {
	{
		ini run seed="$2" threads=1 ${4:+comm="$4"}
		ini_fmnist limit=2048
		ini data.eval limit=2048
		ini_layers flat:flatten fc1:linear:out=64 r1:relu fc2:linear:out=10 loss:softmax_xent
		ini train epochs=2 batch=64 lr=0.05 momentum=0.9 log_every=16 eval=0 checkpoint_every=1000
		ini plugin.cpu async=1
		ini dist bucket_mb=0.05 timeout="$3"
	} > "$1"
}

run() {
	_name=$1 _n=$2 _b=$3
	shift 3
	if [ "$_n" = 0 ]; then
		# one process opens no communicator; the free port keeps it
		# off 29500 all the same, which a concurrent test may hold
		KILN_MASTER_PORT=$(free_port 7) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/$_name" \
			train.batch="$_b" "$@" > "$tmp/$_name.log" 2>&1
	else
		timeout 120 "$kiln" launch -n "$_n" -- "$kiln" train "$ini" \
			run.out_dir="$tmp/$_name" train.batch="$_b" "$@" > "$tmp/$_name.log" 2>&1
	fi
	_rc=$?
	[ $_rc = 0 ] || { bad "$_name exited $_rc"; tail -20 "$tmp/$_name.log"; }
}

states_close() {
	_ca=$1 _cb=$2 _cw=$3
	shift 3
	"$tool" close "$_ca" "$_cb" 1e-5 "$@" || bad "$_cw: $* differ"
}

rank1_oom() {
	_on=$1 _ob=$2 _of=$3 _oi=$4
	shift 4
	rm -rf "$tmp/hit" "$tmp/r.0" "$tmp/r.1"
	KILN_MASTER_PORT=$(free_port "$_on") timeout 120 "$kiln" launch -n 2 -- sh -c \
		"if [ \"\$KILN_RANK\" = 1 ]; then export LD_PRELOAD=\"$shim\" SHIM_ALLOC_NTH=$_on SHIM_ALLOC_BYTES=$_ob SHIM_ALLOC_FROM=$_of SHIM_ALLOC_MAIN=1 SHIM_ALLOC_HIT=\"$tmp/hit\"; fi; exec \"$kiln\" train \"$_oi\" run.out_dir=\"$tmp/r.\$KILN_RANK\" $*" \
		>"$tmp/l.log" 2>&1
}

paired() {
	_l=$1
	shift
	for _r in "$@"; do
		set -- $_r
		[ "$(grep -c "stage $1 (this rank): $2 of $3 crossing tensors sent paired with the recv from the same stage after them, in one sendrecv" "$tmp/$_l.log")" = 1 ] ||
			{ bad "$_l: stage $1's rank did not pair $2 of its $3 sends with a recv"; grep "sent paired" "$tmp/$_l.log"; }
	done
}

# rates NAME D: in $tmp/NAME.log, every rank's final metrics line (rank
# 0's on stdout, the others' after "kiln: rank N's final metrics: ") has
# samples_per_s = D x train_samples_per_s, both as printed (to 0.1); and
# the last epoch's lines, one a rank, show those samples_per_s ("%.0f
# samples/s" of the same number: the final rate is timed over the last
# epoch of a run of 1 or 2, the epoch line over that epoch), matched in
# order as the lines say no rank.  Before session 39 no samples_per_s,
# and the epoch line showed a rank's rate, 1/D of the train lines'.
rates() {
	sed -n 's/.*"train_samples_per_s": \([0-9.]*\), "samples_per_s": \([0-9.]*\),.*/\1 \2/p' \
		"$tmp/$1.log" > "$tmp/$1.rates"
	_re='^epoch \([0-9]*\)/[0-9]*: train loss .*, \([0-9]*\) samples/s).*'
	_e=$(sed -n "s|$_re|\1|p" "$tmp/$1.log" | sort -n | tail -1)
	sed -n "s|$_re|\1 \2|p" "$tmp/$1.log" | awk -v e="$_e" '$1 == e { print $2 }' | sort -n > "$tmp/$1.lines"
	cut -d' ' -f2 "$tmp/$1.rates" | sort -n | paste -d' ' - "$tmp/$1.lines" > "$tmp/$1.pairs"
	awk -v d="$2" '{ r = $2 - d * $1; if (r < 0) r = -r; if (NF != 2 || $1 <= 0 || r > 0.05 + d * 0.05 + 1e-9) exit 1; n++ }
		END { exit n < 2 }' "$tmp/$1.rates" ||
		{ bad "$1: samples_per_s is not $2 x train_samples_per_s:"; cat "$tmp/$1.rates"; }
	awk '{ r = $1 - $2; if (r < 0) r = -r; if (NF != 2 || r > 0.55) exit 1; n++ } END { exit n < 2 }' "$tmp/$1.pairs" ||
		{ bad "$1: the epoch $_e lines' samples/s (right) are not the final samples_per_s (left):"; cat "$tmp/$1.pairs"; }
}

# stamped NAME PATTERN CMD...: run CMD, its output (stdout and stderr) to
# $tmp/NAME.log as it comes, and to $tmp/NAME.stamps the time of each line
# matching the case PATTERN ("SECONDS.NANOS LINE") and of CMD's exit
# ("SECONDS.NANOS exit RC"); only those lines pay a `date` (one per line
# lags behind a loaded machine), the rest pass through builtins; returns
# CMD's status.  A bound timed from such a line to the exit leaves out
# start-up and training, which a loaded machine stretches
stamped() {
	_sn=$1 _sp=$2
	shift 2
	{ "$@" 2>&1; echo "kiln-test-exit $?"; } | {
		while IFS= read -r _l; do
			case $_l in
			*"kiln-test-exit "*)
				[ -z "${_l%kiln-test-exit *}" ] || printf '%s\n' "${_l%kiln-test-exit *}"
				echo "$(date +%s.%N) exit ${_l##*kiln-test-exit }" >&3
				continue ;;
			$_sp) echo "$(date +%s.%N) $_l" >&3 ;;
			esac
			printf '%s\n' "$_l"
		done
	} > "$tmp/$_sn.log" 3> "$tmp/$_sn.stamps"
	return "$(sed -n 's/^[0-9.]* exit \([0-9]*\)$/\1/p' "$tmp/$_sn.stamps" | grep . || echo 255)"
}

# stamp_ms NAME PATTERN: milliseconds from the first line of
# $tmp/NAME.stamps matching the grep PATTERN to CMD's exit; -1 if either
# is missing
stamp_ms() {
	_a=$(grep -m1 -- "$2" "$tmp/$1.stamps" | cut -d' ' -f1)
	_b=$(grep " exit [0-9]*$" "$tmp/$1.stamps" | cut -d' ' -f1)
	awk -v a="$_a" -v b="$_b" 'BEGIN { if (a == "" || b == "") print -1; else printf "%d", (b - a) * 1000 }'
}

# ended_soon NAME RC PATTERN WHEN WHAT: the stamped run NAME (WHAT, for
# its line) exited RC, non-zero and not timeout's 124, within 30 s of its
# first stamped line matching the grep PATTERN (WHEN, in words): [dist]
# timeout and heartbeat 60 s, so ranks left waiting fail it
ended_soon() {
	_es=$(stamp_ms "$1" "$3")
	echo "$1: $5: exit $2, $_es ms after $4"
	[ "$2" != 0 ] && [ "$2" != 124 ] || bad "$1: exit $2"
	[ "$_es" -ge 0 ] && [ "$_es" -le 30000 ] ||
		bad "$1: the ranks ended $_es ms after $4 ([dist] timeout and heartbeat 60 s)"
}

# agreed_run NAME INI FAULT@R WHEN WHAT WHY OVERRIDES...: a run of INI on 2
# ranks (batch 32) in $tmp/NAME with KILN_TEST_CKPT_FAIL=FAULT@R, stamped
# from the first line containing WHEN: every rank exits non-zero within
# 30 s of it (ended_soon), rank R saying "rank R of 2: WHAT: WHY: failed
# (the tests' fault: ...)", the other "rank O of 2: WHAT: rank R failed
# (its message says why)" (kiln_dist_sum_agreed; tests/agreed_fault.sh,
# tests/eval_fault.sh)
agreed_run() {
	_n=$1 _i=$2 _f=$3 _w=$4 _what=$5 _why=$6
	shift 6
	_r=${_f#*@}
	_o=$((1 - _r))
	KILN_TEST_CKPT_FAIL=$_f stamped "$_n" "*$_w*" \
		timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$_i" \
		run.out_dir="$tmp/$_n" train.batch=32 "$@"
	ended_soon "$_n" $? "$_w" "'$_w'" "$_why failed on rank $_r"
	grep -qxF "kiln: error: rank $_r of 2: $_what: $_why: failed (the tests' fault: KILN_TEST_CKPT_FAIL=$_f)" "$tmp/$_n.log" ||
		{ bad "$_n: rank $_r does not name its cause"; grep -i "error" "$tmp/$_n.log"; }
	grep -qxF "kiln: error: rank $_o of 2: $_what: rank $_r failed (its message says why)" "$tmp/$_n.log" ||
		{ bad "$_n: rank $_o does not name rank $_r"; grep -i "error" "$tmp/$_n.log"; }
}

# ckpt_fault_run NAME FROM WHO0 WHO1 LINK WHY CMD...: copy FROM's out_dir
# (a checkpoint at step 2) to NAME's, make the temporary file of ckpt-4.kiln
# a link to LINK ("-": none) and run CMD (which resumes in $tmp/NAME and
# trains past step 4, its write of ckpt-4.kiln failing on rank 0: a link
# to /dev/full, a fault of KILN_TEST_CKPT_FAIL), timed: every rank must
# exit non-zero within 30 s of step 4's log point (the line just before
# the write, past step 4's collectives on every rank: start-up and the
# steps, which a loaded machine stretches, left out; the broken
# behaviour, the ranks left waiting in a collective or for a token (`kiln
# launch` ends the others once one exits), ends on [dist] timeout or
# heartbeat, 60 s after it: a wrapper keeping every rank 45 s past its
# failure measured 45061 ms, FAIL; as it should, 0.03-2.2 s (mpirun the
# slowest), idle or under taskset -c 0 beside 2 spin loops), rank 0
# (WHO0, its name in messages) naming the file and the cause WHY (a grep
# pattern), once ("rank 0 of 2: rank 0" was its name twice before
# session 14), rank 1 (WHO1) rank 0, the file
# and the cause; ckpt-2.kiln unchanged, neither ckpt-4.kiln nor its
# temporary left
ckpt_fault_run() {
	_n=$1 _from=$2 _w0=$3 _w1=$4 _link=$5 _why=$6
	shift 6
	rm -rf "$tmp/$_n"
	cp -r "$tmp/$_from" "$tmp/$_n"
	cp "$tmp/$_n/checkpoints/ckpt-2.kiln" "$tmp/$_n.copy"
	[ "$_link" = - ] || ln -s "$_link" "$tmp/$_n/checkpoints/ckpt-4.kiln.tmp"
	stamped "$_n" "*step 4/*" "$@"
	ended_soon "$_n" $? " step 4/" "step 4's log point" "rank 0's write failed"
	_f=$tmp/$_n/checkpoints/ckpt-4.kiln
	grep -q "^kiln: error: $_w0: checkpoint $_f: $_why" "$tmp/$_n.log" ||
		{ bad "$_n: rank 0 does not name the file and the cause (once)"; grep -i "error" "$tmp/$_n.log"; }
	grep -q "^kiln: error: $_w1: checkpoint $_f: rank 0 could not write it: $_why" "$tmp/$_n.log" ||
		{ bad "$_n: rank 1 does not name rank 0, the file and the cause (once)"; grep -i "error" "$tmp/$_n.log"; }
	cmp -s "$tmp/$_n.copy" "$tmp/$_n/checkpoints/ckpt-2.kiln" || bad "$_n: ckpt-2.kiln changed"
	[ ! -e "$_f" ] && [ ! -e "$_f.tmp" ] && [ ! -L "$_f.tmp" ] || bad "$_n: ckpt-4.kiln or its temporary left behind"
}

# ckpt_fail_run NAME FROM WHO0 WHO1 CMD...: ckpt_fault_run with rank 0's
# write failing mid-file (its temporary file a link to /dev/full: a full
# disk; tests run as root, so an unwritable directory would not do)
ckpt_fail_run() {
	_n=$1 _from=$2 _w0=$3 _w1=$4
	shift 4
	ckpt_fault_run "$_n" "$_from" "$_w0" "$_w1" /dev/full \
		"$tmp/$_n/checkpoints/ckpt-4.kiln.tmp: write failed: No space left on device" "$@"
}

hand_ranks() {
	_hn=$1 _hw=$2 _ht=$3 _hi=$4
	shift 4
	_hr=0
	while [ $_hr -lt "$_hw" ]; do
		KILN_RANK=$_hr KILN_WORLD_SIZE=$_hw KILN_MASTER_PORT=$port timeout "$_ht" "$kiln" train "$_hi" \
			run.out_dir="$tmp/$_hn$_hr" "$@" > "$tmp/$_hn$_hr.log" 2>&1 &
		eval "pid$_hr=\$!"
		_hr=$((_hr + 1))
	done
}

await_line() {
	_ai=0
	while [ $_ai -lt "$3" ] && ! grep -q -- "$2" "$1" 2>/dev/null; do sleep 0.1; _ai=$((_ai + 1)); done
}

rank_kill() {
	pkill -KILL -P "$1" 2>/dev/null
	kill -KILL "$1" 2>/dev/null
}

below() {
	for _c in $(cat "/proc/$1/task/$1/children" 2> /dev/null); do
		echo "$_c"
		below "$_c"
	done
}

await_train() {
	_ti=0
	until grep -q '"event":"train"' "$tmp/$1/metrics.jsonl" 2> /dev/null; do
		_ti=$((_ti + 1))
		[ $_ti -le 600 ] || {
			kill -KILL "$2" $(below "$2") 2> /dev/null
			bad "$1: training did not start"
			return 1
		}
		sleep 0.1
	done
}
