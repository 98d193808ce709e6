/* core/layers/gelu.c - y = x * Phi(x), the exact (erf) GELU, PyTorch's
 * default; `approximate = tanh` gives GPT-2's tanh approximation
 * (nn.GELU(approximate='tanh')). */
#include "act.h"

static const struct kiln_key gelu_keys[] = {
	{ "approximate", KILN_KEY_ENUM, "none", 0, 0, "none|tanh",
	  "`none`: the exact erf form; `tanh`: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's (nn.GELU(approximate))." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

ACT_LAYER(gelu, "gelu", KILN_ACT_GELU, "GELU, exact erf form: y = x * Phi(x), or its tanh approximation",
	  gelu_keys);
