/* plugins/cpu/teamstart.c - a thread's OpenMP team started only after its
 * threads were shown to fit under the process's thread limits, so that
 * libgomp never meets a failed pthread_create (it exits the process).
 * See teamstart.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_getname_np */
#endif
#include "teamstart.h"

#include <errno.h>
#include <omp.h>         /* omp_in_parallel; the region below */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h> /* getrlimit(RLIMIT_NPROC) */
#include <sys/syscall.h>  /* SYS_gettid */
#include <time.h>
#include <unistd.h>

#include "threads.h" /* cpu_cgroup_path */

/* ---- the limits, for the message ----------------------------------------- */

/* The first line of file path into buf (n bytes, newline dropped); -1
 * when it cannot be read. */
static int read_line(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	const int ok = fgets(buf, (int)n, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* The pids limit with the least room on the cgroup path under root
 * (cgroup v1's pids controller, or v2), walking up to root: its text
 * "pids.max M (C in use) of DIR" appended to buf; nothing when none
 * limits the process. */
static void pids_limit(const char *proc_cgroup, const char *root, int v2, char *buf, size_t n)
{
	/* (cgroup paths are short; a longer one is left out of the message) */
	char path[512], dir[1024], f[1100], max[64], cur[64];
	if (cpu_cgroup_path(proc_cgroup, v2 ? NULL : "pids", path, sizeof path))
		return;
	int len = snprintf(dir, sizeof dir, "%s%s", root, strcmp(path, "/") ? path : "");
	if (len <= 0 || (size_t)len >= sizeof dir)
		return;
	long best_room = -1, best_max = 0, best_cur = 0;
	char best_dir[1024] = "";
	for (;;) {
		snprintf(f, sizeof f, "%s/pids.max", dir);
		if (!read_line(f, max, sizeof max) && strcmp(max, "max")) {
			snprintf(f, sizeof f, "%s/pids.current", dir);
			const long m = atol(max), c = read_line(f, cur, sizeof cur) ? 0 : atol(cur);
			if (best_room < 0 || m - c < best_room) {
				best_room = m - c;
				best_max = m;
				best_cur = c;
				memcpy(best_dir, dir, strlen(dir) + 1);
			}
		}
		char *slash = strrchr(dir, '/');
		if (!slash || (size_t)(slash - dir) < strlen(root))
			break;
		*slash = 0;
	}
	if (best_room >= 0) {
		const size_t at = strlen(buf);
		snprintf(buf + at, n - at, ", cgroup pids.max %ld (%ld in use) of %s", best_max, best_cur,
			 best_dir);
	}
}

void cpu_thread_limits(char *buf, size_t n)
{
	struct rlimit r;
	char tmax[64];
	if (getrlimit(RLIMIT_NPROC, &r) || r.rlim_cur == RLIM_INFINITY)
		snprintf(buf, n, "ulimit -u unlimited");
	else
		snprintf(buf, n, "ulimit -u %llu", (unsigned long long)r.rlim_cur);
	char text[2048];
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (f) {
		const size_t got = fread(text, 1, sizeof text - 1, f);
		fclose(f);
		text[got] = 0;
		/* v1's pids controller, else v2 (at /sys/fs/cgroup, or
		 * /sys/fs/cgroup/unified on hybrid systems) */
		const size_t before = strlen(buf);
		pids_limit(text, "/sys/fs/cgroup/pids", 0, buf, n);
		if (strlen(buf) == before)
			pids_limit(text, "/sys/fs/cgroup", 1, buf, n);
		if (strlen(buf) == before)
			pids_limit(text, "/sys/fs/cgroup/unified", 1, buf, n);
	}
	if (!read_line("/proc/sys/kernel/threads-max", tmax, sizeof tmax)) {
		const size_t at = strlen(buf);
		snprintf(buf + at, n - at, ", kernel.threads-max %s", tmax);
	}
}

/* ---- the trial team ------------------------------------------------------- */

struct trial {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int go;
	long tid[]; /* each trial thread's kernel id */
};

struct trial_arg {
	struct trial *t;
	int i;
};

/* A trial thread: says who it is, then waits until all are made. */
static void *trial_main(void *arg)
{
	const struct trial_arg *a = arg;
	a->t->tid[a->i] = (long)syscall(SYS_gettid);
	pthread_mutex_lock(&a->t->mu);
	while (!a->t->go)
		pthread_cond_wait(&a->t->cv, &a->t->mu);
	pthread_mutex_unlock(&a->t->mu);
	return NULL;
}

/* Until the kernel has let go of the joined threads' slots (at most 2 s).
 * pthread_join returns when a thread clears its id, before the kernel
 * releases it and uncharges ulimit -u and pids.max: libgomp's
 * pthread_create right after could meet the slots still taken.  The
 * release removes /proc/self/task/TID after uncharging. */
static void trial_wait_released(const long *tid, int n)
{
	char p[64];
	const struct timespec nap = { 0, 100000 };
	for (int i = 0, tries = 0; i < n; i++)
		for (;;) {
			snprintf(p, sizeof p, "/proc/self/task/%ld", tid[i]);
			if (access(p, F_OK) || ++tries > 20000)
				break;
			nanosleep(&nap, NULL);
		}
}

/* Makes `more` threads that all exist at once, then lets them end.  The
 * count made (`more` on success) and pthread_create's error in *err. */
static int trial_team(int more, int *err)
{
	struct trial *t = calloc(1, sizeof *t + (size_t)more * sizeof *t->tid);
	pthread_t *th = calloc((size_t)more, sizeof *th);
	struct trial_arg *a = calloc((size_t)more, sizeof *a);
	*err = 0;
	if (!t || !th || !a) {
		free(t), free(th), free(a);
		*err = ENOMEM;
		return 0;
	}
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	int made = 0;
	for (; made < more; made++) {
		a[made] = (struct trial_arg){ t, made };
		if ((*err = pthread_create(&th[made], NULL, trial_main, &a[made])))
			break;
	}
	pthread_mutex_lock(&t->mu);
	t->go = 1;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	for (int i = 0; i < made; i++)
		pthread_join(th[i], NULL);
	trial_wait_released(t->tid, made);
	pthread_cond_destroy(&t->cv);
	pthread_mutex_destroy(&t->mu);
	free(t), free(th), free(a);
	return made;
}

/* ---- the team --------------------------------------------------------------- */

static __thread int started_team; /* the largest team started on this thread */

/* The trial of team - 1 more threads; 0, or -1 with the message. */
static int team_trial(int team, const char *who, char *msg, size_t n)
{
	int err;
	const int made = trial_team(team - 1, &err);
	if (made == team - 1)
		return 0;
	char lim[1024], name[40];
	if (!who) { /* the thread's name: kiln-stream-N for a stream worker */
		char t[16] = "";
		pthread_getname_np(pthread_self(), t, sizeof t);
		snprintf(name, sizeof name, "thread '%s'", t);
		who = name;
	}
	cpu_thread_limits(lim, sizeof lim);
	snprintf(msg, n,
		 "cpu: cannot start the OpenMP team of %d threads on %s: %d of the %d more threads "
		 "could be created (%s); the limits on processes and threads: %s; lower [run] threads "
		 "or raise the limit",
		 team, who, made, team - 1, strerror(err), lim);
	return -1;
}

int cpu_team_check(int team, const char *who, char *msg, size_t n)
{
	if (team <= started_team || team <= 1)
		return 0;
	return team_trial(team, who, msg, n);
}

int cpu_team_start(int team, const char *who, char *msg, size_t n)
{
	if (team <= started_team || team <= 1 || omp_in_parallel())
		return 0;
	if (team_trial(team, who, msg, n))
		return -1;
	/* libgomp's pool for this thread, from the slots just freed: a later
	 * region reuses it (a region of fewer threads, two or more, lets the
	 * rest end, and a larger one after it makes them again; kiln's own
	 * open the whole team: cpu.h cpu_team_whole, docs/training.md) */
#pragma omp parallel num_threads(team)
	{
		__asm__ __volatile__("" ::: "memory");
	}
	started_team = team;
	return 0;
}
