"""Submission to Vertex AI Pipelines with google-cloud-aiplatform's `PipelineJob`, and pipeline parameters from text."""

from __future__ import annotations

import json
import re

from pipelines import definitions

LABEL_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def parameter_types(name: str) -> dict[str, str]:
    """`{parameter: KFP type}` of pipeline `name` (String, Integer, Float, Boolean, List or Dict)."""
    pipeline = definitions.PIPELINES[name]()
    return {key: spec.type for key, spec in pipeline.component_spec.inputs.items()}


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


def submit(template_path: str, *, project: str, region: str, pipeline_root: str, parameter_values: dict,
           service_account: str | None = None, network: str | None = None, labels: dict | None = None,
           display_name: str | None = None, enable_caching: bool | None = None, api_endpoint: str | None = None) -> str:
    """Submits a compiled pipeline as a Vertex AI PipelineJob; returns the job's resource name.

    `api_endpoint` replaces `{region}-aiplatform.googleapis.com` (a private
    endpoint). Credentials are never sent in clear text: an `http://` endpoint
    (a local stand-in for tests) is called without credentials.
    """
    from google.cloud import aiplatform

    if not pipeline_root.startswith("gs://"):
        raise ValueError(f"--pipeline-root {pipeline_root!r} must be a gs:// path; Vertex AI writes artifacts there.")
    credentials = None
    if api_endpoint and api_endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    aiplatform.init(project=project, location=region, credentials=credentials, api_endpoint=api_endpoint,
                    api_transport="rest" if api_endpoint else None)
    if display_name is None:
        import yaml

        with open(template_path) as file:
            display_name = f"fullres-{yaml.safe_load(file)['pipelineInfo']['name']}"
    job = aiplatform.PipelineJob(
        display_name=display_name,
        template_path=template_path, pipeline_root=pipeline_root, parameter_values=parameter_values,
        labels={"created-by": "fullres", **(labels or {})}, enable_caching=enable_caching, project=project,
        location=region, credentials=credentials,
    )
    job.submit(service_account=service_account, network=network)
    return job.resource_name
