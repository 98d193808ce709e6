/* tests/cnn_rig.h - the CNN on Fashion-MNIST the resume tests train
 * (tests/check_ckpt.c's trainer cases, the suites of tests/resume_rig.h):
 * 640 samples of [data] limit (200 evaluated), randomly cropped and
 * flipped, conv, batchnorm, ReLU, maxpool, dropout and linear, AdamW with
 * batch 16 x accumulate 2: 20 optimizer steps an epoch, 3 epochs = 60
 * steps.  CNN_RIG_INI is the text from [data] to [train]'s optimizer: a
 * suite writes its [run] before it and the rest of [train] (its logging,
 * evaluation batch, schedule) after it. */
#ifndef KILN_TESTS_CNN_RIG_H
#define KILN_TESTS_CNN_RIG_H

#define CNN_RIG_INI                                                                          \
	"[data]\nsource = idx\nlimit = 640\nmean = 0.286\nstd = 0.353\nshuffle = 1\n"        \
	"crop = random\npad = 2\nflip = 1\nworkers = 2\n"                                    \
	"[data.eval]\nlimit = 200\n"                                                         \
	"[layer.c1]\ntype = conv\nout = 4\nkernel = 3\npadding = 1\n"                        \
	"[layer.bn]\ntype = batchnorm\n[layer.r]\ntype = relu\n"                             \
	"[layer.p]\ntype = maxpool\nkernel = 2\n"                                            \
	"[layer.d]\ntype = dropout\np = 0.3\n"                                               \
	"[layer.f]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n"                   \
	"[layer.loss]\ntype = softmax_xent\n"                                                \
	"[train]\nepochs = 3\nbatch = 16\naccumulate = 2\noptimizer = adamw\nlr = 0.003\n" \
	"weight_decay = 0.01\n"

#endif
