"""The PyTorch side of `peer_bench.py`: the networks from their own packages, fullres's loss in torch, one timed row.

Networks (the zoo's ports, `tests/trainer/zoo/`, are the fullres side of the same configurations):
  nnunet_plain  nnU-Net's default 3d_fullres PlainConvUNet (dynamic-network-architectures): 6 stages, 32 to 320
                features, InstanceNorm (affine), LeakyReLU(0.01), conv bias, transposed convolutions k2 s2, one output.
  monai_unet    MONAI's UNet (monai.networks.nets.UNet) as its 3D tutorials build it: channels 16 to 256, strides 2,
                two residual units, InstanceNorm, PReLU.
`tiny` is each one's test size, as the zoo's `tiny` (4 to 16 features, /8).

The loss is fullres's own (`trainer/models/losses.py:dice_cross_entropy`): voxel cross-entropy weighing each class by
its batch count to the power −`class_balance`, plus 1 − soft Dice per example and foreground class, in float32.
The optimizer is fullres's default, Adam at 1e-3 (nnU-Net trains with SGD; the benchmark keeps one optimizer on both
sides). Modes: `eager` (float32 or bfloat16 autocast) and `nnunet` (what nnU-Net v2 runs: the network through
torch.compile, float16 autocast, GradScaler; nnU-Net enables autocast on CUDA only).
"""

from __future__ import annotations

import statistics
import time

NETWORKS = ("nnunet_plain", "monai_unet")
ZOO = {"nnunet_plain": "tests/trainer/zoo/nnunet_plain.py", "monai_unet": "tests/trainer/zoo/monai_unet.py"}
NUM_CLASSES = 3


def network(name: str, tiny: bool):
    """The PyTorch network `name` (NCDHW), built by its own package, in its published or its `tiny` configuration."""
    from torch import nn

    if name == "nnunet_plain":
        from dynamic_network_architectures.architectures.unet import PlainConvUNet

        features, strides = ((4, 8, 16, 16), (1, 2, 2, 2)) if tiny else ((32, 64, 128, 256, 320, 320), (1, 2, 2, 2, 2, 2))
        return PlainConvUNet(1, len(features), features, nn.Conv3d, 3, strides, 2, NUM_CLASSES, 2, conv_bias=True,
                             norm_op=nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                             nonlin=nn.LeakyReLU, nonlin_kwargs={"negative_slope": 0.01, "inplace": True},
                             deep_supervision=False)
    if name == "monai_unet":
        from monai.networks.nets import UNet

        channels, strides = ((4, 8, 16, 16), (2, 2, 2)) if tiny else ((16, 32, 64, 128, 256), (2, 2, 2, 2))
        return UNet(spatial_dims=3, in_channels=1, out_channels=NUM_CLASSES, channels=channels, strides=strides,
                    num_res_units=2)
    raise ValueError(f"network {name!r} is not known; use one of {', '.join(NETWORKS)}.")


def dice_cross_entropy(logits, labels, class_balance: float, epsilon: float = 1e-5):
    """fullres's `losses.dice_cross_entropy` for (B, C, D, H, W) logits and (B, D, H, W) labels, in float32."""
    import torch
    import torch.nn.functional as F

    logits = logits.float()
    log_probs = F.log_softmax(logits, dim=1)
    one_hot = F.one_hot(labels.long(), logits.shape[1]).movedim(-1, 1).float()  # (B, C, D, H, W)
    voxel_loss = -(one_hot * log_probs).sum(dim=1)  # (B, D, H, W)
    if class_balance:
        counts = one_hot.sum(dim=(0, 2, 3, 4))  # (C,)
        weights = torch.where(counts > 0, counts.clamp(min=1.0) ** -class_balance, torch.zeros_like(counts))
        voxel_weights = (one_hot * weights.view(1, -1, 1, 1, 1)).sum(dim=1)
        cross_entropy = (voxel_weights * voxel_loss).sum() / voxel_weights.sum()
    else:
        cross_entropy = voxel_loss.mean()
    probs = log_probs.exp()
    spatial = (2, 3, 4)
    intersection = (probs * one_hot).sum(dim=spatial)  # (B, C)
    total = probs.sum(dim=spatial) + one_hot.sum(dim=spatial)
    dice = (2.0 * intersection + epsilon) / (total + epsilon)
    return cross_entropy + 1.0 - dice[:, 1:].mean()


def peak_figures(device) -> dict:
    """The CUDA caching allocator's peak, or on a CPU the process's peak RSS, marked so."""
    import resource

    import torch

    if device.type == "cuda":
        return {"peak_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_bytes_source": "torch.cuda.max_memory_allocated"}
    return {"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_bytes_source": "process peak RSS (a CPU keeps no allocator peak; includes Python, torch and data)"}


def used_parameters(net) -> int:
    """The weights the last step trained (with a gradient): PlainConvUNet keeps a segmentation layer per decoder stage
    without deep supervision, and uses only the last."""
    return sum(p.numel() for p in net.parameters() if p.grad is not None)


def unavailable(row: dict, device) -> str | None:
    """Why `row` cannot run on `device`, or None."""
    if row["mode"] == "nnunet" and device.type != "cuda":
        return "nnU-Net's float16 autocast with GradScaler runs on CUDA only (nnU-Net turns autocast off elsewhere)"
    return None


def run(row: dict, class_balance: float) -> dict:
    """One PyTorch row: median step over `steps` after `warmup`, the allocator's peak, the first step's seconds."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    why = unavailable(row, device)
    if why:
        return {"status": "not_run", "error": why}
    torch.manual_seed(0)
    net = network(row["network"], row["tiny"]).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    compiled = torch.compile(net) if row["mode"] == "nnunet" else net
    dtype = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[row["precision"]]
    scaler = torch.amp.GradScaler(device.type) if row["precision"] == "float16" else None
    size, batch = row["size"], row["batch_size"]
    generator = torch.Generator().manual_seed(0)
    image = torch.randn((batch, 1, size, size, size), generator=generator).to(device)  # (B, 1, D, H, W)
    labels = torch.randint(0, NUM_CLASSES, (batch, size, size, size), generator=generator).to(device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = compiled(image)
        loss = dice_cross_entropy(logits, labels, class_balance)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss

    def timed():
        started = time.perf_counter()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started, loss

    first, _ = timed()  # torch.compile's compilation happens here; eager's first step warms cuDNN's choices
    times = []
    for number in range(row["warmup"] - 1 + row["steps"]):
        seconds, loss = timed()
        if number >= row["warmup"] - 1:
            times.append(seconds)
        if len(times) >= 3 and time.perf_counter() + max(times) > row.get("deadline", float("inf")):
            break
    return {"status": "ok", "median_step_seconds": statistics.median(times), "steps": len(times),
            "warmup_steps": row["warmup"], "first_step_seconds": first,
            "compile_seconds": first if row["mode"] == "nnunet" else None, "loss": float(loss),
            "parameters": used_parameters(net), "device": str(device),
            "versions": {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}, **peak_figures(device)}
