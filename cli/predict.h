/* cli/predict.h - the pieces of `kiln predict` (cli/cmd_predict.c):
 * its inputs and class names (cli/predict_inputs.c). */
#ifndef KILN_CLI_PREDICT_H
#define KILN_CLI_PREDICT_H

#include <kiln/kiln.h>
#include <kiln/infer.h>

/* A list of malloc()ed strings. */
struct pred_names {
	char **v;
	size_t n, cap;
};
void pred_names_free(struct pred_names *l);

/* The image files of the INPUT arguments: a file as given, a folder's
 * .jpg/.jpeg/.png files below it (sorted by path).  KILN_EUSAGE for a
 * missing path or an image-less folder. */
kiln_status pred_list_inputs(char **inputs, int n, struct pred_names *files);

/* The class names when [data.eval] source = folder (its class
 * directories, sorted); else none (the classes are their indices). */
kiln_status pred_class_names(const struct kiln_config *cfg, struct pred_names *names);

/* Read and decode image file `path` into img, and transform it into one
 * input sample at x (kiln_infer_image).  Errors name the file. */
kiln_status pred_load_image(struct kiln_infer *m, const char *path, int64_t max_pixels,
			    struct kiln_image *img, void *x);

/* pred_load_image of paths[0..rows) into rows consecutive samples at x,
 * on up to `threads` threads (each its own rows: i, i + threads, ...);
 * the error is the first failing file's, as one thread would report. */
kiln_status pred_load_images(struct kiln_infer *m, const char *const *paths, int64_t rows,
			     int64_t max_pixels, int threads, char *x);

#endif
