"""Validation of a job spec at admission: every problem names the field it is about.

Pure: checks the spec alone and against its pool (``PoolShape``, the pool's nodes per
GPU model), so a request that can never run ("16 GPUs per worker" in a pool of 8-GPU
nodes) fails at submit time with a clear message instead of pending forever.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from gpusched.core.catalog import CATALOG, is_mig_capable
from gpusched.core.mig import NO_SLOT, parse_profile
from gpusched.core.model import (
    Autoscaling, FailureCause, JobSpec, Readiness, RetryAction, ScalingMetric, ServiceSpec,
)
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.state import NodeState
from gpusched.core.topology import NO_REQUEST, request_problems, shape_problems

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")   # used with fullmatch: "$" admits a final newline
MAX_WORKERS = 4096

# Size limits of what the API takes in: every string and list a client sends is bounded,
# so no request can make an event larger than the log takes (Kafka's 1 MB record) or a
# state that every replica must hold. Checked at admission and again by the reducer.
MAX_NAME = 253                # names, teams, pools: a DNS subdomain's length
MAX_ORG = 253
MAX_COMMAND_ARGS = 256
MAX_COMMAND_ARG = 4096        # characters of one argument
MAX_COMMAND_TOTAL = 65536     # characters of all arguments together
MAX_GPU_MODELS = 16
MAX_RETRY_RULES = 16
MAX_DEPENDENCIES = 64
MAX_ARRAY_TASKS = 10_000
MAX_EXIT_CODES = 32           # exit codes one retry rule lists
MAX_PROFILE = 16              # a MIG profile name ("3g.40gb")
MAX_REASON = 1024             # cancel and cordon reasons
MAX_KEY = 256                 # idempotency keys
MAX_ID = 256                  # job ids and node names in requests
MAX_PAGE_TOKEN = 512
MAX_FILTERS = 16              # phases in a ListJobs filter


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class ModelGroup:
    """The nodes of one GPU model in a pool, as far as validation needs them."""

    model: str
    mig_capable: bool
    most_gpus: int
    total_gpus: int
    most_cpu_milli: int
    most_memory_mib: int
    most_gpu_memory_mib: int = 0   # the largest GPU's memory (0: unknown, use the catalog)
    takes_whole: bool = True       # some GPU takes whole GPUs and shares (MIG not enabled)


@dataclass(frozen=True, slots=True)
class PoolShape:
    """A pool summarised per GPU model: what ``validate_spec`` checks a spec against.

    Validation asks only which models a pool has and the largest and total sizes among
    their nodes, so a pool of thousands of nodes reduces to a group per model, built
    once per change of the inventory (the admission service keeps it until a node
    registers) instead of a scan of every node for every submission."""

    groups: tuple[ModelGroup, ...] = ()

    @classmethod
    def of(cls, nodes: list[NodeState]) -> PoolShape:
        by_model: dict[str, list[NodeState]] = {}
        for node in nodes:
            by_model.setdefault(node.model, []).append(node)
        return cls(tuple(_group(model, group) for model, group in sorted(by_model.items())))


def _group(model: str, nodes: list[NodeState]) -> ModelGroup:
    gpus = [g for n in nodes for g in n.gpus]
    # MIG as the nodes registered it: a MIG-capable GPU with MIG off takes no slice.
    takes_mig = any(g.info.mig_capable and g.mig_slots != NO_SLOT for g in gpus)
    return ModelGroup(model, takes_mig, max(len(n.gpus) for n in nodes), len(gpus),
                      max(n.info.cpu_milli for n in nodes), max(n.info.memory_mib for n in nodes),
                      max((g.info.memory_mib for g in gpus), default=0),
                      any(g.whole_ok for g in gpus) or not gpus)


def check_time_limit(spec: JobSpec, limits: tuple[float, float]) -> list[FieldError]:
    """The pool's maximum time limit (``PoolTimeLimitsSet``) against what the job asks,
    or against the pool's default when it asks nothing; the reducer applies the same rule."""
    default_s, max_s = limits
    asked = spec.max_runtime_s or default_s
    if max_s and asked > max_s:
        return [FieldError("spec.max_runtime_s", f"{asked:g}s is above pool {spec.pool}'s time limit of {max_s:g}s")]
    return []


