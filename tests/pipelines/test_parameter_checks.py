"""`pipeline run --local` and `pipeline submit` check every parameter before anything starts.

Each bad parameter gets one sentence, in the words of the command its step runs, no traceback; a local run
creates no pipeline root and starts no step; a submission without Google credentials names the parameter (so the
check came first), and with good parameters names the missing credentials and the fix. All in-process, through
the CLI users call: no step ever runs, so each case takes a fraction of a second.
"""

import json

import pytest
from typer.testing import CliRunner

from pipelines import cli, definitions, parameter_checks


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """Two tiny CT cases as NIfTI with label maps holding 0, 1 and 2."""
    from preprocessing.ct import demo_ct

    root = tmp_path_factory.mktemp("scans")
    return demo_ct.write_demo_cases(str(root), 2, (8, 16, 16), seed=0, formats=("nifti",))["nifti"]


def _one_sentence(result) -> str:
    """Exit 2, one `fullres: error:` line and no traceback anywhere; returns the sentence."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0].removeprefix("fullres: error: ")


def _inputs(scans: str) -> list[str]:
    return ["--param", f"train_input_uri={scans}/images", "--param", f"train_labels_uri={scans}/labels",
            "--param", f"eval_input_uri={scans}/images", "--param", f"eval_labels_uri={scans}/labels"]


LOCAL = [  # (parameters beyond the good inputs, the sentence)
    (["--param", "max_failed_fraction=-3"],
     "--param max_failed_fraction -3 must be a fraction from 0 to 1 (the share of inputs that may fail before the "
     "run counts as failed), e.g. 0.1."),
    (["--param", "steps=-5"], "--param steps=-5: steps must be >= 1, got -5."),
    (["--param", "spacing=1.5,1.5"], "--param spacing '1.5,1.5' is not valid; write it like 1.0,1.0,2.5."),
    (["--param", "spacing=1,0,1"], "--param spacing needs three positive values X,Y,Z in mm, got (1.0, 0.0, 1.0)."),
    (["--param", "window=300,100"], "--param window needs LOW,HIGH with LOW < HIGH, got (300.0, 100.0)."),
    (["--param", 'train_overrides={"model.num_classes": 2}'],
     "the model's 2 classes are too few for the label maps at {scans}/labels: they hold label values 0, 1, 2; pass "
     "--param train_overrides='{{\"model.num_classes\": 3}}' or more."),
    (["--param", "preset=ct_256"],  # its UNet has 3 classes: fits
     None),
    (["--param", "class_names=background,liver,spleen,kidney,lung"],  # the report's names: one per class
     "--param class_names 'background,liver,spleen,kidney,lung' names 5 classes but the model has 3 (background "
     "included); give one name per class, background first, or set the model's classes with --param "
     "train_overrides='{{\"model.num_classes\": 5}}'."),
    (["--param", "preset=huge"], "preset 'huge' is not known; use default or one of ct_256, demo, smoke, nnunet, "
                                 "detection, detection_2560, detection_demo, video."),
    (["--param", "augmentation=heavy"], "augmentation 'heavy' is not known; use one of nnunet, flips, intensity, video, none."),
    (["--param", "accelerator_type=TPU_V9_QUANTUM", "--param", "accelerator_count=-2"],
     "--param accelerator_count -2 must be 1 or more: the accelerators each host gets (Vertex AI machines carry 1, "
     "2, 4, 8, 16 GPUs; a TPU slice is its topology)."),
    (["--param", "replica_count=0"], "--param replica_count 0 must be 1 or more."),
    # A user's network (model_code/model_function), judged as the train step would judge it.
    (["--param", "model_function=build"],
     "model_code (the text of your network's Python file) and model_function (the function in it that returns the "
     "network) go together; pass both (fullres pipeline run --model FILE.py:FUNCTION sets them), or neither for the "
     "task's own model."),
    (["--param", "model_code=import keras\n", "--param", "model_function=my net"],
     "--param model_function 'my net' is not a function name; pass the name of the function in model_code that "
     "returns the network, e.g. build (fullres pipeline run --model FILE.py:FUNCTION sets both)."),
    (["--param", "model_code=def build(num_classes, in_channels:\n    return None\n", "--param", "model_function=build"],
     "--param model_code is not Python the train step can import (line 1): '(' was never closed; fix the file and "
     "pass it again (fullres pipeline run --model FILE.py:FUNCTION passes its text)."),
    (["--param", "model_code=def build(num_classes, in_channels):\n    return None\n", "--param",
      "model_function=build", "--param", 'train_overrides={"model.num_levels": 3}'],
     "unknown train override model.num_levels with --model network.py:build; valid ones: "),
]


@pytest.mark.parametrize("extra, sentence", LOCAL)
def test_a_local_run_refuses_each_bad_parameter_before_anything_starts(scans, tmp_path, extra, sentence):
    root = tmp_path / "root"
    if sentence is None:  # a good configuration passes the check: only what the check itself says is seen
        values = parameter_checks.check(definitions.CT_PIPELINE, {"train_input_uri": f"{scans}/images",
                                                                  "train_labels_uri": f"{scans}/labels",
                                                                  "eval_input_uri": f"{scans}/images",
                                                                  "preset": "ct_256"})
        assert values["preset"] == "ct_256" and values["spacing"] == "1.0,1.0,1.0"
        return
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root),
                                          *_inputs(scans), *extra])
    said = _one_sentence(result)
    assert said.startswith(sentence.format(scans=scans)) if sentence.endswith(": ") else said == sentence.format(
        scans=scans)
    assert not root.exists()  # no pipeline root, no log, no step


@pytest.mark.parametrize("given, sentence", [
    ([], "pipeline ct-segmentation needs --param train_input_uri=... and --param eval_input_uri=... (the training "
         "scans, the held-out scans: a folder or file each); `fullres pipeline parameters --pipeline ct-segmentation` "
         "lists every parameter."),
    (["--param", "train_input_uri=/nonexistent/scans", "--param", "eval_input_uri=/nonexistent/eval"],
     "--param train_input_uri '/nonexistent/scans' does not exist."),
    (["--param", "train_input_uri=gs://my-bucket/ct", "--param", "eval_input_uri=gs://my-bucket/ct"],
     "--param train_input_uri 'gs://my-bucket/ct' is in Cloud Storage, but a local run reads its inputs from this "
     "machine's file system; copy them here (gcloud storage cp -r) or mount the bucket (gcsfuse), and pass the local "
     "path."),
])
def test_a_local_run_names_missing_and_unreadable_inputs(tmp_path, given, sentence):
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(tmp_path / "root"),
                                          *given])
    assert _one_sentence(result) == sentence
    assert not (tmp_path / "root").exists()


@pytest.fixture()
def no_credentials(tmp_path, monkeypatch):
    """An environment with no Google credentials at all: no key file, no gcloud configuration, not on GCE."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # where gcloud keeps application credentials
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # google.auth: do not ask a metadata server (none answers here)
    import google.auth

    with pytest.raises(google.auth.exceptions.DefaultCredentialsError):
        google.auth.default()  # really none


