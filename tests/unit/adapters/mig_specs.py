"""Fake NVML specs shared by the MIG tests."""
from __future__ import annotations

import json
from pathlib import Path

H200 = {"name": "NVIDIA H200", "memory_mib": 143_771}


def h200(uuid: str, mig: str = "enabled", instances=(), **extra) -> dict:
    return {**H200, "uuid": uuid, "mig": mig, "instances": list(instances), **extra}


def mig_node(errors: dict | None = None) -> dict:
    """GPU 0: MIG enabled with a 3g at slice 0 and a 1g at slice 4; GPU 1: MIG off."""
    return {"gpus": [h200("GPU-0", instances=[{"profile": "3g.71gb", "start": 0, "uuid": "MIG-3g-a"},
                                              {"profile": "1g.18gb", "start": 4, "uuid": "MIG-1g-b"}]),
                     h200("GPU-1", mig="disabled")],
            "errors": errors or {}}


def write(tmp: Path, spec: dict, name: str = "nvml.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(spec))
    return path
