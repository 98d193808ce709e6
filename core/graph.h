/* core/graph.h - the model (layers + flat parameter buffers) and its plans
 * (one per batch size and mode, each with its own activation arena). */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "internal.h"

#define KILN_MAX_LAYERS 1024

struct model_layer {
	char *name;    /* "fc1" */
	char *section; /* "layer.fc1" */
	const struct kiln_plugin *type;
	int n_in;
	int in[KILN_LAYER_MAX_INPUTS]; /* producer index, -1 = the data */
	int trainable;
	int first_param, n_params;
};

struct model_param {
	char name[160];               /* "fc1.weight" */
	struct kiln_tensor_desc desc;
	int init;
	int64_t fan_in;
	int layer;
	int trainable;
	size_t off;                   /* elements into the flat buffers */
	int64_t numel;
};

struct kiln_model {
	const struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_tensor_desc sample; /* one sample, no batch dim */
	int n_layers;
	struct model_layer *layers;
	int loss_layer;
	int n_params;
	struct model_param *params;
	size_t n_elems;      /* all parameters */
	size_t n_trainable;  /* leading elements the optimizer updates */
	float *params_d, *grads_d, *momentum_d;
	/* optimizer */
	void *sgd_plan;
	size_t sgd_ws;
};

struct plan_node {
	struct kiln_layer l;
	const struct kiln_layer_ops *ops;
	int ystore;  /* storage of the output; -1 = the data input, -2 = none */
	int gstore;  /* storage of the output's gradient; -2 = none */
	int dx_accum[KILN_LAYER_MAX_INPUTS];
	int dx_on[KILN_LAYER_MAX_INPUTS];
	int planned;
};

struct storage {
	size_t bytes, off;
	int start, end;   /* schedule positions, inclusive */
};

struct kiln_plan {
	struct kiln_model *m;
	int64_t batch;
	int training;
	struct plan_node *nodes;
	int n_store;
	struct storage *store;
	size_t arena_bytes, ws_bytes;
	void *arena, *ws;
};

#endif
