/* cli/cmd_bench_comm.c - `kiln bench comm --nproc N`: allreduce latency
 * and bus bandwidth of every available kiln communicator beside the raw
 * libraries (bench/mpi_raw, bench/gloo_raw) and torch.distributed's gloo
 * (bench/torch_comm.py), each run --runs times with --nproc local ranks;
 * per size the median over the runs of each run's median time, and the
 * ratios against the targets of docs/PERFORMANCE.md.
 *
 * `kiln bench comm --rank COMM MAX` is one rank of a kiln measurement
 * (what the driver starts under `kiln launch` or mpirun): an in-place f32
 * sum allreduce through the plugin's ops on a synchronous CPU stream,
 * median of 200/20/5 iterations by size, busbw = algbw x 2(n-1)/n. */
#include "build-config.h"
#include "cli.h"

#include <kiln/dist.h>
#include <kiln/plugin.h>

#include <arpa/inet.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 16
#define MAX_RUNS 15

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* ---- one rank ------------------------------------------------------------- */

static int rank_main(const char *tool, size_t max)
{
	struct kiln_dist_env env;
	struct kiln_registry *reg = NULL;
	struct kiln_config *cfg = NULL;
	struct kiln_device *dev = NULL;
	struct kiln_store *store = NULL;
	const struct kiln_plugin *p;
	void *ctx = NULL, *stream = NULL;
	float *buf = NULL;
	kiln_status st;
	/* COMM-noshm: the communicator with [plugin.COMM] shm = 0 (the
	 * library's own collectives, not kiln's shared-memory ones);
	 * COMM-staged: zero_copy = 0 (the buffer in device memory, through
	 * the staging buffers); COMM: the buffer in the communicator's
	 * shared memory when it has some (alloc_shared), as DDP's gradients */
	char name[32], ini[128];
	snprintf(name, sizeof name, "%s", tool);
	const char *key = strstr(name, "-noshm") ? "shm" : strstr(name, "-staged") ? "zero_copy" : NULL;
	if (key)
		*strchr(name, '-') = 0;
	snprintf(ini, sizeof ini, "[run]\nthreads = 1\n%s%s%s%s%s", key ? "[plugin." : "", key ? name : "",
		 key ? "]\n" : "", key ? key : "", key ? " = 0\n" : "");
	if ((st = kiln_dist_env_read(&env)) || (st = kiln_registry_open(NULL, &reg)) ||
	    (st = kiln_config_load_string(ini, "bench comm", &cfg)) ||
	    (st = kiln_device_open(reg, cfg, "cpu", 0, &dev)) ||
	    (st = kiln_device_stream_create(dev, &stream)) ||
	    (st = kiln_registry_find(reg, KILN_PLUGIN_COMM, name, &p)))
		return cli_fail(st);
	const struct kiln_comm_ops *ops = p->ops;
	/* the store's and the communicator's waits: [dist] timeout's default
	 * (a run's ranks under load wait as long as a training run's do) */
	double timeout_s = 0;
	if ((st = kiln_config_get_float(cfg, "dist", "timeout", &timeout_s)))
		return cli_fail(st);
	const int timeout_ms = (int)(timeout_s * 1000.0);
	if ((st = kiln_store_open(env.master_addr, env.master_port, env.rank == 0, env.rank,
				  env.world, timeout_ms, &store)) ||
	    (st = kiln_store_rendezvous(store, env.rank, env.world, timeout_ms)) ||
	    (st = ops->open(kiln_host_table(), cfg, store, dev, env.rank, env.world, timeout_ms, &ctx)))
		return cli_fail(st);
	int shared = 0;
	if (ops->version >= 3 && ops->alloc_shared) {
		st = ops->alloc_shared(ctx, max, (void **)&buf);
		if (st && st != KILN_ENOTSUP)
			return cli_fail(st);
		shared = !st;
	}
	if (!shared && (st = kiln_device_alloc(dev, max, (void **)&buf)))
		return cli_fail(st);
	memset(buf, 0, max);
	if (env.rank == 0)
		printf("# kiln-%s, %d ranks, buffer in %s\n", tool, env.world,
		       shared ? "the communicator's shared memory" : "device memory");
	for (size_t bytes = 4096; bytes <= max; bytes *= 4) {
		int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 20 : 5;
		double t[200];
		for (int w = 0; w < 3; w++)
			if ((st = ops->allreduce(ctx, buf, bytes / 4, KILN_F32, KILN_REDUCE_SUM, stream,
						 NULL)))
				return cli_fail(st);
		for (int i = 0; i < iters; i++) {
			if ((st = ops->barrier(ctx)))
				return cli_fail(st);
			double t0 = cli_now_s();
			if ((st = ops->allreduce(ctx, buf, bytes / 4, KILN_F32, KILN_REDUCE_SUM, stream,
						 NULL)) ||
			    (st = kiln_device_stream_sync(dev, stream)))
				return cli_fail(st);
			t[i] = cli_now_s() - t0;
		}
		qsort(t, (size_t)iters, sizeof *t, cmp_double);
		double med = t[iters / 2];
		if (env.rank == 0)
			printf("  %10zu %12.1f %12.3f\n", bytes, med * 1e6,
			       (double)bytes / med * 2.0 * (env.world - 1) / env.world / 1e9);
		fflush(stdout);
	}
	/* no rank closes its pairs while a peer is still in the last
	 * allreduce (a rank that left first cut Gloo's TCP pairs under a
	 * peer that still waited for data: "Connection closed by peer",
	 * kiln-gloo-noshm under load).  This barrier's own failure is not
	 * the run's: past it every rank has finished its last allreduce, and
	 * Gloo's wait throws on a closed pair even when the notice it waited
	 * for came before the close (tcp::Buffer::waitRecv checks the pair's
	 * exception first), which the first rank out causes under load */
	if (ops->barrier(ctx))
		kiln_clear_error();
	if (!shared)
		kiln_device_free(dev, buf);
	ops->close(ctx);
	kiln_store_close(store);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return 0;
}