def check_pool_limits(pool: str, default_s: float, max_s: float) -> list[FieldError]:
    errors = []
    if not pool:
        errors.append(FieldError("pool", "must not be empty"))
    for name, value in (("default_time_limit_s", default_s), ("max_time_limit_s", max_s)):
        if not 0.0 <= value < math.inf:   # NaN fails too
            errors.append(FieldError(name, "must be a finite number of seconds >= 0 (0: none)"))
    if not errors and max_s and default_s > max_s:
        errors.append(FieldError("default_time_limit_s", f"{default_s:g}s is above max_time_limit_s {max_s:g}s"))
    return errors


def validate_spec(spec: JobSpec, pool: PoolShape) -> list[FieldError]:
    errors = check_spec_alone(spec)
    if not errors:
        errors += _check_asks_gpu(spec)
    if not errors and pool.groups:
        errors += _check_fits_pool(spec, pool.groups)
    return errors


def check_spec_alone(spec: JobSpec) -> list[FieldError]:
    """Every rule that needs the spec only: what the reducer applies to each
    ``JobSubmitted`` it folds (cheap; no scan of the pool). Not the API's rule that a job
    asks for a GPU (``_check_asks_gpu``): the core model has CPU-only workers, which
    replayed traces (the simulator) submit."""
    errors = _check_sizes(spec)
    if errors:   # an oversized field is not looked at further (no regex over megabytes)
        return errors
    errors = _check_identity(spec) + _check_resources(spec) + _check_numbers(spec) + _check_command(spec)
    if spec.retry:
        errors += _check_retry(spec)
    if spec.array.count or spec.array.parallel:
        errors += _check_array(spec)
    if spec.readiness != _NO_READINESS:
        errors += _check_readiness(spec)
    if spec.topology != NO_REQUEST:
        errors += [FieldError(at, why) for at, why in shape_problems(spec)]
    return errors + _check_dependencies(spec) if spec.depends_on else errors


_NO_READINESS = Readiness()
MAX_READINESS_PATH = 1024
MAX_SERVICE_REPLICAS = 10_000
MAX_SCALE_UP = 1000


def _check_readiness(spec: JobSpec) -> list[FieldError]:
    r, at = spec.readiness, "spec.readiness"
    errors = []
    if r.http_path and r.command:
        errors.append(FieldError(f"{at}.http_path", "an HTTP check or a command, not both"))
    if r.http_path:
        if not spec.serve_port:
            errors.append(FieldError(f"{at}.http_path", "checks the replica's port, and the replica declares none "
                                                         "(serve_port: false)"))
        if not r.http_path.startswith("/") or len(r.http_path) > MAX_READINESS_PATH or not r.http_path.isprintable():
            errors.append(FieldError(f"{at}.http_path", f"a path starting with '/' (at most {MAX_READINESS_PATH} "
                                                         f"printable characters), got {r.http_path[:64]!r}"))
    if len(r.command) > MAX_COMMAND_ARGS or any(len(a) > MAX_COMMAND_ARG for a in r.command):
        errors.append(FieldError(f"{at}.command", f"at most {MAX_COMMAND_ARGS} arguments of {MAX_COMMAND_ARG} characters"))
    for name in ("period_s", "timeout_s"):
        value = getattr(r, name)
        if not (math.isfinite(value) and 0 <= value <= 3600):
            errors.append(FieldError(f"{at}.{name}", f"seconds in [0, 3600] (0: 1 s), got {value}"))
    if not (math.isfinite(r.initial_delay_s) and 0 <= r.initial_delay_s <= 86_400):
        errors.append(FieldError(f"{at}.initial_delay_s", f"seconds in [0, 86400], got {r.initial_delay_s}"))
    for name in ("success_threshold", "failure_threshold"):
        if not 0 <= getattr(r, name) <= 100:
            errors.append(FieldError(f"{at}.{name}", f"must be 0..100 (0: the default), got {getattr(r, name)}"))
    return errors


