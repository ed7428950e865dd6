"""`fullres train --set kernels.choose=measure` on this CPU, as a user runs it: the first run measures and says so in
one line, run_record.json holds every layer's candidates and choice and the step comparison; a second run on the same
device takes the cache and measures nothing; a resume keeps the run's recorded choice; the default on a CPU is the
fixed kernels (nothing measured, nothing recorded)."""

import json

import pytest
from typer.testing import CliRunner

from pipelines import cli

TINY = ["--preset", "smoke", "--set", "model.base_filters=2", "--input-partition-dims", "1,4,1,1,1", "--no-saved-model",
        "--no-augment"]

pytestmark = pytest.mark.slow  # four short training runs in this process


def _train(*arguments):
    result = CliRunner().invoke(cli.app, ["train", *TINY, *arguments])
    assert result.exit_code == 0, result.output + result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("kernels: ")]


def test_measure_chooses_records_caches_and_resumes(demo_data, tmp_path):
    cache = tmp_path / "cache" / "choices.json"
    measure = ["--set", "kernels.choose=measure", "--set", f"kernels.cache={cache}"]
    first = _train("--train", demo_data["train"], "--output", str(tmp_path / "first"), "--steps", "2", *measure)
    assert len(first) == 1 and ", measured (" in first[0] and "(kept the " in first[0], first
    record = json.loads((tmp_path / "first" / "run_record.json").read_text())["kernel_choice"]
    assert record["served"] == "measured" and record["measurements"] > 0
    kinds = {row["kind"] for row in record["layers"]}
    assert kinds == {"convolution", "normalization"}  # the smoke UNet upsamples by a 1×1 convolution
    for row in record["layers"]:
        assert row["layer"] and row["reached"] and row["choice"] in row["times"]
        assert set(row["times"]) == {"convolution": {"xla", "taps"}, "normalization": {"xla", "fused"}}[row["kind"]]
    assert f"{len(record['layers'])} layers of {len({row['signature'] for row in record['layers']})} signatures" \
        in first[0]
    step = record["step"]
    assert step["kept"] in ("measured", "fixed")
    if "fixed_seconds" in step:  # the faster program is kept
        assert (step["kept"] == "measured") == (step["measured_seconds"] < step["fixed_seconds"])
    applied = record["applied"]["layers"]
    assert applied == ({row["signature"]: row["choice"] for row in record["layers"] if row["choice"] != "xla"}
                       if step["kept"] == "measured" else {})
    assert cache.is_file()

    second = _train("--train", demo_data["train"], "--output", str(tmp_path / "second"), "--steps", "2", *measure)
    assert len(second) == 1 and f"from the cache {cache}" in second[0], second
    again = json.loads((tmp_path / "second" / "run_record.json").read_text())["kernel_choice"]
    assert again["served"] == "cache" and again["measurements"] == 0 and again["applied"] == record["applied"]

    resumed = _train("--output", str(tmp_path / "first"), "--steps", "3", *measure)
    assert resumed == [f"kernels: the run's recorded choice ({len(applied)} signatures not the fields', xla_flags "
                       f"{record['applied']['xla_flags']}; run_record.json)"]
    assert json.loads((tmp_path / "first" / "run_record.json").read_text())["kernel_choice"] == record

    fixed = _train("--train", demo_data["train"], "--output", str(tmp_path / "fixed"), "--steps", "1")
    assert fixed == []
    assert "kernel_choice" not in json.loads((tmp_path / "fixed" / "run_record.json").read_text())