def _submit(*arguments: str):
    return CliRunner().invoke(cli.app, ["pipeline", "submit", "--project", "my-project", "--region", "us-central1",
                                        "--pipeline-root", "gs://my-bucket/root", *arguments])


GOOD = ["--param", "train_input_uri=gs://my-bucket/ct/train", "--param", "eval_input_uri=gs://my-bucket/ct/eval"]
CREDENTIALS = ("no Google Cloud credentials to submit with (Your default credentials were not found); run `gcloud "
               "auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file.")


@pytest.mark.parametrize("given, sentence", [
    ([], "pipeline ct-segmentation needs --param train_input_uri=... and --param eval_input_uri=... (the training "
         "scans, the held-out scans: a folder or file each, in Cloud Storage); `fullres pipeline parameters "
         "--pipeline ct-segmentation` lists every parameter."),
    (["--param", "train_input_uri=/home/me/scans", *GOOD[2:]],
     "--param train_input_uri '/home/me/scans' is a path on this machine, which Vertex AI's steps cannot read; copy "
     "it to Cloud Storage (gcloud storage cp -r) and pass gs://BUCKET/PATH."),
    (["--param", "train_input_uri=gs://B/scans", *GOOD[2:]],
     "--param train_input_uri 'gs://B/scans' is not a well-formed Cloud Storage location; write it like "
     "gs://BUCKET/PATH (a bucket name has 3 to 63 lowercase letters, digits, dots, dashes or underscores)."),
    ([*GOOD, "--param", "max_failed_fraction=-3"], "--param max_failed_fraction -3 must be a fraction from 0 to 1"),
    ([*GOOD, "--param", "steps=-5"], "--param steps=-5: steps must be >= 1, got -5."),
    ([*GOOD, "--param", "shape=64,x,64"], "--param shape '64,x,64' is not valid; write it like 128,256,256."),
    ([*GOOD, "--param", "spacing=1.5;1.5;2"], "--param spacing '1.5;1.5;2' is not valid; write it like 1.0,1.0,2.5."),
    ([*GOOD, "--param", "accelerator_type=TPU_V9_QUANTUM"],
     "--param accelerator_type 'TPU_V9_QUANTUM' is not an accelerator Vertex AI offers; use CPU, one of NVIDIA_"),
    ([*GOOD, "--param", "accelerator_type=TPU_V9_QUANTUM", "--param", "accelerator_count=-2"],
     "--param accelerator_count -2 must be 1 or more"),
    ([*GOOD, "--param", "accelerator_type=NVIDIA_L4", "--param", "accelerator_count=3"],
     "--param accelerator_count 3 is not a number of GPUs a Vertex AI machine carries; use 1, 2, 4, 8, 16."),
    ([*GOOD, "--param", "accelerator_type=TPU_V5_LITEPOD", "--param", "tpu_topology=3x3"],
     "--param tpu_topology: v5e has no 3x3 slice; its slices are 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16 and 16x16."),
    ([*GOOD, "--param", "accelerator_type=TPU_V4_POD", "--param", "tpu_topology=2x2x1"],
     "--param accelerator_type 'TPU_V4_POD': Vertex AI custom training does not offer v4 slices"),
    ([*GOOD, "--param", "strategy=CHEAP"], "--param strategy 'CHEAP' is not a Vertex AI scheduling strategy; use one "
                                           "of ON_DEMAND, LOW_COST, STANDARD, SPOT, FLEX_START."),
    ([*GOOD, "--param", "max_wait_duration=1 day"], "--param max_wait_duration '1 day' is not a duration Vertex AI "
                                                    "reads; write seconds with an s, e.g. 86400s."),
    (GOOD, CREDENTIALS),  # every parameter is good: then the credentials are looked for, and there are none
])
def test_submit_without_credentials_names_the_bad_parameter_first(no_credentials, given, sentence):
    assert _one_sentence(_submit(*given)).startswith(sentence)


