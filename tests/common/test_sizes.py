"""Byte counts read from the command line and written for people, by one module."""

from common import sizes


def test_human_bytes_reads_what_parse_bytes_reads():
    for count in (3 * 2**29, 5 * 2**20):
        assert sizes.parse_bytes(sizes.human_bytes(count).replace(" ", "")) == count
