/* plugins/cpu/team_verdicts.c - what dnnteam.c's probes found, kept for
 * the device context: for an op (cpu_op_key), the plan's kernel and
 * implementation and a smaller team, whether oneDNN's version for that
 * team gives the opening team's bytes.
 *
 * Kept: at most CPU_TEAM_VERDICTS of them (the oldest goes first), found
 * by a hash of their key bytes (FNV-1a, CPU_TEAM_VERDICT_BUCKETS chains).
 * Each holds a struct kiln_op (about 1 KB): before session 42 the list
 * had no cap, was searched from its head under the context's lock on
 * every new plan's version, and grew by each op, row count and team a
 * process met (a server passing each request's own row count: one key a
 * size).  A probe that could not run for want of memory is kept not at
 * all: before, it was kept as "other bytes", and every later plan of the
 * op stayed on the opening team without a probe that might have
 * succeeded.  A kernel's own failure is a verdict, "other bytes", kept
 * (cpu_team_probe_failed): it would fail again on every new plan.
 *
 * The caller holds the context's lock around each call (dnnteam.c).
 */
#include "cpu.h"

#include <stddef.h> /* offsetof */
#include <stdlib.h>
#include <string.h>

/* The bytes of a verdict that key it: key .. busy */
#define VERDICT_FROM offsetof(struct cpu_team_verdict, key)
#define VERDICT_LEN (offsetof(struct cpu_team_verdict, same) - VERDICT_FROM)

int cpu_team_probe_failed(kiln_status st) { return st == KILN_ENOMEM ? -1 : 0; }

void cpu_team_verdict_hash(struct cpu_team_verdict *k)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
	const unsigned char *b = (const unsigned char *)k + VERDICT_FROM;
	for (size_t i = 0; i < VERDICT_LEN; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	k->hash = h;
}

static int verdict_match(const struct cpu_team_verdict *a, const struct cpu_team_verdict *b)
{
	return a->hash == b->hash &&
	       !memcmp((const char *)a + VERDICT_FROM, (const char *)b + VERDICT_FROM, VERDICT_LEN);
}

static struct cpu_team_verdict **chain_of(struct cpu_team_verdicts *vs, uint64_t hash)
{
	return &vs->bucket[(hash ^ hash >> 32) % CPU_TEAM_VERDICT_BUCKETS];
}

int cpu_team_verdict_find(struct cpu_team_verdicts *vs, const struct cpu_team_verdict *k)
{
	for (const struct cpu_team_verdict *x = *chain_of(vs, k->hash); x; x = x->next)
		if (verdict_match(x, k))
			return x->same;
	return -1;
}

/* The oldest verdict unchained and freed. */
static void drop_oldest(struct cpu_team_verdicts *vs)
{
	struct cpu_team_verdict *x = vs->oldest, **at = chain_of(vs, x->hash);
	while (*at != x)
		at = &(*at)->next;
	*at = x->next;
	vs->oldest = x->newer;
	if (!vs->oldest)
		vs->newest = NULL;
	vs->n--;
	free(x);
}

void cpu_team_verdict_keep(struct cpu_team_verdicts *vs, const struct cpu_team_verdict *k,
			   int same)
{
	if (same < 0 || cpu_team_verdict_find(vs, k) >= 0)
		return; /* a probe that did not run; or kept already */
	struct cpu_team_verdict *x = malloc(sizeof *x);
	if (!x)
		return; /* the next plan probes */
	memcpy(x, k, sizeof *x); /* padding too: verdict_match compares bytes */
	x->same = same;
	if (vs->n >= CPU_TEAM_VERDICTS)
		drop_oldest(vs);
	struct cpu_team_verdict **at = chain_of(vs, x->hash);
	x->next = *at;
	*at = x;
	x->newer = NULL;
	if (vs->newest)
		vs->newest->newer = x;
	else
		vs->oldest = x;
	vs->newest = x;
	vs->n++;
}

void cpu_team_verdicts_clear(struct cpu_team_verdicts *vs)
{
	while (vs->oldest)
		drop_oldest(vs);
}
