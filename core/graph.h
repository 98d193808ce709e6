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
	int n_params;
	int pidx[KILN_LAYER_MAX_PARAMS]; /* model_param index of the layer's k-th */
};

struct model_param {
	char name[160];               /* "fc1.weight" */
	struct kiln_tensor_desc desc;
	int init;
	int64_t fan_in;
	int layer;
	int trainable;
	int buffer;                   /* 1: non-trained state, in the buffers region */
	int slot;                     /* k: the layer's k-th parameter */
	size_t off;                   /* elements into params (or buffers) */
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
	size_t n_buf_elems;  /* the buffers region (batchnorm running stats) */
	float *params_d, *grads_d, *momentum_d, *buffers_d;
	int layout;          /* KILN_NCHW or KILN_NHWC, from [model] layout */
	uint64_t seed;
	int64_t *step_d;     /* device i64[1]: micro-steps done (dropout's counter) */
	void *step_plan;     /* COUNTER_ADD of 1 */
	/* optimizer */
	void *sgd_plan;
	size_t sgd_ws;
};

struct plan_node {
	struct kiln_layer l;
	const struct kiln_layer_ops *ops;
	int ystore;  /* storage of the output; -1 = the data input, -2 = none */
	int gstore;  /* storage of the output's gradient; -2 = none */
	int sstore;  /* storage kept from forward to backward; -2 = none */
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
	int training, input_grad, keep_all;
	struct plan_node *nodes;
	int data_gstore;     /* gradient of the data input, -2 = none */
	int data_store;      /* storage of the reordered data input, -1 = x itself */
	void *in_reorder;    /* NCHW data -> NHWC arena copy, or NULL */
	struct kiln_tensor_desc data_desc; /* the data input as layers see it */
	int n_store;
	struct storage *store;
	size_t arena_bytes, ws_bytes;
	void *arena, *ws;
};

/* The model's training state as device buffers: what a checkpoint saves
 * and a resume restores.  Names are the checkpoint's section tags. */
struct kiln_state_buf {
	const char *name; /* static: "params", "buffers", "momentum", "step" */
	void *ptr;        /* device pointer (NULL when bytes is 0) */
	size_t bytes;
};
#define KILN_MAX_STATE_BUFS 16

/* Fill out[0..KILN_MAX_STATE_BUFS) with m's state buffers in a fixed order
 * and return their count.  Grads are not state (the first backward writes
 * them).  The optimizer-state issue replaces this list with
 * kiln_model_state_buffers(); a new state buffer is one more row here. */
int kiln_model_ckpt_buffers(const struct kiln_model *m, struct kiln_state_buf *out);

#endif
