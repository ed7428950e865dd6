"""A split against the devices and the batch: each refusal names the problem and the fix."""

import pytest

from trainer.parallel import replicas
from trainer.parallel.partitioning import PartitionConfig, PartitionError


@pytest.mark.parametrize(
    "dims, devices, batch, message",
    [
        # product does not divide the device count
        ((1, 3, 1, 1, 1), 8, None,
         r"asks for 3 cores per replica, which does not divide the 8 devices present; use dims whose product is one "
         r"of \[1, 2, 4, 8\]"),
        # global batch vs replicas
        ((1, 4, 1, 1, 1), 8, 3,
         r"global batch size 3 does not divide over 2 replicas \(8 devices / 4 cores per replica\); use a multiple of 2"),
    ],
)
def test_replicas_refuse_with_fix(dims, devices, batch, message):
    with pytest.raises(PartitionError, match=message):
        replicas.validate(PartitionConfig(dims), devices, batch)

