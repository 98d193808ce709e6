/* core/layers/tanh.c - y = tanh(x). */
#include "act.h"

ACT_LAYER(tanh, "tanh", KILN_ACT_TANH, "hyperbolic tangent", NULL);
