/* core/out_file.c - writing a command's output file without losing another:
 * kiln_output_check, the refusal of an output that is one of the command's
 * inputs or a kiln checkpoint (`kiln export`, `kiln predict --logits`,
 * `kiln quantize --out`: before session 31 export and predict overwrote
 * the checkpoint they read and exited 0), and kiln_file_write, the
 * all-or-nothing write through a temporary file that the safetensors and
 * ONNX writers share (before session 31 a failed ONNX write removed the
 * previous good export). */
#include "internal.h"
#include "checkpoint.h" /* kiln_ckpt_is_checkpoint */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status kiln_output_check(const char *out, const char *const *inputs, int n)
{
	struct stat o, in;
	if (!out || stat(out, &o))
		return KILN_OK; /* nothing there yet: nothing to lose */
	for (int i = 0; i < n; i++)
		if (inputs[i] && *inputs[i] && !stat(inputs[i], &in) && in.st_dev == o.st_dev &&
		    in.st_ino == o.st_ino)
			return kiln_error(KILN_EUSAGE, "the output %s is the file %s, which this command reads: choose another file",
					  out, inputs[i]);
	/* not an input: the newest checkpoint of out_dir, found later, is a
	 * checkpoint too, and only training writes one */
	if (kiln_ckpt_is_checkpoint(out))
		return kiln_error(KILN_EUSAGE, "the output %s is a kiln checkpoint, which would be overwritten: choose another file",
				  out);
	return KILN_OK;
}

/* fill's bytes into fp, then fp closed, fsynced first when `sync` (a
 * regular file about to be renamed into place); 0 or the first errno. */
static int write_stream(FILE *fp, kiln_file_fill fill, void *ctx, int sync)
{
	errno = 0; /* (not an earlier call's: the caller's stat of a new file) */
	int err = fill(fp, ctx);
	if (!err && sync && (fflush(fp) || fsync(fileno(fp))))
		err = errno ? errno : EIO;
	if (fclose(fp) && !err)
		err = errno ? errno : EIO;
	return err;
}

/* Write to `target` (a regular file, or none yet) through
 * target.tmp<pid> in its directory, fsynced and renamed over it: the old
 * file stays whole until then; 0 or an errno (the temporary removed). */
static int write_replacing(const char *target, kiln_file_fill fill, void *ctx)
{
	size_t tn = strlen(target) + 32;
	char *tmp = malloc(tn);
	if (!tmp)
		return ENOMEM;
	snprintf(tmp, tn, "%s.tmp%ld", target, (long)getpid());
	FILE *fp = fopen(tmp, "wb");
	int err = fp ? write_stream(fp, fill, ctx, 1) : errno;
	if (!err && rename(tmp, target))
		err = errno;
	if (err && fp)
		unlink(tmp);
	free(tmp);
	return err;
}

int kiln_file_write(const char *path, kiln_file_fill fill, void *ctx)
{
	/* what `path` names decides how: a symlink's target is replaced, not
	 * the link (one that cannot be resolved is an error: written straight
	 * to, a failure would leave the target cut short); a device or FIFO
	 * (/dev/stdout), or a dangling link, is written straight to, and the
	 * target a failed write through a dangling link made is removed */
	struct stat sb, lsb;
	char *real = NULL;
	int link = !lstat(path, &lsb) && S_ISLNK(lsb.st_mode), exists = !stat(path, &sb), err;
	if (link && exists && S_ISREG(sb.st_mode) && !(real = realpath(path, NULL))) {
		err = errno;
	} else if (exists ? S_ISREG(sb.st_mode) : !link) {
		err = write_replacing(real ? real : path, fill, ctx);
	} else {
		FILE *fp = fopen(path, "wb");
		err = fp ? write_stream(fp, fill, ctx, 0) : errno;
		if (err && fp && !exists && (real = realpath(path, NULL)))
			unlink(real);
	}
	free(real);
	return err;
}
