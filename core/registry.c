/* core/registry.c - finding, loading and listing plugins.
 *
 * Search order (first file of a given name wins): [run] plugin_path,
 * $KILN_PLUGIN_PATH, the build tree's plugins/.libs when this libkiln is the
 * build tree's own, then the installed $(pkglibdir).  Only files named
 * kiln-<name>.so are considered.
 *
 * Loading is lazy: opening the registry only lists the files.  A lookup
 * by name loads kiln-<name>.so; for a name no file is named after (a
 * source of kiln-loaders.so) the other files are dlopen()ed and
 * initialised in a child process (core/registry_probe.c), which tells which file
 * provides what, and only the file providing the name is loaded here.
 * Listing every plugin loads every file the probe survived: a file whose
 * loading crashes the child is reported and never loaded here.
 */
#include "internal.h"
#include "dist.h"
#include "registry_impl.h"
#include "store.h" /* kiln_store_peek */
#include "../plugins/common/spin_rule.h" /* common_omp_env_defaults */

#include <dirent.h>
#include <errno.h>
#include <dlfcn.h>
#include <pthread.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>


/* ---- the host table --------------------------------------------------- */

static kiln_status host_prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan,
				size_t *ws)
{
	return kiln_device_prepare(dev, op, plan, ws);
}
static kiln_status host_run(struct kiln_device *dev, void *plan, const struct kiln_op_args *a,
			    void *stream)
{
	return kiln_device_run(dev, plan, a, stream);
}
static void host_plan_free(struct kiln_device *dev, void *plan)
{
	kiln_device_plan_free(dev, plan);
}

static const char *host_device_name(struct kiln_device *dev)
{
	return kiln_device_name(dev);
}

static const struct kiln_host host = {
	.version = KILN_HOST_VERSION,
	.log = kiln_log,
	.error = kiln_error,
	.config_get = kiln_config_get,
	.config_get_int = kiln_config_get_int,
	.config_get_float = kiln_config_get_float,
	.config_get_bool = kiln_config_get_bool,
	.config_where = kiln_config_where,
	.device_prepare = host_prepare,
	.device_run = host_run,
	.device_plan_free = host_plan_free,
	.last_error = kiln_last_error,
	.device_aux_bytes = kiln_device_aux_bytes,
	.crc32c = kiln_crc32c,
	.op_name = kiln_op_name,
	.store_set = kiln_store_set,
	.store_get = kiln_store_get,
	.store_add = kiln_store_add,
	.free = free,
	.device_host_fn = kiln_device_host_fn,
	.device_event_record = kiln_device_event_record,
	.device_stream_sync = kiln_device_stream_sync,
	.device_name = host_device_name,
	.device_proc = kiln_device_proc,
	.fatal = kiln_host_fatal,
	.group_allreduce = kiln_dist_group_allreduce,
	.group_allgather = kiln_dist_group_allgather,
	.device_capturing = kiln_device_capturing,
	.run_ns = kiln_run_ns,
	.store_check = kiln_store_peek,
};

const struct kiln_host *kiln_host_table(void) { return &host; }

const char *kiln_plugin_kind_name(int kind)
{
	switch (kind) {
	case KILN_PLUGIN_DEVICE: return "device";
	case KILN_PLUGIN_COMM: return "comm";
	case KILN_PLUGIN_PRECISION: return "precision";
	case KILN_PLUGIN_SOURCE: return "source";
	case KILN_PLUGIN_OPTIM: return "optim";
	case KILN_PLUGIN_LAYER: return "layer";
	}
	return "unknown";
}

/* ---- search path ------------------------------------------------------ */