def check_service_alone(spec: ServiceSpec) -> list[FieldError]:
    """Every rule of a service spec that needs the spec only, each error naming its field
    (``spec.replicas``, ``spec.template.resources.gpus``...); the reducer applies it to
    every ``ServiceApplied``."""
    errors = []
    if not spec.name or len(spec.name) > 63 or not _SERVICE_NAME.fullmatch(spec.name):
        errors.append(FieldError("spec.name", "a DNS label: lower-case letters, digits and '-', starting with a "
                                              f"letter, at most 63, got {spec.name[:64]!r}"))
    if spec.template.service or spec.template.array.count or spec.template.depends_on:
        errors.append(FieldError("spec.template", "a replica template takes no service, array or depends_on"))
    for error in check_spec_alone(spec.replica_spec()):
        field = error.field
        if field.split(".")[1].split("[")[0] not in _SERVICE_FIELDS:
            field = "spec.template." + field[len("spec."):]
        errors.append(FieldError(field, error.message))
    for name in ("replicas", "min_replicas", "max_replicas"):
        value = getattr(spec, name)
        if not 0 <= value <= MAX_SERVICE_REPLICAS:
            errors.append(FieldError(f"spec.{name}", f"must be 0..{MAX_SERVICE_REPLICAS}, got {value}"))
    if errors:
        return errors
    if spec.max_replicas and spec.min_replicas > spec.max_replicas:
        errors.append(FieldError("spec.min_replicas", f"{spec.min_replicas} is above max_replicas {spec.max_replicas}"))
    elif spec.replicas < spec.min_replicas or (spec.max_replicas and spec.replicas > spec.max_replicas):
        errors.append(FieldError("spec.replicas", f"{spec.replicas} is outside min_replicas..max_replicas "
                                                  f"({spec.min_replicas}..{spec.max_replicas or 'no bound'})"))
    u = spec.update
    if u.max_surge < 0 or u.max_surge > MAX_SERVICE_REPLICAS:
        errors.append(FieldError("spec.update.max_surge", f"must be 0..{MAX_SERVICE_REPLICAS}, got {u.max_surge}"))
    if u.max_unavailable < 0 or u.max_unavailable > MAX_SERVICE_REPLICAS:
        errors.append(FieldError("spec.update.max_unavailable",
                                 f"must be 0..{MAX_SERVICE_REPLICAS}, got {u.max_unavailable}"))
    if u.max_surge == 0 and u.max_unavailable == 0:
        errors.append(FieldError("spec.update.max_surge", "max_surge and max_unavailable may not both be 0: "
                                                          "the rollout could never replace a replica"))
    return errors + _check_autoscaling(spec)


def check_scale(spec: ServiceSpec, replicas: int) -> list[FieldError]:
    """A desired count asked of a running service: within min..max replicas, or 0 where
    min_replicas is 0."""
    if spec.min_replicas <= replicas and (not spec.max_replicas or replicas <= spec.max_replicas):
        return []
    return [FieldError("replicas", f"{replicas} is outside min_replicas..max_replicas "
                                   f"({spec.min_replicas}..{spec.max_replicas or 'no bound'})")]


_SERVICE_NAME = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
_SERVICE_FIELDS = ("name", "team", "pool", "priority_class", "org", "preemptible")