def test_submit_with_a_plan_and_no_credentials_is_one_sentence(no_credentials, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"launch": {"parameters": {
        "input_partition_dims": "1,4,1,1,1", "batch_size": 2, "precision": "float32", "preset": "smoke",
        "accelerator_type": "TPU_V5_LITEPOD", "machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2",
        "accelerator_count": 1, "replica_count": 1}}}))
    assert _one_sentence(_submit("--plan", str(plan), *GOOD)) == CREDENTIALS
    plan.write_text(json.dumps({"launch": {"parameters": {"tpu_topology": "3x3", "accelerator_type": "TPU_V5_LITEPOD"}}}))
    assert _one_sentence(_submit("--plan", str(plan), *GOOD)).startswith("--param tpu_topology: v5e has no 3x3 slice")


def test_submit_with_a_missing_key_file_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    assert _one_sentence(_submit(*GOOD)) == (
        f"no Google Cloud credentials to submit with (File {tmp_path / 'key.json'} was not found); run `gcloud auth "
        "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file.")


def test_dry_run_shows_the_job_without_credentials(no_credentials):
    result = _submit(*GOOD, "--param", "steps=100", "--service-account", "sa@my-project.iam.gserviceaccount.com",
                     "--label", "team=imaging", "--dry-run")
    assert result.exit_code == 0, result.output
    first, _, body = result.stdout.partition("\n")
    assert first == ("dry run: would send this PipelineJob to us-central1-aiplatform.googleapis.com under "
                     "projects/my-project/locations/us-central1 (nothing was sent):")
    job = json.loads(body)
    assert job["runtimeConfig"] == {"gcsOutputDirectory": "gs://my-bucket/root", "parameterValues": {
        "train_input_uri": "gs://my-bucket/ct/train", "eval_input_uri": "gs://my-bucket/ct/eval", "steps": 100}}
    assert job["serviceAccount"] == "sa@my-project.iam.gserviceaccount.com"
    assert job["labels"] == {"created-by": "fullres", "team": "imaging"}
    assert job["pipelineSpec"]["pipelineInfo"]["name"] == "ct-segmentation"


