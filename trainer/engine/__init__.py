"""The partitioned step, the one forward pass, checkpoints and the files of a run."""