def _check_autoscaling(spec: ServiceSpec) -> list[FieldError]:
    a, at = spec.autoscaling, "spec.autoscaling"
    if a.metric is ScalingMetric.NONE:
        if a != Autoscaling():
            return [FieldError(f"{at}.metric", "required with any other autoscaling setting: one of "
                                               "requests_in_flight, requests_per_second, gpu_utilization")]
        return []
    errors = []
    if not (math.isfinite(a.target) and a.target > 0):
        errors.append(FieldError(f"{at}.target", f"a positive value of the metric per replica, got {a.target}"))
    if not spec.max_replicas:
        errors.append(FieldError("spec.max_replicas", "required (above 0) when the service autoscales"))
    if not (math.isfinite(a.tolerance) and 0 <= a.tolerance < 1):
        errors.append(FieldError(f"{at}.tolerance", f"a fraction in [0, 1), got {a.tolerance}"))
    if not (math.isfinite(a.scale_down_window_s) and 0 <= a.scale_down_window_s <= 86_400):
        errors.append(FieldError(f"{at}.scale_down_window_s", f"seconds in [0, 86400], got {a.scale_down_window_s}"))
    if not 1 <= a.max_scale_up <= MAX_SCALE_UP:
        errors.append(FieldError(f"{at}.max_scale_up", f"replicas a minute, 1..{MAX_SCALE_UP}, got {a.max_scale_up}"))
    if not (math.isfinite(a.scale_to_zero_after_s) and 0 <= a.scale_to_zero_after_s <= 30 * 86_400):
        errors.append(FieldError(f"{at}.scale_to_zero_after_s", f"seconds (0: never), got {a.scale_to_zero_after_s}"))
    elif a.scale_to_zero_after_s and spec.min_replicas:
        errors.append(FieldError(f"{at}.scale_to_zero_after_s", f"needs min_replicas 0, got {spec.min_replicas}"))
    return errors


def _check_array(spec: JobSpec) -> list[FieldError]:
    a = spec.array
    if not 1 <= a.count <= MAX_ARRAY_TASKS:
        return [FieldError("spec.array.count", f"must be 1..{MAX_ARRAY_TASKS}, got {a.count}")]
    if not 0 <= a.parallel <= a.count:
        return [FieldError("spec.array.parallel", f"must be 0 (all at once) .. count ({a.count}), got {a.parallel}")]
    return []


def _check_dependencies(spec: JobSpec) -> list[FieldError]:
    if len(spec.depends_on) > MAX_DEPENDENCIES:
        return [FieldError("spec.depends_on", f"at most {MAX_DEPENDENCIES} jobs, got {len(spec.depends_on)}")]
    errors, seen = [], set()
    for i, dep in enumerate(spec.depends_on):
        if not dep.job or len(dep.job) > MAX_ID:
            errors.append(FieldError(f"spec.depends_on[{i}].job", f"a job id (1..{MAX_ID} characters)"))
        elif dep.job in seen:
            errors.append(FieldError(f"spec.depends_on[{i}].job", f"job {dep.job!r} is listed twice"))
        seen.add(dep.job)
    return errors


def _check_retry(spec: JobSpec) -> list[FieldError]:
    """A retry policy: known causes, exit codes only where the cause is the command's exit,
    a budget of its own only where failures are counted."""
    if len(spec.retry) > MAX_RETRY_RULES:
        return [FieldError("spec.retry", f"at most {MAX_RETRY_RULES} rules, got {len(spec.retry)}")]
    errors = []
    for i, rule in enumerate(spec.retry):
        at = f"spec.retry[{i}]"
        if rule.cause is FailureCause.UNSPECIFIED:
            errors.append(FieldError(f"{at}.cause", "required: one of exit, oom, hang, node, preemption"))
        if rule.exit_codes and rule.cause is not FailureCause.EXIT:
            errors.append(FieldError(f"{at}.exit_codes", f"only for cause: exit, not cause: {rule.cause.value}"))
        if len(rule.exit_codes) > MAX_EXIT_CODES:
            errors.append(FieldError(f"{at}.exit_codes", f"at most {MAX_EXIT_CODES} codes, got {len(rule.exit_codes)}"))
        elif any(not 1 <= code <= 255 for code in rule.exit_codes):
            errors.append(FieldError(f"{at}.exit_codes", f"exit codes are 1..255, got {list(rule.exit_codes)}"))
        if rule.max_restarts < 0:
            errors.append(FieldError(f"{at}.max_restarts", f"must not be negative, got {rule.max_restarts}"))
        elif rule.max_restarts and rule.action is not RetryAction.COUNT:
            errors.append(FieldError(f"{at}.max_restarts", f"a budget only counts failures (action: count), "
                                                           f"not action: {rule.action.value}"))
    return errors


