"""Augmentation on the accelerator, inside the partitioned training step, drawn per (seed, step, row).

The host hands the step compact arrays (int16 images, uint8 labels); the task's
`prepare` makes them float32 and augments them where they lie, sharded: no
augmentation may gather a split volume onto one device. Every draw comes from
`keys.row_keys(seed, step, batch)`, so a resumed run augments exactly as an
uninterrupted one, whatever the split and however many processes read the batch.
"""
