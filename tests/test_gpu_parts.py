"""scripts/gpu_parts.py, which carries onnxruntime-gpu's wheel to a lent GPU machine in parts (issue 24): a file
split and joined again is the same file; a changed or missing part is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_parts.py"
spec = importlib.util.spec_from_file_location("gpu_parts", SCRIPT)
gpu_parts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_parts)


def test_split_then_join_gives_the_same_file_and_checks_every_part(tmp_path):
    data = os.urandom(int(2.5 * (1 << 20)))
    wheel = tmp_path / "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(data)
    manifest = gpu_parts.split(wheel, tmp_path / "parts", mib=1)
    assert [p["bytes"] for p in manifest["parts"]] == [1 << 20, 1 << 20, (1 << 19)]
    assert json.loads((tmp_path / "parts" / "parts.json").read_text()) == manifest
    joined = gpu_parts.join(tmp_path / "parts", tmp_path / "out")
    assert joined.name == wheel.name and joined.read_bytes() == data
    (tmp_path / "parts" / "part-001").write_bytes(b"x" * 10)
    with pytest.raises(SystemExit, match="part-001: sha256 differs"):
        gpu_parts.join(tmp_path / "parts", tmp_path / "out")
    (tmp_path / "parts" / "part-002").unlink()
    with pytest.raises(SystemExit, match="part-00[12]"):
        gpu_parts.join(tmp_path / "parts", tmp_path / "out")