static kiln_status add_dir(struct kiln_registry *reg, const char *d, size_t n)
{
	if (!n)
		return KILN_OK;
	char *s = malloc(n + 1);
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	memcpy(s, d, n);
	s[n] = 0;
	for (int i = 0; i < reg->n_dirs; i++)
		if (!strcmp(reg->dirs[i], s)) {
			free(s);
			return KILN_OK;
		}
	char **nd = realloc(reg->dirs, (size_t)(reg->n_dirs + 1) * sizeof *nd);
	if (!nd) {
		free(s);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	reg->dirs = nd;
	reg->dirs[reg->n_dirs++] = s;
	return KILN_OK;
}

static kiln_status add_path(struct kiln_registry *reg, const char *path)
{
	while (path && *path) {
		const char *c = strchr(path, ':');
		size_t n = c ? (size_t)(c - path) : strlen(path);
		kiln_status st = add_dir(reg, path, n);
		if (st)
			return st;
		path = c ? c + 1 : NULL;
	}
	return KILN_OK;
}

/* Is this libkiln the one in the build tree?  Then the build tree's plugins
 * are the matching ones (so `make check` and ./kiln need no install). */
static int running_from_build_tree(void)
{
#ifdef KILN_BUILD_LIBDIR
	Dl_info info;
	char a[PATH_MAX], b[PATH_MAX];
	if (!dladdr((void *)running_from_build_tree, &info) || !info.dli_fname)
		return 0;
	if (!realpath(info.dli_fname, a) || !realpath(KILN_BUILD_LIBDIR, b))
		return 0;
	char *slash = strrchr(a, '/');
	if (!slash)
		return 0;
	*slash = 0;
	return !strcmp(a, b);
#else
	return 0;
#endif
}

/* ---- loading ---------------------------------------------------------- */

static int has_file(const struct kiln_registry *reg, const char *base)
{
	for (int i = 0; i < reg->n_files; i++) {
		const char *s = strrchr(reg->files[i].path, '/');
		if (!strcmp(s ? s + 1 : reg->files[i].path, base))
			return 1;
	}
	return 0;
}

static kiln_status add_plugin(struct kiln_registry *reg, const struct kiln_plugin *p, int file)
{
	struct reg_plugin *np = kiln_grow(reg->plugins, reg->n_plugins, &reg->cap_plugins, sizeof *np, 32);
	if (!np)
		return kiln_error(KILN_ENOMEM, "out of memory");
	reg->plugins = np;
	struct reg_plugin *r = &reg->plugins[reg->n_plugins++];
	memset(r, 0, sizeof *r);
	r->p = p;
	r->file = file;
	r->available = 1;
	if (p->probe && p->probe(&host, r->why, sizeof r->why)) {
		r->available = 0;
		if (!r->why[0])
			snprintf(r->why, sizeof r->why, "probe failed");
	}
	return KILN_OK;
}

char *reg_dupf(const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	return kiln_strdup(buf);
}

/* Whether a loader's message says memory ran out: dlerror's strerror
 * (ENOMEM), glibc's loader's own words for a failed allocation ("cannot
 * create shared object descriptor" has no strerror) or its "out of
 * memory" when it could not even allocate the message, or a plugin
 * init's kiln_error(KILN_ENOMEM, "out of memory"). */
static int says_oom(const char *msg, const char *path)
{
	if (!msg)
		return 0;
	/* dlerror's "PATH: ...": a folder named "out of memory" is not */
	const size_t n = strlen(path);
	if (!strncmp(msg, path, n))
		msg += n;
	/* glibc's "cannot allocate memory in static TLS block" is a plugin
	 * (or a library it needs) with initial-exec TLS that does not fit,
	 * not memory running out (session 37's review: every failed lookup
	 * said "out of memory" with such a file on the path) */
	if (strstr(msg, "static TLS"))
		return 0;
	return strstr(msg, "Cannot allocate memory") || strstr(msg, "out of memory") ||
	       strstr(msg, "cannot allocate") || strstr(msg, "cannot create shared object descriptor");
}

/* Keep the first reason a file gave (a later one is counted).  No
 * message (reg_dupf out of memory): the file is marked as failed for lack
 * of memory, so a lookup it may have served says so. */
static void file_error(struct loaded_file *f, char *msg)
{
	if (!msg) {
		f->oom = 1;
		return;
	}
	if (!f->error) {
		f->error = msg;
		return;
	}
	char *both = reg_dupf("%s (and more: %s)", f->error, msg);
	free(msg);
	if (both) {
		free(f->error);
		f->error = both;
	}
}

/* Record a file found on the search path (not loaded yet). */
static kiln_status add_file(struct kiln_registry *reg, const char *path)
{
	struct loaded_file *nf = kiln_grow(reg->files, reg->n_files, &reg->cap_files, sizeof *nf, 16);
	if (!nf)
		return kiln_error(KILN_ENOMEM, "out of memory");
	reg->files = nf;
	struct loaded_file *f = &reg->files[reg->n_files];
	memset(f, 0, sizeof *f);
	if (!(f->path = kiln_strdup(path)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	reg->n_files++;
	return KILN_OK;
}

/* dlopen file idx, run its init and register its plugins. */
static kiln_status load_file(struct kiln_registry *reg, int idx)
{
	struct loaded_file *f = &reg->files[idx];
	const char *path = f->path;
	if (f->tried)
		return KILN_OK;
	f->tried = 1;
	dlerror();
	errno = 0;
	f->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!f->handle) {
		/* (errno: a failed malloc or mmap in the loader sets ENOMEM,
		 * whatever words dlerror has for it) */
		const int err = errno;
		const char *e = dlerror();
		f->oom = err == ENOMEM || says_oom(e, path);
		/* a missing symbol is not a missing library: ldd lists every
		 * library found and says nothing of it */
		size_t vm, as;
		kiln_vm(&vm, &as);
		/* ld.so's mmap of a library refused by RLIMIT_AS (errno is not
		 * kept: the words are) */
		if (as != SIZE_MAX && e && strstr(e, "failed to map segment"))
			f->oom = 1;
		if (e && strstr(e, "undefined symbol"))
			file_error(f, reg_dupf("dlopen failed: %s (the plugin needs a symbol no loaded "
					       "library provides: built against another kiln?)", e));
		else if (f->oom && as != SIZE_MAX) /* (a missing library is not the cause) */
			file_error(f, reg_dupf("dlopen failed: %s (out of address space: RLIMIT_AS, "
					       "ulimit -v, is %.1f MiB, %.1f MiB of it mapped)",
					       e ? e : "unknown error", (double)as / 1048576.0,
					       (double)vm / 1048576.0));
		else
			file_error(f, reg_dupf("dlopen failed: %s (check `ldd %s` for missing libraries)",
					       e ? e : "unknown error", path));
		return KILN_OK;
	}
	kiln_plugin_init_fn init;
	*(void **)&init = dlsym(f->handle, KILN_PLUGIN_INIT_SYMBOL);
	if (!init) {
		file_error(f, reg_dupf("not a kiln plugin: no exported symbol %s", KILN_PLUGIN_INIT_SYMBOL));
		return KILN_OK;
	}
	kiln_clear_error();
	/* one init at a time in the process: registries opened on several
	 * threads (kiln/infer.h) load the same file, whose init stores the
	 * host table in its globals (a second store of the same value skipped,
	 * after the first under this lock) */
	static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&init_lock);
	const struct kiln_plugin *const *list = init(&host);
	pthread_mutex_unlock(&init_lock);
	if (!list) {
		f->oom = says_oom(kiln_last_error(), path);
		file_error(f, reg_dupf("%s() failed: %s", KILN_PLUGIN_INIT_SYMBOL,
				       *kiln_last_error() ? kiln_last_error() : "no reason given"));
		return KILN_OK;
	}
	for (int i = 0; list[i]; i++) {
		const struct kiln_plugin *p = list[i];
		if (p->abi_major != KILN_ABI_MAJOR) {
			file_error(f, reg_dupf("plugin '%s' was built for ABI %u.%u, this kiln is ABI %d.%d; rebuild it against this kiln's headers",
					   p->name ? p->name : "?", p->abi_major, p->abi_minor,
					   KILN_ABI_MAJOR, KILN_ABI_MINOR));
			continue;
		}
		/* A newer minor may have grown a struct the core allocates and
		 * the plugin fills (kiln_source_info.classes_from, 2.21): the
		 * plugin would write past this core's copy.  An older minor is
		 * safe (it writes less; the core zeroes and checks versions). */
		if (p->abi_minor > KILN_ABI_MINOR) {
			file_error(f, reg_dupf("plugin '%s' was built for ABI %u.%u, newer than this kiln's ABI %d.%d; rebuild it against this kiln's headers or use a kiln of ABI %u.%u or later",
					   p->name ? p->name : "?", p->abi_major, p->abi_minor,
					   KILN_ABI_MAJOR, KILN_ABI_MINOR, p->abi_major, p->abi_minor));
			continue;
		}
		if (!p->name || !p->ops || p->kind < KILN_PLUGIN_DEVICE || p->kind > KILN_PLUGIN_LAYER) {
			file_error(f, reg_dupf("descriptor %d is malformed (name, kind or ops missing)", i));
			continue;
		}
		kiln_status st = add_plugin(reg, p, idx);
		if (st)
			return st;
		reg->files[idx].n_plugins++;
	}
	return KILN_OK;
}


/* Load file kiln-<name>.so, if there is one not yet tried. */
static kiln_status load_named(struct kiln_registry *reg, const char *name)
{
	char want[300];
	snprintf(want, sizeof want, "kiln-%s.so", name);
	for (int i = 0; i < reg->n_files; i++) {
		const char *s = strrchr(reg->files[i].path, '/');
		if (!strcmp(s ? s + 1 : reg->files[i].path, want))
			return load_file(reg, i);
	}
	return KILN_OK;
}

/* Load every file not yet tried, each probed in a child first. */
static kiln_status load_all(struct kiln_registry *reg)
{
	reg_probe_files(reg);
	for (int i = 0; i < reg->n_files; i++) {
		kiln_status st;
		if (!reg->files[i].tried && (st = load_file(reg, i)))
			return st;
	}
	return KILN_OK;
}

/* Load the files the probe says provide a plugin called name (kind < 0:
 * of any kind). */
static kiln_status load_providers(struct kiln_registry *reg, int kind, const char *name)
{
	char want[300];
	reg_probe_files(reg);
	snprintf(want, sizeof want, ":%s\n", name);
	for (int i = 0; i < reg->n_files; i++) {
		const char *p = reg->files[i].provides;
		kiln_status st;
		for (const char *hit = p ? strstr(p, want) : NULL; hit; hit = strstr(hit + 1, want)) {
			const char *line = hit;
			while (line > p && line[-1] != '\n')
				line--;
			if ((kind < 0 || atoi(line) == kind) && (st = load_file(reg, i)))
				return st;
		}
	}
	return KILN_OK;
}

static int plugin_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static kiln_status scan_dir(struct kiln_registry *reg, const char *dir)
{
	DIR *d = opendir(dir);
	/* a missing directory is normal; no memory for the DIR is not (it
	 * left every plugin of the directory out: "no source plugin named
	 * 'idx'", a config error, before session 37) */
	if (!d && errno == ENOMEM)
		return kiln_error(KILN_ENOMEM, "out of memory listing plugin directory %s", dir);
	if (!d)
		return KILN_OK;
	char **names = NULL;
	int n = 0;
	struct dirent *de;
	kiln_status st = KILN_OK;
	while (!st && (de = readdir(d))) {
		size_t len = strlen(de->d_name);
		if (len < 9 || strncmp(de->d_name, "kiln-", 5) || strcmp(de->d_name + len - 3, ".so"))
			continue;
		/* out of memory: an error, not a plugin left out in silence
		 * (a NULL name reached strcmp before session 34) */
		char **nn = realloc(names, (size_t)(n + 1) * sizeof *nn);
		if (nn)
			names = nn;
		if (!nn || !(names[n] = kiln_strdup(de->d_name)))
			st = kiln_error(KILN_ENOMEM, "out of memory listing plugin directory %s", dir);
		else
			n++;
	}
	closedir(d);
	/* (no kiln-*.so there: names is NULL, which qsort must not get even
	 * for 0 elements; UBSan said so before session 34) */
	if (n > 1)
		qsort(names, (size_t)n, sizeof *names, plugin_name_cmp);
	for (int i = 0; i < n; i++) {
		if (!st && !has_file(reg, names[i])) {
			char path[PATH_MAX];
			snprintf(path, sizeof path, "%s/%s", dir, names[i]);
			st = add_file(reg, path);
		}
		free(names[i]);
	}
	free(names);
	return st;
}

kiln_status kiln_registry_open(const char *plugin_path, struct kiln_registry **out)
{
	if (!out)
		return kiln_null_arg("kiln_registry_open", "out");
	struct kiln_registry *reg = calloc(1, sizeof *reg);
	kiln_status st;
	*out = NULL;
	/* before any plugin brings libgomp in: kiln's OpenMP waiting for a
	 * program that embeds kiln as for the CLI (common/spin_rule.h) */
	common_omp_env_defaults();
	if (!reg)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = add_path(reg, plugin_path)) || (st = add_path(reg, getenv("KILN_PLUGIN_PATH"))))
		goto fail;
