"""Submission to Vertex AI Pipelines with google-cloud-aiplatform's `PipelineJob`, and pipeline parameters from text."""

from __future__ import annotations

import json
import re

from pipelines import definitions

LABEL_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def parameter_types(name: str) -> dict[str, str]:
    """`{parameter: KFP type}` of pipeline `name` (String, Integer, Float, Boolean, List or Dict)."""
    return {key: spec.type for key, spec in definitions.parameters(name).items()}


def parse_parameters(name: str, pairs: list[str]) -> dict:
    """`["steps=500", "beam_args=[\\"--runner=DataflowRunner\\"]"]` -> typed values for pipeline `name`.

    Raises:
        ValueError: one sentence naming the parameter and the fix.
    """
    types = parameter_types(name)
    values = {}
    for pair in pairs:
        key, separator, text = pair.partition("=")
        key = key.strip()
        if not separator:
            raise ValueError(f"--param {pair!r} is not KEY=VALUE; write it like steps=500.")
        if key not in types:
            raise ValueError(f"pipeline {name} has no parameter {key!r}; it has {', '.join(sorted(types))}.")
        kind = types[key]
        try:
            if kind == "Integer":
                values[key] = int(text)
            elif kind == "Float":
                values[key] = float(text)
            elif kind == "Boolean":
                if text.lower() not in ("true", "false"):
                    raise ValueError
                values[key] = text.lower() == "true"
            elif kind in ("List", "Dict"):
                values[key] = json.loads(text)
                if not isinstance(values[key], list if kind == "List" else dict):
                    raise ValueError
            else:
                values[key] = text
        except ValueError:
            example = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false",
                       "List": 'a JSON list, e.g. ["--runner=DataflowRunner"]', "Dict": 'a JSON object, e.g. {"seed": 1}'}
            raise ValueError(f"--param {key}={text!r} must be {example.get(kind, kind)}.") from None
    return values


def plan_parameters(name: str, path: str) -> dict:
    """The launch parameters of a `fullres plan --target ... --json` file, checked as `--param`s are.

    Raises:
        ValueError: one sentence: the file is unreadable, not a plan for a target, or names a parameter
            pipeline `name` does not have.
    """
    try:
        with open(path, encoding="utf-8") as file:
            plan = json.load(file)
    except (OSError, ValueError) as error:
        raise ValueError(f"--plan {path}: cannot read it as JSON ({error}); write it with "
                         "`fullres plan --target ... --json > plan.json`.") from None
    launch = plan.get("launch") if isinstance(plan, dict) else None
    if not isinstance(launch, dict) or not isinstance(launch.get("parameters"), dict):
        raise ValueError(f"--plan {path} has no launch parameters; only a plan for a TPU slice or GPUs has them "
                         "(`fullres plan --target v5e:4x4 ... --json`).")
    pairs = [f"{key}={json.dumps(value) if isinstance(value, (dict, list)) else str(value).lower() if isinstance(value, bool) else value}"
             for key, value in launch["parameters"].items()]
    return parse_parameters(name, pairs)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    """Vertex resource labels from `key=value` texts (lowercase letters, digits, _ and -)."""
    labels = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not LABEL_PATTERN.match(key) or (value and not re.match(r"^[a-z0-9_-]{0,63}$", value)):
            raise ValueError(f"--label {pair!r} is not a Vertex label; write key=value with lowercase letters, digits, "
                             "_ or -, the key starting with a letter.")
        labels[key] = value
    return labels


CREDENTIALS_FIX = ("run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
                   "service-account key file")


def credentials(api_endpoint: str | None = None):
    """The Google Cloud credentials a submission sends: Application Default Credentials, looked up before anything
    is built (aiplatform would otherwise fail deep inside with a traceback). An `http://` endpoint (a local
    stand-in for tests) is called with none: credentials never go out in clear text.

    Raises:
        ValueError: no credentials are set up (one sentence: what was missing and how to set them up).
    """
    if api_endpoint and api_endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    from google.auth import exceptions

    try:
        found, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except exceptions.DefaultCredentialsError as error:
        reason = str(error).split(". To set up", 1)[0].rstrip(".")
        raise ValueError(f"no Google Cloud credentials to submit with ({reason}); {CREDENTIALS_FIX}.") from None
    return found


