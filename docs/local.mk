EXTRA_DIST += docs/config.md docs/plugins.md docs/PERFORMANCE.md docs/design-notes.md \
	docs/formats.md docs/data.md docs/checkpoints.md