#ifdef KILN_BUILD_PLUGINDIR
	if (running_from_build_tree() &&
	    (st = add_dir(reg, KILN_BUILD_PLUGINDIR, strlen(KILN_BUILD_PLUGINDIR))))
		goto fail;
#endif
#ifdef KILN_PKGLIBDIR
	if ((st = add_dir(reg, KILN_PKGLIBDIR, strlen(KILN_PKGLIBDIR))))
		goto fail;
#endif
	for (int i = 0; kiln_builtin_layers[i]; i++)
		if ((st = add_plugin(reg, kiln_builtin_layers[i], -1)))
			goto fail;
	for (int i = 0; kiln_builtin_optims[i]; i++)
		if ((st = add_plugin(reg, kiln_builtin_optims[i], -1)))
			goto fail;
	for (int i = 0; i < reg->n_dirs; i++)
		if ((st = scan_dir(reg, reg->dirs[i])))
			goto fail;
	*out = reg;
	return KILN_OK;
fail:
	kiln_registry_close(reg);
	return st;
}

void kiln_registry_close(struct kiln_registry *reg)
{
	if (!reg)
		return;
	for (int i = 0; i < reg->n_dirs; i++)
		free(reg->dirs[i]);
	for (int i = 0; i < reg->n_files; i++) {
		/* Handles stay open: plugin code may still be referenced by
		 * objects (log sinks, atexit handlers of their libraries) and
		 * unloading libraries like oneDNN mid-process is unsafe. */
		free(reg->files[i].path);
		free(reg->files[i].error);
		free(reg->files[i].provides);
	}
	for (int i = 0; i < reg->n_exiting; i++)
		while (waitpid(reg->exiting[i], NULL, 0) < 0 && errno == EINTR)
			;
	free(reg->exiting);
	free(reg->dirs);
	free(reg->files);
	free(reg->plugins);
	free(reg);
}

