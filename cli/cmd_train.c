/* cli/cmd_train.c - `kiln train` (placeholder until the trainer lands). */
#include "build-config.h"
#include "cli.h"
#include <stdio.h>
int cmd_train(int argc, char **argv)
{
	(void)argc; (void)argv;
	fprintf(stderr, "kiln train: not implemented yet\n");
	return 1;
}