def _job(template_path: str, *, project: str, region: str, pipeline_root: str, parameter_values: dict,
         service_account: str | None, network: str | None, labels: dict | None, display_name: str | None,
         enable_caching: bool | None, api_endpoint: str | None, with_credentials):
    """The `PipelineJob` `submit` sends, built with `with_credentials` (nothing is sent here)."""
    from google.cloud import aiplatform

    if not pipeline_root.startswith("gs://"):
        raise ValueError(f"--pipeline-root {pipeline_root!r} must be a gs:// path; Vertex AI writes artifacts there.")
    aiplatform.init(project=project, location=region, credentials=with_credentials, api_endpoint=api_endpoint,
                    api_transport="rest" if api_endpoint else None)
    if display_name is None:
        import yaml

        with open(template_path) as file:
            display_name = f"fullres-{yaml.safe_load(file)['pipelineInfo']['name']}"
    job = aiplatform.PipelineJob(
        display_name=display_name,
        template_path=template_path, pipeline_root=pipeline_root, parameter_values=parameter_values,
        labels={"created-by": "fullres", **(labels or {})}, enable_caching=enable_caching, project=project,
        location=region, credentials=with_credentials,
    )
    # The resource the job will send (aiplatform keeps it as `_gca_resource` until the job exists; its own
    # `submit` sets the account and network on it just so).
    if service_account:
        job._gca_resource.service_account = service_account
    if network:
        job._gca_resource.network = network
    return job


def dry_run(template_path: str, **settings) -> dict:
    """What `submit` would send, without credentials or a request: `{"parent", "endpoint", "pipeline_job"}` (the
    PipelineJob resource as Vertex AI's REST API takes it)."""
    from google.auth.credentials import AnonymousCredentials
    from google.protobuf import json_format

    job = _job(template_path, **settings, with_credentials=AnonymousCredentials())
    endpoint = settings.get("api_endpoint") or f"{settings['region']}-aiplatform.googleapis.com"
    return {"parent": f"projects/{settings['project']}/locations/{settings['region']}", "endpoint": endpoint,
            "pipeline_job": json_format.MessageToDict(type(job._gca_resource).pb(job._gca_resource))}


def submit(template_path: str, *, project: str, region: str, pipeline_root: str, parameter_values: dict,
           service_account: str | None = None, network: str | None = None, labels: dict | None = None,
           display_name: str | None = None, enable_caching: bool | None = None, api_endpoint: str | None = None) -> str:
    """Submits a compiled pipeline as a Vertex AI PipelineJob; returns the job's resource name.

    `api_endpoint` replaces `{region}-aiplatform.googleapis.com` (a private
    endpoint). Credentials are never sent in clear text: an `http://` endpoint
    (a local stand-in for tests) is called without credentials.

    Raises:
        ValueError: no credentials (`credentials`), a pipeline root that is not gs://, or Vertex AI refused the
            request (one sentence each).
    """
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions

    found = credentials(api_endpoint)
    job = _job(template_path, project=project, region=region, pipeline_root=pipeline_root,
               parameter_values=parameter_values, service_account=service_account, network=network, labels=labels,
               display_name=display_name, enable_caching=enable_caching, api_endpoint=api_endpoint,
               with_credentials=found)
    try:
        job.submit(service_account=service_account, network=network)
    except auth_exceptions.GoogleAuthError as error:
        raise ValueError(f"Google Cloud did not accept the credentials ({str(error).splitlines()[0]}); "
                         f"{CREDENTIALS_FIX}.") from None
    except api_exceptions.GoogleAPICallError as error:
        raise ValueError(f"Vertex AI refused the pipeline job ({error.code.name if error.code else 'error'}: "
                         f"{error.message}); check --project, --region and the service account's roles.") from None
    return job.resource_name
