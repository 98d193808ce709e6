kilninclude_HEADERS += include/kiln/kiln.h include/kiln/plugin.h include/kiln/tensor.h \
	include/kiln/config.h include/kiln/status.h include/kiln/dist.h include/kiln/ops.h