int kiln_registry_has_file(const struct kiln_registry *reg, const char *base)
{
	return has_file(reg, base);
}

const char *kiln_registry_plugin_file(const struct kiln_registry *reg, const struct kiln_plugin *p)
{
	for (int i = 0; reg && i < reg->n_plugins; i++)
		if (reg->plugins[i].p == p)
			return reg->plugins[i].file < 0 ? NULL : reg->files[reg->plugins[i].file].path;
	return NULL;
}

int kiln_registry_dir_count(const struct kiln_registry *reg) { return reg ? reg->n_dirs : 0; }
const char *kiln_registry_dir(const struct kiln_registry *reg, int i)
{
	return reg && i >= 0 && i < reg->n_dirs ? reg->dirs[i] : NULL;
}

/* Listing every file or plugin loads them all (lookups are lazy). */
int kiln_registry_file_count(const struct kiln_registry *reg)
{
	if (!reg)
		return 0;
	load_all((struct kiln_registry *)reg);
	return reg->n_files;
}
void kiln_registry_file_get(const struct kiln_registry *reg, int i, struct kiln_plugin_file *o)
{
	if (!o)
		return;
	if (!reg || i < 0 || i >= reg->n_files) {
		memset(o, 0, sizeof *o); /* (documented) */
		return;
	}
	o->path = reg->files[i].path;
	o->error = reg->files[i].error;
	o->n_plugins = reg->files[i].n_plugins;
}