@pytest.mark.parametrize("pipeline", definitions.PIPELINES)
def test_every_parameter_has_a_rule(pipeline):
    """A new pipeline parameter must be given its rule (one line in `RULES`), be read by a rule over several, or be
    listed as needing none: nothing reaches a step unjudged."""
    judged = set(parameter_checks.RULES) | set(parameter_checks.FREE) | {
        name for names in parameter_checks.TOGETHER.values() for name in names}
    assert set(definitions.parameters(pipeline)) - judged == set()


def test_a_network_file_that_does_not_parse_is_refused_before_anything_starts(scans, tmp_path):
    """`--model FILE.py:FUNCTION` passes the file's text as model_code: a file the train step could not import is
    refused by the same check, before preprocessing (minutes of it) starts, not by the train step after it."""
    network = tmp_path / "net.py"
    network.write_text("import keras\n\n\ndef build(num_classes, in_channels):\n    return keras.Model(\n")
    root = tmp_path / "root"
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root),
                                          "--model", f"{network}:build", *_inputs(scans)])
    assert _one_sentence(result) == (  # the user's file, not the parameter the CLI made of it
        f"--model {network}:build: {network} is not Python the train step can import (line 5): '(' was never closed; "
        "fix the file and pass it again.")
    assert not root.exists()


def test_a_network_file_that_is_a_folder_is_called_a_folder(scans, tmp_path):
    """`--model dir.py:build` where dir.py is a folder said "dir.py does not exist" (as train says)."""
    folder = tmp_path / "dir.py"
    folder.mkdir()
    root = tmp_path / "root"
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root),
                                          "--model", f"{folder}:build", *_inputs(scans)])
    assert _one_sentence(result) == (f"--model {folder}:build: {folder} is a folder, not a Python file; pass the path "
                                     "of the Python file that defines build (FILE.py:FUNCTION).")
    assert not root.exists()


@pytest.mark.slow  # builds the network (Keras, JAX) in the CLI's process: 6.6 s here
def test_a_network_that_breaks_the_contract_is_refused_before_anything_starts_naming_the_user_s_file(scans,
                                                                                                      tmp_path):
    """A network that parses, but whose function is missing or returns the wrong logits, was found only by the train
    step after preprocessing, and its sentence named the step's temporary copy (/tmp/fullres-network-*/network.py)."""
    network = tmp_path / "net.py"
    network.write_text("import keras\n\n\ndef build(num_classes, in_channels):\n"
                       "    i = keras.Input((None, None, None, in_channels))\n"
                       "    return keras.Model(i, keras.layers.Conv3D(num_classes + 1, 1)(i))\n")
    root = tmp_path / "root"
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root),
                                          "--model", f"{network}:build", *_inputs(scans)])
    said = _one_sentence(result)
    assert said == (f"--model {network}:build: the network turns a (1, 256, 256, 256, 1) input into (1, 256, 256, "
                    "256, 4); fullres segments with logits of num_classes=3 channels at the input's resolution, (1, "
                    "256, 256, 256, 3).")
    assert not root.exists()
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root),
                                          "--model", f"{network}:make", *_inputs(scans)])
    assert _one_sentence(result) == (f"--model {network}:make: {network} defines no function make (it defines build); "
                                     f"name the function that returns the network, e.g. --model {network}:build.")
    assert not root.exists()


def test_a_network_passed_as_model_code_that_raises_is_refused_before_anything_starts(scans, tmp_path):
    """`--param model_code` (not `--model FILE`) was only parsed before the run: a function that raises was found
    by the train step, after both preprocessing steps had run. It is built first, as `--model` is."""
    code = "def build(num_classes, in_channels):\n    raise RuntimeError('no network today')\n"
    root = tmp_path / "root"
    result = CliRunner().invoke(cli.app, ["pipeline", "run", "--local", "--pipeline-root", str(root), *_inputs(scans),
                                          "--param", f"model_code={code}", "--param", "model_function=build"])
    assert _one_sentence(result) == (
        "--param model_code:build: build(num_classes=3, in_channels=1) raised RuntimeError: no network today; the "
        "function must take num_classes and in_channels keyword arguments and return a keras.Model.")
    assert not root.exists()  # no pipeline root, no step
