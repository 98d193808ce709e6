/* core/pipe_stages.c - placement: which pipeline stage each layer runs on,
 * from [layer.X] stage or [model] stages, checked against the graph. */
#include "pipeline.h"
#include <ctype.h>

/* [layer.X] stage: each layer's own, else the previous layer's. */
static kiln_status stages_from_layers(struct kiln_model *m, int *stage, int *any)
{
	int64_t prev = 0;
	*any = 0;
	for (int i = 0; i < m->n_layers; i++) {
		int64_t s = prev;
		kiln_status st = kiln_config_get_int(m->cfg, m->layers[i].section, "stage", &s);
		if (st && st != KILN_ENOTFOUND)
			return st;
		if (!st)
			*any = 1;
		stage[i] = (int)s;
		prev = s;
	}
	return KILN_OK;
}

/* One name of [model] stages, trimmed, at *p up to the next ',' '|' or
 * the end: its layer index (KILN_ECONFIG when there is none). */
static kiln_status stage_name(struct kiln_model *m, const char **p, int *layer)
{
	const char *s = *p, *e;
	while (isspace((unsigned char)*s))
		s++;
	e = s;
	while (*e && *e != ',' && *e != '|')
		e++;
	*p = e;
	while (e > s && isspace((unsigned char)e[-1]))
		e--;
	char name[256];
	int n = (int)(e - s);
	if (n <= 0 || n >= (int)sizeof name)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: expected a layer name at '%s'",
				  kiln_config_where(m->cfg, "model", "stages"), s);
	memcpy(name, s, (size_t)n);
	name[n] = 0;
	if ((*layer = kiln_model_find_layer(m, m->n_layers, name)) < 0)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: no layer '%s'",
				  kiln_config_where(m->cfg, "model", "stages"), name);
	return KILN_OK;
}

/* [model] stages = first, last | first, last | ...: stage k runs layers
 * first..last; the groups tile the layers in file order. */
static kiln_status stages_from_model(struct kiln_model *m, const char *v, int *stage)
{
	const char *where = kiln_config_where(m->cfg, "model", "stages");
	const char *p = v;
	int next = 0, k = 0;
	kiln_status st;
	while (*p) {
		int first, last;
		if ((st = stage_name(m, &p, &first)))
			return st;
		last = first;
		if (*p == ',' && (++p, (st = stage_name(m, &p, &last))))
			return st;
		if (*p && *p != '|')
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: each stage is `first, last` (or one layer), stages separated by '|'",
					  where);
		if (*p)
			p++;
		if (first != next || last < first)
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: stage %d must run from layer '%s' (the one after the previous stage) to a later layer, in file order",
					  where, k, next < m->n_layers ? m->layers[next].name : "(none left)");
		if (k >= KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: [model] stages: more than %d stages", where,
					  KILN_PIPE_MAX_STAGES);
		for (int i = first; i <= last; i++)
			stage[i] = k;
		next = last + 1;
		k++;
	}
	if (next != m->n_layers)
		return kiln_error(KILN_ECONFIG, "%s: [model] stages: layer '%s' and those after it are in no stage",
				  where, m->layers[next].name);
	return KILN_OK;
}

/* Stages follow the layers' file order (a stage is a run of layers), none
 * is empty, and no layer reads a later stage's output. */
static kiln_status stages_check(struct kiln_model *m, const int *stage)
{
	for (int i = 0; i < m->n_layers; i++) {
		const char *where = kiln_config_where(m->cfg, m->layers[i].section, "stage");
		if (stage[i] < 0 || stage[i] >= KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s': stage %d is not in 0..%d",
					  where, m->layers[i].name, stage[i], KILN_PIPE_MAX_STAGES - 1);
		int prev = i ? stage[i - 1] : 0;
		if (stage[i] < prev || stage[i] > prev + 1)
			return kiln_error(KILN_ECONFIG, "%s: layer '%s' is on stage %d after a layer on stage %d: stages must follow the layers' file order, each next stage one more",
					  where, m->layers[i].name, stage[i], prev);
		for (int k = 0; k < m->layers[i].n_in; k++) {
			int src = m->layers[i].in[k];
			if (src >= 0 && stage[src] > stage[i])
				return kiln_error(KILN_ECONFIG, "%s: layer '%s' (stage %d) reads '%s' of a later stage (%d)",
						  where, m->layers[i].name, stage[i],
						  m->layers[src].name, stage[src]);
		}
	}
	return KILN_OK;
}

kiln_status kiln_pipe_read_stages(struct kiln_model *m)
{
	const char *v = kiln_config_get(m->cfg, "model", "stages");
	int *stage = calloc((size_t)(m->n_layers ? m->n_layers : 1), sizeof(int));
	int any = 0;
	kiln_status st;
	free(m->stage);
	m->stage = NULL;
	m->n_stages = 1;
	if (!stage)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = stages_from_layers(m, stage, &any)))
		goto fail;
	if (v && *v) {
		if (any) {
			st = kiln_error(KILN_ECONFIG, "%s: [model] stages and [layer.X] stage both place layers: use one",
					kiln_config_where(m->cfg, "model", "stages"));
			goto fail;
		}
		if ((st = stages_from_model(m, v, stage)))
			goto fail;
	}
	if ((st = stages_check(m, stage)))
		goto fail;
	int P = m->n_layers ? stage[m->n_layers - 1] + 1 : 1;
	if (P == 1) {
		free(stage);
		return KILN_OK;
	}
	m->stage = stage;
	m->n_stages = P;
	return KILN_OK;
fail:
	free(stage);
	return st;
}