int kiln_registry_plugin_count(const struct kiln_registry *reg)
{
	if (!reg)
		return 0;
	load_all((struct kiln_registry *)reg);
	return reg->n_plugins;
}

int kiln_registry_loaded_count(const struct kiln_registry *reg) { return reg ? reg->n_plugins : 0; }
/* Into an info of this library's size, copied into the caller's as far as
 * its size goes (kiln/kiln.h, "Structs the library fills"). */
kiln_status kiln_registry_plugin_get(const struct kiln_registry *reg, int i,
				     struct kiln_plugin_info *out)
{
	kiln_status st = kiln_sized_check(out, "kiln_registry_plugin_get", "kiln_plugin_info",
					  "KILN_PLUGIN_INFO_INIT");
	if (st)
		return st;
	if (!reg)
		return kiln_null_arg("kiln_registry_plugin_get", "reg");
	if (i < 0 || i >= reg->n_plugins)
		return kiln_error(KILN_EINVAL, "kiln_registry_plugin_get: index %d out of range [0, %d)",
				  i, reg->n_plugins);
	const struct reg_plugin *r = &reg->plugins[i];
	const struct kiln_plugin_info o = {
		.size = sizeof o,
		.file = r->file < 0 ? "(built-in)" : reg->files[r->file].path,
		.kind = r->p->kind,
		.name = r->p->name,
		.summary = r->p->summary ? r->p->summary : "",
		.abi_major = r->p->abi_major,
		.abi_minor = r->p->abi_minor,
		.available = r->available,
		.why = r->why,
		.keys = r->p->keys,
		.desc = r->p,
	};
	kiln_sized_out(out, &o, sizeof o);
	return KILN_OK;
}

