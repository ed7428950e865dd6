"""tf.data input: CT records, detection records, augmentation."""