/* ---- the driver ------------------------------------------------------------ */

enum { T_KILN_MPI, T_RAW_MPI, T_KILN_GLOO, T_RAW_GLOO, T_TORCH, T_KILN_MPI_NOSHM,
       T_KILN_GLOO_NOSHM, T_KILN_MPI_STAGED, N_TOOLS };
static const char *const tool_names[N_TOOLS] = { "kiln-mpi", "raw-mpi", "kiln-gloo", "raw-gloo",
						 "torch-gloo", "kiln-mpi-noshm", "kiln-gloo-noshm",
						 "kiln-mpi-staged" };

struct series {
	int have, runs;
	int tried;  /* a run of it was started (run_tools) */
	double us[MAX_SIZES][MAX_RUNS], bw[MAX_SIZES][MAX_RUNS];
	double med_us[MAX_SIZES], med_bw[MAX_SIZES];
	char why[160];
};

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t n = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
	    !getsockname(fd, (struct sockaddr *)&a, &n))
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port ? port : 29500 + (int)(getpid() % 20000);
}

/* Run cmd (sh -c), read rank 0's "bytes us busbw" lines into run r.  The
 * busbw is made here from the latency, for nproc ranks (algbw x
 * 2(n-1)/n): every tool prints it to 0.001 GB/s, and a 4 KiB allreduce
 * slowed past 8 ms by a loaded machine printed 0.000 (tests/dist.sh). */
static int collect(const char *cmd, struct series *s, int r, int n_sizes, int nproc)
{
	FILE *f = popen(cmd, "r");
	char line[256];
	int got = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		double b, us, bw;
		if (line[0] == '#' || sscanf(line, "%lf %lf %lf", &b, &us, &bw) != 3)
			continue;
		int k = 0;
		for (double x = 4096; x < b && k < MAX_SIZES; x *= 4)
			k++;
		if (k < n_sizes) {
			s->us[k][r] = us;
			s->bw[k][r] = us > 0 ? b / (us * 1e-6) * 2.0 * (nproc - 1) / nproc / 1e9 : bw;
			got++;
		}
	}
	int rc = pclose(f);
	return rc == 0 && got == n_sizes;
}

static int executable(const char *path)
{
	return access(path, X_OK) == 0;
}

