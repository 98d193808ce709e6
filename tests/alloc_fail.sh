#!/bin/sh
# tests/alloc_fail.sh - a failed allocation is "out of memory", exit 1,
# never a crash (the kiln promise: a clear error, non-zero exit).  Before
# session 37 two strdup results were stored unchecked and dereferenced:
#  - a config entry's `where` (core/config.c set_entry): a command-line
#    `run.out_dir=` whose where was NULL crashed kiln_config_validate
#    (strncmp in unset_override, exit 139);
#  - a layer's section and name (core/graph.c read_layers): NULL reached
#    strcmp in kiln_model_find_layer (exit 139).
#
# And a plugin file whose dlopen ran out of memory was "no source plugin
# named 'idx'", a config error (exit 2): now KILN_ENOMEM, exit 1.
#
# The LD_PRELOAD shim (tests/shim_fault.c) fails the Nth allocation of SIZE
# bytes of the kiln process (not of the libtool wrapper's shell), or
# (SHIM_ALLOC_DLOPEN) the Nth made inside a dlopen of a path holding that
# text, and leaves a file saying it did.  The strings have lengths of their
# own (the override's where, a layer named at length), so each sweep over N
# is a few runs and holds whatever else the build allocates.  A sweep ends at the first N no
# allocation reached.  (oneDNN's engine and gloo's static initialisers do
# not survive a failed allocation: their sizes are not the ones swept.)
name=alloc_fail
. "$(dirname "$0")/lib.sh"
need_source synthetic
need_source idx

shim_build || { cat "$tmp/shim.err"; fail "cannot build the allocation shim"; }

# a probe cache of the test's own, filled before the sweeps: every run
# finds the plugins the same way, without probe children (KILN_PROBE_CACHE
# none would be the same too, at 0.3 s more a run)
KILN_PROBE_CACHE=$tmp/probe_cache
export KILN_PROBE_CACHE
"$kiln" plugins >/dev/null 2>&1 || fail "kiln plugins"

# sweep SIZE ARGS...: kiln ARGS with its 1st, 2nd, ... allocation of SIZE
# bytes (-1: any size) failing, until one is not reached: each run exits 0,
# or 1 saying "out of memory"; at least one runs out
sweep() {
	_size=$1
	shift
	_what="$_size bytes"
	[ "$_size" -ge 0 ] || _what="any size${SHIM_ALLOC_DLOPEN:+ in dlopen($SHIM_ALLOC_DLOPEN)}"
	_n=1
	_oom=0
	while [ $_n -le 300 ]; do
		rm -f "$tmp/hit"
		last="$* (allocation $_n of $_what failing)"
		SHIM_ALLOC_NTH=$_n SHIM_ALLOC_BYTES=$_size SHIM_ALLOC_HIT="$tmp/hit" LD_PRELOAD="$shim" \
			timeout -k 5 60 "$kiln" "$@" >"$out" 2>"$err"
		_rc=$?
		[ -e "$tmp/hit" ] || break
		case $_rc in
		0) ;;
		1) grep -q "out of memory" "$err" || fail "exit 1 without 'out of memory'"
		   _oom=$((_oom + 1)) ;;
		*) fail "exit $_rc (a failed allocation must be exit 1, 'out of memory')" ;;
		esac
		_n=$((_n + 1))
	done
	[ $_n -gt 1 ] || fail "no allocation of $_what: the sweep tested nothing"
	[ $_oom -gt 0 ] || fail "no run ran out of memory: the sweep tested nothing"
	echo "ok: kiln $1 with each of $((_n - 1)) allocations of $_what failing: $_oom out of memory, none crashed"
}

# 1. the where of a command-line override that unsets a key: "command
# line 'run.out_dir='" and its NUL
where="command line 'run.out_dir='"
sweep $((${#where} + 1)) config "$srcdir/tests/data/tr_cnn.ini" "data.path=$srcdir/tests/data" run.out_dir=

# 2. a layer's section and name strings, built by `kiln summary`
layer=fc_named_for_the_allocation_failure_test_xyz
cat >"$tmp/g.ini" <<INI
[run]
device = cpu
[data]
source = synthetic
samples = 64
image_size = 8
image_channels = 1
classes = 10
[layer.flat]
type = flatten
[layer.$layer]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
batch = 8
INI
sweep $((${#layer} + 1)) summary "$tmp/g.ini"
sweep $((${#layer} + 7)) summary "$tmp/g.ini"
# and by `kiln predict`, which builds the model twice (trained, folded;
# "(null)" was the folded config's layer name before session 37)
kiln 0 train "$tmp/g.ini" "run.out_dir=$tmp/run" train.max_steps=1 train.epochs=1
ck=$tmp/run/checkpoints/ckpt-1.kiln
sweep $((${#layer} + 1)) predict "$tmp/g.ini" --checkpoint "$ck" --eval-set
sweep $((${#layer} + 7)) predict "$tmp/g.ini" --checkpoint "$ck" --eval-set

# 3. the allocations of kiln-loaders.so's dlopen (its libraries' too), in
# the probe child and in kiln: the source is out of memory, not missing
SHIM_ALLOC_DLOPEN=kiln-loaders.so
export SHIM_ALLOC_DLOPEN
sweep -1 config "$srcdir/tests/data/tr_cnn.ini" "data.path=$srcdir/tests/data"
