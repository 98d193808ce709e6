/* core/dist_env.c - rank, world size and the store's address from the
 * environment of whatever started the process: `kiln launch` (KILN_*),
 * torchrun, Slurm's srun, Open MPI's mpirun (kiln/dist.h). */
#include "internal.h"
#include <kiln/dist.h>

#include <errno.h>
#include <stdio.h>

/* A non-negative integer variable: 1 set, 0 absent, -1 malformed. */
static int env_int(const char *name, int *out)
{
	const char *v = getenv(name);
	char *end;
	if (!v || !*v)
		return 0;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < 0 || x > 1 << 24)
		return -1;
	*out = (int)x;
	return 1;
}

struct scheme {
	const char *source, *rank, *world, *local_rank, *local_world;
};

static const struct scheme schemes[] = {
	{ "KILN_*", "KILN_RANK", "KILN_WORLD_SIZE", "KILN_LOCAL_RANK", "KILN_LOCAL_WORLD_SIZE" },
	{ "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" },
	{ "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE" },
	{ "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	  "OMPI_COMM_WORLD_LOCAL_SIZE" },
};

kiln_status kiln_dist_env_read(struct kiln_dist_env *e)
{
	if (!e)
		return kiln_null_arg("kiln_dist_env_read", "e");
	memset(e, 0, sizeof *e);
	e->world = e->local_world = 1;
	e->source = "none";
	for (size_t i = 0; i < KILN_ARRAY_LEN(schemes); i++) {
		const struct scheme *s = &schemes[i];
		int r, w;
		int hr = env_int(s->rank, &r), hw = env_int(s->world, &w);
		if (!hr && !hw)
			continue;
		if (hr < 0 || hw < 0)
			return kiln_error(KILN_EUSAGE, "%s='%s' is not a non-negative integer",
					  hr < 0 ? s->rank : s->world, getenv(hr < 0 ? s->rank : s->world));
		if (!hr || !hw)
			return kiln_error(KILN_EUSAGE, "%s is set but %s is not (%s sets both)",
					  hr ? s->rank : s->world, hr ? s->world : s->rank, s->source);
		if (w < 1 || r >= w)
			return kiln_error(KILN_EUSAGE, "%s=%d with %s=%d: the rank must be below the world size",
					  s->rank, r, s->world, w);
		e->rank = r;
		e->world = w;
		e->local_rank = r;
		e->local_world = w;
		if (env_int(s->local_rank, &e->local_rank) < 0)
			return kiln_error(KILN_EUSAGE, "%s='%s' is not a non-negative integer",
					  s->local_rank, getenv(s->local_rank));
		/* Slurm's SLURM_NTASKS_PER_NODE may read "2(x3)": keep what parses */
		int lw;
		const int hlw = env_int(s->local_world, &lw) > 0;
		if (hlw)
			e->local_world = lw;
		if (e->local_rank >= e->local_world) {
			char size[96];
			if (hlw)
				snprintf(size, sizeof size, "%s=%d", s->local_world, lw);
			else
				snprintf(size, sizeof size, "%s unset (taken as %s=%d)", s->local_world,
					 s->world, w);
			return kiln_error(KILN_EUSAGE, "%s=%d with %s: the local rank must be below the local world size (the ranks on this node; %s sets both)",
					  s->local_rank, e->local_rank, size, s->source);
		}
		e->source = s->source;
		break;
	}
	const char *addr = getenv("KILN_MASTER_ADDR");
	if (!addr || !*addr)
		addr = getenv("MASTER_ADDR");
	const char *from = getenv("KILN_MASTER_ADDR") && *getenv("KILN_MASTER_ADDR") ? "KILN_MASTER_ADDR" : "MASTER_ADDR";
	if (!addr || !*addr)
		addr = "127.0.0.1";
	size_t n = strlen(addr);
	/* an IPv6 address may come in brackets ("[::1]", as in a URL) */
	if (addr[0] == '[' && n >= 2 && addr[n - 1] == ']')
		addr++, n -= 2;
	if (!n || n >= sizeof e->master_addr || memchr(addr, '[', n) || memchr(addr, ']', n))
		return kiln_error(KILN_EUSAGE, "%s='%s' is not a host name or address (an IPv6 address alone or in brackets: ::1 or [::1])",
				  from, getenv(from));
	memcpy(e->master_addr, addr, n);
	e->master_addr[n] = 0;
	e->master_port = 29500;
	const char *pv = "KILN_MASTER_PORT";
	int h = env_int(pv, &e->master_port);
	if (!h) {
		pv = "MASTER_PORT";
		h = env_int(pv, &e->master_port);
	}
	if (h < 0 || (h > 0 && e->master_port > 65535))
		return kiln_error(KILN_EUSAGE, "%s='%s' is not a port number (0..65535)", pv, getenv(pv));
	return KILN_OK;
}