static int in_path(const char *prog)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", prog);
	return system(cmd) == 0;
}

/* whether name is an item of the comma-separated list */
static int listed(const char *list, const char *name)
{
	const size_t n = strlen(name);
	for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, name, n) && (p[n] == ',' || !p[n]))
			return 1;
	return 0;
}

static void bench_comm_usage(FILE *f)
{
	fprintf(f, "usage: kiln bench comm [--nproc N] [--max BYTES] [--runs R] [--bench-dir DIR]\n"
		   "                       [--tools LIST]\n\n"
		   "Start N local ranks (default 2) and measure the allreduce (f32 sum, in place)\n"
		   "from 4 KiB to BYTES (default 256 MiB, by 4x) of every communicator available:\n"
		   "kiln-mpi (under mpirun) beside raw MPI (DIR/mpi_raw), kiln-gloo (under kiln\n"
		   "launch) beside raw Gloo (DIR/gloo_raw), and torch.distributed's gloo\n"
		   "(kiln-mpi-noshm and kiln-gloo-noshm: the same with [plugin.mpi|gloo] shm = 0,\n"
		   "the library's own collectives instead of kiln's shared-memory ones;\n"
		   "kiln-mpi-staged: [plugin.mpi] zero_copy = 0, the buffer in device memory\n"
		   "rather than the communicator's shared memory that DDP's gradients live in)\n"
		   "(DIR/torch_comm.py with $KILN_PYTHON, python3 or /usr/bin/python3).  Each is run R times (default 3); per size\n"
		   "the table shows the median over the runs of each run's median latency (us) and\n"
		   "busbw (GB/s, algbw x 2(n-1)/n), then the ratios against the targets:\n"
		   "kiln-mpi within 10 us of raw MPI and >= 0.9x its busbw, kiln-gloo >= 0.9x raw\n"
		   "Gloo, the best kiln communicator >= 5x torch gloo's busbw at 1 MiB.  DIR\n"
		   "defaults to the bench/ folder beside the kiln binary (the build tree); a\n"
		   "baseline that is not there is left out, saying why.  --tools keeps only the\n"
		   "listed ones (comma-separated: kiln-mpi,raw-mpi,kiln-gloo,raw-gloo,torch-gloo,\n"
		   "kiln-mpi-noshm,kiln-gloo-noshm,kiln-mpi-staged).  Run r starts with the r-th\n"
		   "tool (mod 8), so\n"
		   "the order rotates between runs.  It exits 1 when a tool it ran, or one\n"
		   "named in --tools, produced no figures (a failed run, or not available).\n");
}

void bench_comm_usage_print(void)
{
	bench_comm_usage(stdout);
}

/* What the driver was asked for. */
struct bench_opts {
	int nproc, runs;
	size_t max;
	const char *bench_dir, *only;
};

/* Where the programs it starts are, and how. */
struct bench_paths {
	char self[PATH_MAX + 16];  /* this program (the libtool wrapper in the build tree) */
	char dir[PATH_MAX + 16];   /* the bench/ folder beside it */
	char raw_mpi[PATH_MAX + 32], raw_gloo[PATH_MAX + 32], torch_py[PATH_MAX + 32];
	const char *py;            /* the python with torch */
	const char *root;          /* mpirun's --allow-run-as-root, or "" */
};

/* Read the options into *o; returns -1 to go on, else the exit code (a
 * --rank run is done here). */
static int bench_comm_args(int argc, char **argv, struct bench_opts *o)
{
	long long nproc = o->nproc, runs = o->runs, max = (long long)o->max;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--rank") && i + 2 < argc)
			return rank_main(argv[i + 1], (size_t)strtoull(argv[i + 2], NULL, 10));
		int r;
		if ((r = cli_opt_int(argc, argv, &i, "--nproc", 2, 256, &nproc)) ||
		    (r = cli_opt_int(argc, argv, &i, "--runs", 1, MAX_RUNS, &runs)) ||
		    (r = cli_opt_int(argc, argv, &i, "--max", 4096, INT64_MAX, &max)) ||
		    (r = cli_opt(argc, argv, &i, "--bench-dir", &o->bench_dir)) ||
		    (r = cli_opt(argc, argv, &i, "--tools", &o->only))) {
			if (r < 0)
				return 2;
		} else {
			cli_bad_arg(a);
			bench_comm_usage(stderr);
			return 2;
		}
	}
	o->nproc = (int)nproc;
	o->runs = (int)runs;
	o->max = (size_t)max;
	return -1;
}

