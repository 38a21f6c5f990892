"""What the docs name exists: every repository path and every ``gpusched.*`` name written in
backticks (inline or in a fenced block) in README.md and docs/**/*.md.

* A path is a token that starts with one of the repository's top folders
  (``gpusched/``, ``services/``, ``tests/``, ...): it must exist in the checkout, a
  trailing ``/`` as a folder. Exceptions, each for its reason: the build's outputs
  (``GENERATED``, made by deploy/build_parts.py and ignored by git), and the names the
  descriptor set and ``protoc`` give the .proto files (``gpusched/v1/x.proto`` is
  ``proto/gpusched/v1/x.proto``).
* A dotted name ``gpusched.a.b`` must be a module, or an attribute path of the longest
  module prefix that imports; else a protobuf type or service of ``proto/`` when it is
  ``gpusched.v1.Name``; else a string the code writes (a span attribute, a log header, a
  logger name: the name in quotes in ``gpusched/`` or ``services/``). Names with a
  character no Python name has (topic names such as ``gpusched.work.gpu-017``, headers
  such as ``gpusched.event-type``) are not checked.

Links hold too: every relative link of a doc (``[text](../guide/cli.md)``) reaches a file
of the checkout, and every ``docs/<page>.md`` a tracked file names (a code comment, an error
message, a unit file) is a doc that exists, so moving a doc fails here until its readers
follow.

docs/design/design.md's map ("Where things are") names modules without their folder: in a row of
a folder of code, each bare name in backticks is a module or package under that folder, or
a function or class one of them defines.

Tokens with a placeholder (``<node>``, ``*``, ``{...}``, ``$VAR``, ``...``) are skipped.
"""
from __future__ import annotations

import fnmatch
import importlib
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
TOP = ("gpusched", "services", "tests", "deploy", "bench", "docs", "proto")
# What deploy/build_parts.py (or the package build) makes; .gitignore keeps it out of git.
GENERATED = ("gpusched/v1/*_pb2.py", "gpusched/v1/*_pb2.pyi", "gpusched/v1/*_pb2_grpc.py",
             "gpusched/v1/gpusched.desc", "gpusched/_native/", "services/node-agent/gpusched-shim")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
PATH = re.compile(r"(?<![\w./~$-])((?:%s)/[\w./@+-]*)" % "|".join(TOP))
DOTTED = re.compile(r"(?<![\w./-])(gpusched(?:\.[\w-]+)+)")
INLINE = re.compile(r"`([^`\n]+)`")


def backticked(path: Path):
    """(line number, text) of every inline code span and every line of a fenced block."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in INLINE.findall(line):
                yield number, span


def tokens(text: str, pattern: re.Pattern):
    for match in pattern.finditer(text):
        token = match.group(1).rstrip(".,:;)")
        # the whole whitespace-delimited word around the match, for placeholders
        start = text.rfind(" ", 0, match.start()) + 1
        end = text.find(" ", match.end())
        if not PLACEHOLDER.search(text[start:end if end >= 0 else len(text)]):
            yield token


def path_exists(token: str) -> bool:
    if any(fnmatch.fnmatchcase(token, pattern) for pattern in GENERATED):
        return True
    if fnmatch.fnmatchcase(token, "gpusched/v1/*.proto"):
        token = "proto/" + token
    target = ROOT / token
    return target.is_dir() if token.endswith("/") else target.exists()


@cache
def proto_names() -> frozenset[str]:
    names = set()
    for proto in (ROOT / "proto").rglob("*.proto"):
        names.update(re.findall(r"^\s*(?:message|service|enum)\s+(\w+)", proto.read_text(), re.M))
    return frozenset(names)


@cache
def code_text() -> str:
    return "\n".join(p.read_text() for folder in ("gpusched", "services") for p in (ROOT / folder).rglob("*.py"))


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
                continue   # this prefix is not a module: try a shorter one
            raise          # the module exists and fails to import: that is no doc error
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            break
        return True
    if len(parts) >= 3 and parts[1] == "v1" and parts[2] in proto_names():
        return True
    return f'"{name}"' in code_text() or f"'{name}'" in code_text()


LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
DOC_PATH = re.compile(r"(?<![\w/.-])(docs/[\w/.-]+\.md)\b")


def links(text: str):
    """(line number, target) of every relative link of a markdown text, outside code."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            for target in LINK.findall(INLINE.sub("", line)):
                if not re.match(r"[a-z]+:", target):
                    yield number, target


def test_docs_links_reach_files():
    broken = [f"{doc.relative_to(ROOT)}:{number}: ({target}) reaches no file"
              for doc in DOCS for number, target in links(doc.read_text()) if not (doc.parent / target).exists()]
    assert not broken, "docs link to what does not exist:\n" + "\n".join(broken)


