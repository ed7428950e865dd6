"""`fullres pipeline submit` sends Vertex AI the right PipelineJob.

A local HTTP server stands in for the Vertex AI REST endpoint (aiplatform
takes a custom `api_endpoint` and the REST transport); it records the request
the real google-cloud-aiplatform client sends and answers like Vertex does.
The same server answers the Cloud Storage JSON API (`STORAGE_EMULATOR_HOST`):
before submitting, aiplatform looks for the pipeline root's bucket, creates it
when it is missing (as here) and grants the run's service account access.
"""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Vertex(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def _reply(self, body: dict, status: int = 200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else {}

    def do_POST(self):  # noqa: N802  (http.server's naming)
        body = self._body()
        self.requests.append({"method": "POST", "path": self.path, "body": body, "headers": dict(self.headers)})
        if self.path.startswith("/storage/v1/b?"):  # Cloud Storage: create a bucket
            self._reply({"kind": "storage#bucket", "id": body["name"], **body})
            return
        parent = self.path.split("?")[0].removeprefix("/v1/").removesuffix("/pipelineJobs")
        self._reply({**body, "name": f"{parent}/pipelineJobs/fullres-test-123", "state": "PIPELINE_STATE_PENDING"})

    def do_GET(self):  # noqa: N802
        self.requests.append({"method": "GET", "path": self.path})
        if self.path.split("?")[0].endswith("/iam"):  # Cloud Storage: the bucket's IAM policy
            self._reply({"kind": "storage#policy", "bindings": [], "etag": "CAE="})
            return
        if self.path.startswith("/storage/v1/b/"):  # Cloud Storage: no such bucket yet
            self._reply({"error": {"code": 404, "message": "The specified bucket does not exist."}}, status=404)
            return
        self._reply({"name": self.path.removeprefix("/v1/"), "state": "PIPELINE_STATE_PENDING"})

    def do_PUT(self):  # noqa: N802
        body = self._body()
        self.requests.append({"method": "PUT", "path": self.path, "body": body})
        self._reply(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def vertex():
    _Vertex.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vertex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Vertex.requests
    server.shutdown()


def _fullres(*args, storage: str | None = None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GOOGLE_")}
    if storage:
        environment["STORAGE_EMULATOR_HOST"] = storage
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=environment, timeout=300)


@pytest.mark.slow
def test_submit_sends_template_parameters_account_root_and_labels(vertex):
    endpoint, requests = vertex
    result = _fullres(
        "pipeline", "submit", "--project", "my-project", "--region", "europe-west4",
        "--pipeline-root", "gs://my-bucket/fullres", "--service-account", "trainer@my-project.iam.gserviceaccount.com",
        "--network", "projects/123/global/networks/research", "--label", "team=imaging",
        "--param", "train_input_uri=gs://my-bucket/ct/train", "--param", "eval_input_uri=gs://my-bucket/ct/eval",
        "--param", "steps=5000", "--param", "input_partition_dims=1,4,1,1,1",
        "--param", "accelerator_type=TPU_V3", "--param", "machine_type=cloud-tpu", "--param", "accelerator_count=8",
        "--param", 'beam_args=["--runner=DataflowRunner", "--project=my-project", "--region=europe-west4"]',
        "--api-endpoint", endpoint, storage=endpoint,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "submitted ct-segmentation: projects/my-project/locations/europe-west4/pipelineJobs/fullres-test-123" in result.stdout
    created = [r for r in requests if r["method"] == "POST" and r["path"].startswith("/storage/v1/b?")]
    assert len(created) == 1 and created[0]["body"]["name"] == "my-bucket" and "project=my-project" in created[0]["path"]
    (policy,) = [r["body"] for r in requests if r["method"] == "PUT"]
    members = {b["role"]: b["members"] for b in policy["bindings"]}
    assert members["roles/storage.objectCreator"] == ["serviceAccount:trainer@my-project.iam.gserviceaccount.com"]
    posts = [r for r in requests if r["method"] == "POST" and "/pipelineJobs" in r["path"]]
    assert len(posts) == 1
    request = posts[0]
    assert request["path"].startswith("/v1/projects/my-project/locations/europe-west4/pipelineJobs")
    body = request["body"]
    with open(os.path.join(ROOT, "pipeline.yaml")) as file:
        template = yaml.safe_load(file)
    assert body["pipelineSpec"]["pipelineInfo"] == template["pipelineInfo"]
    assert body["pipelineSpec"]["root"] == json.loads(json.dumps(template["root"]))
    assert body["pipelineSpec"]["deploymentSpec"] == json.loads(json.dumps(template["deploymentSpec"]))
    runtime = body["runtimeConfig"]
    assert runtime["gcsOutputDirectory"] == "gs://my-bucket/fullres"
    assert runtime["parameterValues"] == {
        "train_input_uri": "gs://my-bucket/ct/train", "eval_input_uri": "gs://my-bucket/ct/eval", "steps": 5000,
        "input_partition_dims": "1,4,1,1,1", "accelerator_type": "TPU_V3", "machine_type": "cloud-tpu",
        "accelerator_count": 8,
        "beam_args": ["--runner=DataflowRunner", "--project=my-project", "--region=europe-west4"],
    }
    assert body["serviceAccount"] == "trainer@my-project.iam.gserviceaccount.com"
    assert body["network"] == "projects/123/global/networks/research"
    assert body["labels"]["team"] == "imaging" and body["labels"]["created-by"] == "fullres"
    assert body["displayName"] == "fullres-ct-segmentation"
    assert "authorization" not in {k.lower() for k in request["headers"]}  # never credentials over plain HTTP


@pytest.mark.parametrize("args, message", [
    (["--param", "steps=many"], "--param steps='many' must be an integer"),
    (["--param", "stpes=5"], "pipeline ct-segmentation has no parameter 'stpes'"),
    (["--param", "steps"], "is not KEY=VALUE"),
    (["--label", "Team=x"], "is not a Vertex label"),
    (["--pipeline-root", "/tmp/root"], "must be a gs:// path"),
])
def test_bad_submissions_are_refused_in_one_sentence(vertex, args, message):
    endpoint, requests = vertex
    # In-process (each case fails before any request), through the CLI users call.
    from typer.testing import CliRunner

    from pipelines import cli

    base = {"--project": "p", "--region": "us-central1", "--pipeline-root": "gs://b/r"}
    if "--pipeline-root" in args:
        base.pop("--pipeline-root")
    inputs = ["--param", "train_input_uri=gs://bkt/ct/train", "--param", "eval_input_uri=gs://bkt/ct/eval"]
    result = CliRunner().invoke(cli.app, ["pipeline", "submit", *[x for kv in base.items() for x in kv], *inputs, *args,
                                          "--api-endpoint", endpoint])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("fullres: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not [r for r in requests if "/pipelineJobs" in r["path"]]