/* This program and the bench/ folder beside it; 0 when not found. */
static int find_self(struct bench_paths *P)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0) {
		fprintf(stderr, "kiln: error: cannot find this program (/proc/self/exe)\n");
		return 0;
	}
	exe[n] = 0;
	char *d = dirname(exe);
	size_t dl = strlen(d);
	if (dl >= 6 && !strcmp(d + dl - 6, "/.libs"))
		d[dl - 6] = 0;
	snprintf(P->self, sizeof P->self, "%s/kiln", d);
	snprintf(P->dir, sizeof P->dir, "%s/bench", d);
	return 1;
}

/* Which tools can run (s[k].have, else s[k].why), and the python with
 * torch; only: the --tools list or NULL. */
static kiln_status probe_tools(struct series *s, struct bench_paths *P, const char *bench_dir,
			       const char *only)
{
	struct kiln_registry *reg = NULL;
	const struct kiln_plugin *p;
	kiln_status st = kiln_registry_open(NULL, &reg);
	if (st)
		return st;
	const int have_mpirun = in_path("mpirun");
	snprintf(P->raw_mpi, sizeof P->raw_mpi, "%s/mpi_raw", bench_dir);
	snprintf(P->raw_gloo, sizeof P->raw_gloo, "%s/gloo_raw", bench_dir);
	snprintf(P->torch_py, sizeof P->torch_py, "%s/torch_comm.py", bench_dir);
	s[T_KILN_MPI].have = !kiln_registry_find(reg, KILN_PLUGIN_COMM, "mpi", &p) && have_mpirun;
	if (!s[T_KILN_MPI].have)
		snprintf(s[T_KILN_MPI].why, sizeof s->why, "%s",
			 have_mpirun ? "no mpi plugin" : "no mpirun in PATH");
	s[T_RAW_MPI].have = have_mpirun && executable(P->raw_mpi);
	if (!s[T_RAW_MPI].have)
		snprintf(s[T_RAW_MPI].why, sizeof s->why, "%s", have_mpirun ? "no bench/mpi_raw" : "no mpirun");
	s[T_KILN_GLOO].have = !kiln_registry_find(reg, KILN_PLUGIN_COMM, "gloo", &p);
	if (!s[T_KILN_GLOO].have)
		snprintf(s[T_KILN_GLOO].why, sizeof s->why, "no gloo plugin");
	s[T_KILN_MPI_NOSHM] = s[T_KILN_MPI_STAGED] = s[T_KILN_MPI];
	s[T_KILN_GLOO_NOSHM] = s[T_KILN_GLOO];
	s[T_RAW_GLOO].have = executable(P->raw_gloo);
	if (!s[T_RAW_GLOO].have)
		snprintf(s[T_RAW_GLOO].why, sizeof s->why, "no bench/gloo_raw");
	/* $KILN_PYTHON, else the first of python3 and /usr/bin/python3 with
	 * torch; not probed when --tools leaves torch-gloo out (importing
	 * torch takes seconds, tens of them on a loaded machine) */
	const char *py = getenv("KILN_PYTHON");
	char probe[PATH_MAX + 96];
	const char *const pys[] = { py && *py ? py : "python3", "/usr/bin/python3" };
	const int want_torch = !only || listed(only, tool_names[T_TORCH]);
	P->py = py;
	for (int i = 0; i < 2 && want_torch && !s[T_TORCH].have; i++) {
		snprintf(probe, sizeof probe, "'%s' -c 'import torch.distributed' > /dev/null 2>&1", pys[i]);
		if (access(P->torch_py, R_OK) == 0 && system(probe) == 0) {
			s[T_TORCH].have = 1;
			P->py = pys[i];
		}
	}
	if (!s[T_TORCH].have)
		snprintf(s[T_TORCH].why, sizeof s->why, "%s",
			 want_torch ? "no python3 with torch, or no bench/torch_comm.py" : "not in --tools");
	kiln_registry_close(reg);
	for (int k = 0; k < N_TOOLS && only; k++)
		if (s[k].have && !listed(only, tool_names[k])) {
			s[k].have = 0;
			snprintf(s[k].why, sizeof s->why, "not in --tools");
		}
	return KILN_OK;
}

