/* core/layers/gelu.c - y = x * Phi(x), the exact (erf) GELU, PyTorch's default. */
#include "act.h"

ACT_LAYER(gelu, "gelu", KILN_ACT_GELU, "GELU, exact erf form: y = x * Phi(x)", NULL);
