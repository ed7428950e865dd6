"""Images with boxes: COCO and VOC annotations, label maps, demo images."""