/* Is a plugin of kind called name registered (available or not)? */
static int registered(const struct kiln_registry *reg, int kind, const char *name)
{
	for (int i = 0; i < reg->n_plugins; i++)
		if ((kind < 0 || reg->plugins[i].p->kind == kind) && !strcmp(reg->plugins[i].p->name, name))
			return 1;
	return 0;
}

/* Load what may hold a plugin called name (kind < 0: any): kiln-<name>.so,
 * then, when that has none, every file (probed). */
static kiln_status load_for(const struct kiln_registry *creg, int kind, const char *name)
{
	struct kiln_registry *reg = (struct kiln_registry *)creg;
	kiln_status st;
	if (registered(reg, kind, name))
		return KILN_OK;
	if ((st = load_named(reg, name)) || registered(reg, kind, name))
		return st;
	return load_providers(reg, kind, name);
}

/* The files on the path that failed to load, with why as `kiln plugins`
 * says it, into buf ("" when none). */
static void failed_files(const struct kiln_registry *reg, char *buf, size_t n)
{
	size_t off = 0;
	buf[0] = 0;
	for (int i = 0; i < reg->n_files && off < n; i++)
		if (reg->files[i].error && !reg->files[i].n_plugins)
			off += (size_t)snprintf(buf + off, n - off, "%s%s: %s",
						off ? "; " : "; it may be in a file that failed to load: ",
						reg->files[i].path, reg->files[i].error);
}

