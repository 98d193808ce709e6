/* core/layers/sigmoid.c - y = 1 / (1 + exp(-x)). */
#include "act.h"

ACT_LAYER(sigmoid, "sigmoid", KILN_ACT_SIGMOID, "logistic sigmoid: y = 1 / (1 + exp(-x))", NULL);