def test_what_the_repository_names_in_docs_exists():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    missing = []
    for name in tracked.split():
        path = ROOT / name
        if path.suffix in (".png", ".gz") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        missing += [f"{name}: {doc}" for doc in sorted(set(DOC_PATH.findall(text))) if not (ROOT / doc).exists()]
    assert not missing, "files name docs that do not exist:\n" + "\n".join(missing)


# What describes one machine or one run rather than gpusched: a developer's paths and the
# load a run happened to see.
MACHINE = re.compile(r"(?<![\w.-])/(?:work|root|home)/|load average", re.I)


def test_docs_hold_no_machine_paths_or_loads():
    found = [f"{doc.relative_to(ROOT)}:{number}: {line.strip()}" for doc in DOCS
             for number, line in enumerate(doc.read_text().splitlines(), 1) if MACHINE.search(line)]
    assert not found, "docs describe a machine, not gpusched:\n" + "\n".join(found)
    assert MACHINE.search("see /work/main/docs") and MACHINE.search("Load average 3.2")
    assert not MACHINE.search("/etc/gpusched/x ~/.config/gpusched/y /tmp/nvidia-mps")


def test_docs_name_paths_that_exist():
    missing = [f"{doc.relative_to(ROOT)}:{number}: `{token}` is not in the repository"
               for doc in DOCS for number, text in backticked(doc)
               for token in tokens(text, PATH) if not path_exists(token)]
    assert not missing, "docs name paths that do not exist:\n" + "\n".join(missing)


def test_docs_name_modules_that_import():
    unresolved = [f"{doc.relative_to(ROOT)}:{number}: `{token}` is no module, attribute, protobuf type "
                  "or name the code writes"
                  for doc in DOCS for number, text in backticked(doc)
                  for token in tokens(text, DOTTED)
                  if all(part.isidentifier() for part in token.split(".")) and not resolves(token)]
    assert not unresolved, "docs name modules that do not resolve:\n" + "\n".join(unresolved)


MAP_ROW = re.compile(r"\| `((?:gpusched|services)/(?:[\w-]+/|\*\.py))` \| (.*) \|$")
BARE = re.compile(r"`([a-z_][a-z0-9_]*/?)`")


def in_folder(folder: Path, name: str, flat: bool) -> bool:
    """``name`` is a module or package under ``folder`` (only directly in it when ``flat``),
    or a top-level function or class of one of its modules."""
    name = name.rstrip("/")
    files = folder.glob("*.py") if flat else folder.rglob("*.py")
    definition = re.compile(rf"^(?:async def|def|class) {name}\b", re.M)
    return any(f.stem == name or (not flat and f.parent.name == name) or definition.search(f.read_text())
               for f in files)


def test_design_map_names_modules_that_exist():
    doc = ROOT / "docs" / "design" / "design.md"
    stale = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        row = MAP_ROW.match(line)
        if row:
            flat = row.group(1).endswith("*.py")
            folder = ROOT / (row.group(1).removesuffix("*.py"))
            stale += [f"docs/design/design.md:{number}: `{name}` is no module, package, function or class under "
                      f"{row.group(1)}" for name in BARE.findall(row.group(2))
                      if name != "gpusched" and not in_folder(folder, name, flat)]
    assert not stale, "the module map of docs/design/design.md names what does not exist:\n" + "\n".join(stale)


def test_the_checks_see_what_they_must():
    """The scanner finds a path and a module written either way, and misses neither."""
    text = "see `gpusched/core/state.py` and `bench/no_such.py`, `gpusched.core.reducer.apply`"
    assert list(tokens(text, PATH)) == ["gpusched/core/state.py", "bench/no_such.py"]
    assert path_exists("gpusched/core/state.py") and not path_exists("bench/no_such.py")
    assert path_exists("tests/unit/node_agent/") and not path_exists("gpusched/core/state.py/")
    assert list(tokens("`/etc/gpusched/x` `~/.config/gpusched/y` `<prefix>reports.<node>`", PATH)) == []
    assert list(tokens("run `gpusched/<x>.py`", PATH)) == []
    assert resolves("gpusched.core.reducer.apply") and resolves("gpusched.core.reducer")
    assert not resolves("gpusched.core.no_such_module") and not resolves("gpusched.core.reducer.no_such")
    assert resolves("gpusched.v1.EventEnvelope")
    policies = ROOT / "gpusched" / "policies"
    assert in_folder(policies, "queueing/", False) and in_folder(policies, "registry", False)
    assert in_folder(policies, "victims_for", False) and not in_folder(policies, "booking", False)
    assert MAP_ROW.match("| `gpusched/policies/` | `booking` |")
    page = "see [the CLI](../reference/cli.md#job-files), [Kafka](https://kafka.apache.org) and `[x](y.md)`"
    assert [target for _, target in links(page)] == ["../reference/cli.md"]
    assert DOC_PATH.findall("(docs/guide/running.md, docs/figures/static.md) not x/docs/a.md") == \
        ["docs/guide/running.md", "docs/figures/static.md"]
