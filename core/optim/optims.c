/* core/optim/optims.c - the table of built-in optimizers.  Each entry is
 * the descriptor its file defines, the same shape an optim plugin returns;
 * `[train] optimizer = NAME` finds either through the registry. */
#include "../internal.h"

extern const struct kiln_plugin kiln_optim_sgd, kiln_optim_adam, kiln_optim_adamw,
	kiln_optim_lamb;

const struct kiln_plugin *const kiln_builtin_optims[] = {
	&kiln_optim_sgd,
	&kiln_optim_adam,
	&kiln_optim_adamw,
	&kiln_optim_lamb,
	NULL
};

/* The row of `key` in any built-in optimizer's keys, or NULL: [train]
 * accepts (and checks) these whatever the optimizer, as it did when they
 * were all [train] keys, so a config may keep `momentum` beside
 * `optimizer = adamw` (an unused key, as before; warned of since session
 * 40: run_config.c optim_keys_warn). */
const struct kiln_key *kiln_optim_any_key(const char *key)
{
	for (int i = 0; kiln_builtin_optims[i]; i++)
		for (const struct kiln_key *k = kiln_builtin_optims[i]->keys; k && k->name; k++)
			if (!strcmp(k->name, key))
				return k;
	return NULL;
}
