#!/bin/sh
# tests/netns_rsh.sh - mpirun's rsh agent (--mca plm_rsh_agent) for the
# network-namespace hosts of tests/netns_lib.sh: `netns_rsh.sh kiln-hH
# COMMAND...` runs COMMAND (a shell line: Open MPI's orted) in the
# namespace $KILN_NS-hH under the host name kiln-hH, as ssh would on host H.
h=$1
shift
exec ip netns exec "$KILN_NS-${h#kiln-}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$h" "$*"
