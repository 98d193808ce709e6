EXTRA_DIST += docs/config.md docs/plugins.md docs/PERFORMANCE.md docs/design-notes.md docs/training.md \
	docs/formats.md docs/data.md docs/safetensors.md docs/profiler.md docs/checkpoints.md docs/memory.md \
	docs/precision.md docs/gpu.md docs/distributed.md \
	docs/report.md docs/report.png
EXTRA_DIST += docs/logging.md
EXTRA_DIST += docs/generate.md
EXTRA_DIST += docs/inference.md
EXTRA_DIST += docs/rnn.md
EXTRA_DIST += docs/pipeline.md docs/fuzzing.md