/* The shell command of one run of tool k into cmd; tmp: a mkdtemp
 * template for raw Gloo's rendezvous; err: the file its ranks' stderr goes
 * to (shown when the run fails).  0 when it cannot be made (x->why). */
static int tool_command(int k, const struct bench_opts *o, const struct bench_paths *P,
			struct series *x, char *tmp, const char *err, char *cmd, size_t cmd_size)
{
	const int nproc = o->nproc;
	const size_t max = o->max;
	switch (k) {
	case T_KILN_MPI:
	case T_KILN_MPI_NOSHM:
	case T_KILN_MPI_STAGED:
		snprintf(cmd, cmd_size, "mpirun %s--oversubscribe -np %d -x KILN_MASTER_PORT=%d -x OMP_NUM_THREADS=1 '%s' bench comm --rank %s %zu 2>>'%s'",
			 P->root, nproc, free_port(), P->self, tool_names[k] + 5, max, err);
		break;
	case T_RAW_MPI:
		snprintf(cmd, cmd_size, "mpirun %s--oversubscribe -np %d '%s' %zu 2>>'%s'",
			 P->root, nproc, P->raw_mpi, max, err);
		break;
	case T_KILN_GLOO:
	case T_KILN_GLOO_NOSHM:
		snprintf(cmd, cmd_size, "'%s' launch -n %d -- '%s' bench comm --rank %s %zu 2>>'%s'",
			 P->self, nproc, P->self, tool_names[k] + 5, max, err);
		break;
	case T_RAW_GLOO:
		if (!mkdtemp(tmp)) {
			x->have = 0;
			snprintf(x->why, sizeof x->why, "mkdtemp failed");
			return 0;
		}
		snprintf(cmd, cmd_size, "'%s' launch -n %d -- '%s' %s %zu 2>>'%s'; rc=$?; rm -rf %s; exit $rc",
			 P->self, nproc, P->raw_gloo, tmp, max, err, tmp);
		break;
	default:
		snprintf(cmd, cmd_size, "p=%d; r=1; while [ $r -lt %d ]; do RANK=$r WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 '%s' '%s' %zu > /dev/null 2>>'%s' & r=$((r + 1)); done; RANK=0 WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 '%s' '%s' %zu 2>>'%s'; wait",
			 free_port(), nproc, nproc, P->py, P->torch_py, max, err, nproc, P->py,
			 P->torch_py, max, err);
		break;
	}
	return 1;
}

/* Print the last `lines` lines of file path (a failed run's stderr) to
 * stderr, each indented; nothing when it is empty or unreadable. */
static void show_tail(const char *path, int lines)
{
	FILE *f = fopen(path, "r");
	char buf[8192];
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	const long size = ftell(f);
	fseek(f, size > (long)sizeof buf - 1 ? size - (long)(sizeof buf - 1) : 0, SEEK_SET);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	while (n && buf[n - 1] == '\n')
		n--;
	buf[n] = 0;
	const char *p = buf + n;
	for (int k = 0; p > buf && k < lines; k += *--p == '\n')
		;
	if (*p == '\n')
		p++;
	for (const char *q = p; *q; ) {
		const char *e = strchr(q, '\n');
		const int len = e ? (int)(e - q) : (int)strlen(q);
		fprintf(stderr, "    %.*s\n", len, q);
		q += len + (e != NULL);
	}
}

/* Every run of every tool that can run; run r starts with tool r mod
 * N_TOOLS: no tool always runs first, right after another's ranks exit,
 * or always last.  Then each size's medians over the runs. */
