"""What segmentation and detection do differently, each a `base.Task`; `registry.make_task` picks one.

`segmentation` (UNet, Dice), `detection` (RetinaNet, COCO mAP), with their
metrics (`metrics`, `detection_eval`) and HTML reports (`report`).
"""
