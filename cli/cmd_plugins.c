/* cli/cmd_plugins.c - `kiln plugins`: every plugin file found, and every
 * plugin in them, with kind, ABI and availability; then what each device
 * is (its traits: type, auto score, communicator) and what it computes
 * with. */
#include "build-config.h"
#include "cli.h"

#include <kiln/plugin.h> /* KILN_PROC_DESCRIBE, struct kiln_device_ops */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h> /* stat: path_note */

/* Every device plugin's traits, and what `device = auto` would open. */
static void print_devices(const struct kiln_registry *reg)
{
	const struct kiln_plugin *best = NULL;
	printf("\n%-10s %-6s %-5s %s\n", "DEVICE", "TYPE", "AUTO", "COMM (auto)");
	for (int i = 0; i < kiln_registry_plugin_count(reg); i++) {
		struct kiln_plugin_info p = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &p);
		if (p.kind != KILN_PLUGIN_DEVICE)
			continue;
		const struct kiln_device_traits *t =
			&((const struct kiln_device_ops *)p.desc->ops)->traits;
		printf("%-10s %-6s %-5d %s\n", p.name, kiln_device_type_name(t->type), t->auto_score,
		       t->comm ? t->comm : t->caps & KILN_DEVICE_HOST_MEMORY ? "mpi or gloo" : "-");
	}
	if (kiln_device_auto(reg, &best))
		kiln_clear_error();
	printf("device = auto opens: %s\n", best ? best->name : "(none available)");
}

const char cmd_plugins_usage[] =
	"usage: kiln plugins [--path DIR[:DIR...]]\n";
const char cmd_plugins_about[] =
	"List the directories searched, every kiln-*.so found (with the reason when it\n"
	"does not load), and every plugin: kind, name, ABI, available or why not.\n";

/* What is wrong with a search path entry, as " (does not exist)", or ""
 * for a directory: a KILN_PLUGIN_PATH or --path entry with a typo, or a
 * plugin file named instead of its directory, was listed like any other
 * (before session 36), and the plugin then missing said nothing of it. */
static const char *path_note(const char *dir)
{
	static char note[160];
	struct stat sb;
	if (!stat(dir, &sb))
		return S_ISDIR(sb.st_mode) ? "" : " (not a directory: name the directory that holds the plugins)";
	if (errno == ENOENT)
		return " (does not exist)";
	snprintf(note, sizeof note, " (%s)", strerror(errno));
	return note;
}

int cmd_plugins(int argc, char **argv)
{
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		const int r = cli_opt(argc, argv, &i, "--path", &path);
		if (r < 0)
			return 2;
		if (!r) {
			cli_bad_arg_usage(argc, argv, i, cmd_plugins_usage);
			fputs(cmd_plugins_usage, stderr);
			return 2;
		}
	}
	struct kiln_registry *reg;
	kiln_status st = kiln_registry_open(path, &reg);
	if (st)
		return cli_fail(st);
	printf("search path:\n");
	for (int i = 0; i < kiln_registry_dir_count(reg); i++)
		printf("  %s%s\n", kiln_registry_dir(reg, i), path_note(kiln_registry_dir(reg, i)));
	printf("\nfiles:\n");
	int nf = kiln_registry_file_count(reg);
	if (!nf)
		printf("  (none)\n");
	for (int i = 0; i < nf; i++) {
		struct kiln_plugin_file f;
		kiln_registry_file_get(reg, i, &f);
		if (f.error && !f.n_plugins)
			printf("  %s: NOT LOADED: %s\n", f.path, f.error);
		else if (f.error)
			printf("  %s: %d plugin(s); also: %s\n", f.path, f.n_plugins, f.error);
		else
			printf("  %s: %d plugin(s)\n", f.path, f.n_plugins);
	}
	printf("\n%-10s %-14s %-5s %-28s %s\n", "KIND", "NAME", "ABI", "STATUS", "SUMMARY");
	int n = kiln_registry_plugin_count(reg);
	for (int kind = KILN_PLUGIN_DEVICE; kind <= KILN_PLUGIN_LAYER; kind++)
		for (int i = 0; i < n; i++) {
			struct kiln_plugin_info p = KILN_PLUGIN_INFO_INIT;
			kiln_registry_plugin_get(reg, i, &p);
			if (p.kind != kind)
				continue;
			char abi[16], status[300];
			snprintf(abi, sizeof abi, "%u.%u", p.abi_major, p.abi_minor);
			if (p.available)
				snprintf(status, sizeof status, "available%s",
					 strcmp(p.file, "(built-in)") ? "" : " (built-in)");
			else
				snprintf(status, sizeof status, "unavailable: %s", p.why);
			printf("%-10s %-14s %-5s %-28s %s\n", kiln_plugin_kind_name(p.kind), p.name, abi,
			       status, p.summary);
		}
	print_devices(reg);
	/* what each available device computes with (the CPU device: the ISA
	 * oneDNN dispatches to), from its KILN_PROC_DESCRIBE extension; the
	 * table goes out first, the device may log while it opens */
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		struct kiln_plugin_info p = KILN_PLUGIN_INFO_INIT;
		struct kiln_device *dev;
		kiln_registry_plugin_get(reg, i, &p);
		if (p.kind != KILN_PLUGIN_DEVICE || !p.available ||
		    kiln_device_open(reg, NULL, p.name, 0, &dev))
			continue;
		const char *(*describe)(void) =
			(const char *(*)(void))kiln_device_proc(dev, KILN_PROC_DESCRIBE);
		if (describe)
			printf("\ndevice %s: %s\n", p.name, describe());
		kiln_device_close(dev);
	}
	kiln_registry_close(reg);
	return 0;
}