static void run_tools(struct series *s, const struct bench_opts *o, const struct bench_paths *P,
		      int n_sizes)
{
	enum { CMD = 4 * PATH_MAX + 512 };
	char *cmd = malloc(CMD); /* (17 KiB: on the heap, as P) */
	if (!cmd)
		return;
	for (int r = 0; r < o->runs; r++)
		for (int kk = 0; kk < N_TOOLS; kk++) {
			const int k = (kk + r) % N_TOOLS;
			struct series *x = &s[k];
			if (!x->have)
				continue;
			char tmp[] = "/tmp/kiln-bench-comm.XXXXXX";
			char err[PATH_MAX];
			const char *td = getenv("TMPDIR");
			snprintf(err, sizeof err, "%s/kiln-bench-comm-err.XXXXXX", td && *td ? td : "/tmp");
			const int fd = mkstemp(err);
			if (fd < 0)
				snprintf(err, sizeof err, "/dev/null");
			else
				close(fd);
			x->tried = 1;
			if (tool_command(k, o, P, x, tmp, err, cmd, CMD)) {
				fprintf(stderr, "  run %d/%d: %s\n", r + 1, o->runs, tool_names[k]);
				if (collect(cmd, x, x->runs, n_sizes, o->nproc)) {
					x->runs++;
				} else {
					x->have = 0;
					snprintf(x->why, sizeof x->why, "run %d failed or printed too little", r + 1);
					fprintf(stderr, "kiln bench comm: %s: run %d failed or printed too little; the last lines its ranks wrote to stderr:\n",
						tool_names[k], r + 1);
					show_tail(err, 15);
				}
			}
			if (fd >= 0)
				unlink(err);
		}
	free(cmd);
	for (int k = 0; k < N_TOOLS; k++)
		for (int z = 0; z < n_sizes && s[k].have; z++) {
			double a[MAX_RUNS], b[MAX_RUNS];
			memcpy(a, s[k].us[z], sizeof a);
			memcpy(b, s[k].bw[z], sizeof b);
			qsort(a, (size_t)s[k].runs, sizeof *a, cmp_double);
			qsort(b, (size_t)s[k].runs, sizeof *b, cmp_double);
			s[k].med_us[z] = a[s[k].runs / 2];
			s[k].med_bw[z] = b[s[k].runs / 2];
		}
}

/* The table of medians, then the tools left out and why. */
static void print_table(const struct series *s, int nproc, int runs, int n_sizes)
{
	printf("allreduce f32 sum in place, %d ranks, median of %d run(s): latency us / busbw GB/s\n",
	       nproc, runs);
	printf("%10s", "bytes");
	for (int k = 0; k < N_TOOLS; k++)
		if (s[k].have)
			printf(" %21s", tool_names[k]);
	printf("\n");
	for (int z = 0; z < n_sizes; z++) {
		printf("%10zu", (size_t)4096 << (2 * z));
		for (int k = 0; k < N_TOOLS; k++)
			if (s[k].have) /* 4 significant digits: a run slowed to
					* milliseconds by a busy machine still
					* shows a positive busbw, not 0.000 */
				printf(" %10.1f / %8.4g", s[k].med_us[z], s[k].med_bw[z]);
		printf("\n");
	}
	for (int k = 0; k < N_TOOLS; k++)
		if (!s[k].have)
			printf("%s: left out (%s)\n", tool_names[k], s[k].why);
}

/* The tools asked for that produced no figures: one that ran and failed,
 * or one --tools named that cannot run (without --tools, a baseline that
 * is not there is only left out).  Says which on stderr; their count. */
static int count_missing(const struct series *s, const char *only)
{
	int n = 0;
	for (int k = 0; k < N_TOOLS; k++)
		if (!s[k].have && (s[k].tried || (only && listed(only, tool_names[k])))) {
			fprintf(stderr, "kiln bench comm: error: %s produced no figures (%s)\n",
				tool_names[k], s[k].why);
			n++;
		}
	return n;
}

