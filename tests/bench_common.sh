#!/bin/sh
# tests/bench_common.sh - bench/common.sh's plugin probe cache is one file
# a build (probe_cache): two builds alternating in an A/B bench each keep
# their answers (one shared file lost a build's lines whenever a build of
# another ABI rewrote it); libtool's wrapper and the binary it runs share
# the file; a KILN_PROBE_CACHE or XDG_CACHE_HOME of the caller's is kept.
# The placement probe (place_before / place_after): only numbers are
# classified (an empty probe is "no probe", not fast); a probe that hangs is
# stopped at C2C_TIMEOUT_S and is "no probe", said once on stderr.
name=bench_common
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

abs_kiln="$abs_top_builddir/kiln"
# sh -c '. bench/common.sh; ...' with HOME in $tmp and no XDG_CACHE_HOME:
# prints KILN_PROBE_CACHE after sourcing with KILN=$1, then after
# real_kiln, then after probe_cache $2
probe_files() {
	env -u XDG_CACHE_HOME HOME="$tmp/home" TMPDIR="$tmp" KILN="$1" OTHER="$2" \
		${3:+KILN_PROBE_CACHE="$3"} sh -c '. "$0"; echo "$KILN_PROBE_CACHE"; real_kiln;
		echo "$KILN_PROBE_CACHE"; probe_cache "$OTHER"; echo "$KILN_PROBE_CACHE"' \
		"$srcdir/bench/common.sh"
}
mkdir -p "$tmp/home" "$tmp/other/.libs"
probe_files "$abs_kiln" "$tmp/other/kiln" >"$tmp/files" || fail "sourcing bench/common.sh failed"
a=$(sed -n 1p "$tmp/files") a2=$(sed -n 2p "$tmp/files") b=$(sed -n 3p "$tmp/files")
case $a in "$tmp/home/.cache/kiln/plugin_probe."[0-9]*) ;; *) fail "KILN's probe cache is '$a'" ;; esac
[ "$a" = "$a2" ] || fail "the wrapper's probe cache '$a', its binary's (real_kiln) '$a2'"
case $b in "$tmp/home/.cache/kiln/plugin_probe."[0-9]*) ;; *) fail "the other build's probe cache is '$b'" ;; esac
[ "$a" != "$b" ] || fail "two builds share the probe cache '$a'"
echo "ok: a probe cache a build ($(basename "$a"), $(basename "$b")); wrapper and binary share theirs"

# the other build (another ABI: a line this kiln drops) keeps its answer
# while this one runs and writes its own
printf 'kiln-probe 0.0/0 1 2 3 4 %s\t5:other\n' "$tmp/other/kiln-x.so" >"$b"
env KILN_PROBE_CACHE="$a" "$kiln" train "$srcdir/examples/fashion_mnist_mlp.ini" \
	data.limit=256 train.batch=64 train.max_steps=1 train.eval=0 "run.out_dir=$tmp/run" \
	>"$tmp/run.out" 2>&1 || { cat "$tmp/run.out"; fail "kiln train with the keyed probe cache"; }
[ -s "$a" ] || fail "the run wrote no probe cache at $a"
grep -q '5:other$' "$b" || fail "the other build's probe cache lost its line"
echo "ok: a run writes its build's probe cache and leaves the other build's"

# the caller's choices stand
c=$(probe_files "$abs_kiln" "$tmp/other/kiln" "$tmp/mine" | sort -u)
[ "$c" = "$tmp/mine" ] || fail "KILN_PROBE_CACHE=$tmp/mine became '$c'"
c=$(env XDG_CACHE_HOME="$tmp/xdg" HOME="$tmp/home" TMPDIR="$tmp" KILN="$abs_kiln" sh -c \
	'. "$0"; real_kiln; echo "${KILN_PROBE_CACHE-unset}"' "$srcdir/bench/common.sh")
[ "$c" = unset ] || fail "with XDG_CACHE_HOME set, KILN_PROBE_CACHE became '$c'"
echo "ok: the caller's KILN_PROBE_CACHE and XDG_CACHE_HOME stand"

# place C2C_BEFORE STUB_BODY: PLACE after place_after with the stub as $C2C
# (C2C_TIMEOUT_S = 1), then its stderr
place() {
	printf '#!/bin/sh\n%s\n' "$2" >"$tmp/c2c" && chmod +x "$tmp/c2c"
	C2C="$tmp/c2c" C2C_TIMEOUT_S=1 B="$1" sh -c '. "$0"; C2C_BEFORE=$B; place_after; echo "$PLACE"' \
		"$srcdir/bench/common.sh" 2>&1
}
fast='echo "{\"round_trip_ns_median\": 50.0}"'
[ "$(place 60.5 "$fast")" = fast ] || fail "probes 60.5 and 50.0: $(place 60.5 "$fast")"
[ "$(place '' "$fast")" = "no probe" ] || fail "an empty probe and 50.0: $(place '' "$fast")"
[ "$(place null "$fast")" = "no probe" ] || fail "a null probe and 50.0: $(place null "$fast")"
if command -v timeout >/dev/null; then
	t0=$(date +%s)
	r=$(place 60.5 'sleep 30; echo "{\"round_trip_ns_median\": 50.0}"')
	[ $(($(date +%s) - t0)) -lt 10 ] || fail "a hung probe was not stopped at C2C_TIMEOUT_S = 1"
	case $r in *"no placement probe ($tmp/c2c: timed out after 1 s)"*"no probe") ;;
	*) fail "a hung probe: $r" ;; esac
	echo "ok: place_after: an empty probe is 'no probe'; a hung one stopped, 'timed out', 'no probe'"
else
	echo "ok: place_after: an empty probe is 'no probe' (no timeout(1) here: the hung probe not tried)"
fi
