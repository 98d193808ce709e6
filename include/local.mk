kilninclude_HEADERS += include/kiln/kiln.h include/kiln/plugin.h include/kiln/tensor.h \
	include/kiln/config.h include/kiln/status.h include/kiln/dist.h include/kiln/ops.h
# resizing images as PIL does (the transforms; kiln pack --resize)
kilninclude_HEADERS += include/kiln/image.h
# the inference API (docs/inference.md)
kilninclude_HEADERS += include/kiln/infer.h