def check_length(field: str, value: str, limit: int) -> list[FieldError]:
    """A string of a request against its limit, the field named."""
    if len(value) > limit:
        return [FieldError(field, f"at most {limit} characters, got {len(value)}")]
    return []


def _check_sizes(spec: JobSpec) -> list[FieldError]:
    r = spec.resources
    command = spec.command
    # The common case in one expression: the reducer runs this for every JobSubmitted.
    if (len(spec.name) <= MAX_NAME and len(spec.team) <= MAX_NAME and len(spec.pool) <= MAX_NAME
            and len(spec.org) <= MAX_ORG and len(spec.priority_class) <= MAX_NAME
            and len(r.mig_profile) <= MAX_PROFILE and len(r.gpu_models) <= MAX_GPU_MODELS
            and len(command) <= MAX_COMMAND_ARGS and (not command or max(map(len, command)) <= MAX_COMMAND_ARG)
            and (len(command) * MAX_COMMAND_ARG <= MAX_COMMAND_TOTAL or sum(map(len, command)) <= MAX_COMMAND_TOTAL)
            and (not r.gpu_models or max(map(len, r.gpu_models)) <= MAX_NAME)):
        return []
    return _size_errors(spec)


def _size_errors(spec: JobSpec) -> list[FieldError]:
    r = spec.resources
    errors = (check_length("spec.name", spec.name, MAX_NAME) + check_length("spec.team", spec.team, MAX_NAME)
              + check_length("spec.pool", spec.pool, MAX_NAME) + check_length("spec.org", spec.org, MAX_ORG)
              + check_length("spec.priority_class", spec.priority_class, MAX_NAME)
              + check_length("spec.resources.mig_profile", r.mig_profile, MAX_PROFILE))
    if len(spec.command) > MAX_COMMAND_ARGS:
        errors.append(FieldError("spec.command", f"at most {MAX_COMMAND_ARGS} arguments, got {len(spec.command)}"))
    else:
        for i, arg in enumerate(spec.command):
            errors += check_length(f"spec.command[{i}]", arg, MAX_COMMAND_ARG)
        total = sum(map(len, spec.command))
        if total > MAX_COMMAND_TOTAL:
            errors.append(FieldError("spec.command", f"at most {MAX_COMMAND_TOTAL} characters in all, got {total}"))
    if len(r.gpu_models) > MAX_GPU_MODELS:
        errors.append(FieldError("spec.resources.gpu_models", f"at most {MAX_GPU_MODELS} models, got {len(r.gpu_models)}"))
    else:
        for i, model in enumerate(r.gpu_models):
            errors += check_length(f"spec.resources.gpu_models[{i}]", model, MAX_NAME)
    return errors


def check_pool_name(pool: str, field: str = "pool") -> list[FieldError]:
    if len(pool) > MAX_NAME or not _NAME.fullmatch(pool):
        return [FieldError(field, f"use letters, digits, '.', '_' or '-' (at most {MAX_NAME}), got {pool[:64]!r}")]
    return []


def check_topology(spec: JobSpec, levels: Sequence[str]) -> list[FieldError]:
    """The job's topology request against its pool's levels (``core.topology``)."""
    return [FieldError(at, why) for at, why in request_problems(spec, levels)]


def check_known_pool(pool: str, known) -> list[FieldError]:
    """A job's pool must exist in the log (a node registered in it, or ``PoolCreated``):
    a job for a pool nobody has would wait forever with no reason."""
    if pool in known:
        return []
    names = sorted(known)
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return [FieldError("spec.pool", f"no pool {pool!r}; known pools: {listed or 'none'}")]


_INF = math.inf
_GOOD_NAMES: set[str] = set()   # teams and pools seen valid: they repeat in every job of a log


