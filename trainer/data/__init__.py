"""The input: CT records (read by fullres itself, each process its share) and detection records (tf.data)."""
