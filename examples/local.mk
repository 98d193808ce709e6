EXTRA_DIST += examples/fashion_mnist_mlp.ini examples/fashion_mnist_cnn.ini examples/fashion_mnist_resnet.ini \
	examples/fashion_mnist_records.ini examples/fashion_mnist_folder.ini \
	examples/fashion_mnist_resnet_deep.ini examples/resnet50_synthetic.ini \
	examples/gpt_char.ini examples/gpt2_small.ini examples/seq2seq.ini \
	examples/seq_classify.ini
EXTRA_DIST += examples/embed/embed.c
EXTRA_DIST += examples/seq2seq_split.ini examples/gpt_char_split.ini
