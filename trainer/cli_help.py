"""The longer help texts of the trainer's command-line options (`trainer/cli.py`), shared by train and plan."""

STEM_HELP = ("UNet stem: space_to_depth (the default model's: 2x2x2 voxels folded into channels, so TPU lanes are "
             "full) or none (the first level at full resolution; cheaper on CPUs and GPUs).")
ENCODER_HELP = ("UNet encoder: plain (two convolutions per level) or residual (nnU-Net's ResEnc: 1, 3, 4, ... residual "
                "blocks per level, set by --set model.residual_blocks=...).")
AUGMENTATION_HELP = ("Segmentation: the augmentations run on the accelerator, a preset: nnunet (nnU-Net's whole set: "
                     "rotation, scaling, noise, blur, brightness, contrast, low resolution, gamma, mirroring), flips "
                     "(mirroring only), intensity (no mirroring or resampling), video (height and width mirrored alike in every "
                     "frame, intensity per clip; no temporal reversal unless mirror_axes names 0) or none; --set augmentation.FIELD=... "
                     "changes one (e.g. augmentation.mirror_axes=0,1 keeps left and right).")
DEEP_SUPERVISION_HELP = ("Deep supervision (nnU-Net's): the decoder's lower resolutions predict too, their losses "
                         "weighted 1/2 per level; needs 4 levels without the stem, 3 with it.")
LARGEST_HELP = ("Find the largest volume that trains whole: `--largest` grows a cube, `--largest depth` (or "
                "depth,height, ...) grows the axes named and keeps --image-size's others; sizes the network takes "
                "only, bisected, one replica over all the --target's devices, layouts all unless --layouts says, "
                "the CPU's figures as the pre-filter, then the target's compiler. Without --target it sizes on this "
                "machine's CPU (XLA:CPU's figures, --partitions N devices, default 1) against --device-memory, "
                "which it then needs.")
MAX_SECONDS_HELP = ("--largest and a --target generation (v5e, v5p, h100): stop compiling after this many seconds "
                    "(default 900) and say which sizes or slices were not searched.")
