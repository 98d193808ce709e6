/* plugins/cpu/teamstart.h - a thread's OpenMP team started where a
 * failure can still be reported.
 *
 * libgomp creates a host thread's team at its first parallel region, and
 * when pthread_create fails there (the limit on processes and threads:
 * ulimit -u, a cgroup's pids.max, kernel.threads-max) it prints
 * "libgomp: Thread creation failed" and calls exit(1) inside the plugin:
 * no kiln error, no checkpoint.  The CPU device starts each thread's
 * team itself at the thread's first op (cpu_exec, cpu_prepare; the
 * opening thread's, a stream worker's, the loader's): it creates the
 * team's threads once, and only when they all exist does it open the
 * first region, so that libgomp's pool is made from slots just proven
 * free.  A failure is an error naming the limits (docs/training.md,
 * "Process limits").  cpu_open only checks (no pool yet: libgomp's pool
 * does not survive fork(), and a process may fork after opening a
 * device, as Check's tests do, and use OpenMP in the child).
 */
#ifndef KILN_PLUGINS_CPU_TEAMSTART_H
#define KILN_PLUGINS_CPU_TEAMSTART_H

#include <stddef.h>

/* Starts the calling thread's OpenMP team of `team` threads (the caller
 * and team - 1 more), once a thread: a later call with a team no larger
 * returns at once.  0, or -1 with a message naming `who` ("the device's
 * opening thread"; NULL: the thread's name, kiln-stream-N for a stream
 * worker) in msg (n bytes): how many of the threads could be created,
 * the error, and the limits that apply. */
int cpu_team_start(int team, const char *who, char *msg, size_t n);
/* The same trial without making the team (cpu_open's early check): the
 * team - 1 threads created, all alive at once, and let end.  0 or -1 with
 * the message, as cpu_team_start. */
int cpu_team_check(int team, const char *who, char *msg, size_t n);

/* The limits on this process's threads as text for a message, into buf
 * (n bytes): "ulimit -u N", the cgroup's "pids.max M (C in use)" where
 * one limits it, "kernel.threads-max T". */
void cpu_thread_limits(char *buf, size_t n);

#endif
