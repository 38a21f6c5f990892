"""Job files: YAML whose keys are the API's ``JobSpec`` fields (docs/reference/cli.md).

    name: llama-finetune
    team: nlp
    priority_class: training
    workers: 2                 # a gang: all or nothing
    resources: {gpus: 8, cpu_milli: 32000, memory_mib: 262144, gpu_models: [H100-80GB]}
    command: [torchrun, train.py]
    checkpoint_interval: 10m    # a span: seconds (600), or 90s, 10m, 1h30m, 2d

Checked here for shape (unknown keys, wrong types), each error naming its field; the
values themselves are checked by admission, whose errors name the field too. Several
jobs may share a file as YAML documents separated by ``---``."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import yaml
from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import Message

from gpusched.v1 import types_pb2

# What a file may leave out, as the Python client's spec() (gpusched.client) has it;
# preemptible left out is the API's default (true).
DEFAULTS = {"workers": 1, "pool": "default", "priority_class": "training",
            "resources": {"cpu_milli": 1000, "memory_mib": 4096}}
_INTS = {FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_UINT32, FD.TYPE_UINT64}
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SPAN = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))+")
_RENAMED = {"max_runtime_s": "max_runtime", "checkpoint_interval_s": "checkpoint_interval",
            "simulated_duration_s": "simulated_duration"}


class JobFileError(ValueError):
    """``field: problem``, the field as a dotted path from the document's top."""


def load_docs(path: Path) -> list[object]:
    """The file's YAML documents (empty ones left out)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise JobFileError(f"{path}: {exc.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not YAML: {exc}") from None
    if not docs:
        raise JobFileError(f"{path}: no job in the file")
    return docs


def located(docs: list[object], path: Path | None) -> Iterator[tuple[object, str]]:
    """Each document with the words that say where it is, for errors."""
    for i, doc in enumerate(docs):
        if path is None:
            yield doc, ""
        else:
            yield doc, f"{path}" + (f" (document {i + 1})" if len(docs) > 1 else "")


def load(path: Path) -> list[types_pb2.JobSpec]:
    return [parse(doc, where) for doc, where in located(load_docs(path), path)]


def parse(doc: object, where: str = "") -> types_pb2.JobSpec:
    """A JobSpec from one document, with DEFAULTS where it is silent."""
    try:
        if not isinstance(doc, dict):
            raise JobFileError(f"a job is a mapping of JobSpec fields, got {type(doc).__name__}")
        merged = {**DEFAULTS, **doc}
        if isinstance(doc.get("resources", {}), dict):
            merged["resources"] = {**DEFAULTS["resources"], **(doc.get("resources") or {})}
        spec = types_pb2.JobSpec()
        _fill(spec, merged, "")
        return spec
    except JobFileError as exc:
        raise JobFileError(f"{where}: {exc}" if where else str(exc)) from None


# A service file (``gpusched apply -f``): ServiceSpec fields, ``template`` a job's; a
# Kubernetes-style ``kind: Service`` at the top is allowed and ignored.
TEMPLATE_DEFAULTS = {"resources": DEFAULTS["resources"]}


def parse_service(doc: object, where: str = "") -> types_pb2.ServiceSpec:
    """A ServiceSpec from one document; the template's resources default as a job's."""
    try:
        if not isinstance(doc, dict):
            raise JobFileError(f"a service is a mapping of ServiceSpec fields, got {type(doc).__name__}")
        doc = dict(doc)
        if doc.pop("kind", "Service") != "Service":
            raise JobFileError("kind: only Service may be applied")
        template = doc.get("template") or {}
        if not isinstance(template, dict):
            raise JobFileError(f"template: must be a mapping, got {template!r}")
        resources = template.get("resources", {})
        if isinstance(resources, dict):
            doc["template"] = {**template, "resources": {**TEMPLATE_DEFAULTS["resources"], **(resources or {})}}
        msg = types_pb2.ServiceSpec()
        _fill(msg, doc, "")
        return msg
    except JobFileError as exc:
        raise JobFileError(f"{where}: {exc}" if where else str(exc)) from None


def _fill(message: Message, values: dict, prefix: str) -> None:
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in values.items():
        path = f"{prefix}{key}"
        field = fields.get(key) if isinstance(key, str) else None
        if key in _RENAMED and field is None:
            raise JobFileError(f"{path}: now {prefix}{_RENAMED[key]}, a span (600, 90s, 10m, 1h30m)")
        if field is not None and field.message_type is not None and field.message_type.full_name == \
                "google.protobuf.Duration":
            getattr(message, key).FromNanoseconds(round(span_seconds(value, path) * 1e9))
            continue
        if field is None:
            raise JobFileError(f"{path}: unknown field (known: {', '.join(sorted(fields))})")
        if field.type == FD.TYPE_MESSAGE and field.is_repeated:
            if not isinstance(value, list):
                raise JobFileError(f"{path}: must be a list, got {value!r}")
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise JobFileError(f"{path}[{i}]: must be a mapping, got {item!r}")
                _fill(getattr(message, key).add(), item, f"{path}[{i}].")
        elif field.type == FD.TYPE_MESSAGE:
            if not isinstance(value, dict):
                raise JobFileError(f"{path}: must be a mapping, got {value!r}")
            _fill(getattr(message, key), value, f"{path}.")
        elif field.is_repeated:
            if not isinstance(value, list):
                raise JobFileError(f"{path}: must be a list, got {value!r}")
            getattr(message, key).extend(_scalar(field, v, f"{path}[{i}]") for i, v in enumerate(value))
        else:
            setattr(message, key, _scalar(field, value, path))


def span_seconds(value: object, path: str) -> float:
    """A span: seconds as a number, or a string of amounts with units (``1h30m``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and _SPAN.fullmatch(value.strip()):
        seconds = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([dhms])", value))
    else:
        raise JobFileError(f"{path}: must be a span: seconds (600) or 90s, 10m, 1h30m, 2d; got {value!r}")
    if seconds < 0:
        raise JobFileError(f"{path}: must not be negative, got {value!r}")
    return seconds


def _scalar(field, value: object, path: str):
    if field.type == FD.TYPE_STRING:
        if isinstance(value, (dict, list)) or value is None:
            raise JobFileError(f"{path}: must be a string, got {value!r}")
        return str(value)
    if field.type == FD.TYPE_BOOL:
        if not isinstance(value, bool):
            raise JobFileError(f"{path}: must be true or false, got {value!r}")
        return value
    if field.type in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise JobFileError(f"{path}: must be an integer, got {value!r}")
        return value
    if field.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise JobFileError(f"{path}: must be a number, got {value!r}")
        return float(value)
    if field.type == FD.TYPE_ENUM:
        return _enum(field, value, path)
    raise JobFileError(f"{path}: cannot be set from a job file")


def _enum(field, value: object, path: str) -> int:
    """``kind: inference`` (or the API's full name, JOB_KIND_INFERENCE)."""
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", field.enum_type.name).upper() + "_"   # JobKind -> JOB_KIND_
    names = {v.name: v.number for v in field.enum_type.values if not v.name.endswith("_UNSPECIFIED")}
    text = str(value).upper().replace("-", "_")
    for name in (text, prefix + text):
        if name in names:
            return names[name]
    choices = ", ".join(n.removeprefix(prefix).lower() for n in names)
    raise JobFileError(f"{path}: unknown value {value!r} (one of {choices})")