def _good_name(name: str) -> bool:
    """``_NAME.fullmatch``, remembered for valid names (a pure function's cache, bounded)."""
    if name in _GOOD_NAMES:
        return True
    if _NAME.fullmatch(name) is None:
        return False
    if len(_GOOD_NAMES) >= 10_000:
        _GOOD_NAMES.clear()
    _GOOD_NAMES.add(name)
    return True


def _check_command(spec: JobSpec) -> list[FieldError]:
    """Each argument reaches ``execve`` as a C string, which ends at a NUL byte: an
    argument holding one cannot be passed to a process at all, so no node could start
    the job."""
    errors = []
    for i, arg in enumerate(spec.command):
        if "\x00" in arg:
            errors.append(FieldError(f"spec.command[{i}]", "must not contain a NUL byte (\\x00): "
                                                            "no process can be started with it"))
    return errors


def _check_identity(spec: JobSpec) -> list[FieldError]:
    if (_NAME.fullmatch(spec.name) is not None and _good_name(spec.team) and _good_name(spec.pool)
            and spec.priority_class in PRIORITY_CLASSES and 1 <= spec.workers <= MAX_WORKERS):
        return []   # the common case, for the reducer's sake; the errors below otherwise
    errors = []
    if not spec.name:
        errors.append(FieldError("spec.name", "must not be empty"))
    elif not _NAME.fullmatch(spec.name):
        errors.append(FieldError("spec.name", "use letters, digits, '.', '_' or '-' (at most 253)"))
    if not spec.team:
        errors.append(FieldError("spec.team", "must not be empty"))
    elif not _NAME.fullmatch(spec.team):
        errors.append(FieldError("spec.team", "use letters, digits, '.', '_' or '-'"))
    if not _NAME.fullmatch(spec.pool):
        errors.append(FieldError("spec.pool", f"invalid pool name {spec.pool!r}"))
    if spec.priority_class not in PRIORITY_CLASSES:
        errors.append(FieldError("spec.priority_class",
                                 f"unknown class {spec.priority_class!r}; one of {sorted(PRIORITY_CLASSES)}"))
    if not 1 <= spec.workers <= MAX_WORKERS:
        errors.append(FieldError("spec.workers", f"must be 1..{MAX_WORKERS}, got {spec.workers}"))
    return errors


def _check_resources(spec: JobSpec) -> list[FieldError]:
    r = spec.resources
    errors = []
    if r.gpus < 0:
        errors.append(FieldError("spec.resources.gpus", f"must not be negative, got {r.gpus}"))
    if not 0 <= r.gpu_milli <= 1000:
        errors.append(FieldError("spec.resources.gpu_milli", f"must be 1..1000 (share of one GPU), got {r.gpu_milli}"))
    forms = (r.gpus > 0) + (r.gpu_milli > 0) + bool(r.mig_profile)
    if forms > 1:
        errors.append(FieldError("spec.resources", "set only one of gpus, gpu_milli, mig_profile"))
    if r.mig_profile and parse_profile(r.mig_profile) is None:
        errors.append(FieldError("spec.resources.mig_profile", f"unknown MIG profile {r.mig_profile!r}; one of 1g, 2g, 3g, 4g, 7g"))
    if r.cpu_milli < 0:
        errors.append(FieldError("spec.resources.cpu_milli", "must not be negative"))
    if r.memory_mib < 0:
        errors.append(FieldError("spec.resources.memory_mib", "must not be negative"))
    for i, model in enumerate(r.gpu_models):
        if model not in CATALOG:
            errors.append(FieldError(f"spec.resources.gpu_models[{i}]", f"unknown GPU model {model!r}"))
    if r.mig_profile and r.gpu_models and not any(is_mig_capable(m) for m in r.gpu_models):
        errors.append(FieldError("spec.resources.gpu_models", "no listed model supports MIG"))
    return errors + _check_gpu_memory(spec)


def _check_asks_gpu(spec: JobSpec) -> list[FieldError]:
    r = spec.resources
    if r.gpus > 0 or r.gpu_milli > 0 or r.mig_profile:
        return []
    return [FieldError("spec.resources.gpus", "request at least one GPU, a GPU share (gpu_milli) or a MIG profile")]