/* The ratios against docs/PERFORMANCE.md's targets. */
static void print_targets(const struct series *s, int n_sizes)
{
	printf("targets:\n");
	static const int mpi_tools[] = { T_KILN_MPI, T_KILN_MPI_STAGED, T_KILN_MPI_NOSHM };
	for (int t = 0, k; t < 3 && (k = mpi_tools[t], 1); t++)
		for (int z = 0; z < n_sizes && s[k].have && s[T_RAW_MPI].have; z++) {
			double dlat = s[k].med_us[z] - s[T_RAW_MPI].med_us[z];
			double rb = s[k].med_bw[z] / s[T_RAW_MPI].med_bw[z];
			printf("  %s vs raw MPI %10zu B: latency %+8.1f us (%s), busbw %.2fx (%s)\n",
			       tool_names[k], (size_t)4096 << (2 * z), dlat, dlat <= 10 ? "met" : "NOT met",
			       rb, rb >= 0.9 ? "met" : "NOT met");
		}
	for (int k = T_KILN_GLOO; k <= T_KILN_GLOO_NOSHM; k += T_KILN_GLOO_NOSHM - T_KILN_GLOO)
		for (int z = 0; z < n_sizes && s[k].have && s[T_RAW_GLOO].have; z++) {
			double rb = s[k].med_bw[z] / s[T_RAW_GLOO].med_bw[z];
			printf("  %s vs raw Gloo %10zu B: busbw %.2fx (%s)\n", tool_names[k],
			       (size_t)4096 << (2 * z), rb, rb >= 0.9 ? "met" : "NOT met");
		}
	const int z1 = 4; /* 1 MiB */
	if (s[T_TORCH].have && z1 < n_sizes) {
		int best = -1;
		for (int k = T_KILN_MPI; k <= T_KILN_GLOO; k += 2)
			if (s[k].have && (best < 0 || s[k].med_bw[z1] > s[best].med_bw[z1]))
				best = k;
		if (best >= 0) {
			double rb = s[best].med_bw[z1] / s[T_TORCH].med_bw[z1];
			printf("  best kiln communicator (%s) vs torch gloo at 1 MiB: %.2fx (%s)\n",
			       tool_names[best], rb, rb >= 5 ? "met" : "NOT met");
		}
	}
}

/* kiln bench comm with its options o: the exit code. */
static int bench_comm_run(struct bench_opts *o, struct bench_paths *P)
{
	if (!find_self(P))
		return 1;
	if (!o->bench_dir)
		o->bench_dir = P->dir;
	int n_sizes = 0;
	for (size_t b = 4096; b <= o->max && n_sizes < MAX_SIZES; b *= 4)
		n_sizes++;
	struct series *s = calloc(N_TOOLS, sizeof *s);
	if (!s)
		return 1;
	kiln_status st = probe_tools(s, P, o->bench_dir, o->only);
	if (st) {
		free(s);
		return cli_fail(st);
	}
	/* the ranks under mpirun meet at the rendezvous store too, which
	 * wants a secret they share (kiln launch makes its own) */
	const int e = cli_store_token();
	if (e) {
		free(s);
		fprintf(stderr, "kiln bench comm: error: making the store's secret: %s\n", strerror(e));
		return 1;
	}
	kiln_log_set_level(KILN_LOG_WARN);
	fprintf(stderr, "bench comm: %d ranks, 4 KiB..%zu B, %d run(s) each\n", o->nproc, o->max,
		o->runs);
	run_tools(s, o, P, n_sizes);
	print_table(s, o->nproc, o->runs, n_sizes);
	print_targets(s, n_sizes);
	const int missing = count_missing(s, o->only);
	free(s);
	return missing ? 1 : 0;
}

int cmd_bench_comm(int argc, char **argv)
{
	struct bench_opts o = { .nproc = 2, .runs = 3, .max = (size_t)256 << 20 };
	/* its mpirun, Python and kiln runs (popen, system) get the user's
	 * ulimit -n; it opens no shards itself */
	cli_open_files_limit_restore();
	int rc = bench_comm_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	/* (the paths, 20 KiB, on the heap: configure.ac's KILN_FRAME_CFLAGS) */
	struct bench_paths *P = calloc(1, sizeof *P);
	if (!P)
		return 1;
	P->root = geteuid() == 0 ? "--allow-run-as-root " : "";
	rc = bench_comm_run(&o, P);
	free(P);
	return rc;
}
