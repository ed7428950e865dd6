"""Byte counts read from the command line and written for people, by one module."""

import os

import pytest

from common import sizes


def test_human_bytes_reads_what_parse_bytes_reads():
    for count in (3 * 2**29, 5 * 2**20):
        assert sizes.parse_bytes(sizes.human_bytes(count).replace(" ", "")) == count


# The sizes people write, through every command that reads one: each either reads it (the command then goes on to
# its next sentence, named here) or refuses it in one sentence naming the option. Before, `3Gi` and `8Gi` ended in a
# KeyError, `1e999` in an OverflowError and `1.2.3` in Python's "could not convert string to float".
NOT_A_SIZE = ["1e999", "1.2.3"]


def _invoke(*arguments):
    from typer.testing import CliRunner

    from pipelines import cli

    return CliRunner().invoke(cli.app, list(arguments))


def _sentence(result) -> str:
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)
    [line] = result.stderr.strip().splitlines()
    return line.removeprefix("fullres: error: ")


def _expected(option: str, value: str) -> str:
    if value == "1e999":
        return f"{option} '1e999' is more bytes than any machine has; write e.g. 16GiB or 32GB."
    return f"{option} {value!r} is not a size; write e.g. 16GiB or 32GB."


@pytest.mark.parametrize("value", NOT_A_SIZE)
def test_plan_device_memory_reads_gi_and_refuses_the_rest_in_one_sentence(value):
    assert _sentence(_invoke("plan", "--device-memory", "0Gi")) == \
        "--device-memory 0Gi must be more than 0, e.g. --device-memory 16GiB."  # read: 0 bytes
    assert _sentence(_invoke("plan", "--device-memory", value)) == _expected("--device-memory", value)


@pytest.mark.parametrize("value", NOT_A_SIZE)
def test_preprocess_video_max_decoded_bytes_reads_gi_and_refuses_the_rest_in_one_sentence(tmp_path, value):
    said = _sentence(_invoke("preprocess", "video", "--input", str(tmp_path), "--output", str(tmp_path / "out"),
                             "--size", "30000,30000", "--max-decoded-bytes", "8Gi"))
    assert said.endswith("over --max-decoded-bytes 8.00 GiB; choose a smaller --size (e.g. 128,128) or --clip-length, "
                         "or raise --max-decoded-bytes if the workers have that memory to spare."), said
    said = _sentence(_invoke("preprocess", "video", "--input", str(tmp_path), "--output", str(tmp_path / "out"),
                             "--max-decoded-bytes", value))
    assert said == _expected("--max-decoded-bytes", value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", NOT_A_SIZE)
def test_preprocess_ct_max_decoded_bytes_reads_gi_and_refuses_the_rest_in_one_sentence(tmp_path, value):
    scans, a_file = tmp_path / "scans", tmp_path / "notes.txt"
    scans.mkdir()
    a_file.write_text("mine")
    said = _sentence(_invoke("preprocess", "ct", "--input", str(scans), "--output", str(a_file / "out"),
                             "--max-decoded-bytes", "3Gi"))  # read: the command goes on to its --output
    assert said.startswith(f"--output {a_file / 'out'} lies under {a_file}, which is a file"), said
    said = _sentence(_invoke("preprocess", "ct", "--input", str(scans), "--output", str(tmp_path / "out"),
                             "--max-decoded-bytes", value))
    assert said == _expected("--max-decoded-bytes", value)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "scans"] and a_file.read_text() == "mine"


@pytest.mark.parametrize("option", ["--max-decoded-bytes", "--device-memory"])
@pytest.mark.parametrize("value", NOT_A_SIZE)
def test_predict_sizes_read_gi_and_refuse_the_rest_in_one_sentence(tmp_path, option, value):
    said = _sentence(_invoke("predict", "--model", str(tmp_path), "--input", str(tmp_path), "--output",
                             str(tmp_path / "masks"), option, "3Gi"))  # read: the command goes on to its --model
    assert said.startswith(f"--model {tmp_path}"), said
    said = _sentence(_invoke("predict", "--model", str(tmp_path), "--input", str(tmp_path), "--output",
                             str(tmp_path / "masks"), option, value))
    assert said == _expected(option, value)
    assert os.listdir(tmp_path) == []
