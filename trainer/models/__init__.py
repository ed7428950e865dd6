"""The networks and their losses: 2D/3D UNet, RetinaNet, Dice + cross-entropy."""
