/* placeholder */
#include <kiln/plugin.h>
