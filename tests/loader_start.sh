#!/bin/sh
# tests/loader_start.sh - a loader worker that cannot start says why
# (session 30: "cannot start loader worker 0", no cause; under ulimit -u
# pthread_create fails with EAGAIN).  A thread's stack is ulimit -s by
# default: at 1 TB the heuristic overcommit refuses it, pthread_create
# returns EAGAIN even for root (whom ulimit -u does not bind), and the
# error names the cause and the limits to look at.
name=loaderstart
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
	{ echo "SKIP: Fashion-MNIST missing (scripts/install-deps)"; exit 77; }
[ "$(cat /proc/sys/vm/overcommit_memory 2>/dev/null)" = 0 ] ||
	{ echo "SKIP: vm.overcommit_memory is not 0 (a 1 TB stack may be granted)"; exit 77; }
(ulimit -S -s 1000000000) 2>/dev/null ||
	{ echo "SKIP: the stack limit cannot be raised to 1 TB here (its hard limit)"; exit 77; }
{
	ini run seed=1 threads=1
	ini_fmnist path=/usr/share/datasets/fashion-mnist limit=64 workers=1
	ini_layers f:flatten fc:linear:out=10 loss:softmax_xent
	ini train epochs=1 batch=32 max_steps=2
} > "$tmp/run.ini"
(ulimit -S -s 1000000000 && exec timeout 60 "$kiln" train "$tmp/run.ini" run.out_dir="$tmp/o") \
	> "$tmp/log" 2>&1
rc=$?
[ "$rc" = 1 ] || { tail -3 "$tmp/log"; fail "exit $rc, expected 1"; }
grep -q "kiln: error: cannot start loader worker 0 of 1: Resource temporarily unavailable (the limit on processes and threads, ulimit -u, or on memory)" "$tmp/log" ||
	{ tail -3 "$tmp/log"; fail "the error does not say why"; }
echo "loader worker 0 not started: EAGAIN said"
echo PASS
