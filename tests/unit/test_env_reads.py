"""Settings come from one place: no module of gpusched or its services reads a
``GPUSCHED_*`` variable (or another variable a settings model declares) from the
environment itself; ``gpusched/config.py`` does, and passes the values down. The few
exceptions are listed below with their reason."""
from __future__ import annotations

import ast
from pathlib import Path

import gpusched.config as config
from gpusched.config import Settings

ROOT = Path(__file__).resolve().parents[2]

# (module, variable) -> why that module reads the variable itself
ALLOWED: dict[tuple[str, str], str] = {
    ("gpusched/native.py", "GPUSCHED_NATIVE"):
        "read when gpusched.core is first imported, before gpusched.config may be (the core's processes, "
        "such as the catch-up reader, need no pydantic); ProcessSettings declares and documents it",
    **{("gpusched/ctl/root.py", var): "the client CLI's connection options: click declares each option with its "
                                      "variable once, documented in docs/reference/cli.md"
       for var in ("GPUSCHED_ENDPOINT", "GPUSCHED_CONTEXT", "GPUSCHED_CONFIG", "GPUSCHED_CA", "GPUSCHED_CERT",
                   "GPUSCHED_KEY", "GPUSCHED_TOKEN", "GPUSCHED_CLIENT_TOKEN_FILE")},
    ("gpusched/demo.py", "KAFKA_BOOTSTRAP_SERVERS"):
        "whether it is set at all decides if the demo starts a broker of its own; its value, and the login, "
        "are read through KafkaSettings (KafkaConnection.from_env)",
    ("gpusched/ctl/policy.py", "GPUSCHED_ADMISSION"):
        "an older name of the client's --endpoint for `gpusched policy`, declared by its click option "
        "(docs/reference/cli.md)",
}


def declared() -> set[str]:
    """Every variable a settings model declares."""
    models = [m for m in vars(config).values() if isinstance(m, type) and issubclass(m, Settings) and m is not Settings]
    return {var for model in models for _, var in model.sources().values() if var}


def _variable(expr: ast.expr, known: set[str]) -> str | None:
    """The variable ``expr`` names: a literal, or one of gpusched.config's ``ENV_*`` names."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        text = expr.value
    elif isinstance(expr, ast.Name) and expr.id.startswith("ENV_") and hasattr(config, expr.id):
        text = getattr(config, expr.id)
    else:
        return None
    return text if text.startswith("GPUSCHED_") or text in known else None


def env_reads(source: str, known: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, variable) for each read of a settings variable in ``source``:
    ``<mapping>.get(VAR)``, ``os.getenv(VAR)``, ``<mapping>[VAR]`` (a load) and click's
    ``envvar=VAR``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found = None
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv", "pop") and node.args:
                found = _variable(node.args[0], known)
            for keyword in node.keywords:
                if keyword.arg == "envvar":
                    found = found or _variable(keyword.value, known)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            found = _variable(node.slice, known)
        if found:
            out.append((node.lineno, found))
    return out


def reads_outside_config() -> dict[tuple[str, str], list[int]]:
    known, out = declared(), {}
    paths = [*(ROOT / "gpusched").rglob("*.py"), *(ROOT / "services").rglob("*.py")]
    for path in paths:
        rel = str(path.relative_to(ROOT))
        if rel == "gpusched/config.py" or "/v1/" in rel or "/_native/" in rel:
            continue
        for line, var in env_reads(path.read_text(), known):
            out.setdefault((rel, var), []).append(line)
    return out


def test_no_module_outside_config_reads_a_setting_from_the_environment():
    reads = reads_outside_config()
    unexplained = {f"{module}:{lines[0]} reads {var}" for (module, var), lines in reads.items()
                   if (module, var) not in ALLOWED}
    assert unexplained == set()


def test_every_exception_is_still_needed():
    reads = reads_outside_config()
    assert [key for key in ALLOWED if key not in reads] == []


def test_every_kind_of_read_is_found():
    source = '''
import os, click
a = os.environ.get("GPUSCHED_X", "1")
b = os.getenv("GPUSCHED_Y")
c = os.environ["GPUSCHED_Z"]
d = env.get(ENV_USER, "")
e = click.option("--w", envvar="GPUSCHED_W")
f = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
os.environ["GPUSCHED_SET"] = "written for a child, not read"
g = {"GPUSCHED_CHILD": "1"}
h = os.environ.get("HOME")
'''
    found = [var for _, var in env_reads(source, {"KAFKA_BOOTSTRAP_SERVERS"})]
    assert found == ["GPUSCHED_X", "GPUSCHED_Y", "GPUSCHED_Z", config.ENV_USER, "GPUSCHED_W",
                     "KAFKA_BOOTSTRAP_SERVERS"]
