"""Byte counts read from the command line and written for people, by one module."""

import pytest

from common import sizes


@pytest.mark.parametrize("text, expected", [("16GiB", 16 * 2**30), ("32 GB", 32 * 10**9), ("512MiB", 512 * 2**20),
                                            ("1e9", 10**9)])
def test_parse_bytes(text, expected):
    assert sizes.parse_bytes(text) == expected


def test_parse_bytes_refuses_nonsense():
    with pytest.raises(ValueError, match=r"--device-memory 'lots' is not a size; write e.g. 16GiB"):
        sizes.parse_bytes("lots")


def test_human_bytes_reads_what_parse_bytes_reads():
    for count in (3 * 2**29, 5 * 2**20):
        assert sizes.parse_bytes(sizes.human_bytes(count).replace(" ", "")) == count
