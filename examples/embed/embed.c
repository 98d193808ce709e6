/* examples/embed/embed.c - classify one image with a trained kiln model,
 * through the inference API alone (include/kiln/infer.h, docs/inference.md).
 *
 *   cc examples/embed/embed.c $(pkg-config --cflags --libs kiln) -lm -o embed
 *   ./embed CONFIG WEIGHTS IMAGE.pgm|IMAGE.ppm
 *
 * WEIGHTS: a checkpoint of `kiln train` or a safetensors file of `kiln
 * export`.  The image is a binary PGM (gray) or PPM (RGB) file, 8 bits: a
 * format simple enough to read here, so the example needs no image library
 * (`kiln predict` reads JPEG and PNG).  It is transformed as the config's
 * [data.eval] says and classified; prints "class INDEX prob P".  (-lm: its
 * softmax calls exp(); libkiln's own -lm is not a program's.  tests/embed.sh
 * runs the command above as written.)
 */
#include <kiln/infer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* A binary PGM (P5) or PPM (P6) with maxval 255 into img. */
static int read_pnm(const char *path, struct kiln_image *img)
{
	FILE *f = fopen(path, "rb");
	char magic[3] = { 0 };
	int w, h, maxval;
	if (!f || fscanf(f, "%2s %d %d %d", magic, &w, &h, &maxval) != 4 || magic[0] != 'P' ||
	    (magic[1] != '5' && magic[1] != '6') || w <= 0 || h <= 0 || w > 65536 || h > 65536 ||
	    maxval != 255 || fgetc(f) == EOF) {
		fprintf(stderr, "%s: not an 8-bit binary PGM or PPM image\n", path);
		if (f)
			fclose(f);
		return -1;
	}
	img->h = h;
	img->w = w;
	img->c = magic[1] == '5' ? 1 : 3;
	img->cap = (size_t)h * (size_t)w * (size_t)img->c;
	img->data = malloc(img->cap);
	size_t got = img->data ? fread(img->data, 1, img->cap, f) : 0;
	fclose(f);
	if (got != img->cap) {
		fprintf(stderr, "%s: truncated (%zu of %zu pixel bytes)\n", path, got, img->cap);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct kiln_infer *model;
	struct kiln_image img = { 0 };
	char *err;
	if (argc != 4) {
		fprintf(stderr, "usage: %s CONFIG WEIGHTS IMAGE.pgm\n", argv[0]);
		return 2;
	}
	kiln_log_set_level(KILN_LOG_WARN);
	if (kiln_model_load(argv[1], argv[2], NULL, &model, &err)) {
		fprintf(stderr, "error: %s\n", err ? err : "out of memory");
		free(err);
		return 1;
	}
	size_t classes = kiln_infer_output_elems(model);
	void *x = malloc(kiln_infer_input_bytes(model));
	float *logits = malloc(classes * sizeof *logits);
	int rc = 1;
	if (x && logits && read_pnm(argv[3], &img) == 0) {
		if (kiln_infer_image(model, &img, argv[3], x) || kiln_infer(model, x, 1, logits)) {
			fprintf(stderr, "error: %s\n", kiln_last_error());
		} else {
			size_t best = 0;
			double sum = 0;
			for (size_t c = 0; c < classes; c++)
				best = logits[c] > logits[best] ? c : best;
			for (size_t c = 0; c < classes; c++)
				sum += exp(logits[c] - logits[best]);
			printf("class %zu prob %.6f\n", best, 1 / sum);
			rc = 0;
		}
	}
	free(img.data);
	free(x);
	free(logits);
	kiln_infer_free(model);
	return rc;
}
