/* core/registry_probe.c - which plugin file provides what, told by child
 * processes that dlopen and initialise the files (core/registry.c loads in
 * this process only the file providing a name asked for).  A file whose
 * loading crashes or exits its child is reported and never loaded here;
 * what a file provides is kept in the probe cache (core/probe_cache.c). */
#include "registry_impl.h"
#include "probe_cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The exit status of a probe child whose report could not be written (the
 * pipe failed): nothing is known of the file it was loading. */
#define PROBE_EXIT_PIPE 125

/* Write one line of the probe's report to fd, all of it: a write cut
 * short by a signal of the application's goes on. */
static void probe_say(int fd, const char *fmt, ...) KILN_PRINTF(2, 3);
static void probe_say(int fd, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof buf)
		n = snprintf(buf, sizeof buf, "%s", "-1 overlong\n");
	for (int done = 0; done < n;) {
		ssize_t w = write(fd, buf + done, (size_t)(n - done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			_exit(PROBE_EXIT_PIPE);
		done += (int)w;
	}
}

/* The probe child: dlopen and initialise files[from..) in turn, writing
 * "<index> start\n" before each and "<index> <kind>:<name>\n" for each
 * plugin it registers to fd; it ends when one crashes. */
static void probe_child(struct kiln_registry *reg, int from, int fd)
{
	int null = open("/dev/null", O_WRONLY);
	if (null >= 0) {
		dup2(null, 1);
		dup2(null, 2);
	}
	for (int i = from; i < reg->n_files; i++) {
		if (reg->files[i].tried || reg->files[i].provides)
			continue;
		probe_say(fd, "%d start\n", i);
		void *h = dlopen(reg->files[i].path, RTLD_NOW | RTLD_LOCAL);
		kiln_plugin_init_fn init = NULL;
		if (h)
			*(void **)&init = dlsym(h, KILN_PLUGIN_INIT_SYMBOL);
		const struct kiln_plugin *const *list = init ? init(kiln_host_table()) : NULL;
		for (int k = 0; list && list[k]; k++)
			if (list[k]->name)
				probe_say(fd, "%d %d:%.400s\n", i, list[k]->kind, list[k]->name);
		probe_say(fd, "%d %s\n", i, list ? "ok" : "done");
	}
	probe_say(fd, "end\n"); /* the parent need not wait for this exit */
	_exit(0);
}

/* Append "<kind>:<name>\n" to what file i provides. */
static void provides_add(struct loaded_file *f, const char *line)
{
	size_t have = f->provides ? strlen(f->provides) : 0, n = strlen(line);
	char *p = realloc(f->provides, have + n + 1);
	if (!p)
		return;
	memcpy(p + have, line, n + 1);
	f->provides = p;
}

/* The parent's end of a probe child's pipe, read a line at a time. */
struct probe_pipe {
	int fd;
	char buf[4096];
	size_t have;
};

/* The next line (with its newline) of the child's report into line (n
 * bytes): 1, or 0 at the end of the report, or -1 with errno when the pipe
 * failed.  read(2) is retried when a signal of the application's (a
 * timer without SA_RESTART) cuts it short: stdio's fgets would end the
 * report there, as if the child had ended. */
static int probe_pipe_line(struct probe_pipe *pp, char *line, size_t n)
{
	for (;;) {
		char *nl = memchr(pp->buf, '\n', pp->have);
		if (nl || pp->have == sizeof pp->buf) {
			size_t len = nl ? (size_t)(nl - pp->buf) + 1 : pp->have;
			size_t keep = len < n ? len : n - 1;
			memcpy(line, pp->buf, keep);
			line[keep] = 0;
			memmove(pp->buf, pp->buf + len, pp->have - len);
			pp->have -= len;
			return 1;
		}
		ssize_t r = read(pp->fd, pp->buf + pp->have, sizeof pp->buf - pp->have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			return 0; /* a cut last line is dropped */
		pp->have += (size_t)r;
	}
}

/* What a probe child's report said: the file it was loading when the
 * report stopped (-1: none), whether it reached "end", how many files it
 * finished, and errno of a failed read (0: none). */
struct probe_report {
	int cur, ended, finished, read_errno;
};

/* Read a probe child's report from fd into the files' provides. */
static struct probe_report probe_read(struct kiln_registry *reg, int fd)
{
	struct probe_report r = { .cur = -1 };
	struct probe_pipe pp = { .fd = fd };
	char line[512];
	int got, idx;
	while ((got = probe_pipe_line(&pp, line, sizeof line)) > 0) {
		char what[400];
		if (!strcmp(line, "end\n")) {
			r.ended = 1;
			break;
		}
		if (sscanf(line, "%d %399s", &idx, what) != 2 || idx < 0 || idx >= reg->n_files)
			continue;
		if (!strcmp(what, "start")) {
			r.cur = idx;
			provides_add(&reg->files[idx], ""); /* probed, provides nothing yet */
		} else if (!strcmp(what, "done") || !strcmp(what, "ok")) {
			reg->files[idx].probed_ok = what[0] == 'o';
			r.cur = -1;
			r.finished++;
		} else {
			provides_add(&reg->files[idx], line + strcspn(line, " ") + 1);
		}
	}
	if (got < 0)
		r.read_errno = errno;
	return r;
}

/* Wait for probe child pid: 0 with its wait status in *ws, or -1 when
 * there is none to collect (errno ECHILD: the application ignores SIGCHLD,
 * so the kernel reaps its children, or its own handler reaped this one). */
static int probe_wait(pid_t pid, int *ws)
{
	*ws = 0;
	for (;;) {
		if (waitpid(pid, ws, 0) == pid)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

/* Forget that file f was being probed: the child's report stopped for a
 * reason not the file's, so nothing is known of it and it is probed again
 * on the next lookup. */
static void probe_forget(struct loaded_file *f)
{
	free(f->provides);
	f->provides = NULL;
	f->probed_ok = 0;
}

/* The probe child pid stopped reporting while loading file f (rep): blame
 * the file when loading it ended the child; 0 then, else -1 (the report
 * was lost for another reason: the file is left unprobed). */
static int probe_blame(struct loaded_file *f, pid_t pid, const struct probe_report *rep)
{
	int ws;
	if (rep->read_errno) {
		kill(pid, SIGKILL);
		probe_wait(pid, &ws);
		kiln_log(KILN_LOG_WARN, "core", "plugin probe: reading its report failed (%s) while it loaded %s; that file is left unprobed",
			 strerror(rep->read_errno), f->path);
		probe_forget(f);
		return -1;
	}
	/* the pipe's end: the child has closed it, so it has ended */
	if (probe_wait(pid, &ws)) {
		f->error = reg_dupf("loading it ended a test process (how is unknown: its exit status went elsewhere, as when the application ignores SIGCHLD or reaps every child)");
	} else if (WIFSIGNALED(ws)) {
		f->error = reg_dupf("loading it killed a test process with signal %d", WTERMSIG(ws));
	} else if (WIFEXITED(ws) && WEXITSTATUS(ws) == PROBE_EXIT_PIPE) {
		kiln_log(KILN_LOG_WARN, "core", "plugin probe: the test process could not write its report while it loaded %s; that file is left unprobed",
			 f->path);
		probe_forget(f);
		return -1;
	} else {
		f->error = reg_dupf("loading it made a test process exit with status %d before it finished (code in the plugin or a library it loads called exit)",
				WIFEXITED(ws) ? WEXITSTATUS(ws) : ws);
	}
	f->oom = !f->error; /* no memory for its message: not a silent skip */
	f->tried = 1;
	return 0;
}

/* Learn what every file neither loaded nor probed provides, by loading
 * them in child processes (probe_child): a file whose loading kills the
 * child gets its error (and is never loaded here); the next child goes
 * on after it. */
static void probe_children(struct kiln_registry *reg)
{
	int from = 0;
	for (;;) {
		while (from < reg->n_files && (reg->files[from].tried || reg->files[from].provides))
			from++;
		if (from == reg->n_files)
			return; /* nothing left to probe */
		int pfd[2];
		fflush(NULL);
		if (pipe2(pfd, O_CLOEXEC))
			return;
		pid_t pid = fork();
		if (pid < 0) {
			close(pfd[0]);
			close(pfd[1]);
			return;
		}
		if (!pid) {
			close(pfd[0]);
			probe_child(reg, from, pfd[1]);
		}
		close(pfd[1]);
		struct probe_report rep = probe_read(reg, pfd[0]);
		close(pfd[0]);
		int ws;
		if (rep.ended && rep.cur < 0) { /* through every file; reap it now or at close */
			pid_t *e = waitpid(pid, &ws, WNOHANG) ? NULL :
				   realloc(reg->exiting, (size_t)(reg->n_exiting + 1) * sizeof *e);
			if (e) {
				reg->exiting = e;
				e[reg->n_exiting++] = pid;
			}
			return;
		}
		if (rep.cur >= 0) {
			if (probe_blame(&reg->files[rep.cur], pid, &rep))
				return;
			from = rep.cur + 1;
			continue;
		}
		/* the report stopped between two files, before "end": the
		 * child was killed from outside (or its pipe failed); the
		 * files after the last it finished are still unprobed: a new
		 * child goes on from them if this one got anywhere */
		if (rep.read_errno)
			kill(pid, SIGKILL);
		probe_wait(pid, &ws);
		if (!rep.finished || rep.read_errno)
			return;
	}
}

/* What the files neither loaded nor probed provide: the answers kept from
 * an earlier run for files unchanged since (core/probe_cache.c), else from
 * probe children; what the children learnt of files that loaded is kept. */
void reg_probe_files(struct kiln_registry *reg)
{
	struct probe_cache *cache = NULL;
	for (int i = 0; i < reg->n_files; i++) {
		struct loaded_file *f = &reg->files[i];
		if (f->tried || f->provides)
			continue;
		if (!cache && !(cache = kiln_probe_cache_open()))
			break;
		const char *known = kiln_probe_cache_find(cache, f->path);
		if (known)
			f->provides = kiln_strdup(known);
	}
	probe_children(reg);
	for (int i = 0; cache && i < reg->n_files; i++)
		if (reg->files[i].probed_ok) {
			kiln_probe_cache_put(cache, reg->files[i].path, reg->files[i].provides);
			reg->files[i].probed_ok = 0;
		}
	kiln_probe_cache_close(cache);
}
