#!/bin/sh
# tests/omp_pool_whole.sh - the CPU device keeps each thread's OpenMP pool
# whole (plugins/cpu/cpu.h cpu_team_whole): a region of fewer workers
# than the team (attention over fewer (batch, head) pairs than threads,
# pooling and split convolutions over fewer workspace slots) runs on the
# whole team with the extra members idle.  libgomp ends the pool threads
# a smaller team leaves out and creates them again at the next larger
# region, where a failed pthread_create (a pids limit another process
# filled mid-run) exits the process (plugins/cpu/teamstart.h).
#
# A GPT with 2 (batch, head) pairs trains on a team of 4 with
# pthread_create counted (an LD_PRELOAD shim built here): 3 steps and 30
# steps create as many threads (before session 36: 16 and 70, two
# creations a step, the attention's team of 2 ending 2 of the pool's).
name=omp_pool_whole
. "$(dirname "$0")/lib.sh"
CC=${CC:-cc}
need_source tokens

cat >"$tmp/count.c" <<'CEOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int made;
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg)
{
	int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) =
		(int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(
			RTLD_NEXT, "pthread_create");
	__atomic_add_fetch(&made, 1, __ATOMIC_RELAXED);
	return real(t, a, f, arg);
}
/* (every process prints; kiln train's own line is the one with its pid) */
__attribute__((destructor)) static void report(void)
{
	char path[4096];
	snprintf(path, sizeof path, "%s.%d", getenv("COUNT_TO"), (int)getpid());
	FILE *f = fopen(path, "w");
	if (f)
		fprintf(f, "%d\n", made), fclose(f);
}
CEOF
$CC -shared -fPIC -o "$tmp/count.so" "$tmp/count.c" -ldl || fail "cannot build the pthread_create counter"

i=0
while [ $i -lt 200 ]; do
	echo "the quick brown fox jumps over the lazy dog $i times; a stitch in time saves nine."
	i=$((i + 1))
done >"$tmp/corpus.txt"
kiln 0 pack --format tokens "$tmp/corpus.txt" --out "$tmp/data" --val-fraction 0.1
{
	printf '[run]\nseed = 1\nout_dir =\nthreads = 4\n'
	printf '[data]\nsource = tokens\npath = %s/data\ncontext = 256\nvocab = 256\nworkers = 0\n' "$tmp"
	printf '[train]\noptimizer = adamw\nlr = 3e-3\nbatch = 1\nepochs = 1\nlog_every = 5\neval = 0\n'
	printf '[layer.wte]\ntype = embedding\nvocab = 256\ndim = 16\n'
	printf '[layer.wpe]\ntype = pos_embedding\nmax_len = 256\n'
	printf '[layer.ln]\ntype = layernorm\n[layer.c_attn]\ntype = linear\nout = 48\n'
	printf '[layer.sdpa]\ntype = attention\nheads = 2\n'
	printf '[layer.c_proj]\ntype = linear\nout = 16\n'
	printf '[layer.lm_head]\ntype = linear\nout = 256\n[layer.loss]\ntype = softmax_xent\n'
} >"$tmp/gpt.ini"

# made STEPS: the threads kiln train created in a run of STEPS steps
made() {
	rm -rf "$tmp/count" && mkdir "$tmp/count"
	COUNT_TO="$tmp/count/n" LD_PRELOAD="$tmp/count.so" "$kiln" train "$tmp/gpt.ini" \
		train.max_steps="$1" >"$out" 2>"$err" &
	pid=$!
	wait $pid || fail "kiln train ($1 steps) exit code $?: $(tail -3 "$err")"
	[ -s "$tmp/count/n.$pid" ] || fail "no count from kiln train (pid $pid)"
	cat "$tmp/count/n.$pid"
}
few=$(made 3)
many=$(made 30)
echo "threads created: $few in 3 steps, $many in 30"
[ "$few" -eq "$many" ] || fail "the OpenMP pool was remade mid-run: $few threads created in 3 steps, $many in 30"
checks=$((checks + 2))
echo "omp_pool_whole: $checks checks passed"
