/* core/optim/optims.c - the table of built-in optimizers.  Each entry is
 * the descriptor its file defines, the same shape an optim plugin returns;
 * `[train] optimizer = NAME` finds either through the registry. */
#include "../internal.h"

extern const struct kiln_plugin kiln_optim_sgd, kiln_optim_adamw, kiln_optim_lamb;

const struct kiln_plugin *const kiln_builtin_optims[] = {
	&kiln_optim_sgd,
	&kiln_optim_adamw,
	&kiln_optim_lamb,
	NULL
};