def _check_gpu_memory(spec: JobSpec) -> list[FieldError]:
    """A share's GPU-memory request: positive, and no more than a GPU it may use has."""
    r = spec.resources
    if r.gpu_memory_mib == 0:
        return []
    field = "spec.resources.gpu_memory_mib"
    if r.gpu_memory_mib < 0:
        return [FieldError(field, f"must be positive, got {r.gpu_memory_mib}")]
    if not r.is_share:
        return [FieldError(field, "only a GPU share (gpu_milli) takes a GPU-memory request")]
    models = [CATALOG[m] for m in r.gpu_models if m in CATALOG] or list(CATALOG.values())
    most = max(m.memory_mib for m in models)
    if r.gpu_memory_mib > most:
        return [FieldError(field, f"{r.gpu_memory_mib} MiB exceeds every allowed GPU (at most {most} MiB)")]
    return []


def _check_numbers(spec: JobSpec) -> list[FieldError]:
    # NaN fails every comparison, so this common-case test also refuses it.
    if (0.0 <= spec.max_runtime_s < _INF and 0.0 <= spec.checkpoint_interval_s < _INF
            and 0.0 <= spec.simulated_duration_s < _INF and spec.max_restarts >= 0):
        return []
    checks = (
        ("spec.max_runtime_s", spec.max_runtime_s),
        ("spec.checkpoint_interval_s", spec.checkpoint_interval_s),
        ("spec.simulated_duration_s", spec.simulated_duration_s),
        ("spec.max_restarts", spec.max_restarts),
    )
    # NaN compares false with everything, so `v < 0` alone would let it through.
    return [FieldError(f, "must not be negative" if v < 0 else "must be a finite number")
            for f, v in checks if v < 0 or not math.isfinite(v)]


def _check_fits_pool(spec: JobSpec, groups: tuple[ModelGroup, ...]) -> list[FieldError]:
    r = spec.resources
    usable = [g for g in groups if r.allows(g.model) and (not r.mig_profile or g.mig_capable)]
    if not usable:
        what = f"models {list(r.gpu_models)}" if r.gpu_models else "MIG enabled (or MIG-capable simulated GPUs)"
        return [FieldError("spec.resources.gpu_models", f"pool {spec.pool} has no nodes with {what}")]
    if (r.gpus or r.is_share) and not any(g.takes_whole for g in usable):
        field = "spec.resources.gpus" if r.gpus else "spec.resources.gpu_milli"
        return [FieldError(field, f"every GPU of pool {spec.pool} has MIG enabled: request a mig_profile")]
    errors = []
    most_gpu_memory = max(g.most_gpu_memory_mib for g in usable)
    if r.is_share and most_gpu_memory and r.gpu_memory_mib > most_gpu_memory:
        errors.append(FieldError("spec.resources.gpu_memory_mib",
                                 f"{r.gpu_memory_mib} MiB exceeds the largest GPU in pool {spec.pool} "
                                 f"({most_gpu_memory} MiB)"))
    most_gpus = max(g.most_gpus for g in usable)
    if r.gpus > most_gpus:
        errors.append(FieldError("spec.resources.gpus",
                                 f"{r.gpus} per worker exceeds the largest node in pool {spec.pool} ({most_gpus} GPUs)"))
    total_gpus = sum(g.total_gpus for g in usable)
    if r.gpus and r.gpus * spec.workers > total_gpus:
        errors.append(FieldError("spec.workers",
                                 f"gang needs {r.gpus * spec.workers} GPUs, pool {spec.pool} has {total_gpus}"))
    if r.cpu_milli > max(g.most_cpu_milli for g in usable):
        errors.append(FieldError("spec.resources.cpu_milli", "exceeds every node of the pool"))
    if r.memory_mib > max(g.most_memory_mib for g in usable):
        errors.append(FieldError("spec.resources.memory_mib", "exceeds every node of the pool"))
    return errors
