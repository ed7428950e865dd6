"""The one list parser: every comma list (dims, spacings, sizes, counts, class names) is read by `parsing.parse_list`."""

import pytest

from common import parsing


def test_one_list_parser():
    assert parsing.parse_list("[1, 4, 1, 1, 1]") == (1, 4, 1, 1, 1)
    assert parsing.parse_list("1.7,1.7,2.25", float) == (1.7, 1.7, 2.25)
    assert parsing.parse_list("none") is None and parsing.parse_list("") is None


def test_names_keep_their_inner_spaces_and_none_is_nothing():
    assert parsing.parse_list(" left kidney, liver,", str) == ("left kidney", "liver")
    assert parsing.parse_list(None) is None


def test_a_part_of_the_wrong_kind_is_one_sentence_naming_the_value():
    with pytest.raises(ValueError, match=r"^--shape '1,x' is not a comma-separated list of ints; write it like "
                                         r"1,4,1,1,1\.$"):
        parsing.parse_list("1,x", int, "--shape")
