"""The records fullres writes and the trainer reads: tf.train.Example schema and a data set's files."""