/* The file kiln-NAME.so that failed to load (its error set): its index
 * in reg->files, or -1. */
static int named_file_failed(const struct kiln_registry *reg, const char *name)
{
	char want[300];
	snprintf(want, sizeof want, "kiln-%s.so", name);
	for (int i = 0; i < reg->n_files; i++) {
		const char *s = strrchr(reg->files[i].path, '/');
		if (reg->files[i].error && !strcmp(s ? s + 1 : reg->files[i].path, want))
			return i;
	}
	return -1;
}

/* No plugin of kind called name (the others of the kind: names, NULL for
 * none), after every file was tried: why.  A file that failed for lack of
 * memory may have held it (KILN_ENOMEM: before session 37 that was "no
 * such plugin", a config error); a file of the expected name that failed
 * to load explains why; else every file that failed to load is named, as
 * any may have held it (the sources live in kiln-loaders.so: before
 * session 37 a junk kiln-loaders.so was "no source plugin named 'idx'
 * (available: none)" and no word of the file). */
static kiln_status not_found(const struct kiln_registry *reg, int kind, const char *name,
			     const char *names)
{
	for (int i = 0; i < reg->n_files; i++)
		if (reg->files[i].oom && !reg->files[i].n_plugins)
			return kiln_error(KILN_ENOMEM, "out of memory loading plugin file %s (looking for %s plugin '%s')%s%s",
					  reg->files[i].path, kiln_plugin_kind_name(kind), name,
					  reg->files[i].error ? ": " : "",
					  reg->files[i].error ? reg->files[i].error : "");
	const int i = named_file_failed(reg, name);
	if (i >= 0)
		return kiln_error(KILN_EPLUGIN, "%s plugin '%s': %s: %s", kiln_plugin_kind_name(kind),
				  name, reg->files[i].path, reg->files[i].error);
	char sug[100], failed[1500];
	failed_files(reg, failed, sizeof failed);
	return kiln_error(KILN_ENOTFOUND, "no %s plugin named '%s'%s (available: %s; run `kiln plugins`)%s",
			  kiln_plugin_kind_name(kind), name,
			  kiln_suggest_choice(name, names ? names : "", sug, sizeof sug),
			  names ? names : "none", failed);
}

kiln_status kiln_registry_find(const struct kiln_registry *reg, int kind, const char *name,
			       const struct kiln_plugin **out)
{
	if (!reg || !name || !out)
		return kiln_null_arg("kiln_registry_find", !reg ? "reg" : !name ? "name" : "out");
	kiln_status st = load_for(reg, kind, name);
	if (st)
		return st;
	/* not found: every file loaded (that the probe survived), so the
	 * message lists all there are */
	if (!registered(reg, kind, name) && (st = load_all((struct kiln_registry *)reg)))
		return st;
	char names[1024] = "";
	size_t off = 0;
	const struct reg_plugin *unavail = NULL;
	for (int i = 0; i < reg->n_plugins; i++) {
		const struct reg_plugin *r = &reg->plugins[i];
		if (r->p->kind != kind)
			continue;
		if (!strcmp(r->p->name, name)) {
			if (r->available) {
				*out = r->p;
				return KILN_OK;
			}
			if (!unavail)
				unavail = r;
			continue;
		}
		if (off < sizeof names)
			off += (size_t)snprintf(names + off, sizeof names - off, "%s%s",
						off ? ", " : "", r->p->name);
	}
	if (unavail)
		return kiln_error(KILN_EPLUGIN, "%s plugin '%s' (%s) is not available here: %s",
				  kiln_plugin_kind_name(kind), name,
				  unavail->file < 0 ? "built-in" : reg->files[unavail->file].path,
				  unavail->why);
	return not_found(reg, kind, name, off ? names : NULL);
}

/* ---- schema extensions ------------------------------------------------ */

kiln_status kiln_config_ext_schema(const struct kiln_config *cfg,
				   const struct kiln_registry *reg, const char *section,
				   const struct kiln_key **ext)
{
	const struct kiln_plugin *p = NULL;
	kiln_status st;
	*ext = NULL;
	if (!strncmp(section, "layer.", 6)) {
		const char *type = kiln_config_get(cfg, section, "type");
		char note[300];
		if (!type)
			return kiln_error(KILN_ECONFIG, "%s: [%s] has no 'type' key%s",
					  kiln_config_where(cfg, section, NULL), section,
					  kiln_config_unset_note(cfg, section, note, sizeof note));
		if ((st = kiln_registry_find(reg, KILN_PLUGIN_LAYER, type, &p)))
			return kiln_error_wrap(KILN_ECONFIG, "%s: [%s]",
					       kiln_config_where(cfg, section, "type"), section);
	} else if (!strcmp(section, "data") || !strcmp(section, "data.eval") ||
		   !strcmp(section, "data.val")) {
		const char *src = kiln_config_get(cfg, section, "source");
		if (!src)
			return KILN_OK;
		if ((st = kiln_registry_find(reg, KILN_PLUGIN_SOURCE, src, &p)))
			return kiln_error_wrap(st == KILN_ENOTFOUND ? KILN_ECONFIG : st, "%s: [%s] source",
					       kiln_config_where(cfg, section, "source"), section);
	} else if (!strcmp(section, "train")) {
		/* the selected optimizer's keys ([train] optimizer); without a
		 * registry, a built-in's (a plugin's are checked once there
		 * is one) */
		if (!reg) {
			const char *name = kiln_config_get(cfg, "train", "optimizer");
			for (int i = 0; kiln_builtin_optims[i] && !p; i++)
				if (name && !strcmp(kiln_builtin_optims[i]->name, name))
					p = kiln_builtin_optims[i];
			*ext = p ? p->keys : NULL;
			return KILN_OK;
		}
		if ((st = kiln_optim_find(cfg, reg, &p)))
			return st;
	} else if (!strncmp(section, "plugin.", 7)) {
		const char *name = section + 7;
		if ((st = load_for(reg, -1, name)))
			return st;
		static const int kinds[] = { KILN_PLUGIN_DEVICE, KILN_PLUGIN_COMM,
					     KILN_PLUGIN_PRECISION, KILN_PLUGIN_OPTIM };
		for (size_t i = 0; i < KILN_ARRAY_LEN(kinds) && !p; i++)
			for (int j = 0; j < reg->n_plugins; j++)
				if (reg->plugins[j].p->kind == kinds[i] &&
				    !strcmp(reg->plugins[j].p->name, name)) {
					p = reg->plugins[j].p;
					break;
				}
		/* kiln-NAME.so that failed to load says why (kiln-cpu.so's
		 * libraries unmapped under a small ulimit -v: before session 41
		 * "no ... plugin named 'cpu'", a config error) */
		const int f = p ? -1 : named_file_failed(reg, name);
		if (f >= 0)
			return kiln_error(reg->files[f].oom ? KILN_ENOMEM : KILN_EPLUGIN, "%s: [%s]: %s: %s",
					  kiln_config_where(cfg, section, NULL), section,
					  reg->files[f].path, reg->files[f].error);
		if (!p)
			return kiln_error(KILN_ECONFIG,
					  "%s: [%s]: no device, comm, precision or optim plugin named '%s' (run `kiln plugins`)",
					  kiln_config_where(cfg, section, NULL), section, name);
	} else {
		return KILN_OK;
	}
	*ext = p->keys;
	return KILN_OK;
}
